//! `basin.toml`: the one configuration file of a Basin process.
//!
//! ```toml
//! [server]
//! data_dir = "./basin-data"
//!
//! [storage.s3]
//! endpoint = "http://127.0.0.1:8333"
//! region = "us-east-1"
//! access_key_id = "${env:AWS_ACCESS_KEY_ID}"
//! secret_access_key = "${env:AWS_SECRET_ACCESS_KEY}"
//! path_style = true
//!
//! [catalogs.tpch]
//! connector = "tpch"
//! ```
//!
//! Every string value may contain `${env:VAR}`, replaced by the variable's value when the
//! file is loaded. Unknown keys, missing required keys and bad values are errors that name
//! the file, the line, the catalog and the key. docs/configuration.md documents each key.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

use crate::error::{BasinError, Result};
use crate::secret::Secret;

/// The whole configuration of a Basin process.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasinConfig {
    /// Process settings.
    #[serde(default)]
    pub server: ServerConfig,
    /// Object storage settings, shared by file tables and (later) Iceberg warehouses.
    #[serde(default)]
    pub storage: StorageConfig,
    /// The Arrow Flight SQL front end.
    #[serde(default)]
    pub flight_sql: FlightSqlConfig,
    /// What each executor may use.
    #[serde(default)]
    pub executor: ExecutorConfig,
    /// How the processes of a cluster know each other.
    #[serde(default)]
    pub cluster: ClusterConfig,
    /// What SQL users may reach.
    #[serde(default)]
    pub security: SecurityConfig,
    /// Catalogs by name.
    #[serde(default)]
    pub catalogs: BTreeMap<String, CatalogConfig>,
    /// The file this configuration came from, if any.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// `[server]`: where a Basin process keeps its files and how it is reached.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Directory for anything Basin keeps on disk (shuffle files, the embedded lake).
    #[serde(deserialize_with = "env_path")]
    pub data_dir: PathBuf,
    /// Address the scheduler and executors bind to.
    #[serde(deserialize_with = "env_string")]
    pub bind_host: String,
    /// The scheduler's gRPC port.
    pub scheduler_port: u16,
    /// Task slots per executor (0 = number of cores).
    pub executor_task_slots: usize,
    /// Default number of partitions a query is split into (0 = total task slots).
    pub target_partitions: usize,
    /// Queries of one stage (scans, filters, ungrouped aggregates: no exchange) stream
    /// from the executors instead of running as Ballista jobs with shuffle files.
    pub streamed_stages: bool,
    /// A query whose scans read at most this many bytes by the planner's estimate (Iceberg
    /// data files, generated `tpch` tables) runs whole on one executor, streamed back, instead
    /// of as a Ballista job spread over the cluster; 0 turns this off. Needs streamed stages.
    pub single_node_max_bytes: u64,
    /// A query too big for one executor (joins, GROUP BY, windows) runs over every executor
    /// in stages that stream rows to each other over Arrow Flight (hash-repartition
    /// exchanges, no shuffle files) instead of as a Ballista job. Needs streamed stages.
    pub streamed_exchanges: bool,
    /// The longest a Flight SQL client's query may run, in seconds, from the moment its result is asked for
    /// (or a statement is sent) to its last row; longer ones are cancelled with an error.
    /// 0 = no limit. A session may set a shorter one (`SET basin.query_timeout_seconds`).
    pub query_timeout_seconds: u64,
    /// Memory the front end's queries (Flight SQL sessions, `basin standalone -e`) may hold
    /// together in this process; default 10 % of the machine's memory.
    pub front_end_memory_limit: Option<ByteSize>,
    /// Memory each process may keep of Iceberg manifest lists and manifests read while
    /// planning (file statistics, column sizes, row-group offsets), so that the next plan of
    /// the same snapshot reads none again; least recently used first out. Default 64 MiB.
    pub metadata_cache_size: ByteSize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./basin-data"),
            bind_host: "127.0.0.1".to_string(),
            scheduler_port: 50050,
            executor_task_slots: 0,
            target_partitions: 0,
            streamed_stages: true,
            single_node_max_bytes: 1 << 30,
            streamed_exchanges: true,
            query_timeout_seconds: 0,
            front_end_memory_limit: None,
            metadata_cache_size: ByteSize(64 << 20),
        }
    }
}

impl ServerConfig {
    /// `front_end_memory_limit` in bytes, its default resolved.
    pub fn front_end_memory_bytes(&self) -> u64 {
        match self.front_end_memory_limit {
            Some(limit) => limit.0,
            None => crate::memory::default_front_end_memory(crate::memory::machine_memory()),
        }
    }
}

