//! `IcebergScanExec`: reads the file scan tasks the scheduler planned, one group of files
//! per partition, on whichever executor runs the partition.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatchOptions;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{ColumnStatistics, Statistics};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr, conjunction};
use datafusion::physical_expr_common::physical_expr::is_dynamic_physical_expr;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation, PushedDown,
};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::{ArrowReaderBuilder, schema_to_arrow_schema};
use iceberg::io::FileIOBuilder;
use iceberg::scan::FileScanTask;
use iceberg::spec::NameMapping;
use serde::{Deserialize, Serialize};

use super::by_name::ByName;
use super::catalog::error_text;
use super::storage::BasinStorageFactory;

/// What the planner found, shown by `EXPLAIN`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScanPlanStats {
    /// Data files in the snapshot.
    pub files_total: u64,
    /// Data files left after partition and statistics pruning.
    pub files_planned: u64,
    pub bytes_planned: u64,
    /// Bytes of the columns read in the planned files (the manifests' column sizes, whole
    /// files), when every planned file records them: what the route choice sizes a query by.
    #[serde(default)]
    pub column_bytes_planned: Option<u64>,
    /// Delete files applied to the planned files.
    pub delete_files: u64,
    /// The Iceberg predicate used for pruning.
    pub predicate: Option<String>,
}

/// Everything executors need: small enough to travel in the plan.
#[derive(Clone, Serialize, Deserialize)]
pub struct ScanSpec {
    /// `catalog.namespace.table`, for messages and EXPLAIN.
    pub table: String,
    pub snapshot_id: Option<i64>,
    /// Columns read from the files.
    pub columns: Vec<String>,
    /// The query needs no column (count(*)): rows are counted, columns dropped.
    pub read_no_columns: bool,
    /// The Iceberg schema of the version read (JSON).
    pub schema_json: String,
    /// Output columns (names, in order).
    pub output_fields: Vec<String>,
    /// File scan tasks per output partition.
    pub groups: Vec<Vec<FileScanTask>>,
    /// FileIO properties (may hold credentials; never displayed).
    pub file_io: BTreeMap<String, String>,
    /// `schema.name-mapping.default`, for files written without field ids.
    pub name_mapping: Option<String>,
    pub limit: Option<usize>,
    pub stats: ScanPlanStats,
    /// Set when the files are read by DataFusion's Parquet reader, matching columns by name
    /// (see `by_name`); `None`: iceberg-rust's reader.
    #[serde(default)]
    pub by_name: Option<ByName>,
    /// The filters pushed into the scan (DataFusion protobuf, base64), for pruning row groups
    /// and pages on the by-name path.
    #[serde(default)]
    pub filter: Option<String>,
    /// Each output row carries its file and ordinal (`ROW_FILE_COLUMN`, `ROW_POS_COLUMN`);
    /// files are whole and read one at a time, without row filters.
    #[serde(default)]
    pub row_identity: bool,
    /// The partition specs (JSON, by id) of the files below, when they have identity
    /// fields over columns read; see [`IdentityPartitions`].
    #[serde(default)]
    pub identity_partitions: IdentityPartitions,
}

/// Whether `text` names `column` as a whole word.
fn mentions(text: &str, column: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(column).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + column.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// Identity partition values of planned files, which travel beside the tasks (a task's own
/// partition fields cannot be serialized): a file may leave an identity partition's column
/// out (Hive-style files, files registered by `add_files`), and readers then take the
/// column's value from the partition, as the Iceberg spec says.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct IdentityPartitions {
    /// Partition specs (JSON) by id.
    pub specs: BTreeMap<i32, String>,
    /// Data file path → (spec id, partition values as Iceberg's JSON single-value form).
    pub files: BTreeMap<String, (i32, serde_json::Value)>,
}

