//! String views: how Basin reads strings, and where it turns them back into plain strings.
//!
//! Iceberg string columns are read as Arrow `Utf8View`. The Parquet reader then decodes a
//! dictionary-encoded column into 16-byte views of the dictionary instead of copying every
//! value's bytes, and comparisons look at a view's length and 4-byte prefix before its bytes.
//! On TPC-H SF1 that is what separates DataFusion's own Parquet scans from Basin's: Q1
//! 0.31 → 0.25 s, Q12 0.17 → 0.12 s, Q19 0.25 → 0.16 s in DataFusion with plain strings
//! against views.
//!
//! A view array points into buffers it may share with other batches, and Arrow IPC writes
//! every buffer an array points into: a batch of a few rows can carry megabytes (the reason
//! Ballista 53 turns DataFusion's view types off). So strings go back to plain `Utf8` where
//! rows leave a process or Basin:
//! - query results, for clients that do not know view types ([`plain_strings_at_output`]);
//! - Ballista's exchanges (a physical rule on the scheduler, `scheduler/src/views.rs`);
//! - a streamed stage's batches are compacted ([`compact_views`]) before its executor sends
//!   them;
//! - Iceberg writes cast to the table's Arrow types.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, GenericByteViewArray, RecordBatch};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::ByteViewType;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, cast};

/// `data_type` as Basin reads it: strings as views (top-level columns only).
pub fn read_type(data_type: &DataType) -> DataType {
    match data_type {
        DataType::Utf8 => DataType::Utf8View,
        other => other.clone(),
    }
}

/// `schema` with its string columns read as views.
pub fn read_schema(schema: &Schema) -> Schema {
    map_types(schema, |t| Some(read_type(t)))
}

/// `schema` with each column whose type `to` maps given that type.
fn map_types(schema: &Schema, to: impl Fn(&DataType) -> Option<DataType>) -> Schema {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match to(f.data_type()) {
            Some(t) => f.as_ref().clone().with_data_type(t),
            None => f.as_ref().clone(),
        })
        .collect();
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// The plain type of a view type, for rows that leave Basin or a process.
pub fn plain_type(data_type: &DataType) -> Option<DataType> {
    match data_type {
        DataType::Utf8View => Some(DataType::Utf8),
        DataType::BinaryView => Some(DataType::Binary),
        _ => None,
    }
}

/// Whether any column of `schema` is a view.
pub fn has_views(schema: &Schema) -> bool {
    schema
        .fields()
        .iter()
        .any(|f| plain_type(f.data_type()).is_some())
}

/// `schema` as clients see it: view columns as plain strings and binaries.
pub fn plain_schema(schema: &Schema) -> Schema {
    map_types(schema, plain_type)
}

/// A query's plan with a projection on top that casts view columns to plain strings and
/// binaries (clients get the types they have always got); other plans unchanged.
pub fn plain_strings_at_output(plan: LogicalPlan) -> Result<LogicalPlan> {
    let schema = plan.schema().clone();
    if !has_views(schema.as_arrow()) {
        return Ok(plan);
    }
    let exprs: Vec<Expr> = schema
        .iter()
        .map(|(qualifier, field)| {
            let column = Expr::Column((qualifier, field).into());
            match plain_type(field.data_type()) {
                Some(plain) => {
                    cast(column, plain).alias_qualified(qualifier.cloned(), field.name())
                }
                None => column,
            }
        })
        .collect();
    LogicalPlanBuilder::from(plan).project(exprs)?.build()
}

/// `batch` with the bytes of each view column that points into mostly foreign data copied
/// into buffers of its own, so that Arrow IPC sends only this batch's values. Batches
/// without views, and view columns whose buffers are mostly their own values (an
/// aggregate's groups), are returned as they are.
pub fn compact_views(batch: RecordBatch) -> Result<RecordBatch> {
    if !has_views(batch.schema_ref()) {
        return Ok(batch);
    }
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| -> ArrayRef {
            match c.data_type() {
                DataType::Utf8View => compact(c.as_string_view()).unwrap_or_else(|| c.clone()),
                DataType::BinaryView => compact(c.as_binary_view()).unwrap_or_else(|| c.clone()),
                _ => c.clone(),
            }
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// `array` with its own buffers, when the ones it has hold more than twice the bytes its
/// views use.
fn compact<T: ByteViewType + ?Sized>(array: &GenericByteViewArray<T>) -> Option<ArrayRef> {
    let held: usize = array.data_buffers().iter().map(Buffer::len).sum();
    (held > 2 * array.total_buffer_bytes_used()).then(|| Arc::new(array.gc()) as ArrayRef)
}

/// `expr` with string view literals as plain string literals (for converters that know only
/// those, such as iceberg-rust's predicate conversion).
pub fn plain_literals(expr: &Expr) -> Result<Expr> {
    expr.clone()
        .transform(|e| {
            Ok(match e {
                Expr::Literal(ScalarValue::Utf8View(v), meta) => {
                    Transformed::yes(Expr::Literal(ScalarValue::Utf8(v), meta))
                }
                other => Transformed::no(other),
            })
        })
        .map(|t| t.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, StringViewArray};
    use datafusion::logical_expr::{col, lit};

    #[test]
    fn compacted_views_keep_their_values_and_drop_shared_buffers() {
        let long: Vec<String> = (0..1000)
            .map(|i| format!("a value longer than twelve {i}"))
            .collect();
        let views = StringViewArray::from_iter_values(long.iter());
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8View, false),
            Field::new("i", DataType::Int32, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(views),
                Arc::new(Int32Array::from_iter_values(0..1000)),
            ],
        )
        .unwrap()
        .slice(10, 2);
        let before = batch.column(0).get_buffer_memory_size();
        let compact = compact_views(batch.clone()).unwrap();
        assert!(compact.column(0).get_buffer_memory_size() < before / 10);
        assert_eq!(compact, batch);
    }

    #[test]
    fn view_literals_become_plain_literals() {
        let e = col("a").eq(lit(ScalarValue::Utf8View(Some("x".into()))));
        assert_eq!(plain_literals(&e).unwrap(), col("a").eq(lit("x")));
    }

    #[test]
    fn only_strings_are_read_as_views() {
        let schema = Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("b", DataType::Binary, true),
            Field::new("i", DataType::Int64, false),
        ]);
        let read = read_schema(&schema);
        let types: Vec<_> = read
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        assert_eq!(
            types,
            [DataType::Utf8View, DataType::Binary, DataType::Int64]
        );
    }
}