/// `[executor]`: what each executor may use.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecutorConfig {
    /// Memory the queries running on one executor may hold together: sorts, aggregates and
    /// joins above it spill to the work directory, or fail naming this setting. Bytes, or a
    /// string such as `"8GiB"`. Default: 60 % of the machine's memory (or its container's
    /// limit), divided among the executors of the process.
    pub memory_limit: Option<ByteSize>,
    /// The part of `memory_limit` one query (one task) may hold, more than 0 and at most 1:
    /// a query's hash join cannot take memory the other queries on the executor need.
    pub query_memory_fraction: f64,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            memory_limit: None,
            query_memory_fraction: 0.5,
        }
    }
}

impl ExecutorConfig {
    /// The memory limit of each of `executors` executors of one process, in bytes.
    pub fn memory_limit_bytes(&self, executors: usize) -> u64 {
        match self.memory_limit {
            Some(limit) => limit.0,
            None => {
                crate::memory::default_executor_memory(crate::memory::machine_memory(), executors)
            }
        }
    }
}

/// `[cluster]`: how the scheduler and the executors know each other (docs/security.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// The secret every process of the cluster shares (default: the environment variable
    /// `BASIN_CLUSTER_SECRET`): internal calls and plans are signed with it, and the
    /// internal ports refuse calls without a valid signature. Without it the internal ports
    /// are open, so they may only listen on loopback; a standalone process makes a random
    /// secret of its own.
    pub secret: Option<Secret>,
    /// Listen on a non-loopback address without a secret (anyone who reaches the ports
    /// can run plans on the executors). For networks where something else guards them.
    pub allow_unauthenticated: bool,
    /// Serve Ballista's REST API (`/api/...`: jobs, executors, cancel) on the scheduler's
    /// port, behind the cluster secret when one is set.
    pub rest_api: bool,
}

impl ClusterConfig {
    /// The key of the configured secret, if any: `[cluster] secret`, else the environment
    /// variable `BASIN_CLUSTER_SECRET` when it is set and not empty.
    pub fn key(&self) -> Option<crate::cluster::ClusterKey> {
        self.secret().as_ref().map(crate::cluster::ClusterKey::new)
    }

    /// `[cluster] secret`, else `BASIN_CLUSTER_SECRET` from the environment.
    pub fn secret(&self) -> Option<Secret> {
        self.secret.clone().or_else(|| {
            std::env::var(crate::cluster::SECRET_VARIABLE)
                .ok()
                .filter(|v| !v.is_empty())
                .map(Secret::new)
        })
    }

    /// Refuses to open internal ports on `bind_host` (not loopback) without a secret,
    /// unless `allow_unauthenticated`.
    pub fn check_exposure(&self, bind_host: &str, what: &str) -> Result<()> {
        if let Some(secret) = self.secret()
            && secret.expose().chars().count() < crate::cluster::MIN_SECRET_CHARS
        {
            return Err(BasinError::Invalid(format!(
                "[cluster] secret (or BASIN_CLUSTER_SECRET) has fewer than {} characters: \
                 anyone could guess it. Make one with `openssl rand -hex 32`",
                crate::cluster::MIN_SECRET_CHARS
            )));
        }
        if self.secret().is_some() || self.allow_unauthenticated || is_loopback(bind_host) {
            return Ok(());
        }
        Err(BasinError::Invalid(format!(
            "the {what} would listen on {bind_host} with no [cluster] secret: anyone who \
             reaches its ports could run plans with this cluster's files and credentials. Set \
             [cluster] secret = \"${{env:BASIN_CLUSTER_SECRET}}\" (the same value on the \
             scheduler and every executor), bind to 127.0.0.1, or set [cluster] \
             allow_unauthenticated = true if something else guards the network"
        )))
    }
}

/// `[security]`: what SQL users may reach (docs/security.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityConfig {
    /// The local directories and object-store locations (`s3://bucket/prefix/`, `s3://` for
    /// every bucket) that `read_*()`, `CREATE EXTERNAL TABLE`, `COPY … TO` and Iceberg
    /// `location` options of Flight SQL clients may use, besides the data directory and the
    /// Iceberg warehouses. Default: every bucket of `[storage.s3]` when it is configured.
    pub allowed_locations: Option<Vec<String>>,
    /// Authorization rules for Flight SQL users (JSON when the name ends in `.json`, else
    /// TOML), read again when the file changes; without it every user may do everything.
    #[serde(deserialize_with = "env_path_opt")]
    pub rules_file: Option<PathBuf>,
    /// A file the scheduler appends one JSON line to per statement of a Flight SQL client
    /// (time, user, client, statement, tables read and written, rows, outcome, duration).
    #[serde(deserialize_with = "env_path_opt")]
    pub audit_log: Option<PathBuf>,
}

