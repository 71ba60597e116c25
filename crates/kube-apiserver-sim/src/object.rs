//! Object layout: field order and omitted empties as the apiserver's JSON
//! encoder writes them, plus small accessors.
//!
//! Built-in kinds are Go structs: `kind`, `apiVersion`, `metadata` (fields in
//! `ObjectMeta` declaration order), then the rest (the sim keeps the order
//! the client sent, which for kubectl and client-go is the struct order).
//! Custom resources are `map[string]interface{}` and Go encodes maps with
//! sorted keys, at every level.

use serde_json::{Map, Value};

use super::resources::ResourceSpec;

/// `ObjectMeta` fields in Go declaration order (`metav1.ObjectMeta`).
const META_ORDER: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Puts `object` in the layout the apiserver would encode for `spec`:
/// `kind`/`apiVersion` set, fields ordered, empty metadata omitted.
pub fn normalize(spec: &ResourceSpec, object: Value) -> Value {
    let Value::Object(mut map) = object else {
        return object;
    };
    map.insert("kind".to_string(), Value::String(spec.kind.clone()));
    map.insert("apiVersion".to_string(), Value::String(spec.api_version()));
    let metadata = match map.remove("metadata") {
        Some(Value::Object(m)) => order_meta(m),
        _ => Map::new(),
    };
    if !spec.is_built_in() {
        map.insert("metadata".to_string(), Value::Object(metadata));
        return sort_keys(Value::Object(map));
    }
    let mut out = Map::with_capacity(map.len() + 1);
    for key in ["kind", "apiVersion"] {
        if let Some(v) = map.remove(key) {
            out.insert(key.to_string(), v);
        }
    }
    out.insert("metadata".to_string(), Value::Object(metadata));
    out.extend(map);
    Value::Object(out)
}

fn order_meta(mut meta: Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::with_capacity(meta.len());
    for key in META_ORDER {
        if let Some(v) = meta.remove(*key) {
            if !is_omitted(key, &v) {
                out.insert((*key).to_string(), v);
            }
        }
    }
    // Unknown metadata fields would be dropped by the Go struct decoder.
    out
}

fn is_omitted(key: &str, v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Number(n) => key == "generation" && n.as_i64() == Some(0),
        Value::Bool(_) => false,
    }
}

/// Sorts object keys at every level, as Go encodes `map[string]any`.
pub fn sort_keys(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

/// A list item: built-in groups drop `kind` and `apiVersion` (the typed Go
/// list's items carry no TypeMeta); custom resources keep them.
pub fn list_item(spec: &ResourceSpec, object: &Value) -> Value {
    if !spec.is_built_in() {
        return object.clone();
    }
    match object {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "kind" && k.as_str() != "apiVersion")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `metadata.<field>` as a string, or `""`.
pub fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Sets `metadata.<field>`, creating `metadata` if needed. The caller
/// re-normalizes to restore field order.
pub fn set_meta(object: &mut Value, field: &str, value: Value) {
    if let Value::Object(map) = object {
        let meta = map
            .entry("metadata".to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = meta {
            m.insert(field.to_string(), value);
        }
    }
}

/// Removes `metadata.<field>`.
pub fn remove_meta(object: &mut Value, field: &str) -> Option<Value> {
    object
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .and_then(|m| m.shift_remove(field))
}

/// A copy of `object` whose `metadata.resourceVersion` is `rv`, keeping
/// field order.
pub fn with_rv(object: &Value, rv: u64) -> Value {
    let mut out = object.clone();
    if let Some(slot) = out
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .and_then(|m| m.get_mut("resourceVersion"))
    {
        *slot = Value::String(rv.to_string());
    }
    out
}

/// `metadata.labels` as pairs.
pub fn labels(object: &Value) -> Vec<(String, String)> {
    object
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// The storage key: `namespace/name` for namespaced resources, `name`
/// otherwise. Its byte order is the apiserver's list order.
pub fn storage_key(spec: &ResourceSpec, namespace: &str, name: &str) -> String {
    if spec.namespaced {
        format!("{namespace}/{name}")
    } else {
        name.to_string()
    }
}

/// Now, as `metav1.Time` encodes it: RFC 3339, seconds, `Z`.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn built_in_layout() {
        let spec = ResourceSpec::new("", "v1", "configmaps", "ConfigMap", true);
        let v = normalize(
            &spec,
            json!({"data": {"k": "v"}, "metadata": {"labels": {}, "uid": "u", "name": "n", "namespace": "ns", "annotations": {"a": "b"}}}),
        );
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"n","namespace":"ns","uid":"u","annotations":{"a":"b"}},"data":{"k":"v"}}"#
        );
        let item = list_item(&spec, &v);
        assert_eq!(
            serde_json::to_string(&item).unwrap(),
            r#"{"metadata":{"name":"n","namespace":"ns","uid":"u","annotations":{"a":"b"}},"data":{"k":"v"}}"#
        );
    }

    #[test]
    fn custom_resources_sort_keys_everywhere() {
        let spec = ResourceSpec::new("example.com", "v1", "widgets", "Widget", true);
        let v = normalize(
            &spec,
            json!({"spec": {"z": 1, "a": {"y": 2, "b": 3}}, "metadata": {"name": "w", "namespace": "ns"}}),
        );
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"ns"},"spec":{"a":{"b":3,"y":2},"z":1}}"#
        );
        assert_eq!(list_item(&spec, &v), v);
    }

    #[test]
    fn keys_sort_by_bytes() {
        let spec = ResourceSpec::new("", "v1", "configmaps", "ConfigMap", true);
        let mut keys = [storage_key(&spec, "a", "b"), storage_key(&spec, "a-x", "c")];
        keys.sort();
        assert_eq!(keys, ["a-x/c".to_string(), "a/b".to_string()]);
    }
}
