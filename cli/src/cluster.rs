//! A whole Basin cluster in one process: a scheduler and N executors that talk over
//! loopback gRPC and Flight exactly as separate processes do.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use basin_core::{BasinConfig, BasinError, Result};
use basin_executor::{ExecutorOptions, TaskLog, effective_task_slots};
use basin_scheduler::{SchedulerHandle, SchedulerOptions};
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
    executors: Vec<JoinHandle<Result<()>>>,
    task_log: TaskLog,
    task_slots: usize,
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
        let executors = (0..options.executors)
            .map(|i| spawn_executor(&config, &scheduler, i, &work_root, &task_log))
            .collect();
        let mut cluster = Self {
            task_slots: options.executors * effective_task_slots(config.server.executor_task_slots),
            config,
            scheduler,
            executors,
            task_log,
            work_root,
        };
        cluster.wait_for_executors(Duration::from_secs(60)).await?;
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
                Ok(Ok(())) if restarts < 3 => {
                    restarts += 1;
                    tracing::warn!(
                        executor = i,
                        "executor stopped while starting; starting it again on new ports"
                    );
                    // Its stop marked every executor of this process as shutting down.
                    basin_executor::clear_shutting_down();
                    self.executors[i] = spawn_executor(
                        &self.config,
                        &self.scheduler,
                        i,
                        &self.work_root,
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
}

impl Drop for StandaloneCluster {
    fn drop(&mut self) {
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

/// Starts executor `i` of a standalone cluster (its own free ports, its work directory).
fn spawn_executor(
    config: &Arc<BasinConfig>,
    scheduler: &SchedulerHandle,
    i: usize,
    work_root: &Path,
    task_log: &TaskLog,
) -> JoinHandle<Result<()>> {
    let mut executor_options = ExecutorOptions::new(
        config,
        &scheduler.addr.ip().to_string(),
        scheduler.addr.port(),
    );
    executor_options.work_dir = Some(work_root.join(format!("executor-{i}")));
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
