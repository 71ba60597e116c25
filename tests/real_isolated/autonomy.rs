//! Edge autonomy, honestly: a node rebooted while the apiserver is
//! unreachable. Against a real kube-apiserver v1.36 and a hollow kubelet
//! (kubemark), through a node proxy on the shipped node configuration (the
//! node's client certificate, snapshots on the node's disk):
//!
//! 1. the kubelet runs its pods through the proxy;
//! 2. the apiserver goes down; the node reboots: kubelet killed, the proxy
//!    stopped as systemd stops it (SIGTERM: its last snapshots, marked
//!    clean);
//! 3. the proxy starts again with the apiserver still down: it serves from
//!    its snapshots what the apiserver's rules allow stale
//!    (`resourceVersion=0` lists, watches from them), and the restarted
//!    kubelet starts its pods again from them; nothing is fabricated:
//!    writes fail with `503` and the apiserver's Status;
//! 4. the apiserver returns: the proxy resumes (one list per resource,
//!    where the returning apiserver's watch cache cannot resume it), the
//!    kubelet's status reaches the apiserver, nothing else relists.
//!
//! Prints the time from the proxy's start to the pods running during the
//! outage, and to convergence after it.
//!
//! Skipped, with one line, where no control plane is available.

use crate::support;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use apimachinery::pki::Ca;
use kube_cache_proxy::component::config::Config;
use kube_testenv::{Morph, Options};
use serde_json::json;
use support::client::{Auth, Client};
use support::env::tempdir;
use support::real::{Isolated, eventually, metric_sum};

