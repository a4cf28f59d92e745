//! `DELETE … WHERE` and `UPDATE` on Iceberg tables by rewriting the data files that hold
//! changed rows (copy-on-write), distributed over the executors:
//!
//! 1. The scheduler plans the files the condition may match (partition and statistics
//!    pruning, the same as a scan) and spreads them over the tasks of one Ballista stage
//!    ([`IcebergRewriteNode`] → [`IcebergRewriteExec`]).
//! 2. Each task reads, for each of its files, the condition's columns until a row matches
//!    (a file without one is left alone), then reads the matching files whole, with their
//!    delete files applied, and writes what is left of them: the rows the condition does not
//!    hold for (false or NULL), and for `UPDATE` the matched rows with their new values
//!    (computed only for matched rows, so `SET x = 1 / y WHERE y <> 0` never divides by zero).
//! 3. The front end commits one snapshot ([`IcebergRowChangeExec`]): the rewritten files are
//!    removed and the new ones added (`overwrite`, or `delete` when nothing is left), only if
//!    `main` is still the snapshot the statement read — a concurrent commit fails the
//!    statement as a conflict and nothing changes.
//!
//! The statement's result is the number of rows deleted or updated.

use std::any::Any;
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt64Array};
use datafusion::arrow::compute::kernels::boolean::not;
use datafusion::arrow::compute::{
    cast, concat_batches, filter_record_batch, prep_null_mask_filter,
};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::execution_props::ExecutionProps;
use datafusion::logical_expr::expr_rewriter::unnormalize_col;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, UserDefinedLogicalNodeCore};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr, create_physical_expr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion_proto::bytes::Serializeable;
use futures::{StreamExt, TryStreamExt};
use iceberg::TableIdent;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::expr::Predicate;
use iceberg::scan::FileScanTask;
use iceberg::spec::{DataFile, Operation};
use iceberg::table::Table;
use serde::{Deserialize, Serialize};

use super::catalog::{IcebergCatalog, error_text};
use super::commit::replace_files;
use super::scan::{IcebergScanExec, IdentityPartitions, ScanSpec};
use super::table::{IcebergTableSpec, balance, pruning_predicate, strip_task};
use super::write::{
    COMMIT_ID_PROPERTY, WriteSpec, Written, commit, count_schema, data_files_schema,
    deserialize_files, write_files,
};

/// What a statement changes in the rows it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RowChange {
    Delete,
    Update,
    /// Every row rewritten as it is (compaction).
    Optimize,
}

impl fmt::Display for RowChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RowChange::Delete => "DELETE",
            RowChange::Update => "UPDATE",
            RowChange::Optimize => "OPTIMIZE",
        })
    }
}

/// The condition and new values of a `DELETE` or `UPDATE`, over the table's columns
/// (unqualified), from the statement's logical plan.
#[derive(Debug, Clone)]
pub struct RowChangePlan {
    pub change: RowChange,
    /// `None`: every row.
    pub condition: Option<Expr>,
    /// `UPDATE`: each column's value for a matched row, in the table's column order.
    pub values: Vec<Expr>,
}

