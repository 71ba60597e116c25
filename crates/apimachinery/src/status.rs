//! Kubernetes `Status` bodies: every error a client sees is one of these.
//!
//! The field order and the omission of empty fields mirror what
//! kube-apiserver's JSON encoder writes for `metav1.Status`
//! (`staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/types.go`), so error
//! bodies produced here are byte-compatible with the apiserver's.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use crate::body::{self, Body};

/// A `metav1.Status` with `status: Failure`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: EmptyMeta,
    status: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
    pub code: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
struct EmptyMeta {}

/// `metav1.StatusDetails`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Details {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
    #[serde(rename = "retryAfterSeconds", skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u32>,
}

/// `metav1.StatusCause`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cause {
    #[serde(skip_serializing_if = "str::is_empty")]
    pub reason: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub field: String,
}

// === impl Status ===

impl Status {
    /// A failure with the given HTTP code, reason and message.
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Status {
            kind: "Status",
            api_version: "v1",
            metadata: EmptyMeta {},
            status: "Failure",
            message: message.into(),
            reason,
            details: None,
            code: code.as_u16(),
        }
    }

    /// Adds `details` to the status.
    pub fn with_details(mut self, details: Details) -> Self {
        self.details = Some(details);
        self
    }

    /// `400 BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Status::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    /// `404 NotFound` for a named object, as `apierrors.NewNotFound` writes it:
    /// `configmaps "x" not found`, or `deployments.apps "x" not found` for a
    /// named group.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified_resource(group, resource);
        Status::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{qualified} {} not found", crate::go::quote(name)),
        )
        .with_details(Details {
            name: name.to_string(),
            group: group.to_string(),
            kind: resource.to_string(),
            ..Details::default()
        })
    }

    /// `404 NotFound` for a path the server does not serve.
    pub fn path_not_found() -> Self {
        Status::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(Details::default())
    }

    /// `410 Expired`, for a watch or list whose resourceVersion is older than
    /// what the server still holds.
    pub fn expired(message: impl Into<String>) -> Self {
        Status::new(StatusCode::GONE, "Expired", message)
    }

    /// `422 Invalid` on `ListOptions`, as the apiserver's list-options
    /// validation reports it.
    pub fn invalid_list_options(causes: Vec<Cause>) -> Self {
        let joined = causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect::<Vec<_>>();
        let summary = if joined.len() == 1 {
            joined.into_iter().next().unwrap_or_default()
        } else {
            format!("[{}]", joined.join(", "))
        };
        Status::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("ListOptions.meta.k8s.io \"\" is invalid: {summary}"),
        )
        .with_details(Details {
            group: "meta.k8s.io".to_string(),
            kind: "ListOptions".to_string(),
            causes,
            ..Details::default()
        })
    }

    /// `504 Timeout` for a resourceVersion the cache has not reached in time,
    /// with the `ResourceVersionTooLarge` cause clients key on.
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        Status::new(
            StatusCode::GATEWAY_TIMEOUT,
            "Timeout",
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
        )
        .with_details(Details {
            causes: vec![Cause {
                reason: "ResourceVersionTooLarge",
                message: "Too large resource version".to_string(),
                field: String::new(),
            }],
            retry_after_seconds: Some(1),
            ..Details::default()
        })
    }

    /// `401 Unauthorized`.
    pub fn unauthorized() -> Self {
        Status::new(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
    }

    /// `503 ServiceUnavailable`.
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Status::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            message,
        )
    }

    /// `500 InternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        Status::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
        .with_details(Details {
            causes: vec![Cause {
                reason: "",
                message,
                field: String::new(),
            }],
            ..Details::default()
        })
    }

    /// The HTTP status code.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The JSON encoding (Go's escaping), without a trailing newline.
    pub fn to_json(&self) -> Bytes {
        Bytes::from(crate::go::to_vec(self))
    }

    /// The response the apiserver would send: the status code, JSON body with a
    /// trailing newline (as Go's `json.Encoder` writes it), `Content-Type:
    /// application/json`, `Cache-Control: no-cache, private`, and
    /// `Retry-After` when the status carries `retryAfterSeconds`.
    pub fn into_response(self) -> Response<Body> {
        let mut response = Response::new(body::full(crate::go::to_line(&self)));
        *response.status_mut() = self.status_code();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache, private"),
        );
        if let Some(secs) = self.details.as_ref().and_then(|d| d.retry_after_seconds) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Ok(id) = HeaderValue::from_str(&uuid::Uuid::new_v4().to_string()) {
            headers.insert("audit-id", id);
        }
        response
    }
}

/// `resource` or `resource.group`, as `schema.GroupResource.String()` writes it.
pub fn qualified_resource(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_recording() {
        let s = Status::not_found("", "configmaps", "nope");
        assert_eq!(
            std::str::from_utf8(&s.to_json()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"nope\" not found","reason":"NotFound","details":{"name":"nope","kind":"configmaps"},"code":404}"#
        );
        let s = Status::not_found("apps", "deployments", "nope");
        assert_eq!(
            std::str::from_utf8(&s.to_json()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"deployments.apps \"nope\" not found","reason":"NotFound","details":{"name":"nope","group":"apps","kind":"deployments"},"code":404}"#
        );
    }

    #[test]
    fn too_large_rv_matches_recording() {
        let s = Status::too_large_resource_version(999999999, 332);
        assert_eq!(
            std::str::from_utf8(&s.to_json()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Timeout: Too large resource version: 999999999, current: 332","reason":"Timeout","details":{"causes":[{"reason":"ResourceVersionTooLarge","message":"Too large resource version"}],"retryAfterSeconds":1},"code":504}"#
        );
        let r = s.into_response();
        assert_eq!(r.headers()["retry-after"], "1");
    }

    #[test]
    fn path_not_found_has_empty_details() {
        assert_eq!(
            std::str::from_utf8(&Status::path_not_found().to_json()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#
        );
    }
}
