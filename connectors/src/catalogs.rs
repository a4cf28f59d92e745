//! Turns `basin.toml` into what a DataFusion session needs: catalogs, table functions and a
//! runtime whose object store registry knows `[storage]`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use basin_core::{BasinConfig, CatalogConfig, IcebergCatalogConfig};
use datafusion::error::Result;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::prelude::SessionContext;

use crate::files::{BasinObjectStoreRegistry, FileKind, ReadFilesFunction};
use crate::iceberg::{IcebergCatalog, IcebergCatalogProvider};
use crate::remote::{RemoteCatalogProvider, register_sources, source};
use crate::tpch::{DEFAULT_ROWS_PER_PARTITION, TpchCatalogProvider, TpchOptions};

/// A runtime environment whose object stores come from the configuration.
pub fn runtime_env(config: &BasinConfig) -> Result<Arc<RuntimeEnv>> {
    // Every process that builds a runtime (front end, scheduler, executors) knows the
    // database sources by catalog name: plans name them, they never carry credentials.
    register_sources(config)?;
    crate::mongodb::register_sources(config)?;
    let registry = Arc::new(BasinObjectStoreRegistry::new(config.storage.s3.clone()));
    RuntimeEnvBuilder::new()
        .with_object_store_registry(registry)
        .build_arc()
}

/// Registers every configured catalog in `ctx`. `task_slots` is the cluster's parallelism,
/// used to split generated and remote tables.
pub fn register_catalogs(
    ctx: &SessionContext,
    config: &BasinConfig,
    task_slots: usize,
) -> Result<()> {
    for (name, catalog) in &config.catalogs {
        match catalog {
            CatalogConfig::Tpch(options) => {
                let options = TpchOptions {
                    rows_per_partition: options
                        .rows_per_partition
                        .unwrap_or(DEFAULT_ROWS_PER_PARTITION),
                    min_partitions: task_slots.max(1),
                };
                ctx.register_catalog(name, Arc::new(TpchCatalogProvider::new(options)));
            }
            CatalogConfig::Iceberg(options) => {
                let catalog = shared_iceberg_catalog(name, options, config)?;
                ctx.register_catalog(name, Arc::new(IcebergCatalogProvider::new(catalog)));
            }
            CatalogConfig::Postgres(_)
            | CatalogConfig::Mysql(_)
            | CatalogConfig::Sqlserver(_)
            | CatalogConfig::Oracle(_) => {
                register_sources(config)?;
                ctx.register_catalog(name, Arc::new(RemoteCatalogProvider::new(source(name)?)));
            }
            CatalogConfig::Mongodb(_) => {
                crate::mongodb::register_sources(config)?;
                ctx.register_catalog(
                    name,
                    Arc::new(crate::mongodb::MongoCatalogProvider::new(
                        crate::mongodb::source(name)?,
                    )),
                );
            }
        }
        tracing::debug!(catalog = %name, connector = catalog.connector(), "registered catalog");
    }
    Ok(())
}

/// Registers Basin's table functions (`read_parquet`, `read_csv`, `read_json`).
pub fn register_functions(ctx: &SessionContext) {
    for kind in [FileKind::Parquet, FileKind::Csv, FileKind::Json] {
        ctx.register_udtf(
            kind.function_name(),
            Arc::new(ReadFilesFunction::new(kind, ctx.runtime_env())),
        );
    }
}

/// Confines the session's file access to `sandbox`: its `read_*()` functions, and (checked
/// when statements are planned, by whoever reads the session's [`Sandbox`] extension)
/// external tables, `COPY … TO` and Iceberg locations.
pub fn sandbox_session(ctx: &SessionContext, sandbox: Arc<basin_core::sandbox::Sandbox>) {
    for kind in [FileKind::Parquet, FileKind::Csv, FileKind::Json] {
        ctx.register_udtf(
            kind.function_name(),
            Arc::new(ReadFilesFunction::new(kind, ctx.runtime_env()).sandboxed(sandbox.clone())),
        );
    }
    ctx.state_ref().write().config_mut().set_extension(sandbox);
}

/// Iceberg catalogs are connected once per process and shared by every session (each holds
/// a connection pool and a small runtime).
fn shared_iceberg_catalog(
    name: &str,
    options: &IcebergCatalogConfig,
    config: &BasinConfig,
) -> Result<Arc<IcebergCatalog>> {
    static CATALOGS: OnceLock<Mutex<HashMap<String, Arc<IcebergCatalog>>>> = OnceLock::new();
    let key = format!(
        "{name}\u{0}{options:?}\u{0}{}\u{0}{:?}",
        config.server.data_dir.display(),
        config.storage.s3
    );
    let mut catalogs = CATALOGS.get_or_init(Default::default).lock().map_err(|_| {
        datafusion::error::DataFusionError::Internal("catalog cache poisoned".into())
    })?;
    if let Some(c) = catalogs.get(&key) {
        return Ok(c.clone());
    }
    let catalog = Arc::new(IcebergCatalog::connect(name, options, config)?);
    catalogs.insert(key, catalog.clone());
    Ok(catalog)
}
