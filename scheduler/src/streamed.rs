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
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, SchemaAsIpc, Ticket};
use ballista_core::extension::SessionConfigHelperExt;
use ballista_core::serde::protobuf::TaskDefinition;
use basin_connectors::codec::{encode_stage_ticket, physical_codec};
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::arrow::ipc::MessageHeader;
use datafusion::arrow::ipc::writer::IpcWriteOptions;
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
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use crate::server::ExecutorInfo;

/// Flight messages are split well below this; it bounds what an executor may make us buffer.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The largest HTTP/2 frame executors may send a streamed partition in.
const STREAM_FRAME_BYTES: u32 = 1 << 20;

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

/// The queries running whole on each executor (by id), and the executor given the last one.
#[derive(Default)]
struct Placement {
    running: HashMap<String, usize>,
    last: Option<String>,
}

static PLACEMENT: LazyLock<Mutex<Placement>> = LazyLock::new(Mutex::default);

fn placement() -> std::sync::MutexGuard<'static, Placement> {
    PLACEMENT.lock().unwrap_or_else(|e| e.into_inner())
}

/// A query counted as running on an executor, until the plan and every stream of it are
/// dropped.
pub(crate) struct Running {
    executor: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        placement().finished(&self.executor);
    }
}

impl Placement {
    /// See [`next_executor`]; `turn` counts the turns taken.
    fn choose<'a>(
        &mut self,
        executors: &'a [ExecutorInfo],
        turn: &AtomicUsize,
    ) -> Option<&'a ExecutorInfo> {
        let running = |e: &ExecutorInfo| self.running.get(&e.id).copied().unwrap_or(0);
        let fewest = executors.iter().map(running).min()?;
        let idle: Vec<&ExecutorInfo> = executors.iter().filter(|e| running(e) == fewest).collect();
        let last = self.last.as_deref();
        let chosen = match idle.iter().find(|e| last == Some(e.id.as_str())) {
            Some(last) => *last,
            None => idle[turn.fetch_add(1, Ordering::Relaxed) % idle.len()],
        };
        *self.running.entry(chosen.id.clone()).or_default() += 1;
        self.last = Some(chosen.id.clone());
        Some(chosen)
    }

    fn finished(&mut self, executor: &str) {
        if let Some(n) = self.running.get_mut(executor) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running.remove(executor);
            }
        }
    }
}

/// The executor for the next query that runs whole on one: one of those running the fewest
/// such queries, so that concurrent queries spread; among them the one that ran the last
/// query, whose memory is warm. (A fresh executor's first runs of a query are up to 2.7x
/// slower, mostly the kernel clearing pages the allocator asks for, and the allocator keeps
/// what the last queries freed. Taking turns gave each executor half the runs, so queries run
/// one after another met cold executors twice as long.) Otherwise they take turns. `None`
/// without executors.
pub(crate) fn next_executor(executors: &[ExecutorInfo]) -> Option<(&ExecutorInfo, Arc<Running>)> {
    let chosen = placement().choose(executors, &NEXT_EXECUTOR)?;
    let running = Running {
        executor: chosen.id.clone(),
    };
    Some((chosen, Arc::new(running)))
}

/// Wraps a whole plan (planned for `executor`'s cores) to run on `executor` as one streamed
/// task, when every scan reports its size and together they read at most `max_bytes`.
/// `None` sends the query to Ballista: too big, a scan of unknown size (a remote database),
/// or a plan that cannot travel.
pub(crate) fn single_node(
    plan: Arc<dyn ExecutionPlan>,
    (executor, running): (&ExecutorInfo, Arc<Running>),
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
        Ok(mut stage) => {
            stage.running = Some(running);
            Some(Arc::new(stage))
        }
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
    let plan = projection_below_merge(plan);
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

/// A projection over a merge, moved below it: it runs on the executors, and a merge of a
/// streamed stage with nothing above it is relayed to the client as is (the cast of string
/// views to plain strings that every result gets, `basin_connectors::views`).
fn projection_below_merge(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let Some(projection) = plan.as_any().downcast_ref::<ProjectionExec>() else {
        return plan;
    };
    let Some(merge) = projection
        .input()
        .as_any()
        .downcast_ref::<CoalescePartitionsExec>()
    else {
        return plan;
    };
    if merge.fetch().is_some() {
        return plan;
    }
    match ProjectionExec::try_new(projection.expr().to_vec(), merge.input().clone()) {
        Ok(below) => Arc::new(CoalescePartitionsExec::new(Arc::new(below))),
        Err(_) => plan,
    }
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
    /// The query counted as running on its executor, when it runs whole on one.
    running: Option<Arc<Running>>,
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
            running: None,
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
                let mut stage = Self::try_new(input, &self.executors)?;
                stage.first = self.first;
                stage.running = self.running.clone();
                Ok(Arc::new(stage))
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
        let messages = self.flight(partition, context);
        let batches = FlightRecordBatchStream::new_from_flight_data(
            messages.map_err(|e| FlightError::ExternalError(Box::new(e))),
        )
        .map_err(|e| match e {
            FlightError::ExternalError(e) => match e.downcast::<DataFusionError>() {
                Ok(e) => *e,
                Err(e) => DataFusionError::External(e),
            },
            other => DataFusionError::Execution(format!("bad stream from an executor: {other}")),
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            batches,
        )))
    }
}

