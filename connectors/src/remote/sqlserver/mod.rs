//! Microsoft SQL Server (and Azure SQL, and Babelfish for PostgreSQL) over TDS with
//! `tiberius`: the catalog from `INFORMATION_SCHEMA`, pushed-down queries in T-SQL, splits as
//! ranges of an integer primary key, rows decoded from TDS values straight into Arrow
//! builders.
//!
//! Semantics Basin guards (docs/connectors/sqlserver.md):
//! - T-SQL's `=` on text ignores trailing spaces under every collation, `_BIN2` included, and
//!   the default collations ignore case: GROUP BY/DISTINCT, joins and ordering on text
//!   columns stay in Basin; an equality filter with a literal is pushed as a superset and
//!   checked again in Basin.
//! - T-SQL has no boolean values: `bit` columns and boolean expressions are not pushed
//!   outside predicates.
//! - `SUM` of an `int` is an `int` there (it fails past 2^31): sums of integers narrower than
//!   `bigint` stay in Basin; `AVG` of integers truncates: only averages of floats are pushed.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use basin_core::{SqlSourceConfig, TlsMode};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::sql::sqlparser::ast::{
    self, CharacterLength, ExactNumberInfo, Ident, ObjectName, ObjectNamePart,
};
use datafusion::sql::unparser::dialect::{CharacterLengthStyle, Dialect as UnparserDialect};
use futures::StreamExt;
use tiberius::{AuthMethod, Client, ColumnData, Config, EncryptionLevel, Row, SqlBrowser};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use super::backend::{
    Backend, BatchSender, Capabilities, Described, IdleConnections, Splits, SqlDialect, Stop,
    flush, ranges,
};
use super::decode::{Columns, Value};
use super::exec::SplitBase;
use super::source::{ACQUIRE_TIMEOUT, CANNOT_CONNECT, Login, RemoteSource, application_name};
use super::types::{RemoteColumn, decimal, readable_common, timestamp};

/// T-SQL.
pub struct SqlServerDialect;

impl SqlDialect for SqlServerDialect {
    fn name(&self) -> &'static str {
        "sqlserver"
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
            nulls_ordering: false,
            boolean_values: false,
            sum_of_small_integers: false,
            decimal_avg: false,
        }
    }

    fn unparser(&self) -> Box<dyn UnparserDialect> {
        Box::new(TsqlUnparser)
    }

    fn quote_ident(&self, name: &str) -> String {
        format!("[{}]", name.replace(']', "]]"))
    }

    /// A Unicode literal `N'…'` with `'` doubled (a backslash is an ordinary character in
    /// T-SQL). NUL is refused: such a predicate runs in Basin.
    fn quote_literal(&self, value: &str) -> Result<String> {
        if value.contains('\0') {
            return Err(DataFusionError::NotImplemented(
                "NUL in a string literal for SQL Server".into(),
            ));
        }
        Ok(format!("N'{}'", value.replace('\'', "''")))
    }

    fn literal_ok(&self, value: &ScalarValue) -> bool {
        match value {
            ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s) => {
                s.as_deref().is_none_or(|s| !s.contains('\0'))
            }
            ScalarValue::Boolean(_) => false,
            other => super::types::literal_ok_common(other),
        }
    }

    fn readable(&self, data_type: &DataType) -> bool {
        !matches!(data_type, DataType::Decimal256(_, _)) && readable_common(data_type)
    }

    /// `TOP (n)`, or `OFFSET … FETCH` when rows are skipped (T-SQL has no `LIMIT`).
    fn limit(&self, inner: &str, order_by: &[String], fetch: usize, skip: usize) -> String {
        if skip == 0 {
            let mut sql = format!("SELECT TOP ({fetch}) * FROM ({inner}) AS q");
            if !order_by.is_empty() {
                sql.push_str(&format!(" ORDER BY {}", order_by.join(", ")));
            }
            return sql;
        }
        let order = if order_by.is_empty() {
            "(SELECT NULL)".to_string()
        } else {
            order_by.join(", ")
        };
        format!(
            "SELECT * FROM ({inner}) AS q ORDER BY {order} OFFSET {skip} ROWS FETCH NEXT {fetch} ROWS ONLY"
        )
    }

    fn select(
        &self,
        columns: &str,
        from: &str,
        predicate: Option<&str>,
        limit: Option<usize>,
    ) -> String {
        let mut sql = match limit {
            Some(n) => format!("SELECT TOP ({n}) {columns} FROM {from}"),
            None => format!("SELECT {columns} FROM {from}"),
        };
        if let Some(p) = predicate {
            sql.push_str(&format!(" WHERE {p}"));
        }
        sql
    }

    /// T-SQL has no EXPLAIN statement: the source compiles the query and returns no row.
    fn explain(&self, sql: &str) -> String {
        format!("SELECT TOP (0) * FROM ({sql}) AS q")
    }

    /// The query with each result column cast to the type Basin decodes (`money` arrives as
    /// a float over TDS: cast to `decimal(19,4)`, it arrives exact).
    fn statement(&self, split_sql: &str, schema: &SchemaRef) -> String {
        let columns: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| {
                let name = self.quote_ident(f.name());
                match wire_type(f.data_type()) {
                    Some(t) => format!("CAST(q.{name} AS {t}) AS {name}"),
                    None => format!("q.{name}"),
                }
            })
            .collect();
        if columns.is_empty() {
            // No column is needed, only rows (`count(*)` of a subquery): T-SQL has no empty
            // select list, and the reader skips this one.
            return format!("SELECT 1 AS [c0] FROM ({split_sql}) AS q");
        }
        format!("SELECT {} FROM ({split_sql}) AS q", columns.join(", "))
    }
}

