//! Pipelines as plan nodes: `MongoQueryTable` (what the pushdown rule puts in the logical
//! plan) and `MongoScanExec` (its splits, run on executors).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use bson::{Bson, Document, doc};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use mongodb::bson::RawDocumentBuf;
use serde::{Deserialize, Serialize};

use super::decode::Documents;
use super::schema::Repr;
use super::{MongoSource, source};
use crate::remote::exec::{receiver_stream, schema_to_ipc};

/// An aggregation pipeline on one collection, producing the plan's columns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MongoQuery {
    /// The catalog (source) name.
    pub source: String,
    pub database: String,
    pub collection: String,
    /// The stages ([`encode_pipeline`]).
    pub pipeline: String,
    /// The top-level field each output column reads.
    pub fields: Vec<String>,
    pub reprs: Vec<Repr>,
    /// A plain scan (match and project only): may be split by `_id` ranges.
    pub splittable: bool,
    /// A grouped aggregate without GROUP BY: one row even over no documents, with 0 in the
    /// columns marked (counts) and NULL elsewhere.
    pub empty_row: Option<Vec<bool>>,
}

/// Stages as they travel in plans: the BSON bytes of `{p: [stages]}`, base64-encoded (a
/// pipeline's key order matters, and JSON maps do not keep it).
pub fn encode_pipeline(stages: &[Document]) -> String {
    use base64::Engine;
    let bytes = doc! { "p": stages.to_vec() }.to_vec().unwrap_or_default();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Stages as relaxed extended JSON with their keys in order, for EXPLAIN and errors.
pub fn pipeline_text(stages: &[Document]) -> String {
    let mut out = String::new();
    ordered_json(
        &Bson::Array(stages.iter().cloned().map(Bson::Document).collect()),
        &mut out,
    );
    out
}

/// `value` as relaxed extended JSON, documents' keys in their order.
pub fn ordered_json(value: &Bson, out: &mut String) {
    match value {
        Bson::Document(d) => {
            out.push('{');
            for (i, (k, v)) in d.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(k.to_string()).to_string());
                out.push(':');
                ordered_json(v, out);
            }
            out.push('}');
        }
        Bson::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ordered_json(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.clone().into_relaxed_extjson().to_string()),
    }
}

pub fn decode_pipeline(encoded: &str) -> Result<Vec<Document>> {
    use base64::Engine;
    let bad = |e: &dyn fmt::Display| {
        DataFusionError::Internal(format!("a MongoDB pipeline does not decode: {e}"))
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| bad(&e))?;
    let doc = Document::from_reader(&bytes[..]).map_err(|e| bad(&e))?;
    match doc.get("p") {
        Some(Bson::Array(stages)) => stages
            .iter()
            .map(|s| match s {
                Bson::Document(d) => Ok(d.clone()),
                other => Err(bad(&format!("stage {other}"))),
            })
            .collect(),
        _ => Err(bad(&"no stages")),
    }
}

/// A pushed-down pipeline as a table: one `TableScan` in the logical plan.
#[derive(Debug)]
pub struct MongoQueryTable {
    query: MongoQuery,
    schema: SchemaRef,
}

impl MongoQueryTable {
    pub fn new(query: MongoQuery, schema: SchemaRef) -> Self {
        Self { query, schema }
    }

    pub fn query(&self) -> &MongoQuery {
        &self.query
    }
}

#[async_trait]
impl TableProvider for MongoQueryTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![
            TableProviderFilterPushDown::Unsupported;
            filters.len()
        ])
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut query = self.query.clone();
        let mut schema = self.schema.clone();
        if let Some(p) = projection {
            schema = Arc::new(schema.project(p)?);
            query.fields = p.iter().map(|&i| query.fields[i].clone()).collect();
            query.reprs = p.iter().map(|&i| query.reprs[i]).collect();
            if let Some(zero) = &query.empty_row {
                query.empty_row = Some(p.iter().map(|&i| zero[i]).collect());
            }
        }
        plan_scan(query, schema).await
    }
}

/// Everything an executor needs to run the splits of a pipeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MongoScanSpec {
    pub query: MongoQuery,
    /// Per split (one per output partition): the `$match` on `_id` it adds in front
    /// ([`encode_pipeline`]); `None` reads everything.
    pub splits: Vec<Option<String>>,
    /// How the splits were made, for EXPLAIN.
    pub split_note: Option<String>,
    /// The result schema as Arrow IPC bytes.
    pub schema_ipc: Vec<u8>,
}

/// Runs a pipeline, one split per partition.
#[derive(Debug)]
pub struct MongoScanExec {
    spec: MongoScanSpec,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl MongoScanExec {
    pub fn try_new(spec: MongoScanSpec) -> Result<Self> {
        let reader =
            datafusion::arrow::ipc::reader::StreamReader::try_new(&spec.schema_ipc[..], None)?;
        let schema = reader.schema();
        Ok(Self::with_schema(spec, schema))
    }

    fn with_schema(spec: MongoScanSpec, schema: SchemaRef) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(spec.splits.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            spec,
            schema,
            properties,
        }
    }

