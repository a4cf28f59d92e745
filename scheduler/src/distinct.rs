//! DataFusion's rewrite of a single `DISTINCT` aggregate into two group-bys, keeping the
//! aggregate's result types.
//!
//! `SingleDistinctToGroupBy` turns `count(DISTINCT a), sum(b)` into an inner aggregate
//! grouped by `a` with `sum(b)` per group, and an outer `count(a), sum(inner sum)`. In
//! DataFusion 53 the outer `sum` is typed for its own input, so a sum of `Decimal(7, 2)`
//! values, declared `Decimal(17, 2)`, comes out as `Decimal(27, 2)` (upstream issue
//! apache/datafusion#17699; the fix, PR #17815, was not in 53). The plan then announces one
//! type and produces another: TPC-DS Q16, Q94 and Q95 failed on executors with "an executor's
//! rows have types [Int64, Decimal128(27, 2), …], the plan's have [Int64, Decimal128(17, 2),
//! …]", and a client told `Decimal(17, 2)` would have been sent `Decimal(27, 2)` values.
//!
//! [`DistinctKeepsTypes`] runs DataFusion's rule and casts every column whose type it changed
//! back to the declared type. The value is the same sum either way: a sum of per-group sums
//! of `b` is the sum of `b`, which the declared type holds exactly when the plain aggregate's
//! would (it overflows where the plain `sum` would have).
//!
//! ```text
//!  Aggregate: count(DISTINCT a), sum(b) [Decimal(17,2)]
//!    =>  Projection: count, CAST(sum AS Decimal(17,2))        (Basin)
//!          Projection: count(alias1), sum(alias2)               (DataFusion)
//!            Aggregate: count(alias1), sum(alias2) [Decimal(27,2)]
//!              Aggregate: group by a AS alias1, sum(b) AS alias2 [Decimal(17,2)]
//! ```

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, cast};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::single_distinct_to_groupby::SingleDistinctToGroupBy;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

/// The name of the DataFusion rule that [`DistinctKeepsTypes`] takes the place of.
const REPLACED: &str = "single_distinct_aggregation_to_group_by";

/// [`SingleDistinctToGroupBy`] with the aggregate's declared result types kept (see the
/// module docs).
#[derive(Debug, Default)]
pub struct DistinctKeepsTypes(SingleDistinctToGroupBy);

impl OptimizerRule for DistinctKeepsTypes {
    fn name(&self) -> &str {
        "basin_single_distinct_keeps_types"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        self.0.apply_order()
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let declared = Arc::clone(plan.schema());
        let rewritten = self.0.rewrite(plan, config)?;
        if !rewritten.transformed {
            return Ok(rewritten);
        }
        let produced = Arc::clone(rewritten.data.schema());
        let same = declared.fields().len() == produced.fields().len()
            && declared
                .fields()
                .iter()
                .zip(produced.fields())
                .all(|(d, p)| d.data_type() == p.data_type());
        if same {
            return Ok(rewritten);
        }
        let exprs = declared
            .iter()
            .zip(produced.iter())
            .map(|((declared_qualifier, declared), (qualifier, field))| {
                let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
                if declared.data_type() == field.data_type() {
                    column
                } else {
                    cast(column, declared.data_type().clone())
                        .alias_qualified(declared_qualifier.cloned(), declared.name())
                }
            })
            .collect();
        let projection = Projection::try_new(exprs, Arc::new(rewritten.data))?;
        Ok(Transformed::yes(LogicalPlan::Projection(projection)))
    }
}

/// Puts [`DistinctKeepsTypes`] in the place of DataFusion's rule in `rules` (a session's
/// optimizer rules, in order).
pub fn keep_distinct_types(rules: &mut [Arc<dyn OptimizerRule + Send + Sync>]) {
    for rule in rules.iter_mut() {
        if rule.name() == REPLACED {
            *rule = Arc::new(DistinctKeepsTypes::default());
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::SessionStateBuilder;
    use datafusion::optimizer::Optimizer;
    use datafusion::prelude::SessionContext;

    use super::*;

    async fn context(keep: bool) -> SessionContext {
        let mut rules = Optimizer::new().rules;
        if keep {
            keep_distinct_types(&mut rules);
        }
        let mut builder = SessionStateBuilder::new().with_default_features();
        *builder.optimizer() = Some(Optimizer::with_rules(rules));
        let ctx = SessionContext::new_with_state(builder.build());
        ctx.sql(
            "CREATE TABLE sales (g INT, o BIGINT, cost DECIMAL(7, 2)) AS VALUES \
             (1, 1, 1.25), (1, 1, 2.50), (1, 2, 99999.99), (2, 3, NULL), (2, 3, 0.01)",
        )
        .await
        .unwrap();
        ctx
    }

    #[tokio::test]
    async fn a_distinct_count_beside_a_decimal_sum_keeps_the_sums_type() {
        for sql in [
            "SELECT count(DISTINCT o), sum(cost) FROM sales",
            "SELECT g, count(DISTINCT o) AS n, sum(cost) AS total FROM sales GROUP BY g ORDER BY g",
        ] {
            let ctx = context(true).await;
            let df = ctx.sql(sql).await.unwrap();
            let declared = df.schema().as_arrow().clone();
            let plan = df.clone().into_optimized_plan().unwrap();
            assert!(
                plan.display_indent().to_string().contains("alias1"),
                "DataFusion's rewrite still applies:\n{}",
                plan.display_indent()
            );
            assert_eq!(
                plan.schema().as_arrow().fields(),
                declared.fields(),
                "{sql}"
            );
            let physical = df.clone().create_physical_plan().await.unwrap();
            let batches = df.collect().await.unwrap();
            for batch in &batches {
                assert_eq!(batch.schema().fields(), declared.fields(), "{sql}");
            }
            assert_eq!(physical.schema().fields(), declared.fields(), "{sql}");
            // The same sums as without the rewrite.
            let plain = context(false).await;
            plain
                .sql("SET datafusion.optimizer.max_passes = 0")
                .await
                .unwrap();
            let expected = plain.sql(sql).await.unwrap().collect().await.unwrap();
            assert_eq!(
                datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                    .unwrap()
                    .to_string(),
                datafusion::arrow::util::pretty::pretty_format_batches(&expected)
                    .unwrap()
                    .to_string(),
                "{sql}"
            );
        }
    }

    #[tokio::test]
    async fn the_rule_takes_datafusions_place_once() {
        let mut rules = Optimizer::new().rules;
        let count = rules.len();
        keep_distinct_types(&mut rules);
        assert_eq!(rules.len(), count);
        assert!(rules.iter().all(|r| r.name() != REPLACED));
        assert_eq!(
            rules
                .iter()
                .filter(|r| r.name() == "basin_single_distinct_keeps_types")
                .count(),
            1
        );
    }
}
