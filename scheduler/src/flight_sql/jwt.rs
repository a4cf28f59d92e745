//! JWT bearer tokens from an identity provider (`[flight_sql.jwt]`): a client sends
//! `authorization: Bearer <JWT>` on its calls (no handshake needed); Basin checks the
//! signature against the provider's keys (a JWKS file or URL), the issuer, the audience and
//! the expiry, and takes the user name (and groups) from claims.
//!
//! Signatures: RS256/RS384/RS512 and ES256/ES384 (what identity providers issue), verified
//! by ring. `none` and HMAC algorithms are refused: a shared secret would let anyone who can
//! verify tokens also make them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use basin_core::config::JwtConfig;
use basin_core::{BasinError, Result};
use serde::Deserialize;

/// Clock difference tolerated on `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 60;

/// How often an unknown key id may make Basin fetch the JWKS URL again.
const REFETCH_EVERY: Duration = Duration::from_secs(60);

/// Why a token was refused.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub why: String,
    /// The token names a key the provider's keys do not have (yet).
    pub unknown_key: bool,
}

/// Who a valid token says the caller is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    /// Seconds since the epoch when the token expires.
    pub expires: u64,
}

#[derive(Debug, Clone, Deserialize)]
struct Jwks {
    keys: Vec<Jwk>,
}

#[derive(Debug, Clone, Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    alg: Option<String>,
    n: Option<String>,
    e: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
}

/// Checks JWTs against the configured provider.
pub struct JwtValidator {
    config: JwtConfig,
    keys: Mutex<(Vec<Jwk>, Option<Instant>)>,
}

impl std::fmt::Debug for JwtValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtValidator")
            .field("issuer", &self.config.issuer)
            .finish()
    }
}

impl JwtValidator {
    /// Reads the provider's keys (file, or URL at start).
    pub async fn new(config: JwtConfig) -> Result<Self> {
        // Without both, tokens the provider issued for other applications (or, with keys
        // shared by many tenants, other tenants) would be taken.
        if config.issuer.is_none() || config.audience.is_none() {
            return Err(BasinError::Invalid(
                "[flight_sql.jwt] needs `issuer` and `audience`: the `iss` and an `aud` Basin's \
                 tokens carry, so that tokens for other applications are refused"
                    .into(),
            ));
        }
        let keys = load_keys(&config).await?;
        Ok(Self {
            config,
            keys: Mutex::new((keys, Some(Instant::now()))),
        })
    }

    /// The identity of a valid token; the error says what is wrong with it, never what the
    /// token holds. `Err(None)`-like cases are told apart by [`Refusal::unknown_key`]: a key
    /// id the provider's keys do not have (they may have rotated: [`JwtValidator::refetch`]).
    pub fn validate(&self, token: &str) -> std::result::Result<Identity, Refusal> {
        let refused = |why: String| Refusal {
            why,
            unknown_key: false,
        };
        let mut parts = token.split('.');
        let (Some(header), Some(claims), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(refused("not a JWT (three dot-separated parts)".into()));
        };
        let decode = |part: &str, what: &str| {
            URL_SAFE_NO_PAD
                .decode(part.trim_end_matches('='))
                .map_err(|_| refused(format!("its {what} is not base64url")))
        };
        let head: Header = serde_json::from_slice(&decode(header, "header")?)
            .map_err(|_| refused("its header is not JSON with `alg`".to_string()))?;
        let signature = decode(signature, "signature")?;
        let message = format!("{header}.{claims}");
        let key = self
            .key(head.kid.as_deref(), &head.alg)
            .ok_or_else(|| Refusal {
                why: format!(
                    "no key of the identity provider matches its key id and algorithm {}",
                    head.alg
                ),
                unknown_key: true,
            })?;
        verify(&key, &head.alg, message.as_bytes(), &signature).map_err(refused)?;
        let claims: serde_json::Value = serde_json::from_slice(&decode(claims, "claims")?)
            .map_err(|_| refused("its claims are not JSON".to_string()))?;
        self.check_claims(&claims).map_err(refused)
    }

    /// Whether the keys come from a URL that can be fetched again.
    pub fn refetchable(&self) -> bool {
        self.config.jwks_url.is_some()
    }

