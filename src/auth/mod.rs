//! Who is asking, and may they: authentication of every downstream request
//! and authorization of every read the cache answers, so the cache never
//! shows anyone what kube-apiserver would not.
//!
//! Authentication follows the apiserver's order (its union authenticator):
//! a client certificate verified against the client CA (user = CN, groups
//! = O), then a bearer token (TokenReview upstream), then anonymous
//! (`system:anonymous` in `system:unauthenticated`, unless disabled). A
//! certificate that does not verify falls through to the token, but is
//! never anonymous ([`Credential::of`]).
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

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use http::header::AUTHORIZATION;

use crate::component::config::{AuthenticationConfig, AuthorizationConfig};
use crate::upstream::{ServerInfo, Upstream};
use apimachinery::request::RequestInfo;
use apimachinery::status::Status;

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
    /// A WebSocket request's bearer token in its subprotocols (see
    /// [`ProtocolToken`]), with the other subprotocols.
    WebSocket {
        token: String,
        /// `Sec-WebSocket-Protocol` once the token authenticated: the
        /// other subprotocols joined with `,`.
        protocols: String,
    },
    /// No credential.
    None,
}

/// What a WebSocket request's `Sec-WebSocket-Protocol` headers say about
/// its caller, as the apiserver's protocol authenticator reads them
/// (`staging/src/k8s.io/apiserver/pkg/authentication/request/websocket/
/// protocol.go`), for requests that are WebSocket requests
/// ([`apimachinery::request::is_websocket_request`]): every header's
/// comma-separated, trimmed subprotocols; one of them may be
/// `base64url.bearer.authorization.k8s.io.<token, base64url without
/// padding>`. It runs after the client certificate and the
/// `Authorization` header, only when neither authenticated the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolToken {
    /// No token subprotocol (or an empty token): no opinion.
    None,
    /// A token, and the other subprotocols joined with `,`.
    Token { token: String, protocols: String },
    /// More than one token subprotocol, a token that is not base64url or
    /// not UTF-8, or no other subprotocol: an error (`401` unless an
    /// earlier authenticator succeeded).
    Invalid,
}

/// Go's `base64.RawURLEncoding` decoder: the URL alphabet, no padding,
/// and (not being strict) any trailing bits.
const RAW_URL_ENCODING: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// The subprotocol prefix of a bearer token.
pub const BEARER_PROTOCOL_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

impl ProtocolToken {
    /// Reads a request's `Sec-WebSocket-Protocol` headers.
    pub fn of(headers: &HeaderMap) -> ProtocolToken {
        use base64::Engine;
        let mut token = String::new();
        let mut saw_token = false;
        let mut others: Vec<String> = Vec::new();
        for value in headers.get_all(http::header::SEC_WEBSOCKET_PROTOCOL) {
            let value = String::from_utf8_lossy(value.as_bytes());
            for protocol in value.split(',').map(str::trim) {
                let Some(encoded) = protocol.strip_prefix(BEARER_PROTOCOL_PREFIX) else {
                    others.push(protocol.to_string());
                    continue;
                };
                if saw_token {
                    return ProtocolToken::Invalid;
                }
                saw_token = true;
                let Ok(decoded) = RAW_URL_ENCODING.decode(encoded) else {
                    return ProtocolToken::Invalid;
                };
                let Ok(decoded) = String::from_utf8(decoded) else {
                    return ProtocolToken::Invalid;
                };
                token = decoded;
            }
        }
        match (token.is_empty(), others.is_empty()) {
            (false, true) => ProtocolToken::Invalid,
            (true, _) => ProtocolToken::None,
            (false, false) => ProtocolToken::Token {
                token,
                protocols: others.join(","),
            },
        }
    }
}

