//! Counting rows of `generate_series` / `range` on an executor.
//!
//! `SELECT count(*) FROM generate_series(1, 10)` scans the series with no column, and
//! datafusion-proto 53 drops a `LazyMemoryExec`'s projection when it sends the plan to an
//! executor: the executor's copy builds one-column batches under a schema of none and the
//! query fails ("number of columns(1) must match number of fields(0)"). [`SeriesProjections`]
//! runs on the scheduler and moves such a projection out of the generator: the series is
//! generated whole and an empty `ProjectionExec` above it keeps the row count.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::functions_table::generate_series::{Empty, GenericSeriesState, TimestampValue};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::memory::LazyMemoryExec;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

/// See the module documentation.
#[derive(Debug, Default)]
pub struct SeriesProjections;

impl PhysicalOptimizerRule for SeriesProjections {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        crate::rewrite_each(plan, |lazy: &LazyMemoryExec| {
            let [generator] = lazy.generators().as_slice() else {
                return Ok(None);
            };
            if !lazy.schema().fields().is_empty() {
                return Ok(None);
            }
            // The generator does not say which columns it makes: a fresh copy's first
            // batch does.
            let fresh = {
                let g = generator.read();
                let any = g.as_any();
                let series = any.is::<GenericSeriesState<i64>>()
                    || any.is::<GenericSeriesState<TimestampValue>>()
                    || any.is::<Empty>();
                series.then(|| g.reset_state())
            };
            let Some(fresh) = fresh else {
                return Ok(None);
            };
            let first = fresh.write().generate_next_batch()?;
            let whole: Arc<dyn ExecutionPlan> = match first {
                Some(batch) => Arc::new(LazyMemoryExec::try_new(
                    batch.schema(),
                    vec![generator.read().reset_state()],
                )?),
                None => Arc::new(EmptyExec::new(lazy.schema())),
            };
            let counted = ProjectionExec::try_new(Vec::<ProjectionExpr>::new(), whole)?;
            Ok(Some(Arc::new(counted) as Arc<dyn ExecutionPlan>))
        })
    }

    fn name(&self) -> &str {
        "basin_series_projections"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
