//! Streamed stages: a query with no exchange below its final merge runs without a Ballista
//! job. Each partition of that one stage runs on an executor, which streams its batches back
//! over Flight as they are produced; the merge and whatever light work sits above it (the
//! final step of an ungrouped aggregate, a projection, a limit) run here.
//!
//! ```text
//!  Ballista job:   executors ─► shuffle files ─► job ends ─► results fetched one by one
//!  streamed stage: executors ─► Flight ─► merge here ─► client, while the scans still run
//! ```
//!
//! A full extraction of a remote table (`SELECT * FROM pg.public.lineitem`), a pushed-down
//! aggregate, or a filtered scan of an Iceberg table is such a query. Reading and delivering
//! overlap, and nothing is written to disk. Queries with joins, grouped aggregates, window
//! functions or sorts over several partitions keep running as Ballista jobs.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_flight::Ticket;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use ballista_core::extension::SessionConfigHelperExt;
use ballista_core::serde::protobuf::TaskDefinition;
use basin_connectors::codec::{encode_stage_ticket, physical_codec};
use datafusion::common::tree_node::TreeNode;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Aggregate, LogicalPlan, TableScan};
use datafusion::physical_expr::Distribution;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use datafusion_proto::physical_plan::AsExecutionPlan;
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::{StreamExt, TryStreamExt};

use crate::server::ExecutorInfo;

/// Flight messages are split well below this; it bounds what an executor may make us buffer.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Spreads the partitions of successive queries over the executors.
static NEXT_EXECUTOR: AtomicUsize = AtomicUsize::new(0);

/// What a logical plan node asks of where the query runs.
#[derive(PartialEq)]
enum Needs {
    /// Nothing beyond its own partition: scans, filters, projections, limits, sorts,
    /// unions, ungrouped aggregates.
    OneStage,
    /// Rows of other partitions: joins, grouped aggregates, windows, DISTINCT.
    Exchange,
    /// The front end: statements, `information_schema` (which Ballista also runs there).
    FrontEnd,
}

