//! Aggregate subqueries over the query's own rows, as window functions.
//!
//! A correlated subquery that aggregates the same rows the query joins — TPC-H Q17's average
//! quantity of a part's lineitems next to those very lineitems, Q2's lowest supply cost of a
//! part among the European suppliers the query already joins — is decorrelated by DataFusion
//! into a join with an aggregate grouped by the correlation key. That aggregate reads its
//! tables a second time (Q17: all 6 million lineitems again, to keep the 6,000 the query
//! wants). [`AggregateSubqueryAsWindow`] computes it over the query's rows instead, as a window
//! partitioned by the key (the rewrite known as WinMagic):
//!
//! ```text
//!  before:  Join(c = g, F)                         after:  Projection(O's columns, g := c, a := w)
//!             ├─ O = I ⋈ R  (rows of I joined to R)          └─ Filter(F with a := w)
//!             └─ Aggregate(g; a := min/max/avg(x))                └─ Window(w := min/max/avg(x) OVER (PARTITION BY c))
//!                  └─ I                                                └─ O
//! ```
//!
//! Why the result is the same: `O` is a tree of inner equi joins whose leaves are the leaves
//! of `I` — the same scans with the same filters, joined by exactly the same equalities — and
//! other leaves `R`, joined to `I`'s part only through `I`'s grouping keys. Within one value
//! `v` of the keys, `O`'s rows are then every row of `I` with key `v` paired with every row of
//! `R` that joins `v`: each row of the group appears the same number of times. `min`, `max`
//! and `avg` do not change when every value is repeated the same number of times, so the
//! window over `O`'s rows of key `v` equals the subquery's group `v`, and every row of `O`
//! has its group (its key is one of `I`'s). Sums and counts would change, and are left alone.
//!
//! An ungrouped subquery over the same rows as the outer side's grouped aggregate (TPC-H Q11:
//! the total stock value of the German suppliers, next to the same sum per part) is the
//! combination of the groups' own values: the sum of their sums or counts, the least of their
//! minimums, the greatest of their maximums — a window `OVER ()` over the groups.
//!
//! The rewrite pays off when `O` is smaller than `I`; it is made only when `R` filters (a
//! filtered scan or filter among its leaves), as the parts of one brand do in Q17 and Q2.
//! `I` must read the same rows each time (no volatile function, no `LIMIT`).

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchemaRef, JoinType, NullEquality, Result};
use datafusion::logical_expr::ExprSchemable;
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction, WindowFunctionParams};
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{
    Aggregate, Expr, Join, LogicalPlan, LogicalPlanBuilder, Operator, TableScan, WindowFrame,
    WindowFunctionDefinition,
};

use crate::prefilter::{always_true, unalias};

/// The names of the window columns this rule adds.
const WINDOW: &str = "__basin_window";

/// See the module documentation.
#[derive(Debug, Default)]
pub struct AggregateSubqueryAsWindow;

crate::prefilter::join_rule!(
    AggregateSubqueryAsWindow,
    "basin_aggregate_subquery_as_window",
    as_window
);

/// The subquery of a join: its alias, its output expressions (over the aggregate's columns)
/// and the aggregate.
struct Subquery<'a> {
    alias: &'a datafusion::common::TableReference,
    schema: &'a DFSchemaRef,
    outputs: Vec<Expr>,
    aggregate: &'a Aggregate,
}

fn subquery(plan: &LogicalPlan) -> Option<Subquery<'_>> {
    let LogicalPlan::SubqueryAlias(alias) = plan else {
        return None;
    };
    let (outputs, aggregate) = match alias.input.as_ref() {
        LogicalPlan::Projection(p) => match p.input.as_ref() {
            LogicalPlan::Aggregate(a) => (p.expr.clone(), a),
            _ => return None,
        },
        LogicalPlan::Aggregate(a) => (
            a.schema
                .iter()
                .map(|field| Expr::Column(Column::from(field)))
                .collect(),
            a,
        ),
        _ => return None,
    };
    Some(Subquery {
        alias: &alias.alias,
        schema: &alias.schema,
        outputs,
        aggregate,
    })
}

