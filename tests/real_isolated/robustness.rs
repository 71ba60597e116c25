//! The short robustness run (`crates/robustness`, docs/reliability.md), in
//! CI: a highly available control plane (three kube-apiservers on a
//! three-member etcd cluster, behind HAProxy where it is installed), two
//! tier replicas and four node proxies of this build on the shipped
//! configurations, hollow kubelets, recording watchers of every kind,
//! steady writes, and every kind of fault at least once (the control
//! plane's: an apiserver killed, stopped or lagging, the etcd leader
//! killed, a rolling restart, a rolling upgrade to the other minor version,
//! etcd restored with and without the revision bumped; and the proxies'),
//! from a fixed seed; every watch stream is validated against etcd's own
//! history, epoch by epoch across restores. The long run is the same with
//! `kcp-robustness --duration 2400` (README.md, docs/reliability.md).
//!
//! Skipped, with one line, where no control plane is available.

use std::path::Path;

use kcp_robustness::faults::FaultKind;
use kcp_robustness::run::{Options, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_robustness_run_finds_no_anomaly() {
    // It starts its own control plane, and its proxies' processes.
    let _alone = crate::support::real::Isolated::alone().await;
    match kube_testenv::Assets::locate() {
        Err(e @ kube_testenv::AssetsError::Absent { .. }) => {
            kube_testenv::skip::skip(format!("no real control plane: {e}"));
            return;
        }
        r => {
            r.unwrap();
        }
    }
    let opts = Options::short(Path::new(env!("CARGO_BIN_EXE_kube-cache-proxy")));
    let report = run(&opts).await.unwrap();
    let text = report.text();
    println!("{text}");
    assert!(report.clean(), "{text}");
    // Every kind at least once: a kind this machine cannot inject (an
    // etcd of one member, no other minor version at hand, no root to
    // mount the small snapshot directory) is a test that cannot run here
    // (kube_testenv::skip): it fails under KUBE_CACHE_PROXY_REQUIRE_ALL.
    for kind in FaultKind::ALL {
        if report.faults.by_kind.get(&kind).copied().unwrap_or(0) > 0 {
            continue;
        }
        let why: Vec<&String> = report
            .faults
            .skipped
            .keys()
            .filter(|k| k.starts_with(kind.as_str()))
            .collect();
        assert!(!why.is_empty(), "{kind} was never injected\n{text}");
        kube_testenv::skip::skip(format!("the fault {kind}: {why:?}"));
    }
    assert!(report.events > 1000, "{text}");
    let _ = std::fs::remove_dir_all(&report.dir);
}