/// Reads the condition (and for `UPDATE` the new values) off the input DataFusion planned for
/// a `DELETE` or `UPDATE` of `table`: projections and filters over the table's scan. Anything
/// else (a join: `UPDATE … FROM`, a subquery in the condition) is refused, saying so.
pub fn row_change_plan(
    input: &LogicalPlan,
    change: RowChange,
    table: &str,
    columns: &SchemaRef,
) -> Result<RowChangePlan> {
    let refuse = |what: String| {
        DataFusionError::NotImplemented(format!(
            "{change} of `{table}` {what} is not supported yet: Basin changes rows of one \
             Iceberg table by a condition on its own columns (a MERGE statement is on its way)"
        ))
    };
    let mut values: Option<Vec<Expr>> = None;
    let mut conditions: Vec<Expr> = Vec::new();
    let mut node = input;
    loop {
        match node {
            LogicalPlan::Projection(p) => {
                match values.take() {
                    None if change == RowChange::Update => {
                        values = Some(p.expr.iter().map(|e| e.clone().unalias()).collect());
                    }
                    v => {
                        values = v
                            .map(|v| v.into_iter().map(|e| inline(e, p)).collect())
                            .transpose()?;
                    }
                }
                conditions = conditions
                    .into_iter()
                    .map(|e| inline(e, p))
                    .collect::<Result<_>>()?;
                node = p.input.as_ref();
            }
            LogicalPlan::Filter(f) => {
                conditions.push(f.predicate.clone());
                node = f.input.as_ref();
            }
            LogicalPlan::SubqueryAlias(a) => node = a.input.as_ref(),
            LogicalPlan::TableScan(scan) => {
                conditions.extend(scan.filters.iter().cloned());
                break;
            }
            LogicalPlan::EmptyRelation(e) if !e.produce_one_row => {
                // The optimizer found the condition never holds.
                conditions.push(Expr::Literal(false.into(), None));
                break;
            }
            other => {
                return Err(refuse(format!(
                    "with this plan ({})",
                    other.display().to_string().trim()
                )));
            }
        }
    }
    let condition = conjunction(conditions).map(unnormalize_col);
    if let Some(c) = &condition
        && c.exists(|e| {
            Ok(matches!(
                e,
                Expr::ScalarSubquery(_) | Expr::InSubquery(_) | Expr::Exists(_)
            ))
        })?
    {
        return Err(refuse("with a subquery in its condition".to_string()));
    }
    let values = match (change, values) {
        (RowChange::Delete | RowChange::Optimize, _) => Vec::new(),
        (RowChange::Update, Some(v)) => v.into_iter().map(unnormalize_col).collect(),
        (RowChange::Update, None) => columns
            .fields()
            .iter()
            .map(|f| Expr::Column(datafusion::common::Column::new_unqualified(f.name())))
            .collect(),
    };
    if change == RowChange::Update && values.len() != columns.fields().len() {
        return Err(DataFusionError::Internal(format!(
            "UPDATE of `{table}`: {} values for {} columns",
            values.len(),
            columns.fields().len()
        )));
    }
    Ok(RowChangePlan {
        change,
        condition,
        values,
    })
}

/// `expr` (over `p`'s output) over `p`'s input.
fn inline(expr: Expr, p: &Projection) -> Result<Expr> {
    Ok(expr
        .transform(|e| {
            let Expr::Column(c) = &e else {
                return Ok(Transformed::no(e));
            };
            let at = p.schema.index_of_column(c).ok().or_else(|| {
                let mut found = p
                    .schema
                    .fields()
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.name() == &c.name);
                match (found.next(), found.next()) {
                    (Some((i, _)), None) => Some(i),
                    _ => None,
                }
            });
            match at.and_then(|i| p.expr.get(i)) {
                Some(value) => Ok(Transformed::yes(value.clone().unalias())),
                None => Err(DataFusionError::Internal(format!(
                    "column {c} not found in a projection of the statement's plan"
                ))),
            }
        })?
        .data)
}

/// What the executors need to rewrite the files of one statement.
#[derive(Clone, Serialize, Deserialize)]
pub struct RewriteSpec {
    pub change: RowChange,
    /// Where and how new files are written (the table's current schema and spec).
    pub write: WriteSpec,
    /// The Iceberg schema of the table (JSON).
    pub schema_json: String,
    pub name_mapping: Option<String>,
    /// Whole data files (with their delete files), per task.
    pub groups: Vec<Vec<FileScanTask>>,
    /// Their identity partition values (a file may leave such a column out).
    #[serde(default)]
    pub identity_partitions: IdentityPartitions,
    /// The condition (DataFusion protobuf, base64); `None`: every row.
    pub condition: Option<String>,
    /// `UPDATE`: the new value of each column (DataFusion protobuf, base64).
    pub values: Vec<String>,
    /// Shown by EXPLAIN.
    pub shown: String,
    /// The condition as an Iceberg predicate (what pruning used): at the commit, whether a
    /// concurrent append added files it may match. Stays in the front end.
    #[serde(skip)]
    pub predicate: Option<Predicate>,
}

impl fmt::Debug for RewriteSpec {
    // The write spec's FileIO properties may hold credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RewriteSpec")
            .field("table", &self.write.table)
            .field("change", &self.change)
            .field("groups", &self.groups.len())
            .field("shown", &self.shown)
            .finish_non_exhaustive()
    }
}

