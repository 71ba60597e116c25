//! API resources as kube-apiserver knows them, for the proxy and the
//! simulated apiserver alike: kind, scope, and which field selectors each
//! accepts and how their values are computed.
//!
//! Field selectors follow the apiserver exactly. Which labels a resource
//! accepts comes from the field-label conversion functions registered per
//! GVK (`pkg/apis/core/v1/conversion.go`, `pkg/apis/batch/v1/conversion.go`,
//! `pkg/apis/events/v1/conversion.go`...); kinds without one use
//! `runtime.DefaultMetaV1FieldSelectorConversion`. The values come from
//! each registry's `ToSelectableFields` (`pkg/registry/core/pod/strategy.go`
//! and friends). A label can be accepted yet absent from the field set
//! (pods' `status.podIPs`): it then compares as the empty string.
//!
//! The per-kind tables are in [`kinds`] (which resources, their kind and
//! scope) and `fields` (each kind's field-selector labels and where
//! their values are in the object); this module reads them.

use serde::de::DeserializeSeed;

use crate::selector::{FieldRequirement, FieldSelector};

mod fields;
pub mod kinds;
mod prune;

pub use kinds::{BUILT_IN_GROUPS, BUILT_INS};

/// A group, version and resource.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvr {
    pub group: String,
    pub version: String,
    pub resource: String,
}

/// How a kind's field-selector labels are converted and what fields it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldSet {
    /// `metadata.name` and `metadata.namespace` only (the default conversion).
    Default,
    Pod,
    Node,
    Service,
    Secret,
    Namespace,
    ReplicationController,
    CoreEvent,
    EventsV1Event,
    Job,
    CertificateSigningRequest,
    ResourceSlice,
}

/// A built-in resource the proxy knows without discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltIn {
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub fields: FieldSet,
}

/// The built-in resource for `group`/`version`/`resource`, if known.
pub fn built_in(group: &str, version: &str, resource: &str) -> Option<&'static BuiltIn> {
    BUILT_INS
        .iter()
        .find(|b| b.group == group && b.version == version && b.resource == resource)
}

/// Whether `group` is served by kube-apiserver itself (not a CRD).
pub fn is_built_in_group(group: &str) -> bool {
    BUILT_IN_GROUPS.contains(&group)
}

// === impl FieldSet ===

impl FieldSet {
    /// The field set for a built-in resource, or [`FieldSet::Default`].
    pub fn of(group: &str, version: &str, resource: &str) -> FieldSet {
        built_in(group, version, resource).map_or(FieldSet::Default, |b| b.fields)
    }

    /// Converts a parsed field selector like the apiserver's
    /// `ConvertFieldLabel` for this kind: rejects unknown labels with the
    /// kind's own message and renames aliases (`spec.host`,
    /// `regarding.name`...). Terms are converted in their sorted order; the
    /// first bad one is reported.
    ///
    /// # Errors
    /// The `400 BadRequest` message.
    pub fn convert(self, selector: &FieldSelector) -> Result<FieldSelector, String> {
        let mut out = Vec::with_capacity(selector.terms().len());
        for term in selector.terms() {
            let field = self.convert_label(&term.field)?;
            out.push(FieldRequirement {
                field: field.to_string(),
                not_equals: term.not_equals,
                value: term.value.clone(),
            });
        }
        Ok(FieldSelector::from_terms(out))
    }

    /// Whether the fields need more of the object than its metadata.
    pub fn needs_body(self) -> bool {
        self != FieldSet::Default
    }

