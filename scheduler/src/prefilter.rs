//! Groups pre-filtered by the keys they will be joined with.
//!
//! A decorrelated subquery joins a query's rows with an aggregate over a whole table, grouped
//! by the join key (TPC-H Q17: the parts of one brand and container joined with
//! `avg(l_quantity)` of *every* part's lineitems; Q2 and Q20 alike). DataFusion computes every
//! group and lets the join throw almost all of them away. DuckDB computes only the groups whose
//! key occurs on the other side (its "delim join").
//!
//! [`PrefilterGroups`] does the same with plain logical operators, so that it works on a
//! cluster as well as in one process. For a join whose one side is an aggregate grouped by the
//! join key, it looks on the other side for the input that constrains that key: a filtered
//! scan, found through projections, filters and the equal keys of inner and semi joins. The
//! aggregate's input then keeps only rows whose key that scan yields, by a semi join placed as
//! low as it may go (above the scan and filters that produce the key):
//!
//! ```text
//!  before:  Join(k = g)                    after:  Join(k = g)
//!             ├─ … Filter(part) …                    ├─ … Filter(part) …
//!             └─ Aggregate(by g)                     └─ Aggregate(by g)
//!                  └─ lineitem                            └─ RightSemi(k' = g)
//!                                                              ├─ Filter(part) as k'
//!                                                              └─ lineitem
//! ```
//!
//! The semi join reads the filtered scan a second time; that is the price. It is paid only
//! when the key's source is one filtered scan of another table than the one aggregated.
//!
//! Why the result is the same: rows of a group whose key is not among the source's keys can
//! only form groups that the join drops (an inner or semi join, or the non-preserved side of
//! an outer join, with keys that never equal NULL), and each kept group keeps all of its rows.
//! The source's keys are a superset of the other side's, since the path from that side down to
//! the source only filters rows (filters, inner and semi joins) or renames columns.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, JoinType, NullEquality, Result, ScalarValue};
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::{
    Expr, Join, LogicalPlan, LogicalPlanBuilder, Projection, SubqueryAlias, TableScan,
};

/// `impl OptimizerRule` for the unit struct `$rule`, named `$name`, that rewrites each join
/// bottom up with `$rewrite: fn(&Join) -> Result<Option<LogicalPlan>>` (`None`: unchanged).
macro_rules! join_rule {
    ($rule:ty, $name:literal, $rewrite:path) => {
        impl datafusion::optimizer::OptimizerRule for $rule {
            fn name(&self) -> &str {
                $name
            }

            fn apply_order(&self) -> Option<datafusion::optimizer::ApplyOrder> {
                Some(datafusion::optimizer::ApplyOrder::BottomUp)
            }

            fn supports_rewrite(&self) -> bool {
                true
            }

            fn rewrite(
                &self,
                plan: datafusion::logical_expr::LogicalPlan,
                _config: &dyn datafusion::optimizer::OptimizerConfig,
            ) -> datafusion::common::Result<
                datafusion::common::tree_node::Transformed<datafusion::logical_expr::LogicalPlan>,
            > {
                $crate::prefilter::on_join(plan, $rewrite)
            }
        }
    };
}
pub(crate) use join_rule;

/// The alias of the key sources this rule adds; a plan that has one is not rewritten again.
const KEYS: &str = "__basin_join_keys";

/// See the module documentation.
#[derive(Debug, Default)]
pub struct PrefilterGroups;

join_rule!(PrefilterGroups, "basin_prefilter_groups", prefilter);

/// `rewrite` applied to `plan` when it is a join.
pub(crate) fn on_join(
    plan: LogicalPlan,
    rewrite: fn(&Join) -> Result<Option<LogicalPlan>>,
) -> Result<Transformed<LogicalPlan>> {
    let LogicalPlan::Join(join) = &plan else {
        return Ok(Transformed::no(plan));
    };
    Ok(match rewrite(join)? {
        Some(rewritten) => Transformed::yes(rewritten),
        None => Transformed::no(plan),
    })
}

#[derive(Clone, Copy)]
enum Side {
    Left,
    Right,
}

/// The sides of `join` whose rows without a partner on the other side never reach the
/// output (none for a join that compares NULLs as equal or is null-aware).
fn partnered_sides(join: &Join) -> &'static [Side] {
    if join.null_equality != NullEquality::NullEqualsNothing || join.null_aware {
        return &[];
    }
    match join.join_type {
        JoinType::Inner => &[Side::Right, Side::Left],
        JoinType::Left | JoinType::LeftSemi => &[Side::Right],
        JoinType::Right | JoinType::RightSemi => &[Side::Left],
        _ => &[],
    }
}

/// Whether `join` passes each row of one side (the left one when `on_left`) at most as
/// itself, so that rows of that side may be cut below it: not when they are the side that
/// NULL-padded rows come from for the other one.
fn passes_rows_as_themselves(join: &Join, on_left: bool) -> bool {
    match join.join_type {
        JoinType::Inner => true,
        JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti => on_left,
        JoinType::Right | JoinType::RightSemi | JoinType::RightAnti => !on_left,
        _ => false,
    }
}

/// The join with one side's aggregate pre-filtered, or `None` when no side qualifies.
fn prefilter(join: &Join) -> Result<Option<LogicalPlan>> {
    for &side in partnered_sides(join) {
        let (grouped, other) = match side {
            Side::Left => (&join.left, &join.right),
            Side::Right => (&join.right, &join.left),
        };
        if has_key_source(grouped) {
            continue; // rewritten before
        }
        for (l, r) in &join.on {
            let (Expr::Column(l), Expr::Column(r)) = (l, r) else {
                continue;
            };
            let (group_key, other_key) = match side {
                Side::Left => (l, r),
                Side::Right => (r, l),
            };
            let Some(source) = key_source(other, other_key).filter(repeatable) else {
                continue;
            };
            let Some(rewritten) = reduce_groups(grouped, group_key, &source)? else {
                continue;
            };
            let (left, right) = match side {
                Side::Left => (rewritten, join.right.as_ref().clone()),
                Side::Right => (join.left.as_ref().clone(), rewritten),
            };
            let plan = LogicalPlan::Join(join.clone());
            tracing::debug!(key = %group_key, source = %source.table, "groups pre-filtered by join key");
            return plan
                .with_new_exprs(plan.expressions(), vec![left, right])
                .map(Some);
        }
    }
    Ok(None)
}

