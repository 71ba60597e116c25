//! Watchers resume through a node proxy without `410 Gone` (issue 60): four
//! informer-like watchers of one ConfigMap through the proxy's binary
//! (caching configmaps, its snapshots on disk) ride out what a node sees:
//! the proxy killed (`SIGKILL`) and restarted twice, the apiserver stalled
//! for 8 s, and the apiserver killed and restarted; while the ConfigMap
//! changes every 250 ms. Each watcher resumes from the last
//! resourceVersion it saw, as client-go's reflector does, and relists only
//! on `410`; beside them, the same watchers directly on the apiserver are
//! the reference: a 410 is the proxy's only where the apiserver's own
//! watchers got none.
//!
//! Skipped, with one line, where no control plane is available.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kube_testenv::Options;
use parking_lot::Mutex;
use serde_json::{Value, json};
use support::binary::Binary;
use support::real::{Isolated, namespace};
use support::{Auth, Client, Next};

const NS: &str = "resumes";
const NAME: &str = "watched";
const WATCHERS: usize = 4;

/// What one watcher saw.
#[derive(Default)]
struct Seen {
    /// The `data.v` of the last event (the value written).
    value: AtomicU64,
    /// `410` answers, by the fault during or after which they came.
    gone: Mutex<Vec<String>>,
    /// Values that did not follow the one before by exactly one, between
    /// lists: a change missed or sent twice.
    out_of_order: Mutex<Vec<(u64, u64)>>,
}

impl Seen {
    /// The value of an event: the next one, or out of order.
    fn event(&self, v: u64) {
        let last = self.value.swap(v, Ordering::SeqCst);
        if v != last + 1 {
            self.out_of_order.lock().push((last, v));
        }
    }
}