/// The T-SQL type a result column is cast to, when its own TDS type is not decoded as is.
fn wire_type(data_type: &DataType) -> Option<String> {
    Some(match data_type {
        DataType::Boolean => "bit".into(),
        DataType::Int16 => "smallint".into(),
        DataType::Int32 => "int".into(),
        DataType::Int64 => "bigint".into(),
        DataType::Float32 => "real".into(),
        DataType::Float64 => "float".into(),
        DataType::Decimal128(p, s) => format!("decimal({p},{s})"),
        DataType::Date32 => "date".into(),
        DataType::Time64(_) => "time(6)".into(),
        DataType::Timestamp(_, None) => "datetime2(6)".into(),
        // Text, binary and zoned timestamps (`datetimeoffset`, read as UTC) as they come.
        _ => return None,
    })
}

/// DataFusion's unparser, writing T-SQL.
struct TsqlUnparser;

fn named_type(name: &str) -> ast::DataType {
    ast::DataType::Custom(
        ObjectName(vec![ObjectNamePart::Identifier(Ident::new(name))]),
        vec![],
    )
}

impl UnparserDialect for TsqlUnparser {
    fn identifier_quote_style(&self, _: &str) -> Option<char> {
        Some('[')
    }

    fn supports_nulls_first_in_sort(&self) -> bool {
        false
    }

    fn float64_ast_dtype(&self) -> ast::DataType {
        ast::DataType::Float(ExactNumberInfo::None)
    }

    fn utf8_cast_dtype(&self) -> ast::DataType {
        ast::DataType::Nvarchar(Some(CharacterLength::Max))
    }

    fn large_utf8_cast_dtype(&self) -> ast::DataType {
        ast::DataType::Nvarchar(Some(CharacterLength::Max))
    }

    fn character_length_style(&self) -> CharacterLengthStyle {
        CharacterLengthStyle::Length
    }

    fn int64_cast_dtype(&self) -> ast::DataType {
        ast::DataType::BigInt(None)
    }

    fn int32_cast_dtype(&self) -> ast::DataType {
        ast::DataType::Int(None)
    }

    fn timestamp_cast_dtype(
        &self,
        _unit: &datafusion::arrow::datatypes::TimeUnit,
        tz: &Option<Arc<str>>,
    ) -> ast::DataType {
        named_type(if tz.is_some() {
            "DATETIMEOFFSET"
        } else {
            "DATETIME2"
        })
    }

    fn requires_derived_table_alias(&self) -> bool {
        true
    }

    fn supports_qualify(&self) -> bool {
        false
    }
}