/// What the connection's client certificate says, as the apiserver's x509
/// authenticator (`staging/src/k8s.io/apiserver/pkg/authentication/
/// request/x509/x509.go`) judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCertificate {
    /// None was presented: no opinion.
    None,
    /// It verifies against the client CA now, for client authentication,
    /// and names a user (CN).
    Verified(UserInfo),
    /// It verifies but has no CN: no opinion, the next authenticator
    /// decides.
    NoUser,
    /// It does not verify (unknown CA, expired, not yet valid, not for
    /// client authentication): an error, unless a later authenticator
    /// (a bearer token) succeeds.
    Rejected,
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

/// Why a request has no identity: the apiserver's `401`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unauthenticated;

// === impl Credential ===

impl Credential {
    /// The credential of a request, tried in the apiserver's order (its
    /// union authenticator, `request/union/union.go`): a verified client
    /// certificate, then a bearer token. A certificate that fails
    /// verification is an error the union remembers: a bearer token still
    /// authenticates the request, but without one it is `401`, never
    /// anonymous (the anonymous authenticator runs only when the chain
    /// returned no error).
    ///
    /// # Errors
    /// [`Unauthenticated`] for a rejected certificate without a token.
    ///
    /// A WebSocket request (`websocket`) may carry its token in a
    /// subprotocol instead ([`ProtocolToken`]); a malformed one is an
    /// error of the chain (`401`).
    pub fn of(
        cert: &ClientCertificate,
        headers: &HeaderMap,
        websocket: bool,
    ) -> Result<Credential, Unauthenticated> {
        if let ClientCertificate::Verified(user) = cert {
            return Ok(Credential::Certificate(user.clone()));
        }
        if let Some(token) = bearer_token(headers) {
            return Ok(Credential::Bearer(token));
        }
        let protocol = if websocket {
            ProtocolToken::of(headers)
        } else {
            ProtocolToken::None
        };
        match (protocol, cert) {
            (ProtocolToken::Token { token, protocols }, _) => {
                Ok(Credential::WebSocket { token, protocols })
            }
            (ProtocolToken::Invalid, _) | (ProtocolToken::None, ClientCertificate::Rejected) => {
                Err(Unauthenticated)
            }
            (ProtocolToken::None, _) => Ok(Credential::None),
        }
    }
}

/// The `Warning` the apiserver adds when an `Authorization` header has
/// more than one space between `Bearer` and the token.
pub const EXTRA_SPACE_WARNING: &str = "299 - \"the provided Authorization header contains extra space before the bearer token, and is ignored\"";

/// How the apiserver's `bearertoken` authenticator reads the
/// `Authorization` header
/// (`staging/src/k8s.io/apiserver/pkg/authentication/request/bearertoken/bearertoken.go`):
/// the first value, trimmed of white space, split on single spaces into at
/// most three parts; the first must be `bearer` in any case, the second is
/// the token. `Bearer  <token>` (two spaces) has an empty second part: no
/// token (the request is anonymous, with a warning). `Bearer <a> <b>`
/// authenticates `<a>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BearerHeader {
    /// No bearer token.
    None,
    /// A token.
    Token(String),
    /// `Bearer` followed by more than one space: ignored, with
    /// [`EXTRA_SPACE_WARNING`].
    ExtraSpace,
}

impl BearerHeader {
    /// Parses a request's `Authorization` header.
    pub fn of(headers: &HeaderMap) -> BearerHeader {
        let Some(value) = headers.get(AUTHORIZATION) else {
            return BearerHeader::None;
        };
        // Go reads the header's bytes as a string; invalid UTF-8 would be
        // replaced on its way into a TokenReview anyway.
        let value = String::from_utf8_lossy(value.as_bytes());
        let parts: Vec<&str> = value.trim().splitn(3, ' ').collect();
        if parts.len() < 2 || parts[0].to_lowercase() != "bearer" {
            return BearerHeader::None;
        }
        match (parts[1], parts.len()) {
            ("", 3) => BearerHeader::ExtraSpace,
            ("", _) => BearerHeader::None,
            (token, _) => BearerHeader::Token(token.to_string()),
        }
    }
}

