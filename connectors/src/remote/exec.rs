//! Remote queries as plan nodes: `RemoteQueryTable` (what the pushdown rule puts in the
//! logical plan) and `RemoteScanExec` (its splits, run on executors).
//!
//! PostgreSQL splits are `ctid` page ranges read with `COPY (…) TO STDOUT (FORMAT binary)`,
//! all under one snapshot exported by the scheduler (`pg_export_snapshot`), so every split
//! sees the same data. MySQL splits are ranges of an integer primary key.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};

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
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::{Executor, Row};

use super::decode::{Columns, CopyParser};
use super::pgwire;
use super::source::{Dialect, Pool, RemoteSource, source};
use super::sql::{quote_ident, quote_literal};
use super::types::postgres_wire_type;

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
    /// MySQL: the integer primary key to split on.
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

/// Keeps the exporting transaction of a PostgreSQL snapshot open while the plan lives.
struct SnapshotHolder(Mutex<Option<sqlx::PgConnection>>);

impl Drop for SnapshotHolder {
    fn drop(&mut self) {
        if let Some(conn) = self.0.lock().ok().and_then(|mut c| c.take()) {
            crate::io_runtime().spawn(async move {
                use sqlx::Connection;
                let _ = conn.close().await;
            });
        }
    }
}

impl fmt::Debug for SnapshotHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SnapshotHolder")
    }
}

/// Reads a remote query, one split per partition.
#[derive(Debug)]
pub struct RemoteScanExec {
    spec: RemoteScanSpec,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    _snapshot: Option<Arc<SnapshotHolder>>,
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
        snapshot: Option<Arc<SnapshotHolder>>,
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
            _snapshot: snapshot,
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

/// The statement a split sends: PostgreSQL wraps the query in a binary COPY whose columns are
/// cast to the types Basin decodes; MySQL runs it as it is.
fn statement(query: &RemoteQuery, split_sql: &str, schema: &SchemaRef) -> String {
    match query.dialect {
        Dialect::Postgres => {
            let columns: Vec<String> = schema
                .fields()
                .iter()
                .map(|f| {
                    format!(
                        "q.{}::{}",
                        quote_ident(f.name(), Dialect::Postgres),
                        postgres_wire_type(f.data_type())
                    )
                })
                .collect();
            format!(
                "COPY (SELECT {} FROM ({split_sql}) AS q) TO STDOUT (FORMAT binary)",
                columns.join(", ")
            )
        }
        Dialect::MySql => split_sql.to_string(),
    }
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
            let result = match task_source.dialect {
                Dialect::Postgres => {
                    run_postgres(&task_source, &statement, snapshot, schema, batch_size, &tx).await
                }
                Dialect::MySql => {
                    run_mysql(&task_source, &statement, schema, batch_size, &tx).await
                }
            };
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
            }
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream.boxed(),
        )))
    }
}

/// What stopped a remote read early.
enum Stop {
    /// The consumer went away (query cancelled or LIMIT satisfied).
    Cancelled,
    Failed(DataFusionError),
}

