//! Table maintenance procedures, in Trino's syntax — `ALTER TABLE t EXECUTE
//! expire_snapshots(retention_threshold => '7d')` — or as `CALL system.expire_snapshots(table
//! => 't', …)` (the front end parses both into [`IcebergProcedure`]); they run in the front end.
//!
//! - `expire_snapshots(retention_threshold | older_than, retain_last)`: removes the snapshots
//!   older than the threshold from the table's metadata (one commit, iceberg-rust's
//!   `ExpireSnapshotsAction`: never the head of a branch or tag, each branch keeps its
//!   `retain_last` newest), then deletes the manifest lists, manifests, data and delete files
//!   that only expired snapshots referenced. A file a retained snapshot reads is never deleted.
//! - `remove_orphan_files(retention_threshold | older_than, dry_run)`: lists every file under
//!   the table's location and deletes those no metadata references (the current and logged
//!   metadata files, every snapshot's manifest list, manifests and their files, statistics
//!   files) and that are older than the threshold. A threshold under one day is refused unless
//!   `allow_short_retention => true` is given: a write in flight has files that no commit
//!   references yet. `dry_run => true` lists the files instead of deleting them.
//!
//! - `rollback_to_snapshot(snapshot_id)` moves `main` back to an ancestor of its current
//!   snapshot, `set_current_snapshot(snapshot_id)` to any snapshot of the table; both return
//!   the previous and the current snapshot id.
//!
//! - `add_files(location, recursive_directory, dry_run)`: existing Parquet files registered
//!   after checking each ([`super::add_files`]). Files outside the table's own folders are
//!   never deleted by `expire_snapshots`.
//!
//! The first two return Trino's metrics table (`metric_name`, `metric_value`); a dry run returns the
//! files (`file_path`, `size_bytes`, `last_modified`).

use std::any::Any;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;
use iceberg::TableIdent;
use iceberg::spec::DataContentType;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use object_store::ObjectStoreExt;

use super::add_files::Recursive;
use super::catalog::{IcebergCatalog, error_text};
use super::commit::iceberg_error;
use super::storage::BasinStorage;

const DAY_MS: i64 = 24 * 60 * 60 * 1000;
/// Trino's default threshold for both procedures.
const DEFAULT_RETENTION_MS: i64 = 7 * DAY_MS;
/// Files deleted at a time.
const DELETES_AT_ONCE: usize = 16;

/// A maintenance procedure and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Procedure {
    ExpireSnapshots {
        /// Snapshots older than this (ms since the epoch) expire; `None`: the table's
        /// `history.expire.max-snapshot-age-ms` (5 days by default).
        older_than_ms: Option<i64>,
        retain_last: Option<usize>,
    },
    RemoveOrphanFiles {
        older_than_ms: i64,
        dry_run: bool,
    },
    /// `main` back to one of its ancestors.
    RollbackToSnapshot {
        snapshot_id: i64,
    },
    /// `main` to any snapshot of the table.
    SetCurrentSnapshot {
        snapshot_id: i64,
    },
    /// Compaction: in each partition with more than one data file under the threshold (or
    /// with delete files), those files rewritten into files of the target size. Planned by
    /// the front end as a distributed rewrite.
    Optimize {
        file_size_threshold: u64,
        /// Only files that may hold rows for which this SQL condition holds.
        filter: Option<String>,
    },
    /// Existing Parquet files registered after checking each ([`super::add_files`]).
    AddFiles {
        location: String,
        recursive: Recursive,
        dry_run: bool,
    },
}

/// Trino's default `file_size_threshold` of `optimize`.
pub const DEFAULT_OPTIMIZE_THRESHOLD: u64 = 100 << 20;

