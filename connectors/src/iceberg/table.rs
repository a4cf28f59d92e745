//! An Iceberg table as a DataFusion table: scans are planned into file groups balanced by
//! bytes (on the scheduler), inserts become distributed writers plus one commit.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::Statistics;
use datafusion::common::stats::Precision;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use futures::TryStreamExt;
use iceberg::TableIdent;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::io::FileIOBuilder;
use iceberg::scan::FileScanTask;
use iceberg::spec::{TableMetadata, TableMetadataRef};
use iceberg::table::Table;
use iceberg_datafusion::physical_plan::convert_filters_to_predicate;
use serde::{Deserialize, Serialize};

use super::by_name::{by_name_fields, encode_filters};
use super::catalog::{IcebergCatalog, IcebergOptions, error_text};
use super::scan::{IcebergScanExec, IdentityPartitions, ScanPlanStats, ScanSpec};
use super::stats::{column_statistics, row_group_offsets};
use super::storage::BasinStorageFactory;

/// Which snapshot a query reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TableVersion {
    /// `FOR VERSION AS OF <snapshot id>`
    Snapshot(i64),
    /// `FOR VERSION AS OF '<branch or tag>'`
    Ref(String),
    /// `FOR TIMESTAMP AS OF ...`, in milliseconds since the epoch (UTC).
    TimestampMs(i64),
}

impl TableVersion {
    /// The form that travels inside a table name.
    pub fn encode(&self) -> String {
        match self {
            TableVersion::Snapshot(id) if *id < 0 => format!("n{}", id.unsigned_abs()),
            TableVersion::Snapshot(id) => format!("s{id}"),
            TableVersion::Ref(name) => format!(
                "r{}",
                name.bytes().map(|b| format!("{b:02x}")).collect::<String>()
            ),
            TableVersion::TimestampMs(ms) if *ms < 0 => format!("m{}", ms.unsigned_abs()),
            TableVersion::TimestampMs(ms) => format!("t{ms}"),
        }
    }

    pub fn decode(text: &str) -> Result<Self> {
        let bad = || DataFusionError::Plan(format!("bad table version `{text}`"));
        let (kind, value) = text.split_at_checked(1).ok_or_else(bad)?;
        match kind {
            "s" => value.parse().map(TableVersion::Snapshot).map_err(|_| bad()),
            "n" => value
                .parse::<i64>()
                .map(|v| TableVersion::Snapshot(-v))
                .map_err(|_| bad()),
            "r" => {
                let bytes = (0..value.len())
                    .step_by(2)
                    .map(|i| {
                        value
                            .get(i..i + 2)
                            .and_then(|h| u8::from_str_radix(h, 16).ok())
                    })
                    .collect::<Option<Vec<u8>>>()
                    .ok_or_else(bad)?;
                String::from_utf8(bytes)
                    .map(TableVersion::Ref)
                    .map_err(|_| bad())
            }
            "t" => value
                .parse()
                .map(TableVersion::TimestampMs)
                .map_err(|_| bad()),
            "m" => value
                .parse::<i64>()
                .map(|v| TableVersion::TimestampMs(-v))
                .map_err(|_| bad()),
            _ => Err(bad()),
        }
    }

    /// The snapshot this version names in `metadata`.
    fn resolve(&self, table: &str, metadata: &TableMetadata) -> Result<i64> {
        match self {
            TableVersion::Snapshot(id) => metadata
                .snapshot_by_id(*id)
                .map(|s| s.snapshot_id())
                .ok_or_else(|| {
                    DataFusionError::Plan(format!(
                        "table `{table}` has no snapshot {id}; \"{}$snapshots\" lists them",
                        table.rsplit('.').next().unwrap_or(table)
                    ))
                }),
            TableVersion::Ref(name) => metadata
                .snapshot_for_ref(name)
                .map(|s| s.snapshot_id())
                .ok_or_else(|| {
                    DataFusionError::Plan(format!(
                        "table `{table}` has no branch or tag `{name}`; \"{}$refs\" lists them",
                        table.rsplit('.').next().unwrap_or(table)
                    ))
                }),
            TableVersion::TimestampMs(ms) => {
                // The snapshot that was current at that time: the last entry of the
                // snapshot log at or before it.
                metadata
                    .history()
                    .iter()
                    .filter(|entry| entry.timestamp_ms <= *ms)
                    .max_by_key(|entry| entry.timestamp_ms)
                    .map(|entry| entry.snapshot_id)
                    .ok_or_else(|| {
                        let when = chrono::DateTime::from_timestamp_millis(*ms)
                            .map(|t| t.to_rfc3339())
                            .unwrap_or_else(|| ms.to_string());
                        DataFusionError::Plan(format!(
                            "table `{table}` has no snapshot at or before {when}"
                        ))
                    })
            }
        }
    }
}

