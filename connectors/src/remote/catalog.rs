//! Schemas, tables and columns discovered from the source's own catalog, lazily and cached
//! for `metadata_ttl_secs`.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::catalog::{CatalogProvider, SchemaProvider, Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use sqlx::Row;

use super::exec::{RemoteQuery, SplitBase, plan_scan};
use super::source::{Dialect, Pool, RemoteSource};
use super::sql::{quote_ident, quote_literal};
use super::types::{
    RemoteColumn, mysql_binary_collation, mysql_type, postgres_exact_text, postgres_type,
};

type Cached<T> = Mutex<Option<(Instant, T)>>;

/// A database source as a DataFusion catalog: its schemas (MySQL: databases).
#[derive(Debug)]
pub struct RemoteCatalogProvider {
    source: Arc<RemoteSource>,
    schemas: Cached<Vec<String>>,
}

impl RemoteCatalogProvider {
    pub fn new(source: Arc<RemoteSource>) -> Self {
        Self {
            source,
            schemas: Mutex::new(None),
        }
    }

    fn schema_list(&self) -> Result<Vec<String>> {
        if let Ok(guard) = self.schemas.lock()
            && let Some((at, names)) = guard.as_ref()
            && at.elapsed() < self.source.metadata_ttl()
        {
            return Ok(names.clone());
        }
        let source = self.source.clone();
        let names = self
            .source
            .call_blocking(async move { list_schemas(&source).await })?;
        if let Ok(mut guard) = self.schemas.lock() {
            *guard = Some((Instant::now(), names.clone()));
        }
        Ok(names)
    }
}

impl CatalogProvider for RemoteCatalogProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        self.schema_list().unwrap_or_else(|e| {
            tracing::warn!(source = %self.source.name, "cannot list schemas: {e}");
            vec![]
        })
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let provider = |failed: Option<String>| {
            Some(Arc::new(RemoteSchemaProvider {
                source: self.source.clone(),
                schema: name.to_string(),
                tables: Mutex::new(None),
                columns: Mutex::new(HashMap::new()),
                failed,
            }) as Arc<dyn SchemaProvider>)
        };
        match self.schema_list() {
            Ok(names) if names.iter().any(|n| n == name) => provider(None),
            Ok(_) => None,
            Err(e) => {
                // This call cannot fail: the table lookup that follows says what went wrong
                // (a refused login, say) instead of "table not found".
                tracing::warn!(source = %self.source.name, "cannot list schemas: {e}");
                provider(Some(match e {
                    DataFusionError::External(e) => e.to_string(),
                    other => other.to_string(),
                }))
            }
        }
    }
}

/// One schema of a source.
#[derive(Debug)]
pub struct RemoteSchemaProvider {
    source: Arc<RemoteSource>,
    schema: String,
    tables: Cached<Vec<String>>,
    columns: Mutex<HashMap<String, (Instant, Arc<RemoteTable>)>>,
    /// Why the source could not list its schemas: what a table lookup answers.
    failed: Option<String>,
}

impl RemoteSchemaProvider {
    fn table_list(&self) -> Result<Vec<String>> {
        if let Ok(guard) = self.tables.lock()
            && let Some((at, names)) = guard.as_ref()
            && at.elapsed() < self.source.metadata_ttl()
        {
            return Ok(names.clone());
        }
        let source = self.source.clone();
        let schema = self.schema.clone();
        let names = self
            .source
            .call_blocking(async move { list_tables(&source, &schema).await })?;
        if let Ok(mut guard) = self.tables.lock() {
            *guard = Some((Instant::now(), names.clone()));
        }
        Ok(names)
    }
}

