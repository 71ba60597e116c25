//! Which objects a list or watch selects: a namespace (the storage-key
//! prefix) and the label and field selectors (the predicate).

use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::object;
use super::resources::ResourceSpec;
use super::store::Attrs;
use apimachinery::selector::{FieldSelector, LabelSelector};

/// A list's or watch's selection.
#[derive(Debug, Clone)]
pub struct Selection {
    pub spec: Arc<ResourceSpec>,
    /// Empty for all namespaces (or a cluster-scoped resource).
    pub namespace: String,
    pub labels: LabelSelector,
    /// Already converted for the resource.
    pub fields: FieldSelector,
}

// === impl Selection ===

impl Selection {
    /// The storage-key prefix: `ns/` within a namespace, else empty.
    pub fn prefix(&self) -> String {
        if self.spec.namespaced && !self.namespace.is_empty() {
            format!("{}/", self.namespace)
        } else {
            String::new()
        }
    }

    /// Whether `object` passes the label and field selectors (and is in
    /// the namespace; watchers see every event of the resource).
    pub fn matches(&self, obj: &Value) -> bool {
        if !self.in_namespace(obj) {
            return false;
        }
        if !self.labels.is_empty() && !self.labels.matches(&object::labels(obj)) {
            return false;
        }
        self.fields.is_empty()
            || self
                .fields
                .matches(&self.spec.fields.extract(obj, self.spec.namespaced))
    }

    /// Like [`Selection::matches`], with the attributes computed once in
    /// `slot` and shared with the other watchers of the event.
    pub fn matches_cached(&self, obj: &Value, slot: &OnceLock<Attrs>) -> bool {
        if !self.in_namespace(obj) {
            return false;
        }
        if self.selects_everything() {
            return true;
        }
        let attrs = slot.get_or_init(|| Attrs {
            labels: object::labels(obj),
            fields: self.spec.fields.extract(obj, self.spec.namespaced),
        });
        self.labels.matches(&attrs.labels) && self.fields.matches(&attrs.fields)
    }

    fn in_namespace(&self, obj: &Value) -> bool {
        !self.spec.namespaced
            || self.namespace.is_empty()
            || object::meta_str(obj, "namespace") == self.namespace
    }

    /// Whether no label or field selector applies (`Predicate.Empty()`).
    pub fn selects_everything(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// The one storage key a list reads when its field selector pins a
    /// name (registry `Store.ListPredicate`, `MatchesSingle`): the name
    /// must be a valid path segment, and a namespaced resource's namespace
    /// come from the path or a `metadata.namespace` term
    /// (`MatchesSingleNamespace`, a valid namespace name).
    pub fn single_key(&self) -> Option<String> {
        let name = self.fields.requires_exact_match("metadata.name")?;
        if !apimachinery::request::valid_path_segment_name(name) {
            return None;
        }
        if !self.spec.namespaced {
            return Some(name.to_string());
        }
        let namespace = if self.namespace.is_empty() {
            let ns = self.fields.requires_exact_match("metadata.namespace")?;
            if !apimachinery::selector::is_dns1123_label(ns) {
                return None;
            }
            ns
        } else {
            self.namespace.as_str()
        };
        Some(super::object::storage_key(&self.spec, namespace, name))
    }

    /// The storage key relative to the list's prefix, as continue tokens
    /// carry it.
    pub fn relative_key<'a>(&self, key: &'a str) -> &'a str {
        let prefix = self.prefix();
        key.strip_prefix(prefix.as_str()).unwrap_or(key)
    }
}
