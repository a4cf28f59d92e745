//! Oracle Database through the `oracle` crate (ODPI-C, which loads Oracle Instant Client at
//! run time). A machine without Instant Client starts Basin and serves every other catalog;
//! only this catalog's queries fail, with an error that says how to install it.
//!
//! Semantics Basin guards (docs/connectors/oracle.md):
//! - `''` is NULL in Oracle: an empty string literal is never pushed.
//! - Sessions compare and sort text in binary (`NLS_COMP`/`NLS_SORT = BINARY`), so
//!   `VARCHAR2` equality and ordering are byte-wise as in Basin (UTF-8 byte order is code point
//!   order); `CHAR` compares blank-padded (equality pushed only as a superset), `NVARCHAR2`
//!   sorts by UTF-16 code units (not ordered), LOBs are not comparable.
//! - No boolean values in SQL (before 23ai); `/` of integers is a decimal; decimal results are
//!   read truncated at their scale (`TRUNC(x, s)`) as Basin computes AVG.
//! - Table aliases take no `AS` in Oracle.
//! - Splits are `ORA_HASH(ROWID, n - 1) = i` buckets, all reading `AS OF SCN` one system
//!   change number taken when the scan is planned: one consistent state across splits.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use basin_core::SqlSourceConfig;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::sql::unparser::dialect::{CustomDialectBuilder, Dialect as UnparserDialect};

use super::backend::{
    Backend, BatchSender, Capabilities, Described, IdleConnections, Splits, SqlDialect,
};
use super::decode::Columns;
use super::exec::SplitBase;
use super::source::{CANNOT_CONNECT, Login, RemoteSource, application_name};
use super::types::{RemoteColumn, UNCONSTRAINED_NUMERIC, decimal, readable_common, timestamp};

/// Oracle's SQL.
pub struct OracleDialect;

impl SqlDialect for OracleDialect {
    fn name(&self) -> &'static str {
        "oracle"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            filters: true,
            aggregates: true,
            joins: true,
            limit: true,
            top_n: true,
            casts: false,
            division: false,
            nulls_ordering: true,
            boolean_values: false,
            sum_of_small_integers: true,
            decimal_avg: true,
        }
    }

    fn unparser(&self) -> Box<dyn UnparserDialect> {
        Box::new(
            CustomDialectBuilder::new()
                .with_identifier_quote_style('"')
                .with_requires_derived_table_alias(true)
                .build(),
        )
    }

    fn quote_ident(&self, name: &str) -> String {
        format!("\"{}\"", name.replace('"', "\"\""))
    }

    /// `'…'` with `'` doubled. The empty string is NULL in Oracle and NUL cannot be written:
    /// both refused, so the expression runs in Basin.
    fn quote_literal(&self, value: &str) -> Result<String> {
        if value.is_empty() || value.contains('\0') {
            return Err(DataFusionError::NotImplemented(
                "Oracle reads '' as NULL and cannot hold NUL".into(),
            ));
        }
        Ok(format!("'{}'", value.replace('\'', "''")))
    }

    fn literal_ok(&self, value: &ScalarValue) -> bool {
        match value {
            ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s) => s
                .as_deref()
                .is_none_or(|s| !s.is_empty() && !s.contains('\0')),
            ScalarValue::Boolean(_) => false,
            other => super::types::literal_ok_common(other),
        }
    }

    fn readable(&self, data_type: &DataType) -> bool {
        !matches!(data_type, DataType::Decimal256(_, _)) && readable_common(data_type)
    }

    fn table_alias(&self, alias: &str) -> String {
        format!(" {}", self.quote_ident(alias))
    }

    fn limit(&self, inner: &str, order_by: &[String], fetch: usize, skip: usize) -> String {
        let mut sql = format!("SELECT * FROM ({inner}) q");
        if !order_by.is_empty() {
            sql.push_str(&format!(" ORDER BY {}", order_by.join(", ")));
        }
        if skip > 0 {
            sql.push_str(&format!(" OFFSET {skip} ROWS"));
        }
        sql.push_str(&format!(" FETCH NEXT {fetch} ROWS ONLY"));
        sql
    }

    fn fetch_first(&self, n: usize) -> String {
        format!(" FETCH FIRST {n} ROWS ONLY")
    }

    fn explain(&self, sql: &str) -> String {
        format!("EXPLAIN PLAN FOR {sql}")
    }

    /// The query with decimals truncated at their scale (as Basin's AVG), zoned timestamps
    /// as UTC, and every value but binaries read in its text form (the session's NLS formats
    /// are ISO).
    fn statement(&self, split_sql: &str, schema: &SchemaRef) -> String {
        if schema.fields().is_empty() {
            return format!("SELECT 1 AS \"c0\" FROM ({split_sql}) q");
        }
        let columns: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| {
                let name = self.quote_ident(f.name());
                let column = format!("q.{name}");
                let value = match f.data_type() {
                    DataType::Decimal128(_, s) => format!("TRUNC({column}, {s})"),
                    DataType::Timestamp(_, Some(_)) => format!("SYS_EXTRACT_UTC({column})"),
                    _ => column,
                };
                format!("{value} AS {name}")
            })
            .collect();
        format!("SELECT {} FROM ({split_sql}) q", columns.join(", "))
    }
}

