//! The demo cluster's objects, shaped as a real cluster's are: Nodes with
//! the status a kubelet reports (capacity, allocatable, conditions,
//! addresses, nodeInfo), Pods with the status a kubelet reports
//! (conditions, IPs, containerStatuses) and resource requests, so that
//! `kubectl get pods` shows `1/1 Running` and `kubectl describe node` sane
//! allocations.

use serde_json::{Value, json};

use apimachinery::resource::Gvr;

/// `group`/`version`/`resource`.
pub fn gvr(group: &str, version: &str, resource: &str) -> Gvr {
    Gvr {
        group: group.into(),
        version: version.into(),
        resource: resource.into(),
    }
}

/// The demo's nodes: `node-1` (control-plane), `node-2`, `node-3`
/// (cordoned).
pub const NODES: usize = 3;
/// Each node's allocatable CPU (cores) and memory.
const NODE_CPU: &str = "4";
const NODE_MEMORY_KI: u64 = 16 * 1024 * 1024;
/// The kubelet version the demo nodes report.
pub const KUBELET_VERSION: &str = "v1.36.2";
/// The pod that crashes and restarts (`churn`).
pub const FLAKY: &str = "flaky-0";

/// The name of the `n`th node (from 1).
pub fn node_name(n: usize) -> String {
    format!("node-{n}")
}

fn node_ip(n: usize) -> String {
    format!("10.0.0.{}", 10 + n)
}

/// A short deterministic hex string (container IDs, machine IDs).
fn hex_id(seed: &str, len: usize) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(seed.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex.chars().cycle().take(len).collect()
}

/// The `n`th node (from 1), as its kubelet would have registered it.
pub fn node(n: usize, now: &str) -> Value {
    let name = node_name(n);
    let mut labels = json!({
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
    });
    let mut spec =
        json!({"podCIDR": format!("10.244.{n}.0/24"), "podCIDRs": [format!("10.244.{n}.0/24")]});
    if n == 1 {
        labels["node-role.kubernetes.io/control-plane"] = json!("");
        spec["taints"] =
            json!([{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]);
    }
    if n == NODES {
        // Cordoned: `kubectl get nodes` shows Ready,SchedulingDisabled.
        spec["unschedulable"] = json!(true);
        spec["taints"] = json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": now}]);
    }
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "lastHeartbeatTime": now, "lastTransitionTime": now,
               "reason": reason, "message": message})
    };
    let capacity = json!({
        "cpu": NODE_CPU,
        "ephemeral-storage": "102626232Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": format!("{}Ki", NODE_MEMORY_KI + 102_400),
        "pods": "110",
    });
    let mut allocatable = capacity.clone();
    allocatable["memory"] = json!(format!("{NODE_MEMORY_KI}Ki"));
    allocatable["ephemeral-storage"] = json!("94580335255");
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": node_ip(n)},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": hex_id(&format!("machine-{name}"), 32),
                "systemUUID": uuid_like(&format!("system-{name}")),
                "bootID": uuid_like(&format!("boot-{name}")),
                "kernelVersion": "6.12.38-demo",
                "osImage": "Debian GNU/Linux 13 (trixie)",
                "containerRuntimeVersion": "containerd://2.1.4",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320_368}],
        },
    })
}

fn uuid_like(seed: &str) -> String {
    let h = hex_id(seed, 32);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// What a demo pod's single container is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    /// Created, its image not started yet (`ContainerCreating`).
    Creating,
    /// Running and ready, after `restarts` restarts (the last one
    /// finished at `last_finished`).
    Running {
        restarts: u32,
        last_finished: Option<String>,
    },
    /// Exited with code 1 and waiting to be restarted.
    CrashLoopBackOff {
        restarts: u32,
        last_finished: String,
    },
}

