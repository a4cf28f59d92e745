//! The pushdown rule: the largest subtrees of a logical plan that read one source, and that
//! the source computes exactly as Basin would, become one remote query each.
//!
//! Discipline (after Trino's): what a connector may push is listed in its `Capabilities`;
//! text comparisons are pushed only where the source compares bytes (PostgreSQL
//! deterministic collations for `=`, `C`/`POSIX` for ordering; MySQL binary collations);
//! float comparisons and MIN/MAX are never pushed (NaN and -0.0 order differently); ORDER BY
//! is pushed only as part of a top-N, and Basin sorts the N rows again. Whatever is not
//! pushed runs in Basin: pushdown never makes a query fail.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr::{AggregateFunction, Alias};
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    Aggregate, BinaryExpr, Expr, ExprSchemable, FetchType, Filter, JoinType, LogicalPlan,
    LogicalPlanBuilder, Operator, Projection, Sort, TableScan,
};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use datafusion::sql::unparser::Unparser;

use super::catalog::RemoteTable;
use super::exec::{RemoteQuery, RemoteQueryTable};
use super::source::RemoteSource;
use super::sql::{prepare, prepare_expr};
use super::types::RemoteColumn;

/// Basin's pushdown rule (runs after DataFusion's own logical optimizations).
#[derive(Debug, Default)]
pub struct RemotePushdown;

impl OptimizerRule for RemotePushdown {
    fn name(&self) -> &str {
        "basin_remote_pushdown"
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        rewrite(plan)
    }
}

/// What the rule knows about the columns of a subtree: where they come from.
type Facts = HashMap<Column, RemoteColumn>;

fn remote_table(scan: &TableScan) -> Option<RemoteTable> {
    let provider = source_as_provider(&scan.source).ok()?;
    provider.as_any().downcast_ref::<RemoteTable>().cloned()
}

fn rewrite(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let mut facts = Facts::new();
    if let Some(source) = pushable(&plan, &mut facts) {
        match push(&plan, &source) {
            Ok(replaced) => return Ok(Transformed::yes(replaced)),
            Err(e) => tracing::debug!(source = %source.name, "not pushed: {e}"),
        }
    }
    // DataFusion's common-subexpression elimination leaves an aggregate over a projection of
    // `__common_expr_N` columns (TPC-H Q1), which the unparser turns into SQL that names
    // tables outside their subquery: push the aggregate with the projection inlined.
    if let LogicalPlan::Aggregate(a) = &plan
        && let LogicalPlan::Projection(p) = a.input.as_ref()
        && let Some(inlined) = inline_projection(a, p)?
    {
        let mut facts = Facts::new();
        if let Some(source) = pushable(&inlined, &mut facts) {
            match push(&inlined, &source) {
                Ok(replaced) => return Ok(Transformed::yes(replaced)),
                Err(e) => tracing::debug!(source = %source.name, "not pushed: {e}"),
            }
        }
    }
    // A projection over a filter that stays (partly) in Basin — a text equality the source
    // answers loosely: the source computes the projection too, over the rows of the pushed
    // conjuncts, and the rest is checked above it (access rules' column masks: the clear
    // value never leaves the source). Only when the filter reads nothing but columns the
    // projection passes through.
    if let LogicalPlan::Projection(p) = &plan
        && let LogicalPlan::Filter(f) = p.input.as_ref()
        && p.expr.iter().all(cannot_fail)
        && f.predicate.column_refs().iter().all(|c| {
            p.expr
                .iter()
                .any(|e| matches!(e, Expr::Column(passed) if passed == *c))
        })
    {
        let mut facts = Facts::new();
        if let Some(source) = pushable(&f.input, &mut facts)
            && let (Some(pushed), Some(rest)) = split_filter(f, &facts, &source)
        {
            let below = LogicalPlan::Filter(Filter::try_new(pushed, f.input.clone())?);
            let inner =
                LogicalPlan::Projection(Projection::try_new(p.expr.clone(), Arc::new(below))?);
            // The projection's expressions must be the source's to compute (the filter's
            // were chosen by split_filter).
            if p.expr
                .iter()
                .all(|e| expr_ok(e, f.input.schema(), &facts, &source))
                && let Ok(replaced) = push(&inner, &source)
            {
                return Ok(Transformed::yes(LogicalPlan::Filter(Filter::try_new(
                    rest,
                    Arc::new(replaced),
                )?)));
            }
        }
    }
    // A filter whose predicate is only partly pushable: push the pushable conjuncts.
    if let LogicalPlan::Filter(f) = &plan {
        let mut facts = Facts::new();
        if let Some(source) = pushable(&f.input, &mut facts)
            && let (Some(pushed), Some(rest)) = split_filter(f, &facts, &source)
        {
            let inner = LogicalPlan::Filter(Filter::try_new(pushed, f.input.clone())?);
            if let Ok(replaced) = push(&inner, &source) {
                return Ok(Transformed::yes(LogicalPlan::Filter(Filter::try_new(
                    rest,
                    Arc::new(replaced),
                )?)));
            }
        }
    }
    // A bare scan always becomes a remote query, even when nothing above it could be pushed.
    if let LogicalPlan::TableScan(scan) = &plan
        && let Some(table) = remote_table(scan)
    {
        return Ok(Transformed::yes(push_scan(
            &plan, &table, scan, None, None,
        )?));
    }
    plan.map_children(rewrite)?
        .transform_data(|p| p.map_subqueries(rewrite))
}

