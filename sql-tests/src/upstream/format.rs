//! Results printed the way DataFusion's own sqllogictest driver prints them, so that its
//! expected results compare as they are: the same ideas as `datafusion-sqllogictest`'s
//! `normalize.rs` and `conversion.rs`, written for Basin (not copied).
//!
//! - NULL is `NULL`, an empty string `(empty)`, a string loses trailing newlines and shows
//!   NUL characters as `\0`;
//! - floats and decimals are their plain decimal text rounded half-to-even to 12 decimals
//!   without trailing zeros (`0.30000000000000004` → `0.3`, `100.00` → `100`);
//!   NaN and infinities are `NaN`, `Infinity`, `-Infinity`;
//! - dictionaries print their values; everything else prints as Arrow displays it with
//!   DataFusion's format options (durations "pretty", not ISO 8601);
//! - a last cell of several lines (EXPLAIN) becomes one row per line, `NN)` numbered, with
//!   leading spaces shown as `-` (sqllogictest ignores whitespace);
//! - the working tree's path is shown as `WORKSPACE_ROOT`.

use std::sync::LazyLock;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Float16Type, Float32Type, Float64Type, Schema};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use sqllogictest::ColumnType;

/// Column types in `query` headers, DataFusion's letters: B boolean, D date/time,
/// I integer, P timestamp, R float/decimal, T text, ? anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataFusionColumnType {
    Boolean,
    DateTime,
    Integer,
    Timestamp,
    Float,
    Text,
    Another,
}

impl ColumnType for DataFusionColumnType {
    fn from_char(value: char) -> Option<Self> {
        Some(match value {
            'B' => Self::Boolean,
            'D' => Self::DateTime,
            'I' => Self::Integer,
            'P' => Self::Timestamp,
            'R' => Self::Float,
            'T' => Self::Text,
            _ => Self::Another,
        })
    }

    fn to_char(&self) -> char {
        match self {
            Self::Boolean => 'B',
            Self::DateTime => 'D',
            Self::Integer => 'I',
            Self::Timestamp => 'P',
            Self::Float => 'R',
            Self::Text => 'T',
            Self::Another => '?',
        }
    }
}

/// The header letter of each column.
pub fn column_types(schema: &Schema) -> Vec<DataFusionColumnType> {
    schema
        .fields()
        .iter()
        .map(|f| column_type(f.data_type()))
        .collect()
}

fn column_type(data_type: &DataType) -> DataFusionColumnType {
    match data_type {
        DataType::Boolean => DataFusionColumnType::Boolean,
        dt if dt.is_integer() => DataFusionColumnType::Integer,
        dt if dt.is_floating() || dt.is_decimal() => DataFusionColumnType::Float,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DataFusionColumnType::Text,
        DataType::Date32 | DataType::Date64 | DataType::Time32(_) | DataType::Time64(_) => {
            DataFusionColumnType::DateTime
        }
        DataType::Timestamp(_, _) => DataFusionColumnType::Timestamp,
        DataType::Dictionary(key, value) if key.is_integer() => match value.as_ref() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DataFusionColumnType::Text,
            _ => DataFusionColumnType::Another,
        },
        _ => DataFusionColumnType::Another,
    }
}

/// The rows of `batches`, cells formatted, multi-line last cells expanded and `root` (the
/// working tree) replaced by `WORKSPACE_ROOT`.
pub fn rows(batches: &[RecordBatch], root: &str) -> Result<Vec<Vec<String>>, ArrowError> {
    let options = format_options();
    let mut out = vec![];
    for batch in batches {
        for row in 0..batch.num_rows() {
            let cells = batch
                .columns()
                .iter()
                .map(|col| cell(col, row, &options))
                .collect::<Result<Vec<_>, _>>()?;
            for mut expanded in expand_last_cell(cells) {
                if !root.is_empty() {
                    for c in &mut expanded {
                        if c.contains(root) {
                            *c = c.replace(root, "WORKSPACE_ROOT");
                        }
                    }
                }
                out.push(expanded);
            }
        }
    }
    Ok(out)
}

/// DataFusion's display options (its `FormatOptions` defaults, NULL shown as `NULL`): they
/// differ from Arrow's in the date, timestamp and duration formats.
static DATAFUSION_FORMAT: LazyLock<datafusion::config::FormatOptions> =
    LazyLock::new(|| datafusion::config::FormatOptions {
        null: "NULL".to_string(),
        ..Default::default()
    });

fn format_options() -> FormatOptions<'static> {
    (&*DATAFUSION_FORMAT)
        .try_into()
        .unwrap_or_else(|_| FormatOptions::default().with_null("NULL"))
}