impl IdentityPartitions {
    /// What `tasks` need: those whose spec has an identity field (over a column they read,
    /// with `read_only`).
    pub fn of<'a>(
        tasks: impl IntoIterator<Item = &'a FileScanTask>,
        read_only: bool,
        metadata: &iceberg::spec::TableMetadata,
    ) -> Self {
        let mut out = Self::default();
        let any_identity = metadata.partition_specs_iter().any(|s| {
            s.fields()
                .iter()
                .any(|f| f.transform == iceberg::spec::Transform::Identity)
        });
        if !any_identity {
            return out;
        }
        for task in tasks {
            let Some(partition) = &task.partition else {
                continue;
            };
            // iceberg-rust 0.10's planning leaves the task's spec out: the table's spec
            // with as many fields as the partition has, when only one has.
            let spec = match &task.partition_spec {
                Some(spec) => spec,
                None => {
                    let mut fits = metadata
                        .partition_specs_iter()
                        .filter(|s| s.fields().len() == partition.fields().len());
                    match (fits.next(), fits.next()) {
                        (Some(spec), None) => spec,
                        _ => continue,
                    }
                }
            };
            let wanted = spec.fields().iter().any(|f| {
                f.transform == iceberg::spec::Transform::Identity
                    && (!read_only || task.project_field_ids.contains(&f.source_id))
            });
            if !wanted {
                continue;
            }
            let Ok(partition_type) = spec.partition_type(&task.schema) else {
                continue;
            };
            let Ok(values) = iceberg::spec::Literal::Struct(partition.clone())
                .try_into_json(&iceberg::spec::Type::Struct(partition_type))
            else {
                continue;
            };
            if !out.specs.contains_key(&spec.spec_id())
                && let Ok(json) = serde_json::to_string(spec.as_ref())
            {
                out.specs.insert(spec.spec_id(), json);
            }
            out.files
                .insert(task.data_file_path.clone(), (spec.spec_id(), values));
        }
        out
    }

    /// The specs, read once per execution.
    pub fn parsed_specs(&self) -> Result<HashMap<i32, Arc<iceberg::spec::PartitionSpec>>> {
        self.specs
            .iter()
            .map(|(id, json)| {
                serde_json::from_str(json)
                    .map(|s| (*id, Arc::new(s)))
                    .map_err(|e| {
                        DataFusionError::Internal(format!(
                            "partition spec {id} did not survive the trip to the executor: {e}"
                        ))
                    })
            })
            .collect()
    }

    /// Gives `task` its partition values and spec (from [`Self::parsed_specs`]) back, when
    /// they travelled.
    pub fn restore(
        &self,
        specs: &HashMap<i32, Arc<iceberg::spec::PartitionSpec>>,
        task: &mut FileScanTask,
    ) -> Result<()> {
        let Some((spec_id, values)) = self.files.get(&task.data_file_path) else {
            return Ok(());
        };
        let bad = |what: &str| {
            DataFusionError::Internal(format!(
                "the partition of `{}` did not survive the trip to the executor: {what}",
                task.data_file_path
            ))
        };
        let spec = specs.get(spec_id).ok_or_else(|| bad("no spec"))?.clone();
        let partition_type = spec
            .partition_type(&task.schema)
            .map_err(|e| bad(&error_text(&e)))?;
        match iceberg::spec::Literal::try_from_json(
            values.clone(),
            &iceberg::spec::Type::Struct(partition_type),
        ) {
            Ok(Some(iceberg::spec::Literal::Struct(partition))) => {
                // iceberg-rust's reader evaluates the task's predicate on the file's own
                // columns: a file without the column would lose every row of a condition on
                // it. Partition pruning already decided such conditions for the file, and
                // DataFusion filters the rows above the scan.
                if let Some(predicate) = &task.predicate {
                    let text = predicate.to_string();
                    let on_identity = spec
                        .fields()
                        .iter()
                        .filter(|f| f.transform == iceberg::spec::Transform::Identity)
                        .filter_map(|f| task.schema.field_by_id(f.source_id))
                        .any(|f| mentions(&text, &f.name));
                    if on_identity {
                        task.predicate = None;
                    }
                }
                task.partition = Some(partition);
                task.partition_spec = Some(spec);
                Ok(())
            }
            Ok(_) => Err(bad("not a struct")),
            Err(e) => Err(bad(&error_text(&e))),
        }
    }
}

impl fmt::Debug for ScanSpec {
    // The FileIO properties may hold credentials, and plans are logged with `{:?}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScanSpec")
            .field("table", &self.table)
            .field("snapshot_id", &self.snapshot_id)
            .field("columns", &self.columns)
            .field("groups", &self.groups.len())
            .field("limit", &self.limit)
            .field("by_name", &self.by_name.is_some())
            .finish_non_exhaustive()
    }
}

