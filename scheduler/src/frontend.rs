//! Front-end sessions: what a client (the `basin` CLI today, Flight SQL later) talks to.
//! Statements are parsed and planned here against the configured catalogs; queries run as
//! Ballista jobs on the cluster.

use ballista_core::extension::SessionStateExt;
use basin_connectors::catalogs::{register_catalogs, register_functions, runtime_env};
use basin_core::BasinConfig;
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;

use crate::session::base_config;

/// Opens a session on the scheduler at `scheduler_url` (`http://host:port`) with the
/// catalogs of `config`. `task_slots` is the cluster's total task slots: the default number
/// of partitions of a query.
pub fn connect(
    config: &BasinConfig,
    scheduler_url: &str,
    task_slots: usize,
) -> Result<SessionContext> {
    let partitions = if config.server.target_partitions > 0 {
        config.server.target_partitions
    } else {
        task_slots.max(1)
    };
    let session_config = base_config().with_target_partitions(partitions);
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(session_config)
        .with_runtime_env(runtime_env(config)?)
        .build()
        .upgrade_for_ballista(scheduler_url.to_string())?;
    let ctx = SessionContext::new_with_state(state);
    register_catalogs(&ctx, config, partitions);
    register_functions(&ctx);
    Ok(ctx)
}
