//! Writes: executors write Parquet data files routed by the table's partition spec
//! (`IcebergWriteExec`, one per input partition); the front end commits every file of the
//! statement in one atomic fast-append (`IcebergCommitExec`).
//!
//! A statement that fails, or is killed before its commit, leaves the table at its old
//! snapshot: files are only ever made visible by the one commit.

use std::any::Any;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, SessionState, TaskContext};
use datafusion::logical_expr::{
    Expr, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::physical_expr::{Distribution, EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, execute_stream_partitioned,
};
use datafusion::physical_planner::{ExtensionPlanner, PhysicalPlanner};
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::{FieldMatchMode, RecordBatchPartitionSplitter, schema_to_arrow_schema};
use iceberg::io::FileIOBuilder;
use iceberg::spec::{
    DataFile, DataFileFormat, TableMetadata, TableMetadataRef, deserialize_data_file_from_json,
    serialize_data_file_to_json,
};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::partitioning::PartitioningWriter;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::writer::partitioning::unpartitioned_writer::UnpartitionedWriter;
use iceberg::{Catalog, ErrorKind, TableIdent};
use serde::{Deserialize, Serialize};

use super::catalog::{IcebergCatalog, error_text};
use super::parquet_props::writer_properties;
use super::storage::BasinStorageFactory;
use super::table::IcebergTableSpec;

/// The summary property that marks the snapshot of one Basin statement.
pub const COMMIT_ID_PROPERTY: &str = "basin.commit-id";

/// The column of the write stage's output: one serialized data file per row.
pub const DATA_FILE_COLUMN: &str = "data_file";

/// A `MERGE` write's output beside the files: the target's files it rewrote…
const REMOVED_COLUMN: &str = "removed";
/// …and the rows it inserted, updated or deleted.
const CHANGED_COLUMN: &str = "changed_rows";

pub(super) fn data_files_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(DATA_FILE_COLUMN, DataType::Utf8, true),
        Field::new(REMOVED_COLUMN, DataType::Utf8, true),
        Field::new(CHANGED_COLUMN, DataType::UInt64, true),
    ]))
}

/// What writers report: the files they added (serialized), the table's files they replace
/// (paths), and the rows they changed (for statements that count changes, not rows written).
#[derive(Debug, Default)]
pub(super) struct Written {
    pub(super) added: Vec<String>,
    pub(super) removed: std::collections::BTreeSet<String>,
    pub(super) changed: u64,
}

impl Written {
    /// As one batch of [`data_files_schema`]: a row per file, the count on a row of its own.
    pub(super) fn into_batch(self) -> Result<RecordBatch> {
        let mut added: Vec<Option<String>> = self.added.into_iter().map(Some).collect();
        let mut removed: Vec<Option<String>> = vec![None; added.len()];
        for path in self.removed {
            added.push(None);
            removed.push(Some(path));
        }
        added.push(None);
        removed.push(None);
        let mut changed: Vec<Option<u64>> = vec![None; added.len() - 1];
        changed.push(Some(self.changed));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(added)),
            Arc::new(StringArray::from(removed)),
            Arc::new(UInt64Array::from(changed)),
        ];
        Ok(RecordBatch::try_new(data_files_schema(), columns)?)
    }

    /// Everything the partitions of `input` (writers) report.
    pub(super) async fn collect(
        input: Arc<dyn ExecutionPlan>,
        context: Arc<TaskContext>,
    ) -> Result<Self> {
        let bad = || DataFusionError::Internal("bad output of an Iceberg writer".to_string());
        let mut written = Self::default();
        for stream in execute_stream_partitioned(input, context)? {
            let batches: Vec<RecordBatch> = stream.try_collect().await?;
            for batch in batches {
                let strings = |i: usize| {
                    batch
                        .column(i)
                        .as_any()
                        .downcast_ref::<StringArray>()
                        .cloned()
                        .ok_or_else(bad)
                };
                written
                    .added
                    .extend(strings(0)?.iter().flatten().map(str::to_string));
                written
                    .removed
                    .extend(strings(1)?.iter().flatten().map(str::to_string));
                let counts = batch
                    .column(2)
                    .as_any()
                    .downcast_ref::<UInt64Array>()
                    .ok_or_else(bad)?;
                written.changed += counts.iter().flatten().sum::<u64>();
            }
        }
        Ok(written)
    }
}

