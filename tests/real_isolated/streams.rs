//! Many concurrent requests passed through to a real kube-apiserver v1.36,
//! which allows 100 concurrent HTTP/2 streams per connection: the proxy
//! opens more upstream connections as they fill (as Go's HTTP/2 transport
//! does), so 150 pass-through watches are all open at the apiserver and a
//! request made meanwhile is not queued behind them. And streaming lists
//! of a quiet resource in a busy cluster, which wait for an upstream
//! bookmark, keep progress watches rolling while they come.
//!
//! Skipped, with one line, where no control plane is available.

use crate::support;

use std::time::{Duration, Instant};

use kube_testenv::Options;
use support::real::{Isolated, RealEnv, eventually, metric_sum};

const WATCHES: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_watches_beyond_one_connections_streams_all_open_upstream() {
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let env = RealEnv::start_on(plane.cp(), |_| {}).await;
    let ns = env.namespace("streams").await;
    // Secrets are not cached: every watch passes through.
    let path = format!("/api/v1/namespaces/{ns}/secrets?watch=1&allowWatchBookmarks=true");
    let before = metric_sum(
        &env.apiserver_metrics().await,
        "apiserver_longrunning_requests",
        &[("verb", "WATCH"), ("resource", "secrets")],
    );
    let mut watches = Vec::new();
    for _ in 0..WATCHES {
        let client = env.proxy(env.admin());
        watches.push(client.watch(&path, &[]).await);
    }
    eventually(
        Duration::from_secs(30),
        "every pass-through watch open at the apiserver",
        || {
            let env = &env;
            async move {
                let now = metric_sum(
                    &env.apiserver_metrics().await,
                    "apiserver_longrunning_requests",
                    &[("verb", "WATCH"), ("resource", "secrets")],
                );
                (now - before >= WATCHES as f64).then_some(())
            }
        },
    )
    .await;
    // A request meanwhile is answered at once.
    let started = Instant::now();
    let r = env
        .proxy(env.admin())
        .get(&format!("/api/v1/namespaces/{ns}/secrets"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    println!(
        "{WATCHES} pass-through watches open at the apiserver; a list meanwhile in {:?}",
        started.elapsed()
    );
    drop(watches);
}

/// A streaming list (an informer's start) of a quiet resource in a busy
/// cluster waits for an upstream bookmark to show the cache fresh. While
/// such reads keep coming, progress watches roll, one a second, so that one
/// is due at each of the apiserver's bookmark ticks; without them, after
/// `progressWatchRollSeconds`, none is opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_watches_roll_while_streaming_lists_wait() {
    use support::client::Next;
    let roll = 3;
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let env = RealEnv::start_on(plane.cp(), |c| {
        support::cache_configmaps(c);
        c.cache.progress_watch_roll_seconds = roll;
    })
    .await;
    let ns = env.namespace("rolling").await;
    let base = format!("/api/v1/namespaces/{ns}/configmaps");
    env.create(
        &base,
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "quiet"}}),
    )
    .await;
    // Busy: a Lease (not cached) written every 20 ms moves etcd's revision.
    let busy = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (apiserver, busy, ns) = (env.apiserver(), busy.clone(), ns.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !busy.is_cancelled() {
                let lease = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": format!("l{i}")}});
                let path = format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases");
                assert_eq!(apiserver.post_json(&path, &lease).await.status, 201);
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let counter = |name: &'static str, labels: &'static [(&'static str, &'static str)]| {
        let env = &env;
        async move { metric_sum(&env.proxy_metrics().await, name, labels) }
    };
    let progress = || {
        counter(
            "kube_cache_proxy_cache_progress_watches_total",
            &[("resource", "configmaps")],
        )
    };
    let served = || {
        counter(
            "kube_cache_proxy_cache_reads_total",
            &[
                ("resource", "configmaps"),
                ("verb", "WATCH"),
                ("source", "cache"),
            ],
        )
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (progress_before, served_before) = (progress().await, served().await);
    let proxy = env.proxy(env.admin());
    let path = format!(
        "{base}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
    );
    let reads = 6;
    let started = Instant::now();
    let mut waits = Vec::new();
    for _ in 0..reads {
        let t = Instant::now();
        let mut w = proxy.watch(&path, &[]).await;
        loop {
            match w.next(Duration::from_secs(10)).await {
                Next::Event(e)
                    if e["type"] == "BOOKMARK"
                        && e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"]
                            == "true" =>
                {
                    break;
                }
                Next::Event(e) => assert_eq!(e["object"]["metadata"]["name"], "quiet", "{e}"),
                other => panic!("no initial-events-end: {other:?}"),
            }
        }
        waits.push(t.elapsed());
        // Longer than a wait: one progress watch per read would fall
        // behind one a second.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let elapsed = started.elapsed();
    let rolled = progress().await - progress_before;
    println!("{reads} streaming lists in {elapsed:?}, waits {waits:?}, {rolled} progress watches");
    // Each waits for the next bookmark tick of the apiserver's (about a
    // second; measured 0.60-0.70 s) once progress watches roll; the first
    // starts the roll, and waits for a progress watch of its own (1.45 s).
    let tick = Duration::from_millis(1300);
    assert!(waits[0] < 2 * tick, "the first wait: {waits:?}");
    assert!(
        waits[1..].iter().all(|w| *w < tick),
        "a wait past one bookmark tick: {waits:?}"
    );
    assert_eq!(
        served().await - served_before,
        reads as f64,
        "all from the cache"
    );
    // One a second from the first wait on (not one per read).
    assert!(
        rolled >= elapsed.as_secs_f64().floor() - 1.0,
        "{rolled} progress watches in {elapsed:?}"
    );
    // No waiting reads: after the roll window, none.
    tokio::time::sleep(Duration::from_secs(roll + 2)).await;
    let settled = progress().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        progress().await,
        settled,
        "progress watches without waiting reads"
    );
    busy.cancel();
    writer.await.unwrap();
}

/// kubelet watches each Secret and ConfigMap a new pod mounts, and its own
/// Node, with a consistent streaming list of that one object, and gives
/// the watch 1 s to sync before it fails the pod's volume mount. In a busy
/// cluster the cache of a quiet resource stays behind upstream's revision
/// until the next bookmark (up to a tick, about a second). Instead of
/// waiting, the proxy reads the object upstream (a consistent list of it
/// alone) and starts the watch from that: the object, the
/// `k8s.io/initial-events-end` bookmark at upstream's revision, then only
/// the changes after it, from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_of_one_object_starts_from_a_read_of_it_upstream() {
    use serde_json::json;
    use support::client::Next;
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let env = RealEnv::start_on(plane.cp(), support::cache_configmaps).await;
    let ns = env.namespace("one-object").await;
    let base = format!("/api/v1/namespaces/{ns}/configmaps");
    let quiet = |v: usize| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "quiet"}, "data": {"k": format!("v{v}")}});
    env.create(&base, quiet(0)).await;
    // Busy: a Lease (not cached) written every 20 ms moves etcd's revision.
    let busy = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (apiserver, busy, ns) = (env.apiserver(), busy.clone(), ns.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !busy.is_cancelled() {
                let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": format!("l{i}")}});
                let path = format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases");
                assert_eq!(apiserver.post_json(&path, &lease).await.status, 201);
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let counter = |name: &'static str, labels: &'static [(&'static str, &'static str)]| {
        let env = &env;
        async move { metric_sum(&env.proxy_metrics().await, name, labels) }
    };
    let object_reads = || {
        counter(
            "kube_cache_proxy_cache_object_reads_total",
            &[("resource", "configmaps"), ("result", "ok")],
        )
    };
    let served = || {
        counter(
            "kube_cache_proxy_cache_reads_total",
            &[
                ("resource", "configmaps"),
                ("verb", "WATCH"),
                ("source", "cache"),
            ],
        )
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (reads_before, served_before) = (object_reads().await, served().await);
    let proxy = env.proxy(env.admin());
    let apiserver = env.apiserver();
    let path = format!(
        "{base}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&fieldSelector=metadata.name%3Dquiet"
    );
    let rounds = 5;
    let mut waits = Vec::new();
    for i in 0..rounds {
        // The watch's initial state reflects every write completed before
        // it started.
        let floor = env.current_rv().await;
        let t = Instant::now();
        let mut w = proxy.watch(&path, &[]).await;
        let added = w.event(Duration::from_secs(10)).await;
        assert_eq!(added["type"], "ADDED", "{added}");
        assert_eq!(added["object"]["data"]["k"], format!("v{i}"), "{added}");
        let end = w.event(Duration::from_secs(10)).await;
        assert_eq!(end["type"], "BOOKMARK", "{end}");
        assert_eq!(
            end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
        let end_rv: u64 = end["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(end_rv >= floor, "initial state at {end_rv}, below {floor}");
        waits.push(t.elapsed());
        // A change after it reaches the watch, and nothing older does.
        let r = apiserver
            .put_json(&format!("{base}/quiet"), &quiet(i + 1))
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        loop {
            match w.next(Duration::from_secs(10)).await {
                Next::Event(e) if e["type"] == "BOOKMARK" => continue,
                Next::Event(e) => {
                    assert_eq!(e["type"], "MODIFIED", "{e}");
                    assert_eq!(e["object"]["data"]["k"], format!("v{}", i + 1), "{e}");
                    let rv: u64 = e["object"]["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap()
                        .parse()
                        .unwrap();
                    assert!(rv > end_rv, "{e}");
                    break;
                }
                other => panic!("no MODIFIED: {other:?}"),
            }
        }
        match w.next(Duration::from_millis(500)).await {
            Next::Timeout => {}
            Next::Event(e) if e["type"] == "BOOKMARK" => {}
            other => panic!("after the change: {other:?}"),
        }
    }
    let read_upstream = object_reads().await - reads_before;
    println!(
        "{rounds} streaming lists of one object, waits {waits:?}, {read_upstream} read upstream"
    );
    assert_eq!(
        served().await - served_before,
        rounds as f64,
        "all from the cache"
    );
    assert!(
        read_upstream >= 1.0,
        "the cache was never behind in a busy cluster?"
    );
    busy.cancel();
    writer.await.unwrap();
}
