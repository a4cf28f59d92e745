//! A configured database source: its dialect, connection pool, limits and the process-wide
//! registry that executors use to find it by catalog name (so connection secrets never
//! travel inside plans).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use basin_core::{BasinConfig, CatalogConfig, SqlSourceConfig};
use datafusion::error::{DataFusionError, Result};
use tokio::sync::Semaphore;

use super::backend::{Backend, SourceError, SourceErrorKind, SqlDialect};

/// The label of a failed connection attempt (`RemoteSource::error(CANNOT_CONNECT, e)`): an
/// `Unavailable` error.
pub const CANNOT_CONNECT: &str = "cannot connect";
pub use super::backend::{Capabilities, Dialect};

/// A configured database source: its dialect, its backend (pool and driver) and limits.
pub struct RemoteSource {
    pub name: String,
    pub dialect: Dialect,
    pub config: SqlSourceConfig,
    backend: Box<dyn Backend>,
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
/// How long a query waits for a connection of the pool.
pub(crate) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_CONCURRENT_QUERIES: usize = 4;
pub const DEFAULT_SPLIT_SIZE_BYTES: u64 = 64 << 20;

impl RemoteSource {
    /// Creates the source and its (lazily connecting) pool. Must run inside [`runtime`].
    fn new(name: &str, dialect: Dialect, config: &SqlSourceConfig) -> Result<Self> {
        let pool_size = config.pool_size.unwrap_or(DEFAULT_POOL_SIZE).max(1);
        let backend: Box<dyn Backend> = match dialect {
            Dialect::Postgres => Box::new(super::postgres::PostgresBackend::new(
                name,
                config,
                pool_size,
                max_concurrent_queries(config),
            )?),
            Dialect::MySql => Box::new(super::mysql::MySqlBackend::new(name, config, pool_size)?),
            Dialect::SqlServer => Box::new(super::sqlserver::SqlServerBackend::new(
                name, config, pool_size,
            )?),
            Dialect::Oracle => {
                Box::new(super::oracle::OracleBackend::new(name, config, pool_size)?)
            }
        };
        Ok(Self {
            name: name.to_string(),
            dialect,
            config: config.clone(),
            backend,
            permits: Arc::new(Semaphore::new(max_concurrent_queries(config))),
        })
    }

    /// The driver side of this source.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// How this source's SQL is written.
    pub fn sql(&self) -> &'static dyn SqlDialect {
        self.dialect.sql()
    }

    pub fn capabilities(&self) -> Capabilities {
        self.sql().capabilities()
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
                self.backend.address(),
                ACQUIRE_TIMEOUT.as_secs()
            ));
        }
        for secret in [&self.config.password, &self.config.url]
            .into_iter()
            .flatten()
        {
            text = secret.redact_in(&text);
        }
        let kind = if is_statement_timeout(&text) {
            SourceErrorKind::Timeout
        } else if what == CANNOT_CONNECT
            || what == "closed"
            // sqlx's only word for a source it could not reach within the pool's deadline.
            || text.contains("pool timed out while waiting for an open connection")
        {
            SourceErrorKind::Unavailable
        } else {
            SourceErrorKind::Failed
        };
        DataFusionError::External(Box::new(SourceError {
            kind,
            message: text,
        }))
    }

    /// Runs `fut` on the connector runtime and waits for it from async code.
    pub async fn call<T, Fut>(&self, fut: Fut) -> Result<T>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        crate::on_io(&self.name, fut).await
    }

    /// Runs `fut` on the connector runtime and blocks until it is done.
    pub fn call_blocking<T, Fut>(&self, fut: Fut) -> Result<T>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        crate::on_io_blocking(&self.name, fut)
    }
}

/// Remote queries one Basin process runs at once on a source.
pub(crate) fn max_concurrent_queries(c: &SqlSourceConfig) -> usize {
    c.max_concurrent_queries
        .unwrap_or(DEFAULT_MAX_CONCURRENT_QUERIES)
        .max(1)
}