/// What an Iceberg table provider carries between processes: enough to rebuild the table
/// without a catalog (the scheduler plans scans from it; executors write with it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IcebergTableSpec {
    pub catalog: String,
    pub namespace: Vec<String>,
    pub name: String,
    pub metadata_location: Option<String>,
    pub metadata: TableMetadataRef,
    /// FileIO properties (may hold storage credentials; never displayed).
    pub file_io: BTreeMap<String, String>,
    /// The snapshot read (`None`: the table has no snapshot yet).
    pub snapshot_id: Option<i64>,
    /// True when the query asked for an older version (the table is then read-only).
    pub time_travel: bool,
    pub options: IcebergOptions,
    /// The table read with each row's identity ([`ROW_FILE_COLUMN`], [`ROW_POS_COLUMN`]):
    /// the target of a `MERGE`.
    #[serde(default)]
    pub row_identity: bool,
}

/// With `row_identity`: the data file a row was read from…
pub const ROW_FILE_COLUMN: &str = "__basin_file";
/// …and its ordinal among the rows read from that file (deletes applied: stable for one
/// snapshot, as the same file with the same delete files reads in the same order).
pub const ROW_POS_COLUMN: &str = "__basin_pos";

impl IcebergTableSpec {
    pub fn qualified_name(&self) -> String {
        format!(
            "{}.{}.{}",
            self.catalog,
            self.namespace.join("."),
            self.name
        )
    }

    pub fn ident(&self) -> Result<TableIdent> {
        TableIdent::from_strs(self.namespace.iter().chain(std::iter::once(&self.name)))
            .map_err(|e| DataFusionError::Plan(format!("bad table name: {e}")))
    }

    /// The Iceberg schema of the version read: the snapshot's for time travel, else the
    /// current one.
    pub fn version_schema(&self) -> Result<iceberg::spec::SchemaRef> {
        match self
            .snapshot_id
            .and_then(|id| self.metadata.snapshot_by_id(id))
        {
            Some(snapshot) if self.time_travel => snapshot
                .schema(&self.metadata)
                .map_err(|e| DataFusionError::Execution(error_text(&e))),
            _ => Ok(self.metadata.current_schema().clone()),
        }
    }

    /// An iceberg-rust table (read-only, no catalog) for the current runtime: the one kept
    /// from an earlier query of the same metadata file, or a new one.
    pub fn table(&self) -> Result<Table> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| DataFusionError::Execution(format!("no runtime: {e}")))?
            .id();
        let Some(location) = &self.metadata_location else {
            return self.build_table();
        };
        let mut file_io: Vec<(String, String)> = self.file_io.clone().into_iter().collect();
        file_io.sort();
        let key = TableKey {
            runtime,
            location: location.clone(),
            file_io,
            time_travel: self.time_travel,
        };
        let mut tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(table) = tables.get(&key) {
            return Ok(table.clone());
        }
        let table = self.build_table()?;
        tables.insert(key, table.clone());
        Ok(table)
    }

    fn build_table(&self) -> Result<Table> {
        let file_io = FileIOBuilder::new(Arc::new(BasinStorageFactory))
            .with_props(self.file_io.clone())
            .build();
        let metadata = if self.time_travel {
            self.metadata.clone()
        } else {
            current_schema_for_current_snapshot(&self.metadata)?
        };
        let mut builder = Table::builder()
            .metadata(metadata)
            .identifier(self.ident()?)
            .file_io(file_io)
            .runtime(
                iceberg::Runtime::try_current()
                    .map_err(|e| DataFusionError::Execution(error_text(&e)))?,
            )
            .readonly(true);
        if let Some(location) = &self.metadata_location {
            builder = builder.metadata_location(location.clone());
        }
        builder.build().map_err(|e| {
            DataFusionError::Execution(format!(
                "cannot open table `{}`: {}",
                self.qualified_name(),
                error_text(&e)
            ))
        })
    }

    /// The columns a query sees: the table's, then the row identity when asked for.
    pub fn provider_schema(&self) -> Result<SchemaRef> {
        let schema = self.arrow_schema()?;
        if !self.row_identity {
            return Ok(schema);
        }
        let mut fields: Vec<datafusion::arrow::datatypes::FieldRef> =
            schema.fields().iter().cloned().collect();
        fields.push(Arc::new(datafusion::arrow::datatypes::Field::new(
            ROW_FILE_COLUMN,
            datafusion::arrow::datatypes::DataType::Utf8,
            false,
        )));
        fields.push(Arc::new(datafusion::arrow::datatypes::Field::new(
            ROW_POS_COLUMN,
            datafusion::arrow::datatypes::DataType::UInt64,
            false,
        )));
        Ok(Arc::new(
            datafusion::arrow::datatypes::Schema::new_with_metadata(
                fields,
                schema.metadata().clone(),
            ),
        ))
    }

    /// The Arrow schema of the version read.
    pub fn arrow_schema(&self) -> Result<SchemaRef> {
        let schema = self.version_schema()?;
        let arrow = schema_to_arrow_schema(&schema).map_err(|e| {
            DataFusionError::Plan(format!(
                "table `{}` has a column type Basin cannot read yet: {}",
                self.qualified_name(),
                error_text(&e)
            ))
        })?;
        // Strings are read as views (crate::views).
        Ok(Arc::new(super::query_schema(&arrow)))
    }
}