fn encode(expr: &Expr) -> Result<String> {
    Ok(BASE64_STANDARD.encode(expr.to_bytes()?))
}

fn decode(text: &str, context: &TaskContext) -> Result<Expr> {
    let bytes = BASE64_STANDARD
        .decode(text)
        .map_err(|e| DataFusionError::Internal(format!("bad expression in plan: {e}")))?;
    Expr::from_bytes_with_registry(&bytes, context)
}

/// The whole-file scan tasks of `snapshot_id` of `table` that `predicate` may match (all of
/// them without one), with their delete files.
async fn planned_files(
    table: &Table,
    qualified: &str,
    snapshot_id: i64,
    predicate: Option<&Predicate>,
) -> Result<Vec<FileScanTask>> {
    let mut builder = table.scan().snapshot_id(snapshot_id).select_all();
    if let Some(p) = predicate {
        builder = builder.with_filter(p.clone());
    }
    let planning = |e: iceberg::Error| {
        DataFusionError::Execution(format!(
            "cannot plan the files of `{qualified}`: {}",
            error_text(&e)
        ))
    };
    builder
        .build()
        .map_err(planning)?
        .plan_files()
        .await
        .map_err(planning)?
        .try_collect()
        .await
        .map_err(planning)
}

/// A task that reads every row of its file (the rewrite applies the condition), small
/// enough to travel in the plan.
fn whole_file(task: FileScanTask) -> FileScanTask {
    let mut task = strip_task(task);
    task.predicate = None;
    task
}

/// Plans the rewrite of `plan` on `table` (as the statement read it): the files the condition
/// may match, spread over at most `target_partitions` tasks. `None` when no row can change.
pub async fn plan_rewrite(
    table: &IcebergTableSpec,
    plan: &RowChangePlan,
    target_partitions: usize,
) -> Result<Option<RewriteSpec>> {
    let qualified = table.qualified_name();
    let Some(snapshot_id) = table.snapshot_id else {
        return Ok(None);
    };
    let mut condition = plan.condition.clone();
    if let Some(c) = &condition
        && c.column_refs().is_empty()
    {
        // A constant condition: decided here.
        if !constant_holds(c)? {
            return Ok(None);
        }
        condition = None;
    }
    let predicate = match &condition {
        Some(c) => pruning_predicate(std::slice::from_ref(c), &table.provider_schema()?)?,
        None => None,
    };
    let tasks = planned_files(&table.table()?, &qualified, snapshot_id, predicate.as_ref()).await?;
    if tasks.is_empty() {
        return Ok(None);
    }
    let identity_partitions = IdentityPartitions::of(&tasks, false, &table.metadata);
    let tasks = tasks.into_iter().map(whole_file).collect();
    let groups = balance(
        tasks,
        &Default::default(),
        table.options.split_size,
        target_partitions,
    );
    let schema = table.metadata.current_schema();
    let shown = match (&plan.condition, plan.change) {
        (Some(c), _) => format!("where {c}"),
        (None, _) => "every row".to_string(),
    };
    Ok(Some(RewriteSpec {
        change: plan.change,
        write: WriteSpec::new(table),
        schema_json: serde_json::to_string(schema.as_ref())
            .map_err(|e| DataFusionError::Internal(e.to_string()))?,
        name_mapping: table
            .metadata
            .properties()
            .get("schema.name-mapping.default")
            .cloned(),
        groups,
        identity_partitions,
        condition: condition.as_ref().map(encode).transpose()?,
        values: plan.values.iter().map(encode).collect::<Result<_>>()?,
        shown,
        predicate,
    }))
}

fn constant_holds(condition: &Expr) -> Result<bool> {
    let schema = Arc::new(Schema::empty());
    let batch = RecordBatch::try_new_with_options(
        schema.clone(),
        vec![],
        &datafusion::arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(1)),
    )?;
    let physical = create_physical_expr(
        condition,
        &DFSchema::try_from(schema.as_ref().clone())?,
        &ExecutionProps::new(),
    )?;
    let value = physical.evaluate(&batch)?.into_array(1)?;
    Ok(value
        .as_any()
        .downcast_ref::<BooleanArray>()
        .is_some_and(|b| b.is_valid(0) && b.value(0)))
}

