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
use std::time::{Duration, Instant};

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, SchemaAsIpc, Ticket};
use ballista_core::extension::SessionConfigHelperExt;
use ballista_core::serde::protobuf::TaskDefinition;
use basin_connectors::codec::{encode_stage_ticket, physical_codec};
use basin_connectors::iceberg::IcebergScanExec;
use basin_core::cluster::ClusterKey;
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::arrow::ipc::MessageHeader;
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
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

/// Whether a logical plan holds a recursive query (`WITH RECURSIVE`), which runs in one
/// process or not at all.
pub fn is_recursive(plan: &LogicalPlan) -> bool {
    let mut found = false;
    // The closure never fails: the walk's result says nothing more than `found`.
    let _ = plan.apply_with_subqueries(|node| {
        found = matches!(node, LogicalPlan::RecursiveQuery(_));
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found
}

/// Whether a (optimized) logical plan may run whole on one executor when it is small: a
/// query (exchanges allowed), not a statement, and not over `information_schema`.
pub(crate) fn may_run_on_one_node(plan: &LogicalPlan) -> bool {
    !needs_more(plan, &[Needs::OneStage, Needs::Exchange])
}

/// The queries running whole on each executor (by id), the executor given the last one, and
/// the executors taken out of placement because they stopped answering.
#[derive(Default)]
struct Placement {
    running: HashMap<String, usize>,
    last: Option<String>,
    /// Executors that failed a connection or a probe, and when: no query or partition goes
    /// to them until a probe started after that answers ([`crate::liveness`]).
    out: HashMap<String, Instant>,
}

static PLACEMENT: LazyLock<Mutex<Placement>> = LazyLock::new(Mutex::default);

fn placement() -> std::sync::MutexGuard<'static, Placement> {
    PLACEMENT.lock().unwrap_or_else(|e| e.into_inner())
}

/// A query counted as running on an executor, until the plan and every stream of it are
/// dropped.
pub(crate) struct Running {
    executor: String,
    /// The executors it was placed among: where it goes if its executor is lost before it
    /// sent a row.
    among: Arc<[ExecutorInfo]>,
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
        let answering = || executors.iter().filter(|e| !self.out.contains_key(&e.id));
        let fewest = answering().map(running).min()?;
        let idle: Vec<&ExecutorInfo> = answering().filter(|e| running(e) == fewest).collect();
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

    /// Takes executor `id` out of placement from `at` on; false when it already was.
    fn take_out(&mut self, id: &str, at: Instant) -> bool {
        match self.out.get_mut(id) {
            Some(since) => {
                *since = (*since).max(at);
                false
            }
            None => {
                self.out.insert(id.to_string(), at);
                true
            }
        }
    }

    /// Puts executor `id` back when it answered a probe started at `probed_at`, at least
    /// [`OUT_AT_LEAST`] after it was taken out (an older probe's answer says nothing about
    /// the failure); true when it was out.
    fn put_back(&mut self, id: &str, probed_at: Instant) -> bool {
        match self.out.get(id) {
            Some(since) if *since + OUT_AT_LEAST <= probed_at => {
                self.out.remove(id);
                true
            }
            _ => false,
        }
    }

    /// Forgets executors out since before `before` that are no longer `registered`: they
    /// were removed from the cluster and a new start registers under a new id.
    fn forget(&mut self, registered: &dyn Fn(&str) -> bool, before: Instant) {
        self.out
            .retain(|id, since| registered(id) || *since >= before);
    }
}

/// How long an executor stays out of placement at least. A killed process resets its
/// connections before the kernel closes its listening socket: a probe at that moment is
/// still accepted (seen in `cli/tests/it/liveness.rs` with two clusters on two cores).
const OUT_AT_LEAST: Duration = Duration::from_secs(1);

/// Signals that an executor was taken out, for the streams running on it and the probes.
static LOSSES: LazyLock<tokio::sync::watch::Sender<u64>> =
    LazyLock::new(|| tokio::sync::watch::Sender::new(0));

/// Changes whenever an executor is taken out of placement.
pub(crate) fn losses() -> tokio::sync::watch::Receiver<u64> {
    LOSSES.subscribe()
}

/// Takes `executor` out of placement at once (it failed a connection or probes, `why`): no
/// query or partition goes to it until a probe started later answers, and partitions
/// streaming from it stop waiting. Returns false when it already was out.
pub(crate) fn executor_lost(executor: &ExecutorInfo, why: &dyn fmt::Display) -> bool {
    let newly = placement().take_out(&executor.id, Instant::now());
    if newly {
        tracing::warn!(
            executor = %executor.id,
            at = %format!("{}:{}", executor.host, executor.port),
            %why,
            "executor taken out of placement until it answers again"
        );
        LOSSES.send_modify(|n| *n = n.wrapping_add(1));
    }
    newly
}

/// Executor `id` answered a probe started at `probed_at`: it takes queries again if it was
/// taken out before.
pub(crate) fn executor_answers(id: &str, probed_at: Instant) {
    if placement().put_back(id, probed_at) {
        tracing::info!(executor = %id, "executor answers again: back in placement");
    }
}

/// Whether executor `id` is out of placement.
pub(crate) fn is_out(id: &str) -> bool {
    placement().out.contains_key(id)
}

/// `executors` without those out of placement.
pub(crate) fn answering(mut executors: Vec<ExecutorInfo>) -> Vec<ExecutorInfo> {
    let placement = placement();
    executors.retain(|e| !placement.out.contains_key(&e.id));
    executors
}

/// Forgets executors taken out more than `after` ago that `registered` no longer knows.
pub(crate) fn forget_lost(registered: &dyn Fn(&str) -> bool, after: Duration) {
    if let Some(before) = Instant::now().checked_sub(after) {
        placement().forget(registered, before);
    }
}

/// The executor for the next query that runs whole on one: one of those running the fewest
/// such queries, so that concurrent queries spread; among them the one that ran the last
/// query, whose memory is warm. (A fresh executor's first runs of a query are up to 2.7x
/// slower, mostly the kernel clearing pages the allocator asks for, and the allocator keeps
/// what the last queries freed. Taking turns gave each executor half the runs, so queries run
/// one after another met cold executors twice as long.) Otherwise they take turns. `None`
/// without executors that answer (executors taken out by [`executor_lost`] are passed over).
pub(crate) fn next_executor(executors: &[ExecutorInfo]) -> Option<(&ExecutorInfo, Arc<Running>)> {
    let chosen = placement().choose(executors, &NEXT_EXECUTOR)?;
    let running = Running {
        executor: chosen.id.clone(),
        among: executors.into(),
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
    max_bytes: Option<u64>,
) -> Option<Arc<dyn ExecutionPlan>> {
    if let Some(max_bytes) = max_bytes {
        let bytes = scanned_bytes(&plan)?;
        if bytes > max_bytes {
            tracing::debug!(
                bytes,
                max_bytes,
                "query too big for one executor: Ballista runs it"
            );
            return None;
        }
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
    // An Iceberg scan reads only its columns' bytes: TPC-DS Q14 reads 4 of store_sales' 23
    // columns, 7 times over, and its whole files (2 GB at SF1) had sent it past the limit to
    // a Ballista job (9.4 s; DataFusion alone 1.1 s).
    if let Some(scan) = plan.as_any().downcast_ref::<IcebergScanExec>()
        && let Some(bytes) = scan.spec().stats.column_bytes_planned
    {
        return Some(bytes);
    }
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
pub(crate) fn light_above_stage(plan: &Arc<dyn ExecutionPlan>) -> bool {
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
    /// Whether a partition may run again on another executor when its executor is lost
    /// before it sent a row (not when it reads exchanges: their partitions are read once).
    moves: bool,
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
    pub(crate) fn try_new(
        input: Arc<dyn ExecutionPlan>,
        executors: &[ExecutorInfo],
    ) -> Result<Self> {
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
            moves: true,
        })
    }

    /// The stage with partitions that never move to another executor.
    pub(crate) fn fixed(mut self) -> Self {
        self.moves = false;
        self
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
                stage.moves = self.moves;
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
        let schema = self.schema();
        // The stage's plan lives as long as its rows are read (see ExchangeReadExec).
        let input = self.input.clone();
        let batches = batches.and_then(move |batch| {
            let _alive = &input;
            futures::future::ready(basin_connectors::exchange::conform(batch, &schema))
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
    /// is passed on to the client unchanged ([`relayable`]). An executor lost before the
    /// partition sent a row (it cannot be reached, its stream broke and it no longer
    /// answers, or the probes took it out meanwhile) is taken out of placement and the
    /// partition runs once more on another executor; lost after a row, the stream fails
    /// naming the executor.
    pub(crate) fn flight(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> BoxStream<'static, Result<FlightData>> {
        let task = TaskDefinition {
            job_id: self.id.clone(),
            partition_id: partition as u32,
            plan: self.encoded.as_ref().clone(),
            session_id: context.session_id(),
            props: context.session_config().to_key_value_pairs(),
            ..Default::default()
        };
        let ticket = Ticket::new(encode_stage_ticket(&task));
        let fallback = match &self.running {
            _ if !self.moves => Fallback::Never,
            Some(running) => Fallback::OneExecutor(running.clone()),
            None => Fallback::Spread(self.executors.clone()),
        };
        let key = basin_connectors::cluster::key_of(&context);
        let fetch: Fetch = Arc::new(move |executor| fetch(executor, ticket.clone(), key.clone()));
        PartitionStream::new(
            format!("{} partition {partition}", self.id),
            self.executor(partition).clone(),
            self.running.clone(),
            fallback,
            fetch,
        )
        .into_stream()
    }
}

/// Why a partition's stream failed. `lost`: the executor could not be reached or the
/// connection to it broke (an error of this process's HTTP/2 client, which carries its
/// cause), rather than an error the executor sent (a source's, a bad plan: no cause).
struct Failed {
    error: DataFusionError,
    lost: bool,
}

impl Failed {
    fn lost(what: &str, e: &dyn fmt::Display) -> Self {
        Self {
            error: DataFusionError::Execution(format!("{what}: {e}")),
            lost: true,
        }
    }

    fn status(status: tonic::Status) -> Self {
        use std::error::Error;
        // A source's error the executor sent: its kind goes on to the client, and another
        // executor would meet the same source.
        if let Some(error) = basin_connectors::remote::status_source_error(&status) {
            return Self { error, lost: false };
        }
        let lost = status.source().is_some() || status.code() == tonic::Code::Unavailable;
        Self {
            error: DataFusionError::Execution(status.message().into()),
            lost,
        }
    }
}

/// Opens a partition's stream on an executor.
type Fetch = Arc<
    dyn Fn(&ExecutorInfo) -> BoxStream<'static, std::result::Result<FlightData, Failed>>
        + Send
        + Sync,
>;

/// Runs the ticket's partition on `executor` and streams its Flight messages.
fn fetch(
    executor: &ExecutorInfo,
    ticket: Ticket,
    key: Option<Arc<ClusterKey>>,
) -> BoxStream<'static, std::result::Result<FlightData, Failed>> {
    let address = format!("http://{}:{}", executor.host, executor.port);
    let fetch = async move {
        let endpoint = tonic::transport::Endpoint::from_shared(address)
            .map_err(|e| Failed::lost("bad executor address", &e))?
            .tcp_nodelay(true)
            // A partition streams up to gigabytes: frames of up to 1 MiB, not HTTP/2's
            // 16 KiB (64 per record batch). Windows stay hyper's (2 MiB per stream): they
            // bound what a slow client makes this process buffer per partition.
            .max_frame_size(STREAM_FRAME_BYTES)
            // An executor whose host vanished (no reset, no more packets) fails the query
            // within 30 s instead of holding it (sooner when the probes take it out). An
            // executor busy with the partition still answers pings: its connection's task
            // answers them, not the plan's, whenever one of its runtime's threads is free.
            .connect_timeout(Duration::from_secs(10))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20));
        let key = key.as_deref();
        let endpoint = basin_connectors::cluster::with_user_agent(endpoint, key)
            .map_err(|e| Failed::lost("bad cluster user agent", &e))?;
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| Failed::lost("cannot connect (is the executor running?)", &e))?;
        let mut client = FlightServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let response = client
            .do_get(basin_connectors::cluster::signed_ticket(ticket, key))
            .await
            .map_err(Failed::status)?;
        // The executor's own words (a source's error, a bad plan), or a broken connection.
        let messages = response.into_inner().map_err(Failed::status);
        Ok::<_, Failed>(messages)
    };
    futures::stream::once(fetch).try_flatten().boxed()
}

/// Where a partition goes when its executor is lost before it sent a row.
enum Fallback {
    /// A query placed whole on one executor: the next executor placement picks among those
    /// it was placed among.
    OneExecutor(Arc<Running>),
    /// A partition of a stage spread over these executors: the next of them still in
    /// placement.
    Spread(Arc<[ExecutorInfo]>),
    /// A partition that reads exchanges: it stays where it is.
    Never,
}

impl Fallback {
    /// An executor other than `lost`, with the query counted as running on it.
    fn next(&self, lost: &ExecutorInfo) -> Option<(ExecutorInfo, Option<Arc<Running>>)> {
        match self {
            Fallback::OneExecutor(running) => {
                let (next, running) = next_executor(&running.among)?;
                (next.id != lost.id).then(|| (next.clone(), Some(running)))
            }
            Fallback::Spread(executors) => {
                let n = executors.len();
                let at = executors.iter().position(|e| e.id == lost.id).unwrap_or(0);
                (1..n)
                    .map(|i| &executors[(at + i) % n])
                    .find(|e| e.id != lost.id && !is_out(&e.id))
                    .map(|e| (e.clone(), None))
            }
            Fallback::Never => None,
        }
    }
}

/// One partition's messages from its executor, moved once to another executor when that
/// one is lost before a row was sent.
struct PartitionStream {
    /// `stream-… partition N`, for errors.
    name: String,
    executor: ExecutorInfo,
    messages: BoxStream<'static, std::result::Result<FlightData, Failed>>,
    /// The query counted as running on `executor` (one placed whole on it).
    running: Option<Arc<Running>>,
    fallback: Fallback,
    fetch: Fetch,
    losses: tokio::sync::watch::Receiver<u64>,
    sent_schema: bool,
    sent_rows: bool,
    moved: bool,
}

impl PartitionStream {
    fn new(
        name: String,
        executor: ExecutorInfo,
        running: Option<Arc<Running>>,
        fallback: Fallback,
        fetch: Fetch,
    ) -> Self {
        Self {
            name,
            messages: fetch(&executor),
            executor,
            running,
            fallback,
            fetch,
            losses: losses(),
            sent_schema: false,
            sent_rows: false,
            moved: false,
        }
    }

    /// The messages, ending after the first error.
    fn into_stream(self) -> BoxStream<'static, Result<FlightData>> {
        futures::stream::unfold(Some(self), |state| async move {
            let mut state = state?;
            match state.next_message().await? {
                Ok(message) => Some((Ok(message), Some(state))),
                Err(e) => Some((Err(e), None)),
            }
        })
        .boxed()
    }

    async fn next_message(&mut self) -> Option<Result<FlightData>> {
        loop {
            let next = tokio::select! {
                next = self.messages.next() => next,
                Ok(()) = self.losses.changed() => {
                    if !is_out(&self.executor.id) {
                        continue;
                    }
                    Some(Err(Failed::lost(
                        "lost",
                        &"a connection to it failed or it does not answer probes",
                    )))
                }
            };
            match next? {
                Ok(message) => {
                    match header_type(&message) {
                        // The first executor's schema went out already.
                        Some(MessageHeader::Schema) if self.sent_schema => continue,
                        Some(MessageHeader::Schema) => self.sent_schema = true,
                        Some(_) => self.sent_rows = true,
                        None => {}
                    }
                    return Some(Ok(message));
                }
                Err(failed) => match self.recover(failed) {
                    Ok(()) => continue,
                    Err(e) => return Some(Err(e)),
                },
            }
        }
    }

    /// After `failed`: the partition started again on another executor, or the error to
    /// end with.
    fn recover(&mut self, failed: Failed) -> Result<()> {
        if !failed.lost {
            return Err(failed.error); // the executor's own error
        }
        executor_lost(&self.executor, &failed.error);
        let name = format!(
            "{} on executor {}:{}",
            self.name, self.executor.host, self.executor.port
        );
        let lost = |why: &str| {
            DataFusionError::Execution(format!("{name}: {}; {why}", failed.error.message()))
        };
        if self.sent_rows {
            return Err(lost(
                "the executor was lost after it sent rows, so the query does not run again \
                 elsewhere (its rows would repeat): run it again",
            ));
        }
        if matches!(self.fallback, Fallback::Never) {
            return Err(lost(
                "a partition reading exchanges does not run again elsewhere: run the query again",
            ));
        }
        if self.moved {
            return Err(lost(
                "the partition already moved once: run the query again",
            ));
        }
        let Some((next, running)) = self.fallback.next(&self.executor) else {
            return Err(lost(
                "no other executor answers: start executors with `basin executor`",
            ));
        };
        tracing::warn!(
            partition = %self.name,
            from = %format!("{}:{}", self.executor.host, self.executor.port),
            to = %format!("{}:{}", next.host, next.port),
            error = %failed.error,
            "executor lost before the partition sent a row: running it on another"
        );
        self.messages = (self.fetch)(&next);
        self.executor = next;
        if running.is_some() {
            self.running = running;
        }
        self.moved = true;
        Ok(())
    }
}

