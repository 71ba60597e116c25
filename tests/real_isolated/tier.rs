//! A tier of proxies in front of a real kube-apiserver v1.36: one tier
//! proxy (`manifests/tier/config.yaml`, `upstream.identity: Tier`, the
//! shipped tier RBAC), K node proxies (`manifests/node/config.yaml`, each
//! with its node's client certificate) whose upstream is the tier and whose
//! fallback is the apiserver, and K hollow kubelets (kubemark) behind them.
//!
//! - the tier's own requests upstream are in its own API Priority and
//!   Fairness level (`manifests/tier/flowcontrol.yaml`);
//! - every kubelet registers, becomes Ready and runs its pods, each with a
//!   ConfigMap and a Secret volume;
//! - the apiserver serves only the tier's watches: per resource exactly
//!   what the tier holds open (`kube_cache_proxy_upstream_watches`),
//!   kubelets' per-object ConfigMap and Secret watches included, whatever
//!   K is;
//! - when the tier goes away, the node proxies move to the apiserver and
//!   the kubelets carry on (a new pod still starts); when it is back, they
//!   return to it and the apiserver's watches are the tier's again.
//!
//! K is 2, or `KCP_TIER_NODES`; the figures (the apiserver's watches, CPU
//! and memory) are printed. Skipped, with one line, where no control plane
//! or no kubemark is available.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use apimachinery::pki::Ca;
use kube_cache_proxy::component::config::{FallbackConfig, IdentityMode};
use kube_testenv::{Morph, Options};
use serde_json::{Value, json};
use support::env::{Running, tempdir};
use support::real::{
    Isolated, apply, eventually, metric_by_resource, metric_sum, service_account_token, shipped,
    write,
};
use support::{Auth, Client};

/// The apiserver's open watches by resource.
fn apiserver_watches(metrics: &str) -> BTreeMap<String, f64> {
    metric_by_resource(
        metrics,
        "apiserver_longrunning_requests",
        &[("verb", "WATCH")],
    )
}

/// `kube_cache_proxy_upstream_watches` (every kind) by resource.
fn proxy_upstream_watches(metrics: &str) -> BTreeMap<String, f64> {
    metric_by_resource(metrics, "kube_cache_proxy_upstream_watches", &[])
}

