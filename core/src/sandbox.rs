//! The file sandbox of Flight SQL sessions: the local directories and object-store locations SQL users may read and
//! write with `read_*()`, `CREATE EXTERNAL TABLE … LOCATION`, `COPY … TO` and Iceberg
//! `location` options.
//!
//! A location is resolved before it is checked: `file://` URLs and plain paths are the same,
//! percent-encoded names are decoded, relative paths are taken from the working directory,
//! `.` and `..` are applied, and symbolic links in the existing part of the path are followed
//! (so `/data/link/x` with `link -> /etc` is `/etc/x`). A glob (`/data/*.csv`) is checked by
//! the directory before its first wildcard.

use std::path::{Component, Path, PathBuf};

use crate::config::BasinConfig;

/// Where SQL users may read and write files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    allowed: Vec<Allowed>,
    /// Basin's own directory (catalog, warehouses, shuffle files): refused, except its
    /// user area, whatever else allows it.
    own: Option<PathBuf>,
    /// The part of [`Sandbox::own`] that is the users': `<data_dir>/files`.
    user_area: Option<PathBuf>,
    /// Iceberg warehouses: where an Iceberg table's `location` may also go.
    warehouses: Vec<Allowed>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    /// A local directory (resolved) and everything under it.
    Local(PathBuf),
    /// An object-store location: scheme, bucket (empty: every bucket) and key prefix (empty:
    /// the whole bucket; else whole segments).
    Store {
        scheme: String,
        bucket: String,
        prefix: Vec<String>,
    },
}

/// A location, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resolved {
    Local(PathBuf),
    Store {
        scheme: String,
        bucket: String,
        key: Vec<String>,
    },
}

/// The directory of the data directory that SQL users may read and write.
pub const USER_AREA: &str = "files";

impl Sandbox {
    /// The sandbox of a configuration: the data directory's user area (`<data_dir>/files`)
    /// and `[security] allowed_locations` — by default every bucket of the configured object
    /// store (`[storage.s3]`), when there is one. The rest of the data directory is Basin's
    /// and always refused. Iceberg tables may also be placed in their catalogs' warehouses.
    pub fn from_config(config: &BasinConfig) -> Result<Self, String> {
        let bad = |entry: &str, why: String| {
            format!("[security] allowed_locations: `{entry}` is not a location: {why}")
        };
        let own = resolve_local(&config.server.data_dir).map_err(|why| {
            format!(
                "the data directory {}: {why}",
                config.server.data_dir.display()
            )
        })?;
        let user_area = own.join(USER_AREA);
        let mut allowed = vec![Allowed::Local(user_area.clone())];
        // With access rules, raw files could go around them (a table's data files read
        // directly): no bucket unless listed.
        let listed: Vec<String> = match &config.security.allowed_locations {
            Some(listed) => listed.clone(),
            None if config.storage.s3.is_some() && config.security.rules_file.is_none() => {
                vec!["s3://".to_string()]
            }
            None => vec![],
        };
        for entry in &listed {
            allowed.push(Allowed::parse(entry).map_err(|why| bad(entry, why))?);
        }
        let mut warehouses = Vec::new();
        for catalog in config.catalogs.values() {
            if let crate::config::CatalogConfig::Iceberg(iceberg) = catalog
                && let Some(warehouse) = &iceberg.warehouse
                && warehouse.contains("://")
            {
                warehouses.push(Allowed::parse(warehouse).map_err(|why| bad(warehouse, why))?);
            }
        }
        Ok(Self {
            allowed,
            own: Some(own),
            user_area: Some(user_area),
            warehouses,
        })
    }