/// Whether `host` names only this machine.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A size in bytes: an integer, or a string of a number and a unit — `B`, `KB`/`MB`/`GB`/
/// `TB` (powers of 1000) or `KiB`/`MiB`/`GiB`/`TiB` (powers of 1024), e.g. `"8GiB"`,
/// `"1.5 GB"`, `"512MiB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let bad = || {
            format!(
                "`{text}` is not a size: give bytes, or a number with a unit such as 512MiB, \
                 8GiB or 2GB"
            )
        };
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            "tib" => 1 << 40,
            _ => return Err(bad()),
        };
        if let Ok(whole) = number.parse::<u64>() {
            return whole.checked_mul(scale).map(ByteSize).ok_or_else(bad);
        }
        let value = number.parse::<f64>().map_err(|_| bad())?;
        let bytes = value * scale as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
            return Err(bad());
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a size: bytes, or a string such as \"8GiB\"")
        })? {
            Raw::Bytes(bytes) => Ok(ByteSize(bytes)),
            Raw::Text(text) => interpolate_env(&text)
                .map_err(serde::de::Error::custom)?
                .parse()
                .map_err(serde::de::Error::custom),
        }
    }
}

/// `[flight_sql]`: the Arrow Flight SQL endpoint of the scheduler (JDBC, ADBC, `basin sql`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlightSqlConfig {
    /// Port (0 = any free port).
    pub port: u16,
    /// File of `user:bcrypt-hash` lines; without it only loopback clients may connect,
    /// anonymously.
    #[serde(deserialize_with = "env_path_opt")]
    pub users_file: Option<PathBuf>,
    /// PEM certificate chain for TLS.
    #[serde(deserialize_with = "env_path_opt")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[serde(deserialize_with = "env_path_opt")]
    pub tls_key: Option<PathBuf>,
    /// Seconds an idle session is kept.
    pub session_idle_seconds: u64,
    /// Accept password logins over plain TCP from other machines (without TLS the password
    /// crosses the network in the clear; refused by default).
    pub allow_plaintext_passwords: bool,
    /// JWT bearer tokens from an identity provider (`[flight_sql.jwt]`).
    pub jwt: Option<JwtConfig>,
}

/// `[flight_sql.jwt]`: bearer tokens an identity provider signs (docs/security.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The provider's public keys (a JWKS document) in a file...
    #[serde(default, deserialize_with = "env_path_opt")]
    pub jwks_file: Option<PathBuf>,
    /// ... or at a URL (read at start, and again when a token names an unknown key).
    #[serde(default, deserialize_with = "env_string_opt")]
    pub jwks_url: Option<String>,
    /// The `iss` tokens must have.
    #[serde(default, deserialize_with = "env_string_opt")]
    pub issuer: Option<String>,
    /// An `aud` tokens must have.
    #[serde(default, deserialize_with = "env_string_opt")]
    pub audience: Option<String>,
    /// The claim that names the user (default `sub`).
    #[serde(default = "default_user_claim")]
    pub user_claim: String,
    /// A claim with the user's groups (a list or one string), for access rules.
    #[serde(default)]
    pub groups_claim: Option<String>,
}

fn default_user_claim() -> String {
    "sub".to_string()
}

impl Default for FlightSqlConfig {
    fn default() -> Self {
        Self {
            port: 50060,
            users_file: None,
            tls_cert: None,
            tls_key: None,
            session_idle_seconds: 3600,
            allow_plaintext_passwords: false,
            jwt: None,
        }
    }
}

/// `[storage]`: object stores.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// `[storage.s3]`: S3 and S3-compatible stores (MinIO, SeaweedFS, AWS).
    pub s3: Option<S3Config>,
}

/// `[storage.s3]`: settings for every `s3://bucket/...` location.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// Endpoint URL of an S3-compatible store, e.g. `http://127.0.0.1:8333`.
    #[serde(default, deserialize_with = "env_string_opt")]
    pub endpoint: Option<String>,
    /// Region (default `us-east-1`).
    #[serde(default, deserialize_with = "env_string_opt")]
    pub region: Option<String>,
    /// Access key id.
    #[serde(default, deserialize_with = "env_string_opt")]
    pub access_key_id: Option<String>,
    /// Secret access key.
    #[serde(default)]
    pub secret_access_key: Option<Secret>,
    /// Session token for temporary credentials.
    #[serde(default)]
    pub session_token: Option<Secret>,
    /// Path-style requests (`endpoint/bucket/key`), needed by most S3-compatible stores.
    #[serde(default)]
    pub path_style: bool,
    /// Allow plain HTTP (default: true when the endpoint starts with `http://`).
    #[serde(default)]
    pub allow_http: Option<bool>,
}

