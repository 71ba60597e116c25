#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Restarts through the real proxy over TLS, in front of the simulated
//! apiserver: a restarted proxy resumes every upstream watch from its
//! snapshot instead of listing, and a snapshot that is corrupt, truncated
//! or from another cluster is discarded, never served.

use crate::support;
use support::item_names as names;

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

async fn metric(running: &Running, prefix: &str) -> f64 {
    let (_, text) = running.admin_get("/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Lists of every resource the sim has served, but the `limit=1` probes
/// (a resumed watch checks that upstream's history did not go back:
/// `cache/ingest/reflector.rs`).
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

/// After a crash, the proxy resumes from its periodic snapshot, older
/// than what it served; the events it then receives for the
/// resourceVersions in between need not be those the crashed process sent
/// (docs/reliability.md, finding 9). Once caught up, a watch from one of
/// them gets `410 Gone`, as from a restarted kube-apiserver, and its
/// client lists again; the snapshot's resourceVersion and the cache's are
/// served.
#[tokio::test]
async fn after_a_crash_a_watch_from_what_the_crashed_process_served_gets_410() {
    let dir = tempdir().join("snapshots");
    let mut env = Env::start_with(SimConfig::default(), with_snapshots(dir.clone())).await;
    env.ready().await;
    let admin = Identity::admin().auth(&env.sim);
    let first = env.proxy(admin.clone());
    let snapshot_rv = rv(&first
        .get("/api/v1/namespaces/r/configmaps?resourceVersion=0")
        .await
        .json());
    // The first snapshots, written at the first lists: what a crash
    // leaves on disk (no clean mark).
    let file = dir.join("configmaps.v1.snapshot");
    let deadline = std::time::Instant::now() + support::SOON;
    while !file.is_file() {
        assert!(std::time::Instant::now() < deadline, "no snapshot");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let crashed = tempdir().join("crashed");
    std::fs::create_dir_all(&crashed).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "snapshot") {
            std::fs::copy(&path, crashed.join(path.file_name().unwrap())).unwrap();
        }
    }
    let gvr = support::configmaps();
    for name in ["a", "b"] {
        env.sim.create(&gvr, cm(name)).unwrap();
    }
    until_listed(&first, &["a", "b"]).await;
    let served = rv(&first
        .get("/api/v1/namespaces/r/configmaps?resourceVersion=0")
        .await
        .json());
    assert!(served > snapshot_rv + 1);
    env.stop_proxy().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::rename(&crashed, &dir).unwrap();

    // While no proxy runs, the world moves on.
    env.sim.create(&gvr, cm("c")).unwrap();
    let second = Running::start(&env.config).await;
    let c = Client::new(&second.url, &env.proxy_ca_pem, admin, false);
    // Sent at once: it waits for the cache to catch up, then is refused.
    let mut w = c
        .watch(
            &format!("/api/v1/namespaces/r/configmaps?watch=1&resourceVersion={served}"),
            &[],
        )
        .await;
    assert_eq!(w.status, 200);
    match w.next(std::time::Duration::from_secs(15)).await {
        support::Next::Event(e) => {
            assert_eq!(e["type"], "ERROR", "{e}");
            assert_eq!(e["object"]["code"], 410, "{e}");
            assert_eq!(e["object"]["reason"], "Expired", "{e}");
            let message = e["object"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(&format!("too old resource version: {served} (")),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    second.ready().await;
    // From the snapshot's resourceVersion: every change since.
    let mut w = c
        .watch(
            &format!("/api/v1/namespaces/r/configmaps?watch=1&resourceVersion={snapshot_rv}"),
            &[],
        )
        .await;
    let mut added = Vec::new();
    while added.len() < 3 {
        match w.next(std::time::Duration::from_secs(5)).await {
            support::Next::Event(e) => {
                assert_eq!(e["type"], "ADDED", "{e}");
                added.push(
                    e["object"]["metadata"]["name"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                );
            }
            other => panic!("{other:?} after {added:?}"),
        }
    }
    assert_eq!(added, ["a", "b", "c"]);
    // The client lists again, and watches from what it got.
    let list = c
        .get("/api/v1/namespaces/r/configmaps?resourceVersion=0")
        .await
        .json();
    assert_eq!(names(&list), ["a", "b", "c"]);
    let mut w = c
        .watch(
            &format!(
                "/api/v1/namespaces/r/configmaps?watch=1&resourceVersion={}",
                rv(&list)
            ),
            &[],
        )
        .await;
    env.sim.create(&gvr, cm("d")).unwrap();
    match w.next(std::time::Duration::from_secs(5)).await {
        support::Next::Event(e) => {
            assert_eq!(e["type"], "ADDED", "{e}");
            assert_eq!(e["object"]["metadata"]["name"], "d", "{e}");
        }
        other => panic!("{other:?}"),
    }
}

fn rv(list: &Value) -> u64 {
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}
