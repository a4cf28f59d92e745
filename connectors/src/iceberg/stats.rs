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
//!
//! A null count is given only when it is zero. DataFusion 53 uses a column's null count in one
//! place, the distinct keys of a join key (`rows - nulls`), and subtracts it there unchecked
//! from an exact row count. A join estimated to yield nothing (an input of no rows, or
//! inputs whose bounds do not meet) is estimated at `Inexact(0)` rows, which DataFusion's `Statistics::with_fetch` then turns into `Exact(0)`
//! (apache/datafusion#22413) while the join's columns keep their inputs' null counts
//! (apache/datafusion#22743): the next join up subtracts, say, 4 nulls from exactly 0 rows.
//! Debug builds panicked in planning (TPC-DS Q1, Q14, Q24 and Q95 at SF 0.1, six more at
//! SF 0.01; in Q94 the web sites, filtered to no file, zeroed the first join); release builds
//! wrap, harmlessly, since the wrapped figure divides a product with the zero row count. No
//! nonzero count is safe there, whatever the scan's own rows, and the correction it buys is
//! small: of the 99 TPC-DS plans at SF 0.1 (EXPLAIN compared), only Q33, Q56 and Q60 change,
//! one join built from the other side, and they take the same time (debug build, best of 9:
//! 3.69 vs 3.89 s, 4.01 vs 3.96 s, 3.76 vs 4.01 s for three runs each). A count of zero
//! cannot be subtracted wrongly. Without the others all 99 queries answer right at SF 0.01
//! and 0.1, cluster and standalone.
//! DataFusion fixed both halves after 53.1 (apache/datafusion#22146 keeps the zero inexact;
//! 55 subtracts with `checked_sub`): with those, the counts can be given again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, ScalarValue};
use futures::StreamExt;
use iceberg::spec::{
    DataContentType, Datum, ManifestContentType, ManifestFile, ManifestList, PrimitiveLiteral,
    PrimitiveType, Schema, TableMetadata,
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
    /// Bytes of each column in the file.
    sizes: HashMap<i32, u64>,
    /// Where the file's row groups start (the manifest's `split_offsets`), if recorded.
    splits: Option<Vec<i64>>,
}

/// Manifest lists and manifests are immutable: what was read from them is kept by path for
/// the next plans (a new snapshot reads only its new manifests). Both caches are bounded by
/// their estimated bytes, together at most `[server] metadata_cache_size` (default 64 MiB):
/// the least recently used entries go first, and a manifest larger than the whole cache is
/// read again each time rather than kept.
static MANIFEST_LISTS: Cache<Arc<Vec<ManifestFile>>> = LazyLock::new(Mutex::default);
static MANIFESTS: Cache<Arc<ManifestMetrics>> = LazyLock::new(Mutex::default);
/// The bytes both caches may hold (set from the configuration when a catalog connects).
static CACHE_BYTES: AtomicU64 = AtomicU64::new(DEFAULT_CACHE_BYTES);
/// `[server] metadata_cache_size`'s default (until a catalog connects).
const DEFAULT_CACHE_BYTES: u64 = 64 << 20;
/// Manifests read at once when a snapshot is first planned.
const MANIFEST_READS: usize = 8;

type Cache<V> = LazyLock<Mutex<Weighed<V>>>;

/// Sets the bytes the manifest caches may hold together (`[server] metadata_cache_size`);
/// entries over the new bound go at the next insert.
pub(crate) fn set_cache_bytes(bytes: u64) {
    CACHE_BYTES.store(bytes, Ordering::Relaxed);
}

/// Entries by path with their estimated bytes, the least recently used dropped first.
#[derive(Debug)]
struct Weighed<V> {
    clock: u64,
    bytes: u64,
    /// path → (last use, bytes, value)
    entries: HashMap<String, (u64, u64, V)>,
}

impl<V> Default for Weighed<V> {
    fn default() -> Self {
        Self {
            clock: 0,
            bytes: 0,
            entries: HashMap::new(),
        }
    }
}

