//! Filters of several conditions (`a AND b AND …`) evaluated term by term on bitmaps.
//!
//! DataFusion evaluates `a AND b` as a binary tree: when fewer than a fifth of the rows
//! pass `a`, it copies every column of the batch down to those rows, evaluates `b` on the
//! copy and spreads the result back out one value at a time (`pre_selection_scatter`, with
//! an array slice per run of passing rows). TPC-H Q6's five conditions spent a fifth of
//! their executor's time there, more than in the comparisons themselves. A
//! [`Conjunction`] instead
//!
//! - evaluates cheap terms (a column compared with a literal or another column, a null
//!   test) first, over the whole batch, and combines their bitmaps with a bitwise `AND`
//!   (Kleene logic, so `NULL` stays `NULL`);
//! - evaluates a term only on the rows still undecided (true or null so far) when few
//!   enough are left for the copy to pay off, copying just the columns that term reads,
//!   and spreads its result back
//!   bit by bit;
//! - stops as soon as no row can pass.
//!
//! The values are those of the `AND` tree it replaces, which it displays as. Terms that
//! could fail (casts, arithmetic, functions) run after the cheap ones and, when those
//! already removed rows, on fewer rows: a query can fail less often, never more.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, BooleanArray};
use datafusion::arrow::buffer::{BooleanBuffer, MutableBuffer, NullBuffer};
use datafusion::arrow::compute::{and_kleene, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::bit_util;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::expressions::{
    BinaryExpr, Column, IsNotNullExpr, IsNullExpr, Literal, NotExpr,
};
use datafusion::physical_expr::{PhysicalExpr, split_conjunction};
use datafusion::physical_expr_common::physical_expr::is_dynamic_physical_expr;

/// How costly a term is to evaluate on every row, cheapest first. Terms run in this order
/// (stable: the planner's order within a class).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cost {
    /// A fixed-width column (or a boolean column) compared, or tested for null.
    Fixed,
    /// A comparison of variable-width values (strings, binary).
    Variable,
    /// Anything else: functions, `LIKE`, `IN` lists, arithmetic, casts.
    Other,
}

impl Cost {
    /// Evaluate the term on the undecided rows only when at most this share of the batch
    /// is undecided (true or null) so far. Below it, copying the term's columns down to those rows and
    /// spreading the result back costs less than evaluating the term on every row.
    fn preselect_below(self) -> f64 {
        match self {
            Cost::Fixed => 0.1,
            Cost::Variable => 0.25,
            Cost::Other => 0.5,
        }
    }
}

#[derive(Debug)]
struct Term {
    /// Over the filter's input.
    expr: Arc<dyn PhysicalExpr>,
    /// `None` when the term reads no column (it then always runs on the whole batch).
    projected: Option<Projected>,
    cost: Cost,
}

/// A term rewritten over only the input columns it reads.
#[derive(Debug)]
struct Projected {
    /// Those columns' indices in the input, ascending.
    columns: Vec<usize>,
    /// The term, its column `i` being input column `columns[i]`.
    expr: Arc<dyn PhysicalExpr>,
}

/// `t1 AND t2 AND …` evaluated term by term (see the module's documentation).
#[derive(Debug)]
pub struct Conjunction {
    /// The `AND` tree this replaces: what it displays, compares and reasons as.
    original: Arc<dyn PhysicalExpr>,
    /// The filter's input schema the terms were planned on.
    schema: SchemaRef,
    terms: Vec<Term>,
}

