//! Users and bearer tokens for the Flight SQL endpoint.
//!
//! Users come from a file of `name:bcrypt-hash[:group,group…]` lines (`#` starts a comment);
//! the groups are what access rules (`[security] rules_file`) match `group` against. A client
//! authenticates with HTTP Basic credentials in the Flight handshake and gets a bearer token,
//! which every later call carries in `authorization: Bearer …`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use basin_core::{BasinError, Result};

/// The configured users.
#[derive(Debug, Default)]
pub struct Users {
    hashes: HashMap<String, String>,
    groups: HashMap<String, Vec<String>>,
}

impl Users {
    /// Reads a users file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            BasinError::Invalid(format!("cannot read users file {}: {e}", path.display()))
        })?;
        let mut hashes = HashMap::new();
        let mut groups = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (user, rest) = line.split_once(':').ok_or_else(|| {
                BasinError::Invalid(format!(
                    "users file {} line {}: expected `user:bcrypt-hash[:groups]`",
                    path.display(),
                    i + 1
                ))
            })?;
            // bcrypt hashes have no `:`; what follows one is the user's groups.
            let (hash, member_of) = rest.split_once(':').unwrap_or((rest, ""));
            let member_of: Vec<String> = member_of
                .split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(str::to_string)
                .collect();
            groups.insert(user.trim().to_string(), member_of);
            if !hash.starts_with("$2") {
                return Err(BasinError::Invalid(format!(
                    "users file {} line {}: the password of `{user}` is not a bcrypt hash \
                     (create one with `basin hash-password`)",
                    path.display(),
                    i + 1
                )));
            }
            hashes.insert(user.trim().to_string(), hash.trim().to_string());
        }
        if hashes.is_empty() {
            return Err(BasinError::Invalid(format!(
                "users file {} defines no user",
                path.display()
            )));
        }
        Ok(Self { hashes, groups })
    }

    /// The groups of `user` (none for an unknown user).
    pub fn groups(&self, user: &str) -> Vec<String> {
        self.groups.get(user).cloned().unwrap_or_default()
    }

    /// Whether `password` is `user`'s password.
    pub fn verify(&self, user: &str, password: &str) -> bool {
        match self.hashes.get(user) {
            Some(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            None => {
                // Spend the same time for unknown users as for known ones.
                static DUMMY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
                    bcrypt::hash("basin", bcrypt::DEFAULT_COST).unwrap_or_default()
                });
                let _ = bcrypt::verify(password, &DUMMY);
                false
            }
        }
    }
}

/// Hashes a password for a users file.
pub fn hash_password(password: &str) -> Result<String> {
    bcrypt::hash(password, bcrypt::DEFAULT_COST)
        .map_err(|e| BasinError::Invalid(format!("cannot hash the password: {e}")))
}

/// Failed logins per client address (IPv4, or IPv6 /64): after [`LoginGuard::MAX_FAILURES`] within
/// [`LoginGuard::WINDOW`], the address may not try again until the window is over plus
/// [`LoginGuard::PENALTY`]. Bounded: addresses whose window is over are forgotten, and at
/// most [`LoginGuard::MAX_ADDRESSES`] are tracked.
#[derive(Debug, Default)]
pub struct LoginGuard {
    failures: Mutex<HashMap<std::net::IpAddr, (u32, Instant)>>,
}

impl LoginGuard {
    pub const MAX_FAILURES: u32 = 5;
    pub const WINDOW: Duration = Duration::from_secs(60);
    pub const PENALTY: Duration = Duration::from_secs(60);
    pub const MAX_ADDRESSES: usize = 100_000;

    /// Starts a login attempt from `ip`: `Err(wait)` while the address may not try. The
    /// attempt counts as failed until [`LoginGuard::succeeded`] says otherwise, so that
    /// logins sent at once cannot all pass before the first failures are counted.
    pub fn attempt(&self, ip: std::net::IpAddr) -> std::result::Result<(), Duration> {
        let ip = Self::network(ip);
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let over = Self::WINDOW + Self::PENALTY;
        if let Some((count, first)) = failures.get(&ip)
            && *count >= Self::MAX_FAILURES
        {
            let until = *first + over;
            if let Some(wait) = until.checked_duration_since(now).filter(|w| !w.is_zero()) {
                return Err(wait);
            }
        }
        if failures.len() >= Self::MAX_ADDRESSES {
            failures.retain(|_, (_, first)| now.duration_since(*first) < over);
        }
        if failures.len() >= Self::MAX_ADDRESSES && !failures.contains_key(&ip) {
            // Too many addresses at once: refuse rather than forget who failed.
            return Err(Self::PENALTY);
        }
        let entry = failures.entry(ip).or_insert((0, now));
        if now.duration_since(entry.1) >= over {
            *entry = (0, now);
        }
        entry.0 += 1;
        Ok(())
    }

