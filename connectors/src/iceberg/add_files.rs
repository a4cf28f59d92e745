//! `add_files`: existing Parquet files registered in an Iceberg table — checked first, file
//! by file, for what Trino's and Spark's `add_files` leave to luck.
//!
//! `ALTER TABLE t EXECUTE add_files(location => 's3://b/import/', recursive_directory =>
//! 'true', dry_run => true)` (or `CALL system.add_files(table => 't', location => …)`):
//! every Parquet file at the location (one file, or a folder; names starting with `_` or `.`
//! skipped, as Hive and Spark write them) is read by its footer only, and accepted when
//! - each table column it has is of the column's type (or one Iceberg promotes to it: int →
//!   long, float → double, a decimal of the same scale and no more digits), by field id when
//!   the file has them (and then each id must name the same column), else by name;
//! - each required (NOT NULL) column is in the file and holds no null: declared REQUIRED in
//!   the file, or a null count of 0 in every row group's statistics (a file that does not say
//!   is rejected, not trusted);
//! - its rows belong to one partition of the table's spec: each partition field's value from
//!   the source column's exact statistics (the transform of the least and the greatest value
//!   agree) and, for identity fields, from a `name=value` folder in its path; where both say,
//!   they agree;
//! - it is not in the table already: not the same path as a live data file, and not the same
//!   content (same size, rows and SHA-256) as a live file or another file of the same call.
//!
//! A rejected file is reported with its reason and the others still land: all accepted files
//! in one `append` snapshot, or nothing (a concurrent commit fails the call, changing
//! nothing). `dry_run => true` reports the same outcomes (`would add`) and commits nothing.
//! A table without `schema.name-mapping.default` gets one, built from its schema, in the same
//! commit: files without field ids are read through it (by name), not by column position.
//!
//! The files stay where they are. Files outside the table's own location are never deleted by
//! Basin's `expire_snapshots` (nor listed by `remove_orphan_files`, which looks only under the
//! table's location), so a later `DELETE` or `optimize` followed by expiry leaves the
//! originals alone.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use futures::StreamExt;
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum, Literal, MappedField,
    NameMapping, NestedFieldRef, PartitionSpec, PrimitiveType, Schema, Struct, Transform, Type,
};
use iceberg::table::Table;
use iceberg::transform::create_transform_function;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetObjectReader};
use parquet::basic::Repetition;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::statistics::Statistics;
use sha2::{Digest, Sha256};

use super::catalog::error_text;
use super::commit::iceberg_error;
use super::storage::BasinStorage;

/// Footers read at a time.
const FOOTERS_AT_ONCE: usize = 16;
/// The table property naming files without field ids by column name.
const NAME_MAPPING: &str = "schema.name-mapping.default";

/// `recursive_directory`: Trino's argument, same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Recursive {
    /// Files in sub-folders too (Hive-style partition folders need this).
    Yes,
    /// Only the folder's own files.
    No,
    /// The default: a sub-folder with files fails the call (they might be meant or not).
    Fail,
}

impl Recursive {
    pub fn parse(value: &str) -> Result<Self> {
        match value.to_ascii_lowercase().as_str() {
            "true" => Ok(Self::Yes),
            "false" => Ok(Self::No),
            "fail" => Ok(Self::Fail),
            other => Err(DataFusionError::Plan(format!(
                "add_files: recursive_directory must be 'true', 'false' or 'fail', not `{other}`"
            ))),
        }
    }
}

/// The rows `add_files` returns: one per file found.
pub fn schema() -> SchemaRef {
    Arc::new(ArrowSchema::new(vec![
        Field::new("file_path", DataType::Utf8, false),
        Field::new("outcome", DataType::Utf8, false),
        Field::new("record_count", DataType::Int64, true),
        Field::new("reason", DataType::Utf8, true),
    ]))
}

/// What became of one file.
struct Outcome {
    path: String,
    records: Option<u64>,
    /// The file to add, or why not.
    result: std::result::Result<Accepted, String>,
}

