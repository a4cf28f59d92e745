//! The executor's Arrow Flight service: Ballista's shuffle-file fetches, plus streamed
//! stages — one partition of a plan that the scheduler sends in the ticket, run here and
//! streamed straight back, with no shuffle file in between.
//!
//! ```text
//!  scheduler ──DoGet(BASIN-STAGE ticket: plan, partition, settings)──► executor
//!            ◄──────────── Arrow batches, as the plan produces them ──────┘
//!  others    ──DoGet(FetchPartition) / DoAction ──► Ballista's BallistaFlightService
//!  scheduler ──DoAction(basin.query_memory) ──► bytes one query may hold here
//!  consumers ──DoGet(BASIN-EXCHANGE ticket) ──► one partition of an exchange's producer
//! ```
//!
//! Dropping the response stream (the client went away, or the query was cancelled) drops
//! the running plan, which cancels its remote queries.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use ballista_core::error::BallistaError;
use ballista_core::extension::SessionConfigHelperExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::TaskDefinition;
use ballista_core::utils::{GrpcServerConfig, create_grpc_server};
use ballista_core::{ConfigProducer, RuntimeProducer};
use ballista_executor::ArrowFlightServerProvider;
use ballista_executor::flight_service::BallistaFlightService;
use ballista_executor::shutdown::Shutdown;
use basin_connectors::cluster::{check_call, check_ticket};
use basin_connectors::codec::decode_stage_ticket;
use basin_connectors::exchange::{ExchangeTicket, PartitionSubsetExec, decode_exchange_ticket};
use basin_core::cluster::ClusterKey;
use basin_core::memory::{MemoryBudget, QUERY_MEMORY_ACTION};
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{AsExecutionPlan, PhysicalExtensionCodec};
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::{Stream, TryStreamExt};

use crate::engine::{TaskLog, TaskRecord};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Flight messages are split well below this; it bounds what a peer may make us buffer.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// What a streamed stage needs to decode and run its plan, as Ballista's own tasks do.
#[derive(Clone)]
pub(crate) struct StageRuntime {
    pub runtime: RuntimeProducer,
    pub config: ConfigProducer,
    pub functions: Arc<BallistaFunctionRegistry>,
    pub codec: Arc<dyn PhysicalExtensionCodec>,
    /// `host:port` of this executor, for the task log.
    pub name: String,
    pub log: Option<TaskLog>,
    /// The executor's memory budget, whose per-query share the scheduler asks for.
    pub memory: Arc<MemoryBudget>,
    /// The cluster's key: calls without its proof are refused (basin_core::cluster).
    pub key: Option<ClusterKey>,
}

/// Ballista's Flight service with streamed stages added.
#[derive(Clone)]
pub(crate) struct ExecutorFlight {
    shuffle: BallistaFlightService,
    stages: StageRuntime,
    producers: crate::exchange::Producers,
}

impl ExecutorFlight {
    /// The context a ticket's plan runs in: its session's settings, this executor's
    /// runtime and functions.
    fn task_context(&self, task: &TaskDefinition) -> Result<TaskContext, Status> {
        let config = (self.stages.config)().update_from_key_value_pair(&task.props);
        let runtime = (self.stages.runtime)(&config).map_err(stage_error)?;
        let functions = &self.stages.functions;
        Ok(TaskContext::new(
            Some(task.job_id.clone()),
            task.session_id.clone(),
            config,
            functions.scalar_functions.clone(),
            functions.aggregate_functions.clone(),
            functions.window_functions.clone(),
            runtime,
        ))
    }

