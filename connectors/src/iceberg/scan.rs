//! `IcebergScanExec`: reads the file scan tasks the scheduler planned, one group of files
//! per partition, on whichever executor runs the partition.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatchOptions;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, Statistics};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
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
}

impl IcebergScanExec {
    pub fn try_new(spec: ScanSpec) -> Result<Self> {
        let iceberg_schema: iceberg::spec::Schema = serde_json::from_str(&spec.schema_json)
            .map_err(|e| DataFusionError::Internal(format!("bad Iceberg schema in plan: {e}")))?;
        let full = schema_to_arrow_schema(&iceberg_schema)
            .map_err(|e| DataFusionError::Plan(error_text(&e)))?;
        let full = super::query_schema(&full);
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
        })
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
    fn conform(
        &self,
        stream: impl futures::Stream<Item = Result<RecordBatch>> + Send + 'static,
    ) -> SendableRecordBatchStream {
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
        let tasks: Vec<FileScanTask> = tasks
            .iter()
            .cloned()
            .map(|mut t| {
                t.name_mapping = name_mapping.clone();
                t
            })
            .collect();
        let bytes = MetricBuilder::new(&self.metrics).counter("bytes_scanned", partition);
        let files = MetricBuilder::new(&self.metrics).counter("files_scanned", partition);
        files.add(tasks.len());
        bytes.add(tasks.iter().map(|t| t.length as usize).sum());
        if let Some(by_name) = &self.spec.by_name {
            let stream =
                super::by_name::execute(&self.spec, by_name, &self.table_schema, &tasks, context)?;
            return Ok(self.conform(stream));
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
        Ok(self.conform(stream))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// The same scan with metrics of its own (an executor that runs several partitions
    /// of a stage from one decoded plan gives each task its own copy).
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self {
            spec: self.spec.clone(),
            table_schema: Arc::clone(&self.table_schema),
            schema: Arc::clone(&self.schema),
            properties: Arc::clone(&self.properties),
            metrics: ExecutionPlanMetricsSet::new(),
            column_stats: self.column_stats.clone(),
        }))
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
