//! Writes: the object rules shared by HTTP writes and `Sim`'s direct store
//! access. Every write bumps the global RV by one and emits one event;
//! an update that changes nothing writes nothing, like etcd's no-op
//! updates.

use std::sync::Arc;

use serde_json::Value;

use super::errors::{self, MODIFIED, go_quote};
use super::object;
use super::resources::ResourceSpec;
use super::store::{Mutation, Store};
use apimachinery::selector::is_dns1123_subdomain;
use apimachinery::status::{Cause, Status};

/// What an update replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The whole object. With `keep_status`, the stored status is kept (a
    /// write to the main resource of one with a status subresource).
    Main { keep_status: bool },
    /// Only `.status` (the `status` subresource).
    Status,
}

/// Preconditions of a delete (`DeleteOptions.preconditions`).
#[derive(Debug, Clone, Default)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// `names.SimpleNameGenerator`: `generateName` plus five random characters
/// from the apiserver's alphabet (no vowels, no confusable digits).
fn generate_name(base: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let base = if base.len() > 58 { &base[..58] } else { base };
    let suffix: String = (0..5)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect();
    format!("{base}{suffix}")
}

/// Checks that the object's namespace agrees with the URL's and fills it in.
fn place(
    spec: &ResourceSpec,
    url_namespace: Option<&str>,
    obj: &mut Value,
) -> Result<String, Status> {
    if !spec.namespaced {
        object::remove_meta(obj, "namespace");
        return Ok(String::new());
    }
    let in_body = object::meta_str(obj, "namespace").to_string();
    let ns = match url_namespace {
        Some(url) if !in_body.is_empty() && in_body != url => {
            return Err(Status::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        Some(url) => url.to_string(),
        None => in_body,
    };
    if ns.is_empty() {
        return Err(errors::invalid(
            &spec.group,
            &spec.kind,
            object::meta_str(obj, "name"),
            vec![errors::required("metadata.namespace", "")],
        ));
    }
    object::set_meta(obj, "namespace", Value::String(ns.clone()));
    Ok(ns)
}

/// Sets `status.phase` unless the object has one.
fn default_phase(obj: &mut Value, phase: &str) {
    if obj.pointer("/status/phase").is_some() {
        return;
    }
    if let Value::Object(m) = obj {
        let status = m
            .entry("status")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(st) = status {
            st.insert("phase".into(), Value::String(phase.into()));
        }
    }
}

/// Creates `obj` (a JSON object) as `spec`; `url_namespace` is the
/// namespace of the request path, if any.
///
/// # Errors
/// 400 for a namespace mismatch, 422 for a missing or invalid name, 409
/// AlreadyExists.
pub fn create(
    store: &Store,
    spec: &ResourceSpec,
    url_namespace: Option<&str>,
    mut obj: Value,
) -> Result<Arc<Value>, Status> {
    if !obj.is_object() {
        return Err(Status::bad_request(
            "the object provided is not a JSON object",
        ));
    }
    let ns = place(spec, url_namespace, &mut obj)?;
    let mut name = object::meta_str(&obj, "name").to_string();
    if name.is_empty() {
        let base = object::meta_str(&obj, "generateName").to_string();
        if base.is_empty() {
            return Err(errors::invalid(
                &spec.group,
                &spec.kind,
                "",
                vec![errors::required(
                    "metadata.name",
                    "name or generateName is required",
                )],
            ));
        }
        name = generate_name(&base);
        object::set_meta(&mut obj, "name", Value::String(name.clone()));
    }
    let problems = is_dns1123_subdomain(&name);
    if !problems.is_empty() {
        let causes = problems
            .into_iter()
            .map(|p| Cause {
                reason: "FieldValueInvalid",
                message: format!("Invalid value: {}: {p}", go_quote(&name)),
                field: "metadata.name".into(),
            })
            .collect();
        return Err(errors::invalid(&spec.group, &spec.kind, &name, causes));
    }
    // The store assigns the RV; a client-set one is ignored.
    object::remove_meta(&mut obj, "resourceVersion");
    object::set_meta(
        &mut obj,
        "uid",
        Value::String(uuid::Uuid::new_v4().to_string()),
    );
    object::set_meta(
        &mut obj,
        "creationTimestamp",
        Value::String(object::now_rfc3339()),
    );
    if spec.has_generation() && obj.get("spec").is_some() {
        object::set_meta(&mut obj, "generation", Value::from(1));
    }
    // What the pod and namespace strategies default on create.
    if spec.group.is_empty() {
        match spec.resource.as_str() {
            "pods" => default_phase(&mut obj, "Pending"),
            "namespaces" => {
                default_phase(&mut obj, "Active");
                if obj.get("spec").is_none() {
                    if let Value::Object(m) = &mut obj {
                        m.insert(
                            "spec".into(),
                            serde_json::json!({"finalizers": ["kubernetes"]}),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    let key = object::storage_key(spec, &ns, &name);
    store.mutate(spec, &key, |prev| match prev {
        Some(_) => Err(errors::already_exists(&spec.group, &spec.resource, &name)),
        None => Ok(Mutation::Put(obj)),
    })
}

/// Replaces the object with `obj`. `url` is the namespace and name of the
/// request path, if any; `metadata.resourceVersion`, when set, must be the
/// stored one.
///
/// # Errors
/// 400 for name/namespace mismatches, 404, 409 Conflict.
pub fn update(
    store: &Store,
    spec: &ResourceSpec,
    url: Option<(&str, &str)>,
    mut obj: Value,
    target: Target,
) -> Result<Arc<Value>, Status> {
    if !obj.is_object() {
        return Err(Status::bad_request(
            "the object provided is not a JSON object",
        ));
    }
    let ns = place(spec, url.map(|(ns, _)| ns), &mut obj)?;
    let body_name = object::meta_str(&obj, "name").to_string();
    let name = match url {
        Some((_, url_name)) if !body_name.is_empty() && body_name != url_name => {
            return Err(Status::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({url_name})"
            )));
        }
        Some((_, url_name)) => url_name.to_string(),
        None => body_name,
    };
    if name.is_empty() {
        return Err(errors::invalid(
            &spec.group,
            &spec.kind,
            "",
            vec![errors::required("metadata.name", "name is required")],
        ));
    }
    object::set_meta(&mut obj, "name", Value::String(name.clone()));
    let key = object::storage_key(spec, &ns, &name);
    store.mutate(spec, &key, |prev| {
        let prev = prev.ok_or_else(|| Status::not_found(&spec.group, &spec.resource, &name))?;
        next_state(spec, prev, obj, target, &name)
    })
}

/// Applies `apply` to the stored object and stores the result, atomically.
///
/// # Errors
/// 404, whatever `apply` returns, and the update errors.
pub fn patch<F>(
    store: &Store,
    spec: &ResourceSpec,
    namespace: &str,
    name: &str,
    target: Target,
    apply: F,
) -> Result<Arc<Value>, Status>
where
    F: FnOnce(&mut Value) -> Result<(), Status>,
{
    let key = object::storage_key(spec, namespace, name);
    store.mutate(spec, &key, |prev| {
        let prev = prev.ok_or_else(|| Status::not_found(&spec.group, &spec.resource, name))?;
        let mut patched = prev.as_ref().clone();
        apply(&mut patched)?;
        if object::meta_str(&patched, "name") != name {
            return Err(Status::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                object::meta_str(&patched, "name")
            )));
        }
        next_state(spec, prev, patched, target, name)
    })
}

/// The object an update of `prev` with `body` stores.
fn next_state(
    spec: &ResourceSpec,
    prev: &Arc<Value>,
    body: Value,
    target: Target,
    name: &str,
) -> Result<Mutation, Status> {
    let prev_rv = object::meta_str(prev, "resourceVersion");
    let body_rv = object::meta_str(&body, "resourceVersion");
    if !body_rv.is_empty() && body_rv != prev_rv {
        return Err(errors::conflict(
            &spec.group,
            &spec.resource,
            name,
            MODIFIED,
        ));
    }
    let prev_uid = object::meta_str(prev, "uid");
    let body_uid = object::meta_str(&body, "uid");
    if !body_uid.is_empty() && body_uid != prev_uid {
        return Err(errors::conflict(
            &spec.group,
            &spec.resource,
            name,
            &format!(
                "Precondition failed: UID in precondition: {body_uid}, UID in object meta: {prev_uid}"
            ),
        ));
    }
    let mut next = match target {
        Target::Status => {
            let mut next = prev.as_ref().clone();
            if let (Value::Object(n), Some(status)) = (&mut next, body.get("status")) {
                n.insert("status".into(), status.clone());
            }
            next
        }
        Target::Main { keep_status } => {
            let mut next = body;
            if keep_status {
                if let Value::Object(n) = &mut next {
                    match prev.get("status") {
                        Some(s) => {
                            n.insert("status".into(), s.clone());
                        }
                        None => {
                            n.shift_remove("status");
                        }
                    }
                }
            }
            next
        }
    };
    for field in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
        match prev.get("metadata").and_then(|m| m.get(field)) {
            Some(v) => object::set_meta(&mut next, field, v.clone()),
            None => {
                object::remove_meta(&mut next, field);
            }
        }
    }
    if spec.has_generation() && next.get("spec") != prev.get("spec") {
        let generation = prev
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        object::set_meta(&mut next, "generation", Value::from(generation + 1));
    }
    if object::normalize(spec, next.clone()) == **prev {
        return Ok(Mutation::Unchanged);
    }
    Ok(Mutation::Put(next))
}

/// Deletes the object, checking `pre`. Returns the last state with the
/// delete's RV.
///
/// # Errors
/// 404, 409 when a precondition fails.
pub fn delete(
    store: &Store,
    spec: &ResourceSpec,
    namespace: &str,
    name: &str,
    pre: &Preconditions,
) -> Result<Arc<Value>, Status> {
    let key = object::storage_key(spec, namespace, name);
    store.mutate(spec, &key, |prev| {
        let prev = prev.ok_or_else(|| Status::not_found(&spec.group, &spec.resource, name))?;
        let uid = object::meta_str(prev, "uid");
        let rv = object::meta_str(prev, "resourceVersion");
        let failed = |what: &str, want: &str, have: &str| {
            errors::conflict(
                &spec.group,
                &spec.resource,
                name,
                &format!("Precondition failed: {what} in precondition: {want}, {what} in object meta: {have}"),
            )
        };
        if let Some(want) = pre.uid.as_deref().filter(|u| *u != uid) {
            return Err(failed("UID", want, uid));
        }
        if let Some(want) = pre.resource_version.as_deref().filter(|r| *r != rv) {
            return Err(failed("ResourceVersion", want, rv));
        }
        Ok(Mutation::Delete)
    })
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;
