//! Subqueries that call volatile functions are kept apart.
//!
//! DataFusion's expression simplifier folds `x = x` into `x IS NOT NULL OR NULL` (and
//! `x AND x`, `x OR x` into `x`) unless `x` is volatile, and it asks a subquery expression
//! whether it is volatile without looking into its plan: `(SELECT max(random()) FROM t) =
//! (SELECT max(random()) FROM t)` was folded into one subquery and answered `true`.
//!
//! ```text
//!  analyzer:   (SELECT max(random()) ...)  →  __basin_volatile((SELECT max(random()) ...))
//!  optimizer:  DataFusion's rules (the subqueries become joins, each its own aggregate)
//!  last rule:  __basin_volatile(x)         →  x
//! ```
//!
//! [`MarkVolatileSubqueries`] wraps each scalar subquery whose plan calls a volatile function
//! in `__basin_volatile(...)`, an identity function declared volatile, which the simplifier
//! leaves alone; [`UnmarkVolatileSubqueries`], Basin's last logical rule, takes the marks
//! off once the subqueries are joins. Output names stay what they were. `IN`/`EXISTS`
//! subqueries are not marked (DataFusion decorrelates them only as whole conditions): `x IN
//! (volatile subquery) AND x IN (the same)` is still read once.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion::optimizer::analyzer::AnalyzerRule;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

/// The name of the marking function.
const MARK: &str = "__basin_volatile";

/// See the module documentation.
#[derive(Debug, Default)]
pub struct MarkVolatileSubqueries;

