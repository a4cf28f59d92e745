//! An execution engine that runs tasks with Ballista's default engine and records each one.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ballista_core::serde::protobuf::ShuffleWritePartition;
use ballista_executor::execution_engine::{
    DefaultExecutionEngine, ExecutionEngine, QueryStageExecutor,
};
use basin_connectors::cluster::{ClusterOptions, verify_task};
use basin_core::cluster::ClusterKey;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::prelude::SessionConfig;
use futures::FutureExt;

/// One task an executor ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    pub executor: String,
    pub job_id: String,
    pub stage_id: usize,
    pub partition: usize,
}

/// The most recent tasks executors ran (used by tests of an in-process cluster); keeps at
/// most [`TaskLog::CAPACITY`] records.
#[derive(Debug, Clone, Default)]
pub struct TaskLog(Arc<Mutex<std::collections::VecDeque<TaskRecord>>>);

impl TaskLog {
    pub const CAPACITY: usize = 10_000;

    pub(crate) fn push(&self, record: TaskRecord) {
        if let Ok(mut v) = self.0.lock() {
            if v.len() == Self::CAPACITY {
                v.pop_front();
            }
            v.push_back(record);
        }
    }

    /// The tasks recorded so far (the most recent ones).
    pub fn records(&self) -> Vec<TaskRecord> {
        self.0
            .lock()
            .map(|v| v.iter().cloned().collect())
            .unwrap_or_default()
    }
}

pub(crate) struct LoggingEngine {
    executor: String,
    log: Option<TaskLog>,
    inner: DefaultExecutionEngine,
    /// The cluster's key: a task runs only with the scheduler's signature of it.
    key: Option<ClusterKey>,
}

impl LoggingEngine {
    pub(crate) fn new(executor: String, log: Option<TaskLog>, key: Option<ClusterKey>) -> Self {
        Self {
            executor,
            log,
            inner: DefaultExecutionEngine::new(),
            key,
        }
    }

    /// Refuses a task the scheduler did not sign: Ballista's task port takes plans from
    /// whoever connects (basin_core::cluster).
    fn check_signed(&self, job_id: &str, stage_id: usize, config: &SessionConfig) -> Result<()> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        let token = config
            .options()
            .extensions
            .get::<ClusterOptions>()
            .map(|o| o.task_token.as_str());
        let stage = u32::try_from(stage_id).unwrap_or(u32::MAX);
        verify_task(key, job_id, stage, token).map_err(|why| {
            tracing::warn!(executor = %self.executor, job = job_id, stage = stage_id, %why, "refused a task");
            DataFusionError::Execution(format!("task of job {job_id} refused: {why}"))
        })
    }
}

impl ExecutionEngine for LoggingEngine {
    fn create_query_stage_exec(
        &self,
        job_id: String,
        stage_id: usize,
        partition_id: usize,
        plan: Arc<dyn ExecutionPlan>,
        work_dir: &str,
        config: &SessionConfig,
    ) -> Result<Arc<dyn QueryStageExecutor>> {
        self.check_signed(&job_id, stage_id, config)?;
        let record = TaskRecord {
            executor: self.executor.clone(),
            job_id: job_id.clone(),
            stage_id,
            partition: partition_id,
        };
        // Ballista decodes a stage's plan once for the partitions it sends an executor
        // together; each task gets fresh operator state and metrics (otherwise every task
        // reports the metrics of all of them: EXPLAIN ANALYZE counted files twice).
        let plan = reset_plan_states(Arc::clone(&plan)).unwrap_or(plan);
        let inner = self.inner.create_query_stage_exec(
            job_id,
            stage_id,
            partition_id,
            crate::fast::fast_expressions(plan),
            work_dir,
            config,
        )?;
        Ok(Arc::new(LoggedStage {
            record,
            log: self.log.clone(),
            inner,
        }))
    }
}

struct LoggedStage {
    record: TaskRecord,
    log: Option<TaskLog>,
    inner: Arc<dyn QueryStageExecutor>,
}

impl fmt::Debug for LoggedStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}

impl fmt::Display for LoggedStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

#[async_trait]
impl QueryStageExecutor for LoggedStage {
    async fn execute_query_stage(
        &self,
        input_partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<Vec<ShuffleWritePartition>> {
        let r = &self.record;
        // A task that panics would never report its status: Ballista's job would wait for
        // it forever. It fails with the panic's message instead.
        let result = AssertUnwindSafe(self.inner.execute_query_stage(input_partition, context))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".to_string());
                Err(DataFusionError::Execution(format!(
                    "task {}/{}/{input_partition} on executor {} panicked: {message}",
                    r.job_id, r.stage_id, r.executor
                )))
            });
        tracing::info!(
            target: "basin::task",
            executor = %r.executor,
            job = %r.job_id,
            stage = r.stage_id,
            partition = input_partition,
            ok = result.is_ok(),
            "task finished"
        );
        if let Some(log) = &self.log {
            log.push(TaskRecord {
                partition: input_partition,
                ..r.clone()
            });
        }
        result
    }

    fn collect_plan_metrics(&self) -> Vec<MetricsSet> {
        self.inner.collect_plan_metrics()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Panics;

    impl fmt::Display for Panics {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Panics")
        }
    }

    #[async_trait]
    impl QueryStageExecutor for Panics {
        async fn execute_query_stage(
            &self,
            _: usize,
            _: Arc<TaskContext>,
        ) -> Result<Vec<ShuffleWritePartition>> {
            panic!("index out of bounds")
        }

        fn collect_plan_metrics(&self) -> Vec<MetricsSet> {
            vec![]
        }
    }

    #[tokio::test]
    async fn a_task_that_panics_fails_with_the_message() {
        let log = TaskLog::default();
        let stage = LoggedStage {
            record: TaskRecord {
                executor: "e1".into(),
                job_id: "j1".into(),
                stage_id: 2,
                partition: 0,
            },
            log: Some(log.clone()),
            inner: Arc::new(Panics),
        };
        let e = stage
            .execute_query_stage(3, Arc::new(TaskContext::default()))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("task j1/2/3 on executor e1 panicked: index out of bounds"),
            "{e}"
        );
        assert_eq!(log.records().len(), 1);
    }
}
