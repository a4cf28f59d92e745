//! `NOT IN (subquery)` as a plain anti join.
//!
//! `x NOT IN (SELECT k …)` is true only when the subquery returns no NULL key and `x` is not
//! among its keys — and `x` is not NULL unless the subquery is empty. DataFusion decorrelates
//! it into a *null-aware* anti join when a key may be NULL (an Iceberg column that is not
//! `required`, any column of a remote table). Such a join must collect its whole left side —
//! the query's rows, not the subquery's — into one hash table, and it yields them from a
//! single partition: TPC-H Q16 built its table from the 120,000 parts-and-suppliers rows to
//! probe them with a handful of suppliers, and grouped them afterwards on one thread.
//!
//! [`NotInAsAntiJoin`] writes it as a plain anti join, which DataFusion plans either way
//! round (the small subquery as the build side) and keeps partitioned, and checks the NULL
//! rules with two counts of the subquery's rows, joined in as one row:
//!
//! ```text
//!  before:  LeftAnti(x = k, null-aware)       after:  Projection(left's columns)
//!             ├─ left                                  └─ Filter(n = nk AND (x IS NOT NULL OR n = 0))
//!             └─ subquery                                   └─ Join(cross)
//!                                                               ├─ Aggregate(n: count(*), nk: count(k))
//!                                                               │    └─ subquery
//!                                                               └─ LeftAnti(x = k)
//!                                                                    ├─ left
//!                                                                    └─ subquery
//! ```
//!
//! Why the result is the same: a plain anti join keeps the rows whose `x` equals no key,
//! including every row whose `x` is NULL. When the subquery has a NULL key (`n > nk`), `NOT
//! IN` is never true: the filter drops every row. When it is empty (`n = 0`), every row is
//! kept, NULL or not. Otherwise a row with a NULL `x` has an unknown `NOT IN` and is dropped
//! (`x IS NOT NULL`), and the others are the anti join's. The subquery is read twice, so it
//! must give the same rows each time (no volatile function, no `LIMIT`), and `x` is computed
//! twice, so it must not be volatile either.

use std::sync::Arc;

use datafusion::common::{Column, JoinConstraint, JoinType, NullEquality, Result};
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::logical_expr::{Expr, Join, LogicalPlan, LogicalPlanBuilder, lit};

/// The alias of the subquery's counts.
const COUNTS: &str = "__basin_not_in";
/// The subquery's rows.
const ROWS: &str = "rows";
/// The subquery's non-NULL keys.
const KEYS: &str = "keys";

/// See the module documentation.
#[derive(Debug, Default)]
pub struct NotInAsAntiJoin;

crate::prefilter::join_rule!(
    NotInAsAntiJoin,
    "basin_not_in_as_anti_join",
    plain_anti_join
);

