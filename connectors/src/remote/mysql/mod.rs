//! MySQL and MariaDB over sqlx: the catalog from information_schema, splits as ranges of
//! an integer primary key, rows read over the text protocol.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use basin_core::{SqlSourceConfig, TlsMode};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::sql::unparser::dialect::{
    Dialect as UnparserDialect, MySqlDialect as MySqlUnparser,
};
use futures::StreamExt;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlSslMode};
use sqlx::{Executor, Row};

use super::backend::{
    Backend, BatchSender, Capabilities, Described, Splits, SqlDialect, Stop, flush, ranges,
};
use super::decode::Columns;
use super::exec::SplitBase;
use super::source::{ACQUIRE_TIMEOUT, CANNOT_CONNECT, RemoteSource, display_address};
use super::types::{RemoteColumn, decimal, readable_common, timestamp};

/// MySQL's and MariaDB's SQL.
pub struct MySqlDialect;

impl SqlDialect for MySqlDialect {
    fn name(&self) -> &'static str {
        "mysql"
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
            boolean_values: true,
            sum_of_small_integers: true,
            decimal_avg: false,
        }
    }

    fn unparser(&self) -> Box<dyn UnparserDialect> {
        Box::new(MySqlUnparser {})
    }

    fn quote_ident(&self, name: &str) -> String {
        format!("`{}`", name.replace('`', "``"))
    }

    /// A hexadecimal literal with a character set introducer, `_utf8mb4 X'…'`: no quoting
    /// at all, whatever `sql_mode` says about backslashes.
    fn quote_literal(&self, value: &str) -> Result<String> {
        let mut out = String::with_capacity(value.len() * 2 + 12);
        out.push_str("_utf8mb4 X'");
        for b in value.as_bytes() {
            out.push_str(&format!("{b:02X}"));
        }
        out.push('\'');
        Ok(out)
    }

    fn literal_ok(&self, value: &ScalarValue) -> bool {
        match value {
            ScalarValue::Utf8(_)
            | ScalarValue::LargeUtf8(_)
            | ScalarValue::Utf8View(_)
            | ScalarValue::UInt8(_)
            | ScalarValue::UInt16(_)
            | ScalarValue::UInt32(_)
            | ScalarValue::UInt64(_) => true,
            other => super::types::literal_ok_common(other),
        }
    }

    fn readable(&self, data_type: &DataType) -> bool {
        matches!(
            data_type,
            DataType::Int8
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
                | DataType::UInt64
        ) || readable_common(data_type)
    }

    fn explain(&self, sql: &str) -> String {
        format!("EXPLAIN {sql}")
    }
}

/// A MySQL/MariaDB source's connections.
pub struct MySqlBackend {
    pool: MySqlPool,
    address: String,
}

impl MySqlBackend {
    /// The (lazily connecting) pool of catalog `name`. Must run inside the connector runtime.
    pub fn new(name: &str, config: &SqlSourceConfig, pool_size: u32) -> Result<Self> {
        let options = mysql_options(name, config)?;
        let address = display_address(options.get_socket(), options.get_host(), options.get_port());
        let timeout = config.statement_timeout_secs;
        let pool = MySqlPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(Duration::from_secs(300))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if let Some(secs) = timeout {
                        mysql_statement_timeout(conn, secs).await?;
                    }
                    Ok(())
                })
            })
            .connect_lazy_with(options);
        Ok(Self { pool, address })
    }
}

fn catalog_error(source: &RemoteSource, what: &str) -> impl Fn(sqlx::Error) -> DataFusionError {
    move |e| source.error(what, e)
}

#[async_trait]
impl Backend for MySqlBackend {
    fn address(&self) -> String {
        self.address.clone()
    }

    async fn list_schemas(&self, source: &RemoteSource) -> Result<Vec<String>> {
        let pool = &self.pool;
        let rows = mysql_text_rows(
            pool,
            "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME NOT IN \
                 ('information_schema', 'mysql', 'performance_schema', 'sys') ORDER BY 1",
        )
        .await
        .map_err(catalog_error(source, "cannot list schemas"))?;
        Ok(rows.into_iter().filter_map(|mut r| r.remove(0)).collect())
    }

