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
        on_collect_left_joins(plan, |join| {
            if !emits_build_rows_after_probe(*join.join_type())
                || join.right().output_partitioning().partition_count() <= 1
            {
                return Ok(None);
            }
            let rebuild = |mode, build, probe| {
                join.builder()
                    .with_partition_mode(mode)
                    .with_new_children(vec![build, probe])?
                    .recompute_properties()
                    .reset_state()
                    .build_exec()
                    .map(Some)
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
    }

    fn name(&self) -> &str {
        "basin_distributed_safe_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Hash tables built from the side with fewer rows.
///
/// DataFusion's join selection puts the side with fewer *bytes* on the build side when both
/// sides have a byte estimate. A projection estimates its bytes from its columns' widths, a
/// filter scales its input's — so a key column of many rows can look smaller than a few rows
/// of several columns. TPC-H Q4 built its `EXISTS` hash table from the 3.8 million lineitems
/// (one 8-byte key each, estimated 9.6 MB) instead of the 57,000 orders it probes (estimated
/// 11.3 MB with their priority strings). Building costs per row (hash, insert, a chain entry)
/// more than probing does, so [`SmallerBuildSide`], run right after DataFusion's join
/// selection, swaps a collected build side that has more than twice the rows of the probe
/// side, when both sides have a row estimate and the probe side is not much wider in bytes
/// (at most four times).
#[derive(Debug, Default)]
pub struct SmallerBuildSide;

impl PhysicalOptimizerRule for SmallerBuildSide {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        on_collect_left_joins(plan, |join| {
            if !join.join_type().supports_swap()
                || join.null_aware
                || !more_rows_than_twice(join.left().as_ref(), join.right().as_ref())?
            {
                return Ok(None);
            }
            join.swap_inputs(PartitionMode::CollectLeft).map(Some)
        })
    }

    fn name(&self) -> &str {
        "basin_smaller_build_side"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with each hash join that collects its build side (bottom up) replaced by what
/// `rewrite` makes of it, or kept when it makes nothing.
fn on_collect_left_joins(
    plan: Arc<dyn ExecutionPlan>,
    rewrite: impl Fn(&HashJoinExec) -> Result<Option<Arc<dyn ExecutionPlan>>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    crate::rewrite_each(plan, |join: &HashJoinExec| match join.partition_mode() {
        PartitionMode::CollectLeft => rewrite(join),
        _ => Ok(None),
    })
}

/// Whether `build` has more than twice the rows of `probe` by their estimates, and `probe` is
/// at most four times `build`'s bytes (when both are estimated).
fn more_rows_than_twice(build: &dyn ExecutionPlan, probe: &dyn ExecutionPlan) -> Result<bool> {
    let (b, p) = (
        build.partition_statistics(None)?,
        probe.partition_statistics(None)?,
    );
    let (Some(build_rows), Some(probe_rows)) = (b.num_rows.get_value(), p.num_rows.get_value())
    else {
        return Ok(false);
    };
    let narrow_enough = match (b.total_byte_size.get_value(), p.total_byte_size.get_value()) {
        (Some(build_bytes), Some(probe_bytes)) => *probe_bytes <= build_bytes.saturating_mul(4),
        _ => true,
    };
    Ok(*build_rows > probe_rows.saturating_mul(2) && narrow_enough)
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

    /// A session that collects build sides and runs [`SmallerBuildSide`] after the join
    /// selection (or not).
    async fn collecting(with_rule: bool) -> datafusion::prelude::SessionContext {
        use datafusion::execution::SessionStateBuilder;
        use datafusion::prelude::{SessionConfig, SessionContext};
        let mut config = SessionConfig::new().with_target_partitions(2);
        let optimizer = &mut config.options_mut().optimizer;
        optimizer.hash_join_single_partition_threshold = usize::MAX;
        optimizer.hash_join_single_partition_threshold_rows = usize::MAX;
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_config(config)
            .build();
        let mut rules = state.physical_optimizers().to_vec();
        if with_rule {
            let at = rules
                .iter()
                .position(|r| r.name() == "join_selection")
                .unwrap();
            rules.insert(at + 1, Arc::new(SmallerBuildSide));
        }
        let ctx = SessionContext::new_with_state(
            SessionStateBuilder::new_from_existing(state)
                .with_physical_optimizer_rules(rules)
                .build(),
        );
        // Few orders with wide rows; many line items of one key column each.
        ctx.sql(
            "CREATE TABLE o AS SELECT value AS k, repeat('x', 500) AS note \
             FROM generate_series(1, 40) AS t(value)",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
        ctx.sql(
            "CREATE TABLE l AS SELECT value % 50 AS k FROM generate_series(1, 3000) AS t(value)",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
        ctx
    }

    #[tokio::test]
    async fn the_side_with_fewer_rows_is_built() {
        let sql = "SELECT k, note FROM o WHERE EXISTS (SELECT 1 FROM l WHERE l.k = o.k) \
                   ORDER BY k";
        let mut answers = vec![];
        for with_rule in [false, true] {
            let ctx = collecting(with_rule).await;
            let df = ctx.sql(sql).await.unwrap();
            let plan = df.clone().create_physical_plan().await.unwrap();
            let text = displayable(plan.as_ref()).indent(false).to_string();
            // Built from the orders, the join keeps the rows of its build side.
            let built_from_orders = text.contains("join_type=LeftSemi");
            assert_eq!(built_from_orders, with_rule, "{text}");
            answers.push(df.collect().await.unwrap());
        }
        assert_eq!(answers[0], answers[1]);
        assert_eq!(answers[1].iter().map(|b| b.num_rows()).sum::<usize>(), 40);
    }

    #[test]
    fn null_aware_anti_join_reads_its_probe_side_whole() {
        let text = rewrite(join(JoinType::LeftAnti, 3, true));
        assert!(text.contains("mode=CollectLeft"), "{text}");
        assert!(text.contains("CoalescePartitionsExec"), "{text}");
    }
}
