//! Basin's data sources and the codec that ships their plans to executors.
//!
//! ```text
//!   basin.toml catalogs ──► catalogs::register ──► SessionContext (front end)
//!   tpch   : generated TPC-H data             (TpchScanExec on executors)
//!   files  : local and S3 files, read_*()     (DataFusion listing tables)
//!   iceberg: Iceberg REST/SQL catalogs        (IcebergScanExec, IcebergWriteExec)
//!   remote : PostgreSQL, MySQL/MariaDB        (pushdown rule, RemoteScanExec)
//!   codec  : BasinLogicalCodec / BasinPhysicalCodec (client → scheduler → executors)
//! ```

pub mod catalogs;
pub mod codec;
pub mod files;
pub mod iceberg;
pub mod remote;
pub mod tpch;