/// The kind of an IPC message, `None` for one without a header (app_metadata only).
fn header_type(message: &FlightData) -> Option<MessageHeader> {
    if message.data_header.is_empty() {
        return None;
    }
    datafusion::arrow::ipc::root_as_message(&message.data_header)
        .ok()
        .map(|m| m.header_type())
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

    fn executors(ids: &[&str]) -> Vec<ExecutorInfo> {
        ids.iter()
            .enumerate()
            .map(|(i, id)| ExecutorInfo {
                id: id.to_string(),
                host: "127.0.0.1".into(),
                port: 9000 + i as u16,
                task_slots: 2,
            })
            .collect()
    }

    #[test]
    fn an_executor_taken_out_gets_no_query_until_a_later_probe_answers() {
        let executors = executors(&["a", "b"]);
        let turn = AtomicUsize::new(0);
        let mut placement = Placement::default();
        let pick = |p: &mut Placement| {
            let id = p.choose(&executors, &turn).map(|e| e.id.clone());
            if let Some(id) = &id {
                p.finished(id);
            }
            id
        };
        let warm = pick(&mut placement).unwrap();
        let lost_at = Instant::now();
        assert!(placement.take_out(&warm, lost_at));
        assert!(!placement.take_out(&warm, lost_at), "already out");
        // The warm executor is passed over while it is out.
        let other = pick(&mut placement).unwrap();
        assert_ne!(other, warm);
        assert_eq!(pick(&mut placement).as_ref(), Some(&other));
        // An answer to a probe started before the loss says nothing about it.
        let before = lost_at.checked_sub(Duration::from_millis(1)).unwrap();
        assert!(!placement.put_back(&warm, before));
        assert_eq!(pick(&mut placement).as_ref(), Some(&other));
        // With every executor out there is none to take a query.
        placement.take_out(&other, lost_at);
        assert_eq!(pick(&mut placement), None);
        // Nor does one started right after it: the process may still be dying.
        assert!(!placement.put_back(&warm, lost_at + Duration::from_millis(10)));
        // Back once a later probe answers.
        assert!(placement.put_back(&warm, lost_at + OUT_AT_LEAST));
        assert_eq!(pick(&mut placement).as_ref(), Some(&warm));
        // Executors out that left the cluster are forgotten after a while, not before.
        placement.forget(&|_| false, lost_at);
        assert!(placement.out.contains_key(&other));
        placement.forget(&|id| id == "b", lost_at + Duration::from_millis(1));
        assert_eq!(placement.out.contains_key(&other), other == "b");
    }

    /// What a fake executor does with a partition.
    #[derive(Clone, Copy)]
    enum Fake {
        /// Sends its schema, then breaks.
        BreaksBeforeRows,
        /// Sends its schema and a batch, then breaks.
        BreaksAfterRows,
        /// Sends its schema and waits.
        Hangs,
        /// Sends its schema and a batch.
        Works,
        /// Answers with an error of its own (a source's).
        Fails,
    }

    /// A partition's stream over fake executors `(id, behaviour)`, starting on the first.
    fn partition_stream(
        fakes: &[(&str, Fake)],
        one_executor: bool,
    ) -> BoxStream<'static, Result<FlightData>> {
        let ids: Vec<&str> = fakes.iter().map(|f| f.0).collect();
        let executors = executors(&ids);
        let behaviour: HashMap<String, Fake> = fakes
            .iter()
            .map(|(id, fake)| (id.to_string(), *fake))
            .collect();
        let fetch: Fetch = Arc::new(move |executor| {
            let sent = messages(&schema(["a", "b"]));
            let broken = || Err(Failed::lost("h2 protocol error", &"connection reset"));
            let messages: Vec<std::result::Result<FlightData, Failed>> = match behaviour
                [&executor.id]
            {
                Fake::BreaksBeforeRows => vec![Ok(sent[0].clone()), broken()],
                Fake::BreaksAfterRows => vec![Ok(sent[0].clone()), Ok(sent[1].clone()), broken()],
                Fake::Hangs => {
                    return futures::stream::iter([Ok(sent[0].clone())])
                        .chain(futures::stream::pending())
                        .boxed();
                }
                Fake::Works => sent.into_iter().map(Ok).collect(),
                Fake::Fails => vec![Err(Failed::status(tonic::Status::internal(
                    "relation \"t\" does not exist",
                )))],
            };
            futures::stream::iter(messages).boxed()
        });
        let (running, fallback) = if one_executor {
            let running = Arc::new(Running {
                executor: executors[0].id.clone(),
                among: executors.clone().into(),
            });
            (Some(running.clone()), Fallback::OneExecutor(running))
        } else {
            (None, Fallback::Spread(executors.clone().into()))
        };
        PartitionStream::new(
            "stream-test partition 0".into(),
            executors[0].clone(),
            running,
            fallback,
            fetch,
        )
        .into_stream()
    }

    fn kinds(messages: &[Result<FlightData>]) -> Vec<String> {
        messages
            .iter()
            .map(|m| match m {
                Ok(m) => format!("{:?}", header_type(m)),
                Err(e) => format!("error: {e}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_partition_whose_executor_is_lost_before_a_row_runs_once_more_elsewhere() {
        for one_executor in [false, true] {
            let (x, y) = if one_executor {
                ("one-x", "one-y")
            } else {
                ("spread-x", "spread-y")
            };
            let got: Vec<_> = partition_stream(
                &[(x, Fake::BreaksBeforeRows), (y, Fake::Works)],
                one_executor,
            )
            .collect()
            .await;
            // One schema (the second executor's is dropped), then its rows.
            assert_eq!(
                kinds(&got),
                ["Some(Schema)", "Some(RecordBatch)"],
                "one executor: {one_executor}"
            );
            assert!(is_out(x) && !is_out(y));
        }
    }

    #[tokio::test]
    async fn a_partition_fails_naming_the_executor_lost_after_rows_or_with_no_other() {
        let got: Vec<_> = partition_stream(
            &[("after-x", Fake::BreaksAfterRows), ("after-y", Fake::Works)],
            false,
        )
        .collect()
        .await;
        let kinds = kinds(&got);
        assert_eq!(kinds.len(), 3, "{kinds:?}");
        assert!(
            kinds[2].contains("on executor 127.0.0.1:9000")
                && kinds[2].contains("after it sent rows"),
            "{kinds:?}"
        );
        assert!(is_out("after-x"));

        let got: Vec<_> = partition_stream(
            &[
                ("twice-x", Fake::BreaksBeforeRows),
                ("twice-y", Fake::BreaksBeforeRows),
            ],
            false,
        )
        .collect()
        .await;
        let last = got.last().unwrap().as_ref().unwrap_err().to_string();
        assert!(
            last.contains("on executor 127.0.0.1:9001") && last.contains("already moved once"),
            "{last}"
        );
    }

    #[test]
    fn a_status_the_executor_sent_is_its_own_error_a_broken_connection_is_a_loss() {
        // Statuses read from the executor's trailers carry no cause.
        assert!(!Failed::status(tonic::Status::internal("Divide by zero")).lost);
        assert!(!Failed::status(tonic::Status::invalid_argument("bad ticket")).lost);
        // This process's client makes statuses of its transport errors, with the cause.
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(Failed::status(tonic::Status::from_error(Box::new(reset))).lost);
        assert!(Failed::status(tonic::Status::unavailable("connection refused")).lost);
        // A source the executor could not reach: not a lost executor, and still a source's
        // error of that kind for the client.
        let source = basin_connectors::remote::source_status(&DataFusionError::External(Box::new(
            basin_connectors::remote::SourceError {
                kind: basin_connectors::remote::SourceErrorKind::Unavailable,
                message: "postgres source `pg`: cannot connect".into(),
            },
        )))
        .unwrap();
        let failed = Failed::status(source);
        assert!(!failed.lost);
        assert_eq!(
            crate::flight_sql::to_status(failed.error).code(),
            tonic::Code::Unavailable
        );
    }

    #[tokio::test]
    async fn an_executors_own_error_is_passed_on_and_keeps_it_in_placement() {
        let got: Vec<_> =
            partition_stream(&[("own-x", Fake::Fails), ("own-y", Fake::Works)], false)
                .collect()
                .await;
        assert_eq!(
            kinds(&got),
            ["error: Execution error: relation \"t\" does not exist"]
        );
        assert!(!is_out("own-x"));
    }

    #[tokio::test]
    async fn a_partition_waiting_on_an_executor_taken_out_moves_at_once() {
        let stream = partition_stream(&[("hang-x", Fake::Hangs), ("hang-y", Fake::Works)], false);
        let collect = tokio::spawn(stream.collect::<Vec<_>>());
        tokio::time::sleep(Duration::from_millis(50)).await;
        executor_lost(&executors(&["hang-x"])[0], &"test");
        let got = tokio::time::timeout(Duration::from_secs(10), collect)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(kinds(&got), ["Some(Schema)", "Some(RecordBatch)"]);
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
