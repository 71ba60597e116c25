#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Connection hygiene through the real proxy over TLS: a flood of idle
//! connections from one local process cannot lock kubelet out, and one
//! client's requests cannot take every request slot.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_apiserver_sim::SimConfig;
use support::{Client, Env, Identity};
use tokio::io::AsyncReadExt;

/// A TLS connection that completes its handshake and never sends a request.
async fn idle_tls(env: &Env) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let cfg = support::client::tls_config(&env.proxy_ca_pem, &support::Auth::Anonymous);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let addr = env.proxy_url.trim_start_matches("https://").to_string();
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    connector
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .ok()
}

/// With `KCP_IDLE_FLOOD=N` (e.g. 10000, in a release build), the flood is
/// N connections against the default limits (10000 in all, 1000 per
/// client); otherwise 300 against limits of 100 and 80.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_one_process_do_not_lock_kubelet_out() {
    let flood: Option<usize> = std::env::var("KCP_IDLE_FLOOD")
        .ok()
        .and_then(|n| n.parse().ok());
    let env = Env::start_with(SimConfig::default(), |c| {
        if flood.is_none() {
            c.max_connections = 100;
            c.max_connections_per_client = 80;
        }
    })
    .await;
    env.ready().await;
    let (n, per_client) = match flood {
        Some(n) => (n, env.config.max_connections_per_client),
        None => (300, 80),
    };
    // Idle connections without credentials: far over both limits.
    let mut idle = Vec::new();
    for _ in 0..n {
        if let Some(c) = idle_tls(&env).await {
            idle.push(c);
        }
    }
    // kubelet (its node's certificate), each request on a fresh connection.
    let node = Identity::node("node-1").auth(&env.sim);
    let started = Instant::now();
    for _ in 0..20 {
        let kubelet = env.proxy(node.clone());
        let r = kubelet
            .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1&resourceVersion=0")
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let kubelet_took = started.elapsed();
    // Most of the flood was closed to make room: read EOF from each.
    let mut closed = 0;
    for mut c in idle {
        let mut b = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(20), c.read(&mut b)).await
        {
            closed += 1;
        }
    }
    assert!(
        closed >= n - per_client,
        "{closed} of the {n} idle connections were closed"
    );
    println!(
        "{n} idle connections (limits {} / {} per client): {closed} closed; 20 kubelet \
         requests on fresh connections in {kubelet_took:?}",
        env.config.max_connections, env.config.max_connections_per_client
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_requests_in_flight_are_limited_as_the_apiservers() {
    let env = Env::start_with(SimConfig::default(), |c| {
        c.max_requests_in_flight_per_client = 2;
        c.cache.not_older_than_wait_milliseconds = 2000;
        support::cache_configmaps(c);
    })
    .await;
    env.ready().await;
    let admin = Identity::admin().auth(&env.sim);
    // Two requests waiting for their response (a resourceVersion the cache
    // has not reached waits before 504).
    let slow = |c: Client| async move {
        c.get("/api/v1/namespaces/x/configmaps?resourceVersion=999999999")
            .await
    };
    let a = tokio::spawn(slow(env.proxy(admin.clone())));
    let b = tokio::spawn(slow(env.proxy(admin.clone())));
    // Both are waiting in the cache (the gauge of requests served from
    // it), not merely sent.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, text) = env.admin_get("/metrics").await;
        let waiting: f64 = text
            .lines()
            .filter(|l| l.starts_with(r#"kube_cache_proxy_requests_in_flight{source="cache"}"#))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if waiting >= 2.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{waiting} requests waiting after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The third of the same client: kube-apiserver's 429.
    let r = env
        .proxy(admin.clone())
        .get("/api/v1/namespaces/x/configmaps?resourceVersion=0")
        .await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.text(), "Too many requests, please try again later.\n");
    // Another client is not affected.
    let node = Identity::node("node-1").auth(&env.sim);
    let r = env
        .proxy(node)
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1&resourceVersion=0")
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(a.await.unwrap().status, 504);
    assert_eq!(b.await.unwrap().status, 504);
    // Once they are answered, the client is served again.
    let r = env
        .proxy(admin)
        .get("/api/v1/namespaces/x/configmaps?resourceVersion=0")
        .await;
    assert_eq!(r.status, 200);
}