/// `join` with its aggregate subquery computed as a window (see the module documentation),
/// or `None` when it is not one that may be.
fn as_window(join: &Join) -> Result<Option<LogicalPlan>> {
    if join.null_equality != NullEquality::NullEqualsNothing || join.null_aware {
        return Ok(None);
    }
    let (outer, sub, sub_right) = match (subquery(&join.right), subquery(&join.left)) {
        (Some(sub), _) if matches!(join.join_type, JoinType::Inner | JoinType::Left) => {
            (join.left.as_ref(), sub, true)
        }
        (None, Some(sub)) if matches!(join.join_type, JoinType::Inner | JoinType::Right) => {
            (join.right.as_ref(), sub, false)
        }
        _ => return Ok(None),
    };
    let agg = sub.aggregate;
    let groups: Vec<&Column> = match agg.group_expr.iter().map(Expr::try_as_col).collect() {
        Some(groups) => groups,
        None => return Ok(None),
    };
    if agg.group_expr.len() + agg.aggr_expr.len() != agg.schema.fields().len()
        || !crate::prefilter::reads_the_same_twice(&agg.input)
    {
        return Ok(None);
    }
    let computed = if groups.is_empty() {
        total_over_groups(join, outer, agg)
    } else {
        over_keys(join, outer, &sub, sub_right, &groups)
    };
    let Some(Windows {
        windows,
        replacements,
        conditions,
    }) = computed
    else {
        return Ok(None);
    };
    // The subquery's columns over the outer rows and the window: as outputs (aliased to
    // their names) and as what replaces them in the join's conditions.
    let mut sub_columns = vec![];
    let mut sub_values: Vec<(Column, Expr)> = vec![];
    for ((qualifier, field), out) in sub.schema.iter().zip(&sub.outputs) {
        let value = replace_columns(unalias(out).clone(), &replacements)?;
        sub_values.push((Column::from((qualifier, field)), value.clone()));
        sub_columns.push(value.alias_qualified(qualifier.cloned(), field.name()));
    }
    let to_outer = |e: &Expr| replace_columns(e.clone(), &sub_values);
    let mut predicates = vec![];
    for (o, s) in &conditions {
        predicates.push(o.clone().eq(to_outer(s)?));
    }
    if let Some(f) = &join.filter {
        predicates.push(to_outer(f)?);
    }
    let mut plan = LogicalPlanBuilder::from(outer.clone()).window(windows)?;
    if let Some(f) = datafusion::logical_expr::utils::conjunction(predicates) {
        plan = plan.filter(f)?;
    }
    let outer_columns = outer
        .schema()
        .iter()
        .map(|field| Expr::Column(Column::from(field)));
    let columns: Vec<Expr> = if sub_right {
        outer_columns.chain(sub_columns).collect()
    } else {
        sub_columns.into_iter().chain(outer_columns).collect()
    };
    plan.project(columns)?.build().map(Some)
}

