//! The shipped RBAC (manifests/rbac.yaml) against a real kube-apiserver
//! v1.36: the proxy's ServiceAccount, with a token bound to its node, is
//! denied every dangerous action; a proxy running with exactly that
//! identity (acting as its node by constrained impersonation) carries a
//! hollow kubelet to Ready with its pods Running, and refuses to act as
//! any other certificate user.
//!
//! Skipped, with one line, where no control plane is available.

use crate::support;

use std::time::Duration;

use http::Method;
use kube_cache_proxy::component::config::IdentityMode;
use kube_testenv::{Morph, Options};
use serde_json::{Value, json};
use support::Auth;
use support::binary::{Binary, can_drop_capabilities};
use support::client::Client;
use support::real::{Isolated, RealEnv, apply, eventually, metric_sum};

const NODE: &str = "lp-node";

/// A request to make: what it is, method, path, headers, body.
type Probe = (
    &'static str,
    Method,
    String,
    Vec<(&'static str, String)>,
    Option<Vec<u8>>,
);

/// Whether the token's user may do it (a SelfSubjectAccessReview).
async fn may(client: &Client, attrs: Value) -> bool {
    let r = client
        .post_json(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            &json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": attrs}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["status"]["allowed"] == true
}

fn condition_true(obj: &Value, kind: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// Applies the shipped RBAC, creates the proxy's ServiceAccount and Node
/// `node` (as exists before a node's DaemonSet pod gets its token), and
/// returns a token of the account bound to that Node, as the pod's
/// projected token is.
async fn node_bound_token(admin: &Client, node: &str) -> String {
    apply(admin, include_str!("../../manifests/rbac.yaml")).await;
    let r = admin
        .post_json(
            "/api/v1/namespaces/kube-system/serviceaccounts",
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kube-cache-proxy"}}),
        )
        .await;
    assert!(r.status == 201 || r.status == 409, "{}", r.text());
    let r = admin
        .post_json(
            "/api/v1/nodes",
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let uid = r.json()["metadata"]["uid"].clone();
    let r = admin
        .post_json(
            "/api/v1/namespaces/kube-system/serviceaccounts/kube-cache-proxy/token",
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600,
                             "boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["status"]["token"].as_str().unwrap().to_string()
}

/// Before constrained impersonation (kube-apiserver 1.34 and older, or
/// 1.35 without the feature) the DaemonSet's identity cannot act as its
/// node: the proxy says so and exits 64 instead of never becoming ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_constrained_impersonation_the_proxy_stops_with_a_clear_error() {
    // 1.34, and 1.35 by default, have none; 1.36 with the feature off.
    let minor = Options::default()
        .wanted_version()
        .and_then(|v| v.split('.').nth(1)?.parse::<u32>().ok());
    let options = if minor.is_none_or(|m| m >= 36) {
        Options {
            apiserver_args: vec!["--feature-gates=ConstrainedImpersonation=false".into()],
            ..Options::default()
        }
    } else {
        Options::default()
    };
    let Some(plane) = Isolated::start(options).await else {
        return;
    };
    let cp = plane.cp();
    assert!(!cp.has_constrained_impersonation(), "{}", cp.version());
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    let token = node_bound_token(&admin, "lp-old-node").await;
    // What the apiserver itself answers the impersonation.
    let sa = Client::new(&cp.url(), &cp.ca_pem(), Auth::Token(token.clone()), false);
    let r = sa
        .send(
            Method::GET,
            "/api/v1/nodes/lp-old-node",
            &[("impersonate-user", "system:node:lp-old-node")],
            None,
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text());
    let mut proxy = Binary::start(
        cp,
        &apimachinery::kubeconfig::with_token(&cp.url(), &cp.ca_pem(), &token),
        "lp-old-node",
    );
    let exit = tokio::time::timeout(Duration::from_secs(30), proxy.child.wait())
        .await
        .expect("the proxy did not stop")
        .unwrap();
    let stderr = proxy.stderr();
    assert_eq!(exit.code(), Some(64), "{stderr}");
    for part in [
        "upstream.identity",
        "does not let this proxy act as node \"lp-old-node\"",
        cp.version(),
        "ConstrainedImpersonation",
        "node's own client certificate",
        // The apiserver's own reason.
        "cannot impersonate resource \"users\"",
    ] {
        assert!(stderr.contains(part), "{part}: {stderr}");
    }
    assert!(!stderr.contains(&token), "{stderr}");
}

/// The binary with exactly the DaemonSet's configuration and a node-bound
/// token (upstream.identity Node, as shipped): it confirms it may act as
/// its node, becomes ready, serves a kube-proxy-like agent and its node
/// from the cache, refuses other certificate users, and stops on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_with_the_daemonset_configuration_as_its_node() {
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let cp = plane.cp();
    if !cp.has_constrained_impersonation() {
        // Proven by without_constrained_impersonation_the_proxy_stops_with_a_clear_error.
        kube_testenv::skip::not_applicable(format!(
            "kube-apiserver {} has no constrained impersonation: a node-bound token cannot act as its node",
            cp.version()
        ));
        return;
    }
    const NODE: &str = "lp-binary-node";
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    let token = node_bound_token(&admin, NODE).await;
    // A node agent with its own account, as kube-proxy has.
    let r = admin
        .post_json(
            "/api/v1/namespaces/kube-system/serviceaccounts",
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "lp-kube-proxy"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = admin
        .post_json(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": "lp-kube-proxy"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier"},
                    "subjects": [{"kind": "ServiceAccount", "name": "lp-kube-proxy", "namespace": "kube-system"}]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = admin
        .post_json(
            "/api/v1/namespaces/kube-system/serviceaccounts/lp-kube-proxy/token",
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600}}),
        )
        .await;
    let agent_token = r.json()["status"]["token"].as_str().unwrap().to_string();

    let mut proxy = Binary::start(
        cp,
        &apimachinery::kubeconfig::with_token(&cp.url(), &cp.ca_pem(), &token),
        NODE,
    );
    let readyz = eventually(Duration::from_secs(60), "the proxy to be ready", || {
        let p = &proxy;
        async move {
            p.admin_get("/readyz?verbose")
                .await
                .filter(|(s, _)| *s == 200)
        }
    })
    .await;
    assert!(readyz.1.contains("[+]upstream-identity ok"), "{}", readyz.1);

    let agent = proxy.client(Auth::Token(agent_token));
    for path in [
        "/api/v1/services?resourceVersion=0",
        "/apis/discovery.k8s.io/v1/endpointslices?resourceVersion=0",
        "/api/v1/nodes?resourceVersion=0",
    ] {
        let r = agent.get(path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    let node = proxy.client(Auth::Cert(
        cp.issue_client(&format!("system:node:{NODE}"), Some("system:nodes"))
            .unwrap(),
    ));
    for path in [
        format!("/api/v1/nodes/{NODE}"),
        format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&resourceVersion=0"),
    ] {
        let r = node.get(&path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    // Consistent lists of the node's own scopes: each is proven fresh by
    // a probe with the scope and its negation (it selects nothing), which
    // the Node authorizer must allow as the node's own read.
    for path in [
        format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"),
        format!("/api/v1/nodes?fieldSelector=metadata.name%3D{NODE}"),
    ] {
        let r = node.get(&path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    // Consistent lists of unscoped caches, namespaced or not: their probes
    // pin one name (in `default`, for a namespaced resource) and exclude
    // it, which the apiserver must accept and the proxy's identity be
    // allowed.
    for path in [
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
    ] {
        let r = agent.get(path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    let (_, metrics) = proxy.admin_get("/metrics").await.unwrap();
    for resource in ["pods", "nodes", "services", "endpointslices"] {
        let probes = |result: &str| {
            metric_sum(
                &metrics,
                "kube_cache_proxy_cache_consistency_probes_total",
                &[("resource", resource), ("result", result)],
            )
        };
        assert!(
            probes("ok") >= 1.0 && probes("error") == 0.0,
            "{resource}: the consistency probes as the node failed: {metrics}"
        );
    }
    for resource in ["services", "endpointslices", "pods"] {
        let served = metric_sum(
            &metrics,
            "kube_cache_proxy_requests_total",
            &[("resource", resource), ("source", "cache")],
        );
        assert!(
            served >= 1.0,
            "{resource} not served from the cache: {metrics}"
        );
    }
    // The proxy's own token, sent through it with legacy impersonation:
    // passed through with the token, refused as by the apiserver.
    let imp = [("impersonate-user", "system:admin")];
    let path = "/api/v1/namespaces/kube-system/secrets";
    let d = Client::new(&cp.url(), &cp.ca_pem(), Auth::Token(token.clone()), false)
        .send(Method::GET, path, &imp, None)
        .await;
    let p = proxy
        .client(Auth::Token(token.clone()))
        .send(Method::GET, path, &imp, None)
        .await;
    assert_eq!((d.status, d.json()), (p.status, p.json()));
    assert_eq!(d.status, 403);
    println!(
        "legacy impersonation by the proxy's account: {}",
        d.json()["message"]
    );
    // The metrics port: health open, /metrics for who may read it.
    let anonymous = proxy.metrics_client(Auth::Anonymous);
    assert_eq!(anonymous.get("/readyz").await.status, 200);
    assert_eq!(anonymous.get("/metrics").await.status, 401);
    let r = proxy
        .metrics_client(Auth::Cert(cp.admin().clone()))
        .get("/metrics")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // An administrator's certificate is not the node's: refused.
    let r = proxy
        .client(Auth::Cert(cp.admin().clone()))
        .get("/api/v1/namespaces/kube-system/secrets")
        .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.text().contains("acts upstream only as node"),
        "{}",
        r.text()
    );

    let pid = proxy.child.id().unwrap();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let exit = tokio::time::timeout(Duration::from_secs(40), proxy.child.wait())
        .await
        .expect("the proxy did not stop")
        .unwrap();
    assert!(exit.success(), "{exit:?}: {}", proxy.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_identity_is_the_node_and_nothing_more() {
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let cp = plane.cp();
    if !cp.has_constrained_impersonation() {
        // Proven by without_constrained_impersonation_the_proxy_stops_with_a_clear_error.
        kube_testenv::skip::not_applicable(format!(
            "kube-apiserver {} has no constrained impersonation: a node-bound token cannot act as its node",
            cp.version()
        ));
        return;
    }
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    let token = node_bound_token(&admin, NODE).await;

    // What the proxy's own identity may not do.
    let sa = Client::new(&cp.url(), &cp.ca_pem(), Auth::Token(token.clone()), false);
    let denied = [
        json!({"verb": "get", "resource": "secrets", "namespace": "kube-system"}),
        json!({"verb": "list", "resource": "secrets"}),
        json!({"verb": "list", "resource": "pods"}),
        json!({"verb": "list", "resource": "configmaps"}),
        json!({"verb": "get", "resource": "nodes", "name": "other-node"}),
        json!({"verb": "patch", "resource": "nodes", "name": NODE}),
        json!({"verb": "create", "resource": "pods", "namespace": "default"}),
        json!({"verb": "delete", "resource": "pods", "namespace": "default"}),
        json!({"verb": "impersonate", "resource": "users", "name": "system:admin"}),
        json!({"verb": "impersonate", "resource": "groups", "name": "system:masters"}),
        json!({"verb": "impersonate", "resource": "serviceaccounts", "namespace": "kube-system", "name": "default"}),
        json!({"verb": "impersonate:arbitrary-node", "group": "authentication.k8s.io", "resource": "nodes", "name": "other-node"}),
        json!({"verb": "impersonate:user-info", "group": "authentication.k8s.io", "resource": "users", "name": "system:admin"}),
        json!({"verb": "create", "group": "rbac.authorization.k8s.io", "resource": "clusterrolebindings"}),
        json!({"verb": "escalate", "group": "rbac.authorization.k8s.io", "resource": "clusterroles"}),
        json!({"verb": "bind", "group": "rbac.authorization.k8s.io", "resource": "clusterroles"}),
        json!({"verb": "create", "resource": "serviceaccounts", "subresource": "token", "namespace": "kube-system", "name": "default"}),
        json!({"verb": "update", "group": "certificates.k8s.io", "resource": "certificatesigningrequests", "subresource": "approval"}),
        json!({"verb": "approve", "group": "certificates.k8s.io", "resource": "signers", "name": "kubernetes.io/kube-apiserver-client"}),
    ];
    let mut table = Vec::new();
    for attrs in &denied {
        let allowed = may(&sa, attrs.clone()).await;
        table.push(format!(
            "{attrs}: {}",
            if allowed { "ALLOWED" } else { "denied" }
        ));
        assert!(!allowed, "the proxy's identity may {attrs}");
    }
    // What it may: act as its own node, for kubelet's verbs.
    assert!(
        may(&sa, json!({"verb": "impersonate:associated-node", "group": "authentication.k8s.io", "resource": "nodes", "name": "*"})).await
    );
    println!("{}", table.join("\n"));

    // Real requests made the way the proxy makes them (the token,
    // impersonating its node): what its node may not do is refused, by the
    // apiserver's own checks (constrained impersonation, the Node
    // authorizer, NodeRestriction), exactly as for the node's certificate.
    let ns = "lp-requests";
    let r = admin
        .post_json(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    for (path, obj) in [
        (
            "/api/v1/nodes".to_string(),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "lp-other-node"}}),
        ),
        (
            format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        ),
        (
            format!("/api/v1/namespaces/{ns}/secrets"),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unreferenced"},
                   "stringData": {"k": "v"}}),
        ),
        (
            format!("/api/v1/namespaces/{ns}/pods"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "elsewhere"},
                   "spec": {"nodeName": "lp-other-node", "automountServiceAccountToken": false,
                            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}),
        ),
    ] {
        let r = admin.post_json(&path, &obj).await;
        assert_eq!(r.status, 201, "{path}: {}", r.text());
    }
    let as_node = [("impersonate-user", format!("system:node:{NODE}"))];
    let pod_elsewhere = serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "lp-evil"},
        "spec": {"nodeName": "lp-other-node", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}))
    .unwrap();
    let merge = "application/merge-patch+json";
    let label = br#"{"metadata":{"labels":{"evil":"yes"}}}"#.to_vec();
    let node_cert = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(
            cp.issue_client(&format!("system:node:{NODE}"), Some("system:nodes"))
                .unwrap(),
        ),
        false,
    );
    let requests: Vec<Probe> = vec![
        (
            "impersonate another node",
            Method::GET,
            format!("/api/v1/nodes/{NODE}"),
            vec![("impersonate-user", "system:node:lp-other-node".into())],
            None,
        ),
        (
            "impersonate the node with group system:masters",
            Method::GET,
            format!("/api/v1/nodes/{NODE}"),
            vec![
                ("impersonate-user", format!("system:node:{NODE}")),
                ("impersonate-group", "system:masters".into()),
            ],
            None,
        ),
        (
            "patch another node's Node",
            Method::PATCH,
            "/api/v1/nodes/lp-other-node".into(),
            vec![as_node[0].clone(), ("content-type", merge.into())],
            Some(label.clone()),
        ),
        (
            "create a pod bound to another node",
            Method::POST,
            format!("/api/v1/namespaces/{ns}/pods"),
            vec![
                as_node[0].clone(),
                ("content-type", "application/json".into()),
            ],
            Some(pod_elsewhere),
        ),
        (
            "get a secret no pod of the node references",
            Method::GET,
            format!("/api/v1/namespaces/{ns}/secrets/unreferenced"),
            as_node.to_vec(),
            None,
        ),
        (
            "get another node's pod",
            Method::GET,
            format!("/api/v1/namespaces/{ns}/pods/elsewhere"),
            as_node.to_vec(),
            None,
        ),
        (
            "list every pod",
            Method::GET,
            "/api/v1/pods".into(),
            as_node.to_vec(),
            None,
        ),
        (
            "delete another node's pod",
            Method::DELETE,
            format!("/api/v1/namespaces/{ns}/pods/elsewhere"),
            as_node.to_vec(),
            None,
        ),
    ];
    for (what, method, path, headers, body) in requests {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = sa.send(method.clone(), &path, &h, body.clone()).await;
        assert_eq!(r.status, 403, "{what}: {}", r.text());
        // The node itself is refused the same (impersonation aside).
        if what.starts_with("impersonate") {
            println!("{what}: 403 {}", r.json()["message"]);
            continue;
        }
        let plain: Vec<(&str, &str)> = h
            .iter()
            .filter(|(k, _)| !k.starts_with("impersonate-"))
            .copied()
            .collect();
        let d = node_cert.send(method, &path, &plain, body).await;
        assert_eq!(d.status, 403, "{what} by the node itself: {}", d.text());
        // Refused as the node, not for want of an impersonation grant.
        assert_eq!(r.json()["message"], d.json()["message"], "{what}");
        println!("{what}: 403 {}", r.json()["message"]);
    }
    // What the node may, the token may as the node.
    let r = sa
        .send(
            Method::GET,
            &format!("/api/v1/nodes/{NODE}"),
            &[("impersonate-user", &format!("system:node:{NODE}"))],
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());

    // A proxy with exactly that identity.
    let kubeconfig = cp
        .write_file(
            "lp-upstream.kubeconfig",
            &apimachinery::kubeconfig::with_token(&cp.url(), &cp.ca_pem(), &token),
        )
        .unwrap();
    let env = RealEnv::start_on(cp, |c| {
        c.upstream.kubeconfig = Some(kubeconfig);
        c.upstream.identity = IdentityMode::Node;
    })
    .await;
    let ns = env.namespace("least-privilege").await;
    env.create(
        &format!("/api/v1/namespaces/{ns}/configmaps"),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "1"}}),
    )
    .await;

    let kubelet_kc = env.proxy_kubeconfig(
        "lp-kubelet",
        &format!("system:node:{NODE}"),
        Some("system:nodes"),
    );
    let kubelet = cp.hollow(Morph::Kubelet, NODE, &kubelet_kc, &[]).unwrap();
    let apiserver = env.apiserver();
    eventually(
        Duration::from_secs(90),
        "the hollow node to be Ready",
        || {
            let a = apiserver.clone();
            async move {
                let r = a.get(&format!("/api/v1/nodes/{NODE}")).await;
                (r.status == 200 && condition_true(&r.json(), "Ready")).then_some(())
            }
        },
    )
    .await;
    for i in 0..3 {
        env.create(
            &format!("/api/v1/namespaces/{ns}/pods"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("p-{i}")},
                   "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                            "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}]}}),
        )
        .await;
    }
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    eventually(Duration::from_secs(90), "its pods Running", || {
        let (a, p) = (apiserver.clone(), pods.clone());
        async move {
            let items = a.get(&p).await.json()["items"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            (items
                .iter()
                .filter(|p| p["status"]["phase"] == "Running")
                .count()
                == 3)
                .then_some(())
        }
    })
    .await;
    drop(kubelet);

    // Another node's certificate through the same proxy cannot act as it.
    let other = env.proxy(env.node("other-node"));
    for (method, path, body) in [
        (Method::GET, "/api/v1/nodes/other-node".to_string(), None),
        (
            Method::POST,
            format!("/api/v1/namespaces/{ns}/events"),
            Some(serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "e"}, "involvedObject": {"kind": "Node", "name": "other-node"}})).unwrap()),
        ),
    ] {
        let r = other
            .send(method, &path, &[("content-type", "application/json")], body)
            .await;
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert!(r.text().contains("acts upstream only as node"), "{}", r.text());
    }
    // Its own node's requests pass; the cache is scoped to the node.
    let own = env.proxy(env.node(NODE));
    assert_eq!(own.get(&format!("/api/v1/nodes/{NODE}")).await.status, 200);
    let metrics = env.proxy_metrics().await;
    assert!(metrics.contains("kube_cache_proxy_ready 1"), "{metrics}");
}