/// An informer of `NS/NAME` on `client`: lists, then watches from the
/// list's resourceVersion, resumes from the last resourceVersion seen
/// when the stream ends or breaks (after 0.2 s), relists on `410` (counted
/// under the fault `phase` names), until `stop`.
async fn informer(
    client: Client,
    seen: Arc<Seen>,
    phase: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
) {
    let base = format!("/api/v1/namespaces/{NS}/configmaps");
    let selector = format!("fieldSelector=metadata.name%3D{NAME}");
    let mut rv: Option<String> = None;
    while !stop.load(Ordering::SeqCst) {
        let Some(from) = rv.clone() else {
            match client
                .try_send(http::Method::GET, &format!("{base}?{selector}"), &[], None)
                .await
            {
                Ok(r) if r.status == 200 => {
                    let list = r.json();
                    if let Some(v) = list["items"][0]["data"]["v"].as_str() {
                        seen.value.store(v.parse().unwrap_or(0), Ordering::SeqCst);
                    }
                    rv = list["metadata"]["resourceVersion"]
                        .as_str()
                        .map(str::to_string);
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
            continue;
        };
        let path = format!(
            "{base}?watch=true&allowWatchBookmarks=true&{selector}&resourceVersion={from}&timeoutSeconds=30"
        );
        let Ok(mut stream) = client.try_watch(&path, &[]).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if stream.status != 200 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        loop {
            match stream.next(Duration::from_secs(40)).await {
                Next::Event(e) => {
                    if e["type"] == "ERROR" {
                        if e["object"]["code"] == 410 {
                            seen.gone.lock().push(phase.lock().clone());
                            rv = None;
                        }
                        break;
                    }
                    if let Some(v) = e["object"]["metadata"]["resourceVersion"].as_str() {
                        rv = Some(v.to_string());
                    }
                    if let Some(v) = e["object"]["data"]["v"].as_str() {
                        seen.event(v.parse().unwrap_or(0));
                    }
                }
                Next::End | Next::Error(_) | Next::Timeout => break,
            }
            if stop.load(Ordering::SeqCst) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_resume_through_proxy_restarts_and_apiserver_faults_without_410() {
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let cp = plane.cp();
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    namespace(&admin, NS).await;
    let r = admin
        .post_json(
            &format!("/api/v1/namespaces/{NS}/configmaps"),
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME}, "data": {"v": "0"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());

    // The proxy's binary caching configmaps, as the admin (what to cache
    // is the point here, not who), its snapshots in its state directory.
    let dir = support::env::tempdir();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubecacheproxy.io/v1alpha1\nkind: KubeCacheProxyConfiguration\n\
         cache:\n  resources:\n  - {group: \"\", version: v1, resource: configmaps}\n",
    )
    .unwrap();
    let admin_kubeconfig = cp.kubeconfig_text(&cp.url(), "admin", cp.admin());
    let mut proxy = Binary::start_with(
        cp,
        config.to_str().unwrap(),
        |_| admin_kubeconfig,
        "node-1",
        false,
    );
    let ready = async |proxy: &Binary| {
        for _ in 0..600 {
            if matches!(proxy.admin_get("/readyz").await, Some((200, _))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the proxy never became ready: {}", proxy.stderr());
    };
    ready(&proxy).await;

    let phase = Arc::new(Mutex::new("start".to_string()));
    let stop = Arc::new(AtomicBool::new(false));
    let through: Vec<Arc<Seen>> = (0..WATCHERS).map(|_| Arc::default()).collect();
    let direct: Vec<Arc<Seen>> = (0..WATCHERS).map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (seen, client) in through
        .iter()
        .map(|s| (s, proxy.client(Auth::Cert(cp.admin().clone()))))
        .chain(direct.iter().map(|s| (s, admin.clone())))
    {
        tasks.push(tokio::spawn(informer(
            client,
            seen.clone(),
            phase.clone(),
            stop.clone(),
        )));
    }

    // The writer: the next value every 250 ms, at the apiserver. After a
    // failed write (the apiserver down or stalled) it reads the value back:
    // the write may have landed, and every value written follows the one
    // before by one.
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (admin, written, stop) = (admin.clone(), written.clone(), stop.clone());
        tokio::spawn(async move {
            let path = format!("/api/v1/namespaces/{NS}/configmaps/{NAME}");
            while !stop.load(Ordering::SeqCst) {
                let current = admin.try_send(http::Method::GET, &path, &[], None).await;
                let Some(current) = current
                    .ok()
                    .filter(|r| r.status == 200)
                    .and_then(|r| r.json()["data"]["v"].as_str()?.parse::<u64>().ok())
                else {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                };
                let v = current + 1;
                let r = admin
                    .try_send(
                        http::Method::PATCH,
                        &format!("/api/v1/namespaces/{NS}/configmaps/{NAME}"),
                        &[("content-type", "application/merge-patch+json")],
                        Some(
                            json!({"data": {"v": v.to_string()}})
                                .to_string()
                                .into_bytes(),
                        ),
                    )
                    .await;
                if r.is_ok_and(|r| r.status == 200) {
                    written.store(v, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    // Every watcher has seen a value written after `since` (within 60 s).
    let converged = async |since: u64, what: &str| {
        for _ in 0..600 {
            if through
                .iter()
                .chain(&direct)
                .all(|s| s.value.load(Ordering::SeqCst) > since)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let values: Vec<u64> = through
            .iter()
            .chain(&direct)
            .map(|s| s.value.load(Ordering::SeqCst))
            .collect();
        panic!("{what}: not every watcher saw a value past {since}: {values:?}");
    };
    let settle = async |phase_name: &str| {
        // Long enough for a snapshot to be old: the proxy writes one every
        // 60 s (cache.persistence.intervalSeconds).
        *phase.lock() = phase_name.to_string();
        let now = written.load(Ordering::SeqCst);
        converged(now, phase_name).await;
    };
    settle("start").await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    for i in 1..=2 {
        *phase.lock() = format!("proxy killed {i}");
        proxy.kill_and_restart().await;
        ready(&proxy).await;
        settle(&format!("proxy killed {i}")).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    *phase.lock() = "apiserver stalled 8 s".into();
    cp.pause_apiserver().unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    cp.resume_apiserver().unwrap();
    settle("apiserver stalled 8 s").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    *phase.lock() = "apiserver killed".into();
    cp.kill_apiserver(Duration::from_secs(2)).await.unwrap();
    settle("apiserver killed").await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    stop.store(true, Ordering::SeqCst);
    writer.abort();
    for t in tasks {
        t.abort();
    }
    let count = |seen: &[Arc<Seen>]| -> Vec<Vec<String>> {
        seen.iter().map(|s| s.gone.lock().clone()).collect()
    };
    let (through_gone, direct_gone) = (count(&through), count(&direct));
    eprintln!("410s through the proxy: {through_gone:?}");
    eprintln!("410s directly: {direct_gone:?}");
    let log: Value = json!(
        proxy
            .stderr()
            .lines()
            .filter(|l| l.contains("WARN")
                || l.contains("410")
                || l.contains("relist")
                || l.contains("Gone"))
            .collect::<Vec<_>>()
    );
    eprintln!("{log:#}");
    for (who, seen) in [("through the proxy", &through), ("directly", &direct)] {
        let disorder: Vec<Vec<(u64, u64)>> =
            seen.iter().map(|s| s.out_of_order.lock().clone()).collect();
        assert!(
            disorder.iter().all(Vec::is_empty),
            "watchers {who} missed or repeated changes (last, next): {disorder:?}"
        );
    }
    assert!(
        through_gone.iter().all(Vec::is_empty),
        "watchers through the proxy got 410: {through_gone:?} (directly: {direct_gone:?})\n{log:#}"
    );
}
