//! A whole Basin cluster in one process: a scheduler and N executors that talk over
//! loopback gRPC and Flight exactly as separate processes do.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use basin_core::{BasinConfig, BasinError, Result};
use basin_executor::{ExecutorOptions, TaskLog, effective_task_slots};
use basin_scheduler::{ClusterView, SchedulerHandle, SchedulerOptions};
use datafusion::prelude::SessionContext;
use tokio::task::JoinHandle;

/// How to start a standalone cluster.
#[derive(Debug, Clone)]
pub struct StandaloneOptions {
    /// Number of executors.
    pub executors: usize,
    /// Scheduler gRPC port (0 = any free port).
    pub scheduler_port: u16,
}

impl Default for StandaloneOptions {
    fn default() -> Self {
        Self {
            executors: 2,
            scheduler_port: 0,
        }
    }
}

/// A running in-process cluster. Dropping it stops the cluster and removes its work files.
pub struct StandaloneCluster {
    config: Arc<BasinConfig>,
    scheduler: SchedulerHandle,
    /// The executors while the cluster starts; then the supervisor's.
    executors: Vec<JoinHandle<Result<()>>>,
    /// Starts an executor that stopped again (see [`supervise`]).
    supervisor: Option<JoinHandle<()>>,
    task_log: TaskLog,
    task_slots: usize,
    /// Bytes each executor's queries may hold: `[executor] memory_limit`, by default a
    /// share of the machine's memory divided among the executors of this process.
    memory_limit: u64,
    work_root: PathBuf,
}

impl StandaloneCluster {
    /// Starts the scheduler and the executors and waits until every executor registered.
    pub async fn start(config: Arc<BasinConfig>, options: StandaloneOptions) -> Result<Self> {
        if options.executors == 0 {
            return Err(BasinError::Invalid(
                "a standalone cluster needs at least one executor (--executors 1 or more)"
                    .to_string(),
            ));
        }
        // Scheduler and executors share this process: their ports are closed with a secret
        // of its own when the configuration names none.
        let config = if config.cluster.secret().is_none() {
            let mut own = (*config).clone();
            own.cluster.secret = Some(basin_core::cluster::random_secret());
            Arc::new(own)
        } else {
            config
        };
        let scheduler_options = SchedulerOptions {
            port: options.scheduler_port,
            ..SchedulerOptions::from_config(&config)
        };
        let scheduler = basin_scheduler::start(config.clone(), scheduler_options).await?;
        let work_root = config.server.data_dir.join("standalone").join(format!(
            "{}-{}",
            std::process::id(),
            scheduler.addr.port()
        ));
        let task_log = TaskLog::default();
        let memory_limit = config.executor.memory_limit_bytes(options.executors);
        let executors = (0..options.executors)
            .map(|i| {
                spawn_executor(
                    &config,
                    scheduler.addr,
                    i,
                    (&work_root, memory_limit),
                    &task_log,
                )
            })
            .collect();
        let mut cluster = Self {
            task_slots: options.executors * effective_task_slots(config.server.executor_task_slots),
            memory_limit,
            config,
            scheduler,
            executors,
            supervisor: None,
            task_log,
            work_root,
        };
        cluster.wait_for_executors(Duration::from_secs(60)).await?;
        let start = Restart {
            config: cluster.config.clone(),
            scheduler: cluster.scheduler.addr,
            cluster: cluster.scheduler.cluster_view(),
            work_root: cluster.work_root.clone(),
            task_log: cluster.task_log.clone(),
            memory_limit: cluster.memory_limit,
        };
        let executors = std::mem::take(&mut cluster.executors);
        cluster.supervisor = Some(tokio::spawn(supervise(executors, start)));
        Ok(cluster)
    }

