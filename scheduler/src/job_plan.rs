//! A Ballista job's logical plan, made to arrive as it was sent.
//!
//! A job's logical plan goes to the Ballista scheduler through datafusion-proto 53, which
//! rebuilds some nodes from part of what they hold. Found by DataFusion's sqllogictest corpus
//! with every query a Ballista job (the `jobs` route); each was a wrong answer:
//!
//! - A join came back with the default NULL semantics: its `null_equality` (`ON a IS NOT
//!   DISTINCT FROM b`, and the joins DataFusion makes for `INTERSECT` and `EXCEPT`, where NULLs
//!   match NULLs) and its `null_aware` flag (`NOT IN`) are not decoded. The job dropped the
//!   rows whose keys were NULL (`join_is_not_distinct_from.slt`: one row of three; an `EXCEPT`
//!   in `union_by_name.slt` kept a row it should remove). [`portable_job_plan`] adds a call of
//!   `basin_join_semantics(nulls_equal, null_aware)` to such a join's filter, where
//!   datafusion-proto keeps it; [`RestoreJoinSemantics`], an analyzer rule of the scheduler's
//!   sessions (analyzers run before any optimizer rule reads the join), takes the call out and
//!   sets the two fields. The function is volatile, so no rule moves or folds it on the way,
//!   and it is true wherever it would run.
//! - A `USING` join came back as a cross join (`t1 LEFT JOIN t2 USING (id)`: every row of t1
//!   with every row of t2): it is sent as the `ON` join it already is.
//! - Join keys of type `Null` (`SELECT NULL AS a … ON a = b`): Ballista's sort-merge join read
//!   two `Null`-typed keys as equal and returned a row. They are sent cast to `Int32` (all
//!   NULL as well).
//! - `OFFSET n` without a `LIMIT` came back with a fetch of `i64::MAX`, which overflowed once
//!   the offset was added to it further down (`OFFSET 2` of four rows returned none). It is
//!   sent with the largest fetch that does not: `i64::MAX - n`.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchemaRef, JoinConstraint, NullEquality, Result, ScalarValue};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, FetchType, Limit, LogicalPlan, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, SkipType, Volatility, cast, lit,
};
use datafusion::optimizer::AnalyzerRule;

/// The marker's name.
pub const MARKER: &str = "basin_join_semantics";

/// `basin_join_semantics(nulls_equal, null_aware)`: true; carries a join's NULL semantics.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct JoinSemanticsMarker {
    signature: Signature,
}

impl Default for JoinSemanticsMarker {
    fn default() -> Self {
        Self {
            signature: Signature::exact(
                vec![DataType::Boolean, DataType::Boolean],
                Volatility::Volatile,
            ),
        }
    }
}

impl ScalarUDFImpl for JoinSemanticsMarker {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn name(&self) -> &str {
        MARKER
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }
    fn invoke_with_args(&self, _: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))))
    }
}

/// The marker function, for a session's registry.
pub fn marker_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(JoinSemanticsMarker::default()))
}

/// `plan` as the Ballista scheduler will read it back (see the module docs).
pub fn portable_job_plan(plan: LogicalPlan) -> Result<LogicalPlan> {
    Ok(plan
        .transform_up_with_subqueries(|node| {
            let mut join = match node {
                LogicalPlan::Join(join) => join,
                LogicalPlan::Limit(limit) => return bounded_offset(limit),
                other => return Ok(Transformed::no(other)),
            };
            let mut changed = false;
            if join.join_constraint == JoinConstraint::Using {
                join.join_constraint = JoinConstraint::On;
                changed = true;
            }
            for (left, right) in &mut join.on {
                let null_typed = |e: &Expr, schema: &DFSchemaRef| {
                    e.get_type(schema.as_ref())
                        .is_ok_and(|t| t == DataType::Null)
                };
                if null_typed(left, join.left.schema()) || null_typed(right, join.right.schema()) {
                    *left = cast(left.clone(), DataType::Int32);
                    *right = cast(right.clone(), DataType::Int32);
                    changed = true;
                }
            }
            if join.null_equality == NullEquality::NullEqualsNull || join.null_aware {
                let marker = Expr::ScalarFunction(ScalarFunction::new_udf(
                    marker_udf(),
                    vec![
                        lit(join.null_equality == NullEquality::NullEqualsNull),
                        lit(join.null_aware),
                    ],
                ));
                join.filter = Some(match join.filter.take() {
                    Some(filter) => marker.and(filter),
                    None => marker,
                });
                join.null_equality = NullEquality::NullEqualsNothing;
                join.null_aware = false;
                changed = true;
            }
            Ok(if changed {
                Transformed::yes(LogicalPlan::Join(join))
            } else {
                Transformed::no(LogicalPlan::Join(join))
            })
        })?
        .data)
}

/// A `LIMIT` with an offset and no fetch, with the largest fetch whose sum with the offset
/// fits an `i64` (see the module docs).
fn bounded_offset(mut limit: Limit) -> Result<Transformed<LogicalPlan>> {
    if let (SkipType::Literal(skip @ 1..), FetchType::Literal(None)) =
        (limit.get_skip_type()?, limit.get_fetch_type()?)
    {
        let fetch = (i64::MAX as u64).saturating_sub(skip as u64);
        limit.fetch = Some(Box::new(lit(fetch as i64)));
        return Ok(Transformed::yes(LogicalPlan::Limit(limit)));
    }
    Ok(Transformed::no(LogicalPlan::Limit(limit)))
}

