//! An Iceberg catalog (REST or SQL) as a DataFusion catalog: namespaces are schemas.
//!
//! DataFusion asks for schema and table names synchronously, while Iceberg catalogs are
//! async clients. Every catalog call therefore runs on a small runtime owned by the catalog,
//! so a synchronous caller can wait for it without blocking the runtime it runs on.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use basin_core::{BasinConfig, IcebergCatalogConfig, IcebergCatalogKind};
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableProvider};
use datafusion::error::{DataFusionError, Result};
use iceberg::io::StorageFactory;
use iceberg::table::Table;
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableIdent};
use iceberg_catalog_rest::RestCatalogBuilder;
use iceberg_catalog_sql::SqlCatalogBuilder;

use super::commit::Committer;
use super::metadata_tables::MetadataTableKind;
use super::storage::BasinStorageFactory;
use super::table::{IcebergTableProvider, TableVersion};

/// Default bytes of data files per scan partition.
pub const DEFAULT_SPLIT_SIZE: u64 = 128 * 1024 * 1024;
/// Default target size of written data files (Iceberg's `write.target-file-size-bytes`).
pub const DEFAULT_TARGET_FILE_SIZE: u64 = 512 * 1024 * 1024;

/// Per-catalog options that shape scans and writes.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct IcebergOptions {
    pub split_size: u64,
    pub target_file_size: u64,
}

impl Default for IcebergOptions {
    fn default() -> Self {
        Self {
            split_size: DEFAULT_SPLIT_SIZE,
            target_file_size: DEFAULT_TARGET_FILE_SIZE,
        }
    }
}

/// A tokio runtime that is shut down without blocking when the catalog is dropped (which
/// may happen inside another runtime).
#[derive(Debug)]
struct CatalogRuntime(Option<tokio::runtime::Runtime>);

impl CatalogRuntime {
    fn new(name: &str) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("iceberg-{name}"))
            .enable_all()
            .build()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(Self(Some(runtime)))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("catalog runtime is alive").handle()
    }
}

impl Drop for CatalogRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// A connected Iceberg catalog.
#[derive(Debug)]
pub struct IcebergCatalog {
    name: String,
    catalog: Arc<dyn Catalog>,
    runtime: CatalogRuntime,
    options: IcebergOptions,
    /// Commits iceberg-rust cannot make (super::commit).
    committer: Committer,
}

impl IcebergCatalog {
    /// Connects to the catalog `name` described by `config`. The embedded SQLite catalog and
    /// its warehouse are created under `[server] data_dir` when missing.
    pub fn connect(name: &str, config: &IcebergCatalogConfig, basin: &BasinConfig) -> Result<Self> {
        super::stats::set_cache_bytes(basin.server.metadata_cache_size.0);
        let runtime = CatalogRuntime::new(name)?;
        let props = catalog_properties(name, config, basin)?;
        let kind = config.kind;
        let committer = Committer::new(
            name,
            kind == IcebergCatalogKind::Rest,
            &props,
            rest_client().map_err(|e| DataFusionError::Plan(error_text(&e)))?,
        );
        let catalog_name = name.to_string();
        let handle = runtime.handle().clone();
        let catalog: Arc<dyn Catalog> = wait(&handle, async move {
            let factory: Arc<dyn StorageFactory> = Arc::new(BasinStorageFactory);
            let runtime = iceberg::Runtime::try_current()?;
            let catalog: Arc<dyn Catalog> = match kind {
                IcebergCatalogKind::Rest => Arc::new(
                    RestCatalogBuilder::default()
                        .with_client(rest_client()?)
                        .with_storage_factory(factory)
                        .with_runtime(runtime)
                        .load(catalog_name, props)
                        .await?,
                ),
                IcebergCatalogKind::Sql => {
                    sqlx::any::install_default_drivers();
                    Arc::new(
                        SqlCatalogBuilder::default()
                            .with_storage_factory(factory)
                            .with_runtime(runtime)
                            .load(catalog_name, props)
                            .await?,
                    )
                }
            };
            Ok::<_, iceberg::Error>(catalog)
        })
        .map_err(|e| {
            DataFusionError::Plan(format!(
                "cannot connect to Iceberg catalog `{name}`: {}",
                error_text(&e)
            ))
        })?;
        Ok(Self {
            name: name.to_string(),
            catalog,
            committer,
            runtime,
            options: IcebergOptions {
                split_size: config.split_size_bytes.unwrap_or(DEFAULT_SPLIT_SIZE).max(1),
                target_file_size: config
                    .target_file_size_bytes
                    .unwrap_or(DEFAULT_TARGET_FILE_SIZE)
                    .max(1024),
            },
        })
    }

