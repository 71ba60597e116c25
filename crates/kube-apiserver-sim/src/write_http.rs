//! HTTP glue for writes: body limits and decoding with the apiserver's
//! errors, then the rules in `write`. POST creates (201), PUT updates,
//! PATCH patches (merge, strategic-as-merge, JSON patch, apply-as-merge),
//! DELETE deletes one object or a collection.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{Map, Value, json};

use super::accept::Output;
use super::errors;
use super::gojson;
use super::list;
use super::object;
use super::options::ListOptions;
use super::patch;
use super::resources::ResourceSpec;
use super::respond;
use super::selection::Selection;
use super::state::Ctx;
use super::write::{self, Preconditions, Target};
use apimachinery::body::Body;
use apimachinery::status::Status;

/// The apiserver's request body limit (3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

/// Reads a request body, at most [`MAX_BODY_BYTES`].
///
/// # Errors
/// 413 RequestEntityTooLarge, or 400 when the body cannot be read.
pub async fn read_body(req: Request<Incoming>) -> Result<Bytes, Status> {
    match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(errors::entity_too_large(MAX_BODY_BYTES))
        }
        Err(e) => Err(Status::bad_request(format!(
            "error reading request body: {e}"
        ))),
    }
}

fn content_type(req: &Request<Incoming>) -> String {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

/// `transformDecodeError`'s summary of a body that did not decode.
fn summarize(data: &[u8]) -> String {
    const MAX: usize = 30;
    match data.first() {
        None => "<empty>".into(),
        Some(b'{') => {
            let s = String::from_utf8_lossy(&data[..data.len().min(MAX)]).into_owned();
            if data.len() > MAX {
                format!("{s} ...")
            } else {
                s
            }
        }
        Some(_) => {
            let hex: String = data[..data.len().min(MAX)]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            if data.len() > MAX {
                format!("{hex} ...")
            } else {
                hex
            }
        }
    }
}

/// Decodes a write body as `spec`'s kind, with the apiserver's 400s.
fn decode(spec: &ResourceSpec, data: &[u8], media: &str) -> Result<Value, Status> {
    let unrecognized = |err: String| {
        Status::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: {err} ({})",
            spec.kind,
            summarize(data)
        ))
    };
    let value: Value = if media.contains("yaml") {
        let text = std::str::from_utf8(data).map_err(|e| unrecognized(e.to_string()))?;
        serde_saphyr::from_str(text).map_err(|e| unrecognized(e.to_string()))?
    } else {
        gojson::check_valid(data).map_err(unrecognized)?;
        serde_json::from_slice(data).map_err(|e| unrecognized(e.to_string()))?
    };
    let Value::Object(map) = &value else {
        return Err(unrecognized(format!(
            "json: cannot unmarshal {} into Go value of type struct {{ APIVersion string \"json:\\\"apiVersion,omitempty\\\"\"; Kind string \"json:\\\"kind,omitempty\\\"\" }}",
            match value {
                Value::Array(_) => "array",
                Value::String(_) => "string",
                Value::Number(_) => "number",
                Value::Bool(_) => "bool",
                _ => "null",
            }
        )));
    };
    let api_version = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if !api_version.is_empty() && api_version != spec.api_version() {
        return Err(Status::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            spec.api_version()
        )));
    }
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or("");
    if !kind.is_empty() && kind != spec.kind {
        return Err(Status::bad_request(format!(
            "{kind} in version {} cannot be handled as a {}: no kind {} is registered for version {}",
            errors::go_quote(&spec.version),
            spec.kind,
            errors::go_quote(kind),
            errors::go_quote(&spec.api_version())
        )));
    }
    Ok(value)
}

fn check_media(media: &str) -> Result<(), Status> {
    if media.is_empty() || media.contains("json") || media.contains("yaml") {
        return Ok(());
    }
    Err(errors::unsupported_media_type(&[
        "application/json",
        "application/yaml",
        "application/vnd.kubernetes.protobuf",
    ]))
}

/// `POST` to a collection.
pub async fn create(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    respond::either(
        async {
            let media = content_type(&req);
            check_media(&media)?;
            let data = read_body(req).await?;
            let obj = decode(&spec, &data, &media)?;
            let url_ns = spec.namespaced.then_some(namespace);
            let created = write::create(&ctx.state.store, &spec, url_ns, obj)?;
            Ok(respond::json(StatusCode::CREATED, created.as_ref()))
        }
        .await,
    )
}