/// The data files a statement wrote, read back from their serialized form.
pub(super) fn deserialize_files(spec: &WriteSpec, files: &[String]) -> Result<Vec<DataFile>> {
    let metadata = &spec.metadata;
    let spec_id = metadata.default_partition_spec_id();
    let partition_type = metadata.default_partition_type();
    let schema = metadata.current_schema();
    files
        .iter()
        .map(|json| deserialize_data_file_from_json(json, spec_id, partition_type, schema))
        .collect::<iceberg::Result<_>>()
        .map_err(|e| {
            DataFusionError::Internal(format!(
                "cannot read the files written to `{}`: {}",
                spec.table,
                error_text(&e)
            ))
        })
}

/// In a `MERGE` write, after the table's columns: the target file of the row (NULL for an
/// inserted row)…
pub const MERGE_FILE_COLUMN: &str = super::table::ROW_FILE_COLUMN;
/// …what happens to it: 0 kept as it is, 1 updated, 2 deleted, 3 inserted…
pub const MERGE_ACTION_COLUMN: &str = "__basin_action";
/// …and how many source rows matched its target row (more than one fails the statement).
pub const MERGE_MATCHES_COLUMN: &str = "__basin_matches";

/// What the executors need to write files for one statement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriteSpec {
    /// `catalog.namespace.table`, for messages.
    pub table: String,
    pub metadata: TableMetadataRef,
    /// FileIO properties (may hold credentials; never displayed).
    pub file_io: BTreeMap<String, String>,
    pub target_file_size: u64,
    /// Unique per statement: the prefix of every file name it writes.
    pub write_id: String,
    /// A `MERGE`: the input carries [`MERGE_FILE_COLUMN`], [`MERGE_ACTION_COLUMN`] and
    /// [`MERGE_MATCHES_COLUMN`] after the table's columns, and only rows of the target files
    /// it changes (and inserted rows).
    #[serde(default)]
    pub merge: bool,
}

impl WriteSpec {
    pub fn new(table: &IcebergTableSpec) -> Self {
        let target = table
            .metadata
            .properties()
            .get("write.target-file-size-bytes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(table.options.target_file_size);
        Self {
            table: table.qualified_name(),
            metadata: table.metadata.clone(),
            file_io: table.file_io.clone(),
            target_file_size: target,
            write_id: uuid::Uuid::now_v7().to_string(),
            merge: false,
        }
    }
}

/// Logical node: write the input into data files of a table (runs on the executors).
#[derive(Debug, Clone)]
pub struct IcebergWriteNode {
    pub spec: WriteSpec,
    pub input: LogicalPlan,
    schema: DFSchemaRef,
}

impl IcebergWriteNode {
    pub fn new(spec: WriteSpec, input: LogicalPlan) -> Result<Self> {
        Ok(Self {
            spec,
            input,
            schema: Arc::new(DFSchema::try_from(data_files_schema().as_ref().clone())?),
        })
    }
}

impl PartialEq for IcebergWriteNode {
    fn eq(&self, other: &Self) -> bool {
        self.spec.write_id == other.spec.write_id && self.input == other.input
    }
}
impl Eq for IcebergWriteNode {}
impl Hash for IcebergWriteNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.spec.write_id.hash(state);
        self.input.hash(state);
    }
}
impl PartialOrd for IcebergWriteNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.spec.write_id.partial_cmp(&other.spec.write_id)
    }
}

impl UserDefinedLogicalNodeCore for IcebergWriteNode {
    fn name(&self) -> &str {
        "IcebergWrite"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "IcebergWrite: table={}", self.spec.table)
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("IcebergWrite needs one input".to_string()))?;
        Ok(Self {
            spec: self.spec.clone(),
            input,
            schema: self.schema.clone(),
        })
    }
}

/// Plans [`IcebergWriteNode`] on the scheduler: rows of one table partition go to one
/// writer task (hash on the partition source columns), then each task writes its files.
#[derive(Debug, Default)]
pub struct IcebergWritePlanner;

