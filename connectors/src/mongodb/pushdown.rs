//! The MongoDB pushdown rule: the largest subtree over one collection that the server
//! answers exactly as Basin would becomes one aggregation pipeline.
//!
//! What is pushed, and the guards that keep it exact:
//! - filters → `$match` on top-level fields read as their own type. Comparisons of
//!   integers, decimals, strings (the server compares UTF-8 bytes, as Basin does), dates,
//!   booleans and ObjectIds (as 24-hex-digit strings); `<>` and `NOT IN` exclude missing and
//!   null fields as SQL does; `LIKE` as an anchored regular expression (patterns without
//!   `_`). Never on doubles (NaN and -0.0 compare otherwise), on text read as extended JSON
//!   (several types), or on structs and lists (the server's array matching differs);
//! - projections → `$project` (fields whose names are not paths: else whole documents);
//! - `GROUP BY` with `count`, `sum`, `min`, `max`, `avg` → `$group`: missing and null keys
//!   are one group, a `sum` of only NULLs is NULL, a global aggregate over nothing is one
//!   row; no `avg` of decimals (the server's scale differs), no `min`/`max` of doubles;
//! - `ORDER BY … LIMIT` → `$sort` + `$limit` (NULLs placed as Basin places them), and Basin
//!   sorts the N rows again; `LIMIT`/`OFFSET` → `$limit`/`$skip`.
//!
//! Whatever is not pushed runs in Basin: pushdown never makes a query fail.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bson::{Bson, Document, doc};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::error::Result;
use datafusion::logical_expr::expr::{AggregateFunction, Like};
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    BinaryExpr, Expr, FetchType, Filter, LogicalPlan, LogicalPlanBuilder, Operator, Projection,
    SkipType, Sort, TableScan,
};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use super::catalog::{MongoTable, projection};
use super::exec::{MongoQuery, MongoQueryTable, encode_pipeline};
use super::safe_field;
use super::schema::Repr;

/// Basin's MongoDB pushdown rule (runs after DataFusion's own logical optimizations).
#[derive(Debug, Default)]
pub struct MongoPushdown;

