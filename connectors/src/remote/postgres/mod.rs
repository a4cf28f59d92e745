//! PostgreSQL: sqlx for the catalog and for pushed-down queries' checks; splits read
//! `COPY (…) TO STDOUT (FORMAT binary)` over sessions of their own ([`pgwire`]) where the
//! connection allows it (no TLS), else through the pool. Splits of a table are `ctid` page
//! ranges, all under one snapshot exported by the planning side (`pg_export_snapshot`).

pub mod pgwire;

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use basin_core::{SqlSourceConfig, TlsMode};
use datafusion::arrow::datatypes::{DataType, IntervalUnit, SchemaRef, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::sql::unparser::dialect::{Dialect as UnparserDialect, PostgreSqlDialect};
use futures::StreamExt;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use sqlx::{Executor, Row};

use super::backend::{
    Backend, BatchSender, Capabilities, Described, Keepalive, Splits, SqlDialect, Stop, flush,
};
use super::decode::{Columns, CopyParser};
use super::exec::SplitBase;
use super::source::{
    ACQUIRE_TIMEOUT, CANNOT_CONNECT, RemoteSource, application_name, display_address,
};
use super::types::{
    RemoteColumn, UNCONSTRAINED_NUMERIC, decimal, list, readable_common, timestamp,
};

/// PostgreSQL's SQL.
pub struct PostgresDialect;

impl SqlDialect for PostgresDialect {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            filters: true,
            aggregates: true,
            joins: true,
            limit: true,
            top_n: true,
            casts: true,
            division: true,
            nulls_ordering: true,
            boolean_values: true,
            sum_of_small_integers: true,
            decimal_avg: true,
        }
    }

    fn unparser(&self) -> Box<dyn UnparserDialect> {
        Box::new(PostgreSqlDialect {})
    }

    fn quote_ident(&self, name: &str) -> String {
        format!("\"{}\"", name.replace('"', "\"\""))
    }

    /// An escape string `E'…'` with `\` and `'` escaped (valid with or without
    /// `standard_conforming_strings`). NUL cannot be in a PostgreSQL string: refused, so the
    /// predicate runs in Basin.
    fn quote_literal(&self, value: &str) -> Result<String> {
        if value.contains('\0') {
            return Err(DataFusionError::NotImplemented(
                "PostgreSQL strings cannot contain NUL".into(),
            ));
        }
        let mut out = String::with_capacity(value.len() + 3);
        out.push_str("E'");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\'' => out.push_str("''"),
                c => out.push(c),
            }
        }
        out.push('\'');
        Ok(out)
    }

    fn literal_ok(&self, value: &ScalarValue) -> bool {
        match value {
            ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s) => {
                s.as_deref().is_none_or(|s| !s.contains('\0'))
            }
            ScalarValue::UInt8(_)
            | ScalarValue::UInt16(_)
            | ScalarValue::UInt32(_)
            | ScalarValue::UInt64(_) => false,
            other => super::types::literal_ok_common(other),
        }
    }

    fn readable(&self, data_type: &DataType) -> bool {
        match data_type {
            DataType::Interval(IntervalUnit::MonthDayNano) => true,
            DataType::List(item) => matches!(
                item.data_type(),
                DataType::Boolean
                    | DataType::Int16
                    | DataType::Int32
                    | DataType::Int64
                    | DataType::Float32
                    | DataType::Float64
                    | DataType::Utf8
            ),
            other => readable_common(other),
        }
    }

    fn order_item(&self, column: &str, asc: bool, nulls_first: bool) -> String {
        format!(
            "q.{} {} {}",
            self.quote_ident(column),
            if asc { "ASC" } else { "DESC" },
            if nulls_first {
                "NULLS FIRST"
            } else {
                "NULLS LAST"
            }
        )
    }

    fn explain(&self, sql: &str) -> String {
        format!("EXPLAIN (COSTS OFF) {sql}")
    }

    /// The query wrapped in a binary COPY whose columns are cast to the types Basin decodes.
    fn statement(&self, split_sql: &str, schema: &SchemaRef) -> String {
        let columns: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| {
                let column = format!("q.{}", self.quote_ident(f.name()));
                match f.data_type() {
                    // Truncated, not rounded, at the scale: as Basin computes a decimal AVG
                    // or division (exact values are unchanged).
                    DataType::Decimal128(_, s) | DataType::Decimal256(_, s) => format!(
                        "trunc({column}::numeric, {s})::{}",
                        postgres_wire_type(f.data_type())
                    ),
                    other => format!("{column}::{}", postgres_wire_type(other)),
                }
            })
            .collect();
        format!(
            "COPY (SELECT {} FROM ({split_sql}) AS q) TO STDOUT (FORMAT binary)",
            columns.join(", ")
        )
    }
}