    /// Addresses are counted by IPv4 address or IPv6 /64 (one host may hold a whole /64).
    fn network(ip: std::net::IpAddr) -> std::net::IpAddr {
        match ip {
            std::net::IpAddr::V6(v6) => {
                let mut octets = v6.octets();
                octets[8..].fill(0);
                std::net::IpAddr::V6(std::net::Ipv6Addr::from(octets))
            }
            v4 => v4,
        }
    }

    /// A successful login from `ip`: its count starts again.
    pub fn succeeded(&self, ip: std::net::IpAddr) {
        let ip = Self::network(ip);
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        // This attempt was counted when it arrived; below the limit without it, the address
        // starts again.
        if let Some((count, _)) = failures.get_mut(&ip) {
            *count = count.saturating_sub(1);
            if *count < Self::MAX_FAILURES {
                failures.remove(&ip);
            }
        }
    }
}

/// Issued bearer tokens.
#[derive(Debug, Default)]
pub struct Tokens {
    tokens: Mutex<HashMap<String, (String, Instant)>>,
}

impl Tokens {
    /// Issues a token for `user`.
    pub fn issue(&self, user: &str) -> String {
        let token = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        if let Ok(mut t) = self.tokens.lock() {
            t.insert(token.clone(), (user.to_string(), Instant::now()));
        }
        token
    }

    /// The user a token was issued to, if it was used within `ttl`; using it renews it.
    pub fn user(&self, token: &str, ttl: Duration) -> Option<String> {
        let mut t = self.tokens.lock().ok()?;
        t.retain(|_, (_, at)| at.elapsed() < ttl);
        let (user, at) = t.get_mut(token)?;
        *at = Instant::now();
        Some(user.clone())
    }
}

/// Parses `Basic base64(user:password)`, padded or not (Go's Flight client omits padding).
pub fn parse_basic(header: &str) -> Option<(String, String)> {
    use base64::Engine;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let encoded = header
        .strip_prefix("Basic ")
        .or_else(|| header.strip_prefix("basic "))?;
    let decoded = LENIENT.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_failed_logins_lock_the_address_out() {
        let guard = LoginGuard::default();
        let ip: std::net::IpAddr = "10.0.0.7".parse().unwrap();
        let other: std::net::IpAddr = "10.0.0.8".parse().unwrap();
        // Four failures, then a success: the count starts again.
        for _ in 0..LoginGuard::MAX_FAILURES - 1 {
            assert!(guard.attempt(ip).is_ok());
        }
        assert!(guard.attempt(ip).is_ok());
        guard.succeeded(ip);
        // Five attempts sent at once, none answered yet: the sixth waits.
        for _ in 0..LoginGuard::MAX_FAILURES {
            assert!(guard.attempt(ip).is_ok());
        }
        let wait = guard.attempt(ip).unwrap_err();
        assert!(wait > LoginGuard::PENALTY && wait <= LoginGuard::WINDOW + LoginGuard::PENALTY);
        assert!(guard.attempt(other).is_ok());
        // One IPv6 /64 is one address.
        let a: std::net::IpAddr = "2001:db8::1".parse().unwrap();
        let b: std::net::IpAddr = "2001:db8::ffff:2".parse().unwrap();
        for _ in 0..LoginGuard::MAX_FAILURES {
            assert!(guard.attempt(a).is_ok());
        }
        assert!(guard.attempt(b).is_err());
    }

    #[test]
    fn users_file_and_tokens() {
        /// Removes the test's directory however the test ends.
        struct Removed(std::path::PathBuf);
        impl Drop for Removed {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir = std::env::temp_dir().join(format!("basin-users-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _removed = Removed(dir.clone());
        let file = dir.join("users");
        let hash = bcrypt::hash("pw", 4).unwrap();
        std::fs::write(
            &file,
            format!("# users\nalice:{hash}\nbob:{hash}:analysts, eu\n"),
        )
        .unwrap();
        let users = Users::load(&file).unwrap();
        assert!(users.verify("alice", "pw"));
        assert!(users.verify("bob", "pw"));
        assert_eq!(users.groups("alice"), Vec::<String>::new());
        assert_eq!(users.groups("bob"), ["analysts", "eu"]);
        assert!(!users.verify("alice", "nope"));
        assert!(!users.verify("carol", "pw"));
        std::fs::write(&file, "alice:plaintext\n").unwrap();
        assert!(
            Users::load(&file)
                .unwrap_err()
                .to_string()
                .contains("bcrypt")
        );

        let tokens = Tokens::default();
        let t = tokens.issue("alice");
        assert_eq!(
            tokens.user(&t, Duration::from_secs(60)).as_deref(),
            Some("alice")
        );
        assert_eq!(tokens.user("forged", Duration::from_secs(60)), None);
        assert_eq!(
            parse_basic("Basic YWxpY2U6cHc="),
            Some(("alice".into(), "pw".into()))
        );
        assert_eq!(
            parse_basic("Basic YWxpY2U6cHc"),
            Some(("alice".into(), "pw".into()))
        );
    }
}
