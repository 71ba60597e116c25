//! One run's figures (`Report`), how fast Service changes reached every
//! agent (`Reach`), the tables with their ratios against direct, and the
//! results file the runs append to.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::stats::{Summary, mib, micros};
use crate::tier::nodes::Arrival;

/// One run: a topology at N nodes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    pub topology: String,
    /// What differs from the shipped configurations ("" when nothing).
    pub variant: String,
    pub nodes: usize,
    /// Nodes behind a real node proxy, and behind a simulated one.
    pub real_proxies: usize,
    pub simulated_proxies: usize,
    pub replicas: usize,
    /// Seconds since the Unix epoch at the run's start, and the load
    /// average then (the machine is shared).
    pub unix_time: u64,
    pub load_average: String,
    /// Why the run stopped, if it did not finish.
    pub error: Option<String>,
    /// Watches this tool opened (agents, simulated node proxies), and how
    /// long until all were open.
    pub watches_opened: usize,
    pub started_in_s: f64,
    pub steady_s: f64,
    pub writes: u64,
    pub apiserver: Apiserver,
    /// How fast Service changes reached every watch of a group.
    pub reach: Vec<Reach>,
    pub node_proxies: Option<NodeProxies>,
    /// Per tier replica: CPU (cores) and RSS (bytes).
    pub tier: Vec<(f64, u64)>,
    /// The tier's requests per second by verb, resource and source, and
    /// what else it did (as [`NodeProxies::diagnostics`]), all replicas
    /// together.
    pub tier_requests: Vec<(String, f64)>,
    pub tier_diagnostics: Vec<(String, f64)>,
    /// This tool's own CPU (cores) during the steady phase.
    pub tool_cpu_cores: f64,
    /// Requests of this tool that failed (and were retried) since the start.
    pub failures: u64,
    /// Watches of this tool that ended without an error and resumed,
    /// during the steady phase, and how long they had lived (p50, max).
    pub resumes: u64,
    pub resumed_after_ms: [f64; 2],
    /// This tool's requests that failed while the nodes started, by status.
    pub start_failures: String,
    /// The log agents' GETs during the steady phase, and their latency.
    pub gets: u64,
    pub get_p50_ms: f64,
    pub get_p99_ms: f64,
}

/// The apiserver during the steady phase, from its `/metrics`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Apiserver {
    /// Open watches at the end, and before anything of the run started
    /// (its own).
    pub watches: f64,
    pub watches_before: f64,
    pub cpu_cores: f64,
    pub rss_bytes: u64,
    pub events_per_s: f64,
    pub bytes_per_s: f64,
    /// The largest shares of the events and bytes, by resource.
    pub events_by_resource: Vec<(String, f64)>,
    pub bytes_by_resource: Vec<(String, f64)>,
    /// Requests per second by verb and resource (the most), and the
    /// reviews among them.
    pub requests: Vec<(String, f64)>,
    /// Open watches at the end by resource.
    pub watches_by_resource: Vec<(String, f64)>,
    pub token_reviews_per_s: f64,
    pub access_reviews_per_s: f64,
}

/// The real node proxies during the steady phase.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeProxies {
    pub count: usize,
    /// Per node proxy: CPU (cores) mean and max, RSS mean and max at the
    /// end, and the largest peak RSS (`VmHWM`) of any.
    pub cpu_mean: f64,
    pub cpu_max: f64,
    pub rss_mean: u64,
    pub rss_max: u64,
    pub peak_rss_max: u64,
    /// Their clients' requests per second by verb, resource and how they
    /// were served (`kube_cache_proxy_requests_total`: `cache`,
    /// `upstream`), all proxies together, counted when they end.
    pub requests: Vec<(String, f64)>,
    /// The upstream watches their caches hold, all proxies together
    /// (`kube_cache_proxy_upstream_watches`).
    pub upstream_watches: f64,
    /// What else they did, per second: their clients' watches they ended
    /// by reason, their upstream watches restarted, their
    /// authentications and authorizations by result and source.
    pub diagnostics: Vec<(String, f64)>,
}

/// How fast each Service change reached every watch of a group: per
/// change, from its patch's sending to its event's arrival at the last
/// watch of the group.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Reach {
    pub group: String,
    /// Watches of Services in the group.
    pub watches: usize,
    /// Service changes made, and those that reached every watch.
    pub changes: usize,
    pub everywhere: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Over every single arrival instead (a change at one watch).
    pub arrival_p50_ms: f64,
    pub arrival_p99_ms: f64,
}

