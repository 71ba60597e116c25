//! Against a real kube-apiserver v1.36 (`kube-testenv`): protobuf and
//! metadata-only (`PartialObjectMetadata[List]`, `meta.k8s.io/v1` and
//! `v1beta1`, JSON and protobuf) lists, gets and watches of every resource
//! the default configuration caches, sent to the apiserver directly and
//! through the proxy, get the same answer — byte for byte, except a list's
//! and a bookmark's resourceVersion (`support::differential` says why) —
//! and are answered from the cache. Protobuf lists are also decoded on
//! both sides into the same typed values (`k8s-pb`). Tables pass
//! through: the same answer as the apiserver's, counted as passed through.
//!
//! Skipped, with one line, where no control plane is available.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use apimachinery::protobuf::{fields, find_field};
use http::Method;
use prost::Message as _;
use serde_json::{Value, json};
use support::client::{Client, Resp, WatchStream};
use support::differential::{assert_same, assert_same_events, collect};
use support::real::{RealEnv, eventually, metric_sum};

const PB: &str = "application/vnd.kubernetes.protobuf";
/// What kubelet and kube-proxy send (client-go's protobuf content type).
const KUBELET: &str = "application/vnd.kubernetes.protobuf,application/json";
const TABLE_V1: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// The `Accept` headers of each representation, for lists and for gets
/// and watches.
fn representations() -> Vec<(String, String)> {
    let mut out = vec![
        (PB.to_string(), PB.to_string()),
        (KUBELET.into(), KUBELET.into()),
    ];
    for v in ["v1", "v1beta1"] {
        for enc in [PB, "application/json"] {
            out.push((
                format!("{enc};as=PartialObjectMetadataList;g=meta.k8s.io;v={v}"),
                format!("{enc};as=PartialObjectMetadata;g=meta.k8s.io;v={v}"),
            ));
        }
    }
    // client-go's metadata client.
    out.push((
        format!("{PB};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"),
        format!("{PB};as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"),
    ));
    out
}

/// The type meta and `raw` of an envelope.
fn envelope(body: &[u8]) -> (&[u8], &[u8]) {
    assert!(body.starts_with(b"k8s\0"), "not protobuf: {body:?}");
    let e = &body[4..];
    let f = fields(e).expect("envelope");
    assert_eq!(
        f.iter().map(|(n, _, _)| *n).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "envelope fields"
    );
    (&e[f[0].2.clone()], &e[f[1].2.clone()])
}

/// A protobuf list as comparable parts: the type meta, the list metadata's
/// fields without `resourceVersion` (checked to be a number), and the
/// items' bytes in order.
/// A list's type meta, metadata fields without the RV, and items.
type ListParts = (Vec<u8>, Vec<(u32, Vec<u8>)>, Vec<Vec<u8>>);

fn list_parts(body: &[u8], what: &str) -> ListParts {
    let (type_meta, raw) = envelope(body);
    let kind = &type_meta[find_field(type_meta, 2).unwrap()];
    // meta.k8s.io/v1beta1's PartialObjectMetadataList: items 1, metadata 2.
    let v1beta1 =
        type_meta.windows(7).any(|w| w == b"v1beta1") && kind == b"PartialObjectMetadataList";
    let (meta_n, items_n) = if v1beta1 { (2, 1) } else { (1, 2) };
    let mut meta = Vec::new();
    let mut items = Vec::new();
    let mut order = Vec::new();
    for (n, _, r) in fields(raw).unwrap() {
        order.push(n);
        if n == meta_n {
            for (mn, _, mr) in fields(&raw[r.clone()]).unwrap() {
                let v = raw[r.clone()][mr].to_vec();
                if mn == 2 {
                    std::str::from_utf8(&v)
                        .unwrap()
                        .parse::<u64>()
                        .unwrap_or_else(|_| panic!("{what}: list RV"));
                } else {
                    meta.push((mn, v));
                }
            }
        } else {
            assert_eq!(n, items_n, "{what}: list field");
            items.push(raw[r].to_vec());
        }
    }
    // The fields are written in field-number order.
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "{what}: field order");
    (type_meta.to_vec(), meta, items)
}

/// Compares two answers: JSON as `assert_same` does; protobuf byte for
/// byte, lists without their resourceVersion.
fn assert_same_any(d: &Resp, p: &Resp, what: &str) {
    assert_eq!(d.status, p.status, "{what}: status; proxy {:?}", p.text());
    for h in ["content-type", "cache-control"] {
        assert_eq!(d.header(h), p.header(h), "{what}: header {h}");
    }
    if d.header("content-type") != Some(PB) {
        // Byte for byte too (indentation of errors included), unless a list.
        let json = d.json();
        if !json["kind"].as_str().unwrap_or("").ends_with("List") {
            return assert_eq!(d.text(), p.text(), "{what}: body");
        }
        return assert_same(d, p, what);
    }
    let (type_meta, _) = envelope(&d.body);
    if type_meta[find_field(type_meta, 2).unwrap()].ends_with(b"List") {
        assert_eq!(
            list_parts(&d.body, what),
            list_parts(&p.body, what),
            "{what}: list"
        );
    } else {
        assert_eq!(d.body, p.body, "{what}: body");
    }
}

