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

use super::backend::Described;
use super::exec::{RemoteQuery, SplitBase, plan_scan};
use super::source::RemoteSource;
use super::types::RemoteColumn;

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
        let provider = |schema: String, failed: Option<String>| {
            Some(Arc::new(RemoteSchemaProvider {
                source: self.source.clone(),
                schema,
                tables: Mutex::new(None),
                columns: Mutex::new(HashMap::new()),
                failed,
            }) as Arc<dyn SchemaProvider>)
        };
        match self.schema_list() {
            Ok(names) => provider(resolve_name(&names, name)?, None),
            Err(e) => {
                // This call cannot fail: the table lookup that follows says what went wrong
                // (a refused login, say) instead of "table not found".
                tracing::warn!(source = %self.source.name, "cannot list schemas: {e}");
                provider(
                    name.to_string(),
                    Some(match e {
                        DataFusionError::External(e) => e.to_string(),
                        other => other.to_string(),
                    }),
                )
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
            .call(async move {
                if let Some(found) = describe_table(&source, &schema, &table).await? {
                    return Ok(Some((table, found)));
                }
                // Not under this spelling: the source's own, if one matches ignoring case.
                let names = list_tables(&source, &schema).await?;
                match resolve_name(&names, &table) {
                    Some(real) if real != table => Ok(describe_table(&source, &schema, &real)
                        .await?
                        .map(|found| (real, found))),
                    _ => Ok(None),
                }
            })
            .await?;
        let Some((real, (columns, key))) = found else {
            return Ok(None);
        };
        let table = Arc::new(RemoteTable::new(
            self.source.clone(),
            &self.schema,
            &real,
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
            .map(|t| resolve_name(&t, name).is_some())
            .unwrap_or(false)
    }
}

/// The source's own spelling of `name`: `name` itself if the source has it, else the one
/// name equal to it ignoring case — unquoted SQL names are folded to lower case, so
/// `ora.hr.employees` finds Oracle's `HR.EMPLOYEES` and `ms.dbo.orders` SQL Server's
/// `dbo.Orders`. Two such names (`Orders` and `ORDERS`) are ambiguous: neither is found, and
/// the query must quote the one it means.
pub fn resolve_name(names: &[String], name: &str) -> Option<String> {
    if names.iter().any(|n| n == name) {
        return Some(name.to_string());
    }
    let folded = name.to_lowercase();
    let mut matching = names.iter().filter(|n| n.to_lowercase() == folded);
    match (matching.next(), matching.next()) {
        (Some(only), None) => Some(only.clone()),
        _ => None,
    }
}

/// A table (or view) of a source.
#[derive(Debug, Clone)]
pub struct RemoteTable {
    pub source: Arc<RemoteSource>,
    pub schema_name: String,
    pub table_name: String,
    pub columns: Vec<RemoteColumn>,
    /// MySQL, SQL Server: an integer key column to split scans on.
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
        let d = self.source.sql();
        format!(
            "{}.{}",
            d.quote_ident(&self.schema_name),
            d.quote_ident(&self.table_name)
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
        let d = self.source.sql();
        let select: Vec<String> = if columns.is_empty() {
            vec![format!("1 AS {}", d.quote_ident("c0"))]
        } else {
            columns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    format!(
                        "{} AS {}",
                        d.quote_ident(c),
                        d.quote_ident(&format!("c{i}"))
                    )
                })
                .collect()
        };
        let mut from = self.quoted_name();
        if let Some(a) = alias {
            from.push_str(&d.table_alias(a));
        }
        let select = select.join(", ");
        let select_from = d.select(&select, &from, None, None);
        let sql = d.select(&select, &from, predicate.as_deref(), limit);
        RemoteQuery {
            source: self.source.name.clone(),
            dialect: self.source.dialect,
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

async fn list_schemas(source: &RemoteSource) -> Result<Vec<String>> {
    source.backend().list_schemas(source).await
}

async fn list_tables(source: &RemoteSource, schema: &str) -> Result<Vec<String>> {
    source.backend().list_tables(source, schema).await
}

async fn describe_table(source: &RemoteSource, schema: &str, table: &str) -> Result<Described> {
    source.backend().describe_table(source, schema, table).await
}

#[cfg(test)]
mod tests {
    use super::resolve_name;

    #[test]
    fn unquoted_names_find_the_sources_own_spelling() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let oracle = names(&["EMPLOYEES", "JOBS"]);
        assert_eq!(
            resolve_name(&oracle, "employees").as_deref(),
            Some("EMPLOYEES")
        );
        assert_eq!(
            resolve_name(&oracle, "EMPLOYEES").as_deref(),
            Some("EMPLOYEES")
        );
        let both = names(&["Orders", "ORDERS", "orders2"]);
        assert_eq!(resolve_name(&both, "orders"), None, "ambiguous");
        assert_eq!(resolve_name(&both, "Orders").as_deref(), Some("Orders"));
        assert_eq!(resolve_name(&both, "nothing"), None);
    }
}
