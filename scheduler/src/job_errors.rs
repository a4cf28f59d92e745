//! A Ballista job seen from the front end: its memory error as the executor wrote it, and
//! the job cancelled when nobody reads its rows any more.
//!
//! A client that stops reading (a shell's Ctrl-C, a test runner's deadline, a caller that
//! drops the stream) drops Ballista's `DistributedQueryExec` stream, which only stops
//! polling: the job went on running, holding its task slots, and every later job waited
//! behind it (DataFusion's sqllogictest corpus on the jobs route timed out file after file
//! that way). [`JobErrorsExec`]'s stream cancels its job on the scheduler when it is dropped
//! before its last row.
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
use std::time::{Duration, Instant};

use ballista_core::execution_plans::DistributedQueryExec;
use ballista_core::extension::{BallistaConfigGrpcEndpoint, SessionConfigExt};
use ballista_core::serde::protobuf::CancelJobParams;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::utils::create_grpc_client_endpoint;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion_proto::protobuf::LogicalPlanNode;
use futures::{StreamExt, TryStreamExt};

/// `plan` (a Ballista job submitted to the scheduler at `scheduler_url`), whose memory
/// errors come out plain and which is cancelled when its stream is dropped unfinished.
pub(crate) fn plain_job_errors(
    plan: Arc<dyn ExecutionPlan>,
    scheduler_url: &str,
) -> Arc<dyn ExecutionPlan> {
    if plan.name() == "DistributedQueryExec" {
        Arc::new(JobErrorsExec {
            job: plan,
            scheduler_url: scheduler_url.to_string(),
        })
    } else {
        plan
    }
}