/// A catalog: its connector kind and that connector's options.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "connector", rename_all = "lowercase")]
pub enum CatalogConfig {
    /// The built-in TPC-H data generator.
    Tpch(TpchCatalogConfig),
    /// An Apache Iceberg catalog (REST or SQL).
    Iceberg(Box<IcebergCatalogConfig>),
    /// A PostgreSQL database, queried in place.
    Postgres(Box<SqlSourceConfig>),
    /// A MySQL or MariaDB server, queried in place.
    #[serde(alias = "mariadb")]
    Mysql(Box<SqlSourceConfig>),
    /// A Microsoft SQL Server (or Azure SQL, or Babelfish) database, queried in place.
    #[serde(alias = "mssql")]
    Sqlserver(Box<SqlSourceConfig>),
    /// An Oracle database (needs Oracle Instant Client at run time), queried in place.
    Oracle(Box<SqlSourceConfig>),
    /// A MongoDB deployment (or one that speaks its protocol: DocumentDB, Cosmos DB),
    /// queried in place: databases are schemas, collections are tables.
    #[serde(alias = "mongo")]
    Mongodb(Box<MongoSourceConfig>),
}

impl CatalogConfig {
    /// The connector kind, as written in the file.
    pub fn connector(&self) -> &'static str {
        match self {
            CatalogConfig::Tpch(_) => "tpch",
            CatalogConfig::Iceberg(_) => "iceberg",
            CatalogConfig::Postgres(_) => "postgres",
            CatalogConfig::Mysql(_) => "mysql",
            CatalogConfig::Sqlserver(_) => "sqlserver",
            CatalogConfig::Oracle(_) => "oracle",
            CatalogConfig::Mongodb(_) => "mongodb",
        }
    }
}

/// How a connection to a database source is encrypted (libpq's `sslmode` names).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it (default).
    #[default]
    Prefer,
    /// TLS or fail; the certificate is not checked.
    Require,
    /// TLS with a certificate signed by a trusted CA.
    VerifyCa,
    /// TLS with a trusted certificate for the host name.
    VerifyFull,
}

/// Options of a `connector = "postgres"`, `"mysql"` or `"sqlserver"` catalog: a database
/// queried in place. Give `url`, or the separate fields (which override the URL's parts).
///
/// ```toml
/// [catalogs.pg]
/// connector = "postgres"
/// url = "postgres://basin@db.internal:5432/shop"
/// password = "${env:PG_PASSWORD}"
/// tls = "require"
/// max_concurrent_queries = 4   # protects the production database
/// ```
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SqlSourceConfig {
    /// `postgres://user:password@host:port/database`, `mysql://...` or
    /// `sqlserver://user:password@host:port/database`.
    #[serde(default)]
    pub url: Option<Secret>,
    #[serde(default, deserialize_with = "env_string_opt")]
    pub host: Option<String>,
    pub port: Option<u16>,
    #[serde(default, deserialize_with = "env_string_opt")]
    pub user: Option<String>,
    #[serde(default)]
    pub password: Option<Secret>,
    /// The database (PostgreSQL, SQL Server) or the default schema (MySQL).
    #[serde(default, deserialize_with = "env_string_opt")]
    pub database: Option<String>,
    /// `disable`, `prefer` (default), `require`, `verify-ca` or `verify-full`.
    #[serde(default)]
    pub tls: TlsMode,
    /// PEM file of the CA that signed the server's certificate, for `verify-ca` and
    /// `verify-full` (default: the system's trusted roots).
    #[serde(default, deserialize_with = "env_string_opt")]
    pub tls_ca_file: Option<String>,
    /// SQL Server: a named instance (`host\\instance`), found through the SQL Browser
    /// service on UDP 1434 when no `port` is given.
    #[serde(default, deserialize_with = "env_string_opt")]
    pub instance: Option<String>,
    /// Connections kept open per Basin process (default 8).
    pub pool_size: Option<u32>,
    /// Remote queries run at once per Basin process (default 4); the rest wait.
    pub max_concurrent_queries: Option<usize>,
    /// How long discovered schemas, tables and columns are cached (default 60 s).
    pub metadata_ttl_secs: Option<u64>,
    /// Table bytes per parallel read split (default 64 MiB).
    pub split_size_bytes: Option<u64>,
    /// Most splits of one table scan (default: 2 per task slot of the cluster).
    pub max_splits: Option<usize>,
    /// Longest one remote statement may run on the source, in seconds (default: no limit):
    /// PostgreSQL `statement_timeout`, MariaDB `max_statement_time`, MySQL
    /// `max_execution_time`. A query that reaches it fails with an error that names it.
    pub statement_timeout_secs: Option<u64>,
}

