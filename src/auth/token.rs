//! Bearer tokens, authenticated by a TokenReview upstream and cached.
//!
//! The cache is keyed by SHA-256 of a per-process random salt and the
//! token, never by the token itself. A positive answer is kept for
//! `cacheTTLSeconds` (default 10 s, so that a deleted ServiceAccount's
//! token stops working within seconds, as at the apiserver; its webhook
//! authenticator keeps 2 minutes) but never past the token's
//! own expiry when the token is a JWT (its `exp` claim is read, not
//! trusted: it only shortens the TTL); a negative answer for
//! `failureCacheTTLSeconds` (default 10 s), unless the review carries an
//! error. Failed reviews (the apiserver unreachable) are not cached.
//! Concurrent misses for the same token make one upstream call.

use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use sha2::{Digest, Sha256};

use crate::upstream::Upstream;

use super::UserInfo;
use super::metrics::AuthMetrics;
use super::review::{self, ReviewError};
use super::ttl_cache::{Fetched, TtlCache};

/// What a token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenResult {
    /// The apiserver authenticated it as this user.
    Authenticated(UserInfo),
    /// The apiserver did not authenticate it.
    Rejected,
}

/// Token cache settings.
#[derive(Debug, Clone, Copy)]
pub struct TokenSettings {
    pub success_ttl: Duration,
    pub failure_ttl: Duration,
    /// How long past its TTL a review stands in while upstream cannot be
    /// asked (never past a JWT's expiry).
    pub last_known: Duration,
    pub capacity: u64,
}

/// Authenticates bearer tokens.
pub struct TokenAuthenticator {
    upstream: Upstream,
    cache: TtlCache<TokenResult>,
    salt: [u8; 32],
    settings: TokenSettings,
    metrics: AuthMetrics,
}

impl std::fmt::Debug for TokenAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAuthenticator")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

// === impl TokenAuthenticator ===

impl TokenAuthenticator {
    /// A token authenticator asking `upstream`.
    pub fn new(
        upstream: Upstream,
        settings: TokenSettings,
        metrics: AuthMetrics,
    ) -> TokenAuthenticator {
        let mut salt = [0u8; 32];
        for b in &mut salt {
            *b = fastrand::u8(..);
        }
        // Mix in a fresh UUID (from the OS's randomness) so the salt does
        // not depend on fastrand's seed alone.
        let uuid = uuid::Uuid::new_v4();
        for (s, u) in salt.iter_mut().zip(uuid.as_bytes()) {
            *s ^= u;
        }
        TokenAuthenticator {
            upstream,
            cache: TtlCache::new(settings.capacity),
            salt,
            settings,
            metrics,
        }
    }

