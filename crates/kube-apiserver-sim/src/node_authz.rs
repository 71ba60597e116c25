//! The Node authorizer (`plugin/pkg/auth/authorizer/node`), emulated: a
//! user `system:node:<n>` in group `system:nodes` may read its pods, its
//! node, and the secrets, configmaps and claims its pods reference; its
//! denials are NoOpinion with the apiserver's reasons
//! (`/tmp/research/auth.md` §8). Resources it does not subdivide fall back
//! to static `system:node` rules.

use super::authorizer::{Attributes, Decision};
use super::rbac::Rule;

/// `system:nodes`.
pub const NODES_GROUP: &str = "system:nodes";
const NODE_PREFIX: &str = "system:node:";

/// What a pod may reference, for the graph check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefKind {
    ConfigMap,
    Secret,
    PersistentVolumeClaim,
}

/// The node → pod → object relationships the authorizer checks.
pub trait NodeGraph {
    /// `spec.nodeName` of pod `namespace/name`, if the pod exists.
    fn pod_node(&self, namespace: &str, name: &str) -> Option<String>;
    /// Whether a pod bound to `node` references object `namespace/name`.
    fn node_references(&self, node: &str, kind: RefKind, namespace: &str, name: &str) -> bool;
}

/// The node name if `attrs.user` is a node identity
/// (`nodeidentifier.NodeIdentity`): `Some("")` for a node user with no name.
pub fn node_identity(attrs: &Attributes) -> Option<&str> {
    let name = attrs.user.name.strip_prefix(NODE_PREFIX)?;
    attrs.user.in_group(NODES_GROUP).then_some(name)
}

