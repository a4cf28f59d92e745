//! Starting the Ballista scheduler with Basin's codecs and sessions.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::{SchedulerConfig, TaskDistributionPolicy};
use ballista_scheduler::scheduler_server::SchedulerServer;
use basin_connectors::catalogs::runtime_env;
use basin_connectors::codec::{logical_codec, physical_codec};
use basin_core::cluster::ClusterKey;
use basin_core::net::reserve_port;
use basin_core::{BasinConfig, BasinError, Result};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use tokio::task::JoinHandle;

use crate::launch::BasinTasks;
use crate::session::{config_producer, session_builder};

/// Where and how the scheduler listens.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Address to bind (default 127.0.0.1).
    pub bind_host: String,
    /// gRPC port; 0 picks a free port.
    pub port: u16,
    /// Host name executors and clients use to reach this scheduler.
    pub external_host: String,
    /// Seconds without a heartbeat after which Ballista drops an executor (and tells it to
    /// stop). An executor that died is dropped sooner, by Basin's probes
    /// ([`crate::liveness`]); this is for one that hangs with its port open.
    pub executor_timeout_seconds: u64,
}

impl SchedulerOptions {
    /// Options from `[server]`.
    pub fn from_config(config: &BasinConfig) -> Self {
        Self {
            bind_host: config.server.bind_host.clone(),
            port: config.server.scheduler_port,
            external_host: config.server.bind_host.clone(),
            executor_timeout_seconds: 60,
        }
    }
}

/// A running scheduler.
pub struct SchedulerHandle {
    /// The address it listens on.
    pub addr: SocketAddr,
    server: SchedulerServer<LogicalPlanNode, PhysicalPlanNode>,
    task: JoinHandle<()>,
    /// Probes the executors ([`crate::liveness`]).
    probes: JoinHandle<()>,
    /// Reports the tasks executors refused ([`crate::launch`]).
    refusals: JoinHandle<()>,
}

/// A cheap, clonable view of the cluster's executors.
#[derive(Clone)]
pub struct ClusterView {
    server: SchedulerServer<LogicalPlanNode, PhysicalPlanNode>,
}

impl ClusterView {
    /// Total task slots of the registered executors.
    pub async fn task_slots(&self) -> usize {
        self.executors(false)
            .await
            .iter()
            .map(|e| e.task_slots as usize)
            .sum()
    }
}

impl ClusterView {
    /// The executors that take work now: registered, not shutting down, and not taken out
    /// of placement for failing a connection or probes ([`crate::liveness`]).
    pub async fn active_executors(&self) -> Vec<ExecutorInfo> {
        crate::streamed::answering(self.executors(true).await)
    }

    /// The registered executors; with `active_only`, those not shutting down.
    async fn executors(&self, active_only: bool) -> Vec<ExecutorInfo> {
        use ballista_core::serde::protobuf::executor_status::Status;
        let manager = &self.server.state.executor_manager;
        let state = manager.get_executors_state().await.unwrap_or_default();
        state
            .into_iter()
            .filter(|(m, _, _)| {
                !active_only
                    || manager.get_executor_hearbeat(&m.id).is_none_or(|hb| {
                        matches!(hb.status.and_then(|s| s.status), Some(Status::Active(_)))
                    })
            })
            .map(|(m, _, _)| ExecutorInfo {
                id: m.id,
                host: m.host,
                port: m.port,
                task_slots: m.specification.task_slots,
            })
            .collect()
    }

