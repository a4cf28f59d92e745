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
//! two identical-looking scans may be filtered by different joins. Nor is one that evaluates
//! a volatile expression anywhere in its subtree (`random()`, `uuid()`, a volatile UDF): two
//! copies of it are two different results (see [`same_rows_every_time`]).

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use basin_connectors::iceberg::IcebergScanExec;
use basin_connectors::mongodb::MongoScanExec;
use basin_connectors::remote::RemoteScanExec;
use basin_connectors::tpch::TpchScanExec;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Volatility;
use datafusion::physical_expr::window::{
    PlainAggregateWindowExpr, SlidingAggregateWindowExpr, StandardWindowExpr, WindowExpr,
};
use datafusion::physical_expr::{LexOrdering, PhysicalExpr, PhysicalExprRef};
use datafusion::physical_expr_common::physical_expr::is_volatile;
use datafusion::physical_plan::Partitioning;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec, SymmetricHashJoinExec,
};
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::memory::LazyMemoryExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::partial_sort::PartialSortExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::{InterleaveExec, UnionExec};
use datafusion::physical_plan::unnest::UnnestExec;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec, WindowUDFExpr};
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
    if !same_rows_every_time(node) {
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

/// Whether every run of `plan` gives the same rows: no node of its subtree evaluates a
/// volatile expression (`random()`, `uuid()`, a scalar, aggregate or window function
/// declared [`Volatility::Volatile`]), and every node is one whose expressions are known
/// here. Two copies of `SELECT max(random()) FROM t` are two different values: sharing them
/// would make `(SELECT max(random()) FROM t) = (SELECT max(random()) FROM t)` true. Stable
/// functions (`now()`) have one value per query and may be shared. An unknown node (a new
/// DataFusion node, an async function) is never shared.
fn same_rows_every_time(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut same = true;
    let _ = plan.apply(|node| {
        same = match node_expressions(node.as_ref()) {
            Some(exprs) => !exprs.iter().any(is_volatile),
            None => false,
        };
        Ok(if same {
            TreeNodeRecursion::Continue
        } else {
            TreeNodeRecursion::Stop
        })
    });
    same
}

fn volatile_function(volatility: Volatility) -> bool {
    volatility == Volatility::Volatile
}

/// The expressions `node` evaluates (not those of its children), or `None` when it is a
/// node not known here or calls a volatile aggregate or window function.
fn node_expressions(node: &dyn ExecutionPlan) -> Option<Vec<Arc<dyn PhysicalExpr>>> {
    let any = node.as_any();
    let sorted = |ordering: &LexOrdering| ordering.iter().map(|s| Arc::clone(&s.expr)).collect();
    if let Some(p) = any.downcast_ref::<ProjectionExec>() {
        return Some(p.expr().iter().map(|e| Arc::clone(&e.expr)).collect());
    }
    if let Some(f) = any.downcast_ref::<FilterExec>() {
        return Some(vec![Arc::clone(f.predicate())]);
    }
    if let Some(a) = any.downcast_ref::<AggregateExec>() {
        let mut exprs: Vec<_> = a
            .group_expr()
            .expr()
            .iter()
            .map(|(e, _)| Arc::clone(e))
            .collect();
        exprs.extend(a.filter_expr().iter().flatten().cloned());
        for f in a.aggr_expr() {
            if volatile_function(f.fun().signature().volatility) {
                return None;
            }
            exprs.extend(f.expressions());
            exprs.extend(f.order_bys().iter().map(|s| Arc::clone(&s.expr)));
        }
        return Some(exprs);
    }
    if let Some(w) = any.downcast_ref::<BoundedWindowAggExec>() {
        return window_expressions(w.window_expr());
    }
    if let Some(w) = any.downcast_ref::<WindowAggExec>() {
        return window_expressions(w.window_expr());
    }
    let join = |on: &[(PhysicalExprRef, PhysicalExprRef)], filter: Option<&JoinFilter>| {
        let mut exprs: Vec<_> = on
            .iter()
            .flat_map(|(l, r)| [Arc::clone(l), Arc::clone(r)])
            .collect();
        exprs.extend(filter.map(|f| Arc::clone(f.expression())));
        exprs
    };
    if let Some(j) = any.downcast_ref::<HashJoinExec>() {
        return Some(join(j.on(), j.filter()));
    }
    if let Some(j) = any.downcast_ref::<SortMergeJoinExec>() {
        return Some(join(j.on(), j.filter().as_ref()));
    }
    if let Some(j) = any.downcast_ref::<SymmetricHashJoinExec>() {
        return Some(join(j.on(), j.filter()));
    }
    if let Some(j) = any.downcast_ref::<NestedLoopJoinExec>() {
        return Some(join(&[], j.filter()));
    }
    if let Some(s) = any.downcast_ref::<SortExec>() {
        return Some(sorted(s.expr()));
    }
    if let Some(s) = any.downcast_ref::<PartialSortExec>() {
        return Some(sorted(s.expr()));
    }
    if let Some(s) = any.downcast_ref::<SortPreservingMergeExec>() {
        return Some(sorted(s.expr()));
    }
    if let Some(r) = any.downcast_ref::<RepartitionExec>() {
        return Some(match r.partitioning() {
            Partitioning::Hash(exprs, _) => exprs.clone(),
            _ => vec![],
        });
    }
    if let Some(scan) = any.downcast_ref::<DataSourceExec>() {
        let source = scan.data_source().as_any();
        if source.is::<MemorySourceConfig>() {
            return Some(vec![]);
        }
        let config = source.downcast_ref::<FileScanConfig>()?;
        let file = config.file_source();
        let mut exprs: Vec<_> = file.filter().into_iter().collect();
        if let Some(projection) = file.projection() {
            exprs.extend(projection.iter().map(|p| Arc::clone(&p.expr)));
        }
        return Some(exprs);
    }
    // Nodes that evaluate no expression of their own. Basin's scans read what their spec
    // names: Iceberg predicates and remote SQL hold columns, literals and operators only.
    let plain = any.is::<CoalescePartitionsExec>()
        || any.is::<GlobalLimitExec>()
        || any.is::<LocalLimitExec>()
        || any.is::<UnionExec>()
        || any.is::<InterleaveExec>()
        || any.is::<CrossJoinExec>()
        || any.is::<EmptyExec>()
        || any.is::<PlaceholderRowExec>()
        || any.is::<UnnestExec>()
        || any.is::<LazyMemoryExec>()
        || any.is::<CooperativeExec>()
        || any.is::<TpchScanExec>()
        || any.is::<IcebergScanExec>()
        || any.is::<RemoteScanExec>()
        || any.is::<MongoScanExec>();
    plain.then(Vec::new)
}

/// The expressions of window functions, or `None` when one is volatile or not known here.
fn window_expressions(windows: &[Arc<dyn WindowExpr>]) -> Option<Vec<Arc<dyn PhysicalExpr>>> {
    let mut exprs = vec![];
    for w in windows {
        let any = w.as_any();
        let volatility = if let Some(a) = any.downcast_ref::<PlainAggregateWindowExpr>() {
            a.get_aggregate_expr().fun().signature().volatility
        } else if let Some(a) = any.downcast_ref::<SlidingAggregateWindowExpr>() {
            a.get_aggregate_expr().fun().signature().volatility
        } else if let Some(s) = any.downcast_ref::<StandardWindowExpr>() {
            let udf = s
                .get_standard_func_expr()
                .as_any()
                .downcast_ref::<WindowUDFExpr>()?;
            udf.fun().signature().volatility
        } else {
            return None;
        };
        if volatile_function(volatility) {
            return None;
        }
        exprs.extend(w.expressions());
        exprs.extend(w.partition_by().iter().cloned());
        exprs.extend(w.order_by().iter().map(|s| Arc::clone(&s.expr)));
    }
    Some(exprs)
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

    /// Identical aggregates over volatile expressions are two computations, each with its
    /// own values: in the aggregate, in a filter or projection below it, in a scalar UDF
    /// declared volatile. Stable functions (`now()`) are one value per query: shared.
    #[tokio::test]
    async fn volatile_aggregates_are_never_shared() {
        use datafusion::arrow::datatypes::DataType;
        use datafusion::logical_expr::{ColumnarValue, create_udf};
        let ctx = context().await;
        // A volatile UDF that returns its argument: only its declaration says volatile.
        ctx.register_udf(create_udf(
            "same_but_volatile",
            vec![DataType::Int32],
            DataType::Int32,
            Volatility::Volatile,
            Arc::new(|args: &[ColumnarValue]| Ok(args[0].clone())),
        ));
        for sql in [
            "SELECT (SELECT max(random()) FROM t) = (SELECT max(random()) FROM t)",
            "SELECT (SELECT max(uuid()) FROM t) = (SELECT max(uuid()) FROM t)",
            "SELECT (SELECT sum(v) FROM t WHERE random() < 0.5) AS a, \
             (SELECT sum(v) FROM t WHERE random() < 0.5) AS b",
            "WITH a AS (SELECT k, sum(v * random()) AS s FROM t GROUP BY k) \
             SELECT x.k, x.s = y.s FROM a x JOIN a y ON x.k = y.k",
            "WITH a AS (SELECT k, sum(same_but_volatile(v)) AS s FROM t GROUP BY k) \
             SELECT x.k, x.s, y.s FROM a x JOIN a y ON x.k = y.k",
        ] {
            let shared = share(plan(&ctx, sql).await);
            assert_eq!(
                count(&shared),
                0,
                "{sql}\n{}",
                displayable(shared.as_ref()).indent(true)
            );
        }
        let stable = "WITH a AS (SELECT k, sum(v) + extract(year FROM now()) AS s FROM t \
                      GROUP BY k) SELECT x.k, x.s, y.s FROM a x JOIN a y ON x.k = y.k";
        assert_eq!(count(&share(plan(&ctx, stable).await)), 2, "{stable}");
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
