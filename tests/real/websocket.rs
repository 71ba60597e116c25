//! Against a real kube-apiserver v1.36 (`kube-testenv`): watches over
//! WebSocket (`Upgrade: websocket`, as browsers and some clients send
//! them), to the apiserver directly and through the proxy, which serves
//! them from its cache: the same handshake answers (`101` with the same
//! headers, or the same refusal: `403` without a valid `Origin`, `400` for
//! a bad key, version or more than one subprotocol), the same messages
//! (one text message per JSON event, newline included), the same close
//! (status 1000, then the end of the connection), and the same
//! authentication, a bearer token in a `base64url.bearer.authorization.
//! k8s.io.` subprotocol included.
//!
//! Skipped, with one line, where no control plane is available.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::Auth;
use support::differential::normalize;
use support::raw::{Raw, RawResp, Upgrade, WS_ACCEPT, Ws, ws_headers};
use support::real::{RealEnv, metric_sum};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// A pod no node runs (deleted at once).
fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"app": name}},
           "spec": {"automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
}

/// What a WebSocket carried: its messages (text as JSON, normalized;
/// binary as bytes), its close frame, and whether the connection then
/// ended.
#[derive(Debug, PartialEq)]
struct Session {
    messages: Vec<Msg>,
    close: Option<CloseFrame>,
    ended: bool,
}

#[derive(Debug, PartialEq)]
enum Msg {
    Text(Value),
    Binary(Vec<u8>),
}

fn text(m: &Message) -> Msg {
    match m {
        Message::Text(t) => {
            assert!(
                t.as_str().ends_with('\n'),
                "an event ends with a newline: {t}"
            );
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            Msg::Text(json!({"type": v["type"], "object": normalize(&v["object"], "ws")}))
        }
        Message::Binary(b) => Msg::Binary(b.to_vec()),
        other => panic!("unexpected message {other:?}"),
    }
}

/// Reads messages until the server's close frame and the end of the
/// connection (at most `within` for each).
async fn session(ws: &mut Ws, within: Duration) -> Session {
    let mut s = Session {
        messages: Vec::new(),
        close: None,
        ended: false,
    };
    loop {
        match tokio::time::timeout(within, ws.next()).await {
            Err(_) => return s,
            Ok(None) => {
                s.ended = true;
                return s;
            }
            Ok(Some(Err(e))) => panic!("WebSocket error: {e}"),
            Ok(Some(Ok(Message::Close(frame)))) => s.close = frame,
            Ok(Some(Ok(m @ (Message::Text(_) | Message::Binary(_))))) => s.messages.push(text(&m)),
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// Headers without those only one server sends: `date` (Go's hijacked
/// connection writes none), `content-length` (Go's refusals are delimited
/// by the end of the connection, which the proxy's also are:
/// `connection: close`), and the apiserver's own request identifiers.
fn comparable(r: &RawResp) -> Vec<(String, String)> {
    let mut h: Vec<(String, String)> = r
        .headers
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "date" | "content-length" | "connection" | "audit-id" | "x-content-type-options"
            ) && !k.starts_with("x-kubernetes-pf-")
        })
        .cloned()
        .collect();
    h.sort();
    h
}

/// What is sent, by whom, where, with which header changes (`None`:
/// removed); the apiserver's status; and where the proxy's answer comes
/// from (0 cache, 1 proxy, 2 upstream).
type Case<'a> = (
    &'a str,
    &'a str,
    &'a str,
    Vec<(&'a str, Option<String>)>,
    u16,
    usize,
);