/// Takes the markers of [`portable_job_plan`] out of the joins' filters and sets what they carry.
#[derive(Debug, Default)]
pub struct RestoreJoinSemantics;

impl AnalyzerRule for RestoreJoinSemantics {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        Ok(plan
            .transform_up_with_subqueries(|node| {
                let LogicalPlan::Join(mut join) = node else {
                    return Ok(Transformed::no(node));
                };
                let Some(filter) = join.filter.take() else {
                    return Ok(Transformed::no(LogicalPlan::Join(join)));
                };
                let mut marked = None;
                let rest: Vec<Expr> = split_conjunction_owned(filter)
                    .into_iter()
                    .filter(|e| match flags(e) {
                        Some(f) if marked.is_none() => {
                            marked = Some(f);
                            false
                        }
                        _ => true,
                    })
                    .collect();
                join.filter = conjunction(rest);
                let Some((nulls_equal, null_aware)) = marked else {
                    return Ok(Transformed::no(LogicalPlan::Join(join)));
                };
                if nulls_equal {
                    join.null_equality = NullEquality::NullEqualsNull;
                }
                join.null_aware = null_aware;
                Ok(Transformed::yes(LogicalPlan::Join(join)))
            })?
            .data)
    }

    fn name(&self) -> &str {
        "basin_restore_join_semantics"
    }
}

/// The flags of a marker call.
fn flags(e: &Expr) -> Option<(bool, bool)> {
    let Expr::ScalarFunction(f) = e else {
        return None;
    };
    if f.func.name() != MARKER {
        return None;
    }
    let flag = |i: usize| match f.args.get(i) {
        Some(Expr::Literal(ScalarValue::Boolean(Some(b)), _)) => Some(*b),
        _ => None,
    };
    Some((flag(0)?, flag(1)?))
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;
    use datafusion_proto::bytes::{
        logical_plan_from_bytes_with_extension_codec, logical_plan_to_bytes_with_extension_codec,
    };

    use super::*;

    /// Each join's semantics as `(null_equality, null_aware)`, outermost first.
    fn semantics(plan: &LogicalPlan) -> Vec<(NullEquality, bool)> {
        let mut found = vec![];
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::Join(j) = node {
                found.push((j.null_equality, j.null_aware));
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .unwrap();
        found
    }

    /// How many rows `plan` returns.
    async fn rows_of(ctx: &SessionContext, plan: LogicalPlan) -> usize {
        let batches = ctx
            .execute_logical_plan(plan)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        batches.iter().map(|b| b.num_rows()).sum()
    }

    #[tokio::test]
    async fn null_semantics_of_joins_come_through_the_codec() {
        let ctx = SessionContext::new();
        ctx.register_udf((*marker_udf()).clone());
        for sql in [
            "CREATE TABLE t1(id INT, val INT) AS VALUES (1, 10), (2, NULL), (6, NULL)",
            "CREATE TABLE t2(id INT, val INT) AS VALUES (1, 10), (2, NULL), (3, 30)",
        ] {
            ctx.sql(sql).await.unwrap().collect().await.unwrap();
        }
        let sql = "SELECT t1.id, t2.id FROM t1 JOIN t2 \
                   ON (t1.val IS NOT DISTINCT FROM t2.val) AND t1.id <= t2.id";
        let plan = ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap();
        let before = semantics(&plan);
        assert_eq!(before, vec![(NullEquality::NullEqualsNull, false)]);
        let filter_before = format!("{plan}");

        // Through the codecs, as to the Ballista scheduler.
        let codec = basin_connectors::codec::logical_codec();
        let through = |plan: &LogicalPlan| {
            let bytes = logical_plan_to_bytes_with_extension_codec(plan, codec.as_ref()).unwrap();
            logical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), codec.as_ref())
                .unwrap()
        };
        // What datafusion-proto does to the plan as it is.
        let plain = through(&plan);
        assert_eq!(
            semantics(&plain),
            vec![(NullEquality::NullEqualsNothing, false)]
        );

        let marked = portable_job_plan(plan).unwrap();
        let decoded = through(&marked);
        let restored = RestoreJoinSemantics
            .analyze(decoded, &ConfigOptions::default())
            .unwrap();
        assert_eq!(semantics(&restored), before);
        assert_eq!(format!("{restored}"), filter_before);
        // (1, 1) on 10 = 10, (2, 2) on NULL = NULL; (6, 2) fails the filter.
        assert_eq!(rows_of(&ctx, restored).await, 2);

        // USING joins keep their keys; NULL-typed keys become typed.
        for (sql, rows) in [
            ("SELECT t1.id, t2.val FROM t1 LEFT JOIN t2 USING (id)", 3),
            (
                "SELECT * FROM (SELECT NULL AS a) x JOIN (SELECT NULL AS b) y ON a = b",
                0,
            ),
            ("SELECT t1.id FROM t1 JOIN t2 USING (id) OFFSET 1", 1),
        ] {
            let plan = ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap();
            let decoded = through(&portable_job_plan(plan).unwrap());
            let restored = RestoreJoinSemantics
                .analyze(decoded, &ConfigOptions::default())
                .unwrap();
            let shown = format!("{restored}");
            assert!(
                !shown.contains("Cross") && shown.contains("Join: "),
                "{shown}"
            );
            assert!(!shown.contains(&i64::MAX.to_string()), "{shown}");
            assert_eq!(rows_of(&ctx, restored).await, rows, "{sql}");
        }
    }
}
