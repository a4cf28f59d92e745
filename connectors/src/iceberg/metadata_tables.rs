//! Metadata tables with Trino's names and columns: `"t$snapshots"`, `"t$history"`,
//! `"t$files"`, `"t$manifests"`, `"t$partitions"`, `"t$refs"`, `"t$properties"`.
//! They are small: built in the front end as memory tables of the table's current metadata.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Int32Array, Int64Array, MapBuilder, RecordBatch, StringArray,
    StringBuilder, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::TableProvider;
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result};
use iceberg::spec::{Struct, TableMetadata};
use iceberg::table::Table;

use super::catalog::error_text;

/// The metadata tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataTableKind {
    Snapshots,
    History,
    Files,
    Manifests,
    Partitions,
    Refs,
    Properties,
}

const ALL: [(&str, MetadataTableKind); 7] = [
    ("snapshots", MetadataTableKind::Snapshots),
    ("history", MetadataTableKind::History),
    ("files", MetadataTableKind::Files),
    ("manifests", MetadataTableKind::Manifests),
    ("partitions", MetadataTableKind::Partitions),
    ("refs", MetadataTableKind::Refs),
    ("properties", MetadataTableKind::Properties),
];

impl MetadataTableKind {
    pub fn parse(name: &str) -> Option<Self> {
        ALL.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, k)| *k)
    }

    pub fn names() -> String {
        ALL.iter()
            .map(|(n, _)| format!("${n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
}

fn map_type() -> DataType {
    // The layout MapBuilder produces.
    let mut b = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    let array = b.finish();
    array.data_type().clone()
}

fn table(schema: SchemaRef, columns: Vec<ArrayRef>) -> Result<Arc<dyn TableProvider>> {
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

/// Builds the metadata table `kind` of `t`.
pub async fn provider(
    kind: MetadataTableKind,
    qualified: &str,
    t: &Table,
) -> Result<Arc<dyn TableProvider>> {
    let m = t.metadata();
    let fail = |e: iceberg::Error| {
        DataFusionError::Execution(format!(
            "cannot read the metadata of `{qualified}`: {}",
            error_text(&e)
        ))
    };
    match kind {
        MetadataTableKind::Snapshots => snapshots(m),
        MetadataTableKind::History => history(m),
        MetadataTableKind::Refs => refs(m),
        MetadataTableKind::Properties => {
            let props: BTreeMap<&String, &String> = m.properties().iter().collect();
            let schema = Arc::new(Schema::new(vec![
                Field::new("key", DataType::Utf8, false),
                Field::new("value", DataType::Utf8, true),
            ]));
            table(
                schema,
                vec![
                    Arc::new(StringArray::from_iter_values(props.keys())),
                    Arc::new(StringArray::from_iter_values(props.values())),
                ],
            )
        }
        MetadataTableKind::Manifests => manifests(t).await.map_err(fail)?,
        MetadataTableKind::Files => files(t).await.map_err(fail)?,
        MetadataTableKind::Partitions => partitions(t).await.map_err(fail)?,
    }
}

fn snapshots(m: &TableMetadata) -> Result<Arc<dyn TableProvider>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("committed_at", ts_type(), false),
        Field::new("snapshot_id", DataType::Int64, false),
        Field::new("parent_id", DataType::Int64, true),
        Field::new("operation", DataType::Utf8, true),
        Field::new("manifest_list", DataType::Utf8, true),
        Field::new("summary", map_type(), true),
    ]));
    let mut snaps: Vec<_> = m.snapshots().collect();
    snaps.sort_by_key(|s| (s.timestamp_ms(), s.snapshot_id()));
    let mut summary = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    for s in &snaps {
        let props: BTreeMap<&String, &String> = s.summary().additional_properties.iter().collect();
        for (k, v) in props {
            summary.keys().append_value(k);
            summary.values().append_value(v);
        }
        summary.append(true)?;
    }
    table(
        schema,
        vec![
            Arc::new(
                TimestampMillisecondArray::from_iter_values(snaps.iter().map(|s| s.timestamp_ms()))
                    .with_timezone("UTC"),
            ),
            Arc::new(Int64Array::from_iter_values(
                snaps.iter().map(|s| s.snapshot_id()),
            )),
            Arc::new(Int64Array::from_iter(
                snaps.iter().map(|s| s.parent_snapshot_id()),
            )),
            Arc::new(StringArray::from_iter_values(
                snaps
                    .iter()
                    .map(|s| s.summary().operation.as_str().to_string()),
            )),
            Arc::new(StringArray::from_iter_values(
                snaps.iter().map(|s| s.manifest_list()),
            )),
            Arc::new(summary.finish()),
        ],
    )
}

