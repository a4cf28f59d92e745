//! Front-end sessions: what a client (the `basin` CLI today, Flight SQL later) talks to.
//! Statements are parsed and planned here against the configured catalogs; queries run as
//! Ballista jobs on the cluster.

use std::sync::Arc;
use std::time::Duration;

use crate::joins::SmallerBuildSide;
use crate::notin::NotInAsAntiJoin;
use crate::prefilter::{PrefilterGroups, PrefilterScans};
use crate::semijoin::PushDownSemiJoins;
use crate::series::SeriesProjections;
use crate::volatile::{MarkVolatileSubqueries, UnmarkVolatileSubqueries};
use crate::window::AggregateSubqueryAsWindow;
use async_trait::async_trait;
use ballista_core::extension::{SessionConfigExt, SessionStateExt};
use ballista_core::planner::BallistaQueryPlanner;
use basin_connectors::catalogs::{register_catalogs, register_functions, runtime_env};
use basin_connectors::codec::portable_names;
use basin_connectors::iceberg::{
    IcebergAlterTable, IcebergCommitExec, IcebergCreateTable, IcebergDdl, IcebergDdlExec,
    IcebergDeleteExec, IcebergMergeNode, IcebergProcedure, IcebergProcedureExec,
    IcebergRewriteNode, IcebergRowChangeExec, IcebergTableProvider, IcebergWriteNode, Overwrite,
    Procedure, RowChange, WriteSpec, by_whole_files, no_change, plan_optimize, plan_rewrite,
    row_change_plan,
};
use basin_connectors::mongodb::MongoPushdown;
use basin_connectors::portable::portable_plan;
use basin_connectors::remote::RemotePushdown;
use basin_core::BasinConfig;
use basin_core::cluster::ClusterKey;
use datafusion::common::DFSchema;
use datafusion::common::format::ExplainFormat;
use datafusion::config::OptimizerOptions;
use datafusion::datasource::{MemTable, source_as_provider};
use datafusion::error::DataFusionError;
use datafusion::error::Result;
use datafusion::execution::SessionState;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{DmlStatement, Extension, LogicalPlan, WriteOp};
use datafusion::logical_expr::{PlanType, StringifiedPlan, ToStringifiedPlan};
use datafusion::physical_plan::explain::ExplainExec;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion::prelude::SessionContext;
use datafusion_proto::protobuf::LogicalPlanNode;

use crate::server::{ClusterView, ExecutorInfo};
use crate::session::base_config;
use crate::streamed;