    pub fn spec(&self) -> &MongoScanSpec {
        &self.spec
    }

    /// The stages split `i` sends.
    pub fn pipeline(&self, i: usize) -> Result<Vec<Document>> {
        split_pipeline(&self.spec, i)
    }
}

fn split_pipeline(spec: &MongoScanSpec, i: usize) -> Result<Vec<Document>> {
    let mut stages = vec![];
    if let Some(Some(range)) = spec.splits.get(i) {
        stages.extend(decode_pipeline(range)?);
    }
    stages.extend(decode_pipeline(&spec.query.pipeline)?);
    Ok(stages)
}

impl DisplayAs for MongoScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let q = &self.spec.query;
        write!(
            f,
            "MongoScanExec: source={}, collection={}.{}, splits={}",
            q.source,
            q.database,
            q.collection,
            self.spec.splits.len()
        )?;
        if let Some(note) = &self.spec.split_note {
            write!(f, " ({note})")?;
        }
        match self.pipeline(0) {
            Ok(stages) => write!(f, ", pipeline={}", pipeline_text(&stages)),
            Err(e) => write!(f, ", pipeline=<{e}>"),
        }
    }
}

impl ExecutionPlan for MongoScanExec {
    fn name(&self) -> &str {
        "MongoScanExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "MongoScanExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition >= self.spec.splits.len().max(1) {
            return Err(DataFusionError::Internal(format!(
                "MongoScanExec has no partition {partition}"
            )));
        }
        let source = source(&self.spec.query.source)?;
        let stages = self.pipeline(partition)?;
        let batch_size = context.session_config().batch_size();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
        let schema = self.schema.clone();
        let query = self.spec.query.clone();
        crate::io_runtime().spawn(async move {
            let _permit = tokio::select! {
                p = source.permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = tx.closed() => return,
            };
            if let Err(e) = read(&source, &query, stages, partition, schema, batch_size, &tx).await
            {
                let _ = tx.send(Err(e)).await;
            }
        });
        Ok(receiver_stream(self.schema.clone(), rx))
    }
}

