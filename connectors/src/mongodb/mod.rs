//! MongoDB queried in place (and what speaks its protocol: DocumentDB, Cosmos DB for MongoDB
//! vCore): databases are schemas, collections are tables.
//!
//! ```text
//!   basin.toml [catalogs.m] ─► MongoSource (client, limits; registry by name)
//!   MongoCatalogProvider ─► databases, collections, columns (sampled or declared; TTL cache)
//!   MongoPushdown (optimizer rule) ─► filters, projections, groups, top-N → one pipeline
//!   MongoScanExec ─► the pipeline, split by `_id` ranges, run on executors, read as Arrow
//! ```
//!
//! A second kind of pushdown target beside SQL: the rule translates a plan subtree into an
//! aggregation pipeline (`$match`, `$group`, `$sort`, `$limit`, `$project`) only where the
//! server answers exactly as Basin would, and leaves the rest to Basin.

pub mod catalog;
pub mod decode;
pub mod exec;
pub mod pushdown;
pub mod schema;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use basin_core::{BasinConfig, CatalogConfig, MongoSourceConfig};
use datafusion::error::{DataFusionError, Result};
use mongodb::options::{ClientOptions, Credential, Tls, TlsOptions};
use tokio::sync::{OnceCell, Semaphore};

use crate::remote::{SourceError, SourceErrorKind};

pub use catalog::{MongoCatalogProvider, MongoTable};
pub use exec::{MongoQuery, MongoQueryTable, MongoScanExec, MongoScanSpec};
pub use pushdown::MongoPushdown;
use schema::MongoColumn;

pub const DEFAULT_SAMPLE_SIZE: usize = 1000;

/// A configured MongoDB source: its client (connected on first use) and limits.
pub struct MongoSource {
    pub name: String,
    pub config: MongoSourceConfig,
    client: OnceCell<mongodb::Client>,
    /// Declared collections (`database.collection` → columns), parsed from the config.
    declared: HashMap<String, Vec<MongoColumn>>,
    /// Limits the pipelines this process runs at once.
    pub permits: Arc<Semaphore>,
}