impl OptimizerRule for MongoPushdown {
    fn name(&self) -> &str {
        "basin_mongodb_pushdown"
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

fn mongo_table(scan: &TableScan) -> Option<MongoTable> {
    let provider = source_as_provider(&scan.source).ok()?;
    provider.as_any().downcast_ref::<MongoTable>().cloned()
}

/// One column of what a pipeline produces at some stage.
#[derive(Debug, Clone)]
struct Col {
    /// The top-level field of the documents at this stage.
    field: String,
    data_type: DataType,
    repr: Repr,
    /// May be named in `$match`, `$group` and `$sort` (`$field`): a safe name, read as
    /// its own type (not text of several types, not a struct or list).
    pushable: bool,
}

/// A pipeline being built for a plan subtree.
#[derive(Debug, Clone)]
struct Pipe {
    table: MongoTable,
    stages: Vec<Document>,
    cols: Vec<Col>,
    grouped: bool,
    /// A sort, limit or group is in the pipeline: it cannot be split.
    shaped: bool,
    empty_row: Option<Vec<bool>>,
}

fn rewrite(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    if let Some(pipe) = translate(&plan) {
        return Ok(Transformed::yes(replacement(&plan, pipe)?));
    }
    // A filter whose predicate is only partly pushable: push the pushable conjuncts.
    if let LogicalPlan::Filter(f) = &plan
        && let Some(mut pipe) = translate(&f.input)
        && pipe.empty_row.is_none()
    {
        let schema = f.input.schema();
        let (yes, no): (Vec<&Expr>, Vec<Document>) = (vec![], vec![]);
        let (mut yes, mut rest, mut matches) = (yes, vec![], no);
        for e in split_conjunction(&f.predicate) {
            match predicate(e, schema, &pipe.cols) {
                Some(m) => {
                    yes.push(e);
                    matches.push(m);
                }
                None => rest.push(e.clone()),
            }
        }
        if !yes.is_empty() {
            pipe.stages.push(doc! { "$match": and(matches) });
            let pushed = replacement(&f.input, pipe)?;
            let rest =
                conjunction(rest).unwrap_or(Expr::Literal(ScalarValue::Boolean(Some(true)), None));
            return Ok(Transformed::yes(LogicalPlan::Filter(Filter::try_new(
                rest,
                Arc::new(pushed),
            )?)));
        }
    }
    plan.map_children(rewrite)?
        .transform_data(|p| p.map_subqueries(rewrite))
}

fn and(mut matches: Vec<Document>) -> Document {
    if matches.len() == 1 {
        matches.remove(0)
    } else {
        doc! { "$and": matches }
    }
}

/// `$or` of `parts`; equalities of one field as `$in` (which an index answers in one scan).
fn or(parts: Vec<Document>) -> Document {
    let equality = |d: &Document| -> Option<(String, Bson)> {
        let (field, test) = d.iter().next().filter(|_| d.len() == 1)?;
        let test = test.as_document().filter(|t| t.len() == 1)?;
        Some((field.to_string(), test.get("$eq")?.clone()))
    };
    let equalities: Option<Vec<(String, Bson)>> = parts.iter().map(equality).collect();
    if let Some(eqs) = equalities
        && let Some((first, _)) = eqs.first()
        && eqs.iter().all(|(f, _)| f == first)
    {
        let field = first.clone();
        let values: Vec<Bson> = eqs.into_iter().map(|(_, v)| v).collect();
        return doc! { field: { "$in": values } };
    }
    doc! { "$or": parts }
}

/// The pipeline that computes `plan`, if all of it can be pushed exactly.
fn translate(plan: &LogicalPlan) -> Option<Pipe> {
    let pipe = match plan {
        LogicalPlan::TableScan(scan) => {
            let table = mongo_table(scan)?;
            if !scan.filters.is_empty() {
                return None;
            }
            let indexes: Vec<usize> = match &scan.projection {
                Some(p) => p.clone(),
                None => (0..table.columns.len()).collect(),
            };
            let cols = indexes
                .iter()
                .map(|&i| {
                    let c = &table.columns[i];
                    Col {
                        field: c.name.clone(),
                        data_type: c.data_type.clone(),
                        repr: c.repr,
                        pushable: safe_field(&c.name)
                            && c.repr != Repr::Json
                            && !matches!(c.data_type, DataType::Struct(_) | DataType::List(_)),
                    }
                })
                .collect();
            let mut pipe = Pipe {
                table,
                stages: vec![],
                cols,
                grouped: false,
                shaped: false,
                empty_row: None,
            };
            if let Some(n) = scan.fetch {
                pipe.stages.push(doc! { "$limit": n as i64 });
                pipe.shaped = true;
            }
            pipe
        }
        LogicalPlan::SubqueryAlias(a) => translate(&a.input)?,
        LogicalPlan::Filter(f) => {
            let mut pipe = translate(&f.input)?;
            if pipe.empty_row.is_some() {
                return None;
            }
            let m = predicate(&f.predicate, f.input.schema(), &pipe.cols)?;
            pipe.stages.push(doc! { "$match": m });
            pipe
        }
        LogicalPlan::Projection(p) => {
            let mut pipe = translate(&p.input)?;
            let schema = p.input.schema();
            pipe.cols = p
                .expr
                .iter()
                .map(|e| match e.clone().unalias() {
                    Expr::Column(c) => schema
                        .index_of_column(&c)
                        .ok()
                        .map(|i| pipe.cols[i].clone()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            pipe
        }
        LogicalPlan::Aggregate(a) => aggregate(a)?,
        LogicalPlan::Limit(l) => {
            let (Ok(FetchType::Literal(fetch)), Ok(SkipType::Literal(skip))) =
                (l.get_fetch_type(), l.get_skip_type())
            else {
                return None;
            };
            let mut pipe = match l.input.as_ref() {
                LogicalPlan::Sort(s) => {
                    let mut pipe = translate(&s.input)?;
                    sort(s, &mut pipe)?;
                    pipe
                }
                other => translate(other)?,
            };
            if pipe.empty_row.is_some() {
                return None;
            }
            if skip > 0 {
                pipe.stages.push(doc! { "$skip": skip as i64 });
            }
            if let Some(fetch) = fetch {
                pipe.stages.push(doc! { "$limit": fetch as i64 });
            } else if matches!(l.input.as_ref(), LogicalPlan::Sort(_)) {
                return None;
            }
            pipe.shaped = true;
            pipe
        }
        _ => return None,
    };
    // Every column must be one Basin reads from documents.
    plan.schema()
        .fields()
        .iter()
        .all(|f| readable(f.data_type()))
        .then_some(pipe)
}

fn readable(t: &DataType) -> bool {
    match t {
        DataType::Int32
        | DataType::Int64
        | DataType::Float64
        | DataType::Boolean
        | DataType::Utf8
        | DataType::Decimal128(_, _)
        | DataType::Date32
        | DataType::Timestamp(TimeUnit::Millisecond, _)
        | DataType::Binary => true,
        DataType::Struct(fields) => fields.iter().all(|f| readable(f.data_type())),
        DataType::List(f) => readable(f.data_type()),
        _ => false,
    }
}

/// The column an expression reads, looking through casts that keep every value (integer
/// widening).
fn column<'a>(e: &Expr, schema: &DFSchema, cols: &'a [Col]) -> Option<&'a Col> {
    match e {
        Expr::Column(c) => schema.index_of_column(c).ok().map(|i| &cols[i]),
        Expr::Cast(c) if c.data_type == DataType::Int64 => {
            let col = column(&c.expr, schema, cols)?;
            (col.data_type == DataType::Int32).then_some(col)
        }
        _ => None,
    }
}

/// Types compared and ordered by the server as by Basin.
fn comparable(c: &Col) -> bool {
    c.pushable
        && matches!(
            c.data_type,
            DataType::Int32
                | DataType::Int64
                | DataType::Utf8
                | DataType::Decimal128(_, _)
                | DataType::Date32
                | DataType::Timestamp(TimeUnit::Millisecond, _)
                | DataType::Boolean
        )
}

/// `value` as the BSON value the server compares a field of column `c` with.
fn literal(value: &ScalarValue, c: &Col) -> Option<Bson> {
    if value.is_null() {
        return None;
    }
    let int = || -> Option<i64> {
        match value {
            ScalarValue::Int8(Some(v)) => Some(i64::from(*v)),
            ScalarValue::Int16(Some(v)) => Some(i64::from(*v)),
            ScalarValue::Int32(Some(v)) => Some(i64::from(*v)),
            ScalarValue::Int64(Some(v)) => Some(*v),
            ScalarValue::UInt8(Some(v)) => Some(i64::from(*v)),
            ScalarValue::UInt16(Some(v)) => Some(i64::from(*v)),
            ScalarValue::UInt32(Some(v)) => Some(i64::from(*v)),
            ScalarValue::UInt64(Some(v)) => i64::try_from(*v).ok(),
            _ => None,
        }
    };
    match (&c.data_type, c.repr) {
        (DataType::Int32 | DataType::Int64, _) => int().map(Bson::Int64),
        (DataType::Utf8, Repr::Plain) => match value {
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)) => Some(Bson::String(s.clone())),
            _ => None,
        },
        (DataType::Utf8, Repr::ObjectId) => match value {
            // Only the text Basin shows for an ObjectId can equal one.
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s))
                if s.len() == 24 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
            {
                bson::oid::ObjectId::parse_str(s).ok().map(Bson::ObjectId)
            }
            _ => None,
        },
        (DataType::Decimal128(_, _), _) => match value {
            ScalarValue::Decimal128(Some(v), _, s) => {
                let text = decimal_text(*v, *s);
                bson::Decimal128::from_str(&text).ok().map(Bson::Decimal128)
            }
            _ => int().map(Bson::Int64),
        },
        (DataType::Date32, _) => match value {
            ScalarValue::Date32(Some(d)) => Some(Bson::DateTime(bson::DateTime::from_millis(
                i64::from(*d) * 86_400_000,
            ))),
            _ => None,
        },
        (DataType::Timestamp(TimeUnit::Millisecond, _), _) => {
            let ms = match value {
                ScalarValue::TimestampMillisecond(Some(v), _) => Some(*v),
                ScalarValue::TimestampSecond(Some(v), _) => v.checked_mul(1000),
                ScalarValue::TimestampMicrosecond(Some(v), _) if v % 1000 == 0 => Some(v / 1000),
                ScalarValue::TimestampNanosecond(Some(v), _) if v % 1_000_000 == 0 => {
                    Some(v / 1_000_000)
                }
                _ => None,
            }?;
            Some(Bson::DateTime(bson::DateTime::from_millis(ms)))
        }
        (DataType::Boolean, _) => match value {
            ScalarValue::Boolean(Some(b)) => Some(Bson::Boolean(*b)),
            _ => None,
        },
        _ => None,
    }
}

