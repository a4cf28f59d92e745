//! Source column types → Arrow types, and the semantic facts pushdown must respect
//! (does `=` on this text column mean byte equality? does `<` mean code point order?).
//!
//! The full tables are in docs/connectors/postgres.md and docs/connectors/mysql.md.

use datafusion::arrow::datatypes::{DataType, Field, IntervalUnit, TimeUnit};
use std::sync::Arc;

/// A column as Basin sees it, with what the source says about it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteColumn {
    pub name: String,
    /// The source's type, as it prints it (`numeric(15,2)`, `varchar(25)`).
    pub source_type: String,
    pub data_type: DataType,
    pub nullable: bool,
    /// `=`, `IN`, `LIKE` and GROUP BY on this column behave as in Basin (byte equality).
    pub exact_text: bool,
    /// `<`, ORDER BY, MIN/MAX on this column order as in Basin (code point order).
    pub ordered_text: bool,
}

/// Decimal used for PostgreSQL's unconstrained `numeric`: 38 digits, 10 after the point.
pub const UNCONSTRAINED_NUMERIC: (u8, i8) = (38, 10);

fn decimal(precision: i64, scale: i64) -> Option<DataType> {
    if !(1..=76).contains(&precision) || scale < 0 || scale > precision {
        return None;
    }
    Some(if precision <= 38 {
        DataType::Decimal128(precision as u8, scale as i8)
    } else {
        DataType::Decimal256(precision as u8, scale as i8)
    })
}

fn timestamp(tz: bool) -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, tz.then(|| Arc::from("UTC")))
}

fn list(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", item, true)))
}

/// Arrow type of a PostgreSQL column. `typname` is the base type's name (`int4`, `_text`
/// for arrays), `typmod` the attribute's type modifier, `element` the array element's name.
pub fn postgres_type(typname: &str, typmod: i32, element: Option<&str>) -> DataType {
    match typname {
        "bool" => DataType::Boolean,
        "int2" => DataType::Int16,
        "int4" => DataType::Int32,
        "int8" | "oid" => DataType::Int64,
        "float4" => DataType::Float32,
        "float8" => DataType::Float64,
        "numeric" if typmod < 0 => {
            let (p, s) = UNCONSTRAINED_NUMERIC;
            DataType::Decimal128(p, s)
        }
        "numeric" => {
            let m = typmod - 4;
            decimal(((m >> 16) & 0xffff) as i64, (m & 0xffff) as i64).unwrap_or(DataType::Utf8)
        }
        "money" => DataType::Decimal128(19, 2),
        "bytea" => DataType::Binary,
        "date" => DataType::Date32,
        "time" => DataType::Time64(TimeUnit::Microsecond),
        "timestamp" => timestamp(false),
        "timestamptz" => timestamp(true),
        "interval" => DataType::Interval(IntervalUnit::MonthDayNano),
        _ if typname.starts_with('_') => match element.map(|e| postgres_type(e, -1, None)) {
            Some(
                t @ (DataType::Boolean
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::Float32
                | DataType::Float64),
            ) => list(t),
            Some(DataType::Utf8) if matches!(element, Some("text" | "varchar")) => {
                list(DataType::Utf8)
            }
            _ => DataType::Utf8,
        },
        // text, varchar, bpchar, name, citext, uuid, json(b), xml, inet, cidr, macaddr, enums,
        // bit strings, ranges, geometric types...: their text form.
        _ => DataType::Utf8,
    }
}

/// Whether equality on a PostgreSQL text column is byte equality (`citext` and `char(n)`
/// are not; neither are types exposed through their text form, such as `uuid`).
pub fn postgres_exact_text(typname: &str, deterministic: bool) -> bool {
    matches!(typname, "text" | "varchar" | "name") && deterministic
}