/// The Iceberg predicate that prunes files for `filters` (over `schema`'s columns), or `None`.
/// iceberg-datafusion converts plain string literals only (the columns are views), and it
/// unwraps a cast of a column (`CAST(x AS INT) = 5` becomes `x = 5`), which is only right for
/// casts that keep every value apart and in order: a conjunct with any other cast of a column
/// (a double to an integer, a decimal to fewer decimals, a number to a string) is left out of
/// pruning, else files holding matching rows (x = 5.3) would be skipped.
pub(crate) fn pruning_predicate(
    filters: &[Expr],
    schema: &SchemaRef,
) -> Result<Option<iceberg::expr::Predicate>> {
    use datafusion::logical_expr::utils::split_conjunction;
    let mut kept = Vec::new();
    for filter in filters {
        for conjunct in split_conjunction(filter) {
            if has_lossy_cast(conjunct, schema) {
                continue;
            }
            kept.push(crate::views::plain_literals(conjunct)?);
        }
    }
    Ok(convert_filters_to_predicate(&kept))
}

/// Whether `expr` casts a column of `schema` to a type that merges or reorders its values.
fn has_lossy_cast(expr: &Expr, schema: &SchemaRef) -> bool {
    use datafusion::arrow::datatypes::DataType as T;
    let exact = |from: &T, to: &T| -> bool {
        let int = |t: &T| t.is_integer();
        match (from, to) {
            (a, b) if a == b => true,
            (a, b) if int(a) && int(b) => {
                // Widening, same signedness or unsigned into a wider signed.
                a.primitive_width() <= b.primitive_width()
                    && (a.is_signed_integer() == b.is_signed_integer()
                        || (a.is_unsigned_integer() && a.primitive_width() < b.primitive_width()))
            }
            (a, T::Float64) if int(a) => a.primitive_width().is_some_and(|w| w <= 4),
            (a, T::Float32) if int(a) => a.primitive_width().is_some_and(|w| w <= 2),
            (T::Float32, T::Float64) => true,
            (a, T::Decimal128(p, s) | T::Decimal256(p, s)) if int(a) => {
                let digits = match a.primitive_width() {
                    Some(1) => 3,
                    Some(2) => 5,
                    Some(4) => 10,
                    _ => 20,
                };
                (*p as i32 - *s as i32) >= digits
            }
            (
                T::Decimal128(p1, s1) | T::Decimal256(p1, s1),
                T::Decimal128(p2, s2) | T::Decimal256(p2, s2),
            ) => s2 >= s1 && (*p2 as i32 - *s2 as i32) >= (*p1 as i32 - *s1 as i32),
            (T::Utf8 | T::LargeUtf8 | T::Utf8View, T::Utf8 | T::LargeUtf8 | T::Utf8View) => true,
            (T::Date32, T::Date64) => true,
            (T::Timestamp(u1, _), T::Timestamp(u2, _)) => u1 == u2,
            _ => false,
        }
    };
    use datafusion::common::tree_node::TreeNode;
    expr.exists(|e| {
        let (inner, to) = match e {
            Expr::Cast(c) => (&c.expr, &c.data_type),
            Expr::TryCast(c) => (&c.expr, &c.data_type),
            _ => return Ok(false),
        };
        let Expr::Column(column) = inner.as_ref() else {
            // A cast of an expression: iceberg-datafusion leaves it unconverted.
            return Ok(false);
        };
        Ok(match schema.field_with_name(&column.name) {
            Ok(field) => !exact(field.data_type(), to),
            Err(_) => true,
        })
    })
    .unwrap_or(true)
}