/// Opens a session on the scheduler at `scheduler_url` (`http://host:port`) with the
/// catalogs of `config`. `task_slots` is the cluster's total task slots: the default number
/// of partitions of a query. With `cluster` (the session lives in the scheduler's process),
/// queries of one stage stream from the executors instead of running as Ballista jobs
/// ([`crate::streamed`]; `[server] streamed_stages` turns this off).
pub fn connect(
    config: &BasinConfig,
    scheduler_url: &str,
    task_slots: usize,
    cluster: Option<ClusterView>,
) -> Result<SessionContext> {
    let partitions = if config.server.target_partitions > 0 {
        config.server.target_partitions
    } else {
        task_slots.max(1)
    };
    let mut session_config = base_config().with_target_partitions(partitions);
    // Calls to the scheduler and the executors prove they come from the cluster.
    if let Some(key) = config.cluster.key() {
        session_config = basin_connectors::cluster::with_key(session_config, Some(&key))
            .with_ballista_override_create_grpc_client_endpoint(
                basin_connectors::cluster::endpoint_override(&key),
            );
    }
    // What runs here (merges of streamed results, writes to memory tables) is bounded too.
    let base = runtime_env(config)?;
    let runtime = RuntimeEnvBuilder::from_runtime_env(&base)
        .with_memory_pool(crate::memory::front_end_pool(config))
        .build_arc()?;
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(session_config)
        .with_runtime_env(runtime)
        .build()
        .upgrade_for_ballista(scheduler_url.to_string())?;
    let cluster = cluster.filter(|_| config.server.streamed_stages);
    let planner = BasinQueryPlanner::new(
        scheduler_url,
        &state,
        cluster,
        config.server.single_node_max_bytes,
        config.server.streamed_exchanges,
    );
    // Build sides by rows right after DataFusion's join selection, before distribution and
    // sorting are settled around them.
    let mut physical_rules = state.physical_optimizers().to_vec();
    crate::aggregate_statistics::answer_from_scans_only(&mut physical_rules);
    let after_join_selection = physical_rules
        .iter()
        .position(|rule| rule.name() == "join_selection")
        .map_or(physical_rules.len(), |at| at + 1);
    physical_rules.insert(after_join_selection, Arc::new(SmallerBuildSide));
    // Semi joins estimated by their keys before the join selection reads the estimates.
    physical_rules.insert(
        after_join_selection.saturating_sub(1),
        Arc::new(crate::semi_join_keys::SemiJoinKeysFirst),
    );
    let mut builder = SessionStateBuilder::new_from_existing(state);
    if let Some(optimizer) = builder.optimizer() {
        crate::distinct::keep_distinct_types(&mut optimizer.rules);
    }
    let state = builder
        .with_physical_optimizer_rules(physical_rules)
        .with_query_planner(Arc::new(planner))
        .with_optimizer_rule(Arc::new(RemotePushdown))
        .with_optimizer_rule(Arc::new(MongoPushdown))
        .with_optimizer_rule(Arc::new(NotInAsAntiJoin))
        .with_optimizer_rule(Arc::new(AggregateSubqueryAsWindow))
        .with_optimizer_rule(Arc::new(PrefilterGroups))
        .with_optimizer_rule(Arc::new(PushDownSemiJoins))
        .with_optimizer_rule(Arc::new(PrefilterScans))
        .with_optimizer_rule(Arc::new(UnmarkVolatileSubqueries))
        .with_analyzer_rule(Arc::new(MarkVolatileSubqueries))
        .with_physical_optimizer_rule(Arc::new(SeriesProjections))
        .with_physical_optimizer_rule(Arc::new(crate::empty_projections::EmptyProjectionsTravel))
        .with_physical_optimizer_rule(Arc::new(
            crate::aggregate_names::ReversedAggregatesKeepNames,
        ))
        .build();
    let ctx = SessionContext::new_with_state(state);
    register_catalogs(&ctx, config, partitions)?;
    register_functions(&ctx);
    Ok(ctx)
}

/// Handles `USE catalog[.schema]` (which DataFusion does not plan): checks that the catalog
/// and schema exist and makes them the session's defaults. Returns `None` for any other SQL.
pub fn try_use_statement(ctx: &SessionContext, sql: &str) -> Option<Result<()>> {
    let text = sql.trim().trim_end_matches(';').trim();
    let (keyword, rest) = text.split_once(char::is_whitespace)?;
    if !keyword.eq_ignore_ascii_case("use") {
        return None;
    }
    let parts: Vec<String> = rest
        .trim()
        .split('.')
        .map(|p| {
            let p = p.trim();
            if p.len() >= 2 && p.starts_with('"') && p.ends_with('"') {
                p[1..p.len() - 1].to_string()
            } else {
                p.to_ascii_lowercase()
            }
        })
        .collect();
    Some(use_names(ctx, &parts))
}

fn use_names(ctx: &SessionContext, parts: &[String]) -> Result<()> {
    use datafusion::error::DataFusionError;
    let state = ctx.state();
    let current_catalog = state.config_options().catalog.default_catalog.clone();
    let (catalog, schema) = match parts {
        [one] if ctx.catalog(one).is_some() => (one.clone(), None),
        [one] => (current_catalog, Some(one.clone())),
        [c, s] => (c.clone(), Some(s.clone())),
        _ => {
            return Err(DataFusionError::Plan(
                "USE takes a catalog, a schema, or catalog.schema".to_string(),
            ));
        }
    };
    let provider = ctx.catalog(&catalog).ok_or_else(|| {
        DataFusionError::Plan(format!(
            "catalog `{catalog}` not found; SHOW CATALOGS lists the catalogs"
        ))
    })?;
    let schema = match schema {
        Some(s) => s,
        None => provider
            .schema_names()
            .into_iter()
            .next()
            .unwrap_or_else(|| "public".to_string()),
    };
    if provider.schema(&schema).is_none() {
        return Err(DataFusionError::Plan(format!(
            "schema `{catalog}.{schema}` not found"
        )));
    }
    let state_ref = ctx.state_ref();
    let mut state = state_ref.write();
    let options = state.config_mut().options_mut();
    options.catalog.default_catalog = catalog;
    options.catalog.default_schema = schema;
    Ok(())
}