/// The windows that compute a subquery grouped by `groups` over the outer rows, when the
/// outer rows are its input joined to filtered rows by those keys (see the module
/// documentation).
fn over_keys(
    join: &Join,
    outer: &LogicalPlan,
    sub: &Subquery<'_>,
    sub_right: bool,
    groups: &[&Column],
) -> Option<Windows> {
    let agg = sub.aggregate;
    // The subquery's output expressions, over the aggregate's columns.
    let output = |col: &Column| -> Option<&Expr> {
        if col.relation.as_ref() != Some(sub.alias) {
            return None;
        }
        let index = sub.schema.index_of_column(col).ok()?;
        Some(unalias(&sub.outputs[index]))
    };
    // Each grouping key's column of the outer rows, and the other conditions of the join.
    let mut keys: Vec<Option<Column>> = vec![None; groups.len()];
    let mut conditions: Vec<(Expr, Expr)> = vec![];
    for (l, r) in &join.on {
        let (o, s) = if sub_right { (l, r) } else { (r, l) };
        let group = Expr::try_as_col(s)
            .and_then(output)
            .and_then(Expr::try_as_col)
            .and_then(|c| groups.iter().position(|g| *g == c));
        match (group, Expr::try_as_col(o)) {
            (Some(i), Some(c)) if keys[i].is_none() => keys[i] = Some(c.clone()),
            _ => conditions.push((o.clone(), s.clone())),
        }
    }
    let keys = keys.into_iter().collect::<Option<Vec<Column>>>()?;
    if !matches!(join.join_type, JoinType::Inner)
        && (!conditions.is_empty() || join.filter.is_some())
    {
        return None;
    }
    // The outer rows: the aggregate's input joined to other rows by its grouping keys.
    if let Err(reason) = outer_is_input_joined_by(outer, &agg.input, groups, &keys) {
        tracing::debug!(reason, "aggregate subquery not computed as a window");
        return None;
    }
    // The window functions, and what the aggregate's columns become over the outer rows.
    let mut windows = vec![];
    let mut replacements: Vec<(Column, Expr)> = groups
        .iter()
        .zip(agg.schema.iter())
        .zip(&keys)
        .map(|((_, field), key)| (Column::from(field), Expr::Column(key.clone())))
        .collect();
    for (i, (expr, field)) in agg
        .aggr_expr
        .iter()
        .zip(agg.schema.iter().skip(groups.len()))
        .enumerate()
    {
        let Expr::AggregateFunction(AggregateFunction { func, params }) = unalias(expr) else {
            return None;
        };
        // An average of floating-point values depends on how many additions make it: only
        // exact (integer, decimal) averages are the same with every row repeated.
        let repeatable = match func.name() {
            "min" | "max" => true,
            "avg" => params
                .args
                .iter()
                .all(|a| a.get_type(outer.schema()).is_ok_and(|t| exact_sum(&t))),
            _ => false,
        };
        if !repeatable
            || params.distinct
            || params.filter.is_some()
            || !params.order_by.is_empty()
            || params.null_treatment.is_some()
            || params
                .args
                .iter()
                .any(|a| a.is_volatile() || !columns_in(a, outer.schema()))
        {
            return None;
        }
        let name = format!("{WINDOW}_{i}");
        windows.push(
            Expr::WindowFunction(Box::new(WindowFunction {
                fun: WindowFunctionDefinition::AggregateUDF(Arc::clone(func)),
                params: WindowFunctionParams {
                    args: params.args.clone(),
                    partition_by: keys.iter().cloned().map(Expr::Column).collect(),
                    order_by: vec![],
                    window_frame: WindowFrame::new(None),
                    filter: None,
                    null_treatment: None,
                    distinct: false,
                },
            }))
            .alias(&name),
        );
        replacements.push((Column::from(field), Expr::Column(Column::from_name(name))));
    }
    Some(Windows {
        windows,
        replacements,
        conditions,
    })
}

/// The windows over the rows of the outer side, and what the subquery's aggregate columns
/// become over them; `conditions` are the join's equalities left to check.
struct Windows {
    windows: Vec<Expr>,
    replacements: Vec<(Column, Expr)>,
    conditions: Vec<(Expr, Expr)>,
}