    /// Waits until every executor registered; an executor that fails first fails the start
    /// with its reason instead of a timeout. One whose servers stopped without an error
    /// while starting most likely lost its gRPC port to another process between reserving
    /// and binding it (Ballista binds that port itself): it is started again on new ports, a
    /// few times.
    async fn wait_for_executors(&mut self, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut restarts = 0;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let (i, outcome) = {
                let registered = self
                    .scheduler
                    .wait_for_executors(self.executors.len(), left);
                let stopped = futures::future::select_all(self.executors.iter_mut());
                tokio::select! {
                    registered = registered => return registered.map(|_| ()),
                    (outcome, i, _) = stopped => (i, outcome),
                }
            };
            let reason = match outcome {
                // A server that ended on its own at start is most often a free port that
                // another process took between its pick and the bind (tests, other
                // clusters on the machine): new ports, up to three times.
                Ok(Ok(()) | Err(BasinError::Stopped(_))) if restarts < 3 => {
                    restarts += 1;
                    tracing::warn!(
                        executor = i,
                        "executor stopped while starting; starting it again on new ports"
                    );
                    self.executors[i] = spawn_executor(
                        &self.config,
                        self.scheduler.addr,
                        i,
                        (&self.work_root, self.memory_limit),
                        &self.task_log,
                    );
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(())) => "it stopped before registering with the scheduler".into(),
                Err(e) => format!("it panicked or was cancelled: {e}"),
            };
            return Err(BasinError::Invalid(format!(
                "executor {i} of the standalone cluster did not start: {reason}"
            )));
        }
    }

    /// A new front-end session on this cluster.
    pub fn connect(&self) -> Result<SessionContext> {
        Ok(basin_scheduler::connect(
            &self.config,
            &self.scheduler.url(),
            self.task_slots,
            Some(self.scheduler.cluster_view()),
        )?)
    }

    /// The configuration the cluster runs with.
    pub fn config(&self) -> &Arc<BasinConfig> {
        &self.config
    }

    /// The scheduler.
    pub fn scheduler(&self) -> &SchedulerHandle {
        &self.scheduler
    }

    /// The tasks the executors have run so far.
    pub fn task_log(&self) -> &TaskLog {
        &self.task_log
    }

    /// Total task slots.
    pub fn task_slots(&self) -> usize {
        self.task_slots
    }

    /// Bytes each executor's queries may hold together.
    pub fn memory_limit(&self) -> u64 {
        self.memory_limit
    }
}

