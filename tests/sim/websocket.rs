#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Watches over WebSocket served from the cache, through the real proxy
//! over TLS in front of the simulated apiserver: the handshake and its
//! refusals, one text message per event, the close when the watch ends
//! (its timeout, or the proxy stopping), authorization as for any cached
//! watch, and a bearer token carried in a subprotocol. Nothing of it
//! reaches the apiserver but the token and access reviews.
//! (`tests/real/websocket.rs` compares all of it with a real
//! kube-apiserver.)

use crate::support;

use std::time::Duration;

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use kube_apiserver_sim::{Rule, SimConfig, Subject, UserInfo};
use serde_json::{Value, json};
use support::raw::{Raw, Upgrade, WS_ACCEPT, Ws, ws_headers};
use support::{Auth, Env, Identity, QUIET, SOON};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

fn cm(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": {"k": name}})
}

async fn env() -> Env {
    let env = Env::start_with(SimConfig::default(), support::cache_configmaps).await;
    env.ready().await;
    env
}

fn raw(env: &Env, auth: Auth) -> Raw {
    Raw::new(&env.proxy_url, &env.proxy_ca_pem, auth)
}

/// The next message, which must be a JSON event.
async fn event(ws: &mut Ws) -> Value {
    match tokio::time::timeout(SOON, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => {
            assert!(t.as_str().ends_with('\n'), "one event per message: {t}");
            assert_eq!(t.as_str().matches('\n').count(), 1, "one event per message");
            serde_json::from_str(t.as_str()).unwrap()
        }
        other => panic!("expected a text message, got {other:?}"),
    }
}

/// The server's close frame (status 1000), then the end of the
/// connection.
async fn closed(ws: &mut Ws, within: Duration) {
    match tokio::time::timeout(within, ws.next()).await {
        Ok(Some(Ok(Message::Close(Some(frame))))) => {
            assert_eq!(frame.code, CloseCode::Normal);
            assert_eq!(frame.reason.as_str(), "");
        }
        other => panic!("expected a close frame, got {other:?}"),
    }
    match tokio::time::timeout(SOON, ws.next()).await {
        Ok(None) => {}
        other => panic!("expected the end of the connection, got {other:?}"),
    }
}