async fn same(direct: &Client, proxy: &Client, path: &str, accept: &str) -> Resp {
    let h = [("accept", accept)];
    let (d, p) = tokio::join!(
        direct.send(Method::GET, path, &h, None),
        proxy.send(Method::GET, path, &h, None)
    );
    assert_same_any(&d, &p, &format!("{path} [{accept}]"));
    p
}

async fn served(env: &RealEnv, representation: &str) -> f64 {
    metric_sum(
        &env.proxy_metrics().await,
        "kube_cache_proxy_cache_served_total",
        &[("representation", representation)],
    )
}

/// The fixtures: one or more objects of every default cached resource,
/// labelled `test=pb-<name>`.
pub(crate) async fn fixtures(env: &RealEnv, ns: &str, label: &str, node: &str) {
    let l = json!({"test": label});
    env.create(
        &format!("/api/v1/namespaces/{ns}/pods"),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p-0", "labels": {"test": label, "b": "2", "a": "1"}, "annotations": {"note": "<&>"}},
               "spec": {"nodeName": node, "automountServiceAccountToken": false,
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                        "ports": [{"containerPort": 80, "name": "http"}],
                                        "env": [{"name": "E", "value": ""}],
                                        "resources": {"limits": {"cpu": "100m", "memory": "1Gi"}, "requests": {"cpu": "0.05"}},
                                        "readinessProbe": {"httpGet": {"port": "http", "path": "/"}},
                                        "livenessProbe": {"tcpSocket": {"port": 80}, "initialDelaySeconds": 0},
                                        "securityContext": {"runAsNonRoot": false, "readOnlyRootFilesystem": true}}],
                        "volumes": [{"name": "v", "configMap": {"name": "cm", "optional": true}}, {"name": "e", "emptyDir": {"sizeLimit": "1Mi"}}],
                        "tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 5, "effect": "NoExecute"}],
                        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "x", "operator": "In", "values": ["a", "b"]}]}]}}}}}),
    )
    .await;
    env.create(
        &format!("/api/v1/namespaces/{ns}/pods"),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p-1", "labels": l},
               "spec": {"nodeName": node, "automountServiceAccountToken": false,
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}),
    )
    .await;
    env.create(
        "/api/v1/nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": l},
               "spec": {"taints": [{"key": "t", "value": "v", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24"]},
               "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}, "allocatable": {"cpu": "3900m", "memory": "7Gi"},
                          "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                          "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                          "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "k", "osImage": "o", "containerRuntimeVersion": "c", "kubeletVersion": "v1.36.2", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}}),
    )
    .await;
    env.create(
        &format!("/api/v1/namespaces/{ns}/services"),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "labels": l},
               "spec": {"selector": {"app": "x"}, "ports": [{"name": "a", "port": 80, "targetPort": "http"}, {"name": "b", "port": 81, "targetPort": 8081, "protocol": "UDP"}]}}),
    )
    .await;
    env.create(
        &format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "s-1", "labels": {"test": label, "kubernetes.io/service-name": "s"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["10.0.0.5"], "conditions": {"ready": true, "serving": true, "terminating": false}, "nodeName": node,
                              "targetRef": {"kind": "Pod", "namespace": ns, "name": "p-0"}}],
               "ports": [{"name": "a", "port": 8080, "protocol": "TCP"}]}),
    )
    .await;
    env.create(
        "/apis/node.k8s.io/v1/runtimeclasses",
        json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": format!("{label}-rc"), "labels": l},
               "handler": "runc", "overhead": {"podFixed": {"cpu": "10m", "memory": "5Mi"}},
               "scheduling": {"nodeSelector": {"a": "b"}, "tolerations": [{"key": "k", "operator": "Equal", "value": "v"}]}}),
    )
    .await;
    env.create(
        "/apis/storage.k8s.io/v1/csidrivers",
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": format!("{label}.csi.example.com"), "labels": l},
               "spec": {"attachRequired": false, "podInfoOnMount": true, "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                        "tokenRequests": [{"audience": "a", "expirationSeconds": 3600}], "requiresRepublish": false}}),
    )
    .await;
    env.create(
        "/apis/storage.k8s.io/v1/csinodes",
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": node, "labels": l},
               "spec": {"drivers": [{"name": format!("{label}.csi.example.com"), "nodeID": "n", "topologyKeys": ["zone"], "allocatable": {"count": 5}}]}}),
    )
    .await;
}

