//! The Arrow Flight SQL front end: BI tools, JDBC, ADBC and `basin sql` connect here.
//!
//! ```text
//!  client ──Flight SQL (gRPC)──► BasinFlightSqlService ─► Registry (sessions, statements)
//!                                       │ front-end SessionContext per session
//!                                       ▼
//!                         Ballista scheduler ─► executors ─► results streamed back
//! ```

mod auth;
mod jwt;
mod metadata;
mod params;
mod service;
mod state;
mod wrapper;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use basin_core::{BasinConfig, BasinError, Result};
use datafusion::prelude::SessionContext;
use tokio::task::JoinHandle;
use tonic::transport::{Identity, Server, ServerTlsConfig};

pub use auth::hash_password;
pub use service::{BasinFlightSqlService, to_status};

use crate::server::ClusterView;

/// Creates front-end sessions for Flight SQL clients.
pub struct SessionFactory {
    config: Arc<BasinConfig>,
    scheduler_url: String,
    cluster: ClusterView,
    /// Where the clients' SQL may read and write files ([security] allowed_locations).
    sandbox: Arc<basin_core::sandbox::Sandbox>,
    /// What each user may see and change ([security] rules_file).
    access: Option<Arc<crate::access::AccessControl>>,
    /// One line per statement ([security] audit_log).
    audit: Option<Arc<crate::audit::AuditLog>>,
}

impl SessionFactory {
    /// The audit log, when `[security] audit_log` is set.
    pub fn audit_log(&self) -> Option<Arc<crate::audit::AuditLog>> {
        self.audit.clone()
    }

    /// Total task slots of the registered executors (at least 1).
    pub async fn task_slots(&self) -> usize {
        self.cluster.task_slots().await.max(1)
    }

    /// True when sessions plan for the cluster's task slots (no `[server] target_partitions`).
    pub fn follows_task_slots(&self) -> bool {
        self.config.server.target_partitions == 0
    }

    /// Cancels the running Ballista jobs named `name`.
    pub async fn cancel_jobs_named(&self, name: &str) {
        self.cluster.cancel_jobs_named(name).await;
    }

    /// Removes the shuffle files of the jobs named `name` that ended at or after `since_ms`.
    pub async fn remove_data_of_jobs_named(&self, name: &str, since_ms: u64) {
        self.cluster.remove_data_of_jobs_named(name, since_ms).await;
    }

    /// The time limit of a query that `session` runs now.
    pub fn time_limit(&self, session: &SessionContext) -> Option<crate::limits::TimeLimit> {
        crate::limits::TimeLimit::of(
            session.state_ref().read().config(),
            self.config.server.query_timeout_seconds,
        )
    }

    /// A new front-end session of `subject`, its files confined to the sandbox and what it
    /// sees and may change to the access rules.
    pub fn connect(
        &self,
        task_slots: usize,
        subject: crate::access::Subject,
    ) -> datafusion::error::Result<SessionContext> {
        let ctx = crate::frontend::connect(
            &self.config,
            &self.scheduler_url,
            task_slots,
            Some(self.cluster.clone()),
        )?;
        basin_connectors::catalogs::sandbox_session(&ctx, self.sandbox.clone());
        let Some(control) = &self.access else {
            return Ok(ctx);
        };
        let access = Arc::new(crate::access::SessionAccess {
            control: control.clone(),
            subject,
        });
        let state = ctx.state();
        let guarded = access.guard(state.catalog_list().clone());
        let mut state = datafusion::execution::SessionStateBuilder::new_from_existing(state)
            .with_catalog_list(guarded)
            .build();
        state.config_mut().set_extension(access);
        Ok(SessionContext::new_with_state(state))
    }
}

/// A running Flight SQL endpoint.
pub struct FlightSqlHandle {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
    janitor: JoinHandle<()>,
}

impl Drop for FlightSqlHandle {
    fn drop(&mut self) {
        self.task.abort();
        self.janitor.abort();
    }
}

/// Serves Flight SQL on `[flight_sql]` for the scheduler at `scheduler_url`.
pub async fn serve(
    config: Arc<BasinConfig>,
    scheduler_url: String,
    cluster: ClusterView,
    port: u16,
) -> Result<FlightSqlHandle> {
    let options = config.flight_sql.clone();
    let host = config.server.bind_host.clone();
    let addr = basin_core::net::reserve_port(&host, port, "Flight SQL endpoint")?;
    let users = match &options.users_file {
        Some(path) => Some(Arc::new(auth::Users::load(path)?)),
        None => {
            let loopback = addr.ip().is_loopback();
            tracing::warn!(
                "Flight SQL: no [flight_sql] users_file configured: accepting anonymous \
                 clients{}",
                if loopback {
                    " (from loopback only)"
                } else {
                    " from loopback only; remote clients are refused"
                }
            );
            None
        }
    };
    if users.is_some() && !addr.ip().is_loopback() {
        tracing::warn!(
            "Flight SQL authenticates its clients, but the scheduler's and executors' own gRPC \
             and Flight ports do not: keep them on a private network"
        );
    }
    let registry = Arc::new(state::Registry::default());
    let idle = Duration::from_secs(options.session_idle_seconds.max(1));
    let sandbox =
        basin_core::sandbox::Sandbox::from_config(&config).map_err(BasinError::Invalid)?;
    let factory = Arc::new(SessionFactory {
        config: config.clone(),
        scheduler_url,
        cluster,
        sandbox: Arc::new(sandbox),
        access: match &config.security.rules_file {
            Some(path) => Some(Arc::new(crate::access::AccessControl::load(path)?)),
            None => None,
        },
        audit: match &config.security.audit_log {
            Some(path) => Some(Arc::new(crate::audit::AuditLog::open(path)?)),
            None => None,
        },
    });
    let tls = options.tls_cert.is_some() && options.tls_key.is_some();
    let jwt = match &options.jwt {
        Some(jwt) => Some(Arc::new(jwt::JwtValidator::new(jwt.clone()).await?)),
        None => None,
    };
    let service = BasinFlightSqlService::new(factory, registry.clone(), users, idle)
        .with_transport(tls, options.allow_plaintext_passwords)
        .with_jwt(jwt);
    let mut builder = Server::builder();
    if let (Some(cert), Some(key)) = (&options.tls_cert, &options.tls_key) {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| {
                BasinError::Invalid(format!("cannot read TLS file {}: {e}", p.display()))
            })
        };
        let identity = Identity::from_pem(read(cert)?, read(key)?);
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(identity))
            .map_err(|e| BasinError::Invalid(format!("bad TLS configuration: {e}")))?;
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| BasinError::Invalid(format!("cannot listen on {addr} for Flight SQL: {e}")))?;
    let router = builder.add_service(
        FlightServiceServer::new(wrapper::BasinFlightService(Arc::new(service)))
            .max_decoding_message_size(256 * 1024 * 1024)
            .max_encoding_message_size(256 * 1024 * 1024),
    );
    let task = tokio::spawn(async move {
        // Small answers (a FlightInfo, a schema, a one-row result) must not wait for the
        // client's delayed ACK: with Nagle's algorithm on, every query paid ~40 ms twice.
        let incoming = tonic::transport::server::TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(Duration::from_secs(60)));
        if let Err(e) = router.serve_with_incoming(incoming).await {
            tracing::error!(error = %e, "Flight SQL endpoint stopped");
        }
    });
    let janitor = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            registry.expire(idle);
        }
    });
    tracing::info!(%addr, tls = options.tls_cert.is_some(), "Flight SQL endpoint listening");
    Ok(FlightSqlHandle {
        addr,
        task,
        janitor,
    })
}
