//! What differs between database sources, as two traits: [`SqlDialect`] (how a source's SQL
//! is written: quoting, literals, LIMIT, what may be pushed) and [`Backend`] (how a source is
//! reached: its catalog queries, split planning and split reading over its own driver).
//!
//! Everything else — the pushdown rule, literal safety, the plan nodes, limits and
//! cancellation — is shared and lives beside this module. A new connector is one module
//! implementing both traits plus a [`Dialect`] variant (see docs/connectors/writing.md).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::sql::unparser::dialect::Dialect as UnparserDialect;
use serde::{Deserialize, Serialize};

use super::decode::Columns;
use super::exec::{RemoteQuery, SplitBase};
use super::source::RemoteSource;
use super::types::RemoteColumn;

/// The kind of a source: which [`SqlDialect`] writes its SQL. Travels in plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dialect {
    Postgres,
    MySql,
    SqlServer,
    Oracle,
}

impl Dialect {
    /// The SQL rules of this kind of source.
    pub fn sql(self) -> &'static dyn SqlDialect {
        match self {
            Dialect::Postgres => &super::postgres::PostgresDialect,
            Dialect::MySql => &super::mysql::MySqlDialect,
            Dialect::SqlServer => &super::sqlserver::SqlServerDialect,
            Dialect::Oracle => &super::oracle::OracleDialect,
        }
    }

    pub fn name(self) -> &'static str {
        self.sql().name()
    }
}

/// What a connector may push into its source. Anything not allowed here runs in Basin.
#[derive(Debug, Clone, Copy)]
pub struct Capabilities {
    pub filters: bool,
    pub aggregates: bool,
    pub joins: bool,
    pub limit: bool,
    pub top_n: bool,
    /// `CAST` expressions (MySQL's CAST targets differ from DataFusion's type names).
    pub casts: bool,
    /// `/` with DataFusion's semantics (MySQL's `/` of integers gives a decimal).
    pub division: bool,
    /// `NULLS FIRST/LAST` in ORDER BY.
    pub nulls_ordering: bool,
    /// Boolean-typed expressions in a select list or as join/filter operands beyond
    /// predicates (T-SQL has no boolean type: `SELECT a = b` is not valid there).
    pub boolean_values: bool,
    /// `SUM` of `smallint`/`int` gives a wider type (PostgreSQL `bigint`, MySQL `decimal`);
    /// T-SQL's is an `int` that fails past 2^31, where Basin's is a `bigint`.
    pub sum_of_small_integers: bool,
    /// A decimal `AVG` reads back as Basin computes it (truncated at the result's scale):
    /// PostgreSQL's result columns are truncated to their scale, not rounded.
    pub decimal_avg: bool,
}

/// How a source's SQL is written: quoting, literals, LIMIT, EXPLAIN, and the types its
/// results are read as. Implemented by a unit struct per kind of source.
pub trait SqlDialect: Send + Sync {
    /// `postgres`, `mysql`, `sqlserver`: as in `connector = "…"` and in errors.
    fn name(&self) -> &'static str;
    fn capabilities(&self) -> Capabilities;
    /// The dialect DataFusion's unparser writes pushed-down plans in.
    fn unparser(&self) -> Box<dyn UnparserDialect>;
    /// A quoted identifier. Names with quote characters, backslashes or NUL are refused
    /// before anything is pushed (`pushdown::safe_name`).
    fn quote_ident(&self, name: &str) -> String;
    /// A string literal that means exactly `value` whatever the server's settings; an
    /// error keeps the expression in Basin.
    fn quote_literal(&self, value: &str) -> Result<String>;
    /// Whether a literal of this value may appear in pushed SQL.
    fn literal_ok(&self, value: &ScalarValue) -> bool;
    /// Whether Basin reads a result column of this Arrow type back from the source.
    fn readable(&self, data_type: &DataType) -> bool;
    /// One ORDER BY item of a top-N over the derived table `q`.
    fn order_item(&self, column: &str, asc: bool, nulls_first: bool) -> String {
        let _ = nulls_first;
        format!(
            "q.{} {}",
            self.quote_ident(column),
            if asc { "ASC" } else { "DESC" }
        )
    }
    /// A table alias as it follows the table (`AS "t"`; Oracle takes no `AS`).
    fn table_alias(&self, alias: &str) -> String {
        format!(" AS {}", self.quote_ident(alias))
    }
    /// `inner` limited to `fetch` rows after `skip`, in the order of `order_by`.
    fn limit(&self, inner: &str, order_by: &[String], fetch: usize, skip: usize) -> String {
        let mut sql = format!("SELECT * FROM ({inner}) AS q");
        if !order_by.is_empty() {
            sql.push_str(&format!(" ORDER BY {}", order_by.join(", ")));
        }
        sql.push_str(&format!(" LIMIT {fetch}"));
        if skip > 0 {
            sql.push_str(&format!(" OFFSET {skip}"));
        }
        sql
    }
    /// `SELECT <columns> FROM <table>` with an optional row limit (no split ranges then).
    fn select(
        &self,
        columns: &str,
        from: &str,
        predicate: Option<&str>,
        limit: Option<usize>,
    ) -> String {
        let mut sql = format!("SELECT {columns} FROM {from}");
        if let Some(p) = predicate {
            sql.push_str(&format!(" WHERE {p}"));
        }
        if let Some(n) = limit {
            sql.push_str(&self.fetch_first(n));
        }
        sql
    }
    /// The clause that ends a query after `n` rows (` LIMIT n`; Oracle `FETCH FIRST`).
    fn fetch_first(&self, n: usize) -> String {
        format!(" LIMIT {n}")
    }
    /// The statement that makes the source plan `sql` without running it.
    fn explain(&self, sql: &str) -> String;
    /// The statement a split sends: its query, with the result columns cast where the
    /// source's wire form needs it.
    fn statement(&self, split_sql: &str, schema: &SchemaRef) -> String {
        let _ = schema;
        split_sql.to_string()
    }
}