/// Arrow type of a SQL Server column from `INFORMATION_SCHEMA.COLUMNS`.
pub fn sqlserver_type(data_type: &str, precision: i64, scale: i64) -> DataType {
    match data_type {
        "bit" => DataType::Boolean,
        // tinyint is 0..255 in SQL Server.
        "tinyint" | "smallint" => DataType::Int16,
        "int" => DataType::Int32,
        "bigint" => DataType::Int64,
        "decimal" | "numeric" => decimal(precision, scale).unwrap_or(DataType::Utf8),
        "money" => DataType::Decimal128(19, 4),
        "smallmoney" => DataType::Decimal128(10, 4),
        "real" => DataType::Float32,
        "float" if precision > 0 && precision <= 24 => DataType::Float32,
        "float" => DataType::Float64,
        "date" => DataType::Date32,
        "time" => DataType::Time64(TimeUnit::Microsecond),
        "datetime" | "datetime2" | "smalldatetime" => timestamp(false),
        "datetimeoffset" => timestamp(true),
        "binary" | "varbinary" | "image" | "rowversion" | "timestamp" => DataType::Binary,
        // char, varchar, nchar, nvarchar, text, ntext, xml, uniqueidentifier, sysname,
        // sql_variant...: text.
        _ => DataType::Utf8,
    }
}

type Conn = Client<Compat<TcpStream>>;

/// A SQL Server source's connections: idle clients kept for the next query, at most
/// `pool_size` open at once.
pub struct SqlServerBackend {
    config: Config,
    address: String,
    idle: IdleConnections<Conn>,
    open: Arc<tokio::sync::Semaphore>,
}

/// A connection taken from the pool; given back with [`SqlServerBackend::give_back`], closed
/// when dropped otherwise.
struct Lease {
    conn: Conn,
    _open: tokio::sync::OwnedSemaphorePermit,
}

impl SqlServerBackend {
    pub fn new(name: &str, c: &SqlSourceConfig, pool_size: u32) -> Result<Self> {
        let config = tiberius_config(name, c)?;
        let address = match &c.instance {
            Some(i) => format!("{}\\{i}", c.host.as_deref().unwrap_or("localhost")),
            None => config.get_addr(),
        };
        Ok(Self {
            config,
            address,
            idle: IdleConnections::default(),
            open: Arc::new(tokio::sync::Semaphore::new(pool_size as usize)),
        })
    }

    async fn lease(&self, source: &RemoteSource) -> Result<Lease> {
        let open = tokio::time::timeout(ACQUIRE_TIMEOUT, self.open.clone().acquire_owned())
            .await
            .map_err(|_| {
                source.error(
                    CANNOT_CONNECT,
                    format!(
                        "every connection of the pool stayed busy for {} s",
                        ACQUIRE_TIMEOUT.as_secs()
                    ),
                )
            })?
            .map_err(|e| source.error("closed", e))?;
        if let Some(conn) = self.idle.take() {
            return Ok(Lease { conn, _open: open });
        }
        let connect = async {
            let tcp = TcpStream::connect_named(&self.config).await?;
            tcp.set_nodelay(true)?;
            Client::connect(self.config.clone(), tcp.compat_write()).await
        };
        let conn = tokio::time::timeout(ACQUIRE_TIMEOUT, connect)
            .await
            .map_err(|_| {
                source.error(
                    CANNOT_CONNECT,
                    format!(
                        "no answer from {} within {} s: is the server up and reachable?",
                        self.address,
                        ACQUIRE_TIMEOUT.as_secs()
                    ),
                )
            })?
            .map_err(|e| source.error(CANNOT_CONNECT, e))?;
        Ok(Lease { conn, _open: open })
    }

    /// Keeps a connection whose last statement ended cleanly.
    fn give_back(&self, lease: Lease) {
        self.idle.keep(lease.conn);
    }