fn needs(node: &LogicalPlan) -> Needs {
    match node {
        LogicalPlan::TableScan(TableScan { table_name, .. })
            if table_name.schema() == Some("information_schema") =>
        {
            Needs::FrontEnd
        }
        LogicalPlan::Aggregate(Aggregate { group_expr, .. }) if !group_expr.is_empty() => {
            Needs::Exchange
        }
        LogicalPlan::TableScan(_)
        | LogicalPlan::Aggregate(_)
        | LogicalPlan::Projection(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Union(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::EmptyRelation(_)
        | LogicalPlan::Values(_) => Needs::OneStage,
        LogicalPlan::Join(_)
        | LogicalPlan::Window(_)
        | LogicalPlan::Repartition(_)
        | LogicalPlan::Distinct(_) => Needs::Exchange,
        _ => Needs::FrontEnd,
    }
}

/// True when some node of `plan` needs more than `allowed`.
fn needs_more(plan: &LogicalPlan, allowed: &[Needs]) -> bool {
    plan.exists(|node| Ok(!allowed.contains(&needs(node))))
        .expect("the closure never fails")
}

/// Whether a (optimized) logical plan can be a streamed stage: no node needs another
/// partition's rows or the front end.
pub(crate) fn may_stream(plan: &LogicalPlan) -> bool {
    !needs_more(plan, &[Needs::OneStage])
}

/// Whether a (optimized) logical plan may run whole on one executor when it is small: a
/// query (exchanges allowed), not a statement, and not over `information_schema`.
pub(crate) fn may_run_on_one_node(plan: &LogicalPlan) -> bool {
    !needs_more(plan, &[Needs::OneStage, Needs::Exchange])
}

/// The executor for the next query that runs on one: they take turns.
pub(crate) fn next_executor(executors: &[ExecutorInfo]) -> &ExecutorInfo {
    &executors[NEXT_EXECUTOR.fetch_add(1, Ordering::Relaxed) % executors.len()]
}

/// Wraps a whole plan (planned for `executor`'s cores) to run on `executor` as one streamed
/// task, when every scan reports its size and together they read at most `max_bytes`.
/// `None` sends the query to Ballista: too big, a scan of unknown size (a remote database),
/// or a plan that cannot travel.
pub(crate) fn single_node(
    plan: Arc<dyn ExecutionPlan>,
    executor: &ExecutorInfo,
    max_bytes: u64,
) -> Option<Arc<dyn ExecutionPlan>> {
    let bytes = scanned_bytes(&plan)?;
    if bytes > max_bytes {
        tracing::debug!(
            bytes,
            max_bytes,
            "query too big for one executor: Ballista runs it"
        );
        return None;
    }
    let plan: Arc<dyn ExecutionPlan> = if plan.properties().partitioning.partition_count() > 1 {
        Arc::new(CoalescePartitionsExec::new(plan))
    } else {
        plan
    };
    match StreamedStageExec::try_new(plan, std::slice::from_ref(executor)) {
        Ok(stage) => Some(Arc::new(stage)),
        Err(e) => {
            tracing::debug!(error = %e, "the plan cannot travel to an executor: Ballista runs it");
            None
        }
    }
}

/// What the scans of `plan` read by their own estimate, `None` when one cannot tell.
fn scanned_bytes(plan: &Arc<dyn ExecutionPlan>) -> Option<u64> {
    let children = plan.children();
    if children.is_empty() {
        let stats = plan.partition_statistics(None).ok()?;
        return match stats.total_byte_size.get_value() {
            Some(bytes) => Some(*bytes as u64),
            // A leaf of a few rows (EmptyExec, a VALUES list) reads next to nothing.
            None if stats.num_rows.get_value().is_some_and(|r| *r <= 10_000) => Some(0),
            None => None,
        };
    }
    children
        .into_iter()
        .try_fold(0u64, |sum, child| Some(sum + scanned_bytes(child)?))
}

/// Rewrites `plan` so that its one stage streams from `executors`, or returns `None` when the
/// plan has an exchange (it must run as a Ballista job) or cannot be sent to an executor.
pub(crate) fn stream_stage(
    plan: Arc<dyn ExecutionPlan>,
    executors: &[ExecutorInfo],
) -> Option<Arc<dyn ExecutionPlan>> {
    if executors.is_empty() {
        return None;
    }
    if one_stage(&plan) {
        return match StreamedStageExec::try_new(plan, executors) {
            Ok(stage) => Some(Arc::new(stage)),
            Err(e) => {
                tracing::debug!(error = %e, "the plan cannot travel to an executor: Ballista runs it");
                None
            }
        };
    }
    if !light_above_stage(&plan) {
        return None;
    }
    let [child] = plan.children()[..] else {
        return None;
    };
    let child = stream_stage(child.clone(), executors)?;
    plan.with_new_children(vec![child]).ok()
}

/// True when no part of `plan` needs another partition's data: no exchange, no merge, and
/// no operator that requires a particular distribution of its input.
fn one_stage(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let any = plan.as_any();
    if any.is::<RepartitionExec>()
        || any.is::<CoalescePartitionsExec>()
        || any.is::<SortPreservingMergeExec>()
    {
        return false;
    }
    plan.required_input_distribution()
        .iter()
        .all(|d| matches!(d, Distribution::UnspecifiedDistribution))
        && plan.children().into_iter().all(one_stage)
}

/// Operators that may run here, above the streamed stage: merges, and cheap work on the
/// merged rows (the final step of an ungrouped aggregate, projections, filters, limits,
/// top-N). Anything heavier keeps the query on the cluster.
fn light_above_stage(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let any = plan.as_any();
    if let Some(agg) = any.downcast_ref::<AggregateExec>() {
        return matches!(agg.mode(), AggregateMode::Final | AggregateMode::Single)
            && agg.group_expr().is_empty();
    }
    if let Some(sort) = any.downcast_ref::<SortExec>() {
        return sort.fetch().is_some();
    }
    any.is::<CoalescePartitionsExec>()
        || any.is::<SortPreservingMergeExec>()
        || any.is::<ProjectionExec>()
        || any.is::<FilterExec>()
        || any.is::<GlobalLimitExec>()
        || any.is::<LocalLimitExec>()
}

/// One stage of a query, run on the executors partition by partition and streamed back.
pub struct StreamedStageExec {
    input: Arc<dyn ExecutionPlan>,
    /// `input`, encoded once for every partition.
    encoded: Arc<Vec<u8>>,
    executors: Arc<[ExecutorInfo]>,
    first: usize,
    id: String,
}

impl fmt::Debug for StreamedStageExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamedStageExec")
            .field("id", &self.id)
            .field("executors", &self.executors.len())
            .finish_non_exhaustive()
    }
}

