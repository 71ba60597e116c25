//! Many concurrent requests passed through to a real kube-apiserver v1.36,
//! which allows 100 concurrent HTTP/2 streams per connection: the proxy
//! opens more upstream connections as they fill (as Go's HTTP/2 transport
//! does), so 150 pass-through watches are all open at the apiserver and a
//! request made meanwhile is not queued behind them.
//!
//! Skipped, with one line, where no control plane is available.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use support::real::{RealEnv, eventually, metric_sum};

const WATCHES: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_watches_beyond_one_connections_streams_all_open_upstream() {
    let Some(env) = RealEnv::start().await else {
        return;
    };
    let ns = env.namespace("streams").await;
    // Secrets are not cached: every watch passes through.
    let path = format!("/api/v1/namespaces/{ns}/secrets?watch=1&allowWatchBookmarks=true");
    let before = metric_sum(
        &env.apiserver_metrics().await,
        "apiserver_longrunning_requests",
        &[("verb", "WATCH"), ("resource", "secrets")],
    );
    let mut watches = Vec::new();
    for _ in 0..WATCHES {
        let client = env.proxy(env.admin());
        watches.push(client.watch(&path, &[]).await);
    }
    eventually(
        Duration::from_secs(30),
        "every pass-through watch open at the apiserver",
        || {
            let env = &env;
            async move {
                let now = metric_sum(
                    &env.apiserver_metrics().await,
                    "apiserver_longrunning_requests",
                    &[("verb", "WATCH"), ("resource", "secrets")],
                );
                (now - before >= WATCHES as f64).then_some(())
            }
        },
    )
    .await;
    // A request meanwhile is answered at once.
    let started = Instant::now();
    let r = env
        .proxy(env.admin())
        .get(&format!("/api/v1/namespaces/{ns}/secrets"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    println!(
        "{WATCHES} pass-through watches open at the apiserver; a list meanwhile in {:?}",
        started.elapsed()
    );
    drop(watches);
}
