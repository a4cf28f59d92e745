//! Ballista's exchanges without string views.
//!
//! Basin reads strings as Arrow views (`basin_connectors::views`). A view array points into
//! buffers it shares with other batches, and a shuffle writes every buffer each batch points
//! into: a hash repartition of a scan would write its dictionaries once per batch and output
//! partition. [`PlainExchanges`] runs on the scheduler after the plan is otherwise final
//! (before Ballista cuts it into stages at its exchanges) and makes each exchange carry plain
//! strings: a cast to `Utf8` below it, and a cast back to views above it (which copies no
//! bytes). The plans that run whole on one executor or as one streamed stage exchange rows in
//! memory and are not rewritten.

use std::sync::Arc;

use basin_connectors::views::{has_views, plain_type};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{CastExpr, Column};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct PlainExchanges;

impl PhysicalOptimizerRule for PlainExchanges {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let any = node.as_any();
            let exchange = any.is::<RepartitionExec>()
                || any.is::<CoalescePartitionsExec>()
                || any.is::<SortPreservingMergeExec>();
            let input = match node.children()[..] {
                [input] if exchange => input.clone(),
                _ => return Ok(Transformed::no(node)),
            };
            // An exchange's output has its input's types.
            let types = input.schema();
            if !has_views(&types) {
                return Ok(Transformed::no(node));
            }
            let plain = cast_columns(input, |_, t| plain_type(t))?;
            let exchanged = node.with_new_children(vec![plain])?;
            let restored = cast_columns(exchanged, |i, t| {
                let own = types.field(i).data_type();
                (t != own).then(|| own.clone())
            })?;
            Ok(Transformed::yes(restored))
        })
        .data()
    }

    fn name(&self) -> &str {
        "basin_plain_exchanges"
    }

    fn schema_check(&self) -> bool {
        // Types are restored above each exchange; casts may drop a field's metadata.
        false
    }
}

/// `input` with each column whose type `to` (given its position) maps cast to that type,
/// names kept.
fn cast_columns(
    input: Arc<dyn ExecutionPlan>,
    to: impl Fn(usize, &DataType) -> Option<DataType>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = input.schema();
    let exprs: Vec<ProjectionExpr> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let column = Arc::new(Column::new(f.name(), i));
            let expr: Arc<dyn PhysicalExpr> = match to(i, f.data_type()) {
                Some(t) => Arc::new(CastExpr::new(column, t, None)),
                None => column,
            };
            ProjectionExpr::new(expr, f.name().clone())
        })
        .collect();
    Ok(Arc::new(ProjectionExec::try_new(exprs, input)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringViewArray};
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::{Partitioning, collect, displayable};
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn exchanges_carry_plain_strings_and_the_plan_keeps_its_types() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8View, true),
            Field::new("i", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringViewArray::from(vec![
                    Some("a string longer than twelve bytes"),
                    None,
                    Some("b"),
                ])) as ArrayRef,
                Arc::new(Int64Array::from(vec![1, 2, 3])),
            ],
        )
        .unwrap();
        let scan =
            MemorySourceConfig::try_new_exec(&[vec![batch.clone()]], schema.clone(), None).unwrap();
        let hash = Partitioning::Hash(vec![Arc::new(Column::new("s", 0))], 2);
        let repartition = Arc::new(RepartitionExec::try_new(scan, hash).unwrap());
        let plan = Arc::new(CoalescePartitionsExec::new(repartition));

        let rewritten = PlainExchanges
            .optimize(plan.clone(), &ConfigOptions::default())
            .unwrap();
        let text = displayable(rewritten.as_ref()).indent(false).to_string();
        // Below each exchange the strings are plain, above it views again.
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert!(
            lines[0].starts_with("ProjectionExec: expr=[CAST(s@0 AS Utf8View)"),
            "{text}"
        );
        assert!(lines[1].starts_with("CoalescePartitionsExec"), "{text}");
        assert!(
            lines[2].starts_with("ProjectionExec: expr=[CAST(s@0 AS Utf8)"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("ProjectionExec: expr=[CAST(s@0 AS Utf8View)"),
            "{text}"
        );
        assert!(lines[4].starts_with("RepartitionExec"), "{text}");
        assert!(
            lines[5].starts_with("ProjectionExec: expr=[CAST(s@0 AS Utf8)"),
            "{text}"
        );
        assert_eq!(rewritten.schema().field(0).data_type(), &DataType::Utf8View);

        let ctx = SessionContext::new();
        let mut rows = collect(rewritten, ctx.task_ctx()).await.unwrap();
        let mut expected = collect(plan, ctx.task_ctx()).await.unwrap();
        let sort = |batches: &mut Vec<RecordBatch>| {
            let mut v: Vec<String> =
                datafusion::arrow::util::pretty::pretty_format_batches(batches)
                    .unwrap()
                    .to_string()
                    .lines()
                    .map(str::to_string)
                    .collect();
            v.sort();
            v
        };
        assert_eq!(sort(&mut rows), sort(&mut expected));
    }
}
