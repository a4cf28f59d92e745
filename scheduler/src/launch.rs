//! How the scheduler hands tasks to executors.
//!
//! Ballista's own launcher removes an executor from the cluster whenever a launch fails,
//! whatever the reason — also when the executor answered and refused the tasks because it
//! could not decode their plan (a plan that does not survive the codec) or their signature.
//! The tasks then go back to the queue, are launched on the next executor, which refuses them
//! too, and so on: one query whose plan the executors cannot read took every executor out of
//! the cluster, again after each heartbeat registered them back, and no job finished any more
//! (found by running DataFusion's `group_by.slt` with every query a Ballista job).
//!
//! ```text
//!  launch each stage's tasks on the executor (one call per stage: a refusal names its tasks)
//!     accepted                     ─► running
//!     refused (INVALID_ARGUMENT,   ─► the executor stays; the refused tasks are reported
//!      UNAUTHENTICATED, PERMISSION     failed, not retryable, with the executor's reason:
//!      _DENIED: it answered)           their job fails with that message
//!     no answer / cannot connect   ─► Ballista's rule: the executor is removed
//! ```
//!
//! Tasks are signed for their job and stage when the cluster has a key
//! ([`basin_connectors::cluster::sign_task`]): an executor runs only signed tasks.

use std::time::{SystemTime, UNIX_EPOCH};

use ballista_core::error::BallistaError;
use ballista_core::serde::protobuf::scheduler_grpc_server::SchedulerGrpc;
use ballista_core::serde::protobuf::{
    ExecutionError, FailedTask, KeyValuePair, MultiTaskDefinition, TaskStatus,
    UpdateTaskStatusParams, failed_task, task_status,
};
use ballista_core::serde::scheduler::ExecutorMetadata;
use ballista_scheduler::scheduler_server::SchedulerServer;
use ballista_scheduler::state::executor_manager::ExecutorManager;
use ballista_scheduler::state::task_manager::TaskLauncher;
use basin_core::cluster::ClusterKey;
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Tasks an executor refused, to be reported failed: (executor id, their statuses).
type Refusal = (String, Vec<TaskStatus>);

/// Refusals waiting to be reported; a launch waits when this many are queued.
const REFUSALS_QUEUED: usize = 64;

/// Basin's [`TaskLauncher`]: see the module docs.
pub(crate) struct BasinTasks {
    key: Option<ClusterKey>,
    scheduler_id: String,
    refused: mpsc::Sender<Refusal>,
}

impl BasinTasks {
    /// A launcher, and the receiver [`report_refusals`] takes once the scheduler exists.
    pub(crate) fn new(
        key: Option<ClusterKey>,
        scheduler_id: String,
    ) -> (Self, mpsc::Receiver<Refusal>) {
        let (refused, rx) = mpsc::channel(REFUSALS_QUEUED);
        (
            Self {
                key,
                scheduler_id,
                refused,
            },
            rx,
        )
    }
}

#[async_trait::async_trait]
impl TaskLauncher for BasinTasks {
    async fn launch_tasks(
        &self,
        executor: &ExecutorMetadata,
        tasks: Vec<MultiTaskDefinition>,
        executor_manager: &ExecutorManager,
    ) -> ballista_core::error::Result<()> {
        use basin_connectors::cluster::{TASK_TOKEN_KEY, sign_task};
        for mut task in tasks {
            if let Some(key) = &self.key {
                // Whatever a session set under the same name does not count.
                task.props.retain(|kv| kv.key != TASK_TOKEN_KEY);
                task.props.push(KeyValuePair {
                    key: TASK_TOKEN_KEY.to_string(),
                    value: Some(sign_task(key, &task.job_id, task.stage_id)),
                });
            }
            // What a refusal reports: the definition without its plan.
            let plan = std::mem::take(&mut task.plan);
            let head = task.clone();
            task.plan = plan;
            let Err(e) = executor_manager
                .launch_multi_task(&executor.id, vec![task], self.scheduler_id.clone())
                .await
            else {
                continue;
            };
            let Some(reason) = refusal(&e) else {
                return Err(e);
            };
            let why = format!(
                "executor {}:{} refused the tasks of stage {} of job {}: {reason}",
                executor.host, executor.port, head.stage_id, head.job_id
            );
            tracing::warn!(job = %head.job_id, stage = head.stage_id, %why, "tasks refused");
            let failed = refused_statuses(&head, &why);
            // The receiver goes only with the scheduler.
            let _ = self.refused.send((executor.id.clone(), failed)).await;
        }
        Ok(())
    }
}