impl Procedure {
    /// The procedure `name` with its named arguments (`argument => value`, values as written
    /// without quotes), checked; `now_ms` is the statement's time.
    pub fn parse(name: &str, args: &[(String, String)], now_ms: i64) -> Result<Self> {
        let name = name.to_ascii_lowercase();
        let allowed: &[&str] = match name.as_str() {
            "expire_snapshots" => &[
                "retention_threshold",
                "older_than",
                "retain_last",
                "allow_short_retention",
            ],
            "remove_orphan_files" => &[
                "retention_threshold",
                "older_than",
                "dry_run",
                "allow_short_retention",
            ],
            "rollback_to_snapshot" | "set_current_snapshot" => &["snapshot_id"],
            "optimize" => &["file_size_threshold", "filter"],
            "add_files" => &["location", "format", "recursive_directory", "dry_run"],
            other => {
                return Err(DataFusionError::Plan(format!(
                    "unknown table procedure `{other}`: Basin has expire_snapshots, \
                     remove_orphan_files, rollback_to_snapshot, set_current_snapshot, \
                     optimize and add_files"
                )));
            }
        };
        let mut values = BTreeMap::new();
        for (arg, value) in args {
            let arg = arg.to_ascii_lowercase();
            if !allowed.contains(&arg.as_str()) {
                return Err(DataFusionError::Plan(format!(
                    "{name} has no argument `{arg}` (it takes {})",
                    allowed.join(", ")
                )));
            }
            if values.insert(arg.clone(), value.clone()).is_some() {
                return Err(DataFusionError::Plan(format!(
                    "{name}: argument `{arg}` given twice"
                )));
            }
        }
        if name == "optimize" {
            let file_size_threshold = match values.get("file_size_threshold") {
                None => DEFAULT_OPTIMIZE_THRESHOLD,
                Some(v) => {
                    v.parse::<basin_core::ByteSize>()
                        .map_err(|e| {
                            DataFusionError::Plan(format!("optimize: file_size_threshold: {e}"))
                        })?
                        .0
                }
            };
            return Ok(Procedure::Optimize {
                file_size_threshold,
                filter: values.get("filter").cloned(),
            });
        }
        let boolean = |arg: &str| -> Result<bool> {
            match values.get(arg).map(|v| v.to_ascii_lowercase()) {
                None => Ok(false),
                Some(v) if v == "true" => Ok(true),
                Some(v) if v == "false" => Ok(false),
                Some(v) => Err(DataFusionError::Plan(format!(
                    "{name}: {arg} must be true or false, not `{v}`"
                ))),
            }
        };
        if name == "add_files" {
            let location = values.get("location").cloned().ok_or_else(|| {
                DataFusionError::Plan(
                    "add_files needs location => '<folder or file>' (local path, file:// or \
                     s3://)"
                        .to_string(),
                )
            })?;
            if let Some(format) = values.get("format")
                && !format.eq_ignore_ascii_case("parquet")
            {
                return Err(DataFusionError::NotImplemented(format!(
                    "add_files: format `{format}`: Basin adds Parquet files only"
                )));
            }
            let recursive = match values.get("recursive_directory") {
                Some(v) => Recursive::parse(v)?,
                None => Recursive::Fail,
            };
            return Ok(Procedure::AddFiles {
                location,
                recursive,
                dry_run: boolean("dry_run")?,
            });
        }
        if let "rollback_to_snapshot" | "set_current_snapshot" = name.as_str() {
            let id = values.get("snapshot_id").ok_or_else(|| {
                DataFusionError::Plan(format!("{name} needs snapshot_id => <id>"))
            })?;
            let snapshot_id = id.parse::<i64>().map_err(|_| {
                DataFusionError::Plan(format!("{name}: `{id}` is not a snapshot id"))
            })?;
            return Ok(if name == "rollback_to_snapshot" {
                Procedure::RollbackToSnapshot { snapshot_id }
            } else {
                Procedure::SetCurrentSnapshot { snapshot_id }
            });
        }
        let older_than = match (values.get("retention_threshold"), values.get("older_than")) {
            (Some(_), Some(_)) => {
                return Err(DataFusionError::Plan(format!(
                    "{name}: give retention_threshold or older_than, not both"
                )));
            }
            (Some(d), None) => Some(now_ms - parse_duration_ms(d)?),
            (None, Some(t)) => Some(parse_timestamp(t)?),
            (None, None) => None,
        };
        let short = older_than.is_some_and(|t| now_ms - t < DAY_MS);
        if short && !boolean("allow_short_retention")? {
            return Err(DataFusionError::Plan(format!(
                "{name}: a threshold under one day could remove what a running query or write \
                 still reads; give retention_threshold => '1d' or more, or add \
                 allow_short_retention => true when nothing can be running"
            )));
        }
        match name.as_str() {
            "expire_snapshots" => {
                let retain_last = match values.get("retain_last") {
                    None => None,
                    Some(v) => match v.parse::<usize>() {
                        Ok(n) if n >= 1 => Some(n),
                        _ => {
                            return Err(DataFusionError::Plan(format!(
                                "{name}: retain_last must be a whole number of at least 1, not \
                                 `{v}`"
                            )));
                        }
                    },
                };
                Ok(Procedure::ExpireSnapshots {
                    older_than_ms: older_than,
                    retain_last,
                })
            }
            _ => {
                let older_than_ms = older_than.unwrap_or(now_ms - DEFAULT_RETENTION_MS);
                Ok(Procedure::RemoveOrphanFiles {
                    older_than_ms,
                    dry_run: boolean("dry_run")?,
                })
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Procedure::ExpireSnapshots { .. } => "expire_snapshots",
            Procedure::RemoveOrphanFiles { .. } => "remove_orphan_files",
            Procedure::RollbackToSnapshot { .. } => "rollback_to_snapshot",
            Procedure::SetCurrentSnapshot { .. } => "set_current_snapshot",
            Procedure::Optimize { .. } => "optimize",
            Procedure::AddFiles { .. } => "add_files",
        }
    }

    /// The rows the procedure returns.
    pub fn schema(&self) -> SchemaRef {
        match self {
            Procedure::RemoveOrphanFiles { dry_run: true, .. } => Arc::new(Schema::new(vec![
                Field::new("file_path", DataType::Utf8, false),
                Field::new("size_bytes", DataType::Int64, false),
                Field::new(
                    "last_modified",
                    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                    false,
                ),
            ])),
            Procedure::RollbackToSnapshot { .. } | Procedure::SetCurrentSnapshot { .. } => {
                Arc::new(Schema::new(vec![
                    Field::new("previous_snapshot_id", DataType::Int64, true),
                    Field::new("current_snapshot_id", DataType::Int64, false),
                ]))
            }
            // The rows rewritten.
            Procedure::Optimize { .. } => super::write::count_schema(),
            Procedure::AddFiles { .. } => super::add_files::schema(),
            _ => Arc::new(Schema::new(vec![
                Field::new("metric_name", DataType::Utf8, false),
                Field::new("metric_value", DataType::Int64, false),
            ])),
        }
    }
}

/// A duration as Trino writes one: a number and a unit (`ms`, `s`, `m`, `h`, `d`), e.g.
/// `7d`, `12h`, `1.5d`.
pub fn parse_duration_ms(text: &str) -> Result<i64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit_ms = match unit.trim() {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => DAY_MS as f64,
        _ => f64::NAN,
    };
    match number.parse::<f64>() {
        Ok(n) if n >= 0.0 && unit_ms.is_finite() => Ok((n * unit_ms) as i64),
        _ => Err(DataFusionError::Plan(format!(
            "`{text}` is not a duration: write a number and a unit (ms, s, m, h, d), e.g. '7d'"
        ))),
    }
}

