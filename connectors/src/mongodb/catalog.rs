//! Databases as schemas, collections as tables, columns sampled or declared; cached for
//! `metadata_ttl_secs`.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bson::{Document, doc};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::catalog::{CatalogProvider, SchemaProvider, Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use futures::TryStreamExt;
use mongodb::bson::RawDocumentBuf;

use super::MongoSource;
use super::exec::{MongoQuery, plan_scan};
use super::schema::{self, MongoColumn};
use crate::remote::catalog::resolve_name;

type Cached<T> = Mutex<Option<(Instant, T)>>;

/// Most bytes of sampled documents held to find a collection's columns.
const SAMPLE_BYTES: usize = 64 << 20;

/// Databases MongoDB keeps for itself.
const SYSTEM_DATABASES: &[&str] = &["admin", "config", "local"];

/// A MongoDB source as a DataFusion catalog: its databases.
#[derive(Debug)]
pub struct MongoCatalogProvider {
    source: Arc<MongoSource>,
    databases: Cached<Vec<String>>,
}

impl MongoCatalogProvider {
    pub fn new(source: Arc<MongoSource>) -> Self {
        Self {
            source,
            databases: Mutex::new(None),
        }
    }

    fn database_list(&self) -> Result<Vec<String>> {
        if let Ok(guard) = self.databases.lock()
            && let Some((at, names)) = guard.as_ref()
            && at.elapsed() < self.source.metadata_ttl()
        {
            return Ok(names.clone());
        }
        let source = self.source.clone();
        let names = self.source.call_blocking(async move {
            let client = source.client().await?;
            let mut names = client
                .list_database_names()
                .await
                .map_err(|e| source.error("listing databases", e))?;
            names.retain(|n| !SYSTEM_DATABASES.contains(&n.as_str()));
            if let Some(only) = &source.config.databases {
                names.retain(|n| only.contains(n));
            }
            names.sort();
            Ok(names)
        })?;
        if let Ok(mut guard) = self.databases.lock() {
            *guard = Some((Instant::now(), names.clone()));
        }
        Ok(names)
    }
}

impl CatalogProvider for MongoCatalogProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        self.database_list().unwrap_or_else(|e| {
            tracing::warn!(source = %self.source.name, "cannot list databases: {e}");
            vec![]
        })
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let provider = |database: String, failed: Option<String>| {
            Some(Arc::new(MongoSchemaProvider {
                source: self.source.clone(),
                database,
                collections: Mutex::new(None),
                tables: Mutex::new(HashMap::new()),
                failed,
            }) as Arc<dyn SchemaProvider>)
        };
        match self.database_list() {
            Ok(names) => provider(resolve_name(&names, name)?, None),
            Err(e) => provider(
                name.to_string(),
                Some(match e {
                    DataFusionError::External(e) => e.to_string(),
                    other => other.to_string(),
                }),
            ),
        }
    }
}

/// One database of a source.
#[derive(Debug)]
pub struct MongoSchemaProvider {
    source: Arc<MongoSource>,
    database: String,
    collections: Cached<Vec<String>>,
    tables: Mutex<HashMap<String, (Instant, Arc<MongoTable>)>>,
    /// Why the source could not list its databases: what a table lookup answers.
    failed: Option<String>,
}

impl MongoSchemaProvider {
    fn collection_list(&self) -> Result<Vec<String>> {
        if let Ok(guard) = self.collections.lock()
            && let Some((at, names)) = guard.as_ref()
            && at.elapsed() < self.source.metadata_ttl()
        {
            return Ok(names.clone());
        }
        let source = self.source.clone();
        let database = self.database.clone();
        let names = self.source.call_blocking(async move {
            let client = source.client().await?;
            let mut names = client
                .database(&database)
                .list_collection_names()
                .await
                .map_err(|e| source.error(&format!("listing collections of {database}"), e))?;
            names.retain(|n| !n.starts_with("system."));
            names.sort();
            Ok(names)
        })?;
        if let Ok(mut guard) = self.collections.lock() {
            *guard = Some((Instant::now(), names.clone()));
        }
        Ok(names)
    }
}

#[async_trait]
impl SchemaProvider for MongoSchemaProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.collection_list().unwrap_or_else(|e| {
            tracing::warn!(source = %self.source.name, "cannot list collections: {e}");
            vec![]
        })
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if let Some(failed) = &self.failed {
            return Err(DataFusionError::Plan(failed.clone()));
        }
        if let Ok(tables) = self.tables.lock()
            && let Some((at, t)) = tables.get(name)
            && at.elapsed() < self.source.metadata_ttl()
        {
            return Ok(Some(t.clone()));
        }
        let Some(real) = resolve_name(&self.collection_list()?, name) else {
            return Ok(None);
        };
        let source = self.source.clone();
        let (database, collection) = (self.database.clone(), real.clone());
        let columns = self
            .source
            .call(async move { describe(&source, &database, &collection).await })
            .await?;
        let table = Arc::new(MongoTable::new(
            self.source.clone(),
            &self.database,
            &real,
            columns,
        ));
        if let Ok(mut tables) = self.tables.lock() {
            tables.insert(name.to_string(), (Instant::now(), table.clone()));
        }
        Ok(Some(table))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.collection_list()
            .map(|names| resolve_name(&names, name).is_some())
            .unwrap_or(false)
    }
}

