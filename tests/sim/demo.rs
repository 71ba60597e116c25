//! `kube-cache-proxy demo`, the real binary, as a newcomer uses it:
//! - `kubectl get pods`/`get nodes` Tables have kube-apiserver's columns
//!   and show the demo pods `1/1 Running`;
//! - `kubectl exec`/`attach` work through the proxy (WebSocket, the
//!   remotecommand v5 and v4 channel protocols);
//! - `kubectl describe node`'s figures are sane (capacity, allocatable,
//!   node info, pod requests);
//! - pods change, so a watch sees them created, modified and deleted;
//! - a second demo never touches the files of one that is running;
//! - keys and kubeconfigs are readable by their owner only.
//!
//! Each test drives the binary over real sockets and TLS with this
//! crate's clients; where `kubectl` is installed it is run too.
#![cfg(feature = "demo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apimachinery::pki::Issued;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::kubectl::{Kubectl, kubectl_available};
use support::{Auth, Client, Next};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::Message;

const BIN: &str = env!("CARGO_BIN_EXE_kube-cache-proxy");
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// A running demo: the child process and what its banner says.
struct Demo {
    _child: Child,
    proxy_url: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

/// What a demo run printed, when it did not start.
struct Failed {
    code: Option<i32>,
    stderr: String,
}

/// Starts `demo args...` with `TMPDIR=tmp`; `Err` when it exits first.
async fn start(tmp: &Path, args: &[&str]) -> Result<Demo, Failed> {
    let mut child = Command::new(BIN)
        .arg("demo")
        .args(args)
        .env("TMPDIR", tmp)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut proxy_url, mut dir, mut kubeconfig) = (None, None, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = tokio::time::timeout_at(deadline.into(), lines.next_line())
            .await
            .expect("the demo printed no banner in 30 s")
            .unwrap();
        let Some(line) = line else {
            let out = child.wait_with_output().await.unwrap();
            return Err(Failed {
                code: out.status.code(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["kube-cache-proxy", url] => proxy_url = Some(url.to_string()),
            ["files", d] => dir = Some(PathBuf::from(d)),
            ["export", kc] => kubeconfig = kc.strip_prefix("KUBECONFIG=").map(PathBuf::from),
            _ => {}
        }
        if line.contains("Ctrl-C stops the demo") {
            break;
        }
    }
    // Keep draining stdout so that the demo never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Demo {
        _child: child,
        proxy_url: proxy_url.unwrap(),
        dir: dir.unwrap(),
        kubeconfig: kubeconfig.unwrap(),
    })
}

async fn start_ok(tmp: &Path, args: &[&str]) -> Demo {
    match start(tmp, args).await {
        Ok(demo) => demo,
        Err(f) => panic!("demo exited ({:?}): {}", f.code, f.stderr),
    }
}

async fn demo() -> Demo {
    let tmp = support::env::tempdir();
    start_ok(
        &tmp,
        &["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
    )
    .await
}

// === impl Demo ===

impl Demo {
    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap()
    }

    fn admin(&self) -> Issued {
        Issued {
            cert_pem: self.read("admin.crt"),
            key_pem: self.read("admin.key"),
        }
    }

    fn client(&self) -> Client {
        Client::new(
            &self.proxy_url,
            &self.read("ca.crt"),
            Auth::Cert(self.admin()),
            false,
        )
    }

    fn kubectl(&self) -> Option<Kubectl> {
        kubectl_available()
            .then(|| Kubectl::new(&std::fs::read_to_string(&self.kubeconfig).unwrap()))
    }

    async fn table(&self, path: &str) -> Value {
        let r = self
            .client()
            .send(http::Method::GET, path, &[("accept", TABLE)], None)
            .await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        r.json()
    }

    /// Opens a remotecommand WebSocket on `path` offering `protocol`.
    async fn websocket(
        &self,
        path: &str,
        protocol: &str,
    ) -> (
        tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
        String,
    ) {
        let cfg = support::client::tls_config(&self.read("ca.crt"), &Auth::Cert(self.admin()));
        let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
        let addr = self.proxy_url.trim_start_matches("https://").to_string();
        let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let tls = connector
            .connect("127.0.0.1".try_into().unwrap(), tcp)
            .await
            .unwrap();
        let mut request = format!("wss://{addr}{path}").into_client_request().unwrap();
        request
            .headers_mut()
            .insert("sec-websocket-protocol", protocol.parse().unwrap());
        let (ws, response) = tokio_tungstenite::client_async(request, tls).await.unwrap();
        let chosen = response
            .headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (ws, chosen)
    }

    /// Runs a remotecommand session: sends `stdin` (then, with v5, the
    /// close signal for stdin), reads until the server closes. Returns
    /// stdout, stderr and the error channel's Status.
    async fn session(&self, path: &str, protocol: &str, stdin: &[&str]) -> (String, String, Value) {
        let (mut ws, chosen) = self.websocket(path, protocol).await;
        assert_eq!(chosen, protocol);
        for chunk in stdin {
            let mut frame = vec![0u8];
            frame.extend_from_slice(chunk.as_bytes());
            ws.send(Message::Binary(frame.into())).await.unwrap();
        }
        if protocol == "v5.channel.k8s.io" && !stdin.is_empty() {
            ws.send(Message::Binary(vec![255u8, 0].into()))
                .await
                .unwrap();
        }
        let (mut stdout, mut stderr, mut error) = (Vec::new(), Vec::new(), Vec::new());
        loop {
            let message = tokio::time::timeout(Duration::from_secs(20), ws.next())
                .await
                .expect("the session did not end in 20 s");
            match message {
                Some(Ok(Message::Binary(data))) => match data.first() {
                    Some(1) => stdout.extend_from_slice(&data[1..]),
                    Some(2) => stderr.extend_from_slice(&data[1..]),
                    Some(3) => error.extend_from_slice(&data[1..]),
                    other => panic!("unexpected channel {other:?}"),
                },
                Some(Ok(Message::Close(frame))) => {
                    assert_eq!(frame.map(|f| u16::from(f.code)), Some(1000));
                    break;
                }
                Some(Ok(_)) => {}
                None => break,
                Some(Err(e)) => panic!("websocket: {e}"),
            }
        }
        (
            String::from_utf8(stdout).unwrap(),
            String::from_utf8(stderr).unwrap(),
            serde_json::from_slice(&error).unwrap_or(Value::Null),
        )
    }
}

fn cells<'a>(table: &'a Value, name: &str) -> Vec<&'a str> {
    table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cells"][0] == name)
        .unwrap_or_else(|| panic!("no row {name}"))["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_show_what_a_cluster_shows() {
    let demo = demo().await;
    let pods = demo.table("/api/v1/namespaces/demo/pods").await;
    let columns: Vec<&str> = pods["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Name",
            "Ready",
            "Status",
            "Restarts",
            "Age",
            "IP",
            "Node",
            "Nominated Node",
            "Readiness Gates"
        ]
    );
    let app = cells(&pods, "app-4");
    assert_eq!(&app[1..4], ["1/1", "Running", "0"], "{app:?}");
    assert_eq!(
        &app[5..],
        ["10.244.2.14", "node-2", "<none>", "<none>"],
        "{app:?}"
    );

    let nodes = demo.table("/api/v1/nodes").await;
    let node = |n: &str| cells(&nodes, n);
    assert_eq!(node("node-1")[1..3], ["Ready", "control-plane"]);
    assert_eq!(node("node-3")[1..3], ["Ready,SchedulingDisabled", "<none>"]);
    assert_eq!(
        node("node-2")[4..],
        [
            "v1.36.2",
            "10.0.0.12",
            "<none>",
            "Debian GNU/Linux 13 (trixie)",
            "6.12.38-demo (amd64)",
            "containerd://2.1.4"
        ]
    );

    if let Some(kubectl) = demo.kubectl() {
        let out = kubectl.ok(&["get", "pods", "-n", "demo", "app-4"]).await;
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
            "{out}"
        );
        assert_eq!(lines[1][..4], ["app-4", "1/1", "Running", "0"], "{out}");
        let out = kubectl.ok(&["get", "nodes", "-o", "wide"]).await;
        assert!(
            out.starts_with("NAME")
                && out.contains("INTERNAL-IP")
                && out.contains("SchedulingDisabled"),
            "{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_and_attach_work_through_the_proxy() {
    let demo = demo().await;
    let v5 = "v5.channel.k8s.io";
    let exec = "/api/v1/namespaces/demo/pods/app-3/exec";
    let (out, err, status) = demo
        .session(
            &format!("{exec}?command=echo&command=hello&stdout=true&stderr=true"),
            v5,
            &[],
        )
        .await;
    assert_eq!((out.as_str(), err.as_str()), ("hello\n", ""));
    assert_eq!(status, json!({"metadata": {}, "status": "Success"}));

    let (_, _, status) = demo
        .session(
            &format!("{exec}?command=sh&command=-c&command=exit%203&stdout=true&stderr=true"),
            v5,
            &[],
        )
        .await;
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "ExitCode", "message": "3"}])
    );

    // stdin, ended by v5's close signal.
    let (out, _, status) = demo
        .session(
            &format!("{exec}?command=cat&stdin=true&stdout=true&stderr=true"),
            v5,
            &["one\n", "two\n"],
        )
        .await;
    assert_eq!(out, "one\ntwo\n");
    assert_eq!(status["status"], "Success");

    // A command the container lacks, as the kubelet reports it.
    let (_, _, status) = demo
        .session(
            &format!("{exec}?command=nope&stdout=true&stderr=true"),
            v5,
            &[],
        )
        .await;
    assert_eq!(
        (status["reason"].as_str(), status["code"].as_i64()),
        (Some("InternalError"), Some(500)),
        "{status}"
    );

    // v4: the same channels, no close signal.
    let (out, _, status) = demo
        .session(
            &format!("{exec}?command=hostname&stdout=true"),
            "v4.channel.k8s.io",
            &[],
        )
        .await;
    assert_eq!(
        (out.as_str(), &status["status"]),
        ("app-3\n", &json!("Success"))
    );

    // attach: the container's process (a shell) reads stdin.
    let (out, _, status) = demo
        .session(
            "/api/v1/namespaces/demo/pods/app-3/attach?container=main&stdin=true&stdout=true&stderr=true",
            v5,
            &["echo attached\n"],
        )
        .await;
    assert_eq!(
        (out.as_str(), &status["status"]),
        ("attached\n", &json!("Success"))
    );

    // The apiserver's checks come before the upgrade.
    let r = demo
        .client()
        .get(&format!("{exec}?command=true&container=other&stdout=true"))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "container other is not valid for pod app-3"
    );

    if let Some(kubectl) = demo.kubectl() {
        let out = kubectl
            .ok(&[
                "exec", "-n", "demo", "app-3", "--", "echo", "via", "kubectl",
            ])
            .await;
        assert_eq!(out, "via kubectl\n");
        let (ok, _, err) = kubectl
            .run(&["exec", "-n", "demo", "app-3", "--", "sh", "-c", "exit 7"])
            .await;
        assert!(
            !ok && err.contains("command terminated with exit code 7"),
            "{err}"
        );
        let mut attach = kubectl.command(&["attach", "-i", "-n", "demo", "app-3"]);
        attach
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = attach.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stdin, b"echo through attach\n")
            .await
            .unwrap();
        drop(stdin);
        let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "through attach\n");
    }
}

