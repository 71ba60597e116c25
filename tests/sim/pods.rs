//! Pods on the pod network (`podNetwork`, docs/pods.md): the proxy's
//! second listener, and the `default/kubernetes` Service that this node's
//! kubelet reads pointing at it, while every other client reads the real
//! one. The real-control-plane side (a pod's network namespace, real
//! clients, hollow kubelets) is `tests/real_isolated/pods.rs`.

use std::time::Duration;

use apimachinery::resource::Gvr;
use serde_json::{Value, json};

use crate::support::client::{Auth, Next, WatchStream};
use crate::support::env::{Env, free_port};

/// Where tests put the pods' listener: a second loopback address, as a
/// node-local address beside the node's `127.0.0.1`.
const POD_HOST: &str = "127.0.0.2";
const TIMEOUT: Duration = Duration::from_secs(10);

fn gvr(group: &str, resource: &str) -> Gvr {
    Gvr {
        group: group.into(),
        version: "v1".into(),
        resource: resource.into(),
    }
}

fn kubernetes_service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"], "type": "ClusterIP",
                 "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                 "ports": [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": 6443}]}
    })
}

fn kubelet(env: &Env) -> Auth {
    env.cert("system:node:node-1", Some("system:nodes"))
}

/// The `kubernetes` Service's cluster IP and `https` port in a list or
/// an event's object.
fn address_in(service: &Value) -> (String, i64) {
    let ip = service["spec"]["clusterIP"].as_str().unwrap().to_string();
    let port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "https")
        .unwrap()["port"]
        .as_i64()
        .unwrap();
    (ip, port)
}

fn kubernetes_in(list: &Value) -> (String, i64) {
    let item = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["metadata"]["name"] == "kubernetes" && i["metadata"]["namespace"] == "default")
        .unwrap_or_else(|| panic!("no default/kubernetes in {list}"));
    address_in(item)
}

/// An env whose proxy is `node-1`'s, with the pods' listener on
/// `POD_HOST` and the given `kubernetesService` mode.
async fn env_with(mode: &str) -> (Env, u16) {
    let port = free_port();
    let env = Env::start_with(Default::default(), |c| {
        c.node_name = "node-1".into();
        c.pod_network.listen = Some(format!("{POD_HOST}:{port}"));
        c.pod_network.kubernetes_service = serde_json::from_value(json!(mode)).unwrap();
    })
    .await;
    env.ready().await;
    (env, port)
}

async fn metric(env: &Env, line_start: &str) -> Option<f64> {
    let (_, text) = env.admin_get("/metrics").await;
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The next event of `watch` that is not a bookmark.
async fn next_change(watch: &mut WatchStream) -> Value {
    loop {
        let e = watch.event(TIMEOUT).await;
        if e["type"] != "BOOKMARK" {
            return e;
        }
    }
}

/// A client of the pods' listener is served like one of the node's
/// loopback listener: the same answer, from the cache.
#[tokio::test]
async fn pods_reach_the_proxy_at_its_pod_network_address() {
    let env = Env::start_with(Default::default(), |c| {
        c.pod_network.listen = Some(format!("{POD_HOST}:0"));
    })
    .await;
    env.ready().await;
    env.sim
        .create(
            &gvr("", "namespaces"),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "agents"}}),
        )
        .unwrap();
    let path = "/api/v1/namespaces?resourceVersion=0";
    // Each read waits for the cache to have the namespace.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let (via_pods, via_node) = loop {
        let via_pods = env.pods(env.admin()).get(path).await;
        let via_node = env.proxy(env.admin()).get(path).await;
        assert_eq!(via_pods.status, 200, "{}", via_pods.text());
        if crate::support::item_names(&via_pods.json()).contains(&"agents".to_string())
            && via_pods.json()["metadata"] == via_node.json()["metadata"]
        {
            break (via_pods, via_node);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            via_pods.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(via_pods.json(), via_node.json());
    let served = metric(&env, "kube_cache_proxy_cache_reads_total{").await;
    assert!(served.is_some(), "no cache read counted");
    // Anonymous, as at the apiserver: whatever anonymous may do.
    let anonymous = env.pods(Auth::Anonymous).get("/api/v1/namespaces").await;
    assert_eq!(anonymous.status, 403, "{}", anonymous.text());
}