/// Options of a `connector = "mongodb"` catalog.
///
/// ```toml
/// [catalogs.shop]
/// connector = "mongodb"
/// url = "mongodb://reader:${env:MONGO_PASSWORD}@db1:27017/?tls=true&authSource=admin"
/// sample_size = 1000
/// [catalogs.shop.collections."sales.orders"]
/// columns = ["_id objectid", "total decimal(12,2)", "placed timestamp", "lines json"]
/// ```
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MongoSourceConfig {
    /// A MongoDB connection string (`mongodb://` or `mongodb+srv://`), with its options
    /// (`tls`, `authSource`, `authMechanism`, `replicaSet`, `directConnection`...).
    #[serde(default)]
    pub url: Option<Secret>,
    /// Overrides the URL's user name.
    #[serde(default, deserialize_with = "env_string_opt")]
    pub user: Option<String>,
    /// Overrides the URL's password.
    #[serde(default)]
    pub password: Option<Secret>,
    /// PEM file of the CA that signed the server's certificate (switches TLS on).
    #[serde(default, deserialize_with = "env_string_opt")]
    pub tls_ca_file: Option<String>,
    /// Only these databases are schemas of the catalog (default: every database the user
    /// can list, except `admin`, `config` and `local`).
    pub databases: Option<Vec<String>>,
    /// Documents sampled to find a collection's columns and types (default 1000).
    pub sample_size: Option<usize>,
    /// Declared columns of collections (`"database.collection"`), instead of sampling.
    #[serde(default)]
    pub collections: std::collections::BTreeMap<String, MongoCollectionConfig>,
    /// Connections kept open per Basin process (default 8).
    pub pool_size: Option<u32>,
    /// Pipelines run at once per Basin process (default 4); the rest wait.
    pub max_concurrent_queries: Option<usize>,
    /// How long discovered databases, collections and columns are cached (default 60 s).
    pub metadata_ttl_secs: Option<u64>,
    /// Collection bytes per parallel read split (default 64 MiB).
    pub split_size_bytes: Option<u64>,
    /// Most `_id`-range splits of one collection scan (default 1: one cursor).
    pub max_splits: Option<usize>,
    /// Longest one pipeline may run on the server, in seconds (`maxTimeMS`; default: no
    /// limit).
    pub statement_timeout_secs: Option<u64>,
}

/// The declared columns of one MongoDB collection: `"name type"` each, in order. Types:
/// `string`, `int`, `bigint`, `double`, `decimal(p,s)`, `boolean`, `date`, `timestamp`,
/// `timestamptz`, `binary`, `objectid`, `json` (any value, as extended JSON text).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MongoCollectionConfig {
    pub columns: Vec<String>,
}

/// Options of a `connector = "tpch"` catalog.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TpchCatalogConfig {
    /// Rows per generated partition (default 100 000); smaller means more parallelism.
    pub rows_per_partition: Option<usize>,
}

/// How an Iceberg catalog is reached.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum IcebergCatalogKind {
    /// An Iceberg REST catalog (Polaris, Nessie, Lakekeeper, SeaweedFS, AWS Glue REST...).
    Rest,
    /// iceberg-rust's SQL catalog on SQLite or PostgreSQL.
    #[default]
    Sql,
}