    /// [`FieldSet::extract`] straight from the object's JSON, without
    /// building the whole object as a [`serde_json::Value`]: only the members
    /// [`FieldSet::extract`] reads are materialized, everything else is
    /// skipped (still checked to be well-formed JSON). For a 5 KB pod this
    /// is a fraction of the cost of a full parse (see `benches/ingest.rs`).
    ///
    /// # Errors
    /// When `json` is not a well-formed JSON value.
    pub fn extract_json(
        self,
        json: &[u8],
        namespaced: bool,
    ) -> Result<Vec<(&'static str, String)>, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_slice(json);
        let pruned = prune::Prune(self.read_paths().to_vec(), 0).deserialize(&mut de)?;
        de.end()?;
        Ok(self.extract(&pruned, namespaced))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::Pairs;
    use serde_json::Value;

    fn conv(fs: FieldSet, s: &str) -> Result<String, String> {
        fs.convert(&FieldSelector::parse(s).unwrap())
            .map(|s| s.to_string())
    }

    #[test]
    fn conversion_messages() {
        assert_eq!(
            conv(FieldSet::Default, "spec.nodeName=x").unwrap_err(),
            r#""spec.nodeName" is not a known field selector: only "metadata.name", "metadata.namespace""#
        );
        assert_eq!(
            conv(FieldSet::Pod, "spec.foo=x").unwrap_err(),
            "field label not supported: spec.foo"
        );
        assert_eq!(
            conv(FieldSet::Pod, "spec.host=n1").unwrap(),
            "spec.nodeName=n1"
        );
        assert_eq!(
            conv(FieldSet::Node, "metadata.namespace=x").unwrap_err(),
            "field label not supported: metadata.namespace"
        );
        assert_eq!(
            conv(FieldSet::Job, "x=1").unwrap_err(),
            r#"field label "x" not supported for batchv1.Job"#
        );
        // Sorted terms: the first bad one in sorted order is reported.
        assert_eq!(
            conv(FieldSet::Default, "spec.b=1,spec.a=2").unwrap_err(),
            r#""spec.a" is not a known field selector: only "metadata.name", "metadata.namespace""#
        );
    }

    #[test]
    fn pod_fields() {
        let pod: Value = serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "hostNetwork": true},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.1"}]}
        });
        let f = FieldSet::Pod.extract(&pod, true);
        assert_eq!(f.get("spec.nodeName"), Some("n1"));
        assert_eq!(f.get("spec.hostNetwork"), Some("true"));
        assert_eq!(f.get("status.podIP"), Some("10.0.0.1"));
        assert_eq!(f.get("spec.restartPolicy"), Some(""));
        assert_eq!(f.get("status.podIPs"), None);
        let sel = FieldSet::Pod
            .convert(&FieldSelector::parse("status.podIPs=").unwrap())
            .unwrap();
        assert!(
            sel.matches(&f),
            "status.podIPs is accepted but always empty"
        );
    }

    #[test]
    fn extra_fields_are_what_extract_gives_beyond_the_metadata() {
        let all = [
            FieldSet::Default,
            FieldSet::Pod,
            FieldSet::Node,
            FieldSet::Service,
            FieldSet::Secret,
            FieldSet::Namespace,
            FieldSet::ReplicationController,
            FieldSet::CoreEvent,
            FieldSet::EventsV1Event,
            FieldSet::Job,
            FieldSet::CertificateSigningRequest,
            FieldSet::ResourceSlice,
        ];
        let object = serde_json::json!({"metadata": {"name": "o", "namespace": "ns"}});
        for fs in all {
            for namespaced in [true, false] {
                let names: Vec<&str> = fs
                    .extract(&object, namespaced)
                    .into_iter()
                    .map(|(k, _)| k)
                    .filter(|k| !matches!(*k, "metadata.name" | "metadata.namespace"))
                    .collect();
                assert_eq!(names, fs.extra_fields(), "{fs:?}");
            }
        }
    }

    #[test]
    fn cluster_scoped_has_no_namespace_field() {
        let node: Value = serde_json::json!({"metadata": {"name": "n1"}, "spec": {}});
        let f = FieldSet::Node.extract(&node, false);
        assert_eq!(f.get("metadata.namespace"), None);
        assert_eq!(f.get("spec.unschedulable"), Some("false"));
    }
}