/// Parses a timestamp (time travel's `TIMESTAMP '…'`, a procedure's `older_than`; UTC
/// unless it names an offset) into milliseconds since the epoch.
pub fn parse_timestamp(text: &str) -> Result<i64> {
    let t = text.trim();
    for format in [
        "%Y-%m-%d %H:%M:%S%.f %:z",
        "%Y-%m-%dT%H:%M:%S%.f%:z",
        "%Y-%m-%d %H:%M:%S%.f%:z",
    ] {
        if let Ok(dt) = chrono::DateTime::parse_from_str(t, format) {
            return Ok(dt.timestamp_millis());
        }
    }
    let stripped = t
        .strip_suffix(" UTC")
        .or_else(|| t.strip_suffix('Z'))
        .unwrap_or(t);
    for format in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(dt) = chrono::NaiveDateTime::parse_from_str(stripped, format) {
            return Ok(dt.and_utc().timestamp_millis());
        }
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(stripped, "%Y-%m-%d") {
        return Ok(d
            .and_hms_opt(0, 0, 0)
            .map(|dt| dt.and_utc().timestamp_millis())
            .unwrap_or_default());
    }
    Err(DataFusionError::Plan(format!(
        "`{text}` is not a timestamp; use TIMESTAMP 'YYYY-MM-DD HH:MM:SS[.fff][ +HH:MM]'"
    )))
}

