//! `user.Info`: name, uid, groups and extra, with the JSON field names of
//! `authentication.k8s.io/v1` `UserInfo` (used in TokenReview results and
//! SubjectAccessReview specs). Reading tolerates `null` fields, as Go
//! writes them.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest, Sha256};

/// The anonymous user's name.
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The group every authenticated user is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The anonymous user's group.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The extra key x509 authentication sets (`user.CredentialIDKey`).
pub const CREDENTIAL_ID_EXTRA: &str = "authentication.kubernetes.io/credential-id";

/// A user as the apiserver sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct UserInfo {
    #[serde(
        rename = "username",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub uid: String,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub groups: Vec<String>,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub extra: BTreeMap<String, Vec<String>>,
}

fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

// === impl UserInfo ===

impl UserInfo {
    /// A user with a name and groups.
    pub fn new(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..UserInfo::default()
        }
    }

    /// `system:anonymous` in `system:unauthenticated`.
    pub fn anonymous() -> UserInfo {
        UserInfo::new(ANONYMOUS_USER, &[UNAUTHENTICATED_GROUP])
    }

    /// The user of a verified client certificate (DER), as the apiserver's
    /// `x509.CommonNameUserConversion` maps it: CN is the name, each O a
    /// group, and the certificate's SHA-256 the credential id extra. `None`
    /// when the certificate has no CN (the apiserver does not authenticate
    /// it).
    pub fn from_certificate(der: &[u8]) -> Option<UserInfo> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let name = subject
            .iter_common_name()
            .next()?
            .as_str()
            .ok()?
            .to_string();
        if name.is_empty() {
            return None;
        }
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_string))
            .collect();
        let fingerprint: String = Sha256::digest(der)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut extra = BTreeMap::new();
        extra.insert(
            CREDENTIAL_ID_EXTRA.to_string(),
            vec![format!("X509SHA256={fingerprint}")],
        );
        Some(UserInfo {
            name,
            uid: String::new(),
            groups,
            extra,
        })
    }

    /// Whether the user is in `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// Adds `system:authenticated` unless the user is anonymous or already
    /// carries `system:authenticated` or `system:unauthenticated`, as the
    /// apiserver's `AuthenticatedGroupAdder` does.
    pub fn with_authenticated_group(mut self) -> UserInfo {
        let marked = self
            .groups
            .iter()
            .any(|g| g == AUTHENTICATED_GROUP || g == UNAUTHENTICATED_GROUP);
        if self.name != ANONYMOUS_USER && !marked {
            self.groups.push(AUTHENTICATED_GROUP.to_string());
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_field_names_and_nulls() {
        let u = UserInfo::new("alice", &["dev"]);
        assert_eq!(
            serde_json::to_string(&u).unwrap(),
            r#"{"username":"alice","groups":["dev"]}"#
        );
        let u: UserInfo =
            serde_json::from_str(r#"{"username":"bob","uid":null,"groups":null,"extra":null}"#)
                .unwrap();
        assert_eq!(u, UserInfo::new("bob", &[]));
    }

    #[test]
    fn authenticated_group() {
        let u = UserInfo::new("alice", &[]).with_authenticated_group();
        assert_eq!(u.groups, vec![AUTHENTICATED_GROUP]);
        let a = UserInfo::anonymous().with_authenticated_group();
        assert_eq!(a.groups, vec![UNAUTHENTICATED_GROUP]);
    }

    #[test]
    fn certificate_maps_cn_and_o() {
        use rustls_pki_types::pem::PemObject;
        let ca = crate::pki::Ca::new("ca").unwrap();
        let c = ca
            .issue_client("system:node:n1", Some("system:nodes"))
            .unwrap();
        let der = rustls_pki_types::CertificateDer::from_pem_slice(c.cert_pem.as_bytes()).unwrap();
        let u = UserInfo::from_certificate(&der).unwrap();
        assert_eq!(
            (u.name.as_str(), u.groups.as_slice()),
            ("system:node:n1", &["system:nodes".to_string()][..])
        );
        assert!(u.extra[CREDENTIAL_ID_EXTRA][0].starts_with("X509SHA256="));
    }
}