/// Whether `e` gives a value for every row (no arithmetic, which overflows at a source that
/// raises errors for it, no cast, nothing volatile): it may be computed on rows an exact
/// filter would have dropped.
fn cannot_fail(e: &Expr) -> bool {
    !e.is_volatile()
        && !e
            .exists(|x| {
                Ok(matches!(
                    x,
                    Expr::Cast(_)
                        | Expr::TryCast(_)
                        | Expr::ScalarFunction(_)
                        | Expr::Negative(_)
                        | Expr::BinaryExpr(BinaryExpr {
                            op: Operator::Divide
                                | Operator::Modulo
                                | Operator::Plus
                                | Operator::Minus
                                | Operator::Multiply,
                            ..
                        })
                ))
            })
            .unwrap_or(true)
}

/// What of `f`'s predicate the source can take (its pushable conjuncts, and text
/// equalities it answers loosely, which cut what it sends) and what Basin checks after it
/// (the conjuncts that are not pushable, the loose ones again); `None` for an empty part.
fn split_filter(f: &Filter, facts: &Facts, source: &RemoteSource) -> (Option<Expr>, Option<Expr>) {
    let schema = f.input.schema();
    let (yes, no): (Vec<&Expr>, Vec<&Expr>) = split_conjunction(&f.predicate)
        .into_iter()
        .partition(|e| expr_ok(e, schema, facts, source));
    let superset = no
        .iter()
        .copied()
        .filter(|e| superset_ok(e, schema, facts, source));
    let pushed = conjunction(yes.into_iter().chain(superset).cloned());
    let rest = conjunction(no.into_iter().cloned());
    (pushed, rest)
}