fn condition_true(obj: &Value, kind: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_proxies_behind_a_tier_keep_the_apiservers_watches_flat() {
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let cp = plane.cp();
    if !cp.assets().has_kubemark() {
        kube_testenv::skip::skip(format!("no kubemark in {}", cp.assets().dir.display()));
        return;
    }
    let k: usize = std::env::var("KCP_TIER_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    apply(
        &admin,
        include_str!("../../manifests/tier/serviceaccount.yaml"),
    )
    .await;
    apply(&admin, include_str!("../../manifests/tier/rbac.yaml")).await;
    apply(
        &admin,
        include_str!("../../manifests/tier/flowcontrol.yaml"),
    )
    .await;
    if !cp.has_constrained_impersonation() {
        apply(
            &admin,
            include_str!("../../manifests/tier/rbac-legacy-impersonation.yaml"),
        )
        .await;
    }
    apply(&admin, include_str!("../../manifests/node/rbac.yaml")).await;
    let baseline = apiserver_watches(&admin.get("/metrics").await.text());

    // The tier, as its ServiceAccount.
    let tier_token = service_account_token(&admin, "kube-system", "kube-cache-proxy-tier").await;
    let tier_dir = tempdir();
    let tier_ca = Ca::new("tier-ca").unwrap();
    let mut tier_config = shipped(
        "manifests/tier/config.yaml",
        &tier_dir,
        &tier_ca,
        &cp.ca_pem(),
    );
    assert_eq!(tier_config.upstream.identity, IdentityMode::Tier);
    let tier_port = kube_testenv::free_port().unwrap();
    tier_config.listen = format!("127.0.0.1:{tier_port}");
    tier_config.upstream.kubeconfig = Some(write(
        &tier_dir,
        "upstream.kubeconfig",
        &apimachinery::kubeconfig::with_token(&cp.url(), &cp.ca_pem(), &tier_token),
    ));
    let mut tier = Running::start(&tier_config).await;
    tier.ready().await;
    let tier_url = format!("https://127.0.0.1:{tier_port}");

    // K node proxies and their kubelets.
    let ns = "tier";
    let _ = admin
        .post_json(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    let _ = admin
        .post_json(
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        )
        .await;
    let mut node_proxies = Vec::new();
    let mut kubelets = Vec::new();
    for i in 0..k {
        let node = format!("tier-node-{i}");
        let user = format!("system:node:{node}");
        let cert = cp.issue_client(&user, Some("system:nodes")).unwrap();
        let dir = tempdir();
        let proxy_ca = Ca::new("node-proxy-ca").unwrap();
        let mut c = shipped("manifests/node/config.yaml", &dir, &proxy_ca, &cp.ca_pem());
        c.node_name = node.clone();
        c.upstream.kubeconfig = Some(write(
            &dir,
            "tier.kubeconfig",
            &apimachinery::kubeconfig::with_certificate(
                &tier_url,
                &tier_ca.cert_pem(),
                &user,
                &cert.cert_pem,
                &cert.key_pem,
            ),
        ));
        c.upstream.fallback = Some(FallbackConfig {
            kubeconfig: write(
                &dir,
                "apiserver.kubeconfig",
                &apimachinery::kubeconfig::with_certificate(
                    &cp.url(),
                    &cp.ca_pem(),
                    &user,
                    &cert.cert_pem,
                    &cert.key_pem,
                ),
            ),
            context: None,
        });
        let running = Running::start(&c).await;
        running.ready().await;
        let kubelet_kc = write(
            &dir,
            "kubelet.kubeconfig",
            &apimachinery::kubeconfig::with_certificate(
                &running.url,
                &proxy_ca.cert_pem(),
                &user,
                &cert.cert_pem,
                &cert.key_pem,
            ),
        );
        kubelets.push(cp.hollow(Morph::Kubelet, &node, &kubelet_kc, &[]).unwrap());
        node_proxies.push(running);
    }
    let nodes: Vec<String> = (0..k).map(|i| format!("tier-node-{i}")).collect();
    let started = Instant::now();
    eventually(Duration::from_secs(120), "every hollow node Ready", || {
        let (admin, nodes) = (admin.clone(), nodes.clone());
        async move {
            for n in &nodes {
                let r = admin.get(&format!("/api/v1/nodes/{n}")).await;
                if r.status != 200 || !condition_true(&r.json(), "Ready") {
                    return None;
                }
            }
            Some(())
        }
    })
    .await;
    let ready_in = started.elapsed();
    for (name, kind) in [("cfg", "configmaps"), ("sec", "secrets")] {
        let body = if kind == "configmaps" {
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1"}})
        } else {
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"a": "1"}})
        };
        let r = admin
            .post_json(&format!("/api/v1/namespaces/{ns}/{kind}"), &body)
            .await;
        assert!(r.status == 201 || r.status == 409, "{}", r.text());
    }
    let pod = |name: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name},
               "spec": {"nodeName": node, "automountServiceAccountToken": false,
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                        "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}},
                                    {"name": "sec", "secret": {"secretName": "sec"}}]}})
    };
    const PODS_PER_NODE: usize = 3;
    for n in &nodes {
        for j in 0..PODS_PER_NODE {
            let r = admin
                .post_json(
                    &format!("/api/v1/namespaces/{ns}/pods"),
                    &pod(&format!("{n}-{j}"), n),
                )
                .await;
            assert_eq!(r.status, 201, "{}", r.text());
        }
    }
    let running_pods = |want: usize| {
        let admin = admin.clone();
        move || {
            let admin = admin.clone();
            async move {
                let r = admin.get(&format!("/api/v1/namespaces/{ns}/pods")).await;
                let items = r.json()["items"].as_array().cloned().unwrap_or_default();
                let running = items
                    .iter()
                    .filter(|p| p["status"]["phase"] == "Running" && condition_true(p, "Ready"))
                    .count();
                (running >= want).then_some(())
            }
        }
    };
    eventually(
        Duration::from_secs(120),
        "every pod Running",
        running_pods(k * PODS_PER_NODE),
    )
    .await;

    // The apiserver serves the tier's watches and nobody else's: per
    // resource, its added watches are what the tier holds open.
    let (apiserver, tier_watches) = eventually(
        Duration::from_secs(60),
        "the apiserver's watches to be the tier's",
        || {
            let (admin, tier, baseline) = (admin.clone(), &tier, &baseline);
            async move {
                let now = apiserver_watches(&admin.get("/metrics").await.text());
                let (_, m) = tier.admin_get("/metrics").await;
                let held = proxy_upstream_watches(&m);
                let added: BTreeMap<String, f64> = now
                    .iter()
                    .map(|(r, v)| (r.clone(), v - baseline.get(r).copied().unwrap_or(0.0)))
                    .filter(|(_, v)| *v != 0.0)
                    .collect();
                let matches = added
                    .iter()
                    .all(|(r, v)| (held.get(r).copied().unwrap_or(0.0) - v).abs() < 0.5)
                    && held.get("configmaps").copied().unwrap_or(0.0) >= 1.0;
                matches.then_some((added, held))
            }
        },
    )
    .await;
    // The kubelets' per-object ConfigMap and Secret watches were served by
    // the tier, from its cache.
    for kind in ["configmaps", "secrets"] {
        eventually(
            Duration::from_secs(60),
            &format!("every kubelet's {kind} watch served by the tier"),
            || {
                let tier = &tier;
                async move {
                    let (_, m) = tier.admin_get("/metrics").await;
                    let served = metric_sum(
                        &m,
                        "kube_cache_proxy_requests_total",
                        &[("verb", "WATCH"), ("resource", kind), ("source", "cache")],
                    );
                    (served >= k as f64).then_some(())
                }
            },
        )
        .await;
    }
    // The tier's own requests (its reviews, lists and watches) are in its
    // own priority level (manifests/tier/flowcontrol.yaml), not in the
    // default `kube-system-service-accounts` schema's `workload-high`.
    let own_level = metric_sum(
        &admin.get("/metrics").await.text(),
        "apiserver_flowcontrol_dispatched_requests_total",
        &[
            ("flow_schema", "kube-cache-proxy-tier"),
            ("priority_level", "kube-cache-proxy-tier"),
        ],
    );
    assert!(
        own_level >= k as f64,
        "the tier's requests in its priority level: {own_level}"
    );
    let cpu = |m: &str| metric_sum(m, "process_cpu_seconds_total", &[]);
    let rss = |m: &str| metric_sum(m, "process_resident_memory_bytes", &[]);
    let m0 = admin.get("/metrics").await.text();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let m1 = admin.get("/metrics").await.text();
    println!(
        "K={k}: ready in {ready_in:?}; apiserver watches added {apiserver:?} (total {}), the \
         tier holds {tier_watches:?}; apiserver CPU {:.3} cores over 10 s, RSS {} MiB",
        apiserver.values().sum::<f64>(),
        (cpu(&m1) - cpu(&m0)) / 10.0,
        rss(&m1) as u64 >> 20
    );

    // The tier goes away: the node proxies move to the apiserver and the
    // kubelets carry on.
    tier.stop().await.unwrap();
    let extra = format!("{}-extra", nodes[0]);
    let r = admin
        .post_json(
            &format!("/api/v1/namespaces/{ns}/pods"),
            &pod(&extra, &nodes[0]),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let down = Instant::now();
    eventually(
        Duration::from_secs(90),
        "a new pod Running with the tier down",
        running_pods(k * PODS_PER_NODE + 1),
    )
    .await;
    let on_fallback_in = down.elapsed();
    // It comes back: the node proxies return, and the apiserver's watches
    // are the tier's again.
    for p in &node_proxies {
        let (_, m) = p.admin_get("/metrics").await;
        assert_eq!(
            metric_sum(&m, "kube_cache_proxy_upstream_fallback_active", &[]),
            1.0,
            "a node proxy did not fall back"
        );
    }
    let mut tier = Running::start(&tier_config).await;
    tier.ready().await;
    let back = Instant::now();
    eventually(
        Duration::from_secs(40),
        "every node proxy back on the tier",
        || {
            let node_proxies = &node_proxies;
            async move {
                for p in node_proxies {
                    let (_, m) = p.admin_get("/metrics").await;
                    if metric_sum(&m, "kube_cache_proxy_upstream_fallback_active", &[]) != 0.0 {
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
    let returned_in = back.elapsed();
    eventually(
        Duration::from_secs(150),
        "the node proxies back on the tier",
        || {
            let (admin, tier, baseline) = (admin.clone(), &tier, &baseline);
            async move {
                let now = apiserver_watches(&admin.get("/metrics").await.text());
                let (_, m) = tier.admin_get("/metrics").await;
                let held = proxy_upstream_watches(&m);
                if std::env::var("KCP_TIER_DEBUG").is_ok() {
                    eprintln!("apiserver {now:?}\nbaseline {baseline:?}\ntier {held:?}");
                    for l in m.lines().filter(|l| {
                        l.starts_with("kube_cache_proxy_requests_in_flight")
                            || (l.starts_with("kube_cache_proxy_cache_reads_total")
                                && l.contains("WATCH")
                                && l.contains("source=\"upstream\""))
                    }) {
                        eprintln!("tier: {l}");
                    }
                }
                now.iter()
                    .all(|(r, v)| {
                        (v - baseline.get(r).copied().unwrap_or(0.0)
                            - held.get(r).copied().unwrap_or(0.0))
                        .abs()
                            < 0.5
                    })
                    .then_some(())
            }
        },
    )
    .await;
    println!(
        "tier down: a new pod Running after {on_fallback_in:?}; tier back: node proxies back \
         on it after {returned_in:?}, the apiserver's watches the tier's again after {:?}",
        back.elapsed()
    );
    drop(kubelets);
    for mut p in node_proxies {
        let _ = p.stop().await;
    }
    let _ = tier.stop().await;
}
