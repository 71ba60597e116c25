#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The watch cache's semantics through the real proxy over TLS: consistent
//! reads and read-your-writes, resourceVersion rules, scopes, readiness,
//! bookmarks, slow watchers, and the upstream load it saves.

use crate::support;
use support::item_names as names;

use std::time::{Duration, Instant};

use apimachinery::resource::Gvr;
use http::Method;
use kube_apiserver_sim::SimConfig;
use kube_cache_proxy::component::config::CachedResource;
use serde_json::{Value, json};
use support::{Client, Env, Identity, Next, QUIET, SOON, WatchStream};

fn cms() -> Gvr {
    support::configmaps()
}

fn cm(ns: &str, name: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}, "data": {"k": name}})
}

async fn env_with(customize: impl FnOnce(&mut kube_cache_proxy::component::config::Config)) -> Env {
    let env = Env::start_with(SimConfig::default(), |c| {
        support::cache_configmaps(c);
        customize(c);
    })
    .await;
    env.ready().await;
    env
}

/// The resourceVersion of a list of `path`.
async fn list_rv(c: &Client, path: &str) -> String {
    c.get(path).await.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn metric(env: &Env, prefix: &str) -> f64 {
    let (_, text) = env.admin_get("/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn reads_reflect_writes_that_went_through_the_proxy() {
    let env = env_with(|_| {}).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    for i in 0..10 {
        let name = format!("ryw-{i}");
        let created = c
            .post_json("/api/v1/namespaces/ryw/configmaps", &cm("ryw", &name, "a"))
            .await;
        assert_eq!(created.status, 201);
        // A consistent list and get right after the write see it.
        let list = c.get("/api/v1/namespaces/ryw/configmaps").await;
        assert!(
            names(&list.json()).contains(&name),
            "iteration {i}: {}",
            list.text()
        );
        let got = c
            .get(&format!("/api/v1/namespaces/ryw/configmaps/{name}"))
            .await;
        assert_eq!(got.status, 200);
        // Not older than the write's RV, too.
        let rv = created.json()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let list = c
            .get(&format!(
                "/api/v1/namespaces/ryw/configmaps?resourceVersion={rv}"
            ))
            .await;
        assert!(names(&list.json()).contains(&name));
    }
    assert!(metric(&env, "kube_cache_proxy_cache_reads_total{group=\"\",reason=\"\",resource=\"configmaps\",source=\"cache\",verb=\"LIST\"}").await >= 10.0);
}

#[tokio::test]
async fn consistent_reads_cost_upstream_nothing_extra() {
    let env = env_with(|_| {}).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    c.post_json("/api/v1/namespaces/cr/configmaps", &cm("cr", "one", "a"))
        .await;
    let before = env.sim.stats();
    // A consistent get goes straight upstream: no probe, no review.
    for _ in 0..5 {
        let got = c.get("/api/v1/namespaces/cr/configmaps/one").await;
        assert_eq!(got.status, 200);
    }
    let after = env.sim.stats();
    assert_eq!(
        after.lists("configmaps"),
        before.lists("configmaps"),
        "no probe"
    );
    assert_eq!(
        after.count("get", "configmaps"),
        before.count("get", "configmaps") + 5
    );
    assert_eq!(
        after.count("create", "subjectaccessreviews"),
        before.count("create", "subjectaccessreviews"),
        "no review for a read the cache will not answer"
    );
    assert!(
        metric(
            &env,
            "kube_cache_proxy_cache_reads_total{group=\"\",reason=\"consistent_get\",resource=\"configmaps\",source=\"upstream\",verb=\"GET\"}"
        )
        .await
            >= 5.0
    );
    // 100 concurrent consistent lists share a few probes (one in flight,
    // one queued, for those that arrive together) and are served from the
    // cache, which is current.
    let before = env.sim.stats();
    let lists = (0..100).map(|_| {
        let c = c.clone();
        async move { c.get("/api/v1/namespaces/cr/configmaps").await }
    });
    for list in futures_util::future::join_all(lists).await {
        assert_eq!(names(&list.json()), vec!["one"]);
    }
    let probes = env.sim.stats().lists("configmaps") - before.lists("configmaps");
    assert!((1..=10).contains(&probes), "{probes} probes");
}

#[tokio::test]
async fn consistent_reads_of_a_quiet_resource_are_served_after_a_progress_watch() {
    // Writes to another resource move upstream's RV; the configmap cache
    // only learns it is still current through a progress watch.
    let env = env_with(|c| c.cache.consistent_list_wait_milliseconds = 3000).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    c.post_json("/api/v1/namespaces/q/configmaps", &cm("q", "only", "a"))
        .await;
    let pods = Gvr {
        resource: "pods".into(),
        ..cms()
    };
    for i in 0..3 {
        env.sim
            .create(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("p{i}"), "namespace": "q"}, "spec": {"containers": []}}))
            .unwrap();
    }
    let lists_before = env.sim.stats().lists("configmaps");
    let started = Instant::now();
    let list = c.get("/api/v1/namespaces/q/configmaps").await;
    assert_eq!(names(&list.json()), vec!["only"]);
    assert_eq!(
        env.sim.stats().lists("configmaps"),
        lists_before + 1,
        "one limit=1 probe, no pass-through"
    );
    // The probe reads the list's resourceVersion and asks for metadata
    // only, not its item's spec and status.
    let probe = env
        .sim
        .requests()
        .into_iter()
        .rfind(|r| r.verb == "list" && r.resource == "configmaps")
        .unwrap();
    assert!(probe.query.split('&').any(|p| p == "limit=1"), "{probe:?}");
    assert!(
        probe
            .accept
            .starts_with("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"),
        "{probe:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        metric(
            &env,
            "kube_cache_proxy_cache_progress_watches_total{group=\"\",resource=\"configmaps\"}"
        )
        .await
            >= 1.0
    );
    // With the default short wait, the same read passes through rather than
    // wait: slower at worst, never stale.
    let env = env_with(|_| {}).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    c.post_json("/api/v1/namespaces/q/configmaps", &cm("q", "only", "a"))
        .await;
    env.sim
        .create(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "q"}, "spec": {"containers": []}}))
        .unwrap();
    let probes =
        "kube_cache_proxy_cache_consistency_probes_total{group=\"\",resource=\"configmaps\"";
    let from_cache = "kube_cache_proxy_cache_reads_total{group=\"\",reason=\"\",resource=\"configmaps\",source=\"cache\",verb=\"LIST\"}";
    let probes_before = metric(&env, probes).await;
    let started = Instant::now();
    let list = c.get("/api/v1/namespaces/q/configmaps").await;
    assert_eq!(names(&list.json()), vec!["only"]);
    // Found behind, the cache is not probed again for a second: the lists
    // meanwhile cost upstream one request each, as going direct does.
    for _ in 0..20 {
        let list = c.get("/api/v1/namespaces/q/configmaps").await;
        assert_eq!(names(&list.json()), vec!["only"]);
    }
    let probed = metric(&env, probes).await - probes_before;
    let allowed = 1.0 + started.elapsed().as_secs_f64().floor();
    assert!(
        (1.0..=allowed).contains(&probed),
        "{probed} probes in {:?}",
        started.elapsed()
    );
    // Meanwhile a progress watch brought the quiet cache up to date, so
    // once the second is over it answers again.
    // Lists until one is served from it, within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let served = metric(&env, from_cache).await;
        let list = c.get("/api/v1/namespaces/q/configmaps").await;
        assert_eq!(names(&list.json()), vec!["only"]);
        if metric(&env, from_cache).await == served + 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "never from the cache again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "within the second"
    );
}

