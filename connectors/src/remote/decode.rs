//! Source values → Arrow arrays: PostgreSQL's binary COPY format, MySQL's text protocol, and
//! typed values from drivers that decode rows themselves (SQL Server's TDS).

use std::sync::Arc;

use std::any::Any;

use bytes::{Bytes, BytesMut};
use datafusion::arrow::array::{
    ArrayBuilder, ArrayRef, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder,
    Decimal256Builder, Float32Builder, Float64Builder, Int8Builder, Int16Builder, Int32Builder,
    Int64Builder, IntervalMonthDayNanoBuilder, ListBuilder, StringArray, StringBuilder,
    Time64MicrosecondBuilder, TimestampMicrosecondBuilder, UInt8Builder, UInt16Builder,
    UInt32Builder, UInt64Builder,
};
use datafusion::arrow::datatypes::{
    DataType, IntervalMonthDayNano, IntervalUnit, SchemaRef, TimeUnit, i256,
};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::error::{DataFusionError, Result};

/// Days from 1970-01-01 to 2000-01-01 (PostgreSQL's epoch).
const PG_EPOCH_DAYS: i32 = 10_957;
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

fn bad(what: &str, detail: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!(
        "cannot read a {what} value from the source: {detail}"
    ))
}

fn be<const N: usize>(v: &[u8], what: &str) -> Result<[u8; N]> {
    v.try_into()
        .map_err(|_| bad(what, format!("{} bytes, expected {N}", v.len())))
}

/// A decimal text split into sign, integer digits and fraction digits.
type DecimalParts<'a> = (bool, &'a [u8], &'a [u8]);

/// The sign, integer digits and fraction digits of a decimal text (`-12.345`; exponents are
/// not produced by sources); `None` for NaN/Infinity (read as NULL).
fn decimal_parts(text: &str) -> Result<Option<DecimalParts<'_>>> {
    let t = text.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if matches!(t.as_bytes().first(), Some(b'N' | b'n' | b'I' | b'i')) {
        return Ok(None);
    }
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().chain(frac.bytes()).all(|c| c.is_ascii_digit())
    {
        return Err(bad("decimal", format!("`{text}`")));
    }
    Ok(Some((neg, int.as_bytes(), frac.as_bytes())))
}

macro_rules! parse_decimal_as {
    ($name:ident, $t:ty, $from:expr, $one:expr) => {
        /// Parses a decimal text into an integer scaled by `scale`, rounding half away from
        /// zero. `None` for NaN/Infinity (read as NULL).
        pub fn $name(text: &str, scale: i8) -> Result<Option<$t>> {
            let Some((neg, int, frac)) = decimal_parts(text)? else {
                return Ok(None);
            };
            let overflow = || bad("decimal", format!("`{text}` overflows"));
            let scale = scale.max(0) as usize;
            let ten: $t = $from(10);
            let mut v: $t = $from(0);
            for &c in int.iter().chain(frac.iter().take(scale)) {
                v = v
                    .checked_mul(ten)
                    .and_then(|v| v.checked_add($from((c - b'0') as i128)))
                    .ok_or_else(overflow)?;
            }
            for _ in frac.len()..scale {
                v = v.checked_mul(ten).ok_or_else(overflow)?;
            }
            if frac.len() > scale && frac[scale] >= b'5' {
                v = v.checked_add($one).ok_or_else(overflow)?;
            }
            Ok(Some(if neg { v.wrapping_neg() } else { v }))
        }
    };
}

parse_decimal_as!(parse_decimal, i256, i256::from_i128, i256::ONE);
parse_decimal_as!(parse_decimal_i128, i128, |v: i128| v, 1i128);

/// PostgreSQL's binary `numeric`: base-10000 digits and the weight of the first one.
struct PgNumeric<'a> {
    negative: bool,
    weight: i32,
    digits: &'a [u8],
}

/// Splits a binary `numeric` (ndigits, weight, sign, dscale, then ndigits base-10000 digits,
/// all big-endian 16-bit); `None` for NaN and ±Infinity (read as NULL).
fn pg_numeric(v: &[u8]) -> Result<Option<PgNumeric<'_>>> {
    let word = |at: usize| u16::from_be_bytes([v[at], v[at + 1]]);
    if v.len() < 8 {
        return Err(bad(
            "numeric",
            format!("{} bytes, expected at least 8", v.len()),
        ));
    }
    let ndigits = word(0) as usize;
    let digits = &v[8..];
    if digits.len() != ndigits * 2 {
        return Err(bad(
            "numeric",
            format!("{} digit bytes, expected {}", digits.len(), ndigits * 2),
        ));
    }
    let negative = match word(4) {
        0x0000 => false,
        0x4000 => true,
        _ => return Ok(None), // NaN, +Infinity, -Infinity
    };
    Ok(Some(PgNumeric {
        negative,
        weight: word(2) as i16 as i32,
        digits,
    }))
}

macro_rules! pg_numeric_as {
    ($name:ident, $t:ty, $from:expr, $one:expr) => {
        /// A binary `numeric` as an integer scaled by `scale`, rounding half away from zero
        /// (no text detour: PostgreSQL sends it cheaper, Basin reads it cheaper).
        pub fn $name(v: &[u8], scale: i8) -> Result<Option<$t>> {
            let Some(n) = pg_numeric(v)? else {
                return Ok(None);
            };
            let overflow = || bad("numeric", "value overflows its Arrow decimal");
            let ten: $t = $from(10);
            let shift = |mut acc: $t, places: i32| -> Result<$t> {
                for _ in 0..places {
                    acc = acc.checked_mul(ten).ok_or_else(overflow)?;
                }
                Ok(acc)
            };
            // Digit i is worth digit * 10^(4 * (weight - i)); scaled, its place is
            // 4 * (weight - i) + scale. `acc` is worth acc * 10^acc_place.
            let mut place = 4 * n.weight + scale.max(0) as i32;
            let (mut acc, mut acc_place): ($t, i32) = ($from(0), 0);
            let mut round_up = false;
            for pair in n.digits.chunks_exact(2) {
                let digit = u16::from_be_bytes([pair[0], pair[1]]) as u32;
                if digit > 9999 {
                    return Err(bad("numeric", format!("digit {digit} is not base 10000")));
                }
                if place >= 0 {
                    acc = acc
                        .checked_mul($from(10_000))
                        .and_then(|a| a.checked_add($from(digit as i128)))
                        .ok_or_else(overflow)?;
                    acc_place = place;
                } else {
                    // The first digit below the scale: its leading part still counts, the
                    // next decimal digit decides the rounding, later digits cannot matter.
                    acc = shift(acc, acc_place)?;
                    acc_place = 0;
                    let drop = (-place) as u32;
                    if drop <= 4 {
                        // u32 arithmetic: i128 division is a library call.
                        acc = acc
                            .checked_add($from((digit / 10u32.pow(drop)) as i128))
                            .ok_or_else(overflow)?;
                        round_up = digit / 10u32.pow(drop - 1) % 10 >= 5;
                    }
                    break;
                }
                place -= 4;
            }
            let mut acc = shift(acc, acc_place)?;
            if round_up {
                acc = acc.checked_add($one).ok_or_else(overflow)?;
            }
            Ok(Some(if n.negative { acc.wrapping_neg() } else { acc }))
        }
    };
}

