//! Memory on the scheduler's side: the front end's own pool, and what one query may hold on
//! each executor, which decides whether a query may run whole on one.
//!
//! ```text
//!  front-end sessions ──► one MemoryBudget per process ([server] front_end_memory_limit)
//!  plan_streamed ──DoAction(basin.query_memory)──► executor: bytes one query may hold there
//! ```
//!
//! Ballista's executor registration carries only task slots, so the scheduler asks each
//! executor's Flight port once (cached by executor id: ids are new for every start) what
//! one query may hold there; an executor that does not answer is checked against
//! `single_node_max_bytes` alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arrow_flight::Action;
use arrow_flight::flight_service_client::FlightServiceClient;
use basin_core::BasinConfig;
use basin_core::memory::{MemoryBudget, MemoryOwner, QUERY_MEMORY_ACTION};
use datafusion::execution::memory_pool::MemoryPool;

use crate::server::ExecutorInfo;

/// The memory pool of one front-end session: its queries' share of the process's front-end
/// budget, made by the first session of the process with its configuration's limit.
pub(crate) fn front_end_pool(config: &BasinConfig) -> Arc<dyn MemoryPool> {
    static FRONT_END: OnceLock<Arc<MemoryBudget>> = OnceLock::new();
    FRONT_END
        .get_or_init(|| {
            Arc::new(MemoryBudget::new(
                "the front end",
                MemoryOwner::FrontEnd,
                config.server.front_end_memory_bytes(),
                config.executor.query_memory_fraction,
            ))
        })
        .query_pool()
}

/// What executors said one query may hold on them, by executor id; `None`: no answer.
type Answers = Mutex<HashMap<String, Option<u64>>>;

fn answers() -> &'static Answers {
    static ANSWERS: OnceLock<Answers> = OnceLock::new();
    ANSWERS.get_or_init(Answers::default)
}

/// The bytes one query may hold on `executor` (`[executor] memory_limit` times
/// `query_memory_fraction`), as it says; `None` when it does not answer.
pub(crate) async fn query_memory(executor: &ExecutorInfo) -> Option<u64> {
    if let Some(known) = lock(answers()).get(&executor.id) {
        return *known;
    }
    let answer = ask(executor).await;
    if answer.is_none() {
        tracing::debug!(executor = %executor.id, "executor does not say how much memory a query may hold");
    }
    let mut known = lock(answers());
    // Executors come and go with new ids: the answers stay few.
    if known.len() > 1024 {
        known.clear();
    }
    known.insert(executor.id.clone(), answer);
    answer
}

async fn ask(executor: &ExecutorInfo) -> Option<u64> {
    let url = format!("http://{}:{}", executor.host, executor.port);
    let endpoint = tonic::transport::Endpoint::from_shared(url)
        .ok()?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2));
    let channel = endpoint.connect().await.ok()?;
    let action = Action {
        r#type: QUERY_MEMORY_ACTION.to_string(),
        body: Default::default(),
    };
    let mut results = FlightServiceClient::new(channel)
        .do_action(action)
        .await
        .ok()?
        .into_inner();
    let first = results.message().await.ok()??;
    std::str::from_utf8(&first.body).ok()?.trim().parse().ok()
}

fn lock(answers: &Answers) -> std::sync::MutexGuard<'_, HashMap<String, Option<u64>>> {
    answers.lock().unwrap_or_else(|e| e.into_inner())
}