struct Accepted {
    file: DataFile,
    has_field_ids: bool,
    size: u64,
    /// Where it is read from, for a content comparison.
    store: Arc<dyn ObjectStore>,
    key: Path,
}

/// Runs `add_files` on `table` (as loaded): checks every file under `location`, then (unless
/// `dry_run`) commits the accepted ones in one snapshot. `sandbox`: the locations the
/// session may read (each file is checked), `None` when every location is.
pub(crate) async fn add_files(
    committer: &super::commit::Committer,
    table: Table,
    qualified: &str,
    location: &str,
    recursive: Recursive,
    dry_run: bool,
    sandbox: Option<&basin_core::sandbox::Sandbox>,
) -> Result<RecordBatch> {
    let metadata = table.metadata();
    let schema = metadata.current_schema().clone();
    let spec = metadata.default_partition_spec().clone();
    let storage = BasinStorage::new(table.file_io().config().props().clone());
    let found = list_files(&storage, location, recursive).await?;
    let live = live_files(&table, &storage).await?;

    let checks: Vec<_> = found
        .into_iter()
        .map(|(path, meta, store)| {
            let schema = schema.clone();
            let spec = spec.clone();
            async move {
                if let Some(sandbox) = sandbox
                    && let Err(why) = sandbox.check("add_files", &path)
                {
                    return Outcome {
                        path,
                        records: None,
                        result: Err(format!(
                            "outside the locations this session may read: {why}"
                        )),
                    };
                }
                check_file(store, meta, path, &schema, &spec).await
            }
        })
        .collect();
    let checked: Vec<Outcome> = futures::stream::iter(checks)
        .buffered(FOOTERS_AT_ONCE)
        .collect()
        .await;

    // Duplicates: by place, then by content among files of the same size and rows (live
    // files, and the files of this call accepted before).
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(checked.len());
    for mut outcome in checked {
        if let Ok(accepted) = &outcome.result {
            let shape = (accepted.size, accepted.file.record_count());
            if let Some(other) = live.by_place(&storage, &outcome.path) {
                outcome.result = Err(format!("already in the table (as `{other}`)"));
            } else {
                let mut same_shape: Vec<(String, Arc<dyn ObjectStore>, Path)> = Vec::new();
                for other in live.shapes.get(&shape).into_iter().flatten() {
                    let (store, key) = storage.resolve(other).map_err(iceberg_error)?;
                    same_shape.push((other.clone(), store, key));
                }
                for earlier in &outcomes {
                    if let Ok(a) = &earlier.result
                        && (a.size, a.file.record_count()) == shape
                    {
                        same_shape.push((earlier.path.clone(), a.store.clone(), a.key.clone()));
                    }
                }
                if !same_shape.is_empty() {
                    let mine = content_hash(&accepted.store, &accepted.key).await?;
                    for (other, store, key) in same_shape {
                        if content_hash(&store, &key).await? == mine {
                            outcome.result = Err(format!("same content as `{other}`"));
                            break;
                        }
                    }
                }
            }
        }
        outcomes.push(outcome);
    }

    let accepted: Vec<&Accepted> = outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().ok())
        .collect();
    if !dry_run && !accepted.is_empty() {
        let mut updates = Vec::new();
        if accepted.iter().any(|a| !a.has_field_ids)
            && !metadata.properties().contains_key(NAME_MAPPING)
        {
            let mapping = serde_json::to_string(&name_mapping(&schema)).map_err(|e| {
                DataFusionError::Internal(format!("cannot write the name mapping: {e}"))
            })?;
            updates.push(iceberg::TableUpdate::SetProperties {
                updates: HashMap::from([(NAME_MAPPING.to_string(), mapping)]),
            });
        }
        let files: Vec<DataFile> = accepted.iter().map(|a| a.file.clone()).collect();
        let count = files.len().to_string();
        super::commit::append_files(
            committer,
            &table,
            qualified,
            files,
            &[("basin.added-existing-files", count.as_str())],
            updates,
        )
        .await?;
    }

    let added = if dry_run { "would add" } else { "added" };
    let paths: ArrayRef = Arc::new(StringArray::from_iter_values(
        outcomes.iter().map(|o| o.path.as_str()),
    ));
    let results: ArrayRef =
        Arc::new(StringArray::from_iter_values(outcomes.iter().map(
            |o| match o.result {
                Ok(_) => added,
                Err(_) => "rejected",
            },
        )));
    let records: ArrayRef = Arc::new(Int64Array::from_iter(
        outcomes.iter().map(|o| o.records.map(|n| n as i64)),
    ));
    let reasons: ArrayRef = Arc::new(StringArray::from_iter(
        outcomes
            .iter()
            .map(|o| o.result.as_ref().err().map(String::as_str)),
    ));
    Ok(RecordBatch::try_new(
        self::schema(),
        vec![paths, results, records, reasons],
    )?)
}