    pub(crate) fn committer(&self) -> &Committer {
        &self.committer
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn options(&self) -> IcebergOptions {
        self.options
    }

    /// The iceberg-rust catalog client.
    pub fn client(&self) -> Arc<dyn Catalog> {
        self.catalog.clone()
    }

    /// Runs `f` against the catalog on the catalog's runtime, from async code.
    pub async fn call<T, F, Fut>(&self, f: F) -> iceberg::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn Catalog>) -> Fut,
        Fut: Future<Output = iceberg::Result<T>> + Send + 'static,
    {
        let fut = f(self.catalog.clone());
        match self.runtime.handle().spawn(fut).await {
            Ok(result) => result,
            Err(e) => Err(iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                format!("catalog call failed: {e}"),
            )),
        }
    }

    /// Runs `f` against the catalog and waits for it, from synchronous code.
    pub fn call_blocking<T, F, Fut>(&self, f: F) -> iceberg::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn Catalog>) -> Fut,
        Fut: Future<Output = iceberg::Result<T>> + Send + 'static,
    {
        wait(self.runtime.handle(), f(self.catalog.clone()))
    }

    /// Loads a table, with an error that names it.
    pub async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        let id = ident.clone();
        self.call(move |c| async move { c.load_table(&id).await })
            .await
            .map_err(|e| self.table_error(ident, "cannot load", &e))
    }

    /// `catalog.namespace.table`, for messages.
    pub fn qualified(&self, ident: &TableIdent) -> String {
        format!("{}.{}.{}", self.name, ident.namespace.join("."), ident.name)
    }

    /// A DataFusion error for a failed operation on a table.
    pub fn table_error(
        &self,
        ident: &TableIdent,
        action: &str,
        e: &iceberg::Error,
    ) -> DataFusionError {
        let table = self.qualified(ident);
        match e.kind() {
            iceberg::ErrorKind::TableNotFound => {
                DataFusionError::Plan(format!("table `{table}` does not exist"))
            }
            iceberg::ErrorKind::NamespaceNotFound => DataFusionError::Plan(format!(
                "schema `{}.{}` does not exist (table `{table}`)",
                self.name,
                ident.namespace.join(".")
            )),
            _ => DataFusionError::Execution(format!("{action} table `{table}`: {}", error_text(e))),
        }
    }
}

/// The REST catalog's HTTP client: a catalog that stops answering fails the statement after a
/// while instead of hanging it (reqwest's default has no timeout).
fn rest_client() -> iceberg::Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .map_err(|e| {
            iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                format!("cannot build the REST catalog's HTTP client: {e}"),
            )
        })
}

/// Waits for `fut` on `handle` from any thread, also from inside another runtime.
fn wait<T, Fut>(handle: &tokio::runtime::Handle, fut: Fut) -> iceberg::Result<T>
where
    T: Send + 'static,
    Fut: Future<Output = iceberg::Result<T>> + Send + 'static,
{
    let task = handle.spawn(fut);
    let (tx, rx) = std::sync::mpsc::channel();
    handle.spawn(async move {
        let _ = tx.send(task.await);
    });
    match rx.recv() {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(iceberg::Error::new(
            iceberg::ErrorKind::Unexpected,
            format!("catalog call failed: {e}"),
        )),
        Err(_) => Err(iceberg::Error::new(
            iceberg::ErrorKind::Unexpected,
            "the catalog runtime stopped",
        )),
    }
}