const BIN: &str = env!("CARGO_BIN_EXE_kube-cache-proxy");
const NODE: &str = "autonomy-node";
const NS: &str = "autonomy";
const PODS: usize = 5;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn start_proxy(dir: &Path, config: &Path) -> tokio::process::Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("proxy.log"))
        .unwrap();
    tokio::process::Command::new(BIN)
        .arg("--config")
        .arg(config)
        .arg(format!("--node-name={NODE}"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn sigterm(child: &tokio::process::Child) {
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

/// The pods whose containers the kubelet's log says it started (its fake
/// runtime's `AddContainer`) after `offset` bytes of it.
fn started_pods(log: &Path, offset: usize) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out: Vec<String> = text
        .get(offset..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"AddContainer\""))
        .filter_map(|l| {
            let p = l.split("pod=\"").nth(1)?;
            Some(p.split('"').next()?.to_string())
        })
        .filter(|p| p.starts_with(&format!("{NS}/")))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn running(pod: &serde_json::Value) -> bool {
    pod["status"]["phase"] == "Running"
}

/// Whether all the test's pods exist and are Running, read directly.
async fn pods_running(admin: &Client) -> Option<bool> {
    let l = admin
        .get(&format!("/api/v1/namespaces/{NS}/pods"))
        .await
        .json();
    let items = l["items"].as_array()?;
    Some(items.len() == PODS && items.iter().all(running))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_rebooted_during_an_outage_runs_its_pods_from_the_proxy() {
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let cp = plane.cp();
    if !cp.assets().has_kubemark() {
        kube_testenv::skip::skip(format!("no kubemark in {}", cp.assets().dir.display()));
        return;
    }
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    support::real::apply(&admin, include_str!("../../manifests/node/rbac.yaml")).await;
    for (path, body) in [
        (
            "/api/v1/namespaces".to_string(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
        ),
        (
            format!("/api/v1/namespaces/{NS}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        ),
    ] {
        let r = admin.post_json(&path, &body).await;
        assert!(r.status == 201 || r.status == 409, "{}", r.text());
    }

    // The node proxy, on the shipped node configuration.
    let dir = tempdir();
    let user = format!("system:node:{NODE}");
    let cert = cp.issue_client(&user, Some("system:nodes")).unwrap();
    let proxy_ca = Ca::new("autonomy-proxy-ca").unwrap();
    let serving = proxy_ca
        .issue_server(&["localhost"], &["127.0.0.1".parse().unwrap()])
        .unwrap();
    let mut c = Config::from_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/node/config.yaml"),
    )
    .unwrap();
    let port = kube_testenv::free_port().unwrap();
    let admin_port = kube_testenv::free_port().unwrap();
    c.listen = format!("127.0.0.1:{port}");
    c.admin_listen = format!("127.0.0.1:{admin_port}");
    c.metrics_listen = None;
    c.tls.cert_file = Some(write(&dir, "tls.crt", &serving.cert_pem));
    c.tls.private_key_file = Some(write(&dir, "tls.key", &serving.key_pem));
    c.tls.client_ca_file = Some(write(&dir, "client-ca.crt", &cp.ca_pem()));
    c.upstream.kubeconfig = Some(write(
        &dir,
        "upstream.kubeconfig",
        &apimachinery::kubeconfig::with_certificate(
            &cp.url(),
            &cp.ca_pem(),
            &user,
            &cert.cert_pem,
            &cert.key_pem,
        ),
    ));
    c.cache.persistence.directory = Some(dir.join("cache"));
    c.takeover.socket_path = Some(dir.join("takeover.sock"));
    c.shutdown_grace_period_seconds = 5;
    let config = write(&dir, "config.yaml", &serde_saphyr::to_string(&c).unwrap());
    let proxy_url = format!("https://127.0.0.1:{port}");
    let as_node = Client::new(
        &proxy_url,
        &proxy_ca.cert_pem(),
        Auth::Cert(cert.clone()),
        false,
    );
    let metrics = || async move {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", admin_port))
            .await
            .ok()?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };

    let mut proxy = start_proxy(&dir, &config);
    let kubeconfig = write(
        &dir,
        "kubelet.kubeconfig",
        &apimachinery::kubeconfig::with_certificate(
            &proxy_url,
            &proxy_ca.cert_pem(),
            &user,
            &cert.cert_pem,
            &cert.key_pem,
        ),
    );
    let kubelet = cp.hollow(Morph::Kubelet, NODE, &kubeconfig, &[]).unwrap();
    let kubelet_log = kubelet.log_path().to_path_buf();
    for i in 0..PODS {
        let r = admin
            .post_json(
                &format!("/api/v1/namespaces/{NS}/pods"),
                &json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": format!("p-{i}")},
                        "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    eventually(Duration::from_secs(120), "the pods Running", || {
        let admin = admin.clone();
        async move { pods_running(&admin).await?.then_some(()) }
    })
    .await;

    // The outage, then the reboot.
    cp.stop_apiserver();
    drop(kubelet);
    sigterm(&proxy);
    let status = tokio::time::timeout(Duration::from_secs(30), proxy.wait())
        .await
        .expect("the proxy did not stop")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        dir.join("cache").join("clean-shutdown").exists(),
        "a clean stop marks its snapshots"
    );

    // The node comes back; the apiserver does not.
    let offset = std::fs::metadata(&kubelet_log)
        .map(|m| m.len() as usize)
        .unwrap_or(0);
    let started = Instant::now();
    let mut proxy = start_proxy(&dir, &config);
    // What the apiserver's rules allow stale is served from the snapshots.
    let listed =
        eventually(
            Duration::from_secs(20),
            "the node's pods from the snapshot",
            || {
                let as_node = as_node.clone();
                async move {
                    let r = as_node
                .try_send(
                    http::Method::GET,
                    &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&resourceVersion=0"),
                    &[],
                    None,
                )
                .await
                .ok()?;
                    (r.status == 200).then(|| r.json())
                }
            },
        )
        .await;
    assert_eq!(listed["items"].as_array().unwrap().len(), PODS);
    assert!(listed["items"].as_array().unwrap().iter().all(running));
    let served_in = started.elapsed();
    let kubelet = cp.hollow(Morph::Kubelet, NODE, &kubeconfig, &[]).unwrap();
    let pods: Vec<String> = (0..PODS).map(|i| format!("{NS}/p-{i}")).collect();
    eventually(
        Duration::from_secs(120),
        "the kubelet restarts its pods during the outage",
        || {
            let want = pods.clone();
            let log = kubelet_log.clone();
            async move { (started_pods(&log, offset) == want).then_some(()) }
        },
    )
    .await;
    let running_in = started.elapsed();
    // Nothing is fabricated: a write (the kubelet's own kind) fails.
    let w = as_node
        .send(
            http::Method::PATCH,
            &format!("/api/v1/nodes/{NODE}/status"),
            &[("content-type", "application/merge-patch+json")],
            Some(br#"{"metadata":{"labels":{"autonomy":"x"}}}"#.to_vec()),
        )
        .await;
    assert_eq!(w.status, 503, "{}", w.text());
    assert_eq!(w.json()["kind"], "Status", "{}", w.text());
    let m = metrics().await.unwrap();
    let upstream_failures = metric_sum(&m, "kube_cache_proxy_requests_total", &[("code", "503")]);
    assert!(upstream_failures >= 1.0);

    // The kubelet's lists through the proxy so far (it is the proxy's only
    // client): any more after the apiserver's return would be a relist.
    let kubelet_lists =
        |m: &str| metric_sum(m, "kube_cache_proxy_requests_total", &[("verb", "LIST")]);
    let lists_before = kubelet_lists(&metrics().await.unwrap());

    // The apiserver returns: everything converges.
    let back = Instant::now();
    cp.start_apiserver().await.unwrap();
    let apiserver_ready = back.elapsed();
    eventually(
        Duration::from_secs(120),
        "the pods Running and the node Ready again",
        || {
            let admin = admin.clone();
            async move {
                let pods = pods_running(&admin).await?;
                let node = admin.get(&format!("/api/v1/nodes/{NODE}")).await.json();
                let ready = node["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                (pods && ready).then_some(())
            }
        },
    )
    .await;
    let converged_in = back.elapsed();
    // No relist storm: the proxy lists each cached resource at most once
    // (the returning apiserver's watch cache starts past the snapshots),
    // and the kubelet none (its watches never broke: the proxy's relists
    // reach them as events).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let apiserver = admin.get("/metrics").await.text();
    let lists = metric_sum(&apiserver, "apiserver_request_total", &[("verb", "LIST")]);
    let m = metrics().await.unwrap();
    let relists = metric_sum(&m, "kube_cache_proxy_upstream_relists_total", &[]);
    assert!(
        relists <= c.cache.resources.len() as f64,
        "the proxy listed {relists} times for {} resources",
        c.cache.resources.len()
    );
    let kubelet_relists = kubelet_lists(&m) - lists_before;
    assert_eq!(
        kubelet_relists, 0.0,
        "the kubelet listed again after the apiserver's return"
    );
    let _ = (kubelet, &mut proxy);
    println!(
        "autonomy: the proxy served the node's pods from its snapshots {served_in:?} after its \
         start, and the kubelet had restarted all {PODS} pods {running_in:?} after it, with the \
         apiserver down; after the apiserver's return (ready in {apiserver_ready:?}) the kubelet's \
         Lease was renewed through the proxy, the pods Running and the node Ready in the \
         apiserver {converged_in:?} later; the proxy relisted \
         {relists} times (for {} cached resources), and the returned apiserver served {lists} LISTs \
         in all",
        c.cache.resources.len()
    );
}