/// `a` computed directly on `p`'s input (the projection's expressions substituted for its
/// columns), under a projection that restores `a`'s output names; `None` when `p` has a
/// volatile expression (inlining could evaluate it more or fewer times).
fn inline_projection(a: &Aggregate, p: &Projection) -> Result<Option<LogicalPlan>> {
    if p.expr.iter().any(|e| e.is_volatile()) {
        return Ok(None);
    }
    let definitions: HashMap<Column, Expr> = p
        .schema
        .columns()
        .into_iter()
        .zip(p.expr.iter().map(|e| e.clone().unalias()))
        .collect();
    let inline = |e: &Expr| -> Result<Expr> {
        e.clone()
            .transform(|x| match x {
                Expr::Column(c) => Ok(match definitions.get(&c) {
                    Some(d) => Transformed::yes(d.clone()),
                    None => Transformed::no(Expr::Column(c)),
                }),
                other => Ok(Transformed::no(other)),
            })
            .map(|t| t.data)
    };
    let group = a
        .group_expr
        .iter()
        .map(inline)
        .collect::<Result<Vec<_>>>()?;
    let aggr = a.aggr_expr.iter().map(inline).collect::<Result<Vec<_>>>()?;
    let Ok(inner) = Aggregate::try_new(p.input.clone(), group, aggr) else {
        return Ok(None);
    };
    let inner = LogicalPlan::Aggregate(inner);
    let renamed: Vec<Expr> = inner
        .schema()
        .columns()
        .into_iter()
        .zip(a.schema.iter())
        .map(|(c, (q, f))| Expr::Column(c).alias_qualified(q.cloned(), f.name()))
        .collect();
    Ok(Some(
        LogicalPlanBuilder::from(inner).project(renamed)?.build()?,
    ))
}

/// Names that cannot be quoted safely everywhere keep their subtree in Basin.
fn safe_name(name: &str) -> bool {
    !name.contains(['"', '`', '[', ']', '\\', '\0'])
}

fn safe_schema(schema: &DFSchema) -> bool {
    schema.iter().all(|(q, f)| {
        safe_name(f.name()) && q.is_none_or(|q| q.to_vec().iter().all(|p| safe_name(p)))
    })
}

/// The single source a subtree can be pushed to, filling `facts` with its columns.
fn pushable(plan: &LogicalPlan, facts: &mut Facts) -> Option<Arc<RemoteSource>> {
    if !safe_schema(plan.schema()) {
        return None;
    }
    if let LogicalPlan::TableScan(scan) = plan {
        let table = remote_table(scan)?;
        if !scan.filters.is_empty()
            || !safe_name(&table.schema_name)
            || !safe_name(&table.table_name)
        {
            return None;
        }
        for (q, f) in scan.projected_schema.iter() {
            if let Some(c) = table.column(f.name()) {
                facts.insert(Column::new(q.cloned(), f.name()), c.clone());
            }
        }
        return Some(table.source.clone());
    }
    // ORDER BY is pushed only under a LIMIT (top-N).
    let inputs: Vec<&LogicalPlan> = match plan {
        LogicalPlan::Limit(l) => match l.input.as_ref() {
            LogicalPlan::Sort(s) => vec![s.input.as_ref()],
            other => vec![other],
        },
        other => other.inputs(),
    };
    if inputs.is_empty() {
        return None;
    }
    let mut source: Option<Arc<RemoteSource>> = None;
    for input in inputs {
        let s = pushable(input, facts)?;
        if source.as_ref().is_some_and(|prev| prev.name != s.name) {
            return None;
        }
        source = Some(s);
    }
    let source = source?;
    let caps = source.capabilities();
    let ok = match plan {
        LogicalPlan::Projection(p) => p
            .expr
            .iter()
            .all(|e| expr_ok(e, p.input.schema(), facts, &source)),
        LogicalPlan::Filter(f) => {
            caps.filters && expr_ok(&f.predicate, f.input.schema(), facts, &source)
        }
        LogicalPlan::SubqueryAlias(_) => true,
        LogicalPlan::Aggregate(a) => {
            let schema = a.input.schema();
            caps.aggregates
                && a.group_expr.iter().all(|e| {
                    !matches!(e, Expr::GroupingSet(_))
                        && expr_ok(e, schema, facts, &source)
                        && text_ok(e, schema, facts, false)
                })
                && a.aggr_expr
                    .iter()
                    .all(|e| aggregate_ok(e, schema, facts, &source))
        }
        LogicalPlan::Limit(l) => {
            let literal = matches!(l.get_fetch_type(), Ok(FetchType::Literal(_)))
                && matches!(
                    l.get_skip_type(),
                    Ok(datafusion::logical_expr::SkipType::Literal(_))
                );
            caps.limit
                && literal
                && match l.input.as_ref() {
                    LogicalPlan::Sort(s) => caps.top_n && sort_ok(s, facts, &source),
                    _ => true,
                }
        }
        LogicalPlan::Join(j) => {
            let schema = j.schema.as_ref();
            caps.joins
                && !j.null_aware
                && j.null_equality == datafusion::common::NullEquality::NullEqualsNothing
                && matches!(
                    j.join_type,
                    JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full
                )
                && j.on.iter().all(|(l, r)| {
                    expr_ok(l, schema, facts, &source)
                        && expr_ok(r, schema, facts, &source)
                        && text_ok(l, schema, facts, false)
                        && text_ok(r, schema, facts, false)
                        && !is_float(l, schema)
                })
                && j.filter
                    .as_ref()
                    .is_none_or(|f| expr_ok(f, schema, facts, &source))
        }
        _ => false,
    };
    ok.then_some(source)
}

