//! Remote queries as plan nodes: `RemoteQueryTable` (what the pushdown rule puts in the
//! logical plan) and `RemoteScanExec` (its splits, run on executors).
//!
//! How a source splits a scan and reads a split is its [`Backend`](super::backend::Backend)'s
//! business (PostgreSQL: `ctid` page ranges under one exported snapshot; MySQL and SQL
//! Server: ranges of an integer key).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::backend::{Dialect, Keepalive, Splits};
use super::source::source;

/// A query for one source, producing columns `c0..cN`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteQuery {
    /// The catalog (source) name.
    pub source: String,
    pub dialect: Dialect,
    /// The whole query, unsplit.
    pub sql: String,
    /// For a plain scan of one table: the pieces that range splits are built from.
    pub split: Option<SplitBase>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitBase {
    pub schema: String,
    pub table: String,
    /// `SELECT … FROM "schema"."table"`.
    pub select_from: String,
    /// The pushed-down predicate, rendered.
    pub predicate: Option<String>,
    /// MySQL, SQL Server: the integer key to split on.
    pub key: Option<String>,
}

/// A pushed-down query as a table: one `TableScan` in the logical plan.
#[derive(Debug)]
pub struct RemoteQueryTable {
    query: RemoteQuery,
    schema: SchemaRef,
}

impl RemoteQueryTable {
    pub fn new(query: RemoteQuery, schema: SchemaRef) -> Self {
        Self { query, schema }
    }

    pub fn query(&self) -> &RemoteQuery {
        &self.query
    }
}

#[async_trait]
impl TableProvider for RemoteQueryTable {
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
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let exec = plan_scan(
            self.query.clone(),
            self.schema.clone(),
            state.config().target_partitions(),
        )
        .await?;
        match projection {
            Some(p)
                if p.len() != self.schema.fields().len()
                    || p.iter().enumerate().any(|(i, &j)| i != j) =>
            {
                let exprs = p
                    .iter()
                    .map(|&i| {
                        let name = self.schema.field(i).name().clone();
                        (
                            Arc::new(datafusion::physical_expr::expressions::Column::new(
                                &name, i,
                            ))
                                as Arc<dyn datafusion::physical_expr::PhysicalExpr>,
                            name,
                        )
                    })
                    .collect::<Vec<_>>();
                Ok(Arc::new(ProjectionExec::try_new(exprs, exec)?))
            }
            _ => Ok(exec),
        }
    }
}

/// Everything an executor needs to run the splits of a remote query.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteScanSpec {
    pub query: RemoteQuery,
    /// The query of each split (one per output partition).
    pub splits: Vec<String>,
    /// How the splits were made, for EXPLAIN.
    pub split_note: Option<String>,
    /// PostgreSQL: the snapshot all splits read.
    pub snapshot: Option<String>,
    /// The result schema as Arrow IPC bytes.
    pub schema_ipc: Vec<u8>,
}

/// Reads a remote query, one split per partition.
#[derive(Debug)]
pub struct RemoteScanExec {
    spec: RemoteScanSpec,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    _keepalive: Option<Arc<dyn Keepalive>>,
}

pub fn schema_to_ipc(schema: &Schema) -> Result<Vec<u8>> {
    let mut buf = vec![];
    {
        let mut w = datafusion::arrow::ipc::writer::StreamWriter::try_new(&mut buf, schema)?;
        w.finish()?;
    }
    Ok(buf)
}

fn schema_from_ipc(bytes: &[u8]) -> Result<SchemaRef> {
    let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(bytes, None)?;
    Ok(reader.schema())
}

impl RemoteScanExec {
    pub fn try_new(spec: RemoteScanSpec) -> Result<Self> {
        let schema = schema_from_ipc(&spec.schema_ipc)?;
        Ok(Self::with_schema(spec, schema, None))
    }

    fn with_schema(
        spec: RemoteScanSpec,
        schema: SchemaRef,
        keepalive: Option<Arc<dyn Keepalive>>,
    ) -> Self {
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
            _keepalive: keepalive,
        }
    }

    pub fn spec(&self) -> &RemoteScanSpec {
        &self.spec
    }

    /// The exact statement sent to the source for split `i`.
    pub fn statement(&self, i: usize) -> String {
        statement(&self.spec.query, &self.spec.splits[i], &self.schema)
    }
}

