//! Streamed exchanges: a query too big for one executor runs over every executor in
//! stages that all start at once and pass rows to each other over Arrow Flight, without a
//! Ballista job or shuffle files (`[server] streamed_exchanges`).
//!
//! ```text
//!  front end:  merge ◄── StreamedStageExec: partition p on an executor
//!                          └─ … ExchangeReadExec (partition p of every producer task)
//!  executor t:   RepartitionExec(Hash(k, N)) ─ PartitionSubsetExec{p mod T = t} ─ … ─ scan
//! ```
//!
//! [`plan_exchanges`] cuts a physical plan bottom-up at every `RepartitionExec`: its input
//! becomes the producer of an exchange, split over T tasks (T = the executors that answer,
//! at most the input's partitions), task t running the input partitions `p mod T = t` and
//! the same repartitioning over them; the repartition itself becomes an
//! [`ExchangeReadExec`] whose partition p reads output partition p of every task. Cut
//! stages nest: a producer's plan may read other exchanges. What is left above the last
//! cut runs as one streamed stage (partition p on an executor), with the merge and light
//! work above it here.
//!
//! Two more kinds of exchange keep the stages partition-local ([`not_partition_local`]):
//!
//! - **gather**: a merge (`CoalescePartitionsExec`, `SortPreservingMergeExec`) inside the
//!   plan; its input runs over T tasks, each merging its own partitions into one, and the
//!   same merge reads the T tasks' outputs (partition t of the read is task t's) in the
//!   one consumer that runs it;
//! - **broadcast**: the build side of a `CollectLeft` join (or a cross join) probed by many
//!   partitions; the build side runs over T tasks, each merging its partitions into one
//!   that its executor keeps (under the query's memory pool) and serves whole to each of
//!   the K tasks that run the join (K is set when the consumer stage is cut), so every
//!   consumer task builds its hash table from the whole build side once.
//!
//! A `CollectLeft` join that emits its build side's unmatched rows (left, full, left
//! semi/anti/mark joins) needs every probe partition in one place and is not broadcast: the
//! query keeps the other routes, and [`plan_exchanges`] says why (logged, and shown by
//! `EXPLAIN` as the route's reason).

use std::sync::Arc;

use basin_connectors::codec::physical_codec;
use basin_connectors::exchange::{
    ExchangeMode, ExchangeReadExec, ExchangeSpec, PartitionSubsetExec, Producer,
};
use datafusion::common::JoinType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_expr::Distribution;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PartitionMode,
};
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use crate::server::ExecutorInfo;
use crate::streamed::{self, StreamedStageExec};

/// `plan` with its repartitions, merges and collected build sides made exchanges between
/// `executors` and its top stage streamed from them; `Err` says why not (a stage that
/// cannot be made partition-local, a node that cannot travel, no executor), in one line
/// naming the operator. `plan`'s joins must be safe to split (`DistributedSafeJoins`).
pub(crate) fn plan_exchanges(
    plan: Arc<dyn ExecutionPlan>,
    executors: &[ExecutorInfo],
) -> std::result::Result<Arc<dyn ExecutionPlan>, String> {
    let executors = streamed::answering(executors.to_vec());
    if executors.is_empty() {
        return Err("no executor answers".into());
    }
    let mut cut = Cut {
        query: format!("exchange-{}", uuid::Uuid::new_v4().simple()),
        executors,
        stages: 0,
        codec: physical_codec(),
    };
    // (A plan with no exchange is one streamed stage.)
    cut.top(plan, &Above::Nothing)
}

/// What the light operators above a stage need when its partitions are merged in tasks (a
/// gather): the order in which a sort-preserving merge above reads each partition.
enum Above {
    /// No order: a merge may interleave partitions.
    Nothing,
    /// A sort-preserving merge in `order`, with only filters and limits in between.
    Sorted(LexOrdering),
    /// A sort-preserving merge, in columns the operators in between renamed.
    SortedElsewhere,
}

impl Above {
    /// What `plan`'s input must give, when `plan` (light, above a stage) needs `self`.
    fn below(&self, plan: &Arc<dyn ExecutionPlan>) -> Above {
        let any = plan.as_any();
        if let Some(merge) = any.downcast_ref::<SortPreservingMergeExec>() {
            return Above::Sorted(merge.expr().clone());
        }
        let keeps_rows_in_order =
            any.is::<FilterExec>() || any.is::<GlobalLimitExec>() || any.is::<LocalLimitExec>();
        match self {
            Above::Sorted(order) if keeps_rows_in_order => Above::Sorted(order.clone()),
            Above::Sorted(_) | Above::SortedElsewhere
                if keeps_rows_in_order || any.is::<ProjectionExec>() =>
            {
                Above::SortedElsewhere
            }
            // Merges everything itself (a top-N sort, an ungrouped aggregate, a merge).
            _ => Above::Nothing,
        }
    }
}

