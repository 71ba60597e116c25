#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The `kube-cache-proxy` binary: its flags, its exit status on a bad
//! configuration, and a real run with exactly the shipped configuration
//! files (`config/` and `manifests/`), ending on SIGTERM.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kube_apiserver_sim::{Sim, SimConfig};
use kube_cache_proxy::pki::Ca;
use support::{Client, Identity};

const BIN: &str = env!("CARGO_BIN_EXE_kube-cache-proxy");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn help_documents_every_flag() {
    let out = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--config",
        "--listen",
        "--admin-listen",
        "--upstream-kubeconfig",
        "--upstream-context",
        "--tls-cert-file",
        "--tls-private-key-file",
        "--client-ca-file",
        "--tls-min-version",
        "--shutdown-grace-period-seconds",
        "--node-name",
        "--log-format",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
    // The demo subcommand exists exactly when the binary has the simulator.
    assert_eq!(
        help.contains("\n  demo "),
        cfg!(feature = "demo"),
        "demo subcommand vs feature:\n{help}"
    );
}

#[test]
fn a_bad_configuration_exits_64_naming_the_field() {
    let dir = support::env::tempdir();
    let bad = dir.join("bad.yaml");
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "listen: 127.0.0.1:1\ncache:\n  historyCapacty: 5\n",
            &[],
            "historyCapacty",
        ),
        ("listen: nowhere\n", &[], "listen"),
        ("", &[], "tls.certFile"),
        (
            "cache:\n  resources:\n  - {version: v1, resource: widgets, group: example.com}\n",
            &[
                "--tls-cert-file",
                "/dev/null",
                "--tls-private-key-file",
                "/dev/null",
            ],
            "cache.resources[0].kind",
        ),
    ];
    for (yaml, extra, field) in cases {
        std::fs::write(&bad, yaml).unwrap();
        let out = std::process::Command::new(BIN)
            .arg("--config")
            .arg(&bad)
            .args(*extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{yaml}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(field), "{yaml}: {stderr}");
    }
    let out = std::process::Command::new(BIN)
        .arg("--no-such-flag")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs the binary with `config` and overrides for what only exists on a
/// node (addresses, files), reaches it, then stops it with SIGTERM.
async fn run_with_shipped_config(config: &Path, extra: &[&str]) {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = support::env::tempdir();
    let ca = Ca::new("binary-test").unwrap();
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
    let mut child = tokio::process::Command::new(BIN)
        .arg("--config")
        .arg(config)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-private-key-file")
        .arg(&key)
        .arg("--client-ca-file")
        .arg(&client_ca)
        .arg("--upstream-kubeconfig")
        .arg(&upstream)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Ready once every cache listed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !admin_get(admin_port, "/readyz")
        .await
        .starts_with("HTTP/1.1 200")
    {
        assert!(
            Instant::now() < deadline,
            "{} never became ready",
            config.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every series docs/metrics.md says is present from start is, before
    // any request.
    let scrape = admin_get(admin_port, "/metrics").await;
    for family in documented_from_start() {
        assert!(
            scrape.contains(&format!("\n{family}{{"))
                || scrape.contains(&format!("\n{family} "))
                || scrape.contains(&format!("\n{family}_bucket{{")),
            "{family} is documented but not exported at start:\n{scrape}"
        );
    }
    let client = Client::new(
        &format!("https://127.0.0.1:{port}"),
        &ca.cert_pem(),
        Identity::admin().auth(&sim),
        true,
    );
    let r = client.get("/api/v1/nodes?resourceVersion=0").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["kind"], "NodeList");
    let mut w = client
        .watch("/api/v1/namespaces?watch=1&resourceVersion=0", &[])
        .await;
    assert_eq!(w.status, 200);
    let r = client.get("/version").await;
    assert_eq!(r.status, 200);
    // The scrape, with requests counted, is what promtool accepts.
    let scrape = admin_get(admin_port, "/metrics").await;
    let body = scrape
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert!(
        body.contains("kube_cache_proxy_requests_total{code=\"200\",group=\"\",resource=\"namespaces\",scope=\"cluster\",source=\"cache\",subresource=\"\",verb=\"WATCH\"}"),
        "{body}"
    );
    promtool_check_metrics(body);
    // SIGTERM: watches end cleanly, the process exits 0.
    let stopped = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    loop {
        match w.next(Duration::from_secs(5)).await {
            support::Next::Event(_) => continue,
            support::Next::End => break,
            other => panic!("{other:?}"),
        }
    }
    let exit = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    assert!(stopped.elapsed() < Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(dir);
}

/// A plain HTTP/1.1 GET on the admin port: the whole response, or "" when
/// the port does not answer yet.
async fn admin_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return String::new();
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out
}

/// The metric families docs/metrics.md lists, less those it says appear
/// with traffic only.
fn documented_from_start() -> Vec<String> {
    let doc = std::fs::read_to_string(root().join("docs/metrics.md")).unwrap();
    let mut names: Vec<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_string()))
        .filter(|n| n.starts_with("kube_cache_proxy_") || n.starts_with("process_"))
        .filter(|n| {
            n != "kube_cache_proxy_requests_total"
                && n != "kube_cache_proxy_request_duration_seconds"
        })
        .collect();
    names.dedup();
    assert!(names.len() > 30, "{names:?}");
    names
}

/// `promtool check metrics` on a scrape: its lint of names, types, help
/// and units. Without promtool the check is skipped, unless
/// `KUBE_CACHE_PROXY_REQUIRE_PROMTOOL` is set (CI sets it after
/// installing promtool).
fn promtool_check_metrics(scrape: &str) {
    use std::io::Write;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var_os("KUBE_CACHE_PROXY_REQUIRE_PROMTOOL").is_none(),
                "promtool: {e}"
            );
            eprintln!("skipping promtool check metrics: promtool: {e}");
            return;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{scrape}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn runs_with_the_shipped_example_configuration() {
    run_with_shipped_config(&root().join("config/kube-cache-proxy.yaml"), &[]).await;
}

#[tokio::test]
async fn runs_with_the_daemonset_configuration() {
    // The simulated apiserver's credential is no node's; acting as a node
    // (upstream.identity Node) is proven against the real apiserver by
    // tests/real_least_privilege.rs.
    run_with_shipped_config(
        &root().join("manifests/kube-cache-proxy.yaml"),
        &["--node-name", "node-1", "--upstream-identity", "AsGiven"],
    )
    .await;
}

/// The `csr-serving-cert` component replaces the DaemonSet's configuration
/// with its own copy; apart from the serving certificate's source the two
/// must say the same, or enabling the component would silently change
/// other settings.
#[test]
fn csr_component_configuration_matches_the_daemonset_one() {
    let read = |path: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(root().join(path)).unwrap();
        serde_saphyr::from_str(&text).unwrap()
    };
    let mut base = read("manifests/kube-cache-proxy.yaml");
    let mut component = read("manifests/components/csr-serving-cert/kube-cache-proxy.yaml");
    assert_eq!(component["tls"]["csr"]["enabled"], true);
    for key in ["certFile", "privateKeyFile", "csr"] {
        base["tls"].as_object_mut().unwrap().remove(key);
        component["tls"].as_object_mut().unwrap().remove(key);
    }
    assert_eq!(base, component);
}
