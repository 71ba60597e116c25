#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Upstream trouble during active watches: a killed connection resumes
//! from the cache's RV; a `410` relists, and the difference reaches
//! downstream watchers as ordinary events — they never see a `410` and end
//! in the right state.

use crate::support;
use support::item_names as names;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use apimachinery::resource::Gvr;
use kube_apiserver_sim::SimConfig;
use serde_json::{Value, json};
use support::{Env, Identity, Next, QUIET, SOON, WatchStream};

fn cms() -> Gvr {
    support::configmaps()
}

fn cm(name: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "f", "labels": {"app": app}}, "data": {"k": name}})
}

async fn env() -> Env {
    let env = Env::start_with(SimConfig::default(), |c| {
        support::cache_configmaps(c);
    })
    .await;
    env.ready().await;
    env
}

async fn metric(env: &Env, needle: &str) -> f64 {
    let (_, text) = env.admin_get("/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Applies watch events to a model of the selected objects.
#[derive(Default, Debug)]
struct Model {
    objects: BTreeMap<String, Value>,
    last_rv: u64,
}

impl Model {
    fn apply(&mut self, e: &Value) {
        let kind = e["type"].as_str().unwrap();
        assert_ne!(kind, "ERROR", "a downstream watcher saw an error: {e}");
        let obj = &e["object"];
        let rv: u64 = obj["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            rv >= self.last_rv,
            "RVs go backwards: {rv} after {}",
            self.last_rv
        );
        if kind != "BOOKMARK" {
            assert!(
                rv > self.last_rv || self.last_rv == 0,
                "duplicate RV {rv}: {e}"
            );
        }
        self.last_rv = rv;
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match kind {
            "ADDED" => {
                assert!(!self.objects.contains_key(&name), "ADDED twice: {name}");
                self.objects.insert(name, obj.clone());
            }
            "MODIFIED" => {
                assert!(self.objects.contains_key(&name), "MODIFIED unknown {name}");
                self.objects.insert(name, obj.clone());
            }
            "DELETED" => {
                assert!(
                    self.objects.remove(&name).is_some(),
                    "DELETED unknown {name}"
                );
            }
            _ => {}
        }
    }

    /// Reads events until the model matches `want` (name → data.k and
    /// labels), then checks nothing else arrives.
    async fn follow_until(&mut self, w: &mut WatchStream, want: &BTreeMap<String, String>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.summary() != *want {
            assert!(
                Instant::now() < deadline,
                "model {:?}, want {want:?}",
                self.summary()
            );
            match w.next(SOON).await {
                Next::Event(e) => self.apply(&e),
                other => panic!("stream ended: {other:?}; model {:?}", self.summary()),
            }
        }
        loop {
            match w.next(QUIET).await {
                Next::Timeout => break,
                Next::Event(e) => {
                    self.apply(&e);
                    assert_eq!(self.summary(), *want, "extra event {e}");
                }
                other => panic!("stream ended: {other:?}"),
            }
        }
    }

    fn summary(&self) -> BTreeMap<String, String> {
        self.objects
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v["metadata"]["labels"]["app"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
            })
            .collect()
    }
}

fn want(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn relist_after_410_reaches_watchers_as_events() {
    let env = env().await;
    let c = env.proxy_h2(Identity::admin().auth(&env.sim));
    for (n, app) in [("a", "x"), ("b", "x"), ("c", "x")] {
        env.sim.create(&cms(), cm(n, app)).unwrap();
    }
    let list = c.get("/api/v1/namespaces/f/configmaps").await.json();
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut all = c
        .watch(
            &format!("/api/v1/namespaces/f/configmaps?watch=1&resourceVersion={rv}"),
            &[],
        )
        .await;
    let mut ys = c
        .watch(
            &format!(
                "/api/v1/namespaces/f/configmaps?watch=1&resourceVersion={rv}&labelSelector=app%3Dy"
            ),
            &[],
        )
        .await;
    let mut streaming = c
        .watch("/api/v1/namespaces/f/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", &[])
        .await;
    let mut m_all = Model::default();
    for (n, app) in [("a", "x"), ("b", "x"), ("c", "x")] {
        m_all.objects.insert(n.into(), cm(n, app));
    }
    let mut m_ys = Model::default();
    let mut m_stream = Model::default();
    m_stream
        .follow_until(&mut streaming, &want(&[("a", "x"), ("b", "x"), ("c", "x")]))
        .await;
    let relists = metric(
        &env,
        "kube_cache_proxy_upstream_relists_total{group=\"\",resource=\"configmaps\"}",
    )
    .await;

    // Upstream goes away; while it is gone, objects change and its history
    // is compacted, so the proxy's resume point is gone too.
    env.sim.stop().await;
    env.sim.create(&cms(), cm("d", "x")).unwrap();
    let mut b = env.sim.get(&cms(), "f", "b").unwrap();
    b["metadata"]["labels"]["app"] = json!("y");
    env.sim.update(&cms(), b).unwrap();
    env.sim.delete(&cms(), "f", "c").unwrap();
    env.sim.compact();
    env.sim.restart().await.unwrap();

    let after = want(&[("a", "x"), ("b", "y"), ("d", "x")]);
    m_all.follow_until(&mut all, &after).await;
    m_ys.follow_until(&mut ys, &want(&[("b", "y")])).await;
    m_stream.follow_until(&mut streaming, &after).await;
    assert!(
        metric(
            &env,
            "kube_cache_proxy_upstream_relists_total{group=\"\",resource=\"configmaps\"}"
        )
        .await
            > relists
    );
    assert!(metric(&env, "kube_cache_proxy_upstream_watch_restarts_total{group=\"\",reason=\"expired\",resource=\"configmaps\"}").await >= 1.0);

    // Live events keep flowing on the same streams.
    c.post_json("/api/v1/namespaces/f/configmaps", &cm("e", "y"))
        .await;
    m_all
        .follow_until(
            &mut all,
            &want(&[("a", "x"), ("b", "y"), ("d", "x"), ("e", "y")]),
        )
        .await;
    m_ys.follow_until(&mut ys, &want(&[("b", "y"), ("e", "y")]))
        .await;
    // And the cache agrees with upstream.
    let via = c
        .get("/api/v1/namespaces/f/configmaps?resourceVersion=0")
        .await
        .json();
    let direct = env
        .direct(Identity::admin().auth(&env.sim))
        .get("/api/v1/namespaces/f/configmaps")
        .await
        .json();
    assert_eq!(via["items"], direct["items"]);
}

#[tokio::test]
async fn a_killed_upstream_connection_resumes_without_relisting() {
    let env = env().await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    env.sim.create(&cms(), cm("a", "x")).unwrap();
    let rv = c.get("/api/v1/namespaces/f/configmaps").await.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w = c
        .watch(
            &format!("/api/v1/namespaces/f/configmaps?watch=1&resourceVersion={rv}"),
            &[],
        )
        .await;
    let mut m = Model::default();
    m.objects.insert("a".into(), cm("a", "x"));
    let relists = metric(
        &env,
        "kube_cache_proxy_upstream_relists_total{group=\"\",resource=\"configmaps\"}",
    )
    .await;
    for round in 0..3 {
        env.sim.drop_watches();
        // Changes made while the proxy reconnects are not lost.
        env.sim
            .create(&cms(), cm(&format!("r{round}"), "x"))
            .unwrap();
        let mut expected = want(&[("a", "x")]);
        for r in 0..=round {
            expected.insert(format!("r{r}"), "x".into());
        }
        m.follow_until(&mut w, &expected).await;
    }
    assert_eq!(
        metric(
            &env,
            "kube_cache_proxy_upstream_relists_total{group=\"\",resource=\"configmaps\"}"
        )
        .await,
        relists,
        "resumed from the cache's RV, no relist"
    );
    assert!(metric(&env, "kube_cache_proxy_upstream_watch_restarts_total{group=\"\",reason=\"error\",resource=\"configmaps\"}").await >= 3.0);
}

/// An upstream that answers but refuses the cache's own watch (`403`: the
/// proxy's role edited, or restarted apiservers whose authorizers are not
/// ready, as after an etcd restore) is not an upstream that cannot be
/// reached: what the cache kept is not served meanwhile, reads pass
/// through and get the apiserver's answer, and the cache serves again
/// once its watch is allowed (docs/reliability.md, finding 10).
#[tokio::test]
async fn reads_pass_through_while_upstream_refuses_the_caches_watch() {
    let env = env().await;
    let admin = env.proxy(Identity::admin().auth(&env.sim));
    let list = "/api/v1/namespaces/f/configmaps?resourceVersion=0";
    let refused = "kube_cache_proxy_cache_reads_total{group=\"\",reason=\"upstream_refused\",resource=\"configmaps\",source=\"upstream\",verb=\"LIST\"}";
    env.sim.create(&cms(), cm("a", "x")).unwrap();
    let deadline = Instant::now() + SOON;
    while names(&admin.get(list).await.json()) != ["a"] {
        assert!(Instant::now() < deadline, "never listed a");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&env, refused).await, 0.0);

    env.sim.policy().withhold_from_proxy("configmaps", true);
    env.sim.drop_watches();
    env.sim.create(&cms(), cm("b", "x")).unwrap();
    // The cache cannot see b; the apiserver, asked for the admin, can.
    let deadline = Instant::now() + SOON;
    loop {
        let r = admin.get(list).await;
        assert_eq!(r.status, 200, "{}", r.text());
        if names(&r.json()) == ["a", "b"] {
            break;
        }
        assert!(Instant::now() < deadline, "served {}", r.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(metric(&env, refused).await >= 1.0);

    // Allowed again: the cache catches up and serves.
    env.sim.policy().withhold_from_proxy("configmaps", false);
    env.sim.create(&cms(), cm("c", "x")).unwrap();
    let from_cache = "kube_cache_proxy_cache_reads_total{group=\"\",reason=\"\",resource=\"configmaps\",source=\"cache\",verb=\"LIST\"}";
    let deadline = Instant::now() + SOON;
    loop {
        let before = metric(&env, from_cache).await;
        let r = admin.get(list).await;
        if names(&r.json()) == ["a", "b", "c"] && metric(&env, from_cache).await > before {
            break;
        }
        assert!(Instant::now() < deadline, "served {}", r.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// etcd restored without `--bump-revision`, where one cache's
/// resourceVersion lies in the history the restore lost and the new
/// history has passed it by the time the proxy reconnects: no probe of
/// that cache can tell (upstream is ahead of it again), and its resumed
/// watch is accepted. Another cache, further ahead, finds upstream below
/// it; every cache of the proxy then relists, and the first one serves
/// the restored world too, not a version the new history never had
/// (docs/reliability.md, finding 11: a tier replica served a Node's lost
/// version until its consistency check, minutes later).
#[tokio::test]
async fn a_history_gone_back_found_by_one_cache_relists_every_cache() {
    let env = env().await;
    let admin = env.proxy(Identity::admin().auth(&env.sim));
    let namespaces = Gvr {
        group: String::new(),
        version: "v1".into(),
        resource: "namespaces".into(),
    };
    let ns = |label: &str| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rewound", "labels": {"world": label}}});
    let cached_label = |admin: &support::Client| {
        let admin = admin.clone();
        async move {
            let r = admin
                .get("/api/v1/namespaces/rewound?resourceVersion=0")
                .await
                .json();
            r["metadata"]["labels"]["world"]
                .as_str()
                .map(str::to_string)
        }
    };
    env.sim.create(&namespaces, ns("backup")).unwrap();
    let backup = env.sim.backup();
    // The lost history: the namespace changes once, then the configmaps
    // move on well past it.
    env.sim.update(&namespaces, ns("lost")).unwrap();
    for i in 0..10 {
        env.sim
            .create(&cms(), cm(&format!("lost-{i}"), "x"))
            .unwrap();
    }
    let list = "/api/v1/namespaces/f/configmaps?resourceVersion=0";
    let deadline = Instant::now() + SOON;
    while cached_label(&admin).await.as_deref() != Some("lost")
        || names(&admin.get(list).await.json()).len() != 10
    {
        assert!(Instant::now() < deadline, "the lost history never cached");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Restored, every apiserver restarted; the new history passes the
    // namespace cache's resourceVersion before the proxy reconnects, and
    // stays below the configmap cache's.
    env.sim.stop().await;
    env.sim.restore(&backup);
    for i in 0..3 {
        env.sim
            .create(&cms(), cm(&format!("new-{i}"), "x"))
            .unwrap();
    }
    env.sim.restart().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = names(&admin.get(list).await.json());
        let label = cached_label(&admin).await;
        if listed == ["new-0", "new-1", "new-2"] && label.as_deref() == Some("backup") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the proxy serves {listed:?} and the namespace as {label:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
