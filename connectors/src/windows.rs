//! Window functions whose `IGNORE NULLS` and evaluation direction survive datafusion-proto.
//!
//! datafusion-proto 53 encodes a window function such as `lag`, `lead`, `first_value` or
//! `nth_value` by its name and arguments only: the expression's `IGNORE NULLS` and its
//! `is_reversed` flag (set when the optimizer evaluates the window over the input in the
//! opposite order, to save a sort) are dropped, so an executor computed `lag(a) IGNORE NULLS
//! OVER (ORDER BY id)` as plain `lag`, and a reversed `lag` as a `lead` (DataFusion's
//! sqllogictest `window.slt`: 24 wrong answers on Basin's routes).
//!
//! [`portable_window_functions`] rewrites a logical plan before physical planning: each call
//! of a built-in window function that has either property wraps the function in
//! [`NullTreatedWindow`], which carries both flags inside the function itself, where
//! datafusion-proto does keep them: the codecs encode the wrapper ([`encode`], [`decode`]).
//! The wrapper is invisible otherwise: it has its function's name, signature, type and
//! ordering, so plans, `EXPLAIN` and column names stay as they were.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::functions_window::all_default_window_functions;
use datafusion::logical_expr::expr::{NullTreatment, WindowFunction};
use datafusion::logical_expr::function::{
    ExpressionArgs, PartitionEvaluatorArgs, WindowUDFFieldArgs,
};
use datafusion::logical_expr::{
    Expr, LimitEffect, LogicalPlan, PartitionEvaluator, ReversedUDWF, Signature,
    WindowFunctionDefinition, WindowUDF, WindowUDFImpl,
};
use datafusion::physical_expr::PhysicalExpr;
use serde::{Deserialize, Serialize};

/// Functions whose evaluator reads the direction flag (an offset or position that counts
/// from the other end when the window runs reversed).
const DIRECTIONAL: [&str; 3] = ["lag", "lead", "nth_value"];

/// A built-in window function with its `IGNORE NULLS` and direction held in the function.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct NullTreatedWindow {
    inner: Arc<WindowUDF>,
    ignore_nulls: bool,
    reversed: bool,
}

/// What travels in the plan: the built-in function's name and the two flags.
#[derive(Serialize, Deserialize)]
struct Wire {
    function: String,
    ignore_nulls: bool,
    reversed: bool,
}

impl NullTreatedWindow {
    fn wrap(inner: Arc<WindowUDF>, ignore_nulls: bool, reversed: bool) -> Arc<WindowUDF> {
        Arc::new(WindowUDF::new_from_impl(Self {
            inner,
            ignore_nulls,
            reversed,
        }))
    }
}

impl WindowUDFImpl for NullTreatedWindow {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn expressions(&self, expr_args: ExpressionArgs) -> Vec<Arc<dyn PhysicalExpr>> {
        self.inner.expressions(expr_args)
    }

    fn partition_evaluator(
        &self,
        args: PartitionEvaluatorArgs,
    ) -> Result<Box<dyn PartitionEvaluator>> {
        // In the planning process the expression's own flags equal the wrapper's; in a
        // decoded plan only the wrapper's are left.
        self.inner
            .partition_evaluator_factory(PartitionEvaluatorArgs::new(
                args.input_exprs(),
                args.input_fields(),
                args.is_reversed() || self.reversed,
                args.ignore_nulls() || self.ignore_nulls,
            ))
    }

    fn field(&self, field_args: WindowUDFFieldArgs) -> Result<FieldRef> {
        self.inner.field(field_args)
    }

