//! Runs Basin's sqllogictest suites, and DataFusion's own sqllogictest files, against a
//! Basin cluster on each route:
//!
//! - `inprocess`: an in-process standalone cluster, sessions with the cluster in view
//!   (streamed stages, small queries whole on one executor, else Ballista jobs);
//! - `cluster`: a real multi-process cluster (`basin scheduler` + 2 `basin executor`
//!   processes), sessions in this process, so every query is a Ballista job;
//! - `jobs`: an in-process cluster with `streamed_stages = false`: every query a Ballista job;
//! - `exchanges`: an in-process cluster with `single_node_max_bytes = 0`: every query with a
//!   join, GROUP BY or window runs in stages over both executors, streaming to each other.
//!
//! ```text
//! cargo test -p basin-sql-tests --test sqllogictests [-- [--complete] [--mode inprocess,cluster,jobs,exchanges]
//!     [--datafusion] [--record-differences] [--all] [--parallel N] [FILTER]]
//! ```
//!
//! Without `--datafusion`, Basin's own suites run (on `inprocess` and `cluster` unless
//! `--mode` says otherwise); with it, DataFusion's files (on `inprocess`, `exchanges` and
//! `jobs` unless `--mode` says otherwise). Suites are folders under `sql-tests/suites/`. `--complete` rewrites expected results from
//! Basin's output (never use it on suites whose answers come from another engine: those
//! folders hold a `REFERENCE` marker and are skipped by `--complete`).
//!
//! DataFusion's files ([`basin_sql_tests::upstream`]) are compared with their own expected
//! results; where Basin differs, the record must be listed in
//! `sql-tests/datafusion-differences.toml`, which `--record-differences` writes for the
//! routes and files run. `--all` also runs the files the list skips whole.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use basin_cli::cluster::{StandaloneCluster, StandaloneOptions};
use basin_core::BasinConfig;
use sqllogictest::{Runner, default_column_validator, default_normalizer};

use basin_sql_tests::engine::{self, BasinDb};
use basin_sql_tests::process_cluster::ProcessCluster;
use basin_sql_tests::upstream::{self, Connect, differences};
use basin_sql_tests::validate;

struct Args {
    complete: bool,
    /// Routes given with `--mode`; else every route.
    modes: Option<Vec<String>>,
    filter: Option<String>,
    /// DataFusion's files instead of Basin's own suites.
    datafusion: bool,
    record: bool,
    all: bool,
    parallel: usize,
    /// With `--record-differences`: how many times each route runs the files; a record
    /// whose outcome changes between them is listed as unstable.
    runs: usize,
}

/// Routes Basin's own suites run on by default.
const BASIN_ROUTES: [&str; 2] = ["inprocess", "cluster"];
/// Routes DataFusion's files run on by default (in CI); `--mode` chooses others. Writing the
/// list with `--runs 2` took 2 × 83 s on `inprocess`, 2 × 98 s on `exchanges` and 2 × 188 s
/// on `jobs` (debug build, 2 files at a time); a check skips the listed timeouts. The
/// `cluster` route (processes) is checked in CI on the files of `sql-tests/cluster-files`.
const DATAFUSION_ROUTES: [&str; 3] = ["inprocess", "exchanges", "jobs"];

fn parse_args() -> Args {
    let mut args = Args {
        complete: false,
        modes: None,
        filter: None,
        datafusion: false,
        record: false,
        all: false,
        parallel: 2,
        runs: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--complete" => args.complete = true,
            "--mode" => {
                if let Some(m) = it.next() {
                    args.modes = Some(m.split(',').map(str::to_string).collect());
                }
            }
            "--datafusion" => args.datafusion = true,
            "--record-differences" => {
                args.record = true;
                args.datafusion = true;
            }
            "--all" => args.all = true,
            "--runs" => {
                if let Some(n) = it.next().and_then(|n| n.parse().ok()) {
                    args.runs = n;
                }
            }
            "--parallel" => {
                if let Some(n) = it.next().and_then(|n| n.parse().ok()) {
                    args.parallel = n;
                }
            }
            // Flags cargo or libtest-style runners pass; nothing to do with them.
            s if s.starts_with("--") => {}
            s => args.filter = Some(s.to_string()),
        }
    }
    args
}