/// The proxy binary as an older build would be, without `PodSpec.hostname`
/// in its protobuf schema, on `config` with the admin's credentials as
/// node `node`, once ready.
pub(crate) async fn older_proxy(
    cp: &'static kube_testenv::ControlPlane,
    config: &str,
    node: &str,
) -> support::binary::Binary {
    let admin_kubeconfig = cp.kubeconfig_text(&cp.url(), "admin", cp.admin());
    let proxy = support::binary::Binary::start_with_env(
        cp,
        config,
        |_| admin_kubeconfig,
        node,
        false,
        &[(
            "KUBE_CACHE_PROXY_TEST_HIDE_PROTOBUF_FIELDS",
            "k8s.io.api.core.v1.PodSpec.hostname",
        )],
    );
    eventually(Duration::from_secs(60), "the older proxy ready", || async {
        matches!(proxy.admin_get("/readyz").await, Some((200, _))).then_some(())
    })
    .await;
    proxy
}

/// Creates namespace `ns` with its `default` ServiceAccount (no
/// kube-controller-manager runs to make one), unless they exist.
pub(crate) async fn namespace_with_default_sa(direct: &Client, ns: &str) {
    for (path, body) in [
        (
            "/api/v1/namespaces".to_string(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        ),
        (
            format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        ),
    ] {
        let r = direct.post_json(&path, &body).await;
        assert!(r.status == 201 || r.status == 409, "{}", r.text());
    }
}

/// The collections and one object of each, as read in the tests.
pub(crate) fn collections(ns: &str, label: &str, node: &str) -> Vec<(String, String)> {
    let sel = format!("labelSelector=test%3D{label}");
    vec![
        (
            format!("/api/v1/namespaces/{ns}/pods?{sel}"),
            format!("/api/v1/namespaces/{ns}/pods/p-0"),
        ),
        (
            format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
            format!("/api/v1/namespaces/{ns}/pods/p-1"),
        ),
        (
            format!("/api/v1/nodes?{sel}"),
            format!("/api/v1/nodes/{node}"),
        ),
        (
            format!("/api/v1/namespaces/{ns}/services?{sel}"),
            format!("/api/v1/namespaces/{ns}/services/s"),
        ),
        (
            format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
            format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/s-1"),
        ),
        (
            format!("/api/v1/namespaces?fieldSelector=metadata.name%3D{ns}"),
            format!("/api/v1/namespaces/{ns}"),
        ),
        (
            format!("/apis/node.k8s.io/v1/runtimeclasses?{sel}"),
            format!("/apis/node.k8s.io/v1/runtimeclasses/{label}-rc"),
        ),
        (
            format!("/apis/storage.k8s.io/v1/csidrivers?{sel}"),
            format!("/apis/storage.k8s.io/v1/csidrivers/{label}.csi.example.com"),
        ),
        (
            format!("/apis/storage.k8s.io/v1/csinodes?{sel}"),
            format!("/apis/storage.k8s.io/v1/csinodes/{node}"),
        ),
        (
            "/apis/networking.k8s.io/v1/servicecidrs".to_string(),
            "/apis/networking.k8s.io/v1/servicecidrs/kubernetes".to_string(),
        ),
    ]
}

/// Waits until both the apiserver's and the proxy's caches have `rv` for
/// every collection.
pub(crate) async fn synced(direct: &Client, proxy: &Client, colls: &[(String, String)], rv: u64) {
    for c in [direct, proxy] {
        for (list, _) in colls {
            let sep = if list.contains('?') { '&' } else { '?' };
            let r = c.get(&format!("{list}{sep}resourceVersion={rv}")).await;
            assert_eq!(r.status, 200, "{list}: {}", r.text());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_gets_match_the_apiserver_in_every_representation() {
    let Some(env) = RealEnv::start().await else {
        return;
    };
    lists_and_gets_match(&env, "pb-reads", true).await;
}

/// With no protobuf encoding kept (`cache.protobufCacheMib: 0`), every
/// protobuf read encodes afresh, and answers the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_gets_match_with_no_protobuf_encoding_kept() {
    let Some(env) = RealEnv::start_with(|c| c.cache.protobuf_cache_mib = 0).await else {
        return;
    };
    lists_and_gets_match(&env, "pb-unkept", false).await;
}

/// Lists and gets of fixtures in namespace `name` through the proxy and
/// directly; `kept`: the proxy keeps protobuf encodings.
pub(crate) async fn lists_and_gets_match(env: &RealEnv, name: &str, kept: bool) {
    let ns = env.namespace(name).await;
    let (label, node) = (name, &*format!("{name}-node"));
    fixtures(env, &ns, label, node).await;
    let rv = env.current_rv().await;
    let admin = env.admin();
    let (direct, proxy) = (env.direct(admin.clone()), env.proxy(admin));
    let colls = collections(&ns, label, node);
    synced(&direct, &proxy, &colls, rv).await;
    let before = (
        served(env, "protobuf").await,
        served(env, "metadata_protobuf").await,
        served(env, "metadata_json").await,
    );

    // An empty list: a metadata-only one's items are `null`.
    let empty = format!("/api/v1/namespaces/{ns}/pods?labelSelector=test%3D{label}-none");
    for (list_accept, _) in representations() {
        for rv in ["0".to_string(), rv.to_string()] {
            let p = same(
                &direct,
                &proxy,
                &format!("{empty}&resourceVersion={rv}"),
                &list_accept,
            )
            .await;
            assert_eq!(p.status, 200, "{empty}: {}", p.text());
        }
    }
    for (list, get) in &colls {
        let sep = if list.contains('?') { '&' } else { '?' };
        for (list_accept, get_accept) in representations() {
            let p = same(
                &direct,
                &proxy,
                &format!("{list}{sep}resourceVersion=0"),
                &list_accept,
            )
            .await;
            assert_eq!(p.status, 200, "{list}: {}", p.text());
            same(
                &direct,
                &proxy,
                &format!("{list}{sep}resourceVersion={rv}"),
                &list_accept,
            )
            .await;
            same(
                &direct,
                &proxy,
                &format!("{list}{sep}resourceVersion=0&limit=1"),
                &list_accept,
            )
            .await;
            let p = same(
                &direct,
                &proxy,
                &format!("{get}?resourceVersion=0"),
                &get_accept,
            )
            .await;
            assert_eq!(p.status, 200, "{get}: {}", p.text());
            same(
                &direct,
                &proxy,
                &format!("{get}-missing?resourceVersion=0"),
                &get_accept,
            )
            .await;
        }
    }
    // Errors in each encoding: protobuf, JSON, and indented JSON when no
    // clause fits without a transformation.
    for (accept, _) in representations() {
        let pods = format!("/api/v1/namespaces/{ns}/pods");
        same(
            &direct,
            &proxy,
            &format!("{pods}?labelSelector=a+in"),
            &accept,
        )
        .await;
        same(
            &direct,
            &proxy,
            &format!("{pods}?resourceVersionMatch=Exact&resourceVersion=0"),
            &accept,
        )
        .await;
    }
    // Decoded on both sides, the protobuf lists are the same typed values.
    let pods = format!("/api/v1/namespaces/{ns}/pods?resourceVersion=0");
    let (d, p) = tokio::join!(
        direct.send(Method::GET, &pods, &[("accept", PB)], None),
        proxy.send(Method::GET, &pods, &[("accept", PB)], None)
    );
    let decode = |r: &Resp| {
        let mut list = k8s_pb::api::core::v1::PodList::decode(envelope(&r.body).1).unwrap();
        list.metadata.as_mut().unwrap().resource_version = None;
        list
    };
    let (dl, pl) = (decode(&d), decode(&p));
    assert_eq!(dl.items.len(), 2);
    assert_eq!(dl, pl, "decoded PodLists");
    let nodes = format!("/api/v1/nodes/{node}?resourceVersion=0");
    let (d, p) = tokio::join!(
        direct.send(Method::GET, &nodes, &[("accept", PB)], None),
        proxy.send(Method::GET, &nodes, &[("accept", PB)], None)
    );
    let node_of = |r: &Resp| k8s_pb::api::core::v1::Node::decode(envelope(&r.body).1).unwrap();
    assert_eq!(node_of(&d), node_of(&p));
    assert_eq!(node_of(&p).metadata.unwrap().name.as_deref(), Some(node));

    // Every representation was answered from the cache.
    let after = (
        served(env, "protobuf").await,
        served(env, "metadata_protobuf").await,
        served(env, "metadata_json").await,
    );
    assert!(
        after.0 - before.0 >= (colls.len() * 2 * 3) as f64,
        "protobuf reads from the cache: {before:?} -> {after:?}"
    );
    assert!(
        after.1 - before.1 >= (colls.len() * 3 * 2) as f64,
        "metadata protobuf: {before:?} -> {after:?}"
    );
    assert!(
        after.2 - before.2 >= (colls.len() * 2 * 2) as f64,
        "metadata JSON: {before:?} -> {after:?}"
    );
    let m = env.proxy_metrics().await;
    let held = metric_sum(
        &m,
        "kube_cache_proxy_cache_encoded_bytes",
        &[("resource", "pods"), ("encoding", "protobuf")],
    );
    if kept {
        assert!(held > 0.0);
    } else {
        assert_eq!(held, 0.0, "nothing kept once the reads are done");
    }
    assert_eq!(
        metric_sum(&m, "kube_cache_proxy_cache_encode_failures_total", &[]),
        0.0
    );
}

/// A protobuf watch frame: its type and object envelope.
fn event(frame: &[u8]) -> (String, Vec<u8>) {
    let e = &frame[4..];
    let t = String::from_utf8(e[find_field(e, 1).unwrap()].to_vec()).unwrap();
    let obj = &e[find_field(e, 2).unwrap()];
    (t, obj[find_field(obj, 1).unwrap()].to_vec())
}

/// Reads protobuf frames until `n` that are not plain bookmarks arrived.
async fn protobuf_events(w: &mut WatchStream, n: usize, what: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    while out.len() < n {
        let f = w
            .next_protobuf(Duration::from_secs(15))
            .await
            .unwrap_or_else(|| panic!("{what}: {} of {n} events: {out:?}", out.len()));
        let (t, obj) = event(&f);
        if t == "BOOKMARK" && !obj.windows(25).any(|w| w == b"k8s.io/initial-events-end") {
            continue;
        }
        out.push((t, obj));
    }
    out
}

/// A bookmark's object with its resourceVersion removed: the envelope's
/// type meta and the object decoded as `kind`, compared as typed values.
fn bookmark_shape(obj: &[u8], metadata: bool) -> String {
    let (tm, raw) = envelope(obj);
    if metadata {
        let mut m =
            k8s_pb::apimachinery::pkg::apis::meta::v1::PartialObjectMetadata::decode(raw).unwrap();
        m.metadata.as_mut().unwrap().resource_version = None;
        format!("{tm:?} {m:?}")
    } else {
        let mut p = k8s_pb::api::core::v1::Pod::decode(raw).unwrap();
        p.metadata.as_mut().unwrap().resource_version = None;
        format!("{tm:?} {p:?}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_event_sequences_match_in_every_representation() {
    let Some(env) = RealEnv::start().await else {
        return;
    };
    watch_event_sequences_match(&env, "pb-watch").await;
}

/// The watch test's event sequences, through the proxy and directly, in
/// namespace `name`.
pub(crate) async fn watch_event_sequences_match(env: &RealEnv, name: &str) {
    let ns = env.namespace(name).await;
    let (label, node) = (name, &*format!("{name}-node"));
    let admin = env.admin();
    let (direct, proxy) = (env.direct(admin.clone()), env.proxy(admin));
    let apiserver = env.apiserver();
    env.create(
        &format!("/api/v1/namespaces/{ns}/pods"),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "before", "labels": {"test": label}},
               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}),
    )
    .await;
    let rv = env.current_rv().await;
    let colls = vec![
        (format!("/api/v1/namespaces/{ns}/pods"), String::new()),
        ("/api/v1/nodes".to_string(), String::new()),
        (format!("/api/v1/namespaces/{ns}/services"), String::new()),
        (
            format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
            String::new(),
        ),
    ];
    synced(&direct, &proxy, &colls, rv).await;

    // Watches from `rv`, as informers resume, in each representation.
    let watched = [
        format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
        format!("/api/v1/nodes?labelSelector=test%3D{label}"),
        format!("/api/v1/namespaces/{ns}/services"),
        format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
    ];
    let accepts = [
        format!("{PB};stream=watch"),
        KUBELET.to_string(),
        format!("{PB};as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1".to_string(),
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1".to_string(),
    ];
    let mut streams = Vec::new();
    for path in &watched {
        for accept in &accepts {
            let q = format!(
                "{path}{}watch=1&resourceVersion={rv}&allowWatchBookmarks=true",
                if path.contains('?') { '&' } else { '?' }
            );
            let h = [("accept", accept.as_str())];
            let (d, p) = tokio::join!(direct.watch(&q, &h), proxy.watch(&q, &h));
            assert_eq!(d.status, 200);
            assert_eq!(p.status, 200);
            assert_eq!(
                d.headers.get("content-type"),
                p.headers.get("content-type"),
                "{q} [{accept}]"
            );
            streams.push((q, accept.clone(), d, p));
        }
    }
    // Creates, updates (a label change, a status), deletes.
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    for name in ["w-0", "w-1"] {
        env.create(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"test": label}},
                                 "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1m"}}}]}})).await;
    }
    let mut p0 = apiserver.get(&format!("{pods}/w-0")).await.json();
    p0["metadata"]["labels"]["extra"] = json!("x");
    assert_eq!(
        apiserver.put_json(&format!("{pods}/w-0"), &p0).await.status,
        200
    );
    env.create("/api/v1/nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"test": label}}})).await;
    let mut n = apiserver.get(&format!("/api/v1/nodes/{node}")).await.json();
    n["status"] = json!({"capacity": {"cpu": "2"}, "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]});
    assert_eq!(
        apiserver
            .put_json(&format!("/api/v1/nodes/{node}/status"), &n)
            .await
            .status,
        200
    );
    env.create(&format!("/api/v1/namespaces/{ns}/services"), json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}})).await;
    env.create(&format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "e", "labels": {"kubernetes.io/service-name": "s"}},
               "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.1"]}], "ports": [{"port": 80}]})).await;
    for path in [
        format!("{pods}/w-1"),
        format!("{pods}/before"),
        format!("/api/v1/namespaces/{ns}/services/s"),
        format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/e"),
        format!("/api/v1/nodes/{node}"),
    ] {
        let r = apiserver
            .send(
                Method::DELETE,
                &format!("{path}?gracePeriodSeconds=0"),
                &[],
                None,
            )
            .await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    // pods: ADDED w-0, w-1, MODIFIED w-0, DELETED w-1, before (immediate
    // deletes of unscheduled... pods with a node get a deletionTimestamp
    // first, then go).
    let expected = |path: &str| -> usize {
        if path.contains("/pods") {
            5
        } else if path.contains("/nodes") {
            3
        } else {
            2
        }
    };
    for (q, accept, mut d, mut p) in streams {
        let what = format!("{q} [{accept}]");
        let n = expected(&q);
        if accept.contains("application/json") && !accept.starts_with(PB) {
            let (dw, pw) = tokio::join!(
                collect(&mut d, n, Duration::from_millis(300), &what),
                collect(&mut p, n, Duration::from_millis(300), &what)
            );
            assert_same_events(&dw, &pw, &what);
        } else {
            let (de, pe) = tokio::join!(
                protobuf_events(&mut d, n, &what),
                protobuf_events(&mut p, n, &what)
            );
            assert_eq!(de, pe, "{what}");
        }
    }

    // A streaming list (sendInitialEvents) in protobuf, as informers
    // start: the initial ADDED events and the initial-events-end bookmark.
    env.create(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s-0"}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})).await;
    let rv = env.current_rv().await;
    synced(&direct, &proxy, &colls[..1], rv).await;
    for (accept, metadata) in [
        (format!("{PB};stream=watch"), false),
        (
            format!("{PB};as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
            true,
        ),
    ] {
        let q = format!(
            "{pods}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion={rv}"
        );
        let h = [("accept", accept.as_str())];
        let (mut d, mut p) = tokio::join!(direct.watch(&q, &h), proxy.watch(&q, &h));
        // w-0 and s-0, then the bookmark.
        let (de, pe) = tokio::join!(
            protobuf_events(&mut d, 3, &q),
            protobuf_events(&mut p, 3, &q)
        );
        assert_eq!(de[..2], pe[..2], "{q}: initial events");
        assert_eq!(
            (de[2].0.as_str(), pe[2].0.as_str()),
            ("BOOKMARK", "BOOKMARK")
        );
        assert_eq!(
            bookmark_shape(&de[2].1, metadata),
            bookmark_shape(&pe[2].1, metadata),
            "{q}: bookmark"
        );
    }
    assert!(served(env, "protobuf").await > 0.0);
    let _: Value = Value::Null;
}

/// kube-proxy's and kubelet's informers, as a metadata informer would too,
/// get their watches from the cache; protobuf-only clients of a resource
/// that failed to encode pass through (covered by unit tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_only_node_reads_come_from_the_cache() {
    let Some(env) = RealEnv::start().await else {
        return;
    };
    let node = "pb-node-reads";
    env.create(
        "/api/v1/nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
    )
    .await;
    let client = env.proxy(env.node(node));
    let before = served(&env, "protobuf").await;
    let r = eventually(Duration::from_secs(10), "node get from the cache", || {
        let client = client.clone();
        async move {
            let r = client
                .send(
                    Method::GET,
                    &format!("/api/v1/nodes/{node}?resourceVersion=0"),
                    &[("accept", PB)],
                    None,
                )
                .await;
            (r.status == 200).then_some(r)
        }
    })
    .await;
    assert_eq!(r.header("content-type"), Some(PB));
    let mut w = client
        .watch(
            &format!(
                "/api/v1/nodes?fieldSelector=metadata.name%3D{node}&watch=1&resourceVersion=0"
            ),
            &[("accept", PB)],
        )
        .await;
    assert_eq!(
        w.headers.get("content-type").unwrap(),
        "application/vnd.kubernetes.protobuf;stream=watch"
    );
    let f = w.next_protobuf(Duration::from_secs(10)).await.unwrap();
    assert_eq!(event(&f).0, "ADDED");
    assert!(served(&env, "protobuf").await >= before + 2.0);
}

/// What `kubectl get` sends.
const KUBECTL_TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// A Table (or a watch event's) comparable parts: the column definitions,
/// and each row's cells without Age (its value moves with the clock), its
/// conditions and its object; the Table's resourceVersion left out (a
/// list's is the apiserver's cache RV at the moment it answered).
fn table_parts(table: &Value, age: Option<usize>) -> Value {
    assert_eq!(table["kind"], "Table", "not a Table: {table}");
    // A watch's later events have no column definitions (the apiserver
    // sends them once): `age` says where Age is then.
    let columns = &table["columnDefinitions"];
    let age = match columns.as_array() {
        Some(c) => c.iter().position(|c| c["name"] == "Age"),
        None => age,
    };
    let rows: Vec<Value> = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut cells = r["cells"].as_array().unwrap().clone();
            if let Some(age) = age {
                cells.remove(age);
            }
            json!({"cells": cells, "conditions": r.get("conditions"), "object": r.get("object")})
        })
        .collect();
    assert!(!rows.is_empty(), "no rows: {table}");
    json!({"apiVersion": table["apiVersion"], "columns": columns, "rows": rows})
}