    /// Runs `sql` with `params` and returns every row (catalog queries).
    async fn rows(
        &self,
        source: &RemoteSource,
        what: &str,
        sql: &str,
        params: &[&str],
    ) -> Result<Vec<Row>> {
        let mut lease = self.lease(source).await?;
        let mut query = tiberius::Query::new(sql);
        for p in params {
            query.bind(p.to_string());
        }
        let rows = async {
            query
                .query(&mut lease.conn)
                .await?
                .into_first_result()
                .await
        }
        .await
        .map_err(|e| source.error(what, e))?;
        self.give_back(lease);
        Ok(rows)
    }
}

fn text(row: &Row, i: usize) -> Option<String> {
    match row.get_column_data(i).ok()? {
        ColumnData::String(Some(s)) => Some(s.to_string()),
        _ => None,
    }
}

fn number(row: &Row, i: usize) -> Option<i64> {
    match row.get_column_data(i).ok()? {
        ColumnData::U8(Some(v)) => Some(i64::from(*v)),
        ColumnData::I16(Some(v)) => Some(i64::from(*v)),
        ColumnData::I32(Some(v)) => Some(i64::from(*v)),
        ColumnData::I64(Some(v)) => Some(*v),
        ColumnData::Numeric(Some(n)) => i64::try_from(n.int_part()).ok(),
        _ => None,
    }
}

#[async_trait]
impl Backend for SqlServerBackend {
    fn address(&self) -> String {
        self.address.clone()
    }

    async fn list_schemas(&self, source: &RemoteSource) -> Result<Vec<String>> {
        let rows = self
            .rows(
                source,
                "cannot list schemas",
                "SELECT DISTINCT TABLE_SCHEMA FROM INFORMATION_SCHEMA.TABLES ORDER BY 1",
                &[],
            )
            .await?;
        Ok(rows.iter().filter_map(|r| text(r, 0)).collect())
    }

    async fn list_tables(&self, source: &RemoteSource, schema: &str) -> Result<Vec<String>> {
        let rows = self
            .rows(
                source,
                "cannot list tables",
                "SELECT TABLE_NAME FROM INFORMATION_SCHEMA.TABLES WHERE TABLE_SCHEMA = @P1 ORDER BY 1",
                &[schema],
            )
            .await?;
        Ok(rows.iter().filter_map(|r| text(r, 0)).collect())
    }

    async fn describe_table(
        &self,
        source: &RemoteSource,
        schema: &str,
        table: &str,
    ) -> Result<Described> {
        let rows = self
            .rows(
                source,
                "cannot describe table",
                "SELECT COLUMN_NAME, DATA_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, IS_NULLABLE, \
                   CHARACTER_MAXIMUM_LENGTH \
                 FROM INFORMATION_SCHEMA.COLUMNS WHERE TABLE_SCHEMA = @P1 AND TABLE_NAME = @P2 \
                 ORDER BY ORDINAL_POSITION",
                &[schema, table],
            )
            .await?;
        let mut columns = vec![];
        for r in &rows {
            let (Some(name), Some(data_type)) = (text(r, 0), text(r, 1)) else {
                continue;
            };
            let data_type = data_type.to_ascii_lowercase();
            let arrow = sqlserver_type(
                &data_type,
                number(r, 2).unwrap_or(0),
                number(r, 3).unwrap_or(0),
            );
            let printed = match (number(r, 5), number(r, 2), number(r, 3)) {
                (Some(-1), _, _) => format!("{data_type}(max)"),
                (Some(n), _, _) => format!("{data_type}({n})"),
                (None, Some(p), Some(s)) if matches!(data_type.as_str(), "decimal" | "numeric") => {
                    format!("{data_type}({p},{s})")
                }
                _ => data_type.clone(),
            };
            columns.push(RemoteColumn {
                name,
                source_type: printed,
                data_type: arrow,
                nullable: text(r, 4).as_deref() != Some("NO"),
                // `=` ignores trailing spaces under every collation (and case under most).
                exact_text: false,
                ordered_text: false,
                // `=` on text/ntext is an error in T-SQL; on uniqueidentifier and xml the
                // literal would be converted.
                text_superset: matches!(
                    data_type.as_str(),
                    "char" | "varchar" | "nchar" | "nvarchar" | "sysname"
                ),
            });
        }
        let keys = self
            .rows(
                source,
                "cannot describe table",
                "SELECT k.COLUMN_NAME FROM INFORMATION_SCHEMA.TABLE_CONSTRAINTS c \
                 JOIN INFORMATION_SCHEMA.KEY_COLUMN_USAGE k \
                   ON k.CONSTRAINT_NAME = c.CONSTRAINT_NAME AND k.TABLE_SCHEMA = c.TABLE_SCHEMA \
                  AND k.TABLE_NAME = c.TABLE_NAME \
                 WHERE c.CONSTRAINT_TYPE = 'PRIMARY KEY' AND c.TABLE_SCHEMA = @P1 \
                   AND c.TABLE_NAME = @P2",
                &[schema, table],
            )
            .await?;
        let keys: Vec<String> = keys.iter().filter_map(|r| text(r, 0)).collect();
        let key = match keys.as_slice() {
            [k] if columns
                .iter()
                .any(|c| &c.name == k && c.data_type.is_integer()) =>
            {
                Some(k.clone())
            }
            _ => None,
        };
        Ok((!columns.is_empty()).then_some((columns, key)))
    }

