//! The built-in `tpch` catalog: TPC-H data generated on the fly (like Trino's tpch
//! connector), spec-identical to dbgen through the `tpchgen` crate.
//!
//! ```text
//!  tpch.<schema>.<table>         schema: tiny (SF 0.01), sf0_1, sf1, sf10, sf100, sf1000, sfN
//!        │
//!  TpchTable (TableProvider) ──scan──► TpchScanExec (N partitions, one generator part each)
//!                                         │ encoded by Basin's codec, run on executors
//! ```

mod generate;
mod scan;
mod tables;

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{CatalogProvider, SchemaProvider, Session, TableProvider};
use datafusion::common::Statistics;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;

pub use generate::generate;
pub use scan::{TpchScanExec, TpchScanSpec};
pub use tables::{TpchTable, scale_factor_of};

/// Schemas listed by `SHOW SCHEMAS`; any `sfN` also resolves.
pub const LISTED_SCHEMAS: [&str; 6] = ["tiny", "sf0_1", "sf1", "sf10", "sf100", "sf1000"];

/// Default rows per generated partition.
pub const DEFAULT_ROWS_PER_PARTITION: usize = 250_000;

/// Options of a tpch catalog.
#[derive(Debug, Clone)]
pub struct TpchOptions {
    /// Rows per generated partition.
    pub rows_per_partition: usize,
    /// Partitions to use at least for large tables (typically the cluster's task slots).
    pub min_partitions: usize,
}

impl Default for TpchOptions {
    fn default() -> Self {
        Self {
            rows_per_partition: DEFAULT_ROWS_PER_PARTITION,
            min_partitions: 1,
        }
    }
}

/// The `tpch` catalog.
#[derive(Debug)]
pub struct TpchCatalogProvider {
    options: TpchOptions,
}

impl TpchCatalogProvider {
    pub fn new(options: TpchOptions) -> Self {
        Self { options }
    }
}

impl CatalogProvider for TpchCatalogProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        LISTED_SCHEMAS.iter().map(|s| s.to_string()).collect()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let sf = scale_factor_of(name)?;
        Some(Arc::new(TpchSchemaProvider {
            scale_factor: sf,
            options: self.options.clone(),
        }))
    }
}

/// One scale factor of the tpch catalog.
#[derive(Debug)]
pub struct TpchSchemaProvider {
    scale_factor: f64,
    options: TpchOptions,
}

#[async_trait]
impl SchemaProvider for TpchSchemaProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        TpchTable::ALL
            .iter()
            .map(|t| t.name().to_string())
            .collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        Ok(TpchTable::from_name(name).map(|table| {
            Arc::new(TpchTableProvider::new(
                table,
                self.scale_factor,
                self.options.clone(),
            )) as Arc<dyn TableProvider>
        }))
    }

    fn table_exist(&self, name: &str) -> bool {
        TpchTable::from_name(name).is_some()
    }
}

/// One generated TPC-H table.
#[derive(Debug, Clone)]
pub struct TpchTableProvider {
    table: TpchTable,
    scale_factor: f64,
    options: TpchOptions,
}

impl TpchTableProvider {
    pub fn new(table: TpchTable, scale_factor: f64, options: TpchOptions) -> Self {
        Self {
            table,
            scale_factor,
            options,
        }
    }

    pub fn table(&self) -> TpchTable {
        self.table
    }

    pub fn scale_factor(&self) -> f64 {
        self.scale_factor
    }

    pub fn options(&self) -> &TpchOptions {
        &self.options
    }

    /// Number of generator parts: enough that each holds about `rows_per_partition` rows,
    /// at least `min_partitions` (and the query's `target_partitions`) for tables big
    /// enough to be worth splitting.
    pub fn parts(&self, target_partitions: usize) -> usize {
        if !self.table.splittable() {
            return 1;
        }
        let rows = self.table.row_count(self.scale_factor) as usize;
        let by_size = rows.div_ceil(self.options.rows_per_partition.max(1));
        // Splitting below ~10k rows costs more than it saves.
        let worth = (rows / 10_000).max(1);
        by_size
            .max(
                self.options
                    .min_partitions
                    .max(target_partitions)
                    .min(worth),
            )
            .clamp(1, 100_000)
    }
}

#[async_trait]
impl TableProvider for TpchTableProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.table.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // `min_partitions` is the cluster's slots when the session opened; the query's
        // target follows executors that joined since.
        let spec = TpchScanSpec {
            table: self.table,
            scale_factor: self.scale_factor,
            parts: self.parts(state.config().target_partitions()),
            projection: projection.cloned(),
            limit,
        };
        Ok(Arc::new(TpchScanExec::try_new(spec)?))
    }

    fn statistics(&self) -> Option<Statistics> {
        TpchScanExec::try_new(TpchScanSpec {
            table: self.table,
            scale_factor: self.scale_factor,
            parts: 1,
            projection: None,
            limit: None,
        })
        .and_then(|e| e.partition_statistics(None))
        .ok()
    }
}

/// Error for a tpch schema name that is not a scale factor.
pub fn unknown_schema(name: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "tpch has no schema `{name}`: use tiny, sf0_1, sf1, sf10, sf100, sf1000 or sfN"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_follow_the_query_target_and_the_catalog_minimum() {
        let customer = |min_partitions| {
            TpchTableProvider::new(
                TpchTable::Customer,
                1.0,
                TpchOptions {
                    min_partitions,
                    ..TpchOptions::default()
                },
            )
        };
        // 150,000 rows: one part by size, split to use the query's partitions.
        assert_eq!(customer(1).parts(1), 1);
        assert_eq!(customer(1).parts(4), 4);
        assert_eq!(customer(2).parts(1), 2);
        // Too small to be worth splitting.
        let region = TpchTableProvider::new(TpchTable::Region, 1.0, TpchOptions::default());
        assert_eq!(region.parts(8), 1);
    }
}