#[tokio::test]
async fn a_websocket_watch_is_served_from_the_cache() {
    let env = env().await;
    let cms = support::configmaps();
    env.sim.create(&cms, cm("ws", "a")).unwrap();
    let before = env.sim.stats();
    let admin = raw(&env, env.admin());
    let (head, mut ws) = admin
        .websocket(
            "/api/v1/namespaces/ws/configmaps?watch=1&resourceVersion=0&timeoutSeconds=3",
            &ws_headers(),
        )
        .await
        .switched();
    assert_eq!(head.status, 101);
    assert_eq!(head.header("upgrade"), Some("websocket"));
    assert_eq!(head.header("connection"), Some("Upgrade"));
    assert_eq!(head.header("sec-websocket-accept"), Some(WS_ACCEPT));
    assert_eq!(head.header("sec-websocket-protocol"), None);
    assert_eq!(head.header("content-type"), None);
    let added = event(&mut ws).await;
    assert_eq!(
        (
            added["type"].as_str(),
            added["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("a"))
    );
    // Changes arrive as they happen, one message each.
    env.sim.create(&cms, cm("ws", "b")).unwrap();
    env.sim.delete(&cms, "ws", "a").unwrap();
    let (b, a) = (event(&mut ws).await, event(&mut ws).await);
    assert_eq!(
        (b["type"].as_str(), b["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("b"))
    );
    assert_eq!(a["type"], "DELETED");
    // Client messages are ignored; pings answered.
    ws.send(Message::text("ignored")).await.unwrap();
    ws.send(Message::Ping(b"p".to_vec().into())).await.unwrap();
    match tokio::time::timeout(SOON, ws.next()).await {
        Ok(Some(Ok(Message::Pong(p)))) => assert_eq!(&p[..], b"p"),
        other => panic!("expected a pong, got {other:?}"),
    }
    // timeoutSeconds ends the watch: close 1000, end of connection.
    closed(&mut ws, Duration::from_secs(5)).await;
    let after = env.sim.stats();
    assert_eq!(
        after.watches("configmaps"),
        before.watches("configmaps"),
        "no watch went upstream"
    );
}

#[tokio::test]
async fn handshake_refusals_close_the_connection() {
    let env = env().await;
    let admin = raw(&env, env.admin());
    let target = "/api/v1/namespaces/ws/configmaps?watch=1&resourceVersion=0";
    let without = |name: &str| -> Vec<(&'static str, &'static str)> {
        ws_headers()
            .into_iter()
            .filter(|(k, _)| *k != name)
            .collect()
    };
    let with = |name: &'static str, value: &'static str| {
        let mut h = without(name);
        h.push((name, value));
        h
    };
    for (headers, status, body) in [
        (without("Origin"), 403, ""),
        (with("Origin", "null"), 403, ""),
        (
            without("Sec-WebSocket-Key"),
            400,
            "mismatch challenge/response",
        ),
        (
            with("Sec-WebSocket-Version", "8"),
            400,
            "missing or bad WebSocket Version",
        ),
        (with("Sec-WebSocket-Protocol", "a, b"), 400, ""),
    ] {
        let r = admin.websocket(target, &headers).await.refused();
        assert_eq!((r.status, r.text().as_str()), (status, body), "{headers:?}");
        assert_eq!(r.header("connection"), Some("close"), "{headers:?}");
        assert_eq!(r.header("content-type"), None, "{headers:?}");
    }
    // A subprotocol is echoed, whatever it is.
    let (head, _ws) = admin
        .websocket(target, &with("Sec-WebSocket-Protocol", "v4.channel.k8s.io"))
        .await
        .switched();
    assert_eq!(
        head.header("sec-websocket-protocol"),
        Some("v4.channel.k8s.io")
    );
    // Gets and lists ignore the upgrade, as the apiserver's handlers do.
    let r = admin
        .websocket(
            "/api/v1/namespaces/ws/configmaps?resourceVersion=0",
            &ws_headers(),
        )
        .await
        .refused();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["kind"], "ConfigMapList");
}

#[tokio::test]
async fn websocket_watches_are_authorized_and_may_carry_their_token() {
    let env = env().await;
    env.sim
        .add_token("wanda-token", UserInfo::new("wanda", &[]));
    env.sim.policy().grant(
        Subject::User("wanda".into()),
        Rule::new(&["watch"], &[""], &["configmaps"]).in_namespaces(&["ws"]),
    );
    let protocol = format!(
        "base64url.bearer.authorization.k8s.io.{}, base64.channel.k8s.io",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("wanda-token")
    );
    let mut headers = ws_headers();
    headers.push(("Sec-WebSocket-Protocol", &protocol));
    let anonymous = raw(&env, Auth::Anonymous);
    // The token subprotocol authenticates wanda, and is not echoed.
    let (head, mut ws) = anonymous
        .websocket(
            "/api/v1/namespaces/ws/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1",
            &headers,
        )
        .await
        .switched();
    assert_eq!(
        head.header("sec-websocket-protocol"),
        Some("base64.channel.k8s.io")
    );
    closed(&mut ws, Duration::from_secs(5)).await;
    // Elsewhere wanda may not watch: the apiserver's 403, before any
    // upgrade.
    let r = anonymous
        .websocket("/api/v1/namespaces/other/configmaps?watch=1", &headers)
        .await
        .refused();
    assert_eq!(r.status, 403);
    assert!(
        r.text().contains(r#"User \"wanda\" cannot watch"#),
        "{}",
        r.text()
    );
    // An unknown token is 401; a token alone (no other subprotocol) too.
    let mut bad = ws_headers();
    bad.push((
        "Sec-WebSocket-Protocol",
        "base64url.bearer.authorization.k8s.io.bm9wZQ, x",
    ));
    let r = anonymous
        .websocket("/api/v1/namespaces/ws/configmaps?watch=1", &bad)
        .await
        .refused();
    assert_eq!(
        (r.status, r.json()["reason"].as_str()),
        (401, Some("Unauthorized"))
    );
    // Anonymous without a token: forbidden, as any cached watch.
    let r = anonymous
        .websocket("/api/v1/namespaces/ws/configmaps?watch=1", &ws_headers())
        .await
        .refused();
    assert_eq!(r.status, 403);
    // A node may watch what the Node authorizer lets it.
    let node = raw(&env, Identity::node("node-1").auth(&env.sim));
    let r = node
        .websocket("/api/v1/namespaces/ws/configmaps?watch=1", &ws_headers())
        .await;
    assert!(matches!(r, Upgrade::Refused(ref r) if r.status == 403));
}

#[tokio::test]
async fn stopping_the_proxy_closes_websocket_watches() {
    let mut env = env().await;
    let admin = raw(&env, env.admin());
    let (_, mut ws) = admin
        .websocket(
            "/api/v1/namespaces/ws/configmaps?watch=1&resourceVersion=0",
            &ws_headers(),
        )
        .await
        .switched();
    // Nothing yet: the watch is open.
    assert!(tokio::time::timeout(QUIET, ws.next()).await.is_err());
    env.stop_proxy().await.unwrap();
    closed(&mut ws, Duration::from_secs(5)).await;
}