/// Reads planned Iceberg file scan tasks.
#[derive(Debug)]
pub struct IcebergScanExec {
    spec: ScanSpec,
    /// The whole table (version read) in Arrow.
    table_schema: SchemaRef,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// Bounds and null counts of the output columns over the planned files (from the
    /// manifests), for the planner's estimates; not sent to executors.
    column_stats: Option<Vec<ColumnStatistics>>,
    /// Filters pushed into the plan by DataFusion's physical filter pushdown (a join's or a
    /// TopK's dynamic filter, or a static one), in the columns of the table's Arrow schema:
    /// row groups and pages are pruned with them when each file is opened (a dynamic filter
    /// as it stands then). They only prune: the operators that pushed them still filter, so
    /// they are not sent to executors, where the executor pushes its own (see
    /// [`IcebergScanExec::handle_child_pushdown_result`]).
    pushed: Vec<Arc<dyn PhysicalExpr>>,
}

impl IcebergScanExec {
    /// The same scan with `pushed` as its pruning filters and metrics of its own.
    fn with_pushed(&self, pushed: Vec<Arc<dyn PhysicalExpr>>) -> Self {
        Self {
            spec: self.spec.clone(),
            table_schema: Arc::clone(&self.table_schema),
            schema: Arc::clone(&self.schema),
            properties: Arc::clone(&self.properties),
            metrics: ExecutionPlanMetricsSet::new(),
            column_stats: self.column_stats.clone(),
            pushed,
        }
    }

