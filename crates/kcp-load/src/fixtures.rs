//! Realistic object JSON for the benches and the load tool, shaped like the
//! pods and config maps of the kube-apiserver v1.36 recording
//! (`tests/fixtures/real-apiserver-v1.36.json`): a pod is about 4.6 KB, with
//! `managedFields`, a projected service-account volume, tolerations and
//! container statuses, as a real scheduled pod.
//!
//! Shared with the proxy's benches (`benches/` at the workspace root)
//! through `#[path]`, so it depends on nothing but `std`.
#![allow(dead_code)]

/// A pod as kube-apiserver serves it, `@X@` placeholders filled by [`pod`].
const POD: &str = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"@NAME@","generateName":"@APP@-7d9f8b6c5d-","namespace":"@NS@","uid":"@UID@","resourceVersion":"@RV@","generation":1,"creationTimestamp":"2026-11-21T11:55:21Z","labels":{"app":"@APP@","app.kubernetes.io/name":"@APP@","pod-template-hash":"7d9f8b6c5d","tier":"@TIER@"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"@APP@-7d9f8b6c5d","uid":"6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d","controller":true,"blockOwnerDeletion":true}],"managedFields":[{"manager":"kubelet","operation":"Update","apiVersion":"v1","time":"2026-11-21T11:55:21Z","fieldsType":"FieldsV1","fieldsV1":{"f:status":{"f:conditions":{".":{},"k:{\"type\":\"ContainersReady\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:observedGeneration":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Initialized\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:observedGeneration":{},"f:status":{},"f:type":{}},"k:{\"type\":\"PodReadyToStartContainers\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:observedGeneration":{},"f:status":{},"f:type":{}},"k:{\"type\":\"PodScheduled\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:observedGeneration":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Ready\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:observedGeneration":{},"f:status":{},"f:type":{}}},"f:containerStatuses":{},"f:hostIP":{},"f:hostIPs":{},"f:observedGeneration":{},"f:phase":{},"f:podIP":{},"f:podIPs":{".":{},"k:{\"ip\":\"@IP@\"}":{".":{},"f:ip":{}}},"f:startTime":{}}},"subresource":"status"},{"manager":"kube-controller-manager","operation":"Update","apiVersion":"v1","time":"2026-11-21T11:55:21Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:app.kubernetes.io/name":{},"f:pod-template-hash":{},"f:tier":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:ports":{},"f:resources":{},"f:terminationMessagePath":{},"f:terminationMessagePolicy":{}}},"f:dnsPolicy":{},"f:enableServiceLinks":{},"f:restartPolicy":{},"f:schedulerName":{},"f:securityContext":{},"f:terminationGracePeriodSeconds":{}}}}]},"spec":{"volumes":[{"name":"kube-api-access-mrlgc","projected":{"sources":[{"serviceAccountToken":{"expirationSeconds":3607,"path":"token"}},{"configMap":{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}},{"downwardAPI":{"items":[{"path":"namespace","fieldRef":{"apiVersion":"v1","fieldPath":"metadata.namespace"}}]}}],"defaultMode":420}}],"containers":[{"name":"main","image":"registry.k8s.io/e2e-test-images/agnhost:2.53","ports":[{"containerPort":8080,"protocol":"TCP"}],"resources":{"requests":{"cpu":"100m","memory":"128Mi"}},"volumeMounts":[{"name":"kube-api-access-mrlgc","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}],"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent"}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","serviceAccount":"default","nodeName":"@NODE@","securityContext":{},"schedulerName":"default-scheduler","tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300},{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}],"priority":0,"enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"},"status":{"observedGeneration":1,"phase":"Running","conditions":[{"type":"PodReadyToStartContainers","observedGeneration":1,"status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-21T11:55:23Z"},{"type":"Initialized","observedGeneration":1,"status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-21T11:55:21Z"},{"type":"Ready","observedGeneration":1,"status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-21T11:55:24Z"},{"type":"ContainersReady","observedGeneration":1,"status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-21T11:55:24Z"},{"type":"PodScheduled","observedGeneration":1,"status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-21T11:55:21Z"}],"hostIP":"192.0.2.2","hostIPs":[{"ip":"192.0.2.2"}],"podIP":"@IP@","podIPs":[{"ip":"@IP@"}],"startTime":"2026-11-21T11:55:21Z","containerStatuses":[{"name":"main","state":{"running":{"startedAt":"2026-11-21T11:55:23Z"}},"lastState":{},"ready":true,"restartCount":0,"image":"registry.k8s.io/e2e-test-images/agnhost:2.53","imageID":"registry.k8s.io/e2e-test-images/agnhost@sha256:99c6b4bb4a1e1df3f0b3752168c89358794d02258ebebc26bf21c29399011a85","containerID":"containerd://4f9d0c6e3b1a2d5e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6","started":true,"volumeMounts":[{"name":"kube-api-access-mrlgc","mountPath":"/var/run/secrets/kubernetes.io/serviceaccount","readOnly":true,"recursiveReadOnly":"Disabled"}]}],"qosClass":"Burstable"}}"#;

