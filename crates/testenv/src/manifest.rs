//! The objects of a manifest, as `kubectl apply -k` creates them: each
//! with the collection a `POST` creates it in, found from its
//! `apiVersion` and `kind` in the built-in resources
//! (`apimachinery::resource::BUILT_INS`), and a namespaced one in the
//! kustomization's namespace.
//!
//! ```
//! let objects = kube_testenv::manifest::objects(
//!     "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: sa\n---\n\
//!      apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: r\n",
//!     "kube-system",
//! )
//! .unwrap();
//! assert_eq!(objects[0].collection, "/api/v1/namespaces/kube-system/serviceaccounts");
//! assert_eq!(objects[0].body["metadata"]["namespace"], "kube-system");
//! assert_eq!(objects[1].collection, "/apis/rbac.authorization.k8s.io/v1/clusterroles");
//! ```

use serde_json::Value;

use apimachinery::resource::BUILT_INS;

/// An object of a manifest and where it is created.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// The path of its collection (`/api/v1/namespaces/{ns}/serviceaccounts`,
    /// `/apis/{group}/{version}/{resource}`).
    pub collection: String,
    /// The object, as JSON.
    pub body: Value,
}

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A document is not YAML.
    #[error("document {index}: {message}")]
    Yaml { index: usize, message: String },
    /// A document's `apiVersion` and `kind` are not a built-in resource.
    #[error("document {index}: {api_version} {kind} is not a built-in resource")]
    Kind {
        index: usize,
        api_version: String,
        kind: String,
    },
}

/// The objects of multi-document YAML `manifest`, in order; empty
/// documents (comments only) are skipped. A namespaced object is put in
/// `namespace`, as a kustomization's `namespace` does.
pub fn objects(manifest: &str, namespace: &str) -> Result<Vec<Object>, ManifestError> {
    let mut out = Vec::new();
    for (index, doc) in manifest.split("\n---\n").enumerate() {
        let mut body: Value = match serde_saphyr::from_str(doc) {
            Ok(Value::Null) => continue,
            Ok(v) => v,
            Err(e) => {
                return Err(ManifestError::Yaml {
                    index,
                    message: e.to_string(),
                });
            }
        };
        let api_version = body["apiVersion"].as_str().unwrap_or_default();
        let kind = body["kind"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let Some(resource) = BUILT_INS
            .iter()
            .find(|b| b.group == group && b.version == version && b.kind == kind)
        else {
            return Err(ManifestError::Kind {
                index,
                api_version: api_version.to_string(),
                kind: kind.to_string(),
            });
        };
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let collection = if resource.namespaced {
            body["metadata"]["namespace"] = Value::from(namespace);
            format!("{prefix}/namespaces/{namespace}/{}", resource.resource)
        } else {
            format!("{prefix}/{}", resource.resource)
        };
        out.push(Object { collection, body });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shipped manifest the tests and tools apply reads, each object
    /// with its collection.
    #[test]
    fn the_shipped_manifests_read() {
        for (manifest, n) in [
            (include_str!("../../../manifests/node/rbac.yaml"), 2),
            (
                include_str!("../../../manifests/tier/serviceaccount.yaml"),
                1,
            ),
            (include_str!("../../../manifests/tier/rbac.yaml"), 5),
            (include_str!("../../../manifests/tier/flowcontrol.yaml"), 2),
            (include_str!("../../../manifests/sidecar/rbac.yaml"), 3),
        ] {
            let objects = objects(manifest, "kube-system").unwrap();
            assert_eq!(objects.len(), n, "{objects:?}");
        }
        let flow = objects(
            include_str!("../../../manifests/tier/flowcontrol.yaml"),
            "kube-system",
        )
        .unwrap();
        assert_eq!(
            flow[1].collection,
            "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas"
        );
    }

    #[test]
    fn an_unknown_kind_or_bad_yaml_is_an_error() {
        let e = objects("apiVersion: v1\nkind: Nope\n", "ns").unwrap_err();
        assert!(matches!(e, ManifestError::Kind { index: 0, .. }), "{e}");
        let e = objects("# a comment\n---\nkind: [\n", "ns").unwrap_err();
        assert!(matches!(e, ManifestError::Yaml { index: 1, .. }), "{e}");
    }
}
