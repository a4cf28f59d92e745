//! Basin's shared pieces: the `basin.toml` configuration model and the error type that the
//! scheduler, the executors and the connectors all use.
//!
//! ```text
//!   basin.toml ──► BasinConfig ──► scheduler (catalogs, front end)
//!                              └─► executor  (object stores, connector runtime)
//! ```
//!
//! Secrets are read from the environment with `${env:VAR}` and held in [`Secret`], whose
//! `Debug` and `Display` never show the value.

pub mod cluster;
pub mod config;
pub mod error;
pub mod memory;
pub mod net;
pub mod sandbox;
pub mod secret;

pub use config::{
    BasinConfig, ByteSize, CatalogConfig, ClusterConfig, ExecutorConfig, FlightSqlConfig,
    IcebergCatalogConfig, IcebergCatalogKind, JwtConfig, MongoCollectionConfig, MongoSourceConfig,
    S3Config, SecurityConfig, ServerConfig, SqlSourceConfig, StorageConfig, TlsMode,
};
pub use error::{BasinError, Result};
pub use secret::Secret;
