//! A highly available control plane (three kube-apiservers on a
//! three-member etcd cluster): the proxy spreading its own upstream
//! connections across the apiservers (`upstream.clientSideBalancing`,
//! learnt from the `default/kubernetes` EndpointSlices), against the same
//! proxy behind HAProxy configured as kubeadm's HA guide does. In each,
//! the apiserver carrying the proxy's watch is killed while a client reads
//! through the proxy every 50 ms and another watches; the figures (how
//! long until the watcher sees writes again, requests failed) are printed
//! (docs/operations.md, "Highly available control planes"). Then, with
//! client-side balancing, an apiserver whose etcd member is stopped is
//! left while the others serve, and taken back once its member is.
//!
//! Skipped, with one line, where no control plane is available; the
//! HAProxy half is skipped where HAProxy is not installed.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube_testenv::{ControlPlane, Options};
use serde_json::json;
use support::cache_configmaps;
use support::client::{Auth, Client, Next};
use support::real::{Isolated, RealEnv, eventually, metric_sum};

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// The address apiserver `i` is published at: a documentation address
/// (RFC 5737), since kube-apiserver refuses loopback addresses in
/// EndpointSlices; the proxy (built with `failpoints`) dials its loopback
/// address instead (the failpoint `upstream::balance::dial`).
fn published(i: usize) -> String {
    format!("192.0.2.{}", i + 1)
}

/// One EndpointSlice per apiserver for the `kubernetes` Service, as the
/// apiservers' endpoint reconciler publishes them (kube-testenv runs them
/// with `--endpoint-reconciler-type=none`), and the failpoint that maps
/// each published address to the apiserver's loopback one.
async fn publish_apiservers(cp: &ControlPlane, admin: &Client) {
    let mut map = Vec::new();
    for i in 0..cp.apiserver_count() {
        let port = port_of(&cp.apiserver_url(i));
        map.push(format!("{}:{port}=127.0.0.1:{port}", published(i)));
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("kubernetes-{i}"), "namespace": "default",
                "labels": {"kubernetes.io/service-name": "kubernetes"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [published(i)], "conditions": {"ready": true}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]
        });
        let r = admin
            .post_json(
                "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
                &slice,
            )
            .await;
        assert!(r.status.is_success() || r.status == 409, "{}", r.text());
    }
    fail::cfg(
        "upstream::balance::dial",
        &format!("return({})", map.join(",")),
    )
    .unwrap();
}

/// The admin client of apiserver `i` directly.
fn admin_of(cp: &ControlPlane, i: usize) -> Client {
    Client::new(
        &cp.apiserver_url(i),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    )
}

/// The apiserver whose watch cache has a configmaps watch open (the
/// proxy's reflector: nothing else watches configmaps here).
/// The proxy's caches in these tests: configmaps, and podtemplates, which
/// no apiserver watches itself (each watches configmaps: its own
/// informers), so that the apiserver with a podtemplates watch is the one
/// carrying the proxy's (every cache's watch shares its one connection).
fn cache_configmaps_and_a_marker(c: &mut kube_cache_proxy::component::config::Config) {
    cache_configmaps(c);
    c.cache
        .resources
        .push(kube_cache_proxy::component::config::CachedResource {
            version: "v1".into(),
            resource: "podtemplates".into(),
            ..Default::default()
        });
}

async fn carrying_the_watch(cp: &ControlPlane) -> Option<usize> {
    for i in 0..cp.apiserver_count() {
        let c = admin_of(cp, i);
        let Ok(r) = c.try_send(http::Method::GET, "/metrics", &[], None).await else {
            continue;
        };
        let watches = metric_sum(
            &r.text(),
            "apiserver_longrunning_requests",
            &[("resource", "podtemplates"), ("verb", "WATCH")],
        );
        if watches > 0.0 {
            return Some(i);
        }
    }
    None
}

/// What a client of the proxy saw around the kill.
#[derive(Debug)]
struct Failover {
    /// From the fault to the watcher's first event for a write made after
    /// it.
    watch_gap: Duration,
    /// From that write's success (the apiserver's answer) to its event:
    /// how far behind the cluster the watcher was, without the time the
    /// cluster itself took to accept writes again (an etcd election when
    /// the stopped member led).
    behind: Duration,
    reads: u64,
    failed: u64,
}

/// The most a watcher may be behind the cluster, from a write's success
/// to its event, after the apiserver carrying the proxy's watch is killed:
/// the watch breaks at once and resumes on another apiserver after the
/// reflector's first backoff (0.1–0.2 s). Measured: 0–0.2 s.
const BEHIND_AFTER_A_KILL: Duration = Duration::from_secs(5);
/// The same after its etcd member stops, with client-side balancing: the
/// balancer leaves an apiserver whose consistent read fails within
/// `maxLagSeconds` (4 here) and a probe interval (2), which closes its
/// connections; the watch resumes on another.
const BEHIND_AFTER_A_LAG: Duration = Duration::from_secs(10);

