//! Which executors answer. Queries are placed on executors by the scheduler's own list
//! (streamed stages, small queries whole on one executor: [`crate::streamed`]), and
//! Ballista binds its jobs' tasks by its cluster state. Both used to learn that an executor
//! died only from its heartbeats: the executor is dropped after `executor_timeout_seconds`
//! without one (60 s here), checked every `expire_dead_executor_interval_seconds` (Ballista's
//! default 15 s). When the kernel killed an executor in a TPC-DS run, every later query that
//! was placed on it failed ("cannot connect (is the executor running?)") for as long as the
//! run lasted.
//!
//! ```text
//!  every second, and at once after a loss ── probe each registered executor's Flight port
//!     answers                  ─► back in placement (if it was taken out before the probe)
//!     refused, or 3 × silent   ─► out of placement, and Ballista removes it (ExecutorLost:
//!                                 its running tasks go to the others); a live executor's
//!                                 next heartbeat registers it again
//!  a partition's stream cannot connect, or breaks and the probe is refused
//!                              ─► out of placement at once; the partition runs once more on
//!                                 another executor if it sent no row yet
//! ```
//!
//! A probe is a TCP connection to the Flight port: the kernel refuses it as soon as the
//! process is gone, and accepts it for a live executor however busy its threads are, so a
//! long query does not make its executor look dead. A host that vanished (no refusal) is
//! taken out after three probes without an answer (about 9 s). An executor that hangs with
//! its port open is left to the streams' HTTP/2 keep-alive (10 s + 20 s) and to Ballista's
//! heartbeat timeout: Ballista also *stops* an executor whose heartbeats timed out, so the
//! timeout stays long (a starved machine once delayed heartbeats past it).
//! Measured in `cli/tests/it/liveness.rs` (two executors, one killed with `kill -9`, on a
//! 2-core machine with a load average of 12-20): Ballista had forgotten the executor 0.1-1.9 s
//! after the kill, and the next queries (streamed, one-executor and Ballista jobs) ran on the
//! survivor.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use ballista_core::serde::protobuf::ExecutorStoppedParams;
use ballista_core::serde::protobuf::scheduler_grpc_server::SchedulerGrpc;
use ballista_scheduler::scheduler_server::SchedulerServer;
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use tokio::task::JoinHandle;

use crate::server::ExecutorInfo;
use crate::streamed;

/// Time between two rounds of probes.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How long a probe waits for the connection to be accepted.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Probes in a row without an answer (neither accepted nor refused) after which an executor
/// is taken out.
const SILENT_PROBES: u32 = 3;

/// How long an executor that left the cluster is remembered as taken out.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// What a probe of an executor's Flight port found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Probe {
    Answers,
    /// Nothing listens there: the process is gone.
    Refused(String),
    /// No answer within [`PROBE_TIMEOUT`]: the host is unreachable, or very slow.
    Silent,
}

async fn probe(host: &str, port: u16) -> Probe {
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Probe::Answers,
        Ok(Err(e)) => Probe::Refused(e.to_string()),
        Err(_) => Probe::Silent,
    }
}

/// Probes the registered executors until aborted: see the module docs.
pub(crate) fn watch(server: SchedulerServer<LogicalPlanNode, PhysicalPlanNode>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut silent: HashMap<String, u32> = HashMap::new();
        // Executors Ballista was asked to remove, until they answer again.
        let mut removed: HashSet<String> = HashSet::new();
        let mut losses = streamed::losses();
        loop {
            let registered = registered(&server).await;
            let started = Instant::now();
            let probes =
                futures::future::join_all(registered.iter().map(|e| probe(&e.host, e.port))).await;
            for (executor, found) in registered.iter().zip(probes) {
                let why = match found {
                    Probe::Answers => {
                        silent.remove(&executor.id);
                        removed.remove(&executor.id);
                        streamed::executor_answers(&executor.id, started);
                        continue;
                    }
                    Probe::Refused(e) => format!("its Flight port refuses connections: {e}"),
                    Probe::Silent => {
                        let n = silent.entry(executor.id.clone()).or_default();
                        *n += 1;
                        if *n < SILENT_PROBES {
                            continue;
                        }
                        format!("its Flight port did not answer {n} probes of {PROBE_TIMEOUT:?}")
                    }
                };
                silent.remove(&executor.id);
                streamed::executor_lost(executor, &why);
                if removed.insert(executor.id.clone()) {
                    remove_from_ballista(&server, executor, why).await;
                }
            }
            let ids: HashSet<&str> = registered.iter().map(|e| e.id.as_str()).collect();
            silent.retain(|id, _| ids.contains(id.as_str()));
            removed.retain(|id| ids.contains(id.as_str()));
            streamed::forget_lost(&|id| ids.contains(id), FORGET_AFTER);
            // A loss seen by a query is probed at once (and told to Ballista if confirmed).
            tokio::select! {
                () = tokio::time::sleep(PROBE_INTERVAL) => {}
                _ = losses.changed() => {}
            }
        }
    })
}

/// The executors registered with Ballista.
async fn registered(
    server: &SchedulerServer<LogicalPlanNode, PhysicalPlanNode>,
) -> Vec<ExecutorInfo> {
    match server.state.executor_manager.get_executors_state().await {
        Ok(state) => state
            .into_iter()
            .map(|(m, _, _)| ExecutorInfo {
                id: m.id,
                host: m.host,
                port: m.port,
                task_slots: m.specification.task_slots,
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the executors to probe them");
            vec![]
        }
    }
}

/// Has Ballista remove `executor` as if it had said it stopped: it is no longer given
/// tasks, and the tasks it ran go to the others. If it is alive after all, its next
/// heartbeat registers it again.
async fn remove_from_ballista(
    server: &SchedulerServer<LogicalPlanNode, PhysicalPlanNode>,
    executor: &ExecutorInfo,
    why: String,
) {
    let request = tonic::Request::new(ExecutorStoppedParams {
        executor_id: executor.id.clone(),
        reason: format!("Basin's probe: {why}"),
    });
    if let Err(status) = server.executor_stopped(request).await {
        tracing::warn!(
            executor = %executor.id,
            error = %status.message(),
            "cannot remove a lost executor from the cluster; its heartbeats will time out"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_probe_tells_a_listening_port_from_a_closed_one() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(probe("127.0.0.1", port).await, Probe::Answers);
        drop(listener);
        assert!(matches!(probe("127.0.0.1", port).await, Probe::Refused(_)));
    }
}
