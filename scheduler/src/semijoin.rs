//! Semi joins placed below the inner joins they filter.
//!
//! A decorrelated `IN (subquery)` becomes a semi join above the whole `FROM` clause: TPC-H
//! Q18 joins customer, orders and lineitem (1.5 million orders, 6 million lineitems) and
//! only then keeps the rows whose order key the subquery returned (57 of them). DataFusion
//! does not move semi joins, so it builds a hash table of every customer's orders and
//! probes it with every lineitem. [`PushDownSemiJoins`] moves the semi join down to the
//! input its keys come from, the way a filter is pushed down:
//!
//! ```text
//!  before:  LeftSemi(o_orderkey = k)            after:  Join(o_orderkey = l_orderkey)
//!             ├─ Join(o_orderkey = l_orderkey)            ├─ Join(c_custkey = o_custkey)
//!             │    ├─ Join(c_custkey = o_custkey)         │    ├─ customer
//!             │    │    ├─ customer                       │    └─ LeftSemi(o_orderkey = k)
//!             │    │    └─ orders                         │         ├─ orders
//!             │    └─ lineitem                            │         └─ subquery
//!             └─ subquery                                 └─ lineitem
//! ```
//!
//! It moves through projections that pass its keys through and into the side of a join
//! its keys come from (either side of an inner join, the preserved side of an outer join,
//! the filtered side of an anti join). It stops above a filter: the filter is
//! cheaper per row, and the semi join then probes only the rows that passed it. For the same
//! reason it stops above an inner join whose other side is one filtered table (a dimension
//! cut by a predicate): such a join drops rows as a filter does, with a smaller hash table
//! than the subquery's. TPC-DS Q14 keeps the sales of one month whose item is
//! among most of the catalogue; moved below the month's join, the semi join probed every
//! sale of five years, and DataFusion's join selection, without an estimate for the
//! subquery, built its hash table from them (10× DataFusion's time).
//!
//! Why the result is the same: a semi join keeps or drops each row of its input by the
//! row's key alone, without changing or repeating it, like a filter on the key's columns.
//! Such a filter commutes with projections that pass the key through, with both sides of
//! an inner join (on the side that has the key) and with the preserved side of an outer
//! join, and so does the semi join.

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, JoinConstraint, JoinType, NullEquality, Result, plan_err};
use datafusion::logical_expr::{Expr, Join, LogicalPlan, Projection};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

use crate::prefilter::passed_from;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct PushDownSemiJoins;

impl OptimizerRule for PushDownSemiJoins {
    fn name(&self) -> &str {
        "basin_push_down_semi_joins"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Join(join) = &plan else {
            return Ok(Transformed::no(plan));
        };
        // A semi join that cannot be moved stays where it is: the query never fails for it.
        match push_down(join) {
            Ok(Some(rewritten)) => Ok(Transformed::yes(rewritten)),
            Ok(None) => Ok(Transformed::no(plan)),
            Err(e) => {
                tracing::debug!(error = %e, "semi join left in place");
                Ok(Transformed::no(plan))
            }
        }
    }
}

/// The semi join's filtered side with the semi join moved down into it, or `None` when
/// it cannot move (or is not a plain equi semi join).
fn push_down(join: &Join) -> Result<Option<LogicalPlan>> {
    if join.null_equality != NullEquality::NullEqualsNothing
        || join.null_aware
        || join.filter.is_some()
        || join.on.is_empty()
    {
        return Ok(None);
    }
    let (filtered, keys_side, left_semi) = match join.join_type {
        JoinType::LeftSemi => (&join.left, &join.right, true),
        JoinType::RightSemi => (&join.right, &join.left, false),
        _ => return Ok(None),
    };
    let mut keys = Vec::with_capacity(join.on.len());
    let mut others = Vec::with_capacity(join.on.len());
    for (l, r) in &join.on {
        let (Expr::Column(l), Expr::Column(r)) = (l, r) else {
            return Ok(None);
        };
        let (key, other) = if left_semi { (l, r) } else { (r, l) };
        keys.push(key.clone());
        others.push(other.clone());
    }
    let semi = Semi {
        keys: others,
        plan: keys_side.as_ref(),
    };
    // Only a move below at least one operator is a change.
    descend(filtered, &keys, &semi)
}