    async fn check(&self, source: &RemoteSource, statement: &str) -> Result<()> {
        self.rows(source, "rejected a pushed-down query", statement, &[])
            .await
            .map(|_| ())
    }

    /// Ranges of the integer primary key; the number of splits from the row count (SQL
    /// Server's catalog sizes are not portable: Babelfish reports none).
    async fn plan_splits(
        &self,
        src: &Arc<RemoteSource>,
        base: &SplitBase,
        max_splits: usize,
    ) -> Result<Option<Splits>> {
        let Some(key) = &base.key else {
            return Ok(None);
        };
        let d = SqlServerDialect;
        let k = d.quote_ident(key);
        let sql = format!(
            "SELECT COUNT_BIG(*), MIN({k}), MAX({k}) FROM {}.{}",
            d.quote_ident(&base.schema),
            d.quote_ident(&base.table)
        );
        let rows = self.rows(src, "cannot size the table", &sql, &[]).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let (Some(count), Some(lo), Some(hi)) = (number(row, 0), number(row, 1), number(row, 2))
        else {
            return Ok(None);
        };
        let bytes = (count.max(0) as u64).saturating_mul(ROW_BYTES_ESTIMATE);
        let n = (bytes.div_ceil(src.split_size_bytes()) as usize).clamp(1, max_splits);
        if n <= 1 {
            return Ok(None);
        }
        let queries = ranges(i128::from(lo), i128::from(hi), n, &k)
            .iter()
            .map(|r| base.with_range(r))
            .collect();
        Ok(Some(Splits {
            queries,
            note: Some(format!("ranges of {key}")),
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
        let mut lease = tokio::select! {
            l = self.lease(source) => l?,
            _ = tx.closed() => return Ok(()),
        };
        let outcome: std::result::Result<(), Stop> = async {
            let failed = |e: tiberius::error::Error| Stop::Failed(source.error("query failed", e));
            let stream = tokio::select! {
                s = lease.conn.simple_query(statement) => s.map_err(failed)?,
                _ = tx.closed() => return Err(Stop::Cancelled),
            };
            let mut rows = stream.into_row_stream();
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
                        for (i, (_, cell)) in row.cells().take(width).enumerate() {
                            push(&mut columns, i, cell).map_err(Stop::Failed)?;
                        }
                        columns.end_row();
                        if columns.rows() >= batch_size {
                            flush(&mut columns, tx).await?;
                        }
                    }
                    Some(Err(e)) => return Err(failed(e)),
                    None => break,
                }
            }
            flush(&mut columns, tx).await?;
            Ok(())
        }
        .await;
        match outcome {
            Ok(()) => {
                self.give_back(lease);
                Ok(())
            }
            // The connection is mid-query: dropping it closes the socket, and the server
            // stops the query.
            Err(stop) => stop.outcome(),
        }
    }
}

/// Bytes per row assumed when sizing splits.
const ROW_BYTES_ESTIMATE: u64 = 128;

/// Days from 0001-01-01 to 1970-01-01 (`date`, `datetime2`).
const DAYS_0001_TO_1970: i64 = 719_162;
/// Days from 1900-01-01 to 1970-01-01 (`datetime`, `smalldatetime`).
const DAYS_1900_TO_1970: i64 = 25_567;
const MICROS_PER_DAY: i64 = 86_400_000_000;

