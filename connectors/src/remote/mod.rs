//! Database sources queried in place: PostgreSQL and MySQL/MariaDB.
//!
//! ```text
//!   basin.toml [catalogs.pg] ─► RemoteSource (pool, limits; registry by catalog name)
//!   RemoteCatalogProvider ─► schemas, tables, columns from the source's catalog (TTL cache)
//!   RemotePushdown (optimizer rule) ─► largest single-source subtrees → RemoteQueryTable
//!   RemoteScanExec ─► splits (ctid ranges / key ranges) run on executors, streamed as Arrow
//! ```

pub mod catalog;
pub mod decode;
pub mod exec;
pub mod pgwire;
pub mod pushdown;
pub mod source;
pub mod sql;
pub mod types;

pub use catalog::{RemoteCatalogProvider, RemoteTable};
pub use exec::{RemoteQuery, RemoteQueryTable, RemoteScanExec, RemoteScanSpec};
pub use pushdown::RemotePushdown;
pub use source::{Dialect, RemoteSource, register_sources, source};
