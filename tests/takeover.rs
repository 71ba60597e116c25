#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Zero-downtime takeover through the real binary, in front of the
//! simulated apiserver: a second `kube-cache-proxy` started with the same
//! configuration takes the listening sockets over once it is ready, and
//! the first drains. Under load across the takeover, a client making a
//! request every 20 ms on a fresh connection sees no failure, and watchers
//! (one served from the cache, one passed through) that re-watch from
//! their last resourceVersion when their stream ends, as informers do, see
//! every change exactly once, in order, with no 410.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube_apiserver_sim::{Sim, SimConfig};
use kube_cache_proxy::pki::Ca;
use kube_cache_proxy::resource::Gvr;
use parking_lot::Mutex;
use serde_json::json;
use support::{Auth, Client, Identity, Next};

const BIN: &str = env!("CARGO_BIN_EXE_kube-cache-proxy");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Setup {
    dir: PathBuf,
    config: PathBuf,
    port: u16,
    admin_port: u16,
    ca_pem: String,
}

fn setup(sim: &Sim) -> Setup {
    let dir = support::env::tempdir();
    let ca = Ca::new("takeover-test").unwrap();
    let serving = ca
        .issue_server(&["localhost"], &["127.0.0.1".parse().unwrap()])
        .unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cert = write("tls.crt", &serving.cert_pem);
    let key = write("tls.key", &serving.key_pem);
    let client_ca = write("client-ca.crt", &sim.ca_pem());
    let upstream = write(
        "upstream.kubeconfig",
        &sim.kubeconfig(&SimConfig::default().proxy_user, None),
    );
    let (port, admin_port) = (free_port(), free_port());
    let state = dir.join("state");
    let config = write(
        "config.yaml",
        &format!(
            r#"listen: 127.0.0.1:{port}
adminListen: 127.0.0.1:{admin_port}
tls:
  certFile: {cert}
  privateKeyFile: {key}
  clientCAFile: {client_ca}
upstream:
  kubeconfig: {upstream}
shutdownGracePeriodSeconds: 5
cache:
  bookmarkIntervalSeconds: 1
  resources:
    - {{version: v1, resource: configmaps}}
    - {{version: v1, resource: pods}}
  persistence:
    directory: {state}/cache
takeover:
  socketPath: {state}/takeover.sock
"#,
            cert = cert.display(),
            key = key.display(),
            client_ca = client_ca.display(),
            upstream = upstream.display(),
            state = state.display(),
        ),
    );
    Setup {
        dir,
        config,
        port,
        admin_port,
        ca_pem: ca.cert_pem(),
    }
}

