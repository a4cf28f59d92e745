//! The producer side of exchanges ([`basin_connectors::exchange`]): one instance of each
//! producer task's plan per executor, whose output partitions are served once each, to the
//! consumers that ask for them.
//!
//! ```text
//!  consumer ──DoGet(BASIN-EXCHANGE: query, stage, task t, partition j, plan)──► executor
//!           first ticket of (query, stage, t): decode the plan, keep it here
//!           every ticket: execute partition j of that one instance, stream it back
//! ```
//!
//! An instance is forgotten once every one of its partitions was asked for (the streams
//! keep what they need), or when no partition was asked for in [`PRODUCER_IDLE`] (a query
//! cancelled before all its consumers started). At most [`MAX_PRODUCERS`] instances live
//! at once on an executor.
//!
//! A broadcast producer (the build side of a `CollectLeft` join, read whole by every task
//! that probes it) has one output partition, run once: its batches are kept, under a
//! reservation of the query's memory pool (a build side over the query's share fails
//! naming it), and served to each of its `readers` consumers; the instance is forgotten
//! when all of them asked for it (the batches live until the last stream ends) or after
//! [`PRODUCER_IDLE`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};

/// The most producer instances an executor keeps at once (every stage of every query
/// running here with an exchange counts one per task).
pub const MAX_PRODUCERS: usize = 512;

/// How long a producer instance waits for the consumers of its other partitions.
pub const PRODUCER_IDLE: Duration = Duration::from_secs(60);

/// How long a forgotten producer is remembered, so that a late ticket fails clearly
/// instead of running the plan a second time.
const REMEMBER_FORGOTTEN: Duration = Duration::from_secs(600);

/// (query, stage, task).
pub(crate) type ProducerKey = (String, u32, u32);

struct Instance {
    plan: Arc<dyn ExecutionPlan>,
    context: Arc<TaskContext>,
    /// Output partitions asked for already.
    served: Vec<bool>,
    left: usize,
    last_used: Instant,
    /// A broadcast producer's output, made once for all its readers.
    kept: Option<Kept>,
}

/// A broadcast producer's batches and the memory they hold.
struct KeptBatches {
    batches: Vec<RecordBatch>,
    _reservation: MemoryReservation,
}

type Kept = Shared<BoxFuture<'static, std::result::Result<Arc<KeptBatches>, Arc<DataFusionError>>>>;

/// Runs partition 0 of a broadcast producer and keeps its batches under a reservation.
fn keep(name: String, plan: Arc<dyn ExecutionPlan>, context: Arc<TaskContext>) -> Kept {
    async move {
        let reservation =
            MemoryConsumer::new(format!("{name} (broadcast)")).register(context.memory_pool());
        let mut stream = plan.execute(0, context)?;
        let mut batches = vec![];
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            reservation
                .try_grow(batch.get_array_memory_size())
                .map_err(|e| {
                    DataFusionError::ResourcesExhausted(format!(
                        "{name}: the build side of a broadcast join does not fit in this \
                         query's memory on this executor (it is kept whole to be sent to \
                         every task that probes it; set [server] streamed_exchanges = false \
                         to run such queries as Ballista jobs): {}",
                        e.message()
                    ))
                })?;
            batches.push(batch);
        }
        Ok(Arc::new(KeptBatches {
            batches,
            _reservation: reservation,
        }))
    }
    .map(|r: Result<Arc<KeptBatches>>| r.map_err(Arc::new))
    .boxed()
    .shared()
}

#[derive(Default)]
struct State {
    live: HashMap<ProducerKey, Instance>,
    /// Producers forgotten, and when.
    forgotten: HashMap<ProducerKey, Instant>,
    sweeping: bool,
}

/// The producer instances of this executor.
#[derive(Clone, Default)]
pub(crate) struct Producers {
    state: Arc<Mutex<State>>,
}

impl Producers {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `key` has an instance here.
    pub(crate) fn has(&self, key: &ProducerKey) -> bool {
        self.lock().live.contains_key(key)
    }