/// Plans queries as Ballista jobs, except changes to front-end memory tables, which live in
/// this process and run here.
struct BasinQueryPlanner {
    distributed: BallistaQueryPlanner<LogicalPlanNode>,
    local: DefaultPhysicalPlanner,
    /// The cluster, when queries of one stage may stream from its executors.
    cluster: Option<ClusterView>,
    /// `[server] single_node_max_bytes`: small queries run whole on one executor.
    single_node_max_bytes: u64,
    /// `[server] streamed_exchanges`: bigger ones run in stages streaming to each other.
    streamed_exchanges: bool,
    /// Where jobs go (and are cancelled when nobody reads them any more).
    scheduler_url: String,
}

impl std::fmt::Debug for BasinQueryPlanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasinQueryPlanner").finish_non_exhaustive()
    }
}

impl BasinQueryPlanner {
    fn new(
        scheduler_url: &str,
        state: &SessionState,
        cluster: Option<ClusterView>,
        single_node_max_bytes: u64,
        streamed_exchanges: bool,
    ) -> Self {
        let config = state.config().ballista_config();
        Self {
            distributed: BallistaQueryPlanner::with_extension(
                scheduler_url.to_string(),
                config,
                state.config().ballista_logical_extension_codec(),
            ),
            local: DefaultPhysicalPlanner::default(),
            cluster,
            single_node_max_bytes,
            streamed_exchanges,
            scheduler_url: scheduler_url.to_string(),
        }
    }
}

