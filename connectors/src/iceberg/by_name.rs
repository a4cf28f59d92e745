//! Reading Iceberg data files with DataFusion's own Parquet reader.
//!
//! iceberg-rust's `ArrowReader` matches columns by field id and always evaluates the scan
//! predicate while decoding (a Parquet `RowFilter`): the predicate's columns are decoded
//! first, then the others for the selected rows only. For the scattered selections of
//! analytical filters that is slower than decoding everything and filtering once (TPC-H SF1
//! in DataFusion: Q12 0.140 → 0.233 s, Q19 0.158 → 0.206 s with `pushdown_filters`), and the
//! reader has neither DataFusion's page-index pruning nor its Parquet options.
//!
//! When matching by name is provably the same as matching by field id, a scan reads its files
//! through DataFusion's `ParquetSource` instead: row groups and pages pruned with the pushed
//! filters, rows filtered once by the `FilterExec` above. Filters pushed into the physical
//! plan prune too, among them a hash join's dynamic filter of its build side's keys, as it
//! stands when each file is opened (`IcebergScanExec::handle_child_pushdown_result`). That
//! holds when
//! - no planned file has delete files (they need iceberg-rust's delete handling), and every
//!   file is Parquet;
//! - the table's `schema.name-mapping.default`, if any (for files without field ids), maps
//!   each such column's own name, and only it, to its field id, and the column is not the
//!   source of an identity partition (a file added without ids may leave it out);
//! - every column read or filtered is of a primitive type without an `initial-default`, has a
//!   plain name (`[A-Za-z_][A-Za-z0-9_]*`, which no writer rewrites) and, across every schema
//!   in the table's history, that name always meant that field id and that id that name (no
//!   rename, no drop and re-add under the same name).
//!
//! Type promotions (int → long, float → double, wider decimals) are casts in DataFusion's
//! schema adapter; a column a file lacks reads as nulls, as the Iceberg spec says for a field
//! without default. Each file's field ids are still checked when its footer is read: a file
//! whose column carries another field id fails the query with the file's name instead of
//! returning another column's data.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use bytes::Bytes;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::config::TableParquetOptions;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfigBuilder, ParquetFileReaderFactory, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::execution_props::ExecutionProps;
use datafusion::logical_expr::utils::conjunction;
use datafusion::physical_expr::{
    PhysicalExpr, conjunction as physical_conjunction, create_physical_expr,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion_proto::bytes::Serializeable;
use futures::FutureExt;
use futures::future::BoxFuture;
use iceberg::scan::FileScanTask;
use iceberg::spec::{
    DataFileFormat, NameMapping, NestedField, Schema, TableMetadata, Transform, Type,
};
use object_store::{ObjectMeta, ObjectStore};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::{AsyncFileReader, ParquetObjectReader};
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use serde::{Deserialize, Serialize};

use super::catalog::error_text;
use super::scan::ScanSpec;
use super::storage::BasinStorage;

/// How a scan's files are read by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ByName {
    /// The field id of each column read or filtered (ordered: equal scans encode to equal
    /// bytes, which is how an executor finds an aggregate a plan repeats).
    pub fields: BTreeMap<String, i32>,
    /// The table's name mapping gives these names these ids, so a file column without a field
    /// id is taken by its name.
    pub ids_optional: bool,
}

/// How a scan's files may be read by name (see the module documentation); `None` when they
/// must go through iceberg-rust.
pub(crate) fn by_name_fields(
    metadata: &TableMetadata,
    schema: &Schema,
    columns: &[String],
    filters: &[Expr],
    tasks: &[FileScanTask],
) -> Option<ByName> {
    // Files without field ids are matched through the name mapping: by name only where it
    // maps each column's own name, and nothing else, to its field id.
    let mapping = match metadata.properties().get("schema.name-mapping.default") {
        Some(raw) => Some(serde_json::from_str::<NameMapping>(raw).ok()?),
        None => None,
    };
    if tasks
        .iter()
        .any(|t| !t.deletes.is_empty() || t.data_file_format != DataFileFormat::Parquet)
    {
        return None;
    }
    let mut names: HashSet<String> = columns.iter().cloned().collect();
    for filter in filters {
        names.extend(filter.column_refs().into_iter().map(|c| c.name.clone()));
    }
    let mut fields = BTreeMap::new();
    for name in names {
        let field = schema.field_by_name(&name)?;
        if !same_by_name(metadata, mapping.as_ref(), &name, field) {
            return None;
        }
        fields.insert(name, field.id);
    }
    Some(ByName {
        fields,
        ids_optional: mapping.is_some(),
    })
}