/// Logical node: rewrite the files of a `DELETE` or `UPDATE` (runs on the executors).
#[derive(Debug, Clone)]
pub struct IcebergRewriteNode {
    pub spec: RewriteSpec,
    schema: DFSchemaRef,
}

impl IcebergRewriteNode {
    pub fn new(spec: RewriteSpec) -> Result<Self> {
        Ok(Self {
            spec,
            schema: Arc::new(DFSchema::try_from(data_files_schema().as_ref().clone())?),
        })
    }
}

impl PartialEq for IcebergRewriteNode {
    fn eq(&self, other: &Self) -> bool {
        self.spec.write.write_id == other.spec.write.write_id
    }
}
impl Eq for IcebergRewriteNode {}
impl Hash for IcebergRewriteNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.spec.write.write_id.hash(state);
    }
}
impl PartialOrd for IcebergRewriteNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.spec
            .write
            .write_id
            .partial_cmp(&other.spec.write.write_id)
    }
}

impl UserDefinedLogicalNodeCore for IcebergRewriteNode {
    fn name(&self) -> &str {
        "IcebergRewrite"
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
            "IcebergRewrite: {} {} {}",
            self.spec.change, self.spec.write.table, self.spec.shown
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, _inputs: Vec<LogicalPlan>) -> Result<Self> {
        Ok(self.clone())
    }
}

/// Rewrites the files of its partition's group (see the module's documentation); outputs
/// the files removed and added.
#[derive(Debug)]
pub struct IcebergRewriteExec {
    spec: RewriteSpec,
    properties: Arc<PlanProperties>,
}

impl IcebergRewriteExec {
    pub fn new(spec: RewriteSpec) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(data_files_schema()),
            Partitioning::UnknownPartitioning(spec.groups.len().max(1)),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self { spec, properties }
    }

    pub fn spec(&self) -> &RewriteSpec {
        &self.spec
    }
}

impl DisplayAs for IcebergRewriteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergRewriteExec: {} {} {}, files={}",
            self.spec.change,
            self.spec.write.table,
            self.spec.shown,
            self.spec.groups.iter().map(Vec::len).sum::<usize>()
        )
    }
}

impl ExecutionPlan for IcebergRewriteExec {
    fn name(&self) -> &str {
        "IcebergRewriteExec"
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
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let tasks = self.spec.groups.get(partition).cloned().unwrap_or_default();
        let spec = self.spec.clone();
        let stream = futures::stream::once(async move {
            let (removed, added, changed) = rewrite(&spec, partition, tasks, context).await?;
            Written {
                added,
                removed: removed.into_iter().collect(),
                changed,
            }
            .into_batch()
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            data_files_schema(),
            stream,
        )))
    }
}

/// Reads `columns` (with their Iceberg field ids) of one whole data file, its deletes applied,
/// in the table's query types.
fn read_file(
    spec: &RewriteSpec,
    task: &FileScanTask,
    columns: &[(String, i32)],
    context: &Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let mut task = task.clone();
    task.project_field_ids = columns.iter().map(|c| c.1).collect();
    let names: Vec<String> = columns.iter().map(|c| c.0.clone()).collect();
    let scan = IcebergScanExec::try_new(ScanSpec {
        table: spec.write.table.clone(),
        snapshot_id: None,
        columns: names.clone(),
        read_no_columns: false,
        schema_json: spec.schema_json.clone(),
        output_fields: names,
        groups: vec![vec![task]],
        file_io: spec.write.file_io.clone(),
        name_mapping: spec.name_mapping.clone(),
        limit: None,
        stats: Default::default(),
        by_name: None,
        filter: None,
        row_identity: false,
        identity_partitions: spec.identity_partitions.clone(),
    })?;
    scan.execute(0, context.clone())
}

/// `expr` as a physical expression over `schema`.
fn physical(expr: &Expr, schema: &SchemaRef) -> Result<Arc<dyn PhysicalExpr>> {
    create_physical_expr(
        expr,
        &DFSchema::try_from(schema.as_ref().clone())?,
        &ExecutionProps::new(),
    )
}

