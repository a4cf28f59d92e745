//! Source values → Arrow arrays: PostgreSQL's binary COPY format and MySQL's text protocol.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayBuilder, ArrayRef, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder,
    Decimal256Builder, Float32Builder, Float64Builder, Int8Builder, Int16Builder, Int32Builder,
    Int64Builder, IntervalMonthDayNanoBuilder, ListBuilder, StringBuilder,
    Time64MicrosecondBuilder, TimestampMicrosecondBuilder, UInt8Builder, UInt16Builder,
    UInt32Builder, UInt64Builder, make_builder,
};
use datafusion::arrow::datatypes::{DataType, IntervalMonthDayNano, SchemaRef, i256};
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

/// Column builders, one per result column.
pub struct Columns {
    schema: SchemaRef,
    builders: Vec<Box<dyn ArrayBuilder>>,
    rows: usize,
}

macro_rules! builder {
    ($b:expr, $t:ty) => {
        $b.as_any_mut()
            .downcast_mut::<$t>()
            .expect("builder matches its data type")
    };
}

impl Columns {
    pub fn new(schema: SchemaRef, capacity: usize) -> Self {
        let builders = schema
            .fields()
            .iter()
            .map(|f| make_builder(f.data_type(), capacity))
            .collect();
        Self {
            schema,
            builders,
            rows: 0,
        }
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
        let arrays: Vec<ArrayRef> = self.builders.iter_mut().map(|b| b.finish()).collect();
        // A query may need rows but no columns (`count(*)` over a subquery).
        let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
        self.rows = 0;
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &options,
        )?)
    }

    /// Appends one PostgreSQL binary-format value (`None` = NULL) to column `i`.
    pub fn push_pg(&mut self, i: usize, value: Option<&[u8]>) -> Result<()> {
        push_pg(
            self.builders[i].as_mut(),
            self.schema.field(i).data_type(),
            value,
        )
    }

    /// Appends one MySQL text-protocol value to column `i`.
    pub fn push_mysql(&mut self, i: usize, value: Option<&[u8]>) -> Result<()> {
        push_mysql(
            self.builders[i].as_mut(),
            self.schema.field(i).data_type(),
            value,
        )
    }
}

fn text<'a>(v: &'a [u8], what: &str) -> Result<&'a str> {
    std::str::from_utf8(v).map_err(|e| bad(what, e))
}

fn push_decimal(b: &mut dyn ArrayBuilder, data_type: &DataType, v: Option<&str>) -> Result<()> {
    let scale = match data_type {
        DataType::Decimal128(_, s) | DataType::Decimal256(_, s) => *s,
        _ => 0,
    };
    match data_type {
        // i128 arithmetic: the common case, several times cheaper than i256.
        DataType::Decimal128(_, _) => {
            let parsed = v.map(|t| parse_decimal_i128(t, scale)).transpose()?;
            builder!(b, Decimal128Builder).append_option(parsed.flatten())
        }
        _ => {
            let parsed = v.map(|t| parse_decimal(t, scale)).transpose()?;
            builder!(b, Decimal256Builder).append_option(parsed.flatten())
        }
    }
    Ok(())
}

