//! The Basin executor: a Ballista executor that knows Basin's plan codec, opens the object
//! stores of `basin.toml`, and records which tasks it ran.
//!
//! ```text
//!  scheduler ──tasks (push)──► executor ──► TpchScanExec / file scans / joins / aggregates
//!                                  │  shuffle files in the work dir, served over Flight
//!                                  └────────────► other executors and the client
//!  scheduler ──streamed stage (Flight DoGet)──► executor ──batches──► scheduler
//! ```

/// Inside `impl PhysicalExpr for X`, where `X` computes the same values as its `original`
/// expression: what the planner knows about it (sort order kept, bounds, statistics) is
/// the original's.
macro_rules! planned_as_original {
    () => {
        fn get_properties(
            &self,
            children: &[datafusion::logical_expr::sort_properties::ExprProperties],
        ) -> datafusion::error::Result<datafusion::logical_expr::sort_properties::ExprProperties> {
            self.original.get_properties(children)
        }

        fn evaluate_bounds(
            &self,
            children: &[&datafusion::logical_expr::interval_arithmetic::Interval],
        ) -> datafusion::error::Result<datafusion::logical_expr::interval_arithmetic::Interval> {
            self.original.evaluate_bounds(children)
        }

        fn propagate_constraints(
            &self,
            interval: &datafusion::logical_expr::interval_arithmetic::Interval,
            children: &[&datafusion::logical_expr::interval_arithmetic::Interval],
        ) -> datafusion::error::Result<
            Option<Vec<datafusion::logical_expr::interval_arithmetic::Interval>>,
        > {
            self.original.propagate_constraints(interval, children)
        }

        fn evaluate_statistics(
            &self,
            children: &[&datafusion::logical_expr::statistics::Distribution],
        ) -> datafusion::error::Result<datafusion::logical_expr::statistics::Distribution> {
            self.original.evaluate_statistics(children)
        }

        fn propagate_statistics(
            &self,
            parent: &datafusion::logical_expr::statistics::Distribution,
            children: &[&datafusion::logical_expr::statistics::Distribution],
        ) -> datafusion::error::Result<
            Option<Vec<datafusion::logical_expr::statistics::Distribution>>,
        > {
            self.original.propagate_statistics(parent, children)
        }
    };
}

/// Inside `impl PhysicalExpr for X`, where `X` stands in for its `original` expression:
/// its children are the original's, and new children make the plain original again (they
/// may have other types than `X` was built for); its SQL is the original's.
macro_rules! rebuilt_as_original {
    () => {
        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>> {
            self.original.children()
        }

        fn with_new_children(
            self: std::sync::Arc<Self>,
            children: Vec<std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>>,
        ) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>>
        {
            std::sync::Arc::clone(&self.original).with_new_children(children)
        }

        fn fmt_sql(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.original.fmt_sql(f)
        }
    };
}

mod conjunction;
pub mod decimal;
mod dynamic_filters;
mod engine;
pub mod exchange;
mod fast;
mod flight;
mod like;
pub mod shared;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::{ConfigProducer, RuntimeProducer};
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use basin_connectors::catalogs::runtime_env;
use basin_connectors::codec::{logical_codec, physical_codec};
use basin_core::memory::{MemoryBudget, MemoryOwner, show_bytes};
use basin_core::net::{reserve_listener, reserve_port};
use basin_core::{BasinConfig, BasinError, Result};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;

pub use engine::{TaskLog, TaskRecord};

/// Where an executor listens and which scheduler it joins.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// Address to bind (default 127.0.0.1).
    pub bind_host: String,
    /// Host name the scheduler and other executors use to reach this executor.
    pub external_host: String,
    /// Arrow Flight port (shuffle data); 0 picks a free port.
    pub flight_port: u16,
    /// gRPC port for task launches; 0 picks a free port.
    pub grpc_port: u16,
    /// Scheduler host.
    pub scheduler_host: String,
    /// Scheduler gRPC port.
    pub scheduler_port: u16,
    /// Concurrent tasks (0 = number of cores).
    pub task_slots: usize,
    /// Directory for shuffle and spill files (default: a fresh directory under the data dir).
    pub work_dir: Option<PathBuf>,
    /// Bytes the tasks of this executor may hold together (`[executor] memory_limit`).
    pub memory_limit: u64,
    /// Seconds to keep retrying the first connection to the scheduler.
    pub connect_timeout_seconds: u16,
    /// Seconds between heartbeats.
    pub heartbeat_seconds: u64,
    /// Records the tasks this executor ran (for tests and `EXPLAIN`-style diagnostics).
    pub task_log: Option<TaskLog>,
}

