//! A Ballista job's memory error, as the executor wrote it.
//!
//! Ballista 53 sends a failed task's error to the scheduler as Rust debug text, twice over
//! (`Task failed due to runtime execution error: DataFusionError(Execution("DataFusionError(
//! Shared(ResourcesExhausted(\"query needs …\\n …\")))"))`): the message that names the
//! executor's `memory_limit` reached the client buried in escapes. [`JobErrorsExec`] sits on
//! the job's plan in the front end and turns such an error back into the
//! `ResourcesExhausted` error the executor raised: a Flight SQL client reads the executor's
//! own text. The kind is lost on the way, so this reads the text: the variant's name and its
//! string, unescaped once per level.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::error::ArrowError;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::TryStreamExt;

/// `plan` (a Ballista job), whose memory errors come out plain.
pub(crate) fn plain_job_errors(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    if plan.name() == "DistributedQueryExec" {
        Arc::new(JobErrorsExec { job: plan })
    } else {
        plan
    }
}

/// A Ballista job whose memory errors come out as the executor raised them.
#[derive(Debug)]
pub(crate) struct JobErrorsExec {
    job: Arc<dyn ExecutionPlan>,
}

impl DisplayAs for JobErrorsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.job.fmt_as(t, f)
    }
}

impl ExecutionPlan for JobErrorsExec {
    fn name(&self) -> &str {
        "JobErrorsExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.job.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.job]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(job), true) => Ok(Arc::new(JobErrorsExec { job })),
            _ => Err(DataFusionError::Internal(
                "JobErrorsExec takes one child".to_string(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let stream = self.job.execute(partition, context)?;
        let schema = stream.schema();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            stream.map_err(plain),
        )))
    }
}

/// The executor's `ResourcesExhausted` error inside `e`, else `e`.
fn plain(e: DataFusionError) -> DataFusionError {
    let text = match &e {
        DataFusionError::ArrowError(arrow, _) => match arrow.as_ref() {
            ArrowError::ExternalError(inner) => inner.to_string(),
            _ => return e,
        },
        other => other.to_string(),
    };
    match debug_string_after(&text, "ResourcesExhausted(") {
        Some(message) => DataFusionError::ResourcesExhausted(message),
        None => e,
    }
}

/// The string literal right after `marker` in `text`, written by `{:?}` one or more times
/// over (each level doubles the backslashes before its quotes), unescaped.
fn debug_string_after(text: &str, marker: &str) -> Option<String> {
    let start = text.find(marker)? + marker.len();
    let rest = &text[start..];
    let slashes = rest.find('"')?;
    if rest[..slashes].chars().any(|c| c != '\\') {
        return None;
    }
    let levels = match slashes {
        0 => 1,
        1 => 2,
        3 => 3,
        7 => 4,
        _ => return None,
    };
    let body = &rest[slashes + 1..];
    // The closing quote: preceded by exactly as many backslashes as the opening one.
    let bytes = body.as_bytes();
    let mut end = None;
    for (i, b) in bytes.iter().enumerate() {
        if *b != b'"' {
            continue;
        }
        let run = bytes[..i].iter().rev().take_while(|c| **c == b'\\').count();
        if run == slashes {
            end = Some(i - run);
            break;
        }
    }
    let mut message = body[..end?].to_string();
    for _ in 0..levels {
        message = unescape(&message);
    }
    Some(message)
}

/// Undoes one `{:?}` of a string: `\\`, `\"`, `\'`, `\n`, `\r`, `\t`, `\0`, `\u{…}`.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('0') => out.push('\0'),
            Some('u') => {
                let code: String = chars.by_ref().take_while(|c| *c != '}').collect();
                let decoded = u32::from_str_radix(code.trim_start_matches('{'), 16)
                    .ok()
                    .and_then(char::from_u32);
                out.push(decoded.unwrap_or(char::REPLACEMENT_CHARACTER));
            }
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_error_debug_printed_twice_reads_as_the_executor_wrote_it() {
        let raised = "query needs more memory than executor e allows it: \"x\".\n  HashJoinInput";
        let once = format!(
            "{:?}",
            DataFusionError::ResourcesExhausted(raised.to_string())
        );
        let twice = format!("{:?}", DataFusionError::Execution(once.clone()));
        let ballista = format!(
            "Job j failed: Task failed due to runtime execution error: DataFusionError({twice})"
        );
        for text in [once, twice, ballista] {
            let e = plain(DataFusionError::Execution(text));
            match e {
                DataFusionError::ResourcesExhausted(m) => assert_eq!(m, raised),
                other => panic!("{other}"),
            }
        }
        let e = plain(DataFusionError::ArrowError(
            Box::new(ArrowError::ExternalError(Box::new(
                DataFusionError::Execution(format!("Job failed: ResourcesExhausted(\"{}\")", "m")),
            ))),
            None,
        ));
        assert!(matches!(e, DataFusionError::ResourcesExhausted(m) if m == "m"));
        let other = plain(DataFusionError::Execution("Divide by zero".to_string()));
        assert!(matches!(other, DataFusionError::Execution(_)));
    }
}