/// `plan` without the semi joins this rule added, for a plan that runs as a Ballista job.
/// There a semi join is planned as a partitioned hash join (Ballista keeps build sides from
/// being broadcast), which shuffles the aggregate's whole input instead of its partial
/// groups: TPC-H SF1 Q17 as a job took 1.57 s with it, 1.14 s without. The semi join only
/// drops rows the join above drops anyway, so taking it out keeps the result.
pub fn without_prefilters(plan: &LogicalPlan) -> Result<LogicalPlan> {
    plan.clone()
        .transform_up(|node| {
            Ok(match node {
                LogicalPlan::Join(join)
                    if join.join_type == JoinType::RightSemi && is_keys(&join.left) =>
                {
                    Transformed::yes(Arc::unwrap_or_clone(join.right))
                }
                other => Transformed::no(other),
            })
        })
        .map(|t| t.data)
}

/// Whether `plan` is a key source this rule added (maybe under projections).
fn is_keys(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => is_keys(&p.input),
        other => is_keys_alias(other),
    }
}

fn is_keys_alias(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::SubqueryAlias(a) if a.alias.table() == KEYS)
}

fn has_key_source(plan: &LogicalPlan) -> bool {
    is_keys_alias(plan) || plan.inputs().into_iter().any(has_key_source)
}

/// A filtered scan whose column `key` holds every value of the other side's join key.
struct KeySource {
    plan: LogicalPlan,
    key: Column,
    /// The scanned table (a rule never pre-filters a table by itself).
    table: String,
}

/// Whether reading the source a second time yields the same rows: no volatile expression
/// (`random()`) and no row limit (a `LIMIT` without order may keep other rows).
fn repeatable(source: &KeySource) -> bool {
    reads_the_same_twice(&source.plan)
}