    pub fn try_new(spec: ScanSpec) -> Result<Self> {
        let iceberg_schema: iceberg::spec::Schema = serde_json::from_str(&spec.schema_json)
            .map_err(|e| DataFusionError::Internal(format!("bad Iceberg schema in plan: {e}")))?;
        let full = schema_to_arrow_schema(&iceberg_schema)
            .map_err(|e| DataFusionError::Plan(error_text(&e)))?;
        let mut full = super::query_schema(&full);
        if spec.row_identity {
            use datafusion::arrow::datatypes::{DataType, Field};
            let mut fields: Vec<Field> = full.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.push(Field::new(
                super::table::ROW_FILE_COLUMN,
                DataType::Utf8,
                false,
            ));
            fields.push(Field::new(
                super::table::ROW_POS_COLUMN,
                DataType::UInt64,
                false,
            ));
            full = datafusion::arrow::datatypes::Schema::new_with_metadata(
                fields,
                full.metadata().clone(),
            );
        }
        let indices = spec
            .output_fields
            .iter()
            .map(|name| full.index_of(name))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let schema = Arc::new(full.project(&indices)?);
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(spec.groups.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            spec,
            table_schema: Arc::new(full),
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
            column_stats: None,
            pushed: Vec::new(),
        })
    }

    /// `filter` (over this scan's output columns) over the table's columns, when the files
    /// are read by name and it names only columns read from them; `None`: not used.
    fn over_table_columns(&self, filter: &Arc<dyn PhysicalExpr>) -> Option<Arc<dyn PhysicalExpr>> {
        let by_name = self.spec.by_name.as_ref()?;
        let mut usable = true;
        let rewritten = Arc::clone(filter)
            .transform_up(|e| {
                let Some(column) = e.as_any().downcast_ref::<Column>() else {
                    return Ok(Transformed::no(e));
                };
                let field = self.schema.fields().get(column.index());
                let at = field
                    .filter(|f| f.name() == column.name() && by_name.fields.contains_key(f.name()))
                    .and_then(|f| self.table_schema.index_of(f.name()).ok());
                match at {
                    Some(at) => Ok(Transformed::yes(
                        Arc::new(Column::new(column.name(), at)) as Arc<dyn PhysicalExpr>
                    )),
                    None => {
                        usable = false;
                        Ok(Transformed::no(e))
                    }
                }
            })
            .ok()?
            .data;
        usable.then_some(rewritten)
    }

    /// The filters pushed into this scan, for EXPLAIN and tests.
    pub fn pushed_filters(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.pushed
    }

    /// Column statistics for the planner (one per output column, else ignored).
    pub fn with_column_statistics(mut self, stats: Option<Vec<ColumnStatistics>>) -> Self {
        self.column_stats = stats.filter(|s| s.len() == self.schema.fields().len());
        self
    }

    pub fn spec(&self) -> &ScanSpec {
        &self.spec
    }

    /// Batches as this scan's schema says (the files' field metadata dropped, no columns for
    /// `count(*)`), at most `limit` rows.
    /// Reads `tasks` one file at a time, each whole, and adds each row's file and ordinal.
    fn execute_with_row_identity(
        &self,
        tasks: Vec<FileScanTask>,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        use datafusion::arrow::array::{ArrayRef, StringArray, UInt64Array};
        let file_io = FileIOBuilder::new(Arc::new(BasinStorageFactory))
            .with_props(self.spec.file_io.clone())
            .build();
        let runtime = iceberg::Runtime::try_current()
            .map_err(|e| DataFusionError::Execution(error_text(&e)))?;
        let batch_size = context.session_config().batch_size();
        let schema = self.schema.clone();
        // Where each output column comes from: a column read (its index), or the identity.
        let read_columns = if self.spec.read_no_columns {
            Vec::new()
        } else {
            self.spec.columns.clone()
        };
        let sources: Vec<Option<usize>> = self
            .spec
            .output_fields
            .iter()
            .map(|name| read_columns.iter().position(|c| c == name))
            .collect();
        let table = self.spec.table.clone();
        let streams = tasks.into_iter().map(move |task| {
            let path = task.data_file_path.clone();
            let reader = ArrowReaderBuilder::new(file_io.clone(), runtime.clone())
                .with_batch_size(batch_size)
                .with_data_file_concurrency_limit(1)
                .build();
            let schema = schema.clone();
            let sources = sources.clone();
            let table = table.clone();
            let mut next = 0u64;
            let fail = move |e: iceberg::Error| {
                DataFusionError::Execution(format!("cannot read `{table}`: {}", error_text(&e)))
            };
            let stream = match reader.read(Box::pin(futures::stream::iter([Ok(task)]))) {
                Ok(s) => s.stream().map_err(fail).boxed(),
                Err(e) => futures::stream::once(async move { Err(fail(e)) }).boxed(),
            };
            stream.map(move |batch| {
                let batch = batch?;
                let rows = batch.num_rows();
                let columns = sources
                    .iter()
                    .zip(schema.fields())
                    .map(|(source, field)| {
                        let column: ArrayRef = match source {
                            Some(i) => batch.column(*i).clone(),
                            None if field.name() == super::table::ROW_FILE_COLUMN => {
                                Arc::new(StringArray::from(vec![path.as_str(); rows]))
                            }
                            None => {
                                Arc::new(UInt64Array::from_iter_values(next..next + rows as u64))
                            }
                        };
                        if column.data_type() == field.data_type() {
                            Ok(column)
                        } else {
                            cast(&column, field.data_type()).map_err(DataFusionError::from)
                        }
                    })
                    .collect::<Result<Vec<_>>>()?;
                next += rows as u64;
                Ok(RecordBatch::try_new_with_options(
                    schema.clone(),
                    columns,
                    &RecordBatchOptions::new().with_row_count(Some(rows)),
                )?)
            })
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::iter(streams).flatten(),
        )))
    }

    fn conform(
        &self,
        partition: usize,
        stream: impl futures::Stream<Item = Result<RecordBatch>> + Send + 'static,
    ) -> SendableRecordBatchStream {
        // Rows returned: what pruning (statistics, pushed and dynamic filters) left.
        let output_rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let schema = self.schema.clone();
        let read_no_columns = self.spec.read_no_columns;
        let mut remaining = self.spec.limit;
        let stream = stream
            .map(move |batch| {
                let batch = batch?;
                let columns = if read_no_columns {
                    vec![]
                } else {
                    // iceberg-rust's reader gives plain strings: views of them (no copy).
                    batch
                        .columns()
                        .iter()
                        .zip(schema.fields())
                        .map(|(c, f)| {
                            if c.data_type() == f.data_type() {
                                Ok(c.clone())
                            } else {
                                cast(c, f.data_type())
                            }
                        })
                        .collect::<std::result::Result<Vec<_>, _>>()?
                };
                Ok(RecordBatch::try_new_with_options(
                    schema.clone(),
                    columns,
                    &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
                )?)
            })
            .try_filter_map(move |batch: RecordBatch| {
                let out = match remaining.as_mut() {
                    None => Some(batch),
                    Some(0) => None,
                    Some(left) => {
                        let take = batch.num_rows().min(*left);
                        *left -= take;
                        Some(batch.slice(0, take))
                    }
                };
                if let Some(batch) = &out {
                    output_rows.add(batch.num_rows());
                }
                futures::future::ready(Ok(out))
            });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream))
    }
}

