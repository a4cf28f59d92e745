//! The cluster secret: how the scheduler and the executors know each other.
//!
//! Whoever reaches an internal port (the scheduler's gRPC port, an executor's gRPC or Flight
//! port) could otherwise run any plan there, with the executor's files and the sources'
//! credentials. With `[cluster] secret` set on every process of a cluster (the same value,
//! from `${env:BASIN_CLUSTER_SECRET}`), each internal call carries proof that its sender
//! knows the secret, and the secret itself never travels:
//!
//! ```text
//!  every gRPC / Flight call      user-agent: basin-cluster/<HMAC(secret, "call")>
//!                                  (Ballista's clients can only be given a user agent)
//!  a Flight ticket with a plan   x-basin-signature: <expiry>.<HMAC(secret, ticket, expiry)>
//!  a Ballista task (launch)      prop basin_cluster.task_token:
//!                                  <expiry>.<HMAC(secret, job, stage, expiry)>
//! ```
//!
//! Keys are HMAC-SHA256; signatures are compared in constant time. A standalone process
//! (scheduler and executors in one process) makes a random secret of its own.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::secret::Secret;

/// The fewest characters a cluster secret may have.
pub const MIN_SECRET_CHARS: usize = 16;

/// The environment variable a process takes the secret from when `[cluster] secret` is not set.
pub const SECRET_VARIABLE: &str = "BASIN_CLUSTER_SECRET";

/// The prefix of the user agent that proves a call comes from inside the cluster.
pub const USER_AGENT_PREFIX: &str = "basin-cluster/";

/// The metadata key of a plan ticket's signature.
pub const SIGNATURE_HEADER: &str = "x-basin-signature";

/// How long a signature made for a ticket or a task is accepted: it is made right before
/// the ticket is sent or the task launched. Leaves room for clocks a little apart.
pub const SIGNATURE_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// The key every process of a cluster derives from `[cluster] secret`.
#[derive(Clone)]
pub struct ClusterKey {
    mac: Hmac<Sha256>,
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(***)")
    }
}

/// Why a call's proof was refused. The message says what to check, never a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No proof at all: a client outside the cluster, or a process without the secret.
    Missing,
    /// A proof made with another secret, or for another ticket or task.
    Wrong,
    /// A signature whose time is over.
    Expired,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refused::Missing => {
                "this port serves only the Basin cluster and the call carries no cluster \
                 credential: a process of the cluster needs the same [cluster] secret as the \
                 scheduler"
            }
            Refused::Wrong => {
                "the call's cluster credential does not match: every process of the cluster \
                 needs the same [cluster] secret"
            }
            Refused::Expired => {
                "the call's cluster signature has expired (are the machines' clocks apart?)"
            }
        })
    }
}

impl ClusterKey {
    /// The key of `secret`.
    pub fn new(secret: &Secret) -> Self {
        Self::from_bytes(secret.expose().as_bytes())
    }

    fn from_bytes(bytes: &[u8]) -> Self {
        // HMAC takes keys of any length.
        let mac = Hmac::<Sha256>::new_from_slice(bytes)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
        Self { mac }
    }

    fn tag(&self, purpose: &str, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(purpose.as_bytes());
        for part in parts {
            // Lengths first, so that no two lists of parts read the same.
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac
    }

    /// The user agent Basin's clients send on every internal call.
    pub fn user_agent(&self) -> String {
        let tag = self.tag("call", &[]).finalize().into_bytes();
        format!("{USER_AGENT_PREFIX}{}", hex(&tag))
    }

    /// Whether a call's `user-agent` header proves the sender knows the secret. gRPC
    /// clients append their own name after a space.
    pub fn check_user_agent(&self, header: Option<&str>) -> Result<(), Refused> {
        let Some(tag) = header
            .and_then(|h| h.split_whitespace().next())
            .and_then(|word| word.strip_prefix(USER_AGENT_PREFIX))
        else {
            return Err(Refused::Missing);
        };
        let tag = unhex(tag).ok_or(Refused::Wrong)?;
        self.tag("call", &[])
            .verify_slice(&tag)
            .map_err(|_| Refused::Wrong)
    }

    /// The bearer token of Ballista's REST API: a proof of its own, so that handing it to an
    /// operator hands over no internal call.
    pub fn rest_token(&self) -> String {
        hex(&self.tag("rest", &[]).finalize().into_bytes())
    }

    /// Whether `token` is [`ClusterKey::rest_token`].
    pub fn check_rest_token(&self, token: &str) -> Result<(), Refused> {
        let tag = unhex(token.trim()).ok_or(Refused::Wrong)?;
        self.tag("rest", &[])
            .verify_slice(&tag)
            .map_err(|_| Refused::Wrong)
    }

    /// A signature of `parts` for `purpose`, valid for [`SIGNATURE_LIFETIME`]:
    /// `<expiry seconds>.<hex tag>`.
    pub fn sign(&self, purpose: &str, parts: &[&[u8]]) -> String {
        let expiry = now_seconds() + SIGNATURE_LIFETIME.as_secs();
        self.sign_until(purpose, parts, expiry)
    }

    fn sign_until(&self, purpose: &str, parts: &[&[u8]], expiry: u64) -> String {
        let expiry_text = expiry.to_string();
        let mut all = parts.to_vec();
        all.push(expiry_text.as_bytes());
        let tag = self.tag(purpose, &all).finalize().into_bytes();
        format!("{expiry_text}.{}", hex(&tag))
    }

    /// Checks a signature made by [`ClusterKey::sign`] of the same `purpose` and `parts`.
    pub fn verify(
        &self,
        purpose: &str,
        parts: &[&[u8]],
        signature: Option<&str>,
    ) -> Result<(), Refused> {
        let signature = signature
            .filter(|s| !s.is_empty())
            .ok_or(Refused::Missing)?;
        let (expiry_text, tag) = signature.split_once('.').ok_or(Refused::Wrong)?;
        let expiry: u64 = expiry_text.parse().map_err(|_| Refused::Wrong)?;
        let tag = unhex(tag).ok_or(Refused::Wrong)?;
        let mut all = parts.to_vec();
        all.push(expiry_text.as_bytes());
        self.tag(purpose, &all)
            .verify_slice(&tag)
            .map_err(|_| Refused::Wrong)?;
        if expiry < now_seconds() {
            return Err(Refused::Expired);
        }
        Ok(())
    }
}

/// A secret no other process knows (244 random bits): for a standalone process, whose
/// scheduler and executors share it in memory.
pub fn random_secret() -> Secret {
    Secret::new(format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    ))
}

