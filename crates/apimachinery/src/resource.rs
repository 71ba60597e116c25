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

use serde::de::DeserializeSeed;
use serde_json::Value;

use crate::selector::{FieldRequirement, FieldSelector};

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

const fn b(
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    kind: &'static str,
    namespaced: bool,
    fields: FieldSet,
) -> BuiltIn {
    BuiltIn {
        group,
        version,
        resource,
        kind,
        namespaced,
        fields,
    }
}

/// Built-in resources that can be listed and watched.
pub const BUILT_INS: &[BuiltIn] = &[
    b("", "v1", "pods", "Pod", true, FieldSet::Pod),
    b("", "v1", "nodes", "Node", false, FieldSet::Node),
    b("", "v1", "services", "Service", true, FieldSet::Service),
    b("", "v1", "endpoints", "Endpoints", true, FieldSet::Default),
    b(
        "",
        "v1",
        "namespaces",
        "Namespace",
        false,
        FieldSet::Namespace,
    ),
    b("", "v1", "configmaps", "ConfigMap", true, FieldSet::Default),
    b("", "v1", "secrets", "Secret", true, FieldSet::Secret),
    b(
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        FieldSet::Default,
    ),
    b("", "v1", "events", "Event", true, FieldSet::CoreEvent),
    b(
        "",
        "v1",
        "persistentvolumes",
        "PersistentVolume",
        false,
        FieldSet::Default,
    ),
    b(
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        FieldSet::Default,
    ),
    b(
        "",
        "v1",
        "replicationcontrollers",
        "ReplicationController",
        true,
        FieldSet::ReplicationController,
    ),
    b(
        "",
        "v1",
        "limitranges",
        "LimitRange",
        true,
        FieldSet::Default,
    ),
    b(
        "",
        "v1",
        "resourcequotas",
        "ResourceQuota",
        true,
        FieldSet::Default,
    ),
    b(
        "",
        "v1",
        "podtemplates",
        "PodTemplate",
        true,
        FieldSet::Default,
    ),
    b(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        true,
        FieldSet::Default,
    ),
    b(
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        true,
        FieldSet::Default,
    ),
    b(
        "apps",
        "v1",
        "daemonsets",
        "DaemonSet",
        true,
        FieldSet::Default,
    ),
    b(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        true,
        FieldSet::Default,
    ),
    b(
        "apps",
        "v1",
        "controllerrevisions",
        "ControllerRevision",
        true,
        FieldSet::Default,
    ),
    b("batch", "v1", "jobs", "Job", true, FieldSet::Job),
    b(
        "batch",
        "v1",
        "cronjobs",
        "CronJob",
        true,
        FieldSet::Default,
    ),
    b(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
        FieldSet::Default,
    ),
    b(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        true,
        FieldSet::EventsV1Event,
    ),
    b(
        "node.k8s.io",
        "v1",
        "runtimeclasses",
        "RuntimeClass",
        false,
        FieldSet::Default,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "csidrivers",
        "CSIDriver",
        false,
        FieldSet::Default,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "csinodes",
        "CSINode",
        false,
        FieldSet::Default,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "StorageClass",
        false,
        FieldSet::Default,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "volumeattachments",
        "VolumeAttachment",
        false,
        FieldSet::Default,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "csistoragecapacities",
        "CSIStorageCapacity",
        true,
        FieldSet::Default,
    ),
    b(
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        FieldSet::Default,
    ),
    b(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        true,
        FieldSet::Default,
    ),
    b(
        "networking.k8s.io",
        "v1",
        "ingresses",
        "Ingress",
        true,
        FieldSet::Default,
    ),
    b(
        "networking.k8s.io",
        "v1",
        "servicecidrs",
        "ServiceCIDR",
        false,
        FieldSet::Default,
    ),
    b(
        "networking.k8s.io",
        "v1",
        "ingressclasses",
        "IngressClass",
        false,
        FieldSet::Default,
    ),
    b(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
        FieldSet::Default,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        FieldSet::Default,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        FieldSet::Default,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        FieldSet::Default,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        FieldSet::Default,
    ),
    b(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "PriorityClass",
        false,
        FieldSet::Default,
    ),
    b(
        "certificates.k8s.io",
        "v1",
        "certificatesigningrequests",
        "CertificateSigningRequest",
        false,
        FieldSet::CertificateSigningRequest,
    ),
    b(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        FieldSet::Default,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        false,
        FieldSet::Default,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        false,
        FieldSet::Default,
    ),
    b(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "ResourceSlice",
        false,
        FieldSet::ResourceSlice,
    ),
    b(
        "resource.k8s.io",
        "v1",
        "resourceclaims",
        "ResourceClaim",
        true,
        FieldSet::Default,
    ),
    b(
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        "DeviceClass",
        false,
        FieldSet::Default,
    ),
];