fn sort_ok(s: &Sort, facts: &Facts, source: &RemoteSource) -> bool {
    let schema = s.input.schema();
    s.expr.iter().all(|e| {
        let nulls_ok = source.capabilities().nulls_ordering
            // MySQL sorts NULLs first ascending and last descending, and has no NULLS clause.
            || e.asc == e.nulls_first
            || !e.expr.nullable(schema).unwrap_or(true);
        nulls_ok
            && expr_ok(&e.expr, schema, facts, source)
            && text_ok(&e.expr, schema, facts, true)
            && !is_float(&e.expr, schema)
    })
}

fn is_narrow_integer(t: &DataType) -> bool {
    t.is_integer() && !matches!(t, DataType::Int64 | DataType::UInt64)
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_float(e: &Expr, schema: &DFSchema) -> bool {
    e.get_type(schema)
        .is_ok_and(|t| matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64))
}

/// A text-typed operand is allowed where the source compares (or orders, with `ordered`)
/// exactly as Basin: a column whose collation says so, or a literal.
fn text_ok(e: &Expr, schema: &DFSchema, facts: &Facts, ordered: bool) -> bool {
    let Ok(t) = e.get_type(schema) else {
        return false;
    };
    if !is_text(&t) {
        return true;
    }
    match e {
        Expr::Literal(_, _) => true,
        Expr::Alias(Alias { expr, .. }) => text_ok(expr, schema, facts, ordered),
        Expr::Column(c) => facts.get(c).is_some_and(|f| {
            if ordered {
                f.ordered_text
            } else {
                f.exact_text
            }
        }),
        _ => false,
    }
}