/// Whether `plan` yields the same rows when it is read a second time in the same query: no
/// volatile expression, no row limit, and no live database source (PostgreSQL, MySQL, SQL
/// Server, Oracle, MongoDB): two reads of one are two statements that can see different
/// rows — a `NOT IN` checked against one read and anti-joined with the other could answer
/// what neither state of the source holds.
pub(crate) fn reads_the_same_twice(plan: &LogicalPlan) -> bool {
    let mut repeatable = true;
    let _ = plan.apply(|node| {
        let limited = match node {
            LogicalPlan::TableScan(scan) => scan.fetch.is_some() || reads_a_live_source(scan),
            LogicalPlan::Limit(_) => true,
            _ => false,
        };
        if limited || node.expressions().iter().any(Expr::is_volatile) {
            repeatable = false;
            return Ok(datafusion::common::tree_node::TreeNodeRecursion::Stop);
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    repeatable
}

/// Whether `scan` reads a database queried in place (each read is a statement of its own,
/// with no snapshot shared between two reads).
fn reads_a_live_source(scan: &TableScan) -> bool {
    use basin_connectors::{mongodb, remote};
    let Ok(provider) = datafusion::datasource::source_as_provider(&scan.source) else {
        return false;
    };
    let any = provider.as_any();
    any.is::<remote::RemoteQueryTable>()
        || any.is::<remote::RemoteTable>()
        || any.is::<mongodb::MongoQueryTable>()
        || any.is::<mongodb::MongoTable>()
}

/// A chain of projections, filters and aliases over one table scan: its table's name and
/// whether anything in it filters rows.
fn scan_chain(plan: &LogicalPlan) -> Option<(String, bool)> {
    chain_scan(plan).map(|(scan, filtered)| (scan.table_name.to_string(), filtered))
}

/// [`scan_chain`] with the scan itself.
fn chain_scan(plan: &LogicalPlan) -> Option<(&TableScan, bool)> {
    match plan {
        LogicalPlan::TableScan(scan) => Some((
            scan,
            scan.filters.iter().any(|f| !always_true(f)) || scan.fetch.is_some(),
        )),
        LogicalPlan::Filter(f) => chain_scan(&f.input)
            .map(|(scan, filtered)| (scan, filtered || !always_true(&f.predicate))),
        LogicalPlan::Projection(p) => chain_scan(&p.input),
        LogicalPlan::SubqueryAlias(a) => chain_scan(&a.input),
        _ => None,
    }
}

/// A filter that keeps every row: what is left of `FROM a, b WHERE a.k = b.k` once the
/// join took its condition (`partial_filters=[Boolean(true)]`). Pre-filtering by such a
/// table's keys would cost a join and drop nothing.
pub(crate) fn always_true(predicate: &Expr) -> bool {
    matches!(
        predicate,
        Expr::Literal(ScalarValue::Boolean(Some(true)), _)
    )
}

/// The column of `plan`'s input that `plan`'s output column `col` passes on unchanged, for
/// nodes that rename or pass columns (projections, aliases, filters).
pub(crate) fn passed_from(plan: &LogicalPlan, col: &Column) -> Option<Column> {
    match plan {
        LogicalPlan::Projection(Projection { expr, schema, .. }) => {
            let i = schema.index_of_column(col).ok()?;
            match unalias(&expr[i]) {
                Expr::Column(c) => Some(c.clone()),
                _ => None,
            }
        }
        LogicalPlan::SubqueryAlias(SubqueryAlias { input, schema, .. }) => {
            let i = schema.index_of_column(col).ok()?;
            Some(Column::from(input.schema().qualified_field(i)))
        }
        LogicalPlan::Filter(_) => Some(col.clone()),
        _ => None,
    }
}

pub(crate) fn unalias(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => unalias(&a.expr),
        e => e,
    }
}

/// Where the values of `plan`'s column `col` come from: a filtered scan whose values of some
/// column are a superset of them.
fn key_source(plan: &LogicalPlan, col: &Column) -> Option<KeySource> {
    if let Some((table, filtered)) = scan_chain(plan) {
        return filtered.then(|| KeySource {
            plan: plan.clone(),
            key: col.clone(),
            table,
        });
    }
    match plan {
        LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::Filter(_) => {
            key_source(plan.inputs()[0], &passed_from(plan, col)?)
        }
        LogicalPlan::Join(join) if join.null_equality == NullEquality::NullEqualsNothing => {
            let on_left = join.left.schema().has_column(col);
            // The key's partner on the other side of an equal key, when that side only
            // keeps matching rows.
            let partner = join.on.iter().find_map(|(l, r)| match (l, r) {
                (Expr::Column(l), Expr::Column(r)) if on_left && l == col => Some((&join.right, r)),
                (Expr::Column(l), Expr::Column(r)) if !on_left && r == col => Some((&join.left, l)),
                _ => None,
            });
            let own = if on_left { &join.left } else { &join.right };
            let partner_filters = match join.join_type {
                JoinType::Inner => true,
                JoinType::LeftSemi => on_left,
                JoinType::RightSemi => !on_left,
                _ => false,
            };
            // Every join type passes on only values its own side has (or NULLs). The key's
            // own side first: it is where the key is defined (a dimension's primary key).
            key_source(own, col).or_else(|| {
                partner
                    .filter(|_| partner_filters)
                    .and_then(|(side, key)| key_source(side, key))
            })
        }
        _ => None,
    }
}

/// `plan` (a side of the join: aliases, projections and filters over an aggregate grouped by
/// `key`) with the aggregate's input cut down to rows whose key `source` yields.
fn reduce_groups(
    plan: &LogicalPlan,
    key: &Column,
    source: &KeySource,
) -> Result<Option<LogicalPlan>> {
    let input = match plan {
        LogicalPlan::Aggregate(agg) => {
            if agg
                .group_expr
                .iter()
                .any(|e| matches!(e, Expr::GroupingSet(_)))
            {
                return Ok(None);
            }
            let Ok(i) = agg.schema.index_of_column(key) else {
                return Ok(None);
            };
            let Some(Expr::Column(c)) = agg.group_expr.get(i).map(unalias) else {
                return Ok(None);
            };
            place_semi_join(&agg.input, c, source)?
        }
        LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::Filter(_) => {
            match passed_from(plan, key) {
                Some(inner) => reduce_groups(plan.inputs()[0], &inner, source)?,
                None => None,
            }
        }
        _ => None,
    };
    input
        .map(|input| plan.with_new_exprs(plan.expressions(), vec![input]))
        .transpose()
}

/// `plan` with only the rows whose `key` the source yields: a semi join placed above the scan
/// chain that produces `key` (below joins, so that they see fewer rows), or above `plan` when
/// `key` is computed.
fn place_semi_join(
    plan: &LogicalPlan,
    key: &Column,
    source: &KeySource,
) -> Result<Option<LogicalPlan>> {
    if let Some((table, _)) = scan_chain(plan) {
        if table == source.table {
            return Ok(None); // a table filtered by itself: nothing to gain
        }
        return semi_join(plan, key, source);
    }
    let below = match plan {
        LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::Filter(_) => {
            passed_from(plan, key).map(|inner| (0, inner))
        }
        LogicalPlan::Join(join) => {
            let on_left = join.left.schema().has_column(key);
            passes_rows_as_themselves(join, on_left)
                .then(|| (if on_left { 0 } else { 1 }, key.clone()))
        }
        _ => None,
    };
    let Some((i, inner)) = below else {
        return semi_join(plan, key, source);
    };
    let Some(reduced) = place_semi_join(plan.inputs()[i], &inner, source)? else {
        return Ok(None);
    };
    let mut inputs: Vec<LogicalPlan> = plan.inputs().into_iter().cloned().collect();
    inputs[i] = reduced;
    plan.with_new_exprs(plan.expressions(), inputs).map(Some)
}

/// `source`'s keys RIGHT SEMI JOIN `plan`: the keys are the build side, `plan` is probed and
/// keeps its schema.
fn semi_join(plan: &LogicalPlan, key: &Column, source: &KeySource) -> Result<Option<LogicalPlan>> {
    let (Ok((_, probe)), Ok((_, build))) = (
        plan.schema().qualified_field_from_column(key),
        source
            .plan
            .schema()
            .qualified_field_from_column(&source.key),
    ) else {
        return Ok(None);
    };
    if probe.data_type() != build.data_type() {
        return Ok(None);
    }
    let keys = LogicalPlanBuilder::from(source.plan.clone())
        .project(vec![Expr::Column(source.key.clone()).alias("key")])?
        .alias(KEYS)?
        .build()?;
    LogicalPlanBuilder::from(keys)
        .join(
            plan.clone(),
            JoinType::RightSemi,
            (vec![Column::new(Some(KEYS), "key")], vec![key.clone()]),
            None,
        )?
        .build()
        .map(Some)
}

/// A table's rows must be at least this many times a key source's for [`PrefilterScans`] to
/// pre-filter it: the semi join costs a second read of the source and a probe per row.
const SCAN_TO_SOURCE_ROWS: usize = 8;

/// Scans pre-filtered by the keys of a small filtered table they are joined with further up.
///
/// DataFusion joins tables in the order of the `FROM` clause. In TPC-H Q7 the nations that
/// select suppliers and customers are joined last: every lineitem of every supplier goes
/// through the joins with orders and customers first, and the last join drops most of them
/// (Q7 keeps two nations of 25; Q21 one). DuckDB's join order puts the selective dimension
/// first. This rule gets the same early cut with plain logical operators: for a join
/// `a = b` whose `b` side's keys come from a small filtered source (a filtered scan, or a
/// tree of scans, filters, inner and semi joins such as `nation ⋈ σ region`), the scan that
/// produces `a` deep in the other side keeps only rows whose key the source yields, by a
/// semi join placed right above that scan (as [`PrefilterGroups`] does for an aggregate's
/// input):
///
/// ```text
///  before:  Join(s_nationkey = n_nationkey)          after:  Join(s_nationkey = n_nationkey)
///             ├─ Join(s_suppkey = l_suppkey)                   ├─ Join(s_suppkey = l_suppkey)
///             │    ├─ supplier                                 │    ├─ RightSemi(k = s_nationkey)
///             │    └─ lineitem                                 │    │    ├─ σ nation as k
///             └─ σ nation                                      │    │    └─ supplier
///                                                              │    └─ lineitem
///                                                              └─ σ nation
/// ```
///
/// It applies only when the scan is of another table than the source's, has at least
/// [`SCAN_TO_SOURCE_ROWS`] times the rows of the source's largest table, and meets a table
/// with that many times its own rows in a join of its side below the cutting join (so never
/// right next to it, where the join itself is the cut), as the tables' statistics say (a
/// table without statistics is never pre-filtered nor used as a source). The cut is then a
/// probe per row of a small table that spares the joins above it the rows it drops; a large
/// table is left to its joins (TPC-H Q20's partsupp cut by suppliers cost more than it saved).
///
/// The cut follows the equal keys of the inner joins below the cutting one (TPC-H Q5's
/// `c_nationkey = s_nationkey`: the keys that cut the suppliers cut the customers too). And
/// when the scan that produces the key is too small for a cut of its own but is joined
/// further down with the rest of its side (Q5's region `ASIA`, joined above the 25 nations,
/// which are joined above the suppliers and line items), the scans across that join are cut
/// instead, by the keys of the dimension rows the source keeps ([`through_dimension`]).
/// Why the result is the same: see the module documentation; a scan row whose key the
/// source does not yield can only form rows the join drops.
#[derive(Debug, Default)]
pub struct PrefilterScans;

join_rule!(PrefilterScans, "basin_prefilter_scans", prefilter_scans);

/// The join with a scan of one side pre-filtered by the other side's keys, or `None`.
fn prefilter_scans(join: &Join) -> Result<Option<LogicalPlan>> {
    // Every key of the join may cut a scan (a join on a supplier's key and on its nation
    // may cut the line items by the one and the customers by the other).
    let (mut left, mut right) = (join.left.as_ref().clone(), join.right.as_ref().clone());
    let mut changed = false;
    for &side in partnered_sides(join) {
        for (l, r) in &join.on {
            let (Expr::Column(l), Expr::Column(r)) = (l, r) else {
                continue;
            };
            let (target, other, target_key, other_key) = match side {
                Side::Left => (&left, &right, l, r),
                Side::Right => (&right, &left, r, l),
            };
            let Some(source) = key_source(other, other_key)
                .or_else(|| small_tree_source(other, other_key))
                .filter(repeatable)
            else {
                continue;
            };
            let Some(source_rows) = max_scan_rows(&source.plan) else {
                continue;
            };
            let place = Placement {
                source: &source,
                source_rows,
                source_tables: scanned_tables(&source.plan),
            };
            let rewritten = match place.at_scan(target, target_key, 0)? {
                Some(rewritten) => Some(rewritten),
                None => through_dimension(target, target_key, &source)?,
            };
            let Some(rewritten) = rewritten else {
                continue;
            };
            tracing::debug!(key = %target_key, source = %source.table, "scan pre-filtered by join key");
            match side {
                Side::Left => left = rewritten,
                Side::Right => right = rewritten,
            }
            changed = true;
        }
    }
    if !changed {
        return Ok(None);
    }
    let plan = LogicalPlan::Join(join.clone());
    plan.with_new_exprs(plan.expressions(), vec![left, right])
        .map(Some)
}

/// `plan` itself as the source of its column `col`, when it is a tree of scans, filters,
/// projections, inner and semi joins that filters rows somewhere (`nation ⋈ σ region`, or a
/// table a semi join cut).
fn small_tree_source(plan: &LogicalPlan, col: &Column) -> Option<KeySource> {
    fn plain(plan: &LogicalPlan, filtered: &mut bool) -> bool {
        match plan {
            LogicalPlan::TableScan(scan) => {
                *filtered |= scan.filters.iter().any(|f| !always_true(f));
                true
            }
            LogicalPlan::Filter(f) => {
                *filtered |= !always_true(&f.predicate);
                plain(&f.input, filtered)
            }
            LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) => {
                plain(plan.inputs()[0], filtered)
            }
            LogicalPlan::Join(j) if j.null_equality == NullEquality::NullEqualsNothing => {
                match j.join_type {
                    JoinType::Inner => {}
                    JoinType::LeftSemi | JoinType::RightSemi => *filtered = true,
                    _ => return false,
                }
                plain(&j.left, filtered) && plain(&j.right, filtered)
            }
            _ => false,
        }
    }
    let mut filtered = false;
    (plain(plan, &mut filtered) && filtered).then(|| KeySource {
        plan: plan.clone(),
        key: col.clone(),
        table: scanned_tables(plan).join(" ⋈ "),
    })
}

/// The tables `plan` scans.
fn scanned_tables(plan: &LogicalPlan) -> Vec<String> {
    let mut tables = Vec::new();
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            tables.push(scan.table_name.to_string());
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    tables
}

/// The rows of the largest table `plan` scans, by the tables' statistics; `None` when a
/// table has none.
fn max_scan_rows(plan: &LogicalPlan) -> Option<usize> {
    let mut max = Some(0usize);
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            max = max.zip(scan_rows(scan)).map(|(a, b)| a.max(b));
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    max
}

fn scan_rows(scan: &TableScan) -> Option<usize> {
    let provider = source_as_provider(&scan.source).ok()?;
    provider.statistics()?.num_rows.get_value().copied()
}

/// Where [`PrefilterScans`] puts its semi join.
struct Placement<'a> {
    source: &'a KeySource,
    source_rows: usize,
    source_tables: Vec<String>,
}