/// The files at `location` (one file, or a folder's), each with its full location, in path
/// order.
async fn list_files(
    storage: &BasinStorage,
    location: &str,
    recursive: Recursive,
) -> Result<Vec<(String, ObjectMeta, Arc<dyn ObjectStore>)>> {
    let cannot = |e: &dyn std::fmt::Display| {
        DataFusionError::Execution(format!("add_files: cannot read `{location}`: {e}"))
    };
    let (store, prefix) = storage
        .resolve(location)
        .map_err(|e| cannot(&error_text(&e)))?;
    if let Ok(meta) = store.head(&prefix).await {
        return Ok(vec![(location.to_string(), meta, store)]);
    }
    let base = location.trim_end_matches('/');
    let mut files = Vec::new();
    let mut nested = None;
    let mut listing = store.list(Some(&prefix));
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(|e| cannot(&e))?;
        let Some(parts) = meta.location.prefix_match(&prefix) else {
            continue;
        };
        let parts: Vec<String> = parts.map(|p| p.as_ref().to_string()).collect();
        if parts
            .iter()
            .any(|p| p.starts_with('_') || p.starts_with('.'))
        {
            continue;
        }
        if parts.len() > 1 {
            match recursive {
                Recursive::Yes => {}
                Recursive::No => continue,
                Recursive::Fail => {
                    nested.get_or_insert_with(|| parts.join("/"));
                    continue;
                }
            }
        }
        files.push((format!("{base}/{}", parts.join("/")), meta, store.clone()));
    }
    if let Some(example) = nested {
        return Err(DataFusionError::Plan(format!(
            "add_files: `{location}` has files in sub-folders (`{example}`); give \
             recursive_directory => 'true' to add them too (Hive-style partition folders) or \
             'false' to add only the folder's own files"
        )));
    }
    if files.is_empty() {
        return Err(DataFusionError::Plan(format!(
            "add_files: no files at `{location}`"
        )));
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files)
}

/// The table's live data files: where each is, and which have a given size and row count.
struct LiveFiles {
    places: HashMap<(String, String), String>,
    shapes: HashMap<(u64, u64), Vec<String>>,
}

impl LiveFiles {
    fn by_place(&self, storage: &BasinStorage, path: &str) -> Option<&String> {
        let places = super::maintenance::place(storage, path).ok()?;
        places.iter().find_map(|p| self.places.get(p))
    }
}

async fn live_files(table: &Table, storage: &BasinStorage) -> Result<LiveFiles> {
    let mut live = LiveFiles {
        places: HashMap::new(),
        shapes: HashMap::new(),
    };
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Ok(live);
    };
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(iceberg_error)?;
    for manifest in list.entries() {
        let loaded = manifest
            .load_manifest(table.file_io())
            .await
            .map_err(iceberg_error)?;
        for entry in loaded.entries() {
            if !entry.is_alive() || entry.content_type() != DataContentType::Data {
                continue;
            }
            let file = &entry.data_file;
            let path = file.file_path().to_string();
            for place in super::maintenance::place(storage, &path)? {
                live.places.insert(place, path.clone());
            }
            live.shapes
                .entry((file.file_size_in_bytes(), file.record_count()))
                .or_default()
                .push(path);
        }
    }
    Ok(live)
}