impl StreamedStageExec {
    fn try_new(input: Arc<dyn ExecutionPlan>, executors: &[ExecutorInfo]) -> Result<Self> {
        let codec = physical_codec();
        let node = PhysicalPlanNode::try_from_physical_plan(input.clone(), codec.as_ref())?;
        let mut encoded = vec![];
        node.try_encode(&mut encoded)?;
        Ok(Self {
            input,
            encoded: Arc::new(encoded),
            executors: executors.to_vec().into(),
            first: NEXT_EXECUTOR.fetch_add(1, Ordering::Relaxed),
            id: format!("stream-{}", uuid::Uuid::new_v4().simple()),
        })
    }

    /// The executor that runs `partition`.
    fn executor(&self, partition: usize) -> &ExecutorInfo {
        &self.executors[(self.first + partition) % self.executors.len()]
    }
}

impl DisplayAs for StreamedStageExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "StreamedStageExec: partitions={}, executors={}",
            self.input.properties().partitioning.partition_count(),
            self.executors.len()
        )
    }
}

impl ExecutionPlan for StreamedStageExec {
    fn name(&self) -> &str {
        "StreamedStageExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => {
                Ok(Arc::new(Self::try_new(input, &self.executors)?))
            }
            _ => Err(DataFusionError::Internal(
                "StreamedStageExec has exactly one child".into(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let executor = self.executor(partition).clone();
        let task = TaskDefinition {
            job_id: self.id.clone(),
            partition_id: partition as u32,
            plan: self.encoded.as_ref().clone(),
            session_id: context.session_id(),
            props: context.session_config().to_key_value_pairs(),
            ..Default::default()
        };
        let ticket = Ticket::new(encode_stage_ticket(&task));
        let id = self.id.clone();
        let fetch = async move {
            let at = format!("{}:{}", executor.host, executor.port);
            let failed = move |what: &str, e: &dyn fmt::Display| {
                DataFusionError::Execution(format!(
                    "{id} partition {partition} on executor {at}: {what}: {e}"
                ))
            };
            let endpoint = tonic::transport::Endpoint::from_shared(format!(
                "http://{}:{}",
                executor.host, executor.port
            ))
            .map_err(|e| failed("bad executor address", &e))?
            .tcp_nodelay(true);
            let channel = endpoint
                .connect()
                .await
                .map_err(|e| failed("cannot connect (is the executor running?)", &e))?;
            let mut client = FlightServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            let response = client
                .do_get(ticket)
                .await
                .map_err(|status| match status.code() {
                    tonic::Code::Unavailable => failed("unavailable", &status.message()),
                    _ => DataFusionError::Execution(status.message().into()),
                })?;
            let batches = FlightRecordBatchStream::new_from_flight_data(
                response.into_inner().map_err(FlightError::from),
            )
            .map_err(move |e| match e {
                // The executor's own words (a source's error, a bad plan).
                FlightError::Tonic(status) => DataFusionError::Execution(status.message().into()),
                other => failed("lost the stream", &other),
            });
            Ok::<_, DataFusionError>(batches)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            futures::stream::once(fetch).try_flatten().boxed(),
        )))
    }
}
