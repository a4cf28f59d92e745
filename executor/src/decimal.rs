//! Decimal arithmetic on the widths the values need. Arrow computes `+`, `-` and `*` of
//! `Decimal128` values with overflow-checked 128-bit operations, and a checked 128-bit
//! multiplication is a call into the compiler's runtime, several times slower than the
//! hardware's 64 × 64 → 128-bit multiply. TPC-H's prices, discounts and taxes (and most
//! money in practice) are `decimal(15, 2)`: their values fit in 64 bits, so their product
//! fits in 128 bits and cannot overflow. Before an executor runs a plan, every such
//! `BinaryExpr` in a projection, a filter or an aggregate's arguments becomes a
//! [`DecimalArithmetic`], which multiplies two 64-bit values with the widening instruction
//! and falls back to arrow's checked operation, element by element, for values that do not
//! fit — same results, same result type, same overflow errors.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, new_null_array};
use datafusion::arrow::buffer::{NullBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{ArrowNativeTypeOp, DataType, Decimal128Type, Schema};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::{PhysicalExpr, expressions::BinaryExpr};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Add,
    Sub,
    Mul,
}

/// `left op right` for two `Decimal128` operands, as arrow computes it (see the module's
/// documentation). Displays as the `BinaryExpr` it replaces.
#[derive(Debug)]
pub struct DecimalArithmetic {
    original: Arc<BinaryExpr>,
    /// The operands' types the factors and the result type were computed for.
    inputs: (DataType, DataType),
    op: Op,
    /// What each side is multiplied by to bring it to the result's scale (`+` and `-`).
    left_factor: i128,
    right_factor: i128,
    precision: u8,
    scale: i8,
}