fn expr_ok(e: &Expr, schema: &DFSchema, facts: &Facts, source: &RemoteSource) -> bool {
    let caps = source.capabilities();
    let ok = |x: &Expr| expr_ok(x, schema, facts, source);
    match e {
        Expr::Column(c) => {
            safe_name(&c.name)
                && (caps.boolean_values
                    || !e.get_type(schema).is_ok_and(|t| t == DataType::Boolean))
        }
        Expr::Literal(v, _) => {
            source.sql().literal_ok(v)
                && (caps.boolean_values || !matches!(v, ScalarValue::Boolean(_)))
        }
        Expr::Alias(Alias { expr, name, .. }) => safe_name(name) && ok(expr),
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let comparison = matches!(
                op,
                Operator::Eq
                    | Operator::NotEq
                    | Operator::Lt
                    | Operator::LtEq
                    | Operator::Gt
                    | Operator::GtEq
            );
            let allowed = match op {
                Operator::And
                | Operator::Or
                | Operator::Plus
                | Operator::Minus
                | Operator::Multiply => true,
                Operator::Divide => caps.division,
                _ => comparison,
            };
            let ordered = matches!(
                op,
                Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq
            );
            allowed
                && ok(left)
                && ok(right)
                && (!comparison
                    || (text_ok(left, schema, facts, ordered)
                        && text_ok(right, schema, facts, ordered)
                        && !is_float(left, schema)
                        && !is_float(right, schema)))
                // Arithmetic on text is not arithmetic; on integers narrower than 64 bits it
                // overflows at the source's width (PostgreSQL fails `int4 * int4` past 2^31,
                // SQL Server too; MySQL computes in 64 bits where Basin's column is narrower).
                && (comparison
                    || matches!(op, Operator::And | Operator::Or)
                    || !e
                        .get_type(schema)
                        .is_ok_and(|t| is_text(&t) || is_narrow_integer(&t)))
        }
        Expr::Not(x) | Expr::IsNull(x) | Expr::IsNotNull(x) => ok(x),
        Expr::IsTrue(x) | Expr::IsFalse(x) | Expr::IsNotTrue(x) | Expr::IsNotFalse(x) => {
            caps.boolean_values && ok(x)
        }
        Expr::Negative(x) => ok(x) && !is_float(x, schema),
        Expr::Between(b) => {
            ok(&b.expr)
                && ok(&b.low)
                && ok(&b.high)
                && !is_float(&b.expr, schema)
                && [&b.expr, &b.low, &b.high]
                    .iter()
                    .all(|x| text_ok(x, schema, facts, true))
        }
        Expr::InList(l) => {
            ok(&l.expr)
                && !is_float(&l.expr, schema)
                && text_ok(&l.expr, schema, facts, false)
                && l.list
                    .iter()
                    .all(|x| ok(x) && text_ok(x, schema, facts, false))
        }
        Expr::Like(l) => {
            !l.case_insensitive
                && l.escape_char.is_none()
                && ok(&l.expr)
                && ok(&l.pattern)
                && text_ok(&l.expr, schema, facts, false)
                && matches!(l.pattern.as_ref(), Expr::Literal(_, _))
        }
        // Integers and decimals to double (how DataFusion feeds AVG): same in every dialect.
        Expr::Cast(c)
            if c.data_type == DataType::Float64
                && c.expr
                    .get_type(schema)
                    .is_ok_and(|t| t.is_integer() || matches!(t, DataType::Decimal128(_, _))) =>
        {
            ok(&c.expr)
        }
        Expr::Cast(c) => {
            caps.casts
                && ok(&c.expr)
                && matches!(
                    c.data_type,
                    DataType::Int16
                        | DataType::Int32
                        | DataType::Int64
                        | DataType::Decimal128(_, _)
                        | DataType::Date32
                )
                && c.expr.get_type(schema).is_ok_and(|t| {
                    t.is_integer() || matches!(t, DataType::Decimal128(_, _) | DataType::Date32)
                })
        }
        Expr::Case(c) => {
            c.expr.as_ref().is_none_or(|x| ok(x))
                && c.when_then_expr.iter().all(|(w, t)| ok(w) && ok(t))
                && c.else_expr.as_ref().is_none_or(|x| ok(x))
        }
        _ => false,
    }
}

/// `column = 'literal'` or `column IN ('a', 'b')` on a text column whose equality at the
/// source is a superset of Basin's ([`RemoteColumn::text_superset`]).
fn superset_ok(e: &Expr, schema: &DFSchema, facts: &Facts, source: &RemoteSource) -> bool {
    let column = |x: &Expr| match x {
        Expr::Column(c) => facts.get(c).is_some_and(|f| f.text_superset) && safe_name(&c.name),
        _ => false,
    };
    let literal = |x: &Expr| match x {
        Expr::Literal(v @ (ScalarValue::Utf8(Some(_)) | ScalarValue::Utf8View(Some(_))), _) => {
            source.sql().literal_ok(v)
        }
        _ => false,
    };
    source.capabilities().filters
        && match e {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) => (column(left) && literal(right)) || (literal(left) && column(right)),
            Expr::InList(l) => !l.negated && column(&l.expr) && l.list.iter().all(literal),
            _ => false,
        }
        && e.get_type(schema).is_ok()
}

