//! Basin's data sources and the codec that ships their plans to executors.
//!
//! ```text
//!   basin.toml catalogs ──► catalogs::register ──► SessionContext (front end)
//!   tpch   : generated TPC-H data             (TpchScanExec on executors)
//!   files  : local and S3 files, read_*()     (DataFusion listing tables)
//!   iceberg: Iceberg REST/SQL catalogs        (IcebergScanExec, IcebergWriteExec)
//!   remote : PostgreSQL, MySQL/MariaDB, SQL Server, Oracle (pushdown rule, RemoteScanExec)
//!   mongodb: MongoDB                          (pipeline pushdown rule, MongoScanExec)
//!   codec  : BasinLogicalCodec / BasinPhysicalCodec (client → scheduler → executors)
//! ```

pub mod catalogs;
pub mod cluster;
pub mod codec;
pub mod exchange;
pub mod files;
pub mod iceberg;
pub mod mongodb;
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

/// Runs `fut` on [`io_runtime`] and waits for it from async code; `source` names the
/// source in the error of a task that failed.
pub async fn on_io<T, Fut>(source: &str, fut: Fut) -> datafusion::error::Result<T>
where
    T: Send + 'static,
    Fut: Future<Output = datafusion::error::Result<T>> + Send + 'static,
{
    match io_runtime().spawn(fut).await {
        Ok(r) => r,
        Err(e) => Err(datafusion::error::DataFusionError::Execution(format!(
            "source `{source}`: task failed: {e}"
        ))),
    }
}

/// Runs `fut` on [`io_runtime`] and blocks until it is done (for DataFusion's synchronous
/// catalog calls).
pub fn on_io_blocking<T, Fut>(source: &str, fut: Fut) -> datafusion::error::Result<T>
where
    T: Send + 'static,
    Fut: Future<Output = datafusion::error::Result<T>> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    io_runtime().spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().map_err(|_| {
        datafusion::error::DataFusionError::Execution(format!(
            "source `{source}`: connector stopped"
        ))
    })?
}

/// An HTTP connector for object stores whose requests run on [`io_runtime`], so that one
/// store can be shared by every runtime of the process.
pub fn io_connector() -> object_store::client::SpawnedReqwestConnector {
    object_store::client::SpawnedReqwestConnector::new(io_runtime().handle().clone())
}