impl AnalyzerRule for MarkVolatileSubqueries {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        let mark = ScalarUDF::new_from_impl(VolatileMark::default());
        let mark = Arc::new(mark);
        plan.transform_up_with_subqueries(|node| {
            rewrite_outputs(node, |e| match e {
                Expr::ScalarSubquery(s) if calls_volatile(&s.subquery) => {
                    Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction {
                        func: Arc::clone(&mark),
                        args: vec![Expr::ScalarSubquery(s)],
                    })))
                }
                e => Ok(Transformed::no(e)),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "basin_mark_volatile_subqueries"
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct UnmarkVolatileSubqueries;

impl OptimizerRule for UnmarkVolatileSubqueries {
    fn name(&self) -> &str {
        "basin_unmark_volatile_subqueries"
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        plan.transform_up_with_subqueries(|node| {
            rewrite_outputs(node, |e| match e {
                Expr::ScalarFunction(f) if f.func.name() == MARK && f.args.len() == 1 => {
                    Ok(Transformed::yes(
                        f.args
                            .into_iter()
                            .next()
                            .unwrap_or_else(|| unreachable!("the length was checked")),
                    ))
                }
                e => Ok(Transformed::no(e)),
            })
        })
    }
}

/// Whether `plan` (or a subquery of it) evaluates a volatile function.
fn calls_volatile(plan: &LogicalPlan) -> bool {
    let mut volatile = false;
    let _ = plan.apply_with_subqueries(|node| {
        volatile = node.expressions().iter().any(|e| {
            e.is_volatile()
                || e.exists(|x| {
                    Ok(matches!(x,
                        Expr::ScalarSubquery(s) if calls_volatile(&s.subquery)))
                })
                .unwrap_or(false)
        });
        Ok(if volatile {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    volatile
}

/// `node` with `f` applied to its expressions, its outputs keeping their names.
fn rewrite_outputs(
    node: LogicalPlan,
    f: impl Fn(Expr) -> Result<Transformed<Expr>>,
) -> Result<Transformed<LogicalPlan>> {
    let names = output_names(&node);
    let rewritten = node.map_expressions(|e| e.transform_up(&f))?;
    if !rewritten.transformed {
        return Ok(rewritten);
    }
    let mut names = names.into_iter();
    let mut keep = |exprs: Vec<Expr>| -> Vec<Expr> {
        exprs
            .into_iter()
            .map(|e| match names.next() {
                Some(name)
                    if !matches!(e, Expr::Column(_) | Expr::Alias(_))
                        && e.schema_name().to_string() != name =>
                {
                    e.alias(name)
                }
                _ => e,
            })
            .collect()
    };
    rewritten.map_data(|node| {
        Ok(match node {
            LogicalPlan::Projection(mut p) => {
                p.expr = keep(p.expr);
                LogicalPlan::Projection(p)
            }
            LogicalPlan::Aggregate(mut a) => {
                a.group_expr = keep(a.group_expr);
                a.aggr_expr = keep(a.aggr_expr);
                LogicalPlan::Aggregate(a)
            }
            LogicalPlan::Window(mut w) => {
                w.window_expr = keep(w.window_expr);
                LogicalPlan::Window(w)
            }
            other => other,
        })
    })
}

/// The names of the expressions of a node that names its outputs after them.
fn output_names(node: &LogicalPlan) -> Vec<String> {
    let exprs: Vec<&Expr> = match node {
        LogicalPlan::Projection(p) => p.expr.iter().collect(),
        LogicalPlan::Aggregate(a) => a.group_expr.iter().chain(&a.aggr_expr).collect(),
        LogicalPlan::Window(w) => w.window_expr.iter().collect(),
        _ => vec![],
    };
    exprs.iter().map(|e| e.schema_name().to_string()).collect()
}

/// `__basin_volatile(x)`: `x`, declared volatile.
#[derive(Debug, PartialEq, Eq, Hash)]
struct VolatileMark {
    signature: Signature,
}

impl Default for VolatileMark {
    fn default() -> Self {
        Self {
            signature: Signature::any(1, Volatility::Volatile),
        }
    }
}

impl ScalarUDFImpl for VolatileMark {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        MARK
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        args.first()
            .cloned()
            .ok_or_else(|| DataFusionError::Internal(format!("{MARK} takes one argument")))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        args.args
            .into_iter()
            .next()
            .ok_or_else(|| DataFusionError::Internal(format!("{MARK} takes one argument")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::SessionContext;

    fn context() -> SessionContext {
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_analyzer_rule(Arc::new(MarkVolatileSubqueries))
            .with_optimizer_rule(Arc::new(UnmarkVolatileSubqueries))
            .build();
        SessionContext::new_with_state(state)
    }

    async fn run(ctx: &SessionContext, sql: &str) -> (String, String) {
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.clone().into_optimized_plan().unwrap();
        let rows = pretty_format_batches(&df.collect().await.unwrap())
            .unwrap()
            .to_string();
        (plan.display_indent().to_string(), rows)
    }

    /// Two identical subqueries over random values are two subqueries; the marks are gone
    /// from the optimized plan and the output keeps its name. Subqueries without volatile
    /// functions are folded as before.
    #[tokio::test]
    async fn volatile_subqueries_are_not_folded_into_one() {
        let ctx = context();
        ctx.sql("CREATE TABLE t AS VALUES (1), (2), (3)")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        for sql in [
            "SELECT (SELECT max(random()) FROM t) = (SELECT max(random()) FROM t)",
            "SELECT (SELECT max(uuid()) FROM t) = (SELECT max(uuid()) FROM t)",
            "SELECT 1 WHERE (SELECT sum(column1 * random()) FROM t) \
             = (SELECT sum(column1 * random()) FROM t)",
        ] {
            let (plan, rows) = run(&ctx, sql).await;
            assert!(!plan.contains(MARK), "{plan}");
            assert_eq!(plan.matches("Aggregate:").count(), 2, "{sql}\n{plan}");
            assert!(!rows.contains("true"), "{sql}\n{rows}");
        }
        // The columns are named as DataFusion alone names them.
        let plain = SessionContext::new();
        plain
            .sql("CREATE TABLE t AS VALUES (1), (2), (3)")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        for sql in [
            "SELECT (SELECT max(random()) FROM t) = (SELECT max(random()) FROM t)",
            "SELECT (SELECT max(random()) FROM t) AS a, (SELECT max(random()) + 1 FROM t), \
             (SELECT max(random()) FROM t) * 2",
        ] {
            let names = |plan: LogicalPlan| -> Vec<String> {
                plan.schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect()
            };
            let optimized = |ctx: &SessionContext| {
                let ctx = ctx.clone();
                async move { ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap() }
            };
            assert_eq!(
                names(optimized(&ctx).await),
                names(optimized(&plain).await),
                "{sql}"
            );
        }
        // Deterministic subqueries: DataFusion's folding is kept.
        let (plan, rows) = run(
            &ctx,
            "SELECT (SELECT max(column1) FROM t) = (SELECT max(column1) FROM t)",
        )
        .await;
        assert_eq!(plan.matches("Aggregate:").count(), 1, "{plan}");
        assert!(rows.contains("true"), "{rows}");
    }
}
