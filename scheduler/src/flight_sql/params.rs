//! Parameters of Flight SQL statements: JDBC's `?` and DataFusion's `$1`, `$2`, …
//!
//! JDBC, and so most BI tools, writes every parameter as `?`; ADBC clients send what the
//! user wrote. DataFusion numbers its placeholders `$1, $2, …`: a `?` reaches its planner as
//! a placeholder named `?`, which no value can be bound to ("Failed to parse placeholder
//! id"). Basin numbers the `?` of the parsed statement in the order they stand in the text,
//! so a `?` inside a string literal, a quoted identifier or a comment is not a parameter, and
//! a `?` in a subquery, a CTE, an IN list or LIMIT/OFFSET counts where it stands.
//! `?` and `$n` in one statement is an error: which value goes where would be a guess.
//!
//! Values are bound to the planned statement as literals (`LogicalPlan::with_param_values`),
//! never spliced into SQL text: a value is data, whatever characters it holds.
//!
//! Types: DataFusion infers a parameter's type from where it stands (`o_orderkey < ?` is
//! Int64, `INSERT … VALUES (?)` the column's; LIMIT and OFFSET take Int64 here). A bound value
//! is cast to that type: a Python `Decimal('1.50')` arrives as decimal(3,2), the column is
//! decimal(15,2). A parameter nothing fixes (`SELECT ?`) takes its value's type and is
//! reported to clients as Arrow `Null`, ADBC's "unknown".

use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{ParamValues, ScalarValue};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr::Placeholder;
use datafusion::logical_expr::{Expr, Limit, LogicalPlan};
use datafusion::sql::parser::{CopyToSource, Statement};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, Value, ValueWithSpan, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::tokenizer::Location;

/// Numbers the `?` parameters of `statement` `$1, $2, …` in the order they appear in its
/// text (SQLite's `?3` becomes `$3`). Fails when `?` and `$n` (or `$name`) are mixed, or
/// when a `?` stands where only a value, not an expression, may.
pub fn number_placeholders(statement: &mut Statement) -> Result<()> {
    let mut found = Numbering::default();
    if let ControlFlow::Break(e) = walk(statement, &mut found) {
        return Err(e);
    }
    if found.positions.is_empty() {
        if found.numbered.is_empty() {
            return Ok(());
        }
        // `?3` still needs its `$`.
    } else if let Some(other) = found.numbered.first() {
        return Err(DataFusionError::Plan(format!(
            "the statement mixes `?` parameters with `{other}`: write every parameter as `?`, \
             or every one as `$1`, `$2`, …"
        )));
    }
    // Visit order follows the AST's fields, which is not always the text's (`OFFSET ?
    // LIMIT ?`): order by position, unless a placeholder has none.
    let mut order: Vec<usize> = (0..found.positions.len()).collect();
    if found.positions.iter().all(|at| at.line > 0) {
        order.sort_by_key(|&i| (found.positions[i].line, found.positions[i].column));
    }
    let mut numbers = vec![0; order.len()];
    for (number, visited) in order.into_iter().enumerate() {
        numbers[visited] = number + 1;
    }
    let mut rename = Numbering {
        numbers: Some(numbers),
        ..Numbering::default()
    };
    match walk(statement, &mut rename) {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(()),
    }
}

/// Visits every SQL expression of a DataFusion statement.
fn walk<V: VisitorMut>(statement: &mut Statement, visitor: &mut V) -> ControlFlow<V::Break> {
    match statement {
        Statement::Statement(s) => s.visit(visitor),
        Statement::Explain(e) => walk(&mut e.statement, visitor),
        Statement::CopyTo(copy) => match &mut copy.source {
            CopyToSource::Query(query) => query.visit(visitor),
            CopyToSource::Relation(_) => ControlFlow::Continue(()),
        },
        Statement::CreateExternalTable(_) | Statement::Reset(_) => ControlFlow::Continue(()),
    }
}

/// First pass (`numbers` is `None`): where the `?` are, and which other placeholders there
/// are. Second pass: renames the `?` to their numbers.
#[derive(Default)]
struct Numbering {
    positions: Vec<Location>,
    numbered: Vec<String>,
    numbers: Option<Vec<usize>>,
    next: usize,
}

