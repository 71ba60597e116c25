//! `meta.k8s.io` Tables, for `kubectl get` (`Accept: ...;as=Table`), as
//! kube-apiserver's printers make them
//! ([`pkg/printers/internalversion/printers.go`](https://github.com/kubernetes/kubernetes/blob/v1.36.2/pkg/printers/internalversion/printers.go)):
//! - pods: Name, Ready, Status, Restarts, Age, and (priority 1, shown by
//!   `-o wide`) IP, Node, Nominated Node, Readiness Gates (`printPod`);
//! - nodes: Name, Status, Roles, Age, Version, and (priority 1)
//!   Internal-IP, External-IP, OS-Image, Kernel-Version, Container-Runtime
//!   (`printNode`);
//! - configmaps: Name, Data (the number of keys), Age, as the recording's
//!   `list-configmaps-as-table` shows;
//! - anything else: Name and Age (the default table convertor).
//!
//! The apiserver always prints the wide columns (`GenerateOptions{Wide:
//! true}` in `pkg/printers/storage`); kubectl hides those of priority 1
//! unless `-o wide`.

use serde_json::{Map, Value, json};

use super::resources::ResourceSpec;

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const DATA_DESCRIPTION: &str = "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.";
const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
// The swagger docs of the fields behind the pod and node columns
// (k8s.io/api/core/v1/types_swagger_doc_generated.go).
const POD_IP_DESCRIPTION: &str = "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.";
const NODE_NAME_DESCRIPTION: &str = "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename";
const NOMINATED_NODE_DESCRIPTION: &str = "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.";
const READINESS_GATES_DESCRIPTION: &str = "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates";
const KUBELET_VERSION_DESCRIPTION: &str = "Kubelet Version reported by the node.";
const ADDRESSES_DESCRIPTION: &str = "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).";
const OS_IMAGE_DESCRIPTION: &str =
    "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).";
const KERNEL_VERSION_DESCRIPTION: &str =
    "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).";
const CONTAINER_RUNTIME_DESCRIPTION: &str = "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).";

fn column(name: &str, format: &str, description: &str, priority: u8) -> Value {
    json!({"name": name, "type": "string", "format": format, "description": description, "priority": priority})
}

/// Which printer a resource has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Printer {
    Pods,
    Nodes,
    ConfigMaps,
    Default,
}

fn printer(spec: &ResourceSpec) -> Printer {
    if !spec.group.is_empty() {
        return Printer::Default;
    }
    match spec.resource.as_str() {
        "pods" => Printer::Pods,
        "nodes" => Printer::Nodes,
        "configmaps" => Printer::ConfigMaps,
        _ => Printer::Default,
    }
}

/// The column definitions for `spec`.
pub fn columns(spec: &ResourceSpec) -> Vec<Value> {
    let name = column("Name", "name", NAME_DESCRIPTION, 0);
    let age = column("Age", "", AGE_DESCRIPTION, 0);
    match printer(spec) {
        Printer::Pods => vec![
            name,
            column(
                "Ready",
                "",
                "The aggregate readiness state of this pod for accepting traffic.",
                0,
            ),
            column(
                "Status",
                "",
                "The aggregate status of the containers in this pod.",
                0,
            ),
            column(
                "Restarts",
                "",
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                0,
            ),
            age,
            column("IP", "", POD_IP_DESCRIPTION, 1),
            column("Node", "", NODE_NAME_DESCRIPTION, 1),
            column("Nominated Node", "", NOMINATED_NODE_DESCRIPTION, 1),
            column("Readiness Gates", "", READINESS_GATES_DESCRIPTION, 1),
        ],
        Printer::Nodes => vec![
            name,
            column("Status", "", "The status of the node", 0),
            column("Roles", "", "The roles of the node", 0),
            age,
            column("Version", "", KUBELET_VERSION_DESCRIPTION, 0),
            column("Internal-IP", "", ADDRESSES_DESCRIPTION, 1),
            column("External-IP", "", ADDRESSES_DESCRIPTION, 1),
            column("OS-Image", "", OS_IMAGE_DESCRIPTION, 1),
            column("Kernel-Version", "", KERNEL_VERSION_DESCRIPTION, 1),
            column("Container-Runtime", "", CONTAINER_RUNTIME_DESCRIPTION, 1),
        ],
        Printer::ConfigMaps => vec![name, column("Data", "", DATA_DESCRIPTION, 0), age],
        Printer::Default => vec![name, age],
    }
}

