//! The sqllogictest database for DataFusion's own files: a Basin front-end session whose
//! results and errors read the way DataFusion's driver prints them.

use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use sqllogictest::DBOutput;

use super::format::{self, DataFusionColumnType};
use crate::engine::run_statements;

/// Errors print as DataFusion's driver prints them (`DataFusion error: ...`, no backtrace):
/// `statement error` / `query error` patterns in the files match that text.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("DataFusion error: {}", .0.strip_backtrace())]
    DataFusion(#[from] DataFusionError),
    #[error("Arrow error: {0}")]
    Arrow(#[from] ArrowError),
}

/// One connection of a file; every connection of a file shares the file's session, as in
/// DataFusion's driver.
pub struct UpstreamDb {
    ctx: SessionContext,
    /// The working tree's path, printed as `WORKSPACE_ROOT`.
    root: String,
    /// How long one statement may run.
    deadline: Duration,
}

impl UpstreamDb {
    pub fn new(ctx: SessionContext, root: String, deadline: Duration) -> Self {
        Self {
            ctx,
            root,
            deadline,
        }
    }
}

#[async_trait]
impl sqllogictest::AsyncDB for UpstreamDb {
    type Error = UpstreamError;
    type ColumnType = DataFusionColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DataFusionColumnType>, UpstreamError> {
        let Some(result) = run_statements(&self.ctx, sql, self.deadline).await? else {
            return Ok(DBOutput::StatementComplete(0));
        };
        let types = format::column_types(&result.schema);
        let rows = format::rows(&result.batches, &self.root)?;
        if rows.is_empty() && types.is_empty() {
            return Ok(DBOutput::StatementComplete(0));
        }
        Ok(DBOutput::Rows { types, rows })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "basin"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await;
    }
}