impl Placement<'_> {
    /// `plan` with the scan chain that produces `key` pre-filtered, when it is worth it;
    /// `None` otherwise. `partner_rows`: the rows of the largest table the chain's rows meet
    /// in the joins above it (up to the join whose keys cut it).
    fn at_scan(
        &self,
        plan: &LogicalPlan,
        key: &Column,
        partner_rows: usize,
    ) -> Result<Option<LogicalPlan>> {
        if let Some((scan, _)) = chain_scan(plan) {
            // Larger than the source by far, and itself a small side of a join with a larger
            // table: the cut is then cheap (a probe per row of a small table) and spares the
            // joins above it the rows it drops. A fact table is cut by its joins anyway.
            let worth = scan_rows(scan).is_some_and(|rows| {
                rows >= self.source_rows.saturating_mul(SCAN_TO_SOURCE_ROWS)
                    && partner_rows >= rows.saturating_mul(SCAN_TO_SOURCE_ROWS)
            });
            if !worth || self.source_tables.contains(&scan.table_name.to_string()) {
                return Ok(None);
            }
            return semi_join(plan, key, self.source);
        }
        match step_toward(plan, key) {
            Step::Through(inner) => {
                let Some(reduced) = self.at_scan(plan.inputs()[0], &inner, partner_rows)? else {
                    return Ok(None);
                };
                with_input(plan, 0, reduced).map(Some)
            }
            Step::Join(join) => self.at_join(plan, join, key, partner_rows),
            Step::Stop => Ok(None),
        }
    }

    /// [`Placement::at_scan`] through a join (`plan`) below the cutting one: the scan that
    /// produces `key` on its side, and the scans that produce the columns an inner join
    /// equates with `key` on the other side. Those hold the same values in every row the
    /// join yields, so their rows without a key of the source are dropped above as well
    /// (TPC-H Q5's `c_nationkey = s_nationkey`: the nations' keys cut the suppliers and the
    /// customers).
    fn at_join(
        &self,
        plan: &LogicalPlan,
        join: &Join,
        key: &Column,
        partner_rows: usize,
    ) -> Result<Option<LogicalPlan>> {
        let on_left = join.left.schema().has_column(key);
        if !passes_rows_as_themselves(join, on_left) {
            return Ok(None);
        }
        let (own, other) = if on_left { (0, 1) } else { (1, 0) };
        let mut inputs: Vec<LogicalPlan> = plan.inputs().into_iter().cloned().collect();
        let rows: Vec<usize> = inputs
            .iter()
            .map(|side| max_scan_rows(side).unwrap_or(0))
            .collect();
        let mut changed = false;
        if let Some(reduced) = self.at_scan(&inputs[own], key, partner_rows.max(rows[other]))? {
            inputs[own] = reduced;
            changed = true;
        }
        if join.join_type == JoinType::Inner
            && join.null_equality == NullEquality::NullEqualsNothing
        {
            for equal in equal_keys(join, key, on_left) {
                let partner = partner_rows.max(rows[own]);
                if let Some(reduced) = self.at_scan(&inputs[other], &equal, partner)? {
                    inputs[other] = reduced;
                    changed = true;
                }
            }
        }
        if !changed {
            return Ok(None);
        }
        plan.with_new_exprs(plan.expressions(), inputs).map(Some)
    }
}