#[tokio::test]
async fn a_large_consistent_list_of_a_quiet_resource_waits_for_the_cache_a_small_one_passes_through()
 {
    // `largeListObjects: 3`: the namespace `big` holds 3 configmaps, `small`
    // one. Writes to pods move upstream's RV past the configmap cache's.
    let env = env_with(|c| c.cache.large_list_objects = 3).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    for name in ["a", "b", "c"] {
        c.post_json("/api/v1/namespaces/big/configmaps", &cm("big", name, "x"))
            .await;
    }
    c.post_json(
        "/api/v1/namespaces/small/configmaps",
        &cm("small", "only", "x"),
    )
    .await;
    let pods = Gvr {
        resource: "pods".into(),
        ..cms()
    };
    let write_elsewhere = |i: usize| {
        env.sim
            .create(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("p{i}"), "namespace": "big"}, "spec": {"containers": []}}))
            .unwrap();
    };
    let reads = |source: &str, reason: &str| {
        format!(
            "kube_cache_proxy_cache_reads_total{{group=\"\",reason=\"{reason}\",resource=\"configmaps\",source=\"{source}\",verb=\"LIST\"}}"
        )
    };
    let (from_cache, not_fresh) = (reads("cache", ""), reads("upstream", "not_fresh"));

    write_elsewhere(0);
    let (served, passed) = (
        metric(&env, &from_cache).await,
        metric(&env, &not_fresh).await,
    );
    let started = Instant::now();
    let list = c.get("/api/v1/namespaces/big/configmaps").await;
    assert_eq!(names(&list.json()), vec!["a", "b", "c"]);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(
        metric(&env, &from_cache).await,
        served + 1.0,
        "served from the cache"
    );
    assert_eq!(metric(&env, &not_fresh).await, passed);

    write_elsewhere(1);
    let list = c.get("/api/v1/namespaces/small/configmaps").await;
    assert_eq!(names(&list.json()), vec!["only"]);
    assert_eq!(metric(&env, &from_cache).await, served + 1.0);
    assert_eq!(
        metric(&env, &not_fresh).await,
        passed + 1.0,
        "passed through at once"
    );
}