/// The token of an `Authorization: Bearer` header, as the apiserver reads
/// it ([`BearerHeader`]).
pub fn bearer_token(headers: &HeaderMap) -> Option<String> {
    match BearerHeader::of(headers) {
        BearerHeader::Token(token) => Some(token),
        BearerHeader::None | BearerHeader::ExtraSpace => None,
    }
}

/// The bearer token a request presents: its `Authorization` header's, or
/// for a WebSocket request one in its subprotocols.
pub fn request_token(headers: &HeaderMap) -> Option<String> {
    bearer_token(headers).or_else(|| {
        if !apimachinery::request::is_websocket_request(headers) {
            return None;
        }
        match ProtocolToken::of(headers) {
            ProtocolToken::Token { token, .. } => Some(token),
            ProtocolToken::None | ProtocolToken::Invalid => None,
        }
    })
}

/// Authentication and authorization.
#[derive(Debug)]
pub struct Auth {
    tokens: TokenAuthenticator,
    access: AccessReviewer,
    last_modes: LastModes,
    anonymous: bool,
    /// The apiserver's impersonation filter, among what it is.
    server: Arc<ServerInfo>,
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
            server: Arc::default(),
        }
    }

    /// Impersonation decided by the impersonation filter `server` learns
    /// the apiserver runs (until then, and without this, kube-apiserver
    /// 1.36's constrained one).
    #[must_use]
    pub fn with_server_info(mut self, server: Arc<ServerInfo>) -> Auth {
        self.server = server;
        self
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
            Credential::Bearer(token) | Credential::WebSocket { token, .. } => {
                match self.tokens.authenticate(token).await {
                    Ok(TokenResult::Authenticated(user)) => user,
                    Ok(TokenResult::Rejected) => return Err(AuthFailure::Unauthorized),
                    Err(e) => return Err(AuthFailure::Unavailable(e)),
                }
            }
            Credential::None if self.anonymous => UserInfo::anonymous(),
            Credential::None => return Err(AuthFailure::Unauthorized),
        };
        let filter = self.server.impersonation_filter();
        match requested(headers, filter).map_err(AuthFailure::Status)? {
            None => Ok(user),
            Some(req) => impersonate(
                &self.access,
                filter,
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

    fn header(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn bearer_parsing_follows_the_apiserver() {
        assert_eq!(BearerHeader::of(&HeaderMap::new()), BearerHeader::None);
        let token = |s: &str| BearerHeader::Token(s.to_string());
        for (value, want) in [
            ("Bearer abc", token("abc")),
            ("bearer abc", token("abc")),
            ("BEARER abc", token("abc")),
            ("Bearer abc ", token("abc")),
            ("Bearer abc def", token("abc")),
            ("Bearer abc  def", token("abc")),
            ("Bearer  abc", BearerHeader::ExtraSpace),
            ("bearer   abc", BearerHeader::ExtraSpace),
            ("Bearer\tabc", BearerHeader::None),
            ("Bearer", BearerHeader::None),
            ("Bearer ", BearerHeader::None),
            ("Basic abc", BearerHeader::None),
            ("Bearerabc", BearerHeader::None),
            ("", BearerHeader::None),
        ] {
            assert_eq!(BearerHeader::of(&header(value)), want, "{value:?}");
        }
        assert_eq!(bearer_token(&header("Bearer  abc")), None);
        assert_eq!(bearer_token(&header("Bearer a b")).as_deref(), Some("a"));
    }

    #[test]
    fn certificate_then_token_then_anonymous() {
        let h = header("Bearer abc");
        let u = UserInfo::new("alice", &["dev"]);
        let verified = ClientCertificate::Verified(u.clone());
        let bearer = Ok(Credential::Bearer("abc".into()));
        assert_eq!(
            Credential::of(&verified, &h, false),
            Ok(Credential::Certificate(u))
        );
        for cert in [
            ClientCertificate::None,
            ClientCertificate::NoUser,
            ClientCertificate::Rejected,
        ] {
            assert_eq!(Credential::of(&cert, &h, false), bearer, "{cert:?}");
        }
        let none = HeaderMap::new();
        assert_eq!(
            Credential::of(&ClientCertificate::None, &none, false),
            Ok(Credential::None)
        );
        assert_eq!(
            Credential::of(&ClientCertificate::NoUser, &none, false),
            Ok(Credential::None)
        );
        assert_eq!(
            Credential::of(&ClientCertificate::Rejected, &none, false),
            Err(Unauthenticated)
        );
        // An ignored header is no token.
        assert_eq!(
            Credential::of(&ClientCertificate::Rejected, &header("Bearer  abc"), false),
            Err(Unauthenticated)
        );
    }

    fn protocols(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                http::header::SEC_WEBSOCKET_PROTOCOL,
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn websocket_protocol_tokens_as_the_apiserver_reads_them() {
        // "token" in base64url without padding.
        let tok = format!("{BEARER_PROTOCOL_PREFIX}dG9rZW4");
        let token = |p: &str| ProtocolToken::Token {
            token: "token".into(),
            protocols: p.into(),
        };
        assert_eq!(ProtocolToken::of(&protocols(&[])), ProtocolToken::None);
        assert_eq!(
            ProtocolToken::of(&protocols(&["v4.channel.k8s.io"])),
            ProtocolToken::None
        );
        assert_eq!(
            ProtocolToken::of(&protocols(&[&format!("{tok}, v4.channel.k8s.io")])),
            token("v4.channel.k8s.io")
        );
        assert_eq!(
            ProtocolToken::of(&protocols(&["a , b", &tok])),
            token("a,b")
        );
        assert_eq!(
            ProtocolToken::of(&protocols(&[&tok])),
            ProtocolToken::Invalid
        );
        assert_eq!(
            ProtocolToken::of(&protocols(&[&format!("{tok},{tok},x")])),
            ProtocolToken::Invalid
        );
        assert_eq!(
            ProtocolToken::of(&protocols(&[&format!(
                "{BEARER_PROTOCOL_PREFIX}dG9rZW4=, x"
            )])),
            ProtocolToken::Invalid
        );
        // "\xff" is not UTF-8.
        assert_eq!(
            ProtocolToken::of(&protocols(&[&format!("{BEARER_PROTOCOL_PREFIX}_w, x")])),
            ProtocolToken::Invalid
        );
        // Trailing bits are ignored, as Go's decoder ignores them.
        assert_eq!(
            ProtocolToken::of(&protocols(&[&format!(
                "{BEARER_PROTOCOL_PREFIX}dG9rZW5, x"
            )])),
            ProtocolToken::Token {
                token: "token".into(),
                protocols: "x".into()
            }
        );
        // An empty token is no token.
        assert_eq!(
            ProtocolToken::of(&protocols(&[&format!("{BEARER_PROTOCOL_PREFIX}, x")])),
            ProtocolToken::None
        );
        // Consulted for WebSocket requests only, after the certificate
        // and the Authorization header.
        let h = protocols(&[&format!("{tok}, x")]);
        assert_eq!(
            Credential::of(&ClientCertificate::Rejected, &h, true),
            Ok(Credential::WebSocket {
                token: "token".into(),
                protocols: "x".into()
            })
        );
        assert_eq!(
            Credential::of(&ClientCertificate::None, &h, false),
            Ok(Credential::None)
        );
        let mut both = h.clone();
        both.insert(AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert_eq!(
            Credential::of(&ClientCertificate::None, &both, true),
            Ok(Credential::Bearer("abc".into()))
        );
        assert_eq!(
            Credential::of(&ClientCertificate::None, &protocols(&[&tok]), true),
            Err(Unauthenticated)
        );
    }
}
