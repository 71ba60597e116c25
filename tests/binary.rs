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
        "--metrics-listen",
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
        ("adminListen: 0.0.0.0:9444\n", &[], "not a loopback address"),
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

/// A private key, or a kubeconfig holding a token, given where a YAML
/// configuration is expected: the error names the file and the position,
/// and shows none of its lines.
#[test]
fn configuration_errors_never_print_the_file() {
    let dir = support::env::tempdir();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let key_pem = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let key = write("client.key", &key_pem);
    let serving = Ca::new("binary-test")
        .unwrap()
        .issue_server(&["localhost"], &["127.0.0.1".parse().unwrap()])
        .unwrap();
    let (cert, tls_key) = (
        write("tls.crt", &serving.cert_pem),
        write("tls.key", &serving.key_pem),
    );
    let token = "kcp-secret-token-0123456789abcdef";
    let bad_kubeconfig = write(
        "bad.kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: {token}\n    \
             client-key-data: [{token}]\n"
        ),
    );
    let run = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new(BIN)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-private-key-file")
            .arg(&tls_key)
            .args(args)
            .output()
            .unwrap()
    };
    let cases: [(&[&std::ffi::OsStr], &str, Option<i32>); 3] = [
        (
            &["--config".as_ref(), key.as_os_str()],
            "line 1, column 1",
            Some(64),
        ),
        (
            &["--upstream-kubeconfig".as_ref(), key.as_os_str()],
            "line 1, column 1",
            Some(1),
        ),
        (
            &["--upstream-kubeconfig".as_ref(), bad_kubeconfig.as_os_str()],
            "line 7",
            Some(1),
        ),
    ];
    for (args, position, code) in cases {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), code, "{args:?}: {stderr}");
        assert!(stderr.contains(position), "{args:?}: {stderr}");
        let file = args[1].to_string_lossy();
        assert!(stderr.contains(file.as_ref()), "{args:?}: {stderr}");
        for line in key_pem.lines().chain([token]) {
            assert!(
                !stderr.contains(line),
                "{args:?} printed {line:?}: {stderr}"
            );
        }
    }
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
        .args(["--metrics-listen", "127.0.0.1:0"])
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
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", admin_port)).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out).await;
            if out.starts_with("HTTP/1.1 200") {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never became ready",
            config.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
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

#[tokio::test]
async fn runs_with_the_shipped_example_configuration() {
    run_with_shipped_config(&root().join("config/kube-cache-proxy.yaml"), &[]).await;
}

#[tokio::test]
async fn runs_with_the_daemonset_configuration() {
    // The simulated apiserver's credential is no node's, so this run
    // overrides the shipped upstream.identity (Node). The shipped mode
    // itself, the same file with a node-bound token, runs against a real
    // kube-apiserver in tests/real_least_privilege.rs
    // (the_binary_runs_with_the_daemonset_configuration_as_its_node).
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