fn run_postgres<'a>(
    source: &'a Arc<RemoteSource>,
    statement: &'a str,
    snapshot: Option<String>,
    schema: SchemaRef,
    batch_size: usize,
    tx: &'a tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> BoxFuture<'a, Result<()>> {
    Box::pin(async move {
        let Pool::Postgres(pool) = source.pool() else {
            return Err(DataFusionError::Internal("not a PostgreSQL source".into()));
        };
        let _permit = tokio::select! {
            p = source.permits.clone().acquire_owned() => p.map_err(|e| source.error("closed", e))?,
            _ = tx.closed() => return Ok(()),
        };
        if let Some(id) = &snapshot
            && !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        {
            return Err(DataFusionError::Internal(format!(
                "bad PostgreSQL snapshot id {id:?}"
            )));
        }
        if let Some(target) = source.copy_target() {
            match copy_own_session(
                source, target, statement, &snapshot, &schema, batch_size, tx,
            )
            .await?
            {
                Read::Done => return Ok(()),
                Read::Unsupported(why) => source.copy_through_pool(why),
            }
        }
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| source.error("cannot connect", e))?;
        if let Some(id) = &snapshot {
            (&mut *conn).execute(format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{id}'"
        ).as_str())
        .await
        .map_err(|e| source.error("cannot join the scan's snapshot (it ends when the query does)", e))?;
        }
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| source.error("query failed", e))?;
        let outcome: std::result::Result<(), Stop> = async {
            // PostgreSQL answers a COPY only once its query produces: a slow query is
            // cancelled while it has not sent anything yet too.
            let mut stream = tokio::select! {
                s = conn.copy_out_raw(statement) => {
                    s.map_err(|e| Stop::Failed(source.error("query failed", e)))?
                }
                _ = tx.closed() => return Err(Stop::Cancelled),
            };
            let mut parser = CopyParser::new();
            let mut columns = Columns::new(schema.clone(), batch_size).map_err(Stop::Failed)?;
            // One wait for the reader to go away for the whole stream, not one per row.
            let closed = tx.closed();
            tokio::pin!(closed);
            loop {
                let chunk = tokio::select! {
                    biased;
                    c = stream.next() => c,
                    _ = &mut closed => return Err(Stop::Cancelled),
                };
                match chunk {
                    Some(Ok(bytes)) => {
                        parser.feed(bytes);
                        loop {
                            parser
                                .parse(&mut columns, batch_size)
                                .map_err(Stop::Failed)?;
                            if columns.rows() < batch_size {
                                break;
                            }
                            flush(&mut columns, tx).await?;
                        }
                    }
                    Some(Err(e)) => return Err(Stop::Failed(source.error("query failed", e))),
                    None => break,
                }
            }
            flush(&mut columns, tx).await?;
            Ok(())
        }
        .await;
        match outcome {
            Ok(()) => {
                if snapshot.is_some() {
                    let _ = (&mut *conn).execute("COMMIT").await;
                }
                Ok(())
            }
            Err(stop) => {
                // The connection is mid-query: never give it back to the pool.
                conn.close_on_drop();
                drop(conn);
                if let Ok(mut other) = pool.acquire().await {
                    let _ = sqlx::query("SELECT pg_cancel_backend($1)")
                        .bind(pid)
                        .execute(&mut *other)
                        .await;
                }
                match stop {
                    Stop::Cancelled => Ok(()),
                    Stop::Failed(e) => Err(e),
                }
            }
        }
    })
}

