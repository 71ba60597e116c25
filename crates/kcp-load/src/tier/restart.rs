//! The relist storm: the apiserver restarted under the simulated nodes;
//! the LISTs it serves, and the time until every watch is open again and
//! until a change made then reaches every node.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use kube_testenv::ControlPlane;

use super::args::TierArgs;
use super::nodes::{Shared, WatchSpec};
use super::report::{RestartReport, counter, scrape};
use super::seed::patch;
use crate::client::Target;

/// Restarts the apiserver and measures the recovery.
pub async fn relist_storm(
    a: &TierArgs,
    cp: &Arc<ControlPlane>,
    admin: &Target,
    shared: &Arc<Shared>,
    nodes: &[Vec<Arc<WatchSpec>>],
    total: usize,
    (calibration_lists, calibration_cpu): (f64, f64),
) -> Result<RestartReport> {
    let lists0 = shared.lists.load(Ordering::Relaxed);
    let relists0 = shared.relists.load(Ordering::Relaxed);
    let t = Instant::now();
    let restart = {
        let cp = cp.clone();
        tokio::spawn(async move {
            cp.restart_apiserver(Duration::from_secs(10), Duration::from_millis(500))
                .await
        })
    };
    let deadline = t + Duration::from_secs(a.recovery_timeout);
    let mut min_open = total;
    let mut broke = false;
    let mut watches_back = None;
    let mut apiserver_ready = None;
    let mut marker: Option<(u64, Instant)> = None;
    let mut marker_everywhere = None;
    let mut restart = Some(restart);
    while Instant::now() < deadline {
        let open = shared.open.load(Ordering::Relaxed);
        min_open = min_open.min(open);
        if open < total {
            broke = true;
            watches_back = None;
        } else if broke && watches_back.is_none() {
            watches_back = Some(t.elapsed());
        }
        if restart.as_ref().is_some_and(|r| r.is_finished())
            && let Some(r) = restart.take()
        {
            r.await?
                .map_err(|e| anyhow!("restarting the apiserver: {e}"))?;
            apiserver_ready = Some(t.elapsed());
            let rv = patch(admin, "services", 0, 1_000_000).await?;
            marker = Some((rv, Instant::now()));
        }
        if let Some((rv, at)) = marker
            && marker_everywhere.is_none()
            && nodes.iter().all(|w| w[2].rv.load(Ordering::Relaxed) >= rv)
        {
            marker_everywhere = Some(at.elapsed());
        }
        if apiserver_ready.is_some()
            && marker_everywhere.is_some()
            && (watches_back.is_some() || !broke)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(r) = restart {
        r.abort();
        bail!(
            "the apiserver did not restart within {}s",
            a.recovery_timeout
        );
    }
    // What the tier relisted, and what the nodes did, settles within a
    // few seconds more.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let m = scrape(admin).await?;
    Ok(RestartReport {
        lists: counter(&m, "apiserver_request_total", &[("verb", "LIST")]) - calibration_lists,
        node_lists: shared.lists.load(Ordering::Relaxed) - lists0,
        node_relists: shared.relists.load(Ordering::Relaxed) - relists0,
        apiserver_ready: apiserver_ready.unwrap_or_default(),
        broke,
        watches_back,
        min_open,
        marker_everywhere,
        apiserver_cpu_seconds: counter(&m, "process_cpu_seconds_total", &[]) - calibration_cpu,
    })
}