/// Whether this runs in CI, where a missing prerequisite fails instead of skipping.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn suite_files(filter: Option<&str>) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("suites");
    let mut files = vec![];
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "slt")
                && filter.is_none_or(|f| path.to_string_lossy().contains(f))
            {
                files.push(path);
            }
        }
    }
    files.sort();
    let derived = derived_suites(&files, filter);
    files.extend(derived);
    files
}

/// A suite directory with a `DERIVE` file reuses another suite's files with text
/// replaced, e.g. the TPC-H queries and reference answers over Iceberg copies of the
/// tables. `DERIVE` lines: `from = <suite dir>` and `replace = <old> => <new>`. The
/// derived files are written to a temporary directory and run after the suite's own files.
fn derived_suites(own: &[PathBuf], filter: Option<&str>) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("suites");
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir(&root) else {
        return out;
    };
    let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    dirs.sort();
    for dir in dirs {
        let Ok(spec) = std::fs::read_to_string(dir.join("DERIVE")) else {
            continue;
        };
        let suite = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        // Run a derived suite only with its own setup files.
        if !own.iter().any(|f| f.starts_with(&dir)) {
            continue;
        }
        let mut from = None;
        let mut replacements = vec![];
        for line in spec.lines().map(str::trim) {
            if let Some(v) = line.strip_prefix("from =") {
                from = Some(root.join(v.trim()));
            } else if let Some(v) = line.strip_prefix("replace =")
                && let Some((a, b)) = v.split_once("=>")
            {
                replacements.push((a.trim().to_string(), b.trim().to_string()));
            }
        }
        let Some(from) = from else { continue };
        let target = derived_dir().join(&suite);
        if std::fs::create_dir_all(&target).is_err() {
            continue;
        }
        let _ = std::fs::write(target.join("REFERENCE"), "derived\n");
        let Ok(sources) = std::fs::read_dir(&from) else {
            continue;
        };
        let mut sources: Vec<PathBuf> = sources
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "slt"))
            .collect();
        sources.sort();
        for source in sources {
            let Ok(mut text) = std::fs::read_to_string(&source) else {
                continue;
            };
            for (a, b) in &replacements {
                text = text.replace(a.as_str(), b.as_str());
            }
            let path = target.join(source.file_name().unwrap_or_default());
            if filter.is_none_or(|f| path.to_string_lossy().contains(f) || suite.contains(f))
                && std::fs::write(&path, text).is_ok()
            {
                out.push(path);
            }
        }
    }
    out
}

/// Where derived suites are written for this run (removed when every test passed).
fn derived_dir() -> PathBuf {
    std::env::temp_dir().join(format!("basin-sqltest-derived-{}", std::process::id()))
}

fn is_reference_suite(file: &Path) -> bool {
    file.parent().is_some_and(|d| d.join("REFERENCE").exists())
}

fn relative(file: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    file.strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string()
}

async fn run_files(
    mode: &str,
    files: &[PathBuf],
    connect: Connect,
    complete: bool,
) -> (usize, Vec<String>) {
    let mut passed = 0;
    let mut failures = vec![];
    for file in files {
        let connect = connect.clone();
        let mut runner = Runner::new(move || {
            let connect = connect.clone();
            async move {
                connect().map(BasinDb::new).map_err(|e| {
                    engine::EngineError(datafusion::error::DataFusionError::Execution(e))
                })
            }
        });
        runner.with_validator(validate::tolerant_validator);
        runner.with_column_validator(default_column_validator);
        runner.add_label("basin");
        runner.add_label(mode);
        let name = relative(file);
        let result = if complete && !is_reference_suite(file) {
            runner
                .update_test_file(
                    file,
                    " ",
                    validate::tolerant_validator,
                    default_normalizer,
                    default_column_validator,
                )
                .await
                .map_err(|e| e.to_string())
        } else {
            runner
                .run_file_async(file)
                .await
                .map_err(|e| e.display(false).to_string())
        };
        match result {
            Ok(()) => {
                println!("[{mode}] ok   {name}");
                passed += 1;
            }
            Err(e) => {
                println!("[{mode}] FAIL {name}\n{e}");
                failures.push(format!("[{mode}] {name}"));
            }
        }
    }
    (passed, failures)
}