async fn content_hash(store: &Arc<dyn ObjectStore>, key: &Path) -> Result<[u8; 32]> {
    let read = |e: &dyn std::fmt::Display| {
        DataFusionError::Execution(format!("add_files: cannot read `{key}`: {e}"))
    };
    let mut stream = store.get(key).await.map_err(|e| read(&e))?.into_stream();
    let mut hasher = Sha256::new();
    while let Some(chunk) = stream.next().await {
        hasher.update(chunk.map_err(|e| read(&e))?);
    }
    Ok(hasher.finalize().into())
}

/// One file's checks (see the module documentation).
async fn check_file(
    store: Arc<dyn ObjectStore>,
    meta: ObjectMeta,
    path: String,
    schema: &Schema,
    spec: &PartitionSpec,
) -> Outcome {
    let mut reader =
        ParquetObjectReader::new(store.clone(), meta.location.clone()).with_file_size(meta.size);
    let footer = match reader.get_metadata(None).await {
        Ok(footer) => footer,
        Err(e) => {
            return Outcome {
                path,
                records: None,
                result: Err(format!("not a Parquet file Basin can read: {e}")),
            };
        }
    };
    let records = footer.file_metadata().num_rows().max(0) as u64;
    let result =
        data_file(&footer, &path, meta.size, schema, spec).map(|(file, has_field_ids)| Accepted {
            file,
            has_field_ids,
            size: meta.size,
            store,
            key: meta.location,
        });
    Outcome {
        path,
        records: Some(records),
        result,
    }
}

/// What a column of the file says about its values, over all row groups.
#[derive(Default)]
struct ColumnStats {
    size: u64,
    values: u64,
    /// `None` when a row group does not say.
    nulls: Option<u64>,
    /// Exact least and greatest values (the file's metrics).
    lower: Option<Datum>,
    upper: Option<Datum>,
    /// Bounds, exact or not (writers shorten long strings): no value is outside them.
    low: Option<Datum>,
    high: Option<Datum>,
}

