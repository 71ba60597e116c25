//! One mode's figures (`TierReport`, `RestartReport`): the apiserver's
//! counters read from its `/metrics`, printed, and as a row of the table.

use std::time::Duration;

use anyhow::{Result, bail};
use http::{Method, StatusCode};

use crate::client::{Proto, Target};
use crate::metrics::{self, Sample};
use crate::stats::mib;

/// One mode's figures.
#[derive(Debug, Clone, Default)]
pub struct TierReport {
    pub mode: String,
    pub nodes: usize,
    pub watches_per_node: usize,
    /// Time for every node's watches to open.
    pub started_in: Duration,
    /// LISTs the apiserver served while the nodes started.
    pub start_lists: f64,
    /// The apiserver's open watches during the steady phase, and before
    /// the tier and the nodes started (its own).
    pub apiserver_watches: f64,
    pub apiserver_watches_before: f64,
    pub apiserver_cpu_cores: f64,
    pub apiserver_rss: u64,
    pub watch_events_sent: f64,
    pub watch_bytes_sent: f64,
    pub steady_seconds: f64,
    pub writes: u64,
    /// Events the simulated nodes received (bookmarks apart).
    pub node_events: u64,
    /// From a Service or EndpointSlice patch's sending to its event at
    /// each node, over the steady phase.
    pub delivery: crate::stats::Summary,
    /// Per tier replica: CPU (cores) and RSS over the steady phase.
    pub tier: Vec<(f64, u64)>,
    /// Relist storm.
    pub restart: Option<RestartReport>,
}

/// The relist storm's figures.
#[derive(Debug, Clone, Default)]
pub struct RestartReport {
    /// LISTs the restarted apiserver served, less those of a restart with
    /// no client.
    pub lists: f64,
    /// Of which the simulated nodes' own (counted by them).
    pub node_lists: u64,
    /// Node watches that got `410 Gone` and relisted.
    pub node_relists: u64,
    /// From the restart's start (SIGTERM) to the apiserver's readiness.
    pub apiserver_ready: Duration,
    /// Whether any simulated watch broke.
    pub broke: bool,
    /// From the restart's start until every simulated watch was open
    /// again (`None`: not within the timeout, or none broke).
    pub watches_back: Option<Duration>,
    /// Lowest number of open simulated watches seen meanwhile.
    pub min_open: usize,
    /// From the apiserver's readiness until a Service patch made then
    /// reached every node.
    pub marker_everywhere: Option<Duration>,
    /// The restarted apiserver's CPU seconds by then, less those of a
    /// restart with no client.
    pub apiserver_cpu_seconds: f64,
}

