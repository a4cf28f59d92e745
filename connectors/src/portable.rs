//! Logical plans rewritten, just before physical planning, so that what datafusion-proto 53
//! drops on the way to an executor is carried in a form it keeps:
//!
//! - window functions' `IGNORE NULLS` and direction ([`crate::windows`]);
//! - `Float16` literals, which datafusion-proto writes as `Float32` values (an executor then
//!   had a `Float32` column where the plan said `Float16`, and `min`/`max` of it panicked
//!   with "primitive array"): each becomes a cast of its `Float32` value to `Float16`, exact
//!   for every half-precision value.
//!
//! Nothing changes a column's name or type: plans, `EXPLAIN` and results look the same.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::logical_expr::expr::Alias;
use datafusion::logical_expr::{Expr, LogicalPlan, cast};

/// `plan` in a form every executor reads back as it is (see the module's documentation).
pub fn portable_plan(plan: LogicalPlan) -> Result<LogicalPlan> {
    let plan = crate::windows::portable_window_functions(plan)?;
    float16_literals_as_casts(plan)
}

fn float16_literals_as_casts(plan: LogicalPlan) -> Result<LogicalPlan> {
    Ok(plan
        .transform_up_with_subqueries(|node| {
            // A column of these is named after its expression: the outermost keeps its name.
            let names_columns = matches!(
                node,
                LogicalPlan::Projection(_) | LogicalPlan::Aggregate(_) | LogicalPlan::Window(_)
            );
            node.map_expressions(|e| {
                let name = e.schema_name().to_string();
                let t = e.transform_up(|e| match e {
                    Expr::Literal(ScalarValue::Float16(v), meta) => {
                        let value = Expr::Literal(ScalarValue::Float32(v.map(f32::from)), meta);
                        Ok(Transformed::yes(cast(value, DataType::Float16)))
                    }
                    other => Ok(Transformed::no(other)),
                })?;
                Ok(
                    if names_columns && t.transformed && t.data.schema_name().to_string() != name {
                        t.update_data(|e| Expr::Alias(Alias::new(e, None::<&str>, name)))
                    } else {
                        t
                    },
                )
            })
        })?
        .data)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;
    use std::sync::Arc;

    use super::*;
    use crate::codec::through_codec;

    #[tokio::test]
    async fn half_precision_literals_keep_their_type_through_the_codec() {
        let sql = "WITH data AS (SELECT 1 AS k, arrow_cast(1.8125, 'Float16') AS f \
                   UNION ALL SELECT 1, arrow_cast(6.8007813, 'Float16') \
                   UNION ALL SELECT 2, arrow_cast(8.5, 'Float16')) \
                   SELECT k, min(f), max(f), arrow_typeof(max(f)) FROM data GROUP BY k ORDER BY k";
        let ctx = SessionContext::new();
        let direct = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let state = ctx.state();
        let plan = state
            .optimize(ctx.sql(sql).await.unwrap().logical_plan())
            .unwrap();
        let plan = portable_plan(plan).unwrap();
        let physical = state
            .query_planner()
            .create_physical_plan(&plan, &state)
            .await
            .unwrap();
        let decoded = through_codec(Arc::clone(&physical), &ctx);
        assert_eq!(decoded.schema(), physical.schema());
        let travelled = collect(decoded, ctx.task_ctx()).await.unwrap();
        assert_eq!(
            pretty_format_batches(&direct).unwrap().to_string(),
            pretty_format_batches(&travelled).unwrap().to_string()
        );
    }
}