/// The data file entry of a Parquet file for `schema` and `spec`, and whether the file has
/// field ids; or why it does not belong in the table.
fn data_file(
    footer: &ParquetMetaData,
    path: &str,
    size: u64,
    schema: &Schema,
    spec: &PartitionSpec,
) -> std::result::Result<(DataFile, bool), String> {
    let file_metadata = footer.file_metadata();
    let descr = file_metadata.schema_descr();
    let arrow = parquet::arrow::parquet_to_arrow_schema(descr, file_metadata.key_value_metadata())
        .map_err(|e| format!("its schema has no Arrow form: {e}"))?;
    let field_id = |f: &Field| -> Option<i32> {
        f.metadata()
            .get("PARQUET:field_id")
            .and_then(|v| v.parse().ok())
    };
    let has_field_ids = arrow
        .fields()
        .first()
        .is_some_and(|f| field_id(f).is_some());
    if has_field_ids && arrow.fields().iter().any(|f| field_id(f).is_none()) {
        return Err("some of its columns have field ids and others not".to_string());
    }
    let records = file_metadata.num_rows().max(0) as u64;
    let mut stats: HashMap<i32, ColumnStats> = HashMap::new();
    for table_field in schema.as_struct().fields() {
        let found = arrow.fields().iter().position(|f| {
            if has_field_ids {
                field_id(f) == Some(table_field.id)
            } else {
                f.name() == &table_field.name
            }
        });
        let Some(index) = found else {
            if table_field.required {
                return Err(format!(
                    "required column `{}` is not in the file",
                    table_field.name
                ));
            }
            continue;
        };
        let file_field = &arrow.fields()[index];
        if file_field.name() != &table_field.name {
            return Err(format!(
                "its column `{}` carries field id {}, which is column `{}` in the table",
                file_field.name(),
                table_field.id,
                table_field.name
            ));
        }
        let Type::Primitive(table_type) = table_field.field_type.as_ref() else {
            return Err(format!(
                "column `{}` is nested ({}); add_files checks columns of primitive types only",
                table_field.name, table_field.field_type
            ));
        };
        let file_type = file_type(file_field.data_type())
            .map_err(|why| format!("column `{}`: {why}", table_field.name))?;
        if !compatible(&file_type, table_type) {
            return Err(format!(
                "column `{}` is {file_type} in the file, {table_type} in the table",
                table_field.name
            ));
        }
        // The column's leaf (a primitive column has exactly one).
        let Some(leaf) = (0..descr.num_columns())
            .find(|i| descr.column(*i).path().parts().first() == Some(file_field.name()))
        else {
            return Err(format!(
                "column `{}` has no values in the file",
                table_field.name
            ));
        };
        let column = column_stats(footer, leaf, table_type);
        if table_field.required {
            let declared = descr.column(leaf).self_type().get_basic_info().repetition()
                == Repetition::REQUIRED;
            match column.nulls {
                _ if declared => {}
                Some(0) => {}
                Some(n) => {
                    return Err(format!(
                        "required column `{}` has {n} nulls",
                        table_field.name
                    ));
                }
                None => {
                    return Err(format!(
                        "required column `{}` may hold nulls: the file's statistics do not \
                         count them",
                        table_field.name
                    ));
                }
            }
        }
        stats.insert(table_field.id, column);
    }
    let partition = partition_of(path, records, schema, spec, &stats)?;

    let mut builder = DataFileBuilder::default();
    builder
        .content(DataContentType::Data)
        .file_path(path.to_string())
        .file_format(DataFileFormat::Parquet)
        .partition(partition)
        .partition_spec_id(spec.spec_id())
        .record_count(records)
        .file_size_in_bytes(size)
        .column_sizes(stats.iter().map(|(id, s)| (*id, s.size)).collect())
        .value_counts(stats.iter().map(|(id, s)| (*id, s.values)).collect())
        .null_value_counts(
            stats
                .iter()
                .filter_map(|(id, s)| s.nulls.map(|n| (*id, n)))
                .collect(),
        )
        .lower_bounds(
            stats
                .iter()
                .filter_map(|(id, s)| s.lower.clone().map(|d| (*id, d)))
                .collect(),
        )
        .upper_bounds(
            stats
                .iter()
                .filter_map(|(id, s)| s.upper.clone().map(|d| (*id, d)))
                .collect(),
        );
    let offsets: Vec<i64> = footer
        .row_groups()
        .iter()
        .filter_map(|rg| rg.file_offset())
        .collect();
    if !offsets.is_empty() && offsets.windows(2).all(|w| w[0] < w[1]) {
        builder.split_offsets(Some(offsets));
    }
    let file = builder
        .build()
        .map_err(|e| format!("cannot describe it as an Iceberg data file: {e}"))?;
    Ok((file, has_field_ids))
}

/// The Iceberg type of a file column's Arrow type, or why it has none Basin reads as such.
fn file_type(arrow: &DataType) -> std::result::Result<PrimitiveType, String> {
    if matches!(
        arrow,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64
    ) {
        return Err(format!(
            "{arrow} (unsigned) has no Iceberg type; write it as a signed integer"
        ));
    }
    match iceberg::arrow::arrow_type_to_type(arrow) {
        Ok(Type::Primitive(p)) => Ok(p),
        Ok(other) => Err(format!("{other} is nested; the table's column is not")),
        Err(e) => Err(format!("{arrow} has no Iceberg type ({})", error_text(&e))),
    }
}

/// Whether values of `file` read as `table` (the same type or an Iceberg promotion).
fn compatible(file: &PrimitiveType, table: &PrimitiveType) -> bool {
    match (file, table) {
        (a, b) if a == b => true,
        (PrimitiveType::Int, PrimitiveType::Long) => true,
        (PrimitiveType::Float, PrimitiveType::Double) => true,
        (
            PrimitiveType::Decimal {
                precision: p1,
                scale: s1,
            },
            PrimitiveType::Decimal {
                precision: p2,
                scale: s2,
            },
        ) => s1 == s2 && p1 <= p2,
        _ => false,
    }
}