    /// A sandbox of exactly these locations (tests).
    pub fn of(entries: &[&str]) -> Result<Self, String> {
        let allowed = entries
            .iter()
            .map(|e| Allowed::parse(e))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            allowed,
            own: None,
            user_area: None,
            warehouses: Vec::new(),
        })
    }

    /// Whether SQL users may use `location` (for `what`: "read_csv", "COPY … TO", …). The
    /// error names the location as the user wrote it and the setting, never the allowed
    /// list.
    pub fn check(&self, what: &str, location: &str) -> Result<(), String> {
        self.check_in(what, location, &[])
    }

    /// [`Sandbox::check`] for an Iceberg table's `location`, which may also be in a
    /// warehouse of the configured catalogs.
    pub fn check_table_location(&self, what: &str, location: &str) -> Result<(), String> {
        self.check_in(what, location, &self.warehouses)
    }

    fn check_in(&self, what: &str, location: &str, also: &[Allowed]) -> Result<(), String> {
        let refused = |why: &str| {
            format!(
                "{what}: '{location}' {why}; an administrator can allow it in [security] \
                 allowed_locations"
            )
        };
        let resolved = resolve(location).map_err(|why| refused(&why))?;
        if let (Some(own), Some(area), Resolved::Local(path)) =
            (&self.own, &self.user_area, &resolved)
            && path.starts_with(own)
            && !path.starts_with(area)
        {
            return Err(format!(
                "{what}: '{location}' is inside Basin's data directory, which holds its \
                 catalog, tables and shuffle files; SQL users may use only its `{USER_AREA}/` \
                 directory"
            ));
        }
        // Tables' files are read and written through their tables only (their access
        // rules, their commits).
        if also.is_empty() && self.warehouses.iter().any(|w| w.contains(&resolved)) {
            return Err(format!(
                "{what}: '{location}' is inside an Iceberg warehouse, whose files only its \
                 tables may read and write"
            ));
        }
        if self
            .allowed
            .iter()
            .chain(also)
            .any(|a| a.contains(&resolved))
        {
            Ok(())
        } else {
            Err(refused(
                "is outside the locations SQL users may read and write",
            ))
        }
    }
}

impl Allowed {
    fn parse(entry: &str) -> Result<Self, String> {
        Ok(match resolve(entry)? {
            Resolved::Local(path) => Allowed::Local(path),
            Resolved::Store {
                scheme,
                bucket,
                key,
            } => Allowed::Store {
                scheme,
                bucket,
                prefix: key,
            },
        })
    }

    fn contains(&self, location: &Resolved) -> bool {
        match (self, location) {
            (Allowed::Local(dir), Resolved::Local(path)) => path.starts_with(dir),
            (
                Allowed::Store {
                    scheme,
                    bucket,
                    prefix,
                },
                Resolved::Store {
                    scheme: s,
                    bucket: b,
                    key,
                },
            ) => {
                same_scheme(scheme, s)
                    && (bucket.is_empty() || bucket == b)
                    && key.starts_with(prefix)
            }
            _ => false,
        }
    }
}

/// `s3`, `s3a` and `s3n` name the same store.
fn same_scheme(a: &str, b: &str) -> bool {
    let canon = |s: &str| match s {
        "s3a" | "s3n" => "s3".to_string(),
        other => other.to_string(),
    };
    canon(a) == canon(b)
}

/// The part of `location` before its first wildcard (a glob reads under it).
fn before_glob(location: &str) -> &str {
    match location.find(['*', '?', '[', '{']) {
        Some(at) => location[..at].rsplit_once('/').map_or("", |(dir, _)| dir),
        None => location,
    }
}

/// Characters no location may have: what URL parsers drop or read differently from a
/// plain path (a fragment, a backslash, tabs and newlines).
fn odd_character(text: &str) -> bool {
    text.chars()
        .any(|c| c.is_control() || c == '\\' || c == '#')
}