fn decimal_text(v: i128, scale: i8) -> String {
    if scale == 0 {
        return v.to_string();
    }
    if scale < 0 {
        return format!("{v}E+{}", -i32::from(scale));
    }
    let negative = v < 0;
    let digits = v.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{}{int}.{frac}", if negative { "-" } else { "" })
}

/// A filter as a `$match` document, if the server decides it exactly as Basin would.
fn predicate(e: &Expr, schema: &DFSchema, cols: &[Col]) -> Option<Document> {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And => {
                let parts = split_conjunction(e)
                    .into_iter()
                    .map(|p| predicate(p, schema, cols))
                    .collect::<Option<Vec<_>>>()?;
                Some(and(parts))
            }
            Operator::Or => {
                let parts = datafusion::logical_expr::utils::split_binary(e, Operator::Or)
                    .into_iter()
                    .map(|p| predicate(p, schema, cols))
                    .collect::<Option<Vec<_>>>()?;
                Some(or(parts))
            }
            Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq => {
                let (c, value, op) = match (left.as_ref(), right.as_ref()) {
                    (l, Expr::Literal(v, _)) => (column(l, schema, cols)?, v, *op),
                    (Expr::Literal(v, _), r) => (column(r, schema, cols)?, v, op.swap()?),
                    _ => return None,
                };
                if !comparable(c) {
                    return None;
                }
                let v = literal(value, c)?;
                let test = match op {
                    Operator::Eq => doc! { "$eq": v },
                    // SQL's `<>` is unknown for NULL: missing and null fields do not pass.
                    Operator::NotEq => doc! { "$nin": [v, Bson::Null] },
                    Operator::Lt => doc! { "$lt": v },
                    Operator::LtEq => doc! { "$lte": v },
                    Operator::Gt => doc! { "$gt": v },
                    Operator::GtEq => doc! { "$gte": v },
                    _ => return None,
                };
                Some(doc! { c.field.clone(): test })
            }
            _ => None,
        },
        Expr::IsNull(inner) => {
            let c = column(inner, schema, cols)?;
            c.pushable
                .then(|| doc! { c.field.clone(): { "$eq": Bson::Null } })
        }
        Expr::IsNotNull(inner) => {
            let c = column(inner, schema, cols)?;
            c.pushable
                .then(|| doc! { c.field.clone(): { "$ne": Bson::Null } })
        }
        Expr::InList(list) => {
            let c = column(&list.expr, schema, cols)?;
            if !comparable(c) || list.list.is_empty() {
                return None;
            }
            let mut values = list
                .list
                .iter()
                .map(|e| match e {
                    Expr::Literal(v, _) => literal(v, c),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            if list.negated {
                values.push(Bson::Null);
                Some(doc! { c.field.clone(): { "$nin": values } })
            } else {
                Some(doc! { c.field.clone(): { "$in": values } })
            }
        }
        Expr::Like(Like {
            negated: false,
            expr,
            pattern,
            escape_char: None,
            case_insensitive: false,
        }) => {
            let c = column(expr, schema, cols)?;
            if !(c.pushable && c.data_type == DataType::Utf8 && c.repr == Repr::Plain) {
                return None;
            }
            let Expr::Literal(ScalarValue::Utf8(Some(p)) | ScalarValue::Utf8View(Some(p)), _) =
                pattern.as_ref()
            else {
                return None;
            };
            let regex = bson::Regex {
                pattern: like_regex(p)?.try_into().ok()?,
                options: "s".try_into().ok()?,
            };
            Some(doc! { c.field.clone(): Bson::RegularExpression(regex) })
        }
        Expr::Column(_) => {
            let c = column(e, schema, cols)?;
            (c.pushable && c.data_type == DataType::Boolean)
                .then(|| doc! { c.field.clone(): { "$eq": true } })
        }
        Expr::Not(inner) if matches!(inner.as_ref(), Expr::Column(_)) => {
            let c = column(inner, schema, cols)?;
            (c.pushable && c.data_type == DataType::Boolean)
                .then(|| doc! { c.field.clone(): { "$eq": false } })
        }
        _ => None,
    }
}