#[async_trait]
impl ExtensionPlanner for IcebergWritePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session_state: &SessionState,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let Some(node) = node
            .as_any()
            .downcast_ref::<super::rewrite::IcebergRewriteNode>()
        {
            return Ok(Some(Arc::new(super::rewrite::IcebergRewriteExec::new(
                node.spec.clone(),
            ))));
        }
        let Some(node) = node.as_any().downcast_ref::<IcebergWriteNode>() else {
            return Ok(None);
        };
        let [input] = physical_inputs else {
            return Err(DataFusionError::Internal(
                "IcebergWrite needs one input".to_string(),
            ));
        };
        let _ = session_state;
        Ok(Some(Arc::new(IcebergWriteExec::new(
            node.spec.clone(),
            input.clone(),
        ))))
    }
}

/// Writes its input partitions into data files; outputs one row per file written. For a
/// partitioned table it asks for its input hash-partitioned on the partition source
/// columns, so each table partition is written by one task (few, large files).
#[derive(Debug)]
pub struct IcebergWriteExec {
    spec: WriteSpec,
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    properties: Arc<PlanProperties>,
}

/// The input columns the table's partition spec is computed from.
fn partition_keys(spec: &WriteSpec, input: &SchemaRef) -> Vec<Arc<dyn PhysicalExpr>> {
    let partition_spec = spec.metadata.default_partition_spec();
    let schema = spec.metadata.current_schema();
    let mut keys: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
    let mut seen = Vec::new();
    for field in partition_spec.fields() {
        if let Some(source) = schema.field_by_id(field.source_id)
            && let Ok(index) = input.index_of(&source.name)
            && !seen.contains(&index)
        {
            seen.push(index);
            keys.push(Arc::new(Column::new(&source.name, index)));
        }
    }
    keys
}

impl IcebergWriteExec {
    pub fn new(spec: WriteSpec, input: Arc<dyn ExecutionPlan>) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(data_files_schema()),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        let keys = partition_keys(&spec, &input.schema());
        Self {
            spec,
            input,
            keys,
            properties,
        }
    }

    pub fn spec(&self) -> &WriteSpec {
        &self.spec
    }

    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl DisplayAs for IcebergWriteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let spec = self.spec.metadata.default_partition_spec();
        write!(
            f,
            "IcebergWriteExec: table={}, partitioning=[{}], target_file_size={}",
            self.spec.table,
            spec.fields()
                .iter()
                .map(|p| format!("{}={}", p.name, p.transform))
                .collect::<Vec<_>>()
                .join(", "),
            self.spec.target_file_size
        )
    }
}

impl ExecutionPlan for IcebergWriteExec {
    fn name(&self) -> &str {
        "IcebergWriteExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        if self.keys.is_empty() {
            vec![Distribution::UnspecifiedDistribution]
        } else {
            vec![Distribution::HashPartitioned(self.keys.clone())]
        }
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![!self.keys.is_empty()]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children.pop().ok_or_else(|| {
            DataFusionError::Internal("IcebergWriteExec needs one input".to_string())
        })?;
        Ok(Arc::new(Self::new(self.spec.clone(), input)))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let spec = self.spec.clone();
        let task = format!("{}-{partition:05}", spec.write_id);
        let stream = futures::stream::once(async move {
            let (input, merged) = if spec.merge {
                let (input, merged) = merge_input(&spec, input)?;
                (input, Some(merged))
            } else {
                (input, None)
            };
            let added = write_files(&spec, &task, input).await?;
            let mut written = Written {
                added,
                ..Default::default()
            };
            if let Some(merged) = merged {
                let mut merged = merged.lock().unwrap_or_else(|e| e.into_inner());
                written.removed = std::mem::take(&mut merged.files);
                written.changed = merged.changed;
            }
            written.into_batch()
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            data_files_schema(),
            stream,
        )))
    }
}

/// What a `MERGE` task saw: the target files it rewrites, the rows it changed.
#[derive(Debug, Default)]
struct Merged {
    files: std::collections::BTreeSet<String>,
    changed: u64,
}