/// `PUT` to an object or its status.
pub async fn update(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    name: &str,
    status: bool,
    req: Request<Incoming>,
) -> Response<Body> {
    respond::either(
        async {
            let media = content_type(&req);
            check_media(&media)?;
            let data = read_body(req).await?;
            let obj = decode(&spec, &data, &media)?;
            let target = target(&spec, status);
            let out = write::update(
                &ctx.state.store,
                &spec,
                Some((namespace, name)),
                obj,
                target,
            )?;
            Ok(respond::json(StatusCode::OK, out.as_ref()))
        }
        .await,
    )
}

fn target(spec: &ResourceSpec, status: bool) -> Target {
    if status {
        Target::Status
    } else {
        Target::Main {
            keep_status: spec.status_subresource,
        }
    }
}

/// `PATCH` of an object or its status.
pub async fn patch(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    name: &str,
    status: bool,
    req: Request<Incoming>,
) -> Response<Body> {
    respond::either(async {
        let media = content_type(&req);
        if !PATCH_TYPES.contains(&media.as_str()) {
            return Err(errors::unsupported_media_type(PATCH_TYPES));
        }
        let data = read_body(req).await?;
        let store = &ctx.state.store;
        let tgt = target(&spec, status);
        if media == "application/apply-patch+yaml" {
            if ctx.param("fieldManager").unwrap_or_default().is_empty() {
                return Err(Status::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            let applied = decode(&spec, &data, "yaml")?;
            let key = object::storage_key(&spec, namespace, name);
            if store.get(&spec, &key).is_none() {
                let mut obj = applied;
                object::set_meta(&mut obj, "name", Value::String(name.to_string()));
                let created = write::create(store, &spec, spec.namespaced.then_some(namespace), obj)?;
                return Ok(respond::json(StatusCode::CREATED, created.as_ref()));
            }
            let out = write::patch(store, &spec, namespace, name, tgt, |o| {
                patch::merge(o, &applied);
                Ok(())
            })?;
            return Ok(respond::json(StatusCode::OK, out.as_ref()));
        }
        gojson::check_valid(&data).map_err(Status::bad_request)?;
        let doc: Value = serde_json::from_slice(&data).map_err(|e| Status::bad_request(e.to_string()))?;
        let out = write::patch(store, &spec, namespace, name, tgt, |o| {
            if media == "application/json-patch+json" {
                patch::json_patch(o, &doc).map_err(|e| Status::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e))
            } else {
                if !doc.is_object() {
                    return Err(Status::bad_request("patch body must be a JSON object"));
                }
                patch::merge(o, &doc);
                Ok(())
            }
        })?;
        Ok(respond::json(StatusCode::OK, out.as_ref()))
    }
    .await)
}

fn preconditions(data: &[u8]) -> Result<Preconditions, Status> {
    if data.iter().all(u8::is_ascii_whitespace) {
        return Ok(Preconditions::default());
    }
    gojson::check_valid(data).map_err(Status::bad_request)?;
    let v: Value = serde_json::from_slice(data).map_err(|e| Status::bad_request(e.to_string()))?;
    let get = |k: &str| {
        v.pointer(&format!("/preconditions/{k}"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok(Preconditions {
        uid: get("uid"),
        resource_version: get("resourceVersion"),
    })
}

/// `DELETE` of one object: 200 with its last state.
pub async fn delete(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    name: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    respond::either(
        async {
            let data = read_body(req).await?;
            let pre = preconditions(&data)?;
            let out = write::delete(&ctx.state.store, &spec, namespace, name, &pre)?;
            Ok(respond::json(StatusCode::OK, out.as_ref()))
        }
        .await,
    )
}

/// `DELETE` of a collection: deletes every selected object, answers the
/// list of deleted objects.
pub async fn delete_collection(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    respond::either(
        async {
            let opts = ListOptions::parse(&ctx.query, false, spec.fields)?;
            let _ = read_body(req).await?;
            let sel = Selection {
                spec: spec.clone(),
                namespace: namespace.to_string(),
                labels: opts.label_selector,
                fields: opts.field_selector,
            };
            let store = &ctx.state.store;
            let (_, items) = store
                .list(&spec, None, &sel.prefix(), None)
                .map_err(|_| Status::internal("store read failed"))?;
            let mut deleted = Vec::new();
            for (_, obj) in items.iter().filter(|(_, o)| sel.matches(o)) {
                let ns = object::meta_str(obj, "namespace");
                let name = object::meta_str(obj, "name");
                if let Ok(gone) = write::delete(store, &spec, ns, name, &Preconditions::default()) {
                    deleted.push(gone);
                }
            }
            let mut meta = Map::new();
            meta.insert(
                "resourceVersion".into(),
                json!(store.current_rv().to_string()),
            );
            Ok(list::render(&spec, Output::Json, meta, &deleted, ""))
        }
        .await,
    )
}
