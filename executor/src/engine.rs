//! An execution engine that runs tasks with Ballista's default engine and records each one.

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ballista_core::serde::protobuf::ShuffleWritePartition;
use ballista_executor::execution_engine::{
    DefaultExecutionEngine, ExecutionEngine, QueryStageExecutor,
};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::prelude::SessionConfig;

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
}

impl LoggingEngine {
    pub(crate) fn new(executor: String, log: Option<TaskLog>) -> Self {
        Self {
            executor,
            log,
            inner: DefaultExecutionEngine::new(),
        }
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
        let record = TaskRecord {
            executor: self.executor.clone(),
            job_id: job_id.clone(),
            stage_id,
            partition: partition_id,
        };
        let inner = self.inner.create_query_stage_exec(
            job_id,
            stage_id,
            partition_id,
            plan,
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
        let result = self
            .inner
            .execute_query_stage(input_partition, context)
            .await;
        let r = &self.record;
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