/// Failed, not retryable statuses for every task of `task`.
fn refused_statuses(task: &MultiTaskDefinition, why: &str) -> Vec<TaskStatus> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    task.task_ids
        .iter()
        .map(|id| TaskStatus {
            task_id: id.task_id,
            job_id: task.job_id.clone(),
            stage_id: task.stage_id,
            stage_attempt_num: task.stage_attempt_num,
            partition_id: id.partition_id,
            launch_time: task.launch_time,
            start_exec_time: now,
            end_exec_time: now,
            metrics: vec![],
            status: Some(task_status::Status::Failed(FailedTask {
                error: why.to_string(),
                retryable: false,
                count_to_failures: true,
                failed_reason: Some(failed_task::FailedReason::ExecutionError(ExecutionError {})),
            })),
        })
        .collect()
}

/// Reports refused tasks to the scheduler as an executor reports its tasks, until aborted.
pub(crate) fn report_refusals(
    server: SchedulerServer<LogicalPlanNode, PhysicalPlanNode>,
    mut refused: mpsc::Receiver<Refusal>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some((executor_id, task_status)) = refused.recv().await {
            let request = tonic::Request::new(UpdateTaskStatusParams {
                executor_id,
                task_status,
            });
            if let Err(e) = SchedulerGrpc::update_task_status(&server, request).await {
                tracing::error!(error = %e, "cannot report refused tasks to the scheduler");
            }
        }
    })
}

/// The executor's reason when `e` says it answered a launch and refused the tasks; `None`
/// when it did not answer. Ballista keeps only the `Debug` text of the executor's gRPC status
/// (`Failed to connect to executor …: Status { code: InvalidArgument, message: "…", … }`).
fn refusal(e: &BallistaError) -> Option<String> {
    let BallistaError::Internal(text) = e else {
        return None;
    };
    let status = &text[text.find("Status { code: ")? + "Status { code: ".len()..];
    let code = status.split(|c: char| !c.is_ascii_alphanumeric()).next()?;
    if !matches!(
        code,
        "InvalidArgument" | "Unauthenticated" | "PermissionDenied"
    ) {
        return None;
    }
    let message = crate::job_errors::debug_string_after(status, "message: ").unwrap_or_default();
    Some(if message.is_empty() {
        code.to_string()
    } else {
        message
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch_error(status: tonic::Status) -> BallistaError {
        // As ExecutorManager::launch_multi_task words it.
        BallistaError::Internal(format!("Failed to connect to executor e1: {status:?}"))
    }

    #[test]
    fn a_refusal_is_told_from_a_lost_executor() {
        let e = launch_error(tonic::Status::invalid_argument(
            "DataFusion error: Internal error: \"last_value(x)\" ORDER BY [x]\nnext é",
        ));
        assert_eq!(
            refusal(&e).as_deref(),
            Some("DataFusion error: Internal error: \"last_value(x)\" ORDER BY [x]\nnext é")
        );
        let e = launch_error(tonic::Status::unauthenticated("bad task signature"));
        assert_eq!(refusal(&e).as_deref(), Some("bad task signature"));
        for lost in [
            launch_error(tonic::Status::unavailable("connection refused")),
            launch_error(tonic::Status::unknown("transport error")),
            BallistaError::Internal("Failed to connect to executor e1: timeout".into()),
            BallistaError::General("no client".into()),
        ] {
            assert_eq!(refusal(&lost), None, "{lost}");
        }
    }

    #[test]
    fn refused_tasks_fail_for_good() {
        use ballista_core::serde::protobuf::TaskId;
        let task = MultiTaskDefinition {
            task_ids: vec![
                TaskId {
                    task_id: 7,
                    task_attempt_num: 0,
                    partition_id: 0,
                },
                TaskId {
                    task_id: 8,
                    task_attempt_num: 0,
                    partition_id: 1,
                },
            ],
            job_id: "j".into(),
            stage_id: 2,
            stage_attempt_num: 1,
            ..Default::default()
        };
        let statuses = refused_statuses(&task, "why");
        assert_eq!(statuses.len(), 2);
        assert_eq!((statuses[1].task_id, statuses[1].partition_id), (8, 1));
        assert_eq!(statuses[1].stage_attempt_num, 1);
        let Some(task_status::Status::Failed(f)) = &statuses[0].status else {
            panic!("not failed: {:?}", statuses[0].status);
        };
        assert!(!f.retryable && f.error == "why");
    }
}
