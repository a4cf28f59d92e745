//! `DELETE FROM t [WHERE …]` and `TRUNCATE TABLE t` on Iceberg tables, by whole data files
//! (Trino's "metadata delete"): without a condition every data file goes; with one, the
//! condition may only name columns the table is partitioned by with the identity transform,
//! so that it holds for all of a file's rows or for none, and it is decided per file from the
//! file's partition values. One snapshot (operation `delete`) removes those files; nothing
//! is rewritten. A condition on other columns needs files rewritten (or position deletes),
//! which Basin does not do yet: the statement fails saying so, and nothing changes.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, UInt64Array};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, create_physical_expr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use iceberg::TableIdent;
use iceberg::spec::{DataFile, Literal, PartitionSpec, Transform, Type};

use super::catalog::IcebergCatalog;
use super::commit::remove_files;
use super::write::count_schema;

/// Whether `condition` can be decided for whole data files of `table`: it names only columns
/// that every partition spec of the table partitions by as they are (identity), and is not
/// volatile. Then a `DELETE` removes files without reading them.
pub fn by_whole_files(condition: &Expr, table: &iceberg::spec::TableMetadata) -> bool {
    if condition.is_volatile() {
        return false;
    }
    let schema = table.current_schema();
    condition.column_refs().iter().all(|c| {
        schema.field_by_name(&c.name).is_some_and(|field| {
            table.partition_specs_iter().all(|spec| {
                spec.fields()
                    .iter()
                    .any(|p| p.source_id == field.id && p.transform == Transform::Identity)
            })
        })
    })
}

/// Deletes whole data files of an Iceberg table (see the module's documentation), in the
/// front end; returns the number of rows deleted.
#[derive(Debug)]
pub struct IcebergDeleteExec {
    catalog: Arc<IcebergCatalog>,
    ident: TableIdent,
    /// The table's columns as the query sees them (the condition's types).
    columns: SchemaRef,
    condition: Option<Expr>,
    properties: Arc<PlanProperties>,
}

impl IcebergDeleteExec {
    pub fn new(
        catalog: Arc<IcebergCatalog>,
        ident: TableIdent,
        columns: SchemaRef,
        condition: Option<Expr>,
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
            columns,
            condition,
            properties,
        }
    }
}

impl DisplayAs for IcebergDeleteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergDeleteExec: table={}",
            self.catalog.qualified(&self.ident)
        )?;
        if let Some(c) = &self.condition {
            write!(f, ", files where {c}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for IcebergDeleteExec {
    fn name(&self) -> &str {
        "IcebergDeleteExec"
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
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let catalog = self.catalog.clone();
        let ident = self.ident.clone();
        let columns = self.columns.clone();
        let condition = self.condition.clone();
        let stream = futures::stream::once(async move {
            let qualified = catalog.qualified(&ident);
            // The table as it is now: the commit requires that it is still so.
            let table = catalog.load_table(&ident).await?;
            let decide = match &condition {
                None => None,
                Some(c) => Some(FileCondition::new(c, &columns, &table, &qualified)?),
            };
            let removed =
                remove_files(
                    catalog.committer(),
                    &table,
                    &qualified,
                    |file, spec| match &decide {
                        None => Ok(true),
                        Some(d) => d.holds(file, spec),
                    },
                )
                .await?;
            let rows: ArrayRef = Arc::new(UInt64Array::from(vec![removed.removed_rows]));
            Ok(RecordBatch::try_new(count_schema(), vec![rows])?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            stream,
        )))
    }
}

/// A `DELETE` condition decided per data file from its identity partition values.
struct FileCondition {
    condition: Expr,
    /// The columns the condition names: (name, Iceberg field id, Arrow type).
    columns: Vec<(String, i32, Type, Field)>,
    qualified: String,
}

impl FileCondition {
    fn new(
        condition: &Expr,
        table_columns: &SchemaRef,
        table: &iceberg::table::Table,
        qualified: &str,
    ) -> Result<Self> {
        let unqualified = condition
            .clone()
            .transform(|e| {
                Ok(match e {
                    Expr::Column(c) => {
                        Transformed::yes(Expr::Column(Column::new_unqualified(c.name)))
                    }
                    other => Transformed::no(other),
                })
            })?
            .data;
        if unqualified.is_volatile() {
            return Err(DataFusionError::Plan(format!(
                "DELETE FROM `{qualified}`: the condition {condition} changes from row to row \
                 (a volatile function) and cannot be decided for a whole data file"
            )));
        }
        let schema = table.metadata().current_schema();
        let mut columns = Vec::new();
        for column in unqualified.column_refs() {
            let name = column.name.clone();
            let field = schema.field_by_name(&name).ok_or_else(|| {
                DataFusionError::Plan(format!("`{qualified}` has no column `{name}`"))
            })?;
            let arrow = table_columns.field_with_name(&name)?.clone();
            columns.push((name, field.id, field.field_type.as_ref().clone(), arrow));
        }
        Ok(Self {
            condition: unqualified,
            columns,
            qualified: qualified.to_string(),
        })
    }

    /// Whether the condition holds for every row of `file`, written under `spec`.
    fn holds(&self, file: &DataFile, spec: &PartitionSpec) -> Result<bool> {
        let mut values = Vec::with_capacity(self.columns.len());
        for (name, id, ty, arrow) in &self.columns {
            let position = spec
                .fields()
                .iter()
                .position(|p| p.source_id == *id && p.transform == Transform::Identity)
                .ok_or_else(|| {
                    DataFusionError::NotImplemented(format!(
                        "DELETE FROM `{}` by a condition on `{name}` is not supported yet: \
                         Basin deletes whole data files, so the condition may only name \
                         columns the table is partitioned by as they are (identity), which \
                         `{name}` is not{}",
                        self.qualified,
                        if spec.fields().is_empty() {
                            " (the table is not partitioned)"
                        } else {
                            ""
                        }
                    ))
                })?;
            let value = match (file.partition().fields().get(position), ty) {
                (Some(Some(Literal::Primitive(literal))), Type::Primitive(primitive)) => {
                    super::stats::literal_scalar(primitive, literal, arrow.data_type()).ok_or_else(
                        || {
                            DataFusionError::NotImplemented(format!(
                                "DELETE FROM `{}`: partition values of `{name}` ({primitive}) \
                                 cannot be compared yet",
                                self.qualified
                            ))
                        },
                    )?
                }
                (Some(None), _) => ScalarValue::try_from(arrow.data_type())?,
                _ => {
                    return Err(DataFusionError::Execution(format!(
                        "`{}`: data file {} has no partition value for `{name}`",
                        self.qualified,
                        file.file_path()
                    )));
                }
            };
            values.push(value.to_array()?);
        }
        let fields: Vec<Field> = self.columns.iter().map(|c| c.3.clone()).collect();
        let schema = Arc::new(Schema::new(fields));
        let batch = if values.is_empty() {
            RecordBatch::try_new_with_options(
                schema.clone(),
                vec![],
                &datafusion::arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(1)),
            )?
        } else {
            RecordBatch::try_new(schema.clone(), values)?
        };
        let df_schema = DFSchema::try_from(schema.as_ref().clone())?;
        let physical = create_physical_expr(
            &self.condition,
            &df_schema,
            &datafusion::logical_expr::execution_props::ExecutionProps::new(),
        )?;
        let result = physical.evaluate(&batch)?.into_array(1)?;
        let result = result
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "the DELETE condition on `{}` is not a boolean",
                    self.qualified
                ))
            })?;
        Ok(result.is_valid(0) && result.value(0))
    }
}