/// Where the condition holds (false where it is false or NULL).
fn matches(condition: &dyn PhysicalExpr, batch: &RecordBatch, table: &str) -> Result<BooleanArray> {
    let value = condition.evaluate(batch)?.into_array(batch.num_rows())?;
    let mask = value
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| {
            DataFusionError::Plan(format!(
                "the condition on `{table}` is {}, not a boolean",
                value.data_type()
            ))
        })?;
    Ok(if mask.null_count() > 0 {
        prep_null_mask_filter(mask)
    } else {
        mask.clone()
    })
}

/// Rewrites the files of one task: returns the files removed, the files added (serialized)
/// and the number of rows changed.
async fn rewrite(
    spec: &RewriteSpec,
    partition: usize,
    tasks: Vec<FileScanTask>,
    context: Arc<TaskContext>,
) -> Result<(Vec<String>, Vec<String>, u64)> {
    let table = spec.write.table.clone();
    let iceberg_schema: iceberg::spec::Schema = serde_json::from_str(&spec.schema_json)
        .map_err(|e| DataFusionError::Internal(format!("bad Iceberg schema in plan: {e}")))?;
    let arrow = schema_to_arrow_schema(&iceberg_schema)
        .map_err(|e| DataFusionError::Plan(error_text(&e)))?;
    let full: SchemaRef = Arc::new(super::query_schema(&arrow));
    let all_columns: Vec<(String, i32)> = iceberg_schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| (f.name.clone(), f.id))
        .collect();
    let condition = spec
        .condition
        .as_deref()
        .map(|c| decode(c, &context))
        .transpose()?;

    // Which files hold a matching row: read the condition's columns until one does.
    let mut changed_files: Vec<FileScanTask> = Vec::new();
    match &condition {
        None => changed_files = tasks,
        Some(c) => {
            let names: HashSet<String> = c.column_refs().iter().map(|c| c.name.clone()).collect();
            let columns: Vec<(String, i32)> = all_columns
                .iter()
                .filter(|(n, _)| names.contains(n))
                .cloned()
                .collect();
            let indices = columns
                .iter()
                .map(|(n, _)| full.index_of(n))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let projected = Arc::new(full.project(&indices)?);
            let test = physical(c, &projected)?;
            for task in tasks {
                let mut stream = read_file(spec, &task, &columns, &context)?;
                while let Some(batch) = stream.next().await {
                    if matches(test.as_ref(), &batch?, &table)?.true_count() > 0 {
                        changed_files.push(task);
                        break;
                    }
                }
            }
        }
    }
    if changed_files.is_empty() {
        return Ok((Vec::new(), Vec::new(), 0));
    }

    // Rewrite them into new files.
    let test = condition.as_ref().map(|c| physical(c, &full)).transpose()?;
    let values = spec
        .values
        .iter()
        .map(|v| physical(&decode(v, &context)?, &full))
        .collect::<Result<Vec<_>>>()?;
    let changed = Arc::new(AtomicU64::new(0));
    let counter = changed.clone();
    let change = spec.change;
    let reads = changed_files
        .iter()
        .map(|t| read_file(spec, t, &all_columns, &context))
        .collect::<Result<Vec<_>>>()?;
    let schema = full.clone();
    let name = table.clone();
    let rows = futures::stream::iter(reads).flatten().map(move |batch| {
        let batch = batch?;
        let mask = match &test {
            Some(t) => matches(t.as_ref(), &batch, &name)?,
            None => BooleanArray::from(vec![true; batch.num_rows()]),
        };
        counter.fetch_add(mask.true_count() as u64, AtomicOrdering::Relaxed);
        let kept = filter_record_batch(&batch, &not(&mask)?)?;
        match change {
            RowChange::Delete => Ok(kept),
            RowChange::Optimize => Ok(batch),
            RowChange::Update => {
                let matched = filter_record_batch(&batch, &mask)?;
                let columns = values
                    .iter()
                    .zip(schema.fields())
                    .map(|(v, f)| {
                        let value = v.evaluate(&matched)?.into_array(matched.num_rows())?;
                        if value.data_type() == f.data_type() {
                            Ok(value)
                        } else {
                            Ok(cast(&value, f.data_type())?)
                        }
                    })
                    .collect::<Result<Vec<_>>>()?;
                let updated = RecordBatch::try_new(schema.clone(), columns)?;
                Ok(concat_batches(&schema, [&kept, &updated])?)
            }
        }
    });
    let input: SendableRecordBatchStream =
        Box::pin(RecordBatchStreamAdapter::new(full.clone(), rows));
    let task = format!("{}-{partition:05}", spec.write.write_id);
    let added = write_files(&spec.write, &task, input).await?;
    let removed = changed_files
        .into_iter()
        .map(|t| t.data_file_path)
        .collect();
    Ok((removed, added, changed.load(AtomicOrdering::Relaxed)))
}