/// The null-aware anti join `join` without null awareness (see the module documentation),
/// or `None` when it is not one of one equal key.
fn plain_anti_join(join: &Join) -> Result<Option<LogicalPlan>> {
    let [(x, k)] = join.on.as_slice() else {
        return Ok(None);
    };
    if !join.null_aware
        || join.join_type != JoinType::LeftAnti
        || join.filter.is_some()
        || join.null_equality != NullEquality::NullEqualsNothing
        || x.is_volatile()
        || k.is_volatile()
        || !crate::prefilter::reads_the_same_twice(&join.right)
    {
        return Ok(None);
    }
    let counts = LogicalPlanBuilder::from(join.right.as_ref().clone())
        .aggregate(
            Vec::<Expr>::new(),
            vec![count(lit(1)).alias(ROWS), count(k.clone()).alias(KEYS)],
        )?
        .alias(COUNTS)?
        .build()?;
    let anti = LogicalPlan::Join(Join::try_new(
        Arc::clone(&join.left),
        Arc::clone(&join.right),
        join.on.clone(),
        None,
        JoinType::LeftAnti,
        JoinConstraint::On,
        NullEquality::NullEqualsNothing,
        false,
    )?);
    let column = |name: &str| Expr::Column(Column::new(Some(COUNTS), name));
    let rows = column(ROWS);
    let keep = rows
        .clone()
        .eq(column(KEYS))
        .and(x.clone().is_not_null().or(rows.eq(lit(0i64))));
    // The counts (one row) on the left: a cross join collects its left side.
    let left_columns: Vec<Expr> = join
        .left
        .schema()
        .iter()
        .map(|field| Expr::Column(Column::from(field)))
        .collect();
    LogicalPlanBuilder::from(counts)
        .cross_join(anti)?
        .filter(keep)?
        .project(left_columns)?
        .build()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    async fn context(with_rule: bool) -> SessionContext {
        let rule = with_rule.then(|| Arc::new(NotInAsAntiJoin) as _);
        let tables = [
            "CREATE TABLE t (x INT, v VARCHAR) AS VALUES \
             (1, 'a'), (2, 'b'), (3, 'c'), (NULL, 'n'), (5, 'e'), (2, 'b2')",
            "CREATE TABLE s (k INT, tag VARCHAR) AS VALUES \
             (2, 'p'), (4, 'p'), (NULL, 'q'), (5, 'r')",
        ];
        crate::testing::context(rule, &tables).await
    }

    use crate::testing::plan_and_rows as run;

    #[tokio::test]
    async fn not_in_keeps_its_null_rules_as_a_plain_anti_join() {
        let (with, without) = (context(true).await, context(false).await);
        let cases: &[(&str, bool)] = &[
            // The subquery has a NULL key: no row.
            ("SELECT x, v FROM t WHERE x NOT IN (SELECT k FROM s)", true),
            // No NULL key: rows whose x is not a key, not the NULL x.
            (
                "SELECT x, v FROM t WHERE x NOT IN (SELECT k FROM s WHERE tag = 'p')",
                true,
            ),
            // An empty subquery: every row, the NULL x too.
            (
                "SELECT x, v FROM t WHERE x NOT IN (SELECT k FROM s WHERE tag = 'none')",
                true,
            ),
            // Only NULL keys.
            (
                "SELECT x, v FROM t WHERE x NOT IN (SELECT k FROM s WHERE tag = 'q')",
                true,
            ),
            // A computed probe key, and other conditions around it.
            (
                "SELECT x, v FROM t WHERE x + 1 NOT IN (SELECT k FROM s WHERE tag <> 'q') \
                 AND v <> 'c'",
                true,
            ),
            // Grouped above, as in TPC-H Q16.
            (
                "SELECT v, count(DISTINCT x) FROM t \
                 WHERE x NOT IN (SELECT k FROM s WHERE tag = 'p') GROUP BY v",
                true,
            ),
            // A subquery that may read other rows a second time: left null-aware.
            (
                "SELECT x, v FROM t WHERE x NOT IN (SELECT k FROM s LIMIT 2)",
                false,
            ),
            // NOT EXISTS is a plain anti join already.
            (
                "SELECT x, v FROM t WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.k = t.x)",
                false,
            ),
        ];
        for (sql, rewritten) in cases {
            let (plan, rows) = run(&with, sql).await;
            let (_, expected) = run(&without, sql).await;
            assert_eq!(rows, expected, "{sql}\n{plan}");
            assert_eq!(plan.contains(COUNTS), *rewritten, "{sql}\n{plan}");
        }
        // The NULL rules at work (not only the same rows as DataFusion's).
        let (_, rows) = run(&with, cases[0].0).await;
        assert!(rows.iter().all(|r| !r.contains("| a")), "{rows:?}");
        let (_, rows) = run(&with, cases[2].0).await;
        assert!(rows.iter().any(|r| r.contains("| n")), "{rows:?}");
        let (_, rows) = run(&with, cases[1].0).await;
        assert!(rows.iter().any(|r| r.contains("| a")), "{rows:?}");
        assert!(!rows.iter().any(|r| r.contains("| n")), "{rows:?}");
    }
}
