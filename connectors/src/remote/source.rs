//! A configured database source: its dialect, connection pool, limits and the process-wide
//! registry that executors use to find it by catalog name (so connection secrets never
//! travel inside plans).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use basin_core::{BasinConfig, CatalogConfig, SqlSourceConfig, TlsMode};
use datafusion::error::{DataFusionError, Result};
use serde::{Deserialize, Serialize};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use tokio::sync::Semaphore;

/// The SQL dialect (and wire protocol) of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dialect {
    Postgres,
    MySql,
}

impl Dialect {
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
        }
    }
}

/// What a connector may push into its source. Anything not allowed here runs in Basin.
#[derive(Debug, Clone, Copy)]
pub struct Capabilities {
    pub filters: bool,
    pub aggregates: bool,
    pub joins: bool,
    pub limit: bool,
    pub top_n: bool,
    /// `CAST` expressions (MySQL's CAST targets differ from DataFusion's type names).
    pub casts: bool,
    /// `/` with DataFusion's semantics (MySQL's `/` of integers gives a decimal).
    pub division: bool,
    /// `NULLS FIRST/LAST` in ORDER BY.
    pub nulls_ordering: bool,
    /// PostgreSQL `ctid` page-range splits (or integer key ranges for MySQL).
    pub splits: bool,
}

impl Capabilities {
    pub fn of(dialect: Dialect) -> Self {
        match dialect {
            Dialect::Postgres => Self {
                filters: true,
                aggregates: true,
                joins: true,
                limit: true,
                top_n: true,
                casts: true,
                division: true,
                nulls_ordering: true,
                splits: true,
            },
            Dialect::MySql => Self {
                filters: true,
                aggregates: true,
                joins: true,
                limit: true,
                top_n: true,
                casts: false,
                division: false,
                nulls_ordering: false,
                splits: true,
            },
        }
    }
}

/// Connection pool of one source.
#[derive(Clone)]
pub enum Pool {
    Postgres(PgPool),
    MySql(MySqlPool),
}

/// A configured PostgreSQL or MySQL/MariaDB source.
pub struct RemoteSource {
    pub name: String,
    pub dialect: Dialect,
    pub config: SqlSourceConfig,
    pool: Pool,
    /// `host:port` (or the socket) the pool connects to, for errors.
    address: String,
    /// PostgreSQL: where splits open their own COPY sessions ([`super::pgwire`]).
    copy_target: Option<super::pgwire::Target>,
    /// Idle COPY sessions of this process, newest last, for the next splits.
    copy_sessions: Mutex<Vec<(super::pgwire::CopyConn, std::time::Instant)>>,
    /// Set once a COPY session needed what [`super::pgwire`] does not speak (TLS, say):
    /// splits then read through the pool.
    copy_through_pool: AtomicBool,
    /// Limits the remote queries this process runs at once.
    pub permits: Arc<Semaphore>,
}

impl fmt::Debug for RemoteSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteSource")
            .field("name", &self.name)
            .field("dialect", &self.dialect)
            .finish_non_exhaustive()
    }
}

pub const DEFAULT_POOL_SIZE: u32 = 8;
/// How long a split's COPY session may wait idle for the next split.
const COPY_SESSION_IDLE: Duration = Duration::from_secs(60);
/// How long a query waits for a connection of the pool.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_CONCURRENT_QUERIES: usize = 4;
pub const DEFAULT_SPLIT_SIZE_BYTES: u64 = 64 << 20;

