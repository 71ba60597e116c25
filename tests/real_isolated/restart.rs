//! Restarting the proxy in front of a real kube-apiserver v1.36: with its
//! cache persisted, the new process lists nothing upstream but one
//! `limit=1` probe per cached resource, which checks that etcd's history
//! did not go back while it was down (the apiserver's own
//! `apiserver_request_total{verb="LIST"}` says so); it resumes each watch
//! from its snapshot and serves what changed meanwhile.
//!
//! Skipped, with one line, where no control plane is available.

use crate::support;

use std::time::Duration;

use kube_testenv::Options;
use serde_json::json;
use support::env::Running;
use support::real::{Isolated, RealEnv, eventually, metric_sum};

/// The apiserver's LISTs of the resources the proxy caches.
async fn upstream_lists(env: &RealEnv) -> f64 {
    let text = env.apiserver_metrics().await;
    env.config
        .cache
        .resources
        .iter()
        .map(|r| {
            metric_sum(
                &text,
                "apiserver_request_total",
                &[("verb", "LIST"), ("resource", r.resource.as_str())],
            )
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_proxy_adds_no_upstream_list() {
    let snapshots = support::env::tempdir().join("snapshots");
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let mut env = RealEnv::start_on(plane.cp(), |c| {
        support::cache_configmaps(c);
        c.cache.persistence.directory = Some(snapshots.clone());
    })
    .await;
    let ns = env.namespace("restart").await;
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    env.create(
        &path,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "before"}}),
    )
    .await;
    let admin = env.proxy(env.admin());
    eventually(Duration::from_secs(10), "the cache has the object", || {
        let (admin, path) = (admin.clone(), path.clone());
        async move {
            let l = admin.get(&format!("{path}?resourceVersion=0")).await.json();
            (l["items"].as_array()?.len() == 1).then_some(())
        }
    })
    .await;
    env.running.stop().await.unwrap();

    // Meanwhile, a change.
    env.create(
        &path,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "meanwhile"}}),
    )
    .await;
    let before = upstream_lists(&env).await;
    let started = std::time::Instant::now();
    env.running = Running::start(&env.config).await;
    env.running.ready().await;
    let ready_in = started.elapsed();
    let proxy = support::Client::new(&env.running.url, &env.proxy_ca_pem, env.admin(), false);
    eventually(
        Duration::from_secs(10),
        "the change made while down",
        || {
            let (proxy, path) = (proxy.clone(), path.clone());
            async move {
                let l = proxy.get(&format!("{path}?resourceVersion=0")).await.json();
                (l["items"].as_array()?.len() == 2).then_some(())
            }
        },
    )
    .await;
    // Give any list a moment to show in the apiserver's metrics.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = upstream_lists(&env).await;
    // Only the `limit=1` probes that check, before each resumed watch,
    // that upstream's history did not go back (etcd restored from a
    // backup), which the proxy counts.
    let probes = metric_sum(
        &env.proxy_metrics().await,
        "kube_cache_proxy_cache_consistency_probes_total",
        &[("result", "ok")],
    );
    assert!(
        probes <= env.config.cache.resources.len() as f64,
        "{probes} probes"
    );
    assert_eq!(
        after - before,
        probes,
        "upstream LISTs added by the restart"
    );
    println!(
        "restart: ready in {ready_in:?}; upstream LISTs of the {} cached resources: {before} \
         before, {after} after",
        env.config.cache.resources.len()
    );
}