/// A demo pod: one container `main` with requests and limits, on `node`,
/// with the status its kubelet would report for `state`.
pub fn pod(
    namespace: &str,
    name: &str,
    app: &str,
    node: usize,
    ip_suffix: usize,
    state: &ContainerState,
    now: &str,
) -> Value {
    let image = "registry.k8s.io/pause:3.10";
    let ready = matches!(state, ContainerState::Running { .. });
    let started_at = now;
    let condition = |kind: &str, status: bool| json!({"type": kind, "status": if status { "True" } else { "False" }, "lastProbeTime": null, "lastTransitionTime": now});
    let not_ready = |c: Value| {
        let mut c = c;
        if !ready {
            c["reason"] = json!("ContainersNotReady");
            c["message"] = json!("containers with unready status: [main]");
        }
        c
    };
    let (container_state, last_state, restarts) = match state {
        ContainerState::Creating => (
            json!({"waiting": {"reason": "ContainerCreating"}}),
            json!({}),
            0,
        ),
        ContainerState::Running {
            restarts,
            last_finished,
        } => (
            json!({"running": {"startedAt": started_at}}),
            last_finished.as_ref().map_or_else(
                || json!({}),
                |f| json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": f, "finishedAt": f, "containerID": format!("containerd://{}", hex_id(&format!("{namespace}/{name}/{restarts}"), 64))}}),
            ),
            *restarts,
        ),
        ContainerState::CrashLoopBackOff {
            restarts,
            last_finished,
        } => (
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off 10s restarting failed container=main pod={name}_{namespace}({})", uuid_like(name))}}),
            json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": last_finished, "finishedAt": last_finished, "containerID": format!("containerd://{}", hex_id(&format!("{namespace}/{name}/{restarts}"), 64))}}),
            *restarts,
        ),
    };
    let pod_ip = format!("10.244.{node}.{ip_suffix}");
    let host_ip = node_ip(node);
    let mut status = json!({
        "phase": if *state == ContainerState::Creating { "Pending" } else { "Running" },
        "conditions": [
            condition("PodReadyToStartContainers", *state != ContainerState::Creating),
            condition("Initialized", true),
            not_ready(condition("Ready", ready)),
            not_ready(condition("ContainersReady", ready)),
            condition("PodScheduled", true),
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": now,
        "containerStatuses": [{
            "name": "main",
            "state": container_state,
            "lastState": last_state,
            "ready": ready,
            "restartCount": restarts,
            "image": image,
            "imageID": format!("{image}@sha256:{}", hex_id("pause-3.10", 64)),
            "started": ready,
        }],
        "qosClass": "Burstable",
    });
    if *state != ContainerState::Creating {
        status["podIP"] = json!(pod_ip);
        status["podIPs"] = json!([{"ip": pod_ip}]);
        status["containerStatuses"][0]["containerID"] = json!(format!(
            "containerd://{}",
            hex_id(&format!("{namespace}/{name}/{restarts}/run"), 64)
        ));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
        "spec": {
            "nodeName": node_name(node),
            "containers": [{
                "name": "main",
                "image": image,
                "resources": {
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"cpu": "500m", "memory": "128Mi"},
                },
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": status,
    })
}

/// The pods present from the start: twelve running `app-<i>` (three in
/// kube-system) and `flaky-0`, which the churn restarts.
pub fn initial_pods(now: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for i in 0..12 {
        let ns = if i < 3 { "kube-system" } else { "demo" };
        let app = if i % 2 == 0 { "web" } else { "db" };
        out.push(pod(
            ns,
            &format!("app-{i}"),
            app,
            i % NODES + 1,
            10 + i,
            &ContainerState::Running {
                restarts: 0,
                last_finished: None,
            },
            now,
        ));
    }
    out.push(pod(
        "demo",
        FLAKY,
        "flaky",
        2,
        99,
        &ContainerState::Running {
            restarts: 0,
            last_finished: None,
        },
        now,
    ));
    out
}

/// Sample objects: namespaces, nodes, pods spread over the nodes, services, endpoint slices, config maps, a runtime class and a
/// CSI driver.
pub fn sample_objects(now: &str) -> Vec<(Gvr, Value)> {
    let mut out = Vec::new();
    for ns in ["default", "kube-system", "demo"] {
        out.push((gvr("", "v1", "namespaces"), json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})));
    }
    for n in 1..=NODES {
        out.push((gvr("", "v1", "nodes"), node(n, now)));
    }
    for p in initial_pods(now) {
        out.push((gvr("", "v1", "pods"), p));
    }
    for name in ["web", "db"] {
        out.push((gvr("", "v1", "services"), json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "demo"}, "spec": {"selector": {"app": name}, "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}], "type": "ClusterIP", "clusterIP": if name == "web" { "10.96.0.20" } else { "10.96.0.21" }}})));
        out.push((gvr("discovery.k8s.io", "v1", "endpointslices"), json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": format!("{name}-1"), "namespace": "demo", "labels": {"kubernetes.io/service-name": name}}, "addressType": "IPv4", "endpoints": [], "ports": [{"port": 80, "protocol": "TCP"}]})));
    }
    for i in 0..10 {
        out.push((gvr("", "v1", "configmaps"), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("settings-{i}"), "namespace": "demo", "labels": {"tier": if i < 5 { "frontend" } else { "backend" }}}, "data": {"index": i.to_string()}})));
    }
    out.push((gvr("", "v1", "configmaps"), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "heartbeat", "namespace": "demo"}, "data": {"tick": "0"}})));
    out.push((gvr("node.k8s.io", "v1", "runtimeclasses"), json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "runc"}, "handler": "runc"})));
    out.push((gvr("storage.k8s.io", "v1", "csidrivers"), json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "hostpath.csi.k8s.io"}, "spec": {}})));
    out
}