impl Drop for StandaloneCluster {
    fn drop(&mut self) {
        if let Some(supervisor) = &self.supervisor {
            supervisor.abort();
        }
        for e in &self.executors {
            e.abort();
        }
        self.scheduler.stop();
        let _ = std::fs::remove_dir_all(&self.work_root);
        // Also the `standalone` folder when no other cluster uses it (fails if not empty).
        if let Some(parent) = self.work_root.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// What starting an executor of the cluster again takes.
struct Restart {
    config: Arc<BasinConfig>,
    scheduler: SocketAddr,
    cluster: ClusterView,
    work_root: PathBuf,
    task_log: TaskLog,
    memory_limit: u64,
}

/// Executors stop on their own when a server of theirs fails, or when the scheduler gave
/// them up (no heartbeat for `executor_timeout_seconds`, e.g. on a starved machine). Each is
/// started again, at most [`RESTARTS`] times per executor; its running tasks fail or are
/// given to the others by the scheduler. Dropping this future stops the executors.
async fn supervise(executors: Vec<JoinHandle<Result<()>>>, start: Restart) {
    /// The executors still supervised: (executor number, restarts so far, its task).
    /// Dropping it (the cluster stops) aborts them.
    struct Executors(Vec<(usize, usize, JoinHandle<Result<()>>)>);
    impl Drop for Executors {
        fn drop(&mut self) {
            for (_, _, e) in &self.0 {
                e.abort();
            }
        }
    }
    let mut executors = Executors(
        executors
            .into_iter()
            .enumerate()
            .map(|(i, e)| (i, 0, e))
            .collect(),
    );
    // Ctrl-C and SIGTERM stop the executors too (Ballista's own handlers): the process is
    // stopping, nothing is started again.
    let mut signalled = std::pin::pin!(basin_executor::stop_signal());
    while !executors.0.is_empty() {
        let stopped = futures::future::select_all(executors.0.iter_mut().map(|(_, _, e)| e));
        let (outcome, at, _) = tokio::select! {
            stopped = stopped => stopped,
            () = &mut signalled => return,
        };
        let reason = match outcome {
            Ok(Ok(())) => "it stopped".to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(e) => format!("it panicked or was cancelled: {e}"),
        };
        let (i, restarts, _) = executors.0[at];
        if restarts >= RESTARTS {
            tracing::error!(executor = i, %reason, "executor stopped; not starting it again");
            drop(executors.0.swap_remove(at));
            continue;
        }
        tracing::warn!(executor = i, %reason, "executor stopped; starting it again");
        // The scheduler may still count on it (when it was not the one that stopped it).
        start.cluster.forget_stopped_executors().await;
        let task = spawn_executor(
            &start.config,
            start.scheduler,
            i,
            (&start.work_root, start.memory_limit),
            &start.task_log,
        );
        executors.0[at] = (i, restarts + 1, task);
    }
}

/// Times one executor of a standalone cluster is started again after it stopped.
const RESTARTS: usize = 10;

/// Starts executor `i` of a standalone cluster (its own free ports, its work directory
/// under `work_root`, `memory_limit` bytes for its queries).
fn spawn_executor(
    config: &Arc<BasinConfig>,
    scheduler: SocketAddr,
    i: usize,
    (work_root, memory_limit): (&Path, u64),
    task_log: &TaskLog,
) -> JoinHandle<Result<()>> {
    let mut executor_options =
        ExecutorOptions::new(config, &scheduler.ip().to_string(), scheduler.port());
    executor_options.work_dir = Some(work_root.join(format!("executor-{i}")));
    executor_options.memory_limit = memory_limit;
    executor_options.task_log = Some(task_log.clone());
    let config = config.clone();
    tokio::spawn(async move {
        let outcome = basin_executor::run(config, executor_options).await;
        if let Err(e) = &outcome {
            tracing::error!(executor = i, error = %e, "executor failed");
        }
        outcome
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn count_nations(cluster: &StandaloneCluster) -> String {
        let ctx = cluster.connect().unwrap();
        let batches = ctx
            .sql("SELECT count(*) AS n FROM tpch.tiny.nation")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string()
    }

    async fn active_ids(view: &ClusterView) -> Vec<String> {
        view.active_executors()
            .await
            .into_iter()
            .map(|e| e.id)
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_executor_that_stops_is_started_again_and_queries_go_on() {
        let data = std::env::temp_dir().join(format!("basin-cluster-test-{}", std::process::id()));
        let mut config = BasinConfig::embedded();
        config.server.data_dir = data.clone();
        let cluster = StandaloneCluster::start(Arc::new(config), StandaloneOptions::default())
            .await
            .unwrap();
        assert!(count_nations(&cluster).await.contains("| 25 |"));
        let view = cluster.scheduler().cluster_view();
        let before = active_ids(&view).await;
        assert_eq!(before.len(), 2);
        // As the scheduler does with an executor it gave up; Ballista then also marks the
        // other executor of this process as shutting down.
        view.stop_executor(&before[0], "test").await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let now = active_ids(&view).await;
            if now.len() == 2 && !now.contains(&before[0]) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "executors now: {now:?}, before: {before:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Else the executors' next heartbeats would take them all out of scheduling.
        assert!(!basin_executor::shutting_down());
        assert!(count_nations(&cluster).await.contains("| 25 |"));
        drop(cluster);
        let _ = std::fs::remove_dir_all(&data);
    }
}