/// An ungrouped subquery over the same rows as the outer aggregate (TPC-H Q11's total
/// `sum(ps_supplycost * ps_availqty)` of the German suppliers, next to the same sum per
/// part): its aggregates are the outer aggregate's, summed (or their least or greatest) over
/// all groups, as windows `OVER ()`. The subquery's single row joins every group; when there
/// is no group there is no row either way.
fn total_over_groups(join: &Join, outer: &LogicalPlan, agg: &Aggregate) -> Option<Windows> {
    let LogicalPlan::Aggregate(groups) = outer else {
        return None;
    };
    // Grouping sets add subtotal rows: summing over all rows would count them again.
    if groups
        .group_expr
        .iter()
        .any(|e| matches!(e, Expr::GroupingSet(_)))
    {
        return None;
    }
    if !same_rows(&groups.input, &agg.input) {
        tracing::debug!("total subquery not computed as a window: it reads other rows");
        return None;
    }
    let conditions: Vec<(Expr, Expr)> = join.on.clone();
    if join.join_type != JoinType::Inner && (!conditions.is_empty() || join.filter.is_some()) {
        return None;
    }
    let mut windows = vec![];
    let mut replacements = vec![];
    let per_group = groups.schema.iter().skip(groups.group_expr.len());
    let per_group: Vec<_> = groups.aggr_expr.iter().zip(per_group).collect();
    for (i, (expr, (qualifier, field))) in agg.aggr_expr.iter().zip(agg.schema.iter()).enumerate() {
        let expr = unalias(expr);
        let Expr::AggregateFunction(AggregateFunction { func, params }) = expr else {
            return None;
        };
        if params.distinct || params.filter.is_some() || !params.order_by.is_empty() {
            return None;
        }
        let combine = match func.name() {
            "sum" | "count" => datafusion::functions_aggregate::sum::sum_udaf(),
            "min" | "max" => Arc::clone(func),
            _ => return None,
        };
        let (_, (group_qualifier, group_field)) =
            per_group.iter().find(|(e, _)| unalias(e) == expr)?;
        // Floating-point sums of the groups' sums add in another order.
        if func.name() == "sum" && !exact_sum(group_field.data_type()) {
            return None;
        }
        let name = format!("{WINDOW}_{i}");
        windows.push(
            Expr::WindowFunction(Box::new(WindowFunction::new(
                combine,
                vec![Expr::Column(Column::from((*group_qualifier, *group_field)))],
            )))
            .alias(&name),
        );
        let total = Expr::Column(Column::from_name(name));
        replacements.push((
            Column::from((qualifier, field.as_ref())),
            datafusion::logical_expr::cast(total, field.data_type().clone()),
        ));
    }
    Some(Windows {
        windows,
        replacements,
        conditions,
    })
}

/// Whether sums of values of type `t` are the same in any order (integers, decimals).
fn exact_sum(t: &DataType) -> bool {
    t.is_integer() || matches!(t, DataType::Decimal128(..) | DataType::Decimal256(..))
}

/// The sides of `e` when it is `a = b`; `None` for any other condition.
fn equal_sides(e: &Expr) -> Option<(&Expr, &Expr)> {
    match e {
        Expr::BinaryExpr(b) if b.op == Operator::Eq => Some((&b.left, &b.right)),
        _ => None,
    }
}

fn columns_in(e: &Expr, schema: &DFSchemaRef) -> bool {
    e.column_refs().iter().all(|c| schema.has_column(c))
}

fn replace_columns(e: Expr, pairs: &[(Column, Expr)]) -> Result<Expr> {
    e.transform(|e| {
        if let Expr::Column(c) = &e
            && let Some((_, value)) = pairs.iter().find(|(from, _)| from == c)
        {
            return Ok(Transformed::yes(value.clone()));
        }
        Ok(Transformed::no(e))
    })
    .map(|t| t.data)
}

/// A tree of inner equi joins (through projections of columns) flattened: its leaves and its
/// equal columns. `None` when a join has another condition.
#[derive(Default)]
struct JoinGraph<'a> {
    leaves: Vec<&'a LogicalPlan>,
    equal: Vec<(Column, Column)>,
}

impl<'a> JoinGraph<'a> {
    fn of(plan: &'a LogicalPlan) -> Option<Self> {
        let mut graph = Self::default();
        graph.add(plan).then_some(graph)
    }

