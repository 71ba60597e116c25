//! The sidecar example (`manifests/sidecar/`) on a real kube-apiserver
//! v1.36, as a pod would run it:
//!
//! - the proxy, the release-shaped binary with the shipped
//!   `manifests/sidecar/config.yaml`, reaches the apiserver with the
//!   in-cluster configuration of the pod's ServiceAccount
//!   (`KUBERNETES_SERVICE_HOST`/`PORT` and a token and `ca.crt` at
//!   `/var/run/secrets/kubernetes.io/serviceaccount/`), holding only what
//!   `manifests/sidecar/rbac.yaml` grants;
//! - the workload is an unmodified client: the Python `kubernetes`
//!   client's own `config.load_incluster_config()` (what client-go's
//!   `rest.InClusterConfig` does: the same variables and files), with
//!   `KUBERNETES_SERVICE_HOST=127.0.0.1`, the proxy's port, and the
//!   projected volume of `deployment.yaml`: its own token, the proxy's CA
//!   as `ca.crt`.
//!
//! Each process gets its own `/var/run/secrets` as a pod's containers do,
//! in a private mount namespace (`unshare -m`, a tmpfs over `/run`): the
//! test needs root and util-linux's `unshare`, and skips with one line
//! without them, without Python and PyPI, or without a control plane.
//!
//! The workload lists and watches pods through the sidecar while pods are
//! created, changed and deleted; it must see the same events and end with
//! the same state as the same client directly on the apiserver, its list
//! and watch answered from the sidecar's cache, its token reviewed and its
//! reads authorized as the apiserver would.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use apimachinery::pki::Ca;
use kube_testenv::Options;
use serde_json::{Value, json};
use support::env::admin_get;
use support::python::{PythonRun, list_watch_script, python, python_run};
use support::real::{
    Isolated, apply_in, eventually, metric_sum, namespace, service_account_token, shipped, write,
};
use support::{Auth, Client};

const NS: &str = "monitoring";
const SA: &str = "prometheus";
const BIN: &str = env!("CARGO_BIN_EXE_kube-cache-proxy");

/// Whether this process may give a child its own mount namespace.
fn mount_namespaces() -> bool {
    std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs tmpfs /run"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `program args…` in a private mount namespace whose
/// `/var/run/secrets/kubernetes.io/serviceaccount/` holds the files of
/// `secrets` (as a pod's service-account volume), with
/// `KUBERNETES_SERVICE_HOST`/`PORT` naming `port` on the loopback.
fn in_pod(secrets: &Path, port: u16, program: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args(["-m", "sh", "-c"])
        .arg(
            "set -e; mount -t tmpfs tmpfs /run; \
             mkdir -p /run/secrets/kubernetes.io/serviceaccount; \
             cp \"$1\"/* /run/secrets/kubernetes.io/serviceaccount/; \
             shift; exec \"$@\"",
        )
        .arg("sh")
        .arg(secrets)
        .arg(program)
        .args(args)
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", port.to_string())
        .kill_on_drop(true);
    cmd
}

/// A service-account volume: `token`, `ca.crt`, `namespace`.
fn service_account_volume(dir: &Path, name: &str, token: &str, ca_pem: &str) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    write(&d, "token", token);
    write(&d, "ca.crt", ca_pem);
    write(&d, "namespace", NS);
    d
}