    /// Runs output partition `partition` of `key`'s instance, made by `make` (a decoded
    /// plan and its context) when it is the first ticket for `key`. `readers`: the
    /// instance is a broadcast producer whose one partition is kept and served whole to
    /// that many consumers.
    pub(crate) fn execute(
        &self,
        key: ProducerKey,
        partition: usize,
        readers: Option<u32>,
        make: impl FnOnce() -> Result<(Arc<dyn ExecutionPlan>, Arc<TaskContext>)>,
    ) -> Result<SendableRecordBatchStream> {
        let name = || format!("exchange {} stage {} task {}", key.0, key.1, key.2);
        let made = if self.has(&key) { None } else { Some(make()?) };
        let (plan, context) = {
            let mut state = self.lock();
            let now = Instant::now();
            sweep(&mut state, now);
            if state.forgotten.contains_key(&key) {
                return Err(DataFusionError::Execution(format!(
                    "{}: its producer was already done or waited more than {}s for its \
                     consumers: run the query again",
                    name(),
                    PRODUCER_IDLE.as_secs()
                )));
            }
            if !state.live.contains_key(&key) {
                let Some((plan, context)) = made else {
                    return Err(DataFusionError::Internal(format!(
                        "{}: its producer vanished",
                        name()
                    )));
                };
                if state.live.len() >= MAX_PRODUCERS {
                    return Err(DataFusionError::ResourcesExhausted(format!(
                        "{}: this executor runs {MAX_PRODUCERS} exchange producers already \
                         (basin_executor::exchange::MAX_PRODUCERS): too many distributed \
                         queries at once, run it again later",
                        name()
                    )));
                }
                let n = plan.properties().partitioning.partition_count();
                let (served, kept) = match readers {
                    None => (vec![false; n], None),
                    Some(readers) => {
                        if n != 1 {
                            return Err(DataFusionError::Internal(format!(
                                "{}: a broadcast producer with {n} partitions",
                                name()
                            )));
                        }
                        let kept = keep(name(), plan.clone(), context.clone());
                        (vec![false; readers as usize], Some(kept))
                    }
                };
                state.live.insert(
                    key.clone(),
                    Instance {
                        plan,
                        context,
                        left: served.len(),
                        served,
                        last_used: now,
                        kept,
                    },
                );
                if !state.sweeping {
                    state.sweeping = true;
                    spawn_sweeper(Arc::downgrade(&self.state));
                }
            }
            let Some(instance) = state.live.get_mut(&key) else {
                return Err(DataFusionError::Internal(format!(
                    "{}: its producer vanished",
                    name()
                )));
            };
            let n = instance.served.len();
            if let Some(kept) = &instance.kept {
                // A broadcast: every reader asks for partition 0; count them instead.
                let Some(served) = instance.served.iter_mut().find(|s| !**s) else {
                    return Err(DataFusionError::Internal(format!(
                        "{}: more readers than the {n} expected",
                        name()
                    )));
                };
                *served = true;
                let kept = kept.clone();
                let schema = instance.plan.schema();
                instance.left -= 1;
                instance.last_used = now;
                if instance.left == 0 {
                    state.live.remove(&key);
                    state.forgotten.insert(key.clone(), now);
                }
                let batches = futures::stream::once(kept)
                    .map(|kept| match kept {
                        // The stream holds the kept batches (and their reservation) to its end.
                        Ok(kept) => futures::stream::iter(
                            (0..kept.batches.len()).map(move |i| Ok(kept.batches[i].clone())),
                        )
                        .boxed(),
                        Err(e) => {
                            futures::stream::once(async move { Err(DataFusionError::Shared(e)) })
                                .boxed()
                        }
                    })
                    .flatten();
                return Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)));
            }
            match instance.served.get_mut(partition) {
                None => {
                    return Err(DataFusionError::Internal(format!(
                        "{}: partition {partition} of a producer with {n} partitions",
                        name()
                    )));
                }
                Some(true) => {
                    return Err(DataFusionError::Execution(format!(
                        "{}: partition {partition} was read already (a consumer ran twice?)",
                        name()
                    )));
                }
                Some(served) => *served = true,
            }
            instance.left -= 1;
            instance.last_used = now;
            let taken = (instance.plan.clone(), instance.context.clone());
            if instance.left == 0 {
                state.live.remove(&key);
                state.forgotten.insert(key.clone(), now);
            }
            taken
        };
        plan.execute(partition, context)
    }
}