/// A maintenance procedure on one Iceberg table (logical plan node).
#[derive(Debug, Clone)]
pub struct IcebergProcedure {
    pub catalog: Arc<IcebergCatalog>,
    pub ident: TableIdent,
    pub procedure: Procedure,
    schema: DFSchemaRef,
}

impl IcebergProcedure {
    pub fn new(
        catalog: Arc<IcebergCatalog>,
        ident: TableIdent,
        procedure: Procedure,
    ) -> Result<Self> {
        let schema = Arc::new(DFSchema::try_from(procedure.schema().as_ref().clone())?);
        Ok(Self {
            catalog,
            ident,
            procedure,
            schema,
        })
    }

    fn qualified(&self) -> String {
        self.catalog.qualified(&self.ident)
    }
}

impl PartialEq for IcebergProcedure {
    fn eq(&self, other: &Self) -> bool {
        self.ident == other.ident && self.procedure == other.procedure
    }
}
impl Eq for IcebergProcedure {}
impl Hash for IcebergProcedure {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.ident.to_string().hash(state);
        self.procedure.hash(state);
    }
}
impl PartialOrd for IcebergProcedure {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.ident.to_string().partial_cmp(&other.ident.to_string())
    }
}

impl UserDefinedLogicalNodeCore for IcebergProcedure {
    fn name(&self) -> &str {
        "IcebergProcedure"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergProcedure: table={}, {:?}",
            self.qualified(),
            self.procedure
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, _inputs: Vec<LogicalPlan>) -> Result<Self> {
        Ok(self.clone())
    }
}

/// Runs an [`IcebergProcedure`] in the front end.
#[derive(Debug)]
pub struct IcebergProcedureExec {
    node: IcebergProcedure,
    properties: Arc<PlanProperties>,
}

impl IcebergProcedureExec {
    pub fn new(node: IcebergProcedure) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(node.procedure.schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self { node, properties }
    }
}

impl DisplayAs for IcebergProcedureExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergProcedureExec: table={}, procedure={}",
            self.node.qualified(),
            self.node.procedure.name()
        )
    }
}