/// The metadata with its current snapshot read under the current schema. A schema change
/// (a rename, a promotion, an added column) makes no snapshot, and iceberg-rust plans a scan
/// of a snapshot under the schema the snapshot was written with; Iceberg reads the table's
/// current state under its current schema (time travel under the snapshot's), matching
/// columns by field id.
fn current_schema_for_current_snapshot(metadata: &TableMetadataRef) -> Result<TableMetadataRef> {
    let current_schema = metadata.current_schema_id();
    let Some(snapshot) = metadata.current_snapshot() else {
        return Ok(metadata.clone());
    };
    if snapshot.schema_id().is_none_or(|id| id == current_schema) {
        return Ok(metadata.clone());
    }
    let bad = |e: serde_json::Error| {
        DataFusionError::Internal(format!("cannot read the table's metadata: {e}"))
    };
    let mut json = serde_json::to_value(metadata.as_ref()).map_err(bad)?;
    if let Some(snapshots) = json.get_mut("snapshots").and_then(|s| s.as_array_mut()) {
        for s in snapshots {
            if s.get("snapshot-id").and_then(|v| v.as_i64()) == Some(snapshot.snapshot_id()) {
                s["schema-id"] = serde_json::Value::from(current_schema);
            }
        }
    }
    Ok(Arc::new(
        serde_json::from_value::<TableMetadata>(json).map_err(bad)?,
    ))
}

/// iceberg-rust tables kept between queries. A metadata file never changes, and a table's
/// object cache keeps the manifest list and manifests it has read: planning the next query of
/// the same snapshot reads and parses none of them again (Avro parsing was a sixth of the
/// scheduler's planning CPU). Keyed also by the runtime, on which a table spawns its reads,
/// and by the FileIO settings, which can change for the same file (vended credentials).
static TABLES: LazyLock<Mutex<Lru<TableKey, Table>>> =
    LazyLock::new(|| Mutex::new(Lru::new(CACHED_TABLES)));

/// Each keeps at most iceberg-rust's 32 MiB of manifests.
const CACHED_TABLES: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TableKey {
    runtime: tokio::runtime::Id,
    location: String,
    file_io: Vec<(String, String)>,
    time_travel: bool,
}

/// A small map that forgets its least recently used entry past `capacity`.
#[derive(Debug)]
struct Lru<K, V> {
    capacity: usize,
    clock: u64,
    entries: HashMap<K, (u64, V)>,
}

impl<K: Eq + std::hash::Hash + Clone, V> Lru<K, V> {
    fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            clock: 0,
            entries: HashMap::new(),
        }
    }

    fn get(&mut self, key: &K) -> Option<&V> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(key).map(|(used, value)| {
            *used = clock;
            &*value
        })
    }

    fn insert(&mut self, key: K, value: V) {
        self.clock += 1;
        if !self.entries.contains_key(&key)
            && self.entries.len() >= self.capacity
            && let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| k.clone())
        {
            self.entries.remove(&oldest);
        }
        self.entries.insert(key, (self.clock, value));
    }
}

/// A DataFusion table over one version of an Iceberg table.
#[derive(Debug)]
pub struct IcebergTableProvider {
    spec: IcebergTableSpec,
    schema: SchemaRef,
    /// The catalog, in the process that loaded the table (not on the scheduler).
    catalog: Option<Arc<IcebergCatalog>>,
}

impl IcebergTableProvider {
    /// A table loaded from `catalog`, at `version` or at its current snapshot.
    pub fn new(
        catalog: Arc<IcebergCatalog>,
        table: Table,
        version: Option<&TableVersion>,
    ) -> Result<Self> {
        let ident = table.identifier().clone();
        let qualified = catalog.qualified(&ident);
        let metadata = table.metadata_ref();
        let snapshot_id = match version {
            Some(v) => Some(v.resolve(&qualified, &metadata)?),
            None => metadata.current_snapshot().map(|s| s.snapshot_id()),
        };
        let spec = IcebergTableSpec {
            catalog: catalog.name().to_string(),
            namespace: ident.namespace.clone().inner(),
            name: ident.name.clone(),
            metadata_location: table.metadata_location().map(str::to_string),
            metadata,
            file_io: table
                .file_io()
                .config()
                .props()
                .clone()
                .into_iter()
                .collect(),
            snapshot_id,
            time_travel: version.is_some(),
            options: catalog.options(),
            row_identity: false,
        };
        let schema = spec.provider_schema()?;
        Ok(Self {
            spec,
            schema,
            catalog: Some(catalog),
        })
    }

