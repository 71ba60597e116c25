//! Authorization: the apiserver's union of authorizers
//! (`/tmp/research/auth.md` §1, §8), emulated as
//! `system:masters` → Node authorizer → built-in bootstrap rules (the proxy
//! user, discovery, self reviews) → rules granted at run time.
//! The first Allow wins; otherwise the NoOpinion reasons are joined by
//! `"\n"` and the request is forbidden.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use super::authorizer::{Attributes, Decision};

use super::authn::{AUTHENTICATED, UNAUTHENTICATED};
use super::errors::go_quote;
use super::node_authz::{self, NodeGraph};
use super::rbac::{Rule, Subject};
use apimachinery::status::{Details, Status, qualified_resource};

/// `system:masters`: allowed everything.
pub const MASTERS: &str = "system:masters";

/// Authorization rules, changeable while the sim runs.
#[derive(Debug)]
pub struct Policy {
    proxy_user: String,
    grants: RwLock<Vec<(u64, Subject, Rule)>>,
    next_id: AtomicU64,
    /// Resources the proxy user's rules no longer cover (its role edited,
    /// or an apiserver whose authorizer is not ready yet).
    withheld_from_proxy: RwLock<Vec<String>>,
}

/// The 403 `responsewriters.Forbidden` writes for a non-allow decision.
pub fn forbidden(attrs: &Attributes, reason: &str) -> Status {
    let user = go_quote(&attrs.user.name);
    let verb = &attrs.verb;
    let base = if !attrs.resource_request {
        format!("User {user} cannot {verb} path {}", go_quote(&attrs.path))
    } else {
        let mut resource = attrs.resource.clone();
        if !attrs.subresource.is_empty() {
            resource = format!("{resource}/{}", attrs.subresource);
        }
        let resource = go_quote(&resource);
        let group = go_quote(&attrs.api_group);
        if attrs.namespace.is_empty() {
            format!(
                "User {user} cannot {verb} resource {resource} in API group {group} at the cluster scope"
            )
        } else {
            format!(
                "User {user} cannot {verb} resource {resource} in API group {group} in the namespace {}",
                go_quote(&attrs.namespace)
            )
        }
    };
    // The apiserver HTML-escapes its own text, not the authorizer's reason.
    let base = base
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let err = if reason.is_empty() {
        base
    } else {
        format!("{base}: {reason}")
    };
    let qualified = if attrs.resource_request {
        qualified_resource(&attrs.api_group, &attrs.resource)
    } else {
        String::new()
    };
    let message = if qualified.is_empty() {
        format!("forbidden: {err}")
    } else if attrs.name.is_empty() {
        format!("{qualified} is forbidden: {err}")
    } else {
        format!("{qualified} {} is forbidden: {err}", go_quote(&attrs.name))
    };
    let details = if attrs.resource_request {
        Details {
            name: attrs.name.clone(),
            group: attrs.api_group.clone(),
            kind: attrs.resource.clone(),
            ..Details::default()
        }
    } else {
        Details::default()
    };
    Status::new(http::StatusCode::FORBIDDEN, "Forbidden", message).with_details(details)
}

// === impl Policy ===

impl Policy {
    /// A policy with no granted rules; `proxy_user` gets the proxy's rules.
    pub fn new(proxy_user: &str) -> Self {
        Policy {
            proxy_user: proxy_user.to_string(),
            grants: RwLock::new(Vec::new()),
            next_id: AtomicU64::new(1),
            withheld_from_proxy: RwLock::new(Vec::new()),
        }
    }

    /// Grants `rule` to `subject`; returns an id for [`Policy::revoke`].
    pub fn grant(&self, subject: Subject, rule: Rule) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.grants.write().push((id, subject, rule));
        id
    }

    /// Removes the grant `id`; returns whether it existed.
    pub fn revoke(&self, id: u64) -> bool {
        let mut grants = self.grants.write();
        let before = grants.len();
        grants.retain(|(i, _, _)| *i != id);
        grants.len() != before
    }

    /// Takes `resource` (a plural name, any group) out of the proxy
    /// user's rules (`withheld`), or gives it back.
    pub fn withhold_from_proxy(&self, resource: &str, withheld: bool) {
        let mut w = self.withheld_from_proxy.write();
        w.retain(|r| r != resource);
        if withheld {
            w.push(resource.to_string());
        }
    }

    /// Removes every granted rule (built-in rules stay).
    pub fn clear(&self) {
        self.grants.write().clear();
    }

    /// The union of authorizers for `attrs`.
    pub fn authorize(&self, attrs: &Attributes, graph: &dyn NodeGraph) -> Decision {
        if attrs.user.in_group(MASTERS) {
            return Decision::Allow;
        }
        let mut reasons = Vec::new();
        match node_authz::authorize(attrs, graph) {
            Decision::Allow => return Decision::Allow,
            Decision::Deny(r) => return Decision::Deny(r),
            Decision::NoOpinion(r) if !r.is_empty() => reasons.push(r),
            Decision::NoOpinion(_) => {}
        }
        if self.bootstrap_allows(attrs) {
            return Decision::Allow;
        }
        let granted = self
            .grants
            .read()
            .iter()
            .any(|(_, subject, rule)| subject.matches(attrs) && rule.allows(attrs));
        if granted {
            return Decision::Allow;
        }
        // RBAC contributes no reason to a plain denial.
        Decision::NoOpinion(reasons.join("\n"))
    }

    /// The bootstrap roles: `system:public-info-viewer`, `system:discovery`,
    /// `system:basic-user`, and the proxy user's rules.
    fn bootstrap_allows(&self, attrs: &Attributes) -> bool {
        let public = Rule::non_resource(
            &["get"],
            &["/healthz", "/livez", "/readyz", "/version", "/version/"],
        );
        let authenticated = attrs.user.in_group(AUTHENTICATED);
        let anyone = authenticated || attrs.user.in_group(UNAUTHENTICATED);
        if anyone && public.allows(attrs) {
            return true;
        }
        if authenticated {
            let discovery = Rule::non_resource(
                &["get"],
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/openapi",
                    "/openapi/*",
                    "/version",
                ],
            );
            let basic = [
                Rule::new(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                Rule::new(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
            ];
            if discovery.allows(attrs) || basic.iter().any(|r| r.allows(attrs)) {
                return true;
            }
        }
        if attrs.user.name == self.proxy_user
            && !(attrs.resource_request
                && self.withheld_from_proxy.read().contains(&attrs.resource))
        {
            let proxy = [
                Rule::new(&["get", "list", "watch"], &["*"], &["*"]),
                Rule::new(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                Rule::new(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
                Rule::new(&["impersonate"], &["", "authentication.k8s.io"], &["*"]),
                Rule::non_resource(&["get"], &["*"]),
            ];
            return proxy.iter().any(|r| r.allows(attrs));
        }
        false
    }
}

#[cfg(test)]
#[path = "authz_tests.rs"]
mod tests;