/// One row for `object`. `include` is the `includeObject` parameter:
/// `None`, `Object`, or `Metadata` (the default).
pub fn row(spec: &ResourceSpec, object: &Value, include: &str, version: &str) -> Value {
    let mut row = Map::new();
    let cells = match printer(spec) {
        Printer::Pods => {
            let (cells, conditions) = pod_cells(object);
            row.insert("cells".into(), Value::Array(cells));
            if let Some(conditions) = conditions {
                row.insert("conditions".into(), conditions);
            }
            None
        }
        Printer::Nodes => Some(node_cells(object)),
        Printer::ConfigMaps => {
            let count = |k: &str| object.get(k).and_then(Value::as_object).map_or(0, Map::len);
            Some(vec![
                name_cell(object),
                json!(count("data") + count("binaryData")),
                age_cell(object),
            ])
        }
        Printer::Default => Some(vec![name_cell(object), age_cell(object)]),
    };
    if let Some(cells) = cells {
        row.insert("cells".into(), Value::Array(cells));
    }
    match include {
        "None" => {}
        "Object" => {
            row.insert("object".into(), object.clone());
        }
        _ => {
            row.insert("object".into(), partial_metadata(object, version));
        }
    }
    Value::Object(row)
}

fn name_cell(object: &Value) -> Value {
    object
        .pointer("/metadata/name")
        .cloned()
        .unwrap_or(Value::String(String::new()))
}

fn age_cell(object: &Value) -> Value {
    Value::String(since(timestamp(
        object.pointer("/metadata/creationTimestamp"),
    )))
}

fn timestamp(v: Option<&Value>) -> Option<jiff::Timestamp> {
    v.and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
}

