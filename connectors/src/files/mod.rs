//! Files on local disk and S3-compatible object stores.
//!
//! `CREATE EXTERNAL TABLE … STORED AS PARQUET|CSV|JSON LOCATION '…'` is DataFusion's own;
//! Basin adds the object store registry that opens `s3://` buckets from `[storage.s3]`, and
//! the table functions `read_parquet`, `read_csv`, `read_json`. Both produce DataFusion
//! listing tables, which the standard plan codec ships to executors.

mod functions;
mod store;

pub use functions::{FileKind, ReadFilesFunction};
pub use store::BasinObjectStoreRegistry;