impl<V: Clone> Weighed<V> {
    fn get(&mut self, path: &str) -> Option<V> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(path).map(|(used, _, value)| {
            *used = clock;
            value.clone()
        })
    }

    /// Keeps `value` if it fits in `limit` bytes, dropping the least recently used entries
    /// until the cache does.
    fn insert(&mut self, path: &str, value: V, bytes: u64, limit: u64) {
        if let Some((_, old, _)) = self.entries.remove(path) {
            self.bytes -= old;
        }
        if bytes > limit {
            return;
        }
        while self.bytes + bytes > limit {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (used, _, _))| *used)
                .map(|(path, _)| path.clone())
            else {
                break;
            };
            if let Some((_, old, _)) = self.entries.remove(&oldest) {
                self.bytes -= old;
            }
        }
        self.clock += 1;
        self.bytes += bytes;
        self.entries
            .insert(path.to_string(), (self.clock, bytes, value));
    }
}

fn cached<V: Clone>(cache: &Cache<V>, path: &str) -> Option<V> {
    cache.lock().unwrap_or_else(|e| e.into_inner()).get(path)
}

/// Keeps `value` in `cache` within its share of `[server] metadata_cache_size`: manifests
/// take up to nine tenths, manifest lists (a few hundred bytes per manifest) the rest.
fn keep<V: Clone>(cache: &Cache<V>, path: &str, value: V, bytes: u64, share: f64) {
    let limit = (CACHE_BYTES.load(Ordering::Relaxed) as f64 * share) as u64;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(path, value, bytes, limit);
}

/// Estimated bytes of one manifest's metrics in memory (hash tables at about twice their
/// entries' size).
fn manifest_bytes(metrics: &ManifestMetrics) -> u64 {
    const ENTRY: usize = 2 * (std::mem::size_of::<i32>() + std::mem::size_of::<Datum>());
    const COUNT: usize = 2 * (std::mem::size_of::<i32>() + std::mem::size_of::<u64>());
    let datum = |bounds: &HashMap<i32, Datum>| {
        bounds
            .values()
            .map(|d| match d.literal() {
                PrimitiveLiteral::String(s) => ENTRY + s.len(),
                PrimitiveLiteral::Binary(b) => ENTRY + b.len(),
                _ => ENTRY,
            })
            .sum::<usize>()
    };
    let bytes: usize = metrics
        .iter()
        .map(|(path, file)| {
            2 * (path.len() + std::mem::size_of::<(String, FileMetrics)>())
                + datum(&file.lower)
                + datum(&file.upper)
                + COUNT * (file.nulls.len() + file.nans.len() + file.sizes.len())
                + file.splits.as_ref().map_or(0, |s| 8 * s.len())
        })
        .sum();
    bytes as u64
}

/// Estimated bytes of a manifest list's entries in memory.
fn list_bytes(manifests: &[ManifestFile]) -> u64 {
    manifests
        .iter()
        .map(|m| std::mem::size_of::<ManifestFile>() + m.manifest_path.len() + 64)
        .sum::<usize>() as u64
}

/// What the manifests tell of a scan's columns over the planned files.
pub(crate) struct ScanColumns {
    /// One per output column.
    pub statistics: Vec<ColumnStatistics>,
    /// Bytes of the output columns in the planned files, if every file records them.
    pub bytes: Option<u64>,
}

/// Statistics for `schema`'s columns (the output of a scan of `version`) over the planned
/// files, or `None` when the manifests cannot be read (the plan goes on without).
pub(crate) async fn column_statistics(
    table: &Table,
    metadata: &TableMetadata,
    snapshot_id: i64,
    planned: &HashSet<&str>,
    schema: &SchemaRef,
    version: &Schema,
) -> Option<ScanColumns> {
    let field_ids: Vec<i32> = schema
        .fields()
        .iter()
        .map(|f| version.field_by_name(f.name()).map(|x| x.id))
        .collect::<Option<_>>()?;
    let manifests = snapshot_metrics(table, metadata, snapshot_id).await?;
    let mut stats: Vec<ColumnStatistics> = schema
        .fields()
        .iter()
        .map(|_| ColumnStatistics {
            null_count: Precision::Inexact(0),
            ..ColumnStatistics::new_unknown()
        })
        .collect();
    let mut seen = 0usize;
    let mut bytes = Some(0u64);
    let files = manifests.iter().flat_map(|m| m.iter());
    for (_, file) in files.filter(|(path, _)| planned.contains(path.as_str())) {
        seen += 1;
        bytes = field_ids
            .iter()
            .fold(bytes, |sum, id| Some(sum? + file.sizes.get(id)?));
        for ((stat, id), field) in stats.iter_mut().zip(&field_ids).zip(schema.fields()) {
            stat.null_count = no_nulls(stat.null_count, file.nulls.get(id).copied());
            let data_type = field.data_type();
            // Bounds leave NaN out, which DataFusion orders above every number: a float
            // column's bounds only where no planned file has a NaN (or may have one).
            let floats = matches!(data_type, DataType::Float32 | DataType::Float64);
            let bound = |bounds: &HashMap<i32, Datum>| match bounds.get(id) {
                Some(d) if !floats || file.nans.get(id) == Some(&0) => {
                    scalar(d, data_type).map_or(Precision::Absent, Precision::Inexact)
                }
                _ => Precision::Absent,
            };
            let (lo, hi) = (bound(&file.lower), bound(&file.upper));
            if seen == 1 {
                (stat.min_value, stat.max_value) = (lo, hi);
            } else {
                stat.min_value = stat.min_value.min(&lo);
                stat.max_value = stat.max_value.max(&hi);
            }
        }
    }
    (seen == planned.len()).then_some(ScanColumns {
        statistics: stats,
        bytes,
    })
}