/// Sends the rows `columns` hold as one batch (nothing when they hold none).
async fn flush(
    columns: &mut Columns,
    tx: &tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> std::result::Result<(), Stop> {
    if columns.rows() > 0 {
        let batch = columns.finish().map_err(Stop::Failed)?;
        tx.send(Ok(batch)).await.map_err(|_| Stop::Cancelled)?;
    }
    Ok(())
}

/// How [`copy_own_session`] ended.
enum Read {
    Done,
    /// The session needs what [`pgwire`] does not speak: read through the pool.
    Unsupported(&'static str),
}

/// Reads a PostgreSQL split over a session of its own ([`pgwire`]): the COPY stream's frames
/// are parsed where the socket reads put them.
async fn copy_own_session(
    source: &Arc<RemoteSource>,
    target: &pgwire::Target,
    statement: &str,
    snapshot: &Option<String>,
    schema: &SchemaRef,
    batch_size: usize,
    tx: &tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> Result<Read> {
    let sql = match snapshot {
        Some(id) => format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{id}'; \
             {statement}; COMMIT"
        ),
        None => statement.to_string(),
    };
    // An idle session of an earlier split, else a new one. A kept session that the server
    // closed meanwhile fails to start: the next kept one, or a new one, takes over.
    let mut conn = loop {
        let (mut conn, kept) = match source.take_copy_session() {
            Some(conn) => (conn, true),
            None => {
                let connected = tokio::select! {
                    c = pgwire::CopyConn::connect(target) => c,
                    _ = tx.closed() => return Ok(Read::Done),
                };
                match connected.map_err(|e| source.error("cannot connect", e))? {
                    pgwire::Connected::Ready(conn) => (conn, false),
                    pgwire::Connected::Unsupported(why) => return Ok(Read::Unsupported(why)),
                }
            }
        };
        let started = tokio::select! {
            r = conn.start_copy(&sql) => r,
            _ = tx.closed() => {
                conn.cancel().await;
                return Ok(Read::Done);
            }
        };
        match started {
            Ok(()) => break conn,
            Err(pgwire::WireError::Io(e)) if kept => {
                tracing::debug!(source = %source.name, "a kept COPY session is gone: {e}");
            }
            Err(e) => {
                conn.cancel().await;
                return Err(source.error("query failed", e));
            }
        }
    };
    let failed = |e: pgwire::WireError| Stop::Failed(source.error("query failed", e));
    let outcome: std::result::Result<(), Stop> = async {
        let mut parser = CopyParser::new();
        let mut columns = Columns::new(schema.clone(), batch_size).map_err(Stop::Failed)?;
        let closed = tx.closed();
        tokio::pin!(closed);
        loop {
            match conn.next_frame().map_err(failed)? {
                pgwire::Frame::Data => {
                    let data = conn.data();
                    let mut at = 0;
                    loop {
                        at += parser
                            .parse_slice(&data[at..], &mut columns, batch_size)
                            .map_err(Stop::Failed)?;
                        if columns.rows() < batch_size {
                            break;
                        }
                        flush(&mut columns, tx).await?;
                    }
                    parser.keep(&data[at..]);
                }
                pgwire::Frame::NeedMore => tokio::select! {
                    biased;
                    r = conn.read_more() => r.map_err(failed)?,
                    _ = &mut closed => return Err(Stop::Cancelled),
                },
                pgwire::Frame::Done => break,
            }
        }
        if !parser.done {
            return Err(Stop::Failed(
                source.error("query failed", "the COPY stream ended before its trailer"),
            ));
        }
        flush(&mut columns, tx).await?;
        Ok(())
    }
    .await;
    match outcome {
        Ok(()) => {
            source.keep_copy_session(conn);
            Ok(Read::Done)
        }
        Err(stop) => {
            // Whatever still runs for this session stops: the query, then the session.
            conn.cancel().await;
            match stop {
                Stop::Cancelled => Ok(Read::Done),
                Stop::Failed(e) => Err(e),
            }
        }
    }
}

fn run_mysql<'a>(
    source: &'a Arc<RemoteSource>,
    statement: &'a str,
    schema: SchemaRef,
    batch_size: usize,
    tx: &'a tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> BoxFuture<'a, Result<()>> {
    Box::pin(async move {
        let Pool::MySql(pool) = source.pool() else {
            return Err(DataFusionError::Internal("not a MySQL source".into()));
        };
        let _permit = tokio::select! {
            p = source.permits.clone().acquire_owned() => p.map_err(|e| source.error("closed", e))?,
            _ = tx.closed() => return Ok(()),
        };
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| source.error("cannot connect", e))?;
        let id_row = (&mut *conn)
            .fetch_one("SELECT CONNECTION_ID()")
            .await
            .map_err(|e| source.error("query failed", e))?;
        let id: Option<&[u8]> = id_row
            .try_get_unchecked(0)
            .map_err(|e| source.error("query failed", e))?;
        let id: u64 = id
            .and_then(|b| std::str::from_utf8(b).ok()?.parse().ok())
            .unwrap_or(0);
        let outcome: std::result::Result<(), Stop> = async {
            let mut rows = (&mut *conn).fetch(statement);
            let mut columns = Columns::new(schema.clone(), batch_size).map_err(Stop::Failed)?;
            let width = columns.width();
            let closed = tx.closed();
            tokio::pin!(closed);
            loop {
                let row = tokio::select! {
                    biased;
                    r = rows.next() => r,
                    _ = &mut closed => return Err(Stop::Cancelled),
                };
                match row {
                    Some(Ok(row)) => {
                        for i in 0..width {
                            let v: Option<&[u8]> = row.try_get_unchecked(i).map_err(|e| {
                                Stop::Failed(source.error("cannot read a value", e))
                            })?;
                            columns.push_mysql(i, v).map_err(Stop::Failed)?;
                        }
                        columns.end_row();
                        if columns.rows() >= batch_size {
                            flush(&mut columns, tx).await?;
                        }
                    }
                    Some(Err(e)) => return Err(Stop::Failed(source.error("query failed", e))),
                    None => break,
                }
            }
            flush(&mut columns, tx).await?;
            Ok(())
        }
        .await;
        match outcome {
            Ok(()) => Ok(()),
            Err(stop) => {
                conn.close_on_drop();
                drop(conn);
                if id > 0
                    && let Ok(mut other) = pool.acquire().await
                {
                    let _ = (&mut *other)
                        .execute(format!("KILL QUERY {id}").as_str())
                        .await;
                }
                match stop {
                    Stop::Cancelled => Ok(()),
                    Stop::Failed(e) => Err(e),
                }
            }
        }
    })
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
    let task_query = query.clone();
    let (splits, note, snapshot, holder) = src
        .call(async move { plan_splits(&task_src, &task_query, max_splits).await })
        .await?;
    let spec = RemoteScanSpec {
        query,
        splits,
        split_note: note,
        snapshot,
        schema_ipc: schema_to_ipc(&schema)?,
    };
    Ok(Arc::new(RemoteScanExec::with_schema(spec, schema, holder)))
}

type Splits = (
    Vec<String>,
    Option<String>,
    Option<String>,
    Option<Arc<SnapshotHolder>>,
);

fn with_range(base: &SplitBase, range: &str) -> String {
    match &base.predicate {
        Some(p) => format!("{} WHERE {range} AND ({p})", base.select_from),
        None => format!("{} WHERE {range}", base.select_from),
    }
}

/// `n` ranges over `[lo, hi]`: the first open below, the last open above, so rows outside
/// the estimate are still read.
fn ranges(lo: i128, hi: i128, n: usize, column: &str) -> Vec<String> {
    let n = n.max(1) as i128;
    let width = ((hi - lo) / n).max(1);
    let bounds: Vec<i128> = (1..n).map(|i| lo + i * width).collect();
    let mut out = vec![];
    for i in 0..=bounds.len() {
        let lower = (i > 0).then(|| format!("{column} >= {}", bounds[i - 1]));
        let upper = (i < bounds.len()).then(|| format!("{column} < {}", bounds[i]));
        out.push(
            [lower, upper]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" AND "),
        );
    }
    out
}