fn main() -> std::process::ExitCode {
    // `BASIN_LOG=ballista_scheduler=debug,…` shows the in-process cluster's events.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("BASIN_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
    // Planning deep TPC-H queries recurses further than Tokio's default 2 MiB stacks allow
    // in debug builds.
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(16 * 1024 * 1024)
        .build()
    {
        Ok(rt) => rt.block_on(run()),
        Err(e) => {
            eprintln!("cannot start the Tokio runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A running cluster of one route, and how to open sessions on it.
enum Cluster {
    InProcess(Arc<StandaloneCluster>),
    Processes(Arc<ProcessCluster>),
}

async fn start_route(mode: &str, config: &Arc<BasinConfig>) -> Result<(Cluster, Connect), String> {
    match mode {
        "inprocess" | "jobs" | "exchanges" => {
            let mut config = config.as_ref().clone();
            // `jobs`: no streamed stage, no query whole on one executor.
            config.server.streamed_stages = mode != "jobs";
            // `exchanges`: no query whole on one executor, every exchange streamed.
            if mode == "exchanges" {
                config.server.single_node_max_bytes = 0;
                config.server.streamed_exchanges = true;
            }
            let cluster = StandaloneCluster::start(Arc::new(config), StandaloneOptions::default())
                .await
                .map(Arc::new)
                .map_err(|e| format!("[{mode}] cluster start: {e}"))?;
            let c = cluster.clone();
            let connect: Connect = Arc::new(move || c.connect().map_err(|e| e.to_string()));
            Ok((Cluster::InProcess(cluster), connect))
        }
        "cluster" => {
            let cluster = match tokio::task::spawn_blocking(|| ProcessCluster::start(2, 2)).await {
                Ok(Ok(c)) => Arc::new(c),
                Ok(Err(e)) => return Err(format!("[cluster] cluster start: {e}")),
                Err(e) => return Err(format!("[cluster] cluster start panicked: {e}")),
            };
            let url = cluster.url();
            let mut cfg = config.as_ref().clone();
            cfg.cluster.secret = Some(basin_core::Secret::new(cluster.secret.clone()));
            let cfg = Arc::new(cfg);
            let connect: Connect = Arc::new(move || {
                basin_scheduler::connect(&cfg, &url, 4, None).map_err(|e| e.to_string())
            });
            Ok((Cluster::Processes(cluster), connect))
        }
        other => Err(format!(
            "unknown mode {other}: use inprocess, cluster, jobs or exchanges"
        )),
    }
}

/// Distribution: the tasks ran on more than one executor (and none on the scheduler).
fn check_distribution(mode: &str, cluster: &Cluster) -> Result<(), String> {
    match cluster {
        Cluster::InProcess(cluster) => {
            let executors: BTreeSet<String> = cluster
                .task_log()
                .records()
                .into_iter()
                .map(|r| r.executor)
                .collect();
            if executors.len() >= 2 {
                println!("[{mode}] ok   tasks ran on {} executors", executors.len());
                Ok(())
            } else {
                Err(format!("[{mode}] tasks ran on {executors:?} only"))
            }
        }
        Cluster::Processes(cluster) => {
            let mut busy = 0;
            for name in cluster.executor_names() {
                let tasks = cluster.log(&name).matches("task finished").count();
                println!("[{mode}] {name} ran {tasks} tasks");
                if tasks > 0 {
                    busy += 1;
                }
            }
            let scheduler_tasks = cluster.log("scheduler").matches("task finished").count();
            if busy == cluster.executor_names().len() && busy >= 2 && scheduler_tasks == 0 {
                println!("[{mode}] ok   tasks ran on all {busy} executors, none on the scheduler");
                Ok(())
            } else {
                Err(format!(
                    "[{mode}] distribution: {busy} executors busy, scheduler ran {scheduler_tasks} tasks"
                ))
            }
        }
    }
}

/// DataFusion's files, ready to run: the working tree and the differences list.
struct Upstream {
    corpus: upstream::Corpus,
    files: Vec<String>,
    list: differences::Differences,
}

/// Prepares DataFusion's files, or says why they do not run (an error in CI).
fn prepare_upstream(filter: Option<&str>) -> Result<Option<Upstream>, String> {
    let Some(source) = upstream::locate() else {
        let why = format!(
            "DataFusion's sqllogictest files ({}) are not in Cargo's registry: fetch them as \
             .ci/run does (cargo fetch of datafusion-sqllogictest = \"=53.1.0\" in a throwaway \
             manifest) or set BASIN_DATAFUSION_SLT_DIR",
            upstream::CRATE
        );
        return if in_ci() {
            Err(why)
        } else {
            println!("skipped DataFusion's files: {why}");
            Ok(None)
        };
    };
    let list = differences::Differences::load(&differences::path())?;
    let corpus = upstream::Corpus::prepare(&source)?;
    // The files' paths are relative to DataFusion's `datafusion/sqllogictest` folder; the
    // clusters started after this (executor processes too) resolve them from there.
    std::env::set_current_dir(&corpus.dir)
        .map_err(|e| format!("cannot enter {}: {e}", corpus.dir.display()))?;
    let files = corpus.files(filter);
    println!(
        "DataFusion's files: {} from {}, working in {}",
        files.len(),
        source.display(),
        corpus.dir.display()
    );
    Ok(Some(Upstream {
        corpus,
        files,
        list,
    }))
}

/// Runs DataFusion's files on one route and compares with the list; with `record`, notes
/// what differed into the list instead (over `--runs` runs). Returns the failures.
async fn run_upstream(up: &mut Upstream, mode: &str, connect: Connect, args: &Args) -> Vec<String> {
    let runs = if args.record { args.runs.max(1) } else { 1 };
    let mut observed_per_run = vec![];
    let mut run = upstream::RouteRun::default();
    for i in 0..runs {
        run = upstream::run_route(
            &up.corpus,
            mode,
            &up.files,
            connect.clone(),
            &up.list,
            args.all,
            args.parallel,
        )
        .await;
        println!(
            "[{mode}] DataFusion's files{}: {} files, {} records in {:.1} s; {} records differ, {} files skipped",
            if runs > 1 {
                format!(" (run {} of {runs})", i + 1)
            } else {
                String::new()
            },
            run.ran.len(),
            run.records,
            run.elapsed.as_secs_f64(),
            run.observed.len(),
            run.skipped_files,
        );
        observed_per_run.push(std::mem::take(&mut run.observed));
    }
    let observed = differences::combine_runs(&observed_per_run);
    if args.record {
        let unstable = observed
            .iter()
            .filter(|o| o.category == differences::UNSTABLE)
            .count();
        if runs > 1 {
            println!("[{mode}] {unstable} records changed between the {runs} runs (unstable)");
        }
        up.list
            .record(mode, &run.ran, &observed, &run.unrunnable, runs == 1);
        return vec![];
    }
    let mut failures = vec![];
    let listed = up.list.listed(mode);
    let mut seen = BTreeSet::new();
    for o in &observed {
        seen.insert(o.key());
        match listed.get(&o.key()) {
            // Either outcome is expected of an unstable record.
            Some(l) if l.category == differences::UNSTABLE => {}
            None => {
                println!("[{mode}] NEW difference in {}:\n{}", o.file, o.detail);
                failures.push(format!(
                    "[{mode}] datafusion {}:{} {} (new)",
                    o.file, o.line, o.category
                ));
            }
            Some(l) if o.category == differences::WRONG_RESULT && l.category != o.category => {
                println!(
                    "[{mode}] listed as {} but now a wrong answer in {}:\n{}",
                    l.category, o.file, o.detail
                );
                failures.push(format!(
                    "[{mode}] datafusion {}:{} now a wrong answer",
                    o.file, o.line
                ));
            }
            Some(_) => {}
        }
    }
    for f in &run.unrunnable {
        println!("[{mode}] FAIL {} could not run: {}", f.path, f.reason);
        failures.push(format!("[{mode}] datafusion {} could not run", f.path));
    }
    // Fixed: reported, not a failure (the list is rewritten with --record-differences).
    let now_matching: Vec<_> = listed
        .iter()
        .filter(|(k, l)| {
            run.ran.contains(&k.0) && !seen.contains(*k) && l.category != differences::UNSTABLE
        })
        .collect();
    for ((file, part, line), l) in &now_matching {
        let at = part
            .as_deref()
            .map(|p| format!(" ({p})"))
            .unwrap_or_default();
        println!(
            "[{mode}] fixed, re-record: {file}:{line}{at} ({}) now matches DataFusion",
            l.category
        );
    }
    if !now_matching.is_empty() {
        println!(
            "[{mode}] {} listed differences now match DataFusion: fixed, re-record the list \
             (--record-differences)",
            now_matching.len()
        );
    }
    if failures.is_empty() {
        println!("[{mode}] ok   DataFusion's files: every difference is listed");
    }
    failures
}

async fn run() -> std::process::ExitCode {
    let args = parse_args();
    let mut failures: Vec<String> = vec![];
    let mut upstream = None;
    if args.datafusion {
        match prepare_upstream(args.filter.as_deref()) {
            Ok(up) => upstream = up,
            Err(e) => failures.push(e),
        }
    }
    let files = if !args.datafusion {
        suite_files(args.filter.as_deref())
    } else {
        vec![]
    };
    if files.is_empty()
        && upstream.as_ref().is_none_or(|u| u.files.is_empty())
        && failures.is_empty()
    {
        eprintln!("no .slt files match");
        return std::process::ExitCode::FAILURE;
    }
    let data_dir = std::env::temp_dir().join(format!("basin-sqltest-data-{}", std::process::id()));
    let mut config = BasinConfig::embedded();
    config.server.data_dir = data_dir.clone();
    // DataFusion's driver plans with 4 partitions; so do the clusters running its files.
    if args.datafusion {
        config.server.target_partitions = 4;
    }
    let config = Arc::new(config);
    let mut passed = 0;
    let default_routes: &[&str] = if args.datafusion {
        &DATAFUSION_ROUTES
    } else {
        &BASIN_ROUTES
    };
    let modes: Vec<String> = args
        .modes
        .clone()
        .unwrap_or_else(|| default_routes.iter().map(|r| r.to_string()).collect());
    for mode in &modes {
        let basin_here = !files.is_empty();
        let upstream_here = upstream.is_some();
        if !basin_here && !upstream_here {
            continue;
        }
        let (cluster, connect) = match start_route(mode, &config).await {
            Ok(started) => started,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        if basin_here {
            let complete = args.complete && mode != "cluster";
            let (p, f) = run_files(mode, &files, connect.clone(), complete).await;
            passed += p;
            failures.extend(f);
            match check_distribution(mode, &cluster) {
                Ok(()) => passed += 1,
                Err(e) => failures.push(e),
            }
        }
        if upstream_here && let Some(up) = upstream.as_mut() {
            let f = run_upstream(up, mode, connect.clone(), &args).await;
            if f.is_empty() {
                passed += 1;
            }
            failures.extend(f);
            // Written after each route, so a long recording keeps the routes it finished.
            if args.record {
                let path = differences::path();
                match std::fs::write(&path, up.list.to_toml()) {
                    Ok(()) => println!("[{mode}] wrote {}", path.display()),
                    Err(e) => failures.push(format!("cannot write {}: {e}", path.display())),
                }
            }
        }
        drop(cluster);
    }
    drop(upstream);
    let _ = std::fs::remove_dir_all(&data_dir);
    if failures.is_empty() {
        // A failure names a derived file: it stays for reading.
        let _ = std::fs::remove_dir_all(derived_dir());
    }
    println!();
    for f in &failures {
        println!("failed: {f}");
    }
    println!("{passed} passed, {} failed", failures.len());
    if failures.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