/// `translateTimestampSince`: `<unknown>` for a zero time.
fn since(t: Option<jiff::Timestamp>) -> String {
    t.map_or_else(
        || "<unknown>".to_string(),
        |t| human_duration(jiff::Timestamp::now().as_second() - t.as_second()),
    )
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn array_at<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A container status's `lastState.terminated.finishedAt`.
fn last_terminated(status: &Value) -> Option<Option<jiff::Timestamp>> {
    status
        .pointer("/lastState/terminated")
        .filter(|t| t.is_object())
        .map(|t| timestamp(t.get("finishedAt")))
}

/// `lastRestartDate.Before(&terminatedDate)`, zero times included.
fn later(
    current: Option<jiff::Timestamp>,
    candidate: Option<jiff::Timestamp>,
) -> Option<jiff::Timestamp> {
    match (current, candidate) {
        (Some(c), Some(t)) if c < t => Some(t),
        (None, Some(t)) => Some(t),
        (c, _) => c,
    }
}

/// The reason a terminated container state gives: its reason, else
/// `<prefix>Signal:<n>`, else `<prefix>ExitCode:<n>`.
fn terminated_reason(terminated: &Value, prefix: &str) -> String {
    let reason = str_at(terminated, "/reason");
    let signal = terminated
        .get("signal")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let exit_code = terminated
        .get("exitCode")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if !reason.is_empty() {
        format!("{prefix}{reason}")
    } else if signal != 0 {
        format!("{prefix}Signal:{signal}")
    } else {
        format!("{prefix}ExitCode:{exit_code}")
    }
}

/// `isPodInitializedConditionTrue`: the first Initialized condition.
fn initialized(pod: &Value) -> bool {
    array_at(pod, "/status/conditions")
        .iter()
        .find(|c| str_at(c, "/type") == "Initialized")
        .is_some_and(|c| str_at(c, "/status") == "True")
}

/// `printPod`: the cells, and the row's conditions (`Completed` for a
/// pod that succeeded or failed).
fn pod_cells(pod: &Value) -> (Vec<Value>, Option<Value>) {
    let phase = str_at(pod, "/status/phase");
    let mut reason = phase.to_string();
    let status_reason = str_at(pod, "/status/reason");
    if !status_reason.is_empty() {
        reason = status_reason.to_string();
    }
    if array_at(pod, "/status/conditions")
        .iter()
        .any(|c| str_at(c, "/type") == "PodScheduled" && str_at(c, "/reason") == "SchedulingGated")
    {
        reason = "SchedulingGated".into();
    }
    let conditions = match phase {
        "Succeeded" => Some(
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}]),
        ),
        "Failed" => Some(
            json!([{"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}]),
        ),
        _ => None,
    };

    let init_specs = array_at(pod, "/spec/initContainers");
    // An init container with restartPolicy Always is a sidecar.
    let restartable = |name: &str| {
        init_specs
            .iter()
            .any(|c| str_at(c, "/name") == name && str_at(c, "/restartPolicy") == "Always")
    };
    let total = array_at(pod, "/spec/containers").len()
        + init_specs
            .iter()
            .filter(|c| str_at(c, "/restartPolicy") == "Always")
            .count();
    let mut ready = 0usize;
    let mut restarts = 0i64;
    let mut sidecar_restarts = 0i64;
    let mut last_restart: Option<jiff::Timestamp> = None;
    let mut last_sidecar_restart: Option<jiff::Timestamp> = None;
    let restart_count = |s: &Value| s.get("restartCount").and_then(Value::as_i64).unwrap_or(0);

    let mut initializing = false;
    for (i, status) in array_at(pod, "/status/initContainerStatuses")
        .iter()
        .enumerate()
    {
        restarts += restart_count(status);
        if let Some(finished) = last_terminated(status) {
            last_restart = later(last_restart, finished);
        }
        let name = str_at(status, "/name");
        if restartable(name) {
            sidecar_restarts += restart_count(status);
            if let Some(finished) = last_terminated(status) {
                last_sidecar_restart = later(last_sidecar_restart, finished);
            }
        }
        let terminated = status
            .pointer("/state/terminated")
            .filter(|t| t.is_object());
        let waiting_reason = str_at(status, "/state/waiting/reason");
        let started = status.get("started").and_then(Value::as_bool) == Some(true);
        if terminated.is_some_and(|t| t.get("exitCode").and_then(Value::as_i64).unwrap_or(0) == 0) {
            continue;
        } else if restartable(name) && started {
            if status.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        } else if let Some(t) = terminated {
            reason = terminated_reason(t, "Init:");
        } else if status
            .pointer("/state/waiting")
            .is_some_and(Value::is_object)
            && !waiting_reason.is_empty()
            && waiting_reason != "PodInitializing"
        {
            reason = format!("Init:{waiting_reason}");
        } else {
            reason = format!("Init:{i}/{}", init_specs.len());
        }
        initializing = true;
        break;
    }

    if !initializing || initialized(pod) {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        let mut error_reason = String::new();
        for status in array_at(pod, "/status/containerStatuses").iter().rev() {
            restarts += restart_count(status);
            if let Some(finished) = last_terminated(status) {
                last_restart = later(last_restart, finished);
            }
            let waiting_reason = str_at(status, "/state/waiting/reason");
            let terminated = status
                .pointer("/state/terminated")
                .filter(|t| t.is_object());
            if status
                .pointer("/state/waiting")
                .is_some_and(Value::is_object)
                && !waiting_reason.is_empty()
            {
                reason = waiting_reason.to_string();
            } else if let Some(t) = terminated {
                reason = terminated_reason(t, "");
                if t.get("exitCode").and_then(Value::as_i64).unwrap_or(0) != 0 {
                    error_reason = reason.clone();
                }
            } else if status.get("ready").and_then(Value::as_bool) == Some(true)
                && status
                    .pointer("/state/running")
                    .is_some_and(Value::is_object)
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" {
            let has_ready_condition = array_at(pod, "/status/conditions")
                .iter()
                .any(|c| str_at(c, "/type") == "Ready" && str_at(c, "/status") == "True");
            if has_running && has_ready_condition {
                reason = "Running".into();
            } else if !error_reason.is_empty() {
                reason = error_reason;
            } else if has_running {
                reason = "NotReady".into();
            }
        }
    }

    let deleting = pod
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null());
    if deleting && status_reason == "NodeLost" {
        reason = "Unknown".into();
    } else if deleting && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".into();
    }

    let restarts_cell = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", since(Some(t))),
        _ => restarts.to_string(),
    };
    let or_none = |s: &str| {
        if s.is_empty() {
            "<none>".to_string()
        } else {
            s.to_string()
        }
    };
    let pod_ip = array_at(pod, "/status/podIPs")
        .first()
        .map_or("", |ip| str_at(ip, "/ip"));
    let gates = array_at(pod, "/spec/readinessGates");
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let conditions = array_at(pod, "/status/conditions");
        let met = gates
            .iter()
            .filter(|g| {
                let kind = str_at(g, "/conditionType");
                conditions
                    .iter()
                    .find(|c| str_at(c, "/type") == kind)
                    .is_some_and(|c| str_at(c, "/status") == "True")
            })
            .count();
        format!("{met}/{}", gates.len())
    };
    let cells = vec![
        name_cell(pod),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts_cell),
        age_cell(pod),
        json!(or_none(pod_ip)),
        json!(or_none(str_at(pod, "/spec/nodeName"))),
        json!(or_none(str_at(pod, "/status/nominatedNodeName"))),
        json!(readiness_gates),
    ];
    (cells, conditions)
}

