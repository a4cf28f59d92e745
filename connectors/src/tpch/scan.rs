//! `TpchScanExec`: generates TPC-H rows on whichever executor runs each partition.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, Statistics};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use serde::{Deserialize, Serialize};

use super::generate::generate;
use super::tables::TpchTable;

/// Everything an executor needs to generate its partitions: small enough to travel in the
/// plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TpchScanSpec {
    pub table: TpchTable,
    pub scale_factor: f64,
    /// Number of generator parts; partition `i` generates part `i + 1`.
    pub parts: usize,
    /// Projected column indexes into the table schema (`None` = all).
    pub projection: Option<Vec<usize>>,
    /// Row limit per partition.
    pub limit: Option<usize>,
}

/// Generates a TPC-H table, one generator part per output partition.
#[derive(Debug)]
pub struct TpchScanExec {
    spec: TpchScanSpec,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl TpchScanExec {
    /// Creates the scan; fails if the projection does not fit the table.
    pub fn try_new(spec: TpchScanSpec) -> Result<Self> {
        let full = spec.table.schema();
        let schema = match &spec.projection {
            Some(p) => Arc::new(full.project(p)?),
            None => full,
        };
        let parts = if spec.table.splittable() {
            spec.parts.max(1)
        } else {
            1
        };
        let spec = TpchScanSpec { parts, ..spec };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(parts),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            spec,
            schema,
            properties,
        })
    }

    /// What this scan generates.
    pub fn spec(&self) -> &TpchScanSpec {
        &self.spec
    }
}

impl DisplayAs for TpchScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        write!(
            f,
            "TpchScanExec: table={}, sf={}, parts={}, columns=[{}]",
            self.spec.table.name(),
            self.spec.scale_factor,
            self.spec.parts,
            columns.join(", ")
        )?;
        if let Some(limit) = self.spec.limit {
            write!(f, ", limit={limit}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for TpchScanExec {
    fn name(&self) -> &str {
        "TpchScanExec"
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
                "TpchScanExec has no children".to_string(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition >= self.spec.parts {
            return Err(DataFusionError::Internal(format!(
                "TpchScanExec has {} partitions, asked for partition {partition}",
                self.spec.parts
            )));
        }
        let batch_size = context.session_config().batch_size();
        let spec = self.spec.clone();
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema.clone(), 2);
        let tx = builder.tx();
        builder.spawn_blocking(move || {
            generate(&spec, partition, batch_size, &mut |batch| {
                tx.blocking_send(batch).is_ok()
            });
            Ok(())
        });
        Ok(builder.build())
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Statistics> {
        let total = self.spec.table.row_count(self.spec.scale_factor) as usize;
        let rows = match partition {
            Some(_) => total / self.spec.parts.max(1),
            None => total,
        };
        let rows = self.spec.limit.map_or(rows, |l| rows.min(l));
        // Per partition the count is an average (the last part holds the remainder).
        let num_rows = if self.spec.table.row_count_is_exact()
            && self.spec.limit.is_none()
            && partition.is_none()
        {
            Precision::Exact(rows)
        } else {
            Precision::Inexact(rows)
        };
        // Rough widths: 8 bytes per number, 24 per string.
        let width: usize = self
            .schema
            .fields()
            .iter()
            .map(|f| if f.data_type().is_primitive() { 8 } else { 24 })
            .sum();
        Ok(Statistics {
            num_rows,
            total_byte_size: Precision::Inexact(rows * width),
            column_statistics: vec![ColumnStatistics::new_unknown(); self.schema.fields().len()],
        })
    }
}
