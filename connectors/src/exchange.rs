//! Exchanges between executors over Arrow Flight, with no shuffle files: the nodes that
//! travel inside streamed plans.
//!
//! ```text
//!  producer task t (on executor t):  RepartitionExec(Hash(k, N)) ─ PartitionSubsetExec{p : p mod T = t} ─ input
//!  consumer partition p:              ExchangeReadExec ──DoGet(BASIN-EXCHANGE: plan, task t, partition p)──► every task t
//! ```
//!
//! A consumer partition reads its partition from every producer task and passes their
//! batches on as they come. The executor keeps one instance of each producer task's plan
//! and serves each of its output partitions once (`basin_executor`'s exchange registry).
//! Back-pressure is the producer's: `RepartitionExec`'s bounded gates (which spill under the
//! executor's memory pool) and HTTP/2 flow control; nothing here buffers more than a batch
//! per producer. A producer that is lost fails the partition with an error naming its
//! executor; the partition is never read twice (its rows were handed out once).

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::Ticket;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use ballista_core::extension::SessionConfigHelperExt;
use ballista_core::serde::protobuf::TaskDefinition;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::Partitioning;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use datafusion_proto::physical_plan::{AsExecutionPlan, PhysicalExtensionCodec};
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

/// Flight messages are split well below this; it bounds what a producer may make us buffer.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The largest HTTP/2 frame a producer may send a partition in.
const FRAME_BYTES: u32 = 1 << 20;

/// Marks a Flight ticket that asks an executor for one output partition of a producer task
/// of an exchange.
const EXCHANGE_TICKET: &[u8] = b"BASIN-EXCHANGE\0";

/// A Flight ticket for output partition `partition_id` of producer task `task_id` of stage
/// `stage_id` of query `job_id`: [`EXCHANGE_TICKET`] + a Ballista `TaskDefinition` whose
/// plan is the producer's (encoded with Basin's physical codec).
pub fn encode_exchange_ticket(task: &TaskDefinition) -> Vec<u8> {
    crate::codec::encode_ticket(EXCHANGE_TICKET, task)
}

/// Marks a ticket that asks for the whole output of a broadcast producer task; the
/// number of its readers follows (u32, little-endian), then the `TaskDefinition`.
const BROADCAST_TICKET: &[u8] = b"BASIN-BROADCAST\0";

fn broadcast_prefix(readers: u32) -> Vec<u8> {
    let mut prefix = BROADCAST_TICKET.to_vec();
    prefix.extend_from_slice(&readers.to_le_bytes());
    prefix
}

/// What an exchange ticket asks for.
pub enum ExchangeTicket {
    /// One output partition, served once.
    Partition(TaskDefinition),
    /// The one output partition, kept and served to each of `readers` consumers.
    Broadcast { task: TaskDefinition, readers: u32 },
}

/// The task of an exchange ticket; `None` when `ticket` is not one.
pub fn decode_exchange_ticket(ticket: &[u8]) -> Option<Result<ExchangeTicket>> {
    if let Some(rest) = ticket.strip_prefix(BROADCAST_TICKET) {
        let Some((readers, _)) = rest.split_first_chunk::<4>() else {
            return Some(Err(DataFusionError::Internal(
                "corrupt broadcast ticket: no reader count".into(),
            )));
        };
        let readers = u32::from_le_bytes(*readers);
        let decoded = crate::codec::decode_ticket(&broadcast_prefix(readers), "broadcast", ticket)?;
        return Some(decoded.map(|task| ExchangeTicket::Broadcast { task, readers }));
    }
    crate::codec::decode_ticket(EXCHANGE_TICKET, "exchange", ticket)
        .map(|r| r.map(ExchangeTicket::Partition))
}

/// The input partitions `p` with `p mod tasks = task`, renumbered from 0: what one producer
/// task of an exchange runs.
#[derive(Debug)]
pub struct PartitionSubsetExec {
    input: Arc<dyn ExecutionPlan>,
    tasks: usize,
    task: usize,
    properties: Arc<PlanProperties>,
}

