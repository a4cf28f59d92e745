//! Memory on the scheduler's side: the front end's own pool, and what one query may hold on
//! each executor, which decides whether a query may run whole on one.
//!
//! ```text
//!  front-end sessions ──► one MemoryBudget per process ([server] front_end_memory_limit)
//!  plan_streamed ──DoAction(basin.query_memory)──► executor: bytes one query may hold there
//! ```
//!
//! Ballista's executor registration carries only task slots, so the scheduler asks each
//! executor's Flight port once (cached by executor id: ids are new for every start) what
//! one query may hold there; an executor that does not answer is checked against
//! `single_node_max_bytes` alone.
//!
//! That check reads the scans' estimate (for Iceberg, compressed Parquet bytes), which says
//! little about what hash joins build: TPC-DS SF1 Q72 scans ~280 MB, and its single-executor
//! plan outgrew a 3.5 GiB share with one 2.1 GB build side (before pools, an executor grew to
//! 23 GB). A query that runs out of memory on one executor before sending a row therefore
//! runs again as a Ballista job ([`or_as_job`]), whose sort-merge joins and aggregates spill.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arrow_flight::Action;
use arrow_flight::flight_service_client::FlightServiceClient;
use basin_core::BasinConfig;
use basin_core::memory::{MemoryBudget, MemoryOwner, NEEDS_MORE_MEMORY, QUERY_MEMORY_ACTION};
use datafusion::arrow::array::RecordBatch;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use crate::server::ExecutorInfo;

/// The memory pool of one front-end session: its queries' share of the process's front-end
/// budget, made by the first session of the process with its configuration's limit.
pub(crate) fn front_end_pool(config: &BasinConfig) -> Arc<dyn MemoryPool> {
    static FRONT_END: OnceLock<Arc<MemoryBudget>> = OnceLock::new();
    FRONT_END
        .get_or_init(|| {
            Arc::new(MemoryBudget::new(
                "the front end",
                MemoryOwner::FrontEnd,
                config.server.front_end_memory_bytes(),
                config.executor.query_memory_fraction,
            ))
        })
        .query_pool()
}

/// What executors said one query may hold on them, by executor id; `None`: no answer.
type Answers = Mutex<HashMap<String, Option<u64>>>;

fn answers() -> &'static Answers {
    static ANSWERS: OnceLock<Answers> = OnceLock::new();
    ANSWERS.get_or_init(Answers::default)
}

/// The bytes one query may hold on `executor` (`[executor] memory_limit` times
/// `query_memory_fraction`), as it says; `None` when it does not answer.
pub(crate) async fn query_memory(
    executor: &ExecutorInfo,
    key: Option<&basin_core::cluster::ClusterKey>,
) -> Option<u64> {
    if let Some(known) = lock(answers()).get(&executor.id) {
        return *known;
    }
    let answer = ask(executor, key).await;
    if answer.is_none() {
        tracing::debug!(executor = %executor.id, "executor does not say how much memory a query may hold");
    }
    let mut known = lock(answers());
    // Executors come and go with new ids: the answers stay few.
    if known.len() > 1024 {
        known.clear();
    }
    known.insert(executor.id.clone(), answer);
    answer
}

async fn ask(
    executor: &ExecutorInfo,
    key: Option<&basin_core::cluster::ClusterKey>,
) -> Option<u64> {
    let url = format!("http://{}:{}", executor.host, executor.port);
    let endpoint = tonic::transport::Endpoint::from_shared(url)
        .ok()?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2));
    let endpoint = basin_connectors::cluster::with_user_agent(endpoint, key).ok()?;
    let channel = endpoint.connect().await.ok()?;
    let action = Action {
        r#type: QUERY_MEMORY_ACTION.to_string(),
        body: Default::default(),
    };
    let mut results = FlightServiceClient::new(channel)
        .do_action(action)
        .await
        .ok()?
        .into_inner();
    let first = results.message().await.ok()??;
    std::str::from_utf8(&first.body).ok()?.trim().parse().ok()
}

fn lock(answers: &Answers) -> std::sync::MutexGuard<'_, HashMap<String, Option<u64>>> {
    answers.lock().unwrap_or_else(|e| e.into_inner())
}

