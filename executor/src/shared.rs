//! Repeated aggregates computed once: a query that uses a grouped result twice (a CTE read
//! in the outer query and in a scalar subquery, TPC-H Q15's `revenue`) plans the same
//! aggregate twice, and DataFusion runs both. Before an executor runs a plan, every
//! aggregate that appears more than once, identical down to its scans, becomes one
//! [`SharedExec`] per appearance over a single copy of it: each partition is computed once,
//! by a task of its own, and every reader gets the same batches.
//!
//! ```text
//!  Join ─┬─ Aggregate(revenue) ─ scan          Join ─┬─ Shared ─┐
//!        └─ Aggregate(max) ─ Aggregate(revenue) ─ scan   =>   └─ Aggregate(max) ─ Shared ─┴─ Aggregate(revenue) ─ scan
//! ```
//!
//! Only aggregates are shared: their output (one row per group) is held until every reader
//! has it, and is no larger than the hash table the aggregate built anyway. A plan with a
//! dynamic filter (a hash join's bounds, pushed into a scan at run time) is never shared:
//! two identical-looking scans may be filtered by different joins.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
    displayable,
};
use datafusion_proto::physical_plan::{AsExecutionPlan, PhysicalExtensionCodec};
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt, TryStreamExt};

/// One partition's batches, or the error that ended it, as every reader gets them.
type Output = std::result::Result<Arc<Vec<RecordBatch>>, Arc<DataFusionError>>;

/// The computation of one partition, started by its first reader and awaited by all.
type Computation = Shared<BoxFuture<'static, Output>>;

/// What the [`SharedExec`]s of one aggregate have in common.
struct SharedState {
    input: Arc<dyn ExecutionPlan>,
    partitions: Mutex<HashMap<usize, Computation>>,
}

/// Rewrites `plan` so that each aggregate that appears more than once is computed once.
/// Two aggregates are the same when `codec` encodes their subtrees to the same bytes (what
/// an executor receives: tables, snapshots, files, in-memory rows, expressions).
pub fn share_repeated_aggregates(
    plan: Arc<dyn ExecutionPlan>,
    codec: &dyn PhysicalExtensionCodec,
) -> Arc<dyn ExecutionPlan> {
    // Each candidate's key, by the node it was computed for (the plan holds every node,
    // so the addresses stay valid), and how often each key occurs.
    let mut keys: HashMap<*const (), Vec<u8>> = HashMap::new();
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    let _ = plan.apply(|node| {
        if let Some(key) = shareable(node, codec) {
            *seen.entry(key.clone()).or_default() += 1;
            keys.insert(Arc::as_ptr(node) as *const (), key);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    tracing::debug!(
        aggregates = seen.len(),
        repeated = seen.values().filter(|n| **n > 1).count(),
        "looking for repeated aggregates"
    );
    seen.retain(|_, n| *n > 1);
    if seen.is_empty() {
        return plan;
    }
    let mut states: HashMap<Vec<u8>, Arc<SharedState>> = HashMap::new();
    // Top-down over the original nodes: a node is only replaced, never rebuilt, before its
    // subtree is visited, so each visited node is one `keys` has seen.
    let rewritten = plan.clone().transform_down(|node| {
        let key = keys.remove(&(Arc::as_ptr(&node) as *const ()));
        let Some(key) = key.filter(|k| seen.contains_key(k)) else {
            return Ok(Transformed::no(node));
        };
        let state = states
            .entry(key)
            .or_insert_with(|| {
                Arc::new(SharedState {
                    // The one copy every reader shares, with its decimal arithmetic made
                    // fast here (the rewrite of the whole plan leaves shared subtrees alone).
                    input: crate::fast::fast_expressions(node.clone()),
                    partitions: Mutex::new(HashMap::new()),
                })
            })
            .clone();
        let shared: Arc<dyn ExecutionPlan> = Arc::new(SharedExec { state });
        // Its own subtree is the shared one: nothing below it is rewritten again.
        Ok(Transformed::new(shared, true, TreeNodeRecursion::Jump))
    });
    match rewritten {
        Ok(t) => {
            tracing::debug!(
                aggregates = states.len(),
                "repeated aggregates computed once"
            );
            t.data
        }
        Err(e) => {
            tracing::debug!(error = %e, "repeated aggregates not shared");
            plan
        }
    }
}

/// The identity of `node` when it is an aggregate that may be shared: its subtree, encoded.
fn shareable(node: &Arc<dyn ExecutionPlan>, codec: &dyn PhysicalExtensionCodec) -> Option<Vec<u8>> {
    let agg = node.as_any().downcast_ref::<AggregateExec>()?;
    // A partial aggregate is half of one: the final step above it is what repeats.
    if matches!(agg.mode(), AggregateMode::Partial) {
        return None;
    }
    // A dynamic filter encodes as what it is before the query runs, not as the join that
    // will fill it in.
    if displayable(node.as_ref())
        .indent(true)
        .to_string()
        .contains("DynamicFilter")
    {
        return None;
    }
    let mut bytes = vec![];
    let encoded = PhysicalPlanNode::try_from_physical_plan(node.clone(), codec)
        .and_then(|encoded| encoded.try_encode(&mut bytes));
    match encoded {
        Ok(()) => Some(bytes),
        Err(e) => {
            tracing::debug!(error = %e, "an aggregate that cannot be encoded is not shared");
            None
        }
    }
}

/// One appearance of a shared aggregate: reads the batches its first reader's task computes.
pub struct SharedExec {
    state: Arc<SharedState>,
}

impl fmt::Debug for SharedExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedExec").finish_non_exhaustive()
    }
}

impl DisplayAs for SharedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SharedExec: computed once for every reader")
    }
}