impl DisplayAs for IcebergScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let s = &self.spec.stats;
        write!(
            f,
            "IcebergScanExec: table={}, snapshot={}, partitions={}, files={} of {} \
             (pruned {} by partition and statistics), bytes={}{}, delete_files={}, columns=[{}]",
            self.spec.table,
            self.spec
                .snapshot_id
                .map_or_else(|| "none".to_string(), |s| s.to_string()),
            self.spec.groups.len(),
            s.files_planned,
            s.files_total,
            s.files_total.saturating_sub(s.files_planned),
            s.bytes_planned,
            s.column_bytes_planned
                .map_or_else(String::new, |b| format!(", column_bytes={b}")),
            s.delete_files,
            self.spec.output_fields.join(", ")
        )?;
        if let Some(p) = &s.predicate {
            write!(f, ", predicate=[{p}]")?;
        }
        if let Some(limit) = self.spec.limit {
            write!(f, ", limit={limit}")?;
        }
        if !self.pushed.is_empty() {
            let shown = self
                .pushed
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(" AND ");
            write!(f, ", pruning_filters=[{shown}]")?;
        }
        let reader = if self.spec.by_name.is_some() {
            "datafusion-parquet"
        } else {
            "iceberg-rust"
        };
        write!(f, ", reader={reader}")
    }
}