/// Arrow type of an Oracle column from `ALL_TAB_COLUMNS` (`DATA_TYPE`, `DATA_PRECISION`,
/// `DATA_SCALE`; precision and scale NULL for a `NUMBER` without them).
pub fn oracle_type(data_type: &str, precision: Option<i64>, scale: Option<i64>) -> DataType {
    let data_type = data_type.to_ascii_uppercase();
    match data_type.as_str() {
        "NUMBER" => match (precision, scale) {
            (Some(p), s) => decimal(p, s.unwrap_or(0)).unwrap_or(DataType::Utf8),
            // NUMBER(*, s) has a scale but no precision.
            (None, Some(s)) if s > 0 => decimal(38, s).unwrap_or(DataType::Utf8),
            _ => {
                let (p, s) = UNCONSTRAINED_NUMERIC;
                DataType::Decimal128(p, s)
            }
        },
        "FLOAT" | "BINARY_DOUBLE" => DataType::Float64,
        "BINARY_FLOAT" => DataType::Float32,
        // DATE carries a time of day.
        "DATE" => timestamp(false),
        t if t.starts_with("TIMESTAMP") && t.contains("TIME ZONE") => timestamp(true),
        t if t.starts_with("TIMESTAMP") => timestamp(false),
        "RAW" | "LONG RAW" | "BLOB" | "BFILE" => DataType::Binary,
        // VARCHAR2, NVARCHAR2, CHAR, NCHAR, CLOB, NCLOB, LONG, ROWID, INTERVAL…, XMLTYPE:
        // their text form.
        _ => DataType::Utf8,
    }
}

/// What the session is set to, so that values arrive in forms Basin parses and text compares
/// as Basin compares it.
const SESSION: &str = "ALTER SESSION SET NLS_COMP = 'BINARY' NLS_SORT = 'BINARY' \
    NLS_NUMERIC_CHARACTERS = '.,' NLS_DATE_FORMAT = 'YYYY-MM-DD HH24:MI:SS' \
    NLS_TIMESTAMP_FORMAT = 'YYYY-MM-DD HH24:MI:SS.FF6' TIME_ZONE = '+00:00'";

/// How to install what the `oracle` crate loads at run time.
const INSTALL_HINT: &str = "install Oracle Instant Client (Basic or Basic Light, 19c or later) \
    from https://www.oracle.com/database/technologies/instant-client/downloads.html and put \
    its directory in LD_LIBRARY_PATH (or run ldconfig on it) for every Basin process; the \
    other catalogs work without it";

/// An Oracle source: connection settings and idle connections (ODPI-C calls block, so every
/// call runs on a blocking thread).
pub struct OracleBackend {
    user: String,
    password: String,
    connect_string: String,
    statement_timeout: Option<Duration>,
    idle: Arc<IdleConnections<oracle::Connection>>,
    open: Arc<tokio::sync::Semaphore>,
}

impl OracleBackend {
    pub fn new(name: &str, c: &SqlSourceConfig, pool_size: u32) -> Result<Self> {
        let (user, password, connect_string) = oracle_login(name, c)?;
        Ok(Self {
            user,
            password,
            connect_string,
            statement_timeout: c.statement_timeout_secs.map(Duration::from_secs),
            idle: Arc::default(),
            open: Arc::new(tokio::sync::Semaphore::new(pool_size as usize)),
        })
    }