/// The statement a split sends, in its source's dialect.
fn statement(query: &RemoteQuery, split_sql: &str, schema: &SchemaRef) -> String {
    query.dialect.sql().statement(split_sql, schema)
}

impl DisplayAs for RemoteScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "RemoteScanExec: source={}, splits={}",
            self.spec.query.source,
            self.spec.splits.len()
        )?;
        if let Some(note) = &self.spec.split_note {
            write!(f, " ({note})")?;
        }
        write!(f, ", sql={}", self.statement(0))
    }
}

impl ExecutionPlan for RemoteScanExec {
    fn name(&self) -> &str {
        "RemoteScanExec"
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
                "RemoteScanExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let split = self.spec.splits.get(partition).ok_or_else(|| {
            DataFusionError::Internal(format!("RemoteScanExec has no partition {partition}"))
        })?;
        let source = source(&self.spec.query.source)?;
        let statement = statement(&self.spec.query, split, &self.schema);
        let batch_size = context.session_config().batch_size();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
        let schema = self.schema.clone();
        let snapshot = self.spec.snapshot.clone();
        let task_source = source.clone();
        crate::io_runtime().spawn(async move {
            let _permit = tokio::select! {
                p = task_source.permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = tx.send(Err(task_source.error("closed", e))).await;
                        return;
                    }
                },
                _ = tx.closed() => return,
            };
            let result = task_source
                .backend()
                .read(&task_source, &statement, snapshot, schema, batch_size, &tx)
                .await;
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
            }
        });
        Ok(receiver_stream(self.schema.clone(), rx))
    }
}

/// The batches a reader task sends through `rx`, as a plan's stream (the channel closes when
/// the stream is dropped, which stops the reader).
pub(crate) fn receiver_stream(
    schema: SchemaRef,
    rx: tokio::sync::mpsc::Receiver<Result<RecordBatch>>,
) -> SendableRecordBatchStream {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, stream.boxed()))
}

/// Splits of one scan per task slot of the cluster when the source sets no `max_splits`: two
/// reads in flight per slot keep both the source's backends and the decoding busy (TPC-H SF1
/// lineitem from PostgreSQL on 2 executors of 2 slots, interleaved with DuckDB: 4 splits took
/// 4.65–5.75 s per extraction, 8 splits 4.73–4.94 s; benchmarks/README.md).
const SPLITS_PER_SLOT: usize = 2;

/// Plans the splits of `query` (on the scheduler, or wherever the plan is made) and returns
/// the scan. `slots` (the cluster's task slots) bounds the number of splits, at
/// [`SPLITS_PER_SLOT`] per slot, unless the source sets `max_splits`.
pub async fn plan_scan(
    query: RemoteQuery,
    schema: SchemaRef,
    slots: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    let src = source(&query.source)?;
    let max_splits = (src.config.max_splits)
        .unwrap_or(SPLITS_PER_SLOT * slots.max(1))
        .max(1);
    let task_src = src.clone();
    let splits = match &query.split {
        Some(base) if max_splits > 1 => {
            let base = base.clone();
            src.call(async move {
                task_src
                    .backend()
                    .plan_splits(&task_src, &base, max_splits)
                    .await
            })
            .await?
        }
        _ => None,
    }
    .unwrap_or_else(|| Splits::single(&query));
    let spec = RemoteScanSpec {
        query,
        splits: splits.queries,
        split_note: splits.note,
        snapshot: splits.snapshot,
        schema_ipc: schema_to_ipc(&schema)?,
    };
    Ok(Arc::new(RemoteScanExec::with_schema(
        spec,
        schema,
        splits.keepalive,
    )))
}

impl SplitBase {
    /// The scan restricted to `range` (a predicate on the split key), with its own predicate.
    pub fn with_range(&self, range: &str) -> String {
        match &self.predicate {
            Some(p) => format!("{} WHERE {range} AND ({p})", self.select_from),
            None => format!("{} WHERE {range}", self.select_from),
        }
    }
}
