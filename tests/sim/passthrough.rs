#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The frame: every request works through the proxy, over real TLS, to the
//! simulated apiserver: reads, writes, watches, upgrades, large bodies,
//! errors, identities, admin endpoints and shutdown.

use crate::support;

use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::{Value, json};
use support::{Auth, Env, Next, SOON};

fn cm(ns: &str, name: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}, "data": {"k": name}})
}

async fn passthrough_env() -> Env {
    Env::start_with(Default::default(), |c| c.cache.enabled = false).await
}

#[tokio::test]
async fn reads_pass_through_unchanged() {
    let env = passthrough_env().await;
    let admin = env.proxy(env.admin());
    let direct = env.direct(env.admin());
    for name in ["a", "b", "c"] {
        assert_eq!(
            admin
                .post_json("/api/v1/namespaces/ns1/configmaps", &cm("ns1", name, "x"))
                .await
                .status,
            201
        );
    }
    for path in [
        "/api/v1/namespaces/ns1/configmaps",
        "/api/v1/namespaces/ns1/configmaps?labelSelector=app%3Dx&limit=2",
        "/api/v1/namespaces/ns1/configmaps/b",
        "/api/v1/namespaces/ns1/configmaps/nope",
        "/api/v1",
        "/apis",
        "/version",
        "/api/v1/widgets",
    ] {
        let via = admin.get(path).await;
        let ground = direct.get(path).await;
        assert_eq!(via.status, ground.status, "{path}");
        assert_eq!(
            via.header("content-type"),
            ground.header("content-type"),
            "{path}"
        );
        // Continue tokens and the body are byte-identical: nothing was
        // re-encoded on the way.
        assert_eq!(via.body, ground.body, "{path}");
    }
}

#[tokio::test]
async fn writes_pass_through() {
    let env = passthrough_env().await;
    let c = env.proxy(env.admin());
    let created = c
        .post_json("/api/v1/namespaces/ns1/configmaps", &cm("ns1", "w", "x"))
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let mut obj = created.json();
    assert_eq!(
        c.post_json("/api/v1/namespaces/ns1/configmaps", &cm("ns1", "w", "x"))
            .await
            .status,
        409
    );
    obj["data"]["k"] = json!("changed");
    let updated = c
        .put_json("/api/v1/namespaces/ns1/configmaps/w", &obj)
        .await;
    assert_eq!(updated.status, 200, "{}", updated.text());
    assert_eq!(updated.json()["data"]["k"], "changed");
    let patched = c
        .send(
            Method::PATCH,
            "/api/v1/namespaces/ns1/configmaps/w",
            &[("content-type", "application/merge-patch+json")],
            Some(br#"{"data":{"p":"1"}}"#.to_vec()),
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text());
    assert_eq!(patched.json()["data"]["p"], "1");
    let bad = c
        .send(
            Method::POST,
            "/api/v1/namespaces/ns1/configmaps",
            &[("content-type", "application/json")],
            Some(b"{not json".to_vec()),
        )
        .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["reason"], "BadRequest");
    assert_eq!(
        c.delete("/api/v1/namespaces/ns1/configmaps/w").await.status,
        200
    );
    assert_eq!(
        c.get("/api/v1/namespaces/ns1/configmaps/w").await.status,
        404
    );
}