    fn check_claims(&self, claims: &serde_json::Value) -> std::result::Result<Identity, String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let number = |name: &str| claims.get(name).and_then(|v| v.as_u64());
        let expires = number("exp").ok_or("it has no expiry (`exp`)")?;
        if expires + LEEWAY_SECONDS < now {
            return Err("it has expired".into());
        }
        if number("nbf").is_some_and(|nbf| nbf > now + LEEWAY_SECONDS) {
            return Err("it is not valid yet (`nbf`)".into());
        }
        if let Some(issuer) = &self.config.issuer
            && claims.get("iss").and_then(|v| v.as_str()) != Some(issuer.as_str())
        {
            return Err("it was issued by another issuer (`iss`)".into());
        }
        if let Some(audience) = &self.config.audience {
            let ok = match claims.get("aud") {
                Some(serde_json::Value::String(a)) => a == audience,
                Some(serde_json::Value::Array(all)) => {
                    all.iter().any(|a| a.as_str() == Some(audience.as_str()))
                }
                _ => false,
            };
            if !ok {
                return Err("it is meant for another audience (`aud`)".into());
            }
        }
        let user = claims
            .get(&self.config.user_claim)
            .and_then(|v| v.as_str())
            .filter(|u| !u.is_empty())
            .ok_or_else(|| format!("it has no `{}` claim", self.config.user_claim))?
            .to_string();
        let groups = self
            .config
            .groups_claim
            .as_ref()
            .and_then(|name| claims.get(name))
            .map(|v| match v {
                serde_json::Value::Array(all) => all
                    .iter()
                    .filter_map(|g| g.as_str().map(str::to_string))
                    .collect(),
                serde_json::Value::String(one) => vec![one.clone()],
                _ => vec![],
            })
            .unwrap_or_default();
        Ok(Identity {
            user,
            groups,
            expires,
        })
    }

    fn key(&self, kid: Option<&str>, alg: &str) -> Option<Jwk> {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.0
            .iter()
            .find(|k| {
                kid.is_none_or(|kid| k.kid.as_deref() == Some(kid))
                    && k.alg.as_deref().is_none_or(|a| a == alg)
                    && match alg {
                        "RS256" | "RS384" | "RS512" => k.kty == "RSA",
                        "ES256" | "ES384" => k.kty == "EC",
                        _ => false,
                    }
            })
            .cloned()
    }

    /// Fetches the JWKS URL again (the provider rotated its keys), at most once a minute.
    pub async fn refetch(&self) {
        {
            let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            if keys.1.is_some_and(|at| at.elapsed() < REFETCH_EVERY) {
                return;
            }
            keys.1 = Some(Instant::now());
        }
        match load_keys(&self.config).await {
            Ok(fresh) => {
                let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
                keys.0 = fresh;
            }
            Err(e) => tracing::warn!(error = %e, "cannot fetch the identity provider's keys again"),
        }
    }
}

async fn load_keys(config: &JwtConfig) -> Result<Vec<Jwk>> {
    let text = match (&config.jwks_file, &config.jwks_url) {
        (Some(file), _) => std::fs::read_to_string(file).map_err(|e| {
            BasinError::Invalid(format!(
                "[flight_sql.jwt] jwks_file {}: {e}",
                file.display()
            ))
        })?,
        (None, Some(url)) => {
            let fetched = async {
                reqwest::Client::new()
                    .get(url)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await?
                    .error_for_status()?
                    .text()
                    .await
            };
            fetched
                .await
                .map_err(|e| BasinError::Invalid(format!("[flight_sql.jwt] jwks_url {url}: {e}")))?
        }
        (None, None) => {
            return Err(BasinError::Invalid(
                "[flight_sql.jwt] needs jwks_file or jwks_url: where the identity provider's \
                 public keys are"
                    .into(),
            ));
        }
    };
    let jwks: Jwks = serde_json::from_str(&text)
        .map_err(|e| BasinError::Invalid(format!("[flight_sql.jwt] the JWKS is not valid: {e}")))?;
    Ok(jwks.keys)
}

fn verify(
    key: &Jwk,
    alg: &str,
    message: &[u8],
    signature: &[u8],
) -> std::result::Result<(), String> {
    use ring::signature as sig;
    let b64 = |v: &Option<String>, what: &str| {
        v.as_deref()
            .and_then(|s| URL_SAFE_NO_PAD.decode(s.trim_end_matches('=')).ok())
            .ok_or_else(|| format!("the provider's key has no valid `{what}`"))
    };
    let bad = |_| "its signature does not verify".to_string();
    match alg {
        "RS256" | "RS384" | "RS512" => {
            let params = match alg {
                "RS256" => &sig::RSA_PKCS1_2048_8192_SHA256,
                "RS384" => &sig::RSA_PKCS1_2048_8192_SHA384,
                _ => &sig::RSA_PKCS1_2048_8192_SHA512,
            };
            let (n, e) = (b64(&key.n, "n")?, b64(&key.e, "e")?);
            sig::RsaPublicKeyComponents { n, e }
                .verify(params, message, signature)
                .map_err(bad)
        }
        "ES256" | "ES384" => {
            let (params, curve) = match alg {
                "ES256" => (&sig::ECDSA_P256_SHA256_FIXED, "P-256"),
                _ => (&sig::ECDSA_P384_SHA384_FIXED, "P-384"),
            };
            if key.crv.as_deref() != Some(curve) {
                return Err(format!("the provider's key is not on curve {curve}"));
            }
            let mut point = vec![4u8];
            point.extend(b64(&key.x, "x")?);
            point.extend(b64(&key.y, "y")?);
            sig::UnparsedPublicKey::new(params, point)
                .verify(message, signature)
                .map_err(bad)
        }
        other => Err(format!(
            "algorithm {other} is not accepted (RS256/384/512, ES256/384)"
        )),
    }
}

/// Tokens seen recently, so that each call does not verify a signature again.
#[derive(Debug, Default)]
pub struct Verified {
    seen: Mutex<HashMap<String, Identity>>,
}

impl Verified {
    const MAX: usize = 10_000;

    pub fn get(&self, token: &str) -> Option<Identity> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(token)
            .filter(|i| i.expires + LEEWAY_SECONDS >= now)
            .cloned()
    }

    pub fn put(&self, token: &str, identity: Identity) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= Self::MAX {
            seen.clear();
        }
        seen.insert(token.to_string(), identity);
    }
}