impl DecimalArithmetic {
    /// The fast form of `expr` when it is a decimal `+`, `-` or `*` whose result type arrow
    /// would compute the way DataFusion declares it; `None` otherwise.
    pub(crate) fn try_new(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Result<Option<Self>> {
        let Some(binary) = expr.as_any().downcast_ref::<BinaryExpr>() else {
            return Ok(None);
        };
        let op = match binary.op() {
            Operator::Plus => Op::Add,
            Operator::Minus => Op::Sub,
            Operator::Multiply => Op::Mul,
            _ => return Ok(None),
        };
        let inputs = (
            binary.left().data_type(schema)?,
            binary.right().data_type(schema)?,
        );
        let (DataType::Decimal128(p1, s1), DataType::Decimal128(p2, s2)) = inputs else {
            return Ok(None);
        };
        // Ordinary decimals only: no negative scales, no scale above the precision.
        if s1 < 0 || s2 < 0 || s1 as u8 > p1 || s2 as u8 > p2 {
            return Ok(None);
        }
        let (p1, s1, p2, s2) = (i32::from(p1), i32::from(s1), i32::from(p2), i32::from(s2));
        let max = i32::from(datafusion::arrow::datatypes::DECIMAL128_MAX_PRECISION);
        // arrow's rules (Hive's): `+`/`-` keep the larger scale and add a digit, `*` adds
        // precisions and scales.
        let (precision, scale, left_factor, right_factor) = match op {
            Op::Add | Op::Sub => {
                let scale = s1.max(s2);
                let precision = (scale + (p1 - s1).max(p2 - s2) + 1).min(max);
                (precision, scale, pow10(scale - s1), pow10(scale - s2))
            }
            Op::Mul => {
                let scale = s1 + s2;
                if scale > i32::from(datafusion::arrow::datatypes::DECIMAL128_MAX_SCALE) {
                    return Ok(None); // arrow's error, left to arrow
                }
                ((p1 + p2 + 1).min(max), scale, 1, 1)
            }
        };
        let (Ok(precision), Ok(scale)) = (u8::try_from(precision), i8::try_from(scale)) else {
            return Ok(None);
        };
        if binary.data_type(schema)? != DataType::Decimal128(precision, scale) {
            return Ok(None);
        }
        Ok(Some(Self {
            original: Arc::new(binary.clone()),
            inputs,
            op,
            left_factor,
            right_factor,
            precision,
            scale,
        }))
    }

    fn compute(
        &self,
        l: &Decimal128Array,
        l_scalar: bool,
        r: &Decimal128Array,
        r_scalar: bool,
        len: usize,
    ) -> Result<ArrayRef> {
        // A null scalar makes every row null, as in arrow.
        if (l_scalar && l.is_null(0)) || (r_scalar && r.is_null(0)) {
            return Ok(new_null_array(&self.result_type(), len));
        }
        let nulls = NullBuffer::union(
            if l_scalar { None } else { l.nulls() },
            if r_scalar { None } else { r.nulls() },
        );
        let (lv, rv) = (l.values(), r.values());
        // Checked once here, so that the loops below index without checks of their own.
        if lv.len() < if l_scalar { 1 } else { len } || rv.len() < if r_scalar { 1 } else { len } {
            return Err(datafusion::error::DataFusionError::Internal(format!(
                "decimal {}: operands of {} and {} values for {len} rows",
                self.original.op(),
                lv.len(),
                rv.len()
            )));
        }
        let values = match self.apply_narrow(lv, l_scalar, rv, r_scalar, len) {
            Some(values) => values,
            None => match (l_scalar, r_scalar) {
                (false, false) => self.apply(len, |i| lv[i], |i| rv[i], nulls.as_ref())?,
                (true, false) => self.apply(len, |_| lv[0], |i| rv[i], nulls.as_ref())?,
                (false, true) => self.apply(len, |i| lv[i], |_| rv[0], nulls.as_ref())?,
                (true, true) => self.apply(len, |_| lv[0], |_| rv[0], nulls.as_ref())?,
            },
        };
        let array = Decimal128Array::new(ScalarBuffer::from(values), nulls)
            .with_precision_and_scale(self.precision, self.scale)?;
        Ok(Arc::new(array))
    }

    /// Every row's value; a row whose computation overflows fails the batch with arrow's
    /// error unless the row is null (its value is not defined, arrow does not compute it).
    #[inline(always)]
    fn apply(
        &self,
        len: usize,
        left: impl Fn(usize) -> i128,
        right: impl Fn(usize) -> i128,
        nulls: Option<&NullBuffer>,
    ) -> Result<Vec<i128>> {
        let (lf, rf) = (self.left_factor, self.right_factor);
        let mut out = Vec::with_capacity(len);
        macro_rules! each {
            ($f:expr) => {
                for i in 0..len {
                    let (a, b) = (left(i), right(i));
                    let v = match $f(a, b) {
                        Some(v) => v,
                        None if nulls.is_some_and(|n| n.is_null(i)) => 0,
                        None => return Err(self.overflow(a, b).into()),
                    };
                    out.push(v);
                }
            };
        }
        match self.op {
            Op::Mul => each!(mul),
            Op::Add if lf == 1 && rf == 1 => each!(|a: i128, b: i128| a.checked_add(b)),
            Op::Sub if lf == 1 && rf == 1 => each!(|a: i128, b: i128| a.checked_sub(b)),
            Op::Add => each!(|a, b| mul(a, lf)?.checked_add(mul(b, rf)?)),
            Op::Sub => each!(|a, b| mul(a, lf)?.checked_sub(mul(b, rf)?)),
        }
        Ok(out)
    }

    /// Every row's value when every operand (null rows too) fits in 64 bits and so do the
    /// factors: then no row can overflow (a product of two 64-bit values has at most 126
    /// bits, a sum of two such products at most 127), and the loops run without a check or
    /// a branch per row. `None` when some value is wider: the checked loop decides. The
    /// operands hold at least `len` values (one for a scalar).
    fn apply_narrow(
        &self,
        lv: &[i128],
        l_scalar: bool,
        rv: &[i128],
        r_scalar: bool,
        len: usize,
    ) -> Option<Vec<i128>> {
        let (l, r) = (
            &lv[..if l_scalar { 1 } else { len }],
            &rv[..if r_scalar { 1 } else { len }],
        );
        let (lf, rf) = (self.left_factor, self.right_factor);
        // One pass per operand, then one for the values: a flag kept through the arithmetic
        // loop costs more than the second read (measured on TPC-H Q1).
        if !(is_narrow(lf) && is_narrow(rf) && all_narrow(l) && all_narrow(r)) {
            return None;
        }
        // Every value and factor fits in 64 bits: the casts keep them whole.
        let (lf, rf) = (lf as i64, rf as i64);
        let wide = |a: i64, b: i64| i128::from(a) * i128::from(b);
        macro_rules! each {
            ($f:expr) => {{
                let f = $f;
                match (l_scalar, r_scalar) {
                    (false, false) => l
                        .iter()
                        .zip(r)
                        .map(|(&a, &b)| f(a as i64, b as i64))
                        .collect(),
                    (true, false) => {
                        let a = l[0] as i64;
                        r.iter().map(|&b| f(a, b as i64)).collect()
                    }
                    (false, true) => {
                        let b = r[0] as i64;
                        l.iter().map(|&a| f(a as i64, b)).collect()
                    }
                    (true, true) => vec![f(l[0] as i64, r[0] as i64)],
                }
            }};
        }
        // `+` and `-` bring the side of the smaller scale to the other's.
        Some(match self.op {
            Op::Mul => each!(wide),
            Op::Add if lf == 1 && rf == 1 => each!(|a, b| i128::from(a) + i128::from(b)),
            Op::Sub if lf == 1 && rf == 1 => each!(|a, b| i128::from(a) - i128::from(b)),
            Op::Add => each!(move |a, b| wide(a, lf) + wide(b, rf)),
            Op::Sub => each!(move |a, b| wide(a, lf) - wide(b, rf)),
        })
    }

    /// arrow's error for the row that overflowed (computed the way arrow does).
    fn overflow(&self, a: i128, b: i128) -> ArrowError {
        let r = match self.op {
            Op::Mul => a.mul_checked(b),
            Op::Add => a
                .mul_checked(self.left_factor)
                .and_then(|a| a.add_checked(b.mul_checked(self.right_factor)?)),
            Op::Sub => a
                .mul_checked(self.left_factor)
                .and_then(|a| a.sub_checked(b.mul_checked(self.right_factor)?)),
        };
        match r {
            Err(e) => e,
            Ok(_) => ArrowError::ArithmeticOverflow(format!(
                "Overflow happened on: {a:?} {} {b:?}",
                self.original.op()
            )),
        }
    }

    fn result_type(&self) -> DataType {
        DataType::Decimal128(self.precision, self.scale)
    }
}

/// `a * b`, or `None` when it overflows. Two values that fit in 64 bits are multiplied by
/// the widening 64-bit instruction: their product has at most 126 bits.
#[inline(always)]
fn mul(a: i128, b: i128) -> Option<i128> {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) => Some(i128::from(a) * i128::from(b)),
        _ => a.checked_mul(b),
    }
}