/// Runs `stages` and sends the documents as batches of `batch_size` rows, until the end or
/// until `tx` closes (dropping the cursor then kills it on the server).
async fn read(
    source: &Arc<MongoSource>,
    query: &MongoQuery,
    stages: Vec<Document>,
    split: usize,
    schema: SchemaRef,
    batch_size: usize,
    tx: &tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> Result<()> {
    let client = source.client().await?;
    let collection = client
        .database(&query.database)
        .collection::<Document>(&query.collection);
    let mut action = collection
        .aggregate(stages)
        .with_type::<RawDocumentBuf>()
        .allow_disk_use(true)
        .batch_size(batch_size.clamp(101, 100_000) as u32)
        // Which Basin process runs which split, in the server's logs and `currentOp`.
        .comment(Bson::String(format!(
            "{} split {split}",
            crate::remote::source::application_name()
        )));
    if let Some(limit) = source.max_time() {
        action = action.max_time(limit);
    }
    let what = || format!("pipeline on {}.{}", query.database, query.collection);
    let mut cursor = action.await.map_err(|e| source.error(&what(), e))?;
    let mut docs = Documents::new(schema, &query.fields, &query.reprs)
        .map_err(|e| source.failed(format!("{}: {e}", what())))?;
    let mut sent = 0usize;
    loop {
        let more = tokio::select! {
            more = cursor.advance() => more.map_err(|e| source.error(&what(), e))?,
            _ = tx.closed() => return Ok(()),
        };
        if !more {
            break;
        }
        let doc = cursor.current();
        if let Err(e) = docs.push(doc) {
            let id = doc
                .get("_id")
                .ok()
                .flatten()
                .map(|v| format!(", document _id {}", super::decode::json_text(v)))
                .unwrap_or_default();
            return Err(source.failed(format!(
                "collection {}.{}{id}: {e}, where the column's type is another; declare the \
                 column as `json` (any value, as text) in [catalogs.{}.collections.\"{}.{}\"] \
                 or raise sample_size",
                query.database, query.collection, source.name, query.database, query.collection
            )));
        }
        if docs.rows() >= batch_size {
            sent += docs.rows();
            if tx.send(docs.finish()).await.is_err() {
                return Ok(());
            }
        }
    }
    if sent + docs.rows() == 0
        && let Some(zero) = &query.empty_row
    {
        docs.push_empty_aggregate(zero);
    }
    if docs.rows() > 0 {
        let _ = tx.send(docs.finish()).await;
    }
    Ok(())
}

/// Splits of one scan when the source sets no `max_splits`: one cursor. A `_id` range reads
/// through the `_id` index, which costs the server more per document than its collection
/// scan: TPC-H SF1 lineitem from DocumentDB on this 2-core machine took 154.6 s in 8 ranges
/// and 60.5 s through one cursor (the server alone: 45–54 s; benchmarks/README.md). Ranges
/// pay where the server has cores to spare: set `max_splits`.
const DEFAULT_MAX_SPLITS: usize = 1;

/// Plans the splits of `query` and returns the scan.
pub async fn plan_scan(query: MongoQuery, schema: SchemaRef) -> Result<Arc<dyn ExecutionPlan>> {
    let src = source(&query.source)?;
    let max_splits = src.config.max_splits.unwrap_or(DEFAULT_MAX_SPLITS).max(1);
    let (splits, note) = if query.splittable && max_splits > 1 {
        let (task_src, db, coll) = (
            src.clone(),
            query.database.clone(),
            query.collection.clone(),
        );
        src.call(async move { id_ranges(&task_src, &db, &coll, max_splits).await })
            .await?
            .unwrap_or((vec![None], None))
    } else {
        (vec![None], None)
    };
    let spec = MongoScanSpec {
        query,
        splits,
        split_note: note,
        schema_ipc: schema_to_ipc(&schema)?,
    };
    Ok(Arc::new(MongoScanExec::with_schema(spec, schema)))
}

/// `_id` ranges of about `split_size_bytes` each (at most `max_splits`), when the smallest
/// and largest `_id` are both numbers or both ObjectIds — then every `_id` is (BSON orders
/// values by type first), and the ranges, the first open below and the last above, read
/// each document exactly once, each through the `_id` index.
async fn id_ranges(
    src: &Arc<MongoSource>,
    database: &str,
    collection: &str,
    max_splits: usize,
) -> Result<Option<(Vec<Option<String>>, Option<String>)>> {
    let client = src.client().await?;
    let db = client.database(database);
    let what = || format!("planning splits of {database}.{collection}");
    let stats = db
        .run_command(doc! { "collStats": collection })
        .await
        .map_err(|e| src.error(&what(), e))?;
    let size = match stats.get("size") {
        Some(Bson::Int32(v)) => *v as f64,
        Some(Bson::Int64(v)) => *v as f64,
        Some(Bson::Double(v)) => *v,
        _ => return Ok(None),
    };
    let n = ((size / src.split_size_bytes() as f64).ceil() as usize).min(max_splits);
    if n < 2 {
        return Ok(None);
    }
    let coll = db.collection::<Document>(collection);
    let end = |order: i32| {
        let coll = coll.clone();
        async move {
            coll.find_one(doc! {})
                .sort(doc! { "_id": order })
                .projection(doc! { "_id": 1 })
                .await
        }
    };
    let lo = end(1).await.map_err(|e| src.error(&what(), e))?;
    let hi = end(-1).await.map_err(|e| src.error(&what(), e))?;
    let (Some(lo), Some(hi)) = (
        lo.and_then(|d| d.get("_id").cloned()),
        hi.and_then(|d| d.get("_id").cloned()),
    ) else {
        return Ok(None);
    };
    let bounds: Vec<Bson> = match (&lo, &hi) {
        (Bson::ObjectId(a), Bson::ObjectId(b)) => {
            let as_int = |o: &bson::oid::ObjectId| {
                let mut wide = [0u8; 16];
                wide[4..].copy_from_slice(&o.bytes());
                u128::from_be_bytes(wide)
            };
            let (a, b) = (as_int(a), as_int(b));
            let width = ((b.saturating_sub(a)) / n as u128).max(1);
            (1..n as u128)
                .map(|i| {
                    let v = (a + i * width).to_be_bytes();
                    let mut id = [0u8; 12];
                    id.copy_from_slice(&v[4..]);
                    Bson::ObjectId(bson::oid::ObjectId::from_bytes(id))
                })
                .collect()
        }
        (Bson::Int32(_) | Bson::Int64(_), Bson::Int32(_) | Bson::Int64(_)) => {
            let int = |b: &Bson| match b {
                Bson::Int32(v) => i128::from(*v),
                Bson::Int64(v) => i128::from(*v),
                _ => 0,
            };
            let (a, b) = (int(&lo), int(&hi));
            let width = ((b - a) / n as i128).max(1);
            (1..n as i128)
                .map(
                    |i| Bson::Int64((a + i * width).clamp(i64::MIN.into(), i64::MAX.into()) as i64),
                )
                .collect()
        }
        _ => return Ok(None),
    };
    let mut splits = vec![];
    for i in 0..=bounds.len() {
        let range = match (i.checked_sub(1).map(|j| &bounds[j]), bounds.get(i)) {
            (None, Some(upper)) => doc! { "_id": { "$lt": upper.clone() } },
            (Some(lower), Some(upper)) => {
                doc! { "_id": { "$gte": lower.clone(), "$lt": upper.clone() } }
            }
            (Some(lower), None) => doc! { "_id": { "$gte": lower.clone() } },
            (None, None) => doc! {},
        };
        splits.push(Some(encode_pipeline(&[doc! { "$match": range }])));
    }
    Ok(Some((splits, Some("by _id ranges".to_string()))))
}
