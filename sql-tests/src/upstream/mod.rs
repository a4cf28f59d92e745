//! DataFusion's own sqllogictest files, run on a Basin cluster: a peer's test suite as a
//! check that Basin's rewrites and routes keep DataFusion's answers.
//!
//! ```text
//!  ~/.cargo/registry/src/*/datafusion-sqllogictest-53.1.0/test_files/**.slt   (cargo fetch, .ci/run)
//!        │ copied into a working tree laid out like DataFusion's checkout
//!        ▼
//!  <tmp>/datafusion/sqllogictest/{test_files,data}  ◄── the process's working directory
//!        │ record by record, every file its own session (UpstreamDb)
//!        ▼
//!  Basin session ─► route: inprocess | cluster | jobs ─► rows printed as DataFusion prints them
//!        │
//!        ▼
//!  differences  vs  sql-tests/datafusion-differences.toml  ─► a new difference fails
//! ```
//!
//! The files are not committed and the crate is not a dependency (it would build DataFusion's
//! test harness and Spark functions): `.ci/run` fetches the crate's source with `cargo fetch`
//! through a throwaway manifest, and the runner finds it in Cargo's registry (or at
//! `BASIN_DATAFUSION_SLT_DIR`). Paths in the files are relative to DataFusion's
//! `datafusion/sqllogictest` folder: `test_files/...` and `data/...` are in the crate,
//! `../datasource-arrow/tests/...` in the crate of that name; `../core/tests/data` and
//! `../../testing` (git submodules of DataFusion) are not published, and the records that
//! read them are listed differences with that reason.
//!
//! DataFusion's driver registers a few tables and functions in Rust for some files (e.g.
//! `joins.slt`, `map.slt`, `metadata.slt`) and the Spark functions for `spark/`; Basin's
//! sessions have neither, so those records differ too.

mod db;
pub mod differences;
pub mod format;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::prelude::SessionContext;
use sqllogictest::{Record, Runner, parse_file, strict_column_validator};

use db::UpstreamDb;
use differences::{Differences, FileDifference, Observed, TIMEOUT, categorize, listed_sql};

/// The release of DataFusion Basin builds on, whose files are run.
pub const CRATE: &str = "datafusion-sqllogictest-53.1.0";

/// A session on the route being tested.
pub type Connect = Arc<dyn Fn() -> Result<SessionContext, String> + Send + Sync>;

/// Finds the crate's source: `BASIN_DATAFUSION_SLT_DIR`, else Cargo's registry
/// (`$CARGO_HOME/registry/src/*/datafusion-sqllogictest-53.1.0`). `None` when absent.
pub fn locate() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("BASIN_DATAFUSION_SLT_DIR") {
        return Some(PathBuf::from(dir));
    }
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let registries = std::fs::read_dir(cargo_home.join("registry").join("src")).ok()?;
    let mut found: Vec<PathBuf> = registries
        .flatten()
        .map(|r| r.path().join(CRATE))
        .filter(|p| p.join("test_files").is_dir())
        .collect();
    found.sort();
    found.into_iter().next()
}

/// The working tree the files run in.
pub struct Corpus {
    /// The temporary root, shown as `WORKSPACE_ROOT` (DataFusion's checkout).
    pub root: PathBuf,
    /// `<root>/datafusion/sqllogictest`: the working directory while the files run.
    pub dir: PathBuf,
}

impl Corpus {
    /// Copies the crate's `test_files` and `data` into a new working tree, so files the
    /// tests write (`test_files/scratch/<file>/`) never land in Cargo's registry.
    pub fn prepare(source: &Path) -> Result<Self, String> {
        let root = std::env::temp_dir().join(format!("basin-dfslt-{}", std::process::id()));
        let dir = root.join("datafusion").join("sqllogictest");
        for sub in ["test_files", "data"] {
            copy_dir(&source.join(sub), &dir.join(sub))?;
        }
        // `../datasource-arrow/tests/data/...`: in the published crate of that name.
        if let Some(registry) = source.parent() {
            let arrow = registry.join(CRATE.replace("sqllogictest", "datasource-arrow"));
            if arrow.is_dir() {
                let link = root.join("datafusion").join("datasource-arrow");
                let _ = std::os::unix::fs::symlink(&arrow, &link);
            }
        }
        Ok(Self { root, dir })
    }