type Cutting<T> = std::result::Result<T, String>;

fn failed(e: datafusion::error::DataFusionError) -> String {
    format!("the plan cannot be cut into exchanges: {e}")
}

struct Cut {
    query: String,
    executors: Vec<ExecutorInfo>,
    stages: u32,
    codec: Arc<dyn PhysicalExtensionCodec>,
}

impl Cut {
    /// The top of a plan: light operators here (merges, an ungrouped aggregate's final
    /// step, top-N, …), over one stage whose partitions each run on an executor and never
    /// move (their exchanges' partitions are read once).
    fn top(
        &mut self,
        plan: Arc<dyn ExecutionPlan>,
        above: &Above,
    ) -> Cutting<Arc<dyn ExecutionPlan>> {
        if streamed::light_above_stage(&plan)
            && let [child] = plan.children()[..]
        {
            let child = self.top(child.clone(), &above.below(&plan))?;
            return plan.with_new_children(vec![child]).map_err(failed);
        }
        let stage = self.cut(plan)?;
        if stage.as_any().is::<ExchangeReadExec>() {
            return Ok(stage); // nothing to run on an executor: read it here
        }
        if let Some(why) = not_partition_local(&stage) {
            return Err(why);
        }
        if has_unset_broadcast(&stage) {
            // The stage's tasks are the broadcast's readers: it runs as a gather whose
            // producer tasks each build the hash table once for their partitions.
            let tasks = self.tasks(&stage);
            // Each task merges its partitions as the merge above reads them: in its order
            // (the stage's own ordering may say less: a sort key constant in each partition
            // but not across them is no ordering, yet a merge above still needs it).
            let merge = match above {
                Above::Sorted(order) if stage.output_partitioning().partition_count() > 1 => Some(
                    Arc::new(SortPreservingMergeExec::new(order.clone(), stage.clone()))
                        as Arc<dyn ExecutionPlan>,
                ),
                Above::SortedElsewhere if stage.output_ordering().is_none() => {
                    return Err(
                        "a sort-preserving merge above a renaming of a broadcast join's \
                         partitions: each task's merge would not keep their order"
                            .into(),
                    );
                }
                _ => merge_for(&stage),
            };
            let read = self.exchange(stage, tasks, ExchangeMode::ByTask, |subset| {
                Ok(match &merge {
                    Some(merge) => merge.clone().with_new_children(vec![subset])?,
                    None => subset,
                })
            })?;
            return Ok(Arc::new(read));
        }
        match StreamedStageExec::try_new(stage, &self.executors) {
            Ok(stage) => Ok(Arc::new(stage.fixed())),
            Err(e) => Err(format!("the plan cannot travel to an executor: {e}")),
        }
    }

    /// `plan` with every repartition, merge and collected build side below and at it cut.
    fn cut(&mut self, plan: Arc<dyn ExecutionPlan>) -> Cutting<Arc<dyn ExecutionPlan>> {
        if plan.name() == "RecursiveQueryExec" {
            return Err("RecursiveQueryExec runs its recursive term again and again".into());
        }
        let children = plan.children();
        let plan = if children.is_empty() {
            plan
        } else {
            let mut cut = Vec::with_capacity(children.len());
            for child in children {
                cut.push(self.cut(child.clone())?);
            }
            plan.with_new_children(cut).map_err(failed)?
        };
        if let Some(repartition) = plan.as_any().downcast_ref::<RepartitionExec>() {
            let input = repartition.input().clone();
            if let Some(why) = not_partition_local(&input) {
                return Err(why);
            }
            let tasks = self.tasks(&input);
            let ordered = repartition.preserve_order()
                || repartition.properties().output_ordering().is_some();
            if ordered && tasks > 1 {
                return Err(
                    "an order-preserving RepartitionExec: its order would be lost between \
                     the producer tasks"
                        .into(),
                );
            }
            let partitioning = repartition.partitioning().clone();
            let read = self.exchange(input, tasks, ExchangeMode::Partitioned, |subset| {
                Ok(Arc::new(RepartitionExec::try_new(subset, partitioning)?))
            })?;
            return Ok(Arc::new(read));
        }
        if is_merge(&plan) {
            let [input] = plan.children()[..] else {
                return Ok(plan);
            };
            let input = input.clone();
            if input.output_partitioning().partition_count() <= 1 {
                return Ok(plan);
            }
            if let Some(why) = not_partition_local(&input) {
                return Err(why);
            }
            // Gather: each task merges its partitions, the merge here merges the tasks'.
            let tasks = self.tasks(&input);
            let merge = plan.clone();
            let read = self.exchange(input, tasks, ExchangeMode::ByTask, |subset| {
                merge.clone().with_new_children(vec![subset])
            })?;
            return plan.with_new_children(vec![Arc::new(read)]).map_err(failed);
        }
        if let Some(join) = collecting_join(&plan)? {
            return self.broadcast(plan, join);
        }
        Ok(plan)
    }