impl ExecutorOptions {
    /// Options for an executor of the scheduler at `scheduler_host:scheduler_port`.
    pub fn new(config: &BasinConfig, scheduler_host: &str, scheduler_port: u16) -> Self {
        Self {
            bind_host: config.server.bind_host.clone(),
            external_host: config.server.bind_host.clone(),
            flight_port: 0,
            grpc_port: 0,
            scheduler_host: scheduler_host.to_string(),
            scheduler_port,
            task_slots: config.server.executor_task_slots,
            work_dir: None,
            memory_limit: config.executor.memory_limit_bytes(1),
            connect_timeout_seconds: 10,
            heartbeat_seconds: 10,
            task_log: None,
        }
    }
}

/// Number of task slots an executor with `configured` slots has.
pub fn effective_task_slots(configured: usize) -> usize {
    if configured > 0 {
        configured
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    }
}

/// Runs an executor until it is stopped (Ctrl-C, SIGTERM or the scheduler).
pub async fn run(config: Arc<BasinConfig>, options: ExecutorOptions) -> Result<()> {
    // An executor starting means this process is not shutting down, whatever an executor
    // of it that stopped before set.
    clear_shutting_down();
    config
        .cluster
        .check_exposure(&options.bind_host, "executor")?;
    let key = config.cluster.key();
    // The Flight service serves on this listener: its port stays bound from here on.
    let flight_listener = reserve_listener(
        &options.bind_host,
        options.flight_port,
        "executor Flight service",
    )?;
    let flight = flight_listener.local_addr()?.port();
    let work_dir = match &options.work_dir {
        Some(dir) => dir.clone(),
        None => config
            .server
            .data_dir
            .join("executor")
            .join(format!("{}-{flight}", options.external_host)),
    };
    std::fs::create_dir_all(&work_dir).map_err(|e| {
        BasinError::Invalid(format!(
            "cannot create the executor work directory {}: {e}",
            work_dir.display()
        ))
    })?;
    // The default directory is this executor's alone: removed when it stops, and those of
    // executors that stopped without removing theirs are removed here.
    let _owned = match options.work_dir {
        Some(_) => None,
        None => {
            // Waits out a cleanup by another executor: off the runtime's threads.
            let path = work_dir.clone();
            let owned = tokio::task::spawn_blocking(move || OwnedWorkDir::claim(&path))
                .await
                .map_err(|e| {
                    BasinError::Invalid(format!(
                        "executor work directory {}: {e}",
                        work_dir.display()
                    ))
                })??;
            if let Some(parent) = work_dir.parent() {
                let (parent, own) = (parent.to_path_buf(), work_dir.clone());
                // Gigabytes may go: off the runtime's threads, not waited for.
                tokio::task::spawn_blocking(move || remove_stopped_work_dirs(&parent, &own));
            }
            Some(owned)
        }
    };
    let work_dir_str = work_dir.to_string_lossy().to_string();

    // One runtime for all tasks: object stores from the configuration, spills in the work dir.
    let base = runtime_env(&config)?;
    let runtime = RuntimeEnvBuilder::from_runtime_env(&base)
        .with_disk_manager_builder(
            DiskManagerBuilder::default()
                .with_mode(DiskManagerMode::Directories(vec![work_dir.clone()])),
        )
        .build_arc()?;
    let name = format!("{}:{flight}", options.external_host);
    // One memory budget for all tasks, each task (a Ballista task, a streamed stage) its
    // own share of it: see basin_core::memory.
    let memory = Arc::new(MemoryBudget::new(
        format!("executor {name}"),
        MemoryOwner::Executor,
        options.memory_limit,
        config.executor.query_memory_fraction,
    ));
    let budget = memory.clone();
    let runtime_producer: RuntimeProducer = Arc::new(move |_| {
        RuntimeEnvBuilder::from_runtime_env(&runtime)
            .with_memory_pool(budget.query_pool())
            .build_arc()
    });
    let config_producer: ConfigProducer = basin_config_producer(key.clone());
    let functions = Arc::new(function_registry());
    let flight_service = flight::provider(
        flight::StageRuntime {
            runtime: runtime_producer.clone(),
            config: config_producer.clone(),
            functions: functions.clone(),
            codec: physical_codec(),
            name: name.clone(),
            log: options.task_log.clone(),
            memory: memory.clone(),
            key: key.clone(),
        },
        flight_listener,
    );

    let slots = effective_task_slots(options.task_slots);
    wait_for_scheduler(&options).await?;
    // Ballista binds this port itself: it is chosen as late as possible.
    let grpc = reserve_port(
        &options.bind_host,
        options.grpc_port,
        "executor gRPC service",
    )?
    .port();
    let process_config = ExecutorProcessConfig {
        bind_host: options.bind_host.clone(),
        external_host: Some(options.external_host.clone()),
        port: flight,
        grpc_port: grpc,
        scheduler_host: options.scheduler_host.clone(),
        scheduler_port: options.scheduler_port,
        // Ballista 53's retry loop never times out (it measures `Instant::now().elapsed()`),
        // so Basin waits for the scheduler itself (below) and Ballista tries once.
        scheduler_connect_timeout_seconds: 0,
        concurrent_tasks: slots,
        task_scheduling_policy: TaskSchedulingPolicy::PushStaged,
        work_dir: Some(work_dir_str),
        print_thread_info: false,
        executor_heartbeat_interval_seconds: options.heartbeat_seconds,
        override_runtime_producer: Some(runtime_producer),
        override_config_producer: Some(config_producer),
        override_logical_codec: Some(logical_codec()),
        override_physical_codec: Some(physical_codec()),
        override_function_registry: Some(functions),
        override_execution_engine: Some(Arc::new(engine::LoggingEngine::new(
            name,
            options.task_log.clone(),
            key.clone(),
        ))),
        // Its calls to the scheduler and to other executors prove it is of the cluster.
        override_create_grpc_client_endpoint: key
            .as_ref()
            .map(basin_connectors::cluster::endpoint_override),
        override_arrow_flight_service: Some(flight_service),
        ..Default::default()
    };
    tracing::info!(
        flight = %format!("{}:{flight}", options.bind_host),
        grpc = %format!("{}:{grpc}", options.bind_host),
        scheduler = %format!("{}:{}", options.scheduler_host, options.scheduler_port),
        slots,
        work_dir = %work_dir.display(),
        memory_limit = %show_bytes(memory.limit()),
        query_memory = %show_bytes(memory.query_share()),
        "Basin executor starting"
    );
    let process_config = Arc::new(process_config);
    // Ballista 53 registers with the scheduler right after spawning the executor's gRPC
    // server, and the scheduler immediately connects back: when the server is not yet
    // listening (a busy machine), registration fails ("TODO" in ballista-executor's
    // executor_server.rs). Nothing has been started for the executor at that point, so
    // trying again is safe; it is tried for as long as the first connection may take.
    let deadline = tokio::time::Instant::now()
        + std::time::Duration::from_secs(u64::from(options.connect_timeout_seconds.max(30)));
    // Ballista returns the same way whether a signal stopped the executor or one of its
    // servers ended on its own (a port another process took): only the first is a clean stop.
    let asked_to_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = asked_to_stop.clone();
    let _watcher = datafusion::common::runtime::SpawnedTask::spawn(async move {
        stop_signal().await;
        flag.store(true, std::sync::atomic::Ordering::Release);
    });
    let mut attempt: u64 = 0;
    loop {
        attempt += 1;
        match start_executor_process(process_config.clone()).await {
            Ok(()) if asked_to_stop.load(std::sync::atomic::Ordering::Acquire) => return Ok(()),
            Ok(()) => {
                return Err(BasinError::Stopped(format!(
                    "executor {}:{flight} stopped without being asked to: one of its servers \
                     ended (its gRPC port {grpc} taken by another process?) or the scheduler \
                     at {}:{} gave it up; the log above says which. Start it again",
                    options.external_host, options.scheduler_host, options.scheduler_port
                )));
            }
            Err(e)
                if e.to_string().contains("registration")
                    && tokio::time::Instant::now() < deadline =>
            {
                tracing::debug!(attempt, error = %e, "executor registration raced its gRPC server; retrying");
                tokio::time::sleep(std::time::Duration::from_millis((50 * attempt).min(1000)))
                    .await;
            }
            Err(e) => {
                return Err(BasinError::Invalid(format!(
                    "executor stopped: {e} (is the scheduler at {}:{} running?)",
                    options.scheduler_host, options.scheduler_port
                )));
            }
        }
    }
}

