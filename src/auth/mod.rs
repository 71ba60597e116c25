//! Who is asking, and may they: authentication of every downstream request
//! and authorization of every read the cache answers, so the cache never
//! shows anyone what kube-apiserver would not.
//!
//! Authentication follows the apiserver's order (its union authenticator):
//! a client certificate verified against the client CA (user = CN, groups
//! = O), then a bearer token (TokenReview upstream), then anonymous
//! (`system:anonymous` in `system:unauthenticated`, unless disabled).
//! Client-requested impersonation is then authorized (see
//! [`impersonation`]). A read answered from the cache is authorized with a
//! SubjectAccessReview (see [`access`]); a watch once, when it starts.

pub mod access;
pub mod impersonation;
pub mod metrics;
pub mod review;
pub mod token;
pub mod ttl_cache;

// `user.Info` is shared with the simulated apiserver (the `apimachinery`
// crate).
pub use apimachinery::user::{
    ANONYMOUS_USER, AUTHENTICATED_GROUP, CREDENTIAL_ID_EXTRA, UNAUTHENTICATED_GROUP, UserInfo,
};

use std::time::Duration;

use http::HeaderMap;
use http::header::AUTHORIZATION;

use crate::config::{AuthenticationConfig, AuthorizationConfig};
use crate::request::RequestInfo;
use crate::status::Status;
use crate::upstream::Upstream;

use self::access::{AccessReviewer, AccessSettings, Attributes, Decision};
use self::impersonation::{ImpersonationError, LastModes, impersonate, requested};
use self::metrics::AuthMetrics;
use self::review::ReviewError;
use self::token::{TokenAuthenticator, TokenResult, TokenSettings};

/// The credential a request presented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A client certificate verified against the client CA.
    Certificate(UserInfo),
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// No credential.
    None,
}

/// Why a request's identity could not be established.
#[derive(Debug, Clone)]
pub enum AuthFailure {
    /// `401 Unauthorized`.
    Unauthorized,
    /// The apiserver's `400` or `403` (impersonation).
    Status(Box<Status>),
    /// Upstream could not be asked.
    Unavailable(ReviewError),
}

// === impl Credential ===

impl Credential {
    /// The credential of a request: the connection's verified certificate
    /// user wins over a bearer token, as in the apiserver.
    pub fn of(cert_user: Option<&UserInfo>, headers: &HeaderMap) -> Credential {
        if let Some(user) = cert_user {
            return Credential::Certificate(user.clone());
        }
        match bearer_token(headers) {
            Some(token) => Credential::Bearer(token.to_string()),
            None => Credential::None,
        }
    }
}

/// The token of an `Authorization: Bearer` header, like the apiserver's
/// `bearertoken` authenticator parses it (case-insensitive scheme, one
/// space, non-empty token).
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// Authentication and authorization.
#[derive(Debug)]
pub struct Auth {
    tokens: TokenAuthenticator,
    access: AccessReviewer,
    last_modes: LastModes,
    anonymous: bool,
}

// === impl Auth ===

impl Auth {
    /// Builds the authenticator and authorizer, asking `upstream`.
    pub fn new(
        upstream: &Upstream,
        authn: &AuthenticationConfig,
        authz: &AuthorizationConfig,
        metrics: AuthMetrics,
    ) -> Auth {
        let t = &authn.token_review;
        let a = &authz.subject_access_review;
        Auth {
            tokens: TokenAuthenticator::new(
                upstream.clone(),
                TokenSettings {
                    success_ttl: Duration::from_secs(t.cache_ttl_seconds),
                    failure_ttl: Duration::from_secs(t.failure_cache_ttl_seconds),
                    last_known: Duration::from_secs(t.stale_if_unavailable_seconds),
                    capacity: t.cache_size,
                },
                metrics.clone(),
            ),
            access: AccessReviewer::new(
                upstream.clone(),
                AccessSettings {
                    allowed_ttl: Duration::from_secs(a.allowed_cache_ttl_seconds),
                    denied_ttl: Duration::from_secs(a.denied_cache_ttl_seconds),
                    last_known: Duration::from_secs(a.stale_if_unavailable_seconds),
                    capacity: a.cache_size,
                },
                metrics,
            ),
            last_modes: LastModes::default(),
            anonymous: authn.anonymous.enabled,
        }
    }

    /// Whether requests without credentials are `system:anonymous`
    /// (otherwise they get `401`).
    pub fn anonymous_enabled(&self) -> bool {
        self.anonymous
    }

    /// The user a request acts as: its authenticated user, or the user it
    /// impersonates once that is authorized.
    ///
    /// # Errors
    /// [`AuthFailure`].
    pub async fn identify(
        &self,
        credential: &Credential,
        headers: &HeaderMap,
        info: &RequestInfo,
        query: Option<&str>,
    ) -> Result<UserInfo, AuthFailure> {
        let user = match credential {
            Credential::Certificate(user) => user.clone(),
            Credential::Bearer(token) => match self.tokens.authenticate(token).await {
                Ok(TokenResult::Authenticated(user)) => user,
                Ok(TokenResult::Rejected) => return Err(AuthFailure::Unauthorized),
                Err(e) => return Err(AuthFailure::Unavailable(e)),
            },
            Credential::None if self.anonymous => UserInfo::anonymous(),
            Credential::None => return Err(AuthFailure::Unauthorized),
        };
        match requested(headers).map_err(AuthFailure::Status)? {
            None => Ok(user),
            Some(req) => impersonate(
                &self.access,
                &self.last_modes,
                &user,
                &req,
                &Attributes::for_request(&user, info, query),
            )
            .await
            .map_err(|e| match e {
                ImpersonationError::Status(s) => AuthFailure::Status(s),
                ImpersonationError::Error(e) => AuthFailure::Unavailable(e),
            }),
        }
    }

    /// Decides whether `attrs` are allowed.
    ///
    /// # Errors
    /// [`ReviewError`] when the decision could not be made.
    pub async fn authorize(&self, attrs: &Attributes) -> Result<Decision, ReviewError> {
        self.access.authorize(attrs).await
    }

    /// The token authenticator (for inspection in tests).
    pub fn tokens(&self) -> &TokenAuthenticator {
        &self.tokens
    }
}

/// `401 Unauthorized`, as the apiserver's authentication filter writes it.
pub fn unauthorized() -> Status {
    Status::unauthorized()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer_token(&h), None);
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert_eq!(bearer_token(&h), Some("abc"));
        h.insert(AUTHORIZATION, HeaderValue::from_static("bearer  abc "));
        assert_eq!(bearer_token(&h), Some("abc"));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer_token(&h), None);
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer_token(&h), None);
    }

    #[test]
    fn certificate_wins_over_token() {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        let u = UserInfo::new("alice", &["dev"]);
        assert_eq!(Credential::of(Some(&u), &h), Credential::Certificate(u));
        assert_eq!(Credential::of(None, &h), Credential::Bearer("abc".into()));
    }
}