impl StreamedStageExec {
    /// The Flight messages of `partition` as its executor encoded them (schema first, then
    /// record batches), for [`StreamedStageExec::execute`] to decode or for a result that
    /// is passed on to the client unchanged ([`relayable`]).
    pub(crate) fn flight(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> BoxStream<'static, Result<FlightData>> {
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
            .tcp_nodelay(true)
            // A partition streams up to gigabytes: frames of up to 1 MiB, not HTTP/2's
            // 16 KiB (64 per record batch). Windows stay hyper's (2 MiB per stream): they
            // bound what a slow client makes this process buffer per partition.
            .max_frame_size(STREAM_FRAME_BYTES)
            // An executor whose host vanished (no reset, no more packets) fails the query
            // after a minute instead of holding it.
            .connect_timeout(Duration::from_secs(10))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(30));
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
            // The executor's own words (a source's error, a bad plan, a lost connection).
            let messages = response
                .into_inner()
                .map_err(|status| DataFusionError::Execution(status.message().into()));
            Ok::<_, DataFusionError>(messages)
        };
        let running = self.running.clone();
        futures::stream::once(fetch)
            .try_flatten()
            // Counted as running until its last message.
            .inspect(move |_| {
                let _ = &running;
            })
            .boxed()
    }
}

/// The streamed stage of a plan that only merges its partitions, so that its executors'
/// Flight messages can go to the client as they come, without being decoded and encoded
/// again here: no operator above the stage (a merge without a limit at most), and no
/// dictionary in the rows (executors send dictionaries as plain values, the result schema
/// would not match).
fn relayable(plan: &Arc<dyn ExecutionPlan>) -> Option<&StreamedStageExec> {
    let stage = match plan.as_any().downcast_ref::<CoalescePartitionsExec>() {
        Some(merge) if merge.fetch().is_none() => merge.input(),
        Some(_) => return None,
        None => plan,
    };
    let stage = stage.as_any().downcast_ref::<StreamedStageExec>()?;
    let dictionaries = plan
        .schema()
        .fields()
        .iter()
        .any(|f| has_dictionary(f.data_type()));
    (!dictionaries).then_some(stage)
}

fn has_dictionary(data_type: &DataType) -> bool {
    match data_type {
        DataType::Dictionary(..) => true,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _)
        | DataType::RunEndEncoded(_, f) => has_dictionary(f.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| has_dictionary(f.data_type())),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| has_dictionary(f.data_type())),
        _ => false,
    }
}

/// When `plan` only merges the partitions of a streamed stage ([`relayable`]), the
/// messages of all of them as one Flight stream for the client: one schema message
/// (`schema`, the result's), then every partition's record batches in the order they arrive.
/// Each executor's own schema message is checked against `schema`'s column types (a plan
/// that decoded differently on an executor would otherwise reach the client as garbage) and
/// dropped. The stream holds `plan` until it ends: plan nodes may hold what the executors
/// need meanwhile (the transaction that exported a PostgreSQL snapshot).
pub(crate) fn relay(
    plan: &Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    context: Arc<TaskContext>,
) -> Option<BoxStream<'static, Result<FlightData>>> {
    let stage = relayable(plan)?;
    let first: FlightData = SchemaAsIpc::new(&schema, &IpcWriteOptions::default()).into();
    let partitions = stage.properties().partitioning.partition_count();
    let streams = (0..partitions).map(|p| {
        let expected = schema.clone();
        let mut seen_schema = false;
        stage
            .flight(p, context.clone())
            .try_filter_map(move |message| {
                let keep = check_message(&message, &expected, &mut seen_schema);
                futures::future::ready(keep.map(|keep| keep.then_some(message)))
            })
            .boxed()
    });
    tracing::debug!(
        partitions,
        "the executors' messages go to the client as they come"
    );
    let plan = plan.clone();
    Some(
        futures::stream::once(futures::future::ready(Ok(first)))
            .chain(futures::stream::select_all(streams))
            .inspect(move |_| {
                let _holds = &plan;
            })
            .boxed(),
    )
}