/// Whether reading the column `name` (`field`) by name gives what reading it by its id gives,
/// in every file the table may have (see the module documentation).
fn same_by_name(
    metadata: &TableMetadata,
    mapping: Option<&NameMapping>,
    name: &str,
    field: &NestedField,
) -> bool {
    // A top-level column (not a nested field found by its dotted name) with a plain name.
    let plain = field.name == name
        && !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain || !matches!(*field.field_type, Type::Primitive(_)) || field.initial_default.is_some()
    {
        return false;
    }
    if let Some(mapping) = mapping {
        // Files added without field ids (Hive layouts) may leave identity-partitioned
        // columns out of the file: iceberg-rust fills them in from the partition values.
        let partition_source = metadata.partition_specs_iter().any(|spec| {
            spec.fields()
                .iter()
                .any(|f| f.source_id == field.id && f.transform == Transform::Identity)
        });
        let mut entries = mapping
            .fields()
            .iter()
            .filter(|m| m.field_id() == Some(field.id) || m.names().iter().any(|n| n == name));
        let trivial = entries
            .next()
            .is_some_and(|m| m.field_id() == Some(field.id) && m.names() == [name]);
        if partition_source || !trivial || entries.next().is_some() {
            return false;
        }
    }
    metadata.schemas_iter().all(|other| {
        other.field_by_id(field.id).is_none_or(|f| f.name == name)
            && other.field_by_name(name).is_none_or(|f| f.id == field.id)
    })
}

/// The filters pushed into a scan, without table qualifiers, as DataFusion protobuf (base64)
/// for the executors; `None` when there are none or they cannot be encoded (they only prune).
pub(crate) fn encode_filters(filters: &[Expr]) -> Option<String> {
    let unqualified = filters
        .iter()
        .cloned()
        .map(datafusion::logical_expr::expr_rewriter::unnormalize_col)
        .collect::<Vec<_>>();
    let predicate = conjunction(unqualified)?;
    match predicate.to_bytes() {
        Ok(bytes) => Some(BASE64_STANDARD.encode(bytes)),
        Err(e) => {
            tracing::debug!("scan filters not encoded for pruning: {e}");
            None
        }
    }
}

/// One partition of an Iceberg scan read by DataFusion's Parquet reader.
pub(crate) fn execute(
    spec: &ScanSpec,
    by_name: &ByName,
    table_schema: &SchemaRef,
    tasks: &[FileScanTask],
    pushed: Option<Arc<dyn PhysicalExpr>>,
    context: Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let table = &spec.table;
    let storage = BasinStorage::new(spec.file_io.clone().into_iter().collect());
    let mut files = Vec::with_capacity(tasks.len());
    for task in tasks {
        let (store, path) = storage.resolve(&task.data_file_path).map_err(|e| {
            DataFusionError::Execution(format!("cannot read `{table}`: {}", error_text(&e)))
        })?;
        // The resolved path as it is (a string would be percent-encoded again).
        let mut file = PartitionedFile::new_from_meta(ObjectMeta {
            location: path,
            last_modified: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
            size: task.file_size_in_bytes,
            e_tag: None,
            version: None,
        })
        .with_extensions(Arc::new(DataFile {
            store,
            location: task.data_file_path.clone(),
        }));
        // A zero length means the whole file, as in iceberg-rust.
        if task.length != 0 && (task.start != 0 || task.length != task.file_size_in_bytes) {
            file = file.with_range(task.start as i64, (task.start + task.length) as i64);
        }
        files.push(file);
    }
    let projection: Vec<usize> = if spec.read_no_columns {
        Vec::new()
    } else {
        spec.output_fields
            .iter()
            .map(|name| table_schema.index_of(name))
            .collect::<std::result::Result<_, _>>()?
    };
    let mut options = TableParquetOptions {
        global: context.session_config().options().execution.parquet.clone(),
        ..Default::default()
    };
    // INT96 timestamps (Hive, Spark files) in the unit of the table's timestamps, as
    // iceberg-rust does: parquet-rs's nanoseconds wrap around outside 1677-2262.
    if options.global.coerce_int96.is_none() {
        let nanos = table_schema.fields().iter().any(|f| {
            matches!(
                f.data_type(),
                DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Nanosecond, _)
            )
        });
        options.global.coerce_int96 = Some(if nanos { "ns" } else { "us" }.to_string());
    }
    let mut source = ParquetSource::new(table_schema.clone())
        .with_table_parquet_options(options)
        .with_parquet_file_reader_factory(Arc::new(Files {
            by_name: Arc::new(by_name.clone()),
        }));
    // The planned filters and those pushed into the plan (over the table's columns).
    let planned = spec
        .filter
        .as_deref()
        .and_then(|f| predicate(f, table_schema, &context));
    let predicate = match (planned, pushed) {
        (Some(a), Some(b)) => Some(physical_conjunction([a, b])),
        (a, b) => a.or(b),
    };
    if let Some(predicate) = predicate {
        source = source.with_predicate(predicate);
    }
    let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(source))
        .with_file_group(FileGroup::new(files))
        .with_projection_indices(Some(projection))?
        .with_limit(spec.limit)
        .with_batch_size(Some(context.session_config().batch_size()))
        .build();
    DataSourceExec::from_data_source(config).execute(0, context)
}

