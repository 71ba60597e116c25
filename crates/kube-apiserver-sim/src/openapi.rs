//! A minimal OpenAPI v3 (`/openapi/v3`, `/openapi/v3/<group-version>`):
//! one PATCH operation per resource, tagged with its group/version/kind and
//! declaring the `fieldValidation` query parameter. That is what kubectl
//! looks for to use server-side field validation instead of downloading
//! schemas to validate client-side; there are no schemas.

use serde_json::{Map, Value, json};

use super::resources::ResourceSpec;

fn group_version(spec: &ResourceSpec) -> String {
    if spec.group.is_empty() {
        format!("api/{}", spec.version)
    } else {
        format!("apis/{}/{}", spec.group, spec.version)
    }
}

/// The root document: a path per group-version.
pub fn root(specs: &[std::sync::Arc<ResourceSpec>]) -> Value {
    let mut paths = Map::new();
    for spec in specs {
        let gv = group_version(spec);
        paths.insert(
            gv.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash=sim")}),
        );
    }
    json!({ "paths": paths })
}

/// The document of one group-version (`api/v1`, `apis/apps/v1`), or `None`
/// if no resource has it.
pub fn group_version_doc(specs: &[std::sync::Arc<ResourceSpec>], gv: &str) -> Option<Value> {
    let mut paths = Map::new();
    for spec in specs.iter().filter(|s| group_version(s) == gv) {
        let path = if spec.namespaced {
            format!("/{gv}/namespaces/{{namespace}}/{}/{{name}}", spec.resource)
        } else {
            format!("/{gv}/{}/{{name}}", spec.resource)
        };
        paths.insert(
            path,
            json!({"patch": {
                "operationId": format!("patch{}", spec.kind),
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}}],
                "responses": {},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": spec.group, "version": spec.version, "kind": spec.kind},
            }}),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.36.2"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