/// How long a split's COPY session may wait idle for the next split.
const COPY_SESSION_IDLE: Duration = Duration::from_secs(60);

/// A PostgreSQL source's connections.
pub struct PostgresBackend {
    pool: PgPool,
    address: String,
    /// Where splits open their own COPY sessions ([`pgwire`]).
    copy_target: pgwire::Target,
    /// Idle COPY sessions of this process, newest last, for the next splits.
    copy_sessions: Mutex<Vec<(pgwire::CopyConn, Instant)>>,
    /// Set once a COPY session needed what [`pgwire`] does not speak (TLS, say): splits then
    /// read through the pool.
    copy_through_pool: AtomicBool,
    /// Idle COPY sessions kept at most.
    max_idle: usize,
}

impl PostgresBackend {
    /// The (lazily connecting) pool of catalog `name`. Must run inside the connector runtime.
    pub fn new(
        name: &str,
        config: &SqlSourceConfig,
        pool_size: u32,
        max_idle: usize,
    ) -> Result<Self> {
        let options = pg_options(name, config)?;
        let address = display_address(options.get_socket(), options.get_host(), options.get_port());
        let copy_target = pgwire::Target::new(&options, configured_password(config));
        let pool = PgPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(Duration::from_secs(300))
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            address,
            copy_target,
            copy_sessions: Mutex::new(Vec::new()),
            copy_through_pool: AtomicBool::new(false),
            max_idle,
        })
    }

    /// Whether splits open COPY sessions of their own (else they read through the pool).
    fn own_sessions(&self) -> bool {
        !self.copy_through_pool.load(Ordering::Relaxed)
    }

    /// An idle COPY session of an earlier split, if one is fresh enough.
    fn take_copy_session(&self) -> Option<pgwire::CopyConn> {
        let mut idle = self.copy_sessions.lock().ok()?;
        idle.retain(|(_, since)| since.elapsed() < COPY_SESSION_IDLE);
        idle.pop().map(|(conn, _)| conn)
    }

    /// Keeps a session whose COPY ended cleanly for the next split; at most as many as
    /// remote queries may run at once.
    fn keep_copy_session(&self, _source: &RemoteSource, conn: pgwire::CopyConn) {
        if !conn.reusable() {
            return;
        }
        if let Ok(mut idle) = self.copy_sessions.lock()
            && idle.len() < self.max_idle
        {
            idle.push((conn, Instant::now()));
        }
    }

    /// Makes later splits read through the pool: a COPY session needed `why`.
    fn copy_through_pool(&self, source: &RemoteSource, why: &str) {
        if !self.copy_through_pool.swap(true, Ordering::Relaxed) {
            tracing::info!(
                source = %source.name,
                "splits read through sqlx: their own COPY sessions do not support {why}"
            );
        }
    }

    /// Reads a PostgreSQL split over a session of its own ([`pgwire`]): the COPY stream's frames
    /// are parsed where the socket reads put them.
    async fn copy_own_session(
        &self,
        source: &Arc<RemoteSource>,
        statement: &str,
        snapshot: &Option<String>,
        schema: &SchemaRef,
        batch_size: usize,
        tx: &BatchSender,
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
            let (mut conn, kept) = match self.take_copy_session() {
                Some(conn) => (conn, true),
                None => {
                    let connected = tokio::select! {
                        c = pgwire::CopyConn::connect(&self.copy_target) => c,
                        _ = tx.closed() => return Ok(Read::Done),
                    };
                    match connected.map_err(|e| source.error(CANNOT_CONNECT, e))? {
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
                self.keep_copy_session(source, conn);
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
}

fn catalog_error(source: &RemoteSource, what: &str) -> impl Fn(sqlx::Error) -> DataFusionError {
    move |e| source.error(what, e)
}

#[async_trait]
impl Backend for PostgresBackend {
    fn address(&self) -> String {
        self.address.clone()
    }

    async fn list_schemas(&self, source: &RemoteSource) -> Result<Vec<String>> {
        let pool = &self.pool;
        let rows: Vec<(String,)> = sqlx::query_as(
                "SELECT nspname::text FROM pg_namespace \
                 WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') \
                   AND nspname NOT LIKE 'pg\\_temp\\_%' AND nspname NOT LIKE 'pg\\_toast\\_temp\\_%' \
                   AND has_schema_privilege(oid, 'USAGE') ORDER BY 1",
            )
            .fetch_all(pool)
            .await
            .map_err(catalog_error(source, "cannot list schemas"))?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }

    async fn list_tables(&self, source: &RemoteSource, schema: &str) -> Result<Vec<String>> {
        let pool = &self.pool;
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT c.relname::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relkind IN ('r', 'v', 'm', 'p', 'f') \
                   AND NOT c.relispartition ORDER BY 1",
        )
        .bind(schema)
        .fetch_all(pool)
        .await
        .map_err(catalog_error(source, "cannot list tables"))?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }

    async fn describe_table(
        &self,
        source: &RemoteSource,
        schema: &str,
        table: &str,
    ) -> Result<Described> {
        let pool = &self.pool;
        let mut columns = vec![];
        let rows = sqlx::query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
                   COALESCE(bt.typname, t.typname)::text, \
                   CASE WHEN a.atttypmod >= 0 THEN a.atttypmod ELSE t.typtypmod END, \
                   et.typname::text, NOT a.attnotnull, COALESCE(co.collname::text, ''), \
                   COALESCE(co.collisdeterministic, true), \
                   (SELECT datcollate::text FROM pg_database WHERE datname = current_database()) \
                 FROM pg_attribute a \
                 JOIN pg_class c ON c.oid = a.attrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 JOIN pg_type t ON t.oid = a.atttypid \
                 LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype \
                 LEFT JOIN pg_type et ON et.oid = COALESCE(bt.typelem, t.typelem) \
                   AND COALESCE(bt.typcategory, t.typcategory) = 'A' \
                 LEFT JOIN pg_collation co ON co.oid = a.attcollation \
                 WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped \
                 ORDER BY a.attnum",
        )
        .bind(schema)
        .bind(table)
        .fetch_all(pool)
        .await
        .map_err(catalog_error(source, "cannot describe table"))?;
        for r in rows {
            let get = |e: sqlx::Error| source.error("cannot describe table", e);
            let name: String = r.try_get(0).map_err(get)?;
            let printed: String = r.try_get(1).map_err(get)?;
            let typname: String = r.try_get(2).map_err(get)?;
            let typmod: i32 = r.try_get(3).map_err(get)?;
            let element: Option<String> = r.try_get(4).map_err(get)?;
            let nullable: bool = r.try_get(5).map_err(get)?;
            let collation: String = r.try_get(6).map_err(get)?;
            let deterministic: bool = r.try_get(7).map_err(get)?;
            let db_collate: Option<String> = r.try_get(8).map_err(get)?;
            let data_type = postgres_type(&typname, typmod, element.as_deref());
            let exact = postgres_exact_text(&typname, deterministic);
            let c_order = |c: &str| c == "C" || c == "POSIX";
            let ordered = exact
                && (c_order(&collation)
                    || (collation == "default" && db_collate.as_deref().is_some_and(c_order)));
            columns.push(RemoteColumn {
                name,
                source_type: printed,
                data_type,
                nullable,
                exact_text: exact,
                ordered_text: ordered,
                text_superset: matches!(
                    typname.as_str(),
                    "text" | "varchar" | "bpchar" | "name" | "citext"
                ),
            });
        }
        Ok((!columns.is_empty()).then_some((columns, None)))
    }

    async fn check(&self, source: &RemoteSource, statement: &str) -> Result<()> {
        self.pool
            .execute(statement)
            .await
            .map(|_| ())
            .map_err(|e| source.error("rejected a pushed-down query", e))
    }

    async fn plan_splits(
        &self,
        src: &Arc<RemoteSource>,
        base: &SplitBase,
        max_splits: usize,
    ) -> Result<Option<Splits>> {
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
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| src.error("cannot size the table", e))?;
        let Some((pages, kind, version)) = row else {
            return Ok(None);
        };
        // TID range scans need PostgreSQL 14; views and foreign tables have no pages.
        if version < 140_000 || !(kind == "r" || kind == "m") || pages <= 1 {
            return Ok(None);
        }
        let bytes = pages as u64 * 8192;
        let n = (bytes.div_ceil(src.split_size_bytes()) as usize).clamp(1, max_splits);
        if n <= 1 {
            return Ok(None);
        }
        // One snapshot for every split.
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| src.error(CANNOT_CONNECT, e))?
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
                let upper =
                    (i + 1 < n as i64).then(|| format!("ctid < '({},0)'::tid", (i + 1) * per));
                let range = [lower, upper]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(" AND ");
                base.with_range(&range)
            })
            .collect();
        Ok(Some(Splits {
            queries: splits,
            note: Some(format!("ctid ranges of {pages} pages, one snapshot")),
            snapshot: Some(id),
            keepalive: Some(holder),
        }))
    }

    async fn read(
        &self,
        source: &Arc<RemoteSource>,
        statement: &str,
        snapshot: Option<String>,
        schema: SchemaRef,
        batch_size: usize,
        tx: &BatchSender,
    ) -> Result<()> {
        let pool = &self.pool;
        if let Some(id) = &snapshot
            && !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        {
            return Err(DataFusionError::Internal(format!(
                "bad PostgreSQL snapshot id {id:?}"
            )));
        }
        if self.own_sessions() {
            match self
                .copy_own_session(source, statement, &snapshot, &schema, batch_size, tx)
                .await?
            {
                Read::Done => return Ok(()),
                Read::Unsupported(why) => self.copy_through_pool(source, why),
            }
        }
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| source.error(CANNOT_CONNECT, e))?;
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
                stop.outcome()
            }
        }
    }
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