impl VisitorMut for Numbering {
    type Break = DataFusionError;

    fn pre_visit_expr(&mut self, expr: &mut SqlExpr) -> ControlFlow<Self::Break> {
        let SqlExpr::Value(ValueWithSpan {
            value: Value::Placeholder(name),
            span,
        }) = expr
        else {
            return ControlFlow::Continue(());
        };
        match &self.numbers {
            None if name == "?" => self.positions.push(span.start),
            None => self.numbered.push(name.clone()),
            Some(numbers) if name == "?" => {
                let Some(number) = numbers.get(self.next) else {
                    return ControlFlow::Break(DataFusionError::Internal(
                        "the statement changed between numbering its parameters".to_string(),
                    ));
                };
                *name = format!("${number}");
                self.next += 1;
            }
            Some(_) => {
                if let Some(digits) = name.strip_prefix('?') {
                    *name = format!("${digits}");
                }
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_value(&mut self, value: &mut Value) -> ControlFlow<Self::Break> {
        // Placeholders of expressions are renamed before their value is visited: a `?` left
        // here stands outside an expression, where DataFusion cannot bind it.
        match value {
            Value::Placeholder(name) if self.numbers.is_some() && name.starts_with('?') => {
                ControlFlow::Break(DataFusionError::Plan(format!(
                    "a `{name}` parameter cannot stand here; parameters may replace values \
                     in expressions"
                )))
            }
            _ => ControlFlow::Continue(()),
        }
    }
}

/// The parameters of a planned statement: `$1` … `$n` with the types DataFusion inferred.
#[derive(Debug, PartialEq)]
pub struct Parameters {
    types: Vec<Option<DataType>>,
    /// Placeholders that are not numbered (`$name`).
    named: Vec<String>,
}

impl Parameters {
    pub fn of(plan: &LogicalPlan) -> Result<Self> {
        let mut types: Vec<Option<DataType>> = vec![];
        let mut named = vec![];
        for (id, data_type) in plan.get_parameter_types()? {
            let Some(at) = position(&id) else {
                named.push(id);
                continue;
            };
            if types.len() <= at {
                types.resize(at + 1, None);
            }
            // `$1 - $2` types both as Null: nothing is known.
            types[at] = data_type.filter(|t| !t.is_null());
        }
        // Row counts, which DataFusion leaves untyped.
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::Limit(Limit { skip, fetch, .. }) = node {
                for expr in [skip, fetch].into_iter().flatten() {
                    if let Expr::Placeholder(Placeholder { id, field: None }) = expr.as_ref()
                        && let Some(slot) = position(id).and_then(|at| types.get_mut(at))
                    {
                        slot.get_or_insert(DataType::Int64);
                    }
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        named.sort();
        Ok(Self { types, named })
    }

    /// The parameter schema clients get with a prepared statement (ADBC's
    /// `get_parameter_schema`, JDBC's `getParameterMetaData`): one nullable field per
    /// parameter, `Null` where the type is not known, plain strings for string views (as
    /// results have them: clients bind what they know).
    pub fn schema(&self) -> SchemaRef {
        let fields = self.types.iter().enumerate().map(|(i, t)| {
            let t = t.clone().unwrap_or(DataType::Null);
            let t = basin_connectors::views::plain_type(&t).unwrap_or(t);
            Field::new(format!("${}", i + 1), t, true)
        });
        Arc::new(Schema::new(fields.collect::<Vec<_>>()))
    }

    /// `plan` with `values` in place of its parameters, each cast to its parameter's type.
    pub fn bind(&self, plan: LogicalPlan, values: Vec<ScalarValue>) -> Result<LogicalPlan> {
        if let Some(name) = self.named.first() {
            return Err(DataFusionError::Plan(format!(
                "parameter `{name}` is named, but Flight SQL binds parameters by position: \
                 write `?` or `$1`, `$2`, …"
            )));
        }
        if values.len() != self.types.len() {
            return Err(DataFusionError::Plan(format!(
                "the statement has {} but {} bound: bind one value per `?` (or per `$n`)",
                count(self.types.len(), "parameter", "parameters"),
                count(values.len(), "value was", "values were"),
            )));
        }
        if values.is_empty() {
            return Ok(plan);
        }
        let values = values
            .into_iter()
            .zip(&self.types)
            .enumerate()
            .map(|(i, (value, wanted))| match wanted {
                Some(wanted) if value.data_type() != *wanted => {
                    value.cast_to(wanted).map_err(|e| {
                        DataFusionError::Plan(format!(
                            "parameter {} takes {wanted}; the {} value bound to it does not \
                             convert: {e}",
                            i + 1,
                            value.data_type()
                        ))
                    })
                }
                _ => Ok(value),
            })
            .collect::<Result<Vec<_>>>()?;
        plan.with_param_values(ParamValues::from(values))
    }
}

/// `$3` is parameter 2 (from 0).
fn position(id: &str) -> Option<usize> {
    id.strip_prefix('$')?.parse::<usize>().ok()?.checked_sub(1)
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The parameter values of one execution, by position.
pub type Values = Vec<ScalarValue>;

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    fn types(params: &Parameters) -> Vec<DataType> {
        let schema = params.schema();
        schema
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect()
    }

    /// The placeholders left in a plan.
    fn ids(plan: &LogicalPlan) -> Vec<String> {
        let mut ids: Vec<_> = plan.get_parameter_types().unwrap().into_keys().collect();
        ids.sort();
        ids
    }

    fn numbered(sql: &str) -> Result<String> {
        let mut statement = crate::sql::parse_one(sql)?;
        number_placeholders(&mut statement)?;
        Ok(statement.to_string())
    }

    #[test]
    fn question_marks_are_numbered_in_the_order_of_the_text() {
        assert_eq!(
            numbered("SELECT a FROM t WHERE a < ? AND b = ?").unwrap(),
            "SELECT a FROM t WHERE a < $1 AND b = $2"
        );
        // Subqueries, CTEs, IN lists, CASE, LIMIT and OFFSET.
        assert_eq!(
            numbered(
                "WITH c AS (SELECT x FROM u WHERE y = ?) SELECT CASE WHEN a > ? THEN ? ELSE 0 END \
                 FROM t WHERE a IN (?, ?) AND b IN (SELECT x FROM c WHERE x <> ?) LIMIT ? OFFSET ?"
            )
            .unwrap(),
            "WITH c AS (SELECT x FROM u WHERE y = $1) SELECT CASE WHEN a > $2 THEN $3 ELSE 0 END \
             FROM t WHERE a IN ($4, $5) AND b IN (SELECT x FROM c WHERE x <> $6) LIMIT $7 OFFSET $8"
        );
        assert_eq!(
            numbered("INSERT INTO t VALUES (?, ?), (?, 'x')").unwrap(),
            "INSERT INTO t VALUES ($1, $2), ($3, 'x')"
        );
        assert_eq!(
            numbered("EXPLAIN SELECT * FROM t WHERE a = ?").unwrap(),
            "EXPLAIN SELECT * FROM t WHERE a = $1"
        );
        // By the text, not by the AST: OFFSET comes after LIMIT there.
        assert_eq!(
            numbered("SELECT a FROM t OFFSET ? LIMIT ?").unwrap(),
            "SELECT a FROM t LIMIT $2 OFFSET $1"
        );
        // Several lines: by line, then column.
        assert_eq!(
            numbered("SELECT ?,\n  ? FROM t\nWHERE a = ?").unwrap(),
            "SELECT $1, $2 FROM t WHERE a = $3"
        );
    }

    #[test]
    fn question_marks_in_strings_identifiers_and_comments_are_not_parameters() {
        assert_eq!(
            numbered(
                "SELECT '?', \"a?b\", 'it''s ?' FROM \"t?\" -- what?\nWHERE c = ? /* ? */ AND d = ?"
            )
            .unwrap(),
            "SELECT '?', \"a?b\", 'it''s ?' FROM \"t?\" WHERE c = $1 AND d = $2"
        );
        assert_eq!(
            numbered("SELECT 'a' || ? || '?'").unwrap(),
            "SELECT 'a' || $1 || '?'"
        );
    }

    #[test]
    fn dollar_parameters_stay_and_mixing_is_an_error() {
        assert_eq!(
            numbered("SELECT * FROM t WHERE a = $2 AND b = $1").unwrap(),
            "SELECT * FROM t WHERE a = $2 AND b = $1"
        );
        assert_eq!(numbered("SELECT ?2, ?1").unwrap(), "SELECT $2, $1");
        assert_eq!(numbered("SELECT 1").unwrap(), "SELECT 1");
        let err = numbered("SELECT * FROM t WHERE a = ? AND b = $1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mixes `?` parameters with `$1`"), "{err}");
    }

    async fn planned(sql: &str) -> LogicalPlan {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE t (id BIGINT, name VARCHAR, price DECIMAL(15, 2), day DATE)")
            .await
            .unwrap();
        let mut statement = crate::sql::parse_one(sql).unwrap();
        number_placeholders(&mut statement).unwrap();
        crate::sql::plan(&ctx, statement).await.unwrap()
    }

    #[tokio::test]
    async fn types_come_from_the_query_and_values_are_cast_to_them() {
        let plan =
            planned("SELECT id FROM t WHERE id < ? AND price > ? AND name = ? LIMIT ?").await;
        let params = Parameters::of(&plan).unwrap();
        assert_eq!(
            types(&params),
            vec![
                DataType::Int64,
                DataType::Decimal128(15, 2),
                DataType::Utf8,
                DataType::Int64
            ]
        );
        let bound = params
            .bind(
                plan,
                vec![
                    ScalarValue::Int32(Some(5)),
                    ScalarValue::Decimal128(Some(150), 3, 2),
                    ScalarValue::Utf8(Some("x' OR '1'='1".to_string())),
                    ScalarValue::Null,
                ],
            )
            .unwrap();
        assert!(ids(&bound).is_empty());
        let text = bound.display_indent().to_string();
        assert!(text.contains("Int64(5)"), "{text}");
        assert!(text.contains("Decimal128(Some(150),15,2)"), "{text}");
        assert!(text.contains("x' OR '1'='1"), "{text}");
    }

    #[tokio::test]
    async fn untyped_parameters_take_their_values_type_and_counts_must_match() {
        let plan = planned("SELECT ? AS a, ? AS b").await;
        let params = Parameters::of(&plan).unwrap();
        assert_eq!(params.schema().fields().len(), 2);
        assert!(
            params
                .schema()
                .fields()
                .iter()
                .all(|f| f.data_type() == &DataType::Null)
        );
        let err = params
            .bind(plan.clone(), vec![ScalarValue::Int64(Some(1))])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the statement has 2 parameters but 1 value was bound"),
            "{err}"
        );
        let bound = params
            .bind(
                plan,
                vec![ScalarValue::Int64(Some(1)), ScalarValue::from("b")],
            )
            .unwrap();
        assert_eq!(bound.schema().field(0).data_type(), &DataType::Int64);
        assert_eq!(bound.schema().field(1).data_type(), &DataType::Utf8);

        let plan = planned("SELECT id FROM t WHERE id = ?").await;
        let err = Parameters::of(&plan)
            .unwrap()
            .bind(plan, vec![ScalarValue::from("five")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("parameter 1 takes Int64"), "{err}");

        let plan = planned("SELECT id FROM t WHERE id = $id").await;
        let err = Parameters::of(&plan)
            .unwrap()
            .bind(plan, vec![ScalarValue::Int64(Some(1))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("parameter `$id` is named"), "{err}");
    }

    #[tokio::test]
    async fn insert_parameters_take_the_columns_types() {
        let plan = planned("INSERT INTO t VALUES (?, ?, ?, ?)").await;
        let params = Parameters::of(&plan).unwrap();
        assert_eq!(
            types(&params),
            vec![
                DataType::Int64,
                DataType::Utf8,
                DataType::Decimal128(15, 2),
                DataType::Date32
            ]
        );
    }
}
