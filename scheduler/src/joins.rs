//! Hash joins that are correct when their partitions run as separate tasks.
//!
//! A `HashJoinExec` in `CollectLeft` mode builds one hash table from the whole left side and
//! probes it from every partition of the right side. In one process, join types whose output
//! includes build-side rows decided only after *all* probing (LEFT, FULL, LEFT SEMI, LEFT
//! ANTI, LEFT MARK) are produced by the last probe partition to finish, which sees the shared
//! "matched" bitmap. On a Ballista cluster every probe partition is a separate task with its
//! own copy of the build side, so no task is ever the last one: such a join returns no
//! build-side rows at all (TPC-H Q4, Q20, Q21 and Q22 came back empty), or, for a null-aware
//! anti join (`NOT IN`), decides on one partition's view of the probe side.
//!
//! [`DistributedSafeJoins`] runs last among the scheduler's physical optimizer rules and
//! rewrites those joins:
//! - into `Partitioned` mode, both sides hash-repartitioned on the join keys, so each task
//!   owns its build rows and its bitmap is the whole truth for them;
//! - a null-aware anti join (which needs the whole probe side) reads its probe side as one
//!   partition.
//!
//! Ballista's own broadcast promotion (`ballista.optimizer.broadcast_join_threshold_bytes`)
//! turns partitioned joins into exactly these `CollectLeft` shapes after this rule has run,
//! so Basin switches it off (see `session::base_config`); joins whose build side is small
//! are still broadcast when DataFusion's join selection picks `CollectLeft` for a safe type.

use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

/// See the module documentation.
#[derive(Debug, Default)]
pub struct DistributedSafeJoins;

/// Join types whose output depends on what *every* probe partition matched.
fn emits_build_rows_after_probe(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Left
            | JoinType::Full
            | JoinType::LeftSemi
            | JoinType::LeftAnti
            | JoinType::LeftMark
    )
}

impl PhysicalOptimizerRule for DistributedSafeJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let partitions = config.execution.target_partitions.max(1);
        plan.transform_up(|node| {
            let Some(join) = node.as_any().downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            if *join.partition_mode() != PartitionMode::CollectLeft
                || !emits_build_rows_after_probe(*join.join_type())
                || join.right().output_partitioning().partition_count() <= 1
            {
                return Ok(Transformed::no(node));
            }
            let rebuild = |mode, build, probe| {
                join.builder()
                    .with_partition_mode(mode)
                    .with_new_children(vec![build, probe])?
                    .recompute_properties()
                    .reset_state()
                    .build_exec()
                    .map(Transformed::yes)
            };
            if join.null_aware {
                let probe = Arc::new(CoalescePartitionsExec::new(Arc::clone(join.right())));
                return rebuild(PartitionMode::CollectLeft, Arc::clone(join.left()), probe);
            }
            let mut build = Arc::clone(join.left());
            if let Some(coalesce) = build.as_any().downcast_ref::<CoalescePartitionsExec>() {
                build = Arc::clone(coalesce.input());
            }
            let (left_keys, right_keys): (Vec<_>, Vec<_>) = join
                .on()
                .iter()
                .map(|(l, r)| (Arc::clone(l), Arc::clone(r)))
                .unzip();
            let build = hash_partitioned(build, left_keys, partitions)?;
            let probe = hash_partitioned(Arc::clone(join.right()), right_keys, partitions)?;
            rebuild(PartitionMode::Partitioned, build, probe)
        })
        .data()
    }

    fn name(&self) -> &str {
        "basin_distributed_safe_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `input` hash-partitioned on `keys` into `partitions` (as is, if it already is).
fn hash_partitioned(
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<Arc<dyn datafusion::physical_expr::PhysicalExpr>>,
    partitions: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    if let Partitioning::Hash(existing, n) = input.output_partitioning()
        && *n == partitions
        && existing.len() == keys.len()
        && existing.iter().zip(&keys).all(|(a, b)| a.eq(b))
    {
        return Ok(input);
    }
    Ok(Arc::new(RepartitionExec::try_new(
        input,
        Partitioning::Hash(keys, partitions),
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::NullEquality;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_plan::displayable;
    use datafusion::physical_plan::empty::EmptyExec;

    fn join(
        join_type: JoinType,
        probe_partitions: usize,
        null_aware: bool,
    ) -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let build: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(schema.clone()));
        let probe: Arc<dyn ExecutionPlan> =
            Arc::new(EmptyExec::new(schema.clone()).with_partitions(probe_partitions));
        let on = vec![(col("k", &schema).unwrap(), col("k", &schema).unwrap())];
        Arc::new(
            HashJoinExec::try_new(
                build,
                probe,
                on,
                None,
                &join_type,
                None,
                PartitionMode::CollectLeft,
                NullEquality::NullEqualsNothing,
                null_aware,
            )
            .unwrap(),
        )
    }

    fn rewrite(plan: Arc<dyn ExecutionPlan>) -> String {
        let mut config = ConfigOptions::new();
        config.execution.target_partitions = 4;
        let plan = DistributedSafeJoins.optimize(plan, &config).unwrap();
        displayable(plan.as_ref()).indent(false).to_string()
    }

    #[test]
    fn build_side_outputs_become_partitioned() {
        for t in [
            JoinType::Left,
            JoinType::Full,
            JoinType::LeftSemi,
            JoinType::LeftAnti,
        ] {
            let text = rewrite(join(t, 3, false));
            assert!(text.contains("mode=Partitioned"), "{t}: {text}");
            assert_eq!(
                text.matches("RepartitionExec: partitioning=Hash").count(),
                2,
                "{text}"
            );
        }
    }

    #[test]
    fn probe_side_outputs_stay_broadcast() {
        for t in [
            JoinType::Inner,
            JoinType::Right,
            JoinType::RightSemi,
            JoinType::RightAnti,
        ] {
            let text = rewrite(join(t, 3, false));
            assert!(text.contains("mode=CollectLeft"), "{t}: {text}");
            assert!(!text.contains("RepartitionExec"), "{text}");
        }
        // One probe partition is one task: nothing to fix.
        let text = rewrite(join(JoinType::LeftSemi, 1, false));
        assert!(text.contains("mode=CollectLeft"), "{text}");
    }

    #[test]
    fn null_aware_anti_join_reads_its_probe_side_whole() {
        let text = rewrite(join(JoinType::LeftAnti, 3, true));
        assert!(text.contains("mode=CollectLeft"), "{text}");
        assert!(text.contains("CoalescePartitionsExec"), "{text}");
    }
}
