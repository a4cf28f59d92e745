//! The Basin scheduler: front-end sessions (catalogs from `basin.toml`, Basin's table
//! functions) and the Ballista scheduler that splits each query into stages and hands the
//! tasks to executors.
//!
//! ```text
//!  client SQL ─► frontend::connect (SessionContext: catalogs, read_*(), Ballista planner)
//!                   │ logical plan, encoded by basin-connectors' codec
//!                   ▼
//!  server::start ─► Ballista scheduler (push-staged) ─► tasks ─► executors
//!  one-stage queries ─► streamed::StreamedStageExec ─► executors stream batches back
//! ```

pub mod access;
pub mod aggregate_names;
pub mod aggregate_statistics;
pub mod audit;
pub mod distinct;
pub mod empty_projections;
mod exchange;
pub mod flight_sql;
pub mod frontend;
mod job_errors;
pub mod job_plan;
pub mod joins;
mod launch;
pub mod limits;
mod liveness;
mod memory;
pub mod merge;
pub mod notin;
pub mod prefilter;
pub mod semi_join_keys;
pub mod semijoin;
pub mod series;
pub mod server;
pub mod session;
pub mod sql;
pub mod streamed;
#[cfg(test)]
mod testing;
pub mod views;
pub mod volatile;
pub mod window;

pub use frontend::connect;
pub use server::{ClusterView, SchedulerHandle, SchedulerOptions, start};

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::physical_plan::ExecutionPlan;

/// `plan` with each node of type `T` (bottom up) replaced by what `rewrite` makes of it, or
/// kept when it makes nothing: the shell of Basin's physical rules.
pub(crate) fn rewrite_each<T: ExecutionPlan + 'static>(
    plan: Arc<dyn ExecutionPlan>,
    rewrite: impl Fn(&T) -> Result<Option<Arc<dyn ExecutionPlan>>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(typed) = node.as_any().downcast_ref::<T>() else {
            return Ok(Transformed::no(node));
        };
        Ok(match rewrite(typed)? {
            Some(rewritten) => Transformed::yes(rewritten),
            None => Transformed::no(node),
        })
    })
    .map(|t| t.data)
}