/// Whether `v` fits in 64 bits.
#[inline(always)]
fn is_narrow(v: i128) -> bool {
    i128::from(v as i64) == v
}

/// Whether every value fits in 64 bits; one pass without an early exit, which compiles to
/// straight-line code.
fn all_narrow(values: &[i128]) -> bool {
    values.iter().fold(true, |ok, &v| ok & is_narrow(v))
}

fn pow10(exponent: i32) -> i128 {
    10i128.pow(exponent.unsigned_abs())
}

crate::fast::shown_as_original!(DecimalArithmetic);

impl PhysicalExpr for DecimalArithmetic {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(self.result_type())
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.original.nullable(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let left = self.original.left().evaluate(batch)?;
        let right = self.original.right().evaluate(batch)?;
        let scalars = matches!(
            (&left, &right),
            (ColumnarValue::Scalar(_), ColumnarValue::Scalar(_))
        );
        let len = if scalars { 1 } else { batch.num_rows() };
        let (l, l_scalar) = as_array(left)?;
        let (r, r_scalar) = as_array(right)?;
        // Operands other than the planned ones (a child that broke its declared type or
        // length) are left to arrow, which computes or rejects them as before.
        let fits = |a: &ArrayRef, scalar: bool, t: &DataType| {
            a.data_type() == t && (scalar || a.len() == len)
        };
        if !fits(&l, l_scalar, &self.inputs.0) || !fits(&r, r_scalar, &self.inputs.1) {
            return self.original.evaluate(batch);
        }
        let out = self.compute(
            l.as_primitive::<Decimal128Type>(),
            l_scalar,
            r.as_primitive::<Decimal128Type>(),
            r_scalar,
            len,
        )?;
        Ok(if scalars {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(out)
        })
    }

    rebuilt_as_original!();