fn aggregate_ok(e: &Expr, schema: &DFSchema, facts: &Facts, source: &RemoteSource) -> bool {
    let e = match e {
        Expr::Alias(Alias { expr, name, .. }) if safe_name(name) => expr.as_ref(),
        other => other,
    };
    let Expr::AggregateFunction(AggregateFunction { func, params }) = e else {
        return false;
    };
    let name = func.name().to_ascii_lowercase();
    if params.filter.is_some() || !params.order_by.is_empty() || params.null_treatment.is_some() {
        return false;
    }
    let args_ok = params
        .args
        .iter()
        .all(|a| expr_ok(a, schema, facts, source));
    match name.as_str() {
        "count" => {
            args_ok
                && (!params.distinct
                    || params
                        .args
                        .iter()
                        .all(|a| text_ok(a, schema, facts, false) && !is_float(a, schema)))
        }
        "sum" => {
            let caps = source.capabilities();
            args_ok
                && !params.distinct
                && params.args.iter().all(|a| {
                    a.get_type(schema).is_ok_and(|t| {
                        t.is_numeric()
                            && (caps.sum_of_small_integers
                                || !matches!(
                                    t,
                                    DataType::Int8
                                        | DataType::Int16
                                        | DataType::Int32
                                        | DataType::UInt8
                                        | DataType::UInt16
                                        | DataType::UInt32
                                ))
                    })
                })
        }
        // Sources round a decimal average to a scale of their own (PostgreSQL gave 1.666667
        // where Basin gives 1.666666: Basin truncates) and T-SQL truncates integer averages:
        // averages of floats (DataFusion casts integers to double for AVG) are pushed, and
        // of decimals where the source's result is truncated as Basin's is.
        "avg" => {
            let caps = source.capabilities();
            args_ok
                && !params.distinct
                && params.args.iter().all(|a| {
                    a.get_type(schema).is_ok_and(|t| {
                        matches!(t, DataType::Float32 | DataType::Float64)
                            || (caps.decimal_avg && matches!(t, DataType::Decimal128(_, _)))
                    })
                })
        }
        "min" | "max" => {
            args_ok
                && !params.distinct
                && params
                    .args
                    .iter()
                    .all(|a| text_ok(a, schema, facts, true) && !is_float(a, schema))
        }
        _ => false,
    }
}

/// Replaces `plan` (which reads only `source`) by a remote query.
fn push(plan: &LogicalPlan, source: &Arc<RemoteSource>) -> Result<LogicalPlan> {
    if let Some(types) = plan
        .schema()
        .fields()
        .iter()
        .find(|f| !source.sql().readable(f.data_type()))
    {
        return Err(DataFusionError::NotImplemented(format!(
            "result type {} is not read from {}",
            types.data_type(),
            source.dialect.name()
        )));
    }
    // Plain scans (a projection of columns, a filter, one table) can be split.
    if let Some(replaced) = try_simple_scan(plan, source)? {
        return Ok(replaced);
    }
    let query = match plan {
        LogicalPlan::Limit(l) => render_limit(l, source)?,
        other if contains_limit_or_sort(other) => {
            // DataFusion 53's unparser loses table qualifiers above a derived LIMIT/ORDER BY
            // table; such subtrees are pushed in parts (the top-N on its own).
            return Err(DataFusionError::NotImplemented(
                "LIMIT or ORDER BY below the top of a pushed query".into(),
            ));
        }
        other => unparse(other, source)?,
    };
    let replaced = replacement(plan, query)?;
    // A pushed top-N: Basin sorts the N rows again, since order does not survive the exchange.
    if let LogicalPlan::Limit(l) = plan
        && let LogicalPlan::Sort(s) = l.input.as_ref()
        && let Ok(FetchType::Literal(fetch)) = l.get_fetch_type()
    {
        return Ok(LogicalPlan::Sort(Sort {
            expr: s.expr.clone(),
            input: Arc::new(replaced),
            fetch,
        }));
    }
    Ok(replaced)
}