impl ExecutionPlan for IcebergScanExec {
    fn name(&self) -> &str {
        "IcebergScanExec"
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
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "IcebergScanExec has no children".to_string(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let Some(tasks) = self.spec.groups.get(partition) else {
            if partition == 0 && self.spec.groups.is_empty() {
                return Ok(Box::pin(RecordBatchStreamAdapter::new(
                    self.schema.clone(),
                    futures::stream::empty(),
                )));
            }
            return Err(DataFusionError::Internal(format!(
                "IcebergScanExec has {} partitions, asked for partition {partition}",
                self.spec.groups.len()
            )));
        };
        let name_mapping: Option<Arc<NameMapping>> = match &self.spec.name_mapping {
            Some(raw) => Some(Arc::new(serde_json::from_str(raw).map_err(|e| {
                DataFusionError::Execution(format!(
                    "table `{}`: bad schema.name-mapping.default: {e}",
                    self.spec.table
                ))
            })?)),
            None => None,
        };
        let partition_specs = self.spec.identity_partitions.parsed_specs()?;
        let tasks: Vec<FileScanTask> = tasks
            .iter()
            .cloned()
            .map(|mut t| {
                t.name_mapping = name_mapping.clone();
                self.spec
                    .identity_partitions
                    .restore(&partition_specs, &mut t)?;
                Ok(t)
            })
            .collect::<Result<_>>()?;
        let bytes = MetricBuilder::new(&self.metrics).counter("bytes_scanned", partition);
        let files = MetricBuilder::new(&self.metrics).counter("files_scanned", partition);
        files.add(tasks.len());
        bytes.add(tasks.iter().map(|t| t.length as usize).sum());
        if self.spec.row_identity {
            return self.execute_with_row_identity(tasks, context);
        }
        if let Some(by_name) = &self.spec.by_name {
            let stream = super::by_name::execute(
                &self.spec,
                by_name,
                &self.table_schema,
                &tasks,
                (!self.pushed.is_empty()).then(|| conjunction(self.pushed.iter().cloned())),
                context,
            )?;
            return Ok(self.conform(partition, stream));
        }
        let file_io = FileIOBuilder::new(Arc::new(BasinStorageFactory))
            .with_props(self.spec.file_io.clone())
            .build();
        let runtime = iceberg::Runtime::try_current()
            .map_err(|e| DataFusionError::Execution(error_text(&e)))?;
        let reader = ArrowReaderBuilder::new(file_io, runtime)
            .with_batch_size(context.session_config().batch_size())
            .with_data_file_concurrency_limit(2)
            .with_row_group_filtering_enabled(true)
            .with_row_selection_enabled(true)
            .build();
        let table = self.spec.table.clone();
        let stream = reader
            .read(Box::pin(futures::stream::iter(tasks.into_iter().map(Ok))))
            .map_err(|e| {
                DataFusionError::Execution(format!("cannot read `{table}`: {}", error_text(&e)))
            })?
            .stream();
        let table = self.spec.table.clone();
        let stream = stream.map_err(move |e| {
            DataFusionError::Execution(format!("cannot read `{table}`: {}", error_text(&e)))
        });
        Ok(self.conform(partition, stream))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// The same scan with metrics of its own (an executor that runs several partitions
    /// of a stage from one decoded plan gives each task its own copy).
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        // A dynamic filter belongs to the operator that pushed it, and that operator's reset
        // drops it: kept, it would prune the next run with the last run's values.
        let kept = self.pushed.iter().filter(|p| !is_dynamic_physical_expr(p));
        Ok(Arc::new(self.with_pushed(kept.cloned().collect())))
    }

    /// Filters from above (a hash join's keys on its build side, a TopK's bound, a
    /// `FilterExec`'s predicate) prune the row groups and pages of the files read by name;
    /// each stays with the operator that pushed it (`PushedDown::No`), as `ParquetSource`
    /// does without `pushdown_filters`, so that no row is ever dropped by the scan alone.
    /// Filters are not encoded for executors: a dynamic filter is updated in the process
    /// that runs its join, so an executor that runs a whole plan pushes them again after
    /// decoding it (`basin_executor::flight`).
    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let filters = child_pushdown_result
            .parent_filters
            .into_iter()
            .map(|f| f.filter)
            .collect::<Vec<_>>();
        let result = FilterPushdownPropagation::with_parent_pushdown_result(vec![
            PushedDown::No;
            filters.len()
        ]);
        let usable = filters
            .iter()
            .filter_map(|f| self.over_table_columns(f))
            .collect::<Vec<_>>();
        if usable.is_empty() {
            return Ok(result);
        }
        let mut pushed = self.pushed.clone();
        pushed.extend(usable);
        Ok(result.with_updated_node(Arc::new(self.with_pushed(pushed))))
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Statistics> {
        let tasks: Vec<&FileScanTask> = match partition {
            Some(p) => self
                .spec
                .groups
                .get(p)
                .map(|g| g.iter().collect())
                .unwrap_or_default(),
            None => self.spec.groups.iter().flatten().collect(),
        };
        let rows: Option<u64> = tasks
            .iter()
            .map(|t| t.record_count)
            .try_fold(0u64, |acc, r| r.map(|r| acc + r));
        let bytes: u64 = tasks.iter().map(|t| t.length).sum();
        let has_deletes = tasks.iter().any(|t| !t.deletes.is_empty());
        // A range of a file (one of its row groups) carries a share of the file's count by
        // bytes: exact only over the whole scan, where the shares add up.
        let shares = partition.is_some()
            && tasks
                .iter()
                .any(|t| t.start != 0 || t.length != t.file_size_in_bytes);
        let num_rows = match rows {
            Some(r)
                if !has_deletes
                    && !shares
                    && self.spec.limit.is_none()
                    && self.spec.stats.predicate.is_none() =>
            {
                Precision::Exact(r as usize)
            }
            Some(r) => Precision::Inexact(r as usize),
            None => Precision::Absent,
        };
        let mut stats = Statistics::new_unknown(&self.schema);
        stats.num_rows = num_rows;
        stats.total_byte_size = Precision::Inexact(bytes as usize);
        if partition.is_none()
            && let Some(columns) = &self.column_stats
        {
            stats.column_statistics = columns.clone();
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::PhysicalExpr;
    use datafusion::physical_expr::expressions::{
        BinaryExpr, Column, DynamicFilterPhysicalExpr, lit,
    };
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::filter_pushdown::{
        ChildFilterPushdownResult, ChildPushdownResult, FilterPushdownPhase, PushedDown,
    };
    use datafusion::physical_plan::{ExecutionPlan, collect};
    use datafusion::prelude::SessionContext;
    use iceberg::scan::FileScanTask;
    use iceberg::spec::{DataFileFormat, NestedField, PrimitiveType, Type};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::{ByName, IcebergScanExec, ScanSpec};

    /// A table `(k long, v string)` of one Parquet file with 4 row groups of 100 rows,
    /// `k` = 0..400 in order; the scan's output columns are `v, k` (another order than the
    /// table's, so that pushed filters' columns must be reassigned).
    fn scan(name: &str) -> (IcebergScanExec, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("basin-scan-pushdown-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.parquet");
        let id = |n: i32| HashMap::from([("PARQUET:field_id".to_string(), n.to_string())]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false).with_metadata(id(1)),
            Field::new("v", DataType::Utf8, true).with_metadata(id(2)),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..400)),
                Arc::new(StringArray::from_iter_values(
                    (0..400).map(|k| format!("v{k}")),
                )),
            ],
        )
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .build();
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        let iceberg_schema = iceberg::spec::Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "k", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "v", Type::Primitive(PrimitiveType::String)).into(),
            ])
            .build()
            .unwrap();
        let task = FileScanTask::builder()
            .with_file_size_in_bytes(size)
            .with_start(0)
            .with_length(size)
            .with_record_count(Some(400))
            .with_data_file_path(path.to_str().unwrap().to_string())
            .with_data_file_format(DataFileFormat::Parquet)
            .with_schema(Arc::new(iceberg_schema.clone()))
            .with_project_field_ids(vec![2, 1])
            .with_case_sensitive(true)
            .build();
        let spec = ScanSpec {
            table: "lake.s.t".to_string(),
            snapshot_id: None,
            columns: vec!["v".to_string(), "k".to_string()],
            read_no_columns: false,
            schema_json: serde_json::to_string(&iceberg_schema).unwrap(),
            output_fields: vec!["v".to_string(), "k".to_string()],
            groups: vec![vec![task]],
            file_io: BTreeMap::new(),
            name_mapping: None,
            limit: None,
            stats: Default::default(),
            by_name: Some(ByName {
                fields: BTreeMap::from([("k".to_string(), 1), ("v".to_string(), 2)]),
                ids_optional: false,
            }),
            filter: None,
            row_identity: false,
            identity_partitions: Default::default(),
        };
        (IcebergScanExec::try_new(spec).unwrap(), dir)
    }

    /// `k` (output column 1) `op` `value`.
    fn k(op: Operator, value: i64) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(
            Arc::new(Column::new("k", 1)),
            op,
            lit(ScalarValue::Int64(Some(value))),
        ))
    }

    fn and(a: Arc<dyn PhysicalExpr>, b: Arc<dyn PhysicalExpr>) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(a, Operator::And, b))
    }

    /// The scan with `filters` pushed into it; each must be left to the operator above.
    fn pushed(
        scan: &IcebergScanExec,
        filters: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Arc<dyn ExecutionPlan> {
        let n = filters.len();
        let result = scan
            .handle_child_pushdown_result(
                FilterPushdownPhase::Post,
                ChildPushdownResult {
                    parent_filters: filters
                        .into_iter()
                        .map(|filter| ChildFilterPushdownResult {
                            filter,
                            child_results: vec![],
                        })
                        .collect(),
                    self_filters: vec![],
                },
                &Default::default(),
            )
            .unwrap();
        assert_eq!(result.filters.len(), n);
        assert!(result.filters.iter().all(|f| matches!(f, PushedDown::No)));
        result
            .updated_node
            .expect("filters on the columns read are taken")
    }

    /// The values of `k` a plan returns, in order.
    async fn keys(plan: Arc<dyn ExecutionPlan>) -> Vec<i64> {
        let ctx = SessionContext::new();
        let batches = collect(plan, ctx.task_ctx()).await.unwrap();
        let mut keys: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let column = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
                column.values().to_vec()
            })
            .collect();
        keys.sort_unstable();
        keys
    }

    #[tokio::test]
    async fn a_pushed_filter_prunes_row_groups_and_the_filter_above_keeps_its_rows() {
        let (scan, dir) = scan("static");
        let whole = IcebergScanExec::try_new(scan.spec().clone()).unwrap();
        assert_eq!(keys(Arc::new(whole)).await.len(), 400);
        let filter = and(k(Operator::GtEq, 150), k(Operator::Lt, 160));
        let plan = pushed(&scan, vec![filter.clone()]);
        let shown = datafusion::physical_plan::displayable(plan.as_ref())
            .one_line()
            .to_string();
        assert!(
            shown.contains("pruning_filters=[k@0 >= 150 AND k@0 < 160]"),
            "{shown}"
        );
        // Only the second row group (k 100..199) is read.
        assert_eq!(keys(plan.clone()).await, (100..200).collect::<Vec<_>>());
        // The filter stays above the scan and gives exactly its rows.
        let filtered = Arc::new(FilterExec::try_new(filter, plan).unwrap());
        assert_eq!(keys(filtered).await, (150..160).collect::<Vec<_>>());
        // A filter on a column the scan does not output by that name is not taken.
        let wrong: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            Arc::new(Column::new("k", 0)),
            Operator::Eq,
            lit(ScalarValue::Int64(Some(1))),
        ));
        let result = scan
            .handle_child_pushdown_result(
                FilterPushdownPhase::Pre,
                ChildPushdownResult {
                    parent_filters: vec![ChildFilterPushdownResult {
                        filter: wrong,
                        child_results: vec![],
                    }],
                    self_filters: vec![],
                },
                &Default::default(),
            )
            .unwrap();
        assert!(matches!(result.filters[..], [PushedDown::No]));
        assert!(result.updated_node.is_none());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_dynamic_filter_prunes_as_it_stands_when_the_file_is_opened() {
        let (scan, dir) = scan("dynamic");
        let dynamic = Arc::new(DynamicFilterPhysicalExpr::new(
            vec![Arc::new(Column::new("k", 1))],
            lit(true),
        ));
        let plan = pushed(&scan, vec![dynamic.clone() as Arc<dyn PhysicalExpr>]);
        // Before the join's build side is known: every row.
        assert_eq!(keys(plan.clone()).await.len(), 400);
        // Updated after planning (the build side's keys are 250..=260): the row group of
        // 200..299 only.
        dynamic
            .update(and(k(Operator::GtEq, 250), k(Operator::LtEq, 260)))
            .unwrap();
        assert_eq!(keys(plan.clone()).await, (200..300).collect::<Vec<_>>());
        // A reset plan (run again) drops the last run's dynamic filter.
        let reset = plan.reset_state().unwrap();
        assert_eq!(keys(reset).await.len(), 400);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_hash_joins_dynamic_filter_reaches_the_scan_of_its_probe_side() {
        use datafusion::common::NullEquality;
        use datafusion::datasource::memory::MemorySourceConfig;
        use datafusion::logical_expr::JoinType;
        use datafusion::physical_optimizer::PhysicalOptimizerRule;
        use datafusion::physical_optimizer::filter_pushdown::FilterPushdown;
        use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};

        let (scan, dir) = scan("join");
        // The build side: keys 250..=260.
        let keys_schema = Arc::new(Schema::new(vec![Field::new("key", DataType::Int64, false)]));
        let build = RecordBatch::try_new(
            keys_schema.clone(),
            vec![Arc::new(Int64Array::from_iter_values(250..=260))],
        )
        .unwrap();
        let build = MemorySourceConfig::try_new_exec(&[vec![build]], keys_schema, None).unwrap();
        let join = |scan: IcebergScanExec| -> Arc<dyn ExecutionPlan> {
            Arc::new(
                HashJoinExec::try_new(
                    build.clone(),
                    Arc::new(scan),
                    vec![(
                        Arc::new(Column::new("key", 0)) as _,
                        Arc::new(Column::new("k", 1)) as _,
                    )],
                    None,
                    &JoinType::Inner,
                    None,
                    PartitionMode::CollectLeft,
                    NullEquality::NullEqualsNothing,
                    false,
                )
                .unwrap(),
            )
        };
        let rows_read = |plan: &Arc<dyn ExecutionPlan>| {
            let scan = &plan.children()[1];
            scan.metrics().and_then(|m| m.output_rows()).unwrap()
        };
        let ctx = SessionContext::new();
        let count = |batches: Vec<RecordBatch>| batches.iter().map(|b| b.num_rows()).sum::<usize>();
        // Without the pushdown (what a decoded plan is), the whole file is read.
        let plain = join(IcebergScanExec::try_new(scan.spec().clone()).unwrap());
        assert_eq!(
            count(collect(plain.clone(), ctx.task_ctx()).await.unwrap()),
            11
        );
        assert_eq!(rows_read(&plain), 400);
        // The post-optimization pushdown (what the executor runs after decoding): the join's
        // keys reach the scan, which reads one row group of four; same answer.
        let options = ctx.state().config_options().clone();
        let pushed = FilterPushdown::new_post_optimization()
            .optimize(join(scan), &options)
            .unwrap();
        let shown = datafusion::physical_plan::displayable(pushed.as_ref())
            .indent(false)
            .to_string();
        assert!(shown.contains("pruning_filters=[DynamicFilter"), "{shown}");
        assert_eq!(
            count(collect(pushed.clone(), ctx.task_ctx()).await.unwrap()),
            11
        );
        assert_eq!(rows_read(&pushed), 100);
        let _ = std::fs::remove_dir_all(dir);
    }
}
