//! `MERGE INTO` an Iceberg table, copy-on-write: the front end plans the statement as a join
//! of the target (read whole file by whole file, each row with its file and ordinal) with the
//! source, each row's action, and windows that count the source rows matching each target
//! row and mark the target files that change (`basin_scheduler::merge`); the executors write
//! the rows of the changed files that stay, updated, and the inserted rows
//! ([`super::write::IcebergWriteExec`] in `merge` mode), and report the files they replace;
//! the front end commits one snapshot ([`IcebergMergeCommitExec`]).

use std::any::Any;
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use iceberg::TableIdent;

use super::catalog::IcebergCatalog;
use super::rewrite::{ReadState, commit_rewrite};
use super::table::IcebergTableSpec;
use super::write::{WriteSpec, Written, commit, count_schema};

/// Logical node: `MERGE INTO` the table `target` the rows of `input` (the table's columns,
/// then the merge columns of [`WriteSpec::merge`]).
#[derive(Debug, Clone)]
pub struct IcebergMergeNode {
    pub catalog: Arc<IcebergCatalog>,
    pub target: IcebergTableSpec,
    pub input: LogicalPlan,
    /// Unique per statement.
    pub id: String,
    schema: DFSchemaRef,
}

impl IcebergMergeNode {
    pub fn new(
        catalog: Arc<IcebergCatalog>,
        target: IcebergTableSpec,
        input: LogicalPlan,
    ) -> Result<Self> {
        Ok(Self {
            catalog,
            target,
            input,
            id: uuid::Uuid::now_v7().to_string(),
            schema: Arc::new(DFSchema::try_from(count_schema().as_ref().clone())?),
        })
    }
}

impl PartialEq for IcebergMergeNode {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.input == other.input
    }
}
impl Eq for IcebergMergeNode {}
impl Hash for IcebergMergeNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
        self.input.hash(state);
    }
}
impl PartialOrd for IcebergMergeNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.id.partial_cmp(&other.id)
    }
}

impl UserDefinedLogicalNodeCore for IcebergMergeNode {
    fn name(&self) -> &str {
        "IcebergMerge"
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
        write!(f, "IcebergMerge: table={}", self.target.qualified_name())
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("IcebergMerge needs one input".to_string()))?;
        Ok(Self {
            catalog: self.catalog.clone(),
            target: self.target.clone(),
            input,
            id: self.id.clone(),
            schema: self.schema.clone(),
        })
    }
}

/// Commits a `MERGE` in one snapshot (front end): the target files the executors rewrote
/// out, their files in. Serializable: the commit fails as a conflict when the table changed
/// since the statement read it (beyond appends of no data file), and nothing is committed.
/// Outputs the rows inserted, updated and deleted.
#[derive(Debug)]
pub struct IcebergMergeCommitExec {
    catalog: Arc<IcebergCatalog>,
    ident: TableIdent,
    spec: WriteSpec,
    read_snapshot: Option<i64>,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl IcebergMergeCommitExec {
    pub fn new(
        catalog: Arc<IcebergCatalog>,
        ident: TableIdent,
        spec: WriteSpec,
        read_snapshot: Option<i64>,
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
            read_snapshot,
            input,
            properties,
        }
    }
}

impl DisplayAs for IcebergMergeCommitExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergCommitExec: table={}, operation=merge (copy-on-write)",
            self.spec.table
        )
    }
}

impl ExecutionPlan for IcebergMergeCommitExec {
    fn name(&self) -> &str {
        "IcebergMergeCommitExec"
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
            DataFusionError::Internal("IcebergMergeCommitExec needs one input".to_string())
        })?;
        Ok(Arc::new(Self::new(
            self.catalog.clone(),
            self.ident.clone(),
            self.spec.clone(),
            self.read_snapshot,
            input,
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "IcebergMergeCommitExec has one partition, asked for {partition}"
            )));
        }
        let input = self.input.clone();
        let catalog = self.catalog.clone();
        let ident = self.ident.clone();
        let spec = self.spec.clone();
        let read_snapshot = self.read_snapshot;
        let stream = futures::stream::once(async move {
            let written = Written::collect(input, context).await?;
            let changed = written.changed;
            commit_merge(
                &catalog,
                &ident,
                &spec,
                read_snapshot,
                written.removed,
                written.added,
            )
            .await?;
            let array: ArrayRef = Arc::new(UInt64Array::from(vec![changed]));
            Ok(RecordBatch::try_new(count_schema(), vec![array])?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            stream,
        )))
    }
}

async fn commit_merge(
    catalog: &Arc<IcebergCatalog>,
    ident: &TableIdent,
    spec: &WriteSpec,
    read_snapshot: Option<i64>,
    removed: BTreeSet<String>,
    added: Vec<String>,
) -> Result<()> {
    if removed.is_empty() && added.is_empty() {
        return Ok(());
    }
    let Some(snapshot) = read_snapshot else {
        // The table had no snapshot: inserts only, appended (a table with a snapshot gets
        // them in a snapshot that requires `main` unchanged, as rows inserted because no
        // target row matched may meet one a concurrent commit added).
        return commit(catalog, ident, spec, added).await.map(|_| ());
    };
    let read = ReadState {
        snapshot,
        candidates: HashSet::new(),
        predicate: None,
        appends_commute: false,
    };
    commit_rewrite(catalog, ident, spec, &read, removed, added).await
}