    /// The join `plan` (whose left side it collects, see [`collecting_join`]) with its left
    /// side read from a broadcast exchange.
    fn broadcast(
        &mut self,
        plan: Arc<dyn ExecutionPlan>,
        join: &'static str,
    ) -> Cutting<Arc<dyn ExecutionPlan>> {
        let children = plan.children();
        let (left, right) = (children[0].clone(), children[1].clone());
        let read = match gathered(&left) {
            // Already gathered (cut above): its producer tasks serve every reader instead.
            Some(read) => read.with_mode(ExchangeMode::Broadcast { readers: 0 }),
            None => {
                if let Some(why) = not_partition_local(&left) {
                    return Err(format!("{join}'s build side: {why}"));
                }
                if left.output_partitioning().partition_count() != 1 {
                    return Err(format!(
                        "{join}'s build side has {} partitions",
                        left.output_partitioning().partition_count()
                    ));
                }
                self.exchange(left, 1, ExchangeMode::Broadcast { readers: 0 }, Ok)?
            }
        };
        plan.with_new_children(vec![Arc::new(read), right])
            .map_err(failed)
    }

    /// How many producer tasks run `input`: the executors that answer, at most its
    /// partitions.
    fn tasks(&self, input: &Arc<dyn ExecutionPlan>) -> usize {
        let inputs = input.output_partitioning().partition_count();
        self.executors.len().min(inputs).max(1)
    }

    /// A new exchange whose `tasks` producer tasks run `wrap(PartitionSubsetExec(input))`;
    /// the broadcasts that `input` reads get `tasks` readers.
    fn exchange(
        &mut self,
        input: Arc<dyn ExecutionPlan>,
        tasks: usize,
        mode: ExchangeMode,
        wrap: impl FnOnce(Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>>,
    ) -> Cutting<ExchangeReadExec> {
        let input = set_readers(input, tasks as u32).map_err(failed)?;
        let stage = self.stages;
        self.stages += 1;
        // Successive stages start on successive executors.
        let first = stage as usize % self.executors.len();
        let producers = (0..tasks)
            .map(|t| {
                let e = &self.executors[(first + t) % self.executors.len()];
                Producer {
                    host: e.host.clone(),
                    port: e.port,
                }
            })
            .collect();
        let subset = PartitionSubsetExec::try_new(input, tasks, 0).map_err(failed)?;
        let producer = wrap(Arc::new(subset)).map_err(failed)?;
        let spec = ExchangeSpec {
            query: self.query.clone(),
            stage,
            producers,
            mode,
        };
        ExchangeReadExec::try_encode(spec, producer, self.codec.as_ref())
            .map_err(|e| format!("the plan cannot travel to an executor: {e}"))
    }
}

/// The gather read under `plan` when `plan` is a `CoalescePartitionsExec` (no limit) of a
/// gather.
fn gathered(plan: &Arc<dyn ExecutionPlan>) -> Option<&ExchangeReadExec> {
    let merge = plan.as_any().downcast_ref::<CoalescePartitionsExec>()?;
    if merge.fetch().is_some() {
        return None;
    }
    let read = merge.input().as_any().downcast_ref::<ExchangeReadExec>()?;
    (read.spec().mode == ExchangeMode::ByTask).then_some(read)
}

fn is_merge(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let any = plan.as_any();
    any.is::<CoalescePartitionsExec>() || any.is::<SortPreservingMergeExec>()
}

/// The merge that makes one partition of `plan`'s, keeping its order; `None` when it has
/// one already.
fn merge_for(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.output_partitioning().partition_count() <= 1 {
        return None;
    }
    Some(match plan.output_ordering() {
        Some(order) => Arc::new(SortPreservingMergeExec::new(order.clone(), plan.clone())),
        None => Arc::new(CoalescePartitionsExec::new(plan.clone())),
    })
}

/// The name of `plan` when it is a join that collects its whole left side beside many
/// probe partitions and may read it from a broadcast; an error saying why when it collects
/// but may not.
fn collecting_join(plan: &Arc<dyn ExecutionPlan>) -> Cutting<Option<&'static str>> {
    if plan.output_partitioning().partition_count() <= 1 {
        return Ok(None); // runs once: it may collect
    }
    let collects_left = matches!(
        plan.required_input_distribution().first(),
        Some(Distribution::SinglePartition)
    );
    if !collects_left || plan.children().len() != 2 {
        return Ok(None);
    }
    let any = plan.as_any();
    let (name, join_type) = if let Some(join) = any.downcast_ref::<HashJoinExec>() {
        if join.mode != PartitionMode::CollectLeft {
            return Ok(None);
        }
        ("HashJoinExec(CollectLeft)", *join.join_type())
    } else if let Some(join) = any.downcast_ref::<NestedLoopJoinExec>() {
        ("NestedLoopJoinExec", *join.join_type())
    } else if any.is::<CrossJoinExec>() {
        ("CrossJoinExec", JoinType::Inner)
    } else {
        return Err(format!(
            "{} collects its first input beside {} partitions",
            plan.name(),
            plan.output_partitioning().partition_count()
        ));
    };
    match join_type {
        JoinType::Inner
        | JoinType::Right
        | JoinType::RightSemi
        | JoinType::RightAnti
        | JoinType::RightMark => Ok(Some(name)),
        other => Err(format!(
            "{name} {other} join: it emits its build side's unmatched rows once, after every \
             probe partition, so it cannot be broadcast"
        )),
    }
}