impl ExecutionPlan for IcebergProcedureExec {
    fn name(&self) -> &str {
        "IcebergProcedureExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let node = self.node.clone();
        let schema = node.procedure.schema();
        // A session's file sandbox, for the files a procedure reads outside its table.
        let sandbox = context
            .session_config()
            .get_extension::<basin_core::sandbox::Sandbox>();
        let stream = futures::stream::once(async move {
            let catalog = node.catalog.clone();
            let what = format!("{} on `{}`", node.procedure.name(), node.qualified());
            let table = catalog.load_table(&node.ident).await?;
            match &node.procedure {
                Procedure::ExpireSnapshots {
                    older_than_ms,
                    retain_last,
                } => expire_snapshots(&node, table, *older_than_ms, *retain_last).await,
                Procedure::RemoveOrphanFiles {
                    older_than_ms,
                    dry_run,
                } => remove_orphan_files(table, *older_than_ms, *dry_run, &node.procedure).await,
                Procedure::RollbackToSnapshot { snapshot_id }
                | Procedure::SetCurrentSnapshot { snapshot_id } => {
                    move_main(&node, table, *snapshot_id).await
                }
                Procedure::Optimize { .. } => Err(DataFusionError::Internal(
                    "optimize is planned by the front end".to_string(),
                )),
                Procedure::AddFiles {
                    location,
                    recursive,
                    dry_run,
                } => {
                    super::add_files::add_files(
                        node.catalog.committer(),
                        table,
                        &node.qualified(),
                        location,
                        *recursive,
                        *dry_run,
                        sandbox.as_deref(),
                    )
                    .await
                }
            }
            .map_err(|e| e.context(what))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

fn metrics(procedure: &Procedure, rows: &[(&str, usize)]) -> Result<RecordBatch> {
    let names: ArrayRef = Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0)));
    let values: ArrayRef = Arc::new(Int64Array::from_iter_values(
        rows.iter().map(|r| r.1 as i64),
    ));
    Ok(RecordBatch::try_new(
        procedure.schema(),
        vec![names, values],
    )?)
}

/// Every manifest path of `table`'s snapshots `snapshots`, and (when `with_files`) every file
/// their manifests list as alive, or (`any_status`) list at all.
async fn referenced(
    table: &Table,
    snapshot_ids: &HashSet<i64>,
    files: Files,
) -> Result<(HashSet<String>, HashSet<String>)> {
    let mut manifests = HashSet::new();
    let mut paths = HashSet::new();
    for snapshot in table.metadata().snapshots() {
        if !snapshot_ids.contains(&snapshot.snapshot_id()) {
            continue;
        }
        let list = table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .map_err(iceberg_error)?;
        for manifest in list.entries() {
            if !manifests.insert(manifest.manifest_path.clone()) || files == Files::None {
                continue;
            }
            let loaded = manifest
                .load_manifest(table.file_io())
                .await
                .map_err(iceberg_error)?;
            for entry in loaded.entries() {
                if files == Files::Any || entry.is_alive() {
                    paths.insert(entry.file_path().to_string());
                }
            }
        }
    }
    Ok((manifests, paths))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Files {
    None,
    Alive,
    Any,
}

/// Deletes `paths`, a few at a time; the number deleted and the first failure.
async fn delete_all(table: &Table, paths: Vec<String>) -> (usize, Option<String>) {
    let file_io = table.file_io().clone();
    let results: Vec<std::result::Result<(), String>> = futures::stream::iter(paths)
        .map(|path| {
            let file_io = file_io.clone();
            async move {
                file_io
                    .delete(&path)
                    .await
                    .map_err(|e| format!("cannot delete `{path}`: {}", error_text(&e)))
            }
        })
        .buffer_unordered(DELETES_AT_ONCE)
        .collect()
        .await;
    let deleted = results.iter().filter(|r| r.is_ok()).count();
    let failure = results.into_iter().find_map(|r| r.err());
    (deleted, failure)
}

async fn expire_snapshots(
    node: &IcebergProcedure,
    before: Table,
    older_than_ms: Option<i64>,
    retain_last: Option<usize>,
) -> Result<RecordBatch> {
    let tx = Transaction::new(&before);
    let mut action = tx.expire_snapshots();
    if let Some(ms) = older_than_ms {
        action = action.expire_older_than_ms(ms);
    }
    if let Some(n) = retain_last {
        action = action.retain_last(n);
    }
    let tx = action.apply(tx).map_err(iceberg_error)?;
    let after = node
        .catalog
        .call(move |c| async move { tx.commit(c.as_ref()).await })
        .await
        .map_err(iceberg_error)?;
    let kept: HashSet<i64> = after
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    let expired: HashSet<i64> = before
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .filter(|id| !kept.contains(id))
        .collect();
    let lists: Vec<String> = before
        .metadata()
        .snapshots()
        .filter(|s| expired.contains(&s.snapshot_id()))
        .map(|s| s.manifest_list().to_string())
        .collect();
    // What retained snapshots read stays; of the rest, what only expired snapshots read
    // goes. The commit stands whatever happens next: a failure here leaves files behind
    // (for remove_orphan_files), never deletes one that is read.
    let found = async {
        let (kept_manifests, _) = referenced(&after, &kept, Files::None).await?;
        let (expired_manifests, _) = referenced(&before, &expired, Files::None).await?;
        let candidates: Vec<String> = expired_manifests
            .difference(&kept_manifests)
            .cloned()
            .collect();
        let mut data_files = Vec::new();
        let mut delete_files = Vec::new();
        if !candidates.is_empty() {
            let (_, kept_files) = referenced(&after, &kept, Files::Alive).await?;
            let candidate_set: HashSet<&String> = candidates.iter().collect();
            for snapshot in before.metadata().snapshots() {
                if !expired.contains(&snapshot.snapshot_id()) {
                    continue;
                }
                let list = before
                    .manifest_list_reader(snapshot)
                    .load()
                    .await
                    .map_err(iceberg_error)?;
                for manifest in list.entries() {
                    if !candidate_set.contains(&manifest.manifest_path) {
                        continue;
                    }
                    let loaded = manifest
                        .load_manifest(before.file_io())
                        .await
                        .map_err(iceberg_error)?;
                    for entry in loaded.entries() {
                        let path = entry.file_path();
                        if kept_files.contains(path) {
                            continue;
                        }
                        match entry.content_type() {
                            DataContentType::Data => data_files.push(path.to_string()),
                            _ => delete_files.push(path.to_string()),
                        }
                    }
                }
            }
            data_files.sort();
            data_files.dedup();
            delete_files.sort();
            delete_files.dedup();
        }
        Ok::<_, DataFusionError>((data_files, delete_files, candidates))
    }
    .await;
    let (data_files, delete_files, candidates) = match found {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(
                table = %node.qualified(),
                "expire_snapshots committed, but its files were not removed: {e}"
            );
            (Vec::new(), Vec::new(), Vec::new())
        }
    };
    // Only files under the table's own folders: files registered where they were
    // (`add_files`) belong to whoever put them there.
    let owned = Owned::of(&before);
    let (data_files, external): (Vec<String>, Vec<String>) =
        data_files.into_iter().partition(|p| owned.holds(p));
    if !external.is_empty() {
        tracing::info!(
            table = %node.qualified(),
            files = external.len(),
            "expire_snapshots keeps data files outside the table's location"
        );
    }
    let delete_files: Vec<String> = delete_files
        .into_iter()
        .filter(|p| owned.holds(p))
        .collect();
    let candidates: Vec<String> = candidates.into_iter().filter(|p| owned.holds(p)).collect();
    let lists: Vec<String> = lists.into_iter().filter(|p| owned.holds(p)).collect();
    let (data, e1) = delete_all(&before, data_files).await;
    let (deletes, e2) = delete_all(&before, delete_files).await;
    let (manifests, e3) = delete_all(&before, candidates).await;
    let (manifest_lists, e4) = delete_all(&before, lists).await;
    if let Some(failure) = e1.or(e2).or(e3).or(e4) {
        // The commit stands: the files left over are orphans `remove_orphan_files` removes.
        tracing::warn!(table = %node.qualified(), "expire_snapshots: {failure}");
    }
    metrics(
        &node.procedure,
        &[
            ("expired_snapshots_count", expired.len()),
            ("deleted_data_files_count", data),
            ("deleted_delete_files_count", deletes),
            ("deleted_manifest_files_count", manifests),
            ("deleted_manifest_lists_count", manifest_lists),
        ],
    )
}

/// The folders a table's files are written to: its location and the write paths its
/// properties name. What is elsewhere was put there by someone else.
struct Owned {
    storage: BasinStorage,
    folders: Vec<(String, String)>,
}

impl Owned {
    fn of(table: &Table) -> Self {
        let metadata = table.metadata();
        let storage = BasinStorage::new(table.file_io().config().props().clone());
        let mut folders = Vec::new();
        let locations = std::iter::once(metadata.location()).chain(
            [
                "write.data.path",
                "write.metadata.path",
                "write.object-storage.path",
                "write.folder-storage.path",
            ]
            .iter()
            .filter_map(|key| metadata.properties().get(*key).map(String::as_str)),
        );
        for location in locations {
            if let Ok(places) = place(&storage, location) {
                for (bucket, key) in places {
                    folders.push((bucket, format!("{}/", key.trim_end_matches('/'))));
                }
            }
        }
        Self { storage, folders }
    }