/// An iceberg error as one line: its message and its causes (iceberg's Display spans lines
/// and repeats context).
pub fn error_text(e: &iceberg::Error) -> String {
    let mut text = e.message().to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text.replace('\n', " ")
}

/// The properties handed to iceberg-rust's catalog builders (and from there to FileIO).
fn catalog_properties(
    name: &str,
    config: &IcebergCatalogConfig,
    basin: &BasinConfig,
) -> Result<HashMap<String, String>> {
    let mut props = HashMap::new();
    // Object storage from [storage.s3]; catalog properties override it.
    if let Some(s3) = &basin.storage.s3 {
        if let Some(v) = &s3.endpoint {
            props.insert("s3.endpoint".to_string(), v.clone());
        }
        if let Some(v) = &s3.region {
            props.insert("s3.region".to_string(), v.clone());
        }
        if let Some(v) = &s3.access_key_id {
            props.insert("s3.access-key-id".to_string(), v.clone());
        }
        if let Some(v) = &s3.secret_access_key {
            props.insert("s3.secret-access-key".to_string(), v.expose().to_string());
        }
        if let Some(v) = &s3.session_token {
            props.insert("s3.session-token".to_string(), v.expose().to_string());
        }
        props.insert(
            "s3.path-style-access".to_string(),
            s3.path_style.to_string(),
        );
    }
    match config.kind {
        IcebergCatalogKind::Rest => {
            props.insert(
                "uri".to_string(),
                config
                    .uri
                    .clone()
                    .unwrap_or_default()
                    .trim_end_matches('/')
                    .to_string(),
            );
            if let Some(w) = &config.warehouse {
                props.insert("warehouse".to_string(), w.clone());
            }
            if let Some(c) = &config.credential {
                props.insert("credential".to_string(), c.expose().to_string());
            }
            if let Some(t) = &config.token {
                props.insert("token".to_string(), t.expose().to_string());
            }
            if let Some(u) = &config.oauth2_server_uri {
                props.insert("oauth2-server-uri".to_string(), u.clone());
            }
            if let Some(s) = &config.scope {
                props.insert("scope".to_string(), s.clone());
            }
            if config.vended_credentials {
                props.insert(
                    "header.X-Iceberg-Access-Delegation".to_string(),
                    "vended-credentials".to_string(),
                );
            }
            for (k, v) in &config.headers {
                props.insert(format!("header.{k}"), v.expose().to_string());
            }
        }
        IcebergCatalogKind::Sql => {
            let (uri, warehouse) = match (&config.uri, &config.warehouse) {
                (Some(u), Some(w)) => (u.clone(), w.clone()),
                (uri, warehouse) => {
                    let dir = basin.server.data_dir.join(name);
                    std::fs::create_dir_all(dir.join("warehouse")).map_err(|e| {
                        DataFusionError::Plan(format!(
                            "catalog `{name}`: cannot create {}: {e}; check [server] data_dir",
                            dir.display()
                        ))
                    })?;
                    let dir = absolute(&dir)?;
                    (
                        uri.clone().unwrap_or_else(|| {
                            format!("sqlite://{}?mode=rwc", dir.join("catalog.db").display())
                        }),
                        warehouse.clone().unwrap_or_else(|| {
                            format!("file://{}", dir.join("warehouse").display())
                        }),
                    )
                }
            };
            if uri.starts_with("postgres") {
                props.insert("sql_bind_style".to_string(), "DollarNumeric".to_string());
            } else {
                props.insert("sql_bind_style".to_string(), "QMark".to_string());
            }
            props.insert("uri".to_string(), uri);
            props.insert("warehouse".to_string(), warehouse);
        }
    }
    for (k, v) in &config.properties {
        props.insert(k.clone(), v.expose().to_string());
    }
    Ok(props)
}

fn absolute(path: &Path) -> Result<std::path::PathBuf> {
    std::fs::canonicalize(path)
        .map_err(|e| DataFusionError::Plan(format!("cannot resolve {}: {e}", path.display())))
}