/// [`Reach`] of the group of watches `members` (their tracked indexes),
/// over the Service changes `changes` (resourceVersion and sending time).
pub fn reach(
    group: &str,
    members: &[u32],
    changes: &[(u64, Instant)],
    arrivals: &[Arrival],
) -> Reach {
    let wanted: std::collections::HashSet<u32> = members.iter().copied().collect();
    let mut by_rv: HashMap<u64, Vec<&Arrival>> = HashMap::new();
    for a in arrivals.iter().filter(|a| wanted.contains(&a.watch)) {
        by_rv.entry(a.rv).or_default().push(a);
    }
    let mut everywhere = Vec::new();
    let mut each = Vec::new();
    for (rv, sent) in changes {
        let Some(got) = by_rv.get(rv) else { continue };
        let mut seen = std::collections::HashSet::new();
        let mut last = *sent;
        for a in got {
            if seen.insert(a.watch) {
                each.push(micros(a.at.saturating_duration_since(*sent)));
                last = last.max(a.at);
            }
        }
        if seen.len() == wanted.len() {
            everywhere.push(micros(last.saturating_duration_since(*sent)));
        }
    }
    let ms = |us: u64| us as f64 / 1000.0;
    let e = Summary::of(&mut everywhere);
    let a = Summary::of(&mut each);
    Reach {
        group: group.to_string(),
        watches: wanted.len(),
        changes: changes.len(),
        everywhere: e.count,
        p50_ms: ms(e.p50),
        p99_ms: ms(e.p99),
        max_ms: ms(e.max),
        arrival_p50_ms: ms(a.p50),
        arrival_p99_ms: ms(a.p99),
    }
}

pub fn print_report(r: &Report) {
    println!(
        "{}{} N={} ({} real node proxies, {} simulated, {} tier replicas): {}",
        r.topology,
        if r.variant.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.variant)
        },
        r.nodes,
        r.real_proxies,
        r.simulated_proxies,
        r.replicas,
        r.error.as_deref().unwrap_or("completed")
    );
    if r.steady_s == 0.0 {
        return;
    }
    let s = &r.apiserver;
    println!(
        "  {} watches open after {:.1}s; steady {:.0}s, {} writes; apiserver: {:.0} watches ({:.0} \
         before), {:.3} cores, RSS {}, {:.0} watch events/s, {:.3} MB/s; {:.1} TokenReviews/s, {:.1} \
         SubjectAccessReviews/s",
        r.watches_opened,
        r.started_in_s,
        r.steady_s,
        r.writes,
        s.watches,
        s.watches_before,
        s.cpu_cores,
        mib(s.rss_bytes),
        s.events_per_s,
        s.bytes_per_s / 1e6,
        s.token_reviews_per_s,
        s.access_reviews_per_s,
    );
    let shares = |v: &[(String, f64)], scale: f64| {
        v.iter()
            .map(|(k, x)| format!("{k} {:.1}", x / scale))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "  events/s by resource: {}; MB/s: {}",
        shares(&s.events_by_resource, 1.0),
        shares(&s.bytes_by_resource, 1e6)
    );
    println!(
        "  requests/s by verb and resource: {}; watches by resource: {}",
        shares(&s.requests, 1.0),
        shares(&s.watches_by_resource, 1.0)
    );
    for x in &r.reach {
        println!(
            "  a Service change at every watch of {} ({} watches): {}/{} changes, p50 {:.1} ms, p99 \
             {:.1} ms, max {:.1} ms (each arrival: p50 {:.1}, p99 {:.1} ms)",
            x.group,
            x.watches,
            x.everywhere,
            x.changes,
            x.p50_ms,
            x.p99_ms,
            x.max_ms,
            x.arrival_p50_ms,
            x.arrival_p99_ms
        );
    }
    if let Some(p) = &r.node_proxies {
        println!(
            "  {} node proxies: CPU per proxy mean {:.4} max {:.4} cores; RSS mean {} max {} (peak \
             {}); their clients' requests/s: {}; upstream watches of their caches {:.0}",
            p.count,
            p.cpu_mean,
            p.cpu_max,
            mib(p.rss_mean),
            mib(p.rss_max),
            mib(p.peak_rss_max),
            shares(&p.requests, 1.0),
            p.upstream_watches
        );
        println!("  and/s: {}", shares(&p.diagnostics, 1.0));
    }
    for (i, (cpu, rss)) in r.tier.iter().enumerate() {
        println!("  tier replica {i}: {cpu:.3} cores, RSS {}", mib(*rss));
    }
    if !r.tier.is_empty() {
        println!(
            "  the tier's requests/s: {}; and/s: {}",
            shares(&r.tier_requests, 1.0),
            shares(&r.tier_diagnostics, 1.0)
        );
    }
    println!(
        "  this tool: {:.2} cores; {} failed requests; {} watches ended and resumed in the steady \
         phase (after p50 {:.1} s, max {:.1} s); {} log GETs (p50 {:.1} ms, p99 {:.1} ms)",
        r.tool_cpu_cores,
        r.failures,
        r.resumes,
        r.resumed_after_ms[0] / 1000.0,
        r.resumed_after_ms[1] / 1000.0,
        r.gets,
        r.get_p50_ms,
        r.get_p99_ms
    );
}

