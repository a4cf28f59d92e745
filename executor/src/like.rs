//! `LIKE` patterns of several fixed pieces between `%` (`'%special%requests%'`, TPC-H Q13's
//! and Q16's) matched as substring searches in order, not as a regular expression.
//!
//! arrow matches a pattern with one piece (`'abc%'`, `'%abc'`, `'%abc%'`) by a prefix,
//! suffix or substring test, and any other pattern by a regular expression. For a pattern
//! made of pieces and `%` only, a value matches when it starts with the first piece (unless
//! the pattern starts with `%`), ends with the last (unless it ends with `%`), and holds the
//! pieces in between in order, without overlap: finding each piece at its leftmost place
//! after the previous one decides it, in one pass over the value. Patterns with `_` or an
//! escape (`\`), and `ILIKE`, stay with arrow.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{LikeExpr, Literal};
use memchr::memmem::Finder;

/// A `LIKE` pattern as its fixed pieces.
#[derive(Debug)]
struct Pieces {
    /// The first piece must start the value.
    anchored_start: bool,
    /// The last piece must end the value.
    anchored_end: bool,
    pieces: Vec<Finder<'static>>,
}

impl Pieces {
    /// The pieces of `pattern` when it has at least two, separated by `%`, and no `_` or
    /// `\` (patterns arrow does not match with a regular expression are left to it).
    fn parse(pattern: &str) -> Option<Self> {
        if pattern.contains(['_', '\\']) {
            return None;
        }
        let pieces: Vec<Finder<'static>> = pattern
            .split('%')
            .filter(|p| !p.is_empty())
            .map(|p| Finder::new(p.as_bytes()).into_owned())
            .collect();
        (pieces.len() >= 2).then(|| Self {
            anchored_start: !pattern.starts_with('%'),
            anchored_end: !pattern.ends_with('%'),
            pieces,
        })
    }

    fn matches(&self, value: &[u8]) -> bool {
        let mut pieces = self.pieces.as_slice();
        let mut at = 0;
        let mut end = value.len();
        if self.anchored_start {
            let first = pieces[0].needle();
            if !value.starts_with(first) {
                return false;
            }
            at = first.len();
            pieces = &pieces[1..];
        }
        if self.anchored_end {
            let last = pieces[pieces.len() - 1].needle();
            if value.len() < at + last.len() || !value.ends_with(last) {
                return false;
            }
            end = value.len() - last.len();
            pieces = &pieces[..pieces.len() - 1];
        }
        for piece in pieces {
            match piece.find(&value[at..end]) {
                Some(found) => at += found + piece.needle().len(),
                None => return false,
            }
        }
        true
    }
}

/// `value [NOT] LIKE 'pattern'` over a string column, for a pattern of [`Pieces`]. Displays
/// as the `LIKE` it replaces.
#[derive(Debug)]
pub struct PiecewiseLike {
    original: Arc<LikeExpr>,
    pieces: Pieces,
}

impl PiecewiseLike {
    pub(crate) fn try_new(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Result<Option<Self>> {
        let Some(like) = expr.as_any().downcast_ref::<LikeExpr>() else {
            return Ok(None);
        };
        let values = like.expr().data_type(schema)?;
        if like.case_insensitive()
            || !matches!(
                values,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            )
        {
            return Ok(None);
        }
        let pattern = match like
            .pattern()
            .as_any()
            .downcast_ref::<Literal>()
            .map(Literal::value)
        {
            // Of the values' type, as the planner coerces it (arrow rejects other pairs).
            Some(
                v @ (ScalarValue::Utf8(Some(p))
                | ScalarValue::LargeUtf8(Some(p))
                | ScalarValue::Utf8View(Some(p))),
            ) if v.data_type() == values => p,
            _ => return Ok(None),
        };
        let Some(pieces) = Pieces::parse(pattern) else {
            return Ok(None);
        };
        let original = Arc::new(LikeExpr::new(
            like.negated(),
            false,
            Arc::clone(like.expr()),
            Arc::clone(like.pattern()),
        ));
        Ok(Some(Self { original, pieces }))
    }

    /// The result over `values`, or `None` when they are not strings (left to arrow).
    fn compute(&self, values: &ArrayRef) -> Option<BooleanArray> {
        let negated = self.original.negated();
        let test = |bytes: &[u8]| self.pieces.matches(bytes) != negated;
        let bits = match values.data_type() {
            DataType::Utf8View => {
                let a = values.as_string_view();
                BooleanBuffer::collect_bool(a.len(), |i| {
                    a.is_null(i) || test(a.value(i).as_bytes())
                })
            }
            DataType::Utf8 => {
                let a = values.as_string::<i32>();
                BooleanBuffer::collect_bool(a.len(), |i| {
                    a.is_null(i) || test(a.value(i).as_bytes())
                })
            }
            DataType::LargeUtf8 => {
                let a = values.as_string::<i64>();
                BooleanBuffer::collect_bool(a.len(), |i| {
                    a.is_null(i) || test(a.value(i).as_bytes())
                })
            }
            _ => return None,
        };
        Some(BooleanArray::new(bits, values.logical_nulls()))
    }
}

crate::fast::shown_as_original!(PiecewiseLike);

impl PhysicalExpr for PiecewiseLike {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn data_type(&self, input_schema: &Schema) -> Result<DataType> {
        self.original.data_type(input_schema)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.original.nullable(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let values = self.original.expr().evaluate(batch)?;
        let (array, scalar) = match values {
            ColumnarValue::Array(a) => (a, false),
            ColumnarValue::Scalar(s) => (s.to_array()?, true),
        };
        let Some(out) = self.compute(&array) else {
            return self.original.evaluate(batch);
        };
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(Arc::new(out))
        })
    }

