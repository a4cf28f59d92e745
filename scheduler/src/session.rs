//! The scheduler-side session: how the scheduler turns a client's logical plan into a
//! distributed physical plan.

use std::sync::Arc;

use ballista_core::ConfigProducer;
use ballista_core::extension::{
    SessionConfigExt, ballista_aggregate_functions, ballista_scalar_functions,
    ballista_window_functions,
};
use ballista_scheduler::scheduler_server::SessionBuilder;
use basin_connectors::codec::{logical_codec, physical_codec};
use basin_connectors::iceberg::IcebergWritePlanner;
use basin_connectors::portable::portable_plan;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::LogicalPlan;
use datafusion::optimizer::Optimizer;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion::prelude::SessionConfig;

use crate::empty_projections::EmptyProjectionsTravel;
use crate::joins::DistributedSafeJoins;
use crate::limits::BasinOptions;
use crate::series::SeriesProjections;
use crate::views::PlainExchanges;

/// The session configuration every Basin process starts from.
///
/// Joins stay Ballista's sort-merge joins, which spill: on TPC-H SF1 (2 cores) hash joins
/// (`SET datafusion.optimizer.prefer_hash_join = true`) measured the same within noise
/// (24.08 s vs 24.04 s, benchmarks/README.md) and DataFusion's hash join cannot spill.
/// Ballista's broadcast promotion is off: it produces joins that lose rows on a cluster
/// (see [`crate::joins`], which also makes user-chosen hash joins safe).
pub fn base_config() -> SessionConfig {
    let mut config = SessionConfig::new_with_ballista()
        .with_information_schema(true)
        .with_default_catalog_and_schema("basin", "public")
        .with_ballista_logical_extension_codec(logical_codec())
        .with_ballista_physical_extension_codec(physical_codec())
        .with_option_extension(BasinOptions::default());
    config
        .options_mut()
        .set(BROADCAST_JOIN_THRESHOLD, "0")
        .expect("Ballista's configuration is registered");
    config
}

const BROADCAST_JOIN_THRESHOLD: &str = "ballista.optimizer.broadcast_join_threshold_bytes";

/// Produces the scheduler's base configuration.
pub fn config_producer() -> ConfigProducer {
    Arc::new(base_config)
}

/// Ballista's scalar functions and the marker that carries joins' NULL semantics
/// ([`crate::job_plan`]).
fn scalar_functions() -> Vec<Arc<datafusion::logical_expr::ScalarUDF>> {
    let mut functions = ballista_scalar_functions();
    functions.push(crate::job_plan::marker_udf());
    functions
}

/// Builds scheduler sessions that share one runtime (object stores from `basin.toml`).
pub fn session_builder(runtime: Arc<RuntimeEnv>) -> SessionBuilder {
    Arc::new(move |config: SessionConfig| {
        let mut rules = Optimizer::new().rules;
        crate::distinct::keep_distinct_types(&mut rules);
        let mut builder = SessionStateBuilder::new().with_default_features();
        *builder.optimizer() = Some(Optimizer::with_rules(rules));
        *builder.physical_optimizers() = Some(crate::aggregate_statistics::physical_optimizer());
        Ok(builder
            .with_config(config)
            .with_runtime_env(runtime.clone())
            .with_scalar_functions(scalar_functions())
            .with_aggregate_functions(ballista_aggregate_functions())
            .with_window_functions(ballista_window_functions())
            .with_query_planner(Arc::new(SchedulerQueryPlanner))
            .with_analyzer_rule(Arc::new(crate::job_plan::RestoreJoinSemantics))
            .with_physical_optimizer_rule(Arc::new(DistributedSafeJoins))
            .with_physical_optimizer_rule(Arc::new(SeriesProjections))
            .with_physical_optimizer_rule(Arc::new(PlainExchanges))
            .with_physical_optimizer_rule(Arc::new(EmptyProjectionsTravel))
            .with_physical_optimizer_rule(Arc::new(
                crate::aggregate_names::ReversedAggregatesKeepNames,
            ))
            .build())
    })
}

/// The scheduler's physical planner: DataFusion's, plus Basin's distributed Iceberg writer.
#[derive(Debug, Default)]
struct SchedulerQueryPlanner;

#[async_trait::async_trait]
impl QueryPlanner for SchedulerQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session_state: &SessionState,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        if crate::streamed::is_recursive(logical_plan) {
            // Basin's front end runs these on one executor (`frontend.rs`).
            return datafusion::common::plan_err!(
                "a recursive query (WITH RECURSIVE) cannot run as a Ballista job, whose stages \
                 would not share its work table: send it through Basin's front end (Flight \
                 SQL, `basin sql`), which runs it on one executor"
            );
        }
        // What datafusion-proto would drop on the way to the executors travels (`portable`).
        let logical_plan = portable_plan(logical_plan.clone())?;
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(IcebergWritePlanner)])
            .create_physical_plan(&logical_plan, session_state)
            .await
    }
}
