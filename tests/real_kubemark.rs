//! A hollow node (kubemark: the real kubelet and kube-proxy code with fake
//! runtimes) whose kubeconfigs point at the proxy, in front of a real
//! kube-apiserver v1.36: the kubelet registers its Node, becomes Ready and
//! runs its pods; kube-proxy syncs Services and EndpointSlices; their
//! list/watch traffic for cached resources is served from the cache, and
//! the apiserver serves no more watches than the proxy's own plus the
//! kubelet's per-object ConfigMap and Secret watches.
//!
//! Skipped, with one line, where no control plane (or no kubemark) is
//! available.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube_testenv::{ControlPlane, Morph};
use serde_json::{Value, json};
use support::real::{RealEnv, eventually, metric_sum};

const NODE: &str = "hollow-1";
const PODS: usize = 10;

/// `apiserver_longrunning_requests{verb="WATCH"}` by resource.
fn apiserver_watches(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_longrunning_requests{") else {
            continue;
        };
        if !rest.contains("verb=\"WATCH\"") {
            continue;
        }
        let resource = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("resource=\""))
            .map(|r| r.trim_end_matches('"').to_string())
            .unwrap_or_default();
        let value: f64 = line
            .rsplit_once(' ')
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_default();
        *out.entry(resource).or_default() += value;
    }
    out
}

fn condition_true(obj: &Value, kind: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hollow_node_runs_through_the_proxy() {
    let Some(cp) = ControlPlane::shared().await else {
        return;
    };
    if !cp.assets().has_kubemark() {
        eprintln!("skipping: no kubemark in {}", cp.assets().dir.display());
        return;
    }
    let admin_direct = support::Client::new(
        &cp.url(),
        &cp.ca_pem(),
        support::Auth::Cert(cp.admin().clone()),
        false,
    );
    let baseline = apiserver_watches(&admin_direct.get("/metrics").await.text());

    let env = RealEnv::start().await.unwrap();
    let ns = env.namespace("hollow").await;
    env.create(
        &format!("/api/v1/namespaces/{ns}/configmaps"),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config"}, "data": {"a": "1"}}),
    )
    .await;
    env.create(
        &format!("/api/v1/namespaces/{ns}/secrets"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "app-secret"}, "stringData": {"p": "x"}}),
    )
    .await;

    let kubelet_kc = env.proxy_kubeconfig(
        "kubelet",
        &format!("system:node:{NODE}"),
        Some("system:nodes"),
    );
    let kubelet = cp.hollow(Morph::Kubelet, NODE, &kubelet_kc, &[]).unwrap();
    let admin = env.apiserver();
    eventually(
        Duration::from_secs(90),
        "the hollow node to be Ready",
        || {
            let admin = admin.clone();
            async move {
                let r = admin.get(&format!("/api/v1/nodes/{NODE}")).await;
                (r.status == 200 && condition_true(&r.json(), "Ready")).then_some(())
            }
        },
    )
    .await;

    for i in 0..PODS {
        env.create(
            &format!("/api/v1/namespaces/{ns}/pods"),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": format!("pod-{i}")},
                   "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                            "volumes": [{"name": "cfg", "configMap": {"name": "app-config"}},
                                        {"name": "sec", "secret": {"secretName": "app-secret"}}]}}),
        )
        .await;
    }
    let pods_path = format!("/api/v1/namespaces/{ns}/pods");
    eventually(Duration::from_secs(90), "every pod Running", || {
        let admin = admin.clone();
        let path = pods_path.clone();
        async move {
            let r = admin.get(&path).await;
            let items = r.json()["items"].as_array().cloned().unwrap_or_default();
            let running = items
                .iter()
                .filter(|p| p["status"]["phase"] == "Running" && condition_true(p, "Ready"))
                .count();
            (running == PODS).then_some(())
        }
    })
    .await;

    // kube-proxy on the same node, through the same proxy.
    let proxy_kc = env.proxy_kubeconfig("kube-proxy", "system:kube-proxy", None);
    let kube_proxy = cp.hollow(Morph::Proxy, NODE, &proxy_kc, &[]).unwrap();
    env.create(
        &format!("/api/v1/namespaces/{ns}/services"),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
               "spec": {"ports": [{"port": 80}], "selector": {"app": "web"}}}),
    )
    .await;
    env.create(
        &format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["10.1.0.5"], "conditions": {"ready": true}}],
               "ports": [{"port": 80, "protocol": "TCP"}]}),
    )
    .await;

    // Served from the cache: the kubelet's and kube-proxy's watches.
    let served = |m: &str, resource: &str| {
        metric_sum(
            m,
            "kube_cache_proxy_requests_total",
            &[
                ("verb", "WATCH"),
                ("resource", resource),
                ("source", "cache"),
            ],
        )
    };
    let metrics = eventually(Duration::from_secs(60), "kube-proxy's watches", || {
        let env = &env;
        async move {
            let m = env.proxy_metrics().await;
            (served(&m, "endpointslices") >= 1.0 && served(&m, "services") >= 2.0).then_some(m)
        }
    })
    .await;
    let open = |resource: &str| {
        metric_sum(
            &metrics,
            "kube_cache_proxy_cache_watchers",
            &[("resource", resource)],
        )
    };
    for resource in [
        "pods",
        "nodes",
        "services",
        "runtimeclasses",
        "csidrivers",
        "endpointslices",
    ] {
        assert!(
            open(resource) >= 1.0,
            "{resource}: no watcher served from the cache\n{metrics}"
        );
    }
    // The pod watch the kubelet holds is the cache's, not upstream's.
    assert_eq!(
        metric_sum(
            &metrics,
            "kube_cache_proxy_requests_total",
            &[
                ("verb", "WATCH"),
                ("resource", "pods"),
                ("source", "upstream")
            ],
        ),
        0.0,
        "{metrics}"
    );

    // The apiserver: one watch per cached resource (the proxy's reflector,
    // sometimes a short progress watch beside it), the kubelet's
    // per-object ConfigMap and Secret watches, nothing else new.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = apiserver_watches(&admin_direct.get("/metrics").await.text());
    let cached: Vec<String> = env
        .config
        .cache
        .resources
        .iter()
        .map(|r| r.resource.clone())
        .collect();
    let mut report = String::new();
    let mut added_total = 0.0;
    for (resource, n) in &now {
        let added = n - baseline.get(resource).copied().unwrap_or_default();
        if added == 0.0 {
            continue;
        }
        added_total += added;
        report.push_str(&format!("{resource}: +{added}\n"));
        let allowed = if cached.contains(resource) {
            2.0
        } else if resource == "configmaps" || resource == "secrets" {
            1.0
        } else {
            0.0
        };
        assert!(
            added <= allowed,
            "apiserver watches of {resource} grew by {added} (allowed {allowed}):\n{report}\nkubelet log:\n{}\nkube-proxy log:\n{}",
            kubelet.log_tail(3000),
            kube_proxy.log_tail(3000)
        );
    }
    eprintln!(
        "apiserver watches added by the proxy, the hollow kubelet and kube-proxy: {added_total}\n{report}"
    );
    assert!(kubelet.exited().is_none() && kube_proxy.exited().is_none());
}