    /// A table rebuilt from its spec (scheduler side).
    pub fn from_spec(spec: IcebergTableSpec) -> Result<Self> {
        let schema = spec.provider_schema()?;
        Ok(Self {
            spec,
            schema,
            catalog: None,
        })
    }

    pub fn schema_ref(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The same table read with each row's identity (the target of a `MERGE`).
    pub fn with_row_identity(&self) -> Result<Self> {
        let mut spec = self.spec.clone();
        spec.row_identity = true;
        Ok(Self {
            schema: spec.provider_schema()?,
            spec,
            catalog: self.catalog.clone(),
        })
    }

    pub fn spec(&self) -> &IcebergTableSpec {
        &self.spec
    }

    pub fn catalog(&self) -> Option<&Arc<IcebergCatalog>> {
        self.catalog.as_ref()
    }

    /// Plans the files to read: resolves the snapshot, prunes by partition and column
    /// statistics, and spreads the file scan tasks over partitions balanced by bytes.
    pub async fn plan_scan(
        &self,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
        target_partitions: usize,
    ) -> Result<IcebergScanExec> {
        let qualified = self.spec.qualified_name();
        let output_schema: SchemaRef = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let identity = self.spec.row_identity;
        let mut columns: Vec<String> = output_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| !identity || (n != ROW_FILE_COLUMN && n != ROW_POS_COLUMN))
            .collect();
        // count(*) reads no column: read the first one and drop it.
        let read_no_columns = columns.is_empty();
        if read_no_columns && let Some(first) = self.schema.fields().first() {
            columns.push(first.name().clone());
        }
        let predicate = pruning_predicate(filters, &self.schema)?;
        let version_schema = self.spec.version_schema()?;
        let mut tasks: Vec<FileScanTask> = Vec::new();
        let mut files_total = 0u64;
        let mut column_stats = None;
        let mut column_bytes = None;
        let mut row_groups = HashMap::new();
        if let Some(snapshot_id) = self.spec.snapshot_id {
            let table = self.spec.table()?;
            let mut builder = table
                .scan()
                .snapshot_id(snapshot_id)
                .select(columns.clone())
                .with_row_group_filtering_enabled(true)
                .with_row_selection_enabled(true);
            if let Some(p) = &predicate {
                builder = builder.with_filter(p.clone());
            }
            let scan = builder.build().map_err(|e| {
                DataFusionError::Plan(format!("cannot scan `{qualified}`: {}", error_text(&e)))
            })?;
            tasks = scan
                .plan_files()
                .await
                .map_err(|e| {
                    DataFusionError::Execution(format!(
                        "cannot plan the files of `{qualified}`: {}",
                        error_text(&e)
                    ))
                })?
                .try_collect()
                .await
                .map_err(|e| {
                    DataFusionError::Execution(format!(
                        "cannot plan the files of `{qualified}`: {}",
                        error_text(&e)
                    ))
                })?;
            files_total = self
                .spec
                .metadata
                .snapshot_by_id(snapshot_id)
                .and_then(|s| s.summary().additional_properties.get("total-data-files"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(tasks.len() as u64);
            let planned = tasks.iter().map(|t| t.data_file_path.as_str()).collect();
            let columns = column_statistics(
                &table,
                &self.spec.metadata,
                snapshot_id,
                &planned,
                &output_schema,
                &version_schema,
            )
            .await;
            column_bytes = columns.as_ref().and_then(|c| c.bytes);
            column_stats = columns.map(|c| c.statistics);
            let bytes = tasks.iter().map(|t| t.length).sum();
            // Row identities are per whole file: files are not split.
            if !identity
                && tasks.len()
                    < wanted_partitions(bytes, self.spec.options.split_size, target_partitions)
            {
                row_groups =
                    row_group_offsets(&table, &self.spec.metadata, snapshot_id, &planned).await;
            }
        }
        let name_mapping = self
            .spec
            .metadata
            .properties()
            .get("schema.name-mapping.default")
            .cloned();
        let stats = ScanPlanStats {
            files_total,
            files_planned: tasks.len() as u64,
            bytes_planned: tasks.iter().map(|t| t.length).sum(),
            column_bytes_planned: column_bytes,
            delete_files: tasks.iter().map(|t| t.deletes.len() as u64).sum(),
            predicate: predicate.map(|p| p.to_string()),
        };
        let by_name = if identity {
            None
        } else {
            by_name_fields(
                &self.spec.metadata,
                &version_schema,
                &columns,
                filters,
                &tasks,
            )
        };
        let filter = by_name.as_ref().and_then(|_| encode_filters(filters));
        if identity {
            // A MERGE rewrites whole files from these rows: each file is read whole.
            for task in &mut tasks {
                task.predicate = None;
            }
        }
        let identity_partitions = IdentityPartitions::of(&tasks, true, &self.spec.metadata);
        let groups = balance(
            tasks,
            &row_groups,
            self.spec.options.split_size,
            target_partitions,
        );
        let exec = IcebergScanExec::try_new(ScanSpec {
            table: qualified,
            snapshot_id: self.spec.snapshot_id,
            columns,
            read_no_columns,
            schema_json: serde_json::to_string(&version_schema)
                .map_err(|e| DataFusionError::Internal(e.to_string()))?,
            output_fields: output_schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect(),
            groups: groups
                .into_iter()
                .map(|g| g.into_iter().map(strip_task).collect())
                .collect(),
            file_io: self.spec.file_io.clone(),
            name_mapping,
            limit,
            stats,
            by_name,
            filter,
            row_identity: identity,
            identity_partitions,
        })?;
        Ok(exec.with_column_statistics(column_stats))
    }
}

/// Partition values and specs cannot be serialized: identity partitions travel beside the
/// tasks ([`IdentityPartitions`]), the rest is not needed by readers.
pub(super) fn strip_task(mut task: FileScanTask) -> FileScanTask {
    task.partition = None;
    task.partition_spec = None;
    task.name_mapping = None;
    task
}

/// How many partitions a scan of `bytes` wants: as many as the bytes need at `split_size`
/// per partition, and at least enough to use `target_partitions` slots.
fn wanted_partitions(bytes: u64, split_size: u64, target_partitions: usize) -> usize {
    (bytes.div_ceil(split_size.max(1)) as usize).max(target_partitions.max(1))
}

/// Spreads tasks over partitions: as many as [`wanted_partitions`], never more than the
/// pieces there are to spread. Largest pieces first, each to the lightest partition.
///
/// A piece is a whole file, unless there are fewer files than partitions wanted: then each
/// file whose row groups start at known `row_groups` offsets (and that has no delete files)
/// is cut into one byte range per row group, so that a table of one or two files is still
/// read by every slot (TPC-H's `part` is one file). Both readers (DataFusion's and
/// iceberg-rust's) give a row group to the range that holds its start (or its middle); the
/// ranges of a file cover it from byte 0 to its end without gaps, so each row group is read
/// exactly once even if the recorded offsets were wrong. A partition's adjacent ranges of
/// one file are joined again.
pub fn balance(
    tasks: Vec<FileScanTask>,
    row_groups: &HashMap<String, Vec<i64>>,
    split_size: u64,
    target_partitions: usize,
) -> Vec<Vec<FileScanTask>> {
    if tasks.is_empty() {
        return vec![Vec::new()];
    }
    let bytes: u64 = tasks.iter().map(|t| t.length).sum();
    let wanted = wanted_partitions(bytes, split_size, target_partitions);
    let mut pieces: Vec<FileScanTask> = if tasks.len() < wanted {
        tasks
            .into_iter()
            .flat_map(|t| {
                let offsets = row_groups.get(&t.data_file_path);
                split_by_row_group(t, offsets.map_or(&[][..], Vec::as_slice))
            })
            .collect()
    } else {
        tasks
    };
    let n = wanted.min(pieces.len()).max(1);
    pieces.sort_by(|a, b| {
        b.length
            .cmp(&a.length)
            .then_with(|| a.data_file_path.cmp(&b.data_file_path))
            .then_with(|| a.start.cmp(&b.start))
    });
    let mut groups: Vec<(u64, Vec<FileScanTask>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for piece in pieces {
        if let Some(lightest) = groups.iter_mut().min_by_key(|(load, _)| *load) {
            lightest.0 += piece.length;
            lightest.1.push(piece);
        }
    }
    groups.into_iter().map(|(_, g)| join_adjacent(g)).collect()
}

/// `task` (a whole file) as one range per row group, given where its row groups start; the
/// file's record count is shared out by bytes (the ranges' counts add up to the file's).
fn split_by_row_group(task: FileScanTask, offsets: &[i64]) -> Vec<FileScanTask> {
    let size = task.file_size_in_bytes;
    if task.start != 0 || task.length != size || !task.deletes.is_empty() {
        return vec![task];
    }
    let mut cuts: Vec<u64> = offsets
        .iter()
        .filter_map(|o| u64::try_from(*o).ok())
        .filter(|o| *o > 0 && *o < size)
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    // The first row group starts right after the file's magic: no cut before it.
    if !cuts.is_empty() {
        cuts.remove(0);
    }
    if cuts.is_empty() {
        return vec![task];
    }
    let bounds: Vec<u64> = std::iter::once(0)
        .chain(cuts)
        .chain(std::iter::once(size))
        .collect();
    let mut left = task.record_count;
    let last = bounds.len() - 2;
    bounds
        .windows(2)
        .enumerate()
        .map(|(i, w)| {
            let mut piece = task.clone();
            piece.start = w[0];
            piece.length = w[1] - w[0];
            piece.record_count = match (task.record_count, left) {
                (Some(total), Some(rest)) => {
                    let share = if i == last {
                        rest
                    } else {
                        (u128::from(total) * u128::from(piece.length) / u128::from(size.max(1)))
                            .min(u128::from(rest)) as u64
                    };
                    left = Some(rest - share);
                    Some(share)
                }
                _ => None,
            };
            piece
        })
        .collect()
}

/// Joins a partition's ranges that continue one another in the same file.
fn join_adjacent(mut tasks: Vec<FileScanTask>) -> Vec<FileScanTask> {
    tasks.sort_by(|a, b| {
        a.data_file_path
            .cmp(&b.data_file_path)
            .then_with(|| a.start.cmp(&b.start))
    });
    let mut joined: Vec<FileScanTask> = Vec::with_capacity(tasks.len());
    for task in tasks {
        match joined.last_mut() {
            Some(prev)
                if prev.data_file_path == task.data_file_path
                    && prev.start + prev.length == task.start =>
            {
                prev.length += task.length;
                prev.record_count = prev.record_count.zip(task.record_count).map(|(a, b)| a + b);
            }
            _ => joined.push(task),
        }
    }
    joined
}

#[async_trait]
impl TableProvider for IcebergTableProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // Iceberg prunes files and row groups with what it can convert; rows are still
        // filtered by DataFusion.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    /// The rows of the snapshot read, from its summary (`total-records`, before row-level
    /// deletes): what the scheduler weighs tables by when it rewrites a plan.
    fn statistics(&self) -> Option<Statistics> {
        let rows = self
            .spec
            .snapshot_id
            .and_then(|id| self.spec.metadata.snapshot_by_id(id))?
            .summary()
            .additional_properties
            .get("total-records")?
            .parse::<usize>()
            .ok()?;
        Some(Statistics {
            num_rows: Precision::Inexact(rows),
            total_byte_size: Precision::Absent,
            column_statistics: Statistics::unknown_column(&self.schema),
        })
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let exec = self
            .plan_scan(
                projection,
                filters,
                limit,
                state.config().target_partitions(),
            )
            .await?;
        Ok(Arc::new(exec))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use iceberg::scan::{FileScanTask, FileScanTaskDeleteFile};
    use iceberg::spec::{DataContentType, DataFileFormat, Schema};

    use super::{Lru, balance};

    fn file(path: &str, size: u64, rows: u64) -> FileScanTask {
        FileScanTask::builder()
            .with_file_size_in_bytes(size)
            .with_start(0)
            .with_length(size)
            .with_record_count(Some(rows))
            .with_data_file_path(path.to_string())
            .with_data_file_format(DataFileFormat::Parquet)
            .with_schema(Arc::new(Schema::builder().build().unwrap()))
            .with_project_field_ids(vec![])
            .with_case_sensitive(true)
            .build()
    }

    /// A range of a file: path, start, end, rows.
    type Range = (String, u64, u64, Option<u64>);

    /// Each partition's ranges, partitions in order.
    fn ranges(groups: &[Vec<FileScanTask>]) -> Vec<Vec<Range>> {
        groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|t| {
                        let path = t.data_file_path.clone();
                        (path, t.start, t.start + t.length, t.record_count)
                    })
                    .collect()
            })
            .collect()
    }