    /// Runs `f` with a connection on a blocking thread; the connection is kept for the next
    /// call when `f` succeeds.
    async fn with_conn<T, F>(&self, source: &RemoteSource, what: &str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&oracle::Connection) -> std::result::Result<T, oracle::Error> + Send + 'static,
    {
        let _open = self
            .open
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| source.error("closed", e))?;
        let idle = self.idle.clone();
        let (user, password, cs) = (
            self.user.clone(),
            self.password.clone(),
            self.connect_string.clone(),
        );
        let timeout = self.statement_timeout;
        let outcome = tokio::task::spawn_blocking(move || {
            let conn = match idle.take() {
                Some(conn) => conn,
                None => connect(&user, &password, &cs, timeout).map_err(Failure::Connect)?,
            };
            let value = f(&conn).map_err(Failure::Query)?;
            idle.keep(conn);
            Ok(value)
        })
        .await
        .map_err(|e| source.error(what, e))?;
        outcome.map_err(|e: Failure| e.into_error(source, what))
    }
}

/// Why a call failed: connecting (where a missing client library shows) or the statement.
enum Failure {
    Connect(oracle::Error),
    Query(oracle::Error),
}

impl Failure {
    fn into_error(self, source: &RemoteSource, what: &str) -> DataFusionError {
        match self {
            Failure::Connect(e) => connect_error(source, &e.to_string()),
            Failure::Query(e) => source.error(what, e),
        }
    }
}

/// A connection error, with the install hint when Instant Client is missing (ODPI-C's
/// DPI-1047 "Cannot locate a 64-bit Oracle Client library").
fn connect_error(source: &RemoteSource, e: &str) -> DataFusionError {
    if e.contains("DPI-1047") || e.contains("Oracle Client library") {
        source.error(
            CANNOT_CONNECT,
            format!("Oracle Instant Client is not installed: {INSTALL_HINT} ({e})"),
        )
    } else {
        source.error(CANNOT_CONNECT, e)
    }
}

fn connect(
    user: &str,
    password: &str,
    connect_string: &str,
    timeout: Option<Duration>,
) -> std::result::Result<oracle::Connection, oracle::Error> {
    let mut connector = oracle::Connector::new(user, password, connect_string);
    connector.driver_name(application_name());
    let conn = connector.connect()?;
    conn.execute(SESSION, &[])?;
    conn.set_call_timeout(timeout)?;
    Ok(conn)
}

/// The text of column `i` of `row` (NULL as `None`).
fn text(row: &oracle::Row, i: usize) -> std::result::Result<Option<String>, oracle::Error> {
    row.get::<usize, Option<String>>(i)
}

#[async_trait]
impl Backend for OracleBackend {
    fn address(&self) -> String {
        self.connect_string.clone()
    }

    async fn list_schemas(&self, source: &RemoteSource) -> Result<Vec<String>> {
        self.with_conn(source, "cannot list schemas", |conn| {
            let mut names = vec![];
            for row in conn.query(
                "SELECT username FROM all_users WHERE oracle_maintained = 'N' ORDER BY 1",
                &[],
            )? {
                if let Some(name) = text(&row?, 0)? {
                    names.push(name);
                }
            }
            Ok(names)
        })
        .await
    }

    async fn list_tables(&self, source: &RemoteSource, schema: &str) -> Result<Vec<String>> {
        let schema = schema.to_string();
        self.with_conn(source, "cannot list tables", move |conn| {
            let mut names = vec![];
            for row in conn.query(
                "SELECT table_name FROM all_tables WHERE owner = :1 \
                 UNION SELECT view_name FROM all_views WHERE owner = :1 ORDER BY 1",
                &[&schema],
            )? {
                if let Some(name) = text(&row?, 0)? {
                    names.push(name);
                }
            }
            Ok(names)
        })
        .await
    }

    async fn describe_table(
        &self,
        source: &RemoteSource,
        schema: &str,
        table: &str,
    ) -> Result<Described> {
        let (schema, table) = (schema.to_string(), table.to_string());
        self.with_conn(source, "cannot describe table", move |conn| {
            let mut columns = vec![];
            for row in conn.query(
                "SELECT column_name, data_type, data_precision, data_scale, nullable \
                 FROM all_tab_columns WHERE owner = :1 AND table_name = :2 ORDER BY column_id",
                &[&schema, &table],
            )? {
                let row = row?;
                let (Some(name), Some(data_type)) = (text(&row, 0)?, text(&row, 1)?) else {
                    continue;
                };
                let precision = row.get::<usize, Option<i64>>(2)?;
                let scale = row.get::<usize, Option<i64>>(3)?;
                let upper = data_type.to_ascii_uppercase();
                let exact = matches!(upper.as_str(), "VARCHAR2" | "NVARCHAR2");
                columns.push(RemoteColumn {
                    source_type: data_type.clone(),
                    data_type: oracle_type(&data_type, precision, scale),
                    nullable: text(&row, 4)?.as_deref() != Some("N"),
                    exact_text: exact,
                    ordered_text: upper == "VARCHAR2",
                    text_superset: matches!(
                        upper.as_str(),
                        "VARCHAR2" | "NVARCHAR2" | "CHAR" | "NCHAR"
                    ),
                    name,
                });
            }
            Ok((!columns.is_empty()).then_some((columns, None)))
        })
        .await
    }