    /// The executors that take work now, waiting up to `patience` for one to (re)appear:
    /// a query planned with none would wait in Ballista's queue with no end. The error
    /// says how many are registered.
    pub async fn wait_for_active_executors(
        &self,
        patience: Duration,
    ) -> std::result::Result<Vec<ExecutorInfo>, String> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let active = self.active_executors().await;
            if !active.is_empty() {
                return Ok(active);
            }
            if tokio::time::Instant::now() >= deadline {
                let registered = self.executors(false).await.len();
                return Err(format!(
                    "no executor is taking work ({registered} registered with the scheduler, \
                     none of them active) after waiting {patience:?}: start executors with \
                     `basin executor --scheduler HOST:PORT`, or see their logs for why they \
                     stopped"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Asks executor `id` to stop (its running tasks fail or go to the others).
    pub async fn stop_executor(&self, id: &str, reason: &str) {
        self.server
            .state
            .executor_manager
            .stop_executor(id, reason.to_string())
            .await;
    }

    /// Forgets registered executors that no longer listen on their Flight port (they stopped
    /// without telling the scheduler, which would otherwise hand them work until their
    /// heartbeats time out); returns how many.
    pub async fn forget_stopped_executors(&self) -> usize {
        let mut forgotten = 0;
        for executor in self.executors(false).await {
            let address = (executor.host.clone(), executor.port);
            let probe = tokio::time::timeout(
                Duration::from_secs(2),
                tokio::net::TcpStream::connect(address),
            )
            .await;
            if matches!(probe, Ok(Err(_))) {
                let _ = self
                    .server
                    .state
                    .executor_manager
                    .remove_executor(&executor.id, Some("it stopped".to_string()))
                    .await;
                forgotten += 1;
            }
        }
        forgotten
    }

    /// Removes the shuffle files, on every executor, of the jobs named `name` that ended at
    /// or after `since_ms` (milliseconds since the epoch); returns how many jobs. A Flight SQL
    /// result stream calls this when its client has read the last row: Ballista's own
    /// clean-up comes an hour after a job ends (`finished_job_data_clean_up_interval_seconds`),
    /// and a workload of large queries filled the disk before that (TPC-DS SF10: 20 GB of
    /// shuffle files in 20 minutes, then "No space left on device").
    pub async fn remove_data_of_jobs_named(&self, name: &str, since_ms: u64) -> usize {
        let jobs = match self.server.state.task_manager.get_all_jobs().await {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list jobs to remove their shuffle files");
                return 0;
            }
        };
        let mut removed = 0;
        for job in jobs
            .iter()
            .filter(|j| j.job_name == name && j.end_time != 0 && j.end_time >= since_ms)
        {
            tracing::debug!(job = %job.job_id, "removing the job's shuffle files");
            self.server
                .state
                .executor_manager
                .clean_up_job_data(job.job_id.clone());
            removed += 1;
        }
        removed
    }

    /// The ids of the jobs that have not ended.
    pub fn running_jobs(&self) -> Vec<String> {
        let active = self.server.state.task_manager.get_running_job_cache();
        active.keys().cloned().collect()
    }

    /// Cancels the running jobs named `name`; returns how many.
    pub async fn cancel_jobs_named(&self, name: &str) -> usize {
        // The cache of active jobs: listing all jobs fails as soon as one finished job's
        // graph has been evicted.
        let active = self.server.state.task_manager.get_running_job_cache();
        let mut matching = vec![];
        for (job_id, job) in active.iter() {
            if job.execution_graph.read().await.job_name() == name {
                matching.push(job_id.clone());
            }
        }
        let mut cancelled = 0;
        for job_id in matching {
            match self.server.cancel_job(job_id.clone()).await {
                Ok(()) => {
                    tracing::info!(job = %job_id, "cancelled job");
                    cancelled += 1;
                }
                Err(e) => tracing::warn!(job = %job_id, error = %e, "cannot cancel job"),
            }
        }
        cancelled
    }
}

/// An executor registered with the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorInfo {
    pub id: String,
    pub host: String,
    pub port: u16,
    pub task_slots: u32,
}

impl SchedulerHandle {
    /// `http://host:port` for clients and executors.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A view of the cluster for components that outlive this call.
    pub fn cluster_view(&self) -> ClusterView {
        ClusterView {
            server: self.server.clone(),
        }
    }

    /// The executors that have registered.
    pub async fn executors(&self) -> Vec<ExecutorInfo> {
        self.cluster_view().executors(false).await
    }

