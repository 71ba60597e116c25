#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Behaviours of the simulated apiserver the recording does not cover:
//! history and compaction, bookmarks, timeouts, injected faults, tables,
//! upgrades, reviews, impersonation, pagination details and counters.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use apimachinery::resource::Gvr;
use http::Method;
use kube_apiserver_sim::{AuthMethod, ResourceSpec, Rule, Sim, SimConfig, Subject, UserInfo};
use rustls_pki_types::pem::PemObject;
use serde_json::{Value, json};
use support::{Client, Identity, Next, QUIET, SOON};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn gvr(group: &str, resource: &str) -> Gvr {
    Gvr {
        group: group.into(),
        version: "v1".into(),
        resource: resource.into(),
    }
}

fn cm(ns: &str, name: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}, "data": {"k": name}})
}

fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let ns = i["metadata"]["namespace"].as_str().unwrap_or("");
            let n = i["metadata"]["name"].as_str().unwrap();
            if ns.is_empty() {
                n.to_string()
            } else {
                format!("{ns}/{n}")
            }
        })
        .collect()
}

async fn sim_with(config: SimConfig) -> (Sim, Client) {
    let sim = Sim::start(config).await.unwrap();
    let admin = Client::sim(&sim, Identity::admin());
    (sim, admin)
}

async fn default_sim() -> (Sim, Client) {
    sim_with(SimConfig::default()).await
}