/// Tables (what `kubectl get` asks for) pass through, by design
/// (docs/design.md, "Representations"): lists, gets and watches of every
/// default cached resource through the proxy answer what the apiserver
/// answers, and are counted as passed through for `table`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_pass_through_to_the_apiserver() {
    let Some(env) = RealEnv::start().await else {
        return;
    };
    let ns = env.namespace("pb-tables").await;
    let (label, node) = ("pb-tables", "pb-tables-node");
    fixtures(&env, &ns, label, node).await;
    let rv = env.current_rv().await;
    let admin = env.admin();
    let (direct, proxy) = (env.direct(admin.clone()), env.proxy(admin));
    let colls = collections(&ns, label, node);
    synced(&direct, &proxy, &colls, rv).await;
    let tables = || async {
        metric_sum(
            &env.proxy_metrics().await,
            "kube_cache_proxy_cache_reads_total",
            &[("source", "upstream"), ("reason", "table")],
        )
    };
    let before = tables().await;

    let mut reads = 0;
    for (list, get) in &colls {
        let sep = if list.contains('?') { '&' } else { '?' };
        for accept in [TABLE_V1, KUBECTL_TABLE] {
            for path in [
                format!("{list}{sep}resourceVersion=0"),
                format!("{list}{sep}resourceVersion=0&includeObject=Object"),
                format!("{list}{sep}resourceVersion=0&includeObject=None"),
                format!("{get}?resourceVersion=0"),
            ] {
                let h = [("accept", accept)];
                let (d, p) = tokio::join!(
                    direct.send(Method::GET, &path, &h, None),
                    proxy.send(Method::GET, &path, &h, None)
                );
                let what = format!("{path} [{accept}]");
                assert_eq!(d.status, 200, "{what}: {}", d.text());
                assert_eq!(p.status, d.status, "{what}: {}", p.text());
                assert_eq!(p.header("content-type"), d.header("content-type"), "{what}");
                assert_eq!(
                    table_parts(&p.json(), None),
                    table_parts(&d.json(), None),
                    "{what}"
                );
                reads += 1;
            }
        }
    }
    // An error is the apiserver's too.
    let bad = format!("/api/v1/namespaces/{ns}/pods?resourceVersion=0&includeObject=Bogus");
    let h = [("accept", TABLE_V1)];
    let (d, p) = tokio::join!(
        direct.send(Method::GET, &bad, &h, None),
        proxy.send(Method::GET, &bad, &h, None)
    );
    assert_eq!((p.status, p.text()), (d.status, d.text()), "{bad}");
    reads += 1;

    // A watch in Tables: the same events.
    let pods_table = direct
        .send(
            Method::GET,
            &format!("/api/v1/namespaces/{ns}/pods?resourceVersion=0"),
            &h,
            None,
        )
        .await
        .json();
    let age = pods_table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| c["name"] == "Age");
    let watch = format!("/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion=0");
    let dw = direct.watch(&watch, &h).await;
    let pw = proxy.watch(&watch, &h).await;
    assert_eq!(pw.status, dw.status);
    assert_eq!(
        pw.headers.get("content-type"),
        dw.headers.get("content-type")
    );
    let events = |mut w: WatchStream| async move {
        let mut e = w.events(2, Duration::from_secs(10)).await;
        e.sort_by_key(|e| {
            e["object"]["rows"][0]["cells"][0]
                .as_str()
                .map(String::from)
        });
        e.iter()
            .map(|e| json!({"type": e["type"], "table": table_parts(&e["object"], age)}))
            .collect::<Vec<_>>()
    };
    let (de, pe) = tokio::join!(events(dw), events(pw));
    assert_eq!(pe, de, "{watch}");
    reads += 1;

    let after = tables().await;
    assert!(
        after - before >= reads as f64,
        "Table reads passed through: {before} -> {after}, {reads} made"
    );
}