pg_numeric_as!(pg_numeric_i256, i256, i256::from_i128, i256::ONE);
pg_numeric_as!(pg_numeric_i128_general, i128, |v: i128| v, 1i128);

/// 10^i for every power an i128 can hold.
const POW10_I128: [i128; 39] = {
    let mut t = [1i128; 39];
    let mut i = 1;
    while i < 39 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// A binary `numeric` as an i128 scaled by `scale`, rounding half away from zero.
pub fn pg_numeric_i128(v: &[u8], scale: i8) -> Result<Option<i128>> {
    match small_numeric(v, scale) {
        Some(x) => Ok(Some(x)),
        None => pg_numeric_i128_general(v, scale),
    }
}

/// The common `numeric` the quick way: at most four base-10000 digits (16 decimal digits,
/// summed in a u64) and at most one digit's worth below the scale (`numeric(15,2)` sends
/// 0.05 as the digit 500 at weight -1). `None` leaves it to [`pg_numeric_i128_general`]
/// (more digits, NaN, malformed input, overflow).
#[inline]
fn small_numeric(v: &[u8], scale: i8) -> Option<i128> {
    if v.len() < 8 || scale < 0 {
        return None;
    }
    let ndigits = u16::from_be_bytes([v[0], v[1]]) as usize;
    if ndigits > 4 || v.len() != 8 + 2 * ndigits {
        return None;
    }
    let negative = match u16::from_be_bytes([v[4], v[5]]) {
        0x0000 => false,
        0x4000 => true,
        _ => return None,
    };
    if ndigits == 0 {
        return Some(0);
    }
    let mut acc: u64 = 0;
    for pair in v[8..].chunks_exact(2) {
        let digit = u16::from_be_bytes([pair[0], pair[1]]);
        if digit > 9999 {
            return None;
        }
        acc = acc * 10_000 + digit as u64;
    }
    // The scaled place of the last digit: acc is worth acc * 10^place.
    let weight = i16::from_be_bytes([v[2], v[3]]) as i32;
    let place = 4 * (weight - ndigits as i32 + 1) + scale as i32;
    let magnitude = if place >= 0 {
        (acc as i128).checked_mul(*POW10_I128.get(place as usize)?)?
    } else {
        // Constant divisors: the compiler multiplies instead of dividing.
        let (kept, next) = match -place {
            1 => (acc / 10, acc % 10),
            2 => (acc / 100, acc % 100 / 10),
            3 => (acc / 1_000, acc % 1_000 / 100),
            4 => (acc / 10_000, acc % 10_000 / 1_000),
            _ => return None,
        };
        kept as i128 + i128::from(next >= 5)
    };
    Some(if negative { -magnitude } else { magnitude })
}

fn parse_date(text: &str) -> Result<Option<i32>> {
    if text.starts_with("0000-00-00") {
        return Ok(None); // MySQL's zero date
    }
    let d = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map_err(|e| bad("date", format!("`{text}`: {e}")))?;
    Ok(Some(
        (d - chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch")).num_days() as i32,
    ))
}

fn parse_timestamp(text: &str) -> Result<Option<i64>> {
    if text.starts_with("0000-00-00") {
        return Ok(None);
    }
    let t = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
        .map_err(|e| bad("timestamp", format!("`{text}`: {e}")))?;
    Ok(Some(t.and_utc().timestamp_micros()))
}

fn parse_time(text: &str) -> Result<i64> {
    let t = chrono::NaiveTime::parse_from_str(text, "%H:%M:%S%.f").map_err(|e| {
        bad(
            "time",
            format!("`{text}` ({e}); MySQL TIME values outside 00:00:00–23:59:59 are not read"),
        )
    })?;
    use chrono::Timelike;
    Ok(t.num_seconds_from_midnight() as i64 * 1_000_000 + (t.nanosecond() / 1000) as i64)
}

fn parse_num<T: std::str::FromStr>(text: &str, what: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    text.trim()
        .parse()
        .map_err(|e| bad(what, format!("`{text}`: {e}")))
}

/// One column's Arrow builder, typed once per column: a value is appended with one `match`
/// instead of a trait-object downcast and a data-type lookup per value.
enum Builder {
    Boolean(BooleanBuilder),
    Int8(Int8Builder),
    Int16(Int16Builder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    UInt8(UInt8Builder),
    UInt16(UInt16Builder),
    UInt32(UInt32Builder),
    UInt64(UInt64Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Utf8(StringBuilder),
    /// A result column of text: values appended as received and checked as UTF-8 once per
    /// batch (`Columns::finish`), not one by one.
    Text(BinaryBuilder),
    Binary(BinaryBuilder),
    Date32(Date32Builder),
    Timestamp(TimestampMicrosecondBuilder),
    Time64(Time64MicrosecondBuilder),
    Interval(IntervalMonthDayNanoBuilder),
    Decimal128(Decimal128Builder, i8),
    Decimal256(Decimal256Builder, i8),
    List(Box<ListBuilder<Builder>>),
}

/// Runs `$e` with `$b` bound to the concrete builder inside a `Builder`.
macro_rules! each_builder {
    ($self:expr, $b:ident => $e:expr) => {
        match $self {
            Builder::Boolean($b) => $e,
            Builder::Int8($b) => $e,
            Builder::Int16($b) => $e,
            Builder::Int32($b) => $e,
            Builder::Int64($b) => $e,
            Builder::UInt8($b) => $e,
            Builder::UInt16($b) => $e,
            Builder::UInt32($b) => $e,
            Builder::UInt64($b) => $e,
            Builder::Float32($b) => $e,
            Builder::Float64($b) => $e,
            Builder::Utf8($b) => $e,
            Builder::Text($b) => $e,
            Builder::Binary($b) => $e,
            Builder::Date32($b) => $e,
            Builder::Timestamp($b) => $e,
            Builder::Time64($b) => $e,
            Builder::Interval($b) => $e,
            Builder::Decimal128($b, _) => $e,
            Builder::Decimal256($b, _) => $e,
            Builder::List($b) => $e,
        }
    };
}

impl Builder {
    /// The builder of a result column: text columns are `Text`; `bytes` sizes the value
    /// buffer of text and binary columns.
    fn column(data_type: &DataType, capacity: usize, bytes: usize) -> Result<Self> {
        Ok(match data_type {
            DataType::Utf8 => Self::Text(BinaryBuilder::with_capacity(capacity, bytes)),
            DataType::Binary => Self::Binary(BinaryBuilder::with_capacity(capacity, bytes)),
            other => Self::new(other, capacity)?,
        })
    }

    fn new(data_type: &DataType, capacity: usize) -> Result<Self> {
        Ok(match data_type {
            DataType::Boolean => Self::Boolean(BooleanBuilder::with_capacity(capacity)),
            DataType::Int8 => Self::Int8(Int8Builder::with_capacity(capacity)),
            DataType::Int16 => Self::Int16(Int16Builder::with_capacity(capacity)),
            DataType::Int32 => Self::Int32(Int32Builder::with_capacity(capacity)),
            DataType::Int64 => Self::Int64(Int64Builder::with_capacity(capacity)),
            DataType::UInt8 => Self::UInt8(UInt8Builder::with_capacity(capacity)),
            DataType::UInt16 => Self::UInt16(UInt16Builder::with_capacity(capacity)),
            DataType::UInt32 => Self::UInt32(UInt32Builder::with_capacity(capacity)),
            DataType::UInt64 => Self::UInt64(UInt64Builder::with_capacity(capacity)),
            DataType::Float32 => Self::Float32(Float32Builder::with_capacity(capacity)),
            DataType::Float64 => Self::Float64(Float64Builder::with_capacity(capacity)),
            DataType::Utf8 => Self::Utf8(StringBuilder::with_capacity(capacity, capacity * 16)),
            DataType::Binary => Self::Binary(BinaryBuilder::with_capacity(capacity, capacity * 16)),
            DataType::Date32 => Self::Date32(Date32Builder::with_capacity(capacity)),
            DataType::Timestamp(TimeUnit::Microsecond, tz) => Self::Timestamp(
                TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone_opt(tz.clone()),
            ),
            DataType::Time64(TimeUnit::Microsecond) => {
                Self::Time64(Time64MicrosecondBuilder::with_capacity(capacity))
            }
            DataType::Interval(IntervalUnit::MonthDayNano) => {
                Self::Interval(IntervalMonthDayNanoBuilder::with_capacity(capacity))
            }
            DataType::Decimal128(p, s) => Self::Decimal128(
                Decimal128Builder::with_capacity(capacity).with_precision_and_scale(*p, *s)?,
                *s,
            ),
            DataType::Decimal256(p, s) => Self::Decimal256(
                Decimal256Builder::with_capacity(capacity).with_precision_and_scale(*p, *s)?,
                *s,
            ),
            DataType::List(item) => Self::List(Box::new(
                ListBuilder::with_capacity(Builder::new(item.data_type(), capacity)?, capacity)
                    .with_field(item.clone()),
            )),
            other => {
                return Err(DataFusionError::Internal(format!(
                    "no reader for source values of type {other}"
                )));
            }
        })
    }

    /// The Arrow type this builder makes (for errors).
    fn data_type(&self) -> DataType {
        match self {
            Builder::Boolean(_) => DataType::Boolean,
            Builder::Int8(_) => DataType::Int8,
            Builder::Int16(_) => DataType::Int16,
            Builder::Int32(_) => DataType::Int32,
            Builder::Int64(_) => DataType::Int64,
            Builder::UInt8(_) => DataType::UInt8,
            Builder::UInt16(_) => DataType::UInt16,
            Builder::UInt32(_) => DataType::UInt32,
            Builder::UInt64(_) => DataType::UInt64,
            Builder::Float32(_) => DataType::Float32,
            Builder::Float64(_) => DataType::Float64,
            Builder::Utf8(_) | Builder::Text(_) => DataType::Utf8,
            Builder::Binary(_) => DataType::Binary,
            Builder::Date32(_) => DataType::Date32,
            Builder::Timestamp(_) => DataType::Timestamp(TimeUnit::Microsecond, None),
            Builder::Time64(_) => DataType::Time64(TimeUnit::Microsecond),
            Builder::Interval(_) => DataType::Interval(IntervalUnit::MonthDayNano),
            Builder::Decimal128(_, s) => DataType::Decimal128(38, *s),
            Builder::Decimal256(_, s) => DataType::Decimal256(76, *s),
            Builder::List(_) => DataType::List(Arc::new(datafusion::arrow::datatypes::Field::new(
                "item",
                DataType::Null,
                true,
            ))),
        }
    }

    fn append_null(&mut self) {
        each_builder!(self, b => b.append_null())
    }

    /// The length of every non-NULL PostgreSQL binary value this builder reads, when fixed.
    fn pg_width(&self) -> i32 {
        match self {
            Self::Boolean(_) => 1,
            Self::Int16(_) => 2,
            Self::Int32(_) | Self::Float32(_) | Self::Date32(_) => 4,
            Self::Int64(_) | Self::Float64(_) | Self::Timestamp(_) | Self::Time64(_) => 8,
            Self::Interval(_) => 16,
            _ => VARIABLE,
        }
    }
}

impl ArrayBuilder for Builder {
    fn len(&self) -> usize {
        each_builder!(self, b => b.len())
    }

    fn finish(&mut self) -> ArrayRef {
        each_builder!(self, b => Arc::new(b.finish()))
    }

    fn finish_cloned(&self) -> ArrayRef {
        each_builder!(self, b => Arc::new(b.finish_cloned()))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn into_box_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Column builders, one per result column.
pub struct Columns {
    schema: SchemaRef,
    builders: Vec<Builder>,
    rows: usize,
    /// Rows per batch the builders are sized for.
    capacity: usize,
    /// Per column, the byte length of every non-NULL value in PostgreSQL's binary format
    /// (8 for an `int8`), or [`VARIABLE`] (text, `numeric`, arrays).
    pg_widths: Vec<i32>,
    /// Per column, where the current row's value starts and its length (-1: NULL): scratch
    /// space of [`parse_rows`], kept to not allocate per batch.
    spans: Vec<(usize, i32)>,
}

/// A value length PostgreSQL never sends (NULL is -1): the width of variable-length columns.
const VARIABLE: i32 = -2;

/// Bytes reserved per text or binary value before a batch has shown how long they are.
const FIRST_VALUE_BYTES: usize = 16;

impl Columns {
    /// Fails for a column type no source reader produces (the type mapping never asks).
    pub fn new(schema: SchemaRef, capacity: usize) -> Result<Self> {
        let builders = schema
            .fields()
            .iter()
            .map(|f| Builder::column(f.data_type(), capacity, capacity * FIRST_VALUE_BYTES))
            .collect::<Result<Vec<Builder>>>()?;
        let pg_widths = builders.iter().map(Builder::pg_width).collect();
        let spans = vec![(0, 0); builders.len()];
        Ok(Self {
            schema,
            builders,
            rows: 0,
            capacity,
            pg_widths,
            spans,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn width(&self) -> usize {
        self.builders.len()
    }

    /// Marks the end of a row.
    pub fn end_row(&mut self) {
        self.rows += 1;
    }

    /// Takes the rows collected so far as a batch.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.builders.len());
        for (builder, field) in self.builders.iter_mut().zip(self.schema.fields()) {
            // A builder gives its buffers away when it finishes and would regrow them value
            // by value for the next batch (a copy at every doubling): start the next batch
            // with buffers the size of this one's instead.
            let bytes = match &*builder {
                Builder::Text(b) | Builder::Binary(b) => b.values_slice().len(),
                _ => 0,
            };
            let array: ArrayRef = match &mut *builder {
                Builder::Text(b) => {
                    Arc::new(StringArray::try_from_binary(b.finish()).map_err(|e| {
                        bad(
                            "text",
                            format!(
                                "column `{}` holds bytes that are not UTF-8: {e}",
                                field.name()
                            ),
                        )
                    })?)
                }
                other => other.finish(),
            };
            arrays.push(array);
            let bytes = (bytes + bytes / 8).max(self.capacity * FIRST_VALUE_BYTES);
            *builder = Builder::column(field.data_type(), self.capacity, bytes)?;
        }
        // A query may need rows but no columns (`count(*)` over a subquery).
        let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
        self.rows = 0;
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &options,
        )?)
    }

    /// Appends one PostgreSQL binary-format value (`None` = NULL) to column `i` (COPY rows
    /// decode straight into the builders, `parse_rows`).
    #[cfg(test)]
    pub fn push_pg(&mut self, i: usize, value: Option<&[u8]>) -> Result<()> {
        push_pg(&mut self.builders[i], value)
    }

    /// Appends one MySQL text-protocol value to column `i`.
    pub fn push_mysql(&mut self, i: usize, value: Option<&[u8]>) -> Result<()> {
        push_mysql(&mut self.builders[i], value)
    }

    /// Appends one value a driver decoded to column `i`.
    pub fn push_value(&mut self, i: usize, value: Value<'_>) -> Result<()> {
        push_value(&mut self.builders[i], value)
    }
}

/// A value as a driver decodes it, before it meets the column's Arrow type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(&'a str),
    Bytes(&'a [u8]),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since midnight.
    Time(i64),
    /// Microseconds since 1970-01-01 00:00 (UTC for zoned columns).
    Timestamp(i64),
    /// An unscaled value and its scale.
    Decimal(i128, u8),
}

fn push_value(b: &mut Builder, value: Value<'_>) -> Result<()> {
    let mismatch = |b: &Builder| {
        Err(DataFusionError::Internal(format!(
            "a source value {value:?} does not fit a column read as {}",
            b.data_type()
        )))
    };
    let int = |v: i64, what: &str| bad(what, format!("{v} is out of range"));
    match (b, value) {
        (b, Value::Null) => b.append_null(),
        (Builder::Boolean(b), Value::Bool(v)) => b.append_value(v),
        (Builder::Int16(b), Value::Int(v)) => {
            b.append_value(i16::try_from(v).map_err(|_| int(v, "smallint"))?)
        }
        (Builder::Int32(b), Value::Int(v)) => {
            b.append_value(i32::try_from(v).map_err(|_| int(v, "int"))?)
        }
        (Builder::Int64(b), Value::Int(v)) => b.append_value(v),
        (Builder::Float32(b), Value::Float(v)) => b.append_value(v as f32),
        (Builder::Float64(b), Value::Float(v)) => b.append_value(v),
        (Builder::Text(b), Value::Text(v)) => b.append_value(v.as_bytes()),
        (Builder::Utf8(b), Value::Text(v)) => b.append_value(v),
        (Builder::Binary(b), Value::Bytes(v)) => b.append_value(v),
        (Builder::Date32(b), Value::Date(v)) => b.append_value(v),
        (Builder::Time64(b), Value::Time(v)) => b.append_value(v),
        (Builder::Timestamp(b), Value::Timestamp(v)) => b.append_value(v),
        (Builder::Decimal128(b, s), Value::Decimal(v, scale)) => {
            b.append_value(rescale(v, scale, *s)?)
        }
        (Builder::Decimal256(b, s), Value::Decimal(v, scale)) => {
            b.append_value(i256::from_i128(rescale(v, scale, *s)?))
        }
        (b, _) => return mismatch(b),
    }
    Ok(())
}

/// `v` (at `from` digits after the point) at `to` digits; a value that would lose digits is
/// an error, never silently rounded.
fn rescale(v: i128, from: u8, to: i8) -> Result<i128> {
    let to = to.max(0) as u8;
    let overflow = || bad("decimal", format!("{v}e-{from} does not fit scale {to}"));
    if from == to {
        return Ok(v);
    }
    let factor = 10i128
        .checked_pow(u32::from(from.abs_diff(to)))
        .ok_or_else(overflow)?;
    if from < to {
        v.checked_mul(factor).ok_or_else(overflow)
    } else if v % factor == 0 {
        Ok(v / factor)
    } else {
        Err(overflow())
    }
}

fn text<'a>(v: &'a [u8], what: &str) -> Result<&'a str> {
    std::str::from_utf8(v).map_err(|e| bad(what, e))
}

#[inline]
fn push_pg(b: &mut Builder, value: Option<&[u8]>) -> Result<()> {
    let Some(v) = value else {
        b.append_null();
        return Ok(());
    };
    match b {
        Builder::Boolean(b) => b.append_value(v.first() == Some(&1)),
        Builder::Int16(b) => b.append_value(i16::from_be_bytes(be(v, "int2")?)),
        Builder::Int32(b) => b.append_value(i32::from_be_bytes(be(v, "int4")?)),
        Builder::Int64(b) => b.append_value(i64::from_be_bytes(be(v, "int8")?)),
        Builder::Float32(b) => b.append_value(f32::from_be_bytes(be(v, "float4")?)),
        Builder::Float64(b) => b.append_value(f64::from_be_bytes(be(v, "float8")?)),
        Builder::Utf8(b) => b.append_value(text(v, "text")?),
        Builder::Text(b) | Builder::Binary(b) => b.append_value(v),
        Builder::Date32(b) => {
            let d = i32::from_be_bytes(be(v, "date")?);
            // ±infinity are i32::MAX / i32::MIN: no Arrow date can hold them.
            if d == i32::MAX || d == i32::MIN {
                b.append_null()
            } else {
                b.append_value(d + PG_EPOCH_DAYS)
            }
        }
        Builder::Timestamp(b) => {
            let t = i64::from_be_bytes(be(v, "timestamp")?);
            if t == i64::MAX || t == i64::MIN {
                b.append_null()
            } else {
                b.append_value(t + PG_EPOCH_MICROS)
            }
        }
        Builder::Time64(b) => b.append_value(i64::from_be_bytes(be(v, "time")?)),
        Builder::Interval(b) => {
            let raw: [u8; 16] = be(v, "interval")?;
            let micros = i64::from_be_bytes(be(&raw[0..8], "interval")?);
            let days = i32::from_be_bytes(be(&raw[8..12], "interval")?);
            let months = i32::from_be_bytes(be(&raw[12..16], "interval")?);
            b.append_value(IntervalMonthDayNano::new(months, days, micros * 1000))
        }
        Builder::Decimal128(b, s) => b.append_option(pg_numeric_i128(v, *s)?),
        Builder::Decimal256(b, s) => b.append_option(pg_numeric_i256(v, *s)?),
        Builder::List(b) => push_pg_array(b, v)?,
        Builder::Int8(_)
        | Builder::UInt8(_)
        | Builder::UInt16(_)
        | Builder::UInt32(_)
        | Builder::UInt64(_) => {
            return Err(DataFusionError::Internal(
                "PostgreSQL has no one-byte or unsigned integer columns".into(),
            ));
        }
    }
    Ok(())
}

/// A binary array: ndim, has-null flag, element oid, (length, lower bound) per dimension,
/// then each element as (length, bytes). Multi-dimensional arrays are read flattened.
fn push_pg_array(b: &mut ListBuilder<Builder>, v: &[u8]) -> Result<()> {
    let word = |at: usize| -> Result<i32> {
        let w = v.get(at..at + 4).ok_or_else(|| bad("array", "truncated"))?;
        Ok(i32::from_be_bytes(be(w, "array")?))
    };
    let ndim = word(0)?.max(0) as usize;
    let mut count: usize = if ndim == 0 { 0 } else { 1 };
    for d in 0..ndim {
        count = count.saturating_mul(word(12 + d * 8)?.max(0) as usize);
    }
    let mut at = 12 + ndim * 8;
    for _ in 0..count {
        let len = word(at)?;
        at += 4;
        if len < 0 {
            push_pg(b.values(), None)?;
        } else {
            let end = at + len as usize;
            let element = v.get(at..end).ok_or_else(|| bad("array", "truncated"))?;
            push_pg(b.values(), Some(element))?;
            at = end;
        }
    }
    b.append(true);
    Ok(())
}

fn push_mysql(b: &mut Builder, value: Option<&[u8]>) -> Result<()> {
    let Some(v) = value else {
        b.append_null();
        return Ok(());
    };
    match b {
        Builder::Text(b) | Builder::Binary(b) => {
            b.append_value(v);
            return Ok(());
        }
        Builder::UInt64(b) if !v.iter().all(u8::is_ascii_digit) || v.is_empty() => {
            // BIT(n) arrives as big-endian bytes.
            let mut n = 0u64;
            for byte in v.iter().rev().take(8).rev() {
                n = (n << 8) | *byte as u64;
            }
            b.append_value(n);
            return Ok(());
        }
        Builder::Boolean(b) if v.len() == 1 && v[0] <= 1 => {
            // BIT(1) arrives as one raw byte.
            b.append_value(v[0] == 1);
            return Ok(());
        }
        _ => {}
    }
    let t = text(v, "text")?;
    match b {
        Builder::Boolean(b) => b.append_value(parse_num::<i64>(t, "boolean")? != 0),
        Builder::Int8(b) => b.append_value(parse_num(t, "tinyint")?),
        Builder::Int16(b) => b.append_value(parse_num(t, "smallint")?),
        Builder::Int32(b) => b.append_value(parse_num(t, "int")?),
        Builder::Int64(b) => b.append_value(parse_num(t, "bigint")?),
        Builder::UInt8(b) => b.append_value(parse_num(t, "tinyint unsigned")?),
        Builder::UInt16(b) => b.append_value(parse_num(t, "smallint unsigned")?),
        Builder::UInt32(b) => b.append_value(parse_num(t, "int unsigned")?),
        Builder::UInt64(b) => b.append_value(parse_num(t, "bigint unsigned")?),
        Builder::Float32(b) => b.append_value(parse_num(t, "float")?),
        Builder::Float64(b) => b.append_value(parse_num(t, "double")?),
        Builder::Utf8(b) => b.append_value(t),
        Builder::Date32(b) => b.append_option(parse_date(t)?),
        Builder::Timestamp(b) => b.append_option(parse_timestamp(t)?),
        Builder::Time64(b) => b.append_value(parse_time(t)?),
        Builder::Decimal128(b, s) => b.append_option(parse_decimal_i128(t, *s)?),
        Builder::Decimal256(b, s) => b.append_option(parse_decimal(t, *s)?),
        Builder::Text(_) | Builder::Binary(_) | Builder::Interval(_) | Builder::List(_) => {
            return Err(DataFusionError::Internal(
                "MySQL values are not read as intervals or lists".into(),
            ));
        }
    }
    Ok(())
}

/// Incremental parser of PostgreSQL's binary COPY stream.
///
/// PostgreSQL sends one row per CopyData message, so a chunk usually holds whole rows and is
/// decoded where it lies; bytes are copied only when a row straddles chunks.
pub struct CopyParser {
    buf: Unparsed,
    pos: usize,
    header_done: bool,
    pub done: bool,
}

/// The bytes not decoded yet (from `pos` on).
enum Unparsed {
    /// The last chunk fed, as received.
    Chunk(Bytes),
    /// Chunks joined because a row straddles them.
    Joined(BytesMut),
}

impl Unparsed {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Chunk(b) => b,
            Self::Joined(b) => b,
        }
    }
}

impl Default for CopyParser {
    fn default() -> Self {
        Self::new()
    }
}

const COPY_SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

impl CopyParser {
    pub fn new() -> Self {
        Self {
            buf: Unparsed::Chunk(Bytes::new()),
            pos: 0,
            header_done: false,
            done: false,
        }
    }

    /// Adds a chunk of the stream.
    pub fn feed(&mut self, chunk: Bytes) {
        let left = self.buf.bytes().len() - self.pos;
        if left == 0 {
            self.buf = Unparsed::Chunk(chunk);
        } else {
            let joined = match &mut self.buf {
                Unparsed::Joined(joined) => {
                    let _ = joined.split_to(self.pos);
                    std::mem::take(joined)
                }
                Unparsed::Chunk(last) => {
                    let mut joined = BytesMut::with_capacity(left + chunk.len());
                    joined.extend_from_slice(&last[self.pos..]);
                    joined
                }
            };
            let mut joined = joined;
            joined.extend_from_slice(&chunk);
            self.buf = Unparsed::Joined(joined);
        }
        self.pos = 0;
    }

    /// Decodes every complete row buffered so far into `columns`, stopping early once
    /// `columns` holds `max_rows`.
    pub fn parse(&mut self, columns: &mut Columns, max_rows: usize) -> Result<()> {
        parse_rows(
            self.buf.bytes(),
            &mut self.pos,
            &mut self.header_done,
            &mut self.done,
            columns,
            max_rows,
        )
    }

    /// Decodes the complete rows of `chunk`, the next bytes of the stream, where they lie,
    /// stopping early once `columns` holds `max_rows`; returns how many bytes of `chunk` it
    /// took. Bytes it did not take go to [`CopyParser::keep`] before the next chunk. While
    /// an earlier row is incomplete, `chunk` is copied behind it and taken whole.
    pub fn parse_slice(
        &mut self,
        chunk: &[u8],
        columns: &mut Columns,
        max_rows: usize,
    ) -> Result<usize> {
        if self.pos < self.buf.bytes().len() {
            self.feed(Bytes::copy_from_slice(chunk));
            self.parse(columns, max_rows)?;
            return Ok(chunk.len());
        }
        let mut pos = 0;
        parse_rows(
            chunk,
            &mut pos,
            &mut self.header_done,
            &mut self.done,
            columns,
            max_rows,
        )?;
        Ok(pos)
    }

    /// Keeps the bytes of a chunk that [`CopyParser::parse_slice`] did not take (the start
    /// of a row that continues in the next chunk).
    pub fn keep(&mut self, rest: &[u8]) {
        if !rest.is_empty() {
            self.feed(Bytes::copy_from_slice(rest));
        }
    }
}

/// Where each value of the row at the start of `row` (after its field count) starts and
/// its length, into `spans`; the row's length, or `None` when `row` ends before the row.
#[inline]
fn row_spans(row: &[u8], widths: &[i32], spans: &mut [(usize, i32)]) -> Option<usize> {
    let mut at = 2;
    for (span, &width) in spans.iter_mut().zip(widths) {
        let len = i32::from_be_bytes(row.get(at..at + 4)?.try_into().ok()?);
        *span = (at + 4, len);
        at += 4;
        if width != VARIABLE {
            if len == width {
                at += width as usize;
            } else {
                at += unexpected_width(len);
            }
        } else {
            at += len.max(0) as usize;
        }
        if at > row.len() {
            return None;
        }
    }
    Some(at)
}

/// The bytes a value of a fixed-width column takes when not its width: NULL (-1) takes
/// none; a wrong length (which the column's decoder rejects) its own. Out of line, so that
/// the width test in [`row_spans`] stays a branch the processor predicts.
#[cold]
#[inline(never)]
fn unexpected_width(len: i32) -> usize {
    len.max(0) as usize
}

/// Decodes the complete rows of `buf` from `*pos` on (the stream's header first, once),
/// stopping at an incomplete row, at the trailer (`done`), or when `columns` holds
/// `max_rows`.
fn parse_rows(
    buf: &[u8],
    pos: &mut usize,
    header_done: &mut bool,
    done: &mut bool,
    columns: &mut Columns,
    max_rows: usize,
) -> Result<()> {
    if !*header_done {
        if buf.len() < *pos + 19 {
            return Ok(());
        }
        let head = &buf[*pos..];
        if &head[..11] != COPY_SIGNATURE {
            return Err(bad("COPY", "missing binary COPY signature"));
        }
        let ext = u32::from_be_bytes(be(&head[15..19], "COPY header")?) as usize;
        if buf.len() < *pos + 19 + ext {
            return Ok(());
        }
        *pos += 19 + ext;
        *header_done = true;
    }
    let width = columns.width();
    while !*done && columns.rows() < max_rows {
        let row = &buf[*pos..];
        if row.len() < 2 {
            return Ok(());
        }
        let fields = i16::from_be_bytes([row[0], row[1]]);
        if fields == -1 {
            *done = true;
            return Ok(());
        }
        if fields as usize != width {
            return Err(bad(
                "COPY",
                format!("row has {fields} fields, expected {width}"),
            ));
        }
        // Find where each value lies first, so a row is decoded only when it is complete.
        // Each length says where the next one is, a chain of dependent loads: for a column
        // of fixed width the next position is known before its length is read (checked
        // after, off the chain), so only variable-length values wait on their length.
        let Some(end) = row_spans(row, &columns.pg_widths, &mut columns.spans) else {
            return Ok(());
        };
        // The positions are known: the values decode independently of each other.
        for (builder, &(start, len)) in columns.builders.iter_mut().zip(&columns.spans) {
            let value = (len >= 0).then(|| &row[start..start + len as usize]);
            push_pg(builder, value)?;
        }
        columns.end_row();
        *pos += end;
    }
    Ok(())
}

/// A schema's columns made nullable: sources do not promise what Basin's plan assumed.
pub fn nullable(schema: &SchemaRef) -> SchemaRef {
    Arc::new(datafusion::arrow::datatypes::Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_round_half_away_from_zero() {
        assert_eq!(
            parse_decimal("12.345", 2).unwrap(),
            Some(i256::from_i128(1235))
        );
        assert_eq!(parse_decimal("-0.5", 0).unwrap(), Some(i256::from_i128(-1)));
        assert_eq!(parse_decimal("7", 3).unwrap(), Some(i256::from_i128(7000)));
        assert_eq!(parse_decimal("NaN", 2).unwrap(), None);
        assert!(parse_decimal("12x", 2).is_err());
        assert_eq!(parse_decimal_i128("12.345", 2).unwrap(), Some(1235));
        assert_eq!(parse_decimal_i128("-12.344", 2).unwrap(), Some(-1234));
        assert_eq!(parse_decimal_i128("+.5", 0).unwrap(), Some(1));
        assert_eq!(parse_decimal_i128("-Infinity", 2).unwrap(), None);
        assert!(parse_decimal_i128("", 2).is_err());
        assert!(parse_decimal_i128("-", 2).is_err());
        assert!(parse_decimal_i128(&"9".repeat(39), 0).is_err());
        assert_eq!(
            parse_decimal(&"9".repeat(39), 0).unwrap(),
            i256::from_string(&"9".repeat(39))
        );
    }

    /// numeric_send's layout: ndigits, weight, sign, dscale, then base-10000 digits.
    fn numeric(negative: bool, weight: i16, digits: &[u16]) -> Vec<u8> {
        let mut v = (digits.len() as u16).to_be_bytes().to_vec();
        v.extend_from_slice(&weight.to_be_bytes());
        v.extend_from_slice(&(if negative { 0x4000u16 } else { 0 }).to_be_bytes());
        v.extend_from_slice(&0u16.to_be_bytes());
        for d in digits {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v
    }

    #[test]
    fn binary_numerics_scale_and_round_half_away_from_zero() {
        let at = |v: Vec<u8>, s| pg_numeric_i128(&v, s).unwrap();
        // 21168.23 = [2, 1168, 2300] with weight 1
        assert_eq!(at(numeric(false, 1, &[2, 1168, 2300]), 2), Some(2_116_823));
        assert_eq!(at(numeric(true, 1, &[2, 1168, 2300]), 2), Some(-2_116_823));
        assert_eq!(at(numeric(false, 1, &[2, 1168, 2300]), 0), Some(21_168));
        assert_eq!(at(numeric(false, 1, &[2, 1168, 5000]), 0), Some(21_169));
        assert_eq!(at(numeric(true, 1, &[2, 1168, 5000]), 0), Some(-21_169));
        assert_eq!(at(numeric(false, 1, &[2, 1168, 2350]), 1), Some(211_682));
        assert_eq!(
            at(numeric(false, 1, &[2, 1168, 2350, 5000]), 3),
            Some(21_168_235)
        );
        assert_eq!(
            at(numeric(false, 1, &[2, 1168, 2350, 5000]), 5),
            Some(2_116_823_505)
        );
        // 10000 (trailing zero digits are not sent) and 0 (no digits)
        assert_eq!(at(numeric(false, 1, &[1]), 3), Some(10_000_000));
        assert_eq!(at(numeric(false, 0, &[]), 2), Some(0));
        // 0.00005 at scale 4 rounds up; 0.000004 at scale 4 is 0
        assert_eq!(at(numeric(false, -2, &[5000]), 4), Some(1));
        assert_eq!(at(numeric(false, -2, &[400]), 4), Some(0));
        assert_eq!(at(numeric(false, -3, &[9999]), 2), Some(0));
        // 0.12345678 at scale 10 (more digits than needed: none dropped)
        assert_eq!(
            at(numeric(false, -1, &[1234, 5678]), 10),
            Some(1_234_567_800)
        );
        // NaN and infinities read as NULL
        let mut nan = numeric(false, 0, &[]);
        nan[4] = 0xC0;
        assert_eq!(at(nan, 2), None);
        // overflow and malformed input are errors, not panics
        assert!(pg_numeric_i128(&numeric(false, 10, &[1]), 0).is_err());
        assert_eq!(
            pg_numeric_i256(&numeric(false, 10, &[1]), 0).unwrap(),
            Some(i256::from_string(&format!("1{}", "0".repeat(40))).unwrap())
        );
        assert!(pg_numeric_i128(&[0, 1, 0, 0], 2).is_err());
        assert!(pg_numeric_i128(&numeric(false, 0, &[10_000]), 2).is_err());
        let mut short = numeric(false, 0, &[1, 2]);
        short.pop();
        assert!(pg_numeric_i128(&short, 2).is_err());
    }

    #[test]
    fn the_quick_numeric_path_agrees_with_the_general_one() {
        // A deterministic spread of digit counts, weights, signs, digits and scales,
        // values below and above the scale, zeros, 9999s and fives that round.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let special = [0u16, 1, 5, 9, 10, 50, 500, 4999, 5000, 5001, 9999];
        let mut quick = 0;
        for _ in 0..200_000 {
            let ndigits = next(6) as usize;
            let digits: Vec<u16> = (0..ndigits)
                .map(|_| match next(3) {
                    0 => special[next(special.len() as u64) as usize],
                    _ => next(10_000) as u16,
                })
                .collect();
            let weight = next(12) as i16 - 6;
            let scale = next(12) as i8;
            let v = numeric(next(2) == 1, weight, &digits);
            let general = pg_numeric_i128_general(&v, scale).map_err(|e| e.to_string());
            if let Some(x) = small_numeric(&v, scale) {
                quick += 1;
                assert_eq!(
                    Ok(Some(x)),
                    general,
                    "{digits:?} weight {weight} scale {scale}"
                );
            }
            assert_eq!(
                pg_numeric_i128(&v, scale).map_err(|e| e.to_string()),
                general
            );
        }
        assert!(quick > 50_000, "the quick path took only {quick} values");
    }

    #[test]
    fn copy_rows_split_across_chunks() {
        use datafusion::arrow::datatypes::{Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            Field::new("c0", DataType::Int32, true),
            Field::new("c1", DataType::Utf8, true),
        ]));
        let stream = copy_stream(&[
            vec![Some(1i32.to_be_bytes().to_vec()), Some(b"a".to_vec())],
            vec![Some(2i32.to_be_bytes().to_vec()), None],
        ]);
        let mut parser = CopyParser::new();
        let mut columns = Columns::new(schema.clone(), 8).unwrap();
        for chunk in stream.chunks(3) {
            parser.feed(Bytes::copy_from_slice(chunk));
            parser.parse(&mut columns, 100).unwrap();
        }
        assert!(parser.done);
        let batch = columns.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.column(1).null_count(), 1);

        // Borrowed chunks of every size, batches of one row: the same rows, in order.
        use datafusion::arrow::array::{Array, Int32Array};
        for size in 1..=stream.len() {
            let mut parser = CopyParser::new();
            let mut columns = Columns::new(schema.clone(), 1).unwrap();
            let mut batches = vec![];
            for chunk in stream.chunks(size) {
                let mut at = 0;
                loop {
                    at += parser.parse_slice(&chunk[at..], &mut columns, 1).unwrap();
                    if columns.rows() < 1 {
                        break;
                    }
                    batches.push(columns.finish().unwrap());
                }
                parser.keep(&chunk[at..]);
            }
            assert!(parser.done, "chunks of {size}");
            let ids: Vec<i32> = batches
                .iter()
                .map(|b| {
                    let ids = b.column(0).as_any().downcast_ref::<Int32Array>().unwrap();
                    ids.value(0)
                })
                .collect();
            assert_eq!(ids, [1, 2], "chunks of {size}");
            assert!(batches[1].column(1).is_null(0), "chunks of {size}");
        }
    }

    /// A COPY stream of `rows`, each a list of values (`None`: NULL) in binary form.
    fn copy_stream(rows: &[Vec<Option<Vec<u8>>>]) -> Vec<u8> {
        let mut stream = COPY_SIGNATURE.to_vec();
        stream.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
        for row in rows {
            stream.extend_from_slice(&(row.len() as i16).to_be_bytes());
            for value in row {
                match value {
                    Some(v) => {
                        stream.extend_from_slice(&(v.len() as i32).to_be_bytes());
                        stream.extend_from_slice(v);
                    }
                    None => stream.extend_from_slice(&(-1i32).to_be_bytes()),
                }
            }
        }
        stream.extend_from_slice(&(-1i16).to_be_bytes());
        stream
    }

    #[test]
    fn fixed_width_columns_take_nulls_and_reject_wrong_lengths() {
        use datafusion::arrow::array::{Array, Date32Array, Int64Array};
        use datafusion::arrow::datatypes::{Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("day", DataType::Date32, true),
        ]));
        let day = |d: i32| Some(d.to_be_bytes().to_vec());
        let stream = copy_stream(&[
            vec![
                Some(7i64.to_be_bytes().to_vec()),
                Some(b"x".to_vec()),
                day(1),
            ],
            vec![None, None, None],
            vec![
                Some(9i64.to_be_bytes().to_vec()),
                Some(b"".to_vec()),
                day(-1),
            ],
        ]);
        // Whole, and cut into chunks of every size: the same three rows.
        for size in 1..=stream.len() {
            let mut parser = CopyParser::new();
            let mut columns = Columns::new(schema.clone(), 8).unwrap();
            for chunk in stream.chunks(size) {
                parser.feed(Bytes::copy_from_slice(chunk));
                parser.parse(&mut columns, 100).unwrap();
            }
            assert!(parser.done, "chunks of {size}");
            let batch = columns.finish().unwrap();
            let ids = batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            assert_eq!(ids.iter().collect::<Vec<_>>(), [Some(7), None, Some(9)]);
            let days = batch
                .column(2)
                .as_any()
                .downcast_ref::<Date32Array>()
                .unwrap();
            let epoch = PG_EPOCH_DAYS;
            assert_eq!(
                days.iter().collect::<Vec<_>>(),
                [Some(epoch + 1), None, Some(epoch - 1)],
                "chunks of {size}"
            );
            assert_eq!(batch.column(1).null_count(), 1);
        }
        // A value of the wrong length in a fixed-width column is an error that names its
        // type, not a misread of the values after it.
        let bad = copy_stream(&[vec![Some(vec![0, 0, 0, 7]), None, day(1)]]);
        let mut parser = CopyParser::new();
        let mut columns = Columns::new(schema, 8).unwrap();
        parser.feed(Bytes::from(bad));
        let err = parser.parse(&mut columns, 100).unwrap_err().to_string();
        assert!(err.contains("int8") && err.contains("4 bytes"), "{err}");
    }

    #[test]
    fn batches_after_the_first_read_the_same_and_text_is_checked_once_per_batch() {
        use datafusion::arrow::array::{Array, BinaryArray, ListArray};
        use datafusion::arrow::datatypes::{Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, true),
            Field::new("raw", DataType::Binary, true),
            Field::new(
                "tags",
                DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true))),
                true,
            ),
        ]));
        // A text[] of one element: ndim 1, no nulls, text oid, (1 element, lower bound 1).
        let array = |s: &str| {
            let mut v = Vec::new();
            for w in [1i32, 0, 25, 1, 1, s.len() as i32] {
                v.extend_from_slice(&w.to_be_bytes());
            }
            v.extend_from_slice(s.as_bytes());
            v
        };
        let mut columns = Columns::new(schema.clone(), 2).unwrap();
        for batch in 0..3 {
            for row in 0..2 {
                // Values grow past the first batch's buffers.
                let text = format!("é{}", "x".repeat(batch * 40 + row));
                columns.push_pg(0, Some(text.as_bytes())).unwrap();
                columns.push_pg(1, Some(&[batch as u8, 0, 255])).unwrap();
                columns.push_pg(2, Some(&array(&text))).unwrap();
                columns.end_row();
            }
            let out = columns.finish().unwrap();
            assert_eq!(out.schema(), schema);
            let names = out
                .column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap();
            assert_eq!(names.value(1), format!("é{}", "x".repeat(batch * 40 + 1)));
            let raw = out
                .column(1)
                .as_any()
                .downcast_ref::<BinaryArray>()
                .unwrap();
            assert_eq!(raw.value(0), &[batch as u8, 0, 255]);
            let tags = out.column(2).as_any().downcast_ref::<ListArray>().unwrap();
            assert_eq!(tags.value(1).len(), 1);
        }
        // Bytes that are not UTF-8 fail the batch, naming the column.
        columns.push_pg(0, Some(&[b'a', 0xff])).unwrap();
        columns.push_pg(1, None).unwrap();
        columns.push_pg(2, None).unwrap();
        columns.end_row();
        let err = columns.finish().unwrap_err().to_string();
        assert!(
            err.contains("column `name`") && err.contains("UTF-8"),
            "{err}"
        );
    }
}