    fn add(&mut self, plan: &'a LogicalPlan) -> bool {
        match plan {
            LogicalPlan::Projection(p) if p.expr.iter().all(|e| Expr::try_as_col(e).is_some()) => {
                self.add(&p.input)
            }
            LogicalPlan::Join(j)
                if j.join_type == JoinType::Inner
                    && j.null_equality == NullEquality::NullEqualsNothing
                    && !j.null_aware =>
            {
                // Equalities may still be in the filter (DataFusion moves them to `on` in a
                // later pass).
                let in_filter = j.filter.iter().flat_map(split_conjunction);
                for pair in
                    j.on.iter()
                        .map(|(l, r)| Some((l, r)))
                        .chain(in_filter.map(equal_sides))
                {
                    // Any other condition filters rows the graph does not describe.
                    let Some((Some(l), Some(r))) =
                        pair.map(|(l, r)| (Expr::try_as_col(l), Expr::try_as_col(r)))
                    else {
                        return false;
                    };
                    self.equal.push((l.clone(), r.clone()));
                }
                self.add(&j.left) && self.add(&j.right)
            }
            leaf => {
                self.leaves.push(leaf);
                true
            }
        }
    }
}

/// Whether `outer` is `input`'s leaves, joined by exactly `input`'s equalities, joined to
/// other leaves — at least one of them filtered — only by `input`'s grouping keys `groups`,
/// and whether each row of `outer` has `keys[i]` equal to `groups[i]`; if not, why.
fn outer_is_input_joined_by(
    outer: &LogicalPlan,
    input: &LogicalPlan,
    groups: &[&Column],
    keys: &[Column],
) -> std::result::Result<(), &'static str> {
    let (Some(o), Some(i)) = (JoinGraph::of(outer), JoinGraph::of(input)) else {
        return Err("a join with other conditions than equal columns");
    };
    // Each of the input's leaves is one of the outer leaves.
    let mut matched = vec![false; o.leaves.len()];
    for leaf in &i.leaves {
        let Some(at) = (0..o.leaves.len()).find(|&k| !matched[k] && same_rows(leaf, o.leaves[k]))
        else {
            return Err("the subquery reads other rows than the query");
        };
        matched[at] = true;
    }
    let rest: Vec<&LogicalPlan> = (0..o.leaves.len())
        .filter(|&k| !matched[k])
        .map(|k| o.leaves[k])
        .collect();
    if rest.is_empty() || !rest.iter().any(|leaf| filters(leaf)) {
        return Err("nothing else the query joins filters its rows");
    }
    let in_input =
        |c: &Column| (0..o.leaves.len()).any(|k| matched[k] && o.leaves[k].schema().has_column(c));
    let pair = |a: &Column, b: &Column| {
        if a.flat_name() <= b.flat_name() {
            (a.flat_name(), b.flat_name())
        } else {
            (b.flat_name(), a.flat_name())
        }
    };
    let input_equal: HashSet<(String, String)> = i.equal.iter().map(|(a, b)| pair(a, b)).collect();
    let mut outer_equal = HashSet::new();
    for (a, b) in &o.equal {
        match (in_input(a), in_input(b)) {
            (true, true) => {
                outer_equal.insert(pair(a, b));
            }
            // Joined to the other leaves by a grouping key only.
            (true, false) if groups.contains(&a) => {}
            (false, true) if groups.contains(&b) => {}
            (false, false) => {}
            _ => return Err("the query joins the subquery's rows by another column than its key"),
        }
    }
    if outer_equal != input_equal {
        return Err("the query joins the subquery's tables by other columns");
    }
    // Each key of the outer rows is its grouping key, or joined to it.
    // (A key that is the grouping column itself must still meet an equality, which keeps its
    // NULLs out as the subquery's join did.)
    let keyed = groups.iter().zip(keys).all(|(g, k)| {
        (*g == k && o.equal.iter().any(|(a, b)| a == *g || b == *g))
            || o.equal
                .iter()
                .any(|(a, b)| (a == *g && b == k) || (a == k && b == *g))
    });
    if keyed {
        Ok(())
    } else {
        Err("the query's correlated column is not joined to the subquery's key")
    }
}

