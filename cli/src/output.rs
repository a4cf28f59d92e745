//! Printing results as aligned tables, CSV or JSON lines.

use std::io::Write;

use datafusion::arrow::csv::WriterBuilder;
use datafusion::arrow::json::LineDelimitedWriter;
use datafusion::arrow::util::display::FormatOptions;
use datafusion::arrow::util::pretty::pretty_format_batches_with_options;
use datafusion::error::{DataFusionError, Result};

use crate::statements::StatementResult;

/// Output formats of `-e` / `-f`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned table with a header.
    Table,
    /// CSV with a header row.
    Csv,
    /// One JSON object per row.
    Json,
}

fn io_err(e: std::io::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Writes one statement's result. Statements without result columns (DDL) print nothing.
pub fn write_result(
    out: &mut dyn Write,
    result: &StatementResult,
    format: OutputFormat,
) -> Result<()> {
    if result.schema.fields().is_empty() {
        return Ok(());
    }
    let batches: Vec<_> = result
        .batches
        .iter()
        .filter(|b| b.num_columns() > 0)
        .cloned()
        .collect();
    match format {
        OutputFormat::Table => {
            let options = FormatOptions::default().with_null("NULL");
            let table = if batches.is_empty() {
                let empty =
                    datafusion::arrow::record_batch::RecordBatch::new_empty(result.schema.clone());
                pretty_format_batches_with_options(&[empty], &options)?
            } else {
                pretty_format_batches_with_options(&batches, &options)?
            };
            writeln!(out, "{table}").map_err(io_err)?;
        }
        OutputFormat::Csv => {
            let mut writer = WriterBuilder::new().with_header(true).build(&mut *out);
            if batches.is_empty() {
                let empty =
                    datafusion::arrow::record_batch::RecordBatch::new_empty(result.schema.clone());
                writer.write(&empty)?;
            }
            for b in &batches {
                writer.write(b)?;
            }
        }
        OutputFormat::Json => {
            let mut writer = LineDelimitedWriter::new(&mut *out);
            for b in &batches {
                writer.write(b)?;
            }
            writer.finish()?;
        }
    }
    Ok(())
}