#[async_trait]
impl SchemaProvider for RemoteSchemaProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.table_list().unwrap_or_else(|e| {
            tracing::warn!(source = %self.source.name, schema = %self.schema, "cannot list tables: {e}");
            vec![]
        })
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if let Some(e) = &self.failed {
            return Err(DataFusionError::External(e.clone().into()));
        }
        if let Ok(guard) = self.columns.lock()
            && let Some((at, table)) = guard.get(name)
            && at.elapsed() < self.source.metadata_ttl()
        {
            return Ok(Some(table.clone()));
        }
        let source = self.source.clone();
        let (schema, table) = (self.schema.clone(), name.to_string());
        let found = self
            .source
            .call(async move { describe_table(&source, &schema, &table).await })
            .await?;
        let Some((columns, key)) = found else {
            return Ok(None);
        };
        let table = Arc::new(RemoteTable::new(
            self.source.clone(),
            &self.schema,
            name,
            columns,
            key,
        ));
        if let Ok(mut guard) = self.columns.lock() {
            guard.insert(name.to_string(), (Instant::now(), table.clone()));
        }
        Ok(Some(table))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.table_list()
            .map(|t| t.iter().any(|n| n == name))
            .unwrap_or(false)
    }
}

/// A table (or view) of a source.
#[derive(Debug, Clone)]
pub struct RemoteTable {
    pub source: Arc<RemoteSource>,
    pub schema_name: String,
    pub table_name: String,
    pub columns: Vec<RemoteColumn>,
    /// MySQL: an integer primary-key column to split scans on.
    pub split_key: Option<String>,
    arrow: SchemaRef,
}

impl RemoteTable {
    pub fn new(
        source: Arc<RemoteSource>,
        schema_name: &str,
        table_name: &str,
        columns: Vec<RemoteColumn>,
        split_key: Option<String>,
    ) -> Self {
        let arrow = Arc::new(Schema::new(
            columns
                .iter()
                .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable))
                .collect::<Vec<_>>(),
        ));
        Self {
            source,
            schema_name: schema_name.to_string(),
            table_name: table_name.to_string(),
            columns,
            split_key,
            arrow,
        }
    }

    pub fn column(&self, name: &str) -> Option<&RemoteColumn> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// `"schema"."table"` in the source's quoting.
    pub fn quoted_name(&self) -> String {
        let d = self.source.dialect;
        format!(
            "{}.{}",
            quote_ident(&self.schema_name, d),
            quote_ident(&self.table_name, d)
        )
    }

    /// The query reading `columns` (names) of this table, with an optional predicate
    /// (already rendered SQL) and row limit.
    pub fn scan_query(
        &self,
        columns: &[String],
        alias: Option<&str>,
        predicate: Option<String>,
        limit: Option<usize>,
    ) -> RemoteQuery {
        let d = self.source.dialect;
        let select: Vec<String> = if columns.is_empty() {
            vec![format!("1 AS {}", quote_ident("c0", d))]
        } else {
            columns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    format!(
                        "{} AS {}",
                        quote_ident(c, d),
                        quote_ident(&format!("c{i}"), d)
                    )
                })
                .collect()
        };
        let mut select_from = format!("SELECT {} FROM {}", select.join(", "), self.quoted_name());
        if let Some(a) = alias {
            select_from.push_str(&format!(" AS {}", quote_ident(a, d)));
        }
        let mut sql = select_from.clone();
        if let Some(p) = &predicate {
            sql.push_str(&format!(" WHERE {p}"));
        }
        if let Some(n) = limit {
            sql.push_str(&format!(" LIMIT {n}"));
        }
        RemoteQuery {
            source: self.source.name.clone(),
            dialect: d,
            sql,
            split: limit.is_none().then(|| SplitBase {
                schema: self.schema_name.clone(),
                table: self.table_name.clone(),
                select_from,
                predicate,
                key: self.split_key.clone(),
            }),
        }
    }
}