    fn offsets(pairs: &[(&str, &[i64])]) -> HashMap<String, Vec<i64>> {
        pairs
            .iter()
            .map(|(p, o)| (p.to_string(), o.to_vec()))
            .collect()
    }

    #[test]
    fn a_lone_file_is_read_by_row_group_in_every_slot() {
        // Two row groups of 400 and 600 bytes after the 4-byte magic, a 100-byte footer.
        let groups = balance(
            vec![file("a", 1104, 1000)],
            &offsets(&[("a", &[4, 404])]),
            128 << 20,
            2,
        );
        let mut got = ranges(&groups);
        got.sort();
        assert_eq!(
            got,
            vec![
                vec![("a".to_string(), 0, 404, Some(365))],
                vec![("a".to_string(), 404, 1104, Some(635))],
            ]
        );
        // More slots than row groups: one partition per row group, no empty ones.
        let groups = balance(
            vec![file("a", 1104, 1000)],
            &offsets(&[("a", &[4, 404])]),
            128 << 20,
            8,
        );
        assert_eq!(groups.len(), 2);
    }

    #[test]
    fn ranges_cover_the_whole_file_whatever_the_offsets_say() {
        // Unordered, duplicated, out of the file, negative: the ranges still go from byte 0
        // to the end without a gap or an overlap, so no row group is lost or read twice.
        let groups = balance(
            vec![file("a", 1000, 10)],
            &offsets(&[("a", &[700, 4, 300, 300, 5000, -1, 0])]),
            128 << 20,
            4,
        );
        let mut all: Vec<_> = ranges(&groups).into_iter().flatten().collect();
        all.sort_by_key(|r| r.1);
        let bounds: Vec<(u64, u64)> = all.iter().map(|r| (r.1, r.2)).collect();
        assert_eq!(bounds, vec![(0, 300), (300, 700), (700, 1000)]);
        assert_eq!(all.iter().map(|r| r.3.unwrap()).sum::<u64>(), 10);
    }