/// Creates the sidecar's ServiceAccount and RBAC as `kubectl apply -k`
/// would in namespace `monitoring`.
async fn apply_sidecar_rbac(admin: &Client) {
    namespace(admin, NS).await;
    apply_in(
        admin,
        NS,
        include_str!("../../manifests/sidecar/serviceaccount.yaml"),
    )
    .await;
    apply_in(admin, NS, include_str!("../../manifests/sidecar/rbac.yaml")).await;
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmodified_in_cluster_client_is_served_by_the_sidecar_from_its_cache() {
    if !mount_namespaces() {
        kube_testenv::skip::skip(
            "the sidecar test gives each process its own /var/run/secrets in a \
             mount namespace (unshare -m), which needs root and util-linux",
        );
        return;
    }
    let Some(python) = python() else {
        return;
    };
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
    apply_sidecar_rbac(&admin).await;
    let apiserver_port: u16 = cp.url().rsplit(':').next().unwrap().parse().unwrap();

    // The sidecar: the shipped configuration, a serving certificate for
    // 127.0.0.1 from its own CA, the pod's ServiceAccount upstream.
    let dir = support::env::tempdir();
    let proxy_ca = Ca::new("sidecar-test").unwrap();
    let mut config = shipped("manifests/sidecar/config.yaml", &dir, &proxy_ca, "");
    config.tls.client_ca_file = None;
    let (port, admin_port) = (support::env::free_port(), support::env::free_port());
    let admin_addr = ([127, 0, 0, 1], admin_port).into();
    config.listen = format!("127.0.0.1:{port}");
    config.admin_listen = format!("127.0.0.1:{admin_port}");
    let config_file = write(
        &dir,
        "config.yaml",
        &serde_saphyr::to_string(&config).unwrap(),
    );
    let sidecar_token = service_account_token(&admin, NS, SA).await;
    let sidecar_volume = service_account_volume(&dir, "sidecar-sa", &sidecar_token, &cp.ca_pem());
    let log = std::fs::File::create(dir.join("proxy.log")).unwrap();
    let _proxy = in_pod(
        &sidecar_volume,
        apiserver_port,
        Path::new(BIN),
        &["--config", config_file.to_str().unwrap()],
    )
    .stdout(log.try_clone().unwrap())
    .stderr(log)
    .spawn()
    .unwrap();
    eventually(
        Duration::from_secs(60),
        "the sidecar ready",
        || async move {
            admin_get(admin_addr, "/readyz")
                .await
                .ok()
                .and_then(|(s, _)| (s == 200).then_some(()))
        },
    )
    .await;

    // The workload's pods namespace, with one pod before it starts.
    let apps = format!("sidecar-apps-{}", fastrand::u32(..));
    namespace(&admin, &apps).await;
    let pods = format!("/api/v1/namespaces/{apps}/pods");
    let r = admin.post_json(&pods, &pod("a")).await;
    assert_eq!(r.status, 201, "{}", r.text());

    // The workload in its pod: its own token, the sidecar's CA as ca.crt.
    let workload_token = service_account_token(&admin, NS, SA).await;
    let workload_volume =
        service_account_volume(&dir, "workload-sa", &workload_token, &proxy_ca.cert_pem());
    let script = list_watch_script();
    let through = python_run(in_pod(
        &workload_volume,
        port,
        &python,
        &[script.to_str().unwrap(), "in-cluster", &apps, "6", "pods"],
    ))
    .await;
    // The same client directly on the apiserver, for comparison.
    let direct_kubeconfig = write(
        &dir,
        "direct.kubeconfig",
        &cp.kubeconfig_text(&cp.url(), "admin", cp.admin()),
    );
    let direct = {
        let mut cmd = tokio::process::Command::new(&python);
        cmd.arg(&script)
            .arg(&direct_kubeconfig)
            .arg(&apps)
            .arg("6")
            .arg("pods")
            .kill_on_drop(true);
        python_run(cmd).await
    };

    // Creates, updates, a delete.
    let label = |name: &str, v: &str| {
        let (admin, pods) = (admin.clone(), pods.clone());
        let (name, v) = (name.to_string(), v.to_string());
        async move {
            let r = admin
                .send(
                    http::Method::PATCH,
                    &format!("{pods}/{name}"),
                    &[("content-type", "application/merge-patch+json")],
                    Some(serde_json::to_vec(&json!({"metadata": {"labels": {"v": v}}})).unwrap()),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
    };
    assert_eq!(admin.post_json(&pods, &pod("b")).await.status, 201);
    label("a", "2").await;
    assert_eq!(admin.post_json(&pods, &pod("c")).await.status, 201);
    let r = admin
        .delete(&format!("{pods}/b?gracePeriodSeconds=0"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    label("c", "2").await;

    let through: PythonRun = tokio::time::timeout(Duration::from_secs(60), through)
        .await
        .expect("the workload's six events through the sidecar")
        .unwrap();
    let direct: PythonRun = tokio::time::timeout(Duration::from_secs(60), direct)
        .await
        .expect("the six events directly")
        .unwrap();
    println!("workload through the sidecar: {:?}", through.events);
    println!("directly: {:?}", direct.events);
    assert_eq!(
        direct
            .events
            .iter()
            .map(|(t, n, _)| (t.as_str(), n.as_str()))
            .collect::<Vec<_>>(),
        [
            ("ADDED", "b"),
            ("MODIFIED", "a"),
            ("ADDED", "c"),
            // A pod's deletion is two writes: its deletionTimestamp, then
            // its removal.
            ("MODIFIED", "b"),
            ("DELETED", "b"),
            ("MODIFIED", "c")
        ]
    );
    assert_eq!(
        through.events, direct.events,
        "through the sidecar vs directly"
    );
    assert_eq!(through.last, direct.last);
    assert_eq!(through.last.keys().collect::<Vec<_>>(), ["a", "c"]);

    // Answered from the sidecar's cache, as the workload's own identity.
    let (_, metrics) = admin_get(admin_addr, "/metrics").await.unwrap();
    let from_cache = |verb| {
        metric_sum(
            &metrics,
            "kube_cache_proxy_cache_reads_total",
            &[("resource", "pods"), ("verb", verb), ("source", "cache")],
        )
    };
    assert!(
        from_cache("LIST") >= 1.0,
        "the workload's list from the cache"
    );
    assert!(
        from_cache("WATCH") >= 1.0,
        "the workload's watch from the cache"
    );
    // The workload's token, reviewed by TokenReview: it is neither the
    // sidecar's identity nor anonymous.
    let tokens = metric_sum(
        &metrics,
        "kube_cache_proxy_authentication_total",
        &[("result", "authenticated")],
    );
    assert!(
        tokens >= 2.0,
        "{tokens}: the workload's token authenticated"
    );
    println!(
        "sidecar: LIST {} and WATCH {} of pods from its cache; {tokens} token authentications",
        from_cache("LIST"),
        from_cache("WATCH")
    );
}