impl fmt::Debug for MongoSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MongoSource")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl MongoSource {
    fn new(name: &str, config: &MongoSourceConfig) -> Result<Self> {
        let mut declared = HashMap::new();
        for (key, collection) in &config.collections {
            if !key.contains('.') {
                return Err(DataFusionError::Configuration(format!(
                    "catalog `{name}`: collections.\"{key}\" must name \"database.collection\""
                )));
            }
            let columns = schema::declared(&collection.columns).map_err(|e| {
                DataFusionError::Configuration(format!(
                    "catalog `{name}`: collections.\"{key}\": {e}"
                ))
            })?;
            declared.insert(key.clone(), columns);
        }
        Ok(Self {
            name: name.to_string(),
            config: config.clone(),
            client: OnceCell::new(),
            declared,
            permits: Arc::new(Semaphore::new(
                config
                    .max_concurrent_queries
                    .unwrap_or(crate::remote::source::DEFAULT_MAX_CONCURRENT_QUERIES)
                    .max(1),
            )),
        })
    }

    /// The declared columns of `database.collection`, if any.
    pub fn declared(&self, database: &str, collection: &str) -> Option<&Vec<MongoColumn>> {
        self.declared.get(&format!("{database}.{collection}"))
    }

    pub fn sample_size(&self) -> usize {
        self.config
            .sample_size
            .unwrap_or(DEFAULT_SAMPLE_SIZE)
            .max(1)
    }

    pub fn metadata_ttl(&self) -> Duration {
        Duration::from_secs(self.config.metadata_ttl_secs.unwrap_or(60))
    }

    pub fn split_size_bytes(&self) -> u64 {
        self.config
            .split_size_bytes
            .unwrap_or(crate::remote::source::DEFAULT_SPLIT_SIZE_BYTES)
            .max(1 << 20)
    }

    pub fn max_time(&self) -> Option<Duration> {
        self.config.statement_timeout_secs.map(Duration::from_secs)
    }

    /// The client, connected (lazily: the first call parses the URL and resolves SRV
    /// records; servers are contacted by the first operation).
    pub async fn client(&self) -> Result<mongodb::Client> {
        self.client
            .get_or_try_init(|| async {
                let url = self.config.url.as_ref().ok_or_else(|| {
                    DataFusionError::Configuration(format!(
                        "catalog `{}`: give `url`, a MongoDB connection string",
                        self.name
                    ))
                })?;
                let mut options = ClientOptions::parse(url.expose()).await.map_err(|e| {
                    DataFusionError::Configuration(format!(
                        "catalog `{}`: `url` is not a MongoDB connection string \
                         (mongodb://user@host:27017/?tls=true): {}",
                        self.name,
                        self.redact(&e.to_string())
                    ))
                })?;
                if self.config.user.is_some() || self.config.password.is_some() {
                    let mut credential = options
                        .credential
                        .take()
                        .unwrap_or_else(Credential::default);
                    if let Some(user) = &self.config.user {
                        credential.username = Some(user.clone());
                    }
                    if let Some(password) = &self.config.password {
                        credential.password = Some(password.expose().to_string());
                    }
                    options.credential = Some(credential);
                }
                if let Some(ca) = &self.config.tls_ca_file {
                    let mut tls = match options.tls.take() {
                        Some(Tls::Enabled(t)) => t,
                        _ => TlsOptions::default(),
                    };
                    tls.ca_file_path = Some(ca.into());
                    options.tls = Some(Tls::Enabled(tls));
                }
                options.max_pool_size = Some(
                    self.config
                        .pool_size
                        .unwrap_or(crate::remote::source::DEFAULT_POOL_SIZE)
                        .max(1),
                );
                options.app_name = Some(crate::remote::source::application_name());
                options.server_selection_timeout = Some(Duration::from_secs(15));
                options.connect_timeout = Some(Duration::from_secs(10));
                mongodb::Client::with_options(options).map_err(|e| self.error("cannot connect", e))
            })
            .await
            .cloned()
    }

    fn redact(&self, text: &str) -> String {
        let mut text = text.to_string();
        for secret in [&self.config.password, &self.config.url]
            .into_iter()
            .flatten()
        {
            text = secret.redact_in(&text);
        }
        text
    }

    /// A driver error as one that names the source, says what failed and never shows a
    /// secret, with its kind (unreachable, timed out, refused).
    pub fn error(&self, what: &str, e: mongodb::error::Error) -> DataFusionError {
        use mongodb::error::ErrorKind;
        let kind = match e.kind.as_ref() {
            ErrorKind::ServerSelection { .. }
            | ErrorKind::Io(_)
            | ErrorKind::DnsResolve { .. }
            | ErrorKind::ConnectionPoolCleared { .. }
            | ErrorKind::Authentication { .. } => SourceErrorKind::Unavailable,
            // MaxTimeMSExpired: the `statement_timeout_secs` limit.
            ErrorKind::Command(c) if c.code == 50 => SourceErrorKind::Timeout,
            _ => SourceErrorKind::Failed,
        };
        let detail = match e.kind.as_ref() {
            ErrorKind::Authentication { .. } => format!(
                "login refused ({}); check the user, password and authSource",
                e.kind
            ),
            ErrorKind::ServerSelection { .. } => format!(
                "cannot connect ({}): is the server up and reachable, and do TLS settings match?",
                e.kind
            ),
            other => other.to_string(),
        };
        let mut message = format!("mongodb source `{}`: {what}: {detail}", self.name);
        if kind == SourceErrorKind::Timeout
            && let Some(secs) = self.config.statement_timeout_secs
        {
            message.push_str(&format!(
                " (the source's limit: statement_timeout_secs = {secs} in [catalogs.{}])",
                self.name
            ));
        }
        DataFusionError::External(Box::new(SourceError {
            kind,
            message: self.redact(&message),
        }))
    }

    /// A failure of Basin's own reading (a document that does not fit its columns).
    pub fn failed(&self, message: String) -> DataFusionError {
        DataFusionError::External(Box::new(SourceError {
            kind: SourceErrorKind::Failed,
            message: self.redact(&format!("mongodb source `{}`: {message}", self.name)),
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

type Registry = Mutex<HashMap<String, Arc<MongoSource>>>;

fn registry() -> &'static Registry {
    static SOURCES: OnceLock<Registry> = OnceLock::new();
    SOURCES.get_or_init(Default::default)
}

/// Creates (or keeps) the sources of every `mongodb` catalog in `config`.
pub fn register_sources(config: &BasinConfig) -> Result<()> {
    for (name, catalog) in &config.catalogs {
        let CatalogConfig::Mongodb(options) = catalog else {
            continue;
        };
        let mut sources = registry()
            .lock()
            .map_err(|_| DataFusionError::Internal("source registry poisoned".into()))?;
        if sources
            .get(name)
            .is_some_and(|s| &s.config == options.as_ref())
        {
            continue;
        }
        sources.insert(name.clone(), Arc::new(MongoSource::new(name, options)?));
    }
    Ok(())
}

/// The MongoDB source named `name` in this process's configuration.
pub fn source(name: &str) -> Result<Arc<MongoSource>> {
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

/// A field name that may appear in a pipeline as a path (`$name`) or a projection key: not
/// empty, no `.` (a path step), no leading `$` (an operator), no NUL.
pub fn safe_field(name: &str) -> bool {
    !name.is_empty() && !name.contains(['.', '\0']) && !name.starts_with('$')
}
