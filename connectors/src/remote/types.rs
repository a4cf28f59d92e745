//! Source column types → Arrow types, and the semantic facts pushdown must respect
//! (does `=` on this text column mean byte equality? does `<` mean code point order?).
//!
//! Each connector maps its own types (`postgres::postgres_type`, `mysql::mysql_type`,
//! `sqlserver::sqlserver_type`); the tables are in docs/connectors/.

use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};
use datafusion::common::ScalarValue;
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
    /// `col = 'literal'` at the source holds for every value Basin finds equal, and perhaps
    /// for more (trailing spaces, case, accents): an equality filter is pushed as a superset
    /// and checked again in Basin. False for types compared as something else than text
    /// (PostgreSQL `uuid`, T-SQL `ntext`), where the literal could fail to convert.
    pub text_superset: bool,
}

/// Decimal used for PostgreSQL's unconstrained `numeric`: 38 digits, 10 after the point.
pub const UNCONSTRAINED_NUMERIC: (u8, i8) = (38, 10);

pub fn decimal(precision: i64, scale: i64) -> Option<DataType> {
    if !(1..=76).contains(&precision) || scale < 0 || scale > precision {
        return None;
    }
    Some(if precision <= 38 {
        DataType::Decimal128(precision as u8, scale as i8)
    } else {
        DataType::Decimal256(precision as u8, scale as i8)
    })
}

pub fn timestamp(tz: bool) -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, tz.then(|| Arc::from("UTC")))
}

pub fn list(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", item, true)))
}

/// Whether Basin reads a result column of this Arrow type from every kind of source.
pub fn readable_common(data_type: &DataType) -> bool {
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
        _ => false,
    }
}

/// Literals every dialect writes alike (strings and unsigned integers are each dialect's
/// own decision).
pub fn literal_ok_common(v: &ScalarValue) -> bool {
    match v {
        ScalarValue::Boolean(_)
        | ScalarValue::Int8(_)
        | ScalarValue::Int16(_)
        | ScalarValue::Int32(_)
        | ScalarValue::Int64(_)
        | ScalarValue::Date32(_)
        | ScalarValue::Decimal128(_, _, _) => true,
        // Naive timestamps only: a zone-aware literal would meet the source's session zone.
        ScalarValue::TimestampSecond(_, None)
        | ScalarValue::TimestampMillisecond(_, None)
        | ScalarValue::TimestampMicrosecond(_, None) => true,
        ScalarValue::Float32(Some(f)) => f.is_finite() && *f != 0.0,
        ScalarValue::Float64(Some(f)) => f.is_finite() && *f != 0.0,
        _ => false,
    }
}
