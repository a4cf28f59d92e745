//! A collection's columns: found in a sample of its documents, or declared in basin.toml.
//!
//! | BSON | Arrow |
//! |---|---|
//! | int32, int64 | Int64 (declared `int`: Int32) |
//! | double (with or without ints) | Float64 |
//! | decimal128 (with or without ints) | Decimal128(38, largest scale seen) |
//! | string | Utf8 |
//! | objectId | Utf8, 24 lower-case hex digits |
//! | bool | Boolean |
//! | date | Timestamp(ms, UTC) |
//! | binData | Binary |
//! | embedded document | Struct of its fields |
//! | array | List of its elements' type |
//! | several of these in one field, or any other type | Utf8: the value as extended JSON |

use std::sync::Arc;

use bson::RawBsonRef;
use bson::raw::RawDocument;
use datafusion::arrow::datatypes::{DataType, Field, Fields, TimeUnit};

/// A column of a collection: a top-level field, its Arrow type and how its values read.
#[derive(Debug, Clone, PartialEq)]
pub struct MongoColumn {
    pub name: String,
    pub data_type: DataType,
    pub repr: Repr,
}

/// How values of a Utf8 column are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Repr {
    /// The type's own values only (a string column reads strings).
    Plain,
    /// ObjectIds as 24 lower-case hex digits (strings are read as they are).
    ObjectId,
    /// Any value: strings as they are, everything else as relaxed extended JSON.
    Json,
}

/// Deepest nesting read as structs and lists; deeper values are extended JSON text.
const MAX_DEPTH: usize = 8;

pub fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, Some(Arc::from("UTC")))
}

/// What a sample holds in one field.
#[derive(Debug, Default, Clone)]
struct Seen {
    ints: bool,
    doubles: bool,
    /// The largest scale of the decimals seen.
    decimals: Option<i8>,
    strings: bool,
    bools: bool,
    dates: bool,
    object_ids: bool,
    binaries: bool,
    documents: Option<Vec<(String, Seen)>>,
    arrays: Option<Box<Seen>>,
    /// Any other type (regex, timestamp, JavaScript, min/max key...), or a decimal that
    /// is not a number (NaN, infinity) or too wide.
    others: bool,
}

impl Seen {
    fn add(&mut self, value: RawBsonRef<'_>, depth: usize) {
        match value {
            RawBsonRef::Null | RawBsonRef::Undefined => {}
            RawBsonRef::Int32(_) | RawBsonRef::Int64(_) => self.ints = true,
            RawBsonRef::Double(_) => self.doubles = true,
            RawBsonRef::Decimal128(d) => match super::decode::decimal_parts(&d.to_string()) {
                Some((_, scale)) if (0..=38).contains(&scale) => {
                    self.decimals = Some(self.decimals.unwrap_or(0).max(scale as i8))
                }
                _ => self.others = true,
            },
            RawBsonRef::String(_) => self.strings = true,
            RawBsonRef::Boolean(_) => self.bools = true,
            RawBsonRef::DateTime(_) => self.dates = true,
            RawBsonRef::ObjectId(_) => self.object_ids = true,
            RawBsonRef::Binary(_) => self.binaries = true,
            RawBsonRef::Document(d) if depth < MAX_DEPTH => {
                let fields = self.documents.get_or_insert_with(Vec::new);
                add_document(fields, d, depth + 1);
            }
            RawBsonRef::Array(a) if depth < MAX_DEPTH => {
                let item = self.arrays.get_or_insert_with(Default::default);
                for v in a.into_iter().flatten() {
                    item.add(v, depth + 1);
                }
            }
            _ => self.others = true,
        }
    }