/// The null count of a column over one more file: zero while every file so far recorded
/// none, unknown from the first file with a null or without a count (see the module docs).
fn no_nulls(so_far: Precision<usize>, file: Option<u64>) -> Precision<usize> {
    match (so_far, file) {
        (Precision::Inexact(0), Some(0)) => Precision::Inexact(0),
        _ => Precision::Absent,
    }
}

/// Where the row groups of the planned files start, by path, from the same manifests as the
/// statistics (files without recorded offsets are left out; nothing when the manifests cannot
/// be read).
pub(crate) async fn row_group_offsets(
    table: &Table,
    metadata: &TableMetadata,
    snapshot_id: i64,
    planned: &HashSet<&str>,
) -> HashMap<String, Vec<i64>> {
    let Some(manifests) = snapshot_metrics(table, metadata, snapshot_id).await else {
        return HashMap::new();
    };
    manifests
        .iter()
        .flat_map(|m| m.iter())
        .filter(|(path, _)| planned.contains(path.as_str()))
        .filter_map(|(path, file)| Some((path.clone(), file.splits.clone()?)))
        .collect()
}

/// The file metrics of a snapshot's data manifests.
async fn snapshot_metrics(
    table: &Table,
    metadata: &TableMetadata,
    snapshot_id: i64,
) -> Option<Arc<Vec<Arc<ManifestMetrics>>>> {
    let path = metadata.snapshot_by_id(snapshot_id)?.manifest_list();
    let manifests = match cached(&MANIFEST_LISTS, path) {
        Some(hit) => hit,
        None => {
            let bytes = table.file_io().new_input(path).ok()?.read().await.ok()?;
            let list = ManifestList::parse_with_version(&bytes, metadata.format_version()).ok()?;
            let data: Vec<ManifestFile> = list
                .entries()
                .iter()
                .filter(|m| m.content == ManifestContentType::Data)
                .cloned()
                .collect();
            let data = Arc::new(data);
            keep(&MANIFEST_LISTS, path, data.clone(), list_bytes(&data), 0.1);
            data
        }
    };
    // A new snapshot's manifests are read a few at a time, not one after another.
    let reads: Vec<_> = manifests
        .iter()
        .map(|manifest| manifest_metrics(table, manifest))
        .collect();
    let loaded: Vec<_> = futures::stream::iter(reads)
        .buffered(MANIFEST_READS)
        .collect()
        .await;
    Some(Arc::new(loaded.into_iter().collect::<Option<Vec<_>>>()?))
}

async fn manifest_metrics(table: &Table, manifest: &ManifestFile) -> Option<Arc<ManifestMetrics>> {
    if let Some(hit) = cached(&MANIFESTS, &manifest.manifest_path) {
        return Some(hit);
    }
    let loaded = manifest.load_manifest(table.file_io()).await.ok()?;
    let mut metrics = ManifestMetrics::new();
    for entry in loaded.entries() {
        let file = entry.data_file();
        if !entry.is_alive() || file.content_type() != DataContentType::Data {
            continue;
        }
        metrics.insert(
            file.file_path().to_string(),
            FileMetrics {
                lower: file.lower_bounds().clone(),
                upper: file.upper_bounds().clone(),
                nulls: file.null_value_counts().clone(),
                nans: file.nan_value_counts().clone(),
                sizes: file.column_sizes().clone(),
                splits: file.split_offsets().map(<[i64]>::to_vec),
            },
        );
    }
    let bytes = manifest_bytes(&metrics);
    let metrics = Arc::new(metrics);
    keep(
        &MANIFESTS,
        &manifest.manifest_path,
        metrics.clone(),
        bytes,
        0.9,
    );
    Some(metrics)
}