/// Groups served by kube-apiserver itself. Their list items are typed Go
/// structs, encoded without `kind`/`apiVersion`; custom resources keep them.
pub const BUILT_IN_GROUPS: &[&str] = &[
    "",
    "apps",
    "batch",
    "autoscaling",
    "policy",
    "discovery.k8s.io",
    "events.k8s.io",
    "node.k8s.io",
    "storage.k8s.io",
    "coordination.k8s.io",
    "networking.k8s.io",
    "rbac.authorization.k8s.io",
    "scheduling.k8s.io",
    "certificates.k8s.io",
    "apiextensions.k8s.io",
    "admissionregistration.k8s.io",
    "resource.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "apiregistration.k8s.io",
    "internal.apiserver.k8s.io",
    "storagemigration.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
];

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

    fn convert_label(self, label: &str) -> Result<&str, String> {
        let core = |allowed: &[&str]| {
            if allowed.contains(&label) {
                Ok(label)
            } else {
                Err(format!("field label not supported: {label}"))
            }
        };
        match self {
            FieldSet::Default => match label {
                "metadata.name" | "metadata.namespace" => Ok(label),
                _ => Err(format!(
                    "{label:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                )),
            },
            FieldSet::Pod => {
                if label == "spec.host" {
                    return Ok("spec.nodeName");
                }
                core(&[
                    "metadata.name",
                    "metadata.namespace",
                    "spec.nodeName",
                    "spec.restartPolicy",
                    "spec.schedulerName",
                    "spec.serviceAccountName",
                    "spec.hostNetwork",
                    "status.phase",
                    "status.podIP",
                    "status.podIPs",
                    "status.nominatedNodeName",
                ])
            }
            FieldSet::Node => core(&["metadata.name", "spec.unschedulable"]),
            FieldSet::Service => core(&[
                "metadata.namespace",
                "metadata.name",
                "spec.clusterIP",
                "spec.type",
            ]),
            FieldSet::Secret => core(&["type", "metadata.namespace", "metadata.name"]),
            FieldSet::Namespace => core(&["status.phase", "metadata.name"]),
            FieldSet::ReplicationController => {
                core(&["metadata.name", "metadata.namespace", "status.replicas"])
            }
            FieldSet::CoreEvent => core(&[
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
                "metadata.namespace",
                "metadata.name",
            ]),
            FieldSet::EventsV1Event => Ok(match label {
                "reason" => "reason",
                "regarding.kind" => "involvedObject.kind",
                "regarding.namespace" => "involvedObject.namespace",
                "regarding.name" => "involvedObject.name",
                "regarding.uid" => "involvedObject.uid",
                "regarding.apiVersion" => "involvedObject.apiVersion",
                "regarding.resourceVersion" => "involvedObject.resourceVersion",
                "regarding.fieldPath" => "involvedObject.fieldPath",
                "reportingController" => "reportingComponent",
                "source" => "source",
                "type" => "type",
                "metadata.namespace" => "metadata.namespace",
                "metadata.name" => "metadata.name",
                _ => return Err(format!("field label not supported: {label}")),
            }),
            FieldSet::Job => match label {
                "metadata.name" | "metadata.namespace" | "status.successful" => Ok(label),
                _ => Err(format!(
                    "field label {label:?} not supported for batchv1.Job"
                )),
            },
            FieldSet::CertificateSigningRequest => core(&["metadata.name", "spec.signerName"]),
            FieldSet::ResourceSlice => match label {
                "metadata.name" | "spec.nodeName" | "spec.driver" => Ok(label),
                _ => Err(format!(
                    "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: {label}"
                )),
            },
        }
    }

    /// The selectable fields of `object` (its JSON as the apiserver encodes
    /// it), as `ToSelectableFields` computes them. `namespaced` decides
    /// whether `metadata.namespace` is part of the set.
    pub fn extract(self, object: &Value, namespaced: bool) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = Vec::with_capacity(4);
        let mut put = |k: &'static str, v: String| out.push((k, v));
        put("metadata.name", str_at(object, &["metadata", "name"]));
        if namespaced {
            put(
                "metadata.namespace",
                str_at(object, &["metadata", "namespace"]),
            );
        }
        match self {
            FieldSet::Default => {}
            FieldSet::Pod => {
                put("spec.nodeName", str_at(object, &["spec", "nodeName"]));
                put(
                    "spec.restartPolicy",
                    str_at(object, &["spec", "restartPolicy"]),
                );
                put(
                    "spec.schedulerName",
                    str_at(object, &["spec", "schedulerName"]),
                );
                put(
                    "spec.serviceAccountName",
                    str_at(object, &["spec", "serviceAccountName"]),
                );
                put(
                    "spec.hostNetwork",
                    bool_at(object, &["spec", "hostNetwork"]),
                );
                put("status.phase", str_at(object, &["status", "phase"]));
                let pod_ip = object
                    .pointer("/status/podIPs/0/ip")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| str_at(object, &["status", "podIP"]));
                put("status.podIP", pod_ip);
                put(
                    "status.nominatedNodeName",
                    str_at(object, &["status", "nominatedNodeName"]),
                );
            }
            FieldSet::Node => put(
                "spec.unschedulable",
                bool_at(object, &["spec", "unschedulable"]),
            ),
            FieldSet::Service => {
                put("spec.clusterIP", str_at(object, &["spec", "clusterIP"]));
                put("spec.type", str_at(object, &["spec", "type"]));
            }
            FieldSet::Secret => put("type", str_at(object, &["type"])),
            FieldSet::Namespace => put("status.phase", str_at(object, &["status", "phase"])),
            FieldSet::ReplicationController => {
                put("status.replicas", int_at(object, &["status", "replicas"]))
            }
            FieldSet::CoreEvent | FieldSet::EventsV1Event => {
                let (regarding, reporting, source_component) = if self == FieldSet::CoreEvent {
                    (
                        "involvedObject",
                        "reportingComponent",
                        ["source", "component"],
                    )
                } else {
                    (
                        "regarding",
                        "reportingController",
                        ["deprecatedSource", "component"],
                    )
                };
                const INVOLVED: [(&str, &str); 7] = [
                    ("kind", "involvedObject.kind"),
                    ("namespace", "involvedObject.namespace"),
                    ("name", "involvedObject.name"),
                    ("uid", "involvedObject.uid"),
                    ("apiVersion", "involvedObject.apiVersion"),
                    ("resourceVersion", "involvedObject.resourceVersion"),
                    ("fieldPath", "involvedObject.fieldPath"),
                ];
                for (f, label) in INVOLVED {
                    put(label, str_at(object, &[regarding, f]));
                }
                put("reason", str_at(object, &["reason"]));
                let reporting_controller = str_at(object, &[reporting]);
                let mut source = str_at(object, &source_component);
                if source.is_empty() {
                    source = reporting_controller.clone();
                }
                put("reportingComponent", reporting_controller);
                put("source", source);
                put("type", str_at(object, &["type"]));
            }
            FieldSet::Job => put(
                "status.successful",
                int_at(object, &["status", "succeeded"]),
            ),
            FieldSet::CertificateSigningRequest => {
                put("spec.signerName", str_at(object, &["spec", "signerName"]))
            }
            FieldSet::ResourceSlice => {
                put("spec.nodeName", str_at(object, &["spec", "nodeName"]));
                put("spec.driver", str_at(object, &["spec", "driver"]));
            }
        }
        out
    }

    /// Whether the fields need more of the object than its metadata.
    pub fn needs_body(self) -> bool {
        self != FieldSet::Default
    }

    /// [`FieldSet::extract`] straight from the object's JSON, without
    /// building the whole object as a [`Value`]: only the members
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

    /// Every path [`FieldSet::extract`] reads; a path's value is kept whole.
    fn read_paths(self) -> &'static [&'static [&'static str]] {
        const META: [&[&str]; 2] = [&["metadata", "name"], &["metadata", "namespace"]];
        macro_rules! paths {
            ($($p:expr),* $(,)?) => {{
                const P: &[&[&str]] = &[META[0], META[1], $($p),*];
                P
            }};
        }
        match self {
            FieldSet::Default => paths!(),
            FieldSet::Pod => paths!(
                &["spec", "nodeName"],
                &["spec", "restartPolicy"],
                &["spec", "schedulerName"],
                &["spec", "serviceAccountName"],
                &["spec", "hostNetwork"],
                &["status", "phase"],
                &["status", "podIPs"],
                &["status", "podIP"],
                &["status", "nominatedNodeName"],
            ),
            FieldSet::Node => paths!(&["spec", "unschedulable"]),
            FieldSet::Service => paths!(&["spec", "clusterIP"], &["spec", "type"]),
            FieldSet::Secret => paths!(&["type"]),
            FieldSet::Namespace => paths!(&["status", "phase"]),
            FieldSet::ReplicationController => paths!(&["status", "replicas"]),
            FieldSet::CoreEvent => paths!(
                &["involvedObject"],
                &["reason"],
                &["reportingComponent"],
                &["source", "component"],
                &["type"],
            ),
            FieldSet::EventsV1Event => paths!(
                &["regarding"],
                &["reason"],
                &["reportingController"],
                &["deprecatedSource", "component"],
                &["type"],
            ),
            FieldSet::Job => paths!(&["status", "succeeded"]),
            FieldSet::CertificateSigningRequest => paths!(&["spec", "signerName"]),
            FieldSet::ResourceSlice => paths!(&["spec", "nodeName"], &["spec", "driver"]),
        }
    }
}