    async fn check(&self, source: &RemoteSource, statement: &str) -> Result<()> {
        let statement = statement.to_string();
        self.with_conn(source, "rejected a pushed-down query", move |conn| {
            conn.execute(&statement, &[]).map(|_| ())
        })
        .await
    }

    /// `ORA_HASH(ROWID, n - 1)` buckets of a plain scan, every split reading `AS OF SCN` the
    /// change number of planning time.
    async fn plan_splits(
        &self,
        src: &Arc<RemoteSource>,
        base: &SplitBase,
        max_splits: usize,
    ) -> Result<Option<Splits>> {
        let d = OracleDialect;
        let (schema, table) = (base.schema.clone(), base.table.clone());
        let sized = self
            .with_conn(src, "cannot size the table", move |conn| {
                let row = conn.query_row(
                    "SELECT NVL(SUM(bytes), 0), TIMESTAMP_TO_SCN(SYSTIMESTAMP) FROM all_segments \
                     WHERE owner = :1 AND segment_name = :2",
                    &[&schema, &table],
                )?;
                Ok((row.get::<usize, i64>(0)?, row.get::<usize, i64>(1)?))
            })
            .await;
        let Ok((bytes, scn)) = sized else {
            // ALL_SEGMENTS needs no privilege beyond the table's; a view has none.
            return Ok(None);
        };
        let n =
            ((bytes.max(0) as u64).div_ceil(src.split_size_bytes()) as usize).clamp(1, max_splits);
        let table = format!(
            "{}.{}",
            d.quote_ident(&base.schema),
            d.quote_ident(&base.table)
        );
        // AS OF goes right after the table name: only unaliased scans are split.
        let Some(head) = base.select_from.strip_suffix(&table) else {
            return Ok(None);
        };
        if n <= 1 {
            return Ok(None);
        }
        let queries = (0..n)
            .map(|i| {
                let range = format!("ORA_HASH(ROWID, {}) = {i}", n - 1);
                let from = format!("{head}{table} AS OF SCN {scn}");
                match &base.predicate {
                    Some(p) => format!("{from} WHERE {range} AND ({p})"),
                    None => format!("{from} WHERE {range}"),
                }
            })
            .collect();
        Ok(Some(Splits {
            queries,
            note: Some(format!("ORA_HASH buckets as of SCN {scn}")),
            snapshot: None,
            keepalive: None,
        }))
    }

    async fn read(
        &self,
        source: &Arc<RemoteSource>,
        statement: &str,
        _snapshot: Option<String>,
        schema: SchemaRef,
        batch_size: usize,
        tx: &BatchSender,
    ) -> Result<()> {
        let statement = statement.to_string();
        let tx = tx.clone();
        let binary: Vec<bool> = schema
            .fields()
            .iter()
            .map(|f| f.data_type() == &DataType::Binary)
            .collect();
        let width = binary.len();
        let mut columns = Columns::new(schema, batch_size)?;
        let source_name = source.name.clone();
        let result = self
            .with_conn(source, "query failed", move |conn| {
                let mut rows = conn.query(&statement, &[])?;
                for row in &mut rows {
                    let row = row?;
                    for (i, binary) in binary.iter().enumerate().take(width) {
                        let pushed = if *binary {
                            let v = row.get::<usize, Option<Vec<u8>>>(i)?;
                            columns.push_mysql(i, v.as_deref())
                        } else {
                            let v = text(&row, i)?;
                            columns.push_mysql(i, v.as_deref().map(str::as_bytes))
                        };
                        if let Err(e) = pushed {
                            return Ok(Err(e));
                        }
                    }
                    columns.end_row();
                    if columns.rows() >= batch_size {
                        let batch = columns.finish();
                        // The reader went away: stop fetching (the statement's cursor closes
                        // with the result set).
                        if tx.blocking_send(batch).is_err() {
                            return Ok(Ok(()));
                        }
                    }
                }
                if columns.rows() > 0 {
                    let _ = tx.blocking_send(columns.finish());
                }
                Ok(Ok(()))
            })
            .await?;
        result
            .map_err(|e| DataFusionError::Execution(format!("oracle source `{source_name}`: {e}")))
    }
}