/// Whether `plan` filters rows somewhere.
fn filters(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        found |= match node {
            LogicalPlan::Filter(_) => true,
            LogicalPlan::TableScan(scan) => scan.filters.iter().any(|f| !always_true(f)),
            LogicalPlan::Join(j) => matches!(
                j.join_type,
                JoinType::LeftSemi | JoinType::RightSemi | JoinType::LeftAnti | JoinType::RightAnti
            ),
            _ => false,
        };
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found
}

/// Whether `a` and `b` yield the same rows, apart from which columns they keep: the same
/// plan once projections of columns (and the columns a scan reads) are set aside.
fn same_rows(a: &LogicalPlan, b: &LogicalPlan) -> bool {
    let (a, b) = (past_column_projections(a), past_column_projections(b));
    match (a, b) {
        (LogicalPlan::TableScan(x), LogicalPlan::TableScan(y)) => {
            // A comma join's `WHERE` may leave a `true` on one scan and not the other.
            let filters = |scan: &TableScan| -> Vec<Expr> {
                scan.filters
                    .iter()
                    .filter(|f| !always_true(f))
                    .cloned()
                    .collect()
            };
            x.table_name == y.table_name
                && Arc::ptr_eq(&x.source, &y.source)
                && filters(x) == filters(y)
                && x.fetch.is_none()
                && y.fetch.is_none()
        }
        (LogicalPlan::Filter(x), LogicalPlan::Filter(y)) => {
            x.predicate == y.predicate && same_rows(&x.input, &y.input)
        }
        (LogicalPlan::SubqueryAlias(x), LogicalPlan::SubqueryAlias(y)) => {
            x.alias == y.alias && same_rows(&x.input, &y.input)
        }
        (LogicalPlan::Projection(x), LogicalPlan::Projection(y)) => {
            x.expr == y.expr && same_rows(&x.input, &y.input)
        }
        (LogicalPlan::Join(x), LogicalPlan::Join(y)) => {
            x.join_type == y.join_type
                && x.on == y.on
                && x.filter == y.filter
                && x.null_equality == y.null_equality
                && x.null_aware == y.null_aware
                && same_rows(&x.left, &y.left)
                && same_rows(&x.right, &y.right)
        }
        (a, b) => a == b,
    }
}

