//! Apache Iceberg catalogs (REST, SQL) as Basin catalogs.
//!
//! - The front end loads tables from the catalog and pins the snapshot a query reads.
//! - The scheduler plans the files of each scan (partition and statistics pruning) and
//!   spreads them over partitions balanced by bytes ([`IcebergScanExec`]).
//! - Executors read their files, and write data files for `INSERT` and CTAS
//!   ([`IcebergWriteExec`]); the front end then commits every file of the statement in one
//!   snapshot ([`IcebergCommitExec`]).

mod add_files;
mod by_name;
mod catalog;
mod commit;
mod ddl;
mod delete;
mod maintenance;
mod merge;
mod metadata_tables;
mod parquet_props;
mod rewrite;
mod scan;
mod stats;
mod storage;
mod table;
mod write;

pub use add_files::Recursive;
pub use by_name::ByName;
pub use catalog::{
    DEFAULT_SPLIT_SIZE, DEFAULT_TARGET_FILE_SIZE, IcebergCatalog, IcebergCatalogProvider,
    IcebergOptions, IcebergSchemaProvider, TableName, VERSION_MARKER, error_text, namespace_ident,
};
pub use ddl::{
    AlterOp, IcebergAlterTable, IcebergCreateTable, IcebergDdl, IcebergDdlExec, TableOptions,
    create_table_text, parse_partition_field,
};
pub use delete::{IcebergDeleteExec, by_whole_files};
pub use maintenance::{IcebergProcedure, IcebergProcedureExec, Procedure, parse_timestamp};
pub use merge::IcebergMergeNode;
pub use metadata_tables::MetadataTableKind;
pub use rewrite::{
    IcebergRewriteExec, IcebergRewriteNode, IcebergRowChangeExec, RewriteSpec, RowChange,
    RowChangePlan, no_change, plan_optimize, plan_rewrite, row_change_plan,
};
pub use scan::{IcebergScanExec, ScanPlanStats, ScanSpec};
pub use storage::{BasinStorage, BasinStorageFactory};
pub use table::{
    IcebergTableProvider, IcebergTableSpec, ROW_FILE_COLUMN, ROW_POS_COLUMN, TableVersion, balance,
};
pub use write::{
    COMMIT_ID_PROPERTY, IcebergCommitExec, IcebergWriteExec, IcebergWriteNode, IcebergWritePlanner,
    MERGE_ACTION_COLUMN, MERGE_FILE_COLUMN, MERGE_MATCHES_COLUMN, Overwrite, WriteSpec,
};

/// The Arrow schema a query sees of an Iceberg schema converted by iceberg-rust: strings as
/// views (crate::views), and no `PARQUET:field_id` metadata on the columns. Field ids are the
/// files' business (readers and writers map columns by them on their own); left on a table's
/// columns they made plans inconsistent: a `UNION ALL` of columns from different tables
/// (TPC-DS Q71's three sales channels) has no field id logically, where DataFusion's physical
/// union keeps the first input's, and the physical planner refused the plan.
pub(crate) fn query_schema(
    arrow: &datafusion::arrow::datatypes::Schema,
) -> datafusion::arrow::datatypes::Schema {
    let fields: Vec<datafusion::arrow::datatypes::Field> = crate::views::read_schema(arrow)
        .fields()
        .iter()
        .map(|f| {
            let mut metadata = f.metadata().clone();
            metadata.remove(datafusion::parquet::arrow::PARQUET_FIELD_ID_META_KEY);
            f.as_ref().clone().with_metadata(metadata)
        })
        .collect();
    datafusion::arrow::datatypes::Schema::new_with_metadata(fields, arrow.metadata().clone())
}

/// A table identifier (so front ends need not depend on iceberg-rust).
pub fn table_ident(namespace: ::iceberg::NamespaceIdent, name: String) -> ::iceberg::TableIdent {
    ::iceberg::TableIdent::new(namespace, name)
}