async fn sources(env: &RealEnv) -> [f64; 3] {
    let m = env.proxy_metrics().await;
    ["cache", "proxy", "upstream"]
        .map(|s| metric_sum(&m, "kube_cache_proxy_requests_total", &[("source", s)]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_watches_are_served_as_by_the_apiserver() {
    let Some(env) = RealEnv::start().await else {
        return;
    };
    let ns = env.namespace("ws-diff").await;
    for name in ["ws-0", "ws-1"] {
        env.create(&format!("/api/v1/namespaces/{ns}/pods"), pod(name))
            .await;
    }
    env.grant(
        "ws-diff-reader",
        json!({"kind": "ServiceAccount", "name": "default", "namespace": ns}),
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]),
    )
    .await;
    let token = env.token(&ns, "default", &[]).await;
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.as_bytes());
    let token_protocol = format!("base64url.bearer.authorization.k8s.io.{encoded}");
    let with_token = format!("{token_protocol}, v4.channel.k8s.io");
    let watch = format!("/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion=0&timeoutSeconds=2");
    let bad_rv = format!("/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion=abc");
    let set = |k: &'static str, v: &str| (k, Some(v.to_string()));
    let drop = |k: &'static str| (k, None::<String>);
    let cases: Vec<Case> = vec![
        ("a watch", "admin", &watch, vec![], 101, 0),
        ("no Origin", "admin", &watch, vec![drop("Origin")], 403, 0),
        (
            "Origin null",
            "admin",
            &watch,
            vec![set("Origin", "null")],
            403,
            0,
        ),
        (
            "a bad port in Origin",
            "admin",
            &watch,
            vec![set("Origin", "http://a:b")],
            403,
            0,
        ),
        (
            "an unclosed IPv6 Origin",
            "admin",
            &watch,
            vec![set("Origin", "http://[::1")],
            403,
            0,
        ),
        (
            "an opaque Origin",
            "admin",
            &watch,
            vec![set("Origin", "foo:bar")],
            101,
            0,
        ),
        (
            "no key",
            "admin",
            &watch,
            vec![drop("Sec-WebSocket-Key")],
            400,
            0,
        ),
        (
            "version 8",
            "admin",
            &watch,
            vec![set("Sec-WebSocket-Version", "8")],
            400,
            0,
        ),
        (
            "no version",
            "admin",
            &watch,
            vec![drop("Sec-WebSocket-Version")],
            400,
            0,
        ),
        (
            "one subprotocol",
            "admin",
            &watch,
            vec![set("Sec-WebSocket-Protocol", "base64.channel.k8s.io")],
            101,
            0,
        ),
        (
            "two subprotocols",
            "admin",
            &watch,
            vec![set(
                "Sec-WebSocket-Protocol",
                "base64.channel.k8s.io, v4.channel.k8s.io",
            )],
            400,
            0,
        ),
        (
            "Connection: keep-alive, Upgrade",
            "admin",
            &watch,
            vec![set("Connection", "keep-alive, Upgrade")],
            101,
            0,
        ),
        (
            "Upgrade: WebSocket",
            "admin",
            &watch,
            vec![set("Upgrade", "WebSocket")],
            101,
            0,
        ),
        // The token subprotocol authenticates only when nothing before it
        // did; it is then removed, and the other one echoed.
        (
            "a token subprotocol",
            "anonymous",
            &watch,
            vec![set("Sec-WebSocket-Protocol", &with_token)],
            101,
            0,
        ),
        (
            "a token subprotocol with a certificate",
            "admin",
            &watch,
            vec![set("Sec-WebSocket-Protocol", &with_token)],
            400,
            0,
        ),
        (
            "a token subprotocol alone",
            "anonymous",
            &watch,
            vec![set("Sec-WebSocket-Protocol", &token_protocol)],
            401,
            1,
        ),
        (
            "a rejected token subprotocol",
            "anonymous",
            &watch,
            vec![set(
                "Sec-WebSocket-Protocol",
                "base64url.bearer.authorization.k8s.io.YWJj, x",
            )],
            401,
            1,
        ),
        (
            "a token subprotocol not in base64url",
            "anonymous",
            &watch,
            vec![set(
                "Sec-WebSocket-Protocol",
                "base64url.bearer.authorization.k8s.io.@@, x",
            )],
            401,
            1,
        ),
        (
            "an empty token subprotocol",
            "anonymous",
            &watch,
            vec![set(
                "Sec-WebSocket-Protocol",
                "base64url.bearer.authorization.k8s.io., x",
            )],
            403,
            1,
        ),
        ("anonymous", "anonymous", &watch, vec![], 403, 1),
        // Errors before the watch starts are plain HTTP answers.
        ("a bad resourceVersion", "admin", &bad_rv, vec![], 500, 0),
    ];
    for (what, who, target, changes, status, source) in cases {
        let auth = if who == "admin" {
            env.admin()
        } else {
            Auth::Anonymous
        };
        let mut headers: Vec<(&str, String)> = ws_headers()
            .into_iter()
            .filter(|(k, _)| !changes.iter().any(|(c, _)| c == k))
            .map(|(k, v)| (k, v.to_string()))
            .collect();
        headers.extend(
            changes
                .iter()
                .filter_map(|(k, v)| v.clone().map(|v| (*k, v))),
        );
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let direct = Raw::new(&env.cp.url(), &env.cp.ca_pem(), auth.clone());
        let proxy = Raw::new(&env.proxy_url, &env.proxy_ca_pem, auth);
        let before = sources(&env).await;
        let (d, p) = tokio::join!(
            direct.websocket(target, &headers),
            proxy.websocket(target, &headers)
        );
        match (d, p) {
            (Upgrade::Switched(dh, mut dws), Upgrade::Switched(ph, mut pws)) => {
                assert_eq!(status, 101, "{what}: the apiserver switched protocols");
                assert_eq!(comparable(&dh), comparable(&ph), "{what}: 101 headers");
                assert_eq!(ph.header("sec-websocket-accept"), Some(WS_ACCEPT));
                let (ds, ps) = tokio::join!(
                    session(&mut dws, Duration::from_secs(10)),
                    session(&mut pws, Duration::from_secs(10))
                );
                assert_eq!(ds.messages.len(), 2, "{what}: {ds:?}");
                assert_eq!(ds, ps, "{what}: messages, close, end");
                assert_eq!(
                    ps.close.map(|c| (c.code, c.reason.to_string())),
                    Some((CloseCode::Normal, String::new()))
                );
                assert!(
                    ps.ended,
                    "{what}: the connection ends after the close frame"
                );
            }
            (Upgrade::Refused(d), Upgrade::Refused(p)) => {
                assert_eq!(
                    d.status,
                    status,
                    "{what}: the apiserver's answer: {}",
                    d.text()
                );
                assert_eq!(p.status, d.status, "{what}: status: {}", p.text());
                assert_eq!(comparable(&d), comparable(&p), "{what}: headers");
                assert_eq!(d.text(), p.text(), "{what}: body");
            }
            (d, _) => panic!(
                "{what}: one switched, one did not (direct switched: {})",
                matches!(d, Upgrade::Switched(..))
            ),
        }
        let after = sources(&env).await;
        let mut want = [0.0; 3];
        want[source] = 1.0;
        let delta: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        assert_eq!(delta, want, "{what}: answered by (cache, proxy, upstream)");
    }
}

