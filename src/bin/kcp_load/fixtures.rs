//! Realistic object JSON for the benches and the load tool, shaped like the
//! pods and config maps of the kube-apiserver v1.36 recording
//! (`tests/fixtures/real-apiserver-v1.36.json`): a pod is about 4.6 KB, with
//! `managedFields`, a projected service-account volume, tolerations and
//! container statuses, as a real scheduled pod.
//!
//! Shared with the benches through `#[path]`, so it depends on nothing but
//! `std`.
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