fn resolve(location: &str) -> Result<Resolved, String> {
    let location = location.trim();
    if odd_character(location) {
        return Err(
            "has a character locations may not have (`#`, `\\`, control characters)".into(),
        );
    }
    let location = before_glob(location);
    if location.is_empty() {
        return Err("is not a location".to_string());
    }
    let lower = location.to_ascii_lowercase();
    let (scheme, rest) = match location.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        // `file:/path`, as URL parsers read it.
        None if lower.starts_with("file:") => ("file".to_string(), &location[5..]),
        None => ("file".to_string(), location),
    };
    let decoded = percent_decode(rest).ok_or("has a malformed %-escape")?;
    if decoded.contains('\0') || odd_character(&decoded) {
        return Err("has an escaped character locations may not have".to_string());
    }
    // Readers apply `..` in their own ways (lexically, or after following a link): none is
    // taken, so that the place checked is the place read.
    if decoded.split('/').any(|part| part == "..") {
        return Err("has a `..` segment, which locations may not have".to_string());
    }
    if scheme == "file" {
        // file:///abs, file://localhost/abs
        let path = match decoded.strip_prefix("localhost") {
            Some(rest) if rest.starts_with('/') => rest,
            _ => decoded.as_str(),
        };
        return Ok(Resolved::Local(resolve_local(Path::new(path))?));
    }
    let (bucket, key) = decoded.split_once('/').unwrap_or((&decoded, ""));
    let parts: Vec<String> = key
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .map(str::to_string)
        .collect();
    Ok(Resolved::Store {
        scheme,
        bucket: bucket.to_string(),
        key: parts,
    })
}

