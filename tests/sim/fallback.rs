#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `upstream.fallback` through real proxies over TLS: a node proxy whose
//! upstream is a tier proxy (in front of the simulated apiserver) and
//! whose fallback is the apiserver itself. When the tier goes away the
//! node proxy uses the apiserver, and its cache goes on; when the tier is
//! back it returns, moving its cache's watches and its clients'
//! passed-through watches back to the tier.

use crate::support;

use std::time::{Duration, Instant};

use apimachinery::pki::Ca;
use kube_apiserver_sim::{Sim, SimConfig};
use kube_cache_proxy::component::config::{FallbackConfig, IdentityMode};
use serde_json::json;
use support::env::{Running, proxy_config, tempdir};
use support::{Client, Identity, Next};

fn cm(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "f"}})
}

async fn metric(running: &Running, name: &str) -> f64 {
    let (_, text) = running.admin_get("/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The watches of configmaps `running` holds open upstream: its
/// reflector's, and any progress watch (one a second for a while after a
/// reader waited for the cache to be fresh, `progress_watch_roll_seconds`).
async fn configmap_watches(running: &Running) -> f64 {
    let (_, text) = running.admin_get("/metrics").await;
    support::real::metric_sum(
        &text,
        "kube_cache_proxy_upstream_watches",
        &[("resource", "configmaps")],
    )
}

/// Whether the apiserver serves no watch of configmaps but `tier`'s.
async fn only_the_tier_watches(sim: &Sim, tier: &Running) -> bool {
    let open = sim.stats().watches_open("configmaps");
    configmap_watches(tier).await == open as f64 && open == sim.stats().watches_open("configmaps")
}

async fn until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_proxy_falls_back_to_the_apiserver_and_returns_to_its_tier() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let gvr = support::configmaps();
    sim.create(&gvr, cm("before")).unwrap();
    // The tier, in front of the apiserver.
    let tier_dir = tempdir();
    let tier_ca = Ca::new("tier-ca").unwrap();
    let mut tier_config = proxy_config(&sim, &tier_dir, &tier_ca);
    support::cache_configmaps(&mut tier_config);
    tier_config.upstream.identity = IdentityMode::Tier;
    let tier_port = kube_testenv::free_port().unwrap();
    tier_config.listen = format!("127.0.0.1:{tier_port}");
    let mut tier = Running::start(&tier_config).await;
    tier.ready().await;
    // The node proxy: upstream the tier, fallback the apiserver, with the
    // same credential (the sim's proxy user, a client certificate).
    let dir = tempdir();
    let proxy_ca = Ca::new("node-proxy-ca").unwrap();
    let mut config = proxy_config(&sim, &dir, &proxy_ca);
    support::cache_configmaps(&mut config);
    config.upstream.connect_timeout_seconds = 1;
    let user = SimConfig::default().proxy_user;
    let cert = sim.issue_client(&user, None);
    let tier_kubeconfig = dir.join("tier.kubeconfig");
    std::fs::write(
        &tier_kubeconfig,
        apimachinery::kubeconfig::with_certificate(
            &format!("https://127.0.0.1:{tier_port}"),
            &tier_ca.cert_pem(),
            &user,
            &cert.cert_pem,
            &cert.key_pem,
        ),
    )
    .unwrap();
    config.upstream.fallback = Some(FallbackConfig {
        kubeconfig: config.upstream.kubeconfig.take().unwrap(),
        context: None,
    });
    config.upstream.kubeconfig = Some(tier_kubeconfig);
    let node_proxy = Running::start(&config).await;
    node_proxy.ready().await;
    let admin = Identity::admin().auth(&sim);
    let c = Client::new(&node_proxy.url, &proxy_ca.cert_pem(), admin, false);
    let listed = |c: Client, want: &'static str| async move {
        let r = c
            .try_send(
                http::Method::GET,
                "/api/v1/namespaces/f/configmaps?resourceVersion=0",
                &[],
                None,
            )
            .await;
        r.is_ok_and(|r| r.status == 200 && r.text().contains(want))
    };
    // Through the tier: the apiserver serves the tier's watches only.
    assert_eq!(
        metric(&node_proxy, "kube_cache_proxy_upstream_fallback_active").await,
        0.0
    );
    until(
        "the apiserver serving the tier's watches only",
        Duration::from_secs(20),
        || only_the_tier_watches(&sim, &tier),
    )
    .await;
    // A client's passed-through watch (secrets are cached nowhere), with a
    // bearer token: a tier forwards certificate users only if they are
    // nodes.
    sim.add_token(
        "agent-token",
        kube_cache_proxy::auth::UserInfo::new("admin", &["system:masters"]),
    );
    let agent = Client::new(
        &node_proxy.url,
        &proxy_ca.cert_pem(),
        support::Auth::Token("agent-token".into()),
        false,
    );
    let mut w = agent
        .watch(
            "/api/v1/namespaces/f/secrets?watch=1&resourceVersion=0",
            &[],
        )
        .await;
    assert_eq!(w.status, 200);

    // The tier goes away: the node proxy uses the apiserver; its cache goes
    // on with what changes meanwhile.
    tier.stop().await.unwrap();
    let down = Instant::now();
    sim.create(&gvr, cm("while-down")).unwrap();
    until(
        "the change made while the tier is down",
        Duration::from_secs(20),
        || listed(c.clone(), "while-down"),
    )
    .await;
    let moved_in = down.elapsed();
    assert_eq!(
        metric(&node_proxy, "kube_cache_proxy_upstream_fallback_active").await,
        1.0
    );
    // The watch through the tier broke with its connection; the client
    // watches again, now on the apiserver.
    assert!(!matches!(
        w.next(Duration::from_secs(2)).await,
        Next::Event(_)
    ));
    let mut w = agent
        .watch(
            "/api/v1/namespaces/f/secrets?watch=1&resourceVersion=0",
            &[],
        )
        .await;
    assert_eq!(w.status, 200);

    // The tier is back: the node proxy returns to it within the recheck
    // interval (10 s ± 50 %), its cache's watch and the client's watch with
    // it.
    let mut tier = Running::start(&tier_config).await;
    tier.ready().await;
    let up = Instant::now();
    until(
        "the node proxy back on the tier",
        Duration::from_secs(30),
        || async { metric(&node_proxy, "kube_cache_proxy_upstream_fallback_active").await == 0.0 },
    )
    .await;
    let back_in = up.elapsed();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match w.next(Duration::from_secs(1)).await {
            Next::End => break,
            Next::Event(_) | Next::Timeout => {
                assert!(Instant::now() < deadline, "the apiserver's watch went on");
            }
            Next::Error(e) => panic!("the apiserver's watch broke: {e}"),
        }
    }
    sim.create(&gvr, cm("after")).unwrap();
    until(
        "the change made after the return",
        Duration::from_secs(10),
        || listed(c.clone(), "after"),
    )
    .await;
    until(
        "the apiserver serving the tier's watches only",
        Duration::from_secs(10),
        || only_the_tier_watches(&sim, &tier),
    )
    .await;
    println!(
        "tier down: the node proxy's cache current again after {moved_in:?}; tier back: node \
         proxy back on it after {back_in:?}"
    );
    let _ = tier.stop().await;
}