/// `Always`: node-1's kubelet reads `default/kubernetes` pointing at the
/// pods' listener, in every representation and every read the cache
/// answers; everyone else reads the real Service.
#[tokio::test]
async fn kubelet_reads_the_kubernetes_service_at_its_node_proxy_and_no_one_else_does() {
    let (env, port) = env_with("Always").await;
    env.sim
        .create(&gvr("", "services"), kubernetes_service())
        .unwrap();
    let kubelet_client = env.proxy_h2(kubelet(&env));
    let admin = env.proxy(env.admin());
    let node_2 = env.proxy(env.cert("system:node:node-2", Some("system:nodes")));

    // kubelet's informer: a streaming list, then its changes.
    let mut watch = kubelet_client
        .watch(
            "/api/v1/services?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&fieldSelector=spec.clusterIP%21%3DNone",
            &[],
        )
        .await;
    assert_eq!(watch.status, 200);
    let added = next_change(&mut watch).await;
    assert_eq!(added["type"], "ADDED");
    assert_eq!(
        address_in(&added["object"]),
        (POD_HOST.into(), i64::from(port))
    );
    assert_eq!(
        added["object"]["metadata"]["annotations"]["kubecacheproxy.io/rewritten-from"],
        "clusterIP 10.96.0.1, port https 443"
    );
    assert_eq!(added["object"]["spec"]["clusterIPs"], json!([POD_HOST]));
    assert_eq!(added["object"]["spec"]["ports"][0]["targetPort"], 6443);

    let list = kubelet_client
        .get("/api/v1/services?resourceVersion=0")
        .await;
    assert_eq!(
        kubernetes_in(&list.json()),
        (POD_HOST.into(), i64::from(port))
    );
    let get = kubelet_client
        .get("/api/v1/namespaces/default/services/kubernetes?resourceVersion=0")
        .await;
    assert_eq!(address_in(&get.json()), (POD_HOST.into(), i64::from(port)));
    // Protobuf, as kubelet reads: the same rewrite.
    let proto = kubelet_client
        .send(
            http::Method::GET,
            "/api/v1/services?resourceVersion=0",
            &[("accept", "application/vnd.kubernetes.protobuf")],
            None,
        )
        .await;
    assert_eq!(proto.status, 200);
    let body = &proto.body[..];
    let count = |needle: &[u8]| body.windows(needle.len()).filter(|w| *w == needle).count();
    // The old address only in the annotation saying what it was.
    assert_eq!((count(POD_HOST.as_bytes()), count(b"10.96.0.1")), (2, 1));

    // Everyone else: the real Service; another node's kubelet too.
    for client in [&admin, &node_2] {
        let list = client.get("/api/v1/services?resourceVersion=0").await;
        assert_eq!(kubernetes_in(&list.json()), ("10.96.0.1".into(), 443));
    }

    // A change reaches kubelet rewritten, and others as it is.
    let mut admin_watch = admin
        .watch(
            &format!(
                "/api/v1/namespaces/default/services?watch=true&resourceVersion={}",
                list.json()["metadata"]["resourceVersion"].as_str().unwrap()
            ),
            &[],
        )
        .await;
    let mut changed = env
        .sim
        .get(&gvr("", "services"), "default", "kubernetes")
        .unwrap();
    changed["metadata"]["labels"]["changed"] = json!("yes");
    env.sim.update(&gvr("", "services"), changed).unwrap();
    let modified = next_change(&mut watch).await;
    assert_eq!(modified["type"], "MODIFIED");
    assert_eq!(modified["object"]["metadata"]["labels"]["changed"], "yes");
    assert_eq!(
        address_in(&modified["object"]),
        (POD_HOST.into(), i64::from(port))
    );
    let real = next_change(&mut admin_watch).await;
    assert_eq!(address_in(&real["object"]), ("10.96.0.1".into(), 443));

    // Visible as such.
    assert_eq!(
        metric(&env, "kube_cache_proxy_kubernetes_service_rewritten ").await,
        Some(1.0)
    );
    let rewritten = metric(
        &env,
        "kube_cache_proxy_kubernetes_service_reads_total{result=\"rewritten\",verb=\"list\"}",
    )
    .await;
    assert!(rewritten.is_some_and(|n| n >= 2.0), "{rewritten:?}");
    let (_, status) = env.admin_get("/debug/caches").await;
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        status["kubernetesService"],
        json!({"mode": "Always", "rewritten": true, "target": format!("{POD_HOST}:{port}"), "addressOnNode": true})
    );
}