/// Arrow type of a MySQL/MariaDB column from information_schema.COLUMNS.
pub fn mysql_type(data_type: &str, column_type: &str, precision: i64, scale: i64) -> DataType {
    let unsigned = column_type.contains("unsigned");
    match data_type {
        "tinyint" if column_type.starts_with("tinyint(1)") && !unsigned => DataType::Boolean,
        "tinyint" if unsigned => DataType::UInt8,
        "tinyint" => DataType::Int8,
        "smallint" if unsigned => DataType::UInt16,
        "smallint" => DataType::Int16,
        "mediumint" | "int" | "integer" if unsigned => DataType::UInt32,
        "mediumint" | "int" | "integer" => DataType::Int32,
        "bigint" if unsigned => DataType::UInt64,
        "bigint" => DataType::Int64,
        "decimal" | "numeric" => decimal(precision, scale).unwrap_or(DataType::Utf8),
        "float" => DataType::Float32,
        "double" | "real" => DataType::Float64,
        "bit" if column_type == "bit(1)" => DataType::Boolean,
        "bit" => DataType::UInt64,
        "year" => DataType::Int16,
        "date" => DataType::Date32,
        "datetime" => timestamp(false),
        "timestamp" => timestamp(true),
        "time" => DataType::Time64(TimeUnit::Microsecond),
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" | "geometry"
        | "point" | "linestring" | "polygon" => DataType::Binary,
        // char, varchar, *text, enum, set, json (MariaDB: longtext), uuid, inet6...
        _ => DataType::Utf8,
    }
}

/// Whether a MySQL text column compares bytewise: binary collations (`*_bin`, `binary`).
pub fn mysql_binary_collation(collation: Option<&str>) -> bool {
    collation.is_some_and(|c| c == "binary" || c.ends_with("_bin"))
}

/// Whether Basin can read a value of this Arrow type back from `dialect`'s result.
pub fn readable(data_type: &DataType, postgres: bool) -> bool {
    match data_type {
        DataType::Boolean
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::Binary
        | DataType::Date32
        | DataType::Time64(TimeUnit::Microsecond)
        | DataType::Decimal128(_, _)
        | DataType::Decimal256(_, _) => true,
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            tz.as_deref().is_none_or(|t| t == "UTC" || t == "+00:00")
        }
        DataType::Int8
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => !postgres,
        DataType::Interval(IntervalUnit::MonthDayNano) => postgres,
        DataType::List(item) => {
            postgres
                && matches!(
                    item.data_type(),
                    DataType::Boolean
                        | DataType::Int16
                        | DataType::Int32
                        | DataType::Int64
                        | DataType::Float32
                        | DataType::Float64
                        | DataType::Utf8
                )
        }
        _ => false,
    }
}

/// The PostgreSQL type a result column is cast to so that its binary COPY form is the one
/// Basin decodes.
pub fn postgres_wire_type(data_type: &DataType) -> String {
    match data_type {
        DataType::Boolean => "bool".into(),
        DataType::Int16 => "int2".into(),
        DataType::Int32 => "int4".into(),
        DataType::Int64 => "int8".into(),
        DataType::Float32 => "float4".into(),
        DataType::Float64 => "float8".into(),
        DataType::Binary => "bytea".into(),
        DataType::Date32 => "date".into(),
        DataType::Time64(_) => "time".into(),
        DataType::Timestamp(_, None) => "timestamp".into(),
        DataType::Timestamp(_, Some(_)) => "timestamptz".into(),
        DataType::Interval(_) => "interval".into(),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => {
            format!("numeric({p},{s})")
        }
        DataType::List(item) => format!("{}[]", postgres_wire_type(item.data_type())),
        _ => "text".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_numeric_typmods() {
        // numeric(15,2): typmod = ((15 << 16) | 2) + 4
        assert_eq!(
            postgres_type("numeric", ((15 << 16) | 2) + 4, None),
            DataType::Decimal128(15, 2)
        );
        assert_eq!(
            postgres_type("numeric", ((60 << 16) | 5) + 4, None),
            DataType::Decimal256(60, 5)
        );
        assert_eq!(
            postgres_type("numeric", -1, None),
            DataType::Decimal128(38, 10)
        );
        assert_eq!(
            postgres_type("_int4", -1, Some("int4")),
            list(DataType::Int32)
        );
        assert_eq!(postgres_type("_uuid", -1, Some("uuid")), DataType::Utf8);
        assert_eq!(postgres_type("inet", -1, None), DataType::Utf8);
    }

    #[test]
    fn mysql_types() {
        assert_eq!(mysql_type("tinyint", "tinyint(1)", 3, 0), DataType::Boolean);
        assert_eq!(
            mysql_type("int", "int(10) unsigned", 10, 0),
            DataType::UInt32
        );
        assert_eq!(
            mysql_type("decimal", "decimal(12,2)", 12, 2),
            DataType::Decimal128(12, 2)
        );
        assert!(mysql_binary_collation(Some("utf8mb4_bin")));
        assert!(!mysql_binary_collation(Some("utf8mb4_general_ci")));
    }
}