/// Sizes, counts and exact bounds of leaf column `leaf` over every row group, its bounds as
/// values of the table's type `ty`.
fn column_stats(footer: &ParquetMetaData, leaf: usize, ty: &PrimitiveType) -> ColumnStats {
    let mut out = ColumnStats {
        nulls: Some(0),
        ..ColumnStats::default()
    };
    let (mut exact_known, mut bounds_known) = (true, true);
    for row_group in footer.row_groups() {
        let chunk = row_group.column(leaf);
        out.size += chunk.compressed_size().max(0) as u64;
        out.values += chunk.num_values().max(0) as u64;
        let Some(stats) = chunk.statistics() else {
            out.nulls = None;
            (exact_known, bounds_known) = (false, false);
            continue;
        };
        out.nulls = match (out.nulls, stats.null_count_opt()) {
            (Some(total), Some(n)) => Some(total + n),
            _ => None,
        };
        if stats.null_count_opt() == Some(chunk.num_values().max(0) as u64) {
            continue; // all nulls: no bounds, and none needed
        }
        let widen = |lo: &mut Option<Datum>, hi: &mut Option<Datum>, a: Datum, b: Datum| {
            if lo.as_ref().is_none_or(|l| a < *l) {
                *lo = Some(a);
            }
            if hi.as_ref().is_none_or(|h| b > *h) {
                *hi = Some(b);
            }
        };
        match (bound(stats, ty, true, true), bound(stats, ty, false, true)) {
            (Some(a), Some(b)) => widen(&mut out.lower, &mut out.upper, a, b),
            _ => exact_known = false,
        }
        match (
            bound(stats, ty, true, false),
            bound(stats, ty, false, false),
        ) {
            (Some(a), Some(b)) => widen(&mut out.low, &mut out.high, a, b),
            _ => bounds_known = false,
        }
    }
    if !exact_known {
        out.lower = None;
        out.upper = None;
    }
    if !bounds_known {
        out.low = None;
        out.high = None;
    }
    out
}

/// A row group's least (`min`) or greatest value, or (unless `exact`) a bound of it, as a
/// value of the table's type.
fn bound(stats: &Statistics, ty: &PrimitiveType, min: bool, exact: bool) -> Option<Datum> {
    let is_exact = if min {
        stats.min_is_exact()
    } else {
        stats.max_is_exact()
    };
    if exact && !is_exact {
        return None;
    }
    macro_rules! pick {
        ($s:expr) => {
            if min { $s.min_opt() } else { $s.max_opt() }
        };
    }
    match (stats, ty) {
        (Statistics::Boolean(s), PrimitiveType::Boolean) => pick!(s).map(|v| Datum::bool(*v)),
        (Statistics::Int32(s), PrimitiveType::Int) => pick!(s).map(|v| Datum::int(*v)),
        (Statistics::Int32(s), PrimitiveType::Long) => pick!(s).map(|v| Datum::long(*v)),
        (Statistics::Int32(s), PrimitiveType::Date) => pick!(s).map(|v| Datum::date(*v)),
        (Statistics::Int64(s), PrimitiveType::Long) => pick!(s).map(|v| Datum::long(*v)),
        (Statistics::Int64(s), PrimitiveType::Timestamp) => {
            pick!(s).map(|v| Datum::timestamp_micros(*v))
        }
        (Statistics::Int64(s), PrimitiveType::Timestamptz) => {
            pick!(s).map(|v| Datum::timestamptz_micros(*v))
        }
        (Statistics::Float(s), PrimitiveType::Float) => {
            pick!(s).filter(|v| !v.is_nan()).map(|v| Datum::float(*v))
        }
        (Statistics::Float(s), PrimitiveType::Double) => pick!(s)
            .filter(|v| !v.is_nan())
            .map(|v| Datum::double(f64::from(*v))),
        (Statistics::Double(s), PrimitiveType::Double) => {
            pick!(s).filter(|v| !v.is_nan()).map(|v| Datum::double(*v))
        }
        (Statistics::ByteArray(s), PrimitiveType::String) => pick!(s)
            .and_then(|v| std::str::from_utf8(v.data()).ok())
            .map(Datum::string),
        _ => None,
    }
}