impl PartitionSubsetExec {
    pub fn try_new(input: Arc<dyn ExecutionPlan>, tasks: usize, task: usize) -> Result<Self> {
        if tasks == 0 || task >= tasks {
            return Err(DataFusionError::Internal(format!(
                "partition subset {task} of {tasks} tasks"
            )));
        }
        let n = input.output_partitioning().partition_count();
        let count = if task < n {
            (n - task).div_ceil(tasks)
        } else {
            0
        };
        let mut eq = input.equivalence_properties().clone();
        eq.clear_per_partition_constants();
        let properties = PlanProperties::new(
            eq,
            Partitioning::UnknownPartitioning(count),
            input.pipeline_behavior(),
            input.boundedness(),
        );
        Ok(Self {
            input,
            tasks,
            task,
            properties: Arc::new(properties),
        })
    }

    pub fn tasks(&self) -> usize {
        self.tasks
    }

    pub fn task(&self) -> usize {
        self.task
    }

    /// `plan` with its partition subset (the topmost one; the producers below it are inside
    /// exchange reads, which are leaves) made the one of task `task`.
    pub fn for_task(plan: Arc<dyn ExecutionPlan>, task: usize) -> Result<Arc<dyn ExecutionPlan>> {
        let mut found = false;
        let plan = plan
            .transform_down(|node| {
                if found {
                    return Ok(Transformed::no(node));
                }
                let Some(subset) = node.as_any().downcast_ref::<PartitionSubsetExec>() else {
                    return Ok(Transformed::no(node));
                };
                found = true;
                let subset =
                    PartitionSubsetExec::try_new(subset.input.clone(), subset.tasks, task)?;
                Ok(Transformed::yes(Arc::new(subset) as Arc<dyn ExecutionPlan>))
            })?
            .data;
        if !found {
            return Err(DataFusionError::Internal(
                "an exchange producer without its partition subset".into(),
            ));
        }
        Ok(plan)
    }
}

impl DisplayAs for PartitionSubsetExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "PartitionSubsetExec: partitions p mod {} = {}",
            self.tasks, self.task
        )
    }
}

