//! Apache Iceberg catalogs (REST, SQL) as Basin catalogs.
//!
//! - The front end loads tables from the catalog and pins the snapshot a query reads.
//! - The scheduler plans the files of each scan (partition and statistics pruning) and
//!   spreads them over partitions balanced by bytes ([`IcebergScanExec`]).
//! - Executors read their files, and write data files for `INSERT` and CTAS
//!   ([`IcebergWriteExec`]); the front end then commits every file of the statement in one
//!   snapshot ([`IcebergCommitExec`]).

mod by_name;
mod catalog;
mod ddl;
mod metadata_tables;
mod parquet_props;
mod scan;
mod stats;
mod storage;
mod table;
mod write;

pub use by_name::ByName;
pub use catalog::{
    DEFAULT_SPLIT_SIZE, DEFAULT_TARGET_FILE_SIZE, IcebergCatalog, IcebergCatalogProvider,
    IcebergOptions, IcebergSchemaProvider, TableName, VERSION_MARKER, error_text, namespace_ident,
};
pub use ddl::{
    AlterOp, IcebergAlterTable, IcebergCreateTable, IcebergDdl, IcebergDdlExec, TableOptions,
    create_table_text, parse_partition_field,
};
pub use metadata_tables::MetadataTableKind;
pub use scan::{IcebergScanExec, ScanPlanStats, ScanSpec};
pub use storage::{BasinStorage, BasinStorageFactory};
pub use table::{IcebergTableProvider, IcebergTableSpec, TableVersion, balance};
pub use write::{
    COMMIT_ID_PROPERTY, IcebergCommitExec, IcebergWriteExec, IcebergWriteNode, IcebergWritePlanner,
    WriteSpec,
};

/// A table identifier (so front ends need not depend on iceberg-rust).
pub fn table_ident(namespace: ::iceberg::NamespaceIdent, name: String) -> ::iceberg::TableIdent {
    ::iceberg::TableIdent::new(namespace, name)
}