/// The DataFusion catalog over an Iceberg catalog.
#[derive(Debug)]
pub struct IcebergCatalogProvider {
    catalog: Arc<IcebergCatalog>,
}

impl IcebergCatalogProvider {
    pub fn new(catalog: Arc<IcebergCatalog>) -> Self {
        Self { catalog }
    }

    pub fn catalog(&self) -> &Arc<IcebergCatalog> {
        &self.catalog
    }
}

impl CatalogProvider for IcebergCatalogProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        match self
            .catalog
            .call_blocking(|c| async move { c.list_namespaces(None).await })
        {
            Ok(namespaces) => {
                let mut names: Vec<String> = namespaces.iter().map(|n| n.join(".")).collect();
                names.sort();
                names
            }
            Err(e) => {
                tracing::warn!(catalog = %self.catalog.name, error = %error_text(&e), "cannot list namespaces");
                Vec::new()
            }
        }
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let namespace = namespace_ident(name).ok()?;
        let ns = namespace.clone();
        match self
            .catalog
            .call_blocking(move |c| async move { c.namespace_exists(&ns).await })
        {
            Ok(true) => Some(Arc::new(IcebergSchemaProvider {
                catalog: self.catalog.clone(),
                namespace,
            })),
            Ok(false) => None,
            Err(e) => {
                tracing::warn!(catalog = %self.catalog.name, schema = name, error = %error_text(&e), "cannot look up namespace");
                None
            }
        }
    }

    fn register_schema(
        &self,
        name: &str,
        _schema: Arc<dyn SchemaProvider>,
    ) -> Result<Option<Arc<dyn SchemaProvider>>> {
        let namespace = namespace_ident(name)?;
        let ns = namespace.clone();
        self.catalog
            .call_blocking(move |c| async move {
                c.create_namespace(&ns, HashMap::new()).await.map(|_| ())
            })
            .map_err(|e| {
                DataFusionError::Execution(format!(
                    "cannot create schema `{}.{name}`: {}",
                    self.catalog.name,
                    error_text(&e)
                ))
            })?;
        Ok(None)
    }

    fn deregister_schema(
        &self,
        name: &str,
        cascade: bool,
    ) -> Result<Option<Arc<dyn SchemaProvider>>> {
        let Some(schema) = self.schema(name) else {
            return Ok(None);
        };
        let namespace = namespace_ident(name)?;
        let ns = namespace.clone();
        let catalog_name = self.catalog.name.clone();
        self.catalog
            .call_blocking(move |c| async move {
                let tables = c.list_tables(&ns).await?;
                if !tables.is_empty() && !cascade {
                    return Err(iceberg::Error::new(
                        iceberg::ErrorKind::DataInvalid,
                        format!(
                            "schema `{catalog_name}.{}` is not empty ({} tables); drop its \
                             tables first or use DROP SCHEMA ... CASCADE",
                            ns.join("."),
                            tables.len()
                        ),
                    ));
                }
                for t in tables {
                    c.drop_table(&t).await?;
                }
                c.drop_namespace(&ns).await
            })
            .map_err(|e| {
                DataFusionError::Execution(format!(
                    "cannot drop schema `{}.{name}`: {}",
                    self.catalog.name,
                    error_text(&e)
                ))
            })?;
        Ok(Some(schema))
    }
}

/// Parses a schema name into a namespace (`a.b` is a nested namespace).
pub fn namespace_ident(name: &str) -> Result<NamespaceIdent> {
    NamespaceIdent::from_strs(name.split('.'))
        .map_err(|e| DataFusionError::Plan(format!("bad schema name `{name}`: {e}")))
}

/// One namespace as a DataFusion schema.
#[derive(Debug)]
pub struct IcebergSchemaProvider {
    catalog: Arc<IcebergCatalog>,
    namespace: NamespaceIdent,
}

/// What a table name asks for: a table, maybe at a version, or one of its metadata tables.
#[derive(Debug, Clone, PartialEq)]
pub struct TableName {
    pub table: String,
    pub version: Option<TableVersion>,
    pub metadata: Option<MetadataTableKind>,
}

