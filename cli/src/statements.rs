//! Running SQL text (one or many statements) on a session.

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;

/// The result of one statement.
#[derive(Debug)]
pub struct StatementResult {
    pub sql: String,
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

/// Runs every statement in `sql`, in order, stopping at the first error.
pub async fn run_sql(
    ctx: &SessionContext,
    sql: &str,
    on_result: &mut (dyn FnMut(StatementResult) -> Result<()> + Send),
) -> Result<()> {
    // A lone `USE` (which sqlparser may not parse for every name DataFusion takes); a `USE`
    // followed by other statements is split below like any other script.
    let lone = !sql.trim().trim_end_matches(';').contains(';');
    if lone
        && basin_scheduler::frontend::try_use_statement(ctx, sql)
            .transpose()?
            .is_some()
    {
        return Ok(());
    }
    let statements = basin_scheduler::sql::parse(sql)?;
    if statements.is_empty() {
        return Err(DataFusionError::Plan("no SQL statement given".to_string()));
    }
    for statement in statements {
        let text = statement.to_string();
        if let Some(done) = basin_scheduler::frontend::try_use_statement(ctx, &text) {
            done?;
            continue;
        }
        let plan = basin_scheduler::sql::plan(ctx, statement).await?;
        let df = ctx.execute_logical_plan(plan).await?;
        let schema = df.schema().inner().clone();
        let batches = df.collect().await?;
        on_result(StatementResult {
            sql: text,
            schema,
            batches,
        })?;
    }
    Ok(())
}
