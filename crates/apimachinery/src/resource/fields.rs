//! Each kind's field selectors, as the apiserver registers them: the
//! labels its field-label conversion function accepts (and the aliases it
//! renames), and where `ToSelectableFields` finds each value in the
//! object (`pkg/apis/core/v1/conversion.go`,
//! `pkg/registry/core/pod/strategy.go` and friends).

use serde_json::Value;

use super::FieldSet;

// === impl FieldSet ===

impl FieldSet {
    pub(super) fn convert_label(self, label: &str) -> Result<&str, String> {
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

    /// The labels [`FieldSet::extract`] gives beyond `metadata.name` and
    /// `metadata.namespace`, in its order: the same for every object of the
    /// kind, so that a cache keeps them once per kind and only the values
    /// per object.
    pub fn extra_fields(self) -> &'static [&'static str] {
        match self {
            FieldSet::Default => &[],
            FieldSet::Pod => &[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            FieldSet::Node => &["spec.unschedulable"],
            FieldSet::Service => &["spec.clusterIP", "spec.type"],
            FieldSet::Secret => &["type"],
            FieldSet::Namespace => &["status.phase"],
            FieldSet::ReplicationController => &["status.replicas"],
            FieldSet::CoreEvent | FieldSet::EventsV1Event => &[
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
            ],
            FieldSet::Job => &["status.successful"],
            FieldSet::CertificateSigningRequest => &["spec.signerName"],
            FieldSet::ResourceSlice => &["spec.nodeName", "spec.driver"],
        }
    }

    /// Every path [`FieldSet::extract`] reads; a path's value is kept whole.
    pub(super) fn read_paths(self) -> &'static [&'static [&'static str]] {
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