    /// Waits until at least `n` executors have registered.
    pub async fn wait_for_executors(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<ExecutorInfo>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let executors = self.executors().await;
            if executors.len() >= n {
                return Ok(executors);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(BasinError::Invalid(format!(
                    "only {} of {n} executors registered with the scheduler at {} within {:?}",
                    executors.len(),
                    self.addr,
                    timeout
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the scheduler.
    pub fn stop(&self) {
        self.task.abort();
        self.probes.abort();
        self.refusals.abort();
    }
}

impl Drop for SchedulerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the scheduler and returns once it accepts connections.
pub async fn start(config: Arc<BasinConfig>, options: SchedulerOptions) -> Result<SchedulerHandle> {
    config
        .cluster
        .check_exposure(&options.bind_host, "scheduler")?;
    let key = config.cluster.key();
    let addr = reserve_port(&options.bind_host, options.port, "scheduler")?;
    let runtime = runtime_env(&config)?;
    let mut scheduler_config = SchedulerConfig::default()
        .with_hostname(options.external_host.clone())
        .with_port(addr.port())
        .with_scheduler_policy(TaskSchedulingPolicy::PushStaged)
        .with_task_distribution(TaskDistributionPolicy::RoundRobin)
        .with_override_config_producer(config_producer())
        .with_override_session_builder(session_builder(runtime));
    scheduler_config.bind_host = options.bind_host.clone();
    scheduler_config.executor_timeout_seconds = options.executor_timeout_seconds;
    // Heartbeats are checked every 5 s instead of 15: a hung executor goes within 65 s.
    scheduler_config.expire_dead_executor_interval_seconds = 5;
    // Ballista deletes a job's shuffle files this long after the job finishes, even while a
    // client still streams the final stage (its default of 300 s cut off a 60-million-row
    // result). Keep them for an hour.
    scheduler_config.finished_job_data_clean_up_interval_seconds = 3600;
    scheduler_config.override_logical_codec = Some(logical_codec());
    scheduler_config.override_physical_codec = Some(physical_codec());
    // Its calls to the executors prove it is of the cluster.
    scheduler_config.override_create_grpc_client_endpoint = key
        .as_ref()
        .map(basin_connectors::cluster::endpoint_override);
    let scheduler_config = Arc::new(scheduler_config);

    let cannot = |e: ballista_core::error::BallistaError| {
        BasinError::Invalid(format!("cannot create the scheduler: {e}"))
    };
    let cluster = BallistaCluster::new_from_config(&scheduler_config)
        .await
        .map_err(cannot)?;
    // As Ballista's create_scheduler, with Basin's launcher (crate::launch).
    let codec = ballista_core::serde::BallistaCodec::new(logical_codec(), physical_codec());
    let (launcher, refusals) = BasinTasks::new(key.clone(), scheduler_config.scheduler_name());
    let mut scheduler = SchedulerServer::new_with_task_launcher(
        scheduler_config.scheduler_name(),
        cluster,
        codec,
        scheduler_config,
        ballista_scheduler::metrics::default_metrics_collector().map_err(cannot)?,
        Arc::new(launcher),
    );
    scheduler.init().await.map_err(cannot)?;
    let refusals = crate::launch::report_refusals(scheduler.clone(), refusals);
    let server = scheduler.clone();
    let guard = Guard {
        key: key.clone(),
        rest_api: config.cluster.rest_api,
    };
    let task = tokio::spawn(async move {
        if let Err(e) = serve_scheduler(addr, scheduler, guard).await {
            tracing::error!(error = %e, "scheduler stopped");
        }
    });
    // Wait until the port accepts connections.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            break;
        }
        if task.is_finished() || tokio::time::Instant::now() > deadline {
            return Err(BasinError::Invalid(format!(
                "the scheduler did not start listening on {addr}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::info!(%addr, "Basin scheduler listening");
    let probes = crate::liveness::watch(server.clone());
    Ok(SchedulerHandle {
        addr,
        server,
        task,
        probes,
        refusals,
    })
}

/// Serves the scheduler's gRPC API and its REST API (`/api/...`) on `addr`, as Ballista's
/// `start_grpc_service` does, but with `TCP_NODELAY` on every connection: Ballista serves
/// through `axum::serve`, which leaves Nagle's algorithm on, so each small answer (a task
/// status acknowledgement, a job status pushed to the front end) could wait ~40 ms for the
/// peer's delayed ACK — once per stage and once per query.
async fn serve_scheduler(
    addr: SocketAddr,
    scheduler: SchedulerServer<LogicalPlanNode, PhysicalPlanNode>,
    guard: Guard,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    use ballista_core::serde::protobuf::scheduler_grpc_server::SchedulerGrpcServer;
    let config = scheduler.state.config.clone();
    let grpc = SchedulerGrpcServer::new(scheduler.clone())
        .max_encoding_message_size(config.grpc_server_max_encoding_message_size as usize)
        .max_decoding_message_size(config.grpc_server_max_decoding_message_size as usize);
    let mut routes = tonic::service::RoutesBuilder::default();
    routes.add_service(grpc);
    let mut app = routes.routes().into_axum_router();
    if guard.rest_api {
        app = app.merge(ballista_scheduler::api::get_routes(Arc::new(scheduler)));
    }
    let key = guard.key;
    let app = app.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let refused = refuse_scheduler_call(key.as_ref(), &request);
            async move {
                match refused {
                    None => next.run(request).await,
                    Some(refused) => refused,
                }
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind(addr).await?.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY on a scheduler connection");
        }
    });
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

/// What guards the scheduler's port.
struct Guard {
    /// Calls without the cluster's proof are refused (basin_core::cluster).
    key: Option<ClusterKey>,
    /// Ballista's REST API is served (`[cluster] rest_api`).
    rest_api: bool,
}

/// The answer to a call to the scheduler's port from outside the cluster (`None` for a
/// call from inside): gRPC calls get an UNAUTHENTICATED status, REST calls 401. A REST
/// client sends `Authorization: Bearer <ClusterKey::rest_token>`.
fn refuse_scheduler_call(
    key: Option<&ClusterKey>,
    request: &axum::extract::Request,
) -> Option<axum::response::Response> {
    let key = key?;
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
    let is_grpc = header("content-type").is_some_and(|t| t.starts_with("application/grpc"));
    // gRPC calls carry the cluster's call proof; the REST API takes its own token only.
    let checked = if is_grpc {
        key.check_user_agent(header("user-agent"))
    } else {
        match header("authorization").and_then(|v| v.strip_prefix("Bearer ")) {
            Some(token) => key.check_rest_token(token),
            None => Err(basin_core::cluster::Refused::Missing),
        }
    };
    let why = checked.err()?;
    tracing::warn!(path = %request.uri().path(), %why, "refused a call to the scheduler");
    if is_grpc {
        let (parts, body) = basin_connectors::cluster::refused(why)
            .into_http::<tonic::body::Body>()
            .into_parts();
        return Some(axum::response::Response::from_parts(
            parts,
            axum::body::Body::new(body),
        ));
    }
    let mut response = axum::response::Response::new(axum::body::Body::from(why.to_string()));
    *response.status_mut() = axum::http::StatusCode::UNAUTHORIZED;
    Some(response)
}