fn try_simple_scan(plan: &LogicalPlan, source: &Arc<RemoteSource>) -> Result<Option<LogicalPlan>> {
    let (columns, rest): (Option<Vec<String>>, &LogicalPlan) = match plan {
        LogicalPlan::Projection(p) => {
            let mut names = vec![];
            for e in &p.expr {
                match e {
                    Expr::Column(c) => names.push(c.name.clone()),
                    _ => return Ok(None),
                }
            }
            (Some(names), p.input.as_ref())
        }
        other => (None, other),
    };
    let (predicate, rest) = match rest {
        LogicalPlan::Filter(f) => (Some(&f.predicate), f.input.as_ref()),
        other => (None, other),
    };
    let (alias, rest) = match rest {
        LogicalPlan::SubqueryAlias(a) => (Some(a.alias.table().to_string()), a.input.as_ref()),
        other => (None, other),
    };
    let LogicalPlan::TableScan(scan) = rest else {
        return Ok(None);
    };
    let Some(table) = remote_table(scan) else {
        return Ok(None);
    };
    if table.source.name != source.name {
        return Ok(None);
    }
    // A projection that renames or reorders onto the scan's columns: name by column.
    if let Some(names) = &columns
        && names.iter().any(|n| {
            scan.projected_schema
                .field_with_unqualified_name(n)
                .is_err()
        })
    {
        return Ok(None);
    }
    let rendered = match predicate {
        Some(p) => {
            let dialect = source.sql().unparser();
            let mut sql = Unparser::new(dialect.as_ref()).expr_to_sql(p)?;
            Some(prepare_expr(&mut sql)?.finish(source.sql())?)
        }
        None => None,
    };
    Ok(Some(push_scan(
        plan,
        &table,
        scan,
        alias,
        rendered.map(|r| (r, columns)),
    )?))
}

/// A scan of `table` (with an optional rendered predicate and the columns a projection above
/// it keeps) as the replacement of `plan`.
fn push_scan(
    plan: &LogicalPlan,
    table: &RemoteTable,
    scan: &TableScan,
    alias: Option<String>,
    filtered: Option<(String, Option<Vec<String>>)>,
) -> Result<LogicalPlan> {
    let (predicate, projected) = match filtered {
        Some((p, names)) => (Some(p), names),
        None => (None, None),
    };
    let names: Vec<String> = match (projected, plan) {
        (Some(n), _) => n,
        (None, LogicalPlan::Projection(p)) => p
            .expr
            .iter()
            .map(|e| match e {
                Expr::Column(c) => Ok(c.name.clone()),
                _ => Err(DataFusionError::Internal("not a plain projection".into())),
            })
            .collect::<Result<_>>()?,
        (None, _) => plan
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect(),
    };
    let limit = match plan {
        LogicalPlan::TableScan(_) => scan.fetch,
        _ => None,
    };
    let query = table.scan_query(&names, alias.as_deref(), predicate, limit);
    replacement(plan, query)
}

/// Asks the source to plan `sql` (EXPLAIN) without running it.
fn validate(source: &Arc<RemoteSource>, sql: &str) -> Result<()> {
    let src = source.clone();
    let statement = source.sql().explain(sql);
    source.call_blocking(async move { src.backend().check(&src, &statement).await })
}

fn contains_limit_or_sort(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::Limit(_) | LogicalPlan::Sort(_))
        || plan.inputs().into_iter().any(contains_limit_or_sort)
}