/// `NodeLabel`: the node's label turns the rewrite on and off without a
/// restart; each change ends kubelet's watch of Services with `410`, its
/// resumed watch gets `410` until it lists, and the list shows the change.
#[tokio::test]
async fn the_node_label_turns_the_rewrite_on_and_off_and_kubelet_relists() {
    let (env, port) = env_with("NodeLabel").await;
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}});
    env.sim.create(&gvr("", "nodes"), node).unwrap();
    env.sim
        .create(&gvr("", "services"), kubernetes_service())
        .unwrap();
    let kubelet_client = env.proxy_h2(kubelet(&env));
    let rewritten = (POD_HOST.to_string(), i64::from(port));
    let real = ("10.96.0.1".to_string(), 443);

    // kubelet lists and watches as its informer does; `want` is what the
    // list must show (the cache may still be catching up with the sim).
    let list_and_watch = async |want: &(String, i64)| {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let list = loop {
            let list = kubelet_client
                .get("/api/v1/services?resourceVersion=0")
                .await
                .json();
            if list["items"].as_array().is_some_and(|i| !i.is_empty())
                && &kubernetes_in(&list) == want
            {
                break list;
            }
            assert!(tokio::time::Instant::now() < deadline, "{list}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let rv = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let watch = kubelet_client
            .watch(
                &format!(
                    "/api/v1/services?watch=true&allowWatchBookmarks=true&resourceVersion={rv}"
                ),
                &[],
            )
            .await;
        assert_eq!(watch.status, 200);
        (rv, watch)
    };
    let label = async |value: Option<&str>| {
        let mut node = env.sim.get(&gvr("", "nodes"), "", "node-1").unwrap();
        node["metadata"]["labels"] = match value {
            Some(v) => json!({"kubecacheproxy.io/kubernetes-service": v}),
            None => json!({}),
        };
        env.sim.update(&gvr("", "nodes"), node).unwrap();
    };
    let expect_expired = async |watch: &mut WatchStream| {
        let e = next_change(watch).await;
        assert_eq!(e["type"], "ERROR", "{e}");
        assert_eq!(e["object"]["code"], 410, "{e}");
        assert_eq!(e["object"]["reason"], "Expired", "{e}");
        assert!(matches!(watch.next(TIMEOUT).await, Next::End));
    };

    let (rv, mut watch) = list_and_watch(&real).await;
    // A label of another value does not turn it on.
    label(Some("apiserver")).await;
    label(Some("node-local")).await;
    expect_expired(&mut watch).await;
    // Resuming from before the change: `410` until kubelet lists.
    let mut resumed = kubelet_client
        .watch(
            &format!("/api/v1/services?watch=true&resourceVersion={rv}"),
            &[],
        )
        .await;
    expect_expired(&mut resumed).await;
    let (_, mut watch) = list_and_watch(&rewritten).await;
    // The watch after the list is not expired: it gets the next change.
    env.sim
        .create(
            &gvr("", "services"),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "other", "namespace": "default"},
                   "spec": {"clusterIP": "10.96.0.2", "ports": [{"port": 80}]}}),
        )
        .unwrap();
    let added = next_change(&mut watch).await;
    assert_eq!(
        (
            added["type"].as_str(),
            added["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("other"))
    );
    assert_eq!(
        metric(&env, "kube_cache_proxy_kubernetes_service_rewritten ").await,
        Some(1.0)
    );

    // Off again: the label removed.
    label(None).await;
    expect_expired(&mut watch).await;
    list_and_watch(&real).await;
    assert_eq!(
        metric(&env, "kube_cache_proxy_kubernetes_service_rewritten ").await,
        Some(0.0)
    );
    assert_eq!(
        metric(&env, "kube_cache_proxy_kubernetes_service_changes_total ").await,
        Some(2.0)
    );
}

/// An address that is not the node's: the listener binds all the same
/// (`IP_FREEBIND`: the node's network may configure it later), and kubelet
/// reads the real Service, since pods given the address could not connect.
#[tokio::test]
async fn the_service_is_not_rewritten_to_an_address_the_node_does_not_have() {
    // Link-local, never configured on this machine by the tests.
    let missing = "169.254.64.254";
    let port = free_port();
    let env = Env::start_with(Default::default(), |c| {
        c.node_name = "node-1".into();
        c.pod_network.listen = Some(format!("{missing}:{port}"));
        c.pod_network.kubernetes_service = serde_json::from_value(json!("Always")).unwrap();
    })
    .await;
    env.ready().await;
    env.sim
        .create(&gvr("", "services"), kubernetes_service())
        .unwrap();
    let kubelet_client = env.proxy(kubelet(&env));
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let list = loop {
        let list = kubelet_client
            .get("/api/v1/services?resourceVersion=0")
            .await
            .json();
        if list["items"].as_array().is_some_and(|i| !i.is_empty()) {
            break list;
        }
        assert!(tokio::time::Instant::now() < deadline, "{list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(kubernetes_in(&list), ("10.96.0.1".into(), 443));
    let (_, status) = env.admin_get("/debug/caches").await;
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["kubernetesService"]["rewritten"], false, "{status}");
    assert_eq!(
        status["kubernetesService"]["addressOnNode"], false,
        "{status}"
    );
    assert_eq!(
        metric(&env, "kube_cache_proxy_kubernetes_service_rewritten ").await,
        Some(0.0)
    );
}