/// Appends `r` to the results file.
pub fn append(path: &Path, r: &Report) -> Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{}", serde_json::to_string(r)?)?;
    Ok(())
}

/// Every report in the results file, oldest first.
pub fn read(path: &Path) -> Result<Vec<Report>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).context("a malformed line in the results"))
        .collect()
}

/// The newest report of each N and topology, by N, then topology in the
/// order direct, proxies, tier.
pub fn newest(all: &[Report]) -> Vec<Report> {
    let order = |t: &str| ["direct", "proxies", "tier"].iter().position(|x| *x == t);
    let mut m: BTreeMap<(usize, Option<usize>, String), Report> = BTreeMap::new();
    for r in all {
        m.insert((r.nodes, order(&r.topology), r.variant.clone()), r.clone());
    }
    m.into_values().collect()
}

/// `x / direct` as "0.012×", where both are known.
fn ratio(x: f64, direct: Option<f64>) -> String {
    match direct {
        Some(d) if d > 0.0 => format!(" ({:.3}×)", x / d),
        _ => String::new(),
    }
}

/// The table of `reports` (their newest per N and topology), with each
/// figure's ratio to direct's at the same N.
pub fn table(reports: &[Report]) -> String {
    let reports = newest(reports);
    let mut out = String::from(
        "| N | topology | apiserver watches (its own) | watch events/s | watch MB/s | apiserver CPU (cores) | apiserver RSS | a Service change at every agent: p50 / p99 / max (ms) | at every simulated node proxy: p50 / p99 / max (ms) | node proxy CPU (cores): mean / max | node proxy RSS: mean / max | tier replica CPU / RSS |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &reports {
        let direct = reports
            .iter()
            .find(|d| {
                d.nodes == r.nodes
                    && d.topology == "direct"
                    && d.variant.is_empty()
                    && d.error.is_none()
            })
            .filter(|_| r.topology != "direct");
        let topology = if r.variant.is_empty() {
            r.topology.clone()
        } else {
            format!("{} ({})", r.topology, r.variant)
        };
        if let Some(e) = &r.error {
            out.push_str(&format!(
                "| {} | {topology} | {} |||||||||\n",
                r.nodes,
                e.replace('|', "/")
            ));
            continue;
        }
        let s = &r.apiserver;
        let reach = |pick: fn(&Reach) -> bool| {
            r.reach
                .iter()
                .find(|x| pick(x))
                .map(|x| {
                    let missed = if x.everywhere < x.changes {
                        format!(" ({} of {} changes everywhere)", x.everywhere, x.changes)
                    } else {
                        String::new()
                    };
                    format!(
                        "{:.0} / {:.0} / {:.0}{missed}",
                        x.p50_ms, x.p99_ms, x.max_ms
                    )
                })
                .unwrap_or_else(|| "—".into())
        };
        let (cpu, rss) = match &r.node_proxies {
            Some(p) => (
                format!("{:.4} / {:.4}", p.cpu_mean, p.cpu_max),
                format!(
                    "{:.1} / {:.1} MiB",
                    p.rss_mean as f64 / 1048576.0,
                    p.rss_max as f64 / 1048576.0
                ),
            ),
            None => ("—".into(), "—".into()),
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
        out.push_str(&format!(
            "| {} | {topology} | {:.0}{} ({:.0}) | {:.0}{} | {:.2}{} | {:.3} | {:.0} MiB | {} | {} | {cpu} | {rss} | {tier} |\n",
            r.nodes,
            s.watches,
            ratio(s.watches, direct.map(|d| d.apiserver.watches)),
            s.watches_before,
            s.events_per_s,
            ratio(s.events_per_s, direct.map(|d| d.apiserver.events_per_s)),
            s.bytes_per_s / 1e6,
            ratio(s.bytes_per_s, direct.map(|d| d.apiserver.bytes_per_s)),
            s.cpu_cores,
            s.rss_bytes as f64 / 1048576.0,
            reach(|x| !x.group.starts_with("simulated") && !x.group.starts_with("agents of the first")),
            reach(|x| x.group.starts_with("simulated")),
        ));
    }
    out
}

/// The chart: apiserver watches, watch events/s and MB/s (logarithmic),
/// and a Service change's p99 at every agent, by N and topology.
pub fn svg(reports: &[Report]) -> String {
    use crate::chart::Panel;
    let reports = newest(reports);
    let mut ns: Vec<usize> = reports
        .iter()
        .filter(|r| r.variant.is_empty())
        .map(|r| r.nodes)
        .collect();
    ns.dedup();
    let topologies = ["direct", "proxies", "tier"];
    let panel = |title: &str, log: bool, value: &dyn Fn(&Report) -> Option<f64>| Panel {
        title: title.into(),
        log,
        groups: ns
            .iter()
            .map(|n| {
                let values = topologies
                    .iter()
                    .map(|t| {
                        reports
                            .iter()
                            .find(|r| {
                                r.nodes == *n
                                    && r.topology == *t
                                    && r.variant.is_empty()
                                    && r.error.is_none()
                            })
                            .and_then(value)
                    })
                    .collect();
                (format!("{n} nodes"), values)
            })
            .collect(),
        whiskers: Vec::new(),
    };
    let panels = [
        panel("apiserver watches", true, &|r| Some(r.apiserver.watches)),
        panel("apiserver watch events/s", true, &|r| {
            Some(r.apiserver.events_per_s)
        }),
        panel("apiserver watch bytes/s (MB)", true, &|r| {
            Some(r.apiserver.bytes_per_s / 1e6)
        }),
        panel("a Service change at every agent, p99 (ms)", false, &|r| {
            r.reach
                .iter()
                .find(|x| {
                    !x.group.starts_with("simulated") && !x.group.starts_with("agents of the first")
                })
                .filter(|x| x.everywhere > 0)
                .map(|x| x.p99_ms)
        }),
    ];
    crate::chart::bars(&panels, &topologies, 2, 380.0, 260.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_change_reaches_a_group_when_it_reached_its_every_watch() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let arrival = |rv, watch, at| Arrival { rv, watch, at };
        let changes = [(10, t0), (20, ms(100)), (30, ms(200))];
        let arrivals = [
            arrival(10, 0, ms(5)),
            arrival(10, 1, ms(40)),
            arrival(10, 2, ms(900)), // another group's
            arrival(20, 0, ms(110)),
            arrival(20, 1, ms(130)),
            arrival(20, 1, ms(150)), // again, after a resume: the first counts
            arrival(30, 0, ms(210)), // never at watch 1
            arrival(99, 0, ms(300)), // not a Service change
        ];
        let r = reach("agents", &[0, 1], &changes, &arrivals);
        assert_eq!((r.watches, r.changes, r.everywhere), (2, 3, 2));
        assert_eq!((r.p50_ms, r.max_ms), (30.0, 40.0));
        // 5, 40, 10, 30, 10.
        assert_eq!((r.arrival_p50_ms, r.arrival_p99_ms), (10.0, 40.0));
    }

    #[test]
    fn tables_show_ratios_to_direct_at_the_same_n() {
        let run = |topology: &str, watches: f64, events: f64| Report {
            topology: topology.into(),
            nodes: 1000,
            steady_s: 60.0,
            apiserver: Apiserver {
                watches,
                watches_before: 40.0,
                events_per_s: events,
                bytes_per_s: events * 500.0,
                ..Apiserver::default()
            },
            ..Report::default()
        };
        let failed = Report {
            error: Some("the apiserver | exited".into()),
            nodes: 5000,
            topology: "direct".into(),
            ..Report::default()
        };
        let old = run("tier", 1.0, 1.0);
        let t = table(&[
            old,
            run("tier", 76.0, 42.0),
            run("direct", 20_040.0, 10_030.0),
            failed,
        ]);
        let rows: Vec<&str> = t.lines().skip(2).collect();
        assert_eq!(rows.len(), 3, "{t}");
        assert!(
            rows[0].starts_with("| 1000 | direct | 20040 (40) | 10030 |"),
            "{t}"
        );
        assert!(
            rows[1].starts_with("| 1000 | tier | 76 (0.004×) (40) | 42 (0.004×) | 0.02 (0.004×) |"),
            "{t}"
        );
        assert!(rows[2].contains("the apiserver / exited"), "{t}");
        assert!(svg(&[run("direct", 20_040.0, 10_030.0)]).contains("1000 nodes"));
    }
}
