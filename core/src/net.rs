//! Network helpers shared by the scheduler and the executors.

use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{BasinError, Result};

/// Ports this process picked for port 0, with when: later picks skip them for a while. The
/// services of one process start at once (a standalone cluster's executors, each with two
/// ports) and each releases its port before its server binds it: two of them picking the
/// same port in between made one executor stop, and Ballista then marks every executor of
/// the process as shutting down.
static PICKED: Mutex<Vec<(u16, Instant)>> = Mutex::new(Vec::new());
/// How long a picked port is kept from other picks of this process.
const PICKED_FOR: Duration = Duration::from_secs(300);

/// Binds `host:port` to check it is free (and to resolve port 0 to a free port), then
/// releases it. `what` names the service in the error.
pub fn reserve_port(host: &str, port: u16, what: &str) -> Result<SocketAddr> {
    Ok(reserve_listener(host, port, what)?.local_addr()?)
}

/// Binds `host:port` (port 0: a free port, see [`reserve_port`]) and keeps it bound: a
/// service that can serve on this listener has no window in which another process takes
/// its port.
pub fn reserve_listener(host: &str, port: u16, what: &str) -> Result<TcpListener> {
    if port == 0 {
        // Ports the kernel hands out for port 0 are the same ephemeral range outgoing
        // connections use, so one of those (a database connection, a shuffle fetch) can take
        // one that is released before its service binds it again: pick a random port below
        // the ephemeral range instead, never one this process picked lately.
        let mut picked = PICKED.lock().unwrap_or_else(|e| e.into_inner());
        picked.retain(|(_, at)| at.elapsed() < PICKED_FOR);
        for _ in 0..256 {
            let candidate = 20_000 + (random() % 12_000) as u16;
            if picked.iter().any(|(p, _)| *p == candidate) {
                continue;
            }
            if let Ok(listener) = TcpListener::bind((host, candidate)) {
                picked.push((candidate, Instant::now()));
                return Ok(listener);
            }
        }
    }
    TcpListener::bind((host, port)).map_err(|e| {
        BasinError::Invalid(format!(
            "cannot listen on {host}:{port} for the {what}: {e} (choose another port or stop \
             the process using it)"
        ))
    })
}

/// A random number: splitmix64 over the clock, the process id and a counter, so that calls
/// at the same instant (or in processes started at once) differ.
fn random() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut z = nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ CALLS
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_picked_at_once_differ() {
        // Released at once, as services do before binding their ports again.
        let ports: Vec<u16> = (0..200)
            .map(|_| reserve_port("127.0.0.1", 0, "test").unwrap().port())
            .collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        assert!(ports.iter().all(|p| (20_000..32_000).contains(p)));
    }
}