/// The columns of a collection: declared, or found in a sample of its documents.
async fn describe(
    source: &Arc<MongoSource>,
    database: &str,
    collection: &str,
) -> Result<Vec<MongoColumn>> {
    if let Some(columns) = source.declared(database, collection) {
        return Ok(columns.clone());
    }
    let client = source.client().await?;
    let what = format!("sampling {database}.{collection}");
    let mut cursor = client
        .database(database)
        .collection::<Document>(collection)
        .aggregate([doc! { "$sample": { "size": source.sample_size() as i64 } }])
        .with_type::<RawDocumentBuf>()
        .await
        .map_err(|e| source.error(&what, e))?;
    // At most SAMPLE_BYTES of documents are held (one document may be 16 MiB).
    let mut docs: Vec<RawDocumentBuf> = vec![];
    let mut bytes = 0usize;
    while bytes < SAMPLE_BYTES
        && let Some(doc) = cursor
            .try_next()
            .await
            .map_err(|e| source.error(&what, e))?
    {
        bytes += doc.as_bytes().len();
        docs.push(doc);
    }
    let (columns, mixed) = schema::infer(docs.iter().map(|d| d.as_ref()));
    if !mixed.is_empty() {
        tracing::warn!(
            source = %source.name,
            "{database}.{collection}: fields {} hold values of several types in the sample; \
             they read as text (extended JSON). Declare them in \
             [catalogs.{}.collections.\"{database}.{collection}\"] to choose a type",
            mixed.join(", "),
            source.name
        );
    }
    if columns.is_empty() {
        // An empty collection: only `_id` is known to exist.
        return Ok(vec![MongoColumn {
            name: "_id".into(),
            data_type: datafusion::arrow::datatypes::DataType::Utf8,
            repr: schema::Repr::Json,
        }]);
    }
    Ok(columns)
}

/// A collection as a table.
#[derive(Debug, Clone)]
pub struct MongoTable {
    pub source: Arc<MongoSource>,
    pub database: String,
    pub collection: String,
    pub columns: Vec<MongoColumn>,
    arrow: SchemaRef,
}

impl MongoTable {
    pub fn new(
        source: Arc<MongoSource>,
        database: &str,
        collection: &str,
        columns: Vec<MongoColumn>,
    ) -> Self {
        let arrow = Arc::new(Schema::new(
            columns
                .iter()
                .map(|c| Field::new(&c.name, c.data_type.clone(), true))
                .collect::<Vec<_>>(),
        ));
        Self {
            source,
            database: database.to_string(),
            collection: collection.to_string(),
            columns,
            arrow,
        }
    }

    /// A plain scan of `columns` (indexes), as a query.
    pub fn scan_query(
        &self,
        columns: &[usize],
        stages: Vec<Document>,
        splittable: bool,
    ) -> MongoQuery {
        let mut stages = stages;
        let fields: Vec<String> = columns
            .iter()
            .map(|&i| self.columns[i].name.clone())
            .collect();
        if let Some(project) = projection(&fields) {
            stages.push(doc! { "$project": project });
        }
        MongoQuery {
            source: self.source.name.clone(),
            database: self.database.clone(),
            collection: self.collection.clone(),
            pipeline: super::exec::encode_pipeline(&stages),
            reprs: columns.iter().map(|&i| self.columns[i].repr).collect(),
            fields,
            splittable,
            empty_row: None,
        }
    }
}

/// The `$project` that keeps only `fields` (`None` when one of them cannot be named in a
/// projection: the whole documents are read and the fields picked in Basin).
pub fn projection(fields: &[String]) -> Option<Document> {
    if fields.is_empty() {
        // Nothing needed but the number of documents: keep the smallest field.
        return Some(doc! { "_id": 1 });
    }
    if !fields.iter().all(|f| super::safe_field(f)) {
        return None;
    }
    let mut project = Document::new();
    if !fields.iter().any(|f| f == "_id") {
        project.insert("_id", 0);
    }
    for f in fields {
        project.insert(f.clone(), 1);
    }
    Some(project)
}

#[async_trait]
impl TableProvider for MongoTable {
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
        // The pushdown rule moves filters into the pipeline where that is exact.
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
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let indexes: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.columns.len()).collect(),
        };
        let stages = limit
            .map(|n| vec![doc! { "$limit": n as i64 }])
            .unwrap_or_default();
        let query = self.scan_query(&indexes, stages, limit.is_none());
        let schema = Arc::new(self.arrow.project(&indexes)?);
        plan_scan(query, schema).await
    }
}