/// The partition of a file's rows under `spec`, or why it has none.
fn partition_of(
    path: &str,
    records: u64,
    schema: &Schema,
    spec: &PartitionSpec,
    stats: &HashMap<i32, ColumnStats>,
) -> std::result::Result<Struct, String> {
    let folders: HashMap<String, String> = path
        .split('/')
        .filter_map(|part| part.split_once('='))
        .map(|(name, value)| {
            (
                percent_encoding::percent_decode_str(name)
                    .decode_utf8_lossy()
                    .into_owned(),
                percent_encoding::percent_decode_str(value)
                    .decode_utf8_lossy()
                    .into_owned(),
            )
        })
        .collect();
    let mut values = Vec::with_capacity(spec.fields().len());
    for field in spec.fields() {
        let source: &NestedFieldRef = schema.field_by_id(field.source_id).ok_or_else(|| {
            format!(
                "partition field `{}` reads column id {}, which the table's schema does not have",
                field.name, field.source_id
            )
        })?;
        let Type::Primitive(source_type) = source.field_type.as_ref() else {
            return Err(format!(
                "partition field `{}` is over a nested column",
                field.name
            ));
        };
        let transform = create_transform_function(&field.transform)
            .map_err(|e| format!("partition field `{}`: {}", field.name, error_text(&e)))?;
        let apply = |d: &Datum| {
            transform
                .transform_literal_result(d)
                .map_err(|e| format!("partition field `{}`: {}", field.name, error_text(&e)))
        };
        // What the column's statistics say: Some(None) for all nulls. A column the file
        // lacks (Hive-style files leave partition columns to their folders) says nothing:
        // readers fill an identity partition's column from the partition value.
        let from_stats: Option<Option<Datum>> = match stats.get(&source.id) {
            None => None,
            Some(s) => match (s.nulls, &s.low, &s.high) {
                (Some(n), _, _) if n == records => Some(None),
                (Some(n), _, _) if n > 0 => {
                    return Err(format!(
                        "its rows belong to several partitions: `{}` is null in {n} rows and \
                         not in others",
                        source.name
                    ));
                }
                // Bounds that meet hold one value; an order-preserving transform that
                // gives both bounds the same value gives every row that value.
                (_, Some(lo), Some(hi)) if lo == hi || field.transform.preserves_order() => {
                    let (a, b) = (apply(lo)?, apply(hi)?);
                    if a != b {
                        return Err(format!(
                            "its rows belong to several partitions of `{}`: `{}` goes from {} \
                             to {}",
                            field.name,
                            source.name,
                            lo.to_human_string(),
                            hi.to_human_string()
                        ));
                    }
                    Some(Some(a))
                }
                // The column is in the file, but nothing shows its rows share a value.
                _ => {
                    return Err(format!(
                        "its partition `{}` cannot be told: the statistics of `{}` do not \
                         show that every row has the same value",
                        field.name, source.name
                    ));
                }
            },
        };
        let from_path: Option<Option<Datum>> = if field.transform == Transform::Identity {
            folders
                .get(&field.name)
                .or_else(|| folders.get(&source.name))
                .map(|text| parse_value(text, source_type).map(Some))
                .transpose()?
                .map(|d| d.flatten())
        } else {
            None
        };
        let value = match (from_stats, from_path) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "its folder says `{}` is {}, its statistics say {}",
                    field.name,
                    shown(&b),
                    shown(&a)
                ));
            }
            (Some(a), _) => a,
            (None, Some(b)) => b,
            // Statistics say nothing only of a column the file lacks; without a folder
            // either, every row reads null.
            (None, None) => None,
        };
        values.push(value.map(Literal::from));
    }
    Ok(Struct::from_iter(values))
}