/// A proxy older than the apiserver loses nothing. Its protobuf schema
/// lacks a field the apiserver sends: here `PodSpec.hostname`, hidden by a
/// test build's `KUBE_CACHE_PROXY_TEST_HIDE_PROTOBUF_FIELDS`, as an older
/// proxy's schema lacks a newer apiserver's fields. A protobuf watch it
/// serves from its cache ends, cleanly, at the last object it could
/// encode, never with a truncated one; the resumed watch, and every
/// protobuf read of pods after, pass through with the apiserver's bytes.
/// JSON, kept as the apiserver sent it, carries the field byte for byte
/// from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_proxy_passes_protobuf_through_rather_than_lose_a_field() {
    use kube_testenv::ControlPlane;
    use support::Auth;
    let Some(cp) = ControlPlane::shared().await else {
        return;
    };
    let proxy = older_proxy(cp, "config/kube-cache-proxy.yaml", "older-node").await;
    let admin = Auth::Cert(cp.admin().clone());
    let direct = Client::new(&cp.url(), &cp.ca_pem(), admin.clone(), false);
    let through = proxy.client(admin);
    let ns = "pb-older";
    namespace_with_default_sa(&direct, ns).await;
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    let pod = |name: &str, hostname: Option<&str>| {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": "older-node", "containers": [{"name": "c", "image": "i"}]}});
        if let Some(h) = hostname {
            p["spec"]["hostname"] = json!(h);
        }
        p
    };
    let r = direct.post_json(&pods, &pod("known", None)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let rv = r.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let served = |source: &'static str| {
        let proxy = &proxy;
        async move {
            let (_, text) = proxy.admin_get("/metrics").await.unwrap_or_default();
            metric_sum(
                &text,
                "kube_cache_proxy_cache_reads_total",
                &[("resource", "pods"), ("source", source)],
            )
        }
    };

    // A protobuf watch from `rv`, served from the cache once it has it.
    let from_rv = format!("{pods}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true");
    let cached_before = served("cache").await;
    let mut w = eventually(Duration::from_secs(20), "a watch from the cache", || {
        let (through, from_rv) = (&through, &from_rv);
        async move {
            let w = through.watch(from_rv, &[("accept", PB)]).await;
            (w.status == 200).then_some(w)
        }
    })
    .await;
    assert!(
        served("cache").await > cached_before,
        "served from the cache"
    );
    // A pod with the field the proxy does not know.
    let r = direct
        .post_json(&pods, &pod("newer", Some("h-newer")))
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // The watch ends, without a frame for it (every frame whole).
    while let Some(frame) = w.next_protobuf(Duration::from_secs(15)).await {
        let (t, obj) = event(&frame);
        assert_eq!(t, "BOOKMARK", "no object the proxy could not encode whole");
        assert!(!obj.windows(7).any(|w| w == b"h-newer"));
    }
    // Resumed, it passes through: the apiserver's own frames.
    let passed_before = served("upstream").await;
    let (mut d, mut p) = tokio::join!(
        direct.watch(&from_rv, &[("accept", PB)]),
        through.watch(&from_rv, &[("accept", PB)])
    );
    let (de, pe) = (
        protobuf_events(&mut d, 1, "direct").await,
        protobuf_events(&mut p, 1, "older proxy").await,
    );
    assert_eq!(de, pe, "the apiserver's event, byte for byte");
    assert_eq!(de[0].0, "ADDED");
    assert!(de[0].1.windows(7).any(|w| w == b"h-newer"));
    assert!(served("upstream").await > passed_before);
    // Protobuf gets and lists: the apiserver's bytes.
    for path in [
        format!("{pods}/newer?resourceVersion=0"),
        format!("{pods}?resourceVersion=0"),
    ] {
        same(&direct, &through, &path, PB).await;
    }
    // JSON, from the cache, carries the field as the apiserver sent it.
    let cached_before = served("cache").await;
    let p = same(
        &direct,
        &through,
        &format!("{pods}/newer?resourceVersion=0"),
        "application/json",
    )
    .await;
    assert_eq!(p.json()["spec"]["hostname"], "h-newer");
    assert!(served("cache").await > cached_before, "JSON from the cache");
    let (_, text) = proxy.admin_get("/metrics").await.unwrap();
    assert!(
        metric_sum(
            &text,
            "kube_cache_proxy_cache_encode_failures_total",
            &[("resource", "pods")]
        ) >= 1.0
    );
}