    /// The cache key of a token.
    fn key(&self, token: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.salt);
        h.update(token.as_bytes());
        h.finalize().into()
    }

    /// Authenticates `token`.
    ///
    /// # Errors
    /// [`ReviewError`] when the TokenReview could not be made.
    pub async fn authenticate(&self, token: &str) -> Result<TokenResult, ReviewError> {
        let start = Instant::now();
        let (result, source) = self
            .cache
            .get_or_fetch(
                self.key(token),
                self.review(token),
                ReviewError::is_unavailable,
            )
            .await;
        let label = match &result {
            Ok(TokenResult::Authenticated(_)) => "authenticated",
            Ok(TokenResult::Rejected) => "unauthenticated",
            Err(_) => "error",
        };
        self.metrics
            .authenticated(label, source.as_str(), start.elapsed().as_secs_f64());
        result
    }

    async fn review(&self, token: &str) -> Result<Fetched<TokenResult>, ReviewError> {
        let request = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                // None: the apiserver then checks the token against its own
                // --api-audiences (pkg/registry/authentication/tokenreview/
                // storage.go), exactly as when the token is sent to it
                // directly; a token minted for another audience fails both.
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answer: TokenReview = review::create(
            &self.upstream,
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &request,
        )
        .await?;
        let status = answer.status.unwrap_or_default();
        let lifetime = jwt_lifetime(token);
        let fetched = |value, ttl: Duration| {
            let last_known = ttl + self.settings.last_known;
            Fetched {
                value,
                ttl,
                last_known: lifetime.map_or(last_known, |left| left.min(last_known)),
            }
        };
        if status.authenticated != Some(true) {
            // Not authenticated, with or without an error ("invalid bearer
            // token" for any token no authenticator accepts): what the
            // apiserver answers the token itself, 401. Answers with an
            // error are not cached, as the apiserver's webhook
            // authenticator caches none (a transient failure heals).
            let failed = status.error.as_deref().is_some_and(|e| !e.is_empty());
            let ttl = if failed {
                Duration::ZERO
            } else {
                self.settings.failure_ttl
            };
            return Ok(fetched(TokenResult::Rejected, ttl));
        }
        let user = status.user.unwrap_or_default();
        let user = UserInfo {
            name: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        };
        let ttl = match lifetime {
            Some(left) => left.min(self.settings.success_ttl),
            None => self.settings.success_ttl,
        };
        Ok(fetched(
            TokenResult::Authenticated(user.with_authenticated_group()),
            ttl,
        ))
    }

    /// Whether `token` is known, from a cached TokenReview, to authenticate
    /// someone. No review is made.
    pub async fn known_authenticated(&self, token: &str) -> bool {
        matches!(
            self.cache.get(&self.key(token)).await,
            Some(TokenResult::Authenticated(_))
        )
    }

    /// Tokens in the cache, for tests.
    pub async fn cached_entries(&self) -> Vec<([u8; 32], TokenResult)> {
        self.cache.entries().await
    }
}

/// Time until a JWT's `exp`, if the token is a JWT with one. The claim is
/// only used to shorten the cache TTL; the token is not verified here.
fn jwt_lifetime(token: &str) -> Option<Duration> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Claims {
        exp: Option<f64>,
    }
    let claims: Claims =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?)
            .ok()?;
    let exp = SystemTime::UNIX_EPOCH + Duration::from_secs_f64(claims.exp?.max(0.0));
    Some(
        exp.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_expiry_caps_the_ttl() {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let payload = URL_SAFE_NO_PAD.encode(format!(r#"{{"exp":{}}}"#, now + 30));
        let token = format!("eyJhbGciOiJSUzI1NiJ9.{payload}.sig");
        let left = jwt_lifetime(&token).unwrap();
        assert!(
            left <= Duration::from_secs(30) && left > Duration::from_secs(25),
            "{left:?}"
        );
        assert_eq!(jwt_lifetime("opaque-token"), None);
        let past = URL_SAFE_NO_PAD.encode(r#"{"exp":1}"#);
        assert_eq!(jwt_lifetime(&format!("a.{past}.c")), Some(Duration::ZERO));
    }

    #[tokio::test]
    async fn keys_hold_no_plain_token() {
        let cfg = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let upstream = Upstream::new(&cfg, Duration::from_secs(1), Duration::from_secs(1)).unwrap();
        let metrics = AuthMetrics::new(&prometheus::Registry::new()).unwrap();
        let settings = TokenSettings {
            success_ttl: Duration::from_secs(60),
            failure_ttl: Duration::from_secs(10),
            last_known: Duration::ZERO,
            capacity: 10,
        };
        let auth = TokenAuthenticator::new(upstream, settings, metrics);
        let token = "super-secret-token-value";
        auth.cache
            .insert(
                auth.key(token),
                TokenResult::Rejected,
                Duration::from_secs(10),
            )
            .await;
        let entries = auth.cached_entries().await;
        assert_eq!(entries.len(), 1);
        let (key, _) = &entries[0];
        // The key is a digest: it contains no run of the token's bytes, and
        // another process's salt gives another key.
        assert!(
            !key.windows(4)
                .any(|w| token.as_bytes().windows(4).any(|t| t == w))
        );
        let other = TokenAuthenticator::new(auth.upstream.clone(), settings, auth.metrics.clone());
        assert_ne!(other.key(token), *key);
        assert_eq!(auth.key(token), *key);
        // Nothing in the cache's debug output shows the token either.
        assert!(!format!("{auth:?}").contains(token));
    }
}
