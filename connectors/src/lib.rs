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
pub mod exchange;
pub mod files;
pub mod iceberg;
pub mod portable;
mod recursive;
pub mod remote;
pub mod tpch;
pub mod views;
pub mod windows;

/// The runtime all I/O to other systems runs on: PostgreSQL/MySQL pools and their sockets,
/// and the HTTP connections of S3 stores, live here whatever runtime DataFusion, Ballista or
/// a catalog calls from (a connection driven by a runtime whose threads are all blocked, or
/// that was shut down, would stall every caller that shares it). Splits decode their rows
/// here too (PostgreSQL's COPY stream, MySQL's text rows), so it has a thread per core, as
/// DataFusion's does: with a fixed two, an executor of many cores decoded its splits two at
/// a time.
pub fn io_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores.max(2))
            .thread_name("basin-io")
            .enable_all()
            .build()
            .expect("start the I/O runtime")
    })
}

/// An HTTP connector for object stores whose requests run on [`io_runtime`], so that one
/// store can be shared by every runtime of the process.
pub fn io_connector() -> object_store::client::SpawnedReqwestConnector {
    object_store::client::SpawnedReqwestConnector::new(io_runtime().handle().clone())
}