impl ExecutionPlan for SharedExec {
    fn name(&self) -> &str {
        "SharedExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.state.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.state.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => {
                if Arc::ptr_eq(&input, &self.state.input) {
                    return Ok(self);
                }
                // A different input is computed for this reader alone.
                Ok(Arc::new(SharedExec {
                    state: Arc::new(SharedState {
                        input,
                        partitions: Mutex::new(HashMap::new()),
                    }),
                }))
            }
            _ => Err(DataFusionError::Internal(
                "SharedExec has exactly one child".into(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let computation = {
            let mut partitions = self
                .state
                .partitions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match partitions.get(&partition) {
                Some(c) => c.clone(),
                None => {
                    // Run by a task of its own, not by whichever reader polls first: a
                    // reader that is not polled (the probe side of a join whose build side
                    // is the other reader) must not hold the others up. The task is
                    // aborted when every reader is gone.
                    let stream = self.state.input.execute(partition, context)?;
                    let task = SpawnedTask::spawn(async move {
                        stream.try_collect::<Vec<_>>().await.map(Arc::new)
                    });
                    let c: Computation = async move {
                        match task.join().await {
                            Ok(Ok(batches)) => Ok(batches),
                            Ok(Err(e)) => Err(Arc::new(e)),
                            Err(e) => Err(Arc::new(DataFusionError::ExecutionJoin(Box::new(e)))),
                        }
                    }
                    .boxed()
                    .shared();
                    partitions.insert(partition, c.clone());
                    c
                }
            }
        };
        let batches = futures::stream::once(computation)
            .map(|output| match output {
                Ok(batches) => {
                    futures::stream::iter(batches.iter().cloned().map(Ok).collect::<Vec<_>>())
                        .left_stream()
                }
                Err(e) => futures::stream::once(async move { Err(DataFusionError::Shared(e)) })
                    .right_stream(),
            })
            .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            batches,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;

    async fn context() -> SessionContext {
        let ctx = SessionContext::new();
        ctx.sql(
            "CREATE TABLE t (k INT, v INT) AS VALUES (1, 10), (1, 20), (2, 5), (3, 30), \
             (NULL, 7), (3, 0)",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
        ctx
    }

    fn share(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        share_repeated_aggregates(
            plan,
            &datafusion_proto::physical_plan::DefaultPhysicalExtensionCodec {},
        )
    }

    /// The number of `SharedExec`s, after checking that they all read one computation.
    fn count(plan: &Arc<dyn ExecutionPlan>) -> usize {
        let mut states = vec![];
        plan.apply(|node| {
            if let Some(shared) = node.as_any().downcast_ref::<SharedExec>() {
                states.push(shared.state.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        assert!(states.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
        states.len()
    }

    /// A new physical plan of `sql` (a plan runs once: its repartitions hand their
    /// partitions out once).
    async fn plan(ctx: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
        ctx.sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap()
    }

    async fn rows(ctx: &SessionContext, plan: Arc<dyn ExecutionPlan>) -> Vec<String> {
        let batches = collect(plan, ctx.task_ctx()).await.unwrap();
        let text = pretty_format_batches(&batches).unwrap().to_string();
        let mut rows: Vec<String> = text.lines().skip(3).map(str::to_string).collect();
        rows.sort();
        rows
    }

    #[tokio::test]
    async fn a_cte_used_twice_is_aggregated_once_with_the_same_rows() {
        let ctx = context().await;
        for sql in [
            // TPC-H Q15's shape: the groups, and their maximum in a scalar subquery.
            "WITH a AS (SELECT k, sum(v) AS s FROM t GROUP BY k) \
             SELECT k, s FROM a WHERE s = (SELECT max(s) FROM a)",
            // Both readers join the same groups.
            "WITH a AS (SELECT k, count(*) AS c FROM t GROUP BY k) \
             SELECT x.k, x.c, y.c FROM a x JOIN a y ON x.k = y.k",
        ] {
            // The expected rows come from a plan of their own.
            let expected = rows(&ctx, plan(&ctx, sql).await).await;
            let shared = share(plan(&ctx, sql).await);
            assert_eq!(
                count(&shared),
                2,
                "{}",
                displayable(shared.as_ref()).indent(true)
            );
            assert_eq!(rows(&ctx, shared).await, expected, "{sql}");
        }
    }

    /// The decimal rewrite that runs after sharing (as on the executor) keeps one shared
    /// copy, and that copy has its arithmetic rewritten.
    #[tokio::test]
    async fn shared_aggregates_stay_shared_through_the_decimal_rewrite() {
        let ctx = context().await;
        let sql = "WITH a AS (SELECT k, sum(CAST(v AS DECIMAL(15, 2)) * (1 - CAST(k AS DECIMAL(15, 2)))) \
             AS s FROM t GROUP BY k) SELECT k, s FROM a WHERE s = (SELECT max(s) FROM a)";
        let expected = rows(&ctx, plan(&ctx, sql).await).await;
        let both = crate::fast::fast_expressions(share(plan(&ctx, sql).await));
        assert_eq!(
            count(&both),
            2,
            "{}",
            displayable(both.as_ref()).indent(true)
        );
        let mut fast = 0;
        both.apply(|node| {
            if let Some(shared) = node.as_any().downcast_ref::<SharedExec>() {
                shared.state.input.apply(|n| {
                    if let Some(a) = n.as_any().downcast_ref::<AggregateExec>() {
                        fast += a.aggr_expr()[0]
                            .expressions()
                            .iter()
                            .filter(|e| e.as_any().is::<crate::decimal::DecimalArithmetic>())
                            .count();
                    }
                    Ok(TreeNodeRecursion::Continue)
                })?;
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        assert!(fast > 0, "{}", displayable(both.as_ref()).indent(true));
        assert_eq!(rows(&ctx, both).await, expected);
    }

    #[tokio::test]
    async fn different_aggregates_are_left_alone() {
        let ctx = context().await;
        for sql in [
            "SELECT k, s FROM (SELECT k, sum(v) AS s FROM t GROUP BY k) a \
             WHERE s = (SELECT max(v) FROM t WHERE k > 1)",
            // Two in-memory tables that display alike (`partition_sizes=[1]`) but hold
            // different rows.
            "WITH a AS (SELECT k, sum(v) AS s FROM (VALUES (1, 2), (2, 3)) x(k, v) GROUP BY k), \
             b AS (SELECT k, sum(v) AS s FROM (VALUES (1, 5), (2, 7)) x(k, v) GROUP BY k) \
             SELECT a.k, a.s, b.s FROM a JOIN b ON a.k = b.k",
        ] {
            assert_eq!(count(&share(plan(&ctx, sql).await)), 0, "{sql}");
        }
    }
}
