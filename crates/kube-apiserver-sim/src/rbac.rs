//! RBAC-like rules: who may do what, matched as
//! `plugin/pkg/auth/authorizer/rbac` matches `PolicyRule`s (wildcards `*`,
//! `*/subresource`, resource names, non-resource URL prefixes `/apis/*`).

use super::authorizer::Attributes;

/// Who a rule is granted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    User(String),
    Group(String),
}

/// One rule, like an RBAC `PolicyRule` bound in `namespaces` (a
/// RoleBinding) or cluster-wide (`None`, a ClusterRoleBinding).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// Verbs (`get`, `list`, `watch`, `create`, ..., `impersonate`), or `*`.
    pub verbs: Vec<String>,
    /// API groups (`""` for core), or `*`.
    pub api_groups: Vec<String>,
    /// Resources, `resource/subresource`, `*/subresource` or `*`.
    pub resources: Vec<String>,
    /// Object names; empty allows every name.
    pub resource_names: Vec<String>,
    /// Namespaces the rule applies in; `None` for every namespace and the
    /// cluster scope.
    pub namespaces: Option<Vec<String>>,
    /// Non-resource paths (`/healthz`, `/apis/*`); resource fields are then
    /// ignored.
    pub non_resource_urls: Vec<String>,
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

// === impl Subject ===

impl Subject {
    /// Whether the attributes' user is this subject.
    pub fn matches(&self, attrs: &Attributes) -> bool {
        match self {
            Subject::User(u) => attrs.user.name == *u,
            Subject::Group(g) => attrs.user.in_group(g),
        }
    }
}

// === impl Rule ===

impl Rule {
    /// A resource rule for `verbs` on `resources` in `api_groups`.
    pub fn new(verbs: &[&str], api_groups: &[&str], resources: &[&str]) -> Rule {
        Rule {
            verbs: strings(verbs),
            api_groups: strings(api_groups),
            resources: strings(resources),
            ..Rule::default()
        }
    }

    /// A non-resource rule for `verbs` on `urls`.
    pub fn non_resource(verbs: &[&str], urls: &[&str]) -> Rule {
        Rule {
            verbs: strings(verbs),
            non_resource_urls: strings(urls),
            ..Rule::default()
        }
    }

    /// Restricts the rule to objects named `names`.
    pub fn names(mut self, names: &[&str]) -> Rule {
        self.resource_names = strings(names);
        self
    }

    /// Restricts the rule to `namespaces` (like a RoleBinding).
    pub fn in_namespaces(mut self, namespaces: &[&str]) -> Rule {
        self.namespaces = Some(strings(namespaces));
        self
    }

    /// Whether the rule allows the request.
    pub fn allows(&self, attrs: &Attributes) -> bool {
        if !self.verbs.iter().any(|v| v == "*" || *v == attrs.verb) {
            return false;
        }
        if !attrs.resource_request {
            return self.non_resource_urls.iter().any(|u| {
                u == "*"
                    || *u == attrs.path
                    || u.strip_suffix('*')
                        .is_some_and(|p| attrs.path.starts_with(p))
            });
        }
        if let Some(namespaces) = &self.namespaces {
            if attrs.namespace.is_empty() || !namespaces.contains(&attrs.namespace) {
                return false;
            }
        }
        self.api_groups
            .iter()
            .any(|g| g == "*" || *g == attrs.api_group)
            && self.resource_matches(attrs)
            && (self.resource_names.is_empty() || self.resource_names.contains(&attrs.name))
    }

    fn resource_matches(&self, attrs: &Attributes) -> bool {
        let combined = if attrs.subresource.is_empty() {
            attrs.resource.clone()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        self.resources.iter().any(|r| {
            r == "*"
                || *r == combined
                || (!attrs.subresource.is_empty()
                    && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(
        verb: &str,
        group: &str,
        resource: &str,
        sub: &str,
        ns: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            api_version: "v1".into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            ..Attributes::default()
        }
    }

    #[test]
    fn matching() {
        let r = Rule::new(&["get", "list"], &[""], &["pods", "*/status"]);
        assert!(r.allows(&attrs("list", "", "pods", "", "", "")));
        assert!(r.allows(&attrs("get", "", "nodes", "status", "", "n")));
        assert!(!r.allows(&attrs("get", "", "pods", "log", "ns", "p")));
        assert!(!r.allows(&attrs("watch", "", "pods", "", "", "")));
        assert!(!r.allows(&attrs("get", "apps", "pods", "", "", "")));
        let r = Rule::new(&["*"], &["*"], &["configmaps"])
            .names(&["a"])
            .in_namespaces(&["ns"]);
        assert!(r.allows(&attrs("get", "", "configmaps", "", "ns", "a")));
        assert!(!r.allows(&attrs("get", "", "configmaps", "", "ns", "b")));
        assert!(!r.allows(&attrs("get", "", "configmaps", "", "other", "a")));
        assert!(!r.allows(&attrs("list", "", "configmaps", "", "", "a")));
        let r = Rule::non_resource(&["get"], &["/apis/*", "/version"]);
        let mut a = Attributes {
            verb: "get".into(),
            path: "/apis/apps".into(),
            ..Attributes::default()
        };
        assert!(r.allows(&a));
        a.path = "/versions".into();
        assert!(!r.allows(&a));
    }
}