/// Something a planned scan keeps alive while its plan lives (PostgreSQL: the transaction
/// that exported the splits' snapshot).
pub trait Keepalive: Send + Sync + fmt::Debug {}

/// The splits of one scan: the query of each, a note for EXPLAIN, the snapshot they all read,
/// and what keeps that snapshot alive.
pub struct Splits {
    pub queries: Vec<String>,
    pub note: Option<String>,
    pub snapshot: Option<String>,
    pub keepalive: Option<Arc<dyn Keepalive>>,
}

impl Splits {
    /// The whole query as one split.
    pub fn single(query: &RemoteQuery) -> Self {
        Self {
            queries: vec![query.sql.clone()],
            note: None,
            snapshot: None,
            keepalive: None,
        }
    }
}

/// A table's columns and the integer key its scans may be split on.
pub type Described = Option<(Vec<RemoteColumn>, Option<String>)>;

/// The channel a split's batches go to; closed when the reader went away.
pub type BatchSender = tokio::sync::mpsc::Sender<Result<RecordBatch>>;

/// How a source is reached: one implementation per connector, owned by its [`RemoteSource`].
#[async_trait]
pub trait Backend: Send + Sync {
    /// `host:port` (or the socket) the source connects to, for errors.
    fn address(&self) -> String;
    /// Schemas (MySQL: databases) the configured user may read.
    async fn list_schemas(&self, source: &RemoteSource) -> Result<Vec<String>>;
    async fn list_tables(&self, source: &RemoteSource, schema: &str) -> Result<Vec<String>>;
    async fn describe_table(
        &self,
        source: &RemoteSource,
        schema: &str,
        table: &str,
    ) -> Result<Described>;
    /// Runs a statement for its success only (EXPLAIN of a pushed query).
    async fn check(&self, source: &RemoteSource, statement: &str) -> Result<()>;
    /// The splits of a plain scan (`base`), at most `max_splits` (more than one); `None`
    /// reads the query whole.
    async fn plan_splits(
        &self,
        source: &Arc<RemoteSource>,
        base: &SplitBase,
        max_splits: usize,
    ) -> Result<Option<Splits>>;
    /// Reads one split's `statement` into batches of `batch_size` rows sent to `tx`, until
    /// the end or until `tx` closes (then the source's query is cancelled).
    async fn read(
        &self,
        source: &Arc<RemoteSource>,
        statement: &str,
        snapshot: Option<String>,
        schema: SchemaRef,
        batch_size: usize,
        tx: &BatchSender,
    ) -> Result<()>;
}

/// What kind of failure a source reported: how a client is told (a gRPC status) and whether
/// trying again can help. Decided from Basin's own label of the failed step and, for time
/// limits, the source's error code text (drivers report them no other way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceErrorKind {
    /// The source could not be reached or logged into (retrying later can help).
    Unavailable,
    /// The source's statement time limit stopped the query.
    Timeout,
    /// The source refused or failed a statement (the query, a catalog lookup).
    Failed,
}

/// An error of a database source, carried through DataFusion as
/// `DataFusionError::External`. Its text names the source and never holds a secret.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SourceError {
    pub kind: SourceErrorKind,
    pub message: String,
}

/// The gRPC metadata key that marks a status as a source's error (its kind as the value),
/// so that the kind survives the trip from an executor to the scheduler.
pub const SOURCE_ERROR_KEY: &str = "basin-source-error";

impl SourceErrorKind {
    fn name(self) -> &'static str {
        match self {
            SourceErrorKind::Unavailable => "unavailable",
            SourceErrorKind::Timeout => "timeout",
            SourceErrorKind::Failed => "failed",
        }
    }

    fn of(name: &str) -> Option<Self> {
        [Self::Unavailable, Self::Timeout, Self::Failed]
            .into_iter()
            .find(|k| k.name() == name)
    }
}

