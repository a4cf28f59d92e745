//! Bounded memory: the pools that executors and the front end give their queries.
//!
//! ```text
//!   [executor] memory_limit ──► one FairSpillPool per executor (all its tasks together)
//!                                  ▲            ▲
//!   each task / streamed stage ──► QueryMemoryPool: at most query_memory_fraction of it,
//!                                  tracks its top consumers for the error
//! ```
//!
//! Without a pool DataFusion never says no: TPC-DS SF1 Q72 grew one executor to 23 GB
//! (DataFusion alone ran it in 313 MB) until the kernel killed it. With one, operators that
//! can spill — sorts, grouped aggregates, repartitions, a sort-merge join's buffered side —
//! write to the executor's work directory when the pool says no, and those that cannot (a
//! hash join's build side, windows, ungrouped aggregates) fail the query with an error that
//! names the limit and the setting to raise, while the executor goes on serving.
//!
//! Why a cap per task on top of the executor's pool: DataFusion's `FairSpillPool` shares
//! fairly among consumers that spill, but gives memory that cannot spill to whoever asks
//! first: one query's hash join could take a whole executor, and every other query on it
//! then fails. A task may hold at most `query_memory_fraction` of the executor's limit
//! (default 0.5), so whether a query fits does not depend on what else runs, and a query that
//! runs alone still has half the executor. Measured on the 23 GiB dev machine (`basin
//! standalone`, 2 executors of 7.1 GiB, shares of 3.5 GiB): the 22 TPC-H SF1 queries, all
//! run whole on one executor, held at most 376 MiB each (the next 187 MiB, most under
//! 60 MiB), 1.5 GB peak RSS for the process: half an executor leaves the largest nine times
//! its need. Within a task, its own operators share its part as the executor's pool shares
//! the whole (a `FairSpillPool` each), so one aggregate cannot take what a sort beside it
//! needs to spill.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    FairSpillPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation, TrackConsumersPool,
};
use std::sync::Mutex;

/// `bytes` for people: `512 B`, `1.5 GiB`.
pub fn show_bytes(bytes: impl TryInto<u64>) -> String {
    let bytes: u64 = bytes.try_into().unwrap_or(u64::MAX);
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The share of the machine's memory that a process's executors get together by default.
pub const EXECUTORS_SHARE: f64 = 0.60;

/// The share of the machine's memory that a process's front end gets by default.
pub const FRONT_END_SHARE: f64 = 0.10;

/// The Flight action (on an executor's Flight port) whose one result is the bytes one query
/// may hold on that executor, in decimal: the scheduler checks a query it would run whole on
/// one executor against it.
pub const QUERY_MEMORY_ACTION: &str = "basin.query_memory";

/// How every error of a full memory pool begins (what the scheduler recognizes when an
/// executor's error reaches it as text).
pub const NEEDS_MORE_MEMORY: &str = "query needs more memory than";

/// Assumed machine memory where it cannot be read (not Linux): 8 GiB.
const UNKNOWN_MACHINE_MEMORY: u64 = 8 << 30;

/// The memory this process may use: the machine's physical memory, or the container's limit
/// (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`) when that is lower.
pub fn machine_memory() -> u64 {
    machine_memory_linux().unwrap_or_else(|| {
        tracing::warn!(
            "cannot read this machine's memory size: assuming {}; set [executor] memory_limit",
            show_bytes(UNKNOWN_MACHINE_MEMORY)
        );
        UNKNOWN_MACHINE_MEMORY
    })
}

fn machine_memory_linux() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)?;
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|f| std::fs::read_to_string(f).ok()?.trim().parse::<u64>().ok())
    .min();
    Some(cgroup.map_or(total, |c| c.min(total)))
}

/// The default `memory_limit` of each of `executors` executors in one process.
pub fn default_executor_memory(machine: u64, executors: usize) -> u64 {
    (machine as f64 * EXECUTORS_SHARE / executors.max(1) as f64) as u64
}

/// The default memory limit of a process's front end.
pub fn default_front_end_memory(machine: u64) -> u64 {
    (machine as f64 * FRONT_END_SHARE) as u64
}

/// Where a memory limit applies, for its error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryOwner {
    /// An executor; the setting is `[executor] memory_limit`.
    Executor,
    /// The front end (Flight SQL sessions, `basin standalone -e`); the setting is
    /// `[server] front_end_memory_limit`.
    FrontEnd,
}

/// One process part's memory: a pool of `limit` bytes that all its queries share, each
/// query (task) at most `query_share` of it.
pub struct MemoryBudget {
    shared: FairSpillPool,
    limit: usize,
    query_share: usize,
    fraction: f64,
    owner: MemoryOwner,
    /// What the error calls it: `executor 127.0.0.1:50051`, `the front end`.
    name: String,
}

