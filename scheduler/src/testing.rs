//! Helpers for the logical rules' tests.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;

/// The optimized plan of `sql` and its result's lines, sorted (none for no rows, so that an
/// empty result compares equal however it is printed).
pub(crate) async fn plan_and_rows(ctx: &SessionContext, sql: &str) -> (String, Vec<String>) {
    let df = ctx.sql(sql).await.unwrap();
    let plan = df
        .clone()
        .into_optimized_plan()
        .unwrap()
        .display_indent()
        .to_string();
    let batches: Vec<_> = df
        .collect()
        .await
        .unwrap()
        .into_iter()
        .filter(|b| b.num_rows() > 0)
        .collect();
    if batches.is_empty() {
        return (plan, Vec::new());
    }
    let text = pretty_format_batches(&batches).unwrap().to_string();
    let mut rows: Vec<String> = text.lines().map(str::to_string).collect();
    rows.sort();
    (plan, rows)
}