/// The marker that separates a table name from the version Basin's SQL front end moved into
/// it (`t FOR VERSION AS OF 42` becomes `t__basin_version_s42`). Only lowercase letters,
/// digits and `_`, so the name survives plan serialization unquoted.
pub const VERSION_MARKER: &str = "__basin_version_";

impl TableName {
    pub fn parse(name: &str) -> Result<Self> {
        let (rest, version) = match name.split_once(VERSION_MARKER) {
            Some((t, v)) => (t, Some(TableVersion::decode(v)?)),
            None => (name, None),
        };
        let (table, metadata) = match rest.rsplit_once('$') {
            Some((t, kind)) => match MetadataTableKind::parse(kind) {
                Some(k) => (t.to_string(), Some(k)),
                None => {
                    return Err(DataFusionError::Plan(format!(
                        "`{rest}`: unknown metadata table `${kind}`; Basin has {}",
                        MetadataTableKind::names()
                    )));
                }
            },
            None => (rest.to_string(), None),
        };
        Ok(Self {
            table,
            version,
            metadata,
        })
    }
}

impl IcebergSchemaProvider {
    fn ident(&self, table: &str) -> TableIdent {
        TableIdent::new(self.namespace.clone(), table.to_string())
    }
}

#[async_trait]
impl SchemaProvider for IcebergSchemaProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        let ns = self.namespace.clone();
        match self
            .catalog
            .call_blocking(move |c| async move { c.list_tables(&ns).await })
        {
            Ok(tables) => {
                let mut names: Vec<String> = tables.into_iter().map(|t| t.name).collect();
                names.sort();
                names
            }
            Err(e) => {
                tracing::warn!(catalog = %self.catalog.name, schema = %self.namespace.join("."), error = %error_text(&e), "cannot list tables");
                Vec::new()
            }
        }
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let parsed = TableName::parse(name)?;
        let ident = self.ident(&parsed.table);
        let id = ident.clone();
        let table = match self
            .catalog
            .call(move |c| async move { c.load_table(&id).await })
            .await
        {
            Ok(t) => t,
            Err(e) if e.kind() == iceberg::ErrorKind::TableNotFound => return Ok(None),
            Err(e) => return Err(self.catalog.table_error(&ident, "cannot load", &e)),
        };
        if let Some(kind) = parsed.metadata {
            return Ok(Some(
                super::metadata_tables::provider(kind, &self.catalog.qualified(&ident), &table)
                    .await?,
            ));
        }
        let provider =
            IcebergTableProvider::new(self.catalog.clone(), table, parsed.version.as_ref())?;
        Ok(Some(Arc::new(provider)))
    }

    fn table_exist(&self, name: &str) -> bool {
        let Ok(parsed) = TableName::parse(name) else {
            return false;
        };
        let ident = self.ident(&parsed.table);
        self.catalog
            .call_blocking(move |c| async move { c.table_exists(&ident).await })
            .unwrap_or(false)
    }

    fn register_table(
        &self,
        name: String,
        _table: Arc<dyn TableProvider>,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        Err(DataFusionError::Plan(format!(
            "cannot register `{}` as an Iceberg table: use CREATE TABLE {}.{}.{name} (...) \
             or CREATE TABLE ... AS SELECT",
            name,
            self.catalog.name,
            self.namespace.join(".")
        )))
    }

    fn deregister_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let ident = self.ident(name);
        let id = ident.clone();
        let existed = self
            .catalog
            .call_blocking(move |c| async move {
                if !c.table_exists(&id).await? {
                    return Ok(false);
                }
                c.drop_table(&id).await.map(|_| true)
            })
            .map_err(|e| self.catalog.table_error(&ident, "cannot drop", &e))?;
        if existed {
            Ok(Some(Arc::new(
                datafusion::datasource::empty::EmptyTable::new(Arc::new(
                    datafusion::arrow::datatypes::Schema::empty(),
                )),
            )))
        } else {
            Ok(None)
        }
    }
}