/// The static pod's and systemd unit's way: the binary with exactly
/// `manifests/node/config.yaml`, its upstream kubeconfig
/// (`manifests/node/upstream-kubeconfig.yaml`) naming the node's own client
/// certificate in one root-only file as kubelet keeps it, run as root
/// without capabilities, `manifests/node/rbac.yaml` applied: a hollow
/// kubelet through it becomes Ready and runs its pods; another node's
/// certificate cannot act through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_certificate_mode_carries_a_hollow_kubelet() {
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let cp = plane.cp();
    const NODE: &str = "lp-cert-node";
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    apply(&admin, include_str!("../../manifests/node/rbac.yaml")).await;
    let node_cert = cp
        .issue_client(&format!("system:node:{NODE}"), Some("system:nodes"))
        .unwrap();
    let proxy = Binary::start_with(
        cp,
        "manifests/node/config.yaml",
        |dir| {
            use std::os::unix::fs::PermissionsExt;
            // kubelet-client-current.pem: certificate and key, mode 0600.
            let pem = dir.join("kubelet-client-current.pem");
            std::fs::write(&pem, format!("{}{}", node_cert.cert_pem, node_cert.key_pem)).unwrap();
            std::fs::set_permissions(&pem, std::fs::Permissions::from_mode(0o600)).unwrap();
            let ca = dir.join("ca.crt");
            std::fs::write(&ca, cp.ca_pem()).unwrap();
            include_str!("../../manifests/node/upstream-kubeconfig.yaml")
                .replace("https://k8s-api.example.internal:6443", &cp.url())
                .replace("/etc/kubernetes/pki/ca.crt", &ca.display().to_string())
                .replace(
                    "/var/lib/kubelet/pki/kubelet-client-current.pem",
                    &pem.display().to_string(),
                )
        },
        NODE,
        true,
    );
    eventually(Duration::from_secs(60), "the proxy to be ready", || {
        let p = &proxy;
        async move {
            p.admin_get("/readyz?verbose")
                .await
                .filter(|(s, _)| *s == 200)
        }
    })
    .await;

    let ns = "lp-cert";
    for (path, obj) in [
        (
            "/api/v1/namespaces".to_string(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        ),
        (
            format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        ),
        (
            format!("/api/v1/namespaces/{ns}/configmaps"),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "1"}}),
        ),
    ] {
        let r = admin.post_json(&path, &obj).await;
        assert_eq!(r.status, 201, "{path}: {}", r.text());
    }
    let kubelet_kc = proxy.dir.join("kubelet.kubeconfig");
    std::fs::write(
        &kubelet_kc,
        apimachinery::kubeconfig::with_certificate(
            &format!("https://127.0.0.1:{}", proxy.port),
            &proxy.ca_pem,
            &format!("system:node:{NODE}"),
            &node_cert.cert_pem,
            &node_cert.key_pem,
        ),
    )
    .unwrap();
    let kubelet = cp.hollow(Morph::Kubelet, NODE, &kubelet_kc, &[]).unwrap();
    eventually(
        Duration::from_secs(90),
        "the hollow node to be Ready",
        || {
            let a = admin.clone();
            async move {
                let r = a.get(&format!("/api/v1/nodes/{NODE}")).await;
                (r.status == 200 && condition_true(&r.json(), "Ready")).then_some(())
            }
        },
    )
    .await;
    for i in 0..2 {
        let r = admin
            .post_json(
                &format!("/api/v1/namespaces/{ns}/pods"),
                &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("p-{i}")},
                        "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                                 "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}]}}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    eventually(Duration::from_secs(90), "its pods Running", || {
        let (a, p) = (admin.clone(), pods.clone());
        async move {
            let items = a.get(&p).await.json()["items"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            (items
                .iter()
                .filter(|p| p["status"]["phase"] == "Running")
                .count()
                == 2)
                .then_some(())
        }
    })
    .await;
    drop(kubelet);
    let (_, metrics) = proxy.admin_get("/metrics").await.unwrap();
    let served = metric_sum(
        &metrics,
        "kube_cache_proxy_requests_total",
        &[("resource", "pods"), ("source", "cache")],
    );
    assert!(served >= 1.0, "kubelet's pods not served from the cache");

    let other = proxy.client(Auth::Cert(
        cp.issue_client("system:node:lp-cert-other", Some("system:nodes"))
            .unwrap(),
    ));
    let r = other.get("/api/v1/nodes/lp-cert-other").await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.text().contains("acts upstream only as node"),
        "{}",
        r.text()
    );
    println!(
        "certificate mode{}: hollow kubelet Ready, pods Running",
        if can_drop_capabilities() {
            ", root without capabilities"
        } else {
            ""
        }
    );
}