/// An Iceberg bound as a DataFusion scalar of the column's Arrow type, when it converts
/// exactly (floats' NaN and bounds of other types are left out).
fn scalar(datum: &Datum, data_type: &DataType) -> Option<ScalarValue> {
    literal_scalar(datum.data_type(), datum.literal(), data_type)
}

/// An Iceberg value of type `ty` as a DataFusion scalar of the column's Arrow type (see
/// [`scalar`]).
pub(super) fn literal_scalar(
    ty: &PrimitiveType,
    literal: &PrimitiveLiteral,
    data_type: &DataType,
) -> Option<ScalarValue> {
    let value = match (ty, literal) {
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
    } else if let (ScalarValue::Utf8(v), DataType::Utf8View) = (&value, data_type) {
        Some(ScalarValue::Utf8View(v.clone())) // strings are read as views
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

    use datafusion::common::stats::Precision;

    use super::{FileMetrics, ManifestMetrics, Weighed, manifest_bytes, no_nulls, scalar};

    #[test]
    fn the_manifest_cache_keeps_within_its_bytes_least_recently_used_out_first() {
        let mut cache = Weighed::default();
        cache.insert("a", 1, 40, 100);
        cache.insert("b", 2, 40, 100);
        assert_eq!(cache.get("a"), Some(1)); // b is now the least recently used
        cache.insert("c", 3, 40, 100);
        assert_eq!(
            (cache.get("a"), cache.get("b"), cache.get("c")),
            (Some(1), None, Some(3))
        );
        assert_eq!(cache.bytes, 80);
        // Larger than the whole cache: not kept, nothing else dropped for it.
        cache.insert("d", 4, 101, 100);
        assert_eq!((cache.get("d"), cache.bytes), (None, 80));
        // The same path again replaces its bytes; a lower bound drops what no longer fits.
        cache.insert("a", 5, 10, 100);
        assert_eq!(cache.bytes, 50);
        cache.insert("e", 6, 30, 45);
        assert!(
            cache.bytes <= 45,
            "{} bytes over a 45-byte bound",
            cache.bytes
        );
        assert_eq!(cache.get("e"), Some(6));
    }

    #[test]
    fn a_manifest_is_weighed_by_its_files_and_bounds() {
        let file = |bounds: usize| FileMetrics {
            lower: (0..bounds as i32)
                .map(|i| (i, Datum::string("x".repeat(100))))
                .collect(),
            sizes: (0..bounds as i32).map(|i| (i, 1)).collect(),
            ..FileMetrics::default()
        };
        let manifest = |files: usize, bounds: usize| -> ManifestMetrics {
            (0..files)
                .map(|i| (format!("s3://b/t/data/{i}.parquet"), file(bounds)))
                .collect()
        };
        let (small, wide, long) = (
            manifest_bytes(&manifest(10, 2)),
            manifest_bytes(&manifest(10, 20)),
            manifest_bytes(&manifest(1000, 2)),
        );
        assert!(small > 10 * 2 * 100, "{small}");
        assert!(
            wide > 4 * small && long > 50 * small,
            "{small} {wide} {long}"
        );
    }

    #[test]
    fn null_counts_are_given_only_when_zero() {
        let over = |files: &[Option<u64>]| {
            files
                .iter()
                .fold(Precision::Inexact(0), |n, f| no_nulls(n, *f))
        };
        assert_eq!(over(&[Some(0), Some(0)]), Precision::Inexact(0));
        // A join key with a few nulls (TPC-DS ws_ship_date_sk: 4 of 7,212 rows at SF 0.01).
        assert_eq!(over(&[Some(0), Some(4)]), Precision::Absent);
        assert_eq!(over(&[Some(4), Some(0)]), Precision::Absent);
        // A file written without the count.
        assert_eq!(over(&[None, Some(0)]), Precision::Absent);
    }

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