fn push_pg(b: &mut dyn ArrayBuilder, data_type: &DataType, value: Option<&[u8]>) -> Result<()> {
    let Some(v) = value else {
        append_null(b, data_type);
        return Ok(());
    };
    match data_type {
        DataType::Boolean => builder!(b, BooleanBuilder).append_value(v.first() == Some(&1)),
        DataType::Int16 => {
            builder!(b, Int16Builder).append_value(i16::from_be_bytes(be(v, "int2")?))
        }
        DataType::Int32 => {
            builder!(b, Int32Builder).append_value(i32::from_be_bytes(be(v, "int4")?))
        }
        DataType::Int64 => {
            builder!(b, Int64Builder).append_value(i64::from_be_bytes(be(v, "int8")?))
        }
        DataType::Float32 => {
            builder!(b, Float32Builder).append_value(f32::from_be_bytes(be(v, "float4")?))
        }
        DataType::Float64 => {
            builder!(b, Float64Builder).append_value(f64::from_be_bytes(be(v, "float8")?))
        }
        DataType::Utf8 => builder!(b, StringBuilder).append_value(text(v, "text")?),
        DataType::Binary => builder!(b, BinaryBuilder).append_value(v),
        DataType::Date32 => {
            let d = i32::from_be_bytes(be(v, "date")?);
            let b = builder!(b, Date32Builder);
            // ±infinity are i32::MAX / i32::MIN: no Arrow date can hold them.
            if d == i32::MAX || d == i32::MIN {
                b.append_null()
            } else {
                b.append_value(d + PG_EPOCH_DAYS)
            }
        }
        DataType::Timestamp(_, _) => {
            let t = i64::from_be_bytes(be(v, "timestamp")?);
            let b = builder!(b, TimestampMicrosecondBuilder);
            if t == i64::MAX || t == i64::MIN {
                b.append_null()
            } else {
                b.append_value(t + PG_EPOCH_MICROS)
            }
        }
        DataType::Time64(_) => {
            builder!(b, Time64MicrosecondBuilder).append_value(i64::from_be_bytes(be(v, "time")?))
        }
        DataType::Interval(_) => {
            let raw: [u8; 16] = be(v, "interval")?;
            let micros = i64::from_be_bytes(raw[0..8].try_into().expect("8 bytes"));
            let days = i32::from_be_bytes(raw[8..12].try_into().expect("4 bytes"));
            let months = i32::from_be_bytes(raw[12..16].try_into().expect("4 bytes"));
            builder!(b, IntervalMonthDayNanoBuilder).append_value(IntervalMonthDayNano::new(
                months,
                days,
                micros * 1000,
            ))
        }
        DataType::Decimal128(_, _) | DataType::Decimal256(_, _) => {
            push_decimal(b, data_type, Some(text(v, "numeric")?))?
        }
        DataType::List(item) => push_pg_array(b, item.data_type(), v)?,
        other => {
            return Err(DataFusionError::Internal(format!(
                "no PostgreSQL reader for {other}"
            )));
        }
    }
    Ok(())
}

/// A binary array: ndim, has-null flag, element oid, (length, lower bound) per dimension,
/// then each element as (length, bytes). Multi-dimensional arrays are read flattened.
fn push_pg_array(b: &mut dyn ArrayBuilder, item: &DataType, v: &[u8]) -> Result<()> {
    let b = builder!(b, ListBuilder<Box<dyn ArrayBuilder>>);
    let word = |at: usize| -> Result<i32> {
        v.get(at..at + 4)
            .map(|w| i32::from_be_bytes(w.try_into().expect("4 bytes")))
            .ok_or_else(|| bad("array", "truncated"))
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
            push_pg(b.values().as_mut(), item, None)?;
        } else {
            let end = at + len as usize;
            let element = v.get(at..end).ok_or_else(|| bad("array", "truncated"))?;
            push_pg(b.values().as_mut(), item, Some(element))?;
            at = end;
        }
    }
    b.append(true);
    Ok(())
}

