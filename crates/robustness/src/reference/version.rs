//! One version of an object, trimmed to what selectors read, and one
//! change etcd recorded for a key with the watch event it makes for a
//! filter.

use std::sync::Arc;

use serde_json::Value;

use crate::model::{Filter, Kind, ObjectKey};

/// One version of an object: its resourceVersion and what selectors read.
#[derive(Debug, Clone)]
pub struct Version {
    /// The resourceVersion (the etcd `mod_revision`). 0 when unknown: an
    /// object the reference learnt of only through an event's `prev_kv`.
    pub rv: u64,
    /// The object trimmed to `metadata.{name,namespace,labels}` and
    /// `spec.nodeName`, all [`Filter::matches`] reads.
    pub object: Arc<Value>,
    /// The same, packed in one buffer for [`Version::selected`], which the
    /// reference runs for every change and object a query covers.
    packed: Arc<str>,
}

impl PartialEq for Version {
    fn eq(&self, other: &Version) -> bool {
        self.rv == other.rv && self.object == other.object
    }
}

impl Version {
    /// A version of `key` from its full JSON (trimmed).
    pub fn new(rv: u64, key: &ObjectKey, object: &Value) -> Version {
        let object = trim(key, object);
        Version {
            rv,
            packed: pack(&object),
            object: Arc::new(object),
        }
    }

    /// Whether `filter` selects this version: [`Filter::matches`] on the
    /// object, computed from the packed form (one small buffer instead of
    /// a tree of maps: queries touch every change they cover).
    pub fn selected(&self, filter: &Filter) -> bool {
        let mut parts = self.packed.split('\0');
        let namespace = parts.next().unwrap_or("");
        let name = parts.next().unwrap_or("");
        let node = parts.next().unwrap_or("");
        if let Some(ns) = &filter.namespace
            && ns != namespace
        {
            return false;
        }
        let label = |key: &str| {
            let mut labels = parts.clone();
            while let (Some(k), Some(v)) = (labels.next(), labels.next()) {
                if k == key {
                    return Some(v);
                }
            }
            None
        };
        if !filter.labels.iter().all(|r| r.holds(label(r.key()))) {
            return false;
        }
        filter.fields.iter().all(|r| {
            let value = match r.key() {
                "metadata.name" => Some(name),
                "metadata.namespace" => Some(namespace),
                "spec.nodeName" => Some(node),
                _ => None,
            };
            r.holds(value)
        })
    }
}

/// A trimmed object packed as `namespace\0name\0nodeName` then
/// `\0key\0value` per label with a string value (names, label keys and
/// values cannot hold NUL).
fn pack(object: &Value) -> Arc<str> {
    let meta = &object["metadata"];
    let mut out = String::new();
    out.push_str(meta["namespace"].as_str().unwrap_or(""));
    out.push('\0');
    out.push_str(meta["name"].as_str().unwrap_or(""));
    out.push('\0');
    out.push_str(object["spec"]["nodeName"].as_str().unwrap_or(""));
    if let Some(labels) = meta["labels"].as_object() {
        for (k, v) in labels {
            if let Some(v) = v.as_str() {
                out.push('\0');
                out.push_str(k);
                out.push('\0');
                out.push_str(v);
            }
        }
    }
    out.into()
}

/// The parts of `object` selectors read; the name and namespace from
/// `key` when the object lacks them.
fn trim(key: &ObjectKey, object: &Value) -> Value {
    let meta = &object["metadata"];
    let mut m = serde_json::Map::new();
    let name = meta["name"].as_str().unwrap_or(&key.name);
    m.insert("name".to_string(), Value::String(name.to_string()));
    let namespace = meta["namespace"].as_str().unwrap_or(&key.namespace);
    if !namespace.is_empty() {
        m.insert(
            "namespace".to_string(),
            Value::String(namespace.to_string()),
        );
    }
    if let Some(labels) = meta.get("labels").filter(|l| l.is_object()) {
        m.insert("labels".to_string(), labels.clone());
    }
    let mut out = serde_json::Map::new();
    out.insert("metadata".to_string(), Value::Object(m));
    if let Some(node) = object["spec"]["nodeName"].as_str() {
        let mut spec = serde_json::Map::new();
        spec.insert("nodeName".to_string(), Value::String(node.to_string()));
        out.insert("spec".to_string(), Value::Object(spec));
    }
    Value::Object(out)
}