/// A `MERGE` task's input as the rows to write (the table's columns; deleted rows dropped),
/// recording the files it rewrites and the rows it changes; fails on a target row matched
/// by more than one source row.
fn merge_input(
    spec: &WriteSpec,
    input: SendableRecordBatchStream,
) -> Result<(SendableRecordBatchStream, Arc<std::sync::Mutex<Merged>>)> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::compute::filter_record_batch;
    use datafusion::arrow::datatypes::{Int32Type, Int64Type};
    let schema = input.schema();
    let columns = spec.metadata.current_schema().as_struct().fields().len();
    let find = |name: &str| {
        schema.index_of(name).map_err(|_| {
            DataFusionError::Internal(format!("a MERGE write's input has no column {name}"))
        })
    };
    let (file_at, action_at, matches_at) = (
        find(MERGE_FILE_COLUMN)?,
        find(MERGE_ACTION_COLUMN)?,
        find(MERGE_MATCHES_COLUMN)?,
    );
    let output = Arc::new(schema.project(&(0..columns).collect::<Vec<_>>())?);
    let merged = Arc::new(std::sync::Mutex::new(Merged::default()));
    let seen = merged.clone();
    let table = spec.table.clone();
    let projection: Vec<usize> = (0..columns).collect();
    let stream = input.map(move |batch| {
        let batch = batch?;
        let files = batch
            .column(file_at)
            .as_string_opt::<i32>()
            .cloned()
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "a MERGE write's {MERGE_FILE_COLUMN} column is {}, not Utf8",
                    batch.column(file_at).data_type()
                ))
            })?;
        let actions = cast(batch.column(action_at), &DataType::Int32)?;
        let actions = actions.as_primitive::<Int32Type>();
        let matches = cast(batch.column(matches_at), &DataType::Int64)?;
        let matches = matches.as_primitive::<Int64Type>();
        if matches.iter().flatten().any(|m| m > 1) {
            return Err(DataFusionError::Execution(format!(
                "MERGE INTO `{table}`: a target row matched more than one source row (the SQL \
                 standard's cardinality rule); nothing was committed. Make the ON condition \
                 match at most one source row per target row, e.g. by deduplicating the source"
            )));
        }
        let mut merged = seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut keep = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let action = if actions.is_null(row) {
                0
            } else {
                actions.value(row)
            };
            if (1..=3).contains(&action) {
                merged.changed += 1;
            }
            if files.is_valid(row) && !merged.files.contains(files.value(row)) {
                merged.files.insert(files.value(row).to_string());
            }
            keep.push(action != 2);
        }
        drop(merged);
        let kept =
            filter_record_batch(&batch, &datafusion::arrow::array::BooleanArray::from(keep))?;
        Ok(kept.project(&projection)?)
    });
    Ok((
        Box::pin(RecordBatchStreamAdapter::new(output, stream)),
        merged,
    ))
}

/// Writes one input stream into data files; returns them serialized.
pub(super) async fn write_files(
    spec: &WriteSpec,
    task: &str,
    mut input: SendableRecordBatchStream,
) -> Result<Vec<String>> {
    let fail = |what: &str, e: iceberg::Error| {
        DataFusionError::Execution(format!(
            "cannot write to `{}`: {what}: {}",
            spec.table,
            error_text(&e)
        ))
    };
    let metadata: &TableMetadata = &spec.metadata;
    let schema = metadata.current_schema().clone();
    let arrow_schema: SchemaRef =
        Arc::new(schema_to_arrow_schema(&schema).map_err(|e| fail("unsupported column type", e))?);
    let partition_spec = metadata.default_partition_spec().clone();
    let file_io = FileIOBuilder::new(Arc::new(BasinStorageFactory))
        .with_props(spec.file_io.clone())
        .build();
    let parquet = ParquetWriterBuilder::new_with_match_mode(
        writer_properties(&spec.table, metadata.properties())?,
        schema.clone(),
        FieldMatchMode::Name,
    );
    let rolling = RollingFileWriterBuilder::new(
        parquet,
        spec.target_file_size as usize,
        file_io,
        DefaultLocationGenerator::new(metadata).map_err(|e| fail("data location", e))?,
        DefaultFileNameGenerator::new(task.to_string(), None, DataFileFormat::Parquet),
    );
    let builder = DataFileWriterBuilder::new(rolling);
    let files: Vec<DataFile> = if partition_spec.is_unpartitioned() {
        let mut writer = UnpartitionedWriter::new(builder);
        while let Some(batch) = input.next().await {
            let batch = conform(&batch?, &arrow_schema, &spec.table)?;
            if batch.num_rows() > 0 {
                writer.write(batch).await.map_err(|e| fail("write", e))?;
            }
        }
        writer.close().await.map_err(|e| fail("close", e))?
    } else {
        let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(
            schema.clone(),
            partition_spec.clone(),
        )
        .map_err(|e| fail("partition spec", e))?;
        let mut writer = FanoutWriter::new(builder);
        while let Some(batch) = input.next().await {
            let batch = conform(&batch?, &arrow_schema, &spec.table)?;
            if batch.num_rows() == 0 {
                continue;
            }
            for (key, part) in splitter.split(&batch).map_err(|e| fail("partition", e))? {
                writer
                    .write(key, part)
                    .await
                    .map_err(|e| fail("write", e))?;
            }
        }
        writer.close().await.map_err(|e| fail("close", e))?
    };
    let partition_type = metadata.default_partition_type();
    files
        .into_iter()
        .map(|f| {
            serialize_data_file_to_json(f, partition_type, metadata.format_version())
                .map_err(|e| fail("serialize data file", e))
        })
        .collect()
}

