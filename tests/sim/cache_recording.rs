#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Replays every case of the recording of a real kube-apiserver v1.36
//! through the proxy (cache, authorization and pass-through) in front of
//! the simulated apiserver, and compares each answer with the recorded one
//! (see `support/recording.rs`). Then checks that the cases a watch cache
//! can answer were answered by the cache, and only those passed through.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube_apiserver_sim::SimConfig;
use serde_json::Value;
use support::recording::{FIXTURE, Replay, RvMap};
use support::{Env, Identity};

/// Sum of `kube_cache_proxy_requests_total` by source.
async fn requests_by_source(env: &Env) -> BTreeMap<String, f64> {
    let (_, text) = env.admin_get("/metrics").await;
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("kube_cache_proxy_requests_total{"))
    {
        let source = line
            .split(",source=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap();
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        *out.entry(source.to_string()).or_default() += value;
    }
    out
}

/// The cases answered without upstream reading them: served from the cache,
/// or refused by the proxy itself after authorization. (`watch-rv-too-old`
/// is not: a watch older than the cache's history passes through, and
/// upstream answers its 410.)
const FROM_CACHE: &[&str] = &[
    "list-configmaps-ns",
    "list-configmaps-rv0",
    "list-pods-all-namespaces-fieldselector-node",
    "list-configmaps-labelselector",
    "list-configmaps-labelselector-set",
    "list-configmaps-limit-1",
    "list-configmaps-continue",
    "list-continue-with-rv-is-400",
    "list-rv-not-a-number",
    "list-rvmatch-notolderthan-without-rv",
    "list-rvmatch-exact-rv0",
    "list-rvmatch-bogus",
    "list-rv-too-large",
    "list-fieldselector-unsupported",
    "list-fieldselector-malformed",
    "list-labelselector-malformed",
    "list-pods-fieldselector-status-phase",
    "list-limit-negative",
    "list-nodes-cluster-scoped",
    "list-configmaps-accept-protobuf-or-json",
    // A consistent get (resourceVersion unset) always passes through, as the
    // apiserver reads it from etcd: get-configmap, get-configmap-missing,
    // node-get-configmap-unrelated.
    "get-configmap-rv0",
    "unauthenticated-list",
    "node-list-pods-own-node",
    "node-list-pods-other-node",
    "node-list-pods-all",
    "watch-configmaps-rv0",
    "watch-configmaps-from-list-rv-with-changes",
    "watch-configmaps-labelselector-transitions",
    "watch-rv-not-a-number",
    "watch-send-initial-events",
    "watch-send-initial-events-without-bookmarks",
    "watch-timeout-seconds-2",
    "watch-unset-rv-gets-state",
    "watch-pods-node-fieldselector",
    "watch-legacy-path",
    "watch-single-object-by-name",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_every_recorded_case_through_the_proxy() {
    let rec: Value = serde_json::from_str(FIXTURE).unwrap();
    let sim_config = SimConfig {
        too_large_rv_wait: Duration::from_millis(300),
        ..SimConfig::default()
    };
    let env = Env::start_with(sim_config, |c| {
        support::cache_configmaps(c);
        // The recorded 504 after 3 s, sooner.
        c.cache.not_older_than_wait_milliseconds = 300;
        // Quiet resources become fresh through a progress watch (about a
        // second); let consistent lists wait for it so they are served
        // from the cache here.
        c.cache.consistent_list_wait_milliseconds = 3000;
    })
    .await;
    env.ready().await;
    let mut clients = BTreeMap::new();
    clients.insert("admin", env.proxy(Identity::admin().auth(&env.sim)));
    clients.insert("node-1", env.proxy(Identity::node("node-1").auth(&env.sim)));
    clients.insert("anonymous", env.proxy(Identity::Anonymous.auth(&env.sim)));
    let mut replay = Replay {
        sim: &env.sim,
        clients,
        rv: RvMap::default(),
        namespace: rec["meta"]["namespace"].as_str().unwrap().to_string(),
        continue_token: None,
        list_rvs: BTreeMap::new(),
        json_only: false,
    };
    replay.seed(&rec);
    let mut served_by_cache = BTreeSet::new();
    for case in rec["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        replay.before(name, &rec);
        let before = requests_by_source(&env).await;
        replay.replay(case).await;
        let after = requests_by_source(&env).await;
        let delta =
            |s: &str| after.get(s).copied().unwrap_or(0.0) - before.get(s).copied().unwrap_or(0.0);
        // Writes the watch cases make pass through; what matters is the
        // case's own request.
        if delta("cache") + delta("proxy") >= 1.0
            && (delta("upstream") < 1.0 || name.starts_with("watch-"))
        {
            served_by_cache.insert(name.to_string());
        }
    }
    let expected: BTreeSet<String> = FROM_CACHE.iter().map(|s| s.to_string()).collect();
    assert_eq!(served_by_cache, expected, "cases answered without upstream");
}