impl Keepalive for SnapshotHolder {}

impl std::fmt::Debug for SnapshotHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotHolder")
    }
}

enum Read {
    Done,
    /// The session needs what [`pgwire`] does not speak: read through the pool.
    Unsupported(&'static str),
}

fn pg_options(name: &str, c: &SqlSourceConfig) -> Result<PgConnectOptions> {
    let mut o = match &c.url {
        Some(url) => PgConnectOptions::from_str(url.expose()).map_err(|e| {
            DataFusionError::Configuration(format!(
                "catalog `{name}`: `url` is not a PostgreSQL URL: {}",
                url.redact_in(&e.to_string())
            ))
        })?,
        None => PgConnectOptions::new_without_pgpass(),
    };
    o = sqlx_overrides!(o, c);
    let ssl = match c.tls {
        TlsMode::Disable => PgSslMode::Disable,
        TlsMode::Prefer => PgSslMode::Prefer,
        TlsMode::Require => PgSslMode::Require,
        TlsMode::VerifyCa => PgSslMode::VerifyCa,
        TlsMode::VerifyFull => PgSslMode::VerifyFull,
    };
    if let Some(ca) = &c.tls_ca_file {
        o = o.ssl_root_cert(ca);
    }
    let o = o
        .ssl_mode(ssl)
        .application_name(&application_name())
        .statement_cache_capacity(0)
        // Literals are rendered for these settings (see `sql::render`).
        .options([
            ("standard_conforming_strings", "on"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
            ("IntervalStyle", "postgres"),
            ("extra_float_digits", "3"),
        ]);
    Ok(match c.statement_timeout_secs {
        Some(secs) => o.options([("statement_timeout", format!("{secs}s"))]),
        None => o,
    })
}

/// The password of a source's configuration: `password`, else the URL's (sqlx keeps what
/// it parsed to itself).
fn configured_password(c: &SqlSourceConfig) -> Option<String> {
    if let Some(p) = &c.password {
        return Some(p.expose().to_string());
    }
    let url = url::Url::parse(c.url.as_ref()?.expose()).ok()?;
    let p = url.password()?;
    let decoded = percent_encoding::percent_decode_str(p).decode_utf8();
    Some(decoded.map_or_else(|_| p.to_string(), |p| p.into_owned()))
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
}