/// One row of the summary table.
pub fn table_row(r: &TierReport) -> String {
    let per_s = |v: f64| v / r.steady_seconds.max(1e-9);
    let back = |s: &RestartReport| match (s.broke, s.watches_back) {
        (false, _) => "none broke".to_string(),
        (true, Some(d)) => format!("{:.1} s", d.saturating_sub(s.apiserver_ready).as_secs_f64()),
        (true, None) => "not within the timeout".into(),
    };
    let (lists, back, everywhere) = match &r.restart {
        Some(s) => (
            format!("{:.0} ({} by nodes)", s.lists, s.node_lists),
            back(s),
            s.marker_everywhere
                .map(|d| format!("{:.1} s", d.as_secs_f64()))
                .unwrap_or_else(|| "not within the timeout".into()),
        ),
        None => ("—".into(), "—".into(), "—".into()),
    };
    let tier = if r.tier.is_empty() {
        "—".to_string()
    } else {
        r.tier
            .iter()
            .map(|(c, m)| format!("{c:.3} / {:.0} MiB", *m as f64 / 1048576.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "| {} | {} | {:.0} ({:.0}) | {:.3} | {:.0} MiB | {:.0} | {:.2} | {lists} | {back} | {everywhere} | {tier} |",
        r.mode,
        r.nodes,
        r.apiserver_watches,
        r.apiserver_watches_before,
        r.apiserver_cpu_cores,
        r.apiserver_rss as f64 / 1048576.0,
        per_s(r.watch_events_sent),
        per_s(r.watch_bytes_sent) / 1e6,
    )
}

pub fn print_report(r: &TierReport) {
    println!(
        "{}: N={} ({} watches each): all open in {:.1}s ({:.0} LISTs); steady {:.0}s, {} writes: \
         apiserver {:.0} watches ({:.0} before the nodes), {:.3} cores, RSS {}, sent {:.0} watch events ({:.1} MB); nodes \
         received {} events",
        r.mode,
        r.nodes,
        r.watches_per_node,
        r.started_in.as_secs_f64(),
        r.start_lists,
        r.steady_seconds,
        r.writes,
        r.apiserver_watches,
        r.apiserver_watches_before,
        r.apiserver_cpu_cores,
        mib(r.apiserver_rss),
        r.watch_events_sent,
        r.watch_bytes_sent / 1e6,
        r.node_events,
    );
    println!(
        "  delivery of Service and EndpointSlice patches to the nodes (from the patch's sending): {}",
        r.delivery
    );
    for (i, (cpu, rss)) in r.tier.iter().enumerate() {
        println!("  tier replica {i}: {cpu:.3} cores, RSS {}", mib(*rss));
    }
    if let Some(s) = &r.restart {
        println!(
            "  restart: apiserver ready after {:.1}s; {:.0} LISTs ({} by the nodes, {} relists on \
             410); watches (lowest {} open) all back after {}; a change after the restart \
             everywhere after {}; apiserver CPU {:.1}s",
            s.apiserver_ready.as_secs_f64(),
            s.lists,
            s.node_lists,
            s.node_relists,
            s.min_open,
            match (s.broke, s.watches_back) {
                (false, _) => "(none broke)".to_string(),
                (true, Some(d)) => format!("{:.1}s", d.as_secs_f64()),
                (true, None) => "(not within the timeout)".into(),
            },
            s.marker_everywhere
                .map(|d| format!("{:.1}s", d.as_secs_f64()))
                .unwrap_or_else(|| "(not within the timeout)".into()),
            s.apiserver_cpu_seconds,
        );
    }
}

pub async fn scrape(target: &Target) -> Result<Vec<Sample>> {
    let mut conn = target.connect(Proto::H1).await?;
    let r = target
        .fetch(&mut conn, Method::GET, "/metrics", None)
        .await?;
    if r.status != StatusCode::OK {
        bail!("GET /metrics: {}", r.status);
    }
    Ok(metrics::parse(&String::from_utf8_lossy(&r.body)))
}

/// The sum of `name`'s series whose labels match `labels`.
pub fn counter(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == *v))
        .map(|s| s.value)
        .sum()
}

pub fn growth(before: &[Sample], after: &[Sample], name: &str, verb: &str) -> f64 {
    counter(after, name, &[("verb", verb)]) - counter(before, name, &[("verb", verb)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows() {
        let r = TierReport {
            mode: "tier".into(),
            nodes: 100,
            apiserver_watches: 40.0,
            apiserver_watches_before: 7.0,
            apiserver_cpu_cores: 0.05,
            apiserver_rss: 300 << 20,
            watch_events_sent: 600.0,
            watch_bytes_sent: 3e6,
            steady_seconds: 60.0,
            tier: vec![(0.1, 50 << 20)],
            restart: Some(RestartReport {
                lists: 33.0,
                node_lists: 0,
                watches_back: None,
                marker_everywhere: Some(Duration::from_millis(1500)),
                ..RestartReport::default()
            }),
            ..TierReport::default()
        };
        assert_eq!(
            table_row(&r),
            "| tier | 100 | 40 (7) | 0.050 | 300 MiB | 10 | 0.05 | 33 (0 by nodes) | none broke | 1.5 s | 0.100 / 50 MiB |"
        );
    }
}
