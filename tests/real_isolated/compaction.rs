//! History ends where the apiserver's does: against a real kube-apiserver
//! v1.36 that compacts etcd every 10 s (`--etcd-compaction-interval=10s`;
//! the default is 5 minutes), reads at an exact resourceVersion through the
//! proxy are served from the cache while upstream still serves that
//! revision, and once upstream has compacted it they get the apiserver's
//! own `410 Expired`: a continued list (with its inconsistent-continue
//! token), a `resourceVersionMatch=Exact` list and a legacy `limit` list
//! with a resourceVersion. A watch from the compacted revision is answered
//! as the apiserver answers it: from its watch cache's window.
//!
//! Skipped, with one line, where no control plane is available.

use crate::support;

use std::time::Duration;

use kube_testenv::Options;
use serde_json::{Value, json};
use support::cache_configmaps;
use support::client::Next;
use support::real::{Isolated, RealEnv, eventually, metric_sum};

/// A control plane of its own, compacting every 10 s.
async fn control_plane() -> Option<Isolated> {
    Isolated::start(Options {
        apiserver_args: vec!["--etcd-compaction-interval=10s".into()],
        ..Options::default()
    })
    .await
}

fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": name}})
}

/// A `410 Expired` Status with `message`.
fn assert_expired(r: &support::Resp, message: &str, what: &str) {
    assert_eq!(r.status, 410, "{what}: {}", r.text());
    let s = r.json();
    assert_eq!(s["kind"], "Status", "{what}");
    assert_eq!(s["reason"], "Expired", "{what}");
    assert_eq!(s["code"], 410, "{what}");
    assert!(
        s["message"].as_str().unwrap().starts_with(message),
        "{what}: {}",
        s["message"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_reads_past_compaction_answer_as_the_apiserver() {
    let Some(plane) = control_plane().await else {
        return;
    };
    let cp = plane.cp();
    let env = RealEnv::start_on(cp, cache_configmaps).await;
    let ns = env.namespace("compaction").await;
    let base = format!("/api/v1/namespaces/{ns}/configmaps");
    for i in 0..30 {
        env.create(&base, configmap(&format!("cm-{i:02}"))).await;
    }
    let proxy = env.proxy(env.admin());
    let direct = env.apiserver();

    // A paginated list through the proxy, at the cache's resourceVersion.
    let first = eventually(
        Duration::from_secs(10),
        "the cache holds the 30",
        || async {
            let r = proxy
                .get(&format!("{base}?limit=10&resourceVersion=0"))
                .await;
            (r.json()["items"].as_array().unwrap().len() == 30).then_some(())
        },
    )
    .await;
    let () = first;
    let r = proxy.get(&format!("{base}?limit=10")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let page = r.json();
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    let rv: u64 = page["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let continued = format!("{base}?limit=10&continue={token}");
    let exact = format!("{base}?resourceVersion={rv}&resourceVersionMatch=Exact");
    let legacy = format!("{base}?resourceVersion={rv}&limit=5");

    // While upstream serves the revision, so does the cache.
    let before = env.proxy_metrics().await;
    for path in [&continued, &exact, &legacy] {
        let (p, d) = (proxy.get(path).await, direct.get(path).await);
        assert_eq!(
            (p.status.as_u16(), d.status.as_u16()),
            (200, 200),
            "{path}: {}",
            p.text()
        );
        assert_eq!(p.json()["items"], d.json()["items"], "{path}");
    }
    let after = env.proxy_metrics().await;
    let from_cache = |m: &str| {
        metric_sum(
            m,
            "kube_cache_proxy_cache_reads_total",
            &[
                ("resource", "configmaps"),
                ("verb", "LIST"),
                ("source", "cache"),
            ],
        )
    };
    assert_eq!(from_cache(&after) - from_cache(&before), 3.0);
    // One probe proved the revision alive for all three.
    let probes = |m: &str, result: &str| {
        metric_sum(
            m,
            "kube_cache_proxy_cache_compaction_probes_total",
            &[("resource", "configmaps"), ("result", result)],
        )
    };
    assert_eq!(probes(&after, "alive") - probes(&before, "alive"), 1.0);

    // Other writes move etcd's revision on; the apiserver compacts.
    let other = env.namespace("compaction-other").await;
    eventually(
        Duration::from_secs(60),
        "the apiserver compacts the revision",
        || async {
            env.create(
                &format!("/api/v1/namespaces/{other}/configmaps"),
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "tick-"}}),
            )
            .await;
            (direct.get(&exact).await.status == 410).then_some(())
        },
    )
    .await;

    // Now each gets the apiserver's 410, whether or not the cache could
    // still rebuild the state.
    let (p, d) = (proxy.get(&continued).await, direct.get(&continued).await);
    let continue_message =
        "The provided continue parameter is too old to display a consistent list result.";
    assert_expired(&d, continue_message, "continue, direct");
    assert_expired(&p, continue_message, "continue, proxy");
    // The inconsistent-continue token to go on with.
    assert!(
        p.json()["metadata"]["continue"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
    );
    for path in [&exact, &legacy] {
        let (p, d) = (proxy.get(path).await, direct.get(path).await);
        let message = "The resourceVersion for the provided list is too old.";
        assert_expired(&d, message, &format!("{path}, direct"));
        assert_expired(&p, message, &format!("{path}, proxy"));
        assert_eq!(p.json(), d.json(), "{path}");
    }
    let m = env.proxy_metrics().await;
    assert!(probes(&m, "compacted") >= 1.0, "a probe found it compacted");
    assert!(
        metric_sum(
            &m,
            "kube_cache_proxy_cache_reads_total",
            &[
                ("resource", "configmaps"),
                ("source", "upstream"),
                ("reason", "compacted")
            ],
        ) >= 3.0
    );

    // A watch from the compacted revision: as the apiserver, which serves
    // it from its own watch cache (no events since, so none; then the next
    // change).
    let path = format!("{base}?watch=1&resourceVersion={rv}");
    let mut p = proxy.watch(&path, &[]).await;
    let mut d = direct.watch(&path, &[]).await;
    env.create(&base, configmap("cm-after")).await;
    for (what, stream) in [("proxy", &mut p), ("direct", &mut d)] {
        match stream.next(Duration::from_secs(10)).await {
            Next::Event(e) => {
                assert_eq!(e["type"], "ADDED", "{what}: {e}");
                assert_eq!(e["object"]["metadata"]["name"], "cm-after", "{what}: {e}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}