fn shown(value: &Option<Datum>) -> String {
    value
        .as_ref()
        .map(Datum::to_human_string)
        .unwrap_or_else(|| "null".to_string())
}

/// A Hive-style folder's value as a value of `ty` (`__HIVE_DEFAULT_PARTITION__`: null).
fn parse_value(text: &str, ty: &PrimitiveType) -> std::result::Result<Option<Datum>, String> {
    if text == "__HIVE_DEFAULT_PARTITION__" {
        return Ok(None);
    }
    let bad = || format!("its folder value `{text}` is not a {ty}");
    let datum = match ty {
        PrimitiveType::String => Datum::string(text),
        PrimitiveType::Int => Datum::int(text.parse::<i32>().map_err(|_| bad())?),
        PrimitiveType::Long => Datum::long(text.parse::<i64>().map_err(|_| bad())?),
        PrimitiveType::Boolean => Datum::bool_from_str(text).map_err(|_| bad())?,
        PrimitiveType::Date => {
            let date = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").map_err(|_| bad())?;
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).ok_or_else(bad)?;
            Datum::date((date - epoch).num_days() as i32)
        }
        _ => {
            return Err(format!(
                "its folder value `{text}` cannot be read as a {ty} (add_files reads string, \
                 int, long, boolean and date folder values)"
            ));
        }
    };
    Ok(Some(datum))
}

/// The name mapping of `schema`: every field by its own name (what Trino and Spark write when
/// they import files without field ids).
fn name_mapping(schema: &Schema) -> NameMapping {
    fn fields_of(ty: &Type) -> Vec<MappedField> {
        match ty {
            Type::Primitive(_) => Vec::new(),
            Type::Struct(s) => s.fields().iter().map(field).collect(),
            Type::List(l) => vec![field(&l.element_field)],
            Type::Map(m) => vec![field(&m.key_field), field(&m.value_field)],
        }
    }
    fn field(f: &NestedFieldRef) -> MappedField {
        MappedField::new(Some(f.id), vec![f.name.clone()], fields_of(&f.field_type))
    }
    NameMapping::new(schema.as_struct().fields().iter().map(field).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotions() {
        assert!(compatible(&PrimitiveType::Int, &PrimitiveType::Long));
        assert!(!compatible(&PrimitiveType::Long, &PrimitiveType::Int));
        assert!(compatible(&PrimitiveType::Float, &PrimitiveType::Double));
        let dec = |precision, scale| PrimitiveType::Decimal { precision, scale };
        assert!(compatible(&dec(10, 2), &dec(12, 2)));
        assert!(!compatible(&dec(12, 2), &dec(10, 2)));
        assert!(!compatible(&dec(10, 2), &dec(12, 3)));
        assert!(!compatible(&PrimitiveType::String, &PrimitiveType::Binary));
    }

    #[test]
    fn folder_values() {
        assert_eq!(
            parse_value("2026-01-02", &PrimitiveType::Date).unwrap(),
            Some(Datum::date(20455))
        );
        assert_eq!(
            parse_value("__HIVE_DEFAULT_PARTITION__", &PrimitiveType::Int).unwrap(),
            None
        );
        assert!(parse_value("x", &PrimitiveType::Int).is_err());
    }

    #[test]
    fn mapping_names_every_field() {
        let schema = Schema::builder()
            .with_fields(vec![
                iceberg::spec::NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long))
                    .into(),
                iceberg::spec::NestedField::optional(
                    2,
                    "name",
                    Type::Primitive(PrimitiveType::String),
                )
                .into(),
            ])
            .build()
            .unwrap();
        let json = serde_json::to_string(&name_mapping(&schema)).unwrap();
        assert_eq!(
            json,
            r#"[{"field-id":1,"names":["id"]},{"field-id":2,"names":["name"]}]"#
        );
    }
}