/// A LIKE pattern as an anchored regular expression matching the same strings: `%` is
/// `.*` (with `s`, across newlines), every other character literal. Patterns with `_` (one
/// character: the server's regex engine may count bytes) or `\` are not pushed.
fn like_regex(pattern: &str) -> Option<String> {
    if pattern.contains(['_', '\\', '\0']) {
        return None;
    }
    let mut regex = String::from("^");
    for ch in pattern.chars() {
        match ch {
            '%' => regex.push_str(".*"),
            c if c.is_ascii_alphanumeric() || !c.is_ascii() => regex.push(c),
            c => {
                regex.push('\\');
                regex.push(c);
            }
        }
    }
    if !pattern.ends_with('%') {
        // `$` would also match before a final newline.
        regex.push_str("\\z");
    }
    Some(regex)
}

/// Adds the `$sort` of `s` to `pipe`, placing NULLs as `s` asks (the server puts missing
/// and null values first in ascending order).
fn sort(s: &Sort, pipe: &mut Pipe) -> Option<()> {
    if pipe.empty_row.is_some() {
        return None;
    }
    let schema = s.input.schema();
    let mut flags = Document::new();
    let mut order = Document::new();
    for (i, e) in s.expr.iter().enumerate() {
        let c = column(&e.expr, schema, &pipe.cols)?;
        if !comparable(c) {
            return None;
        }
        let direction = if e.asc { 1 } else { -1 };
        if e.asc != e.nulls_first {
            // NULLs after the values ascending (or before them descending): sort by a
            // "is null" flag first.
            let flag = format!("__basin_null_{i}");
            flags.insert(
                flag.clone(),
                doc! { "$eq": [{ "$ifNull": [format!("${}", c.field), Bson::Null] }, Bson::Null] },
            );
            order.insert(flag, direction);
        }
        order.insert(c.field.clone(), direction);
    }
    if !flags.is_empty() {
        pipe.stages.push(doc! { "$addFields": flags });
    }
    pipe.stages.push(doc! { "$sort": order });
    pipe.shaped = true;
    Some(())
}

