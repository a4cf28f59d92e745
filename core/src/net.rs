//! Network helpers shared by the scheduler and the executors.

use std::net::SocketAddr;

use crate::error::{BasinError, Result};

/// Binds `host:port` to check it is free (and to resolve port 0 to a free port), then
/// releases it. `what` names the service in the error.
pub fn reserve_port(host: &str, port: u16, what: &str) -> Result<SocketAddr> {
    if port == 0 {
        // The port is released before the service binds it again. Ports the kernel hands
        // out for port 0 are the same ephemeral range outgoing connections use, so one of
        // those (a database connection, a shuffle fetch) can take it in between: pick a
        // random port below the ephemeral range instead.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ (u64::from(std::process::id()) << 20);
        let mut x = seed | 1;
        for _ in 0..64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let candidate = 20_000 + (x % 12_000) as u16;
            if let Ok(listener) = std::net::TcpListener::bind((host, candidate)) {
                return Ok(listener.local_addr()?);
            }
        }
    }
    let listener = std::net::TcpListener::bind((host, port)).map_err(|e| {
        BasinError::Invalid(format!(
            "cannot listen on {host}:{port} for the {what}: {e} (choose another port or stop \
             the process using it)"
        ))
    })?;
    Ok(listener.local_addr()?)
}