/// `one_node` (a query run whole on one executor), which runs again as `job` (the same
/// query as a Ballista job, whose sort-merge joins and aggregates spill) when the executor
/// runs out of memory for it before it sent a row.
pub(crate) fn or_as_job(
    one_node: Arc<dyn ExecutionPlan>,
    job: Arc<dyn ExecutionPlan>,
) -> Arc<dyn ExecutionPlan> {
    Arc::new(OrAsJobExec { one_node, job })
}

/// See [`or_as_job`]. EXPLAIN shows the plan that runs first; the job is planned but only
/// submitted when it is needed.
#[derive(Debug)]
struct OrAsJobExec {
    one_node: Arc<dyn ExecutionPlan>,
    job: Arc<dyn ExecutionPlan>,
}

impl DisplayAs for OrAsJobExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "OrAsJobExec: as a Ballista job if the executor runs out of memory"
        )
    }
}

impl ExecutionPlan for OrAsJobExec {
    fn name(&self) -> &str {
        "OrAsJobExec"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.one_node.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.one_node]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(one_node), true) => Ok(or_as_job(one_node, self.job.clone())),
            _ => Err(DataFusionError::Internal(
                "OrAsJobExec takes one child".to_string(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let schema = self.one_node.schema();
        let mut first = self.one_node.execute(partition, context.clone())?;
        let job = self.job.clone();
        let started = async move {
            let stream: BoxStream<'static, DFResult<RecordBatch>> = match first.next().await {
                Some(Err(e)) if out_of_memory(&e) => {
                    tracing::info!(error = %e, "a query ran out of memory on one executor: running it as a Ballista job");
                    Box::pin(job.execute(partition, context)?)
                }
                Some(item) => Box::pin(futures::stream::once(async { item }).chain(first)),
                None => Box::pin(futures::stream::empty()),
            };
            Ok::<_, DataFusionError>(stream)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(started).try_flatten(),
        )))
    }
}

/// Whether `e` is an executor's memory error: a `ResourcesExhausted`, or its text where a
/// streamed stage passed it on as the executor's message.
fn out_of_memory(e: &DataFusionError) -> bool {
    matches!(e.find_root(), DataFusionError::ResourcesExhausted(_))
        || e.to_string().contains(NEEDS_MORE_MEMORY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::collect;
    use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]))
    }

    fn rows(n: i64) -> Arc<dyn ExecutionPlan> {
        let batch =
            RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::from(vec![n]))]).unwrap();
        MemorySourceConfig::try_new_exec(&[vec![batch]], schema(), None).unwrap()
    }

    /// A plan whose one partition fails with `error`.
    #[derive(Debug)]
    struct Failing(fn() -> DataFusionError);

    impl PartitionStream for Failing {
        fn schema(&self) -> &SchemaRef {
            static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
            SCHEMA.get_or_init(schema)
        }

        fn execute(&self, _: Arc<TaskContext>) -> SendableRecordBatchStream {
            let error = (self.0)();
            Box::pin(RecordBatchStreamAdapter::new(
                schema(),
                futures::stream::once(async move { Err(error) }),
            ))
        }
    }

    fn failing(error: fn() -> DataFusionError) -> Arc<dyn ExecutionPlan> {
        Arc::new(
            StreamingTableExec::try_new(
                schema(),
                vec![Arc::new(Failing(error))],
                None,
                vec![],
                false,
                None,
            )
            .unwrap(),
        )
    }

    async fn run(plan: Arc<dyn ExecutionPlan>) -> DFResult<Vec<i64>> {
        let batches = collect(plan, Arc::new(TaskContext::default())).await?;
        Ok(batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect())
    }

    #[tokio::test]
    async fn a_query_out_of_memory_on_one_executor_runs_again_as_a_job() {
        let full =
            || DataFusionError::Execution(format!("{NEEDS_MORE_MEMORY} executor e allows it"));
        assert_eq!(run(or_as_job(failing(full), rows(2))).await.unwrap(), [2]);
        let exhausted = || DataFusionError::ResourcesExhausted("full".to_string());
        assert_eq!(
            run(or_as_job(failing(exhausted), rows(2))).await.unwrap(),
            [2]
        );
        // Other errors are the query's own; a query that runs stays where it is.
        let other = || DataFusionError::Execution("Divide by zero".to_string());
        let err = run(or_as_job(failing(other), rows(2))).await.unwrap_err();
        assert!(err.to_string().contains("Divide by zero"), "{err}");
        assert_eq!(run(or_as_job(rows(1), rows(2))).await.unwrap(), [1]);
    }
}