/// `printNode`.
fn node_cells(node: &Value) -> Vec<Value> {
    let mut status: Vec<String> = Vec::new();
    // Only the Ready condition is shown (`NodeAllConditions`).
    if let Some(ready) = array_at(node, "/status/conditions")
        .iter()
        .rev()
        .find(|c| str_at(c, "/type") == "Ready")
    {
        status.push(if str_at(ready, "/status") == "True" {
            "Ready".into()
        } else {
            "NotReady".into()
        });
    }
    if status.is_empty() {
        status.push("Unknown".into());
    }
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled".into());
    }
    let mut roles = std::collections::BTreeSet::new();
    if let Some(labels) = node.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let v = v.as_str().unwrap_or("");
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.insert(role.to_string());
                }
            } else if k == "kubernetes.io/role" && !v.is_empty() {
                roles.insert(v.to_string());
            }
        }
    }
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    };
    let address = |kind: &str| {
        array_at(node, "/status/addresses")
            .iter()
            .find(|a| str_at(a, "/type") == kind)
            .map_or("<none>", |a| str_at(a, "/address"))
            .to_string()
    };
    let info = |field: &str| str_at(node, &format!("/status/nodeInfo/{field}"));
    let or_unknown = |s: &str| {
        if s.is_empty() {
            "<unknown>".to_string()
        } else {
            s.to_string()
        }
    };
    let mut kernel = or_unknown(info("kernelVersion"));
    if !info("architecture").is_empty() {
        kernel = format!("{kernel} ({})", info("architecture"));
    }
    vec![
        name_cell(node),
        json!(status.join(",")),
        json!(roles),
        age_cell(node),
        json!(info("kubeletVersion")),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(or_unknown(info("osImage"))),
        json!(kernel),
        json!(or_unknown(info("containerRuntimeVersion"))),
    ]
}

/// `PartialObjectMetadata` of `object`.
pub fn partial_metadata(object: &Value, version: &str) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A Table with `rows` and list metadata `meta`.
pub fn table(
    spec: &ResourceSpec,
    version: &str,
    meta: Map<String, Value>,
    rows: Vec<Value>,
) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": meta,
        "columnDefinitions": columns(spec),
        "rows": rows,
    })
}

/// `duration.HumanDuration` from `k8s.io/apimachinery`, on whole seconds.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{d}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(human_duration(3), "3s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(400 * 86400), "400d");
    }

    #[test]
    fn configmap_rows() {
        let spec = ResourceSpec::new("", "v1", "configmaps", "ConfigMap", true);
        let cm = json!({"metadata": {"name": "cm-0", "creationTimestamp": crate::object::now_rfc3339()}, "data": {"k": "0"}});
        let r = row(&spec, &cm, "", "v1");
        assert_eq!(r["cells"][0], "cm-0");
        assert_eq!(r["cells"][1], 1);
        assert_eq!(r["object"]["kind"], "PartialObjectMetadata");
        let names: Vec<_> = columns(&spec).iter().map(|c| c["name"].clone()).collect();
        assert_eq!(names, ["Name", "Data", "Age"]);
    }
}
