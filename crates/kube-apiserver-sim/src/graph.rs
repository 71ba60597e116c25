//! The Node authorizer's graph, computed from the store's pods on demand:
//! a pod is related to its `spec.nodeName`, and a node to every secret,
//! configmap and claim its pods reference (volumes, projected sources,
//! `env`/`envFrom`, image pull secrets), like `node/graph_populator.go`.

use serde_json::Value;

use super::node_authz::{NodeGraph, RefKind};
use super::store::Store;

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

fn items<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    v.get(key).and_then(Value::as_array).into_iter().flatten()
}

/// Names of objects of `kind` that `pod` references.
fn references(pod: &Value, kind: RefKind) -> Vec<String> {
    let mut out = Vec::new();
    let Some(spec) = pod.get("spec") else {
        return out;
    };
    let mut add = |name: Option<&str>| {
        if let Some(n) = name {
            out.push(n.to_string());
        }
    };
    for vol in items(spec, "volumes") {
        match kind {
            RefKind::ConfigMap => add(str_at(vol, &["configMap", "name"])),
            RefKind::Secret => add(str_at(vol, &["secret", "secretName"])),
            RefKind::PersistentVolumeClaim => {
                add(str_at(vol, &["persistentVolumeClaim", "claimName"]));
                if vol.get("ephemeral").is_some() {
                    let pod_name = str_at(pod, &["metadata", "name"]).unwrap_or_default();
                    let vol_name = str_at(vol, &["name"]).unwrap_or_default();
                    add(Some(&format!("{pod_name}-{vol_name}")));
                }
            }
        }
        for source in items(vol.get("projected").unwrap_or(&Value::Null), "sources") {
            match kind {
                RefKind::ConfigMap => add(str_at(source, &["configMap", "name"])),
                RefKind::Secret => add(str_at(source, &["secret", "name"])),
                RefKind::PersistentVolumeClaim => {}
            }
        }
    }
    if kind == RefKind::Secret {
        for s in items(spec, "imagePullSecrets") {
            add(str_at(s, &["name"]));
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in items(spec, list) {
            for env in items(c, "env") {
                match kind {
                    RefKind::ConfigMap => {
                        add(str_at(env, &["valueFrom", "configMapKeyRef", "name"]))
                    }
                    RefKind::Secret => add(str_at(env, &["valueFrom", "secretKeyRef", "name"])),
                    RefKind::PersistentVolumeClaim => {}
                }
            }
            for from in items(c, "envFrom") {
                match kind {
                    RefKind::ConfigMap => add(str_at(from, &["configMapRef", "name"])),
                    RefKind::Secret => add(str_at(from, &["secretRef", "name"])),
                    RefKind::PersistentVolumeClaim => {}
                }
            }
        }
    }
    out
}

impl NodeGraph for Store {
    fn pod_node(&self, namespace: &str, name: &str) -> Option<String> {
        self.scan("", "pods", |mut pods| {
            Iterator::find(&mut pods, |p| {
                str_at(p, &["metadata", "namespace"]) == Some(namespace)
                    && str_at(p, &["metadata", "name"]) == Some(name)
            })
            .map(|p| {
                str_at(p, &["spec", "nodeName"])
                    .unwrap_or_default()
                    .to_string()
            })
        })
    }

    fn node_references(&self, node: &str, kind: RefKind, namespace: &str, name: &str) -> bool {
        self.scan("", "pods", |mut pods| {
            Iterator::any(&mut pods, |p| {
                str_at(p, &["spec", "nodeName"]) == Some(node)
                    && str_at(p, &["metadata", "namespace"]) == Some(namespace)
                    && references(p, kind).iter().any(|n| n == name)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_every_reference_kind() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {
            "volumes": [
                {"name": "a", "configMap": {"name": "cm-vol"}},
                {"name": "b", "secret": {"secretName": "s-vol"}},
                {"name": "c", "projected": {"sources": [{"configMap": {"name": "cm-proj"}}, {"secret": {"name": "s-proj"}}]}},
                {"name": "d", "persistentVolumeClaim": {"claimName": "claim"}},
                {"name": "e", "ephemeral": {}}
            ],
            "imagePullSecrets": [{"name": "pull"}],
            "containers": [{"env": [{"valueFrom": {"configMapKeyRef": {"name": "cm-env"}}}, {"valueFrom": {"secretKeyRef": {"name": "s-env"}}}],
                            "envFrom": [{"configMapRef": {"name": "cm-from"}}, {"secretRef": {"name": "s-from"}}]}]
        }});
        assert_eq!(
            references(&pod, RefKind::ConfigMap),
            ["cm-vol", "cm-proj", "cm-env", "cm-from"]
        );
        assert_eq!(
            references(&pod, RefKind::Secret),
            ["s-vol", "s-proj", "pull", "s-env", "s-from"]
        );
        assert_eq!(
            references(&pod, RefKind::PersistentVolumeClaim),
            ["claim", "p-e"]
        );
    }
}