/// Gives a batch the table's Arrow schema (field ids, types), casting where needed.
fn conform(batch: &RecordBatch, schema: &SchemaRef, table: &str) -> Result<RecordBatch> {
    if batch.num_columns() != schema.fields().len() {
        return Err(DataFusionError::Plan(format!(
            "cannot write {} columns into `{table}`, which has {}",
            batch.num_columns(),
            schema.fields().len()
        )));
    }
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| {
            if column.data_type() == field.data_type() {
                Ok(column.clone())
            } else {
                cast(column, field.data_type()).map_err(|e| {
                    DataFusionError::Plan(format!(
                        "column `{}` of `{table}` is {}, the value is {}: {e}",
                        field.name(),
                        field.data_type(),
                        column.data_type()
                    ))
                })
            }
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| DataFusionError::Execution(format!("cannot write to `{table}`: {e}")))
}

/// Commits the files of one statement in one fast-append; runs in the front end.
/// Outputs the number of rows written (DataFusion's DML `count`).
#[derive(Debug)]
pub struct IcebergCommitExec {
    catalog: Arc<IcebergCatalog>,
    ident: TableIdent,
    spec: WriteSpec,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    overwrite: Option<Overwrite>,
}

/// `INSERT OVERWRITE`: what the new files replace.
#[derive(Debug, Clone, Copy)]
pub struct Overwrite {
    /// The snapshot the statement planned from (`None`: the table had none); the commit
    /// fails as a conflict when `main` moved since, so that no concurrent change is dropped.
    pub read_snapshot: Option<i64>,
}

/// The result of a DML or DDL statement: DataFusion's `count` column.
pub(super) fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

impl IcebergCommitExec {
    pub fn new(
        catalog: Arc<IcebergCatalog>,
        ident: TableIdent,
        spec: WriteSpec,
        input: Arc<dyn ExecutionPlan>,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(count_schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            catalog,
            ident,
            spec,
            input,
            properties,
            overwrite: None,
        }
    }

    /// The same commit as an `INSERT OVERWRITE`: an unpartitioned table's files are all
    /// replaced; a partitioned table's files in the partitions the statement wrote rows to
    /// (dynamic partition overwrite).
    pub fn overwriting(mut self, overwrite: Overwrite) -> Self {
        self.overwrite = Some(overwrite);
        self
    }
}

impl DisplayAs for IcebergCommitExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergCommitExec: table={}, operation={}",
            self.spec.table,
            if self.overwrite.is_some() {
                "overwrite"
            } else {
                "append"
            }
        )
    }
}

impl ExecutionPlan for IcebergCommitExec {
    fn name(&self) -> &str {
        "IcebergCommitExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children.pop().ok_or_else(|| {
            DataFusionError::Internal("IcebergCommitExec needs one input".to_string())
        })?;
        let mut exec = Self::new(
            self.catalog.clone(),
            self.ident.clone(),
            self.spec.clone(),
            input,
        );
        exec.overwrite = self.overwrite;
        Ok(Arc::new(exec))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "IcebergCommitExec has one partition, asked for {partition}"
            )));
        }
        let input = self.input.clone();
        let catalog = self.catalog.clone();
        let ident = self.ident.clone();
        let spec = self.spec.clone();
        let overwrite = self.overwrite;
        let stream = futures::stream::once(async move {
            let files = Written::collect(input, context).await?.added;
            let rows = match overwrite {
                None => commit(&catalog, &ident, &spec, files).await?,
                Some(o) => commit_overwrite(&catalog, &ident, &spec, files, o).await?,
            };
            let array: ArrayRef = Arc::new(UInt64Array::from(vec![rows]));
            Ok(RecordBatch::try_new(count_schema(), vec![array])?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            stream,
        )))
    }
}