/// One change etcd recorded for a followed key.
#[derive(Debug, Clone)]
pub struct Change {
    /// The revision of the change (a PUT's `mod_revision`, a DELETE's
    /// revision).
    pub rev: u64,
    pub key: ObjectKey,
    /// The version before the change (`None`: a create).
    pub old: Option<Version>,
    /// The version after the change (`None`: a delete).
    pub new: Option<Version>,
}

impl Change {
    /// The watch event a watcher with `filter` gets for this change, if
    /// any, as kube-apiserver decides: by whether the old and the new
    /// object match.
    pub fn event(&self, filter: &Filter) -> Option<(Kind, ObjectKey, u64)> {
        let old = self.old.as_ref().is_some_and(|v| v.selected(filter));
        let new = self.new.as_ref().is_some_and(|v| v.selected(filter));
        let kind = match (old, new) {
            (true, true) => Kind::Modified,
            (false, true) => Kind::Added,
            (true, false) => Kind::Deleted,
            (false, false) => return None,
        };
        Some((kind, self.key.clone(), self.rev))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Requirement, Resource};
    use serde_json::json;

    fn k(ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(ns, name)
    }

    /// The packed form selects exactly as `Filter::matches` on the JSON.
    #[test]
    fn selected_agrees_with_filter_matches() {
        let mut rng = fastrand::Rng::with_seed(3);
        let pick = |rng: &mut fastrand::Rng, xs: &[&str]| xs[rng.usize(..xs.len())].to_string();
        let values = ["a", "b", ""];
        let keys = [
            "app",
            "tier",
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "x.y",
        ];
        for _ in 0..3000 {
            let mut labels = serde_json::Map::new();
            for key in ["app", "tier"] {
                match rng.u8(..4) {
                    0 => {}
                    1 => {
                        labels.insert(key.into(), json!(7));
                    }
                    _ => {
                        labels.insert(key.into(), json!(pick(&mut rng, &values)));
                    }
                }
            }
            let mut object = json!({"metadata": {"name": pick(&mut rng, &["a", "b"])}});
            if rng.bool() {
                object["metadata"]["namespace"] = json!(pick(&mut rng, &["a", "b"]));
            }
            if rng.bool() {
                object["metadata"]["labels"] = Value::Object(labels);
            }
            if rng.bool() {
                object["spec"] = json!({"nodeName": pick(&mut rng, &values)});
            }
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let v = Version::new(1, &k(&ns, &name), &object);
            let mut filter = Filter::all(Resource::Pods);
            if rng.u8(..3) == 0 {
                filter.namespace = Some(pick(&mut rng, &["a", "b"]));
            }
            for _ in 0..rng.usize(..3) {
                let key = pick(&mut rng, &keys);
                let r = match rng.u8(..3) {
                    0 => Requirement::Equals(key, pick(&mut rng, &values)),
                    1 => Requirement::NotEquals(key, pick(&mut rng, &values)),
                    _ => {
                        Requirement::In(key, vec![pick(&mut rng, &values), pick(&mut rng, &values)])
                    }
                };
                if r.key().contains('.') {
                    filter.fields.push(r);
                } else {
                    filter.labels.push(r);
                }
            }
            assert_eq!(
                v.selected(&filter),
                filter.matches(&v.object),
                "{filter} on {}",
                v.object
            );
            assert_eq!(
                filter.matches(&v.object),
                filter.matches(&object),
                "{filter} on {object}"
            );
        }
    }
}