/// A small config map, like the recording's.
const CONFIG_MAP: &str = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"@NAME@","namespace":"@NS@","uid":"@UID@","resourceVersion":"@RV@","creationTimestamp":"2026-11-21T11:55:21Z","labels":{"app":"@APP@"}},"data":{"k":"v","index":"@INDEX@"}}"#;

/// Pods are spread over this many `app` label values (`web-0`..`web-9`), so
/// `app=web-3` selects a tenth of them.
pub const APPS: usize = 10;

/// A deterministic UUID-shaped string for object `i`.
pub fn uid(i: usize) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", i as u32, i)
}

/// The `app` label of object `i`.
pub fn app(i: usize) -> String {
    format!("web-{}", i % APPS)
}

/// Pod `i` in `namespace`, scheduled on `node`, at resourceVersion `rv`
/// (about 4.6 KB).
pub fn pod(i: usize, namespace: &str, node: &str, rv: u64) -> String {
    let ip = format!("10.{}.{}.{}", (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff);
    POD.replace("@NAME@", &format!("{}-7d9f8b6c5d-{i:06}", app(i)))
        .replace("@APP@", &app(i))
        .replace("@TIER@", if i % 2 == 0 { "frontend" } else { "backend" })
        .replace("@NS@", namespace)
        .replace("@UID@", &uid(i))
        .replace("@RV@", &rv.to_string())
        .replace("@NODE@", node)
        .replace("@IP@", &ip)
}

/// Config map `i` in `namespace` at resourceVersion `rv` (about 250 B).
pub fn config_map(i: usize, namespace: &str, rv: u64) -> String {
    CONFIG_MAP
        .replace("@NAME@", &format!("cm-{i:06}"))
        .replace("@APP@", &app(i))
        .replace("@NS@", namespace)
        .replace("@UID@", &uid(i))
        .replace("@RV@", &rv.to_string())
        .replace("@INDEX@", &i.to_string())
}

/// The name of node `i`.
pub fn node(i: usize) -> String {
    format!("node-{i:05}")
}

/// Node `i` as a kubeadm worker's kubelet reports it: labels, annotations,
/// addresses, capacity, the five conditions, daemon endpoints, node info
/// and `images` (kubelet reports up to 50; `images` of them here, each
/// with its digest and a tag), plus `managedFields` (about 3.5 KB with no
/// images, 200 B more per image).
pub fn node_object(i: usize, images: usize, rv: u64) -> String {
    let name = node(i);
    let ip = format!("192.168.{}.{}", (i >> 8) & 0xff, i & 0xff);
    let condition = |t: &str, status: &str, reason: &str, message: &str| {
        format!(
            r#"{{"type":"{t}","status":"{status}","lastHeartbeatTime":"2026-11-21T11:55:21Z","lastTransitionTime":"2026-11-01T08:00:00Z","reason":"{reason}","message":"{message}"}}"#
        )
    };
    let conditions = [
        condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        condition(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        ),
        condition(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        condition(
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
        ),
    ]
    .join(",");
    let images = (0..images)
        .map(|k| {
            format!(
                r#"{{"names":["registry.example.com/team-{k}/service-{k}@sha256:{:064x}","registry.example.com/team-{k}/service-{k}:v1.{k}.0"],"sizeBytes":{}}}"#,
                k * 7919 + i,
                50_000_000 + k * 1_000_003
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    format!(
        r#"{{"kind":"Node","apiVersion":"v1","metadata":{{"name":"{name}","uid":"{uid}","resourceVersion":"{rv}","creationTimestamp":"2026-11-01T08:00:00Z","labels":{{"beta.kubernetes.io/arch":"amd64","beta.kubernetes.io/os":"linux","kubernetes.io/arch":"amd64","kubernetes.io/hostname":"{name}","kubernetes.io/os":"linux","node.kubernetes.io/instance-type":"m5.xlarge","topology.kubernetes.io/region":"eu-west-1","topology.kubernetes.io/zone":"eu-west-1{zone}","kubecacheproxy.io/proxy":"daemonset"}},"annotations":{{"kubeadm.alpha.kubernetes.io/cri-socket":"unix:///var/run/containerd/containerd.sock","node.alpha.kubernetes.io/ttl":"0","volumes.kubernetes.io/controller-managed-attach-detach":"true"}},"managedFields":[{{"manager":"kubelet","operation":"Update","apiVersion":"v1","time":"2026-11-21T11:55:21Z","fieldsType":"FieldsV1","fieldsV1":{{"f:status":{{"f:allocatable":{{"f:cpu":{{}},"f:ephemeral-storage":{{}},"f:memory":{{}},"f:pods":{{}}}},"f:capacity":{{"f:cpu":{{}},"f:ephemeral-storage":{{}},"f:memory":{{}},"f:pods":{{}}}},"f:conditions":{{"k:{{\"type\":\"DiskPressure\"}}":{{"f:lastHeartbeatTime":{{}}}},"k:{{\"type\":\"MemoryPressure\"}}":{{"f:lastHeartbeatTime":{{}}}},"k:{{\"type\":\"PIDPressure\"}}":{{"f:lastHeartbeatTime":{{}}}},"k:{{\"type\":\"Ready\"}}":{{"f:lastHeartbeatTime":{{}}}}}},"f:images":{{}},"f:nodeInfo":{{"f:bootID":{{}}}}}}}},"subresource":"status"}}]}},"spec":{{"podCIDR":"10.244.{cidr}.0/24","podCIDRs":["10.244.{cidr}.0/24"],"providerID":"aws:///eu-west-1a/i-0{i:016x}"}},"status":{{"capacity":{{"cpu":"4","ephemeral-storage":"101430960Ki","hugepages-1Gi":"0","hugepages-2Mi":"0","memory":"16069620Ki","pods":"110"}},"allocatable":{{"cpu":"4","ephemeral-storage":"93478772582","hugepages-1Gi":"0","hugepages-2Mi":"0","memory":"15967220Ki","pods":"110"}},"conditions":[{conditions}],"addresses":[{{"type":"InternalIP","address":"{ip}"}},{{"type":"Hostname","address":"{name}"}}],"daemonEndpoints":{{"kubeletEndpoint":{{"Port":10250}}}},"nodeInfo":{{"machineID":"{uid}","systemUUID":"{uid}","bootID":"{uid}","kernelVersion":"6.8.0-1015-aws","osImage":"Ubuntu 24.04.1 LTS","containerRuntimeVersion":"containerd://2.0.1","kubeletVersion":"v1.36.2","kubeProxyVersion":"","operatingSystem":"linux","architecture":"amd64"}},"images":[{images}]}}}}"#,
        uid = uid(i),
        zone = ["a", "b", "c"][i % 3],
        cidr = i % 256,
    )
}

/// EndpointSlice `i` of a service with `endpoints` ready pods on one port,
/// as the EndpointSlice controller writes it (about 400 B plus 250 B per
/// endpoint).
pub fn endpoint_slice(i: usize, namespace: &str, endpoints: usize, rv: u64) -> String {
    let service = format!("svc-{i:05}");
    let eps = (0..endpoints)
        .map(|k| {
            let n = i * endpoints + k;
            format!(
                r#"{{"addresses":["10.{}.{}.{}"],"conditions":{{"ready":true,"serving":true,"terminating":false}},"nodeName":"{}","targetRef":{{"kind":"Pod","namespace":"{namespace}","name":"{service}-7d9f8b6c5d-{k:05}","uid":"{}"}},"zone":"eu-west-1a"}}"#,
                (n >> 16) & 0xff,
                (n >> 8) & 0xff,
                n & 0xff,
                node(n % 100),
                uid(n)
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    format!(
        r#"{{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{{"name":"{service}-x7k2p","generateName":"{service}-","namespace":"{namespace}","uid":"{uid}","resourceVersion":"{rv}","generation":3,"creationTimestamp":"2026-11-21T11:55:21Z","labels":{{"endpointslice.kubernetes.io/managed-by":"endpointslice-controller.k8s.io","kubernetes.io/service-name":"{service}"}},"annotations":{{"endpoints.kubernetes.io/last-change-trigger-time":"2026-11-21T11:55:24Z"}},"ownerReferences":[{{"apiVersion":"v1","kind":"Service","name":"{service}","uid":"{uid}","controller":true,"blockOwnerDeletion":true}}]}},"addressType":"IPv4","endpoints":[{eps}],"ports":[{{"name":"http","protocol":"TCP","port":8080}}]}}"#,
        uid = uid(i),
    )
}