impl BasinQueryPlanner {
    /// Iceberg DDL runs here; an Iceberg INSERT is a distributed write job whose files are
    /// committed here, in one snapshot.
    async fn plan_iceberg(
        &self,
        plan: &LogicalPlan,
        state: &SessionState,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        match plan {
            LogicalPlan::Extension(ext) => {
                if let Some(node) = ext.node.as_any().downcast_ref::<IcebergCreateTable>() {
                    return Ok(Some(Arc::new(IcebergDdlExec::new(
                        IcebergDdl::CreateTable(Box::new(node.clone())),
                        state.clone(),
                    ))));
                }
                if let Some(node) = ext.node.as_any().downcast_ref::<IcebergAlterTable>() {
                    return Ok(Some(Arc::new(IcebergDdlExec::new(
                        IcebergDdl::AlterTable(node.clone()),
                        state.clone(),
                    ))));
                }
                if let Some(node) = ext.node.as_any().downcast_ref::<IcebergProcedure>() {
                    if let Procedure::Optimize {
                        file_size_threshold,
                        filter,
                    } = &node.procedure
                    {
                        return self
                            .plan_optimize(node, *file_size_threshold, filter.as_deref(), state)
                            .await
                            .map(Some);
                    }
                    return Ok(Some(Arc::new(IcebergProcedureExec::new(node.clone()))));
                }
                if let Some(node) = ext.node.as_any().downcast_ref::<IcebergMergeNode>() {
                    let mut spec = WriteSpec::new(&node.target);
                    spec.merge = true;
                    let input = crate::prefilter::without_prefilters(&node.input)?;
                    let write = LogicalPlan::Extension(Extension {
                        node: Arc::new(IcebergWriteNode::new(spec.clone(), input)?),
                    });
                    let write = portable_names(write)?;
                    let job = self.distributed.create_physical_plan(&write, state).await?;
                    return Ok(Some(Arc::new(IcebergRowChangeExec::merge(
                        node.catalog.clone(),
                        node.target.ident()?,
                        spec,
                        node.target.snapshot_id,
                        job,
                    ))));
                }
                Ok(None)
            }
            LogicalPlan::Dml(DmlStatement {
                target, op, input, ..
            }) => {
                let Ok(provider) = source_as_provider(target) else {
                    return Ok(None);
                };
                let Some(table) = provider.as_any().downcast_ref::<IcebergTableProvider>() else {
                    return Ok(None);
                };
                let name = table.spec().qualified_name();
                if table.spec().time_travel {
                    return Err(DataFusionError::Plan(format!(
                        "cannot write to an old version of `{name}`"
                    )));
                }
                let catalog = table.catalog().cloned().ok_or_else(|| {
                    DataFusionError::Internal(format!("`{name}` was loaded without its catalog"))
                })?;
                if *op == WriteOp::Truncate {
                    return Ok(Some(Arc::new(IcebergDeleteExec::new(
                        catalog,
                        table.spec().ident()?,
                        provider.schema(),
                        None,
                    ))));
                }
                if matches!(op, WriteOp::Delete | WriteOp::Update) {
                    let change = if *op == WriteOp::Delete {
                        RowChange::Delete
                    } else {
                        RowChange::Update
                    };
                    let plan = row_change_plan(input, change, &name, &provider.schema())?;
                    if change == RowChange::Delete
                        && plan
                            .condition
                            .as_ref()
                            .is_none_or(|c| by_whole_files(c, &table.spec().metadata))
                    {
                        return Ok(Some(Arc::new(IcebergDeleteExec::new(
                            catalog,
                            table.spec().ident()?,
                            provider.schema(),
                            plan.condition,
                        ))));
                    }
                    let target_partitions = state.config().target_partitions();
                    let (Some(read_snapshot), Some(spec)) = (
                        table.spec().snapshot_id,
                        plan_rewrite(table.spec(), &plan, target_partitions).await?,
                    ) else {
                        return Ok(Some(no_change()?));
                    };
                    let node = LogicalPlan::Extension(Extension {
                        node: Arc::new(IcebergRewriteNode::new(spec.clone())?),
                    });
                    let job = self.distributed.create_physical_plan(&node, state).await?;
                    return Ok(Some(Arc::new(IcebergRowChangeExec::rewrite(
                        catalog,
                        table.spec().ident()?,
                        &spec,
                        read_snapshot,
                        job,
                    ))));
                }
                let overwrite = *op == WriteOp::Insert(InsertOp::Overwrite);
                if overwrite && table.spec().metadata.partition_specs_iter().count() > 1 {
                    return Err(DataFusionError::NotImplemented(format!(
                        "INSERT OVERWRITE of `{name}`: the table's partitioning has changed \
                         (it has several partition specs); overwriting partitions across specs \
                         is not supported yet"
                    )));
                }
                if *op != WriteOp::Insert(InsertOp::Append) && !overwrite {
                    return Err(DataFusionError::NotImplemented(format!(
                        "{op} on Iceberg table `{name}` is not supported yet; Basin supports \
                         INSERT INTO, INSERT OVERWRITE, CREATE TABLE ... AS SELECT, DELETE, \
                         UPDATE and TRUNCATE TABLE"
                    )));
                }
                let spec = WriteSpec::new(table.spec());
                let input = crate::prefilter::without_prefilters(input)?;
                let node = IcebergWriteNode::new(spec.clone(), input)?;
                let write = LogicalPlan::Extension(Extension {
                    node: Arc::new(node),
                });
                let write = portable_names(write)?;
                let job = self.distributed.create_physical_plan(&write, state).await?;
                let commit = IcebergCommitExec::new(catalog, table.spec().ident()?, spec, job);
                Ok(Some(Arc::new(if overwrite {
                    commit.overwriting(Overwrite {
                        read_snapshot: table.spec().snapshot_id,
                    })
                } else {
                    commit
                })))
            }
            _ => Ok(None),
        }
    }
}

impl BasinQueryPlanner {
    /// `optimize`: the small files of each partition rewritten by a distributed job, then one
    /// commit replacing them (see `basin_connectors::iceberg::plan_optimize`).
    async fn plan_optimize(
        &self,
        node: &IcebergProcedure,
        threshold: u64,
        filter: Option<&str>,
        state: &SessionState,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let table = node.catalog.load_table(&node.ident).await?;
        let provider = IcebergTableProvider::new(node.catalog.clone(), table, None)?;
        let filter = match filter {
            None => None,
            Some(text) => {
                let schema = DFSchema::try_from(provider.schema_ref().as_ref().clone())?;
                let expr = state
                    .create_logical_expr(text, &schema)
                    .map_err(|e| e.context(format!("optimize: the filter `{text}`")))?;
                Some(expr)
            }
        };
        let (Some(read_snapshot), Some(spec)) = (
            provider.spec().snapshot_id,
            plan_optimize(provider.spec(), filter.as_ref(), threshold).await?,
        ) else {
            return no_change();
        };
        let rewrite = LogicalPlan::Extension(Extension {
            node: Arc::new(IcebergRewriteNode::new(spec.clone())?),
        });
        let job = self
            .distributed
            .create_physical_plan(&rewrite, state)
            .await?;
        Ok(Arc::new(IcebergRowChangeExec::rewrite(
            node.catalog.clone(),
            node.ident.clone(),
            &spec,
            read_snapshot,
            job,
        )))
    }