/// A quantity's value in milli-units (cpu) or bytes (memory).
fn quantity(q: &str, milli: bool) -> i64 {
    let (number, factor): (&str, f64) = [
        ("m", 0.001),
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
    ]
    .iter()
    .find_map(|(suffix, f)| q.strip_suffix(suffix).map(|n| (n, *f)))
    .unwrap_or((q, 1.0));
    let value = number.parse::<f64>().unwrap() * factor;
    (if milli { value * 1000.0 } else { value }).round() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_node_figures_are_sane() {
    let demo = demo().await;
    let c = demo.client();
    let node = c.get("/api/v1/nodes/node-2").await.json();
    let info = &node["status"]["nodeInfo"];
    for field in [
        "kubeletVersion",
        "osImage",
        "kernelVersion",
        "containerRuntimeVersion",
        "architecture",
        "operatingSystem",
    ] {
        assert!(
            !info[field].as_str().unwrap_or("").is_empty(),
            "nodeInfo.{field}: {node}"
        );
    }
    assert_eq!(node["status"]["addresses"][0]["type"], "InternalIP");
    let allocatable = &node["status"]["allocatable"];
    let pods = c
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-2%2Cstatus.phase!%3DSucceeded%2Cstatus.phase!%3DFailed")
        .await
        .json();
    let pods = pods["items"].as_array().unwrap();
    assert!(pods.len() >= 4);
    // kubectl describe node: the sum of the pods' requests over allocatable.
    for (resource, milli) in [("cpu", true), ("memory", false)] {
        let total: i64 = pods
            .iter()
            .flat_map(|p| p["spec"]["containers"].as_array().unwrap())
            .map(|c| {
                quantity(
                    c["resources"]["requests"][resource].as_str().unwrap(),
                    milli,
                )
            })
            .sum();
        let capacity = quantity(allocatable[resource].as_str().unwrap(), milli);
        assert!(capacity > 0, "{resource}: {allocatable}");
        let percent = total * 100 / capacity;
        assert!(
            (1..=100).contains(&percent),
            "{resource}: {total} of {capacity}"
        );
    }

    if let Some(kubectl) = demo.kubectl() {
        let out = kubectl.ok(&["describe", "node", "node-2"]).await;
        assert!(!out.contains("-9223372036854775808"), "{out}");
        let cpu = out
            .lines()
            .skip_while(|l| !l.starts_with("Allocated resources:"))
            .find(|l| l.trim_start().starts_with("cpu"))
            .unwrap_or_else(|| panic!("no allocated cpu line:\n{out}"));
        let words: Vec<&str> = cpu.split_whitespace().collect();
        assert!(
            words[1].ends_with('m') && words[2].starts_with('(') && words[2] != "(0%)",
            "{cpu}"
        );
        assert!(out.contains("Kubelet Version:            v1.36.2"), "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_change_under_a_watch() {
    let demo = demo().await;
    let c = demo.client();
    let list = c.get("/api/v1/namespaces/demo/pods").await.json();
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watch = c
        .watch(
            &format!("/api/v1/namespaces/demo/pods?watch=1&resourceVersion={rv}"),
            &[],
        )
        .await;
    // churn-<k>: created Pending, then Running, then deleted; flaky-0
    // crashes (tick 5, 10 s in) and restarts.
    let mut churn: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut crashed = false;
    let deadline = Instant::now() + Duration::from_secs(40);
    while !(crashed && churn.values().any(|seen| seen.len() >= 3)) {
        assert!(
            Instant::now() < deadline,
            "no full churn seen: {churn:?}, flaky crashed: {crashed}"
        );
        let Next::Event(e) = watch.next(Duration::from_secs(10)).await else {
            panic!("the watch ended or stalled: {churn:?}");
        };
        let name = e["object"]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        let phase = e["object"]["status"]["phase"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if name.starts_with("churn-") {
            churn
                .entry(name)
                .or_default()
                .push(format!("{} {phase}", e["type"].as_str().unwrap()));
        } else if name == "flaky-0" && e["type"] == "MODIFIED" {
            let status = &e["object"]["status"]["containerStatuses"][0];
            if status["state"]["waiting"]["reason"] == "CrashLoopBackOff" {
                assert!(status["restartCount"].as_i64().unwrap() >= 1, "{status}");
                crashed = true;
            }
        }
    }
    // Every churn pod goes through the same lifecycle, in order.
    for seen in churn.values().filter(|s| s.len() >= 3) {
        assert_eq!(
            seen[..3],
            ["ADDED Pending", "MODIFIED Running", "DELETED Running"]
        );
    }
    // Bounded: never more than one churn pod at a time.
    let now = c.get("/api/v1/namespaces/demo/pods").await.json();
    let churning = now["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("churn-")
        })
        .count();
    assert!(churning <= 1, "{churning} churn pods");
}

/// Every file of `dir` with its bytes and modification time.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>, std::time::SystemTime)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
                std::fs::metadata(&p).unwrap().modified().unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_demo_leaves_the_first_alone() {
    let tmp = support::env::tempdir();
    let (api, admin) = (
        format!("127.0.0.1:{}", support::env::free_port()),
        format!("127.0.0.1:{}", support::env::free_port()),
    );
    let first = start_ok(&tmp, &["--listen", &api, "--admin-listen", &admin]).await;
    let before = snapshot(&first.dir);
    assert_eq!(first.kubeconfig, first.dir.join("kubeconfig"));
    // Its own directory, private to its owner.
    let mode = std::fs::metadata(&first.dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);

    // The same ports: refused before any file is written, naming the
    // running demo's kubeconfig.
    let second = start(&tmp, &["--listen", &api, "--admin-listen", &admin]).await;
    let Err(failed) = second else {
        panic!("a second demo on the same ports started");
    };
    assert_eq!(failed.code, Some(1));
    assert!(
        failed.stderr.contains(&format!("{api} is in use"))
            && failed
                .stderr
                .contains(&first.kubeconfig.display().to_string()),
        "{}",
        failed.stderr
    );
    // Its directory, explicitly: refused too.
    let dir = first.dir.display().to_string();
    let third = start(
        &tmp,
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--dir",
            &dir,
        ],
    )
    .await;
    let Err(failed) = third else {
        panic!("a demo started in a running demo's directory");
    };
    assert!(
        failed
            .stderr
            .contains("holds the files of a demo that is running"),
        "{}",
        failed.stderr
    );
    assert_eq!(
        snapshot(&first.dir),
        before,
        "the first demo's files changed"
    );

    // Other ports: another directory; both demos answer.
    let other = start_ok(
        &tmp,
        &["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
    )
    .await;
    assert_ne!(other.dir, first.dir);
    assert_eq!(
        snapshot(&first.dir),
        before,
        "the first demo's files changed"
    );
    for demo in [&first, &other] {
        let r = demo
            .client()
            .get("/api/v1/namespaces/demo/pods/app-3")
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    if let Some(kubectl) = first.kubectl() {
        kubectl.ok(&["get", "nodes"]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_readable_by_their_owner_only() {
    // A directory left by an older demo, its key world-readable.
    let tmp = support::env::tempdir();
    let dir = tmp.join("demo-files");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("admin.key"), "old").unwrap();
    std::fs::set_permissions(
        dir.join("admin.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let dir_arg = dir.display().to_string();
    let demo = start_ok(
        &tmp,
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--dir",
            &dir_arg,
        ],
    )
    .await;
    let mode = |name: &str| {
        std::fs::metadata(demo.dir.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    for private in ["admin.key", "tls.key", "kubeconfig", "upstream.kubeconfig"] {
        assert_eq!(mode(private), 0o600, "{private}");
    }
    assert_eq!(mode("ca.crt"), 0o644);
    let r = demo.client().get("/api/v1/nodes/node-1").await;
    assert_eq!(r.status, 200);
}