/// User, password and connect string of a catalog: `url` (`oracle://user:password@host:port/
/// service`) or the separate fields (`host`, `port`, `database` = the service name), which
/// override the URL's parts.
fn oracle_login(name: &str, c: &SqlSourceConfig) -> Result<(String, String, String)> {
    let Login {
        host,
        port,
        user,
        password,
        database: service,
    } = Login::of(
        name,
        c,
        "an Oracle URL",
        "oracle://user:password@host:port/service",
        &["oracle"],
    )?;
    let (Some(user), Some(host)) = (user, host) else {
        return Err(DataFusionError::Configuration(format!(
            "catalog `{name}`: Oracle needs `user` and `host` (or an oracle:// url)"
        )));
    };
    let mut connect_string = format!("//{host}:{}", port.unwrap_or(1521));
    if let Some(s) = service {
        connect_string.push_str(&format!("/{s}"));
    }
    Ok((user, password.unwrap_or_default(), connect_string))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn oracle_types() {
        assert_eq!(
            oracle_type("NUMBER", Some(12), Some(2)),
            DataType::Decimal128(12, 2)
        );
        assert_eq!(
            oracle_type("NUMBER", Some(10), None),
            DataType::Decimal128(10, 0)
        );
        assert_eq!(
            oracle_type("NUMBER", None, None),
            DataType::Decimal128(38, 10)
        );
        assert_eq!(oracle_type("DATE", None, None), timestamp(false));
        assert_eq!(
            oracle_type("TIMESTAMP(6) WITH LOCAL TIME ZONE", None, Some(6)),
            timestamp(true)
        );
        assert_eq!(oracle_type("TIMESTAMP(3)", None, Some(3)), timestamp(false));
        assert_eq!(oracle_type("BINARY_FLOAT", None, None), DataType::Float32);
        assert_eq!(oracle_type("RAW", None, None), DataType::Binary);
        assert_eq!(oracle_type("NVARCHAR2", None, None), DataType::Utf8);
        assert_eq!(oracle_type("CLOB", None, None), DataType::Utf8);
    }

    #[test]
    fn oracle_sql() {
        let d = OracleDialect;
        assert_eq!(d.quote_literal("it's").unwrap(), "'it''s'");
        assert!(d.quote_literal("").is_err());
        assert!(d.quote_literal("a\0b").is_err());
        assert!(!d.literal_ok(&ScalarValue::Utf8(Some(String::new()))));
        assert_eq!(
            d.limit(
                "SELECT 1 AS \"c0\" FROM DUAL",
                &["q.\"c0\" DESC NULLS LAST".into()],
                5,
                10
            ),
            "SELECT * FROM (SELECT 1 AS \"c0\" FROM DUAL) q ORDER BY q.\"c0\" DESC NULLS LAST \
             OFFSET 10 ROWS FETCH NEXT 5 ROWS ONLY"
        );
        assert_eq!(d.table_alias("t"), " \"t\"");
        let schema = Arc::new(Schema::new(vec![
            Field::new("c0", DataType::Decimal128(16, 6), true),
            Field::new("c1", timestamp(true), true),
        ]));
        assert_eq!(
            d.statement("SELECT 1 FROM DUAL", &schema),
            "SELECT TRUNC(q.\"c0\", 6) AS \"c0\", SYS_EXTRACT_UTC(q.\"c1\") AS \"c1\" \
             FROM (SELECT 1 FROM DUAL) q"
        );
    }

    #[test]
    fn urls_and_fields_make_a_connect_string() {
        let c = SqlSourceConfig {
            url: Some(basin_core::Secret::new(
                "oracle://hr:p%40ss@db.internal:1522/FREEPDB1",
            )),
            ..Default::default()
        };
        let (user, password, cs) = oracle_login("ora", &c).unwrap();
        assert_eq!((user.as_str(), password.as_str()), ("hr", "p@ss"));
        assert_eq!(cs, "//db.internal:1522/FREEPDB1");
        let c = SqlSourceConfig {
            host: Some("h".into()),
            ..Default::default()
        };
        let e = oracle_login("ora", &c).unwrap_err().to_string();
        assert!(e.contains("needs `user`"), "{e}");
    }
}