    #[test]
    fn files_are_kept_whole_when_there_are_enough_or_they_cannot_be_cut() {
        let two = vec![file("a", 1000, 10), file("b", 900, 9)];
        let cut = offsets(&[("a", &[4, 500]), ("b", &[4, 450])]);
        let groups = balance(two.clone(), &cut, 128 << 20, 2);
        let got = ranges(&groups);
        assert!(got.iter().flatten().all(|r| r.1 == 0), "{got:?}");
        // No recorded offsets, one row group, or delete files: the file stays whole.
        for (task, cut) in [
            (file("a", 1000, 10), offsets(&[])),
            (file("a", 1000, 10), offsets(&[("a", &[4])])),
            (
                {
                    let mut t = file("a", 1000, 10);
                    t.deletes.push(
                        FileScanTaskDeleteFile::builder()
                            .with_file_path("d".to_string())
                            .with_file_size_in_bytes(10)
                            .with_file_type(DataContentType::PositionDeletes)
                            .with_partition_spec_id(0)
                            .with_equality_ids(None)
                            .build(),
                    );
                    t
                },
                offsets(&[("a", &[4, 500])]),
            ),
        ] {
            let groups = balance(vec![task], &cut, 128 << 20, 2);
            assert_eq!(
                ranges(&groups),
                vec![vec![("a".to_string(), 0, 1000, Some(10))]]
            );
        }
    }