/// A JSON value with only some paths kept, for [`FieldSet::extract_json`].
mod prune {
    use std::borrow::Cow;
    use std::fmt;

    use serde::Deserialize;
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Value};

    /// Deserializes a value keeping only `paths` (each relative to the
    /// document root, of which the first `.1` keys have been matched
    /// already). Where an object is expected but something else is found,
    /// the result is `null`: [`Value::get`] finds no member in either.
    pub(super) struct Prune(pub Vec<&'static [&'static str]>, pub usize);

    /// An object key, borrowed from the input unless it has escapes.
    #[derive(Deserialize)]
    struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

    impl<'de> DeserializeSeed<'de> for Prune {
        type Value = Value;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Prune {
        type Value = Value;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let Prune(paths, depth) = self;
            let mut out = Map::new();
            while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                let deeper: Vec<&'static [&'static str]> = paths
                    .iter()
                    .copied()
                    .filter(|p| p.get(depth) == Some(&&*key))
                    .collect();
                if deeper.is_empty() {
                    map.next_value::<IgnoredAny>()?;
                } else if deeper.iter().any(|p| p.len() == depth + 1) {
                    out.insert(key.into_owned(), map.next_value::<Value>()?);
                } else {
                    let v = map.next_value_seed(Prune(deeper, depth + 1))?;
                    out.insert(key.into_owned(), v);
                }
            }
            Ok(Value::Object(out))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Value::Null)
        }

        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }

        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }

        fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
            Ok(Value::Null)
        }

        fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
            Ok(Value::Null)
        }

        fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
            Ok(Value::Null)
        }

        fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
            Ok(Value::Null)
        }

        fn visit_str<E>(self, _: &str) -> Result<Value, E> {
            Ok(Value::Null)
        }
    }
}

fn at<'a>(object: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(object, |v, k| v.get(k))
}

fn str_at(object: &Value, path: &[&str]) -> String {
    at(object, path)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn bool_at(object: &Value, path: &[&str]) -> String {
    at(object, path)
        .and_then(Value::as_bool)
        .unwrap_or(false)
        .to_string()
}

fn int_at(object: &Value, path: &[&str]) -> String {
    at(object, path)
        .and_then(Value::as_i64)
        .unwrap_or(0)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::Pairs;

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
    fn cluster_scoped_has_no_namespace_field() {
        let node: Value = serde_json::json!({"metadata": {"name": "n1"}, "spec": {}});
        let f = FieldSet::Node.extract(&node, false);
        assert_eq!(f.get("metadata.namespace"), None);
        assert_eq!(f.get("spec.unschedulable"), Some("false"));
    }
}
