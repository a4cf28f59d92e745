//! Runs Basin's sqllogictest suites against (a) an in-process standalone cluster and (b) a
//! real multi-process cluster (`basin scheduler` + 2 `basin executor` processes).
//!
//! ```text
//! cargo test -p basin-sql-tests --test sqllogictests [-- [--complete] [--mode inprocess|cluster] [FILTER]]
//! ```
//!
//! Suites are folders under `sql-tests/suites/`. `--complete` rewrites expected results from
//! Basin's output (never use it on suites whose answers come from another engine: those
//! folders hold a `REFERENCE` marker and are skipped by `--complete`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use basin_cli::cluster::{StandaloneCluster, StandaloneOptions};
use basin_core::BasinConfig;
use datafusion::prelude::SessionContext;
use sqllogictest::{Runner, default_column_validator, default_normalizer};

use basin_sql_tests::engine::{self, BasinDb};
use basin_sql_tests::process_cluster::ProcessCluster;
use basin_sql_tests::validate;

struct Args {
    complete: bool,
    modes: Vec<String>,
    filter: Option<String>,
}

fn parse_args() -> Args {
    let mut args = Args {
        complete: false,
        modes: vec!["inprocess".into(), "cluster".into()],
        filter: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--complete" => args.complete = true,
            "--mode" => {
                if let Some(m) = it.next() {
                    args.modes = vec![m];
                }
            }
            // Flags cargo or libtest-style runners pass; nothing to do with them.
            s if s.starts_with("--") => {}
            s => args.filter = Some(s.to_string()),
        }
    }
    args
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

type Connect = Arc<dyn Fn() -> Result<SessionContext, String> + Send + Sync>;

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

async fn run() -> std::process::ExitCode {
    let args = parse_args();
    let files = suite_files(args.filter.as_deref());
    if files.is_empty() {
        eprintln!("no .slt files match");
        return std::process::ExitCode::FAILURE;
    }
    let data_dir = std::env::temp_dir().join(format!("basin-sqltest-data-{}", std::process::id()));
    let mut config = BasinConfig::embedded();
    config.server.data_dir = data_dir.clone();
    let config = Arc::new(config);
    let mut passed = 0;
    let mut failures: Vec<String> = vec![];
    for mode in &args.modes {
        match mode.as_str() {
            "inprocess" => {
                let cluster =
                    match StandaloneCluster::start(config.clone(), StandaloneOptions::default())
                        .await
                    {
                        Ok(c) => Arc::new(c),
                        Err(e) => {
                            failures.push(format!("[inprocess] cluster start: {e}"));
                            continue;
                        }
                    };
                let c = cluster.clone();
                let connect: Connect = Arc::new(move || c.connect().map_err(|e| e.to_string()));
                let (p, f) = run_files("inprocess", &files, connect, args.complete).await;
                passed += p;
                failures.extend(f);
                // Distribution: the tasks ran on more than one executor.
                let executors: BTreeSet<String> = cluster
                    .task_log()
                    .records()
                    .into_iter()
                    .map(|r| r.executor)
                    .collect();
                if executors.len() >= 2 {
                    passed += 1;
                    println!(
                        "[inprocess] ok   tasks ran on {} executors",
                        executors.len()
                    );
                } else {
                    failures.push(format!("[inprocess] tasks ran on {executors:?} only"));
                }
            }
            "cluster" => {
                let cluster =
                    match tokio::task::spawn_blocking(|| ProcessCluster::start(2, 2)).await {
                        Ok(Ok(c)) => Arc::new(c),
                        Ok(Err(e)) => {
                            failures.push(format!("[cluster] cluster start: {e}"));
                            continue;
                        }
                        Err(e) => {
                            failures.push(format!("[cluster] cluster start panicked: {e}"));
                            continue;
                        }
                    };
                let url = cluster.url();
                let cfg = config.clone();
                let connect: Connect = Arc::new(move || {
                    basin_scheduler::connect(&cfg, &url, 4, None).map_err(|e| e.to_string())
                });
                let (p, f) = run_files("cluster", &files, connect, false).await;
                passed += p;
                failures.extend(f);
                // Distribution: every executor process ran tasks; the scheduler ran none.
                let mut busy = 0;
                for name in cluster.executor_names() {
                    let tasks = cluster.log(&name).matches("task finished").count();
                    println!("[cluster] {name} ran {tasks} tasks");
                    if tasks > 0 {
                        busy += 1;
                    }
                }
                let scheduler_tasks = cluster.log("scheduler").matches("task finished").count();
                if busy == cluster.executor_names().len() && busy >= 2 && scheduler_tasks == 0 {
                    passed += 1;
                    println!(
                        "[cluster] ok   tasks ran on all {busy} executors, none on the scheduler"
                    );
                } else {
                    failures.push(format!(
                        "[cluster] distribution: {busy} executors busy, scheduler ran {scheduler_tasks} tasks"
                    ));
                }
            }
            other => failures.push(format!("unknown mode {other}: use inprocess or cluster")),
        }
    }
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
