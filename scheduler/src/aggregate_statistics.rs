//! Aggregates answered from statistics only where the statistics are a source's own.
//!
//! DataFusion's physical rule `aggregate_statistics` replaces `count(*)` (and `min`/`max`)
//! by a literal when its input reports an exact row count. In DataFusion 53.1 a count can be
//! exact without being true: a join estimated at `Inexact(0)` rows comes out of
//! `HashJoinExec`'s statistics as `Exact(0)` (`Statistics::with_fetch` turns every zero exact,
//! apache/datafusion#22413, fixed after 53.1 by #22146), and semi joins estimate zero rows
//! whenever *any* column of one input, key or not, has bounds that miss those of the
//! column at the same position in the other (apache/datafusion#22673). So
//! `SELECT count(*) FROM (SELECT DISTINCT x FROM a WHERE k IN (SELECT k FROM b))`
//! answered 0 instead of 2 when `a.x` ran 100..200 and `b.k` 1..2, over Iceberg tables and
//! DataFusion's own Parquet tables alike; Basin's semi joins (`semijoin.rs`, `prefilter.rs`)
//! make such plans more common.
//!
//! [`AggregateStatisticsOverScans`] takes the place of DataFusion's rule and runs it only on
//! subtrees whose every node passes its input's rows on without estimating them: scans and
//! other leaves, projections, exchanges, sorts, limits, unions and the aggregates themselves.
//! A count over a join or a filter is computed, as it would be for an inexact count.
//! `count(*)` of a table (the case the rule is for) is still answered from its metadata.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::aggregate_statistics::AggregateStatistics;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::union::UnionExec;

/// The name of DataFusion's rule, which [`answer_from_scans_only`] replaces.
const REPLACED: &str = "aggregate_statistics";

/// DataFusion's `aggregate_statistics`, applied only where no node estimated the rows.
#[derive(Debug, Default)]
pub struct AggregateStatisticsOverScans {
    inner: AggregateStatistics,
}

impl PhysicalOptimizerRule for AggregateStatisticsOverScans {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if passes_rows_on(plan.as_ref()) {
            return self.inner.optimize(plan, config);
        }
        plan.map_children(|child| self.optimize(child, config).map(Transformed::yes))
            .map(|t| t.data)
    }

    fn name(&self) -> &str {
        REPLACED
    }

    /// As DataFusion's rule: a literal in place of a count changes nullability.
    fn schema_check(&self) -> bool {
        false
    }
}

/// Whether every node of `plan` is a leaf or hands on its input's rows without estimating
/// how many there are (its row count is its input's, exactly when the input's is).
fn passes_rows_on(plan: &dyn ExecutionPlan) -> bool {
    let any = plan.as_any();
    let passes = plan.children().is_empty()
        || any.is::<AggregateExec>()
        || any.is::<ProjectionExec>()
        || any.is::<CoalescePartitionsExec>()
        || any.is::<CooperativeExec>()
        || any.is::<RepartitionExec>()
        || any.is::<SortExec>()
        || any.is::<SortPreservingMergeExec>()
        || any.is::<GlobalLimitExec>()
        || any.is::<LocalLimitExec>()
        || any.is::<UnionExec>();
    passes && plan.children().iter().all(|c| passes_rows_on(c.as_ref()))
}

/// DataFusion's physical optimizer with [`AggregateStatisticsOverScans`] in the place of its
/// rule.
pub fn physical_optimizer() -> PhysicalOptimizer {
    let mut rules = PhysicalOptimizer::new().rules;
    answer_from_scans_only(&mut rules);
    PhysicalOptimizer::with_rules(rules)
}

/// Puts [`AggregateStatisticsOverScans`] in the place of DataFusion's rule in `rules` (a
/// session's physical optimizer rules, in order).
pub fn answer_from_scans_only(rules: &mut [Arc<dyn PhysicalOptimizerRule + Send + Sync>]) {
    for rule in rules.iter_mut() {
        if rule.name() == REPLACED {
            *rule = Arc::new(AggregateStatisticsOverScans::default());
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::SessionContext;

    use super::*;

    /// A session over two Parquet tables whose first columns' bounds do not meet: `a(x, k)`
    /// with `x` in 100..200 and `b(k)` with `k` in 1..2.
    /// A session and its folder of Parquet files, removed when dropped.
    struct Session(SessionContext, std::path::PathBuf);

    impl Drop for Session {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }

    async fn context(replace: bool) -> Session {
        let mut state = SessionStateBuilder::new().with_default_features().build();
        let mut rules = state.physical_optimizers().to_vec();
        if replace {
            answer_from_scans_only(&mut rules);
        }
        state = SessionStateBuilder::new_from_existing(state)
            .with_physical_optimizer_rules(rules)
            .build();
        let ctx = SessionContext::new_with_state(state);
        // One folder per session: the tests run at once in one process.
        static SESSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let session = SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "basin-aggregate-statistics-{}-{session}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.parquet"), dir.join("b.parquet"));
        for sql in [
            format!(
                "COPY (SELECT * FROM (VALUES (100, 1), (150, 2), (200, 3)) AS v(x, k)) \
                 TO '{}' STORED AS PARQUET",
                a.display()
            ),
            format!(
                "COPY (SELECT * FROM (VALUES (1), (2)) AS v(k)) TO '{}' STORED AS PARQUET",
                b.display()
            ),
            format!(
                "CREATE EXTERNAL TABLE a STORED AS PARQUET LOCATION '{}'",
                a.display()
            ),
            format!(
                "CREATE EXTERNAL TABLE b STORED AS PARQUET LOCATION '{}'",
                b.display()
            ),
        ] {
            ctx.sql(&sql).await.unwrap().collect().await.unwrap();
        }
        Session(ctx, dir)
    }

    async fn count(ctx: &SessionContext, sql: &str) -> (i64, String) {
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.clone().create_physical_plan().await.unwrap();
        let text = displayable(plan.as_ref()).indent(false).to_string();
        let batches = df.collect().await.unwrap();
        let n = batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .unwrap()
            .value(0);
        (n, text)
    }

    #[tokio::test]
    async fn a_count_over_a_semi_join_is_computed() {
        let sql = "SELECT count(*) FROM (SELECT DISTINCT x FROM a WHERE k IN (SELECT k FROM b))";
        // DataFusion 53.1 alone: the semi join's estimate of no rows is taken as exact.
        let (n, plan) = count(&context(false).await.0, sql).await;
        assert_eq!(n, 0, "DataFusion fixed apache/datafusion#22413? {plan}");
        let (n, plan) = count(&context(true).await.0, sql).await;
        assert_eq!(n, 2, "{plan}");
        assert!(plan.contains("HashJoinExec"), "{plan}");
    }

    #[tokio::test]
    async fn a_count_of_a_table_is_still_answered_from_its_statistics() {
        let (n, plan) = count(&context(true).await.0, "SELECT count(*) FROM a").await;
        assert_eq!(n, 3);
        assert!(plan.contains("PlaceholderRowExec"), "{plan}");
        assert!(!plan.contains("DataSourceExec"), "{plan}");
    }
}