impl RemoteSource {
    /// Creates the source and its (lazily connecting) pool. Must run inside [`runtime`].
    fn new(name: &str, dialect: Dialect, config: &SqlSourceConfig) -> Result<Self> {
        let pool_size = config.pool_size.unwrap_or(DEFAULT_POOL_SIZE).max(1);
        let mut copy_target = None;
        let address;
        let pool = match dialect {
            Dialect::Postgres => {
                let options = pg_options(name, config)?;
                address =
                    display_address(options.get_socket(), options.get_host(), options.get_port());
                copy_target = Some(super::pgwire::Target::new(
                    &options,
                    configured_password(config),
                ));
                Pool::Postgres(
                    PgPoolOptions::new()
                        .max_connections(pool_size)
                        .acquire_timeout(ACQUIRE_TIMEOUT)
                        .idle_timeout(Duration::from_secs(300))
                        .connect_lazy_with(options),
                )
            }
            Dialect::MySql => {
                let options = mysql_options(name, config)?;
                address =
                    display_address(options.get_socket(), options.get_host(), options.get_port());
                let timeout = config.statement_timeout_secs;
                Pool::MySql(
                    MySqlPoolOptions::new()
                        .max_connections(pool_size)
                        .acquire_timeout(ACQUIRE_TIMEOUT)
                        .idle_timeout(Duration::from_secs(300))
                        .after_connect(move |conn, _| {
                            Box::pin(async move {
                                if let Some(secs) = timeout {
                                    mysql_statement_timeout(conn, secs).await?;
                                }
                                Ok(())
                            })
                        })
                        .connect_lazy_with(options),
                )
            }
        };
        Ok(Self {
            name: name.to_string(),
            dialect,
            config: config.clone(),
            pool,
            address,
            copy_target,
            copy_sessions: Mutex::new(Vec::new()),
            copy_through_pool: AtomicBool::new(false),
            permits: Arc::new(Semaphore::new(max_concurrent_queries(config))),
        })
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Where a split opens its own COPY session, unless they read through the pool.
    pub fn copy_target(&self) -> Option<&super::pgwire::Target> {
        if self.copy_through_pool.load(Ordering::Relaxed) {
            return None;
        }
        self.copy_target.as_ref()
    }

    /// An idle COPY session of an earlier split, if one is fresh enough.
    pub fn take_copy_session(&self) -> Option<super::pgwire::CopyConn> {
        let mut idle = self.copy_sessions.lock().ok()?;
        idle.retain(|(_, since)| since.elapsed() < COPY_SESSION_IDLE);
        idle.pop().map(|(conn, _)| conn)
    }

    /// Keeps a session whose COPY ended cleanly for the next split; at most as many as
    /// remote queries may run at once.
    pub fn keep_copy_session(&self, conn: super::pgwire::CopyConn) {
        if !conn.reusable() {
            return;
        }
        if let Ok(mut idle) = self.copy_sessions.lock()
            && idle.len() < max_concurrent_queries(&self.config)
        {
            idle.push((conn, std::time::Instant::now()));
        }
    }

    /// Makes later splits read through the pool: a COPY session needed `why`.
    pub fn copy_through_pool(&self, why: &str) {
        if !self.copy_through_pool.swap(true, Ordering::Relaxed) {
            tracing::info!(
                source = %self.name,
                "splits read through sqlx: their own COPY sessions do not support {why}"
            );
        }
    }

    pub fn capabilities(&self) -> Capabilities {
        Capabilities::of(self.dialect)
    }

    pub fn metadata_ttl(&self) -> Duration {
        Duration::from_secs(self.config.metadata_ttl_secs.unwrap_or(60))
    }

    pub fn split_size_bytes(&self) -> u64 {
        self.config
            .split_size_bytes
            .unwrap_or(DEFAULT_SPLIT_SIZE_BYTES)
            .max(1 << 20)
    }

    /// Turns a driver error into one that names the source and never shows a secret.
    pub fn error(&self, what: &str, e: impl fmt::Display) -> DataFusionError {
        let mut text = format!(
            "{} source `{}`: {what}: {e}",
            self.dialect.name(),
            self.name
        );
        if let Some(secs) = self.config.statement_timeout_secs
            && is_statement_timeout(&text)
        {
            text.push_str(&format!(
                " (the source's limit: statement_timeout_secs = {secs} in [catalogs.{}])",
                self.name
            ));
        }
        if text.contains("pool timed out while waiting for an open connection") {
            // sqlx retries a refused connection until its deadline, then says only this.
            text.push_str(&format!(
                " (no connection to {} within {} s: is the server up and reachable?)",
                self.address,
                ACQUIRE_TIMEOUT.as_secs()
            ));
        }
        for secret in [&self.config.password, &self.config.url]
            .into_iter()
            .flatten()
        {
            text = secret.redact_in(&text);
        }
        DataFusionError::External(text.into())
    }

    /// Runs `fut` on the connector runtime and waits for it from async code.
    pub async fn call<T, Fut>(&self, fut: Fut) -> Result<T>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        match crate::io_runtime().spawn(fut).await {
            Ok(r) => r,
            Err(e) => Err(DataFusionError::Execution(format!(
                "source `{}`: task failed: {e}",
                self.name
            ))),
        }
    }