    async fn list_tables(&self, source: &RemoteSource, schema: &str) -> Result<Vec<String>> {
        let pool = &self.pool;
        let sql = format!(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} ORDER BY 1",
            MySqlDialect.quote_literal(schema)?
        );
        let rows = mysql_text_rows(pool, &sql)
            .await
            .map_err(catalog_error(source, "cannot list tables"))?;
        Ok(rows.into_iter().filter_map(|mut r| r.remove(0)).collect())
    }

    async fn describe_table(
        &self,
        source: &RemoteSource,
        schema: &str,
        table: &str,
    ) -> Result<Described> {
        let pool = &self.pool;
        let mut columns = vec![];
        let mut key = None;
        let sql = format!(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, \
                   IS_NULLABLE, COLLATION_NAME, COLUMN_KEY \
                 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {} \
                 ORDER BY ORDINAL_POSITION",
            MySqlDialect.quote_literal(schema)?,
            MySqlDialect.quote_literal(table)?
        );
        let rows = mysql_text_rows(pool, &sql)
            .await
            .map_err(catalog_error(source, "cannot describe table"))?;
        let mut keys = vec![];
        for r in rows {
            let s = |i: usize| r[i].clone().unwrap_or_default();
            let n = |i: usize| r[i].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0i64);
            let data_type_name = s(1).to_ascii_lowercase();
            let column_type = s(2).to_ascii_lowercase();
            let data_type = mysql_type(&data_type_name, &column_type, n(3), n(4));
            let binary = mysql_binary_collation(r[6].as_deref());
            if s(7) == "PRI" {
                keys.push((s(0), data_type.is_integer()));
            }
            columns.push(RemoteColumn {
                name: s(0),
                source_type: column_type,
                data_type,
                nullable: s(5) == "YES",
                exact_text: binary,
                ordered_text: binary,
                text_superset: matches!(
                    data_type_name.as_str(),
                    "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext"
                ),
            });
        }
        if let [(name, true)] = keys.as_slice() {
            key = Some(name.clone());
        }
        Ok((!columns.is_empty()).then_some((columns, key)))
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
        let Some(key) = &base.key else {
            return Ok(None);
        };
        let sql = format!(
            "SELECT DATA_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {}",
            MySqlDialect.quote_literal(&base.schema)?,
            MySqlDialect.quote_literal(&base.table)?
        );
        let rows = mysql_text_rows(&self.pool, &sql)
            .await
            .map_err(|e| src.error("cannot size the table", e))?;
        let bytes: u64 = rows
            .first()
            .and_then(|r| r[0].as_deref()?.parse().ok())
            .unwrap_or(0);
        let n = (bytes.div_ceil(src.split_size_bytes()) as usize).clamp(1, max_splits);
        if n <= 1 {
            return Ok(None);
        }
        let k = MySqlDialect.quote_ident(key);
        let sql = format!(
            "SELECT MIN({k}), MAX({k}) FROM {}.{}",
            MySqlDialect.quote_ident(&base.schema),
            MySqlDialect.quote_ident(&base.table)
        );
        let rows = mysql_text_rows(&self.pool, &sql)
            .await
            .map_err(|e| src.error("cannot size the table", e))?;
        let bound = |i: usize| -> Option<i128> { rows.first()?[i].as_deref()?.parse().ok() };
        let (Some(lo), Some(hi)) = (bound(0), bound(1)) else {
            return Ok(None);
        };
        let splits = ranges(lo, hi, n, &k)
            .iter()
            .map(|r| base.with_range(r))
            .collect();
        Ok(Some(Splits {
            queries: splits,
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
        let pool = &self.pool;
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| source.error(CANNOT_CONNECT, e))?;
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
                stop.outcome()
            }
        }
    }
}

fn mysql_options(name: &str, c: &SqlSourceConfig) -> Result<MySqlConnectOptions> {
    let mut o = match &c.url {
        Some(url) => MySqlConnectOptions::from_str(url.expose()).map_err(|e| {
            DataFusionError::Configuration(format!(
                "catalog `{name}`: `url` is not a MySQL URL: {}",
                url.redact_in(&e.to_string())
            ))
        })?,
        None => MySqlConnectOptions::new(),
    };
    o = sqlx_overrides!(o, c);
    let ssl = match c.tls {
        TlsMode::Disable => MySqlSslMode::Disabled,
        TlsMode::Prefer => MySqlSslMode::Preferred,
        TlsMode::Require => MySqlSslMode::Required,
        TlsMode::VerifyCa => MySqlSslMode::VerifyCa,
        TlsMode::VerifyFull => MySqlSslMode::VerifyIdentity,
    };
    if let Some(ca) = &c.tls_ca_file {
        o = o.ssl_ca(ca);
    }
    Ok(o.ssl_mode(ssl)
        .charset("utf8mb4")
        .timezone(Some("+00:00".to_string()))
        .statement_cache_capacity(0))
}

