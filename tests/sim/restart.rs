#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Restarts through the real proxy over TLS, in front of the simulated
//! apiserver: a restarted proxy resumes every upstream watch from its
//! snapshot instead of listing, and a snapshot that is corrupt, truncated
//! or from another cluster is discarded, never served.

use crate::support;

use std::path::PathBuf;

use kube_apiserver_sim::{Sim, SimConfig};
use kube_cache_proxy::component::config::Config;
use serde_json::{Value, json};
use support::env::{Running, tempdir};
use support::{Client, Env, Identity};

fn cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "r"}, "data": {"k": name}})
}

fn with_snapshots(dir: PathBuf) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        support::cache_configmaps(c);
        c.cache.persistence.directory = Some(dir);
    }
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

async fn metric(running: &Running, prefix: &str) -> f64 {
    let (_, text) = running.admin_get("/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Lists of every resource the sim has served, but the `limit=1` probes
/// (a resumed watch checks that upstream's history did not go back:
/// `cache/reflector.rs`).
fn lists(sim: &Sim) -> u64 {
    sim.full_lists(None)
}

/// Waits until the proxy's `resourceVersion=0` list of namespace `r`'s
/// configmaps has `want`.
async fn until_listed(c: &Client, want: &[&str]) {
    let deadline = std::time::Instant::now() + support::SOON;
    loop {
        let l = c
            .get("/api/v1/namespaces/r/configmaps?resourceVersion=0")
            .await
            .json();
        if names(&l) == want {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "listed {l}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_restarted_proxy_resumes_from_its_snapshots_without_listing() {
    let dir = tempdir().join("snapshots");
    let mut env = Env::start_with(SimConfig::default(), with_snapshots(dir.clone())).await;
    env.ready().await;
    let gvr = support::configmaps();
    for name in ["a", "b"] {
        env.sim.create(&gvr, cm(name)).unwrap();
    }
    let admin = Identity::admin().auth(&env.sim);
    until_listed(&env.proxy(admin.clone()), &["a", "b"]).await;
    env.stop_proxy().await.unwrap();
    assert!(dir.join("configmaps.v1.snapshot").is_file());
    assert!(
        dir.join("endpointslices.v1.discovery.k8s.io.snapshot")
            .is_file()
    );

    // While no proxy runs, the world moves on.
    env.sim.create(&gvr, cm("c")).unwrap();
    let lists_before = lists(&env.sim);
    let second = Running::start(&env.config).await;
    second.ready().await;
    let c = Client::new(&second.url, &env.proxy_ca_pem, admin, false);
    until_listed(&c, &["a", "b", "c"]).await;
    assert_eq!(
        lists(&env.sim),
        lists_before,
        "no upstream list after the restart"
    );
    let resources = env.config.cache.resources.len() as f64;
    assert_eq!(
        metric(
            &second,
            "kube_cache_proxy_cache_snapshots_total{group=\"\",operation=\"load\",resource=\"configmaps\",result=\"loaded\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(&second, "kube_cache_proxy_upstream_relists_total").await,
        0.0,
        "{resources} resources resumed"
    );
}

/// The first snapshots are written as soon as the initial lists land, not
/// after `intervalSeconds` (60 s by default): a node that loses the
/// apiserver, or crashes, in its first minute has them to restart from.
#[tokio::test]
async fn the_first_snapshots_are_written_as_soon_as_the_caches_are_synced() {
    let dir = tempdir().join("snapshots");
    let env = Env::start_with(SimConfig::default(), with_snapshots(dir.clone())).await;
    assert_eq!(env.config.cache.persistence.interval_seconds, 60);
    env.ready().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for resource in &env.config.cache.resources {
        let group = if resource.group.is_empty() {
            String::new()
        } else {
            format!(".{}", resource.group)
        };
        let file = dir.join(format!(
            "{}.{}{group}.snapshot",
            resource.resource, resource.version
        ));
        while !file.is_file() {
            assert!(
                std::time::Instant::now() < deadline,
                "no {} within 10 s of the caches' first lists",
                file.display()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn corrupt_truncated_or_foreign_snapshots_are_discarded_never_served() {
    let dir = tempdir().join("snapshots");
    let mut env = Env::start_with(SimConfig::default(), with_snapshots(dir.clone())).await;
    env.ready().await;
    let gvr = support::configmaps();
    env.sim.create(&gvr, cm("a")).unwrap();
    let admin = Identity::admin().auth(&env.sim);
    until_listed(&env.proxy(admin.clone()), &["a"]).await;
    env.stop_proxy().await.unwrap();
    let file = dir.join("configmaps.v1.snapshot");
    let good = std::fs::read(&file).unwrap();

    // Corrupt (one byte changed inside an object), then truncated: the
    // configmaps cache lists, the others resume; what is served is the
    // apiserver's state.
    env.sim.create(&gvr, cm("b")).unwrap();
    let mut corrupt = good.clone();
    let at = good.windows(3).position(|w| w == br#""a""#).unwrap() + 1;
    corrupt[at] = b'z';
    for bad in [corrupt, good[..good.len() - 10].to_vec()] {
        std::fs::write(&file, bad).unwrap();
        let lists_before = env.sim.stats().lists("configmaps");
        let mut running = Running::start(&env.config).await;
        running.ready().await;
        let c = Client::new(&running.url, &env.proxy_ca_pem, admin.clone(), false);
        until_listed(&c, &["a", "b"]).await;
        assert_eq!(env.sim.stats().lists("configmaps"), lists_before + 1);
        assert_eq!(
            metric(
                &running,
                "kube_cache_proxy_cache_snapshots_total{group=\"\",operation=\"load\",resource=\"configmaps\",result=\"discarded\"}"
            )
            .await,
            1.0
        );
        running.stop().await.unwrap();
    }

    // Another cluster (another CA, and its own resourceVersions) with the
    // same snapshot directory: every snapshot is discarded.
    let other = Sim::start(SimConfig::default()).await.unwrap();
    other.create(&gvr, cm("elsewhere")).unwrap();
    let env2 = Env::start_on(other, with_snapshots(dir.clone())).await;
    env2.ready().await;
    let c = env2.proxy(Identity::admin().auth(&env2.sim));
    until_listed(&c, &["elsewhere"]).await;
    let discarded = {
        let (_, text) = env2.admin_get("/metrics").await;
        text.lines()
            .filter(|l| {
                l.starts_with("kube_cache_proxy_cache_snapshots_total{")
                    && l.contains("result=\"discarded\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert_eq!(discarded, env2.config.cache.resources.len() as f64);
}