/// A Ballista job whose memory errors come out as the executor raised them.
#[derive(Debug)]
pub(crate) struct JobErrorsExec {
    job: Arc<dyn ExecutionPlan>,
    scheduler_url: String,
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
            (Some(job), true) => Ok(Arc::new(JobErrorsExec {
                job,
                scheduler_url: self.scheduler_url.clone(),
            })),
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
        let stream = self.job.execute(partition, context.clone())?;
        let schema = stream.schema();
        let job = CancelOnDrop {
            job: Arc::clone(&self.job),
            scheduler_url: self.scheduler_url.clone(),
            context,
            // Ballista's shuffle and Flight reads hand dictionary-encoded columns over as
            // plain values: the rows get the plan's types back (a `CREATE TABLE … AS` of a
            // dictionary column failed with "Mismatch between schema and batches").
            rows: Some(Box::pin(stream.map_err(plain).and_then({
                let schema = schema.clone();
                move |batch| {
                    let schema = schema.clone();
                    async move { basin_connectors::exchange::conform(batch, &schema) }
                }
            }))),
        };
        let stream = futures::stream::unfold(job, |mut job| async move {
            let rows = job.rows.as_mut()?;
            match rows.next().await {
                Some(Ok(batch)) => Some((Ok(batch), job)),
                // An error ends the job (Ballista fails it), as does the last row: nothing
                // is left to cancel.
                Some(Err(e)) => {
                    job.rows = None;
                    Some((Err(e), job))
                }
                None => {
                    job.ended();
                    None
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

type Rows = std::pin::Pin<Box<dyn futures::Stream<Item = Result<RecordBatch>> + Send>>;

/// A job's rows; the job is cancelled on the scheduler when they are dropped before they
/// ended.
struct CancelOnDrop {
    job: Arc<dyn ExecutionPlan>,
    scheduler_url: String,
    context: Arc<TaskContext>,
    /// `None` once the job's stream ended.
    rows: Option<Rows>,
}

impl CancelOnDrop {
    /// The job's stream ended: nothing to cancel.
    fn ended(mut self) {
        self.rows = None;
    }
}

/// How long a dropped job's submission may take to tell its id before it is given up.
const SUBMISSION_PATIENCE: Duration = Duration::from_secs(30);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(mut rows) = self.rows.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let job = Arc::clone(&self.job);
        let job_id = move || {
            job.as_any()
                .downcast_ref::<DistributedQueryExec<LogicalPlanNode>>()
                .and_then(|job| job.job_id())
        };
        let url = self.scheduler_url.clone();
        let endpoint_override = self
            .context
            .session_config()
            .ballista_override_create_grpc_client_endpoint();
        runtime.spawn(async move {
            // Dropped while the job was being submitted: the scheduler may have accepted
            // it, and its id comes with the answer. The submission goes on until then.
            let started = Instant::now();
            let mut id = job_id();
            while id.is_none() && started.elapsed() < SUBMISSION_PATIENCE {
                match tokio::time::timeout(Duration::from_millis(20), rows.next()).await {
                    // Ended or failed: nothing runs any more.
                    Ok(None) | Ok(Some(Err(_))) => return,
                    Ok(Some(Ok(_))) | Err(_) => id = job_id(),
                }
            }
            drop(rows);
            let Some(id) = id else {
                tracing::warn!("a job nobody reads any more did not tell its id in time; it runs to its end");
                return;
            };
            match cancel_job(&url, endpoint_override, &id).await {
                Ok(()) => tracing::info!(job = %id, "cancelled a job nobody reads any more"),
                Err(e) => tracing::warn!(job = %id, error = %e, "cannot cancel a job nobody reads any more"),
            }
        });
    }
}

/// Asks the scheduler at `url` to cancel `job_id`, with the session's call proof.
async fn cancel_job(
    url: &str,
    endpoint_override: Option<Arc<BallistaConfigGrpcEndpoint>>,
    job_id: &str,
) -> std::result::Result<(), String> {
    let mut endpoint =
        create_grpc_client_endpoint(url.to_string(), None).map_err(|e| e.to_string())?;
    if let Some(customize) = endpoint_override {
        endpoint = customize
            .configure_endpoint(endpoint)
            .map_err(|e| e.to_string())?;
    }
    let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
    SchedulerGrpcClient::new(channel)
        .cancel_job(CancelJobParams {
            job_id: job_id.to_string(),
        })
        .await
        .map_err(|e| e.message().to_string())?;
    Ok(())
}

/// The error an executor raised, as it raised it, when `e` is a failed task's error as
/// Ballista passes it on (`Job … failed: … Task failed due to runtime execution error:
/// DataFusionError(Execution("ArrowError(ComputeError(\"…\"))"))`); else `e`.
fn plain(e: DataFusionError) -> DataFusionError {
    let text = match &e {
        DataFusionError::ArrowError(arrow, _) => match arrow.as_ref() {
            ArrowError::ExternalError(inner) => inner.to_string(),
            _ => return e,
        },
        other => other.to_string(),
    };
    const TASK_FAILED: &str = "runtime execution error: ";
    if let Some(at) = text.find(TASK_FAILED)
        && let Some(raised) = peel(&text[at + TASK_FAILED.len()..], 0)
    {
        tracing::debug!(job_error = %text, "a job failed");
        return raised;
    }
    // A memory error anywhere in the text (it names the executor's limit).
    match debug_string_after(&text, "ResourcesExhausted(") {
        Some(message) => DataFusionError::ResourcesExhausted(message),
        None => e,
    }
}

/// Error kinds that carry a message, as `Debug` prints them: DataFusion's, then Arrow's.
const KINDS: [&str; 13] = [
    "Execution",
    "ResourcesExhausted",
    "Plan",
    "NotImplemented",
    "Internal",
    "Configuration",
    "ComputeError",
    "InvalidArgumentError",
    "CastError",
    "ParseError",
    "ArithmeticOverflow",
    "NotYetImplemented",
    "MemoryError",
];

/// The innermost error of `text`, the `Debug` text of an error whose message may be the
/// `Debug` text of another: wrappers (`DataFusionError(…)`, `ArrowError(…)`, `Shared(…)`)
/// are skipped, a kind's message is read and peeled again.
fn peel(text: &str, depth: usize) -> Option<DataFusionError> {
    if depth > 8 {
        return None;
    }
    let mut rest = text.trim_start();
    // Wrappers: an identifier and a parenthesis that are not a kind of error.
    loop {
        let name_len = rest
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .unwrap_or(rest.len());
        let name = &rest[..name_len];
        if name.is_empty() || !rest[name_len..].starts_with('(') {
            break;
        }
        if name == "DivideByZero" {
            break;
        }
        if KINDS.contains(&name) {
            let message = debug_string_after(rest, &format!("{name}("))?;
            return Some(peel(&message, depth + 1).unwrap_or_else(|| raised(name, message)));
        }
        rest = &rest[name_len + 1..];
    }
    rest.starts_with("DivideByZero")
        .then(|| DataFusionError::ArrowError(Box::new(ArrowError::DivideByZero), None))
}

/// The error of kind `kind` with `message`.
fn raised(kind: &str, message: String) -> DataFusionError {
    let arrow = |e: ArrowError| DataFusionError::ArrowError(Box::new(e), None);
    match kind {
        "ResourcesExhausted" => DataFusionError::ResourcesExhausted(message),
        "Plan" => DataFusionError::Plan(message),
        "NotImplemented" => DataFusionError::NotImplemented(message),
        "Internal" => DataFusionError::Internal(message),
        "Configuration" => DataFusionError::Configuration(message),
        "ComputeError" => arrow(ArrowError::ComputeError(message)),
        "InvalidArgumentError" => arrow(ArrowError::InvalidArgumentError(message)),
        "CastError" => arrow(ArrowError::CastError(message)),
        "ParseError" => arrow(ArrowError::ParseError(message)),
        "ArithmeticOverflow" => arrow(ArrowError::ArithmeticOverflow(message)),
        "NotYetImplemented" => arrow(ArrowError::NotYetImplemented(message)),
        "MemoryError" => arrow(ArrowError::MemoryError(message)),
        _ => DataFusionError::Execution(message),
    }
}

/// The string literal right after `marker` in `text`, written by `{:?}` one or more times
/// over (each level doubles the backslashes before its quotes), unescaped.
pub(crate) fn debug_string_after(text: &str, marker: &str) -> Option<String> {
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

    /// Other errors of a task reach the client as the executor raised them (DataFusion's
    /// sqllogictest files on the jobs route: 71 errors differed only by Ballista's wrapping).
    #[test]
    fn a_tasks_error_reads_as_the_executor_raised_it() {
        let job = |inner: String| {
            DataFusionError::Execution(format!(
                "Job J failed: Job failed due to stage 1 failed: Task failed due to runtime \
                 execution error: {inner}"
            ))
        };
        let cases: [(DataFusionError, &str); 4] = [
            (
                DataFusionError::Execution("map key cannot be null".into()),
                "Execution error: map key cannot be null",
            ),
            (
                DataFusionError::ArrowError(
                    Box::new(ArrowError::ComputeError("Cannot use \"NaN\"".into())),
                    None,
                ),
                "Arrow error: Compute error: Cannot use \"NaN\"",
            ),
            (
                DataFusionError::ArrowError(Box::new(ArrowError::DivideByZero), None),
                "Arrow error: Divide by zero error",
            ),
            (
                DataFusionError::Plan("a (b) \\ c".into()),
                "Error during planning: a (b) \\ c",
            ),
        ];
        for (raised, shown) in cases {
            // As Ballista words it: the executor's error debug-printed inside an
            // Execution error, debug-printed again.
            let once = format!("{:?}", DataFusionError::Execution(format!("{raised:?}")));
            let e = plain(job(format!("DataFusionError({once})")));
            assert_eq!(e.to_string(), shown);
        }
        let unknown = plain(job("Something(else)".into()));
        assert!(unknown.to_string().contains("Something(else)"), "{unknown}");
    }
}