    rebuilt_as_original!();
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{
        Array, ArrayRef, BooleanArray, LargeStringArray, StringArray, StringViewArray,
    };
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::common::ScalarValue;
    use datafusion::physical_expr::PhysicalExpr;
    use datafusion::physical_expr::expressions::{LikeExpr, col, lit};

    use super::Pieces;
    use crate::fast::rewrite_expr;

    const VALUES: &[Option<&str>] = &[
        Some("special requests"),
        Some("no special deposits requests"),
        Some("requests special"),
        Some("specialrequests"),
        Some("specia requests"),
        Some(""),
        None,
        Some("special"),
        Some("ab"),
        Some("aba"),
        Some("abab"),
        Some("a\nb"),
        Some("añb ñ"),
        Some("xspecial requestsx"),
    ];

    const PATTERNS: &[&str] = &[
        "%special%requests%",
        "special%requests",
        "special%requests%",
        "%special%requests",
        "a%b",
        "a%%b",
        "ab%ab",
        "a%b%a",
        "%a%a%",
        "añ%ñ",
        // Left to arrow: one piece, wildcards, escapes.
        "%special%",
        "special%",
        "a_b",
        "a\\%b%c",
        "%",
        "",
    ];

    fn batch(values: ArrayRef) -> RecordBatch {
        let schema = Schema::new(vec![Field::new("s", values.data_type().clone(), true)]);
        RecordBatch::try_new(Arc::new(schema), vec![values]).unwrap()
    }

    /// `s [NOT] LIKE pattern`, the pattern of the column's type (as the planner coerces it).
    fn like(negated: bool, pattern: &str, schema: &Schema) -> Arc<dyn PhysicalExpr> {
        let p = Some(pattern.to_string());
        let pattern = lit(match schema.field(0).data_type() {
            DataType::Utf8View => ScalarValue::Utf8View(p),
            DataType::LargeUtf8 => ScalarValue::LargeUtf8(p),
            _ => ScalarValue::Utf8(p),
        });
        Arc::new(LikeExpr::new(
            negated,
            false,
            col("s", schema).unwrap(),
            pattern,
        ))
    }

    #[test]
    fn matches_as_arrow_does() {
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(StringViewArray::from(VALUES.to_vec())),
            Arc::new(StringArray::from(VALUES.to_vec())),
            Arc::new(LargeStringArray::from(VALUES.to_vec())),
        ];
        for values in arrays {
            let batch = batch(values);
            let schema = batch.schema();
            for pattern in PATTERNS {
                for negated in [false, true] {
                    let original = like(negated, pattern, &schema);
                    let mut changed = false;
                    let fast = rewrite_expr(&original, &schema, &mut changed).unwrap();
                    assert_eq!(changed, Pieces::parse(pattern).is_some(), "{pattern}");
                    assert_eq!(fast.to_string(), original.to_string());
                    let want = original.evaluate(&batch).unwrap().into_array(14).unwrap();
                    let got = fast.evaluate(&batch).unwrap().into_array(14).unwrap();
                    assert_eq!(
                        got.as_any().downcast_ref::<BooleanArray>(),
                        want.as_any().downcast_ref::<BooleanArray>(),
                        "{pattern} negated={negated} over {}",
                        batch.column(0).data_type()
                    );
                    assert_eq!(got.null_count(), 1);
                }
            }
        }
    }

    #[test]
    fn other_likes_stay() {
        let batch = batch(Arc::new(StringViewArray::from(VALUES.to_vec())));
        let schema = batch.schema();
        let column = col("s", &schema).unwrap();
        let cases = [
            // ILIKE.
            (true, lit(ScalarValue::Utf8View(Some("%a%b%".into())))),
            // A pattern that is not a literal.
            (false, Arc::clone(&column)),
            // A pattern of another type than the values (arrow rejects it; so must we).
            (false, lit(ScalarValue::Utf8(Some("%a%b%".into())))),
        ];
        for (case_insensitive, pattern) in cases {
            let like: Arc<dyn PhysicalExpr> = Arc::new(LikeExpr::new(
                false,
                case_insensitive,
                Arc::clone(&column),
                pattern,
            ));
            let mut changed = false;
            rewrite_expr(&like, &schema, &mut changed).unwrap();
            assert!(!changed, "{like}");
        }
        assert_eq!(DataType::Utf8View, *batch.column(0).data_type());
    }
}