/// Forgets instances idle for [`PRODUCER_IDLE`], and forgotten keys after
/// [`REMEMBER_FORGOTTEN`].
fn sweep(state: &mut State, now: Instant) {
    let idle: Vec<ProducerKey> = state
        .live
        .iter()
        .filter(|(_, i)| now.duration_since(i.last_used) >= PRODUCER_IDLE)
        .map(|(k, _)| k.clone())
        .collect();
    for key in idle {
        tracing::warn!(
            query = %key.0,
            stage = key.1,
            task = key.2,
            "exchange producer dropped: its other consumers did not come"
        );
        state.live.remove(&key);
        state.forgotten.insert(key, now);
    }
    state
        .forgotten
        .retain(|_, at| now.duration_since(*at) < REMEMBER_FORGOTTEN);
}

fn spawn_sweeper(state: Weak<Mutex<State>>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(PRODUCER_IDLE / 4).await;
            let Some(state) = state.upgrade() else { return };
            let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
            sweep(&mut state, Instant::now());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Schema;
    use datafusion::physical_expr::Partitioning;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::repartition::RepartitionExec;

    fn producer() -> Result<(Arc<dyn ExecutionPlan>, Arc<TaskContext>)> {
        let input = Arc::new(EmptyExec::new(Arc::new(Schema::empty())).with_partitions(2));
        let plan = RepartitionExec::try_new(input, Partitioning::RoundRobinBatch(3))?;
        Ok((Arc::new(plan), Arc::new(TaskContext::default())))
    }

    #[tokio::test]
    async fn a_broadcast_is_run_once_and_served_whole_to_each_reader() {
        use datafusion::arrow::array::Int64Array;
        use datafusion::arrow::datatypes::{DataType, Field};
        use datafusion::datasource::memory::MemorySourceConfig;
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let producer = || -> Result<(Arc<dyn ExecutionPlan>, Arc<TaskContext>)> {
            let plan = MemorySourceConfig::try_new_exec(
                &[vec![batch.clone()], vec![batch.clone()]],
                schema.clone(),
                None,
            )?;
            let plan =
                datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec::new(plan);
            Ok((Arc::new(plan), Arc::new(TaskContext::default())))
        };
        let producers = Producers::default();
        let key: ProducerKey = ("q".into(), 0, 0);
        let mut made = 0;
        for _ in 0..3 {
            let stream = producers
                .execute(key.clone(), 0, Some(3), || {
                    made += 1;
                    producer()
                })
                .unwrap();
            let rows: usize = datafusion::physical_plan::common::collect(stream)
                .await
                .unwrap()
                .iter()
                .map(|b| b.num_rows())
                .sum();
            assert_eq!(rows, 6);
        }
        assert_eq!(made, 1);
        assert!(!producers.has(&key));
        let Err(late) = producers.execute(key, 0, Some(3), producer) else {
            panic!("a fourth reader served");
        };
        assert!(late.to_string().contains("already done"), "{late}");
    }

    #[tokio::test]
    async fn each_partition_is_served_once_from_one_instance_then_forgotten() {
        let producers = Producers::default();
        let key: ProducerKey = ("q".into(), 1, 0);
        let mut made = 0;
        for p in [2, 0] {
            producers
                .execute(key.clone(), p, None, || {
                    made += 1;
                    producer()
                })
                .unwrap();
        }
        assert_eq!(made, 1);
        let Err(again) = producers.execute(key.clone(), 0, None, producer) else {
            panic!("partition 0 served twice");
        };
        assert!(again.to_string().contains("read already"), "{again}");
        producers.execute(key.clone(), 1, None, producer).unwrap();
        assert!(!producers.has(&key));
        let Err(late) = producers.execute(key, 1, None, producer) else {
            panic!("a forgotten producer made again");
        };
        assert!(late.to_string().contains("already done"), "{late}");
    }
}