    /// A ticket's plan, decoded, with the executor's rewrites.
    fn decode_plan(
        &self,
        task: &TaskDefinition,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn ExecutionPlan>, DataFusionError> {
        let plan: Arc<dyn ExecutionPlan> = PhysicalPlanNode::try_decode(&task.plan)
            .and_then(|node| node.try_into_physical_plan(ctx, self.stages.codec.as_ref()))?;
        let plan = crate::shared::share_repeated_aggregates(plan, self.stages.codec.as_ref());
        Ok(crate::fast::fast_expressions(plan))
    }

    /// Refuses a call from outside the cluster.
    fn check<T>(&self, request: &Request<T>, what: &str) -> Result<(), Status> {
        check_call(self.stages.key.as_ref(), request.metadata())
            .inspect_err(|s| self.refused(what, s))
    }

    fn refused(&self, what: &str, status: &Status) {
        tracing::warn!(executor = %self.stages.name, call = what, why = %status.message(), "refused a Flight call");
    }

    fn run_stage(&self, task: TaskDefinition) -> Result<Boxed<FlightData>, Status> {
        let ctx = self.task_context(&task)?;
        let plan = self.decode_plan(&task, &ctx).map_err(stage_error)?;
        let plan = crate::dynamic_filters::push_dynamic_filters(plan, &ctx).map_err(stage_error)?;
        let partition = task.partition_id as usize;
        let partitions = plan.properties().partitioning.partition_count();
        if partition >= partitions {
            return Err(Status::invalid_argument(format!(
                "streamed stage {}: partition {partition} of a plan with {partitions} partitions",
                task.job_id
            )));
        }
        tracing::info!(
            executor = %self.stages.name,
            stage = %task.job_id,
            partition,
            "streaming a stage partition"
        );
        if let Some(log) = &self.stages.log {
            log.push(TaskRecord {
                executor: self.stages.name.clone(),
                job_id: task.job_id.clone(),
                stage_id: 0,
                partition,
            });
        }
        let stream = plan
            .execute(partition, Arc::new(ctx))
            .map_err(stage_error)?;
        Ok(flight_stream(stream))
    }

    /// One output partition of an exchange's producer task, from the task's one instance
    /// on this executor ([`crate::exchange`]).
    fn run_exchange(&self, ticket: ExchangeTicket) -> Result<Boxed<FlightData>, Status> {
        let (task, readers) = match ticket {
            ExchangeTicket::Partition(task) => (task, None),
            ExchangeTicket::Broadcast { task, readers } => (task, Some(readers)),
        };
        let key = (task.job_id.clone(), task.stage_id, task.task_id);
        let partition = task.partition_id as usize;
        let stream = self
            .producers
            .execute(key, partition, readers, || {
                let ctx = self
                    .task_context(&task)
                    .map_err(|s| DataFusionError::Execution(s.message().to_string()))?;
                let plan = self.decode_plan(&task, &ctx)?;
                let plan = PartitionSubsetExec::for_task(plan, task.task_id as usize)?;
                tracing::info!(
                    executor = %self.stages.name,
                    query = %task.job_id,
                    stage = task.stage_id,
                    task = task.task_id,
                    "starting an exchange producer"
                );
                Ok((plan, Arc::new(ctx)))
            })
            .map_err(stage_error)?;
        tracing::debug!(
            executor = %self.stages.name,
            query = %task.job_id,
            stage = task.stage_id,
            task = task.task_id,
            partition,
            "streaming an exchange partition"
        );
        Ok(flight_stream(stream))
    }
}

/// A plan's batches as Flight messages: the schema, then each batch.
fn flight_stream(stream: SendableRecordBatchStream) -> Boxed<FlightData> {
    let schema = stream.schema();
    // Only this batch's bytes go over the wire (string views share buffers).
    let batches = stream
        .and_then(|b| futures::future::ready(basin_connectors::views::compact_views(b)))
        .map_err(|e| FlightError::Tonic(Box::new(stage_error(e))));
    let flight = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(batches)
        .map_err(Status::from);
    Box::pin(flight)
}

/// The error as the user should read it: the message without DataFusion's kind prefix.
fn stage_error(e: DataFusionError) -> Status {
    // A source's failure keeps its kind on the way to the scheduler (and the client).
    if let Some(status) = basin_connectors::remote::source_status(&e) {
        return status;
    }
    match e.find_root() {
        DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(e.message()),
        _ => Status::internal(e.message().into_owned()),
    }
}

#[tonic::async_trait]
impl FlightService for ExecutorFlight {
    type HandshakeStream = Boxed<HandshakeResponse>;
    type ListFlightsStream = Boxed<FlightInfo>;
    type DoGetStream = Boxed<FlightData>;
    type DoPutStream = Boxed<PutResult>;
    type DoActionStream = Boxed<arrow_flight::Result>;
    type ListActionsStream = Boxed<ActionType>;
    type DoExchangeStream = Boxed<FlightData>;

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let ticket = &request.get_ref().ticket;
        let key = self.stages.key.as_ref();
        if let Some(task) = decode_stage_ticket(ticket) {
            check_ticket(key, ticket, request.metadata())
                .inspect_err(|s| self.refused("stage", s))?;
            let task = task.map_err(|e| Status::invalid_argument(e.to_string()))?;
            return Ok(Response::new(self.run_stage(task)?));
        }
        if let Some(task) = decode_exchange_ticket(ticket) {
            check_ticket(key, ticket, request.metadata())
                .inspect_err(|s| self.refused("exchange", s))?;
            let task = task.map_err(|e| Status::invalid_argument(e.to_string()))?;
            return Ok(Response::new(self.run_exchange(task)?));
        }
        self.check(&request, "shuffle fetch")?;
        self.shuffle.do_get(request).await
    }

    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        self.check(&request, "handshake")?;
        self.shuffle.handshake(request).await
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        self.check(&request, "list flights")?;
        self.shuffle.list_flights(request).await
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.check(&request, "get flight info")?;
        self.shuffle.get_flight_info(request).await
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        self.check(&request, "poll flight info")?;
        self.shuffle.poll_flight_info(request).await
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        self.check(&request, "get schema")?;
        self.shuffle.get_schema(request).await
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        self.check(&request, "do put")?;
        self.shuffle.do_put(request).await
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        self.check(&request, "action")?;
        if request.get_ref().r#type == QUERY_MEMORY_ACTION {
            let share = arrow_flight::Result {
                body: self.stages.memory.query_share().to_string().into(),
            };
            return Ok(Response::new(Box::pin(futures::stream::iter([Ok(share)]))));
        }
        self.shuffle.do_action(request).await
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        self.check(&request, "list actions")?;
        self.shuffle.list_actions(request).await
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        self.check(&request, "do exchange")?;
        self.shuffle.do_exchange(request).await
    }
}