    #[test]
    fn a_partitions_adjacent_row_groups_are_read_as_one_range() {
        // `a` in four row groups and `b` in one, over three slots: ranges of `a` that
        // land in one slot next to each other are read as one.
        let groups = balance(
            vec![file("a", 404, 400), file("b", 104, 100)],
            &offsets(&[("a", &[4, 104, 204, 304]), ("b", &[4])]),
            128 << 20,
            3,
        );
        let all: Vec<_> = ranges(&groups).into_iter().flatten().collect();
        let a: u64 = all.iter().filter(|r| r.0 == "a").map(|r| r.2 - r.1).sum();
        assert_eq!(a, 404);
        assert_eq!(all.iter().map(|r| r.3.unwrap()).sum::<u64>(), 500);
        for g in ranges(&groups) {
            for w in g.windows(2) {
                assert!(!(w[0].0 == w[1].0 && w[0].2 == w[1].1), "not joined: {g:?}");
            }
        }
    }

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut lru = Lru::new(2);
        lru.insert("a", 1);
        lru.insert("b", 2);
        assert_eq!(lru.get(&"a"), Some(&1)); // "b" is now the oldest
        lru.insert("c", 3);
        assert_eq!(lru.get(&"b"), None);
        assert_eq!(lru.get(&"a"), Some(&1));
        assert_eq!(lru.get(&"c"), Some(&3));
        lru.insert("c", 4); // replacing keeps the others
        assert_eq!(lru.get(&"a"), Some(&1));
        assert_eq!(lru.get(&"c"), Some(&4));
    }
}
