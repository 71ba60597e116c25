//! The authorizer interface's types, as in
//! `k8s.io/apiserver/pkg/authorization/authorizer`: what is being asked
//! ([`Attributes`]) and an authorizer's answer ([`Decision`]).
//!
//! A leaf module: the Node authorizer (`node_authz`), the RBAC-like rules
//! (`rbac`) and their union (`authz`) all speak these types, so keeping
//! them here lets `authz` compose the others without either pointing back
//! at it.

use super::authn::UserInfo;
use apimachinery::request::RequestInfo;
use apimachinery::selector::{FieldRequirement, FieldSelector, LabelSelector, Requirement};

/// What is being asked, as `authorizer.Attributes`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    pub user: UserInfo,
    pub verb: String,
    pub resource_request: bool,
    /// The path, for non-resource requests.
    pub path: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// Field selector requirements (list/watch/deletecollection only).
    pub field_selector: Vec<FieldRequirement>,
    /// Label selector requirements (list/watch/deletecollection only).
    pub label_selector: Vec<Requirement>,
}

/// An authorizer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied, with a reason.
    Deny(String),
    /// Not allowed by this authorizer, with a (possibly empty) reason.
    NoOpinion(String),
}

// === impl Attributes ===

impl Attributes {
    /// The attributes of an HTTP request by `user`. Selectors are taken from
    /// `query` for list, watch and deletecollection, except for the legacy
    /// `/watch/` path form, like `GetAuthorizerAttributes`.
    pub fn from_request(info: &RequestInfo, user: &UserInfo, query: &str) -> Attributes {
        let mut attrs = Attributes {
            user: user.clone(),
            verb: info.verb.clone(),
            resource_request: info.is_resource_request,
            path: info.path.clone(),
            api_group: info.api_group.clone(),
            api_version: info.api_version.clone(),
            namespace: info.namespace.clone(),
            resource: info.resource.clone(),
            subresource: info.subresource.clone(),
            name: info.name.clone(),
            ..Attributes::default()
        };
        let selectable = matches!(info.verb.as_str(), "list" | "watch" | "deletecollection");
        if selectable && !info.legacy_watch_path {
            let mut seen_fields = false;
            let mut seen_labels = false;
            for (k, v) in form_urlencoded::parse(query.as_bytes()) {
                if k == "fieldSelector" && !seen_fields {
                    seen_fields = true;
                    attrs.field_selector = FieldSelector::parse(&v)
                        .map(|s| s.terms().to_vec())
                        .unwrap_or_default();
                } else if k == "labelSelector" && !seen_labels {
                    seen_labels = true;
                    attrs.label_selector = LabelSelector::parse(&v)
                        .map(|s| s.requirements().to_vec())
                        .unwrap_or_default();
                }
            }
        }
        attrs
    }
}