/// `path` made absolute, with `.`/`..` applied and the symbolic links of its existing part
/// followed.
fn resolve_local(path: &Path) -> Result<PathBuf, String> {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("is relative and the working directory is unknown: {e}"))?
            .join(path)
    };
    // Resolve step by step: `..` after a symbolic link goes up from the link's target.
    let mut resolved = PathBuf::from("/");
    let mut exists = true;
    for component in absolute.components() {
        match component {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                resolved.pop();
            }
            Component::Normal(name) => {
                resolved.push(name);
                if exists {
                    match std::fs::canonicalize(&resolved) {
                        Ok(real) => resolved = real,
                        Err(_) => exists = false,
                    }
                }
            }
        }
    }
    Ok(resolved)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("basin-sandbox-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data/sub")).unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        std::fs::canonicalize(&dir).unwrap()
    }

    #[test]
    fn local_paths_are_resolved_before_they_are_checked() {
        let dir = scratch();
        let data = dir.join("data");
        std::os::unix::fs::symlink(dir.join("outside"), data.join("link")).unwrap();
        let sandbox = Sandbox::of(&[data.to_str().unwrap()]).unwrap();
        let d = data.display();
        for ok in [
            format!("{d}/sub/x.csv"),
            format!("file://{d}/sub/"),
            format!("file:{d}/sub/"),
            format!("file://localhost{d}/sub/"),
            format!("{d}/./sub/y.parquet"),
            format!("{d}/new/dir/z.parquet"),
            format!("{d}/sub/*.csv"),
            format!("file://{}/sub%2Fx.csv", d),
        ] {
            assert_eq!(sandbox.check("read_csv", &ok), Ok(()), "{ok}");
        }
        for bad in [
            "/etc/passwd".to_string(),
            "file:///etc/passwd".to_string(),
            format!("{d}/../outside/x.csv"),
            format!("{d}/sub/../../outside/x.csv"),
            format!("{d}/%2e%2e/outside/x.csv"),
            format!("file://{d}/..%2Foutside%2Fx.csv"),
            format!("{d}/link/x.csv"),
            format!("{d}/link/../../../etc/passwd"),
            format!("{d}*/x.csv"),
            format!("{}/data2/x.csv", dir.display()),
            format!("{d}/sub/../y.parquet"),
            format!("file:///etc/passwd#/../..{d}/x"),
            format!("file://{d}/..\\..\\etc\\passwd"),
            format!("file://{d}/.\t./.\t./etc/passwd"),
            format!("{d}/nope/../link/x"),
            "file:/etc/passwd".to_string(),
            format!("file://{d}/%23/x"),
        ] {
            let err = sandbox.check("read_csv", &bad).unwrap_err();
            assert!(
                err.contains("read_csv") && err.contains("allowed_locations"),
                "{err}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn buckets_and_prefixes() {
        let sandbox = Sandbox::of(&["s3://lake/raw/", "s3://landing"]).unwrap();
        for ok in [
            "s3://lake/raw/x.parquet",
            "s3a://lake/raw/2024/",
            "s3://landing/anything/at/all",
            "s3://lake/raw/./b",
        ] {
            assert_eq!(sandbox.check("COPY … TO", ok), Ok(()), "{ok}");
        }
        for bad in [
            "s3://lake/rawx/y",
            "s3://lake/other/",
            "s3://lake/raw/../secret/x",
            "s3://lake/raw/%2e%2e/secret",
            "s3://other-bucket/raw/",
            "gs://lake/raw/x",
            "/tmp/x",
            "s3://landing/../../x",
            "s3://lake/raw/a/../b",
            "s3://lake/secret/f.parquet#/../../raw/x",
        ] {
            assert!(sandbox.check("COPY … TO", bad).is_err(), "{bad}");
        }
        let every_bucket = Sandbox::of(&["s3://"]).unwrap();
        assert_eq!(every_bucket.check("read_parquet", "s3://any/x"), Ok(()));
        assert!(every_bucket.check("read_parquet", "/tmp/x").is_err());
    }
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn the_data_directory_is_basins_except_its_user_area() {
        let dir = std::env::temp_dir().join(format!("basin-sandbox-cfg-{}", std::process::id()));
        let mut config = BasinConfig::default();
        config.server.data_dir = dir.join("data");
        config.security.allowed_locations = Some(vec![dir.display().to_string()]);
        let sandbox = Sandbox::from_config(&config).unwrap();
        let d = dir.display();
        assert_eq!(
            sandbox.check("COPY … TO", &format!("{d}/data/files/x.csv")),
            Ok(())
        );
        assert_eq!(
            sandbox.check("COPY … TO", &format!("{d}/other/x.csv")),
            Ok(())
        );
        for own in ["data/lake/warehouse/t/metadata/x.json", "data/catalog.db"] {
            let err = sandbox
                .check("COPY … TO", &format!("{d}/{own}"))
                .unwrap_err();
            assert!(err.contains("Basin's data directory"), "{own}: {err}");
        }
        assert!(sandbox.check("read_csv", "/etc/passwd").is_err());
        // No [storage.s3]: no bucket.
        assert!(sandbox.check("read_parquet", "s3://lake/x").is_err());

        // An Iceberg warehouse in a bucket: for its tables, not for files.
        config.storage.s3 = Some(Default::default());
        config.security.allowed_locations = None;
        config.catalogs.insert(
            "rest".into(),
            toml::from_str(
                "connector = \"iceberg\"\nkind = \"rest\"\nuri = \"http://x\"\n\
                 warehouse = \"s3://lake/wh\"",
            )
            .unwrap(),
        );
        let sandbox = Sandbox::from_config(&config).unwrap();
        assert_eq!(sandbox.check("read_parquet", "s3://landing/x"), Ok(()));
        let err = sandbox
            .check("read_parquet", "s3://lake/wh/db/t/data/")
            .unwrap_err();
        assert!(err.contains("Iceberg warehouse"), "{err}");
        assert_eq!(
            sandbox.check_table_location("location", "s3://lake/wh/db/t2"),
            Ok(())
        );
        // With access rules no bucket is open by default.
        config.security.rules_file = Some("/etc/basin/rules.toml".into());
        let sandbox = Sandbox::from_config(&config).unwrap();
        assert!(sandbox.check("read_parquet", "s3://landing/x").is_err());
    }
}