impl ExecutionPlan for PartitionSubsetExec {
    fn name(&self) -> &str {
        "PartitionSubsetExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(Arc::new(Self::try_new(input, self.tasks, self.task)?)),
            _ => Err(DataFusionError::Internal(
                "PartitionSubsetExec has exactly one child".into(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let count = self.properties.partitioning.partition_count();
        if partition >= count {
            return Err(DataFusionError::Internal(format!(
                "partition {partition} of a subset of {count}"
            )));
        }
        self.input
            .execute(self.task + partition * self.tasks, context)
    }
}

/// Where a producer task runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Producer {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Producer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// How the consumers of an exchange read its producer tasks.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum ExchangeMode {
    /// Partition `p` is output partition `p` of every task (a repartition).
    #[default]
    Partitioned,
    /// Partition `t` is the one output partition of task `t` (a gather: the merge above
    /// reads every task's merged, possibly sorted, rows).
    ByTask,
    /// One partition: the one output partition of every task, which each task keeps and
    /// serves whole to each of `readers` consumers (the build side of a `CollectLeft` join
    /// probed by `readers` tasks).
    Broadcast { readers: u32 },
}

/// What identifies an exchange, beside its producer plan.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExchangeSpec {
    /// The query's id, shared by all its exchanges.
    pub query: String,
    pub stage: u32,
    /// Task `t` runs on `producers[t]`.
    pub producers: Vec<Producer>,
    #[serde(default)]
    pub mode: ExchangeMode,
}

/// Reads an exchange: partition `p` is output partition `p` of every producer task,
/// fetched over Flight from the executors running them. A leaf: the producer plan travels
/// inside it (see the module's text).
pub struct ExchangeReadExec {
    spec: ExchangeSpec,
    /// `RepartitionExec(…, PartitionSubsetExec(input, T, 0))`: task `t` runs it with
    /// subset `t`.
    producer: Arc<dyn ExecutionPlan>,
    /// `producer` encoded once.
    encoded: Arc<Vec<u8>>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for ExchangeReadExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExchangeReadExec")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl ExchangeReadExec {
    /// An exchange whose producer tasks run `producer` (encoded as `encoded` by Basin's
    /// physical codec) on `spec.producers`.
    pub fn new(spec: ExchangeSpec, producer: Arc<dyn ExecutionPlan>, encoded: Vec<u8>) -> Self {
        let mut eq = producer.equivalence_properties().clone();
        let tasks = spec.producers.len();
        if tasks > 1 && spec.mode != ExchangeMode::ByTask {
            // The producers' streams are interleaved: no order, no per-partition constant.
            eq.clear_orderings();
            eq.clear_per_partition_constants();
        }
        let partitioning = match spec.mode {
            ExchangeMode::Partitioned => producer.output_partitioning().clone(),
            ExchangeMode::ByTask => {
                eq.clear_per_partition_constants();
                Partitioning::UnknownPartitioning(tasks)
            }
            ExchangeMode::Broadcast { .. } => Partitioning::UnknownPartitioning(1),
        };
        let properties = PlanProperties::new(
            eq,
            partitioning,
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Self {
            spec,
            producer,
            encoded: Arc::new(encoded),
            properties: Arc::new(properties),
        }
    }

    /// Encodes `producer` with `codec`, then [`ExchangeReadExec::new`].
    pub fn try_encode(
        spec: ExchangeSpec,
        producer: Arc<dyn ExecutionPlan>,
        codec: &dyn PhysicalExtensionCodec,
    ) -> Result<Self> {
        let node = PhysicalPlanNode::try_from_physical_plan(producer.clone(), codec)?;
        let mut encoded = vec![];
        node.try_encode(&mut encoded)?;
        Ok(Self::new(spec, producer, encoded))
    }

    pub fn spec(&self) -> &ExchangeSpec {
        &self.spec
    }

    pub fn producer(&self) -> &Arc<dyn ExecutionPlan> {
        &self.producer
    }

    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// Whether this reads the build side of a broadcast join.
    pub fn is_broadcast(&self) -> bool {
        matches!(self.spec.mode, ExchangeMode::Broadcast { .. })
    }

    /// The same exchange read in `mode`.
    pub fn with_mode(&self, mode: ExchangeMode) -> Self {
        let mut spec = self.spec.clone();
        spec.mode = mode;
        let mut read = Self::new(spec, self.producer.clone(), vec![]);
        read.encoded = self.encoded.clone();
        read
    }

    /// This broadcast read with `readers` consumer tasks.
    pub fn with_readers(&self, readers: u32) -> Self {
        let mut spec = self.spec.clone();
        if let ExchangeMode::Broadcast { readers: r } = &mut spec.mode {
            *r = readers;
        }
        Self {
            spec,
            producer: self.producer.clone(),
            encoded: self.encoded.clone(),
            properties: self.properties.clone(),
        }
    }
}

impl DisplayAs for ExchangeReadExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let producers: Vec<String> = self.spec.producers.iter().map(|p| p.to_string()).collect();
        let mode = match self.spec.mode {
            ExchangeMode::Partitioned => "repartition".to_string(),
            ExchangeMode::ByTask => "gather".to_string(),
            ExchangeMode::Broadcast { readers } => format!("broadcast to {readers} readers"),
        };
        write!(
            f,
            "ExchangeReadExec: stage={}, {mode}, partitioning={}, producers=[{}]",
            self.spec.stage,
            self.properties.partitioning,
            producers.join(", ")
        )?;
        if matches!(t, DisplayFormatType::TreeRender) {
            return Ok(());
        }
        // The producer plan, each line marked, below this node's line.
        let producer = datafusion::physical_plan::displayable(self.producer.as_ref())
            .indent(matches!(t, DisplayFormatType::Verbose))
            .to_string();
        for line in producer.lines() {
            write!(f, "\n    | {line}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for ExchangeReadExec {
    fn name(&self) -> &str {
        "ExchangeReadExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "ExchangeReadExec is a leaf".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = self.schema();
        let props = context.session_config().to_key_value_pairs();
        let count = self.properties.partitioning.partition_count();
        if partition >= count {
            return Err(DataFusionError::Internal(format!(
                "partition {partition} of an exchange read of {count}"
            )));
        }
        // (task, its partition) to read.
        let reads: Vec<(usize, usize)> = match self.spec.mode {
            ExchangeMode::Partitioned => (0..self.spec.producers.len())
                .map(|t| (t, partition))
                .collect(),
            ExchangeMode::ByTask => vec![(partition, 0)],
            ExchangeMode::Broadcast { .. } => {
                (0..self.spec.producers.len()).map(|t| (t, 0)).collect()
            }
        };
        let prefix = match self.spec.mode {
            ExchangeMode::Broadcast { readers } => broadcast_prefix(readers),
            _ => EXCHANGE_TICKET.to_vec(),
        };
        let key = crate::cluster::key_of(&context);
        let streams = reads.into_iter().map(|(task, partition)| {
            let producer = &self.spec.producers[task];
            let ticket = TaskDefinition {
                job_id: self.spec.query.clone(),
                stage_id: self.spec.stage,
                task_id: task as u32,
                partition_id: partition as u32,
                plan: self.encoded.as_ref().clone(),
                session_id: context.session_id(),
                props: props.clone(),
                ..Default::default()
            };
            let what = format!(
                "exchange {} stage {} partition {partition}: producer task {task} on \
                     executor {producer}",
                self.spec.query, self.spec.stage
            );
            read_producer(
                producer.clone(),
                Ticket::new(crate::codec::encode_ticket(&prefix, &ticket)),
                what,
                key.clone(),
            )
        });
        let target = schema.clone();
        // The producer plan lives as long as its rows are read: the front end may drop the
        // plan once its streams exist, and what the producers need from this process goes
        // with it (a PostgreSQL scan's exported snapshot is held by its plan node).
        let producer = self.producer.clone();
        let batches = futures::stream::select_all(streams).and_then(move |batch| {
            let _alive = &producer;
            futures::future::ready(conform(batch, &target))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }
}

/// `batch`, read from an executor's Flight stream, with the types of the plan's `schema`:
/// executors send dictionary-encoded columns as plain values (Arrow Flight's default, which
/// also casts nested types to their declared fields), and operators above the read expect
/// the dictionary the plan has (grouping encodes rows by the declared type).
pub fn conform(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema_ref().fields() == schema.fields() {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| {
            if column.data_type() == field.data_type() {
                Ok(column.clone())
            } else {
                datafusion::arrow::compute::cast(column, field.data_type())
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &options,
    )?)
}

/// The batches of one producer task's partition; every error names the executor (`what`).
fn read_producer(
    producer: Producer,
    ticket: Ticket,
    what: String,
    key: Option<Arc<basin_core::cluster::ClusterKey>>,
) -> futures::stream::BoxStream<'static, Result<datafusion::arrow::array::RecordBatch>> {
    let address = format!("http://{producer}");
    let failed = {
        let what = what.clone();
        move |why: &str, e: &dyn fmt::Display| {
            DataFusionError::Execution(format!("{what}: {why}: {e}"))
        }
    };
    let open = {
        let failed = failed.clone();
        async move {
            let endpoint = tonic::transport::Endpoint::from_shared(address)
                .map_err(|e| failed("bad executor address", &e))?
                .tcp_nodelay(true)
                .max_frame_size(FRAME_BYTES)
                // A producer whose host vanished fails the query within 30 s.
                .connect_timeout(Duration::from_secs(10))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(20));
            let key = key.as_deref();
            let endpoint = crate::cluster::with_user_agent(endpoint, key)
                .map_err(|e| failed("bad cluster user agent", &e))?;
            let channel = endpoint
                .connect()
                .await
                .map_err(|e| failed("cannot connect (lost?)", &e))?;
            let mut client = FlightServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            let response = client
                .do_get(crate::cluster::signed_ticket(ticket, key))
                .await
                .map_err(|s| failed("failed", &status_text(&s)))?;
            let messages = response
                .into_inner()
                .map_err(|s| FlightError::Tonic(Box::new(s)));
            Ok::<_, DataFusionError>(
                FlightRecordBatchStream::new_from_flight_data(messages).map_err(flight_error),
            )
        }
    };
    futures::stream::once(open)
        .try_flatten()
        .map_err(move |e| match e {
            DataFusionError::Execution(_) if e.message().starts_with(&what) => e,
            other => failed("failed", &other.message()),
        })
        .boxed()
}

/// What a Flight error says: the executor's own message, or the broken connection's.
fn status_text(status: &tonic::Status) -> String {
    use std::error::Error;
    match status.source() {
        Some(cause) => format!("{} ({cause})", status.message()),
        None => status.message().to_string(),
    }
}

/// A Flight error as DataFusion's: the executor's own message when it sent one.
fn flight_error(e: FlightError) -> DataFusionError {
    match e {
        FlightError::Tonic(status) => crate::remote::status_source_error(&status)
            .unwrap_or_else(|| DataFusionError::Execution(status_text(&status))),
        FlightError::ExternalError(e) => match e.downcast::<DataFusionError>() {
            Ok(e) => *e,
            Err(e) => DataFusionError::External(e),
        },
        other => DataFusionError::Execution(other.to_string()),
    }
}

/// The codec's wire form of an exchange read: its spec as JSON, then the producer plan.
pub(crate) fn encode_exchange_read(read: &ExchangeReadExec, buf: &mut Vec<u8>) -> Result<()> {
    let spec = serde_json::to_vec(&read.spec)
        .map_err(|e| DataFusionError::Internal(format!("cannot encode an exchange: {e}")))?;
    buf.extend_from_slice(&(spec.len() as u32).to_le_bytes());
    buf.extend_from_slice(&spec);
    buf.extend_from_slice(&read.encoded);
    Ok(())
}

/// See [`encode_exchange_read`]; the producer plan is decoded with `codec`.
pub(crate) fn decode_exchange_read(
    payload: &[u8],
    ctx: &TaskContext,
    codec: &dyn PhysicalExtensionCodec,
) -> Result<ExchangeReadExec> {
    let corrupt = || DataFusionError::Internal("corrupt exchange in plan".to_string());
    let (len, rest) = payload.split_first_chunk::<4>().ok_or_else(corrupt)?;
    let len = u32::from_le_bytes(*len) as usize;
    if rest.len() < len {
        return Err(corrupt());
    }
    let (spec, plan) = rest.split_at(len);
    let spec: ExchangeSpec = serde_json::from_slice(spec)
        .map_err(|e| DataFusionError::Internal(format!("cannot decode an exchange: {e}")))?;
    let producer = PhysicalPlanNode::try_decode(plan)?.try_into_physical_plan(ctx, codec)?;
    Ok(ExchangeReadExec::new(spec, producer, plan.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::physical_codec;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_plan::displayable;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::repartition::RepartitionExec;

    #[test]
    fn subsets_cover_every_partition_once() {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let input: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(schema).with_partitions(5));
        let mut seen = vec![];
        for t in 0..3 {
            let subset = PartitionSubsetExec::try_new(input.clone(), 3, t).unwrap();
            for i in 0..subset.properties().partitioning.partition_count() {
                seen.push(t + i * 3);
            }
        }
        seen.sort();
        assert_eq!(seen, (0..5).collect::<Vec<_>>());
        assert!(PartitionSubsetExec::try_new(input, 2, 2).is_err());
    }

    #[test]
    fn an_exchange_read_travels_with_its_producer() {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let input: Arc<dyn ExecutionPlan> =
            Arc::new(EmptyExec::new(schema.clone()).with_partitions(5));
        let subset = Arc::new(PartitionSubsetExec::try_new(input, 2, 0).unwrap());
        let hash = Partitioning::Hash(vec![col("a", &schema).unwrap()], 4);
        let producer = Arc::new(RepartitionExec::try_new(subset, hash).unwrap());
        let spec = ExchangeSpec {
            query: "q".into(),
            stage: 1,
            mode: ExchangeMode::Partitioned,
            producers: vec![
                Producer {
                    host: "h".into(),
                    port: 1,
                },
                Producer {
                    host: "h".into(),
                    port: 2,
                },
            ],
        };
        let codec = physical_codec();
        let read: Arc<dyn ExecutionPlan> =
            Arc::new(ExchangeReadExec::try_encode(spec, producer, codec.as_ref()).unwrap());
        let node = PhysicalPlanNode::try_from_physical_plan(read.clone(), codec.as_ref()).unwrap();
        let back = node
            .try_into_physical_plan(&TaskContext::default(), codec.as_ref())
            .unwrap();
        let show = |p: &Arc<dyn ExecutionPlan>| displayable(p.as_ref()).indent(true).to_string();
        // (datafusion-proto makes an EmptyExec of one partition: the input's count differs.)
        let first = |p: &Arc<dyn ExecutionPlan>| show(p).lines().next().unwrap().to_string();
        assert_eq!(first(&back), first(&read));
        assert!(show(&back).contains("PartitionSubsetExec: partitions p mod 2 = 0"));
        assert!(
            show(&back).contains("producers=[h:1, h:2]"),
            "{}",
            show(&back)
        );
        assert_eq!(back.output_partitioning().partition_count(), 4);
        let back = back.as_any().downcast_ref::<ExchangeReadExec>().unwrap();
        let task = PartitionSubsetExec::for_task(back.producer().clone(), 1).unwrap();
        assert!(show(&task).contains("p mod 2 = 1"), "{}", show(&task));
    }
}