impl Conjunction {
    /// The term-by-term form of `predicate` over `schema` when it is an `AND` of at least
    /// two boolean terms, none of them dynamic (a dynamic filter changes while the plan
    /// runs); `None` otherwise.
    pub fn try_new(predicate: &Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Option<Self>> {
        let parts = split_conjunction(predicate);
        if parts.len() < 2 {
            return Ok(None);
        }
        let mut terms = Vec::with_capacity(parts.len());
        for part in parts {
            if is_dynamic_physical_expr(part) || part.data_type(schema)? != DataType::Boolean {
                return Ok(None);
            }
            terms.push(Term {
                expr: Arc::clone(part),
                projected: project(part, schema)?,
                cost: cost(part, schema)?,
            });
        }
        terms.sort_by_key(|t| t.cost);
        Ok(Some(Self {
            original: Arc::clone(predicate),
            schema: Arc::clone(schema),
            terms,
        }))
    }
}

/// `expr` rewritten over only the columns it reads, with those columns' indices.
fn project(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Result<Option<Projected>> {
    let mut columns = Vec::new();
    expr.apply(|e| {
        if let Some(c) = e.as_any().downcast_ref::<Column>() {
            columns.push(c.index());
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })?;
    columns.sort_unstable();
    columns.dedup();
    if columns.is_empty() {
        return Ok(None);
    }
    let projected = Arc::clone(expr)
        .transform_up(|e| {
            Ok(match e.as_any().downcast_ref::<Column>() {
                Some(c) => {
                    let at = columns.binary_search(&c.index()).map_err(|_| {
                        DataFusionError::Internal(format!("column {c} not collected"))
                    })?;
                    Transformed::yes(Arc::new(Column::new(c.name(), at)) as Arc<dyn PhysicalExpr>)
                }
                None => Transformed::no(e),
            })
        })?
        .data;
    // Rebuilding the term made its faster expressions (decimal arithmetic, `LIKE`s of
    // several pieces) plain again (see `crate::fast`).
    let projected = crate::fast::rewrite_expr(&projected, &schema.project(&columns)?, &mut false)?;
    Ok(Some(Projected {
        columns,
        expr: projected,
    }))
}

fn cost(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Result<Cost> {
    let any = expr.as_any();
    let operand = |e: &Arc<dyn PhysicalExpr>| -> Result<Option<DataType>> {
        let any = e.as_any();
        Ok(if any.is::<Column>() || any.is::<Literal>() {
            Some(e.data_type(schema)?)
        } else {
            None
        })
    };
    let width = |t: &DataType| {
        if t.is_primitive() || *t == DataType::Boolean {
            Cost::Fixed
        } else if matches!(
            t,
            DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::FixedSizeBinary(_)
        ) {
            Cost::Variable
        } else {
            Cost::Other
        }
    };
    if let Some(b) = any.downcast_ref::<BinaryExpr>() {
        let comparison = matches!(
            b.op(),
            Operator::Eq
                | Operator::NotEq
                | Operator::Lt
                | Operator::LtEq
                | Operator::Gt
                | Operator::GtEq
                | Operator::IsDistinctFrom
                | Operator::IsNotDistinctFrom
        );
        if comparison
            && let (Some(l), Some(r)) = (operand(b.left())?, operand(b.right())?)
            && l == r
        {
            return Ok(width(&l));
        }
        return Ok(Cost::Other);
    }
    let tested = if let Some(e) = any.downcast_ref::<IsNullExpr>() {
        Some(e.arg())
    } else if let Some(e) = any.downcast_ref::<IsNotNullExpr>() {
        Some(e.arg())
    } else {
        any.downcast_ref::<NotExpr>().map(|e| e.arg())
    };
    if let Some(arg) = tested
        && arg.as_any().is::<Column>()
    {
        return Ok(Cost::Fixed);
    }
    if any.is::<Column>() {
        return Ok(Cost::Fixed);
    }
    Ok(Cost::Other)
}

/// The result of one term as a boolean array of the batch's length.
fn boolean(value: ColumnarValue, rows: usize) -> Result<BooleanArray> {
    let array = value.into_array(rows)?;
    match array.as_boolean_opt() {
        Some(b) if b.len() == rows => Ok(b.clone()),
        _ => Err(DataFusionError::Internal(format!(
            "a filter term returned {} values of type {}, expected {rows} booleans",
            array.len(),
            array.data_type()
        ))),
    }
}

/// The term's values spread back over the batch: `term` holds them for the rows set in
/// `passing`, in order; every other row is false.
fn scatter(passing: &BooleanBuffer, term: &BooleanArray) -> BooleanArray {
    let rows = passing.len();
    let bytes = bit_util::ceil(rows, 8);
    let mut values = MutableBuffer::from_len_zeroed(bytes);
    let term_values = term.values();
    let nulls = match term.nulls() {
        None => {
            let out = values.as_slice_mut();
            for (j, i) in passing.set_indices().enumerate() {
                if term_values.value(j) {
                    bit_util::set_bit(out, i);
                }
            }
            None
        }
        Some(term_nulls) => {
            let mut valid = MutableBuffer::new(bytes).with_bitset(bytes, true);
            let (out, valid_out) = (values.as_slice_mut(), valid.as_slice_mut());
            for (j, i) in passing.set_indices().enumerate() {
                if term_nulls.is_null(j) {
                    bit_util::unset_bit(valid_out, i);
                } else if term_values.value(j) {
                    bit_util::set_bit(out, i);
                }
            }
            Some(NullBuffer::new(BooleanBuffer::new(valid.into(), 0, rows)))
        }
    };
    BooleanArray::new(BooleanBuffer::new(values.into(), 0, rows), nulls)
}

impl Conjunction {
    fn evaluate_terms(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        let rows = batch.num_rows();
        let mut passing: Option<BooleanArray> = None;
        for term in &self.terms {
            let next = match (&passing, &term.projected) {
                (Some(p), Some(Projected { columns, expr })) => {
                    // The rows the term can still decide: those not already false (a null
                    // so far is decided by the term: NULL AND FALSE is FALSE).
                    let candidates = match p.nulls() {
                        None => p.values().clone(),
                        Some(n) => p.values() | &!n.inner(),
                    };
                    let left = candidates.count_set_bits();
                    if (left as f64) <= term.cost.preselect_below() * rows as f64 {
                        let selection = BooleanArray::new(candidates.clone(), None);
                        let input = filter_record_batch(&batch.project(columns)?, &selection)?;
                        let values = boolean(expr.evaluate(&input)?, input.num_rows())?;
                        let spread = scatter(&candidates, &values);
                        match p.nulls() {
                            None => spread,
                            Some(_) => and_kleene(p, &spread)?,
                        }
                    } else {
                        let values = boolean(term.expr.evaluate(batch)?, rows)?;
                        and_kleene(p, &values)?
                    }
                }
                _ => {
                    let values = boolean(term.expr.evaluate(batch)?, rows)?;
                    match &passing {
                        Some(p) => and_kleene(p, &values)?,
                        None => values,
                    }
                }
            };
            let none_pass = next.null_count() == 0 && next.true_count() == 0;
            passing = Some(next);
            if none_pass {
                break;
            }
        }
        passing.ok_or_else(|| DataFusionError::Internal("a conjunction without terms".into()))
    }
}

crate::fast::shown_as_original!(Conjunction);

impl PhysicalExpr for Conjunction {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.original.nullable(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        Ok(ColumnarValue::Array(Arc::new(self.evaluate_terms(batch)?)))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.original.children()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let original = Arc::clone(&self.original).with_new_children(children)?;
        // Children over another schema than planned get the plain tree.
        Ok(
            match Conjunction::try_new(&original, &self.schema).ok().flatten() {
                Some(c) => Arc::new(c),
                None => original,
            },
        )
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.original.fmt_sql(f)
    }

    planned_as_original!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Float64Array, Int32Array, StringArray};
    use datafusion::arrow::datatypes::Field;
    use datafusion::common::ScalarValue;
    use datafusion::physical_expr::expressions::{binary, col, is_not_null, lit};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Utf8, true),
            Field::new("c", DataType::Float64, true),
        ]))
    }

    /// 10,000 rows of pseudo-random values, about one in ten null.
    fn batch() -> RecordBatch {
        let mut state = 7u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let rows = 10_000;
        let a: Int32Array = (0..rows)
            .map(|_| (next() % 10 != 0).then(|| (next() % 100) as i32))
            .collect();
        let b: StringArray = (0..rows)
            .map(|_| (next() % 10 != 0).then(|| ["x", "y", "zz", "x'--"][(next() % 4) as usize]))
            .collect();
        let c: Float64Array = (0..rows)
            .map(|_| (next() % 10 != 0).then(|| (next() % 1000) as f64 / 10.0))
            .collect();
        let columns: Vec<ArrayRef> = vec![Arc::new(a), Arc::new(b), Arc::new(c)];
        RecordBatch::try_new(schema(), columns).unwrap()
    }

    fn cmp(column: &str, op: Operator, value: ScalarValue) -> Arc<dyn PhysicalExpr> {
        let s = schema();
        binary(col(column, &s).unwrap(), op, lit(value), &s).unwrap()
    }

    fn and(terms: Vec<Arc<dyn PhysicalExpr>>) -> Arc<dyn PhysicalExpr> {
        let s = schema();
        terms
            .into_iter()
            .reduce(|l, r| binary(l, Operator::And, r, &s).unwrap())
            .unwrap()
    }

    fn check(predicate: Arc<dyn PhysicalExpr>) {
        let batch = batch();
        let rows = batch.num_rows();
        let expected = predicate
            .evaluate(&batch)
            .unwrap()
            .into_array(rows)
            .unwrap();
        let terms = Conjunction::try_new(&predicate, &schema())
            .unwrap()
            .unwrap();
        let got = terms.evaluate(&batch).unwrap().into_array(rows).unwrap();
        assert_eq!(got.as_ref(), expected.as_ref(), "{predicate}");
        assert_eq!(terms.to_string(), predicate.to_string());
    }

    #[test]
    fn results_equal_the_and_trees_with_nulls_at_every_selectivity() {
        use Operator::*;
        let i = |v: i32| ScalarValue::Int32(Some(v));
        let s = |v: &str| ScalarValue::Utf8(Some(v.into()));
        let f = |v: f64| ScalarValue::Float64(Some(v));
        let schema = schema();
        // Many rows pass, few pass, none pass; terms of every cost; a term that reads no
        // column; nulls in the terms' results (both evaluation paths see them).
        check(and(vec![cmp("a", Gt, i(10)), cmp("c", Lt, f(90.0))]));
        check(and(vec![
            cmp("a", GtEq, i(40)),
            cmp("a", Lt, i(45)),
            cmp("b", Eq, s("x")),
            cmp("c", Gt, f(10.0)),
        ]));
        check(and(vec![
            cmp("a", Eq, i(3)),
            binary(
                binary(col("a", &schema).unwrap(), Plus, lit(i(1)), &schema).unwrap(),
                Gt,
                lit(i(2)),
                &schema,
            )
            .unwrap(),
            cmp("b", NotEq, s("y")),
            is_not_null(col("c", &schema).unwrap()).unwrap(),
        ]));
        check(and(vec![cmp("a", Lt, i(0)), cmp("b", Eq, s("x"))]));
        check(and(vec![
            cmp("a", Lt, i(5)),
            binary(lit(i(1)), Eq, lit(i(1)), &schema).unwrap(),
            cmp("b", Eq, s("x'--")),
        ]));
        check(and(vec![
            cmp("b", Gt, s("x")),
            cmp("a", Lt, i(2)),
            binary(
                lit(ScalarValue::Boolean(None)),
                Or,
                cmp("c", Gt, f(50.0)),
                &schema,
            )
            .unwrap(),
        ]));
    }

    #[test]
    fn cheap_terms_run_first_and_a_single_term_is_left_alone() {
        let schema = schema();
        let costly = binary(
            binary(
                col("a", &schema).unwrap(),
                Operator::Plus,
                lit(1i32),
                &schema,
            )
            .unwrap(),
            Operator::Gt,
            lit(2i32),
            &schema,
        )
        .unwrap();
        let p = and(vec![
            Arc::clone(&costly),
            cmp("b", Operator::Eq, ScalarValue::Utf8(Some("x".into()))),
            cmp("a", Operator::Eq, ScalarValue::Int32(Some(3))),
        ]);
        let c = Conjunction::try_new(&p, &schema).unwrap().unwrap();
        let costs: Vec<Cost> = c.terms.iter().map(|t| t.cost).collect();
        assert_eq!(costs, vec![Cost::Fixed, Cost::Variable, Cost::Other]);
        assert!(Conjunction::try_new(&costly, &schema).unwrap().is_none());
    }

    /// A term that fails on rows the cheap terms already rejected is not evaluated there,
    /// also when the cheap terms left nulls (DataFusion's tree evaluates it on every row
    /// then, and fails).
    #[test]
    fn failing_terms_run_only_on_rows_still_undecided() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("d", DataType::Int32, false),
        ]));
        let rows = 1000;
        let a: Int32Array = (0..rows)
            .map(|i| (i % 10 != 0).then_some(i as i32))
            .collect();
        // d is 0 only where a is 3 or more; 100 / d fails there.
        let d: Int32Array = (0..rows)
            .map(|i| if i % 10 != 0 && i >= 3 { 0 } else { 1 })
            .collect();
        let batch =
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(a), Arc::new(d)]).unwrap();
        let division = binary(
            binary(
                lit(100i32),
                Operator::Divide,
                col("d", &schema).unwrap(),
                &schema,
            )
            .unwrap(),
            Operator::Gt,
            lit(1i32),
            &schema,
        )
        .unwrap();
        let less = binary(col("a", &schema).unwrap(), Operator::Lt, lit(3i32), &schema).unwrap();
        let predicate = binary(division, Operator::And, less, &schema).unwrap();
        assert!(predicate.evaluate(&batch).is_err());
        let terms = Conjunction::try_new(&predicate, &schema).unwrap().unwrap();
        let got = terms.evaluate(&batch).unwrap().into_array(rows).unwrap();
        let got = got.as_boolean();
        assert_eq!(got.true_count(), 2); // a = 1 and a = 2
        assert_eq!(got.null_count(), 100); // a null: NULL AND TRUE
    }

    #[test]
    fn scatter_spreads_values_and_nulls_to_the_passing_rows() {
        let passing = BooleanBuffer::from(vec![false, true, true, false, true]);
        let term = BooleanArray::from(vec![Some(true), None, Some(false)]);
        let got = scatter(&passing, &term);
        let expected = BooleanArray::from(vec![
            Some(false),
            Some(true),
            None,
            Some(false),
            Some(false),
        ]);
        assert_eq!(got, expected);
    }
}
