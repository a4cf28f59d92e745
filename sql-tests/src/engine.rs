//! The sqllogictest database: a Basin front-end session, with results printed the way
//! DataFusion's sqllogictest driver prints them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use basin_cli::statements::{StatementResult, run_sql};
use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use sqllogictest::{ColumnType, DBOutput};

/// Column types in `query` headers: T text, I integer, R float/decimal, B boolean,
/// D date/time, ? anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BasinColumnType {
    Text,
    Integer,
    Float,
    Boolean,
    DateTime,
    Another,
}

impl ColumnType for BasinColumnType {
    fn from_char(value: char) -> Option<Self> {
        Some(match value {
            'T' => Self::Text,
            'I' => Self::Integer,
            'R' => Self::Float,
            'B' => Self::Boolean,
            'D' => Self::DateTime,
            _ => Self::Another,
        })
    }

    fn to_char(&self) -> char {
        match self {
            Self::Text => 'T',
            Self::Integer => 'I',
            Self::Float => 'R',
            Self::Boolean => 'B',
            Self::DateTime => 'D',
            Self::Another => '?',
        }
    }
}

/// Error type of the engine (DataFusion's, shown in full).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EngineError(#[from] pub DataFusionError);

/// One sqllogictest connection.
pub struct BasinDb {
    ctx: SessionContext,
}

impl BasinDb {
    pub fn new(ctx: SessionContext) -> Self {
        Self { ctx }
    }
}

/// Runs the statements of one record on a session and returns the last one's result, or
/// `None` when it returned no columns. A statement that hangs fails its record (and the run
/// goes on) instead of holding the whole suite until CI's own limit.
pub async fn run_statements(
    ctx: &SessionContext,
    sql: &str,
    limit: Duration,
) -> Result<Option<StatementResult>, DataFusionError> {
    let mut last = None;
    let mut keep = |r| {
        last = Some(r);
        Ok(())
    };
    match tokio::time::timeout(limit, run_sql(ctx, sql, &mut keep)).await {
        Ok(done) => done?,
        Err(_) => {
            return Err(DataFusionError::Execution(format!(
                "the statement did not finish within {limit:?}"
            )));
        }
    }
    Ok(last.filter(|r: &StatementResult| !r.schema.fields().is_empty()))
}

#[async_trait]
impl sqllogictest::AsyncDB for BasinDb {
    type Error = EngineError;
    type ColumnType = BasinColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<BasinColumnType>, EngineError> {
        let Some(result) = run_statements(&self.ctx, sql, statement_deadline()).await? else {
            return Ok(DBOutput::StatementComplete(0));
        };
        let types = column_types(&result.schema);
        let rows = format_rows(&result.batches)?;
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

fn column_types(schema: &Arc<Schema>) -> Vec<BasinColumnType> {
    schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            dt if dt.is_integer() => BasinColumnType::Integer,
            dt if is_fractional(dt) => BasinColumnType::Float,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => BasinColumnType::Text,
            DataType::Boolean => BasinColumnType::Boolean,
            DataType::Date32
            | DataType::Date64
            | DataType::Time32(_)
            | DataType::Time64(_)
            | DataType::Timestamp(_, _) => BasinColumnType::DateTime,
            _ => BasinColumnType::Another,
        })
        .collect()
}

/// Formats rows: NULL, `(empty)` for empty strings, numbers rounded to 12 decimals without
/// trailing zeros, everything else as Arrow displays it.
pub fn format_rows(batches: &[RecordBatch]) -> Result<Vec<Vec<String>>, DataFusionError> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = vec![];
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        for row in 0..batch.num_rows() {
            let mut cells = Vec::with_capacity(batch.num_columns());
            for (col, formatter) in batch.columns().iter().zip(&formatters) {
                cells.push(format_cell(col, row, &formatter.value(row).to_string()));
            }
            rows.push(cells);
        }
    }
    Ok(rows)
}

fn format_cell(col: &ArrayRef, row: usize, displayed: &str) -> String {
    if col.is_null(row) {
        return "NULL".to_string();
    }
    match col.data_type() {
        dt if is_fractional(dt) => normalize_number(displayed),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let s = match col.data_type() {
                DataType::Utf8View => col.as_string_view().value(row).to_string(),
                DataType::LargeUtf8 => col.as_string::<i64>().value(row).to_string(),
                _ => col.as_string::<i32>().value(row).to_string(),
            };
            if s.is_empty() {
                "(empty)".to_string()
            } else {
                s
            }
        }
        _ => displayed.to_string(),
    }
}

/// Floats and decimals: printed rounded and compared with tolerance.
fn is_fractional(dt: &DataType) -> bool {
    dt.is_floating() || dt.is_decimal()
}

/// Rounds a decimal rendering to 12 places and drops trailing zeros (`100.00` → `100`).
pub fn normalize_number(s: &str) -> String {
    let Ok(v) = s.parse::<f64>() else {
        return s.to_string();
    };
    if v.is_nan() {
        return "NaN".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    // Keep decimal renderings exact when they are already short.
    let text = if s.contains('e') || s.contains('E') || decimals(s) > 12 {
        format!("{v:.12}")
    } else {
        s.to_string()
    };
    let trimmed = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    };
    if trimmed == "-0" {
        "0".to_string()
    } else {
        trimmed
    }
}

fn decimals(s: &str) -> usize {
    s.split_once('.').map(|(_, d)| d.len()).unwrap_or(0)
}

/// How long one statement may run (`BASIN_TEST_DEADLINE_SECS`, default 300 s).
pub fn statement_deadline() -> Duration {
    let secs = std::env::var("BASIN_TEST_DEADLINE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::normalize_number;

    #[test]
    fn numbers() {
        assert_eq!(normalize_number("100.00"), "100");
        assert_eq!(normalize_number("0.047758"), "0.047758");
        assert_eq!(normalize_number("1.5e3"), "1500");
        assert_eq!(normalize_number("-0.00"), "0");
        assert_eq!(normalize_number("0.1234567890123456"), "0.123456789012");
    }
}
