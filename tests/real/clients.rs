//! The client matrix against a real kube-apiserver v1.36: each client
//! library watches the same objects through the proxy and directly, and
//! must end with the same state, having seen the same changes.
//!
//! - kube-rs's `runtime::watcher` with a `reflector` store, with streaming
//!   lists (`sendInitialEvents`, `watcher::Config::streaming_lists`) and
//!   with list-then-watch (the default);
//! - the Python `kubernetes` client (`tests/python/`, from PyPI): a list,
//!   then `watch.Watch().stream` from its resourceVersion.
//!
//! The writes (creates, updates, deletes) go to the apiserver directly,
//! after every watcher has synced. Skipped where there is no control
//! plane.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use kube_runtime::reflector::{self, Store};
use kube_runtime::watcher::{self, Event};
use serde_json::json;
use support::kubectl::{Kubectl, kubectl_available};
use support::python::{python, python_client};
use support::real::{RealEnv, eventually, metric_sum};

/// What a watcher saw after its initial state: `(change, name, rv)`.
type Seen = Arc<Mutex<Vec<(&'static str, String, String)>>>;

async fn client(kubeconfig: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// A reflector of `ns`'s configmaps on `client` (with kube-runtime's
/// default backoff, as controllers run it); its store, what it saw after
/// its initial state, and the watch errors it met (each retried).
struct Reflected {
    store: Store<ConfigMap>,
    seen: Seen,
    errors: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

fn reflect(client: kube::Client, ns: &str, streaming: bool) -> Reflected {
    use kube_runtime::WatchStreamExt;
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let config = if streaming {
        watcher::Config::default().streaming_lists()
    } else {
        watcher::Config::default()
    };
    let (store, writer) = reflector::store();
    let seen: Seen = Arc::default();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let events = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
    let (recorded, failed) = (seen.clone(), errors.clone());
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let (change, object) = match event {
                Ok(Event::Apply(o)) => ("apply", o),
                Ok(Event::Delete(o)) => ("delete", o),
                Ok(_) => continue,
                Err(e) => {
                    failed.lock().unwrap().push(e.to_string());
                    continue;
                }
            };
            recorded.lock().unwrap().push((
                change,
                object.metadata.name.clone().unwrap_or_default(),
                object.metadata.resource_version.clone().unwrap_or_default(),
            ));
        }
    });
    Reflected {
        store,
        seen,
        errors,
        task,
    }
}

fn cm(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": {"v": v}}))
    .unwrap()
}

/// Replaces `name`'s data with `v: 2`, directly.
async fn update(api: &Api<ConfigMap>, name: &str) {
    let mut o = api.get(name).await.unwrap();
    o.data = Some([("v".to_string(), "2".to_string())].into());
    api.replace(name, &PostParams::default(), &o).await.unwrap();
}

/// With `a` already there: creates `b` and updates `a`, directly.
async fn write_first_half(api: &Api<ConfigMap>) {
    api.create(&PostParams::default(), &cm("b", "1"))
        .await
        .unwrap();
    update(api, "a").await;
}