    /// The `.slt` files (paths relative to `test_files`), sorted, those containing `filter`
    /// (or one of its comma-separated parts: `group_by.slt,window.slt`).
    pub fn files(&self, filter: Option<&str>) -> Vec<String> {
        let base = self.dir.join("test_files");
        let mut out = vec![];
        let mut dirs = vec![base.clone()];
        while let Some(d) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "slt")
                    && let Ok(rel) = path.strip_prefix(&base)
                {
                    let rel = rel.display().to_string();
                    if filter.is_none_or(|f| f.split(',').any(|part| rel.contains(part))) {
                        out.push(rel);
                    }
                }
            }
        }
        out.sort();
        out
    }

    fn root_text(&self) -> String {
        self.root.display().to_string()
    }
}

impl Drop for Corpus {
    fn drop(&mut self) {
        if std::env::var_os("BASIN_KEEP_TEST_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    let entries =
        std::fs::read_dir(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &target)?;
        } else {
            std::fs::copy(&path, &target)
                .map_err(|e| format!("cannot copy {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// What one route did with the files.
#[derive(Default)]
pub struct RouteRun {
    /// The files run (not skipped).
    pub ran: BTreeSet<String>,
    /// Files that could not run at all, to skip when the list is written.
    pub unrunnable: Vec<FileDifference>,
    /// Records that differed.
    pub observed: Vec<Observed>,
    pub records: usize,
    pub skipped_files: usize,
    pub elapsed: Duration,
}

/// A file may take this many statement deadlines in all.
const FILE_DEADLINES: u32 = 60;

/// How one statement may run before its record fails (`BASIN_TEST_DEADLINE_SECS` if set).
fn deadline() -> Duration {
    std::env::var("BASIN_TEST_DEADLINE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_secs)
}

/// Runs `files` on one route, `parallel` files at a time. Files the list skips on this
/// route are not run unless `all`.
pub async fn run_route(
    corpus: &Corpus,
    route: &str,
    files: &[String],
    connect: Connect,
    list: &Differences,
    all: bool,
    parallel: usize,
) -> RouteRun {
    let start = Instant::now();
    let mut run = RouteRun::default();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for file in files {
        if !all && list.skipped(file, route).is_some() {
            run.skipped_files += 1;
            continue;
        }
        run.ran.insert(file.clone());
        let semaphore = semaphore.clone();
        let connect = connect.clone();
        let file = file.clone();
        let dir = corpus.dir.clone();
        let root = corpus.root_text();
        let route = route.to_string();
        // Records known to hang, on this route or another, are not run again (each would
        // cost the whole deadline; most are hangs, not slow statements, and a route seen
        // for the first time would spend ten minutes on them); they are listed as timeouts
        // of this route too.
        let hangs: Vec<Observed> = if all {
            vec![]
        } else {
            list.records
                .iter()
                .filter(|r| r.file == file && r.category == TIMEOUT)
                .map(|r| Observed {
                    file: r.file.clone(),
                    part: r.part.clone(),
                    line: r.line,
                    sql: r.sql.clone(),
                    category: r.category.clone(),
                    reason: r.reason.clone(),
                    detail: String::new(),
                })
                .collect()
        };
        tasks.spawn(async move {
            let _permit = semaphore.acquire_owned().await;
            let start = Instant::now();
            if std::env::var_os("BASIN_TEST_VERBOSE").is_some() {
                println!("[{route}] starting {file}");
            }
            // Statements have their own deadline; this one catches a hang between them
            // (a session that never opens, a file's tables never dropped).
            let limit = deadline() * FILE_DEADLINES;
            let done = match tokio::time::timeout(
                limit,
                run_file(&dir, &root, &route, &file, connect, hangs),
            )
            .await
            {
                Ok(done) => done,
                Err(_) => FileRun::Unrunnable(FileDifference {
                    path: file.clone(),
                    routes: vec![route.clone()],
                    category: TIMEOUT.to_string(),
                    reason: format!("the file did not finish within {limit:?}"),
                    note: None,
                }),
            };
            (file, start.elapsed(), done)
        });
    }
    let total = tasks.len();
    let mut finished = 0;
    while let Some(done) = tasks.join_next().await {
        finished += 1;
        if let Ok((file, took, done)) = &done {
            let what = match done {
                FileRun::Ran { records, observed } => {
                    format!("{records} records, {} differ", observed.len())
                }
                FileRun::Unrunnable(f) => format!("not run: {}", f.reason),
            };
            println!(
                "[{route}] {finished}/{total} {file}: {what} ({:.1} s)",
                took.as_secs_f64()
            );
        }
        match done.map(|(_, _, d)| d) {
            Ok(FileRun::Ran { records, observed }) => {
                run.records += records;
                run.observed.extend(observed);
            }
            Ok(FileRun::Unrunnable(skip)) => run.unrunnable.push(skip),
            Err(e) => eprintln!("[{route}] a file's task failed: {e}"),
        }
    }
    run.observed.sort_by_key(|o| o.key());
    run.unrunnable.sort_by(|a, b| a.path.cmp(&b.path));
    run.elapsed = start.elapsed();
    run
}

enum FileRun {
    Ran {
        records: usize,
        observed: Vec<Observed>,
    },
    Unrunnable(FileDifference),
}

async fn run_file(
    dir: &Path,
    root: &str,
    route: &str,
    file: &str,
    connect: Connect,
    hangs: Vec<Observed>,
) -> FileRun {
    let unrunnable = |category: &str, reason: String| {
        FileRun::Unrunnable(FileDifference {
            path: file.to_string(),
            routes: vec![route.to_string()],
            category: category.to_string(),
            reason,
            note: None,
        })
    };
    let test_files = dir.join("test_files");
    let path = test_files.join(file);
    // `test_files/scratch/<file stem>/`, empty, as DataFusion's driver prepares it.
    let stem = Path::new(file)
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let scratch = test_files.join("scratch").join(&stem);
    let _ = std::fs::remove_dir_all(&scratch);
    let _ = std::fs::create_dir_all(&scratch);
    let records = match parse_file::<format::DataFusionColumnType>(&path) {
        Ok(records) => records,
        Err(e) => return unrunnable("parse", format!("sqllogictest cannot parse it: {e}")),
    };
    let ctx = match connect() {
        Ok(ctx) => ctx,
        Err(e) => return unrunnable("session", format!("no session: {e}")),
    };
    let missing = MissingData::of(&records, dir);
    let root_for_db = root.to_string();
    let limit = deadline();
    let mut runner = Runner::new(move || {
        let db = UpstreamDb::new(ctx.clone(), root_for_db.clone(), limit);
        async move { Ok::<_, db::UpstreamError>(db) }
    });
    runner.add_label("Datafusion");
    runner.add_label("basin");
    runner.add_label(route);
    runner.with_column_validator(strict_column_validator);
    runner.with_normalizer(trim_end);
    runner.with_validator(validate);
    let mut count = 0;
    let mut observed = vec![];
    let relative = |loc: &sqllogictest::Location| {
        let at = Path::new(loc.file())
            .strip_prefix(&test_files)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| loc.file().to_string());
        (at != file).then_some(at)
    };
    for record in records {
        let sql = match &record {
            Record::Halt { .. } => break,
            Record::Statement { sql, loc, .. } | Record::Query { sql, loc, .. } => {
                let part = relative(loc);
                if let Some(hang) = hangs
                    .iter()
                    .find(|h| h.part == part && h.line == loc.line())
                {
                    observed.push(hang.clone());
                    continue;
                }
                count += 1;
                sql.clone()
            }
            _ => String::new(),
        };
        if let Err(e) = runner.run_async(record).await {
            let loc = e.location();
            let kind = e.kind();
            if only_row_order_differs(&kind, &sql) {
                continue;
            }
            let (mut category, mut reason) = categorize(&kind, &sql, root);
            if let Some(why) = missing.read_by(&sql) {
                category = "missing-data-file".to_string();
                reason = why;
            }
            observed.push(Observed {
                file: file.to_string(),
                part: relative(&loc),
                line: loc.line(),
                sql: listed_sql(&sql),
                category,
                reason,
                detail: e.display(false).to_string().replace(root, "WORKSPACE_ROOT"),
            });
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    FileRun::Ran {
        records: count,
        observed,
    }
}

/// What a file reads from data files the published crate lacks (`../core/tests/data`,
/// `../../testing`, ...): the paths, and the tables over them or made from them. A record
/// that reads them differs because the data is missing (often as zero rows, for a listing
/// table over a missing folder), not because Basin answers wrongly.
struct MissingData {
    paths: Vec<String>,
    /// (table, the missing path it reads).
    tables: Vec<(String, String)>,
}

impl MissingData {
    fn of<T: sqllogictest::ColumnType>(records: &[Record<T>], dir: &Path) -> Self {
        let mut found = Self {
            paths: vec![],
            tables: vec![],
        };
        for record in records {
            let (Record::Statement { sql, .. } | Record::Query { sql, .. }) = record else {
                continue;
            };
            for path in quoted_paths(sql) {
                let local = path.strip_prefix("file://").unwrap_or(&path);
                if !found.paths.contains(&path) && !dir.join(local).exists() {
                    found.paths.push(path);
                }
            }
            // A table created over (or from) missing data is missing data too.
            if let Some(table) = created_table(sql)
                && let Some(why) = found.source_of(sql)
            {
                found.tables.push((table, why));
            }
        }
        found
    }

    fn source_of(&self, sql: &str) -> Option<String> {
        if let Some(path) = self.paths.iter().find(|p| sql.contains(p.as_str())) {
            return Some(path.clone());
        }
        let words = identifiers(sql);
        self.tables
            .iter()
            .find(|(t, _)| words.contains(t))
            .map(|(_, path)| path.clone())
    }

    /// Why `sql` differs for want of data, if it reads some.
    fn read_by(&self, sql: &str) -> Option<String> {
        self.source_of(sql)
            .map(|path| format!("reads {path}, which the published crate does not contain"))
    }
}

/// Quoted strings that look like relative or file paths (`'../x'`, `'data/x'`, ...).
fn quoted_paths(sql: &str) -> Vec<String> {
    sql.split('\'')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            (s.starts_with("../")
                || s.starts_with("test_files/")
                || s.starts_with("data/")
                || s.starts_with("file://"))
                && !s.contains("scratch/")
        })
        .map(str::to_string)
        .collect()
}

/// The table a `CREATE [EXTERNAL|OR REPLACE] TABLE|VIEW name` makes.
fn created_table(sql: &str) -> Option<String> {
    let words = identifiers(sql);
    if words.first().map(String::as_str) != Some("create") {
        return None;
    }
    let at = words.iter().position(|w| w == "table" || w == "view")?;
    let mut rest = words[at + 1..].iter();
    let mut name = rest.next()?;
    if name == "if" {
        // IF NOT EXISTS
        name = rest.nth(2)?;
    }
    Some(name.clone())
}

/// The identifier-like words of `sql`, lower case.
fn identifiers(sql: &str) -> Vec<String> {
    sql.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect()
}

/// A query without a top-level ORDER BY that returned DataFusion's rows in another order:
/// SQL does not fix the order, and distributed plans (other partitions, other executors)
/// return rows in another order than one process, from run to run.
fn only_row_order_differs(kind: &sqllogictest::TestErrorKind, sql: &str) -> bool {
    let sqllogictest::TestErrorKind::QueryResultMismatch {
        expected, actual, ..
    } = kind
    else {
        return false;
    };
    if has_top_level_order_by(sql) {
        return false;
    }
    let sorted = |text: &str| {
        let mut lines: Vec<String> = text.lines().map(|l| l.trim_end().to_string()).collect();
        lines.sort();
        lines
    };
    sorted(expected) == sorted(actual)
}

/// Whether `sql` has an ORDER BY outside parentheses and quotes (not one of an aggregate's
/// or a window's).
fn has_top_level_order_by(sql: &str) -> bool {
    let mut depth = 0i32;
    let mut quoted = false;
    let mut outside = String::with_capacity(sql.len());
    for c in sql.chars() {
        match c {
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            c if !quoted && depth == 0 => outside.push(c.to_ascii_lowercase()),
            _ => outside.push(' '),
        }
    }
    let words: Vec<&str> = outside.split_whitespace().collect();
    words.windows(2).any(|w| w == ["order", "by"])
}

/// Trailing whitespace of expected lines is ignored, as in DataFusion's driver.
#[allow(clippy::ptr_arg)] // sqllogictest's `Normalizer` is `fn(&String) -> String`
fn trim_end(s: &String) -> String {
    s.trim_end().to_string()
}

/// DataFusion's comparison (rows joined by spaces, trailing whitespace ignored,
/// `<slt:ignore>` standing for any text), except that numbers with a fraction may differ
/// in the 13th significant digit: a distributed sum adds in another order than one
/// process does.
fn validate(
    normalizer: sqllogictest::Normalizer,
    actual: &[Vec<String>],
    expected: &[String],
) -> bool {
    const IGNORE: &str = "<slt:ignore>";
    let expected: Vec<String> = expected.iter().map(normalizer).collect();
    let actual: Vec<String> = actual
        .iter()
        .map(|row| row.join(" ").trim_end().to_string())
        .collect();
    if expected.iter().any(|l| l.contains(IGNORE)) {
        return matches_with_ignored(&actual.join("\n"), &expected.join("\n"), IGNORE);
    }
    actual.len() == expected.len()
        && actual.iter().zip(&expected).all(|(a, e)| {
            a == e || {
                let (a, e): (Vec<&str>, Vec<&str>) =
                    (a.split(' ').collect(), e.split(' ').collect());
                a.len() == e.len()
                    && a.iter()
                        .zip(&e)
                        .all(|(a, e)| a == e || close_fractions(a, e))
            }
        })
}

/// `expected` with `marker` standing for any text matches `actual`; text before the first
/// marker must start `actual`.
fn matches_with_ignored(actual: &str, expected: &str, marker: &str) -> bool {
    let mut at = 0;
    for (i, piece) in expected.split(marker).enumerate() {
        if piece.is_empty() {
            continue;
        }
        match actual[at..].find(piece) {
            Some(found) if i > 0 || found == 0 => at += found + piece.len(),
            _ => return false,
        }
    }
    true
}

fn close_fractions(a: &str, e: &str) -> bool {
    let fractional = |s: &str| {
        s.contains('.')
            && s.bytes()
                .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-')
    };
    if !fractional(a) || !fractional(e) {
        return false;
    }
    match (a.parse::<f64>(), e.parse::<f64>()) {
        (Ok(x), Ok(y)) => (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_by_of_the_query_not_of_an_aggregate() {
        assert!(has_top_level_order_by("SELECT a FROM t ORDER BY a"));
        assert!(!has_top_level_order_by(
            "SELECT ARRAY_AGG(a ORDER BY a) FROM t GROUP BY b"
        ));
        assert!(!has_top_level_order_by("SELECT 'order by' FROM t"));
        assert!(has_top_level_order_by(
            "SELECT * FROM (SELECT a FROM t ORDER BY a) ORDER BY 1"
        ));
    }

    #[test]
    fn comparison_is_datafusions_with_summation_order_allowed() {
        let n = trim_end;
        let row = |s: &str| vec![s.to_string()];
        assert!(validate(n, &[row("1 a")], &["1 a  ".to_string()]));
        assert!(!validate(n, &[row("1 a")], &["1 b".to_string()]));
        assert!(validate(
            n,
            &[row("0.1234567890123")],
            &["0.1234567890124".to_string()]
        ));
        assert!(!validate(n, &[row("0.12345")], &["0.12346".to_string()]));
        assert!(!validate(n, &[row("12")], &["13".to_string()]));
        let plan = [row("plan: A"), row("B x=1")];
        assert!(validate(
            n,
            &plan,
            &[
                "plan: <slt:ignore>".to_string(),
                "B <slt:ignore>".to_string()
            ]
        ));
        assert!(!validate(n, &plan, &["B <slt:ignore>".to_string()]));
    }
}