/// Whether an executor's message goes on to the client: record batches do, the executor's
/// schema message (checked against `expected`) does not; anything else is an error.
fn check_message(message: &FlightData, expected: &Schema, seen_schema: &mut bool) -> Result<bool> {
    if message.data_header.is_empty() {
        return Ok(false); // app_metadata only: nothing for the client
    }
    let header = datafusion::arrow::ipc::root_as_message(&message.data_header)
        .map_err(|e| DataFusionError::Execution(format!("bad message from an executor: {e}")))?;
    match header.header_type() {
        MessageHeader::RecordBatch if *seen_schema => Ok(true),
        MessageHeader::Schema if !*seen_schema => {
            let got = Schema::try_from(message).map_err(|e| {
                DataFusionError::Execution(format!("bad schema from an executor: {e}"))
            })?;
            let types = |s: &Schema| {
                s.fields()
                    .iter()
                    .map(|f| f.data_type().clone())
                    .collect::<Vec<_>>()
            };
            if types(&got) != types(expected) {
                return Err(DataFusionError::Internal(format!(
                    "an executor's rows have types {:?}, the plan's have {:?}",
                    types(&got),
                    types(expected)
                )));
            }
            *seen_schema = true;
            Ok(false)
        }
        other => Err(DataFusionError::Execution(format!(
            "unexpected {other:?} message from an executor"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_flight::utils::batches_to_flight_data;
    use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::Field;

    fn messages(schema: &SchemaRef) -> Vec<FlightData> {
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["a", "b"])),
            ],
        )
        .unwrap();
        batches_to_flight_data(schema, vec![batch]).unwrap()
    }

    #[test]
    fn queries_go_to_the_least_busy_executor_and_stay_on_a_warm_one() {
        let executors: Vec<ExecutorInfo> = ["a", "b", "c"]
            .into_iter()
            .map(|id| ExecutorInfo {
                id: id.into(),
                host: "localhost".into(),
                port: 1,
                task_slots: 2,
            })
            .collect();
        let turn = AtomicUsize::new(0);
        let mut placement = Placement::default();
        let pick = |p: &mut Placement| p.choose(&executors, &turn).unwrap().id.clone();
        // One after another: the same executor each time.
        let first = pick(&mut placement);
        placement.finished(&first);
        for _ in 0..5 {
            let again = pick(&mut placement);
            assert_eq!(again, first);
            placement.finished(&again);
        }
        // At once: each on its own executor, then a fourth beside one of them.
        let busy: Vec<String> = (0..3).map(|_| pick(&mut placement)).collect();
        let mut sorted = busy.clone();
        sorted.sort();
        assert_eq!(sorted, ["a", "b", "c"]);
        assert_eq!(busy[0], first, "the warm executor first");
        let fourth = pick(&mut placement);
        // When one finishes, the next query goes there, the least busy.
        placement.finished(&busy[1]);
        assert_eq!(pick(&mut placement), busy[1]);
        assert_eq!(placement.running.values().sum::<usize>(), 4);
        for id in busy.iter().chain([&fourth, &busy[1]]) {
            placement.finished(id);
        }
        assert!(placement.running.is_empty());
    }

    fn schema(names: [&str; 2]) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(names[0], DataType::Int64, false),
            Field::new(names[1], DataType::Utf8, true),
        ]))
    }

    #[test]
    fn relayed_messages_keep_batches_and_drop_the_checked_schema() {
        let sent = messages(&schema(["a", "b"]));
        // Names and nullability may differ (the client gets the plan's); types may not.
        let expected = schema(["x", "y"]);
        let mut seen = false;
        let kept: Vec<bool> = sent
            .iter()
            .map(|m| check_message(m, &expected, &mut seen).unwrap())
            .collect();
        assert_eq!(kept, [false, true]);

        let other = Schema::new(vec![
            Field::new("a", DataType::Int32, false),
            Field::new("b", DataType::Utf8, true),
        ]);
        let err = check_message(&sent[0], &other, &mut false).unwrap_err();
        assert!(err.to_string().contains("types"), "{err}");

        // A batch before any schema, or a second schema, is not a stream Basin sent.
        assert!(check_message(&sent[1], &expected, &mut false).is_err());
        assert!(check_message(&sent[0], &expected, &mut true).is_err());
    }

    #[test]
    fn dictionaries_anywhere_in_a_type_are_found() {
        let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        assert!(has_dictionary(&dict));
        assert!(has_dictionary(&DataType::List(Arc::new(Field::new(
            "item", dict, true
        )))));
        assert!(!has_dictionary(&DataType::List(Arc::new(Field::new(
            "item",
            DataType::Utf8,
            true
        )))));
    }
}