    fn sort_options(&self) -> Option<SortOptions> {
        self.inner.sort_options()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn reverse_expr(&self) -> ReversedUDWF {
        match self.inner.reverse_expr() {
            ReversedUDWF::Reversed(other) => {
                ReversedUDWF::Reversed(Self::wrap(other, self.ignore_nulls, !self.reversed))
            }
            same_or_none => same_or_none,
        }
    }

    fn limit_effect(&self, args: &[Arc<dyn PhysicalExpr>]) -> LimitEffect {
        self.inner.inner().limit_effect(args)
    }
}

/// The built-in window function `udwf` is, if it is one.
fn built_in(udwf: &WindowUDF) -> Option<Arc<WindowUDF>> {
    all_default_window_functions()
        .into_iter()
        .find(|f| f.as_ref() == udwf)
}

/// `plan` with every call of a built-in window function that is `IGNORE NULLS` or reads its
/// direction wrapped in [`NullTreatedWindow`] (see the module's documentation).
pub fn portable_window_functions(plan: LogicalPlan) -> Result<LogicalPlan> {
    Ok(plan
        .transform_up_with_subqueries(|node| {
            if !matches!(node, LogicalPlan::Window(_)) {
                return Ok(Transformed::no(node));
            }
            node.map_expressions(|e| {
                e.transform_up(|e| match e {
                    Expr::WindowFunction(w) => Ok(match portable(&w) {
                        Some(fun) => {
                            let mut w = *w;
                            w.fun = WindowFunctionDefinition::WindowUDF(fun);
                            Transformed::yes(Expr::WindowFunction(Box::new(w)))
                        }
                        None => Transformed::no(Expr::WindowFunction(w)),
                    }),
                    other => Ok(Transformed::no(other)),
                })
            })
        })?
        .data)
}

/// The wrapped function of `w`, when it needs one.
fn portable(w: &WindowFunction) -> Option<Arc<WindowUDF>> {
    let WindowFunctionDefinition::WindowUDF(udwf) = &w.fun else {
        return None;
    };
    if udwf.inner().as_any().is::<NullTreatedWindow>() {
        return None;
    }
    let ignore_nulls = w.params.null_treatment == Some(NullTreatment::IgnoreNulls);
    if !ignore_nulls && !DIRECTIONAL.contains(&udwf.name()) {
        return None;
    }
    built_in(udwf).map(|inner| NullTreatedWindow::wrap(inner, ignore_nulls, false))
}

/// Writes `udwf` into `buf` when it is a [`NullTreatedWindow`]; returns whether it was.
pub fn encode(udwf: &WindowUDF, buf: &mut Vec<u8>) -> Result<bool> {
    let Some(w) = udwf.inner().as_any().downcast_ref::<NullTreatedWindow>() else {
        return Ok(false);
    };
    let wire = Wire {
        function: w.inner.name().to_string(),
        ignore_nulls: w.ignore_nulls,
        reversed: w.reversed,
    };
    serde_json::to_writer(buf, &wire).map_err(|e| DataFusionError::External(Box::new(e)))?;
    Ok(true)
}

/// The [`NullTreatedWindow`] that [`encode`] wrote as `payload`.
pub fn decode(payload: &[u8]) -> Result<Arc<WindowUDF>> {
    let wire: Wire =
        serde_json::from_slice(payload).map_err(|e| DataFusionError::External(Box::new(e)))?;
    let inner = all_default_window_functions()
        .into_iter()
        .find(|f| f.name() == wire.function)
        .ok_or_else(|| {
            DataFusionError::Internal(format!(
                "a plan names the window function {:?}, which this build does not have",
                wire.function
            ))
        })?;
    Ok(NullTreatedWindow::wrap(
        inner,
        wire.ignore_nulls,
        wire.reversed,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::through_codec;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;

    const T: &str = "(SELECT * FROM (VALUES (1, NULL, 'a'), (2, 'b', 'b'), (3, NULL, 'a'), \
                     (4, 'x', 'b'), (5, NULL, 'a'), (6, 'y', NULL)) AS t(id, a, g))";

    /// `sql`'s answer planned here, and after the physical plan went through Basin's codec
    /// with (`portable`) or without the rewrite.
    async fn answers(sql: &str, portable: bool) -> (String, String) {
        let ctx = SessionContext::new();
        let direct = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let state = ctx.state();
        let mut plan = state
            .optimize(ctx.sql(sql).await.unwrap().logical_plan())
            .unwrap();
        if portable {
            plan = portable_window_functions(plan).unwrap();
        }
        let physical = state
            .query_planner()
            .create_physical_plan(&plan, &state)
            .await
            .unwrap();
        let travelled = collect(through_codec(physical, &ctx), ctx.task_ctx())
            .await
            .unwrap();
        let text = |b| pretty_format_batches(b).unwrap().to_string();
        (text(&direct), text(&travelled))
    }

    #[tokio::test]
    async fn ignore_nulls_and_reversed_windows_answer_the_same_after_the_codec() {
        for sql in [
            format!(
                "SELECT id, lag(a) IGNORE NULLS OVER (ORDER BY id), \
                 lead(a, 1, 'def') IGNORE NULLS OVER (ORDER BY id), \
                 lag(a, 2, 'def') IGNORE NULLS OVER (ORDER BY id DESC) FROM {T} ORDER BY id"
            ),
            format!(
                "SELECT id, first_value(a) IGNORE NULLS OVER (ORDER BY id), \
                 last_value(a) IGNORE NULLS OVER (PARTITION BY g ORDER BY id \
                 ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING), \
                 nth_value(a, 2) IGNORE NULLS OVER (ORDER BY id) FROM {T} ORDER BY id"
            ),
            // Windows over the same order in both directions: one of them runs reversed.
            format!(
                "SELECT id, lag(id) OVER (ORDER BY id), lead(id, 2) OVER (ORDER BY id DESC), \
                 nth_value(id, 2) OVER (ORDER BY id DESC), \
                 first_value(a) IGNORE NULLS OVER (ORDER BY id DESC) FROM {T} ORDER BY id"
            ),
        ] {
            let (direct, travelled) = answers(&sql, true).await;
            assert_eq!(direct, travelled, "{sql}");
        }
        // The case the rewrite exists for: plain datafusion-proto loses IGNORE NULLS.
        let sql = format!("SELECT id, lag(a) IGNORE NULLS OVER (ORDER BY id) FROM {T}");
        let (direct, travelled) = answers(&sql, false).await;
        assert_ne!(
            direct, travelled,
            "datafusion-proto keeps IGNORE NULLS now: {sql}"
        );
    }

    #[test]
    fn only_built_in_directional_or_ignore_nulls_calls_are_wrapped() {
        let wire = |udwf: &WindowUDF| {
            let mut buf = vec![];
            encode(udwf, &mut buf).unwrap().then_some(buf)
        };
        let lag = built_in(&datafusion::functions_window::lead_lag::lag_udwf()).unwrap();
        assert!(
            wire(&lag).is_none(),
            "a plain function is not Basin's to encode"
        );
        let wrapped = NullTreatedWindow::wrap(lag, true, false);
        let decoded = decode(&wire(&wrapped).unwrap()).unwrap();
        assert_eq!(decoded, wrapped);
        assert_eq!(decoded.name(), "lag");
        let ReversedUDWF::Reversed(reversed) = decoded.reverse_expr() else {
            panic!("lag reverses")
        };
        let reversed = reversed
            .inner()
            .as_any()
            .downcast_ref::<NullTreatedWindow>()
            .expect("a reversed wrapper is a wrapper");
        assert!(reversed.ignore_nulls && reversed.reversed);
        assert!(decode(br#"{"function":"no_such","ignore_nulls":true,"reversed":false}"#).is_err());
    }
}
