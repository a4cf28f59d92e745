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
//! A stage is split across tasks and instances, so each of its partitions must depend on
//! its own input partition only ([`partition_local`]): no merge or repartition inside, and
//! no operator that collects all partitions of an input (a `CollectLeft` join, a cross
//! join) beside other partitions. Plans with such operators keep the other routes.

use std::sync::Arc;

use basin_connectors::codec::physical_codec;
use basin_connectors::exchange::{ExchangeReadExec, ExchangeSpec, PartitionSubsetExec, Producer};
use datafusion::error::Result;
use datafusion::physical_expr::Distribution;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use crate::server::ExecutorInfo;
use crate::streamed::{self, StreamedStageExec};

/// `plan` with its repartitions made exchanges between `executors` and its top stage
/// streamed from them; `None` when it has no repartition, a stage that is not
/// [`partition_local`], or a node that cannot travel.
pub(crate) fn plan_exchanges(
    plan: Arc<dyn ExecutionPlan>,
    executors: &[ExecutorInfo],
) -> Option<Arc<dyn ExecutionPlan>> {
    let executors = streamed::answering(executors.to_vec());
    if executors.is_empty() {
        return None;
    }
    let mut cut = Cut {
        query: format!("exchange-{}", uuid::Uuid::new_v4().simple()),
        executors,
        stages: 0,
        codec: physical_codec(),
    };
    let plan = match cut.cut(plan) {
        Ok(Some(plan)) => plan,
        Ok(None) => return None,
        Err(e) => {
            tracing::debug!(error = %e, "the plan cannot be cut into exchanges");
            return None;
        }
    };
    if cut.stages == 0 {
        return None;
    }
    top(plan, &cut.executors)
}

struct Cut {
    query: String,
    executors: Vec<ExecutorInfo>,
    stages: u32,
    codec: Arc<dyn PhysicalExtensionCodec>,
}

impl Cut {
    /// `plan` with every repartition below and at it cut; `None` when a stage is not
    /// partition-local.
    fn cut(&mut self, plan: Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if plan.name() == "RecursiveQueryExec" {
            return Ok(None); // runs its recursive term again and again
        }
        let children = plan.children();
        let plan = if children.is_empty() {
            plan
        } else {
            let mut cut = Vec::with_capacity(children.len());
            for child in children {
                match self.cut(child.clone())? {
                    Some(child) => cut.push(child),
                    None => return Ok(None),
                }
            }
            plan.with_new_children(cut)?
        };
        let Some(repartition) = plan.as_any().downcast_ref::<RepartitionExec>() else {
            return Ok(Some(plan));
        };
        let input = repartition.input().clone();
        if !partition_local(&input) {
            return Ok(None);
        }
        let inputs = input.output_partitioning().partition_count();
        let tasks = self.executors.len().min(inputs).max(1);
        let ordered =
            repartition.preserve_order() || repartition.properties().output_ordering().is_some();
        if ordered && tasks > 1 {
            return Ok(None); // its order would be lost between the producer tasks
        }
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
        let subset = PartitionSubsetExec::try_new(input, tasks, 0)?;
        let producer =
            RepartitionExec::try_new(Arc::new(subset), repartition.partitioning().clone())?;
        let spec = ExchangeSpec {
            query: self.query.clone(),
            stage,
            producers,
        };
        let read = ExchangeReadExec::try_encode(spec, Arc::new(producer), self.codec.as_ref())?;
        Ok(Some(Arc::new(read)))
    }
}

/// Whether each output partition of `plan` depends on the same input partitions only
/// (down to its leaves), so that its partitions may run in separate tasks: no merge or
/// repartition, and no operator that collects a whole input unless it has one partition
/// itself (a `CollectLeft` join over many probe partitions would build in every task and
/// emit its unmatched build rows in each).
pub(crate) fn partition_local(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let any = plan.as_any();
    if any.is::<RepartitionExec>()
        || any.is::<CoalescePartitionsExec>()
        || any.is::<SortPreservingMergeExec>()
        || plan.name() == "RecursiveQueryExec"
    {
        return false;
    }
    let single = plan.output_partitioning().partition_count() <= 1;
    let collects = plan
        .required_input_distribution()
        .iter()
        .any(|d| matches!(d, Distribution::SinglePartition));
    (single || !collects) && plan.children().into_iter().all(partition_local)
}

/// The top of a cut plan: light operators here, over one streamed stage whose partitions
/// each run on an executor and never move (their exchanges' partitions are read once).
fn top(plan: Arc<dyn ExecutionPlan>, executors: &[ExecutorInfo]) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.as_any().is::<ExchangeReadExec>() {
        return Some(plan); // nothing to run on an executor: read it here
    }
    if partition_local(&plan) {
        return match StreamedStageExec::try_new(plan, executors) {
            Ok(stage) => Some(Arc::new(stage.fixed())),
            Err(e) => {
                tracing::debug!(error = %e, "the plan cannot travel to an executor");
                None
            }
        };
    }
    if !streamed::light_above_stage(&plan) {
        return None;
    }
    let [child] = plan.children()[..] else {
        return None;
    };
    let child = top(child.clone(), executors)?;
    plan.with_new_children(vec![child]).ok()
}
