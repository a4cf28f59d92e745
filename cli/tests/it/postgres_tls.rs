//! PostgreSQL over TLS on every path (pooled statements, split COPY reads under one snapshot,
//! metadata): a throwaway server that refuses anything but TLS (`hostnossl … reject`), with a
//! CA and a server certificate made here with `openssl`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{RunWithin, in_ci, scratch_dir, stderr, stdout};

/// The directory of PostgreSQL's server programs (Debian's layout).
fn pg_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop()
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what}: {}", stderr(&out));
}

struct Server {
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a CA and a certificate for 127.0.0.1/localhost signed by it into `dir`.
fn certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        run(
            Command::new("openssl").args(args).current_dir(dir),
            &format!("openssl {}", args[0]),
        )
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=basin test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(
        dir.join("san.cnf"),
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
    ]);
}

#[test]
fn postgres_reads_over_tls_on_every_path() {
    let (Some(bin), true) = (
        pg_bin(),
        Command::new("openssl").arg("version").output().is_ok(),
    ) else {
        let msg = "postgres_reads_over_tls_on_every_path: skipped: PostgreSQL's initdb or \
                   openssl is not installed (apt-get install postgresql openssl)";
        assert!(!in_ci(), "{msg}");
        eprintln!("{msg}");
        return;
    };
    let dir = scratch_dir("pgtls");
    std::fs::set_permissions(&*dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    certificates(&dir);
    // PostgreSQL refuses to run as root: as `postgres`, owning its files.
    let root = is_root();
    let as_user = |program: &Path| {
        let mut cmd = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        cmd.current_dir(&*dir);
        cmd
    };
    if root {
        run(
            Command::new("chown").args(["-R", "postgres"]).arg(&*dir),
            "chown",
        );
    }
    run(
        as_user(&bin.join("initdb")).args([
            "-D",
            "data",
            "-U",
            "basin",
            "--auth=trust",
            "-E",
            "UTF8",
        ]),
        "initdb",
    );
    // TLS only: every connection without it is refused.
    let hba = dir.join("data/pg_hba.conf");
    std::fs::write(
        &hba,
        "hostnossl all all 127.0.0.1/32 reject\nhostssl all all 127.0.0.1/32 trust\nlocal all all trust\n",
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let key = dir.join("server.key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let child = as_user(&bin.join("postgres"))
        .args(["-D", "data", "-p", &port.to_string(), "-k"])
        .arg(&*dir)
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "ssl=on",
            "-c",
            "fsync=off",
            "-c",
            "ssl_cert_file=../server.crt",
            "-c",
            "ssl_key_file=../server.key",
            "-c",
            "log_statement=all",
            "-c",
            "log_line_prefix=%m [%p] %a: ",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("postgres.log")).unwrap())
        .spawn()
        .unwrap();
    let _server = Server { child };
    let url = format!("postgres://basin@127.0.0.1:{port}/postgres");
    let psql = |sql: &str| {
        let out = Command::new("psql")
            .arg(format!("{url}?sslmode=require"))
            .args(["-v", "ON_ERROR_STOP=1", "-q", "-A", "-t", "-c", sql])
            .output()
            .unwrap();
        (out.status.success(), stdout(&out), stderr(&out))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !psql("SELECT 1").0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the TLS-only server did not start: {}",
            std::fs::read_to_string(dir.join("postgres.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (ok, _, err) = psql(
        "CREATE TABLE t AS SELECT g AS id, g % 7 AS k, repeat('x', 40) AS pad \
         FROM generate_series(1, 100000) g; ANALYZE t",
    );
    assert!(ok, "{err}");
    let ca = dir.join("ca.pem");
    let basin = |tls: &str, extra: &str, sql: &str| {
        let config = dir.join(format!("basin-{tls}.toml"));
        std::fs::write(
            &config,
            format!(
                "[catalogs.pg]\nconnector = \"postgres\"\nurl = \"{url}\"\ntls = \"{tls}\"\n\
                 split_size_bytes = 1048576\nmax_splits = 4\n{extra}"
            ),
        )
        .unwrap();
        Command::new(env!("CARGO_BIN_EXE_basin"))
            .args(["standalone", "--format", "csv", "--config"])
            .arg(&config)
            .args(["-e", sql])
            .env_remove("BASIN_CONFIG")
            .env("BASIN_DATA_DIR", dir.join("data-basin"))
            .run_within()
    };
    let ca_line = format!("tls_ca_file = \"{}\"\n", ca.display());
    for (tls, extra) in [("require", ""), ("verify-full", ca_line.as_str())] {
        // A pushed aggregate (pooled statement) and a split scan (COPY under one snapshot).
        let out = basin(
            tls,
            extra,
            "SELECT count(*) AS n, sum(k) AS s FROM pg.public.t; \
             EXPLAIN SELECT id, pad FROM pg.public.t; \
             SELECT count(*) AS n FROM (SELECT id, pad FROM pg.public.t WHERE pad <> 'y') q",
        );
        assert!(out.status.success(), "tls = {tls}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(
            text.starts_with("n,s\n100000,300000\n"),
            "tls = {tls}: {text}"
        );
        assert!(
            text.contains("splits=4"),
            "tls = {tls}: expected split reads: {text}"
        );
        assert!(
            text.trim_end().ends_with("n\n100000"),
            "tls = {tls}: {text}"
        );
    }
    // Every session of those runs was encrypted: the server refuses any other (hostnossl
    // … reject), and none was refused.
    let log = std::fs::read_to_string(dir.join("postgres.log")).unwrap_or_default();
    assert!(log.contains("basin standalone"), "{log}");
    assert!(!log.contains("no encryption"), "{log}");
    // Without the CA the certificate does not verify; without TLS the server refuses.
    for (tls, want) in [("verify-full", "certificate"), ("disable", "no encryption")] {
        let out = basin(tls, "", "SELECT count(*) FROM pg.public.t");
        assert!(!out.status.success(), "tls = {tls}");
        let err = stderr(&out);
        assert!(err.to_lowercase().contains(want), "tls = {tls}: {err}");
    }
}

/// Whether this process runs as root.
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