    /// A query planned here and streamed from the executors: one stage spread over them, or
    /// a small query whole on one of them. `None` when it runs as a Ballista job (exchanges
    /// over too much data, no executor yet, or a plan that cannot travel).
    /// `executors`: the cluster's active executors (none without a cluster).
    async fn plan_streamed(
        &self,
        plan: &LogicalPlan,
        state: &SessionState,
        executors: &[ExecutorInfo],
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        self.plan_streamed_or_why(plan, state, executors, &mut None)
            .await
    }

    /// [`Self::plan_streamed`]; `why` says why streamed exchanges were not used when they
    /// were the route's choice.
    async fn plan_streamed_or_why(
        &self,
        plan: &LogicalPlan,
        state: &SessionState,
        executors: &[ExecutorInfo],
        why: &mut Option<String>,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if streamed::is_recursive(plan) {
            // A recursive query's work table lives in the process that runs it: the whole
            // query runs on one executor whatever its size, else here. A Ballista job cut
            // its recursive term into stages that never saw the work table, and waited
            // forever.
            if let LogicalPlan::Explain(explain) = plan {
                // `explain_streamed` shows the executor's plan; other EXPLAINs are made here.
                if self.cluster.is_some() && explain.explain_format == ExplainFormat::Indent {
                    return Ok(None);
                }
                return Ok(Some(self.local.create_physical_plan(plan, state).await?));
            }
            if let Some(one_node) = self
                .plan_on_one_executor(plan, state, executors, true)
                .await?
            {
                return Ok(Some(one_node));
            }
            tracing::info!("a recursive query runs in the front end: no executor can take it");
            return Ok(Some(self.local.create_physical_plan(plan, state).await?));
        }
        if executors.is_empty() {
            return Ok(None);
        }
        let one_stage = streamed::may_stream(plan);
        if one_stage {
            let physical = self.local.create_physical_plan(plan, state).await?;
            return Ok(streamed::stream_stage(physical, executors));
        }
        if !streamed::may_run_on_one_node(plan) {
            return Ok(None);
        }
        if self.single_node_max_bytes > 0
            && let Some(one_node) = self.plan_one_node(plan, state, executors).await?
        {
            return Ok(Some(one_node));
        }
        if !self.streamed_exchanges {
            return Ok(None);
        }
        // Too big for one executor: stages over all of them, streaming to each other, with
        // hash joins; a build side estimated under a quarter of what one query may hold on
        // an executor is collected (`CollectLeft`) and broadcast to every task that probes
        // it (kept once per producer task, built once per consumer task). Hash joins do not
        // spill: a stage that runs out of memory runs the query again as a job, whose
        // sort-merge joins do.
        let mut exchanged = state.clone();
        let mut broadcast_max = self.single_node_max_bytes.max(BROADCAST_MAX_BYTES);
        for executor in executors {
            let key = state.config().get_extension::<ClusterKey>();
            if let Some(memory) = crate::memory::query_memory(executor, key.as_deref()).await {
                broadcast_max = broadcast_max.min(memory / 4);
            }
        }
        let options = exchanged.config_mut().options_mut();
        options.optimizer.prefer_hash_join = true;
        one_node_join_thresholds(&mut options.optimizer, broadcast_max);
        let physical = self.local.create_physical_plan(plan, &exchanged).await?;
        // A collected build side whose unmatched rows the join emits after all probing
        // (left, full, left semi/anti joins) cannot be broadcast: partitioned instead.
        let physical = {
            use datafusion::physical_optimizer::PhysicalOptimizerRule;
            crate::joins::DistributedSafeJoins.optimize(physical, exchanged.config_options())?
        };
        let exchanges = match crate::exchange::plan_exchanges(physical, executors) {
            Ok(exchanges) => exchanges,
            Err(reason) => {
                tracing::info!(why = %reason, "streamed exchanges not used: the query runs as a Ballista job");
                *why = Some(reason);
                return Ok(None);
            }
        };
        let job = self.plan_job(plan, state).await?;
        Ok(Some(crate::memory::or_as_job(exchanges, job)))
    }