/// The columns of the other side of `join` that its keys equate with `key` (a column of
/// the left side when `on_left`).
fn equal_keys(join: &Join, key: &Column, on_left: bool) -> Vec<Column> {
    join.on
        .iter()
        .filter_map(|(l, r)| match (l, r) {
            (Expr::Column(l), Expr::Column(r)) if on_left && l == key => Some(r.clone()),
            (Expr::Column(l), Expr::Column(r)) if !on_left && r == key => Some(l.clone()),
            _ => None,
        })
        .collect()
}

/// `plan` (the side of a cutting join opposite `source`) cut through a dimension: when the
/// scan chain that produces `key` is too small to be worth a cut of its own but is joined,
/// further down, with the rest of `plan` (TPC-H Q5: the region `ASIA` joined last, above the
/// 25 nations, which are joined above the suppliers and their line items), the scans on the
/// other side of that join are cut instead, by the keys of the dimension's rows that the
/// source keeps: `nation ⋉ σ region` cuts the suppliers (and, through equal keys, the
/// customers). Why the result is the same: a row of the other side whose key no kept
/// dimension row has meets only dimension rows whose `key` the cutting join drops.
fn through_dimension(
    plan: &LogicalPlan,
    key: &Column,
    source: &KeySource,
) -> Result<Option<LogicalPlan>> {
    let (i, inner) = match step_toward(plan, key) {
        Step::Through(inner) => (0, inner),
        Step::Join(join) => {
            let on_left = join.left.schema().has_column(key);
            if !passes_rows_as_themselves(join, on_left) {
                return Ok(None);
            }
            let dimension = if on_left { &join.left } else { &join.right };
            if chain_scan(dimension).is_some() {
                return cut_by_dimension(plan, join, on_left, key, source);
            }
            (if on_left { 0 } else { 1 }, key.clone())
        }
        Step::Stop => return Ok(None),
    };
    let Some(reduced) = through_dimension(plan.inputs()[i], &inner, source)? else {
        return Ok(None);
    };
    with_input(plan, i, reduced).map(Some)
}

/// One step of a descent from `plan` toward the scan that produces `key`.
enum Step<'a> {
    /// Into the only input of a projection, alias or filter, where `key` has this name.
    Through(Column),
    /// Into a join, which the caller crosses its own way.
    Join(&'a Join),
    /// Nowhere: `key` is computed here, the join was pre-filtered before (by
    /// [`PrefilterScans`] or [`PrefilterGroups`]), or `plan` is another kind of node.
    Stop,
}

fn step_toward<'a>(plan: &'a LogicalPlan, key: &Column) -> Step<'a> {
    match plan {
        LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::Filter(_) => {
            passed_from(plan, key).map_or(Step::Stop, Step::Through)
        }
        LogicalPlan::Join(join) if is_keys(&join.left) || is_keys(&join.right) => Step::Stop,
        LogicalPlan::Join(join) => Step::Join(join),
        _ => Step::Stop,
    }
}

/// `plan` with its input `i` replaced by `input`.
fn with_input(plan: &LogicalPlan, i: usize, input: LogicalPlan) -> Result<LogicalPlan> {
    let mut inputs: Vec<LogicalPlan> = plan.inputs().into_iter().cloned().collect();
    inputs[i] = input;
    plan.with_new_exprs(plan.expressions(), inputs)
}