/// Snapshots reachable from the current snapshot through parents.
fn current_ancestors(m: &TableMetadata) -> HashSet<i64> {
    let mut out = HashSet::new();
    let mut next = m.current_snapshot().map(|s| s.snapshot_id());
    while let Some(id) = next {
        if !out.insert(id) {
            break;
        }
        next = m.snapshot_by_id(id).and_then(|s| s.parent_snapshot_id());
    }
    out
}

fn history(m: &TableMetadata) -> Result<Arc<dyn TableProvider>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("made_current_at", ts_type(), false),
        Field::new("snapshot_id", DataType::Int64, false),
        Field::new("parent_id", DataType::Int64, true),
        Field::new("is_current_ancestor", DataType::Boolean, false),
    ]));
    let ancestors = current_ancestors(m);
    let log = m.history();
    table(
        schema,
        vec![
            Arc::new(
                TimestampMillisecondArray::from_iter_values(log.iter().map(|l| l.timestamp_ms))
                    .with_timezone("UTC"),
            ),
            Arc::new(Int64Array::from_iter_values(
                log.iter().map(|l| l.snapshot_id),
            )),
            Arc::new(Int64Array::from_iter(log.iter().map(|l| {
                m.snapshot_by_id(l.snapshot_id)
                    .and_then(|s| s.parent_snapshot_id())
            }))),
            Arc::new(BooleanArray::from_iter(
                log.iter().map(|l| Some(ancestors.contains(&l.snapshot_id))),
            )),
        ],
    )
}

fn refs(m: &TableMetadata) -> Result<Arc<dyn TableProvider>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("type", DataType::Utf8, false),
        Field::new("snapshot_id", DataType::Int64, false),
        Field::new("max_reference_age_in_ms", DataType::Int64, true),
        Field::new("min_snapshots_to_keep", DataType::Int32, true),
        Field::new("max_snapshot_age_in_ms", DataType::Int64, true),
    ]));
    // iceberg-rust has no public accessor for the refs: read them from the metadata JSON.
    let json = serde_json::to_value(m).map_err(|e| DataFusionError::Internal(e.to_string()))?;
    let mut rows: Vec<(String, serde_json::Value)> = json
        .get("refs")
        .and_then(|r| r.as_object())
        .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    if rows.is_empty()
        && let Some(s) = m.current_snapshot()
    {
        rows.push((
            "main".to_string(),
            serde_json::json!({"snapshot-id": s.snapshot_id(), "type": "branch"}),
        ));
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let int = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_i64());
    table(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.clone()),
            )),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| {
                r.1.get("type")
                    .and_then(|t| t.as_str())
                    .unwrap_or("branch")
                    .to_ascii_uppercase()
            }))),
            Arc::new(Int64Array::from_iter_values(
                rows.iter()
                    .map(|r| int(&r.1, "snapshot-id").unwrap_or_default()),
            )),
            Arc::new(Int64Array::from_iter(
                rows.iter().map(|r| int(&r.1, "max-ref-age-ms")),
            )),
            Arc::new(Int32Array::from_iter(
                rows.iter()
                    .map(|r| int(&r.1, "min-snapshots-to-keep").map(|v| v as i32)),
            )),
            Arc::new(Int64Array::from_iter(
                rows.iter().map(|r| int(&r.1, "max-snapshot-age-ms")),
            )),
        ],
    )
}

async fn manifests(t: &Table) -> iceberg::Result<Result<Arc<dyn TableProvider>>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("path", DataType::Utf8, false),
        Field::new("length", DataType::Int64, false),
        Field::new("partition_spec_id", DataType::Int32, false),
        Field::new("added_snapshot_id", DataType::Int64, false),
        Field::new("added_data_files_count", DataType::Int32, true),
        Field::new("added_rows_count", DataType::Int64, true),
        Field::new("existing_data_files_count", DataType::Int32, true),
        Field::new("existing_rows_count", DataType::Int64, true),
        Field::new("deleted_data_files_count", DataType::Int32, true),
        Field::new("deleted_rows_count", DataType::Int64, true),
    ]));
    let mut list = Vec::new();
    if let Some(s) = t.metadata().current_snapshot() {
        list = t.manifest_list_reader(s).load().await?.entries().to_vec();
    }
    Ok(table(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(
                list.iter().map(|f| f.manifest_path.clone()),
            )),
            Arc::new(Int64Array::from_iter_values(
                list.iter().map(|f| f.manifest_length),
            )),
            Arc::new(Int32Array::from_iter_values(
                list.iter().map(|f| f.partition_spec_id),
            )),
            Arc::new(Int64Array::from_iter_values(
                list.iter().map(|f| f.added_snapshot_id),
            )),
            Arc::new(Int32Array::from_iter(
                list.iter().map(|f| f.added_files_count.map(|v| v as i32)),
            )),
            Arc::new(Int64Array::from_iter(
                list.iter().map(|f| f.added_rows_count.map(|v| v as i64)),
            )),
            Arc::new(Int32Array::from_iter(
                list.iter()
                    .map(|f| f.existing_files_count.map(|v| v as i32)),
            )),
            Arc::new(Int64Array::from_iter(
                list.iter().map(|f| f.existing_rows_count.map(|v| v as i64)),
            )),
            Arc::new(Int32Array::from_iter(
                list.iter().map(|f| f.deleted_files_count.map(|v| v as i32)),
            )),
            Arc::new(Int64Array::from_iter(
                list.iter().map(|f| f.deleted_rows_count.map(|v| v as i64)),
            )),
        ],
    ))
}