    /// Runs `fut` on the connector runtime and blocks until it is done (for DataFusion's
    /// synchronous catalog calls).
    pub fn call_blocking<T, Fut>(&self, fut: Fut) -> Result<T>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        crate::io_runtime().spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().map_err(|_| {
            DataFusionError::Execution(format!("source `{}`: connector stopped", self.name))
        })?
    }
}

fn pg_options(name: &str, c: &SqlSourceConfig) -> Result<PgConnectOptions> {
    let mut o = match &c.url {
        Some(url) => PgConnectOptions::from_str(url.expose()).map_err(|e| {
            DataFusionError::Configuration(format!(
                "catalog `{name}`: `url` is not a PostgreSQL URL: {}",
                url.redact_in(&e.to_string())
            ))
        })?,
        None => PgConnectOptions::new_without_pgpass(),
    };
    if let Some(h) = &c.host {
        o = o.host(h);
    }
    if let Some(p) = c.port {
        o = o.port(p);
    }
    if let Some(u) = &c.user {
        o = o.username(u);
    }
    if let Some(p) = &c.password {
        o = o.password(p.expose());
    }
    if let Some(d) = &c.database {
        o = o.database(d);
    }
    let ssl = match c.tls {
        TlsMode::Disable => PgSslMode::Disable,
        TlsMode::Prefer => PgSslMode::Prefer,
        TlsMode::Require => PgSslMode::Require,
        TlsMode::VerifyCa => PgSslMode::VerifyCa,
        TlsMode::VerifyFull => PgSslMode::VerifyFull,
    };
    let o = o
        .ssl_mode(ssl)
        .application_name(&application_name())
        .statement_cache_capacity(0)
        // Literals are rendered for these settings (see `sql::render`).
        .options([
            ("standard_conforming_strings", "on"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
            ("IntervalStyle", "postgres"),
            ("extra_float_digits", "3"),
        ]);
    Ok(match c.statement_timeout_secs {
        Some(secs) => o.options([("statement_timeout", format!("{secs}s"))]),
        None => o,
    })
}

/// The password of a source's configuration: `password`, else the URL's (sqlx keeps what
/// it parsed to itself).
fn configured_password(c: &SqlSourceConfig) -> Option<String> {
    if let Some(p) = &c.password {
        return Some(p.expose().to_string());
    }
    let url = url::Url::parse(c.url.as_ref()?.expose()).ok()?;
    let p = url.password()?;
    let decoded = percent_encoding::percent_decode_str(p).decode_utf8();
    Some(decoded.map_or_else(|_| p.to_string(), |p| p.into_owned()))
}

/// Remote queries one Basin process runs at once on a source.
fn max_concurrent_queries(c: &SqlSourceConfig) -> usize {
    c.max_concurrent_queries
        .unwrap_or(DEFAULT_MAX_CONCURRENT_QUERIES)
        .max(1)
}

/// `host:port`, or the socket directory, of a connection's options (for errors).
fn display_address(socket: Option<&std::path::PathBuf>, host: &str, port: u16) -> String {
    match socket {
        Some(socket) => socket.display().to_string(),
        None => format!("{host}:{port}"),
    }
}

/// `basin executor`, `basin scheduler`...: which Basin process a source session belongs to
/// (PostgreSQL shows it in pg_stat_activity and its logs).
fn application_name() -> String {
    match std::env::args().nth(1).as_deref() {
        Some(role @ ("scheduler" | "executor" | "standalone" | "sql")) => format!("basin {role}"),
        _ => "basin".to_string(),
    }
}

fn mysql_options(name: &str, c: &SqlSourceConfig) -> Result<MySqlConnectOptions> {
    let mut o = match &c.url {
        Some(url) => MySqlConnectOptions::from_str(url.expose()).map_err(|e| {
            DataFusionError::Configuration(format!(
                "catalog `{name}`: `url` is not a MySQL URL: {}",
                url.redact_in(&e.to_string())
            ))
        })?,
        None => MySqlConnectOptions::new(),
    };
    if let Some(h) = &c.host {
        o = o.host(h);
    }
    if let Some(p) = c.port {
        o = o.port(p);
    }
    if let Some(u) = &c.user {
        o = o.username(u);
    }
    if let Some(p) = &c.password {
        o = o.password(p.expose());
    }
    if let Some(d) = &c.database {
        o = o.database(d);
    }
    let ssl = match c.tls {
        TlsMode::Disable => MySqlSslMode::Disabled,
        TlsMode::Prefer => MySqlSslMode::Preferred,
        TlsMode::Require => MySqlSslMode::Required,
        TlsMode::VerifyCa => MySqlSslMode::VerifyCa,
        TlsMode::VerifyFull => MySqlSslMode::VerifyIdentity,
    };
    Ok(o.ssl_mode(ssl)
        .charset("utf8mb4")
        .timezone(Some("+00:00".to_string()))
        .statement_cache_capacity(0))
}

/// Whether a source's error says its statement time limit stopped the query.
fn is_statement_timeout(text: &str) -> bool {
    [
        "canceling statement due to statement timeout", // PostgreSQL
        "max_statement_time exceeded",                  // MariaDB
        "maximum statement execution time exceeded",    // MySQL
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// Sets a new MySQL/MariaDB connection's statement time limit: MariaDB's
/// `max_statement_time` (seconds, every statement), else MySQL's `max_execution_time`
/// (milliseconds, SELECTs: all Basin sends).
async fn mysql_statement_timeout(
    conn: &mut sqlx::MySqlConnection,
    secs: u64,
) -> std::result::Result<(), sqlx::Error> {
    use sqlx::Executor;
    let mariadb = conn
        .execute(format!("SET SESSION max_statement_time = {secs}").as_str())
        .await;
    if mariadb.is_err() {
        conn.execute(format!("SET SESSION max_execution_time = {}", secs * 1000).as_str())
            .await?;
    }
    Ok(())
}

type Registry = Mutex<HashMap<String, Arc<RemoteSource>>>;

fn registry() -> &'static Registry {
    static SOURCES: OnceLock<Registry> = OnceLock::new();
    SOURCES.get_or_init(Default::default)
}

/// Creates (or keeps) the sources of every `postgres`/`mysql` catalog in `config`.
pub fn register_sources(config: &BasinConfig) -> Result<()> {
    for (name, catalog) in &config.catalogs {
        let (dialect, options) = match catalog {
            CatalogConfig::Postgres(c) => (Dialect::Postgres, c),
            CatalogConfig::Mysql(c) => (Dialect::MySql, c),
            _ => continue,
        };
        let mut sources = registry()
            .lock()
            .map_err(|_| DataFusionError::Internal("source registry poisoned".into()))?;
        if let Some(s) = sources.get(name)
            && s.dialect == dialect
            && &s.config == options.as_ref()
        {
            continue;
        }
        let _guard = crate::io_runtime().enter();
        let source = Arc::new(RemoteSource::new(name, dialect, options)?);
        sources.insert(name.clone(), source);
    }
    Ok(())
}

/// The source named `name` in this process's configuration.
pub fn source(name: &str) -> Result<Arc<RemoteSource>> {
    registry()
        .lock()
        .map_err(|_| DataFusionError::Internal("source registry poisoned".into()))?
        .get(name)
        .cloned()
        .ok_or_else(|| {
            DataFusionError::Configuration(format!(
                "catalog `{name}` is not configured in this Basin process; the scheduler and \
                 every executor need the same [catalogs.{name}] in basin.toml"
            ))
        })
}
