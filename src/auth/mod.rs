//! Who is asking: the identity of each downstream request.
//!
//! Authentication follows the apiserver's order (its union authenticator):
//! a verified client certificate first (user = CN, groups = O), then a
//! bearer token, then anonymous.

mod user;

pub use user::{
    ANONYMOUS_USER, AUTHENTICATED_GROUP, CREDENTIAL_ID_EXTRA, UNAUTHENTICATED_GROUP, UserInfo,
};

use http::HeaderMap;
use http::header::AUTHORIZATION;

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