/// The lock file an executor holds in its default work directory while it runs.
const WORK_DIR_LOCK: &str = ".executor.lock";

/// An executor's default work directory (`<data_dir>/executor/<host>-<port>`), held through
/// a lock on a file in it and removed when dropped. Its job files (shuffle outputs, spills)
/// are only ever served by the executor that wrote them, so once the executor stops they are
/// garbage — and a new directory is made for every start, since the port is part of its
/// name: before, every benchmark run left gigabytes behind (45 GB on the dev machine).
struct OwnedWorkDir {
    path: PathBuf,
    _lock: std::fs::File,
}

impl OwnedWorkDir {
    /// Creates `path` if needed and locks it. A cleanup by another executor starting at the
    /// same time may hold the lock for a moment, or move the directory away between the
    /// open and the lock (an executor started again on its old port): both are waited out.
    fn claim(path: &Path) -> Result<Self> {
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            BasinError::Invalid(format!(
                "executor work directory {}: {what}: {e}",
                path.display()
            ))
        };
        let lock_path = path.join(WORK_DIR_LOCK);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= 50;
            std::fs::create_dir_all(path).map_err(|e| bad("cannot create it", &e))?;
            let lock = std::fs::File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(|e| bad("cannot create its lock file", &e))?;
            // A fresh lock file is left alone by cleanups (see remove_stopped_work_dirs).
            let _ = lock.set_modified(std::time::SystemTime::now());
            match lock.try_lock() {
                Ok(()) if same_file(&lock, &lock_path) => {
                    return Ok(Self {
                        path: path.to_path_buf(),
                        _lock: lock,
                    });
                }
                Ok(()) if !last => {}
                Ok(()) => return Err(bad("it keeps being moved away", &"try again")),
                Err(std::fs::TryLockError::WouldBlock) if !last => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(bad(
                        "another running executor uses it",
                        &"give this one another --flight-port",
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(bad("cannot lock it", &e)),
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// Whether the open `file` is still the one at `path`.
fn same_file(file: &std::fs::File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
    }
}

impl Drop for OwnedWorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(dir = %self.path.display(), error = %e, "cannot remove the executor work directory");
        }
    }
}

