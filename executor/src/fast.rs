//! The expression rewrites an executor applies to a plan before it runs it: the same
//! values, computed faster. Planning is done by then (the scheduler's plan, decoded), so the
//! rewritten expressions are never serialized and `EXPLAIN` shows the originals.

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use crate::conjunction::Conjunction;
use crate::decimal::DecimalArithmetic;
use crate::like::PiecewiseLike;
use crate::shared::SharedExec;

/// `Display`, `PartialEq`, `Eq` and `Hash` of a faster expression by the expression it
/// replaces (its `original` field): plans show and compare as they would without it.
macro_rules! shown_as_original {
    ($t:ty) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.original, f)
            }
        }

        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                self.original.as_ref() == other.original.as_ref()
            }
        }

        impl Eq for $t {}

        impl std::hash::Hash for $t {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.original.as_ref().hash(state);
            }
        }
    };
}
pub(crate) use shown_as_original;

/// Rewrites the decimal `+`, `-` and `*` in `plan`'s projections, filters and aggregate
/// arguments into [`crate::decimal::DecimalArithmetic`], their `LIKE`s of several pieces
/// (`'%a%b%'`) into [`crate::like::PiecewiseLike`], and a filter's `AND` of several terms
/// into a [`Conjunction`]. A plan that cannot be rewritten is returned as it was: this only
/// changes how fast the same values are computed.
///
/// A [`SharedExec`]'s subtree is left alone: rebuilding it would give each reader a copy
/// of its own. [`crate::shared::share_repeated_aggregates`] rewrites the one shared copy.
pub fn fast_expressions(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    Arc::clone(&plan)
        .transform_down(|node| {
            if node.as_any().is::<SharedExec>() {
                return Ok(Transformed::new(node, false, TreeNodeRecursion::Jump));
            }
            rewrite_node(node)
        })
        .map(|t| t.data)
        .unwrap_or(plan)
}

/// `expr` with its decimal `+`, `-` and `*` and its `LIKE`s of several pieces replaced by
/// their faster forms; sets `changed` when one was.
pub(crate) fn rewrite_expr(
    expr: &Arc<dyn PhysicalExpr>,
    schema: &Schema,
    changed: &mut bool,
) -> Result<Arc<dyn PhysicalExpr>> {
    let t = Arc::clone(expr).transform_up(|e| {
        if let Some(fast) = DecimalArithmetic::try_new(&e, schema)? {
            return Ok(Transformed::yes(Arc::new(fast) as Arc<dyn PhysicalExpr>));
        }
        Ok(match PiecewiseLike::try_new(&e, schema)? {
            Some(fast) => Transformed::yes(Arc::new(fast) as Arc<dyn PhysicalExpr>),
            None => Transformed::no(e),
        })
    })?;
    *changed |= t.transformed;
    Ok(t.data)
}

/// `node` with its own expressions rewritten (its input, and so its input's types, stay).
fn rewrite_node(node: Arc<dyn ExecutionPlan>) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    let any = node.as_any();
    if let Some(p) = any.downcast_ref::<ProjectionExec>() {
        let schema = p.input().schema();
        let mut changed = false;
        let mut exprs = Vec::with_capacity(p.expr().len());
        for e in p.expr() {
            let expr = rewrite_expr(&e.expr, &schema, &mut changed)?;
            exprs.push(ProjectionExpr::new(expr, e.alias.clone()));
        }
        if changed {
            let new = ProjectionExec::try_new(exprs, Arc::clone(p.input()))?;
            return Ok(Transformed::yes(Arc::new(new)));
        }
    } else if let Some(f) = any.downcast_ref::<FilterExec>() {
        let mut changed = false;
        let schema = f.input().schema();
        let mut predicate = rewrite_expr(f.predicate(), &schema, &mut changed)?;
        // A `Conjunction` hides its terms from the filter's equivalence properties (a
        // `column = literal` term makes the column constant); over ordered input, the
        // operators above could then choose other (slower) modes when rebuilt.
        let ordered = f.input().output_ordering().is_some();
        if !ordered && let Some(terms) = Conjunction::try_new(&predicate, &schema)? {
            predicate = Arc::new(terms);
            changed = true;
        }
        if changed {
            let new = FilterExecBuilder::from(f)
                .with_predicate(predicate)
                .build()?;
            return Ok(Transformed::yes(Arc::new(new)));
        }
    } else if let Some(a) = any.downcast_ref::<AggregateExec>() {
        let schema = a.input_schema();
        let mut changed = false;
        let mut aggregates = Vec::with_capacity(a.aggr_expr().len());
        for agg in a.aggr_expr() {
            aggregates.push(rewrite_aggregate(agg, &schema, &mut changed)?);
        }
        if changed {
            return Ok(Transformed::yes(Arc::new(
                a.with_new_aggr_exprs(aggregates),
            )));
        }
    }
    Ok(Transformed::no(node))
}

/// The aggregate with its arguments rewritten; one whose rewrite DataFusion does not
/// support (or that runs reversed, which a rewrite would undo) stays as it is.
fn rewrite_aggregate(
    agg: &Arc<AggregateFunctionExpr>,
    schema: &Schema,
    changed: &mut bool,
) -> Result<Arc<AggregateFunctionExpr>> {
    if agg.is_reversed() {
        return Ok(Arc::clone(agg));
    }
    let mut any = false;
    let args = agg
        .expressions()
        .iter()
        .map(|e| rewrite_expr(e, schema, &mut any))
        .collect::<Result<Vec<_>>>()?;
    if !any {
        return Ok(Arc::clone(agg));
    }
    let order_by = agg
        .order_bys()
        .iter()
        .map(|s| Arc::clone(&s.expr))
        .collect();
    Ok(match agg.with_new_expressions(args, order_by) {
        Some(new) => {
            *changed = true;
            Arc::new(new)
        }
        None => Arc::clone(agg),
    })
}
