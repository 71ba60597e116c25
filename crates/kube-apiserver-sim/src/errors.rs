//! The `Status` errors the sim answers with, beyond the constructors in
//! `apimachinery::status`, each mirroring an `apierrors.New...` of
//! `k8s.io/apimachinery/pkg/api/errors` (message shape, reason, details).

use http::StatusCode;

use apimachinery::status::{Cause, Details, Status, qualified_resource};

pub use apimachinery::go::quote as go_quote;

/// `409 AlreadyExists`: `configmaps "x" already exists`.
pub fn already_exists(group: &str, resource: &str, name: &str) -> Status {
    Status::new(
        StatusCode::CONFLICT,
        "AlreadyExists",
        format!(
            "{} {} already exists",
            qualified_resource(group, resource),
            go_quote(name)
        ),
    )
    .with_details(named(group, resource, name))
}

/// `409 Conflict`: `Operation cannot be fulfilled on configmaps "x": <why>`.
pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Status {
    Status::new(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} {}: {why}",
            qualified_resource(group, resource),
            go_quote(name)
        ),
    )
    .with_details(named(group, resource, name))
}

/// The optimistic-concurrency message of `storage.NewResourceVersionConflictsError`.
pub const MODIFIED: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// `422 Invalid` on an object: `ConfigMap "x" is invalid: <field>: <msg>`.
/// `kind` is the kind (not the resource); `causes` carry reason, message
/// (without the field) and field.
pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Status {
    let qualified = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    let parts: Vec<String> = causes
        .iter()
        .map(|c| {
            if c.field.is_empty() {
                c.message.clone()
            } else {
                format!("{}: {}", c.field, c.message)
            }
        })
        .collect();
    let summary = if parts.len() == 1 {
        parts.concat()
    } else {
        format!("[{}]", parts.join(", "))
    };
    Status::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("{qualified} {} is invalid: {summary}", go_quote(name)),
    )
    .with_details(Details {
        name: name.to_string(),
        group: group.to_string(),
        kind: kind.to_string(),
        causes,
        ..Details::default()
    })
}

/// A `422` cause for a missing required field.
pub fn required(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        message: if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        },
        field: field.to_string(),
    }
}

/// `405 MethodNotAllowed`.
pub fn method_not_supported(group: &str, resource: &str, verb: &str) -> Status {
    Status::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        format!(
            "{} is not supported on resources of kind {}",
            go_quote(verb),
            go_quote(&qualified_resource(group, resource))
        ),
    )
    .with_details(Details {
        group: group.to_string(),
        kind: resource.to_string(),
        ..Details::default()
    })
}

/// `406 NotAcceptable`, as the negotiation in `handlers/negotiation` writes it.
pub fn not_acceptable() -> Status {
    Status::new(
        StatusCode::NOT_ACCEPTABLE,
        "NotAcceptable",
        "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf",
    )
}

/// `415 UnsupportedMediaType` for a request body the sim cannot decode.
pub fn unsupported_media_type(accepted: &[&str]) -> Status {
    Status::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UnsupportedMediaType",
        format!(
            "the body of the request was in an unknown format - accepted media types include: {}",
            accepted.join(", ")
        ),
    )
}

/// `413 RequestEntityTooLarge` for a body over the apiserver's 3 MiB limit.
pub fn entity_too_large(limit: usize) -> Status {
    Status::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestEntityTooLarge",
        format!("Request entity too large: limit is {limit}"),
    )
}

/// A non-`Status` error reaching `responsewriters.ErrorToAPIStatus`: HTTP
/// 500, no reason. The watch handler answers an unparseable
/// resourceVersion this way.
pub fn unknown_500(message: impl Into<String>) -> Status {
    Status::new(StatusCode::INTERNAL_SERVER_ERROR, "", message)
}

/// `strconv.ParseUint` failing on a resourceVersion, as
/// `APIObjectVersioner.ParseResourceVersion` words it.
pub fn rv_parse_message(rv: &str) -> String {
    let why = if rv.bytes().all(|b| b.is_ascii_digit()) && !rv.is_empty() {
        "value out of range"
    } else {
        "invalid syntax"
    };
    format!(
        "resourceVersion: Invalid value: {}: strconv.ParseUint: parsing {}: {why}",
        go_quote(rv),
        go_quote(rv)
    )
}

fn named(group: &str, resource: &str, name: &str) -> Details {
    Details {
        name: name.to_string(),
        group: group.to_string(),
        kind: resource.to_string(),
        ..Details::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_follows_strconv_quote() {
        assert_eq!(go_quote("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(go_quote("tab\there\u{1}"), r#""tab\there\x01""#);
        assert_eq!(go_quote("héllo"), "\"héllo\"");
        assert_eq!(go_quote("\u{a0}"), r#""\u00a0""#);
    }

    #[test]
    fn conflict_and_exists_messages() {
        let s = conflict("", "configmaps", "x", MODIFIED);
        assert_eq!(
            s.message,
            "Operation cannot be fulfilled on configmaps \"x\": the object has been modified; please apply your changes to the latest version and try again"
        );
        assert_eq!(
            already_exists("apps", "deployments", "d").message,
            "deployments.apps \"d\" already exists"
        );
        let s = invalid(
            "",
            "ConfigMap",
            "",
            vec![required(
                "metadata.name",
                "name or generateName is required",
            )],
        );
        assert_eq!(
            s.message,
            "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required"
        );
        assert_eq!(
            rv_parse_message("abc"),
            "resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax"
        );
    }
}