fn now_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `bytes` as lower-case hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_agent_proves_the_same_secret_only() {
        let key = ClusterKey::new(&Secret::new("s3cret"));
        let agent = key.user_agent();
        // The call proof: printf call | openssl dgst -sha256 -hmac s3cret
        assert_eq!(
            agent,
            "basin-cluster/86b61c6c197d8f6897a698ff4dc252134226822ec3c9db9cfc9f4e33df354a19"
        );
        assert_eq!(key.check_user_agent(Some(&agent)), Ok(()));
        // tonic appends its own name.
        assert_eq!(
            key.check_user_agent(Some(&format!("{agent} tonic/0.14.9"))),
            Ok(())
        );
        let other = ClusterKey::new(&Secret::new("other"));
        assert_eq!(other.check_user_agent(Some(&agent)), Err(Refused::Wrong));
        assert_eq!(key.check_user_agent(None), Err(Refused::Missing));
        assert_eq!(
            key.check_user_agent(Some("grpc-python/1.0")),
            Err(Refused::Missing)
        );
        assert_eq!(
            key.check_user_agent(Some("basin-cluster/zz")),
            Err(Refused::Wrong)
        );
        assert_eq!(format!("{key:?}"), "ClusterKey(***)");
        // The REST token is another proof: printf rest | openssl dgst -sha256 -hmac s3cret
        let rest = key.rest_token();
        assert_eq!(key.check_rest_token(&rest), Ok(()));
        assert_ne!(format!("{USER_AGENT_PREFIX}{rest}"), agent);
        assert_eq!(
            key.check_user_agent(Some(&format!("{USER_AGENT_PREFIX}{rest}"))),
            Err(Refused::Wrong)
        );
    }

    #[test]
    fn signatures_are_bound_to_their_parts_and_expire() {
        let key = ClusterKey::new(&Secret::new("s3cret"));
        let signature = key.sign("ticket", &[b"plan bytes"]);
        assert_eq!(
            key.verify("ticket", &[b"plan bytes"], Some(&signature)),
            Ok(())
        );
        for (purpose, parts) in [
            ("ticket", &[&b"other plan"[..]][..]),
            ("task", &[&b"plan bytes"[..]][..]),
            ("ticket", &[&b"plan"[..], &b" bytes"[..]][..]),
        ] {
            assert_eq!(
                key.verify(purpose, parts, Some(&signature)),
                Err(Refused::Wrong),
                "{purpose} {parts:?}"
            );
        }
        let other = ClusterKey::new(&Secret::new("other"));
        assert_eq!(
            other.verify("ticket", &[b"plan bytes"], Some(&signature)),
            Err(Refused::Wrong)
        );
        let old = key.sign_until("ticket", &[b"plan bytes"], now_seconds() - 1);
        assert_eq!(
            key.verify("ticket", &[b"plan bytes"], Some(&old)),
            Err(Refused::Expired)
        );
        // A later expiry written over a real signature does not verify.
        let (_, tag) = old.split_once('.').unwrap();
        let moved = format!("{}.{tag}", now_seconds() + 600);
        assert_eq!(
            key.verify("ticket", &[b"plan bytes"], Some(&moved)),
            Err(Refused::Wrong)
        );
        assert_eq!(key.verify("ticket", &[], None), Err(Refused::Missing));
        assert_eq!(
            key.verify("ticket", &[], Some("garbage")),
            Err(Refused::Wrong)
        );
        let random = ClusterKey::new(&random_secret());
        assert_eq!(
            random.verify("ticket", &[b"plan bytes"], Some(&signature)),
            Err(Refused::Wrong)
        );
    }
}