/// The same behind a load balancer whose health check does not see the
/// lag on open connections: the proxy reconnects once its watches have
/// been silent for 30 s and a consistent read on the connection failed
/// (`cache/ingest/silence.rs`: at most 40 s), and resumes on another apiserver.
const BEHIND_A_LOAD_BALANCER_AFTER_A_LAG: Duration = Duration::from_secs(50);

/// Reads through the proxy (every 50 ms for 10 s) that may fail around a
/// fault: those in flight on the connection it breaks (a passed-through
/// read is not retried: the client decides). Measured: 0–2.
const FAILED_READS: u64 = 3;

/// What happens to the apiserver carrying the proxy's watch.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// `kill -9`.
    Kill,
    /// Its etcd member stopped: it lags.
    Lag,
}

/// `fault` to the apiserver carrying the proxy's configmaps watch while a
/// reader and a watcher use the proxy and a writer writes through another
/// apiserver; what they saw (a watch gap of at most `limit`).
async fn fault_and_measure(env: &RealEnv, ns: &str, fault: Fault, limit: Duration) -> Failover {
    let cp = env.cp;
    let victim = eventually(
        Duration::from_secs(30),
        "the proxy's watch found",
        || async { carrying_the_watch(cp).await },
    )
    .await;
    let writer_of = (victim + 1) % cp.apiserver_count();
    let writer = admin_of(cp, writer_of);
    let cms = format!("/api/v1/namespaces/{ns}/configmaps");
    let proxy = env.proxy_h2(env.admin());
    let listed = proxy.get(&format!("{cms}?resourceVersion=0")).await.json();
    let rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watch = proxy
        .watch(&format!("{cms}?watch=1&resourceVersion={rv}"), &[])
        .await;
    // A reader: a passed-through read every 50 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let reader = {
        let (stop, reads, failed) = (stop.clone(), reads.clone(), failed.clone());
        let client = env.proxy(env.admin());
        let path = format!("/api/v1/namespaces/{ns}/serviceaccounts");
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                reads.fetch_add(1, Ordering::Relaxed);
                match client.try_send(http::Method::GET, &path, &[], None).await {
                    Ok(r) if r.status.is_success() => {}
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = Instant::now();
    match fault {
        Fault::Kill => cp.stop_apiserver_of(victim),
        Fault::Lag => cp.kill_etcd_member(victim),
    }
    // Writes after the kill, through a surviving apiserver, every 100 ms;
    // the watcher's first event for one of them ends the gap. Named for
    // this fault alone: a name an earlier fault's writer used (the same
    // namespace) is `409 AlreadyExists`, no write at all, which once
    // passed for a watcher that saw nothing for 30 s.
    static FAULTS: AtomicU64 = AtomicU64::new(0);
    let prefix = format!("after-{}-", FAULTS.fetch_add(1, Ordering::Relaxed));
    let written: Arc<parking_lot::Mutex<std::collections::HashMap<String, Instant>>> =
        Arc::default();
    let writes = {
        let stop = stop.clone();
        let cms = cms.clone();
        let written = written.clone();
        let prefix = prefix.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("{prefix}{n}");
                let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name}});
                let r = writer
                    .try_send(
                        http::Method::POST,
                        &cms,
                        &[("content-type", "application/json")],
                        Some(serde_json::to_vec(&cm).unwrap()),
                    )
                    .await;
                if r.is_ok_and(|r| r.status.is_success()) {
                    written.lock().insert(name, Instant::now());
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let (watch_gap, behind) = loop {
        match watch.next(limit.saturating_sub(killed.elapsed())).await {
            Next::Event(e)
                if e["object"]["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&prefix)) =>
            {
                let seen = Instant::now();
                let name = e["object"]["metadata"]["name"].as_str().unwrap_or_default();
                // An event before the write's answer: not behind at all.
                let behind = written
                    .lock()
                    .get(name)
                    .map_or(Duration::ZERO, |ok| seen.saturating_duration_since(*ok));
                break (killed.elapsed(), behind);
            }
            Next::Event(_) => {}
            Next::Timeout => {
                // Never seen: behind since the first write that succeeded.
                let first = written.lock().values().min().copied();
                break (limit, first.map_or(limit, |t| t.elapsed()));
            }
            other => panic!("the proxy's watch ended: {other:?}"),
        }
    };
    // The reader keeps going for 10 s after the kill.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(killed.elapsed())).await;
    stop.store(true, Ordering::Relaxed);
    let _ = reader.await;
    let _ = writes.await;
    match fault {
        Fault::Kill => cp.start_apiserver_of(victim, None).await.unwrap(),
        Fault::Lag => cp.start_etcd_member(victim).unwrap(),
    }
    Failover {
        watch_gap,
        behind,
        reads: reads.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_balancing_against_haproxy() {
    // The proxy's warnings (an apiserver left, watches moved), for a
    // failure's post-mortem.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "kube_cache_proxy=warn".into()),
        )
        .with_test_writer()
        .try_init();
    let Some(plane) = Isolated::start(Options {
        apiservers: 3,
        etcd_members: 3,
        ..Options::default()
    })
    .await
    else {
        return;
    };
    let cp = plane.cp();
    publish_apiservers(cp, &admin_of(cp, 0)).await;
    // The proxy's own balancing first, then HAProxy: each starts once
    // every apiserver answers consistent reads again.
    client_side_balancing(cp).await;
    behind_haproxy(cp).await;
}

/// The proxy behind HAProxy (kubeadm's HA guide), for comparison.
async fn behind_haproxy(cp: &'static ControlPlane) {
    wait_all_ready(cp).await;
    let backends: Vec<std::net::SocketAddr> = (0..cp.apiserver_count())
        .map(|i| ([127, 0, 0, 1], port_of(&cp.apiserver_url(i))).into())
        .collect();
    let dir = support::env::tempdir();
    let stop = tokio_util::sync::CancellationToken::new();
    let lb = kcp_robustness::balancer::Balancer::start(&backends, &dir, stop.clone())
        .await
        .unwrap();
    if lb.kind != "haproxy" {
        kube_testenv::skip::skip("HAProxy is not installed (Debian's haproxy)");
        return;
    }
    let env = RealEnv::start_on_within(
        cp,
        |c| {
            cache_configmaps_and_a_marker(c);
            let kubeconfig = c.upstream.kubeconfig.clone().unwrap();
            std::fs::write(
                &kubeconfig,
                cp.kubeconfig_text(&lb.url(), "admin", cp.admin()),
            )
            .unwrap();
        },
        Duration::from_secs(60),
    )
    .await;
    let ns = env.namespace("ha-haproxy").await;
    let f = fault_and_measure(&env, &ns, Fault::Kill, Duration::from_secs(60)).await;
    println!(
        "behind HAProxy: the apiserver carrying the proxy's watch killed; the watcher saw a write again after {:.2?}, {:.2?} after the apiserver accepted it; reads failed: {} of {}",
        f.watch_gap, f.behind, f.failed, f.reads
    );
    assert!(f.watch_gap < Duration::from_secs(15), "{f:?}");
    assert!(f.behind < BEHIND_AFTER_A_KILL, "{f:?}");
    assert!(f.failed <= FAILED_READS, "{f:?}");
    // HAProxy's health check marks a lagging apiserver down for new
    // connections, but the proxy's watch stays on its connection, silent:
    // the proxy's watchdog (`cache/ingest/silence.rs`) finds it and reconnects.
    wait_all_ready(cp).await;
    let f = fault_and_measure(&env, &ns, Fault::Lag, Duration::from_secs(60)).await;
    println!(
        "behind HAProxy: the etcd member of the apiserver carrying the proxy's watch stopped; the watcher saw a write again after {:.2?}, {:.2?} after the apiserver accepted it; reads failed: {} of {}",
        f.watch_gap, f.behind, f.failed, f.reads
    );
    assert!(f.behind < BEHIND_A_LOAD_BALANCER_AFTER_A_LAG, "{f:?}");
    assert!(f.failed <= FAILED_READS, "{f:?}");
    drop(env);
    stop.cancel();
}

/// Waits until every apiserver answers `/readyz` and a consistent read
/// (one just restarted, or its etcd member).
async fn wait_all_ready(cp: &ControlPlane) {
    for i in 0..cp.apiserver_count() {
        let c = admin_of(cp, i);
        eventually(Duration::from_secs(90), "an apiserver ready", || async {
            for path in ["/readyz", "/api/v1/namespaces/default/configmaps?limit=1"] {
                let r = c.try_send(http::Method::GET, path, &[], None).await.ok()?;
                if r.status != 200 {
                    return None;
                }
            }
            Some(())
        })
        .await;
    }
}

async fn ready_apiservers(env: &RealEnv) -> f64 {
    let m = env.proxy_metrics().await;
    metric_sum(
        &m,
        "kube_cache_proxy_upstream_apiservers",
        &[("state", "ready")],
    )
}

/// The proxy spreading its own connections: spread, failover, a lagging
/// apiserver left and taken back.
async fn client_side_balancing(cp: &'static ControlPlane) {
    wait_all_ready(cp).await;
    // Bootstrapped from one apiserver's address, as a kubeconfig written
    // for one server would be.
    let env = RealEnv::start_on_within(
        cp,
        |c| {
            cache_configmaps_and_a_marker(c);
            c.upstream.client_side_balancing.enabled = true;
            c.upstream.client_side_balancing.probe_interval_seconds = 2;
            c.upstream.client_side_balancing.max_lag_seconds = 4;
        },
        Duration::from_secs(60),
    )
    .await;
    let ns = env.namespace("ha-balanced").await;
    eventually(
        Duration::from_secs(30),
        "three apiservers ready",
        || async { (ready_apiservers(&env).await == 3.0).then_some(()) },
    )
    .await;

    // Spread: passed-through watches fill more than one connection's
    // streams (90 each), each new connection to the apiserver with the
    // fewest.
    let proxy = env.proxy_h2(env.admin());
    let mut held = Vec::new();
    for _ in 0..200 {
        held.push(
            proxy
                .watch(
                    &format!("/api/v1/namespaces/{ns}/serviceaccounts?watch=1"),
                    &[],
                )
                .await,
        );
    }
    let m = env.proxy_metrics().await;
    let used: Vec<String> = m
        .lines()
        .filter(|l| l.starts_with("kube_cache_proxy_upstream_apiserver_connections_total{"))
        .filter(|l| !l.contains("configured"))
        .map(str::to_string)
        .collect();
    println!("connections by apiserver: {used:#?}");
    assert!(
        used.len() >= 3,
        "connections spread across the apiservers: {used:?}"
    );
    drop(held);

    let f = fault_and_measure(&env, &ns, Fault::Kill, Duration::from_secs(60)).await;
    println!(
        "client-side balancing: the apiserver carrying the proxy's watch killed; the watcher saw a write again after {:.2?}, {:.2?} after the apiserver accepted it; reads failed: {} of {}",
        f.watch_gap, f.behind, f.failed, f.reads
    );
    assert!(f.watch_gap < Duration::from_secs(15), "{f:?}");
    assert!(f.behind < BEHIND_AFTER_A_KILL, "{f:?}");
    assert!(f.failed <= FAILED_READS, "{f:?}");
    eventually(
        Duration::from_secs(60),
        "three apiservers ready again",
        || async { (ready_apiservers(&env).await == 3.0).then_some(()) },
    )
    .await;
    let f = fault_and_measure(&env, &ns, Fault::Lag, Duration::from_secs(30)).await;
    println!(
        "client-side balancing: the etcd member of the apiserver carrying the proxy's watch stopped; the watcher saw a write again after {:.2?}, {:.2?} after the apiserver accepted it; reads failed: {} of {}",
        f.watch_gap, f.behind, f.failed, f.reads
    );
    // How long the cluster took to accept writes again varies (an etcd
    // election when the stopped member led: up to 20 s here); how far
    // behind the watcher was once it had, does not: the balancer leaves a
    // lagging apiserver within maxLagSeconds (4) and a probe interval (2),
    // and the watch resumes on another at once.
    assert!(f.behind < BEHIND_AFTER_A_LAG, "{f:?}");
    assert!(f.failed <= FAILED_READS, "{f:?}");

    // Lagging: one apiserver's etcd member stopped. It still answers
    // `/readyz` and `resourceVersion=0` from its watch cache, but not a
    // consistent read: it is left while the others serve, and taken back
    // once its member is.
    eventually(
        Duration::from_secs(60),
        "three apiservers ready again",
        || async { (ready_apiservers(&env).await == 3.0).then_some(()) },
    )
    .await;
    let lagging = 2;
    cp.kill_etcd_member(lagging);
    let started = Instant::now();
    eventually(
        Duration::from_secs(30),
        "the lagging apiserver left",
        || async { (ready_apiservers(&env).await == 2.0).then_some(()) },
    )
    .await;
    let m = env.proxy_metrics().await;
    println!(
        "an apiserver whose etcd member stopped was left after {:.1?} (lagging {}, not ready {})",
        started.elapsed(),
        metric_sum(
            &m,
            "kube_cache_proxy_upstream_apiservers",
            &[("state", "lagging")]
        ),
        metric_sum(
            &m,
            "kube_cache_proxy_upstream_apiservers",
            &[("state", "not-ready")]
        ),
    );
    // Reads through the proxy meanwhile are served.
    let r = env
        .proxy(env.admin())
        .get(&format!("/api/v1/namespaces/{ns}/configmaps?limit=1"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    cp.start_etcd_member(lagging).unwrap();
    eventually(
        Duration::from_secs(60),
        "taken back once its member is back",
        || async { (ready_apiservers(&env).await == 3.0).then_some(()) },
    )
    .await;
}