/// Plans `optimize` on `table`: in each partition (of the files that may match `filter`), the
/// data files under `threshold` bytes or with delete files, when there are at least two of
/// them or one with deletes; one task per partition. `None` when nothing needs rewriting.
pub async fn plan_optimize(
    table: &IcebergTableSpec,
    filter: Option<&Expr>,
    threshold: u64,
) -> Result<Option<RewriteSpec>> {
    let qualified = table.qualified_name();
    let Some(snapshot_id) = table.snapshot_id else {
        return Ok(None);
    };
    let predicate = match filter {
        Some(f) => pruning_predicate(std::slice::from_ref(f), &table.provider_schema()?)?,
        None => None,
    };
    let tasks = planned_files(&table.table()?, &qualified, snapshot_id, predicate.as_ref()).await?;
    let mut partitions: std::collections::BTreeMap<String, Vec<FileScanTask>> =
        std::collections::BTreeMap::new();
    for task in tasks {
        if task.file_size_in_bytes >= threshold && task.deletes.is_empty() {
            continue;
        }
        let key = format!(
            "{:?}/{:?}",
            task.partition_spec.as_ref().map(|s| s.spec_id()),
            task.partition
        );
        partitions.entry(key).or_default().push(task);
    }
    let chosen: Vec<Vec<FileScanTask>> = partitions
        .into_values()
        .filter(|files| files.len() > 1 || files.iter().any(|t| !t.deletes.is_empty()))
        .collect();
    let identity_partitions =
        IdentityPartitions::of(chosen.iter().flatten(), false, &table.metadata);
    let groups: Vec<Vec<FileScanTask>> = chosen
        .into_iter()
        .map(|files| files.into_iter().map(whole_file).collect())
        .collect();
    if groups.is_empty() {
        return Ok(None);
    }
    let schema = table.metadata.current_schema();
    let values: Vec<Expr> = schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| Expr::Column(datafusion::common::Column::new_unqualified(&f.name)))
        .collect();
    Ok(Some(RewriteSpec {
        change: RowChange::Optimize,
        write: WriteSpec::new(table),
        schema_json: serde_json::to_string(schema.as_ref())
            .map_err(|e| DataFusionError::Internal(e.to_string()))?,
        name_mapping: table
            .metadata
            .properties()
            .get("schema.name-mapping.default")
            .cloned(),
        groups,
        identity_partitions,
        condition: None,
        values: values.iter().map(encode).collect::<Result<_>>()?,
        shown: format!("files under {threshold} bytes"),
        predicate: None,
    }))
}

/// The result of a statement that changes no row (nothing to read, nothing committed).
pub fn no_change() -> Result<Arc<dyn ExecutionPlan>> {
    let array: ArrayRef = Arc::new(UInt64Array::from(vec![0u64]));
    let batch = RecordBatch::try_new(count_schema(), vec![array])?;
    Ok(MemorySourceConfig::try_new_exec(
        &[vec![batch]],
        count_schema(),
        None,
    )?)
}

/// Commits the files of one `DELETE`, `UPDATE`, `MERGE` or `optimize` in one snapshot; runs
/// in the front end. Outputs the number of rows changed.
#[derive(Debug)]
pub struct IcebergRowChangeExec {
    catalog: Arc<IcebergCatalog>,
    ident: TableIdent,
    write: WriteSpec,
    /// Shown by EXPLAIN.
    operation: String,
    /// The snapshot the statement read, the files it considered there and its predicate:
    /// the commit checks what happened to the table since (see [`commit_rewrite`]). `None`:
    /// the table had no snapshot (a `MERGE` that can only insert: its files are appended).
    read: Option<Arc<ReadState>>,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

/// What a statement read, for the isolation check at its commit.
#[derive(Debug)]
struct ReadState {
    snapshot: i64,
    /// The files it may have changed; `predicate` matches no other file of its snapshot.
    candidates: HashSet<String>,
    /// `None`: any file.
    predicate: Option<Predicate>,
    /// Concurrent appends never conflict (a compaction changes no row).
    appends_commute: bool,
}

impl IcebergRowChangeExec {
    fn new(
        catalog: Arc<IcebergCatalog>,
        ident: TableIdent,
        write: WriteSpec,
        operation: String,
        read: Option<ReadState>,
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
            write,
            operation,
            read: read.map(Arc::new),
            input,
            properties,
        }
    }