fn start(setup: &Setup, log: &str) -> tokio::process::Child {
    let log = std::fs::File::create(setup.dir.join(log)).unwrap();
    tokio::process::Command::new(BIN)
        .arg("--config")
        .arg(&setup.config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn wait_for_log(path: &Path, text: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.contains(text) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {text:?} in {}:\n{log}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ready(setup: &Setup) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", setup.admin_port)).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let _ = s
                .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await;
            let mut out = String::new();
            let _ = s.read_to_string(&mut out).await;
            if out.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sigterm(child: &tokio::process::Child) {
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

/// An informer's watch loop: watch from the last resourceVersion, and when
/// the stream ends, again from there. Records every change's object name
/// and any failure (a transport error, an `ERROR` event, a non-200).
async fn informer(
    client: Arc<dyn Fn() -> Client + Send + Sync>,
    path: String,
    mut rv: u64,
    seen: Arc<Mutex<Vec<String>>>,
    failures: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    rewatches: Arc<AtomicU64>,
) {
    while !stop.load(Ordering::SeqCst) {
        let c = client();
        let mut w = match c
            .try_watch(
                &format!("{path}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true"),
                &[],
            )
            .await
        {
            Ok(w) if w.status == 200 => w,
            Ok(w) => {
                failures
                    .lock()
                    .push(format!("{path}: watch answered {}", w.status));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => {
                failures.lock().push(format!("{path}: watch failed: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        loop {
            match w.next(Duration::from_millis(200)).await {
                Next::Event(e) => {
                    let t = e["type"].as_str().unwrap_or_default().to_string();
                    if t == "ERROR" {
                        failures.lock().push(format!("{path}: {e}"));
                        break;
                    }
                    rv = e["object"]["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap()
                        .parse()
                        .unwrap();
                    if t != "BOOKMARK" {
                        seen.lock().push(
                            e["object"]["metadata"]["name"]
                                .as_str()
                                .unwrap()
                                .to_string(),
                        );
                    }
                }
                Next::End => {
                    rewatches.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                Next::Error(e) => {
                    failures.lock().push(format!("{path}: stream broke: {e}"));
                    break;
                }
                Next::Timeout if stop.load(Ordering::SeqCst) => return,
                Next::Timeout => {}
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_takes_over_without_a_failed_request_or_a_lost_event() {
    let sim = Arc::new(Sim::start(SimConfig::default()).await.unwrap());
    let s = setup(&sim);
    let admin_auth = Identity::admin().auth(&sim);
    let url = format!("https://127.0.0.1:{}", s.port);
    let fresh = {
        let (url, ca, auth) = (url.clone(), s.ca_pem.clone(), admin_auth.clone());
        Arc::new(move || Client::new(&url, &ca, auth.clone(), false))
            as Arc<dyn Fn() -> Client + Send + Sync>
    };

    let mut first = start(&s, "first.log");
    ready(&s).await;
    let cms = support::configmaps();
    let pods = Gvr {
        resource: "pods".into(),
        ..support::configmaps()
    };
    let secrets = Gvr {
        resource: "secrets".into(),
        ..support::configmaps()
    };
    let start_rv: u64 = sim
        .create(&cms, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "start", "namespace": "t"}}))
        .unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let requests = Arc::new(AtomicU64::new(0));
    let rewatches = Arc::new(AtomicU64::new(0));
    // Requests every 20 ms, each on a fresh connection: one from the cache,
    // one passed through.
    let requester = {
        let (fresh, stop, failures, requests) = (
            fresh.clone(),
            stop.clone(),
            failures.clone(),
            requests.clone(),
        );
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let path = if i % 2 == 0 {
                    "/api/v1/namespaces/t/configmaps?resourceVersion=0"
                } else {
                    "/api/v1/namespaces/t/secrets"
                };
                match fresh().try_send(http::Method::GET, path, &[], None).await {
                    Ok(r) if r.status == 200 => {}
                    Ok(r) => failures
                        .lock()
                        .push(format!("{path}: {} {}", r.status, r.text())),
                    Err(e) => failures.lock().push(format!("{path}: {e}")),
                }
                requests.fetch_add(1, Ordering::SeqCst);
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // Watchers: configmaps from the cache, secrets passed through.
    let seen_cms = Arc::new(Mutex::new(Vec::new()));
    let seen_secrets = Arc::new(Mutex::new(Vec::new()));
    let watchers = [
        ("/api/v1/namespaces/t/configmaps", seen_cms.clone()),
        ("/api/v1/namespaces/t/secrets", seen_secrets.clone()),
    ]
    .map(|(path, seen)| {
        tokio::spawn(informer(
            fresh.clone(),
            path.to_string(),
            start_rv,
            seen,
            failures.clone(),
            stop.clone(),
            rewatches.clone(),
        ))
    });
    // Changes all along.
    let writer = {
        let (sim, stop) = (sim.clone(), stop.clone());
        let (cms, secrets, pods) = (cms.clone(), secrets.clone(), pods.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("x{n:04}");
                sim.create(&cms, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "t"}})).unwrap();
                sim.create(&secrets, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "t"}})).unwrap();
                sim.create(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "t"}, "spec": {"containers": []}})).unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            n
        })
    };

    tokio::time::sleep(Duration::from_secs(1)).await;
    let lists_before = sim.stats().lists("configmaps") + sim.stats().lists("pods");
    let second = start(&s, "second.log");
    wait_for_log(
        &s.dir.join("second.log"),
        "took over from the running proxy",
        Duration::from_secs(20),
    )
    .await;
    wait_for_log(
        &s.dir.join("first.log"),
        "drained; idle until stopped",
        Duration::from_secs(20),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The DaemonSet deletes the old pod once the new one is ready.
    sigterm(&first);
    let exited = tokio::time::timeout(Duration::from_secs(5), first.wait())
        .await
        .expect("the drained proxy did not stop at once")
        .unwrap();
    assert!(exited.success());
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let written = writer.await.unwrap();
    requester.await.unwrap();
    // Let the watchers receive the last changes.
    let want: Vec<String> = std::iter::once("start".to_string())
        .chain((0..written).map(|n| format!("x{n:04}")))
        .collect();
    stop.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while (seen_cms.lock().len() < want.len() - 1 || seen_secrets.lock().len() < want.len() - 1)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for w in watchers {
        w.await.unwrap();
    }

    let failures = failures.lock().clone();
    assert!(
        failures.is_empty(),
        "failures across the takeover: {failures:#?}"
    );
    // The watch started after "start": every later change, once, in order.
    assert_eq!(*seen_cms.lock(), want[1..], "configmaps (from the cache)");
    assert_eq!(*seen_secrets.lock(), want[1..], "secrets (passed through)");
    assert!(
        rewatches.load(Ordering::SeqCst) >= 2,
        "both watches ended cleanly at the takeover"
    );
    // The successor resumed from the snapshots the first one wrote.
    assert_eq!(
        sim.stats().lists("configmaps") + sim.stats().lists("pods"),
        lists_before,
        "the successor listed"
    );
    println!(
        "takeover: {} requests on fresh connections, 0 failed; {} changes to each watched \
         resource seen once and in order; {} clean re-watches",
        requests.load(Ordering::SeqCst),
        written,
        rewatches.load(Ordering::SeqCst)
    );
    let mut second = second;
    sigterm(&second);
    assert!(second.wait().await.unwrap().success());
    let _: Auth = admin_auth;
    let _ = std::fs::remove_dir_all(&s.dir);
}