#[tokio::test]
async fn compaction_and_history_limit_give_410() {
    let (sim, admin) = sim_with(SimConfig {
        history_limit: 2,
        ..SimConfig::default()
    })
    .await;
    let cms = gvr("", "configmaps");
    let first = rv_of(&sim.create(&cms, cm("ns", "a", "x")).unwrap());
    for n in ["b", "c"] {
        sim.create(&cms, cm("ns", n, "x")).unwrap();
    }
    // Only the last two events are kept: resuming needs RV >= first.
    let mut w = admin
        .watch(
            &format!(
                "/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion={}",
                first - 1
            ),
            &[],
        )
        .await;
    let ev = w.event(SOON).await;
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    assert_eq!(
        ev["object"]["message"],
        format!("too old resource version: {} ({first})", first - 1)
    );
    assert!(matches!(w.next(SOON).await, Next::End));
    let mut w = admin
        .watch(
            &format!("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion={first}"),
            &[],
        )
        .await;
    assert_eq!(
        w.events(2, SOON)
            .await
            .iter()
            .map(|e| e["object"]["metadata"]["name"].clone())
            .collect::<Vec<_>>(),
        ["b", "c"]
    );

    // A page token and an exact read from before a compaction.
    let page = admin
        .get("/api/v1/namespaces/ns/configmaps?limit=1")
        .await
        .json();
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    let before = sim.resource_version();
    sim.create(&cms, cm("ns", "d", "x")).unwrap();
    sim.compact();
    let mut w = admin
        .watch(
            &format!("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion={before}"),
            &[],
        )
        .await;
    let ev = w.event(SOON).await;
    assert_eq!(
        ev["object"]["message"],
        format!(
            "too old resource version: {before} ({})",
            sim.resource_version()
        )
    );
    let r = admin
        .get(&format!(
            "/api/v1/namespaces/ns/configmaps?resourceVersion={before}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(r.status, 410);
    assert_eq!(
        r.json()["message"],
        "The resourceVersion for the provided list is too old."
    );
    let r = admin
        .get(&format!(
            "/api/v1/namespaces/ns/configmaps?limit=1&continue={token}"
        ))
        .await;
    assert_eq!(r.status, 410);
    let body = r.json();
    assert_eq!(body["reason"], "Expired");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("The provided continue parameter is too old")
    );
    // The fresh token continues at the latest RV (rv -1) after the same key.
    let fresh = body["metadata"]["continue"].as_str().unwrap();
    let r = admin
        .get(&format!(
            "/api/v1/namespaces/ns/configmaps?limit=10&continue={fresh}"
        ))
        .await;
    assert_eq!(names(&r.json()), ["ns/b", "ns/c", "ns/d"]);
    // Watching from now still works.
    let now = sim.resource_version();
    let mut w = admin
        .watch(
            &format!("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion={now}"),
            &[],
        )
        .await;
    sim.delete(&cms, "ns", "a").unwrap();
    assert_eq!(w.event(SOON).await["type"], "DELETED");
}

#[tokio::test]
async fn exact_and_not_older_than_reads() {
    let (sim, admin) = sim_with(SimConfig {
        too_large_rv_wait: Duration::from_millis(200),
        ..SimConfig::default()
    })
    .await;
    let cms = gvr("", "configmaps");
    let a1 = rv_of(&sim.create(&cms, cm("ns", "a", "x")).unwrap());
    let mut changed = cm("ns", "a", "y");
    changed["data"]["k"] = json!("changed");
    sim.update(&cms, changed).unwrap();
    sim.create(&cms, cm("ns", "b", "x")).unwrap();
    let old = admin
        .get(&format!(
            "/api/v1/namespaces/ns/configmaps?resourceVersion={a1}&resourceVersionMatch=Exact"
        ))
        .await
        .json();
    assert_eq!(old["metadata"]["resourceVersion"], a1.to_string());
    assert_eq!(names(&old), ["ns/a"]);
    assert_eq!(old["items"][0]["data"]["k"], "a");
    // limit with an RV is the legacy exact read.
    let legacy = admin
        .get(&format!(
            "/api/v1/namespaces/ns/configmaps?resourceVersion={a1}&limit=5"
        ))
        .await
        .json();
    assert_eq!(names(&legacy), ["ns/a"]);
    // Not older than: the current state.
    let now = admin
        .get(&format!(
            "/api/v1/namespaces/ns/configmaps?resourceVersion={a1}"
        ))
        .await
        .json();
    assert_eq!(names(&now), ["ns/a", "ns/b"]);
    // A future RV is waited for, then served.
    let future = sim.resource_version() + 1;
    let reader = admin.clone();
    let pending = tokio::spawn(async move {
        reader
            .get(&format!(
                "/api/v1/namespaces/ns/configmaps/a?resourceVersion={future}"
            ))
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    sim.create(&cms, cm("ns", "c", "x")).unwrap();
    assert_eq!(pending.await.unwrap().status, 200);
    let r = admin
        .get(&format!(
            "/api/v1/namespaces/ns/configmaps/a?resourceVersion={}",
            future + 10
        ))
        .await;
    assert_eq!(r.status, 504);
    assert_eq!(r.header("retry-after"), Some("1"));
}

#[tokio::test]
async fn bookmarks_follow_the_interval_and_the_rv() {
    let (sim, admin) = sim_with(SimConfig {
        bookmark_interval: Duration::from_millis(150),
        ..SimConfig::default()
    })
    .await;
    let cms = gvr("", "configmaps");
    sim.create(&cms, cm("ns", "a", "x")).unwrap();
    let mut w = admin
        .watch("/api/v1/namespaces/ns/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=30", &[])
        .await;
    assert_eq!(w.event(SOON).await["type"], "ADDED");
    let end = w.event(SOON).await;
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(
        end["object"]["metadata"]["resourceVersion"],
        sim.resource_version().to_string()
    );
    // Nothing moved: no periodic bookmark.
    assert!(matches!(
        w.next(Duration::from_millis(400)).await,
        Next::Timeout
    ));
    // A write elsewhere moves the global RV: the next bookmark carries it.
    sim.create(
        &gvr("", "secrets"),
        json!({"metadata": {"name": "s", "namespace": "other"}}),
    )
    .unwrap();
    let bm = w.event(SOON).await;
    assert_eq!(bm["type"], "BOOKMARK");
    assert_eq!(
        bm["object"],
        json!({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": sim.resource_version().to_string()}})
    );
    // Events come before the bookmark that covers them.
    sim.create(&cms, cm("ns", "b", "x")).unwrap();
    assert_eq!(w.event(SOON).await["type"], "ADDED");
    assert!(matches!(
        w.next(Duration::from_millis(400)).await,
        Next::Timeout
    ));
}

#[tokio::test]
async fn pre_timeout_bookmark_and_timeout_end_cleanly() {
    let (sim, admin) = default_sim().await;
    let start_rv = sim.resource_version();
    sim.create(
        &gvr("", "secrets"),
        json!({"metadata": {"name": "s", "namespace": "n"}}),
    )
    .unwrap();
    let started = Instant::now();
    let mut w = admin
        .watch(&format!("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion={start_rv}&allowWatchBookmarks=true&timeoutSeconds=3"), &[])
        .await;
    // The only bookmark comes 2 s before the deadline.
    let bm = w.event(Duration::from_secs(5)).await;
    assert_eq!(bm["type"], "BOOKMARK");
    let at = started.elapsed();
    assert!(
        at >= Duration::from_millis(900) && at < Duration::from_millis(2000),
        "bookmark at {at:?}"
    );
    assert!(matches!(w.next(Duration::from_secs(5)).await, Next::End));
    let total = started.elapsed();
    assert!(
        total >= Duration::from_millis(2900) && total < Duration::from_millis(4000),
        "ended at {total:?}"
    );
}

#[tokio::test]
async fn drop_watches_breaks_streams_and_counts_watches() {
    let (sim, admin) = default_sim().await;
    let h2 = Client::sim_h2(&sim, Identity::admin());
    let mut w1 = admin
        .watch("/api/v1/pods?watch=1&resourceVersion=0", &[])
        .await;
    let mut w2 = h2.watch("/api/v1/pods?watch=1", &[]).await;
    let mut w3 = admin.watch("/api/v1/namespaces?watch=1", &[]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = sim.stats();
    assert_eq!(stats.watches_open("pods"), 2);
    assert_eq!(stats.watches_open("namespaces"), 1);
    assert_eq!(stats.watches_started("pods"), 2);
    assert_eq!(stats.watches("pods"), 2);
    sim.drop_watches();
    for w in [&mut w1, &mut w2, &mut w3] {
        match w.next(SOON).await {
            Next::Error(_) => {}
            other => panic!("expected a broken stream, got {other:?}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(sim.stats().watches_open("pods"), 0);
    // New watches work again.
    let mut w = admin.watch("/api/v1/pods?watch=1", &[]).await;
    sim.create(
        &gvr("", "pods"),
        json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {}}),
    )
    .unwrap();
    let ev = w.event(SOON).await;
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["status"]["phase"], "Pending");
    assert_eq!(ev["object"]["metadata"]["generation"], 1);
}

#[tokio::test]
async fn stop_and_restart_keep_port_and_state() {
    let (sim, admin) = default_sim().await;
    sim.create(&gvr("", "configmaps"), cm("ns", "a", "x"))
        .unwrap();
    let mut w = admin
        .watch("/api/v1/namespaces/ns/configmaps?watch=1", &[])
        .await;
    assert_eq!(w.event(SOON).await["type"], "ADDED");
    let addr = sim.addr();
    sim.stop().await;
    assert!(
        !matches!(w.next(SOON).await, Next::Event(_) | Next::Timeout),
        "open streams end"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "connections are refused"
    );
    let fresh = Client::sim(&sim, Identity::admin());
    assert!(
        fresh
            .try_send(Method::GET, "/version", &[], None)
            .await
            .is_err()
    );
    sim.restart().await.unwrap();
    assert_eq!(sim.addr(), addr);
    let r = fresh.get("/api/v1/namespaces/ns/configmaps/a").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"]["k"], "a");
}

#[tokio::test]
async fn tables_for_kubectl_get_and_watch() {
    let (sim, admin) = default_sim().await;
    sim.create(&gvr("", "configmaps"), cm("ns", "a", "x"))
        .unwrap();
    let accept = [(
        "accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )];
    let t = admin
        .send(
            Method::GET,
            "/api/v1/namespaces/ns/configmaps",
            &accept,
            None,
        )
        .await
        .json();
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["rows"][0]["cells"][0], "a");
    assert_eq!(t["rows"][0]["cells"][1], 1);
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let t = admin
        .send(
            Method::GET,
            "/api/v1/namespaces/ns/configmaps/a",
            &accept,
            None,
        )
        .await
        .json();
    assert_eq!(t["rows"].as_array().unwrap().len(), 1);
    let pods = admin
        .send(
            Method::GET,
            "/api/v1/pods?includeObject=Object",
            &accept,
            None,
        )
        .await
        .json();
    let cols: Vec<_> = pods["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(
        cols,
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
    let rv = t["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w = admin
        .watch(
            &format!("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion={rv}"),
            &accept,
        )
        .await;
    sim.create(&gvr("", "configmaps"), cm("ns", "b", "x"))
        .unwrap();
    let ev = w.event(SOON).await;
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["kind"], "Table");
    assert_eq!(ev["object"]["rows"][0]["cells"][0], "b");
    // Metadata-only lists, as metadata informers ask for them.
    let meta_accept = [(
        "accept",
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    )];
    let m = admin
        .send(
            Method::GET,
            "/api/v1/namespaces/ns/configmaps",
            &meta_accept,
            None,
        )
        .await
        .json();
    assert_eq!(m["kind"], "PartialObjectMetadataList");
    assert_eq!(m["items"][1]["metadata"]["name"], "b");
    assert!(m["items"][1].get("data").is_none());
    // Only protobuf: 406.
    let r = admin
        .send(
            Method::GET,
            "/api/v1/pods",
            &[("accept", "application/vnd.kubernetes.protobuf")],
            None,
        )
        .await;
    assert_eq!(r.status, 406);
    assert_eq!(r.json()["reason"], "NotAcceptable");
}

fn tls_connector(sim: &Sim) -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_slice(sim.ca_pem().as_bytes()).unwrap())
        .unwrap();
    let issued = sim.issue_client("admin", Some("system:masters"));
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![
                rustls_pki_types::CertificateDer::from_pem_slice(issued.cert_pem.as_bytes())
                    .unwrap(),
            ],
            rustls_pki_types::PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

async fn upgrade(
    sim: &Sim,
    extra_headers: &str,
) -> (
    String,
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
) {
    let tcp = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tls_connector(sim).connect(name, tcp).await.unwrap();
    let req = format!(
        "POST /api/v1/namespaces/ns/pods/p/exec?command=sh&stdin=true HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\n{extra_headers}Content-Length: 0\r\n\r\n",
        sim.addr()
    );
    tls.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tls.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    (String::from_utf8(head).unwrap(), tls)
}

#[tokio::test]
async fn upgrades_echo_bytes_both_ways() {
    let (sim, admin) = default_sim().await;
    sim.create(
        &gvr("", "pods"),
        json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}}),
    )
    .unwrap();
    let (head, mut tls) = upgrade(
        &sim,
        "Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("upgrade: spdy/3.1"), "{head}");
    assert!(
        lower.contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{head}"
    );
    tls.write_all(b"hello through the upgrade").await.unwrap();
    let mut buf = [0u8; 25];
    tokio::time::timeout(SOON, tls.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"hello through the upgrade");

    let (head, _tls) = upgrade(&sim, "Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n").await;
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    assert!(
        lower.contains("sec-websocket-protocol: v5.channel.k8s.io"),
        "{head}"
    );

    let r = admin
        .send(Method::POST, "/api/v1/namespaces/ns/pods/p/exec", &[], None)
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["message"], "Upgrade request required");
    let log = admin
        .get("/api/v1/namespaces/ns/pods/p/log?container=c")
        .await;
    assert_eq!(
        log.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert!(String::from_utf8_lossy(&log.body).contains("log line 1 of ns/p/c"));
}

#[tokio::test]
async fn token_and_access_reviews() {
    let config = SimConfig::default();
    let proxy_user = config.proxy_user.clone();
    let (sim, _) = sim_with(config).await;
    let proxy = Client::sim(&sim, Identity::user(&proxy_user));
    let mut alice = UserInfo::new("alice", &["dev"]);
    alice.uid = "u-1".into();
    sim.add_token("secret-token", alice);
    let r = proxy
        .post_json("/apis/authentication.k8s.io/v1/tokenreviews", &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "secret-token"}}))
        .await;
    assert_eq!(r.status, 201);
    let body = r.json();
    assert_eq!(body["kind"], "TokenReview");
    assert_eq!(body["status"]["authenticated"], true);
    assert_eq!(
        body["status"]["user"],
        json!({"username": "alice", "uid": "u-1", "groups": ["dev", "system:authenticated"]})
    );
    assert_eq!(
        body["status"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    let parsed: UserInfo = serde_json::from_value(body["status"]["user"].clone()).unwrap();
    assert_eq!(parsed.name, "alice");
    sim.revoke_token("secret-token");
    let r = proxy
        .post_json(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &json!({"spec": {"token": "secret-token"}}),
        )
        .await;
    assert_eq!(r.json()["status"], json!({"user": {}}));

    let sar = |fs: Value| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
            "user": "system:node:node-1", "groups": ["system:nodes", "system:authenticated"],
            "resourceAttributes": {"verb": "list", "version": "v1", "resource": "pods", "fieldSelector": fs}}})
    };
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let allowed = proxy.post_json(path, &sar(json!({"requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["node-1"]}]}))).await;
    assert_eq!(allowed.status, 201);
    assert_eq!(allowed.json()["status"], json!({"allowed": true}));
    let raw = proxy
        .post_json(path, &sar(json!({"rawSelector": "spec.nodeName=node-1"})))
        .await;
    assert_eq!(raw.json()["status"]["allowed"], true);
    let denied = proxy.post_json(path, &sar(json!({"requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["node-2"]}]}))).await;
    assert_eq!(
        denied.json()["status"],
        json!({"allowed": false, "reason": "can only list/watch pods with spec.nodeName field selector"})
    );
    assert_eq!(denied.json()["spec"]["user"], "system:node:node-1");
    let path_review = proxy
        .post_json(path, &json!({"spec": {"user": "bob", "groups": ["system:authenticated"], "nonResourceAttributes": {"path": "/apis", "verb": "get"}}}))
        .await;
    assert_eq!(path_review.json()["status"]["allowed"], true);
    let invalid = proxy
        .post_json(path, &json!({"spec": {"user": "bob"}}))
        .await;
    assert_eq!(invalid.status, 422);

    // Others may not create reviews, but may review themselves.
    let bob = Client::sim(&sim, Identity::user("bob"));
    let r = bob.post_json(path, &sar(json!({}))).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["message"],
        "subjectaccessreviews.authorization.k8s.io is forbidden: User \"bob\" cannot create resource \"subjectaccessreviews\" in API group \"authorization.k8s.io\" at the cluster scope"
    );
    let me = bob
        .post_json(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            &json!({}),
        )
        .await
        .json();
    assert_eq!(me["status"]["userInfo"]["username"], "bob");
    let can_i = bob
        .post_json(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            &json!({"spec": {"resourceAttributes": {"verb": "list", "resource": "pods"}}}),
        )
        .await
        .json();
    assert_eq!(can_i["status"]["allowed"], false);
    sim.policy().grant(
        Subject::User("bob".into()),
        Rule::new(&["list"], &[""], &["pods"]),
    );
    let can_i = bob
        .post_json(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            &json!({"spec": {"resourceAttributes": {"verb": "list", "resource": "pods"}}}),
        )
        .await
        .json();
    assert_eq!(can_i["status"]["allowed"], true);
}

#[tokio::test]
async fn impersonation_is_authorized_and_recorded() {
    let config = SimConfig::default();
    let proxy_user = config.proxy_user.clone();
    let (sim, _) = sim_with(config).await;
    sim.create(
        &gvr("", "pods"),
        json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "node-1"}}),
    )
    .unwrap();
    let proxy = Client::sim(&sim, Identity::user(&proxy_user));
    let as_node = [
        ("impersonate-user", "system:node:node-1"),
        ("impersonate-group", "system:nodes"),
    ];
    let r = proxy
        .send(
            Method::GET,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
            &as_node,
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(names(&r.json()), ["ns/p"]);
    let r = proxy
        .send(Method::GET, "/api/v1/pods", &as_node, None)
        .await;
    assert_eq!(r.status, 403);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .ends_with("can only list/watch pods with spec.nodeName field selector")
    );
    // Without the group the user is not a node: RBAC only.
    let r = proxy
        .send(
            Method::GET,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
            &[("impersonate-user", "system:node:node-1")],
            None,
        )
        .await;
    assert_eq!(r.status, 403);
    let rec = sim.requests().into_iter().rev().nth(1).unwrap();
    assert_eq!(rec.user, "system:node:node-1");
    assert_eq!(rec.groups, ["system:nodes", "system:authenticated"]);
    assert_eq!(rec.authenticated_user, proxy_user);
    assert_eq!(rec.auth_method, AuthMethod::X509);
    assert!(rec.impersonated);
    assert!(!rec.has_authorization);

    let bob = Client::sim(&sim, Identity::user("bob"));
    let r = bob
        .send(
            Method::GET,
            "/api/v1/pods",
            &[("impersonate-user", "alice")],
            None,
        )
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["message"],
        // kube-apiserver v1.36, constrained impersonation on: the first
        // mode that applies to a plain user is user-info.
        "pods is forbidden: User \"bob\" cannot impersonate-on:user-info:list resource \"pods\" in API group \"\" at the cluster scope"
    );
    let r = proxy
        .send(
            Method::GET,
            "/api/v1/pods",
            &[("impersonate-group", "system:masters")],
            None,
        )
        .await;
    assert_eq!(r.status, 400);
    let r = proxy
        .send(
            Method::GET,
            "/api/v1/pods",
            &[
                ("impersonate-user", "carol"),
                ("impersonate-extra-scopes", "view"),
            ],
            None,
        )
        .await;
    assert_eq!(r.status, 403, "carol may not list pods");
    let rec = sim.requests().pop().unwrap();
    assert_eq!(rec.user, "carol");
}

#[tokio::test]
async fn authentication_failures_are_401() {
    let (sim, _) = sim_with(SimConfig {
        anonymous_auth: false,
        ..SimConfig::default()
    })
    .await;
    let anon = Client::sim(&sim, Identity::Anonymous);
    let r = anon.get("/api/v1/pods").await;
    assert_eq!(r.status, 401);
    assert_eq!(
        &r.body[..],
        b"{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"Unauthorized\",\"reason\":\"Unauthorized\",\"code\":401}\n"
    );
    sim.add_token("t", UserInfo::new("tina", &[]));
    let tina = Client::sim(&sim, Identity::Token("t".into()));
    let r = tina.get("/api/v1/pods").await;
    assert_eq!(r.status, 403, "authenticated, not authorized");
    assert_eq!(
        tina.get("/apis").await.status,
        200,
        "discovery is open to authenticated users"
    );
    let rec = sim.requests().pop().unwrap();
    assert_eq!(
        (rec.auth_method, rec.has_authorization),
        (AuthMethod::Token, true)
    );
    sim.revoke_token("t");
    assert_eq!(tina.get("/api/v1/pods").await.status, 401);

    let (sim, _) = default_sim().await;
    let wrong = Client::sim(&sim, Identity::Token("nope".into()));
    assert_eq!(
        wrong.get("/version").await.status,
        401,
        "a bad token is 401 even with anonymous on"
    );
    let anon = Client::sim(&sim, Identity::Anonymous);
    assert_eq!(anon.get("/version").await.status, 200);
    let r = anon.get("/apis").await;
    assert_eq!(
        r.json()["message"],
        "forbidden: User \"system:anonymous\" cannot get path \"/apis\""
    );
    assert_eq!(r.json()["details"], json!({}));
}

#[tokio::test]
async fn pagination_follows_storage_key_order() {
    let (sim, admin) = default_sim().await;
    let cms = gvr("", "configmaps");
    for (ns, name, app) in [
        ("a", "b", "x"),
        ("a-x", "c", "y"),
        ("a", "a", "y"),
        ("b", "z", "x"),
    ] {
        sim.create(&cms, cm(ns, name, app)).unwrap();
    }
    let all = admin.get("/api/v1/configmaps").await.json();
    assert_eq!(names(&all), ["a-x/c", "a/a", "a/b", "b/z"]);
    let mut seen = Vec::new();
    let mut path = "/api/v1/configmaps?limit=3".to_string();
    let mut remaining = Vec::new();
    loop {
        let page = admin.get(&path).await.json();
        seen.extend(names(&page));
        remaining.push(page["metadata"]["remainingItemCount"].clone());
        match page["metadata"]["continue"].as_str() {
            Some(t) => path = format!("/api/v1/configmaps?limit=3&continue={t}"),
            None => break,
        }
    }
    assert_eq!(seen, names(&all));
    assert_eq!(remaining, [json!(1), Value::Null]);
    // With a selector: a page may end early, and continue is set as soon
    // as any item follows, even one that does not match.
    let p1 = admin
        .get("/api/v1/configmaps?limit=1&labelSelector=app%3Dx")
        .await
        .json();
    assert_eq!(names(&p1), ["a/b"]);
    assert!(p1["metadata"].get("remainingItemCount").is_none());
    let t = p1["metadata"]["continue"].as_str().unwrap();
    let p2 = admin
        .get(&format!(
            "/api/v1/configmaps?limit=1&labelSelector=app%3Dx&continue={t}"
        ))
        .await
        .json();
    assert_eq!(names(&p2), ["b/z"]);
    assert!(p2["metadata"].get("continue").is_none());
    let none = admin
        .get("/api/v1/configmaps?limit=1&labelSelector=app%3Dnone")
        .await
        .json();
    assert_eq!(names(&none), Vec::<String>::new());
    assert!(none["metadata"].get("continue").is_none());
    assert_eq!(none["items"], json!([]));
    // resourceVersion=0 ignores the limit.
    let any = admin
        .get("/api/v1/configmaps?limit=1&resourceVersion=0")
        .await
        .json();
    assert_eq!(names(&any).len(), 4);
    assert!(any["metadata"].get("continue").is_none());
    // A list pinning one name reads that one key: no continue token,
    // though items follow (kube-apiserver alike: tests/real/api.rs).
    for path in [
        "/api/v1/namespaces/a/configmaps?limit=1&fieldSelector=metadata.name%3Da",
        "/api/v1/configmaps?limit=1&fieldSelector=metadata.name%3Da%2Cmetadata.namespace%3Da",
    ] {
        let one = admin.get(path).await.json();
        assert_eq!(names(&one), ["a/a"], "{path}");
        assert!(one["metadata"].get("continue").is_none(), "{path}");
    }
    // Without a namespace, a namespaced name is no key: the list walks.
    let walk = admin
        .get("/api/v1/configmaps?limit=1&fieldSelector=metadata.name%3Da")
        .await
        .json();
    assert_eq!(names(&walk), ["a/a"]);
    assert!(walk["metadata"]["continue"].is_string());
}

#[tokio::test]
async fn writes_over_http() {
    let (sim, admin) = default_sim().await;
    let base = "/api/v1/namespaces/ns/configmaps";
    let created = admin
        .post_json(
            base,
            &json!({"metadata": {"name": "c"}, "data": {"html": "<a&b>"}}),
        )
        .await;
    assert_eq!(created.status, 201);
    // Go's encoder escapes HTML characters.
    assert!(String::from_utf8_lossy(&created.body).contains(r#""html":"\u003ca\u0026b\u003e""#));
    let obj = created.json();
    let stale = json!({"metadata": {"name": "c", "resourceVersion": "1"}, "data": {}});
    let r = admin
        .send(
            Method::PUT,
            &format!("{base}/c"),
            &[("content-type", "application/json")],
            Some(serde_json::to_vec(&stale).unwrap()),
        )
        .await;
    assert_eq!(r.status, 409);
    assert_eq!(r.json()["reason"], "Conflict");
    let patch = json!([{"op": "add", "path": "/data/new", "value": "v"}, {"op": "test", "path": "/data/html", "value": "<a&b>"}]);
    let r = admin
        .send(
            Method::PATCH,
            &format!("{base}/c"),
            &[("content-type", "application/json-patch+json")],
            Some(serde_json::to_vec(&patch).unwrap()),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"]["new"], "v");
    assert!(rv_of(&r.json()) > rv_of(&obj));
    let r = admin
        .send(
            Method::PATCH,
            &format!("{base}/missing"),
            &[("content-type", "application/merge-patch+json")],
            Some(b"{}".to_vec()),
        )
        .await;
    assert_eq!(r.status, 404);
    let r = admin
        .send(
            Method::PATCH,
            &format!("{base}/c"),
            &[("content-type", "text/plain")],
            Some(b"{}".to_vec()),
        )
        .await;
    assert_eq!(r.status, 415);
    let big = vec![b' '; 3 * 1024 * 1024 + 1];
    let r = admin
        .send(
            Method::POST,
            base,
            &[("content-type", "application/json")],
            Some(big),
        )
        .await;
    assert_eq!(r.status, 413);
    let r = admin.post_json(base, &json!({"metadata": {}})).await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.json()["message"],
        "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required"
    );
    let r = admin
        .post_json(base, &json!({"metadata": {"generateName": "gen-"}}))
        .await;
    assert!(
        r.json()["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("gen-")
    );

    // Status subresource writes change only .status.
    let pods = "/api/v1/namespaces/ns/pods";
    admin
        .post_json(
            pods,
            &json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}}),
        )
        .await;
    let st = json!({"status": {"phase": "Running"}, "spec": {"nodeName": "other"}});
    let r = admin
        .send(
            Method::PATCH,
            &format!("{pods}/p/status"),
            &[("content-type", "application/merge-patch+json")],
            Some(serde_json::to_vec(&st).unwrap()),
        )
        .await;
    assert_eq!(
        (
            r.json()["status"]["phase"].clone(),
            r.json()["spec"]["nodeName"].clone()
        ),
        (json!("Running"), json!("n1"))
    );
    let r = admin.get(&format!("{pods}/p/status")).await;
    assert_eq!(r.json()["status"]["phase"], "Running");
    let del = admin
        .send(Method::DELETE, &format!("{base}/c"), &[], None)
        .await;
    assert_eq!(del.status, 200);
    assert_eq!(del.json()["metadata"]["name"], "c");
    assert_eq!(
        admin
            .send(Method::DELETE, &format!("{base}/c"), &[], None)
            .await
            .status,
        404
    );
    let r = admin
        .send(Method::DELETE, &format!("{base}?labelSelector="), &[], None)
        .await;
    assert_eq!(r.json()["kind"], "ConfigMapList");
    assert!(sim.get(&gvr("", "configmaps"), "ns", "c").is_none());
}

#[tokio::test]
async fn custom_resources_and_discovery() {
    let (sim, admin) = default_sim().await;
    sim.register_resource(ResourceSpec::new(
        "example.com",
        "v1",
        "widgets",
        "Widget",
        true,
    ));
    let w = Gvr {
        group: "example.com".into(),
        version: "v1".into(),
        resource: "widgets".into(),
    };
    sim.create(
        &w,
        json!({"metadata": {"name": "w", "namespace": "ns"}, "spec": {"z": 1, "a": 2}}),
    )
    .unwrap();
    let r = admin
        .get("/apis/example.com/v1/namespaces/ns/widgets")
        .await;
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(
        text.starts_with(
            r#"{"kind":"WidgetList","apiVersion":"example.com/v1","metadata":{"resourceVersion":"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"creationTimestamp":"#
        ),
        "{text}"
    );
    assert!(text.contains(r#""spec":{"a":2,"z":1}"#), "{text}");
    let groups = admin.get("/apis").await.json();
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "example.com")
    );
    let core = admin.get("/api/v1").await.json();
    let cmr = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "configmaps")
        .unwrap()
        .clone();
    assert_eq!(cmr["shortNames"], json!(["cm"]));
    assert!(
        core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "pods/status")
    );
    let apps = admin.get("/apis/apps").await.json();
    assert_eq!(apps["preferredVersion"]["groupVersion"], "apps/v1");
    let v = admin.get("/version").await.json();
    assert_eq!(v["gitVersion"], "v1.36.2");
    assert_eq!(admin.get("/api").await.json()["versions"], json!(["v1"]));
    assert_eq!(admin.get("/nope").await.status, 404);
    assert_eq!(
        admin.get("/apis/example.com/v1/widgets").await.json()["items"][0]["kind"],
        "Widget"
    );
    assert_eq!(admin.get("/api/v1/namespaces/ns/nodes").await.status, 404);
    // A namespaced name: in the path, only with its namespace; in a list's
    // or watch's field selector, across namespaces (as kube-apiserver:
    // tests/real/api.rs lists one such name side by side with it).
    assert_eq!(admin.get("/api/v1/configmaps/x").await.status, 404);
    assert_eq!(admin.get("/api/v1/watch/configmaps/x").await.status, 404);
    let list = admin
        .get("/api/v1/configmaps?fieldSelector=metadata.name%3Dx%2Cmetadata.namespace%3Ddefault")
        .await;
    assert_eq!(list.status, 200, "{}", list.text());
    assert_eq!(list.json()["items"], json!([]));
}

#[tokio::test]
async fn stats_count_requests_by_verb_and_resource() {
    let (sim, admin) = default_sim().await;
    admin.get("/api/v1/pods").await;
    admin.get("/api/v1/pods?limit=5").await;
    admin.get("/api/v1/namespaces/ns/pods/x").await;
    let mut w = admin
        .watch("/api/v1/pods?watch=true&resourceVersion=0", &[])
        .await;
    assert!(matches!(w.next(QUIET).await, Next::Timeout));
    let stats = sim.stats();
    assert_eq!(stats.lists("pods"), 2);
    assert_eq!(stats.count("get", "pods"), 1);
    assert_eq!(stats.watches("pods"), 1);
    assert_eq!(stats.watches_open("pods"), 1);
    assert_eq!(stats.total_requests, 4);
    drop(w);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(sim.stats().watches_open("pods"), 0);
    let log = sim.requests();
    assert_eq!(log.len(), 4, "a watch is logged once its response starts");
    assert_eq!(log[1].query, "limit=5");
    assert_eq!(log[2].status, 404);
    assert_eq!(
        (
            log[3].verb.as_str(),
            log[3].resource.as_str(),
            log[3].status
        ),
        ("watch", "pods", 200)
    );
}

#[test]
fn sim_is_shareable_across_tasks() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Sim>();
}

#[tokio::test]
async fn kubeconfigs_embed_credentials() {
    let (sim, _) = default_sim().await;
    let k: Value =
        serde_saphyr::from_str(&sim.kubeconfig("system:node:n1", Some("system:nodes"))).unwrap();
    assert_eq!(k["clusters"][0]["cluster"]["server"], sim.url());
    assert!(
        k["users"][0]["user"]["client-certificate-data"]
            .as_str()
            .is_some()
    );
    let k: Value = serde_saphyr::from_str(&sim.kubeconfig_with_token("tok")).unwrap();
    assert_eq!(k["users"][0]["user"]["token"], "tok");
}