/// `GROUP BY` and its aggregates as `$group`, then `$project` to columns `c0..cN`.
fn aggregate(a: &datafusion::logical_expr::Aggregate) -> Option<Pipe> {
    let mut pipe = translate(&a.input)?;
    if pipe.empty_row.is_some() {
        return None;
    }
    let schema = a.input.schema();
    let out = a.schema.fields();
    let groupable = |c: &Col| comparable(c);
    let mut id = Document::new();
    let mut group = Document::new();
    let mut project = doc! { "_id": 0 };
    let mut cols = vec![];
    let mut counts = vec![];
    for (i, e) in a.group_expr.iter().enumerate() {
        let e = e.clone().unalias();
        let c = column(&e, schema, &pipe.cols)?;
        if !groupable(c) || !matches!(e, Expr::Column(_)) {
            return None;
        }
        // Missing and null are one group, as NULL is in SQL.
        id.insert(
            format!("k{i}"),
            doc! { "$ifNull": [format!("${}", c.field), Bson::Null] },
        );
        project.insert(format!("c{i}"), format!("$_id.k{i}"));
        cols.push(Col {
            field: format!("c{i}"),
            data_type: c.data_type.clone(),
            repr: c.repr,
            pushable: true,
        });
        counts.push(false);
    }
    let n_keys = a.group_expr.len();
    for (j, e) in a.aggr_expr.iter().enumerate() {
        let i = n_keys + j;
        let Expr::AggregateFunction(AggregateFunction { func, params }) = e.clone().unalias()
        else {
            return None;
        };
        if params.distinct || params.filter.is_some() || !params.order_by.is_empty() {
            return None;
        }
        let name = func.name().to_ascii_lowercase();
        let arg = match params.args.as_slice() {
            [] => None,
            [Expr::Literal(v, _)] if name == "count" && !v.is_null() => None,
            // `avg` of integers: Basin casts them to doubles first, the server's `$avg` does
            // the same.
            [Expr::Cast(c)] if name == "avg" && c.data_type == DataType::Float64 => {
                let col = column(&c.expr, schema, &pipe.cols)?;
                matches!(col.data_type, DataType::Int32 | DataType::Int64).then(|| col.clone())
            }
            [e] => Some(column(e, schema, &pipe.cols)?.clone()),
            _ => return None,
        };
        let result_type = out.get(i)?.data_type().clone();
        let path = arg.as_ref().map(|c| format!("${}", c.field));
        let not_null = |p: &str| doc! { "$cond": [{ "$eq": [{ "$ifNull": [p, Bson::Null] }, Bson::Null] }, 0, 1] };
        let key = format!("a{j}");
        let value: Bson = match (name.as_str(), &arg, &path) {
            ("count", None, _) => {
                group.insert(key.clone(), doc! { "$sum": 1 });
                Bson::String(format!("${key}"))
            }
            ("count", Some(c), Some(p)) if c.pushable => {
                group.insert(key.clone(), doc! { "$sum": not_null(p) });
                Bson::String(format!("${key}"))
            }
            ("sum", Some(c), Some(p))
                if c.pushable
                    && matches!(
                        c.data_type,
                        DataType::Int32
                            | DataType::Int64
                            | DataType::Float64
                            | DataType::Decimal128(_, _)
                    ) =>
            {
                // The server's sum of no values is 0, SQL's is NULL: the smallest value (the
                // server's `$min` skips nulls, as SQL's does) is NULL exactly then, and costs
                // the server less than counting the values.
                group.insert(key.clone(), doc! { "$sum": p.clone() });
                group.insert(format!("m{j}"), doc! { "$min": p.clone() });
                Bson::Document(
                    doc! { "$cond": [{ "$eq": [format!("$m{j}"), Bson::Null] }, Bson::Null, format!("${key}")] },
                )
            }
            ("avg", Some(c), Some(p))
                if c.pushable
                    && matches!(
                        c.data_type,
                        DataType::Int32 | DataType::Int64 | DataType::Float64
                    )
                    && result_type == DataType::Float64 =>
            {
                group.insert(key.clone(), doc! { "$avg": p.clone() });
                Bson::String(format!("${key}"))
            }
            ("min" | "max", Some(c), Some(p)) if comparable(c) => {
                group.insert(key.clone(), doc! { format!("${name}"): p.clone() });
                Bson::String(format!("${key}"))
            }
            _ => return None,
        };
        project.insert(format!("c{i}"), value);
        let repr = match (&arg, name.as_str()) {
            (Some(c), "min" | "max") => c.repr,
            _ => Repr::Plain,
        };
        cols.push(Col {
            field: format!("c{i}"),
            data_type: result_type,
            repr,
            pushable: true,
        });
        counts.push(name == "count");
    }
    let id = if id.is_empty() {
        Bson::Null
    } else {
        Bson::Document(id)
    };
    let mut stage = doc! { "_id": id };
    stage.extend(group);
    pipe.stages.push(doc! { "$group": stage });
    pipe.stages.push(doc! { "$project": project });
    pipe.cols = cols;
    pipe.grouped = true;
    pipe.shaped = true;
    if n_keys == 0 {
        pipe.empty_row = Some(counts);
    }
    Some(pipe)
}

