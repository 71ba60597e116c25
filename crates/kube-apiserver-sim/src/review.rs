//! The review APIs: `TokenReview` (is this bearer token valid, and whose
//! is it), `SubjectAccessReview` and its self/local variants (may this user
//! do that, under the sim's policy), and `SelfSubjectReview` (who am I).
//! Each answers 201 with the request echoed and `status` filled in.
//! Requests may be JSON or, as typed clients send them, protobuf.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Map, Value, json};

use super::authn::UserInfo;
use super::authorizer::{Attributes, Decision};
use super::errors;
use super::gojson;
use super::protobuf;
use super::respond;
use super::state::Ctx;
use super::write_http::read_body;
use apimachinery::body::Body;
use apimachinery::selector::{FieldRequirement, LabelSelector, Operator, Requirement};
use apimachinery::status::{Cause, Status};

/// The audiences the sim's tokens are valid for when a review names none
/// (kube-apiserver's default `--api-audiences`).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Whether `group`/`resource` is a review API the sim serves.
pub fn is_review(group: &str, resource: &str) -> bool {
    matches!(
        (group, resource),
        (
            "authentication.k8s.io",
            "tokenreviews" | "selfsubjectreviews"
        ) | (
            "authorization.k8s.io",
            "subjectaccessreviews" | "selfsubjectaccessreviews" | "localsubjectaccessreviews"
        )
    )
}

/// Serves `POST` to a review resource.
pub async fn handle(ctx: &Ctx, req: Request<Incoming>) -> Response<Body> {
    respond::either(run(ctx, req).await)
}

async fn run(ctx: &Ctx, req: Request<Incoming>) -> Result<Response<Body>, Status> {
    let info = &ctx.info;
    if info.verb != "create" || !info.name.is_empty() || !info.subresource.is_empty() {
        return Err(errors::method_not_supported(
            &info.api_group,
            &info.resource,
            &info.verb,
        ));
    }
    let protobuf = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/vnd.kubernetes.protobuf"));
    let data = read_body(req).await?;
    let kind = kind_of(&info.resource);
    let body: Value = if protobuf {
        protobuf::decode_review(&info.resource, &data).ok_or_else(|| {
            Status::bad_request(format!(
                "the object provided is unrecognized (must be of type {kind})"
            ))
        })?
    } else if data.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        gojson::check_valid(&data).map_err(|e| {
            Status::bad_request(format!(
                "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; json parse error: {e}"
            ))
        })?;
        serde_json::from_slice(&data).map_err(|e| Status::bad_request(e.to_string()))?
    };
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = match info.resource.as_str() {
        "tokenreviews" => token_review(ctx, &spec),
        "selfsubjectreviews" => json!({"userInfo": ctx.user}),
        "selfsubjectaccessreviews" => {
            let attrs = resource_or_path(&spec, ctx.user.clone(), &info.namespace)?;
            decide(ctx, &attrs)
        }
        _ => {
            if info.resource == "localsubjectaccessreviews" {
                let ns = spec
                    .pointer("/resourceAttributes/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if ns != info.namespace {
                    return Err(Status::bad_request(format!(
                        "spec.resourceAttributes.namespace must match namespace: {}",
                        info.namespace
                    )));
                }
            }
            let user: UserInfo = serde_json::from_value(json!({
                "username": spec.get("user").cloned().unwrap_or(Value::Null),
                "uid": spec.get("uid").cloned().unwrap_or(Value::Null),
                "groups": spec.get("groups").cloned().unwrap_or(Value::Null),
                "extra": spec.get("extra").cloned().unwrap_or(Value::Null),
            }))
            .map_err(|e| Status::bad_request(e.to_string()))?;
            if user.name.is_empty() && user.groups.is_empty() {
                return Err(invalid_sar(
                    kind,
                    "spec.user",
                    "",
                    "at least one of user or group must be specified",
                ));
            }
            let attrs = resource_or_path(&spec, user, "")?;
            decide(ctx, &attrs)
        }
    };
    let mut out = Map::new();
    out.insert("kind".into(), Value::String(kind.into()));
    out.insert(
        "apiVersion".into(),
        Value::String(format!("{}/v1", info.api_group)),
    );
    out.insert("metadata".into(), echo_metadata(&body));
    if info.resource != "selfsubjectreviews" {
        out.insert("spec".into(), spec);
    }
    out.insert("status".into(), status);
    Ok(respond::json(StatusCode::CREATED, &Value::Object(out)))
}

fn kind_of(resource: &str) -> &'static str {
    match resource {
        "tokenreviews" => "TokenReview",
        "selfsubjectreviews" => "SelfSubjectReview",
        "selfsubjectaccessreviews" => "SelfSubjectAccessReview",
        "localsubjectaccessreviews" => "LocalSubjectAccessReview",
        _ => "SubjectAccessReview",
    }
}