/// Commits `files` (serialized data files) to the table in one snapshot. Conflicts (409)
/// are retried by iceberg-rust with exponential backoff after reloading and revalidating;
/// when the outcome is unknown (5xx, timeout) the table is reloaded and searched for this
/// statement's snapshot before any retry, and the files are never deleted.
pub async fn commit(
    catalog: &Arc<IcebergCatalog>,
    ident: &TableIdent,
    spec: &WriteSpec,
    files: Vec<String>,
) -> Result<u64> {
    let table_name = spec.table.clone();
    let metadata = spec.metadata.clone();
    let spec_id = metadata.default_partition_spec_id();
    let schema = metadata.current_schema().clone();
    let data_files = deserialize_files(spec, &files)?;
    let rows: u64 = data_files.iter().map(|f| f.record_count()).sum();
    if data_files.is_empty() {
        return Ok(0);
    }
    let paths: Vec<String> = data_files
        .iter()
        .map(|f| f.file_path().to_string())
        .collect();
    // Test hook: die between writing the files and committing them, as a killed statement
    // would. The table must stay at its old snapshot.
    if std::env::var_os("BASIN_TEST_KILL_BEFORE_COMMIT").is_some() {
        tracing::error!(table = %table_name, "BASIN_TEST_KILL_BEFORE_COMMIT is set: aborting before the commit");
        std::process::abort();
    }
    let commit_id = spec.write_id.clone();
    let id = ident.clone();
    let written_schema = schema.clone();
    let result = catalog
        .call(move |c| async move {
            commit_with_recovery(c, id, spec_id, written_schema, data_files, commit_id).await
        })
        .await;
    match result {
        Ok(()) => Ok(rows),
        Err(e) => {
            tracing::warn!(
                table = %table_name,
                files = ?paths,
                "statement failed before its commit; these data files are not part of the table and can be deleted"
            );
            let unknown = e.message().contains("commit state is unknown");
            Err(DataFusionError::Execution(format!(
                "cannot commit to `{table_name}`: {}; {} data file(s) written by this \
                 statement are {} (their paths are in the log)",
                error_text(&e),
                paths.len(),
                if unknown {
                    "kept because the commit may have succeeded"
                } else {
                    "not part of the table"
                }
            )))
        }
    }
}

/// Commits an `INSERT OVERWRITE` (see [`IcebergCommitExec::overwriting`]) in one snapshot.
async fn commit_overwrite(
    catalog: &Arc<IcebergCatalog>,
    ident: &TableIdent,
    spec: &WriteSpec,
    files: Vec<String>,
    overwrite: Overwrite,
) -> Result<u64> {
    let qualified = spec.table.clone();
    let metadata = spec.metadata.clone();
    let spec_id = metadata.default_partition_spec_id();
    let data_files = deserialize_files(spec, &files)?;
    let rows: u64 = data_files.iter().map(|f| f.record_count()).sum();
    let partitioned = !metadata.default_partition_spec().is_unpartitioned();
    let partitions: Vec<iceberg::spec::Struct> =
        data_files.iter().map(|f| f.partition().clone()).collect();
    let paths: Vec<String> = data_files
        .iter()
        .map(|f| f.file_path().to_string())
        .collect();
    let result = async {
        let table = catalog.load_table(ident).await?;
        let current = table.metadata().current_snapshot().map(|s| s.snapshot_id());
        if current != overwrite.read_snapshot {
            return Err(DataFusionError::Execution(format!(
                "conflict: `{qualified}` was changed by snapshot {} while this INSERT OVERWRITE \
                 ran from snapshot {}; nothing was committed, run the statement again",
                current.map_or("none".to_string(), |s| s.to_string()),
                overwrite
                    .read_snapshot
                    .map_or("none".to_string(), |s| s.to_string()),
            )));
        }
        if table.metadata().default_partition_spec_id() != spec_id
            || table.metadata().current_schema_id() != metadata.current_schema_id()
        {
            return Err(DataFusionError::Execution(format!(
                "conflict: the schema or partitioning of `{qualified}` changed while this \
                 statement ran; nothing was committed, run the statement again"
            )));
        }
        if current.is_none() {
            // Nothing to replace: an append.
            return commit(catalog, ident, spec, files.clone())
                .await
                .map(|_| ());
        }
        super::commit::replace_files(
            catalog.committer(),
            &table,
            &qualified,
            |file, file_spec| {
                if !partitioned {
                    return Ok(true);
                }
                if file_spec.spec_id() != spec_id {
                    return Err(DataFusionError::NotImplemented(format!(
                        "INSERT OVERWRITE of `{qualified}`: data file {} was written under an \
                         older partition spec ({}); overwriting partitions across specs is \
                         not supported yet",
                        file.file_path(),
                        file_spec.spec_id()
                    )));
                }
                Ok(partitions.contains(file.partition()))
            },
            data_files.clone(),
            &[
                (COMMIT_ID_PROPERTY, spec.write_id.as_str()),
                ("engine-name", "basin"),
            ],
            false,
        )
        .await?;
        Ok(())
    }
    .await;
    if let Err(e) = &result {
        tracing::warn!(
            table = %qualified,
            files = ?paths,
            error = %e,
            "statement failed before its commit; these data files are not part of the table and can be deleted"
        );
    }
    result.map(|()| rows)
}