/// `LIMIT` (with the `ORDER BY` below it, a top-N) around the unparsed input.
fn render_limit(
    l: &datafusion::logical_expr::Limit,
    source: &Arc<RemoteSource>,
) -> Result<RemoteQuery> {
    let (sort, input) = match l.input.as_ref() {
        LogicalPlan::Sort(s) => (Some(s), s.input.as_ref()),
        other => (None, other),
    };
    if contains_limit_or_sort(input) {
        return Err(DataFusionError::NotImplemented("nested LIMIT".into()));
    }
    let (FetchType::Literal(fetch), datafusion::logical_expr::SkipType::Literal(skip)) =
        (l.get_fetch_type()?, l.get_skip_type()?)
    else {
        return Err(DataFusionError::NotImplemented(
            "LIMIT with an expression".into(),
        ));
    };
    let Some(fetch) = fetch else {
        return Err(DataFusionError::NotImplemented(
            "OFFSET without LIMIT".into(),
        ));
    };
    let d = source.sql();
    let mut query = match input {
        LogicalPlan::TableScan(scan) => {
            let table = remote_table(scan).ok_or_else(|| {
                DataFusionError::NotImplemented("not a table of this source".into())
            })?;
            let names: Vec<String> = scan
                .projected_schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            table.scan_query(&names, None, None, None)
        }
        other => unparse(other, source)?,
    };
    let mut order_by = vec![];
    if let Some(s) = sort {
        for e in &s.expr {
            let Expr::Column(c) = &e.expr else {
                return Err(DataFusionError::NotImplemented(
                    "ORDER BY an expression".into(),
                ));
            };
            let i = input.schema().index_of_column(c)?;
            order_by.push(d.order_item(&format!("c{i}"), e.asc, e.nulls_first));
        }
    }
    let sql = d.limit(&query.sql, &order_by, fetch, skip);
    query.sql = sql;
    query.split = None;
    Ok(query)
}

/// Unparses `plan` into one statement whose columns are named `c0..cN`.
fn unparse(plan: &LogicalPlan, source: &Arc<RemoteSource>) -> Result<RemoteQuery> {
    let aliased = match plan {
        LogicalPlan::Projection(p) => Projection::try_new(
            p.expr
                .iter()
                .enumerate()
                .map(|(i, e)| e.clone().unalias().alias(format!("c{i}")))
                .collect(),
            p.input.clone(),
        )?,
        other => Projection::try_new(
            other
                .schema()
                .columns()
                .into_iter()
                .enumerate()
                .map(|(i, c)| Expr::Column(c).alias(format!("c{i}")))
                .collect(),
            Arc::new(other.clone()),
        )?,
    };
    // Column-only projections inside the query only prune columns, which SQL does not need;
    // DataFusion 53's unparser turns them into derived tables and then loses the table
    // qualifiers above them.
    let input = Arc::unwrap_or_clone(aliased.input.clone())
        .transform_up(|p| match p {
            LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => {
                Ok(Transformed::yes(Arc::unwrap_or_clone(p.input)))
            }
            other => Ok(Transformed::no(other)),
        })?
        .data;
    let aliased = Projection::try_new(aliased.expr, Arc::new(input))?;
    let dialect = source.sql().unparser();
    let mut statement = Unparser::new(dialect.as_ref())
        .with_pretty(true)
        .plan_to_sql(&LogicalPlan::Projection(aliased))?;
    let sql = prepare(&mut statement, &source.name)?.finish(source.sql())?;
    // The unparser has gaps; a statement the source rejects is not pushed.
    validate(source, &sql)?;
    Ok(RemoteQuery {
        source: source.name.clone(),
        dialect: source.dialect,
        sql,
        split: None,
    })
}

/// A scan of the remote query, projected back to `plan`'s exact column names and qualifiers.
fn replacement(plan: &LogicalPlan, query: RemoteQuery) -> Result<LogicalPlan> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let schema = plan.schema();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| Field::new(format!("c{i}"), f.data_type().clone(), f.is_nullable()))
        .collect();
    let name = format!("remote_{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let table = RemoteQueryTable::new(query, Arc::new(Schema::new(fields)));
    let scan = LogicalPlanBuilder::scan(name.clone(), provider_as_source(Arc::new(table)), None)?
        .build()?;
    let exprs = schema
        .iter()
        .enumerate()
        .map(|(i, (q, f))| {
            Expr::Column(Column::new(Some(name.clone()), format!("c{i}")))
                .alias_qualified(q.cloned(), f.name())
        })
        .collect();
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(scan),
    )?))
}
