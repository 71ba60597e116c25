//! Non-resource paths: discovery (`/api`, `/api/v1`, `/apis`,
//! `/apis/<g>`, `/apis/<g>/<v>`, unaggregated: kubectl falls back to it),
//! `/version`, health checks and a minimal OpenAPI v3 (see `openapi`).

use http::{Response, StatusCode};
use serde_json::{Value, json};

use super::openapi;
use super::resources::ResourceSpec;
use super::respond;
use super::state::Ctx;
use apimachinery::body::Body;
use apimachinery::status::Status;

/// `/version` of the recorded apiserver (`meta.server` of the recording).
pub fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "36",
        "emulationMajor": "1",
        "emulationMinor": "36",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "35",
        "gitVersion": "v1.36.2",
        "gitCommit": "98b35193b2ac7a23a673325f5e9b830ecd5ba406",
        "gitTreeState": "clean",
        "buildDate": "2026-11-21T11:42:22Z",
        "goVersion": "go1.27.3",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Serves a GET of a non-resource path.
pub fn handle(ctx: &Ctx) -> Response<Body> {
    let path = ctx.info.path.trim_end_matches('/');
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        ["api"] => respond::json(
            StatusCode::OK,
            &json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ctx.state.addr.to_string()}],
            }),
        ),
        ["api", "v1"] => resource_list(ctx, "", "v1"),
        ["apis"] => respond::json(
            StatusCode::OK,
            &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups(ctx)}),
        ),
        ["apis", group] => match groups(ctx).into_iter().find(|g| g["name"] == *group) {
            Some(mut g) => {
                if let Value::Object(m) = &mut g {
                    let mut out = serde_json::Map::new();
                    out.insert("kind".into(), json!("APIGroup"));
                    out.insert("apiVersion".into(), json!("v1"));
                    out.extend(std::mem::take(m));
                    g = Value::Object(out);
                }
                respond::json(StatusCode::OK, &g)
            }
            None => respond::status(Status::path_not_found()),
        },
        ["apis", group, version] => resource_list(ctx, group, version),
        ["version"] => {
            let pretty = serde_json::to_vec_pretty(&version_info()).unwrap_or_default();
            let mut r = respond::text(StatusCode::OK, pretty);
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
        ["healthz" | "livez" | "readyz", ..] => respond::text(StatusCode::OK, "ok"),
        ["openapi", "v3"] => {
            respond::json(StatusCode::OK, &openapi::root(&ctx.state.registry.all()))
        }
        ["openapi", "v3", rest @ ..] => {
            match openapi::group_version_doc(&ctx.state.registry.all(), &rest.join("/")) {
                Some(doc) => respond::json(StatusCode::OK, &doc),
                None => respond::status(Status::path_not_found()),
            }
        }
        _ => respond::status(Status::path_not_found()),
    }
}

/// The review APIs, served outside the registry.
fn review_resources(group: &str) -> Vec<Value> {
    let entry = |name: &str, kind: &str, namespaced: bool| json!({"name": name, "singularName": kind.to_ascii_lowercase(), "namespaced": namespaced, "kind": kind, "verbs": ["create"]});
    match group {
        "authentication.k8s.io" => vec![
            entry("selfsubjectreviews", "SelfSubjectReview", false),
            entry("tokenreviews", "TokenReview", false),
        ],
        "authorization.k8s.io" => vec![
            entry(
                "localsubjectaccessreviews",
                "LocalSubjectAccessReview",
                true,
            ),
            entry("selfsubjectaccessreviews", "SelfSubjectAccessReview", false),
            entry("subjectaccessreviews", "SubjectAccessReview", false),
        ],
        _ => Vec::new(),
    }
}

/// Groups and their versions, in registration order; the first version is
/// preferred.
fn groups(ctx: &Ctx) -> Vec<Value> {
    let mut names: Vec<(String, Vec<String>)> = Vec::new();
    let specs = ctx.state.registry.all();
    let review = [
        ("authentication.k8s.io", "v1"),
        ("authorization.k8s.io", "v1"),
    ];
    let all = specs
        .iter()
        .map(|s| (s.group.as_str(), s.version.as_str()))
        .chain(review);
    for (group, version) in all {
        if group.is_empty() {
            continue;
        }
        match names.iter_mut().find(|(g, _)| g == group) {
            Some((_, versions)) => {
                if !versions.iter().any(|v| v == version) {
                    versions.push(version.to_string());
                }
            }
            None => names.push((group.to_string(), vec![version.to_string()])),
        }
    }
    names
        .into_iter()
        .map(|(name, versions)| {
            let gv = |v: &String| json!({"groupVersion": format!("{name}/{v}"), "version": v});
            let preferred = versions.first().map(gv).unwrap_or(Value::Null);
            json!({"name": name, "versions": versions.iter().map(gv).collect::<Vec<_>>(), "preferredVersion": preferred})
        })
        .collect()
}

fn resource_entry(spec: &ResourceSpec) -> Vec<Value> {
    let mut main = json!({
        "name": spec.resource,
        "singularName": spec.singular,
        "namespaced": spec.namespaced,
        "kind": spec.kind,
        "verbs": ALL_VERBS,
    });
    if !spec.short_names.is_empty() {
        main["shortNames"] = json!(spec.short_names);
    }
    let sub = |name: &str, kind: &str, verbs: &[&str]| json!({"name": format!("{}/{name}", spec.resource), "singularName": "", "namespaced": spec.namespaced, "kind": kind, "verbs": verbs});
    let mut out = vec![main];
    if spec.group.is_empty() && spec.resource == "pods" {
        out.push(sub("attach", "PodAttachOptions", &["create", "get"]));
        out.push(sub("exec", "PodExecOptions", &["create", "get"]));
        out.push(sub("log", "Pod", &["get"]));
        out.push(sub(
            "portforward",
            "PodPortForwardOptions",
            &["create", "get"],
        ));
    }
    if spec.status_subresource {
        out.push(sub("status", &spec.kind, &["get", "patch", "update"]));
    }
    out
}

fn resource_list(ctx: &Ctx, group: &str, version: &str) -> Response<Body> {
    let mut resources: Vec<Value> = ctx
        .state
        .registry
        .all()
        .iter()
        .filter(|s| s.group == group && s.version == version)
        .flat_map(|s| resource_entry(s))
        .collect();
    if version == "v1" {
        resources.extend(review_resources(group));
    }
    if resources.is_empty() {
        return respond::status(Status::path_not_found());
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let body = if group.is_empty() {
        json!({"kind": "APIResourceList", "groupVersion": group_version, "resources": resources})
    } else {
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
    };
    respond::json(StatusCode::OK, &body)
}