fn plan_splits<'a>(
    src: &'a Arc<RemoteSource>,
    query: &'a RemoteQuery,
    max_splits: usize,
) -> BoxFuture<'a, Result<Splits>> {
    Box::pin(async move {
        let single = || Ok((vec![query.sql.clone()], None, None, None));
        let Some(base) = &query.split else {
            return single();
        };
        if max_splits <= 1 {
            return single();
        }
        match src.pool() {
            Pool::Postgres(pool) => {
                // The table's size now, not `relpages` (an estimate that stays 0 until the
                // first ANALYZE: a freshly loaded table would be read in one piece).
                let row: Option<(i64, String, i32)> = sqlx::query_as(
                    "SELECT pg_relation_size(c.oid) / current_setting('block_size')::int8, \
                 c.relkind::text, current_setting('server_version_num')::int \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                )
                .bind(&base.schema)
                .bind(&base.table)
                .fetch_optional(pool)
                .await
                .map_err(|e| src.error("cannot size the table", e))?;
                let Some((pages, kind, version)) = row else {
                    return single();
                };
                // TID range scans need PostgreSQL 14; views and foreign tables have no pages.
                if version < 140_000 || !(kind == "r" || kind == "m") || pages <= 1 {
                    return single();
                }
                let bytes = pages as u64 * 8192;
                let n = (bytes.div_ceil(src.split_size_bytes()) as usize).clamp(1, max_splits);
                if n <= 1 {
                    return single();
                }
                // One snapshot for every split.
                let mut conn = pool
                    .acquire()
                    .await
                    .map_err(|e| src.error("cannot connect", e))?
                    .detach();
                (&mut conn)
                    .execute(
                        "SET idle_in_transaction_session_timeout = '6h'; \
                 BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
                    )
                    .await
                    .map_err(|e| src.error("cannot start the snapshot transaction", e))?;
                let id: String = sqlx::query_scalar("SELECT pg_export_snapshot()")
                    .fetch_one(&mut conn)
                    .await
                    .map_err(|e| src.error("cannot export a snapshot", e))?;
                if !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
                    return Err(src.error("unexpected snapshot id", &id));
                }
                let holder = Arc::new(SnapshotHolder(Mutex::new(Some(conn))));
                let per = (pages as u64).div_ceil(n as u64) as i64;
                let splits = (0..n as i64)
                    .map(|i| {
                        let lower = (i > 0).then(|| format!("ctid >= '({},0)'::tid", i * per));
                        let upper = (i + 1 < n as i64)
                            .then(|| format!("ctid < '({},0)'::tid", (i + 1) * per));
                        let range = [lower, upper]
                            .into_iter()
                            .flatten()
                            .collect::<Vec<_>>()
                            .join(" AND ");
                        with_range(base, &range)
                    })
                    .collect();
                Ok((
                    splits,
                    Some(format!("ctid ranges of {pages} pages, one snapshot")),
                    Some(id),
                    Some(holder),
                ))
            }
            Pool::MySql(pool) => {
                let Some(key) = &base.key else {
                    return single();
                };
                let sql = format!(
                    "SELECT DATA_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {}",
                    quote_literal(&base.schema, Dialect::MySql)?,
                    quote_literal(&base.table, Dialect::MySql)?
                );
                let rows = super::catalog::mysql_text_rows(pool, &sql)
                    .await
                    .map_err(|e| src.error("cannot size the table", e))?;
                let bytes: u64 = rows
                    .first()
                    .and_then(|r| r[0].as_deref()?.parse().ok())
                    .unwrap_or(0);
                let n = (bytes.div_ceil(src.split_size_bytes()) as usize).clamp(1, max_splits);
                if n <= 1 {
                    return single();
                }
                let k = quote_ident(key, Dialect::MySql);
                let sql = format!(
                    "SELECT MIN({k}), MAX({k}) FROM {}.{}",
                    quote_ident(&base.schema, Dialect::MySql),
                    quote_ident(&base.table, Dialect::MySql)
                );
                let rows = super::catalog::mysql_text_rows(pool, &sql)
                    .await
                    .map_err(|e| src.error("cannot size the table", e))?;
                let bound =
                    |i: usize| -> Option<i128> { rows.first()?[i].as_deref()?.parse().ok() };
                let (Some(lo), Some(hi)) = (bound(0), bound(1)) else {
                    return single();
                };
                let splits = ranges(lo, hi, n, &k)
                    .iter()
                    .map(|r| with_range(base, r))
                    .collect();
                Ok((splits, Some(format!("ranges of {key}")), None, None))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_everything() {
        assert_eq!(
            ranges(0, 100, 3, "k"),
            vec!["k < 33", "k >= 33 AND k < 66", "k >= 66"]
        );
        assert_eq!(ranges(5, 5, 2, "k"), vec!["k < 6", "k >= 6"]);
    }
}