/// The gRPC status a client is told for `error` if it is a source's (by kind: UNAVAILABLE,
/// DEADLINE_EXCEEDED, INVALID_ARGUMENT), marked with [`SOURCE_ERROR_KEY`].
pub fn source_status(error: &DataFusionError) -> Option<tonic::Status> {
    let DataFusionError::External(e) = error.find_root() else {
        return None;
    };
    let e = e.downcast_ref::<SourceError>()?;
    let code = match e.kind {
        SourceErrorKind::Unavailable => tonic::Code::Unavailable,
        SourceErrorKind::Timeout => tonic::Code::DeadlineExceeded,
        SourceErrorKind::Failed => tonic::Code::InvalidArgument,
    };
    let mut status = tonic::Status::new(code, e.message.clone());
    status.metadata_mut().insert(
        SOURCE_ERROR_KEY,
        tonic::metadata::MetadataValue::from_static(e.kind.name()),
    );
    Some(status)
}

/// The source's error a status carries (see [`source_status`]), if it is one.
pub fn status_source_error(status: &tonic::Status) -> Option<DataFusionError> {
    let kind = status.metadata().get(SOURCE_ERROR_KEY)?.to_str().ok()?;
    Some(DataFusionError::External(Box::new(SourceError {
        kind: SourceErrorKind::of(kind)?,
        message: status.message().to_string(),
    })))
}

/// Connections kept for the next statement of a source whose driver has no pool of its own
/// (SQL Server, Oracle): the newest first, none older than [`IDLE`].
pub struct IdleConnections<C>(Mutex<Vec<(C, Instant)>>);

/// How long a kept connection may wait idle.
pub const IDLE: Duration = Duration::from_secs(300);

impl<C> Default for IdleConnections<C> {
    fn default() -> Self {
        Self(Mutex::new(Vec::new()))
    }
}

impl<C> IdleConnections<C> {
    /// A kept connection young enough to use, if any.
    pub fn take(&self) -> Option<C> {
        let mut idle = self.0.lock().ok()?;
        idle.retain(|(_, since)| since.elapsed() < IDLE);
        idle.pop().map(|(conn, _)| conn)
    }

    /// Keeps a connection whose last statement ended cleanly.
    pub fn keep(&self, conn: C) {
        if let Ok(mut idle) = self.0.lock() {
            idle.push((conn, Instant::now()));
        }
    }
}

/// What stopped a remote read early.
pub enum Stop {
    /// The consumer went away (query cancelled or LIMIT satisfied).
    Cancelled,
    Failed(DataFusionError),
}

impl Stop {
    /// The read's outcome once the source's query is stopped: a cancelled read is not an
    /// error.
    pub fn outcome(self) -> Result<()> {
        match self {
            Stop::Cancelled => Ok(()),
            Stop::Failed(e) => Err(e),
        }
    }
}

/// Sends the rows `columns` hold as one batch (nothing when they hold none).
pub async fn flush(columns: &mut Columns, tx: &BatchSender) -> std::result::Result<(), Stop> {
    if columns.rows() > 0 {
        let batch = columns.finish().map_err(Stop::Failed)?;
        tx.send(Ok(batch)).await.map_err(|_| Stop::Cancelled)?;
    }
    Ok(())
}

/// `n` ranges over `[lo, hi]`: the first open below, the last open above, so rows outside
/// the estimate are still read.
pub fn ranges(lo: i128, hi: i128, n: usize, column: &str) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_errors_kind_survives_a_status() {
        for kind in [
            SourceErrorKind::Unavailable,
            SourceErrorKind::Timeout,
            SourceErrorKind::Failed,
        ] {
            let error = DataFusionError::External(Box::new(SourceError {
                kind,
                message: "mongodb source `m`: cannot connect".into(),
            }));
            let status = source_status(&error).unwrap();
            let back = status_source_error(&status).unwrap();
            let DataFusionError::External(e) = back else {
                panic!("not external")
            };
            let e = e.downcast_ref::<SourceError>().unwrap();
            assert_eq!(e.kind, kind);
            assert_eq!(e.message, "mongodb source `m`: cannot connect");
        }
        assert!(source_status(&DataFusionError::Execution("x".into())).is_none());
        assert!(status_source_error(&tonic::Status::unavailable("x")).is_none());
    }

    #[test]
    fn ranges_cover_everything() {
        assert_eq!(
            ranges(0, 100, 3, "k"),
            vec!["k < 33", "k >= 33 AND k < 66", "k >= 66"]
        );
        assert_eq!(ranges(5, 5, 2, "k"), vec!["k < 6", "k >= 6"]);
    }
}