/// Starts [`ExecutorFlight`] where Ballista would start its own Flight service, on
/// `listener` (bound since the port was chosen, so no other process can take it meanwhile)
/// when Ballista asks for its address, else on a new one.
pub(crate) fn provider(
    stages: StageRuntime,
    listener: std::net::TcpListener,
) -> Arc<ArrowFlightServerProvider> {
    let listener = std::sync::Mutex::new(Some(listener));
    let producers = crate::exchange::Producers::default();
    Arc::new(
        move |work_dir: String,
              address: SocketAddr,
              mut shutdown: Shutdown,
              grpc: GrpcServerConfig| {
            let service = ExecutorFlight {
                shuffle: BallistaFlightService::new(work_dir),
                stages: stages.clone(),
                producers: producers.clone(),
            };
            let reserved = listener
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .filter(|l| l.local_addr().is_ok_and(|a| a.port() == address.port()));
            tokio::spawn(async move {
                let server = create_grpc_server(&grpc).add_service(
                    FlightServiceServer::new(service)
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                );
                let stop = async move { shutdown.recv().await };
                let served = match reserved {
                    Some(listener) => {
                        // What create_grpc_server sets for the sockets it accepts itself.
                        let incoming = listener
                            .set_nonblocking(true)
                            .and_then(|()| tokio::net::TcpListener::from_std(listener))
                            .map_err(|e| BallistaError::General(e.to_string()))?;
                        let incoming = TcpIncoming::from(incoming)
                            .with_nodelay(Some(true))
                            .with_keepalive(Some(Duration::from_secs(grpc.tcp_keepalive_seconds)));
                        server.serve_with_incoming_shutdown(incoming, stop).await
                    }
                    None => server.serve_with_shutdown(address, stop).await,
                };
                served.map_err(BallistaError::TonicError)
            })
        },
    )
}
