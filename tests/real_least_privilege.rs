//! The shipped RBAC (manifests/rbac.yaml) against a real kube-apiserver
//! v1.36: the proxy's ServiceAccount, with a token bound to its node, is
//! denied every dangerous action; a proxy running with exactly that
//! identity (acting as its node by constrained impersonation) carries a
//! hollow kubelet to Ready with its pods Running, and refuses to act as
//! any other certificate user.
//!
//! Skipped, with one line, where no control plane is available.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use http::Method;
use kube_cache_proxy::config::IdentityMode;
use kube_testenv::{ControlPlane, Morph};
use serde_json::{Value, json};
use support::Auth;
use support::client::Client;
use support::real::{RealEnv, eventually};

const NODE: &str = "lp-node";

/// Creates every object of a multi-document manifest.
async fn apply(admin: &Client, manifest: &str) {
    for doc in manifest.split("\n---\n") {
        let obj: Value = match serde_saphyr::from_str(doc) {
            Ok(Value::Null) | Err(_) => continue,
            Ok(v) => v,
        };
        let kind = obj["kind"].as_str().unwrap();
        let collection = match kind {
            "ClusterRole" => "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            "ClusterRoleBinding" => "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            other => panic!("unexpected {other} in the RBAC manifest"),
        };
        let r = admin.post_json(collection, &obj).await;
        assert!(r.status == 201 || r.status == 409, "{kind}: {}", r.text());
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_identity_is_the_node_and_nothing_more() {
    let Some(cp) = ControlPlane::shared().await else {
        return;
    };
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    apply(&admin, include_str!("../manifests/rbac.yaml")).await;
    let r = admin
        .post_json(
            "/api/v1/namespaces/kube-system/serviceaccounts",
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kube-cache-proxy"}}),
        )
        .await;
    assert!(r.status == 201 || r.status == 409, "{}", r.text());
    // The node exists before its kubelet first runs (as when a node's
    // DaemonSet pod gets its token), so a token can be bound to it.
    let r = admin
        .post_json(
            "/api/v1/nodes",
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let uid = r.json()["metadata"]["uid"].clone();
    let r = admin
        .post_json(
            "/api/v1/namespaces/kube-system/serviceaccounts/kube-cache-proxy/token",
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600,
                             "boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let token = r.json()["status"]["token"].as_str().unwrap().to_string();

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

    // A proxy with exactly that identity.
    let kubeconfig = cp
        .write_file(
            "lp-upstream.kubeconfig",
            &kube_cache_proxy::kubeconfig::with_token(&cp.url(), &cp.ca_pem(), &token),
        )
        .unwrap();
    let env = RealEnv::start_with(|c| {
        c.upstream.kubeconfig = Some(kubeconfig);
        c.upstream.identity = IdentityMode::Node;
    })
    .await
    .unwrap();
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