#[tokio::test]
async fn a_token_issued_upstream_ahead_of_a_quiet_cache_is_continued_upstream_at_once() {
    let env = env_with(|_| {}).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    for name in ["a", "b", "c"] {
        c.post_json("/api/v1/namespaces/t/configmaps", &cm("t", name, "v"))
            .await;
    }
    // The cache is current, then writes elsewhere move upstream's RV past it.
    let pods = Gvr {
        resource: "pods".into(),
        ..cms()
    };
    for i in 0..3 {
        env.sim
            .create(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("p{i}"), "namespace": "t"}, "spec": {"containers": []}}))
            .unwrap();
    }
    let direct = env.direct(Identity::admin().auth(&env.sim));
    let first = direct
        .get("/api/v1/namespaces/t/configmaps?limit=1")
        .await
        .json();
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    let next = format!("/api/v1/namespaces/t/configmaps?limit=5&continue={token}");
    let ahead = "kube_cache_proxy_cache_reads_total{group=\"\",reason=\"continue_token_ahead_of_the_cache\",resource=\"configmaps\",source=\"upstream\",verb=\"LIST\"}";
    let before = metric(&env, ahead).await;
    let started = Instant::now();
    let page = c.get(&next).await;
    let took = started.elapsed();
    assert_eq!(page.body, direct.get(&next).await.body, "upstream's page");
    assert_eq!(names(&page.json()), vec!["b", "c"]);
    assert_eq!(metric(&env, ahead).await, before + 1.0);
    // No wait for a bookmark (about a second away on a quiet resource).
    assert!(took < Duration::from_millis(500), "{took:?}");
}