/// Then creates `c`, deletes `b` and updates `c`, directly; returns the
/// final state, name → RV.
async fn write_second_half(api: &Api<ConfigMap>) -> BTreeMap<String, String> {
    api.create(&PostParams::default(), &cm("c", "1"))
        .await
        .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    update(api, "c").await;
    let truth: BTreeMap<String, String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| {
            (
                o.metadata.name.clone().unwrap(),
                o.metadata.resource_version.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(truth.keys().collect::<Vec<_>>(), ["a", "c"]);
    truth
}

/// Both halves: five changes.
async fn write_sequence(api: &Api<ConfigMap>) -> BTreeMap<String, String> {
    write_first_half(api).await;
    write_second_half(api).await
}

/// A watcher of the matrix: which side, streaming lists or not, and what
/// it reflects.
type Watcher = (&'static str, bool, Reflected);

/// In a fresh namespace with configmap `a`: kube-rs watchers through the
/// proxy and directly, with streaming lists and with list-then-watch, each
/// synced; the direct API to write with.
async fn watchers_on_both_sides(env: &RealEnv, ns: &str) -> (Api<ConfigMap>, Vec<Watcher>) {
    let ns = env.namespace(ns).await;
    let admin = env.cp.admin();
    let direct = client(&env.cp.kubeconfig_text(&env.cp.url(), "admin", admin)).await;
    let proxied = client(&apimachinery::kubeconfig::with_certificate(
        &env.proxy_url,
        &env.proxy_ca_pem,
        "admin",
        &admin.cert_pem,
        &admin.key_pem,
    ))
    .await;
    let api: Api<ConfigMap> = Api::namespaced(direct.clone(), &ns);
    api.create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    let mut watchers = Vec::new();
    for (side, c) in [("proxy", &proxied), ("direct", &direct)] {
        for streaming in [true, false] {
            let r = reflect(c.clone(), &ns, streaming);
            tokio::time::timeout(Duration::from_secs(30), r.store.wait_until_ready())
                .await
                .unwrap_or_else(|_| panic!("{side} streaming={streaming}: no initial state"))
                .unwrap();
            r.seen.lock().unwrap().clear();
            watchers.push((side, streaming, r));
        }
    }
    (api, watchers)
}

/// Every watcher ends with `truth`, having seen the same five changes in
/// the same order with the same resourceVersions, with no watch error.
async fn assert_same_changes(watchers: Vec<Watcher>, truth: &BTreeMap<String, String>, when: &str) {
    for (side, streaming, r) in &watchers {
        eventually(Duration::from_secs(30), "the final state", || {
            let s = state(&r.store);
            let truth = truth.clone();
            async move { (s == truth).then_some(()) }
        })
        .await;
        println!(
            "kube-rs watcher ({side}, streaming lists: {streaming}){when}: final state as the \
             apiserver's"
        );
    }
    let seen: Vec<_> = watchers
        .iter()
        .map(|(side, streaming, r)| (*side, *streaming, r.seen.lock().unwrap().clone()))
        .collect();
    let expected = &seen[2].2;
    assert_eq!(
        expected
            .iter()
            .map(|(c, n, _)| (*c, n.as_str()))
            .collect::<Vec<_>>(),
        [
            ("apply", "b"),
            ("apply", "a"),
            ("apply", "c"),
            ("delete", "b"),
            ("apply", "c")
        ],
        "direct, streaming lists"
    );
    for (side, streaming, s) in &seen {
        assert_eq!(s, expected, "{side}, streaming lists: {streaming}");
    }
    for (side, streaming, r) in watchers {
        assert!(
            r.errors.lock().unwrap().is_empty(),
            "{side}, streaming lists: {streaming}: {:?}",
            r.errors.lock().unwrap()
        );
        r.task.abort();
    }
}

/// Watches of configmaps the proxy has served from its cache.
async fn configmap_watches_from_the_cache(env: &RealEnv) -> f64 {
    let (_, metrics) = env.running.admin_get("/metrics").await;
    metric_sum(
        &metrics,
        "kube_cache_proxy_cache_reads_total",
        &[
            ("resource", "configmaps"),
            ("verb", "WATCH"),
            ("source", "cache"),
        ],
    )
}

fn state(store: &Store<ConfigMap>) -> BTreeMap<String, String> {
    store
        .state()
        .iter()
        .map(|o| {
            (
                o.metadata.name.clone().unwrap_or_default(),
                o.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_watchers_end_identical_through_the_proxy_and_directly() {
    let Some(env) = RealEnv::start_with(support::cache_configmaps).await else {
        return;
    };
    let (api, watchers) = watchers_on_both_sides(&env, "clients-kube-rs").await;
    let truth = write_sequence(&api).await;
    assert_same_changes(watchers, &truth, "").await;
    // The proxy's watchers were served from its cache, not passed through.
    let served = configmap_watches_from_the_cache(&env).await;
    assert!(served >= 2.0, "{served} watches served from the cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_watchers_see_every_change_once_across_a_proxy_takeover() {
    let takeover = support::env::tempdir().join("takeover.sock");
    let (port, admin_port) = (support::env::free_port(), support::env::free_port());
    let Some(mut env) = RealEnv::start_with(|c| {
        support::cache_configmaps(c);
        c.listen = format!("127.0.0.1:{port}");
        c.admin_listen = format!("127.0.0.1:{admin_port}");
        c.takeover.socket_path = Some(takeover.clone());
    })
    .await
    else {
        return;
    };
    let (api, watchers) = watchers_on_both_sides(&env, "clients-takeover").await;

    // Before the takeover: a create and an update.
    write_first_half(&api).await;
    // A second proxy takes the listening sockets over; the first drains
    // (its watches end) and idles until stopped (as a static pod would, so
    // that kubelet does not restart it); the watchers re-watch from their
    // last resourceVersion on the same address, now served by the second.
    let started = std::time::Instant::now();
    let successor = support::env::Running::take_over(&env.config).await;
    successor.ready().await;
    let mut predecessor = std::mem::replace(&mut env.running, successor);
    predecessor.stop().await.expect("the first proxy drained");
    println!(
        "takeover: the second proxy ready and the first drained in {:?}",
        started.elapsed()
    );
    // After: a create, a delete, an update.
    let truth = write_second_half(&api).await;
    // Nothing lost or repeated across the takeover.
    assert_same_changes(watchers, &truth, " across the takeover").await;
    // The proxied watchers did move: the second proxy took their watches
    // (from its cache, or passed through while its cache had not yet
    // reached the resourceVersion they resumed from).
    let (_, metrics) = env.running.admin_get("/metrics").await;
    let watches = |source| {
        metric_sum(
            &metrics,
            "kube_cache_proxy_cache_reads_total",
            &[
                ("resource", "configmaps"),
                ("verb", "WATCH"),
                ("source", source),
            ],
        )
    };
    // (+ 0.0: an empty sum is -0.)
    let (cached, passed) = (watches("cache") + 0.0, watches("upstream") + 0.0);
    println!("the second proxy: {cached} watches from its cache, {passed} passed through");
    assert!(
        cached + passed >= 2.0,
        "{cached} + {passed} watches resumed on the second proxy"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_watch_stream_ends_identical_through_the_proxy_and_directly() {
    let Some(env) = RealEnv::start_with(support::cache_configmaps).await else {
        return;
    };
    let Some(python) = python() else {
        return;
    };
    let ns = env.namespace("clients-python").await;
    let admin = env.cp.admin();
    let direct_kc = env.dir.join("python-direct.kubeconfig");
    std::fs::write(
        &direct_kc,
        env.cp.kubeconfig_text(&env.cp.url(), "admin", admin),
    )
    .unwrap();
    let proxy_kc = env.dir.join("python-proxy.kubeconfig");
    std::fs::write(
        &proxy_kc,
        apimachinery::kubeconfig::with_certificate(
            &env.proxy_url,
            &env.proxy_ca_pem,
            "admin",
            &admin.cert_pem,
            &admin.key_pem,
        ),
    )
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(
        client(&env.cp.kubeconfig_text(&env.cp.url(), "admin", admin)).await,
        &ns,
    );
    api.create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    let through = python_client(&python, &proxy_kc, &ns, 5).await;
    let direct = python_client(&python, &direct_kc, &ns, 5).await;
    let truth = write_sequence(&api).await;
    let (through, direct) = (through.await.unwrap(), direct.await.unwrap());
    let kinds: Vec<(&str, &str)> = direct
        .events
        .iter()
        .map(|(t, n, _)| (t.as_str(), n.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("ADDED", "b"),
            ("MODIFIED", "a"),
            ("ADDED", "c"),
            ("DELETED", "b"),
            ("MODIFIED", "c")
        ]
    );
    assert_eq!(through.events, direct.events, "the same events, in order");
    assert_eq!(direct.last, truth);
    assert_eq!(through.last, truth);
    println!(
        "Python kubernetes client (Watch().stream): the same 5 events and final state through the proxy and directly"
    );
    let served = configmap_watches_from_the_cache(&env).await;
    assert!(served >= 1.0, "{served} watches served from the cache");
}

/// A running kubectl whose stdout and stderr are collected as they come.
struct Running {
    _child: tokio::process::Child,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
}

fn spawn_kubectl(kubectl: &Kubectl, args: &[&str]) -> Running {
    use tokio::io::AsyncReadExt;
    let mut child = kubectl
        .command(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let collect = |mut r: Box<dyn tokio::io::AsyncRead + Unpin + Send>| {
        let text: Arc<Mutex<String>> = Arc::default();
        let into = text.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 8192];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                into.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        text
    };
    let out = collect(Box::new(child.stdout.take().unwrap()));
    let err = collect(Box::new(child.stderr.take().unwrap()));
    Running {
        _child: child,
        out,
        err,
    }
}

/// `kubectl get -w --output-watch-events` rows: `(EVENT, NAME, DATA)`,
/// without the header and the AGE column (which depends on when).
fn table_rows(out: &str) -> Vec<(String, String, String)> {
    out.lines()
        .filter(|l| !l.starts_with("EVENT"))
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            Some((
                cols.next()?.to_string(),
                cols.next()?.to_string(),
                cols.next()?.to_string(),
            ))
        })
        .collect()
}

/// The objects `kubectl get --watch-only -o json` printed (one JSON
/// document per event): `(name, resourceVersion, data.v)`.
fn json_objects(out: &str) -> Vec<(String, String, String)> {
    serde_json::Deserializer::from_str(out)
        .into_iter::<serde_json::Value>()
        .map_while(Result::ok)
        .map(|o| {
            let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&o["metadata"]["name"]),
                s(&o["metadata"]["resourceVersion"]),
                s(&o["data"]["v"]),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_watches_and_chunked_lists_end_identical_through_the_proxy_and_directly() {
    if !kubectl_available() {
        kube_testenv::skip::skip("kubectl is not installed");
        return;
    }
    let Some(env) = RealEnv::start_with(support::cache_configmaps).await else {
        return;
    };
    let ns = env.namespace("clients-kubectl").await;
    let admin = env.cp.admin();
    let direct_kubeconfig = env.cp.kubeconfig_text(&env.cp.url(), "admin", admin);
    let proxy_kubeconfig = apimachinery::kubeconfig::with_certificate(
        &env.proxy_url,
        &env.proxy_ca_pem,
        "admin",
        &admin.cert_pem,
        &admin.key_pem,
    );
    let api: Api<ConfigMap> = Api::namespaced(client(&direct_kubeconfig).await, &ns);
    api.create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();

    // `get -w` (a table: its watch passes through, as tables do) and
    // `get --watch-only -o json` (JSON: from the cache), on each side.
    let sides = [
        ("proxy", Kubectl::new(&proxy_kubeconfig)),
        ("direct", Kubectl::new(&direct_kubeconfig)),
    ];
    let mut runs = Vec::new();
    for (side, kubectl) in &sides {
        let table = spawn_kubectl(
            kubectl,
            &[
                "get",
                "configmaps",
                "-n",
                &ns,
                "-w",
                "--output-watch-events",
                "-v=6",
            ],
        );
        let json = spawn_kubectl(
            kubectl,
            &[
                "get",
                "configmaps",
                "-n",
                &ns,
                "--watch-only",
                "-o",
                "json",
                "-v=6",
            ],
        );
        // Each has its watch open (kubectl logs the response's status at
        // -v=6 once the headers arrive) before anything is written.
        for (what, r) in [("-w", &table), ("--watch-only", &json)] {
            let err = r.err.clone();
            eventually(
                Duration::from_secs(30),
                &format!("{side} kubectl {what}: its watch open"),
                || {
                    let err = err.lock().unwrap().clone();
                    async move {
                        err.lines()
                            .any(|l| l.contains("watch=true") && l.contains("200 OK"))
                            .then_some(())
                    }
                },
            )
            .await;
        }
        runs.push((*side, table, json));
    }

    write_sequence(&api).await;

    let mut tables = Vec::new();
    let mut jsons = Vec::new();
    for (side, table, json) in &runs {
        let (t, j) = (table.out.clone(), json.out.clone());
        let rows = eventually(Duration::from_secs(20), "six -w rows", || {
            let rows = table_rows(&t.lock().unwrap());
            async move { (rows.len() >= 6).then_some(rows) }
        })
        .await;
        let objects = eventually(Duration::from_secs(20), "five --watch-only objects", || {
            let objects = json_objects(&j.lock().unwrap());
            async move { (objects.len() >= 5).then_some(objects) }
        })
        .await;
        println!("kubectl get -w ({side}): {rows:?}");
        println!("kubectl get --watch-only -o json ({side}): {objects:?}");
        tables.push(rows);
        jsons.push(objects);
    }
    let row = |e: &str, n: &str, d: &str| (e.to_string(), n.to_string(), d.to_string());
    assert_eq!(
        tables[1],
        [
            row("ADDED", "a", "1"),
            row("ADDED", "b", "1"),
            row("MODIFIED", "a", "1"),
            row("ADDED", "c", "1"),
            row("DELETED", "b", "1"),
            row("MODIFIED", "c", "1"),
        ],
        "direct kubectl get -w"
    );
    assert_eq!(tables[0], tables[1], "kubectl get -w: proxy vs direct");
    assert_eq!(
        jsons[1].iter().map(|o| o.0.as_str()).collect::<Vec<_>>(),
        ["b", "a", "c", "b", "c"],
        "direct kubectl get --watch-only -o json"
    );
    assert_eq!(
        jsons[0], jsons[1],
        "kubectl get --watch-only: proxy vs direct"
    );
    drop(runs);

    // Chunked lists: seven objects in pages of two (`limit=2`, then
    // `continue`), the same items with the same resourceVersions.
    for i in 0..5 {
        api.create(&PostParams::default(), &cm(&format!("page-{i}"), "1"))
            .await
            .unwrap();
    }
    let (_, metrics) = env.running.admin_get("/metrics").await;
    let lists = |metrics: &str, source| {
        metric_sum(
            metrics,
            "kube_cache_proxy_cache_reads_total",
            &[
                ("resource", "configmaps"),
                ("verb", "LIST"),
                ("source", source),
            ],
        )
    };
    let before = (lists(&metrics, "cache"), lists(&metrics, "upstream"));
    let mut listed = Vec::new();
    for (side, kubectl) in &sides {
        let (ok, out, err) = kubectl
            .run(&[
                "get",
                "configmaps",
                "-n",
                &ns,
                "--chunk-size=2",
                "-o",
                "json",
                "-v=6",
            ])
            .await;
        assert!(ok, "{side}: kubectl --chunk-size failed: {err}");
        let pages = err
            .lines()
            .filter(|l| l.contains("limit=2") && l.contains("200 OK"))
            .count();
        assert_eq!(pages, 4, "{side}: pages of 2 for 7 objects\n{err}");
        let list: serde_json::Value = serde_json::from_str(&out).unwrap();
        let items: Vec<(String, String)> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap().to_string(),
                    o["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect();
        println!("kubectl get --chunk-size=2 ({side}): {pages} pages, {items:?}");
        listed.push(items);
    }
    assert_eq!(listed[0].len(), 7);
    assert_eq!(
        listed[0], listed[1],
        "kubectl --chunk-size: proxy vs direct"
    );
    let (_, metrics) = env.running.admin_get("/metrics").await;
    println!(
        "kubectl --chunk-size=2 through the proxy: {} pages from the cache, {} passed through",
        lists(&metrics, "cache") - before.0,
        lists(&metrics, "upstream") - before.1
    );
}