/// The pruning predicate: decoded against the table's schema, or none (then nothing is pruned;
/// rows are filtered above the scan either way).
fn predicate(
    encoded: &str,
    table_schema: &SchemaRef,
    context: &TaskContext,
) -> Option<Arc<dyn datafusion::physical_expr::PhysicalExpr>> {
    let made = (|| -> Result<_> {
        let bytes = BASE64_STANDARD
            .decode(encoded)
            .map_err(|e| DataFusionError::Internal(e.to_string()))?;
        let expr = Expr::from_bytes_with_registry(&bytes, context)?;
        let schema = DFSchema::try_from(table_schema.as_ref().clone())?;
        create_physical_expr(&expr, &schema, &ExecutionProps::new())
    })();
    match made {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::debug!("scan predicate not used for pruning: {e}");
            None
        }
    }
}

/// Where a planned file lives (the `PartitionedFile`'s extension).
struct DataFile {
    store: Arc<dyn ObjectStore>,
    location: String,
}

impl std::fmt::Debug for DataFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataFile")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// Opens planned files in their stores, checking each file's field ids.
#[derive(Debug)]
struct Files {
    by_name: Arc<ByName>,
}

impl ParquetFileReaderFactory for Files {
    fn create_reader(
        &self,
        _partition_index: usize,
        file: PartitionedFile,
        metadata_size_hint: Option<usize>,
        _metrics: &ExecutionPlanMetricsSet,
    ) -> Result<Box<dyn AsyncFileReader + Send>> {
        let data_file = file
            .extensions
            .as_ref()
            .and_then(|e| e.downcast_ref::<DataFile>())
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "Iceberg data file `{}` planned without its store",
                    file.object_meta.location
                ))
            })?;
        let mut inner =
            ParquetObjectReader::new(data_file.store.clone(), file.object_meta.location.clone())
                .with_file_size(file.object_meta.size);
        if let Some(hint) = metadata_size_hint {
            inner = inner.with_footer_size_hint(hint);
        }
        Ok(Box::new(CheckedReader {
            inner,
            by_name: self.by_name.clone(),
            location: data_file.location.clone(),
        }))
    }
}

/// A Parquet file whose columns must carry the field ids the table expects.
struct CheckedReader {
    inner: ParquetObjectReader,
    by_name: Arc<ByName>,
    location: String,
}

impl AsyncFileReader for CheckedReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        self.inner.get_bytes(range)
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        self.inner.get_byte_ranges(ranges)
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let metadata = self.inner.get_metadata(options).await?;
            check_field_ids(&metadata, &self.by_name, &self.location)?;
            Ok(metadata)
        }
        .boxed()
    }
}