/// Microseconds of a `time` value (`increments` of 10^-scale seconds).
fn time_micros(t: tiberius::time::Time) -> i64 {
    let increments = t.increments() as i128;
    let scale = u32::from(t.scale());
    let micros = if scale >= 6 {
        increments / 10i128.pow(scale - 6)
    } else {
        increments * 10i128.pow(6 - scale)
    };
    micros as i64
}

fn datetime2_micros(d: tiberius::time::DateTime2) -> i64 {
    (i64::from(d.date().days()) - DAYS_0001_TO_1970) * MICROS_PER_DAY + time_micros(d.time())
}

/// Appends one TDS value to column `i`.
fn push(columns: &mut Columns, i: usize, cell: &ColumnData<'_>) -> Result<()> {
    let guid;
    let xml;
    let value = match cell {
        ColumnData::U8(v) => v.map_or(Value::Null, |v| Value::Int(i64::from(v))),
        ColumnData::I16(v) => v.map_or(Value::Null, |v| Value::Int(i64::from(v))),
        ColumnData::I32(v) => v.map_or(Value::Null, |v| Value::Int(i64::from(v))),
        ColumnData::I64(v) => v.map_or(Value::Null, Value::Int),
        ColumnData::F32(v) => v.map_or(Value::Null, |v| Value::Float(f64::from(v))),
        ColumnData::F64(v) => v.map_or(Value::Null, Value::Float),
        ColumnData::Bit(v) => v.map_or(Value::Null, Value::Bool),
        ColumnData::String(v) => v.as_deref().map_or(Value::Null, Value::Text),
        ColumnData::Guid(v) => match v {
            Some(g) => {
                // SQL Server prints uniqueidentifiers in capitals.
                guid = g.hyphenated().to_string().to_ascii_uppercase();
                Value::Text(&guid)
            }
            None => Value::Null,
        },
        ColumnData::Binary(v) => v.as_deref().map_or(Value::Null, Value::Bytes),
        ColumnData::Numeric(v) => v.map_or(Value::Null, |n| Value::Decimal(n.value(), n.scale())),
        ColumnData::Xml(v) => match v {
            Some(x) => {
                xml = x.to_string();
                Value::Text(&xml)
            }
            None => Value::Null,
        },
        ColumnData::DateTime(v) => v.map_or(Value::Null, |d| {
            // 1/300 s ticks.
            let micros = i64::from(d.seconds_fragments()) * 10_000 / 3;
            Value::Timestamp((i64::from(d.days()) - DAYS_1900_TO_1970) * MICROS_PER_DAY + micros)
        }),
        ColumnData::SmallDateTime(v) => v.map_or(Value::Null, |d| {
            Value::Timestamp(
                (i64::from(d.days()) - DAYS_1900_TO_1970) * MICROS_PER_DAY
                    + i64::from(d.seconds_fragments()) * 60_000_000,
            )
        }),
        ColumnData::Time(v) => v.map_or(Value::Null, |t| Value::Time(time_micros(t))),
        ColumnData::Date(v) => v.map_or(Value::Null, |d| {
            Value::Date((i64::from(d.days()) - DAYS_0001_TO_1970) as i32)
        }),
        ColumnData::DateTime2(v) => {
            v.map_or(Value::Null, |d| Value::Timestamp(datetime2_micros(d)))
        }
        // TDS carries the UTC time and the offset separately.
        ColumnData::DateTimeOffset(v) => v.map_or(Value::Null, |d| {
            Value::Timestamp(datetime2_micros(d.datetime2()))
        }),
    };
    columns.push_value(i, value)
}