/// Sets a new MySQL/MariaDB connection's statement time limit: MariaDB's
/// `max_statement_time` (seconds, every statement), else MySQL's `max_execution_time`
/// (milliseconds, SELECTs: all Basin sends).
async fn mysql_statement_timeout(
    conn: &mut sqlx::MySqlConnection,
    secs: u64,
) -> std::result::Result<(), sqlx::Error> {
    use sqlx::Executor;
    let mariadb = conn
        .execute(format!("SET SESSION max_statement_time = {secs}").as_str())
        .await;
    if mariadb.is_err() {
        conn.execute(format!("SET SESSION max_execution_time = {}", secs * 1000).as_str())
            .await?;
    }
    Ok(())
}

/// Runs `sql` over MySQL's text protocol; every value as text (NULL = `None`).
pub async fn mysql_text_rows(
    pool: &sqlx::MySqlPool,
    sql: &str,
) -> std::result::Result<Vec<Vec<Option<String>>>, sqlx::Error> {
    let rows = sqlx::raw_sql(sql).fetch_all(pool).await?;
    rows.iter()
        .map(|row| {
            (0..row.len())
                .map(|i| {
                    let v: Option<&[u8]> = row.try_get_unchecked(i)?;
                    Ok(v.map(|b| String::from_utf8_lossy(b).into_owned()))
                })
                .collect()
        })
        .collect()
}
/// Arrow type of a MySQL/MariaDB column from information_schema.COLUMNS.
pub fn mysql_type(data_type: &str, column_type: &str, precision: i64, scale: i64) -> DataType {
    let unsigned = column_type.contains("unsigned");
    match data_type {
        "tinyint" if column_type.starts_with("tinyint(1)") && !unsigned => DataType::Boolean,
        "tinyint" if unsigned => DataType::UInt8,
        "tinyint" => DataType::Int8,
        "smallint" if unsigned => DataType::UInt16,
        "smallint" => DataType::Int16,
        "mediumint" | "int" | "integer" if unsigned => DataType::UInt32,
        "mediumint" | "int" | "integer" => DataType::Int32,
        "bigint" if unsigned => DataType::UInt64,
        "bigint" => DataType::Int64,
        "decimal" | "numeric" => decimal(precision, scale).unwrap_or(DataType::Utf8),
        "float" => DataType::Float32,
        "double" | "real" => DataType::Float64,
        "bit" if column_type == "bit(1)" => DataType::Boolean,
        "bit" => DataType::UInt64,
        "year" => DataType::Int16,
        "date" => DataType::Date32,
        "datetime" => timestamp(false),
        "timestamp" => timestamp(true),
        "time" => DataType::Time64(TimeUnit::Microsecond),
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" | "geometry"
        | "point" | "linestring" | "polygon" => DataType::Binary,
        // char, varchar, *text, enum, set, json (MariaDB: longtext), uuid, inet6...
        _ => DataType::Utf8,
    }
}

/// Whether a MySQL text column compares exactly as Basin: a binary collation that does not
/// pad. `utf8mb4_bin` and the other `*_bin` collations before MySQL 8's `*_0900_bin` are
/// PAD SPACE (`'abc' = 'abc '` is true there, and GROUP BY merges the two): only
/// `binary`, `*_0900_bin` and MariaDB's `*_nopad_bin` compare bytes as they are.
pub fn mysql_binary_collation(collation: Option<&str>) -> bool {
    collation
        .is_some_and(|c| c == "binary" || c.ends_with("_0900_bin") || c.ends_with("_nopad_bin"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_types() {
        assert_eq!(mysql_type("tinyint", "tinyint(1)", 3, 0), DataType::Boolean);
        assert_eq!(
            mysql_type("int", "int(10) unsigned", 10, 0),
            DataType::UInt32
        );
        assert_eq!(
            mysql_type("decimal", "decimal(12,2)", 12, 2),
            DataType::Decimal128(12, 2)
        );
        assert!(mysql_binary_collation(Some("utf8mb4_0900_bin")));
        assert!(mysql_binary_collation(Some("utf8mb4_nopad_bin")));
        assert!(!mysql_binary_collation(Some("utf8mb4_bin")));
        assert!(!mysql_binary_collation(Some("utf8mb4_general_ci")));
    }
}
