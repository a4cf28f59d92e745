//! Table functions `read_parquet('…')`, `read_csv('…')` and `read_json('…')`.

use std::sync::Arc;

use basin_core::sandbox::Sandbox;
use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::json::JsonFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::Expr;

/// The file formats the table functions read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Parquet,
    Csv,
    Json,
}

impl FileKind {
    /// The SQL name of the table function.
    pub fn function_name(self) -> &'static str {
        match self {
            FileKind::Parquet => "read_parquet",
            FileKind::Csv => "read_csv",
            FileKind::Json => "read_json",
        }
    }

    fn format(self) -> (Arc<dyn FileFormat>, &'static str) {
        match self {
            FileKind::Parquet => (Arc::new(ParquetFormat::default()), ".parquet"),
            FileKind::Csv => (Arc::new(CsvFormat::default().with_has_header(true)), ".csv"),
            FileKind::Json => (Arc::new(JsonFormat::default()), ".json"),
        }
    }
}

/// `read_parquet('path')` and friends: a path, directory, glob or URL (file://, s3://).
#[derive(Debug)]
pub struct ReadFilesFunction {
    kind: FileKind,
    runtime: Arc<RuntimeEnv>,
    /// Where the session's user may read (none: anywhere the process can).
    sandbox: Option<Arc<Sandbox>>,
}

impl ReadFilesFunction {
    /// Creates the function; `runtime` provides the object stores used to find the files.
    pub fn new(kind: FileKind, runtime: Arc<RuntimeEnv>) -> Self {
        Self {
            kind,
            runtime,
            sandbox: None,
        }
    }

    /// The function, reading only inside `sandbox`.
    pub fn sandboxed(self, sandbox: Arc<Sandbox>) -> Self {
        Self {
            sandbox: Some(sandbox),
            ..self
        }
    }

    async fn open(&self, state: SessionState, path: String) -> Result<Arc<dyn TableProvider>> {
        let name = self.kind.function_name();
        let url = ListingTableUrl::parse(&path)
            .map_err(|e| DataFusionError::Plan(format!("{name}: bad location '{path}': {e}")))?;
        let (format, extension) = self.kind.format();
        // A single file is read whatever its extension; a directory only its data files.
        let is_dir = path.ends_with('/') || std::path::Path::new(&path).is_dir();
        let options =
            ListingOptions::new(format).with_file_extension(if is_dir { extension } else { "" });
        let config = ListingTableConfig::new(url)
            .with_listing_options(options)
            .infer_schema(&state)
            .await
            .map_err(|e| DataFusionError::Plan(format!("{name}('{path}'): {e}")))?;
        if config
            .file_schema
            .as_ref()
            .is_none_or(|s| s.fields().is_empty())
        {
            return Err(DataFusionError::Plan(format!(
                "{name}('{path}'): no readable files found there"
            )));
        }
        Ok(Arc::new(ListingTable::try_new(config)?))
    }
}

impl TableFunctionImpl for ReadFilesFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        let name = self.kind.function_name();
        let path = match args {
            [Expr::Literal(ScalarValue::Utf8(Some(p)) | ScalarValue::Utf8View(Some(p)), _)] => {
                p.clone()
            }
            _ => {
                return Err(DataFusionError::Plan(format!(
                    "{name} takes one string literal: the file, directory or glob to read, \
                     e.g. {name}('s3://bucket/data/')"
                )));
            }
        };
        // Checked before anything is read (the schema is inferred from the files).
        if let Some(sandbox) = &self.sandbox {
            sandbox.check(name, &path).map_err(DataFusionError::Plan)?;
        }
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_runtime_env(self.runtime.clone())
            .build();
        // Table functions are synchronous; listing files and reading footers are not.
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            DataFusionError::Internal(format!("{name} must be called inside a Tokio runtime"))
        })?;
        match handle.runtime_flavor() {
            tokio::runtime::RuntimeFlavor::CurrentThread => std::thread::scope(|s| {
                s.spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| DataFusionError::External(Box::new(e)))?
                        .block_on(self.open(state, path))
                })
                .join()
                .map_err(|_| DataFusionError::Internal(format!("{name} panicked")))?
            }),
            _ => tokio::task::block_in_place(|| handle.block_on(self.open(state, path))),
        }
    }
}