/// tiberius' configuration of a catalog: `url` (`sqlserver://user:password@host:port/db`) or
/// the separate fields, which override the URL's parts.
fn tiberius_config(name: &str, c: &SqlSourceConfig) -> Result<Config> {
    let login = Login::of(
        name,
        c,
        "a SQL Server URL",
        "sqlserver://user:password@host:port/database",
        &["sqlserver", "mssql"],
    )?;
    let mut config = Config::new();
    if let Some(h) = &login.host {
        config.host(h);
    }
    if let Some(p) = login.port {
        config.port(p);
    }
    if let Some(i) = &c.instance {
        config.instance_name(i);
    }
    if let Some(d) = &login.database {
        config.database(d);
    }
    let (user, password) = (login.user, login.password);
    let Some(user) = user else {
        return Err(DataFusionError::Configuration(format!(
            "catalog `{name}`: SQL Server needs a login: give `user` (and `password`) or put \
             them in `url`"
        )));
    };
    config.authentication(AuthMethod::sql_server(user, password.unwrap_or_default()));
    config.application_name(application_name());
    match c.tls {
        // The login packet is still encrypted when the server requires it.
        TlsMode::Disable => config.encryption(EncryptionLevel::NotSupported),
        TlsMode::Prefer => {
            config.encryption(EncryptionLevel::On);
            config.trust_cert();
        }
        TlsMode::Require => {
            config.encryption(EncryptionLevel::Required);
            config.trust_cert();
        }
        TlsMode::VerifyCa | TlsMode::VerifyFull => {
            config.encryption(EncryptionLevel::Required);
            if let Some(ca) = &c.tls_ca_file {
                config.trust_cert_ca(ca);
            }
        }
    }
    if let Some(secs) = c.statement_timeout_secs {
        config.command_timeout(Some(Duration::from_secs(secs)));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn sqlserver_types() {
        assert_eq!(sqlserver_type("bit", 0, 0), DataType::Boolean);
        assert_eq!(sqlserver_type("tinyint", 3, 0), DataType::Int16);
        assert_eq!(sqlserver_type("money", 19, 4), DataType::Decimal128(19, 4));
        assert_eq!(
            sqlserver_type("decimal", 12, 2),
            DataType::Decimal128(12, 2)
        );
        assert_eq!(sqlserver_type("float", 53, 0), DataType::Float64);
        assert_eq!(sqlserver_type("float", 24, 0), DataType::Float32);
        assert_eq!(sqlserver_type("datetimeoffset", 0, 0), timestamp(true));
        assert_eq!(sqlserver_type("uniqueidentifier", 0, 0), DataType::Utf8);
        assert_eq!(sqlserver_type("varbinary", 0, 0), DataType::Binary);
    }

    #[test]
    fn limits_are_top_or_offset_fetch() {
        let d = SqlServerDialect;
        assert_eq!(
            d.limit("SELECT 1 AS [c0]", &["q.[c0] DESC".into()], 5, 0),
            "SELECT TOP (5) * FROM (SELECT 1 AS [c0]) AS q ORDER BY q.[c0] DESC"
        );
        assert_eq!(
            d.limit("SELECT 1 AS [c0]", &[], 5, 10),
            "SELECT * FROM (SELECT 1 AS [c0]) AS q ORDER BY (SELECT NULL) OFFSET 10 ROWS FETCH NEXT 5 ROWS ONLY"
        );
        assert_eq!(d.quote_ident("a]b"), "[a]]b]");
    }

    #[test]
    fn statements_cast_to_what_basin_decodes() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("c0", DataType::Decimal128(19, 4), true),
            Field::new("c1", DataType::Utf8, true),
        ]));
        assert_eq!(
            SqlServerDialect.statement("SELECT 1", &schema),
            "SELECT CAST(q.[c0] AS decimal(19,4)) AS [c0], q.[c1] FROM (SELECT 1) AS q"
        );
    }

    #[test]
    fn urls_and_fields_make_a_login() {
        let c = SqlSourceConfig {
            url: Some(basin_core::Secret::new(
                "sqlserver://basin:p%40ss@db.internal:1433/sales",
            )),
            ..Default::default()
        };
        let config = tiberius_config("ms", &c).unwrap();
        assert_eq!(config.get_addr(), "db.internal:1433");
        let c = SqlSourceConfig {
            host: Some("h".into()),
            ..Default::default()
        };
        let e = tiberius_config("ms", &c).unwrap_err().to_string();
        assert!(e.contains("needs a login"), "{e}");
    }
}
