//! Helpers for the logical rules' tests.

use std::sync::Arc;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::execution::SessionStateBuilder;
use datafusion::optimizer::OptimizerRule;
use datafusion::prelude::SessionContext;

/// A session with DataFusion's rules, `rule` added after them when given, and the tables
/// that `tables` (`CREATE TABLE` statements) make.
pub(crate) async fn context(
    rule: Option<Arc<dyn OptimizerRule + Send + Sync>>,
    tables: &[&str],
) -> SessionContext {
    let mut state = SessionStateBuilder::new().with_default_features();
    if let Some(rule) = rule {
        state = state.with_optimizer_rule(rule);
    }
    let ctx = SessionContext::new_with_state(state.build());
    for sql in tables {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
    ctx
}

/// The optimized plan of `sql` and its result's lines, sorted (none for no rows, so that an
/// empty result compares equal however it is printed).
pub(crate) async fn plan_and_rows(ctx: &SessionContext, sql: &str) -> (String, Vec<String>) {
    let df = ctx.sql(sql).await.unwrap();
    let plan = df
        .clone()
        .into_optimized_plan()
        .unwrap()
        .display_indent()
        .to_string();
    let batches: Vec<_> = df
        .collect()
        .await
        .unwrap()
        .into_iter()
        .filter(|b| b.num_rows() > 0)
        .collect();
    if batches.is_empty() {
        return (plan, Vec::new());
    }
    let text = pretty_format_batches(&batches).unwrap().to_string();
    let mut rows: Vec<String> = text.lines().map(str::to_string).collect();
    rows.sort();
    (plan, rows)
}

/// `plan` encoded and decoded as for an executor (same schema), then run.
pub(crate) async fn round_trip(
    plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    ctx: &SessionContext,
) -> Vec<datafusion::arrow::record_batch::RecordBatch> {
    use datafusion_proto::physical_plan::{AsExecutionPlan, DefaultPhysicalExtensionCodec};
    use datafusion_proto::protobuf::PhysicalPlanNode;
    let codec = DefaultPhysicalExtensionCodec {};
    let node = PhysicalPlanNode::try_from_physical_plan(Arc::clone(plan), &codec).unwrap();
    let decoded = node
        .try_into_physical_plan(&ctx.task_ctx(), &codec)
        .unwrap();
    assert_eq!(decoded.schema(), plan.schema());
    datafusion::physical_plan::collect(decoded, ctx.task_ctx())
        .await
        .unwrap()
}