#[tokio::test]
async fn resource_version_rules() {
    let env = env_with(|c| c.cache.not_older_than_wait_milliseconds = 300).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    let mut rvs = Vec::new();
    for name in ["a", "b", "c"] {
        let r = c
            .post_json("/api/v1/namespaces/rv/configmaps", &cm("rv", name, "x"))
            .await;
        rvs.push(
            r.json()["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let mid = &rvs[1];
    // Exact: the state at that RV, rebuilt from the history.
    let exact = c
        .get(&format!(
            "/api/v1/namespaces/rv/configmaps?resourceVersion={mid}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(names(&exact.json()), vec!["a", "b"]);
    assert_eq!(exact.json()["metadata"]["resourceVersion"], mid.as_str());
    let direct = env.direct(Identity::admin().auth(&env.sim));
    let d = direct
        .get(&format!(
            "/api/v1/namespaces/rv/configmaps?resourceVersion={mid}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(exact.body, d.body, "byte-identical to upstream");
    // Legacy exact: limit with an RV.
    let page = c
        .get(&format!(
            "/api/v1/namespaces/rv/configmaps?resourceVersion={mid}&limit=1"
        ))
        .await
        .json();
    assert_eq!(names(&page), vec!["a"]);
    let token = page["metadata"]["continue"].as_str().unwrap();
    let next = c
        .get(&format!(
            "/api/v1/namespaces/rv/configmaps?limit=5&continue={token}"
        ))
        .await
        .json();
    assert_eq!(names(&next), vec!["b"], "a continued list stays at its RV");
    // RV 0 ignores the limit, like the apiserver's cache.
    let all = c
        .get("/api/v1/namespaces/rv/configmaps?resourceVersion=0&limit=1")
        .await
        .json();
    assert_eq!(names(&all).len(), 3);
    assert!(all["metadata"].get("continue").is_none());
    // Too large: 504 with Retry-After.
    let r = c
        .get("/api/v1/namespaces/rv/configmaps?resourceVersion=99999999")
        .await;
    assert_eq!(r.status, 504);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        r.json()["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    // Older than the cache's history: passes through, upstream answers.
    let old = c
        .get("/api/v1/namespaces/rv/configmaps?resourceVersion=1&resourceVersionMatch=Exact")
        .await;
    let d = direct
        .get("/api/v1/namespaces/rv/configmaps?resourceVersion=1&resourceVersionMatch=Exact")
        .await;
    assert_eq!(old.status, d.status);
}

#[tokio::test]
async fn watch_from_an_rv_older_than_the_history_passes_through() {
    // The cache cannot know the events between the RV and its history;
    // upstream, whose window reaches further back, replays them (or answers
    // 410 itself).
    let env = env_with(|c| c.cache.history_capacity = 5).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    let first = c
        .post_json("/api/v1/namespaces/h/configmaps", &cm("h", "a", "x"))
        .await
        .json();
    let first_rv = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    for i in 0..10 {
        c.post_json(
            "/api/v1/namespaces/h/configmaps",
            &cm("h", &format!("n{i}"), "x"),
        )
        .await;
    }
    // Let the cache apply them.
    c.get("/api/v1/namespaces/h/configmaps").await;
    let mut w = c
        .watch(
            &format!("/api/v1/namespaces/h/configmaps?watch=1&resourceVersion={first_rv}"),
            &[],
        )
        .await;
    assert_eq!(w.status, 200);
    // Ten events where the cache keeps five: they came from upstream.
    for i in 0..10 {
        let e = w.event(SOON).await;
        assert_eq!(e["type"], "ADDED", "{e}");
        assert_eq!(e["object"]["metadata"]["name"], format!("n{i}"));
    }
}

#[tokio::test]
async fn bookmarks_carry_upstream_progress() {
    // Bookmarks every second here; upstream writes to another resource move
    // upstream's RV, which reaches the cache through its own bookmarks or a
    // progress watch, and then the client's bookmarks. (A consistent list
    // that may wait for the cache asks for a progress watch.)
    let env = env_with(|c| c.cache.consistent_list_wait_milliseconds = 3000).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    let list = c.get("/api/v1/namespaces/bm/configmaps").await.json();
    let rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut w = c
        .watch(&format!("/api/v1/namespaces/bm/configmaps?watch=1&resourceVersion={rv}&allowWatchBookmarks=true"), &[])
        .await;
    c.post_json("/api/v1/namespaces/bm/configmaps", &cm("bm", "x", "a"))
        .await;
    let added = w.event(SOON).await;
    assert_eq!(added["type"], "ADDED");
    let added_rv: u64 = added["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // Force progress upstream: a consistent read makes the cache catch up.
    c.post_json(
        "/api/v1/namespaces/bm/secrets",
        &json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}),
    )
    .await;
    let probe = env.proxy(Identity::admin().auth(&env.sim));
    let _ = probe.get("/api/v1/namespaces/bm/configmaps").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let e = w.event(SOON).await;
        if e["type"] == "BOOKMARK" {
            let b: u64 = e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(b >= added_rv);
            assert_eq!(e["object"]["kind"], "ConfigMap");
            if b > added_rv {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no bookmark beyond the last event"
        );
    }
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream_cleanly() {
    let env = env_with(|_| {}).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    let started = Instant::now();
    let mut w = c
        .watch(
            "/api/v1/namespaces/t/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1",
            &[],
        )
        .await;
    loop {
        match w.next(SOON).await {
            Next::Event(_) => continue,
            Next::End => break,
            other => panic!("{other:?}"),
        }
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_scoped_cache_serves_only_requests_inside_its_scope() {
    let env = Env::start_with(SimConfig::default(), |c| {
        c.node_name = "node-1".into();
        c.cache.resources = vec![CachedResource {
            version: "v1".into(),
            resource: "pods".into(),
            field_selector: Some("spec.nodeName=${NODE_NAME}".into()),
            ..CachedResource::default()
        }];
    })
    .await;
    let pods = Gvr {
        resource: "pods".into(),
        ..cms()
    };
    for (name, node) in [("a", "node-1"), ("b", "node-2"), ("c", "node-1")] {
        env.sim
            .create(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "s"}, "spec": {"nodeName": node, "containers": []}}))
            .unwrap();
    }
    env.ready().await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    let direct = env.direct(Identity::admin().auth(&env.sim));
    let ground = direct
        .get("/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dnode-1")
        .await;
    let lists = || env.sim.stats().lists("pods");
    let before = lists();
    let own = c
        .get("/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dnode-1")
        .await;
    assert_eq!(names(&own.json()), vec!["a", "c"]);
    assert_eq!(own.body, ground.body);
    assert_eq!(lists(), before, "served from the scoped cache");
    let all = c.get("/api/v1/pods?resourceVersion=0").await;
    assert_eq!(names(&all.json()), vec!["a", "b", "c"]);
    assert_eq!(lists(), before + 1, "outside the scope: passed through");
    // A get of a pod on another node is not a 404: the scoped cache does
    // not hold it, upstream does.
    let b = c.get("/api/v1/namespaces/s/pods/b?resourceVersion=0").await;
    assert_eq!(b.status, 200, "{}", b.text());
    assert_eq!(b.json()["metadata"]["name"], "b");
}

#[tokio::test]
async fn reads_wait_for_the_first_list_then_pass_through_and_readyz_says_why() {
    // A cached resource upstream does not serve: its first list never lands.
    let env = Env::start_with(SimConfig::default(), |c| {
        c.cache.resources.push(CachedResource {
            group: "example.com".into(),
            version: "v1".into(),
            resource: "widgets".into(),
            kind: Some("Widget".into()),
            namespaced: Some(true),
            ..CachedResource::default()
        });
        c.cache.ready_wait_milliseconds = 300;
    })
    .await;
    // Until the pods' cache is ready (its first list landed); the widgets'
    // never is.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let (status, body) = env.admin_get("/readyz?verbose").await;
        if body.contains("[+]cache:pods ok") || Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("[-]cache:widgets.example.com failed: initial list not done"),
        "{body}"
    );
    assert!(body.contains("[+]cache:pods ok"), "{body}");
    assert!(body.contains("readyz check failed"), "{body}");
    let (status, _) = env.admin_get("/livez").await;
    assert_eq!(status, 200, "alive while not ready");
    // A read of it waits for the first list, then passes through.
    let c = env.proxy(Identity::admin().auth(&env.sim));
    let started = Instant::now();
    let r = c
        .get("/apis/example.com/v1/namespaces/x/widgets?resourceVersion=0")
        .await;
    assert_eq!(r.status, 404, "upstream's answer");
    assert!(
        started.elapsed() >= Duration::from_millis(290),
        "{:?}",
        started.elapsed()
    );
    assert!(
        metric(
            &env,
            "kube_cache_proxy_cache_reads_total{group=\"example.com\",reason=\"not_ready\""
        )
        .await
            >= 1.0
    );
}

#[tokio::test]
async fn with_upstream_down_cached_reads_need_a_cached_decision() {
    let env = env_with(|_| {}).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    assert_eq!(
        c.get("/api/v1/namespaces/d/configmaps?resourceVersion=0")
            .await
            .status,
        200
    );
    env.sim.stop().await;
    // The decision is cached: still served from the cache.
    assert_eq!(
        c.get("/api/v1/namespaces/d/configmaps?resourceVersion=0")
            .await
            .status,
        200
    );
    // A new identity cannot be authorized without upstream: 503, fast.
    let other = env.proxy(Identity::node("node-9").auth(&env.sim));
    let started = Instant::now();
    let r = other
        .get("/api/v1/namespaces/d/configmaps?resourceVersion=0")
        .await;
    assert_eq!(r.status, 503);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn k_clients_cost_one_upstream_watch() {
    let env = env_with(|_| {}).await;
    let before = env.sim.stats();
    let clients: Vec<_> = (0..20)
        .map(|_| env.proxy_h2(Identity::admin().auth(&env.sim)))
        .collect();
    let mut watches = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let rv = list_rv(c, "/api/v1/namespaces/k/configmaps?resourceVersion=0").await;
        let path = if i % 2 == 0 {
            format!("/api/v1/namespaces/k/configmaps?watch=1&resourceVersion={rv}")
        } else {
            "/api/v1/configmaps?watch=1&resourceVersion=0&labelSelector=app%3Da".to_string()
        };
        watches.push(c.watch(&path, &[]).await);
    }
    let c = &clients[0];
    c.post_json("/api/v1/namespaces/k/configmaps", &cm("k", "x", "a"))
        .await;
    for w in &mut watches {
        let e = w.event(SOON).await;
        assert_eq!(e["object"]["metadata"]["name"], "x");
    }
    let after = env.sim.stats();
    assert_eq!(
        after.watches_open("configmaps"),
        1,
        "one upstream watch for all"
    );
    assert_eq!(
        after.lists("configmaps"),
        before.lists("configmaps"),
        "no upstream list"
    );
    assert_eq!(
        after.watches("configmaps"),
        before.watches("configmaps"),
        "no new upstream watch"
    );
}

#[tokio::test]
async fn many_streams_of_one_http2_connection_get_each_event_at_once() {
    // The connection's writes are coalesced (`coalesce.rs`): what one event
    // queues on a hundred streams goes out together, and nothing is held
    // back past the next turn of the scheduler.
    let env = env_with(|_| {}).await;
    let c = env.proxy_h2(Identity::admin().auth(&env.sim));
    let rv = list_rv(&c, "/api/v1/namespaces/h2/configmaps?resourceVersion=0").await;
    let path = format!("/api/v1/namespaces/h2/configmaps?watch=1&resourceVersion={rv}");
    let mut watches = Vec::new();
    for _ in 0..100 {
        watches.push(c.watch(&path, &[]).await);
    }
    let mut slowest = Duration::ZERO;
    for i in 0..10 {
        let written = Instant::now();
        c.post_json(
            "/api/v1/namespaces/h2/configmaps",
            &cm("h2", &format!("cm-{i}"), "a"),
        )
        .await;
        for w in &mut watches {
            let e = w.event(SOON).await;
            assert_eq!(e["object"]["metadata"]["name"], format!("cm-{i}"));
        }
        slowest = slowest.max(written.elapsed());
    }
    // Held back until some later traffic (a ping every 30 s), the last
    // stream would wait seconds.
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_batch_window_a_watch_of_the_resource_gets_its_events_in_one_chunk() {
    // `cache.watchBatchMilliseconds` (the tier's replicas: 200): a watch
    // that any object's change may reach holds an event for the window,
    // and what else reaches it meanwhile leaves in the same write. One
    // pinned to an object (`metadata.name`) is never held.
    let window = Duration::from_millis(1500);
    let env = env_with(|c| c.cache.watch_batch_milliseconds = 1500).await;
    // HTTP/1.1: each write of the watch is one chunk of its body.
    let c = env.proxy(Identity::admin().auth(&env.sim));
    let rv = list_rv(&c, "/api/v1/namespaces/b/configmaps?resourceVersion=0").await;
    let mut all = c
        .watch(
            &format!("/api/v1/namespaces/b/configmaps?watch=1&resourceVersion={rv}"),
            &[],
        )
        .await;
    let mut one = c
        .watch(
            &format!(
                "/api/v1/namespaces/b/configmaps?watch=1&resourceVersion={rv}&fieldSelector=metadata.name%3Da"
            ),
            &[],
        )
        .await;
    assert_eq!((all.status.as_u16(), one.status.as_u16()), (200, 200));
    let written = Instant::now();
    c.post_json("/api/v1/namespaces/b/configmaps", &cm("b", "a", "x"))
        .await;
    let e = one.event(SOON).await;
    assert_eq!(e["object"]["metadata"]["name"], "a");
    let pinned = written.elapsed();
    c.post_json("/api/v1/namespaces/b/configmaps", &cm("b", "b", "x"))
        .await;
    let chunk = all.next_frame(window * 4).await.expect("a chunk");
    let held = written.elapsed();
    let names: Vec<String> = chunk
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let e: Value = serde_json::from_slice(l).unwrap();
            assert_eq!(e["type"], "ADDED", "{e}");
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(names, ["a", "b"], "both events in the window's one chunk");
    assert!(pinned < window, "the pinned watch was held: {pinned:?}");
    assert!(held >= window, "released before the window: {held:?}");
    // The window's end is not a stream's end: the next event comes too.
    c.post_json("/api/v1/namespaces/b/configmaps", &cm("b", "c", "x"))
        .await;
    assert_eq!(changes(&mut all, 1).await, [("ADDED".into(), "c".into())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_held_watches_of_one_http2_connection_share_its_batch_window() {
    // Over HTTP/2 the held watches of a connection (a node's Services and
    // EndpointSlices through a tier) share the batch window: an event
    // held after another's is written with it when the window closes, not
    // a whole window after its own arrival.
    let window = Duration::from_millis(2000);
    let env = env_with(|c| c.cache.watch_batch_milliseconds = 2000).await;
    let c = env.proxy_h2(Identity::admin().auth(&env.sim));
    let rv = list_rv(&c, "/api/v1/namespaces/w/configmaps?resourceVersion=0").await;
    // Each sees one of the two objects: `metadata.name!=...` is not pinned.
    let path = |not: &str| {
        format!(
            "/api/v1/namespaces/w/configmaps?watch=1&resourceVersion={rv}&fieldSelector=metadata.name%21%3D{not}"
        )
    };
    let mut first = c.watch(&path("b"), &[]).await;
    let mut second = c.watch(&path("a"), &[]).await;
    assert_eq!((first.status.as_u16(), second.status.as_u16()), (200, 200));
    let written = Instant::now();
    c.post_json("/api/v1/namespaces/w/configmaps", &cm("w", "a", "x"))
        .await;
    tokio::time::sleep(window / 2).await;
    c.post_json("/api/v1/namespaces/w/configmaps", &cm("w", "b", "x"))
        .await;
    let a = first.event(window * 4).await;
    let first_at = written.elapsed();
    let b = second.event(window * 4).await;
    let second_at = written.elapsed();
    assert_eq!(
        (
            &a["object"]["metadata"]["name"],
            &b["object"]["metadata"]["name"]
        ),
        (&Value::from("a"), &Value::from("b"))
    );
    assert!(
        first_at >= window,
        "released before the window: {first_at:?}"
    );
    // Its own window would have closed at 1.5 windows.
    assert!(
        second_at < window + window / 4,
        "not written when the shared window closed: {second_at:?}"
    );
}

/// Reads a watch until `n` events arrived, skipping bookmarks.
async fn changes(w: &mut WatchStream, n: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while out.len() < n {
        let e = w.event(SOON).await;
        let kind = e["type"].as_str().unwrap().to_string();
        assert_ne!(kind, "ERROR", "{e}");
        if kind == "BOOKMARK" {
            continue;
        }
        out.push((
            kind,
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        ));
    }
    out
}

// Two worker threads: the fast reader must not wait on the writer loop
// for its turn, or on a loaded machine it is as slow as the slow one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_is_closed_without_slowing_the_others() {
    let env = env_with(|c| {
        c.cache.watcher_buffer_events = 4;
        c.cache.slow_watcher_timeout_seconds = 2;
        c.cache.history_capacity = 100_000;
    })
    .await;
    let c = env.proxy_h2(Identity::admin().auth(&env.sim));
    let rv = list_rv(&c, "/api/v1/namespaces/slow/configmaps").await;
    let path = format!("/api/v1/namespaces/slow/configmaps?watch=1&resourceVersion={rv}");
    // The slow client never reads its stream: socket buffers and its
    // buffer fill up, then the budget runs out.
    let slow = env
        .proxy(Identity::admin().auth(&env.sim))
        .watch(&path, &[])
        .await;
    // Enough to fill loopback socket buffers and HTTP/2 windows.
    let big = "x".repeat(256 * 1024);
    let n = 100;
    let mut fast = c.watch(&path, &[]).await;
    let reader = tokio::spawn(async move {
        let got = changes(&mut fast, n).await;
        (got, fast)
    });
    let started = Instant::now();
    for i in 0..n {
        let mut o = cm("slow", &format!("o{i}"), "a");
        o["data"]["blob"] = json!(big);
        env.sim.create(&cms(), o).unwrap();
        if i % 20 == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let (got, _fast) = reader.await.unwrap();
    assert_eq!(got.len(), n);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the others were not slowed"
    );
    // The slow watcher was closed and counted.
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(
        &env,
        "kube_cache_proxy_cache_watchers_terminated_total{group=\"\",reason=\"slow\"",
    )
    .await
        < 1.0
    {
        assert!(Instant::now() < deadline, "slow watcher not terminated");
        env.sim
            .create(
                &cms(),
                cm("slow", &format!("late-{}", fastrand::u32(..)), "a"),
            )
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(slow);
    // Reading it later shows a clean end after what it had buffered; its
    // client re-watches from its last RV, from the history.
    let mut again = c.watch(&path, &[]).await;
    let replay = changes(&mut again, n).await;
    assert_eq!(
        replay, got,
        "re-watch from the start RV replays the history"
    );
}

#[tokio::test]
async fn upgrades_and_methods_other_than_get_are_never_cached() {
    let env = env_with(|_| {}).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    let r = c
        .send(Method::HEAD, "/api/v1/namespaces/x/configmaps", &[], None)
        .await;
    assert_eq!(r.status, 200);
    let before = env.sim.stats().total_requests;
    c.get("/api/v1/namespaces/x/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1&pretty=true")
        .await;
    assert!(
        env.sim.stats().total_requests > before,
        "an unknown parameter passes through"
    );
    let _ = QUIET;
}

/// A store of over a MiB has its objects' JSON packed into shared chunks
/// (`src/cache/store/pack.rs`), and a chunk whose objects were mostly
/// replaced or deleted has the rest copied out. Through both, a list from
/// the cache is exactly upstream's.
#[tokio::test]
async fn a_store_packed_into_chunks_lists_exactly_upstreams_objects() {
    let env = env_with(|_| {}).await;
    let c = env.proxy(Identity::admin().auth(&env.sim));
    let direct = env.direct(Identity::admin().auth(&env.sim));
    let path = "/api/v1/namespaces/pk/configmaps";
    let big = |i: usize, v: usize| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": format!("cm-{i:03}"), "namespace": "pk", "labels": {"v": v.to_string()}},
               "data": {"v": v.to_string(), "pad": "x".repeat(4000)}})
    };
    // 400 objects of ~4 KB: the last ~150 arrive once the store holds a MiB.
    for i in 0..400 {
        assert_eq!(direct.post_json(path, &big(i, 0)).await.status, 201);
    }
    // Most of the packed objects replaced, some deleted: their chunks
    // become sparse and what is left in them is copied out.
    for i in (250..400).filter(|i| i % 4 != 0) {
        let put = direct
            .put_json(&format!("{path}/cm-{i:03}"), &big(i, 1))
            .await;
        assert_eq!(put.status, 200, "{}", put.text());
    }
    for i in (250..400).filter(|i| i % 8 == 1) {
        assert_eq!(
            direct.delete(&format!("{path}/cm-{i:03}")).await.status,
            200
        );
    }
    let rv = list_rv(&direct, path).await;
    let cached = c
        .get(&format!(
            "{path}?resourceVersion={rv}&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert_eq!(cached.status, 200);
    let upstream = direct.get(path).await;
    assert_eq!(cached.json()["items"], upstream.json()["items"]);
    let deleted = (250..400).filter(|i| i % 8 == 1).count();
    assert_eq!(
        cached.json()["items"].as_array().unwrap().len(),
        400 - deleted
    );
    // And by label selector, which reads the labels' spans in the chunks.
    let ones = c.get(&format!("{path}?labelSelector=v%3D1")).await.json();
    let up_ones = direct
        .get(&format!("{path}?labelSelector=v%3D1"))
        .await
        .json();
    assert_eq!(ones["items"], up_ones["items"]);
    assert!(!ones["items"].as_array().unwrap().is_empty());
    assert!(
        metric(
            &env,
            "kube_cache_proxy_cache_reads_total{group=\"\",reason=\"\",resource=\"configmaps\",source=\"cache\",verb=\"LIST\"}"
        )
        .await
            >= 2.0
    );
}
