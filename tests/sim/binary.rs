#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The `kube-cache-proxy` binary: its flags, its exit status on a bad
//! configuration, and a real run with exactly the shipped configuration
//! files (`config/` and `manifests/`), ending on SIGTERM.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use apimachinery::pki::Ca;
use kube_apiserver_sim::{Sim, SimConfig};
use support::{Client, Identity};

const BIN: &str = env!("CARGO_BIN_EXE_kube-cache-proxy");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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
        "--cache-persistence-directory",
        "--takeover-socket-path",
        "--logging-format",
        "-v, --v <LEVEL>",
        "--print-default-config",
        "--validate-config",
        // Accepted values, and what is not a flag.
        "VersionTLS12, VersionTLS13",
        "Auto, Node, AsGiven, Tier",
        "RUST_LOG",
        "Exit status:",
        "  64  ",
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
            Some(64),
        ),
        (
            &["--upstream-kubeconfig".as_ref(), bad_kubeconfig.as_os_str()],
            "line 7",
            Some(64),
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

/// The status of a run that should end by itself, and what it printed on
/// stderr; a run still going after 20 s is killed and fails the test.
fn run_status(args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    use std::io::Read;
    let mut child = std::process::Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still running after 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status.code(), stderr)
}

/// Every exit status `--help` documents, through the real binary: 64 for
/// what the operator must fix (including TLS material and kubeconfigs the
/// configuration names), 1 for a runtime failure.
#[tokio::test]
async fn exit_statuses_are_what_help_says() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = support::env::tempdir();
    let ca = Ca::new("exit-test").unwrap();
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
    let other = ca.issue_server(&["other"], &[]).unwrap();
    let other_key = write("other.key", &other.key_pem);
    let kubeconfig = write(
        "upstream.kubeconfig",
        &sim.kubeconfig(&SimConfig::default().proxy_user, None),
    );
    let garbage = write(
        "garbage.kubeconfig",
        "clusters: [this is not: a kubeconfig\n",
    );
    let bad_ca = write(
        "bad-ca.kubeconfig",
        &apimachinery::kubeconfig::with_token(&sim.url(), "not a certificate", "t"),
    );
    let config = write("config.yaml", "");
    let os = |s: &std::path::Path| s.as_os_str().to_owned();
    let base = |cert: &Path, key: &Path, kubeconfig: &Path| -> Vec<std::ffi::OsString> {
        vec![
            "--config".into(),
            os(&config),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
            "--tls-cert-file".into(),
            os(cert),
            "--tls-private-key-file".into(),
            os(key),
            "--upstream-kubeconfig".into(),
            os(kubeconfig),
        ]
    };
    let refs = |v: &[std::ffi::OsString]| -> Vec<std::ffi::OsString> { v.to_vec() };
    let cases: Vec<(&str, Vec<std::ffi::OsString>, &str)> = vec![
        (
            "swapped certificate and key",
            base(&key, &cert, &kubeconfig),
            "tls.key: no PEM certificate",
        ),
        (
            "a key of another certificate",
            base(&cert, &other_key, &kubeconfig),
            "other.key",
        ),
        (
            "a kubeconfig that is not one",
            base(&cert, &key, &garbage),
            "garbage.kubeconfig",
        ),
        (
            "a kubeconfig with a bad CA",
            base(&cert, &key, &bad_ca),
            "upstream",
        ),
        (
            "identity Node with a credential that is no node's",
            [
                refs(&base(&cert, &key, &kubeconfig)),
                vec!["--upstream-identity".into(), "Node".into()],
            ]
            .concat(),
            "node",
        ),
        (
            "an unknown value",
            vec!["--tls-min-version".into(), "VersionTLS11".into()],
            "VersionTLS12",
        ),
    ];
    for (what, args, names) in &cases {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let (code, stderr) = run_status(&args);
        assert_eq!(code, Some(64), "{what}: {stderr}");
        assert!(stderr.contains(names), "{what}: {stderr}");
        // --validate-config says the same, without starting.
        if args.first().is_some_and(|a| *a == "--config") {
            let mut v: Vec<&std::ffi::OsStr> = args.clone();
            v[0] = std::ffi::OsStr::new("--validate-config");
            let (code, _) = run_status(&v);
            assert_eq!(code, Some(64), "--validate-config: {what}");
        }
    }
    // The same files, right: valid.
    let good = base(&cert, &key, &kubeconfig);
    let mut v: Vec<&std::ffi::OsStr> = good.iter().map(|a| a.as_os_str()).collect();
    v[0] = std::ffi::OsStr::new("--validate-config");
    let (code, stderr) = run_status(&v);
    assert_eq!(code, Some(0), "{stderr}");
    // A listener that cannot be bound is a runtime failure: 1.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = format!("127.0.0.1:{}", taken.local_addr().unwrap().port());
    let mut args = good.clone();
    args[3] = port.into();
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (code, stderr) = run_status(&args);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("binding"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--print-default-config` prints what `Config::default()` holds; with
/// the files filled in, `--validate-config` accepts it. Every shipped
/// configuration file validates with the files a node would have.
#[tokio::test]
async fn default_and_shipped_configurations_validate() {
    let out = std::process::Command::new(BIN)
        .arg("--print-default-config")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let mut parsed = kube_cache_proxy::component::config::Config::from_yaml(&printed).unwrap();
    parsed.api_version = None;
    parsed.kind = None;
    assert_eq!(
        parsed,
        kube_cache_proxy::component::config::Config::default()
    );

    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = support::env::tempdir();
    let ca = Ca::new("validate-test").unwrap();
    let serving = ca
        .issue_server(&["localhost"], &["127.0.0.1".parse().unwrap()])
        .unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let default_file = write("default.yaml", &printed);
    let cert = write("tls.crt", &serving.cert_pem);
    let key = write("tls.key", &serving.key_pem);
    let client_ca = write("client-ca.crt", &sim.ca_pem());
    // A node's credential, for the configurations that act as the node.
    let kubeconfig = write(
        "upstream.kubeconfig",
        &sim.kubeconfig("system:node:node-1", Some("system:nodes")),
    );
    let mut files = vec![default_file];
    for dir in ["config", "manifests"] {
        for entry in walk(&root().join(dir)) {
            let is_config = entry.extension().is_some_and(|e| e == "yaml")
                && std::fs::read_to_string(&entry)
                    .unwrap()
                    .lines()
                    .any(|l| l == "kind: KubeCacheProxyConfiguration");
            if is_config {
                files.push(entry);
            }
        }
    }
    assert!(files.len() >= 5, "{files:?}");
    for file in files {
        let out = std::process::Command::new(BIN)
            .arg("--validate-config")
            .arg(&file)
            .args(["--node-name", "node-1", "--client-ca-file"])
            .arg(&client_ca)
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-private-key-file")
            .arg(&key)
            .arg("--upstream-kubeconfig")
            .arg(&kubeconfig)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
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
    let (port, admin_port) = (support::env::free_port(), support::env::free_port());
    let mut child = tokio::process::Command::new(BIN)
        .arg("--config")
        .arg(config)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
        .args(["--metrics-listen", "127.0.0.1:0"])
        // The node's state directory, here the test's own.
        .arg("--cache-persistence-directory")
        .arg(dir.join("state/cache"))
        .arg("--takeover-socket-path")
        .arg(dir.join("state/takeover.sock"))
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
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Ready once every cache listed (the verbose body names the caches'
    // checks: a /readyz answered before they are registered says nothing).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let readyz = admin_get(admin_port, "/readyz?verbose").await;
        if readyz.starts_with("HTTP/1.1 200") && readyz.contains("[+]cache:pods ok") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} never became ready",
            config.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every series docs/metrics.md says is present from start is, before
    // any request (within seconds: `upstream_info` is set once the
    // upstream's version is learnt, beside the caches' first lists).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = admin_get(admin_port, "/metrics").await;
        let missing: Vec<String> = documented_from_start()
            .into_iter()
            .filter(|family| {
                !(scrape.contains(&format!("\n{family}{{"))
                    || scrape.contains(&format!("\n{family} "))
                    || scrape.contains(&format!("\n{family}_bucket{{")))
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing:?} documented but not exported at start:\n{scrape}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
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
    // The operator's view, from the admin port: every cache, synced, the
    // namespaces cache with its one watcher; as a table and as JSON.
    let status = |output: &str| {
        let out = std::process::Command::new(BIN)
            .args([
                "status",
                "--admin-address",
                &format!("127.0.0.1:{admin_port}"),
            ])
            .args(["-o", output])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let output = status("table");
    let sections: Vec<&str> = output.split("\n\n").collect();
    let section = |header: &str| {
        sections
            .iter()
            .find(|s| s.starts_with(header))
            .unwrap_or_else(|| panic!("no {header} in:\n{output}"))
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    // The one watch, by its user (the sim's admin).
    assert_eq!(section("USER ")[0][1..], ["namespaces", "1"], "{output}");
    // The one upstream server, active.
    assert_eq!(
        section("UPSTREAM ")[0][1..],
        ["primary", "true"],
        "{output}"
    );
    let table = sections[0];
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("RESOURCE "), "{table}");
    let namespaces = lines
        .iter()
        .find(|l| l.starts_with("namespaces "))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = namespaces.split_whitespace().collect();
    // RESOURCE SCOPE SYNCED OBJECTS RV BYTES HISTORY(n from rv) WATCHERS
    assert_eq!(
        (cells[1], cells[2], cells[9]),
        ("-", "true", "1"),
        "{table}"
    );
    let json: serde_json::Value = serde_json::from_str(&status("json")).unwrap();
    let caches = json["caches"].as_array().unwrap();
    assert_eq!(caches.len(), lines.len() - 1, "{json}");
    assert!(caches.iter().all(|c| c["synced"] == true), "{json}");
    let nodes = caches.iter().find(|c| c["resource"] == "nodes").unwrap();
    assert!(nodes["listedSecondsAgo"].as_f64().unwrap() < 60.0, "{json}");
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
    // The logs, on a pipe: no colour codes; with --logging-format=json one
    // flat JSON object per line, Kubernetes' keys.
    let mut logs = String::new();
    {
        use tokio::io::AsyncReadExt;
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut logs)
            .await
            .unwrap();
    }
    assert!(logs.contains("serving"), "{logs}");
    assert!(!logs.contains('\x1b'), "colour codes on a pipe:\n{logs}");
    if extra.contains(&"--logging-format=json") {
        for line in logs.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(v["msg"].is_string() && v["ts"].is_f64(), "{line}");
            assert!(
                v.get("fields").is_none() && v.get("message").is_none(),
                "{line}"
            );
        }
    }
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
/// `KUBE_CACHE_PROXY_REQUIRE_ALL` is set (`kube_testenv::skip`).
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
            kube_testenv::skip::skip(format!("promtool (Debian's prometheus package): {e}"));
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
    // The simulated apiserver's credential is no node's, so this run
    // overrides the shipped upstream.identity (Node). The shipped mode
    // itself, the same file with a node-bound token, runs against a real
    // kube-apiserver in tests/real_isolated/least_privilege.rs
    // (the_binary_runs_with_the_daemonset_configuration_as_its_node).
    run_with_shipped_config(
        &root().join("manifests/kube-cache-proxy.yaml"),
        &[
            "--node-name",
            "node-1",
            "--upstream-identity",
            "AsGiven",
            "--logging-format=json",
        ],
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

/// `prepare-state-dir` (the DaemonSet's init container) makes the node's
/// state directory the proxy user's, mode 0700.
#[test]
fn prepare_state_dir_makes_the_directory_the_proxys() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = support::env::tempdir().join("state");
    let me = std::fs::metadata(support::env::tempdir()).unwrap();
    let out = std::process::Command::new(BIN)
        .arg("prepare-state-dir")
        .arg(&dir)
        .args([
            "--uid",
            &me.uid().to_string(),
            "--gid",
            &me.gid().to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = std::fs::metadata(&dir).unwrap();
    assert!(m.is_dir());
    assert_eq!(m.permissions().mode() & 0o777, 0o700);
    assert_eq!((m.uid(), m.gid()), (me.uid(), me.gid()));
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}