/// Options of a `connector = "iceberg"` catalog.
///
/// ```toml
/// [catalogs.lake]
/// connector = "iceberg"
/// kind = "rest"
/// uri = "http://127.0.0.1:8181"
/// warehouse = "lake"
/// credential = "${env:ICEBERG_CREDENTIAL}"   # OAuth2 client credentials, id:secret
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IcebergCatalogConfig {
    /// `rest` or `sql` (default `sql`).
    #[serde(default)]
    pub kind: IcebergCatalogKind,
    /// REST: the catalog's base URL. SQL: a database URL, `sqlite://PATH` or
    /// `postgres://...`. Default for SQL: `sqlite://<data_dir>/<catalog>/catalog.db`.
    #[serde(default, deserialize_with = "env_string_opt")]
    pub uri: Option<String>,
    /// REST: the warehouse name or location sent to the catalog. SQL: where new tables go,
    /// `file:///dir` or `s3://bucket/prefix`. Default for SQL: `<data_dir>/<catalog>/warehouse`.
    #[serde(default, deserialize_with = "env_string_opt")]
    pub warehouse: Option<String>,
    /// REST: OAuth2 client credentials, `client_id:client_secret`.
    #[serde(default)]
    pub credential: Option<Secret>,
    /// REST: a bearer token (instead of `credential`).
    #[serde(default)]
    pub token: Option<Secret>,
    /// REST: the OAuth2 token endpoint (default: the catalog's `v1/oauth/tokens`).
    #[serde(default, deserialize_with = "env_string_opt")]
    pub oauth2_server_uri: Option<String>,
    /// REST: the OAuth2 scope (default `catalog`).
    #[serde(default, deserialize_with = "env_string_opt")]
    pub scope: Option<String>,
    /// REST: ask the catalog for table-scoped storage credentials
    /// (`X-Iceberg-Access-Delegation: vended-credentials`).
    #[serde(default)]
    pub vended_credentials: bool,
    /// REST: extra HTTP headers sent with every catalog request.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// Extra catalog and FileIO properties, with Iceberg's names (`s3.endpoint`, ...). They
    /// override what Basin derives from `[storage.s3]`.
    #[serde(default)]
    pub properties: BTreeMap<String, Secret>,
    /// Bytes of data files per scan partition (default 128 MiB). Smaller means more
    /// parallelism for small tables.
    pub split_size_bytes: Option<u64>,
    /// Target size of the data files Basin writes (default 512 MiB, Iceberg's default).
    pub target_file_size_bytes: Option<u64>,
}

impl IcebergCatalogConfig {
    /// The embedded catalog: SQLite catalog and local warehouse under the data directory.
    pub fn embedded() -> Self {
        Self::default()
    }
}

impl BasinConfig {
    /// The configuration used when no file is given: the built-in `tpch` catalog.
    pub fn embedded() -> Self {
        let mut config = Self::default();
        config.add_builtin_catalogs();
        config
    }

    /// Loads and validates a configuration file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| BasinError::ConfigRead {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text, path)
    }

    /// Parses and validates configuration text; `path` is only used in messages.
    pub fn from_toml_str(text: &str, path: &Path) -> Result<Self> {
        let mut config: BasinConfig = toml::from_str(text).map_err(|e| BasinError::Config {
            path: path.to_path_buf(),
            message: describe_toml_error(text, &e),
        })?;
        config.source = Some(path.to_path_buf());
        config.validate().map_err(|message| BasinError::Config {
            path: path.to_path_buf(),
            message,
        })?;
        config.add_builtin_catalogs();
        Ok(config)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        for name in self.catalogs.keys() {
            let valid = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                return Err(format!(
                    "catalog name `{name}` is not valid: use lowercase letters, digits and _, \
                     starting with a letter"
                ));
            }
        }
        if self.flight_sql.tls_cert.is_some() != self.flight_sql.tls_key.is_some() {
            return Err("[flight_sql] tls_cert and tls_key must be given together".to_string());
        }
        for (name, catalog) in &self.catalogs {
            if let CatalogConfig::Iceberg(c) = catalog
                && c.kind == IcebergCatalogKind::Rest
                && c.uri.is_none()
            {
                return Err(format!(
                    "catalog `{name}`: kind = \"rest\" needs `uri`, the catalog's base URL"
                ));
            }
            if let CatalogConfig::Postgres(c)
            | CatalogConfig::Mysql(c)
            | CatalogConfig::Sqlserver(c)
            | CatalogConfig::Oracle(c) = catalog
                && c.url.is_none()
                && c.host.is_none()
            {
                return Err(format!(
                    "catalog `{name}`: give `url` (e.g. {}://user@host/db) or `host`",
                    catalog.connector()
                ));
            }
            if let CatalogConfig::Mongodb(c) = catalog
                && c.url.is_none()
            {
                return Err(format!(
                    "catalog `{name}`: give `url`, a MongoDB connection string \
                     (mongodb://user@host:27017/?tls=true)"
                ));
            }
        }
        let fraction = self.executor.query_memory_fraction;
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(format!(
                "[executor] query_memory_fraction must be more than 0 and at most 1 (got {fraction})"
            ));
        }
        for (key, limit) in [
            ("[executor] memory_limit", self.executor.memory_limit),
            (
                "[server] front_end_memory_limit",
                self.server.front_end_memory_limit,
            ),
        ] {
            if limit.is_some_and(|l| l.0 < MIN_MEMORY_LIMIT) {
                return Err(format!(
                    "{key} must be at least 16MiB (sorts alone reserve 10 MiB to merge)"
                ));
            }
        }
        if self.server.bind_host.trim().is_empty() {
            return Err("[server] bind_host must not be empty".to_string());
        }
        Ok(())
    }

    /// Adds the built-in catalogs (`tpch`, and the embedded Iceberg catalog `lake`) unless
    /// the file defines a catalog of that name.
    fn add_builtin_catalogs(&mut self) {
        self.catalogs
            .entry("tpch".to_string())
            .or_insert_with(|| CatalogConfig::Tpch(TpchCatalogConfig::default()));
        self.catalogs
            .entry("lake".to_string())
            .or_insert_with(|| CatalogConfig::Iceberg(Box::new(IcebergCatalogConfig::embedded())));
    }
}