async fn commit_with_recovery(
    catalog: Arc<dyn Catalog>,
    ident: TableIdent,
    spec_id: i32,
    written_schema: iceberg::spec::SchemaRef,
    files: Vec<DataFile>,
    commit_id: String,
) -> iceberg::Result<()> {
    let mut unknown_attempts = 0u32;
    let mut wait = Duration::from_millis(100);
    loop {
        let table = catalog.load_table(&ident).await?;
        if committed(table.metadata(), &commit_id) {
            return Ok(());
        }
        validate(table.metadata(), spec_id, &written_schema)?;
        let tx = Transaction::new(&table);
        let tx = tx
            .fast_append()
            .with_check_duplicate(false)
            .set_snapshot_properties(HashMap::from([
                (COMMIT_ID_PROPERTY.to_string(), commit_id.clone()),
                ("engine-name".to_string(), "basin".to_string()),
            ]))
            .add_data_files(files.clone())
            .apply(tx)?;
        match tx.commit(catalog.as_ref()).await {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Unexpected && unknown_attempts < 3 => {
                // The commit may or may not have happened: look before retrying.
                unknown_attempts += 1;
                tracing::warn!(table = %ident, error = %error_text(&e), "commit state unknown; reloading the table");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(60));
            }
            Err(e) if e.kind() == ErrorKind::Unexpected => {
                // Still unknown: one last look.
                if let Ok(t) = catalog.load_table(&ident).await
                    && committed(t.metadata(), &commit_id)
                {
                    return Ok(());
                }
                return Err(iceberg::Error::new(
                    ErrorKind::Unexpected,
                    format!("the commit state is unknown: {}", error_text(&e)),
                ));
            }
            Err(e) => return Err(e),
        }
    }
}

fn committed(metadata: &TableMetadata, commit_id: &str) -> bool {
    metadata.snapshots().any(|s| {
        s.summary()
            .additional_properties
            .get(COMMIT_ID_PROPERTY)
            .is_some_and(|v| v == commit_id)
    })
}

/// The table may have changed since the files were written: they must still fit.
fn validate(
    metadata: &TableMetadata,
    spec_id: i32,
    written: &iceberg::spec::Schema,
) -> iceberg::Result<()> {
    if metadata.default_partition_spec_id() != spec_id {
        return Err(iceberg::Error::new(
            ErrorKind::DataInvalid,
            "the table's partitioning changed while the statement ran; run it again",
        ));
    }
    let current = metadata.current_schema();
    for field in written.as_struct().fields() {
        match current.field_by_id(field.id) {
            Some(f) if f.field_type == field.field_type => {}
            _ => {
                return Err(iceberg::Error::new(
                    ErrorKind::DataInvalid,
                    format!(
                        "column `{}` changed while the statement ran; run it again",
                        field.name
                    ),
                ));
            }
        }
    }
    Ok(())
}