    /// The Arrow type of the field, and a note when its values were of several types.
    fn resolve(&self, path: &str, mixed: &mut Vec<String>) -> (DataType, Repr) {
        let classes = [
            self.ints && !self.doubles && self.decimals.is_none(),
            self.doubles && self.decimals.is_none(),
            self.decimals.is_some() && !self.doubles,
            self.strings,
            self.bools,
            self.dates,
            self.object_ids,
            self.binaries,
            self.documents.is_some(),
            self.arrays.is_some(),
        ];
        let kinds = classes.iter().filter(|c| **c).count();
        let numbers_mixed = self.doubles && self.decimals.is_some();
        if self.others || numbers_mixed || kinds > 1 {
            mixed.push(path.to_string());
            return (DataType::Utf8, Repr::Json);
        }
        if kinds == 0 {
            // Only nulls (or nothing) seen: any value reads.
            return (DataType::Utf8, Repr::Json);
        }
        if self.ints && !self.doubles && self.decimals.is_none() {
            return (DataType::Int64, Repr::Plain);
        }
        if self.doubles {
            return (DataType::Float64, Repr::Plain);
        }
        if let Some(scale) = self.decimals {
            return (DataType::Decimal128(38, scale), Repr::Plain);
        }
        if self.strings {
            return (DataType::Utf8, Repr::Plain);
        }
        if self.bools {
            return (DataType::Boolean, Repr::Plain);
        }
        if self.dates {
            return (timestamp_type(), Repr::Plain);
        }
        if self.object_ids {
            return (DataType::Utf8, Repr::ObjectId);
        }
        if self.binaries {
            return (DataType::Binary, Repr::Plain);
        }
        if let Some(fields) = &self.documents {
            if fields.is_empty() {
                return (DataType::Utf8, Repr::Json);
            }
            let children: Vec<Field> = fields
                .iter()
                .map(|(name, seen)| {
                    let (t, _) = seen.resolve(&format!("{path}.{name}"), mixed);
                    Field::new(name, t, true)
                })
                .collect();
            return (DataType::Struct(Fields::from(children)), Repr::Plain);
        }
        if let Some(item) = &self.arrays {
            let (t, _) = item.resolve(&format!("{path}[]"), mixed);
            return (
                DataType::List(Arc::new(Field::new("item", t, true))),
                Repr::Plain,
            );
        }
        (DataType::Utf8, Repr::Json)
    }
}

fn add_document(fields: &mut Vec<(String, Seen)>, doc: &RawDocument, depth: usize) {
    for (key, value) in doc.iter().flatten() {
        let key = key.as_str();
        match fields.iter_mut().find(|(n, _)| n == key) {
            Some((_, seen)) => seen.add(value, depth),
            None => {
                let mut seen = Seen::default();
                seen.add(value, depth);
                fields.push((key.to_string(), seen));
            }
        }
    }
}

/// The columns of a sample of documents, in order of first appearance (`_id` first), and
/// the fields whose values were of several types (read as extended JSON text).
pub fn infer<'a>(
    docs: impl IntoIterator<Item = &'a RawDocument>,
) -> (Vec<MongoColumn>, Vec<String>) {
    let mut fields: Vec<(String, Seen)> = vec![];
    for doc in docs {
        add_document(&mut fields, doc, 0);
    }
    if let Some(i) = fields.iter().position(|(n, _)| n == "_id") {
        let id = fields.remove(i);
        fields.insert(0, id);
    }
    let mut mixed = vec![];
    let columns = fields
        .iter()
        .map(|(name, seen)| {
            let (data_type, repr) = seen.resolve(name, &mut mixed);
            MongoColumn {
                name: name.clone(),
                data_type,
                repr,
            }
        })
        .collect();
    (columns, mixed)
}

