//! BSON documents → Arrow columns, straight from the server's raw bytes (no intermediate
//! document). A value that does not fit its column is an error that names the field and
//! the document, never a silent NULL or a rounded number.

use std::collections::HashMap;
use std::sync::Arc;

use bson::RawBsonRef;
use bson::raw::RawDocument;
use datafusion::arrow::array::{
    ArrayRef, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, Float64Builder,
    Int32Builder, Int64Builder, ListArray, StringBuilder, StructArray, TimestampMillisecondBuilder,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::datatypes::{DataType, FieldRef, Fields, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};

use super::schema::Repr;

const MS_PER_DAY: i64 = 86_400_000;

/// One column being built.
enum Builder {
    Int32(Int32Builder),
    Int64(Int64Builder),
    Float64(Float64Builder),
    Boolean(BooleanBuilder),
    Utf8(StringBuilder, Repr),
    Decimal(Decimal128Builder, i8),
    Date32(Date32Builder),
    Timestamp(TimestampMillisecondBuilder),
    Binary(BinaryBuilder),
    Struct {
        fields: Fields,
        lookup: Lookup,
        children: Vec<Builder>,
        valid: Vec<bool>,
        filled: Vec<bool>,
    },
    List {
        field: FieldRef,
        offsets: Vec<i32>,
        child: Box<Builder>,
        valid: Vec<bool>,
    },
}

/// Why a value did not fit its column: what the document holds there.
pub struct Misfit(pub String);

impl Builder {
    fn new(data_type: &DataType, repr: Repr) -> std::result::Result<Self, String> {
        Ok(match data_type {
            DataType::Int32 => Builder::Int32(Int32Builder::new()),
            DataType::Int64 => Builder::Int64(Int64Builder::new()),
            DataType::Float64 => Builder::Float64(Float64Builder::new()),
            DataType::Boolean => Builder::Boolean(BooleanBuilder::new()),
            DataType::Utf8 => Builder::Utf8(StringBuilder::new(), repr),
            DataType::Decimal128(p, s) => Builder::Decimal(
                Decimal128Builder::new()
                    .with_precision_and_scale(*p, *s)
                    .map_err(|e| e.to_string())?,
                *s,
            ),
            DataType::Date32 => Builder::Date32(Date32Builder::new()),
            DataType::Timestamp(TimeUnit::Millisecond, tz) => {
                Builder::Timestamp(TimestampMillisecondBuilder::new().with_timezone_opt(tz.clone()))
            }
            DataType::Binary => Builder::Binary(BinaryBuilder::new()),
            DataType::Struct(fields) => Builder::Struct {
                fields: fields.clone(),
                lookup: Lookup::new(
                    fields
                        .iter()
                        .enumerate()
                        .map(|(i, f)| (f.name().clone(), i))
                        .collect(),
                ),
                children: fields
                    .iter()
                    .map(|f| Builder::new(f.data_type(), Repr::Json))
                    .collect::<std::result::Result<_, _>>()?,
                valid: vec![],
                filled: vec![false; fields.len()],
            },
            DataType::List(field) => Builder::List {
                field: field.clone(),
                offsets: vec![0],
                child: Box::new(Builder::new(field.data_type(), Repr::Json)?),
                valid: vec![],
            },
            other => return Err(format!("Basin does not read MongoDB values as {other}")),
        })
    }

    fn append_null(&mut self) {
        match self {
            Builder::Int32(b) => b.append_null(),
            Builder::Int64(b) => b.append_null(),
            Builder::Float64(b) => b.append_null(),
            Builder::Boolean(b) => b.append_null(),
            Builder::Utf8(b, _) => b.append_null(),
            Builder::Decimal(b, _) => b.append_null(),
            Builder::Date32(b) => b.append_null(),
            Builder::Timestamp(b) => b.append_null(),
            Builder::Binary(b) => b.append_null(),
            Builder::Struct {
                children, valid, ..
            } => {
                for c in children {
                    c.append_null();
                }
                valid.push(false);
            }
            Builder::List { offsets, valid, .. } => {
                offsets.push(*offsets.last().unwrap_or(&0));
                valid.push(false);
            }
        }
    }

    fn append(&mut self, value: Option<RawBsonRef<'_>>) -> std::result::Result<(), Misfit> {
        let Some(value) = value else {
            self.append_null();
            return Ok(());
        };
        if matches!(value, RawBsonRef::Null | RawBsonRef::Undefined) {
            self.append_null();
            return Ok(());
        }
        let misfit = || Misfit(type_name(value));
        match self {
            Builder::Int32(b) => match value {
                RawBsonRef::Int32(v) => b.append_value(v),
                RawBsonRef::Int64(v) => b.append_value(i32::try_from(v).map_err(|_| misfit())?),
                RawBsonRef::Double(v) => b.append_value(
                    integral(v, i32::MIN as f64, i32::MAX as f64).ok_or_else(misfit)? as i32,
                ),
                _ => return Err(misfit()),
            },
            Builder::Int64(b) => match value {
                RawBsonRef::Int32(v) => b.append_value(v.into()),
                RawBsonRef::Int64(v) => b.append_value(v),
                // Numbers written by JavaScript are doubles: whole ones read exactly.
                RawBsonRef::Double(v) => b.append_value(
                    integral(v, -9.007_199_254_740_992e15, 9.007_199_254_740_992e15)
                        .ok_or_else(misfit)? as i64,
                ),
                _ => return Err(misfit()),
            },
            Builder::Float64(b) => match value {
                RawBsonRef::Double(v) => b.append_value(v),
                RawBsonRef::Int32(v) => b.append_value(v.into()),
                RawBsonRef::Int64(v) if v.unsigned_abs() <= 1 << 53 => b.append_value(v as f64),
                _ => return Err(misfit()),
            },
            Builder::Boolean(b) => match value {
                RawBsonRef::Boolean(v) => b.append_value(v),
                _ => return Err(misfit()),
            },
            Builder::Utf8(b, repr) => match (value, *repr) {
                (RawBsonRef::String(s), _) => b.append_value(s),
                // ObjectIds read as their hex text wherever they are.
                (RawBsonRef::ObjectId(o), Repr::ObjectId | Repr::Json) => {
                    b.append_value(o.to_hex())
                }
                (RawBsonRef::Symbol(s), Repr::Plain) => b.append_value(s),
                (v, Repr::Json) => b.append_value(json_text(v)),
                _ => return Err(misfit()),
            },
            Builder::Decimal(b, scale) => match value {
                RawBsonRef::Decimal128(d) => b.append_value(
                    rescale(&d.to_string(), *scale)
                        .ok_or_else(|| Misfit(format!("the decimal {d}")))?,
                ),
                RawBsonRef::Int32(v) => {
                    b.append_value(rescale(&v.to_string(), *scale).ok_or_else(misfit)?)
                }
                RawBsonRef::Int64(v) => {
                    b.append_value(rescale(&v.to_string(), *scale).ok_or_else(misfit)?)
                }
                _ => return Err(misfit()),
            },
            Builder::Date32(b) => match value {
                RawBsonRef::DateTime(d) => {
                    let ms = d.timestamp_millis();
                    if ms % MS_PER_DAY != 0 {
                        return Err(Misfit(format!("the date {d} (not midnight UTC)")));
                    }
                    b.append_value(i32::try_from(ms / MS_PER_DAY).map_err(|_| misfit())?)
                }
                _ => return Err(misfit()),
            },
            Builder::Timestamp(b) => match value {
                RawBsonRef::DateTime(d) => b.append_value(d.timestamp_millis()),
                _ => return Err(misfit()),
            },
            Builder::Binary(b) => match value {
                RawBsonRef::Binary(bin) => b.append_value(bin.bytes),
                _ => return Err(misfit()),
            },
            Builder::Struct {
                lookup,
                children,
                valid,
                filled,
                ..
            } => {
                let RawBsonRef::Document(doc) = value else {
                    return Err(misfit());
                };
                fill(doc, lookup, children, filled)?;
                valid.push(true);
            }
            Builder::List {
                offsets,
                child,
                valid,
                ..
            } => {
                let RawBsonRef::Array(items) = value else {
                    return Err(misfit());
                };
                let mut n = 0i32;
                for item in items {
                    let item = item.map_err(|e| Misfit(format!("a malformed array ({e})")))?;
                    child.append(Some(item))?;
                    n += 1;
                }
                offsets.push(offsets.last().unwrap_or(&0) + n);
                valid.push(true);
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> std::result::Result<ArrayRef, String> {
        Ok(match self {
            Builder::Int32(b) => Arc::new(b.finish()),
            Builder::Int64(b) => Arc::new(b.finish()),
            Builder::Float64(b) => Arc::new(b.finish()),
            Builder::Boolean(b) => Arc::new(b.finish()),
            Builder::Utf8(b, _) => Arc::new(b.finish()),
            Builder::Decimal(b, _) => Arc::new(b.finish()),
            Builder::Date32(b) => Arc::new(b.finish()),
            Builder::Timestamp(b) => Arc::new(b.finish()),
            Builder::Binary(b) => Arc::new(b.finish()),
            Builder::Struct {
                fields,
                children,
                valid,
                ..
            } => {
                let arrays = children
                    .iter_mut()
                    .map(Builder::finish)
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let nulls = NullBuffer::from(std::mem::take(valid));
                Arc::new(
                    StructArray::try_new(fields.clone(), arrays, Some(nulls))
                        .map_err(|e| e.to_string())?,
                )
            }
            Builder::List {
                field,
                offsets,
                child,
                valid,
            } => {
                let values = child.finish()?;
                let offsets = OffsetBuffer::new(std::mem::replace(offsets, vec![0]).into());
                let nulls = NullBuffer::from(std::mem::take(valid));
                Arc::new(
                    ListArray::try_new(field.clone(), offsets, values, Some(nulls))
                        .map_err(|e| e.to_string())?,
                )
            }
        })
    }
}

/// Which column each field name feeds. Documents of one collection mostly list their fields
/// in one order: the names met at each position last time are compared first, and hashed
/// only when they differ.
struct Lookup {
    index: HashMap<String, usize>,
    seen: Vec<(String, Option<usize>)>,
}

impl Lookup {
    fn new(index: HashMap<String, usize>) -> Self {
        Self {
            index,
            seen: vec![],
        }
    }

    /// The column of field `key`, the `position`-th of its document.
    fn find(&mut self, position: usize, key: &str) -> Option<usize> {
        if let Some((name, column)) = self.seen.get(position)
            && name == key
        {
            return *column;
        }
        let column = self.index.get(key).copied();
        if position < self.seen.len() {
            self.seen[position] = (key.to_string(), column);
        } else if position == self.seen.len() && position < 4 * self.index.len().max(16) {
            self.seen.push((key.to_string(), column));
        }
        column
    }
}

/// Puts the fields of `doc` into `children` by name; fields not among them are skipped,
/// columns the document lacks are NULL.
fn fill(
    doc: &RawDocument,
    lookup: &mut Lookup,
    children: &mut [Builder],
    filled: &mut [bool],
) -> std::result::Result<(), Misfit> {
    filled.fill(false);
    for (position, element) in doc.iter().enumerate() {
        let (key, value) = element.map_err(|e| Misfit(format!("a malformed document ({e})")))?;
        if let Some(i) = lookup.find(position, key.as_str())
            && !filled[i]
        {
            children[i]
                .append(Some(value))
                .map_err(|m| Misfit(format!("{} in field `{}`", m.0, key.as_str())))?;
            filled[i] = true;
        }
    }
    for (i, done) in filled.iter().enumerate() {
        if !done {
            children[i].append_null();
        }
    }
    Ok(())
}

/// Builds record batches of one schema from documents whose fields are named `fields`
/// (column `i` reads the top-level field `fields[i]`).
pub struct Documents {
    schema: SchemaRef,
    lookup: Lookup,
    /// One builder per distinct field.
    columns: Vec<Builder>,
    /// The builder of each output column (a field read twice is built once).
    outputs: Vec<usize>,
    filled: Vec<bool>,
    rows: usize,
}

impl Documents {
    pub fn new(
        schema: SchemaRef,
        fields: &[String],
        reprs: &[Repr],
    ) -> std::result::Result<Self, String> {
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut columns = vec![];
        let mut outputs = vec![];
        for (i, f) in schema.fields().iter().enumerate() {
            let name = fields.get(i).cloned().unwrap_or_else(|| f.name().clone());
            if let Some(&j) = index.get(&name) {
                outputs.push(j);
                continue;
            }
            let repr = reprs.get(i).copied().unwrap_or(Repr::Plain);
            index.insert(name, columns.len());
            outputs.push(columns.len());
            columns.push(Builder::new(f.data_type(), repr)?);
        }
        Ok(Self {
            lookup: Lookup::new(index),
            filled: vec![false; columns.len()],
            columns,
            outputs,
            schema,
            rows: 0,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Adds one document; on a misfit, says which field held what. After an error the
    /// builder is not to be used again (the query fails).
    pub fn push(&mut self, doc: &RawDocument) -> std::result::Result<(), String> {
        fill(doc, &mut self.lookup, &mut self.columns, &mut self.filled).map_err(|m| m.0)?;
        self.rows += 1;
        Ok(())
    }

    /// Adds a row of NULLs, with 0 in the output columns marked `zero` (the answer of a
    /// global aggregate over no documents).
    pub fn push_empty_aggregate(&mut self, zero: &[bool]) {
        for (j, c) in self.columns.iter_mut().enumerate() {
            let z = self.outputs.iter().zip(zero).any(|(&o, &z)| o == j && z);
            match c {
                Builder::Int64(b) if z => b.append_value(0),
                other => other.append_null(),
            }
        }
        self.rows += 1;
    }

    pub fn finish(&mut self) -> datafusion::error::Result<RecordBatch> {
        let arrays = self
            .columns
            .iter_mut()
            .map(Builder::finish)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(datafusion::error::DataFusionError::Execution)?;
        let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
        self.rows = 0;
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            self.outputs.iter().map(|&j| arrays[j].clone()).collect(),
            &options,
        )?)
    }
}

/// `v` as an integer, if it is a whole number within `[lo, hi]`.
fn integral(v: f64, lo: f64, hi: f64) -> Option<f64> {
    (v.fract() == 0.0 && v >= lo && v <= hi).then_some(v)
}

/// A BSON type's name, for errors.
pub fn type_name(value: RawBsonRef<'_>) -> String {
    match value {
        RawBsonRef::Double(v) => format!("the double {v}"),
        RawBsonRef::String(_) => "a string".into(),
        RawBsonRef::Array(_) => "an array".into(),
        RawBsonRef::Document(_) => "an embedded document".into(),
        RawBsonRef::Boolean(_) => "a boolean".into(),
        RawBsonRef::Int32(v) => format!("the int {v}"),
        RawBsonRef::Int64(v) => format!("the long {v}"),
        RawBsonRef::Decimal128(d) => format!("the decimal {d}"),
        RawBsonRef::DateTime(_) => "a date".into(),
        RawBsonRef::ObjectId(_) => "an ObjectId".into(),
        RawBsonRef::Binary(_) => "binary data".into(),
        other => format!("a value of BSON type {:?}", other.element_type()),
    }
}

/// A value as relaxed extended JSON text (strings as they are).
pub fn json_text(value: RawBsonRef<'_>) -> String {
    match value {
        RawBsonRef::String(s) => s.to_string(),
        other => match bson::Bson::try_from(other) {
            Ok(b) => b.into_relaxed_extjson().to_string(),
            Err(e) => format!("<unreadable BSON: {e}>"),
        },
    }
}

/// The digits and scale of a decimal's text (`"1.50"` → (150, 2), `"1.5E+3"` → (15, -2)),
/// `None` for NaN, infinities or more than 38 digits.
pub fn decimal_parts(text: &str) -> Option<(i128, i32)> {
    let (mantissa, exponent) = match text.find(['E', 'e']) {
        Some(i) => (&text[..i], text[i + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa.strip_prefix('+').unwrap_or(mantissa)),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 38 {
        return None;
    }
    let mut value: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    if negative {
        value = -value;
    }
    Some((value, frac.len() as i32 - exponent))
}

/// A decimal's text as an integer at `scale`, if that is exact and fits 38 digits.
pub fn rescale(text: &str, scale: i8) -> Option<i128> {
    let (mut value, mut have) = decimal_parts(text)?;
    let want = i32::from(scale);
    while have < want {
        value = value.checked_mul(10)?;
        have += 1;
    }
    while have > want {
        if value % 10 != 0 {
            return None;
        }
        value /= 10;
        have -= 1;
    }
    (value.unsigned_abs() < 10u128.pow(38)).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn decimals_rescale_exactly_or_not_at_all() {
        assert_eq!(rescale("1.5", 2), Some(150));
        assert_eq!(rescale("1.50", 1), Some(15));
        assert_eq!(rescale("1.55", 1), None);
        assert_eq!(rescale("-1.2E+3", 0), Some(-1200));
        assert_eq!(rescale("5E-2", 2), Some(5));
        assert_eq!(rescale("NaN", 2), None);
        assert_eq!(rescale("0E-6176", 2), Some(0));
        assert_eq!(decimal_parts("12.340"), Some((12340, 3)));
    }

    #[test]
    fn a_field_read_twice_fills_both_columns() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("c0", DataType::Int64, true),
            Field::new("c1", DataType::Int64, true),
        ]));
        let mut docs = Documents::new(
            schema,
            &["a".into(), "a".into()],
            &[Repr::Plain, Repr::Plain],
        )
        .unwrap();
        docs.push(&bson::rawdoc! { "b": 1, "a": 5 }).unwrap();
        docs.push(&bson::rawdoc! { "a": 6, "b": 1 }).unwrap();
        let batch = docs.finish().unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&[batch])
            .unwrap()
            .to_string();
        assert!(
            text.contains("| 5  | 5  |") && text.contains("| 6  | 6  |"),
            "{text}"
        );
    }

    #[test]
    fn nested_documents_become_structs_and_lists() {
        let inner = Fields::from(vec![Field::new("a", DataType::Int64, true)]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Struct(inner), true),
            Field::new(
                "l",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
            Field::new("j", DataType::Utf8, true),
        ]));
        let mut docs = Documents::new(
            schema,
            &["s".into(), "l".into(), "j".into()],
            &[Repr::Plain, Repr::Plain, Repr::Json],
        )
        .unwrap();
        docs.push(&bson::rawdoc! { "s": { "a": 1 }, "l": ["x", "y"], "j": { "k": 2 } })
            .unwrap();
        docs.push(&bson::rawdoc! { "j": 5 }).unwrap();
        let err = docs.push(&bson::rawdoc! { "s": "oops" }).unwrap_err();
        assert!(err.contains("a string"), "{err}");
        let batch = docs.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&[batch])
            .unwrap()
            .to_string();
        assert!(
            text.contains("{a: 1}") && text.contains("[x, y]") && text.contains("{\"k\":2}"),
            "{text}"
        );
    }
}