    /// Whether `path` is under one of the table's folders (a path that cannot be placed is
    /// not).
    fn holds(&self, path: &str) -> bool {
        let Ok(places) = place(&self.storage, path) else {
            return false;
        };
        places.iter().any(|(bucket, key)| {
            self.folders
                .iter()
                .any(|(b, folder)| b == bucket && key.starts_with(folder.as_str()))
        })
    }
}

/// `rollback_to_snapshot` (an ancestor of the current snapshot only) and
/// `set_current_snapshot`: `main` points at `snapshot_id`, one commit.
async fn move_main(node: &IcebergProcedure, table: Table, snapshot_id: i64) -> Result<RecordBatch> {
    let qualified = node.qualified();
    let previous = table.metadata().current_snapshot().map(|s| s.snapshot_id());
    if let (Procedure::RollbackToSnapshot { .. }, Some(current)) = (&node.procedure, previous)
        && !super::commit::is_ancestor(&table, current, snapshot_id)
    {
        return Err(DataFusionError::Plan(format!(
            "snapshot {snapshot_id} is not an ancestor of `{qualified}`'s current snapshot \
             {current}: rollback_to_snapshot goes back along the history \
             (`{qualified}$history`); set_current_snapshot moves to any snapshot"
        )));
    }
    super::commit::set_main(node.catalog.committer(), &table, &qualified, snapshot_id).await?;
    let previous: ArrayRef = Arc::new(Int64Array::from(vec![previous]));
    let current: ArrayRef = Arc::new(Int64Array::from(vec![snapshot_id]));
    Ok(RecordBatch::try_new(
        node.procedure.schema(),
        vec![previous, current],
    )?)
}

/// Where a location is: its bucket (empty for local files) and object path, so that the
/// same file written as `/x`, `file:///x`, `s3://b/k` or `s3a://b/k` compares equal.
/// Both spellings of its key are kept: the decoded one Basin reads it by, and the key as
/// written in the location (writers percent-encode partition values: `%3A` for `:`), so
/// that a listed key matches whichever the store reports.
pub(super) fn place(storage: &BasinStorage, location: &str) -> Result<[(String, String); 2]> {
    let (_, path) = storage.resolve(location).map_err(|e| {
        DataFusionError::Execution(format!(
            "a file the table references cannot be located, so none is removed: {}",
            error_text(&e)
        ))
    })?;
    let (bucket, raw) = match url::Url::parse(location) {
        Ok(url) if url.scheme() != "file" => (
            url.host_str().unwrap_or_default().to_string(),
            url.path().trim_start_matches('/').to_string(),
        ),
        Ok(url) => (
            String::new(),
            url.path().trim_start_matches('/').to_string(),
        ),
        Err(_) => (String::new(), location.trim_start_matches('/').to_string()),
    };
    Ok([(bucket.clone(), path.as_ref().to_string()), (bucket, raw)])
}

async fn remove_orphan_files(
    table: Table,
    older_than_ms: i64,
    dry_run: bool,
    procedure: &Procedure,
) -> Result<RecordBatch> {
    let metadata = table.metadata();
    let storage = BasinStorage::new(table.file_io().config().props().clone());
    let all: HashSet<i64> = metadata.snapshots().map(|s| s.snapshot_id()).collect();
    let (manifests, files) = referenced(&table, &all, Files::Any).await?;
    let mut known: Vec<String> = Vec::new();
    known.extend(table.metadata_location().map(str::to_string));
    known.extend(
        metadata
            .metadata_log()
            .iter()
            .map(|m| m.metadata_file.clone()),
    );
    known.extend(metadata.snapshots().map(|s| s.manifest_list().to_string()));
    known.extend(
        metadata
            .statistics_iter()
            .map(|s| s.statistics_path.clone()),
    );
    known.extend(
        metadata
            .partition_statistics_iter()
            .map(|s| s.statistics_path.clone()),
    );
    let processed_manifests = manifests.len();
    known.extend(manifests);
    known.extend(files);
    let mut referenced: HashSet<(String, String)> = HashSet::with_capacity(known.len() * 2);
    for location in &known {
        referenced.extend(place(&storage, location)?);
    }

    let location = metadata.location();
    let (store, prefix) = storage.resolve(location).map_err(iceberg_error)?;
    if prefix.as_ref().trim_matches('/').is_empty() {
        return Err(DataFusionError::Plan(format!(
            "the table's location `{location}` is a bucket or file-system root: \
             remove_orphan_files lists and deletes only under a table's own directory"
        )));
    }
    let [(bucket, _), _] = place(&storage, location)?;
    let mut scanned = 0usize;
    let mut orphans = Vec::new();
    let mut listing = store.list(Some(&prefix));
    while let Some(meta) = listing.next().await {
        let meta =
            meta.map_err(|e| DataFusionError::Execution(format!("cannot list `{location}`: {e}")))?;
        scanned += 1;
        let raw = meta.location.as_ref().to_string();
        let decoded = percent_encoding::percent_decode_str(&raw)
            .decode_utf8_lossy()
            .into_owned();
        let name = meta.location.filename().unwrap_or_default();
        if referenced.contains(&(bucket.clone(), raw))
            || referenced.contains(&(bucket.clone(), decoded))
            || name == "version-hint.text"
            || meta.last_modified.timestamp_millis() >= older_than_ms
        {
            continue;
        }
        let full = if bucket.is_empty() {
            format!("file:///{}", meta.location.as_ref())
        } else {
            let scheme = location.split("://").next().unwrap_or("s3");
            format!("{scheme}://{bucket}/{}", meta.location.as_ref())
        };
        orphans.push((
            full,
            meta.size as i64,
            meta.last_modified.timestamp_millis(),
            meta.location,
        ));
    }
    orphans.sort();
    if dry_run {
        let paths: ArrayRef = Arc::new(StringArray::from_iter_values(
            orphans.iter().map(|o| o.0.as_str()),
        ));
        let sizes: ArrayRef = Arc::new(Int64Array::from_iter_values(orphans.iter().map(|o| o.1)));
        let times: ArrayRef = Arc::new(
            TimestampMillisecondArray::from_iter_values(orphans.iter().map(|o| o.2))
                .with_timezone("UTC"),
        );
        return Ok(RecordBatch::try_new(
            procedure.schema(),
            vec![paths, sizes, times],
        )?);
    }
    // Deleted by the key the store listed (not by a path parsed again).
    let results: Vec<std::result::Result<(), String>> = futures::stream::iter(orphans)
        .map(|(full, _, _, key)| {
            let store = store.clone();
            async move {
                match store.delete(&key).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(format!("cannot delete `{full}`: {e}")),
                }
            }
        })
        .buffer_unordered(DELETES_AT_ONCE)
        .collect()
        .await;
    let deleted = results.iter().filter(|r| r.is_ok()).count();
    if let Some(failure) = results.into_iter().find_map(|r| r.err()) {
        return Err(DataFusionError::Execution(format!(
            "deleted {deleted} orphan files, then: {failure}"
        )));
    }
    metrics(
        procedure,
        &[
            ("processed_manifests_count", processed_manifests),
            ("active_files_count", referenced.len()),
            ("scanned_files_count", scanned),
            ("deleted_files_count", deleted),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_thresholds() {
        assert_eq!(parse_duration_ms("7d").unwrap(), 7 * DAY_MS);
        assert_eq!(parse_duration_ms("1.5h").unwrap(), 5_400_000);
        assert_eq!(parse_duration_ms(" 30 m ").unwrap(), 1_800_000);
        assert!(parse_duration_ms("7 weeks").is_err());
        assert!(parse_duration_ms("-1d").is_err());
        let now = 100 * DAY_MS;
        let args = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            Procedure::parse("remove_orphan_files", &[], now).unwrap(),
            Procedure::RemoveOrphanFiles {
                older_than_ms: now - 7 * DAY_MS,
                dry_run: false
            }
        );
        let short = args(&[("retention_threshold", "1h")]);
        let e = Procedure::parse("remove_orphan_files", &short, now).unwrap_err();
        assert!(e.to_string().contains("allow_short_retention"), "{e}");
        let forced = args(&[
            ("retention_threshold", "1h"),
            ("allow_short_retention", "true"),
        ]);
        assert!(Procedure::parse("remove_orphan_files", &forced, now).is_ok());
        let e =
            Procedure::parse("expire_snapshots", &args(&[("retain_last", "0")]), now).unwrap_err();
        assert!(e.to_string().contains("retain_last"), "{e}");
        let e = Procedure::parse("expire_snapshots", &args(&[("bogus", "1")]), now).unwrap_err();
        assert!(e.to_string().contains("no argument `bogus`"), "{e}");
        assert!(Procedure::parse("optimise", &[], now).is_err());
        assert_eq!(
            Procedure::parse(
                "EXPIRE_SNAPSHOTS",
                &args(&[("older_than", "2026-12-01")]),
                1_900_000_000_000
            )
            .unwrap(),
            Procedure::ExpireSnapshots {
                older_than_ms: Some(1_796_083_200_000),
                retain_last: None
            }
        );
    }
}