/// One live file of the current snapshot.
struct LiveFile {
    content: i32,
    path: String,
    format: String,
    spec_id: i32,
    partition: String,
    records: i64,
    bytes: i64,
}

async fn live_files(t: &Table) -> iceberg::Result<Vec<LiveFile>> {
    let m = t.metadata();
    let Some(s) = m.current_snapshot() else {
        return Ok(vec![]);
    };
    let mut out = Vec::new();
    for mf in t.manifest_list_reader(s).load().await?.entries() {
        let manifest = mf.load_manifest(t.file_io()).await?;
        let partition_type = m
            .partition_spec_by_id(mf.partition_spec_id)
            .map(|spec| spec.partition_type(m.current_schema()))
            .transpose()?;
        for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
            let f = entry.data_file();
            out.push(LiveFile {
                content: f.content_type() as i32,
                path: f.file_path().to_string(),
                format: f.file_format().to_string().to_ascii_uppercase(),
                spec_id: mf.partition_spec_id,
                partition: partition_text(f.partition(), partition_type.as_ref()),
                records: f.record_count() as i64,
                bytes: f.file_size_in_bytes() as i64,
            });
        }
    }
    Ok(out)
}

/// A partition tuple as `{name=value, ...}` (Trino prints partition rows this way).
fn partition_text(value: &Struct, ty: Option<&iceberg::spec::StructType>) -> String {
    let Some(ty) = ty else {
        return String::new();
    };
    let parts: Vec<String> = ty
        .fields()
        .iter()
        .zip(value.iter())
        .map(|(field, literal)| {
            let text = match literal {
                None => "null".to_string(),
                Some(l) => l
                    .clone()
                    .try_into_json(&field.field_type)
                    .map(|j| match j {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    })
                    .unwrap_or_else(|_| format!("{l:?}")),
            };
            format!("{}={}", field.name, text)
        })
        .collect();
    format!("{{{}}}", parts.join(", "))
}

async fn files(t: &Table) -> iceberg::Result<Result<Arc<dyn TableProvider>>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("content", DataType::Int32, false),
        Field::new("file_path", DataType::Utf8, false),
        Field::new("file_format", DataType::Utf8, false),
        Field::new("spec_id", DataType::Int32, false),
        Field::new("partition", DataType::Utf8, true),
        Field::new("record_count", DataType::Int64, false),
        Field::new("file_size_in_bytes", DataType::Int64, false),
    ]));
    let files = live_files(t).await?;
    Ok(table(
        schema,
        vec![
            Arc::new(Int32Array::from_iter_values(
                files.iter().map(|f| f.content),
            )),
            Arc::new(StringArray::from_iter_values(
                files.iter().map(|f| f.path.clone()),
            )),
            Arc::new(StringArray::from_iter_values(
                files.iter().map(|f| f.format.clone()),
            )),
            Arc::new(Int32Array::from_iter_values(
                files.iter().map(|f| f.spec_id),
            )),
            Arc::new(StringArray::from_iter_values(
                files.iter().map(|f| f.partition.clone()),
            )),
            Arc::new(Int64Array::from_iter_values(
                files.iter().map(|f| f.records),
            )),
            Arc::new(Int64Array::from_iter_values(files.iter().map(|f| f.bytes))),
        ],
    ))
}

async fn partitions(t: &Table) -> iceberg::Result<Result<Arc<dyn TableProvider>>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("partition", DataType::Utf8, true),
        Field::new("record_count", DataType::Int64, false),
        Field::new("file_count", DataType::Int64, false),
        Field::new("total_size", DataType::Int64, false),
    ]));
    let mut by_partition: BTreeMap<String, (i64, i64, i64)> = BTreeMap::new();
    for f in live_files(t).await?.into_iter().filter(|f| f.content == 0) {
        let e = by_partition.entry(f.partition).or_default();
        e.0 += f.records;
        e.1 += 1;
        e.2 += f.bytes;
    }
    Ok(table(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(by_partition.keys().cloned())),
            Arc::new(Int64Array::from_iter_values(
                by_partition.values().map(|v| v.0),
            )),
            Arc::new(Int64Array::from_iter_values(
                by_partition.values().map(|v| v.1),
            )),
            Arc::new(Int64Array::from_iter_values(
                by_partition.values().map(|v| v.2),
            )),
        ],
    ))
}