    /// The query whole on one executor, when it is small enough.
    async fn plan_one_node(
        &self,
        plan: &LogicalPlan,
        state: &SessionState,
        executors: &[ExecutorInfo],
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        self.plan_on_one_executor(plan, state, executors, false)
            .await
    }

    /// [`Self::plan_one_node`]; with `whole`, whatever the scans' size, and never again as
    /// a Ballista job when the executor runs out of memory (a query that cannot be one).
    async fn plan_on_one_executor(
        &self,
        plan: &LogicalPlan,
        state: &SessionState,
        executors: &[ExecutorInfo],
        whole: bool,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        // Planned for the cores of the executor that will run it, with hash joins: the
        // scans are bounded by `single_node_max_bytes` and by what one query may hold on
        // that executor, so the build sides fit in memory (sort-merge joins, the cluster's
        // default because they spill, were 2-7x slower on TPC-H SF1 joins). A hash join
        // that still outgrows it fails naming `[executor] memory_limit`.
        let Some((executor, running)) = streamed::next_executor(executors) else {
            return Ok(None);
        };
        let key = state.config().get_extension::<ClusterKey>();
        let max_bytes = match crate::memory::query_memory(executor, key.as_deref()).await {
            Some(memory) => self.single_node_max_bytes.min(memory),
            None => self.single_node_max_bytes,
        };
        let mut one_node = state.clone();
        let options = one_node.config_mut().options_mut();
        options.execution.target_partitions = (executor.task_slots as usize).max(1);
        options.optimizer.prefer_hash_join = true;
        one_node_join_thresholds(&mut options.optimizer, max_bytes);
        let physical = self.local.create_physical_plan(plan, &one_node).await?;
        let limit = (!whole).then_some(max_bytes);
        let Some(one_node) = streamed::single_node(physical, (executor, running), limit) else {
            return Ok(None);
        };
        if whole {
            return Ok(Some(one_node));
        }
        // Hash joins cannot spill: one that outgrows the executor runs again as a job.
        let job = self.plan_job(plan, state).await?;
        Ok(Some(crate::memory::or_as_job(one_node, job)))
    }
}

impl BasinQueryPlanner {
    /// `EXPLAIN` of a query that streams: the logical plans and the physical plan that runs
    /// (Ballista would show the stages of a job that never runs). `EXPLAIN ANALYZE` and the
    /// other output formats keep Ballista's planning.
    async fn explain_streamed(
        &self,
        plan: &LogicalPlan,
        state: &SessionState,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let LogicalPlan::Explain(explain) = plan else {
            return Ok(None);
        };
        if explain.explain_format != ExplainFormat::Indent {
            return Ok(None);
        }
        let Some(cluster) = &self.cluster else {
            return Ok(None);
        };
        let executors = cluster.active_executors().await;
        let mut why = None;
        let streamed = self
            .plan_streamed_or_why(&explain.plan, state, &executors, &mut why)
            .await?;
        // A query the exchanges could not take shows the job it runs as, and why.
        let (physical, note) = match (streamed, why) {
            (Some(physical), _) => (physical, String::new()),
            (None, Some(why)) => (
                self.plan_job(&explain.plan, state).await?,
                format!("-- streamed exchanges not used: {why}\n"),
            ),
            (None, None) => return Ok(None),
        };
        let mut plans = explain.stringified_plans.clone();
        plans.push(explain.plan.to_stringified(PlanType::FinalLogicalPlan));
        plans.push(StringifiedPlan::new(
            PlanType::FinalPhysicalPlan,
            note + &displayable(physical.as_ref())
                .set_show_statistics(state.config_options().explain.show_statistics)
                .indent(explain.verbose)
                .to_string(),
        ));
        Ok(Some(Arc::new(ExplainExec::new(
            Arc::clone(explain.schema.inner()),
            plans,
            explain.verbose,
        ))))
    }
}