    planned_as_original!();
}

fn as_array(value: ColumnarValue) -> Result<(ArrayRef, bool)> {
    Ok(match value {
        ColumnarValue::Array(a) => (a, false),
        ColumnarValue::Scalar(s) => (s.to_array_of_size(1)?, true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::rewrite_expr;
    use datafusion::arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::{Column, Literal};

    fn decimals(values: &[Option<i128>], p: u8, s: i8) -> ArrayRef {
        Arc::new(
            Decimal128Array::from(values.to_vec())
                .with_precision_and_scale(p, s)
                .unwrap(),
        )
    }

    /// The rewritten expression of `a op b` over one batch, and arrow's own result.
    fn both(
        op: Operator,
        a: ArrayRef,
        b: Option<ArrayRef>,
        literal: Option<ScalarValue>,
    ) -> (Result<ArrayRef>, Result<ArrayRef>, bool) {
        let mut fields = vec![Field::new("a", a.data_type().clone(), true)];
        let mut columns = vec![Arc::clone(&a)];
        if let Some(b) = &b {
            fields.push(Field::new("b", b.data_type().clone(), true));
            columns.push(Arc::clone(b));
        }
        let schema = Arc::new(Schema::new(fields));
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
        let right: Arc<dyn PhysicalExpr> = match &literal {
            Some(v) => Arc::new(Literal::new(v.clone())),
            None => Arc::new(Column::new("b", 1)),
        };
        let expr: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(Arc::new(Column::new("a", 0)), op, right));
        let plain = expr
            .evaluate(&batch)
            .and_then(|v| v.into_array(batch.num_rows()));
        let mut changed = false;
        let fast = rewrite_expr(&expr, &schema, &mut changed).unwrap();
        let got = fast
            .evaluate(&batch)
            .and_then(|v| v.into_array(batch.num_rows()));
        (got, plain, changed)
    }

    fn check(op: Operator, a: ArrayRef, b: Option<ArrayRef>, literal: Option<ScalarValue>) {
        let (got, plain, changed) = both(op, a, b, literal);
        assert!(changed, "{op} was not rewritten");
        match (got, plain) {
            (Ok(g), Ok(p)) => {
                assert_eq!(g.data_type(), p.data_type());
                assert_eq!(&g, &p);
            }
            (Err(g), Err(p)) => assert_eq!(g.strip_backtrace(), p.strip_backtrace()),
            (g, p) => panic!("{op}: {g:?} vs arrow's {p:?}"),
        }
    }

    #[test]
    fn results_equal_arrows_for_small_large_null_and_overflowing_values() {
        let big = 10i128.pow(30);
        let a = decimals(
            &[
                Some(12345),
                Some(-99),
                None,
                Some(i64::MAX as i128 + 7),
                Some(0),
                Some(big),
            ],
            38,
            2,
        );
        let b = decimals(
            &[
                Some(7),
                None,
                Some(3),
                Some(-2),
                Some(i64::MIN as i128),
                Some(3),
            ],
            20,
            4,
        );
        for op in [Operator::Plus, Operator::Minus, Operator::Multiply] {
            check(op, Arc::clone(&a), Some(Arc::clone(&b)), None);
            check(
                op,
                Arc::clone(&a),
                None,
                Some(ScalarValue::Decimal128(Some(100), 20, 0)),
            );
            check(
                op,
                Arc::clone(&a),
                None,
                Some(ScalarValue::Decimal128(None, 20, 0)),
            );
        }
        // TPC-H's shape: decimal(15, 2) * (1 - decimal(15, 2)).
        let price = decimals(&[Some(9_999_999_999_999), Some(-1), Some(250)], 15, 2);
        let discount = decimals(&[Some(5), Some(10), None], 15, 2);
        check(
            Operator::Multiply,
            Arc::clone(&price),
            Some(Arc::clone(&discount)),
            None,
        );
        check(
            Operator::Minus,
            price,
            None,
            Some(ScalarValue::Decimal128(Some(1), 20, 0)),
        );
    }

    #[test]
    fn the_extremes_of_64_bits_equal_arrows() {
        let (min, max) = (i128::from(i64::MIN), i128::from(i64::MAX));
        let a = decimals(&[Some(min), Some(max), Some(min), None, Some(-1)], 38, 0);
        let b = decimals(
            &[Some(min), Some(min), Some(max), Some(min), Some(max)],
            38,
            18,
        );
        for op in [Operator::Plus, Operator::Minus, Operator::Multiply] {
            // Factors of 1 and 10^18 (the widest that fits in 64 bits).
            check(op, Arc::clone(&a), Some(Arc::clone(&b)), None);
            check(
                op,
                Arc::clone(&b),
                None,
                Some(ScalarValue::Decimal128(Some(max), 38, 0)),
            );
        }
        // A factor of 10^19 does not fit: the checked loop computes it.
        let c = decimals(&[Some(min), Some(3)], 38, 19);
        check(Operator::Plus, Arc::clone(&a).slice(0, 2), Some(c), None);
    }

    #[test]
    fn overflow_fails_with_arrows_error_but_not_in_a_null_row() {
        let huge = 10i128.pow(37);
        let a = decimals(&[Some(huge), Some(1)], 38, 0);
        let b = decimals(&[Some(100), Some(2)], 38, 0);
        let (got, plain, _) = both(
            Operator::Multiply,
            Arc::clone(&a),
            Some(Arc::clone(&b)),
            None,
        );
        let (got, plain) = (got.unwrap_err(), plain.unwrap_err());
        assert_eq!(got.strip_backtrace(), plain.strip_backtrace());
        assert!(got.to_string().contains("Overflow"), "{got}");
        // The same values in a null row are not computed.
        let a = decimals(&[Some(huge), Some(1)], 38, 0);
        let b = decimals(&[None, Some(2)], 38, 0);
        check(Operator::Multiply, a, Some(b), None);
    }

    #[test]
    fn operands_other_than_the_planned_ones_are_left_to_arrow() {
        let planned = Schema::new(vec![
            Field::new("a", DataType::Decimal128(15, 2), true),
            Field::new("b", DataType::Decimal128(15, 2), true),
        ]);
        let expr: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            Arc::new(Column::new("a", 0)),
            Operator::Plus,
            Arc::new(Column::new("b", 1)),
        ));
        let mut changed = false;
        let fast = rewrite_expr(&expr, &planned, &mut changed).unwrap();
        assert!(changed);
        // A batch whose first column is not what the plan said it would be.
        let a = decimals(&[Some(12345), None], 20, 4);
        let b = decimals(&[Some(1), Some(2)], 15, 2);
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", a.data_type().clone(), true),
            Field::new("b", b.data_type().clone(), true),
        ]));
        let batch = RecordBatch::try_new(schema, vec![a, b]).unwrap();
        let got = fast.evaluate(&batch).unwrap().into_array(2).unwrap();
        let want = expr.evaluate(&batch).unwrap().into_array(2).unwrap();
        assert_eq!(&got, &want);
        assert_eq!(got.data_type(), &DataType::Decimal128(21, 4));
    }

    #[test]
    fn other_operators_and_types_are_left_alone() {
        let a = decimals(&[Some(1)], 10, 2);
        let (_, _, changed) = both(Operator::Divide, Arc::clone(&a), Some(a), None);
        assert!(!changed);
        let ints: ArrayRef = Arc::new(datafusion::arrow::array::Int64Array::from(vec![1]));
        let (_, _, changed) = both(Operator::Multiply, Arc::clone(&ints), Some(ints), None);
        assert!(!changed);
    }

    #[test]
    fn scalars_on_both_sides_give_a_scalar() {
        let schema = Schema::new(vec![Field::new("a", DataType::Int32, true)]);
        let expr: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            Arc::new(Literal::new(ScalarValue::Decimal128(Some(150), 10, 2))),
            Operator::Multiply,
            Arc::new(Literal::new(ScalarValue::Decimal128(Some(3), 5, 0))),
        ));
        let mut changed = false;
        let fast = rewrite_expr(&expr, &schema, &mut changed).unwrap();
        assert!(changed);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![Arc::new(datafusion::arrow::array::Int32Array::from(vec![
                1, 2,
            ]))],
        )
        .unwrap();
        match fast.evaluate(&batch).unwrap() {
            ColumnarValue::Scalar(s) => assert_eq!(s, ScalarValue::Decimal128(Some(450), 16, 2)),
            other => panic!("{other:?}"),
        }
    }
}