/// Declared columns: `"name type"` each (the name may be double-quoted).
pub fn declared(columns: &[String]) -> std::result::Result<Vec<MongoColumn>, String> {
    let mut out: Vec<MongoColumn> = vec![];
    for spec in columns {
        let spec = spec.trim();
        let (name, ty) = if let Some(rest) = spec.strip_prefix('"') {
            let end = rest
                .find('"')
                .ok_or_else(|| format!("`{spec}`: the quoted name has no closing quote"))?;
            (rest[..end].to_string(), rest[end + 1..].trim())
        } else {
            let (n, t) = spec.split_once(char::is_whitespace).ok_or_else(|| {
                format!("`{spec}` must be \"name type\", e.g. \"total decimal(12,2)\"")
            })?;
            (n.to_string(), t.trim())
        };
        if out.iter().any(|c| c.name == name) {
            return Err(format!("column `{name}` is declared twice"));
        }
        let (data_type, repr) = declared_type(ty).ok_or_else(|| {
            format!(
                "column `{name}`: unknown type `{ty}` (use string, int, bigint, double, \
                 decimal(p,s), boolean, date, timestamp, timestamptz, binary, objectid or json)"
            )
        })?;
        out.push(MongoColumn {
            name,
            data_type,
            repr,
        });
    }
    if out.is_empty() {
        return Err("declare at least one column".into());
    }
    Ok(out)
}

fn declared_type(ty: &str) -> Option<(DataType, Repr)> {
    let t = ty.to_ascii_lowercase().replace(' ', "");
    Some(match t.as_str() {
        "string" | "text" | "varchar" => (DataType::Utf8, Repr::Plain),
        "int" | "integer" | "int32" => (DataType::Int32, Repr::Plain),
        "bigint" | "long" | "int64" => (DataType::Int64, Repr::Plain),
        "double" | "float" | "float64" => (DataType::Float64, Repr::Plain),
        "boolean" | "bool" => (DataType::Boolean, Repr::Plain),
        "date" => (DataType::Date32, Repr::Plain),
        "timestamp" => (
            DataType::Timestamp(TimeUnit::Millisecond, None),
            Repr::Plain,
        ),
        "timestamptz" => (timestamp_type(), Repr::Plain),
        "binary" | "bytes" => (DataType::Binary, Repr::Plain),
        "objectid" => (DataType::Utf8, Repr::ObjectId),
        "json" => (DataType::Utf8, Repr::Json),
        _ => {
            let inner = t.strip_prefix("decimal(")?.strip_suffix(')')?;
            let (p, s) = inner.split_once(',')?;
            let (p, s): (u8, i8) = (p.parse().ok()?, s.parse().ok()?);
            if !(1..=38).contains(&p) || s < 0 || s as u8 > p {
                return None;
            }
            (DataType::Decimal128(p, s), Repr::Plain)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc};

    #[test]
    fn a_sample_gives_types_and_marks_mixed_fields() {
        let docs = [
            rawdoc! { "a": 1, "_id": bson::oid::ObjectId::new(), "n": { "x": 1.5 }, "l": [1, 2], "m": "s" },
            rawdoc! { "a": 2_i64, "_id": bson::oid::ObjectId::new(), "n": { "y": "t" }, "l": [], "m": 3 },
        ];
        let (columns, mixed) = infer(docs.iter().map(|d| d.as_ref()));
        let names: Vec<_> = columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["_id", "a", "n", "l", "m"]);
        assert_eq!(columns[0].repr, Repr::ObjectId);
        assert_eq!(columns[1].data_type, DataType::Int64);
        assert!(matches!(&columns[2].data_type, DataType::Struct(f) if f.len() == 2));
        assert!(
            matches!(&columns[3].data_type, DataType::List(f) if f.data_type() == &DataType::Int64)
        );
        assert_eq!(
            (&columns[4].data_type, columns[4].repr),
            (&DataType::Utf8, Repr::Json)
        );
        assert_eq!(mixed, ["m"]);
        let _ = doc! {};
    }

    #[test]
    fn declared_columns_parse_and_bad_ones_say_why() {
        let c = declared(&["_id objectid".into(), "\"odd name\" decimal(12, 2)".into()]).unwrap();
        assert_eq!(c[1].name, "odd name");
        assert_eq!(c[1].data_type, DataType::Decimal128(12, 2));
        assert!(
            declared(&["x money".into()])
                .unwrap_err()
                .contains("unknown type")
        );
        assert!(declared(&["x".into()]).unwrap_err().contains("name type"));
    }
}
