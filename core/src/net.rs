//! Network helpers shared by the scheduler and the executors.

use std::net::SocketAddr;

use crate::error::{BasinError, Result};

/// Binds `host:port` to check it is free (and to resolve port 0 to a free port), then
/// releases it. `what` names the service in the error.
pub fn reserve_port(host: &str, port: u16, what: &str) -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind((host, port)).map_err(|e| {
        BasinError::Invalid(format!(
            "cannot listen on {host}:{port} for the {what}: {e} (choose another port or stop \
             the process using it)"
        ))
    })?;
    Ok(listener.local_addr()?)
}