#[tokio::test]
async fn passthrough_watch_events_arrive_when_they_happen() {
    let env = passthrough_env().await;
    for h2 in [false, true] {
        let auth = env.admin();
        let c = if h2 {
            env.proxy_h2(auth)
        } else {
            env.proxy(auth)
        };
        let rv =
            c.get("/api/v1/namespaces/ns2/configmaps").await.json()["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_string();
        let mut w = c
            .watch(
                &format!("/api/v1/namespaces/ns2/configmaps?watch=1&resourceVersion={rv}"),
                &[],
            )
            .await;
        assert_eq!(w.status, 200);
        for i in 0..3 {
            let name = format!("e{i}-{h2}");
            let started = Instant::now();
            c.post_json("/api/v1/namespaces/ns2/configmaps", &cm("ns2", &name, "x"))
                .await;
            let ev = w.event(SOON).await;
            assert_eq!(ev["type"], "ADDED");
            assert_eq!(ev["object"]["metadata"]["name"], name.as_str());
            assert!(started.elapsed() < Duration::from_secs(2));
        }
    }
}

#[tokio::test]
async fn upgrade_round_trip() {
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = passthrough_env().await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1", "namespace": "ns1"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}});
    assert_eq!(
        env.proxy(env.admin())
            .post_json("/api/v1/namespaces/ns1/pods", &pod)
            .await
            .status,
        201
    );
    let cfg = support::client::tls_config(&env.proxy_ca_pem, &env.admin());
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(env.proxy_url.trim_start_matches("https://"))
        .await
        .unwrap();
    let tls = connector
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    let req = http::Request::post("/api/v1/namespaces/ns1/pods/p1/exec?command=sh&stdin=true")
        .header("host", "127.0.0.1")
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1")
        .header("x-stream-protocol-version", "v4.channel.k8s.io")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(resp.headers()["upgrade"], "SPDY/3.1");
    let upgraded = hyper::upgrade::on(resp).await.unwrap();
    let mut io = TokioIo::new(upgraded);
    for msg in [&b"hello through the proxy"[..], &[0u8, 1, 2, 255][..]] {
        io.write_all(msg).await.unwrap();
        let mut buf = vec![0; msg.len()];
        tokio::time::timeout(SOON, io.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(buf, msg);
    }
    // Counted as kube-apiserver counts it: CONNECT, subresource exec.
    let (_, metrics) = env.admin_get("/metrics").await;
    assert!(
        metrics.contains("kube_cache_proxy_requests_total{code=\"101\",group=\"\",resource=\"pods\",scope=\"resource\",source=\"upstream\",subresource=\"exec\",verb=\"CONNECT\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn large_bodies_stream_through() {
    let env = passthrough_env().await;
    let big = "x".repeat(1 << 20);
    let gvr = support::configmaps();
    for i in 0..50 {
        let mut o = cm("big", &format!("cm-{i:02}"), "x");
        o["data"]["blob"] = json!(big);
        env.sim.create(&gvr, o).unwrap();
    }
    let c = env.proxy(env.admin());
    let via = c.get("/api/v1/namespaces/big/configmaps").await;
    let direct = env
        .direct(env.admin())
        .get("/api/v1/namespaces/big/configmaps")
        .await;
    assert_eq!(via.status, 200);
    assert!(via.body.len() > 50 << 20);
    assert_eq!(via.body, direct.body);
    // A large request body streams upstream too.
    let mut o = cm("big", "upload", "x");
    o["data"]["blob"] = json!("y".repeat(2 << 20));
    assert_eq!(
        c.post_json("/api/v1/namespaces/big/configmaps", &o)
            .await
            .status,
        201
    );
}

#[tokio::test]
async fn upstream_down_is_a_fast_503() {
    let env = passthrough_env().await;
    let c = env.proxy(env.admin());
    assert_eq!(c.get("/api/v1/namespaces").await.status, 200);
    env.sim.stop().await;
    let started = Instant::now();
    let r = c.get("/api/v1/namespaces/ns1/configmaps").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let s = r.json();
    assert_eq!(s["kind"], "Status");
    assert_eq!(s["reason"], "ServiceUnavailable");
    assert_eq!(s["code"], 503);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    env.sim.restart().await.unwrap();
    assert_eq!(c.get("/api/v1/namespaces").await.status, 200);
}

#[tokio::test]
async fn malformed_requests_get_answers_not_hangs() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = passthrough_env().await;
    let c = env.proxy(env.admin());
    let r = c
        .get("/api/v1/namespaces/ns1/configmaps?labelSelector=app%20in%20(a")
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "unable to parse requirement: found '', expected: ',' or ')'"
    );
    let r = c
        .send(
            Method::from_bytes(b"BREW").unwrap(),
            "/api/v1/pods",
            &[],
            None,
        )
        .await;
    assert!(
        r.status.is_client_error() || r.status.is_server_error(),
        "{}",
        r.status
    );
    // Raw garbage on a TLS connection gets an HTTP error, not a hang.
    let cfg = support::client::tls_config(&env.proxy_ca_pem, &Auth::Anonymous);
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(env.proxy_url.trim_start_matches("https://"))
        .await
        .unwrap();
    let mut tls = connector
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"NOT HTTP AT ALL\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(SOON, tls.read_to_end(&mut out))
        .await
        .unwrap()
        .ok();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
}

#[tokio::test]
async fn identities_reach_upstream_as_they_should() {
    let env = passthrough_env().await;
    env.sim.add_token(
        "tok-alice",
        kube_apiserver_sim::UserInfo {
            name: "alice".into(),
            groups: vec!["system:masters".into()],
            ..Default::default()
        },
    );
    // A bearer token goes upstream as itself, without the proxy's identity.
    let r = env
        .proxy(Auth::Token("tok-alice".into()))
        .get("/api/v1/namespaces/ns1/configmaps/none")
        .await;
    assert_eq!(r.status, 404);
    let rec = env
        .sim
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path.ends_with("/configmaps/none"))
        .unwrap();
    assert_eq!(rec.user, "alice");
    assert_eq!(rec.authenticated_user, "alice", "{rec:?}");
    assert!(!rec.impersonated);
    assert_eq!(rec.auth_method, kube_apiserver_sim::AuthMethod::Token);
    // A certificate user goes upstream impersonated, groups intact.
    let node = env.cert("system:node:node-1", Some("system:nodes"));
    env.proxy(node).get("/api/v1/nodes/node-1").await;
    let rec = env
        .sim
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path == "/api/v1/nodes/node-1")
        .unwrap();
    assert_eq!(rec.user, "system:node:node-1");
    assert!(rec.groups.contains(&"system:nodes".to_string()), "{rec:?}");
    assert!(rec.impersonated);
    assert_eq!(
        rec.authenticated_user,
        "system:serviceaccount:kube-system:kube-cache-proxy"
    );
    // Anonymous stays anonymous.
    let r = env
        .proxy(Auth::Anonymous)
        .get("/api/v1/namespaces/ns1/configmaps")
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["message"],
        "configmaps is forbidden: User \"system:anonymous\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"ns1\""
    );
}

