//! Building responses: Go-encoded JSON bodies ending in `\n`,
//! `Content-Type: application/json`, and `Status` errors with
//! `Retry-After` when they carry `retryAfterSeconds`. `Audit-Id` and
//! `Cache-Control` are added to every response by the handler.

use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;
use serde_json::Value;

use apimachinery::body::{self, Body};
use apimachinery::go as json;
use apimachinery::status::Status;

/// `value` as the apiserver's JSON serializer writes it, with `code`.
pub fn json<T: Serialize + ?Sized>(code: StatusCode, value: &T) -> Response<Body> {
    let mut response = Response::new(body::full(json::to_line(value)));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A `Status` error response.
pub fn status(status: Status) -> Response<Body> {
    let retry = status.details.as_ref().and_then(|d| d.retry_after_seconds);
    let mut response = json(status.status_code(), &status);
    if let Some(secs) = retry {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if status.code == 403 {
        response.headers_mut().insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
    }
    response
}

/// A `Status` error whose `metadata.continue` is set (an expired continue
/// token answered with a fresh one), which `apimachinery::status::Status` cannot
/// carry.
pub fn status_with_continue(status: Status, token: &str) -> Response<Body> {
    let code = status.status_code();
    let mut value = serde_json::to_value(&status).unwrap_or(Value::Null);
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("continue".to_string(), Value::String(token.to_string()));
    }
    json(code, &value)
}

/// A plain-text response.
pub fn text(code: StatusCode, body: impl Into<bytes::Bytes>) -> Response<Body> {
    let mut response = Response::new(body::full(body.into()));
    *response.status_mut() = code;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// `Ok` or the error's response, so handlers can use `?` on `Status`.
pub fn either(result: Result<Response<Body>, Status>) -> Response<Body> {
    result.unwrap_or_else(status)
}