    /// The commit of a rewrite planned as `spec` from `read_snapshot`.
    pub fn rewrite(
        catalog: Arc<IcebergCatalog>,
        ident: TableIdent,
        spec: &RewriteSpec,
        read_snapshot: i64,
        input: Arc<dyn ExecutionPlan>,
    ) -> Self {
        let read = ReadState {
            snapshot: read_snapshot,
            candidates: spec
                .groups
                .iter()
                .flatten()
                .map(|t| t.data_file_path.clone())
                .collect(),
            predicate: spec.predicate.clone(),
            appends_commute: spec.change == RowChange::Optimize,
        };
        let operation = spec.change.to_string();
        Self::new(
            catalog,
            ident,
            spec.write.clone(),
            operation,
            Some(read),
            input,
        )
    }

    /// The commit of a `MERGE` written as `write` from `read_snapshot`: it may have changed
    /// any file, so any commit since is a conflict.
    pub fn merge(
        catalog: Arc<IcebergCatalog>,
        ident: TableIdent,
        write: WriteSpec,
        read_snapshot: Option<i64>,
        input: Arc<dyn ExecutionPlan>,
    ) -> Self {
        let read = read_snapshot.map(|snapshot| ReadState {
            snapshot,
            candidates: HashSet::new(),
            predicate: None,
            appends_commute: false,
        });
        Self::new(catalog, ident, write, "MERGE".to_string(), read, input)
    }
}

impl DisplayAs for IcebergRowChangeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergCommitExec: table={}, operation={} (copy-on-write)",
            self.write.table, self.operation
        )
    }
}

impl ExecutionPlan for IcebergRowChangeExec {
    fn name(&self) -> &str {
        "IcebergRowChangeExec"
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
            DataFusionError::Internal("IcebergRowChangeExec needs one input".to_string())
        })?;
        Ok(Arc::new(Self {
            catalog: self.catalog.clone(),
            ident: self.ident.clone(),
            write: self.write.clone(),
            operation: self.operation.clone(),
            read: self.read.clone(),
            input,
            properties: self.properties.clone(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "IcebergRowChangeExec has one partition, asked for {partition}"
            )));
        }
        let input = self.input.clone();
        let catalog = self.catalog.clone();
        let ident = self.ident.clone();
        let write = self.write.clone();
        let read = self.read.clone();
        let stream = futures::stream::once(async move {
            let written = Written::collect(input, context).await?;
            let changed = written.changed;
            match &read {
                Some(read) => {
                    commit_rewrite(
                        &catalog,
                        &ident,
                        &write,
                        read,
                        written.removed,
                        written.added,
                    )
                    .await?
                }
                // No snapshot to have changed: nothing removed, the files appended.
                None if !written.added.is_empty() => {
                    commit(&catalog, &ident, &write, written.added).await?;
                }
                None => {}
            }
            let array: ArrayRef = Arc::new(UInt64Array::from(vec![changed]));
            Ok(RecordBatch::try_new(count_schema(), vec![array])?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            stream,
        )))
    }
}