/// `plan` with its broadcast reads (those of its own stage: reads are leaves) given
/// `readers` readers.
fn set_readers(plan: Arc<dyn ExecutionPlan>, readers: u32) -> Result<Arc<dyn ExecutionPlan>> {
    Ok(plan
        .transform_up(|node| {
            match node.as_any().downcast_ref::<ExchangeReadExec>() {
                Some(read) if read.spec().mode == (ExchangeMode::Broadcast { readers: 0 }) => {
                    Ok(Transformed::yes(
                        Arc::new(read.with_readers(readers)) as Arc<dyn ExecutionPlan>
                    ))
                }
                _ => Ok(Transformed::no(node)),
            }
        })?
        .data)
}

fn has_unset_broadcast(plan: &Arc<dyn ExecutionPlan>) -> bool {
    match plan.as_any().downcast_ref::<ExchangeReadExec>() {
        Some(read) => read.spec().mode == (ExchangeMode::Broadcast { readers: 0 }),
        None => plan.children().into_iter().any(has_unset_broadcast),
    }
}

/// Why `plan` is not partition-local, naming the operator; `None` when it is: each of
/// its output partitions depends on the same input partitions only (down to its leaves),
/// so that its partitions may run in separate tasks (no repartition, no merge but of a
/// gather's tasks, and no operator that collects a whole input unless it has one
/// partition itself or the input is a broadcast).
fn not_partition_local(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    let any = plan.as_any();
    if any.is::<RepartitionExec>() || plan.name() == "RecursiveQueryExec" {
        return Some(format!("{} inside a stage", plan.name()));
    }
    let children = plan.children();
    if is_merge(plan) {
        let gathered = children.iter().all(|c| {
            c.output_partitioning().partition_count() <= 1
                || c.as_any()
                    .downcast_ref::<ExchangeReadExec>()
                    .is_some_and(|r| r.spec().mode == ExchangeMode::ByTask)
        });
        if !gathered {
            return Some(format!(
                "{} over many partitions inside a stage",
                plan.name()
            ));
        }
    }
    let single = plan.output_partitioning().partition_count() <= 1;
    for (child, required) in children.iter().zip(plan.required_input_distribution()) {
        let broadcast = child
            .as_any()
            .downcast_ref::<ExchangeReadExec>()
            .is_some_and(|r| r.is_broadcast());
        if matches!(required, Distribution::SinglePartition) && !single && !broadcast {
            return Some(format!(
                "{} collects an input beside {} partitions",
                plan.name(),
                plan.output_partitioning().partition_count()
            ));
        }
    }
    children.into_iter().find_map(not_partition_local)
}
