#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Replays every case of the recording of a real kube-apiserver v1.36
//! against the simulated apiserver directly; see `support/recording.rs`.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube_apiserver_sim::{Sim, SimConfig};
use serde_json::Value;
use support::recording::{FIXTURE, Replay, RvMap};
use support::{Client, Identity};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_every_recorded_case() {
    let rec: Value = serde_json::from_str(FIXTURE).unwrap();
    let config = SimConfig {
        // The apiserver waits 3 s; the answer is the same after 300 ms.
        too_large_rv_wait: Duration::from_millis(300),
        ..SimConfig::default()
    };
    let sim = Sim::start(config).await.unwrap();
    let mut clients = BTreeMap::new();
    clients.insert("admin", Client::sim(&sim, Identity::admin()));
    clients.insert("node-1", Client::sim(&sim, Identity::node("node-1")));
    clients.insert("anonymous", Client::sim(&sim, Identity::Anonymous));
    let mut replay = Replay {
        sim: &sim,
        clients,
        rv: RvMap::default(),
        namespace: rec["meta"]["namespace"].as_str().unwrap().to_string(),
        continue_token: None,
        list_rvs: BTreeMap::new(),
        json_only: true,
    };
    replay.seed(&rec);
    let cases = rec["cases"].as_array().unwrap();
    assert!(cases.len() >= 48, "every case is replayed");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        replay.before(name, &rec);
        replay.replay(case).await;
    }
    // Every case reached the sim once, plus the writes the watches saw.
    let requests = replay.sim.requests();
    assert_eq!(requests.len(), cases.len() + 5);
    // Every recorded object RV found its sim counterpart.
    assert_eq!(replay.rv.pairs.len(), 13, "{:?}", replay.rv.pairs);
}