/// The plan's replacement: a scan of the pipeline's result, under a projection that gives
/// the columns their names back (and, for a top-N, Basin's own sort of the N rows).
fn replacement(plan: &LogicalPlan, mut pipe: Pipe) -> Result<LogicalPlan> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let fields: Vec<String> = pipe.cols.iter().map(|c| c.field.clone()).collect();
    if !pipe.grouped
        && let Some(project) = projection(&fields)
    {
        pipe.stages.push(doc! { "$project": project });
    }
    let query = MongoQuery {
        source: pipe.table.source.name.clone(),
        database: pipe.table.database.clone(),
        collection: pipe.table.collection.clone(),
        pipeline: encode_pipeline(&pipe.stages),
        fields,
        reprs: pipe.cols.iter().map(|c| c.repr).collect(),
        splittable: !pipe.shaped,
        empty_row: pipe.empty_row.clone(),
    };
    let schema = plan.schema();
    let arrow: Vec<Field> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| Field::new(format!("c{i}"), f.data_type().clone(), true))
        .collect();
    let name = format!("mongodb_{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let table = MongoQueryTable::new(query, Arc::new(Schema::new(arrow)));
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
    let replaced = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(scan))?);
    // A pushed top-N: Basin sorts the N rows again, since order does not survive the
    // exchange.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_patterns_become_anchored_literal_regexes() {
        assert_eq!(like_regex("item 1%").as_deref(), Some("^item\\ 1.*"));
        assert_eq!(like_regex("a.b$").as_deref(), Some("^a\\.b\\$\\z"));
        assert_eq!(like_regex("%ü(%").as_deref(), Some("^.*ü\\(.*"));
        assert_eq!(like_regex("a_b"), None);
    }

    #[test]
    fn decimal_literals_keep_their_digits() {
        assert_eq!(decimal_text(12345, 2), "123.45");
        assert_eq!(decimal_text(-5, 3), "-0.005");
        assert_eq!(decimal_text(7, 0), "7");
        assert_eq!(decimal_text(7, -2), "7E+2");
    }
}
