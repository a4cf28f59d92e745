//! Plans that keep no column of a filter's or a join's rows survive the trip to an executor.
//!
//! DataFusion folds projections into filters and joins (`FilterExec: …, projection=[]`), and
//! a projection that keeps no column is what a `count(*)`, an `EXISTS` or a cross join with
//! a one-row side needs. datafusion-proto 53 writes such a projection as an empty list and
//! reads an empty list back as "no projection", so the executor's node returns every column
//! of its input and the nodes above it read the wrong columns (TPC-DS Q9: `FROM reason WHERE
//! r_reason_sk = 1` joined with fifteen scalar subqueries failed on the executor with "Input
//! field name r_reason_sk does not match with the projection expression count(*)").
//!
//! [`EmptyProjectionsTravel`], the last physical rule of every session that sends plans to
//! executors, takes an empty projection out of a filter, a hash join or a nested loop join
//! into a `ProjectionExec` without expressions, which travels as it is. A scan of an
//! in-memory table (`CREATE TABLE … AS VALUES`) with an empty projection has the same
//! fate (its node reads an empty list back as every column: `SELECT lag(NULL, 1, true)
//! OVER () FROM t` returned t's columns beside the window's); it travels as a scan of
//! every column under such a `ProjectionExec`.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::{DataSource, DataSourceExec};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::joins::{
    HashJoinExec, HashJoinExecBuilder, NestedLoopJoinExec, NestedLoopJoinExecBuilder,
};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

/// See the module docs.
#[derive(Debug, Default)]
pub struct EmptyProjectionsTravel;

impl PhysicalOptimizerRule for EmptyProjectionsTravel {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(all_columns) = without_empty_projection(&node)? else {
                return Ok(Transformed::no(node));
            };
            let none: Vec<ProjectionExpr> = Vec::new();
            Ok(Transformed::yes(Arc::new(ProjectionExec::try_new(
                none,
                all_columns,
            )?)))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "basin_empty_projections_travel"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `node` without its projection, when that projection keeps no column.
fn without_empty_projection(
    node: &Arc<dyn ExecutionPlan>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let empty = |p: Option<&[usize]>| p.is_some_and(<[usize]>::is_empty);
    let any = node.as_any();
    if let Some(filter) = any.downcast_ref::<FilterExec>() {
        if !empty(filter.projection().as_deref()) {
            return Ok(None);
        }
        let plain =
            FilterExecBuilder::new(Arc::clone(filter.predicate()), Arc::clone(filter.input()))
                .with_default_selectivity(filter.default_selectivity())
                .with_fetch(filter.fetch())
                .build()?;
        return Ok(Some(Arc::new(plain)));
    }
    if let Some(join) = any.downcast_ref::<HashJoinExec>() {
        if !empty(join.projection.as_deref()) {
            return Ok(None);
        }
        let plain = HashJoinExecBuilder::from(join)
            .with_projection_ref(None)
            .build()?;
        return Ok(Some(Arc::new(plain)));
    }
    if let Some(join) = any.downcast_ref::<NestedLoopJoinExec>() {
        if !empty(join.projection().as_deref()) {
            return Ok(None);
        }
        let plain = NestedLoopJoinExecBuilder::from(join)
            .with_projection_ref(None)
            .build()?;
        return Ok(Some(Arc::new(plain)));
    }
    if let Some(scan) = any.downcast_ref::<DataSourceExec>()
        && let Some(memory) = scan
            .data_source()
            .as_any()
            .downcast_ref::<MemorySourceConfig>()
    {
        if !empty(memory.projection().as_deref()) {
            return Ok(None);
        }
        let every_column =
            MemorySourceConfig::try_new(memory.partitions(), memory.original_schema(), None)?
                .with_show_sizes(memory.show_sizes())
                .with_limit(memory.fetch());
        return Ok(Some(DataSourceExec::from_data_source(every_column)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::SessionContext;

    use super::*;

    #[tokio::test]
    async fn plans_with_empty_projections_decode_to_the_same_rows() {
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(EmptyProjectionsTravel))
            .build();
        let ctx = SessionContext::new_with_state(state);
        for sql in [
            "CREATE TABLE reason (r_reason_sk INT, r_name VARCHAR) AS VALUES (1, 'a'), (2, 'b')",
            "CREATE TABLE sales (q INT, amt INT) AS VALUES (1, 10), (25, 20), (30, 5)",
        ] {
            ctx.sql(sql).await.unwrap().collect().await.unwrap();
        }
        let sql = "SELECT CASE WHEN (SELECT count(*) FROM sales WHERE q BETWEEN 1 AND 20) > 0 \
                   THEN (SELECT avg(amt) FROM sales WHERE q BETWEEN 1 AND 20) \
                   ELSE (SELECT avg(amt) FROM sales WHERE q > 20) END AS bucket, \
                   (SELECT count(*) FROM sales WHERE q > 20) AS n \
                   FROM reason WHERE r_reason_sk = 1";
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.create_physical_plan().await.unwrap();
        let shown = displayable(plan.as_ref()).indent(false).to_string();
        assert!(!shown.contains("projection=[]"), "{shown}");
        let rows = crate::testing::round_trip(&plan, &ctx).await;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&rows)
            .unwrap()
            .to_string();
        assert!(text.contains("| 10.0   | 2 |"), "{text}");
    }

    /// A window over an in-memory table that reads none of its columns (DataFusion's
    /// window.slt: `SELECT LAG(NULL, 1, true) OVER () FROM t1` returned t1's column too).
    #[tokio::test]
    async fn a_memory_scan_of_no_column_decodes_to_no_column() {
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(EmptyProjectionsTravel))
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.sql("CREATE TABLE t1 (v1 INT) AS VALUES (1), (2)")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let df = ctx
            .sql("SELECT LAG(NULL, 1, true) OVER () AS l FROM t1")
            .await
            .unwrap();
        let plan = df.create_physical_plan().await.unwrap();
        let rows = crate::testing::round_trip(&plan, &ctx).await;
        assert!(rows.iter().all(|b| b.num_columns() == 1), "{rows:?}");
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&rows)
            .unwrap()
            .to_string();
        assert!(text.contains("| true |"), "{text}");
    }
}