/// One cell.
pub fn cell(col: &ArrayRef, row: usize, options: &FormatOptions) -> Result<String, ArrowError> {
    if col.is_null(row) {
        return Ok("NULL".to_string());
    }
    Ok(match col.data_type() {
        DataType::Null => "NULL".to_string(),
        DataType::Boolean => col.as_boolean().value(row).to_string(),
        DataType::Float16 => float_text(
            col.as_primitive::<Float16Type>().value(row).to_f64(),
            || col.as_primitive::<Float16Type>().value(row).to_string(),
        ),
        DataType::Float32 => {
            let v = col.as_primitive::<Float32Type>().value(row);
            float_text(f64::from(v), || v.to_string())
        }
        DataType::Float64 => {
            let v = col.as_primitive::<Float64Type>().value(row);
            float_text(v, || v.to_string())
        }
        DataType::Decimal32(_, _)
        | DataType::Decimal64(_, _)
        | DataType::Decimal128(_, _)
        | DataType::Decimal256(_, _) => round_decimal_text(
            &ArrayFormatter::try_new(col.as_ref(), options)?
                .value(row)
                .to_string(),
        ),
        DataType::Utf8 => text(col.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => text(col.as_string::<i64>().value(row)),
        DataType::Utf8View => text(col.as_string_view().value(row)),
        DataType::Dictionary(_, _) => {
            let dict = col.as_any_dictionary();
            let key = dict.normalized_keys().get(row).copied().unwrap_or_default();
            return cell(dict.values(), key, options);
        }
        _ => ArrayFormatter::try_new(col.as_ref(), options)?
            .value(row)
            .to_string(),
    })
}

fn text(s: &str) -> String {
    if s.is_empty() {
        "(empty)".to_string()
    } else {
        s.trim_end_matches('\n').replace('\u{0000}', "\\0")
    }
}

/// `display` is the value's own shortest decimal text (Rust never prints exponents there).
fn float_text(value: f64, display: impl FnOnce() -> String) -> String {
    if value.is_nan() {
        "NaN".to_string()
    } else if value == f64::INFINITY {
        "Infinity".to_string()
    } else if value == f64::NEG_INFINITY {
        "-Infinity".to_string()
    } else {
        round_decimal_text(&display())
    }
}

/// Rounds plain decimal text (`-12.3450`) half-to-even to 12 decimals and drops trailing
/// zeros and a trailing point; zero has no sign. Text that is not plain decimal is kept.
pub fn round_decimal_text(s: &str) -> String {
    const PLACES: usize = 12;
    let (negative, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return s.to_string();
    }
    // All digits kept, as one number with PLACES decimals, plus whether to round up.
    let mut kept: Vec<u8> = int.bytes().chain(frac.bytes().take(PLACES)).collect();
    kept.extend(std::iter::repeat_n(b'0', PLACES.saturating_sub(frac.len())));
    let dropped = frac.as_bytes().get(PLACES..).unwrap_or_default();
    let round_up = match dropped.first() {
        Some(&d) if d > b'5' => true,
        Some(b'5') => {
            dropped[1..].iter().any(|&d| d != b'0')
                || kept.last().is_some_and(|&d| (d - b'0') % 2 == 1)
        }
        _ => false,
    };
    if round_up {
        let mut i = kept.len();
        loop {
            if i == 0 {
                kept.insert(0, b'1');
                break;
            }
            i -= 1;
            if kept[i] == b'9' {
                kept[i] = b'0';
            } else {
                kept[i] += 1;
                break;
            }
        }
    }
    let split = kept.len() - PLACES;
    let int_part = std::str::from_utf8(&kept[..split]).unwrap_or("0");
    let int_part = int_part.trim_start_matches('0');
    let frac_part = std::str::from_utf8(&kept[split..])
        .unwrap_or("")
        .trim_end_matches('0');
    let int_part = if int_part.is_empty() { "0" } else { int_part };
    let zero = int_part == "0" && frac_part.is_empty();
    let mut out = String::new();
    if negative && !zero {
        out.push('-');
    }
    out.push_str(int_part);
    if !frac_part.is_empty() {
        out.push('.');
        out.push_str(frac_part);
    }
    out
}

/// A last cell of several lines, as DataFusion prints EXPLAIN: the row with the other
/// cells, then one row per line, `NN)` numbered and leading spaces shown as `-`.
fn expand_last_cell(mut cells: Vec<String>) -> Vec<Vec<String>> {
    let Some(last) = cells.pop() else {
        return vec![cells];
    };
    if !last.contains('\n') {
        cells.push(last);
        return vec![cells];
    }
    let mut out = vec![cells];
    for (i, line) in last.split('\n').enumerate() {
        let content = line.trim_start();
        let indent = "-".repeat(line.len() - content.len());
        out.push(vec![format!("{:02}){indent}{content}", i + 1)]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_text_rounds_half_to_even_to_12_places() {
        for (input, expected) in [
            ("100.00", "100"),
            ("0.30000000000000004", "0.3"),
            ("-0.0000000000001", "0"),
            ("1.0000000000011", "1.000000000001"),
            ("1.0000000000005", "1"),
            ("1.0000000000015", "1.000000000002"),
            ("1.00000000000050001", "1.000000000001"),
            ("9.9999999999999", "10"),
            ("-12.5", "-12.5"),
            (
                "12345678901234567890123456789012345678",
                "12345678901234567890123456789012345678",
            ),
            ("0.12345678901234567890123456789012345678", "0.123456789012"),
            ("abc", "abc"),
        ] {
            assert_eq!(round_decimal_text(input), expected, "{input}");
        }
    }

    #[test]
    fn explain_cells_become_numbered_rows() {
        let rows = expand_last_cell(vec!["plan".into(), "A\n  B".into()]);
        assert_eq!(
            rows,
            vec![
                vec!["plan".to_string()],
                vec!["01)A".to_string()],
                vec!["02)--B".to_string()]
            ]
        );
    }
}