/// The request's metadata; a zero `creationTimestamp` encodes as `null`.
fn echo_metadata(body: &Value) -> Value {
    let mut meta = body
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    meta.entry("creationTimestamp").or_insert(Value::Null);
    Value::Object(meta)
}

/// The strings of the array `v[key]` (none when absent).
fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn token_review(ctx: &Ctx, spec: &Value) -> Value {
    let token = spec.get("token").and_then(Value::as_str).unwrap_or("");
    let audiences = strings(spec, "audiences");
    match ctx.state.tokens.lookup(token) {
        Some(user) => {
            let auds = if audiences.is_empty() {
                vec![API_AUDIENCE.to_string()]
            } else {
                audiences
            };
            json!({"authenticated": true, "user": user, "audiences": auds})
        }
        None => json!({"user": {}}),
    }
}

fn invalid_sar(kind: &str, field: &str, value: &str, detail: &str) -> Status {
    errors::invalid(
        "authorization.k8s.io",
        kind,
        "",
        vec![Cause {
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {}: {detail}", errors::go_quote(value)),
            field: field.into(),
        }],
    )
}

fn s(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// Attributes from `spec.resourceAttributes` or `spec.nonResourceAttributes`.
fn resource_or_path(spec: &Value, user: UserInfo, namespace: &str) -> Result<Attributes, Status> {
    let mut attrs = Attributes {
        user,
        ..Attributes::default()
    };
    match (
        spec.get("resourceAttributes"),
        spec.get("nonResourceAttributes"),
    ) {
        (Some(r), None) => {
            attrs.resource_request = true;
            attrs.verb = s(r, "verb");
            attrs.api_group = s(r, "group");
            attrs.api_version = s(r, "version");
            if attrs.api_version.is_empty() {
                attrs.api_version = "*".into();
            }
            attrs.resource = s(r, "resource");
            attrs.subresource = s(r, "subresource");
            attrs.name = s(r, "name");
            attrs.namespace = s(r, "namespace");
            if attrs.namespace.is_empty() {
                attrs.namespace = namespace.to_string();
            }
            attrs.field_selector = field_requirements(r.get("fieldSelector"));
            attrs.label_selector = label_requirements(r.get("labelSelector"));
        }
        (None, Some(n)) => {
            attrs.verb = s(n, "verb");
            attrs.path = s(n, "path");
        }
        _ => {
            return Err(invalid_sar(
                "SubjectAccessReview",
                "spec.resourceAttributes",
                "null",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
    }
    Ok(attrs)
}

/// SAR field selector attributes: `rawSelector` parsed, or `requirements`
/// where `In`/`NotIn` with one value mean `=`/`!=` (others cannot be
/// field selector terms and are dropped).
fn field_requirements(sel: Option<&Value>) -> Vec<FieldRequirement> {
    let Some(sel) = sel else {
        return Vec::new();
    };
    if let Some(reqs) = sel.get("requirements").and_then(Value::as_array) {
        return reqs
            .iter()
            .filter_map(|r| {
                let values = r.get("values").and_then(Value::as_array)?;
                let [value] = values.as_slice() else {
                    return None;
                };
                let not_equals = match r.get("operator").and_then(Value::as_str)? {
                    "In" => false,
                    "NotIn" => true,
                    _ => return None,
                };
                Some(FieldRequirement {
                    field: s(r, "key"),
                    not_equals,
                    value: value.as_str()?.to_string(),
                })
            })
            .collect();
    }
    apimachinery::selector::FieldSelector::parse(&s(sel, "rawSelector"))
        .map(|f| f.terms().to_vec())
        .unwrap_or_default()
}

fn label_requirements(sel: Option<&Value>) -> Vec<Requirement> {
    let Some(sel) = sel else {
        return Vec::new();
    };
    if let Some(reqs) = sel.get("requirements").and_then(Value::as_array) {
        return reqs
            .iter()
            .filter_map(|r| {
                let operator = match r.get("operator").and_then(Value::as_str)? {
                    "In" => Operator::In,
                    "NotIn" => Operator::NotIn,
                    "Exists" => Operator::Exists,
                    "DoesNotExist" => Operator::DoesNotExist,
                    _ => return None,
                };
                let mut values = strings(r, "values");
                values.sort();
                values.dedup();
                Some(Requirement {
                    key: s(r, "key"),
                    operator,
                    values,
                })
            })
            .collect();
    }
    LabelSelector::parse(&s(sel, "rawSelector"))
        .map(|l| l.requirements().to_vec())
        .unwrap_or_default()
}

fn decide(ctx: &Ctx, attrs: &Attributes) -> Value {
    let (allowed, denied, reason) = match ctx.state.policy.authorize(attrs, &ctx.state.store) {
        Decision::Allow => (true, false, String::new()),
        Decision::Deny(r) => (false, true, r),
        Decision::NoOpinion(r) => (false, false, r),
    };
    let mut out = json!({"allowed": allowed});
    if denied {
        out["denied"] = json!(true);
    }
    if !reason.is_empty() {
        out["reason"] = json!(reason);
    }
    out
}