fn push_mysql(b: &mut dyn ArrayBuilder, data_type: &DataType, value: Option<&[u8]>) -> Result<()> {
    let Some(v) = value else {
        append_null(b, data_type);
        return Ok(());
    };
    match data_type {
        DataType::Binary => {
            builder!(b, BinaryBuilder).append_value(v);
            return Ok(());
        }
        DataType::UInt64 if !v.iter().all(u8::is_ascii_digit) || v.is_empty() => {
            // BIT(n) arrives as big-endian bytes.
            let mut n = 0u64;
            for byte in v.iter().rev().take(8).rev() {
                n = (n << 8) | *byte as u64;
            }
            builder!(b, UInt64Builder).append_value(n);
            return Ok(());
        }
        DataType::Boolean if v.len() == 1 && v[0] <= 1 => {
            // BIT(1) arrives as one raw byte.
            builder!(b, BooleanBuilder).append_value(v[0] == 1);
            return Ok(());
        }
        _ => {}
    }
    let t = text(v, "text")?;
    match data_type {
        DataType::Boolean => {
            builder!(b, BooleanBuilder).append_value(parse_num::<i64>(t, "boolean")? != 0)
        }
        DataType::Int8 => builder!(b, Int8Builder).append_value(parse_num(t, "tinyint")?),
        DataType::Int16 => builder!(b, Int16Builder).append_value(parse_num(t, "smallint")?),
        DataType::Int32 => builder!(b, Int32Builder).append_value(parse_num(t, "int")?),
        DataType::Int64 => builder!(b, Int64Builder).append_value(parse_num(t, "bigint")?),
        DataType::UInt8 => {
            builder!(b, UInt8Builder).append_value(parse_num(t, "tinyint unsigned")?)
        }
        DataType::UInt16 => {
            builder!(b, UInt16Builder).append_value(parse_num(t, "smallint unsigned")?)
        }
        DataType::UInt32 => builder!(b, UInt32Builder).append_value(parse_num(t, "int unsigned")?),
        DataType::UInt64 => {
            builder!(b, UInt64Builder).append_value(parse_num(t, "bigint unsigned")?)
        }
        DataType::Float32 => builder!(b, Float32Builder).append_value(parse_num(t, "float")?),
        DataType::Float64 => builder!(b, Float64Builder).append_value(parse_num(t, "double")?),
        DataType::Utf8 => builder!(b, StringBuilder).append_value(t),
        DataType::Date32 => builder!(b, Date32Builder).append_option(parse_date(t)?),
        DataType::Timestamp(_, _) => {
            builder!(b, TimestampMicrosecondBuilder).append_option(parse_timestamp(t)?)
        }
        DataType::Time64(_) => builder!(b, Time64MicrosecondBuilder).append_value(parse_time(t)?),
        DataType::Decimal128(_, _) | DataType::Decimal256(_, _) => {
            push_decimal(b, data_type, Some(t))?
        }
        other => {
            return Err(DataFusionError::Internal(format!(
                "no MySQL reader for {other}"
            )));
        }
    }
    Ok(())
}

fn append_null(b: &mut dyn ArrayBuilder, data_type: &DataType) {
    match data_type {
        DataType::Boolean => builder!(b, BooleanBuilder).append_null(),
        DataType::Int8 => builder!(b, Int8Builder).append_null(),
        DataType::Int16 => builder!(b, Int16Builder).append_null(),
        DataType::Int32 => builder!(b, Int32Builder).append_null(),
        DataType::Int64 => builder!(b, Int64Builder).append_null(),
        DataType::UInt8 => builder!(b, UInt8Builder).append_null(),
        DataType::UInt16 => builder!(b, UInt16Builder).append_null(),
        DataType::UInt32 => builder!(b, UInt32Builder).append_null(),
        DataType::UInt64 => builder!(b, UInt64Builder).append_null(),
        DataType::Float32 => builder!(b, Float32Builder).append_null(),
        DataType::Float64 => builder!(b, Float64Builder).append_null(),
        DataType::Utf8 => builder!(b, StringBuilder).append_null(),
        DataType::Binary => builder!(b, BinaryBuilder).append_null(),
        DataType::Date32 => builder!(b, Date32Builder).append_null(),
        DataType::Timestamp(_, _) => builder!(b, TimestampMicrosecondBuilder).append_null(),
        DataType::Time64(_) => builder!(b, Time64MicrosecondBuilder).append_null(),
        DataType::Interval(_) => builder!(b, IntervalMonthDayNanoBuilder).append_null(),
        DataType::Decimal128(_, _) => builder!(b, Decimal128Builder).append_null(),
        DataType::Decimal256(_, _) => builder!(b, Decimal256Builder).append_null(),
        DataType::List(_) => builder!(b, ListBuilder<Box<dyn ArrayBuilder>>).append_null(),
        _ => {}
    }
}