/// `plan`, an inner `join` of a dimension's scan chain (the left side when `on_left`) with
/// other tables, with those tables' scans cut by the keys of the dimension rows whose `key`
/// `source` yields; `None` when no cut is worth it.
fn cut_by_dimension(
    plan: &LogicalPlan,
    join: &Join,
    on_left: bool,
    key: &Column,
    source: &KeySource,
) -> Result<Option<LogicalPlan>> {
    if join.join_type != JoinType::Inner || join.null_equality != NullEquality::NullEqualsNothing {
        return Ok(None);
    }
    let (dimension, other) = if on_left { (0, 1) } else { (1, 0) };
    let mut inputs: Vec<LogicalPlan> = plan.inputs().into_iter().cloned().collect();
    let Some(kept) = semi_join(&inputs[dimension], key, source)? else {
        return Ok(None);
    };
    let tables = scanned_tables(&kept);
    let Some(source_rows) = max_scan_rows(&kept) else {
        return Ok(None);
    };
    let mut changed = false;
    for (l, r) in &join.on {
        let (Expr::Column(l), Expr::Column(r)) = (l, r) else {
            continue;
        };
        let (dimension_key, other_key) = if on_left { (l, r) } else { (r, l) };
        let kept_keys = KeySource {
            plan: kept.clone(),
            key: dimension_key.clone(),
            table: tables.join(" ⋈ "),
        };
        let place = Placement {
            source: &kept_keys,
            source_rows,
            source_tables: tables.clone(),
        };
        if let Some(reduced) = place.at_scan(&inputs[other], other_key, 0)? {
            tracing::debug!(key = %other_key, source = %kept_keys.table, "scan pre-filtered through a dimension");
            inputs[other] = reduced;
            changed = true;
        }
    }
    if !changed {
        return Ok(None);
    }
    plan.with_new_exprs(plan.expressions(), inputs).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::SessionContext;

    async fn context(with_rule: bool) -> SessionContext {
        let rule = with_rule.then(|| Arc::new(PrefilterGroups) as _);
        let tables = [
            "CREATE TABLE dim (k INT, tag VARCHAR) AS VALUES \
             (1, 'a'), (2, 'b'), (3, 'a'), (NULL, 'a'), (5, 'c'), (6, 'a')",
            "CREATE TABLE fact (k INT, j INT, v INT) AS VALUES \
             (1, 1, 10), (1, 2, 20), (2, 1, 5), (3, 1, 7), (NULL, 1, 1), (NULL, 2, 2), \
             (4, 1, 100), (5, 2, 3), (3, 2, 8)",
            "CREATE TABLE pair (k INT, j INT, w VARCHAR) AS VALUES \
             (1, 1, 'x'), (1, 2, 'y'), (3, 2, 'x'), (4, 1, 'x'), (NULL, 1, 'x')",
        ];
        crate::testing::context(rule, &tables).await
    }

    use crate::testing::plan_and_rows as run;

    /// Every query gives the same rows with and without the rule; `rewritten` says whether
    /// the rule must have pre-filtered a group.
    async fn check(cases: &[(&str, bool)]) {
        let (with, without) = (context(true).await, context(false).await);
        for (sql, rewritten) in cases {
            let (plan, rows) = run(&with, sql).await;
            let (_, expected) = run(&without, sql).await;
            assert_eq!(rows, expected, "{sql}\n{plan}");
            assert_eq!(plan.contains(KEYS), *rewritten, "{sql}\n{plan}");
        }
    }

    #[tokio::test]
    async fn groups_joined_with_a_filtered_table_are_computed_only_for_its_keys() {
        check(&[
            // A derived table joined on its grouping key (inner, and the aggregate on the
            // right of a LEFT JOIN, where only the left side's rows are kept).
            (
                "SELECT d.k, a.s FROM dim d JOIN (SELECT k, sum(v) AS s FROM fact GROUP BY k) a \
                 ON d.k = a.k WHERE d.tag = 'a'",
                true,
            ),
            (
                "SELECT d.k, a.s FROM dim d LEFT JOIN (SELECT k, sum(v) AS s FROM fact GROUP BY k) a \
                 ON d.k = a.k WHERE d.tag = 'a'",
                true,
            ),
            // A correlated scalar subquery (TPC-H Q17's shape).
            (
                "SELECT d.k FROM dim d WHERE d.tag = 'a' \
                 AND 6 < (SELECT sum(v) FROM fact f WHERE f.k = d.k)",
                true,
            ),
            // IN over a grouped subquery with HAVING (a semi join).
            (
                "SELECT k, tag FROM dim WHERE tag = 'a' \
                 AND k IN (SELECT k FROM fact GROUP BY k HAVING sum(v) > 6)",
                true,
            ),
            // Two grouping keys, one of them constrained (TPC-H Q20's shape), with the key's
            // source found through another join of the outer query.
            (
                "SELECT p.k, p.j, p.w FROM pair p JOIN dim d ON p.k = d.k WHERE d.tag = 'a' \
                 AND p.j < (SELECT sum(v) FROM fact f WHERE f.k = p.k AND f.j = p.j)",
                true,
            ),
            // The aggregate's input is a join: the semi join goes below it, on the side
            // that has the key (TPC-H Q2's shape).
            (
                "SELECT d.k, a.m FROM dim d JOIN (SELECT f.k, max(p.w) AS m FROM fact f \
                 JOIN pair p ON f.j = p.j GROUP BY f.k) a ON a.k = d.k WHERE d.tag = 'a'",
                true,
            ),
        ])
        .await;
    }

    #[tokio::test]
    async fn groups_that_reach_the_output_without_a_partner_are_left_alone() {
        check(&[
            // The aggregate is the preserved side of an outer join.
            (
                "SELECT a.k, a.s, d.tag FROM (SELECT k, sum(v) AS s FROM fact GROUP BY k) a \
                 LEFT JOIN (SELECT * FROM dim WHERE tag = 'a') d ON d.k = a.k",
                false,
            ),
            (
                "SELECT a.k, a.s, d.tag FROM (SELECT k, sum(v) AS s FROM fact GROUP BY k) a \
                 FULL JOIN (SELECT * FROM dim WHERE tag = 'a') d ON d.k = a.k",
                false,
            ),
            // NOT IN and NOT EXISTS keep rows for keys the aggregate lacks.
            (
                "SELECT k FROM dim WHERE tag = 'a' AND k NOT IN (SELECT k FROM fact GROUP BY k)",
                false,
            ),
            (
                "SELECT k FROM dim d WHERE tag = 'a' \
                 AND NOT EXISTS (SELECT 1 FROM fact f WHERE f.k = d.k GROUP BY f.k)",
                false,
            ),
            // An unfiltered other side: its keys would filter nothing.
            (
                "SELECT d.k, a.s FROM dim d JOIN (SELECT k, sum(v) AS s FROM fact GROUP BY k) a \
                 ON d.k = a.k",
                false,
            ),
            // The key's only filtered source is the aggregated table itself.
            (
                "SELECT f.k, a.c FROM fact f JOIN (SELECT k, count(*) AS c FROM fact GROUP BY k) a \
                 ON f.k = a.k WHERE f.v > 6",
                false,
            ),
            // A grouping key computed from the input.
            (
                "SELECT d.k, a.s FROM dim d JOIN (SELECT abs(k) AS k, sum(v) AS s FROM fact \
                 GROUP BY abs(k)) a ON d.k = a.k WHERE d.tag = 'a'",
                false,
            ),
        ])
        .await;
    }

    #[test]
    fn a_scan_filtered_by_true_is_not_a_filtered_scan() {
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::logical_expr::logical_plan::builder::LogicalTableSource;
        use datafusion::prelude::{col, lit};
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, true)]));
        let scan = |filters| {
            let source = Arc::new(LogicalTableSource::new(schema.clone()));
            LogicalPlanBuilder::scan_with_filters("t", source, None, filters)
                .unwrap()
                .build()
                .unwrap()
        };
        // What `FROM a, b WHERE a.k = b.k` leaves on a scan that takes inexact filters
        // (Iceberg's; TPC-H Q15 pre-filtered its revenue by every supplier key).
        assert_eq!(
            scan_chain(&scan(vec![lit(true)])),
            Some(("t".into(), false))
        );
        assert_eq!(
            scan_chain(&scan(vec![lit(true), col("k").gt(lit(1))])),
            Some(("t".into(), true))
        );
        let above = LogicalPlanBuilder::from(scan(vec![]))
            .filter(lit(true))
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(scan_chain(&above), Some(("t".into(), false)));
    }

    #[tokio::test]
    async fn a_plan_for_a_ballista_job_goes_without_the_semi_joins() {
        let ctx = context(true).await;
        let sql = "SELECT d.k FROM dim d WHERE d.tag = 'a' \
                   AND 6 < (SELECT sum(v) FROM fact f WHERE f.k = d.k)";
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.clone().into_optimized_plan().unwrap();
        assert!(plan.display_indent().to_string().contains(KEYS));
        let stripped = without_prefilters(&plan).unwrap();
        assert!(
            !stripped.display_indent().to_string().contains(KEYS),
            "{stripped}"
        );
        assert_eq!(stripped.schema(), plan.schema());
        let run = |p: LogicalPlan| {
            let ctx = ctx.clone();
            async move {
                let batches = ctx
                    .execute_logical_plan(p)
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap();
                let text = pretty_format_batches(&batches).unwrap().to_string();
                let mut rows: Vec<String> = text.lines().map(str::to_string).collect();
                rows.sort();
                rows
            }
        };
        assert_eq!(run(stripped).await, run(plan).await);
    }

    #[tokio::test]
    async fn a_rewritten_plan_is_not_rewritten_again() {
        let ctx = context(true).await;
        let sql = "SELECT d.k, a.s FROM dim d JOIN (SELECT k, sum(v) AS s FROM fact GROUP BY k) a \
                   ON d.k = a.k WHERE d.tag = 'a'";
        let (plan, _) = run(&ctx, sql).await;
        let aliases = plan.matches(&format!("SubqueryAlias: {KEYS}")).count();
        assert_eq!(aliases, 1, "{plan}");
    }

    /// A table that reports `rows` rows, whatever it holds (the rule weighs tables by their
    /// statistics; memory tables have none).
    #[derive(Debug)]
    struct Counted {
        table: datafusion::datasource::MemTable,
        rows: usize,
    }

    #[async_trait::async_trait]
    impl datafusion::datasource::TableProvider for Counted {
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn schema(&self) -> datafusion::arrow::datatypes::SchemaRef {
            self.table.schema()
        }
        fn table_type(&self) -> datafusion::datasource::TableType {
            datafusion::datasource::TableType::Base
        }
        async fn scan(
            &self,
            state: &dyn datafusion::catalog::Session,
            projection: Option<&Vec<usize>>,
            filters: &[Expr],
            limit: Option<usize>,
        ) -> Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            self.table.scan(state, projection, filters, limit).await
        }
        fn statistics(&self) -> Option<datafusion::common::Statistics> {
            let mut stats = datafusion::common::Statistics::new_unknown(&self.table.schema());
            stats.num_rows = datafusion::common::stats::Precision::Inexact(self.rows);
            Some(stats)
        }
    }

    /// Nations (`nat`, with regions `reg`), suppliers (`sup`) and their line items (`li`);
    /// `stats`: whether the tables report their rows.
    async fn star(with_rule: bool, stats: bool) -> SessionContext {
        let mut state = SessionStateBuilder::new().with_default_features();
        if with_rule {
            state = state.with_optimizer_rule(Arc::new(PrefilterScans));
        }
        let ctx = SessionContext::new_with_state(state.build());
        let tables = [
            (
                "reg",
                "SELECT * FROM (VALUES (1, 'asia'), (2, 'europe')) AS t(rk, rname)",
                2,
            ),
            (
                "nat",
                "SELECT * FROM (VALUES (1, 'fr', 2), (2, 'de', 2), (3, 'jp', 1), \
                 (CAST(NULL AS INT), 'xx', 1)) AS t(nk, name, rk)",
                4,
            ),
            (
                "sup",
                "SELECT * FROM (VALUES (10, 1), (11, 2), (12, 3), (13, CAST(NULL AS INT)), \
                 (14, 1), (15, 9)) AS t(sk, nk)",
                20_000,
            ),
            (
                "li",
                "SELECT * FROM (VALUES (10, 1.5, 100), (10, 2.5, 101), (11, 3.0, 102), \
                 (12, 4.0, 100), (13, 5.0, 103), (15, 6.0, 104), (CAST(NULL AS INT), 7.0, 101), \
                 (16, 8.0, CAST(NULL AS INT)), (14, 9.0, 102), (10, 1.0, 104)) AS t(sk, price, ck)",
                1_000_000,
            ),
            (
                "cu",
                "SELECT * FROM (VALUES (100, 1), (101, 2), (102, 3), (103, CAST(NULL AS INT)), \
                 (104, 1)) AS t(ck, nk)",
                20_000,
            ),
        ];
        for (name, sql, rows) in tables {
            let df = ctx.sql(sql).await.unwrap();
            let schema = Arc::new(df.schema().as_arrow().clone());
            let batches = df.collect().await.unwrap();
            let table = datafusion::datasource::MemTable::try_new(schema, vec![batches]).unwrap();
            let provider: Arc<dyn datafusion::datasource::TableProvider> = if stats {
                Arc::new(Counted { table, rows })
            } else {
                Arc::new(table)
            };
            ctx.register_table(name, provider).unwrap();
        }
        ctx
    }

    #[tokio::test]
    async fn scans_deep_in_a_join_are_cut_by_a_small_filtered_dimension() {
        let cases: &[(&str, bool)] = &[
            // TPC-H Q7's shape: suppliers and their items first, the nations last.
            (
                "SELECT s.sk, l.price, n.name FROM sup s, li l, nat n \
                 WHERE s.sk = l.sk AND s.nk = n.nk AND n.name IN ('fr', 'jp')",
                true,
            ),
            // The dimension a join of nations and one region, joined first.
            (
                "SELECT s.sk, l.price FROM sup s, li l, \
                 (SELECT nk FROM nat, reg WHERE nat.rk = reg.rk AND rname = 'europe') n \
                 WHERE s.sk = l.sk AND s.nk = n.nk",
                true,
            ),
            // Q5's order, the region joined last (above the nations): the nations are too
            // small to be worth a cut, the suppliers below them are cut by the kept nations.
            (
                "SELECT s.sk, l.price FROM sup s, li l, nat n, reg r \
                 WHERE s.sk = l.sk AND s.nk = n.nk AND n.rk = r.rk AND r.rname = 'europe'",
                true,
            ),
            // The suppliers on the kept side of a LEFT JOIN, cut by an inner join above.
            (
                "SELECT s.sk, l.price FROM sup s LEFT JOIN li l ON s.sk = l.sk \
                 JOIN nat n ON s.nk = n.nk WHERE n.name = 'fr'",
                true,
            ),
            // A RIGHT JOIN keeps every nation: its other side's rows without one go.
            (
                "SELECT s.sk, l.price, n.name FROM sup s JOIN li l ON s.sk = l.sk \
                 RIGHT JOIN (SELECT * FROM nat WHERE name <> 'de') n ON s.nk = n.nk",
                true,
            ),
            // The suppliers on the NULL-padded side of a LEFT JOIN: left alone.
            (
                "SELECT l.price, s.sk FROM li l LEFT JOIN sup s ON s.sk = l.sk \
                 JOIN nat n ON s.nk = n.nk WHERE n.name = 'fr'",
                false,
            ),
            // A FULL JOIN keeps every row of both sides.
            (
                "SELECT s.sk, l.price, n.name FROM sup s JOIN li l ON s.sk = l.sk \
                 FULL JOIN (SELECT * FROM nat WHERE name = 'fr') n ON s.nk = n.nk",
                false,
            ),
            // Right next to the join, the join itself is the cut.
            (
                "SELECT s.sk, n.name FROM sup s JOIN nat n ON s.nk = n.nk WHERE n.name = 'fr'",
                false,
            ),
            // An unfiltered dimension cuts nothing.
            (
                "SELECT s.sk, l.price FROM sup s, li l, nat n WHERE s.sk = l.sk AND s.nk = n.nk",
                false,
            ),
            // A source read twice must give the same rows: no random() filter, no LIMIT.
            (
                "SELECT s.sk, l.price FROM sup s, li l, \
                 (SELECT * FROM nat WHERE random() < 2.0) n \
                 WHERE s.sk = l.sk AND s.nk = n.nk",
                false,
            ),
            (
                "SELECT s.sk, l.price FROM sup s, li l, (SELECT * FROM nat LIMIT 2) n \
                 WHERE s.sk = l.sk AND s.nk = n.nk",
                false,
            ),
            // A source about as large as the scan is not worth a second read.
            (
                "SELECT s.sk, n.name FROM nat n, sup s, (SELECT * FROM li WHERE price > 2) l \
                 WHERE s.sk = l.sk AND s.nk = n.nk",
                false,
            ),
        ];
        let (with, without) = (star(true, true).await, star(false, true).await);
        for (sql, rewritten) in cases {
            let (plan, rows) = run(&with, sql).await;
            let (_, expected) = run(&without, sql).await;
            assert_eq!(rows, expected, "{sql}\n{plan}");
            assert_eq!(plan.contains(KEYS), *rewritten, "{sql}\n{plan}");
            // Optimized once more, the plan gains no further cut.
            let optimized = with.sql(sql).await.unwrap().into_optimized_plan().unwrap();
            let again = with.state().optimize(&optimized).unwrap();
            let cuts = |p: &LogicalPlan| p.display_indent().to_string().matches(KEYS).count();
            assert_eq!(cuts(&again), cuts(&optimized), "{plan}");
        }
        // Q5 itself: customers and their items, suppliers of the customers' nation, the
        // nations, the region last. The kept nations cut the suppliers, and, through
        // `c.nk = s.nk`, the customers.
        let q5 = "SELECT n.name, sum(l.price) FROM cu c, li l, sup s, nat n, reg r \
                  WHERE c.ck = l.ck AND l.sk = s.sk AND c.nk = s.nk AND s.nk = n.nk \
                  AND n.rk = r.rk AND r.rname = 'europe' GROUP BY n.name";
        let (plan, rows) = run(&with, q5).await;
        assert_eq!(rows, run(&without, q5).await.1, "{plan}");
        assert!(rows.iter().any(|r| r.contains("fr")), "{rows:?}");
        let cut = |alias: &str| plan.contains(&format!("RightSemi Join: {KEYS}.key = {alias}.nk"));
        assert!(cut("s") && cut("c"), "{plan}");
        // Tables without statistics are never weighed, so never cut.
        let blind = star(true, false).await;
        let (plan, _) = run(&blind, cases[0].0).await;
        assert!(!plan.contains(KEYS), "{plan}");
    }
}
