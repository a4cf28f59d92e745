//! Aggregates that DataFusion reversed keep their names on the way to an executor.
//!
//! To satisfy several ordered aggregates with one sort, DataFusion swaps an aggregate for its
//! reverse (`last_value(x ORDER BY x DESC)` becomes `first_value(x ORDER BY x ASC)`), and the
//! reversed expression gets the reversed name, while the `AggregateExec` keeps the schema of
//! the names the nodes above it read. datafusion-proto 53 rebuilds the aggregate's schema
//! from its expressions' names, so the executor's plan no longer fit together: "Input field
//! name last_value(…) ORDER BY […] does not match with the projection expression
//! first_value(…)" — and before `crate::launch`, Ballista took every executor out of the
//! cluster for refusing the task (DataFusion's `group_by.slt`, every query a Ballista job).
//!
//! [`ReversedAggregatesKeepNames`], among the last physical rules of every session that
//! sends plans to executors, gives each reversed aggregate the name of the aggregate it
//! replaced: the one its `AggregateExec`'s schema already carries. Nothing else changes.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::physical_expr::aggregate::{AggregateExprBuilder, AggregateFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;

/// See the module docs.
#[derive(Debug, Default)]
pub struct ReversedAggregatesKeepNames;

impl PhysicalOptimizerRule for ReversedAggregatesKeepNames {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(aggregate) = node.as_any().downcast_ref::<AggregateExec>() else {
                return Ok(Transformed::no(node));
            };
            let mut renamed = false;
            let exprs = aggregate
                .aggr_expr()
                .iter()
                .map(|expr| {
                    Ok(match original_name(expr) {
                        Some(name) => {
                            renamed = true;
                            Arc::new(named(expr, name, aggregate)?)
                        }
                        None => Arc::clone(expr),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            if !renamed {
                return Ok(Transformed::no(node));
            }
            Ok(Transformed::yes(Arc::new(
                aggregate.with_new_aggr_exprs(exprs),
            )))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "basin_reversed_aggregates_keep_names"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The name of the aggregate `expr` replaced, when DataFusion reversed it under another name.
fn original_name(expr: &AggregateFunctionExpr) -> Option<String> {
    if !expr.is_reversed() {
        return None;
    }
    let original = expr.reverse_expr()?;
    (original.name() != expr.name()).then(|| original.name().to_string())
}

/// `expr` as it is, under `name`.
fn named(
    expr: &AggregateFunctionExpr,
    name: String,
    aggregate: &AggregateExec,
) -> Result<AggregateFunctionExpr> {
    AggregateExprBuilder::new(Arc::new(expr.fun().clone()), expr.expressions())
        .schema(Arc::clone(&aggregate.input_schema()))
        .alias(name)
        .human_display(expr.human_display().to_string())
        .order_by(expr.order_bys().to_vec())
        .with_ignore_nulls(expr.ignore_nulls())
        .with_distinct(expr.is_distinct())
        .with_reversed(true)
        .build()
}

#[cfg(test)]
mod tests {
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::SessionContext;

    use super::*;

    /// DataFusion's group_by.slt: three ordered aggregates that one sort serves once the
    /// first_value and last_value are reversed.
    async fn plan_of(with_rule: bool) -> (Arc<dyn ExecutionPlan>, SessionContext) {
        // One partition: a single aggregate right under the projection that reads its names.
        let config = datafusion::prelude::SessionConfig::new().with_target_partitions(1);
        let mut state = SessionStateBuilder::new()
            .with_default_features()
            .with_config(config);
        if with_rule {
            state = state.with_physical_optimizer_rule(Arc::new(ReversedAggregatesKeepNames));
        }
        let ctx = SessionContext::new_with_state(state.build());
        ctx.sql(
            "CREATE TABLE sales_global (country VARCHAR, amount DOUBLE) AS VALUES \
             ('FRA', 50.0), ('FRA', 200.0), ('TUR', 100.0), ('TUR', 75.0), ('GRC', 80.0)",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
        let sql = "SELECT country, array_agg(amount ORDER BY amount DESC) AS amounts, \
                   first_value(amount ORDER BY amount ASC) AS fv1, \
                   last_value(amount ORDER BY amount DESC) AS fv2 \
                   FROM sales_global GROUP BY country ORDER BY country";
        let plan = ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        (plan, ctx)
    }

    /// DataFusion's group_by.slt: three ordered aggregates that one sort serves once the
    /// first_value is reversed into a last_value.
    #[tokio::test]
    async fn reversed_aggregates_decode_to_the_same_plan() {
        use datafusion_proto::physical_plan::{AsExecutionPlan, DefaultPhysicalExtensionCodec};
        use datafusion_proto::protobuf::PhysicalPlanNode;
        // Without the rule, the decoded plan does not fit together.
        let (plan, ctx) = plan_of(false).await;
        let codec = DefaultPhysicalExtensionCodec {};
        let node = PhysicalPlanNode::try_from_physical_plan(plan, &codec).unwrap();
        let e = node
            .try_into_physical_plan(&ctx.task_ctx(), &codec)
            .unwrap_err();
        assert!(e.to_string().contains("does not match"), "{e}");

        let (plan, ctx) = plan_of(true).await;
        let mut reversed = 0;
        plan.apply(|node| {
            if let Some(a) = node.as_any().downcast_ref::<AggregateExec>() {
                let fv1 = &a.aggr_expr()[1];
                assert!(fv1.is_reversed() && fv1.fun().name() == "last_value");
                assert!(fv1.name().starts_with("first_value("), "{}", fv1.name());
                reversed += 1;
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .unwrap();
        assert_eq!(reversed, 1, "{}", displayable(plan.as_ref()).indent(false));
        let rows = crate::testing::round_trip(&plan, &ctx).await;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&rows)
            .unwrap()
            .to_string();
        assert!(
            text.contains("| FRA     | [200.0, 50.0] | 50.0 | 50.0 |"),
            "{text}"
        );
    }
}