/// A WebSocket watch to each server; the proxy's served from its cache.
async fn both(env: &RealEnv, target: &str, headers: &[(&str, &str)]) -> (Ws, Ws) {
    let direct = Raw::new(&env.cp.url(), &env.cp.ca_pem(), env.admin());
    let proxy = Raw::new(&env.proxy_url, &env.proxy_ca_pem, env.admin());
    let before = sources(env).await;
    let (d, p) = tokio::join!(
        direct.websocket(target, headers),
        proxy.websocket(target, headers)
    );
    let after = sources(env).await;
    assert_eq!(after[0] - before[0], 1.0, "{target}: served from the cache");
    (d.switched().1, p.switched().1)
}

async fn next_event(ws: &mut Ws) -> Msg {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(m @ (Message::Text(_) | Message::Binary(_))))) => return text(&m),
            Ok(Some(Ok(Message::Pong(_) | Message::Ping(_)))) => {}
            other => panic!("expected an event, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_watch_streams_changes_and_closes_as_the_apiserver() {
    let Some(env) = RealEnv::start().await else {
        return;
    };
    let ns = env.namespace("ws-live").await;
    let rv = env.current_rv().await;
    let target = format!("/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion={rv}");
    let (mut d, mut p) = both(&env, &target, &ws_headers()).await;
    let base = format!("/api/v1/namespaces/{ns}/pods");
    env.create(&base, pod("live-0")).await;
    let mut changed = pod("live-0");
    changed["metadata"]["labels"]["tier"] = json!("x");
    let patched = env
        .apiserver()
        .send(
            http::Method::PATCH,
            &format!("{base}/live-0"),
            &[("content-type", "application/merge-patch+json")],
            Some(serde_json::to_vec(&json!({"metadata": {"labels": {"tier": "x"}}})).unwrap()),
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text());
    assert_eq!(
        env.apiserver()
            .delete(&format!("{base}/live-0?gracePeriodSeconds=0"))
            .await
            .status,
        200
    );
    let mut types = Vec::new();
    while types.last().map(String::as_str) != Some("DELETED") {
        assert!(types.len() < 6, "{types:?}");
        let (de, pe) = (next_event(&mut d).await, next_event(&mut p).await);
        assert_eq!(de, pe);
        let Msg::Text(v) = pe else {
            panic!("JSON events are text")
        };
        types.push(v["type"].as_str().unwrap().to_string());
    }
    assert_eq!(types[..2], ["ADDED", "MODIFIED"]);
    // What a client sends is read and ignored; a ping gets its pong.
    for ws in [&mut d, &mut p] {
        ws.send(Message::text("ignored")).await.unwrap();
        ws.send(Message::Ping(b"hi".to_vec().into())).await.unwrap();
        let pong = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
        assert!(
            matches!(&pong, Ok(Some(Ok(Message::Pong(b)))) if &b[..] == b"hi"),
            "{pong:?}"
        );
    }
    // The client closes: the server closes too, and ends the connection.
    let normal = CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    };
    for ws in [&mut d, &mut p] {
        ws.send(Message::Close(Some(normal.clone()))).await.unwrap();
    }
    let (ds, ps) = tokio::join!(
        session(&mut d, Duration::from_secs(10)),
        session(&mut p, Duration::from_secs(10))
    );
    assert_eq!(ds, ps);
    assert_eq!(ps.close, Some(normal));
    assert!(ps.ended);

    // A watch that cannot be served in time ends with an ERROR event.
    let future = rv + 1_000_000;
    let target = format!(
        "/api/v1/namespaces/{ns}/pods?watch=1&sendInitialEvents=true&allowWatchBookmarks=true\
         &resourceVersionMatch=NotOlderThan&resourceVersion={future}"
    );
    let (mut d, mut p) = both(&env, &target, &ws_headers()).await;
    let (ds, ps) = tokio::join!(
        session(&mut d, Duration::from_secs(15)),
        session(&mut p, Duration::from_secs(15))
    );
    assert_eq!(ds.messages.len(), 1, "{ds:?}");
    assert!(
        matches!(&ds.messages[0], Msg::Text(v) if v["type"] == "ERROR"),
        "{ds:?}"
    );
    assert_eq!(ds, ps);
}