impl fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .field("query_share", &self.query_share)
            .finish_non_exhaustive()
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes, `fraction` (0 < f <= 1) of it per query.
    pub fn new(name: impl Into<String>, owner: MemoryOwner, limit: u64, fraction: f64) -> Self {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let fraction = if fraction > 0.0 && fraction <= 1.0 {
            fraction
        } else {
            1.0
        };
        Self {
            shared: FairSpillPool::new(limit),
            limit,
            query_share: ((limit as f64) * fraction) as usize,
            fraction,
            owner,
            name: name.into(),
        }
    }

    /// The whole limit, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit as u64
    }

    /// What one query (task) may hold, in bytes.
    pub fn query_share(&self) -> u64 {
        self.query_share as u64
    }

    /// Bytes held now by all queries together.
    pub fn reserved(&self) -> u64 {
        self.shared.reserved() as u64
    }

    /// A pool for one query (one task): its consumers count against this budget, at most
    /// the query's share; a failed allocation names the limit, the setting and the query's
    /// top consumers.
    pub fn query_pool(self: &Arc<Self>) -> Arc<dyn MemoryPool> {
        let top = NonZeroUsize::new(5).unwrap_or(NonZeroUsize::MIN);
        Arc::new(QueryMemoryPool {
            tracked: TrackConsumersPool::new(
                QueryShare {
                    budget: self.clone(),
                    own: FairSpillPool::new(self.query_share),
                    used: Mutex::new(Usage::default()),
                },
                top,
            ),
            budget: self.clone(),
        })
    }

    /// The sentence that opens every memory error: which limit, and what to change.
    fn explain(&self) -> String {
        let setting = match self.owner {
            MemoryOwner::Executor => {
                "set [executor] memory_limit higher (basin executor --memory-limit, \
                 BASIN_EXECUTOR_MEMORY_LIMIT) or [executor] query_memory_fraction closer to 1"
            }
            MemoryOwner::FrontEnd => {
                "set [server] front_end_memory_limit higher, or [executor] \
                 query_memory_fraction closer to 1"
            }
        };
        let kind = match self.owner {
            MemoryOwner::Executor => "memory_limit",
            MemoryOwner::FrontEnd => "front_end_memory_limit",
        };
        format!(
            "{NEEDS_MORE_MEMORY} {} allows it: {} per query ({} of its {kind} of {}); \
             {setting}, or make the query smaller",
            self.name,
            show_bytes(self.query_share),
            self.fraction,
            show_bytes(self.limit),
        )
    }
}

/// A query's view of a [`MemoryBudget`]: its share, shared fairly among its own operators
/// (a `FairSpillPool` of its own: one aggregate that spills cannot take what the query's
/// other operators need to spill in turn), and the executor's pool.
#[derive(Debug)]
struct QueryShare {
    budget: Arc<MemoryBudget>,
    own: FairSpillPool,
    used: Mutex<Usage>,
}

/// What a query holds now, and the most it held.
#[derive(Debug, Default)]
struct Usage {
    now: usize,
    peak: usize,
}

impl Usage {
    fn grow(&mut self, additional: usize) {
        self.now = self.now.saturating_add(additional);
        self.peak = self.peak.max(self.now);
    }
}

impl QueryShare {
    fn used(&self) -> std::sync::MutexGuard<'_, Usage> {
        // A panic elsewhere cannot leave the counter half-updated: use it as it is.
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for QueryShare {
    fn drop(&mut self) {
        let peak = self.used().peak;
        if peak > 0 {
            tracing::debug!(
                peak = %show_bytes(peak),
                share = %show_bytes(self.budget.query_share),
                owner = %self.budget.name,
                "a query's memory at its peak"
            );
        }
    }
}

impl MemoryPool for QueryShare {
    fn register(&self, consumer: &MemoryConsumer) {
        self.own.register(consumer);
        self.budget.shared.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.own.unregister(consumer);
        self.budget.shared.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.used().grow(additional);
        self.own.grow(reservation, additional);
        self.budget.shared.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        let mut used = self.used();
        used.now = used.now.saturating_sub(shrink);
        self.own.shrink(reservation, shrink);
        self.budget.shared.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        let mut used = self.used();
        let share = self.budget.query_share;
        self.own
            .try_grow(reservation, additional)
            .map_err(|e| match e {
                DataFusionError::ResourcesExhausted(_) => {
                    DataFusionError::ResourcesExhausted(format!(
                        "cannot give {} more to {} (holding {}): the query holds {} of its {}",
                        show_bytes(additional),
                        reservation.consumer().name(),
                        show_bytes(reservation.size()),
                        show_bytes(used.now),
                        show_bytes(share),
                    ))
                }
                e => e,
            })?;
        self.budget
            .shared
            .try_grow(reservation, additional)
            .inspect_err(|_| self.own.shrink(reservation, additional))
            .map_err(|e| match e {
                DataFusionError::ResourcesExhausted(_) => {
                    DataFusionError::ResourcesExhausted(format!(
                        "cannot give {} more to {}: the queries running on {} hold {} of its {}",
                        show_bytes(additional),
                        reservation.consumer().name(),
                        self.budget.name,
                        show_bytes(self.budget.shared.reserved()),
                        show_bytes(self.budget.limit),
                    ))
                }
                e => e,
            })?;
        used.grow(additional);
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used().now
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.budget.query_share)
    }
}

