//! Authentication as kube-apiserver does it (`/tmp/research/auth.md` §2, §6):
//! a verified client certificate (user = CN, groups = O), else a bearer
//! token from the sim's token map (an unknown token is a 401 even with
//! anonymous access on), else `system:anonymous` if enabled, else 401.

use std::collections::HashMap;

use http::HeaderMap;
use parking_lot::RwLock;

pub use apimachinery::user::UserInfo;
/// `system:authenticated`.
pub const AUTHENTICATED: &str = apimachinery::user::AUTHENTICATED_GROUP;
/// `system:unauthenticated`.
pub const UNAUTHENTICATED: &str = apimachinery::user::UNAUTHENTICATED_GROUP;

/// How a request authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// A client certificate signed by the cluster CA.
    X509,
    /// A bearer token.
    Token,
    /// No credentials: `system:anonymous`.
    Anonymous,
    /// Authentication failed (the request got a 401).
    Failed,
}

/// The bearer tokens the sim accepts.
#[derive(Debug, Default)]
pub struct Tokens {
    map: RwLock<HashMap<String, UserInfo>>,
}

// === impl Tokens ===

impl Tokens {
    /// Accepts `token` as `user`.
    pub fn add(&self, token: &str, user: UserInfo) {
        self.map.write().insert(token.to_string(), user);
    }

    /// Stops accepting `token`.
    pub fn revoke(&self, token: &str) {
        self.map.write().remove(token);
    }

    /// The user for `token`, with `system:authenticated` added.
    pub fn lookup(&self, token: &str) -> Option<UserInfo> {
        self.map
            .read()
            .get(token)
            .cloned()
            .map(UserInfo::with_authenticated_group)
    }
}

/// The bearer token of an `Authorization` header, as `bearertoken.go` reads
/// it: `Bearer <token>`, scheme case-insensitive.
pub fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let auth = headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .trim();
    let mut parts = auth.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return None;
    }
    Some(token.to_string())
}

/// Authenticates a request. `cert_user` is the user of the connection's
/// verified client certificate.
///
/// # Errors
/// `Err(())` means 401 Unauthorized.
pub fn authenticate(
    cert_user: Option<&UserInfo>,
    headers: &HeaderMap,
    tokens: &Tokens,
    anonymous: bool,
) -> Result<(UserInfo, AuthMethod), ()> {
    if let Some(user) = cert_user {
        return Ok((user.clone().with_authenticated_group(), AuthMethod::X509));
    }
    if let Some(token) = bearer_token(headers) {
        return tokens
            .lookup(&token)
            .map(|u| (u, AuthMethod::Token))
            .ok_or(());
    }
    if anonymous {
        return Ok((UserInfo::anonymous(), AuthMethod::Anonymous));
    }
    Err(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, auth.parse().unwrap());
        h
    }

    #[test]
    fn order_and_failures() {
        let tokens = Tokens::default();
        tokens.add("t1", UserInfo::new("alice", &["dev"]));
        let cert = UserInfo::new("bob", &["system:masters"]);
        let (u, m) = authenticate(Some(&cert), &headers("Bearer nope"), &tokens, true).unwrap();
        assert_eq!((u.name.as_str(), m), ("bob", AuthMethod::X509));
        assert_eq!(u.groups, ["system:masters", AUTHENTICATED]);
        let (u, m) = authenticate(None, &headers("bearer t1"), &tokens, false).unwrap();
        assert_eq!((u.name.as_str(), m), ("alice", AuthMethod::Token));
        assert!(authenticate(None, &headers("Bearer nope"), &tokens, true).is_err());
        let (u, m) = authenticate(None, &HeaderMap::new(), &tokens, true).unwrap();
        assert_eq!(
            (u.groups.as_slice(), m),
            (&[UNAUTHENTICATED.to_string()][..], AuthMethod::Anonymous)
        );
        assert!(authenticate(None, &HeaderMap::new(), &tokens, false).is_err());
        tokens.revoke("t1");
        assert!(authenticate(None, &headers("Bearer t1"), &tokens, true).is_err());
    }

    #[test]
    fn user_info_json_names() {
        let mut u = UserInfo::new("a", &["g"]);
        u.extra.insert("k".into(), vec!["v".into()]);
        assert_eq!(
            serde_json::to_string(&u).unwrap(),
            r#"{"username":"a","groups":["g"],"extra":{"k":["v"]}}"#
        );
        let back: UserInfo = serde_json::from_str(r#"{"username":"a","groups":null}"#).unwrap();
        assert_eq!(back, UserInfo::new("a", &[]));
    }

    #[test]
    fn certificate_subject_maps_to_user() {
        let ca = apimachinery::pki::Ca::new("ca").unwrap();
        let issued = ca
            .issue_client("system:node:n1", Some("system:nodes"))
            .unwrap();
        let der: rustls_pki_types::CertificateDer<'_> =
            rustls_pki_types::pem::PemObject::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
        let u = UserInfo::from_certificate(&der).unwrap();
        assert_eq!(
            (u.name.as_str(), u.groups.as_slice()),
            ("system:node:n1", &["system:nodes".to_string()][..])
        );
        assert!(u.extra[apimachinery::user::CREDENTIAL_ID_EXTRA][0].starts_with("X509SHA256="));
    }
}