fn static_rules() -> Vec<Rule> {
    vec![
        Rule::new(
            &["get", "list", "watch"],
            &[""],
            &["services", "endpoints", "persistentvolumes"],
        ),
        Rule::new(
            &["get", "list", "watch"],
            &["discovery.k8s.io"],
            &["endpointslices"],
        ),
        Rule::new(
            &["get", "list", "watch"],
            &["node.k8s.io"],
            &["runtimeclasses"],
        ),
        Rule::new(
            &["get", "list", "watch"],
            &["storage.k8s.io"],
            &["csidrivers", "csinodes"],
        ),
        Rule::new(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
        Rule::new(
            &["create"],
            &["authorization.k8s.io"],
            &["subjectaccessreviews", "localsubjectaccessreviews"],
        ),
        Rule::new(
            &["create", "update", "patch"],
            &["", "events.k8s.io"],
            &["events"],
        ),
        Rule::new(
            &["create", "get", "list", "watch"],
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
        ),
        Rule::new(&["get"], &["storage.k8s.io"], &["volumeattachments"]),
    ]
}

fn no_relationship(node: &str) -> Decision {
    Decision::NoOpinion(format!(
        "no relationship found between node '{node}' and this object"
    ))
}

fn fallback(attrs: &Attributes) -> Decision {
    if static_rules().iter().any(|r| r.allows(attrs)) {
        Decision::Allow
    } else {
        Decision::NoOpinion(String::new())
    }
}

/// Authorizes `attrs` for a node identity; `NoOpinion("")` for anyone else.
pub fn authorize(attrs: &Attributes, graph: &dyn NodeGraph) -> Decision {
    let Some(node) = node_identity(attrs) else {
        return Decision::NoOpinion(String::new());
    };
    if node.is_empty() {
        return Decision::NoOpinion(format!(
            "unknown node for user {}",
            super::errors::go_quote(&attrs.user.name)
        ));
    }
    if !attrs.resource_request {
        return fallback(attrs);
    }
    match (attrs.api_group.as_str(), attrs.resource.as_str()) {
        ("", "secrets") => read_namespaced(node, RefKind::Secret, attrs, graph),
        ("", "configmaps") => read_namespaced(node, RefKind::ConfigMap, attrs, graph),
        ("", "persistentvolumeclaims") => {
            if attrs.verb != "get" {
                return Decision::NoOpinion(
                    "can only get individual resources of this type".into(),
                );
            }
            if !attrs.subresource.is_empty() {
                return Decision::NoOpinion("cannot get subresource".into());
            }
            related(node, RefKind::PersistentVolumeClaim, attrs, graph)
        }
        ("", "nodes") => authorize_node(node, attrs),
        ("", "pods") => authorize_pod(node, attrs, graph),
        ("coordination.k8s.io", "leases") => authorize_lease(node, attrs),
        ("storage.k8s.io", "csinodes") => authorize_csinode(node, attrs),
        _ => fallback(attrs),
    }
}

fn read_namespaced(
    node: &str,
    kind: RefKind,
    attrs: &Attributes,
    graph: &dyn NodeGraph,
) -> Decision {
    if !matches!(attrs.verb.as_str(), "get" | "list" | "watch") {
        return Decision::NoOpinion("can only read resources of this type".into());
    }
    if !attrs.subresource.is_empty() {
        return Decision::NoOpinion("cannot read subresource".into());
    }
    if attrs.namespace.is_empty() {
        return Decision::NoOpinion("can only read namespaced object of this type".into());
    }
    related(node, kind, attrs, graph)
}

fn related(node: &str, kind: RefKind, attrs: &Attributes, graph: &dyn NodeGraph) -> Decision {
    if attrs.name.is_empty() {
        return Decision::NoOpinion("No Object name found".into());
    }
    if graph.node_references(node, kind, &attrs.namespace, &attrs.name) {
        Decision::Allow
    } else {
        no_relationship(node)
    }
}

fn authorize_pod(node: &str, attrs: &Attributes, graph: &dyn NodeGraph) -> Decision {
    match (attrs.subresource.as_str(), attrs.verb.as_str()) {
        ("", "get") => pod_related(node, attrs, graph),
        ("", "list" | "watch") => {
            let pinned = attrs
                .field_selector
                .iter()
                .any(|r| r.field == "spec.nodeName" && !r.not_equals && r.value == node);
            if pinned {
                return Decision::Allow;
            }
            if !attrs.name.is_empty() {
                return pod_related(node, attrs, graph);
            }
            Decision::NoOpinion("can only list/watch pods with spec.nodeName field selector".into())
        }
        ("", "create" | "delete") | ("status", "update" | "patch") | ("eviction", "create") => {
            Decision::Allow
        }
        _ => Decision::NoOpinion(String::new()),
    }
}

fn pod_related(node: &str, attrs: &Attributes, graph: &dyn NodeGraph) -> Decision {
    if attrs.name.is_empty() {
        return Decision::NoOpinion("No Object name found".into());
    }
    match graph.pod_node(&attrs.namespace, &attrs.name) {
        Some(n) if n == node => Decision::Allow,
        _ => no_relationship(node),
    }
}

fn authorize_node(node: &str, attrs: &Attributes) -> Decision {
    match (attrs.subresource.as_str(), attrs.verb.as_str()) {
        ("", "get" | "list" | "watch") => {
            if attrs.name.is_empty() {
                Decision::NoOpinion(format!(
                    "node '{node}' cannot read all nodes, only its own Node object"
                ))
            } else if attrs.name != node {
                Decision::NoOpinion(format!(
                    "node '{node}' cannot read '{}', only its own Node object",
                    attrs.name
                ))
            } else {
                Decision::Allow
            }
        }
        ("", "create") => Decision::Allow,
        ("" | "status", "update" | "patch") if attrs.name == node => Decision::Allow,
        _ => Decision::NoOpinion(String::new()),
    }
}

fn authorize_lease(node: &str, attrs: &Attributes) -> Decision {
    if !matches!(
        attrs.verb.as_str(),
        "get" | "create" | "update" | "patch" | "delete"
    ) {
        return Decision::NoOpinion(
            "can only get, create, update, patch, or delete a node lease".into(),
        );
    }
    if attrs.namespace != "kube-node-lease" {
        return Decision::NoOpinion(
            "can only access leases in the \"kube-node-lease\" system namespace".into(),
        );
    }
    if attrs.verb != "create" && attrs.name != node {
        return Decision::NoOpinion(
            "can only access node lease with the same name as the requesting node".into(),
        );
    }
    Decision::Allow
}

fn authorize_csinode(node: &str, attrs: &Attributes) -> Decision {
    if matches!(attrs.verb.as_str(), "list" | "watch") {
        // The sim's static rules let nodes read CSINodes (see module docs).
        return fallback(attrs);
    }
    if !matches!(
        attrs.verb.as_str(),
        "get" | "create" | "update" | "patch" | "delete"
    ) {
        return Decision::NoOpinion(
            "can only get, create, update, patch, or delete a CSINode".into(),
        );
    }
    if !attrs.subresource.is_empty() {
        return Decision::NoOpinion("cannot authorize CSINode subresources".into());
    }
    if attrs.verb != "create" && attrs.name != node {
        return Decision::NoOpinion(
            "can only access CSINode with the same name as the requesting node".into(),
        );
    }
    Decision::Allow
}