/// Names the directories being removed.
static TRASH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Removes the default work directories under `parent` whose executor stopped without
/// removing its own (killed): those with a lock file nobody holds. A lock file younger than
/// a minute is left alone: its executor may not have locked it yet. Directories without a
/// lock file (other files, or executors before this change) are left alone too.
fn remove_stopped_work_dirs(parent: &Path, own: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        if dir == own || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let lock_path = dir.join(WORK_DIR_LOCK);
        let fresh = std::fs::metadata(&lock_path)
            .and_then(|m| m.modified())
            .map(|t| t.elapsed().map_or(true, |age| age.as_secs() < 60));
        if !matches!(fresh, Ok(false)) {
            continue;
        }
        let Ok(lock) = std::fs::File::options().write(true).open(&lock_path) else {
            continue;
        };
        if lock.try_lock().is_err() || !same_file(&lock, &lock_path) {
            continue;
        }
        // Moved aside under the lock, then removed: an executor started again on the old
        // port makes a new directory instead of using one that is being removed.
        let trash = parent.join(format!(
            ".removing-{}-{}",
            std::process::id(),
            TRASH.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        if std::fs::rename(&dir, &trash).is_err() {
            continue;
        }
        drop(lock);
        match std::fs::remove_dir_all(&trash) {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), "removed the work directory of a stopped executor")
            }
            Err(e) => {
                tracing::warn!(dir = %trash.display(), error = %e, "cannot remove the work directory of a stopped executor")
            }
        }
    }
}

/// Resolves when Ctrl-C or SIGTERM reaches the process (never where they cannot be
/// watched). Every watcher of a signal sees it, Ballista's own included.
pub async fn stop_signal() {
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => futures::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = futures::future::pending::<()>();
    tokio::select! {
        Ok(()) = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
}

/// Lets the executors of this process take tasks again after one of them stopped.
///
/// Ballista 53 keeps "this executor is shutting down" in one process-wide flag
/// (`executor_server::TERMINATING`) and sets it when any executor of the process stops: from
/// then on every executor of the process says so in its heartbeats, the scheduler drops them,
/// and queries wait for executors forever. Every executor start ([`run`]) clears it, so a
/// standalone cluster that starts a stopped executor again has all of them working.
fn clear_shutting_down() {
    ballista_executor::executor_server::TERMINATING
        .store(false, std::sync::atomic::Ordering::Release);
}

/// Whether Ballista's process-wide "shutting down" flag is set (see [`clear_shutting_down`]).
pub fn shutting_down() -> bool {
    ballista_executor::executor_server::TERMINATING.load(std::sync::atomic::Ordering::Acquire)
}

/// Waits up to `connect_timeout_seconds` for the scheduler's port to accept connections.
async fn wait_for_scheduler(options: &ExecutorOptions) -> Result<()> {
    let addr = format!("{}:{}", options.scheduler_host, options.scheduler_port);
    let deadline = tokio::time::Instant::now()
        + std::time::Duration::from_secs(u64::from(options.connect_timeout_seconds));
    loop {
        match tokio::net::TcpStream::connect(&addr).await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(BasinError::Invalid(format!(
                    "cannot reach the scheduler at {addr}: {e} (start `basin scheduler` first \
                     or pass --scheduler HOST:PORT)"
                )));
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
        }
    }
}