/// Commits a rewrite: `removed` (paths) out, `added` (serialized data files) in, as of the
/// snapshot the statement read. Serializable isolation, as Iceberg defines it for
/// copy-on-write: when `main` moved since, the statement commits on top only if every commit
/// in between was an append and none of the files they added may hold a row the condition
/// matches (by partition values and column bounds); anything else fails as a conflict naming
/// the other snapshot, and nothing is committed. Up to [`COMMIT_ATTEMPTS`] races are retried.
async fn commit_rewrite(
    catalog: &Arc<IcebergCatalog>,
    ident: &TableIdent,
    write: &WriteSpec,
    read: &ReadState,
    removed: BTreeSet<String>,
    added: Vec<String>,
) -> Result<()> {
    let qualified = write.table.clone();
    if removed.is_empty() && added.is_empty() {
        return Ok(());
    }
    let metadata = &write.metadata;
    let spec_id = metadata.default_partition_spec_id();
    let files: Vec<DataFile> = deserialize_files(write, &added)?;
    let paths: Vec<String> = files.iter().map(|f| f.file_path().to_string()).collect();
    let mut attempt = 0;
    let result = loop {
        attempt += 1;
        let result = async {
            let table = catalog.load_table(ident).await?;
            isolation_check(&table, &qualified, read).await?;
            if table.metadata().default_partition_spec_id() != spec_id
                || table.metadata().current_schema_id() != metadata.current_schema_id()
            {
                return Err(DataFusionError::Execution(format!(
                    "conflict: the schema or partitioning of `{qualified}` changed while this \
                     statement ran; nothing was committed, run the statement again"
                )));
            }
            replace_files(
                catalog.committer(),
                &table,
                &qualified,
                |f, _| Ok(removed.contains(f.file_path())),
                files.clone(),
                &[
                    (COMMIT_ID_PROPERTY, write.write_id.as_str()),
                    ("engine-name", "basin"),
                ],
                read.appends_commute,
            )
            .await?;
            Ok(())
        }
        .await;
        match result {
            // Lost a race at the catalog: look again at what the other commit did.
            Err(DataFusionError::Execution(m))
                if m.starts_with("conflict: ")
                    && m.contains("was changed by another commit while")
                    && attempt < COMMIT_ATTEMPTS =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(50 * attempt as u64)).await;
            }
            other => break other,
        }
    };
    if let Err(e) = &result {
        tracing::warn!(
            table = %qualified,
            files = ?paths,
            error = %e,
            "statement failed before its commit; these data files are not part of the table and can be deleted"
        );
    }
    result
}

/// How many times a rewrite's commit is tried when the catalog reports a race.
const COMMIT_ATTEMPTS: u32 = 5;

/// Fails with a conflict unless every commit since the statement's snapshot was an append of
/// files its condition cannot match.
async fn isolation_check(table: &Table, qualified: &str, read: &ReadState) -> Result<()> {
    let metadata = table.metadata();
    let Some(current) = metadata.current_snapshot() else {
        return Err(rewrite_conflict(
            qualified,
            read.snapshot,
            "none",
            "the table was emptied",
        ));
    };
    if current.snapshot_id() == read.snapshot {
        return Ok(());
    }
    let mut at = Some(current.clone());
    let mut steps = 0;
    loop {
        let Some(snapshot) = at else {
            return Err(rewrite_conflict(
                qualified,
                read.snapshot,
                &current.snapshot_id().to_string(),
                "main no longer descends from the snapshot this statement read",
            ));
        };
        if snapshot.snapshot_id() == read.snapshot {
            break;
        }
        steps += 1;
        if snapshot.summary().operation != Operation::Append || steps > metadata.snapshots().len() {
            return Err(rewrite_conflict(
                qualified,
                read.snapshot,
                &snapshot.snapshot_id().to_string(),
                &format!("its operation is {:?}", snapshot.summary().operation).to_lowercase(),
            ));
        }
        at = snapshot
            .parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id).cloned());
    }
    if read.appends_commute {
        return Ok(());
    }
    // Only appends: conflict if one added a file the condition may match.
    let tasks = planned_files(
        table,
        qualified,
        current.snapshot_id(),
        read.predicate.as_ref(),
    )
    .await
    .map_err(|e| {
        e.context(format!(
            "cannot check `{qualified}` for conflicting commits"
        ))
    })?;
    if let Some(new) = tasks
        .iter()
        .find(|t| !read.candidates.contains(&t.data_file_path))
    {
        return Err(rewrite_conflict(
            qualified,
            read.snapshot,
            &current.snapshot_id().to_string(),
            &format!(
                "it added {}, which may hold rows this statement's condition matches",
                new.data_file_path
            ),
        ));
    }
    Ok(())
}

fn rewrite_conflict(qualified: &str, read: i64, other: &str, why: &str) -> DataFusionError {
    DataFusionError::Execution(format!(
        "conflict: `{qualified}` was changed by snapshot {other} while this statement ran from \
         snapshot {read} ({why}); nothing was committed, run the statement again"
    ))
}
