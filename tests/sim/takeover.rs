#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Zero-downtime upgrades through the real binary, in front of the
//! simulated apiserver:
//! - takeover: a second `kube-cache-proxy` started with the same
//!   configuration takes the listening sockets over once it is ready, and
//!   the first drains;
//! - a restart with the listening sockets held by systemd (socket
//!   activation, `LISTEN_FDS`): the old process drains and exits, the new
//!   one resumes from its snapshots.
//!
//! Under load across either, a client making a request every 20 ms on a
//! fresh connection sees no failure, and watchers (one served from the
//! cache, one passed through) that re-watch from their last
//! resourceVersion when their stream ends, as informers do, see every
//! change exactly once, in order, with no 410; and nothing is listed
//! upstream again.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use apimachinery::pki::Ca;
use apimachinery::resource::Gvr;
use kube_apiserver_sim::{Sim, SimConfig};
use parking_lot::Mutex;
use serde_json::json;
use support::{Client, Identity, Next};

const BIN: &str = env!("CARGO_BIN_EXE_kube-cache-proxy");

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
    let (port, admin_port) = (support::env::free_port(), support::env::free_port());
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
    start_with_sockets(setup, log, &[])
}

/// Starts the binary; with `sockets`, passes them as systemd does (file
/// descriptors 3, 4..., `LISTEN_FDS`).
fn start_with_sockets(
    setup: &Setup,
    log: &str,
    sockets: &[&std::net::TcpListener],
) -> tokio::process::Child {
    use command_fds::{CommandFdExt, FdMapping};
    let log = std::fs::File::create(setup.dir.join(log)).unwrap();
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("--config")
        .arg(&setup.config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true);
    if !sockets.is_empty() {
        let mappings = sockets
            .iter()
            .zip(3..)
            .map(|(s, child_fd)| FdMapping {
                parent_fd: std::os::fd::AsFd::as_fd(*s).try_clone_to_owned().unwrap(),
                child_fd,
            })
            .collect();
        cmd.fd_mappings(mappings).unwrap();
        cmd.env("LISTEN_FDS", sockets.len().to_string());
    }
    cmd.spawn().unwrap()
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

/// Waits until the proxy logging to `log` answers `/readyz` with 200. The
/// deadline is generous: the debug binary lists from the in-process sim
/// while the rest of the suite shares the machine's two cores. A failure
/// shows the last answer and the proxy's log.
async fn ready(setup: &Setup, log: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", setup.admin_port)).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let _ = s
                .write_all(b"GET /readyz?verbose HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await;
            last.clear();
            let _ = s.read_to_string(&mut last).await;
            if last.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "never ready; last /readyz answer: {last:?}; {log}:\n{}",
            std::fs::read_to_string(setup.dir.join(log)).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the proxy on `setup`'s admin port holds the reflector
/// watch of every cache upstream (`kube_cache_proxy_upstream_watches`,
/// kind `reflector`, one per `kube_cache_proxy_cache_resource_version`
/// series): each cache has resumed or listed by then, so its upstream
/// lists can be counted exactly, not after a hopeful wait.
async fn every_cache_watching(setup: &Setup) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", setup.admin_port)).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let _ = s
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await;
            last.clear();
            let _ = s.read_to_string(&mut last).await;
            let caches = last
                .lines()
                .filter(|l| l.starts_with("kube_cache_proxy_cache_resource_version{"))
                .count();
            let watching = last
                .lines()
                .filter(|l| {
                    l.starts_with("kube_cache_proxy_upstream_watches{")
                        && l.contains(r#"kind="reflector""#)
                        && l.ends_with(" 1")
                })
                .count();
            if caches > 0 && watching == caches {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "not every cache watching upstream after 30 s:\n{last}"
        );
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

/// Requests every 20 ms on fresh connections, two informer-like watchers
/// (configmaps from the cache, secrets passed through) and a writer, all
/// running while the proxy is replaced.
struct Load {
    sim: Arc<Sim>,
    stop: Arc<AtomicBool>,
    failures: Arc<Mutex<Vec<String>>>,
    requests: Arc<AtomicU64>,
    rewatches: Arc<AtomicU64>,
    seen_cms: Arc<Mutex<Vec<String>>>,
    seen_secrets: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    writer: tokio::task::JoinHandle<usize>,
}

impl Load {
    async fn start(sim: Arc<Sim>, s: &Setup) -> Load {
        let admin_auth = Identity::admin().auth(&sim);
        let url = format!("https://127.0.0.1:{}", s.port);
        let fresh = {
            let (url, ca, auth) = (url.clone(), s.ca_pem.clone(), admin_auth.clone());
            Arc::new(move || Client::new(&url, &ca, auth.clone(), false))
                as Arc<dyn Fn() -> Client + Send + Sync>
        };
        let cms = support::configmaps();
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
        let mut tasks = Vec::new();
        // Requests every 20 ms, each on a fresh connection: one from the
        // cache, one passed through.
        tasks.push({
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
        });
        let seen_cms = Arc::new(Mutex::new(Vec::new()));
        let seen_secrets = Arc::new(Mutex::new(Vec::new()));
        for (path, seen) in [
            ("/api/v1/namespaces/t/configmaps", seen_cms.clone()),
            ("/api/v1/namespaces/t/secrets", seen_secrets.clone()),
        ] {
            tasks.push(tokio::spawn(informer(
                fresh.clone(),
                path.to_string(),
                start_rv,
                seen,
                failures.clone(),
                stop.clone(),
                rewatches.clone(),
            )));
        }
        // Changes all along.
        let writer = {
            let (sim, stop) = (sim.clone(), stop.clone());
            let secrets = Gvr {
                resource: "secrets".into(),
                ..support::configmaps()
            };
            let pods = Gvr {
                resource: "pods".into(),
                ..support::configmaps()
            };
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
        Load {
            sim,
            stop,
            failures,
            requests,
            rewatches,
            seen_cms,
            seen_secrets,
            tasks,
            writer,
        }
    }

    /// Lists the sim has served for the cached resources.
    fn upstream_lists(&self) -> u64 {
        // Not the `limit=1` probes a resumed watch makes.
        self.sim.full_lists(Some("configmaps")) + self.sim.full_lists(Some("pods"))
    }

    /// Stops the load and checks what it saw: no failure, every change once
    /// and in order, both watches ended cleanly at least once. Returns a
    /// summary.
    async fn finish(self, what: &str) -> String {
        self.stop.store(true, Ordering::SeqCst);
        let written = self.writer.await.unwrap();
        // The watchers go on until they have seen the last changes.
        let want: Vec<String> = (0..written).map(|n| format!("x{n:04}")).collect();
        self.stop.store(false, Ordering::SeqCst);
        let mut tasks = self.tasks.into_iter();
        let requester = tasks.next().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while (self.seen_cms.lock().len() < want.len()
            || self.seen_secrets.lock().len() < want.len())
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.stop.store(true, Ordering::SeqCst);
        requester.await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        let failures = self.failures.lock().clone();
        assert!(
            failures.is_empty(),
            "failures across the {what}: {failures:#?}"
        );
        // The watches started after "start": every later change, once, in
        // order.
        assert_eq!(*self.seen_cms.lock(), want, "configmaps (from the cache)");
        assert_eq!(*self.seen_secrets.lock(), want, "secrets (passed through)");
        let rewatches = self.rewatches.load(Ordering::SeqCst);
        assert!(rewatches >= 2, "both watches ended cleanly at the {what}");
        format!(
            "{what}: {} requests on fresh connections, 0 failed; {written} changes to each \
             watched resource seen once and in order; {rewatches} clean re-watches",
            self.requests.load(Ordering::SeqCst)
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_takes_over_without_a_failed_request_or_a_lost_event() {
    let sim = Arc::new(Sim::start(SimConfig::default()).await.unwrap());
    let s = setup(&sim);
    let mut first = start(&s, "first.log");
    ready(&s, "first.log").await;
    let load = Load::start(sim, &s).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lists_before = load.upstream_lists();
    let mut second = start(&s, "second.log");
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
    every_cache_watching(&s).await;
    // The successor resumed from the snapshots the first one wrote.
    assert_eq!(load.upstream_lists(), lists_before, "the successor listed");
    println!("{}", load.finish("takeover").await);
    sigterm(&second);
    assert!(second.wait().await.unwrap().success());
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_activated_restart_refuses_no_connection_and_loses_no_event() {
    let sim = Arc::new(Sim::start(SimConfig::default()).await.unwrap());
    let s = setup(&sim);
    // The listening sockets, held here as systemd holds them.
    let api = std::net::TcpListener::bind(("127.0.0.1", s.port)).unwrap();
    let admin = std::net::TcpListener::bind(("127.0.0.1", s.admin_port)).unwrap();
    let mut first = start_with_sockets(&s, "first.log", &[&api, &admin]);
    ready(&s, "first.log").await;
    wait_for_log(
        &s.dir.join("first.log"),
        "LISTEN_FDS",
        Duration::from_secs(5),
    )
    .await;
    let load = Load::start(sim, &s).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lists_before = load.upstream_lists();
    // `systemctl restart`: stop (drain), then start on the same sockets.
    let restart = Instant::now();
    sigterm(&first);
    assert!(
        tokio::time::timeout(Duration::from_secs(10), first.wait())
            .await
            .expect("the proxy did not stop")
            .unwrap()
            .success()
    );
    let mut second = start_with_sockets(&s, "second.log", &[&api, &admin]);
    ready(&s, "second.log").await;
    let gap = restart.elapsed();
    every_cache_watching(&s).await;
    assert_eq!(
        load.upstream_lists(),
        lists_before,
        "the restarted proxy listed"
    );
    println!(
        "{} (stop to ready again: {gap:?})",
        load.finish("socket-activated restart").await
    );
    sigterm(&second);
    assert!(second.wait().await.unwrap().success());
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// A client that keeps its connection (HTTP/1.1 keep-alive, HTTP/2)
/// re-watches on it when the proxy hands over: the old process must send
/// it to a new connection (HTTP/2 GOAWAY at once, HTTP/1.1 `Connection:
/// close`), not answer on the old one with watches that end at once. The
/// robustness run found clients resending a watch there about 180 times in
/// the handover's one-second linger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_sends_kept_connections_elsewhere_without_a_rewatch_storm() {
    let sim = Arc::new(Sim::start(SimConfig::default()).await.unwrap());
    let s = setup(&sim);
    let mut first = start(&s, "first.log");
    ready(&s, "first.log").await;
    let auth = Identity::admin().auth(&sim);
    let url = format!("https://127.0.0.1:{}", s.port);
    let rv: u64 = sim
        .create(&support::configmaps(), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept", "namespace": "t"}}))
        .unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut counters = Vec::new();
    let mut tasks = Vec::new();
    for h2 in [false, true] {
        // One client, reused: its connection is kept.
        let client = Client::new(&url, &s.ca_pem, auth.clone(), h2);
        let rewatches = Arc::new(AtomicU64::new(0));
        counters.push((h2, rewatches.clone()));
        tasks.push(tokio::spawn(informer(
            Arc::new(move || client.clone()),
            "/api/v1/namespaces/t/configmaps".into(),
            rv,
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(Mutex::new(Vec::new())),
            stop.clone(),
            rewatches,
        )));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut second = start(&s, "second.log");
    wait_for_log(
        &s.dir.join("first.log"),
        "drained; idle until stopped",
        Duration::from_secs(20),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    for (h2, rewatches) in counters {
        let n = rewatches.load(Ordering::SeqCst);
        assert!(
            n <= 3,
            "HTTP/{}: {n} re-watches through the handover",
            if h2 { 2 } else { 1 }
        );
    }
    sigterm(&first);
    first.wait().await.unwrap();
    sigterm(&second);
    second.wait().await.unwrap();
    let _ = std::fs::remove_dir_all(&s.dir);
}