#[async_trait]
impl TableProvider for RemoteTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.arrow.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // Filters are pushed by Basin's pushdown rule, with the source's guards.
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
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let indexes: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.columns.len()).collect(),
        };
        let names: Vec<String> = indexes
            .iter()
            .map(|&i| self.columns[i].name.clone())
            .collect();
        let schema = Arc::new(self.arrow.project(&indexes)?);
        let query = self.scan_query(&names, None, None, limit);
        let renamed = Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| f.as_ref().clone().with_name(format!("c{i}")))
                .collect::<Vec<_>>(),
        ));
        let exec = plan_scan(query, renamed, state.config().target_partitions()).await?;
        // Give the columns their table names back.
        let exprs = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                (
                    Arc::new(datafusion::physical_expr::expressions::Column::new(
                        &format!("c{i}"),
                        i,
                    )) as Arc<dyn datafusion::physical_expr::PhysicalExpr>,
                    f.name().clone(),
                )
            })
            .collect::<Vec<_>>();
        Ok(Arc::new(
            datafusion::physical_plan::projection::ProjectionExec::try_new(exprs, exec)?,
        ))
    }
}

fn query_error(source: &RemoteSource, what: &str) -> impl Fn(sqlx::Error) -> DataFusionError {
    move |e| source.error(what, e)
}

async fn list_schemas(source: &RemoteSource) -> Result<Vec<String>> {
    match source.pool() {
        Pool::Postgres(pool) => {
            let rows: Vec<(String,)> = sqlx::query_as(
                "SELECT nspname::text FROM pg_namespace \
                 WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') \
                   AND nspname NOT LIKE 'pg\\_temp\\_%' AND nspname NOT LIKE 'pg\\_toast\\_temp\\_%' \
                   AND has_schema_privilege(oid, 'USAGE') ORDER BY 1",
            )
            .fetch_all(pool)
            .await
            .map_err(query_error(source, "cannot list schemas"))?;
            Ok(rows.into_iter().map(|r| r.0).collect())
        }
        Pool::MySql(pool) => {
            let rows = mysql_text_rows(
                pool,
                "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME NOT IN \
                 ('information_schema', 'mysql', 'performance_schema', 'sys') ORDER BY 1",
            )
            .await
            .map_err(query_error(source, "cannot list schemas"))?;
            Ok(rows.into_iter().filter_map(|mut r| r.remove(0)).collect())
        }
    }
}

async fn list_tables(source: &RemoteSource, schema: &str) -> Result<Vec<String>> {
    match source.pool() {
        Pool::Postgres(pool) => {
            let rows: Vec<(String,)> = sqlx::query_as(
                "SELECT c.relname::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relkind IN ('r', 'v', 'm', 'p', 'f') \
                   AND NOT c.relispartition ORDER BY 1",
            )
            .bind(schema)
            .fetch_all(pool)
            .await
            .map_err(query_error(source, "cannot list tables"))?;
            Ok(rows.into_iter().map(|r| r.0).collect())
        }
        Pool::MySql(pool) => {
            let sql = format!(
                "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} ORDER BY 1",
                quote_literal(schema, Dialect::MySql)?
            );
            let rows = mysql_text_rows(pool, &sql)
                .await
                .map_err(query_error(source, "cannot list tables"))?;
            Ok(rows.into_iter().filter_map(|mut r| r.remove(0)).collect())
        }
    }
}

type Described = Option<(Vec<RemoteColumn>, Option<String>)>;

async fn describe_table(source: &RemoteSource, schema: &str, table: &str) -> Result<Described> {
    let mut columns = vec![];
    let mut key = None;
    match source.pool() {
        Pool::Postgres(pool) => {
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
            .map_err(query_error(source, "cannot describe table"))?;
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
                });
            }
        }
        Pool::MySql(pool) => {
            let sql = format!(
                "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, \
                   IS_NULLABLE, COLLATION_NAME, COLUMN_KEY \
                 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {} \
                 ORDER BY ORDINAL_POSITION",
                quote_literal(schema, Dialect::MySql)?,
                quote_literal(table, Dialect::MySql)?
            );
            let rows = mysql_text_rows(pool, &sql)
                .await
                .map_err(query_error(source, "cannot describe table"))?;
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
                });
            }
            if let [(name, true)] = keys.as_slice() {
                key = Some(name.clone());
            }
        }
    }
    Ok((!columns.is_empty()).then_some((columns, key)))
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