/// The largest build side (estimated bytes) a query of streamed exchanges broadcasts when
/// `single_node_max_bytes` is smaller; also at most a quarter of an executor's share for
/// one query.
const BROADCAST_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// Joins of a query that runs whole on one executor build one hash table for all its
/// partitions (`CollectLeft`, the smaller side by the scans' estimates) instead of
/// repartitioning both sides by the join keys. Ballista's sessions set the thresholds to 0
/// (a collected build side is wrong for outer joins when every probe partition is its own
/// task, apache/datafusion-ballista#1055), which does not apply in one process; and the
/// scans are bounded by `single_node_max_bytes`, so any build side fits in memory.
/// TPC-H SF1 on a 2-executor cluster, clusters interleaved in one run: 4.11 s with
/// partitioned joins, 3.68 s with collected build sides. A session that SET a threshold
/// other than Ballista's 0 or DataFusion's default keeps it.
fn one_node_join_thresholds(optimizer: &mut OptimizerOptions, max_bytes: u64) {
    let defaults = OptimizerOptions::default();
    let bytes = &mut optimizer.hash_join_single_partition_threshold;
    if *bytes == 0 || *bytes == defaults.hash_join_single_partition_threshold {
        *bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    }
    let rows = &mut optimizer.hash_join_single_partition_threshold_rows;
    if *rows == 0 || *rows == defaults.hash_join_single_partition_threshold_rows {
        *rows = usize::MAX;
    }
}

fn writes_memory_table(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Dml(DmlStatement { target, .. }) => source_as_provider(target)
            .map(|p| p.as_any().is::<MemTable>())
            .unwrap_or(false),
        _ => false,
    }
}

/// How long a query waits for an executor to take its work before it fails.
const EXECUTOR_PATIENCE: Duration = Duration::from_secs(30);

#[async_trait]
impl QueryPlanner for BasinQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session_state: &SessionState,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // What datafusion-proto would drop on the way to the executors travels (`portable`).
        let logical_plan = &portable_plan(logical_plan.clone())?;
        let local = writes_memory_table(logical_plan)
            || matches!(logical_plan, LogicalPlan::DescribeTable(_));
        // The executors that will take the work, looked up once per query.
        let executors = match &self.cluster {
            Some(cluster) if !local && !matches!(logical_plan, LogicalPlan::Explain(_)) => cluster
                .wait_for_active_executors(EXECUTOR_PATIENCE)
                .await
                .map_err(DataFusionError::Execution)?,
            _ => vec![],
        };
        if let Some(plan) = self.plan_iceberg(logical_plan, session_state).await? {
            return Ok(plan);
        }
        if local {
            self.local
                .create_physical_plan(logical_plan, session_state)
                .await
        } else if let Some(plan) = self
            .plan_streamed(logical_plan, session_state, &executors)
            .await?
        {
            Ok(plan)
        } else if let Some(plan) = self.explain_streamed(logical_plan, session_state).await? {
            Ok(plan)
        } else {
            self.plan_job(logical_plan, session_state).await
        }
    }
}

impl BasinQueryPlanner {
    /// `plan` as a Ballista job.
    async fn plan_job(
        &self,
        plan: &LogicalPlan,
        state: &SessionState,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // Awkward table names survive the trip to the scheduler (see `portable_names`).
        let plan = portable_names(crate::prefilter::without_prefilters(plan)?)?;
        // And joins' NULL semantics, USING joins, offsets (see `job_plan`).
        let plan = crate::job_plan::portable_job_plan(plan)?;
        let job = self.distributed.create_physical_plan(&plan, state).await?;
        Ok(crate::job_errors::plain_job_errors(
            job,
            &self.scheduler_url,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_node_queries_collect_build_sides_unless_the_session_set_a_threshold() {
        let ballista = OptimizerOptions {
            hash_join_single_partition_threshold: 0,
            hash_join_single_partition_threshold_rows: 0,
            ..OptimizerOptions::default()
        };
        for mut optimizer in [OptimizerOptions::default(), ballista] {
            one_node_join_thresholds(&mut optimizer, 1 << 30);
            assert_eq!(optimizer.hash_join_single_partition_threshold, 1 << 30);
            assert_eq!(
                optimizer.hash_join_single_partition_threshold_rows,
                usize::MAX
            );
        }

        let mut set = OptimizerOptions {
            hash_join_single_partition_threshold: 4096,
            hash_join_single_partition_threshold_rows: 10,
            ..OptimizerOptions::default()
        };
        one_node_join_thresholds(&mut set, 1 << 30);
        assert_eq!(set.hash_join_single_partition_threshold, 4096);
        assert_eq!(set.hash_join_single_partition_threshold_rows, 10);
    }
}