#[tokio::test]
async fn admin_endpoints() {
    let env = Env::start().await;
    env.ready().await;
    let c = env.proxy(env.admin());
    c.get("/api/v1/namespaces/ns1/configmaps").await;
    let (status, metrics) = env.admin_get("/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("kube_cache_proxy_requests_total{code=\"200\",group=\"\",resource=\"configmaps\",scope=\"namespace\",source=\"upstream\",subresource=\"\",verb=\"LIST\"} 1"), "{metrics}");
    assert!(metrics.contains("kube_cache_proxy_request_duration_seconds_bucket"));
    assert!(metrics.contains("kube_cache_proxy_ready 1"), "{metrics}");
    let expiry = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("kube_cache_proxy_serving_certificate_expiry_timestamp_seconds ")
        })
        .unwrap();
    assert!(expiry.parse::<i64>().unwrap() > 1_700_000_000);
    assert_eq!(env.admin_get("/livez").await, (200, "ok".into()));
    assert_eq!(env.admin_get("/healthz").await, (200, "ok".into()));
    let (status, body) = env.admin_get("/readyz?verbose").await;
    assert_eq!(status, 200);
    assert!(body.contains("[+]cache:pods ok"), "{body}");
    // The admin port serves no cluster data.
    assert_eq!(env.admin_get("/api/v1/pods").await.0, 404);
}

#[tokio::test]
async fn graceful_shutdown_ends_watches_and_returns() {
    let mut env = Env::start().await;
    env.ready().await;
    let c = env.proxy(env.admin());
    let mut w = c.watch("/api/v1/pods?watch=1&resourceVersion=0", &[]).await;
    assert_eq!(w.status, 200);
    let stopped = Instant::now();
    env.stop_proxy().await.unwrap();
    assert!(stopped.elapsed() < Duration::from_secs(5));
    loop {
        match w.next(SOON).await {
            Next::Event(_) => continue,
            Next::End => break,
            other => panic!("expected a clean end, got {other:?}"),
        }
    }
    assert!(
        c.try_send(Method::GET, "/api/v1/pods", &[], None)
            .await
            .is_err()
    );
}