/// The functions a task's plan may name: the scheduler plans with DataFusion's defaults plus
/// the nested (array, map, struct) functions, but Ballista 53's executor default leaves the
/// nested ones out, and a task it cannot decode is retried forever (`SELECT a[1] ...` hung).
fn function_registry() -> BallistaFunctionRegistry {
    use ballista_core::extension::{
        ballista_aggregate_functions, ballista_scalar_functions, ballista_window_functions,
    };
    let mut registry = BallistaFunctionRegistry::default();
    for f in ballista_scalar_functions() {
        registry.scalar_functions.insert(f.name().to_string(), f);
    }
    for f in ballista_aggregate_functions() {
        registry.aggregate_functions.insert(f.name().to_string(), f);
    }
    for f in ballista_window_functions() {
        registry.window_functions.insert(f.name().to_string(), f);
    }
    registry
}

/// The settings a task starts from (its own come on top): Basin's codecs, and with a
/// cluster key, the key for the exchange readers and the clients of Ballista's shuffle
/// readers, and the place for the scheduler's signature of the task.
fn basin_config_producer(key: Option<basin_core::cluster::ClusterKey>) -> ConfigProducer {
    use ballista_core::extension::SessionConfigExt;
    use basin_connectors::cluster;
    Arc::new(move || {
        let config = datafusion::prelude::SessionConfig::new_with_ballista()
            .with_ballista_logical_extension_codec(logical_codec())
            .with_ballista_physical_extension_codec(physical_codec())
            .with_option_extension(cluster::ClusterOptions::default());
        match &key {
            Some(key) => cluster::with_key(config, Some(key))
                .with_ballista_override_create_grpc_client_endpoint(cluster::endpoint_override(
                    key,
                )),
            None => config,
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    #[test]
    fn a_work_dir_is_held_while_its_executor_runs_and_removed_after() {
        let root = std::env::temp_dir().join(format!("basin-work-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = |name: &str| {
            let d = root.join(name);
            std::fs::create_dir_all(d.join("job-1")).unwrap();
            std::fs::write(d.join("job-1").join("shuffle.arrow"), b"x").unwrap();
            d
        };
        let stale_lock = |d: &Path| {
            let f = std::fs::File::create(d.join(WORK_DIR_LOCK)).unwrap();
            f.set_modified(SystemTime::now() - Duration::from_secs(3600))
                .unwrap();
        };
        // A killed executor's directory (a lock nobody holds), one whose executor is just
        // starting (a fresh lock), and a directory that is not an executor's (no lock).
        let killed = dir("127.0.0.1-1");
        stale_lock(&killed);
        let starting = dir("127.0.0.1-2");
        std::fs::File::create(starting.join(WORK_DIR_LOCK)).unwrap();
        let other = dir("notes");

        let running = dir("127.0.0.1-3");
        let held = OwnedWorkDir::claim(&running).unwrap();
        remove_stopped_work_dirs(&root, &running);
        assert!(!killed.exists());
        assert!(starting.exists() && other.exists() && running.exists());
        // Held: another executor can neither take it nor sweep it away.
        stale_lock(&running);
        let e = OwnedWorkDir::claim(&running).err().unwrap().to_string();
        assert!(e.contains("another running executor uses it"), "{e}");
        stale_lock(&running);
        let next = dir("127.0.0.1-4");
        let _next = OwnedWorkDir::claim(&next).unwrap();
        remove_stopped_work_dirs(&root, &next);
        assert!(running.exists());
        // Nothing being removed is left behind.
        let left: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".removing"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        drop(held);
        assert!(!running.exists());
        let _ = std::fs::remove_dir_all(&root);
    }
}
