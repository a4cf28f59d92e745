//! The cluster secret on the wire ([`basin_core::cluster`]): what Basin's and Ballista's
//! clients add to internal calls, and what the internal servers check.
//!
//! The key travels inside a process only: in a [`SessionConfig`]'s extensions (never
//! serialized into plans or tickets) and in the clients' endpoint settings.

use std::sync::Arc;

use ballista_core::extension::EndpointOverrideFn;
use basin_core::cluster::{ClusterKey, Refused, SIGNATURE_HEADER};
use datafusion::config::ConfigExtension;
use datafusion::execution::TaskContext;
use datafusion::prelude::SessionConfig;

/// What a signature is for: each kind of signed thing has its own, so that one cannot
/// stand for another.
const TICKET: &str = "flight-ticket";
const TASK: &str = "ballista-task";

datafusion::common::extensions_options! {
    /// Settings an executor reads from a task's properties that are not the user's: the
    /// scheduler's signature of the task ([`sign_task`]).
    pub struct ClusterOptions {
        /// `<expiry>.<HMAC>` of the task's job and stage.
        pub task_token: String, default = String::new()
    }
}

impl ConfigExtension for ClusterOptions {
    const PREFIX: &'static str = "basin_cluster";
}

/// The key of the task property that carries a task's signature.
pub const TASK_TOKEN_KEY: &str = "basin_cluster.task_token";

/// `config` with the process's cluster key (for Basin's clients that run inside plans:
/// exchange readers on executors, streamed-stage readers on the front end).
pub fn with_key(config: SessionConfig, key: Option<&ClusterKey>) -> SessionConfig {
    match key {
        Some(key) => config.with_extension(Arc::new(key.clone())),
        None => config,
    }
}

/// The cluster key a task's plan runs with, if the cluster has one.
pub fn key_of(ctx: &TaskContext) -> Option<Arc<ClusterKey>> {
    ctx.session_config().get_extension::<ClusterKey>()
}

/// For Ballista's gRPC clients (executors to the scheduler and to each other, the
/// scheduler to executors, the front end to the scheduler): every call carries the
/// cluster's user agent.
pub fn endpoint_override(key: &ClusterKey) -> EndpointOverrideFn {
    let agent = key.user_agent();
    Arc::new(move |endpoint| Ok(endpoint.user_agent(agent.clone())?))
}

/// `endpoint` with the cluster's user agent, for Basin's own Flight clients.
pub fn with_user_agent(
    endpoint: tonic::transport::Endpoint,
    key: Option<&ClusterKey>,
) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    match key {
        Some(key) => endpoint.user_agent(key.user_agent()),
        None => Ok(endpoint),
    }
}

/// A DoGet request for `ticket`, signed when the cluster has a key.
pub fn signed_ticket(
    ticket: arrow_flight::Ticket,
    key: Option<&ClusterKey>,
) -> tonic::Request<arrow_flight::Ticket> {
    let signature = key.map(|key| key.sign(TICKET, &[&ticket.ticket]));
    let mut request = tonic::Request::new(ticket);
    if let Some(value) = signature.and_then(|s| s.parse().ok()) {
        request.metadata_mut().insert(SIGNATURE_HEADER, value);
    }
    request
}

/// Checks that a call to an internal server comes from the cluster (its user agent).
pub fn check_call(
    key: Option<&ClusterKey>,
    metadata: &tonic::metadata::MetadataMap,
) -> Result<(), tonic::Status> {
    let Some(key) = key else { return Ok(()) };
    let agent = metadata.get("user-agent").and_then(|v| v.to_str().ok());
    key.check_user_agent(agent).map_err(refused)
}

/// Checks a DoGet of a ticket that carries a plan: the call's user agent and the ticket's
/// own signature (made for these bytes, not expired).
pub fn check_ticket(
    key: Option<&ClusterKey>,
    ticket: &[u8],
    metadata: &tonic::metadata::MetadataMap,
) -> Result<(), tonic::Status> {
    let Some(key) = key else { return Ok(()) };
    check_call(Some(key), metadata)?;
    let signature = metadata.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    key.verify(TICKET, &[ticket], signature).map_err(refused)
}

/// The signature of a Ballista task the scheduler launches.
pub fn sign_task(key: &ClusterKey, job_id: &str, stage_id: u32) -> String {
    key.sign(TASK, &[job_id.as_bytes(), &stage_id.to_le_bytes()])
}

/// Checks the scheduler's signature of a task about to run on an executor.
pub fn verify_task(
    key: &ClusterKey,
    job_id: &str,
    stage_id: u32,
    token: Option<&str>,
) -> Result<(), Refused> {
    key.verify(TASK, &[job_id.as_bytes(), &stage_id.to_le_bytes()], token)
}

/// The status a refused internal call gets.
pub fn refused(why: Refused) -> tonic::Status {
    tonic::Status::unauthenticated(why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use basin_core::Secret;

    #[test]
    fn tickets_are_checked_for_the_caller_and_the_bytes() {
        let key = ClusterKey::new(&Secret::new("s"));
        let ticket = arrow_flight::Ticket::new(b"BASIN-STAGE\0plan".to_vec());
        let mut request = signed_ticket(ticket.clone(), Some(&key));
        request
            .metadata_mut()
            .insert("user-agent", key.user_agent().parse().unwrap());
        assert!(check_ticket(Some(&key), &ticket.ticket, request.metadata()).is_ok());
        // Another ticket under the same signature.
        let err = check_ticket(Some(&key), b"BASIN-STAGE\0other", request.metadata()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        // No user agent.
        let bare = signed_ticket(ticket.clone(), Some(&key));
        let err = check_ticket(Some(&key), &ticket.ticket, bare.metadata()).unwrap_err();
        assert!(err.message().contains("no cluster credential"), "{err}");
        // An open cluster checks nothing.
        assert!(check_ticket(None, &ticket.ticket, bare.metadata()).is_ok());
    }

    #[test]
    fn task_signatures_name_their_job_and_stage() {
        let key = ClusterKey::new(&Secret::new("s"));
        let token = sign_task(&key, "job1", 2);
        assert_eq!(verify_task(&key, "job1", 2, Some(&token)), Ok(()));
        assert_eq!(
            verify_task(&key, "job1", 3, Some(&token)),
            Err(Refused::Wrong)
        );
        assert_eq!(
            verify_task(&key, "job2", 2, Some(&token)),
            Err(Refused::Wrong)
        );
        assert_eq!(verify_task(&key, "job1", 2, None), Err(Refused::Missing));
    }
}