/// [`QueryShare`] with its top consumers tracked, and errors that open with the limit and
/// the setting to change.
#[derive(Debug)]
struct QueryMemoryPool {
    tracked: TrackConsumersPool<QueryShare>,
    budget: Arc<MemoryBudget>,
}

impl MemoryPool for QueryMemoryPool {
    fn register(&self, consumer: &MemoryConsumer) {
        self.tracked.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.tracked.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.tracked.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.tracked.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.tracked
            .try_grow(reservation, additional)
            .map_err(|e| match e {
                DataFusionError::ResourcesExhausted(detail) => DataFusionError::ResourcesExhausted(
                    format!("{}. {detail}", self.budget.explain()),
                ),
                e => e,
            })
    }

    fn reserved(&self) -> usize {
        self.tracked.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.tracked.memory_limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(pool: &Arc<dyn MemoryPool>, name: &str, spill: bool) -> MemoryReservation {
        MemoryConsumer::new(name)
            .with_can_spill(spill)
            .register(pool)
    }

    #[test]
    fn a_query_holds_at_most_its_share_and_the_error_names_limit_and_setting() {
        let budget = Arc::new(MemoryBudget::new(
            "executor 127.0.0.1:1",
            MemoryOwner::Executor,
            1000,
            0.5,
        ));
        let query = budget.query_pool();
        let build = consumer(&query, "HashJoinInput", false);
        build.try_grow(400).unwrap();
        let err = build.try_grow(200).unwrap_err().to_string();
        assert!(err.contains("executor 127.0.0.1:1"), "{err}");
        assert!(err.contains("memory_limit of 1000 B"), "{err}");
        assert!(err.contains("[executor] memory_limit"), "{err}");
        assert!(err.contains("HashJoinInput"), "{err}");
        assert!(err.contains("the query holds 400 B of its 500 B"), "{err}");
        assert_eq!(budget.reserved(), 400);
        drop(build);
        assert_eq!(budget.reserved(), 0);
    }

    #[test]
    fn queries_together_hold_at_most_the_limit() {
        let budget = Arc::new(MemoryBudget::new(
            "executor e",
            MemoryOwner::Executor,
            1000,
            0.5,
        ));
        let (a, b, c) = (
            budget.query_pool(),
            budget.query_pool(),
            budget.query_pool(),
        );
        let ra = consumer(&a, "a", false);
        let rb = consumer(&b, "b", false);
        let rc = consumer(&c, "c", false);
        ra.try_grow(500).unwrap();
        rb.try_grow(450).unwrap();
        let err = rc.try_grow(100).unwrap_err().to_string();
        assert!(
            err.contains("the queries running on executor e hold"),
            "{err}"
        );
        rc.try_grow(50).unwrap();
        drop(ra);
        rc.try_grow(400).unwrap();
        assert_eq!(budget.reserved(), 900);
    }

    #[test]
    fn operators_that_spill_share_their_query_evenly() {
        let budget = Arc::new(MemoryBudget::new(
            "executor e",
            MemoryOwner::Executor,
            1000,
            0.5,
        ));
        let query = budget.query_pool();
        let sort = consumer(&query, "sort", true);
        let aggregate = consumer(&query, "aggregate", true);
        sort.try_grow(250).unwrap();
        let err = sort.try_grow(1).unwrap_err().to_string();
        assert!(
            err.contains("cannot give 1 B more to sort (holding 250 B)"),
            "{err}"
        );
        aggregate.try_grow(250).unwrap();
        drop(aggregate);
        sort.try_grow(250).unwrap();
        assert_eq!(budget.reserved(), 500);
    }

    #[test]
    fn the_front_end_names_its_own_setting() {
        let budget = Arc::new(MemoryBudget::new(
            "the front end",
            MemoryOwner::FrontEnd,
            100,
            1.0,
        ));
        let err = consumer(&budget.query_pool(), "x", true)
            .try_grow(101)
            .unwrap_err()
            .to_string();
        assert!(err.contains("front_end_memory_limit"), "{err}");
    }

    #[test]
    fn defaults_split_the_machine_among_the_executors_of_a_process() {
        let gib = 1u64 << 30;
        assert_eq!(default_executor_memory(10 * gib, 1), 6 * gib);
        assert_eq!(default_executor_memory(10 * gib, 2), 3 * gib);
        assert_eq!(default_executor_memory(10 * gib, 0), 6 * gib);
        assert_eq!(default_front_end_memory(10 * gib), gib);
        let machine = machine_memory();
        assert!(machine > 64 << 20, "{machine}");
        assert_eq!(show_bytes(1023u64), "1023 B");
        assert_eq!(show_bytes(3u64 << 29), "1.5 GiB");
        assert_eq!(show_bytes(64usize << 20), "64.0 MiB");
    }
}