/// The file's columns must carry the field ids the table gives their names, and no other
/// column may carry one of those ids. Whether the file has field ids at all is decided by its
/// first column, as iceberg-rust does; a file without them is matched through the table's
/// name mapping (by name, which the plan checked is the same) or, without one, by position
/// (iceberg-rust's fallback ids 1, 2, …).
fn check_field_ids(
    metadata: &ParquetMetaData,
    by_name: &ByName,
    location: &str,
) -> parquet::errors::Result<()> {
    let columns = metadata
        .file_metadata()
        .schema_descr()
        .root_schema()
        .get_fields();
    let has_ids = columns.first().is_some_and(|c| c.get_basic_info().has_id());
    for (position, column) in columns.iter().enumerate() {
        let info = column.get_basic_info();
        let id = if has_ids {
            info.has_id().then(|| info.id())
        } else if by_name.ids_optional {
            None
        } else {
            i32::try_from(position + 1).ok()
        };
        if let Some(&want) = by_name.fields.get(info.name()) {
            if has_ids && !info.has_id() {
                return Err(ParquetError::General(format!(
                    "Iceberg data file `{location}` has field ids, but not for its column `{}`",
                    info.name()
                )));
            }
            if let Some(id) = id
                && id != want
            {
                return Err(ParquetError::General(format!(
                    "Iceberg data file `{location}`: column `{}` has field id {id}, the table's \
                     column of that name has field id {want}",
                    info.name()
                )));
            }
        }
        if let Some(id) = id
            && let Some((name, _)) = by_name.fields.iter().find(|(_, want)| **want == id)
            && name != info.name()
        {
            return Err(ParquetError::General(format!(
                "Iceberg data file `{location}`: its column `{}` has field id {id}, which the \
                 table calls `{name}`",
                info.name()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;

    use bytes::Bytes;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

    use super::{ByName, check_field_ids};

    fn file(ids: &[(&str, Option<i32>)]) -> ParquetMetaData {
        let fields: Vec<Field> = ids
            .iter()
            .map(|(name, id)| {
                let field = Field::new(*name, DataType::Int64, true);
                match id {
                    Some(id) => field.with_metadata(HashMap::from([(
                        "PARQUET:field_id".to_string(),
                        id.to_string(),
                    )])),
                    None => field,
                }
            })
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let columns = ids
            .iter()
            .map(|_| Arc::new(Int64Array::from(vec![1])) as _)
            .collect();
        let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        ParquetMetaDataReader::new()
            .parse_and_finish(&Bytes::from(out))
            .unwrap()
    }

    /// The error of a file the check refuses.
    fn refused(metadata: &ParquetMetaData, want: &ByName, location: &str) -> String {
        match check_field_ids(metadata, want, location) {
            Ok(()) => panic!("{location} should be refused"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn files_must_carry_the_field_ids_of_the_columns_read() {
        let mut want = ByName {
            fields: BTreeMap::from([("id".to_string(), 1), ("score".to_string(), 3)]),
            ids_optional: false,
        };
        // Matching ids; a column the file lacks, or one not read, is not checked.
        let ok = file(&[("id", Some(1)), ("other", Some(7))]);
        check_field_ids(&ok, &want, "f.parquet").unwrap();
        let e = refused(
            &file(&[("id", Some(1)), ("score", Some(2))]),
            &want,
            "a.parquet",
        );
        assert!(
            e.contains("a.parquet") && e.contains("`score` has field id 2") && e.contains("3"),
            "{e}"
        );
        // A wanted id under another name (a rename the metadata no longer shows).
        let e = refused(
            &file(&[("id", Some(1)), ("points", Some(3))]),
            &want,
            "c.parquet",
        );
        assert!(
            e.contains("c.parquet") && e.contains("`points`") && e.contains("calls `score`"),
            "{e}"
        );
        // Ids decided by the first column: a later column without one is refused.
        let e = refused(
            &file(&[("other", Some(7)), ("id", None)]),
            &want,
            "d.parquet",
        );
        assert!(e.contains("d.parquet") && e.contains("`id`"), "{e}");
        // No ids, no name mapping: iceberg-rust's position ids (1, 2, ...) must agree.
        let by_position = file(&[("id", None), ("x", None), ("score", None)]);
        check_field_ids(&by_position, &want, "e").unwrap();
        let e = refused(&file(&[("x", None), ("id", None)]), &want, "g.parquet");
        assert!(e.contains("g.parquet"), "{e}");
        // With a name mapping that gives these names these ids, names decide.
        want.ids_optional = true;
        check_field_ids(&file(&[("x", None), ("id", None)]), &want, "h.parquet").unwrap();
    }
}