/// The side of the semi join that holds the keys the filtered rows must match.
struct Semi<'a> {
    keys: Vec<Column>,
    plan: &'a LogicalPlan,
}

impl Semi<'_> {
    /// `input ⋉ keys side` on exactly these columns (built as is: a builder would
    /// resolve unqualified or ambiguous names its own way).
    fn place(&self, input: &LogicalPlan, keys: &[Column]) -> Result<LogicalPlan> {
        let resolved = keys.iter().all(|k| input.schema().has_column(k))
            && self.keys.iter().all(|k| self.plan.schema().has_column(k));
        if !resolved {
            return plan_err!("semi join keys {keys:?} = {:?} not found", self.keys);
        }
        let on = keys
            .iter()
            .zip(&self.keys)
            .map(|(k, o)| (Expr::Column(k.clone()), Expr::Column(o.clone())))
            .collect();
        Ok(LogicalPlan::Join(Join::try_new(
            Arc::new(input.clone()),
            Arc::new(self.plan.clone()),
            on,
            None,
            JoinType::LeftSemi,
            JoinConstraint::On,
            NullEquality::NullEqualsNothing,
            false,
        )?))
    }
}

/// `plan` with the semi join on `keys` (columns of `plan`'s output) placed as low inside
/// it as it may go; `None` when it cannot go below `plan` itself.
fn descend(plan: &LogicalPlan, keys: &[Column], semi: &Semi) -> Result<Option<LogicalPlan>> {
    let below = |input: &LogicalPlan, keys: &[Column]| -> Result<LogicalPlan> {
        Ok(match descend(input, keys, semi)? {
            Some(p) => p,
            None => semi.place(input, keys)?,
        })
    };
    Ok(match plan {
        LogicalPlan::Projection(p) => {
            let Some(inner) = keys
                .iter()
                .map(|k| passed_from(plan, k))
                .collect::<Option<Vec<_>>>()
            else {
                return Ok(None);
            };
            let input = below(&p.input, &inner)?;
            // The input's schema is the same: so is the projection's.
            Some(LogicalPlan::Projection(Projection::try_new_with_schema(
                p.expr.clone(),
                Arc::new(input),
                Arc::clone(&p.schema),
            )?))
        }
        LogicalPlan::Join(j) => {
            let on_left = keys.iter().all(|k| j.left.schema().has_column(k));
            let on_right = keys.iter().all(|k| j.right.schema().has_column(k));
            // The side the keys come from, if the semi join may filter it. Not through
            // another semi join: two semi joins on one input would swap places on every
            // pass of the optimizer.
            let go_left = on_left
                && !on_right
                && matches!(
                    j.join_type,
                    JoinType::Inner | JoinType::Left | JoinType::LeftAnti
                );
            let go_right = on_right
                && !on_left
                && matches!(
                    j.join_type,
                    JoinType::Inner | JoinType::Right | JoinType::RightAnti
                );
            if !go_left && !go_right {
                return Ok(None);
            }
            let other = if go_left { &j.right } else { &j.left };
            if j.join_type == JoinType::Inner && filtered_table(other) {
                return Ok(None);
            }
            let mut j = j.clone();
            if go_left {
                j.left = Arc::new(below(&j.left, keys)?);
            } else {
                j.right = Arc::new(below(&j.right, keys)?);
            }
            Some(LogicalPlan::Join(j))
        }
        _ => None,
    })
}

/// Whether `plan` is one table cut by a predicate (a dimension filtered by the query): a
/// scan with pushed-down filters, or below a filter, under projections and aliases only.
/// Joined on equal keys, it drops the other side's rows as a filter would. A join is not:
/// a semi join on a dimension's column (TPC-DS Q70: `s_state IN (…)` beside store sales of
/// twelve months) belongs on the dimension, below the join with the filtered sales.
fn filtered_table(plan: &LogicalPlan) -> bool {
    one_table(plan) == Some(true)
}

