//! `MERGE INTO` an Iceberg table, copy-on-write: the front end plans the statement as a join
//! of the target (read whole file by whole file, each row with its file and ordinal) with the
//! source, each row's action, and windows that count the source rows matching each target
//! row and mark the target files that change (`basin_scheduler::merge`); the executors write
//! the rows of the changed files that stay, updated, and the inserted rows
//! ([`super::write::IcebergWriteExec`] in `merge` mode), and report the files they replace;
//! the front end commits one snapshot ([`super::IcebergRowChangeExec::merge`]).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use super::catalog::IcebergCatalog;
use super::table::IcebergTableSpec;
use super::write::count_schema;

/// Logical node: `MERGE INTO` the table `target` the rows of `input` (the table's columns,
/// then the merge columns of [`super::write::WriteSpec::merge`]).
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