/// `host:port`, or the socket directory, of a connection's options (for errors).
pub(crate) fn display_address(
    socket: Option<&std::path::PathBuf>,
    host: &str,
    port: u16,
) -> String {
    match socket {
        Some(socket) => socket.display().to_string(),
        None => format!("{host}:{port}"),
    }
}

/// `basin executor`, `basin scheduler`...: which Basin process a source session belongs to
/// (PostgreSQL shows it in pg_stat_activity and its logs).
pub(crate) fn application_name() -> String {
    match std::env::args().nth(1).as_deref() {
        Some(role @ ("scheduler" | "executor" | "standalone" | "sql")) => format!("basin {role}"),
        _ => "basin".to_string(),
    }
}

/// Whether a source's error says its statement time limit stopped the query.
fn is_statement_timeout(text: &str) -> bool {
    // SQL Server's "Query timeout expired" comes from tiberius' command timeout.
    [
        "canceling statement due to statement timeout", // PostgreSQL
        "max_statement_time exceeded",                  // MariaDB
        "maximum statement execution time exceeded",    // MySQL
        "Query timeout expired",                        // SQL Server (command timeout)
    ]
    .iter()
    .any(|m| text.contains(m))
}

type Registry = Mutex<HashMap<String, Arc<RemoteSource>>>;

fn registry() -> &'static Registry {
    static SOURCES: OnceLock<Registry> = OnceLock::new();
    SOURCES.get_or_init(Default::default)
}

/// Creates (or keeps) the sources of every `postgres`/`mysql`/`sqlserver` catalog in `config`.
pub fn register_sources(config: &BasinConfig) -> Result<()> {
    for (name, catalog) in &config.catalogs {
        let (dialect, options) = match catalog {
            CatalogConfig::Postgres(c) => (Dialect::Postgres, c),
            CatalogConfig::Mysql(c) => (Dialect::MySql, c),
            CatalogConfig::Sqlserver(c) => (Dialect::SqlServer, c),
            CatalogConfig::Oracle(c) => (Dialect::Oracle, c),
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

/// Where and as whom a source logs in: the parts of its `url` (percent-decoded), each
/// overridden by the separate field of the same name. For drivers that parse no URL
/// themselves (SQL Server, Oracle).
#[derive(Debug, Default)]
pub(crate) struct Login {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub database: Option<String>,
}

impl Login {
    /// `kind` names the URL in errors (`a SQL Server URL`), `example` shows its form; the
    /// first of `schemes` is the one errors ask for.
    pub(crate) fn of(
        name: &str,
        c: &SqlSourceConfig,
        kind: &str,
        example: &str,
        schemes: &[&str],
    ) -> Result<Self> {
        let mut login = Login::default();
        if let Some(url) = &c.url {
            let bad = |why: &str| {
                DataFusionError::Configuration(format!(
                    "catalog `{name}`: `url` is not {kind} ({example}): {why}"
                ))
            };
            let parsed =
                url::Url::parse(url.expose()).map_err(|e| bad(&url.redact_in(&e.to_string())))?;
            if !schemes.contains(&parsed.scheme()) {
                return Err(bad(&format!(
                    "the scheme must be {}://",
                    schemes.first().copied().unwrap_or_default()
                )));
            }
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8()
                    .map(|s| s.into_owned())
                    .map_err(|_| bad("a part is not UTF-8 once decoded"))
            };
            login.host = parsed.host_str().map(str::to_string);
            login.port = parsed.port();
            if !parsed.username().is_empty() {
                login.user = Some(decode(parsed.username())?);
            }
            if let Some(p) = parsed.password() {
                login.password = Some(decode(p)?);
            }
            let path = parsed.path().trim_start_matches('/');
            if !path.is_empty() {
                login.database = Some(decode(path)?);
            }
        }
        login.host = c.host.clone().or(login.host);
        login.port = c.port.or(login.port);
        login.user = c.user.clone().or(login.user);
        login.database = c.database.clone().or(login.database);
        if let Some(p) = &c.password {
            login.password = Some(p.expose().to_string());
        }
        Ok(login)
    }
}