/// Incremental parser of PostgreSQL's binary COPY stream.
pub struct CopyParser {
    buf: Vec<u8>,
    pos: usize,
    header_done: bool,
    pub done: bool,
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
            buf: Vec::with_capacity(1 << 20),
            pos: 0,
            header_done: false,
            done: false,
        }
    }

    /// Adds a chunk of the stream.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.pos > 0 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// Decodes every complete row buffered so far into `columns`, stopping early once
    /// `columns` holds `max_rows`.
    pub fn parse(&mut self, columns: &mut Columns, max_rows: usize) -> Result<()> {
        if !self.header_done {
            if self.buf.len() < self.pos + 19 {
                return Ok(());
            }
            let head = &self.buf[self.pos..];
            if &head[..11] != COPY_SIGNATURE {
                return Err(bad("COPY", "missing binary COPY signature"));
            }
            let ext = u32::from_be_bytes(head[15..19].try_into().expect("4 bytes")) as usize;
            if self.buf.len() < self.pos + 19 + ext {
                return Ok(());
            }
            self.pos += 19 + ext;
            self.header_done = true;
        }
        let width = columns.width();
        while !self.done && columns.rows() < max_rows {
            let row = &self.buf[self.pos..];
            if row.len() < 2 {
                return Ok(());
            }
            let fields = i16::from_be_bytes([row[0], row[1]]);
            if fields == -1 {
                self.done = true;
                return Ok(());
            }
            if fields as usize != width {
                return Err(bad(
                    "COPY",
                    format!("row has {fields} fields, expected {width}"),
                ));
            }
            // Find the row's end first, so a row is decoded only when it is complete.
            let mut at = 2;
            let mut complete = true;
            for _ in 0..width {
                let Some(len) = row.get(at..at + 4) else {
                    complete = false;
                    break;
                };
                let len = i32::from_be_bytes(len.try_into().expect("4 bytes"));
                at += 4 + len.max(0) as usize;
                if at > row.len() {
                    complete = false;
                    break;
                }
            }
            if !complete {
                return Ok(());
            }
            let mut at = self.pos + 2;
            for i in 0..width {
                let len = i32::from_be_bytes(self.buf[at..at + 4].try_into().expect("4 bytes"));
                at += 4;
                if len < 0 {
                    columns.push_pg(i, None)?;
                } else {
                    let end = at + len as usize;
                    columns.push_pg(i, Some(&self.buf[at..end]))?;
                    at = end;
                }
            }
            columns.end_row();
            self.pos = at;
        }
        Ok(())
    }
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

    #[test]
    fn copy_rows_split_across_chunks() {
        use datafusion::arrow::datatypes::{Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            Field::new("c0", DataType::Int32, true),
            Field::new("c1", DataType::Utf8, true),
        ]));
        let mut stream = COPY_SIGNATURE.to_vec();
        stream.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
        for (n, s) in [(1i32, Some("a")), (2, None)] {
            stream.extend_from_slice(&2i16.to_be_bytes());
            stream.extend_from_slice(&4i32.to_be_bytes());
            stream.extend_from_slice(&n.to_be_bytes());
            match s {
                Some(s) => {
                    stream.extend_from_slice(&(s.len() as i32).to_be_bytes());
                    stream.extend_from_slice(s.as_bytes());
                }
                None => stream.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        stream.extend_from_slice(&(-1i16).to_be_bytes());
        let mut parser = CopyParser::new();
        let mut columns = Columns::new(schema, 8);
        for chunk in stream.chunks(3) {
            parser.feed(chunk);
            parser.parse(&mut columns, 100).unwrap();
        }
        assert!(parser.done);
        let batch = columns.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.column(1).null_count(), 1);
    }
}