fn past_column_projections(plan: &LogicalPlan) -> &LogicalPlan {
    match plan {
        LogicalPlan::Projection(p) if p.expr.iter().all(|e| Expr::try_as_col(e).is_some()) => {
            past_column_projections(&p.input)
        }
        plan => plan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    async fn context(with_rule: bool) -> SessionContext {
        let rule = with_rule.then(|| Arc::new(AggregateSubqueryAsWindow) as _);
        let tables = [
            // Line items: part key, quantity, price. NULL keys and quantities.
            "CREATE TABLE li (pk INT, q DECIMAL(10, 2), price DOUBLE) AS VALUES \
             (1, 1.0, 10.0), (1, 5.0, 11.0), (1, 9.0, 12.0), (2, 2.0, 20.0), (2, 4.0, 21.0), \
             (3, NULL, 30.0), (3, 1.0, 31.0), (NULL, 1.0, 40.0), (4, 7.0, 50.0), (5, 3.0, 60.0)",
            // Parts: key 1 twice (a duplicate key), a NULL key.
            "CREATE TABLE p (pk INT, brand VARCHAR, size INT) AS VALUES \
             (1, 'a', 10), (1, 'a', 11), (2, 'a', 12), (3, 'a', 13), (NULL, 'a', 14), \
             (4, 'b', 15), (5, 'a', 16)",
            // Q2's shape: part suppliers, suppliers, nations.
            "CREATE TABLE ps (pk INT, sk INT, cost DECIMAL(10, 2)) AS VALUES \
             (1, 10, 5.0), (1, 11, 3.0), (1, 12, 3.0), (2, 10, 8.0), (2, 12, 1.0), \
             (3, 11, NULL), (3, 10, 2.0), (5, 12, 4.0), (NULL, 10, 0.5)",
            "CREATE TABLE s (sk INT, nk INT, name VARCHAR) AS VALUES \
             (10, 100, 's10'), (11, 101, 's11'), (12, 100, 's12'), (13, NULL, 's13')",
            "CREATE TABLE n (nk INT, region VARCHAR) AS VALUES (100, 'EU'), (101, 'ASIA')",
        ];
        crate::testing::context(rule, &tables).await
    }

    use crate::testing::plan_and_rows as run;

    #[tokio::test]
    async fn aggregate_subqueries_over_the_joined_rows_become_windows() {
        let (with, without) = (context(true).await, context(false).await);
        let cases: &[(&str, bool)] = &[
            // TPC-H Q17's shape, with a part key twice among the parts and NULL keys.
            (
                "SELECT sum(price) FROM li, p WHERE p.pk = li.pk AND p.brand = 'a' \
                 AND q < (SELECT 0.8 * avg(q) FROM li WHERE li.pk = p.pk)",
                true,
            ),
            // The rows themselves, and min and max.
            (
                "SELECT p.size, li.q, li.price FROM li, p WHERE p.pk = li.pk AND p.size < 16 \
                 AND q > (SELECT min(q) FROM li WHERE li.pk = p.pk) \
                 AND q <= (SELECT max(q) FROM li WHERE li.pk = p.pk)",
                true,
            ),
            // Correlated on the aggregated table's own key.
            (
                "SELECT li.pk, li.q FROM li JOIN p ON li.pk = p.pk WHERE p.brand = 'a' \
                 AND q = (SELECT max(q) FROM li WHERE li.pk = p.pk)",
                true,
            ),
            // TPC-H Q2's shape: the lowest cost among the suppliers of one region, over a
            // join of three tables that the query joins too.
            (
                "SELECT p.pk, s.name, ps.cost FROM p, ps, s, n \
                 WHERE p.pk = ps.pk AND ps.sk = s.sk AND s.nk = n.nk AND n.region = 'EU' \
                 AND p.size > 10 AND ps.cost = (SELECT min(ps.cost) FROM ps, s, n \
                 WHERE p.pk = ps.pk AND ps.sk = s.sk AND s.nk = n.nk AND n.region = 'EU')",
                true,
            ),
            // In the select list: a left join.
            (
                "SELECT p.size, li.q, (SELECT max(q) FROM li WHERE li.pk = p.pk) AS m \
                 FROM li JOIN p ON li.pk = p.pk WHERE p.brand = 'a'",
                true,
            ),
            // Of a column the query does not read: left alone.
            (
                "SELECT p.size, li.q, (SELECT max(price) FROM li WHERE li.pk = p.pk) AS m \
                 FROM li JOIN p ON li.pk = p.pk WHERE p.brand = 'a'",
                false,
            ),
            // A sum changes when the part key repeats: left alone.
            (
                "SELECT sum(price) FROM li, p WHERE p.pk = li.pk AND p.brand = 'a' \
                 AND q < (SELECT 0.2 * sum(q) FROM li WHERE li.pk = p.pk)",
                false,
            ),
            // The subquery reads other rows than the query (another filter): left alone.
            (
                "SELECT sum(price) FROM li, p WHERE p.pk = li.pk AND p.brand = 'a' \
                 AND q < (SELECT avg(q) FROM li WHERE li.pk = p.pk AND li.price > 11)",
                false,
            ),
            // The query keeps fewer of the subquery's rows: left alone.
            (
                "SELECT sum(price) FROM li, p WHERE p.pk = li.pk AND p.brand = 'a' \
                 AND li.price > 11 AND q < (SELECT avg(q) FROM li WHERE li.pk = p.pk)",
                false,
            ),
            // Joined to the parts by another column than the key: left alone.
            (
                "SELECT sum(price) FROM li, p WHERE p.pk = li.pk AND p.size = li.pk + 9 \
                 AND q < (SELECT avg(q) FROM li WHERE li.pk = p.pk)",
                false,
            ),
            // Q2's shape where the query joins one region and the subquery all: left alone.
            (
                "SELECT p.pk, s.name FROM p, ps, s, n \
                 WHERE p.pk = ps.pk AND ps.sk = s.sk AND s.nk = n.nk AND n.region = 'EU' \
                 AND p.size > 10 AND ps.cost = (SELECT min(ps.cost) FROM ps, s, n \
                 WHERE p.pk = ps.pk AND ps.sk = s.sk AND s.nk = n.nk)",
                false,
            ),
            // TPC-H Q11's shape: groups above a share of the total over the same rows.
            (
                "SELECT ps.pk, sum(ps.cost * 2) AS v FROM ps, s, n \
                 WHERE ps.sk = s.sk AND s.nk = n.nk AND n.region = 'EU' GROUP BY ps.pk \
                 HAVING sum(ps.cost * 2) > (SELECT sum(ps.cost * 2) * 0.2 FROM ps, s, n \
                 WHERE ps.sk = s.sk AND s.nk = n.nk AND n.region = 'EU')",
                true,
            ),
            // Counts add up; the least of the least.
            (
                "SELECT ps.sk, count(*) AS c FROM ps GROUP BY ps.sk \
                 HAVING count(*) * 3 > (SELECT count(*) FROM ps)",
                true,
            ),
            (
                "SELECT ps.sk, min(ps.cost) FROM ps GROUP BY ps.sk \
                 HAVING min(ps.cost) >= (SELECT min(ps.cost) AS m FROM ps WHERE ps.pk > 1)",
                false,
            ),
            (
                "SELECT ps.sk, min(ps.cost) FROM ps GROUP BY ps.sk \
                 HAVING min(ps.cost) > (SELECT min(ps.cost) AS m FROM ps)",
                true,
            ),
            // The total of other rows (every region): left alone.
            (
                "SELECT ps.pk, sum(ps.cost * 2) AS v FROM ps, s, n \
                 WHERE ps.sk = s.sk AND s.nk = n.nk AND n.region = 'EU' GROUP BY ps.pk \
                 HAVING sum(ps.cost * 2) > (SELECT sum(ps.cost * 2) * 0.2 FROM ps, s, n \
                 WHERE ps.sk = s.sk AND s.nk = n.nk)",
                false,
            ),
            // Floating-point averages and sums depend on the additions made: left alone.
            (
                "SELECT p.size, li.price FROM li, p WHERE p.pk = li.pk AND p.brand = 'a' \
                 AND li.price >= (SELECT avg(price) FROM li WHERE li.pk = p.pk)",
                false,
            ),
            (
                "SELECT li.pk, sum(price) AS s FROM li GROUP BY li.pk \
                 HAVING sum(price) * 6 > (SELECT sum(price) AS t FROM li)",
                false,
            ),
            // Subtotals of a rollup would count rows twice: left alone.
            (
                "SELECT ps.sk, ps.pk, sum(ps.cost) AS v FROM ps GROUP BY ROLLUP (ps.sk, ps.pk) \
                 HAVING sum(ps.cost) * 4 > (SELECT sum(ps.cost) AS t FROM ps)",
                false,
            ),
            // An average of averages is not the average: left alone.
            (
                "SELECT ps.sk, avg(ps.cost) FROM ps GROUP BY ps.sk \
                 HAVING avg(ps.cost) > (SELECT avg(ps.cost) AS a FROM ps)",
                false,
            ),
            // Nothing filters the other side: left alone (no fewer rows to aggregate).
            (
                "SELECT sum(price) FROM li, p WHERE p.pk = li.pk \
                 AND q < (SELECT avg(q) FROM li WHERE li.pk = p.pk)",
                false,
            ),
        ];
        for (sql, rewritten) in cases {
            let (plan, rows) = run(&with, sql).await;
            let (_, expected) = run(&without, sql).await;
            assert!(!expected.is_empty(), "{sql}");
            assert_eq!(rows, expected, "{sql}\n{plan}");
            assert_eq!(plan.contains(WINDOW), *rewritten, "{sql}\n{plan}");
        }
    }
}