impl fmt::Display for BasinConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// The smallest memory limit accepted: DataFusion's sorts reserve 10 MiB up front.
pub const MIN_MEMORY_LIMIT: u64 = 16 << 20;

/// Turns a TOML error into one line: where, which catalog, what.
fn describe_toml_error(text: &str, err: &toml::de::Error) -> String {
    let message = err.message().trim().replace('\n', " ");
    // Errors inside a catalog table (an internally tagged enum) carry the span of the whole
    // document; an unknown key can still be found by name.
    let offset = unknown_key_offset(text, &message).or_else(|| err.span().map(|s| s.start));
    let Some(offset) = offset else {
        return message;
    };
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    let mut location = format!("line {line}, column {column}");
    // The nearest enclosing `[catalogs.NAME]` header names the catalog.
    let header = before
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && !l.starts_with("[["));
    if let Some(name) = header
        .and_then(|h| h.strip_prefix("[catalogs."))
        .and_then(|h| h.strip_suffix(']'))
    {
        location.push_str(&format!(" (catalog `{}`)", name.trim_matches('"')));
    } else if let Some(h) = header {
        location.push_str(&format!(" (section {h})"));
    }
    format!("{location}: {message}")
}

/// Byte offset of the line that sets the key named in an "unknown field `KEY`" message.
fn unknown_key_offset(text: &str, message: &str) -> Option<usize> {
    let key = message.strip_prefix("unknown field `")?.split('`').next()?;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            return Some(offset + (line.len() - trimmed.len()));
        }
        offset += line.len();
    }
    None
}

/// Replaces each `${env:VAR}` in `value`.
pub fn interpolate_env(value: &str) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${env:") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 6..];
        let end = after
            .find('}')
            .ok_or_else(|| "unterminated `${env:` (expected `${env:NAME}`)".to_string())?;
        let var = &after[..end];
        if var.is_empty() {
            return Err("empty variable name in `${env:}`".to_string());
        }
        let v = std::env::var(var).map_err(|_| {
            format!("environment variable {var} is not set (referenced as ${{env:{var}}})")
        })?;
        out.push_str(&v);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn env_string<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    let raw = String::deserialize(d)?;
    interpolate_env(&raw).map_err(serde::de::Error::custom)
}

fn env_string_opt<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    env_string(d).map(Some)
}

fn env_path<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<PathBuf, D::Error> {
    env_string(d).map(PathBuf::from)
}