/// `Some(filtered)` when `plan` reads one table through filters, projections and aliases.
fn one_table(plan: &LogicalPlan) -> Option<bool> {
    match plan {
        LogicalPlan::TableScan(scan) => Some(!scan.filters.is_empty()),
        LogicalPlan::Filter(f) => one_table(&f.input).map(|_| true),
        LogicalPlan::Projection(p) => one_table(&p.input),
        LogicalPlan::SubqueryAlias(a) => one_table(&a.input),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    async fn context() -> SessionContext {
        let ctx = SessionContext::new();
        for sql in [
            "CREATE TABLE customer (c_custkey INT, c_name TEXT) AS VALUES (1, 'a'), (2, 'b'), (3, 'c')",
            "CREATE TABLE orders (o_orderkey INT, o_custkey INT) AS VALUES (10, 1), (11, 2), (12, 2), (13, 3), (14, NULL)",
            "CREATE TABLE lineitem (l_orderkey INT, l_quantity INT) AS VALUES (10, 5), (10, 300), (11, 7), (12, 400), (12, 1), (13, 2), (14, 500), (NULL, 600)",
        ] {
            ctx.sql(sql).await.unwrap().collect().await.unwrap();
        }
        ctx
    }

    const Q18: &str = "SELECT c_name, o_orderkey, sum(l_quantity) AS q \
        FROM customer, orders, lineitem \
        WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300) \
        AND c_custkey = o_custkey AND o_orderkey = l_orderkey \
        GROUP BY c_name, o_orderkey ORDER BY o_orderkey";

    async fn rows(ctx: &SessionContext, sql: &str) -> String {
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string()
    }

    #[tokio::test]
    async fn the_semi_join_moves_to_the_table_its_key_comes_from_with_the_same_rows() {
        let plain = context().await;
        let expected = rows(&plain, Q18).await;
        let ctx = context().await;
        ctx.add_optimizer_rule(Arc::new(PushDownSemiJoins));
        assert_eq!(rows(&ctx, Q18).await, expected);
        assert!(
            expected.contains("| b      | 12         | 401 |"),
            "{expected}"
        );

        let plan = ctx.sql(Q18).await.unwrap().into_optimized_plan().unwrap();
        let text = plan.display_indent().to_string();
        // The semi join is now directly above the orders scan, below the inner joins.
        let semi = text.find("LeftSemi Join").expect(&text);
        let inner = text.find("Inner Join").expect(&text);
        assert!(inner < semi, "{text}");
        let after = &text[semi..];
        assert!(after.lines().nth(1).unwrap().contains("orders"), "{text}");
    }

    #[tokio::test]
    async fn it_does_not_filter_the_optional_side_of_an_outer_join() {
        let sql = "SELECT c_custkey, o_orderkey FROM ( \
              SELECT c_custkey, o_orderkey FROM customer LEFT JOIN orders ON c_custkey = o_custkey \
            ) t WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem WHERE l_quantity > 100) \
            ORDER BY c_custkey, o_orderkey";
        let plain = context().await;
        let expected = rows(&plain, sql).await;
        let ctx = context().await;
        ctx.add_optimizer_rule(Arc::new(PushDownSemiJoins));
        assert_eq!(rows(&ctx, sql).await, expected);
        let sql = "SELECT c_custkey FROM customer LEFT JOIN orders ON c_custkey = o_custkey \
            WHERE c_custkey IN (SELECT o_custkey FROM orders WHERE o_orderkey > 11) ORDER BY 1";
        let expected = rows(&plain, sql).await;
        assert_eq!(rows(&ctx, sql).await, expected);
    }

    #[tokio::test]
    async fn a_semi_join_of_a_table_with_itself_gives_the_same_rows() {
        let sql = "SELECT c_name, orders.o_orderkey FROM customer JOIN orders ON c_custkey = o_custkey \
            LEFT SEMI JOIN orders ON orders.o_orderkey = orders.o_orderkey ORDER BY 2";
        let plain = context().await;
        let expected = plain.sql(sql).await.map(|_| ()).map_err(|e| e.to_string());
        let ctx = context().await;
        ctx.add_optimizer_rule(Arc::new(PushDownSemiJoins));
        match expected {
            Ok(()) => assert_eq!(rows(&ctx, sql).await, rows(&plain, sql).await),
            Err(e) => assert_eq!(
                ctx.sql(sql).await.map(|_| ()).map_err(|e| e.to_string()),
                Err(e)
            ),
        }
        let sql = "SELECT c_name, o.o_orderkey FROM customer JOIN orders o ON c_custkey = o.o_custkey \
            LEFT SEMI JOIN orders ON o.o_orderkey = orders.o_orderkey ORDER BY 2";
        assert_eq!(rows(&ctx, sql).await, rows(&plain, sql).await);
    }

    #[tokio::test]
    async fn it_stays_above_a_join_with_a_filtered_table() {
        // TPC-DS Q14's shape: the orders of customers past the first, among those of a
        // subquery; the customers' join drops rows as a filter would, so the semi join stays
        // above it (and still moves below the unfiltered join with lineitem).
        let sql = "SELECT c_name, o_orderkey, l_quantity FROM orders, customer, lineitem \
            WHERE c_custkey = o_custkey AND c_custkey > 1 AND o_orderkey = l_orderkey \
            AND o_orderkey IN (SELECT l_orderkey FROM lineitem WHERE l_quantity > 100) ORDER BY 2, 3";
        let plain = context().await;
        let expected = rows(&plain, sql).await;
        let ctx = context().await;
        ctx.add_optimizer_rule(Arc::new(PushDownSemiJoins));
        assert_eq!(rows(&ctx, sql).await, expected);
        let plan = ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap();
        let text = plan.display_indent().to_string();
        let semi = text.find("LeftSemi Join").expect(&text);
        let customer_join = text.find("o_custkey").expect(&text);
        assert!(semi < customer_join, "{text}");
    }

    #[tokio::test]
    async fn it_moves_onto_a_dimension_past_a_join_of_filtered_facts() {
        // TPC-DS Q70's shape: a semi join on a customer column beside filtered lineitems
        // joined with orders belongs on the customers, below that join.
        let sql = "SELECT c_name, l_quantity FROM lineitem, orders, customer \
            WHERE l_orderkey = o_orderkey AND o_custkey = c_custkey AND l_quantity > 5 \
            AND c_name IN (SELECT c_name FROM customer WHERE c_custkey > 1) ORDER BY 1, 2";
        let plain = context().await;
        let expected = rows(&plain, sql).await;
        let ctx = context().await;
        ctx.add_optimizer_rule(Arc::new(PushDownSemiJoins));
        assert_eq!(rows(&ctx, sql).await, expected);
        let plan = ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap();
        let text = plan.display_indent().to_string();
        let semi = text.find("LeftSemi Join").expect(&text);
        let after: Vec<&str> = text[semi..].lines().collect();
        assert!(after[1].contains("TableScan: customer"), "{text}");
    }

    #[tokio::test]
    async fn it_stays_above_a_filter() {
        let sql = "SELECT c_name, o_orderkey FROM customer, orders \
            WHERE c_custkey = o_custkey AND o_custkey > 1 \
            AND o_orderkey IN (SELECT l_orderkey FROM lineitem WHERE l_quantity > 100) ORDER BY 2";
        let plain = context().await;
        let expected = rows(&plain, sql).await;
        let ctx = context().await;
        ctx.add_optimizer_rule(Arc::new(PushDownSemiJoins));
        assert_eq!(rows(&ctx, sql).await, expected);
        let plan = ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap();
        let text = plan.display_indent().to_string();
        let semi = text.find("LeftSemi Join").expect(&text);
        let after: Vec<&str> = text[semi..].lines().collect();
        assert!(
            after[1].contains("Filter") && after[2].contains("orders"),
            "{text}"
        );
    }
}