fn env_path_opt<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<PathBuf>, D::Error> {
    env_path(d).map(Some)
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        env_string(d).map(Secret::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BasinConfig> {
        BasinConfig::from_toml_str(text, Path::new("basin.toml"))
    }

    #[test]
    fn empty_file_gives_builtin_tpch() {
        let c = parse("").unwrap();
        assert!(matches!(
            c.catalogs.get("tpch"),
            Some(CatalogConfig::Tpch(_))
        ));
        assert_eq!(c.server.bind_host, "127.0.0.1");
    }

    #[test]
    fn unknown_key_names_file_line_catalog_and_key() {
        let err = parse("[catalogs.gen]\nconnector = \"tpch\"\nbogus = 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("basin.toml"), "{err}");
        assert!(err.contains("catalog `gen`"), "{err}");
        assert!(err.contains("bogus"), "{err}");
        assert!(err.contains("line "), "{err}");
    }

    #[test]
    fn unknown_connector_lists_supported() {
        let err = parse("[catalogs.x]\nconnector = \"oracle9\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("oracle9") && err.contains("tpch"), "{err}");
    }

    #[test]
    fn missing_connector_is_an_error() {
        let err = parse("[catalogs.x]\nrows_per_partition = 5\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("connector"), "{err}");
    }

    #[test]
    fn bad_value_type() {
        let err = parse("[server]\nscheduler_port = \"abc\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("[server]"), "{err}");
    }

    #[test]
    fn env_interpolation_and_secret_redaction() {
        // SAFETY: test-only variable name, not read by other tests.
        unsafe { std::env::set_var("BASIN_TEST_CFG_SECRET", "s3cr3t-value") };
        let c = parse(
            "[storage.s3]\naccess_key_id = \"id\"\nsecret_access_key = \"${env:BASIN_TEST_CFG_SECRET}\"\n",
        )
        .unwrap();
        let s3 = c.storage.s3.as_ref().unwrap();
        assert_eq!(
            s3.secret_access_key.as_ref().unwrap().expose(),
            "s3cr3t-value"
        );
        let shown = format!("{c:?} {c}");
        assert!(!shown.contains("s3cr3t-value"), "{shown}");
    }

    #[test]
    fn missing_env_var_is_named() {
        let err = parse("[storage.s3]\nsecret_access_key = \"${env:BASIN_TEST_SURELY_UNSET}\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("BASIN_TEST_SURELY_UNSET"), "{err}");
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn database_sources() {
        let c = parse(
            "[catalogs.pg]\nconnector = \"postgres\"\nhost = \"db\"\ntls = \"verify-full\"\n\
             [catalogs.my]\nconnector = \"mariadb\"\nurl = \"mysql://u:pw@h/d\"\n",
        )
        .unwrap();
        let Some(CatalogConfig::Postgres(pg)) = c.catalogs.get("pg") else {
            panic!("pg is not postgres")
        };
        assert_eq!(pg.tls, TlsMode::VerifyFull);
        assert!(matches!(
            c.catalogs.get("my"),
            Some(CatalogConfig::Mysql(_))
        ));
        assert!(!format!("{c:?}").contains("pw"));
        let err = parse("[catalogs.pg]\nconnector = \"postgres\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`url`") && err.contains("pg"), "{err}");
    }

    #[test]
    fn invalid_catalog_name() {
        let err = parse("[catalogs.Bad-Name]\nconnector = \"tpch\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("Bad-Name"), "{err}");
    }

    #[test]
    fn sizes_parse_with_decimal_and_binary_units() {
        let size = |t: &str| t.parse::<ByteSize>().map(|b| b.0);
        assert_eq!(size("1024"), Ok(1024));
        assert_eq!(size("8GiB"), Ok(8 << 30));
        assert_eq!(size("512 MiB"), Ok(512 << 20));
        assert_eq!(size("2GB"), Ok(2_000_000_000));
        assert_eq!(size("1.5gib"), Ok(3 << 29));
        assert_eq!(size("10kb"), Ok(10_000));
        assert_eq!(size("7B"), Ok(7));
        for bad in ["", "GiB", "8 GiBs", "-1", "1e3", "99999999999TiB"] {
            let err = size(bad).unwrap_err();
            assert!(
                err.contains("is not a size") && err.contains("8GiB"),
                "{err}"
            );
        }
    }

    #[test]
    fn executor_memory_settings_and_their_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.executor.memory_limit, None);
        assert_eq!(c.executor.query_memory_fraction, 0.5);
        assert_eq!(c.server.front_end_memory_limit, None);
        let machine = crate::memory::machine_memory();
        assert_eq!(
            c.executor.memory_limit_bytes(2),
            crate::memory::default_executor_memory(machine, 2)
        );
        assert_eq!(
            c.server.front_end_memory_bytes(),
            crate::memory::default_front_end_memory(machine)
        );

        let c = parse(
            "[server]\nfront_end_memory_limit = 33554432\n\
             [executor]\nmemory_limit = \"2GiB\"\nquery_memory_fraction = 1.0\n",
        )
        .unwrap();
        assert_eq!(c.executor.memory_limit_bytes(4), 2 << 30);
        assert_eq!(c.executor.query_memory_fraction, 1.0);
        assert_eq!(c.server.front_end_memory_bytes(), 32 << 20);

        let err = parse("[executor]\nmemory_limit = \"lots\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2") && err.contains("`lots` is not a size"),
            "{err}"
        );
        let err = parse("[executor]\nmemory_limit = true\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a size"), "{err}");
        let err = parse("[executor]\nmemory_limit = \"1MiB\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[executor] memory_limit must be at least"),
            "{err}"
        );
        let err = parse("[executor]\nquery_memory_fraction = 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("query_memory_fraction"), "{err}");
    }
}
