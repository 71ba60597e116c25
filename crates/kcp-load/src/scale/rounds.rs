//! `scale --rounds N`: the topologies interleaved over rounds, each run's
//! figures a line of the results file ([`Record`]), and the report over
//! the rounds: each figure's median and spread per topology, and each
//! topology against direct round by round ([`super::spread`]).
//!
//! Round `r` runs the topologies in their order rotated left by `r`
//! ([`order`]: direct, proxies, tier; then proxies, tier, direct; ...),
//! so that none is always first after a quiet start or last in a tired
//! hour. The runs of one measurement are a [`Series`]: the same commit,
//! variant, nodes, pods and rate, restart or not. With `--results`, a
//! run whose series, round and topology the file already holds without
//! an error is not run again: the same command resumes a measurement.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use super::slowest::PodTimes;
use super::spread::{ALPHA, Paired, Spread};
use super::{Figures, ScaleArgs, Topology};

/// What makes runs comparable: one measurement's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Series {
    /// The commit checked out where `kcp-load` runs (`git describe
    /// --always --dirty`), "" outside a git work tree.
    pub commit: String,
    /// What differs from the shipped configurations ("" when nothing).
    pub variant: String,
    pub nodes: usize,
    pub pods_per_node: usize,
    pub pods_per_second: f64,
    /// Whether the runs did the mass restart (not `restart`: a record
    /// holds the series's fields flattened, and its own `restart`).
    pub mass_restart: bool,
}

impl Series {
    pub fn of(a: &ScaleArgs) -> Series {
        Series {
            commit: commit(),
            variant: variant(a),
            nodes: a.nodes,
            pods_per_node: a.pods_per_node,
            pods_per_second: a.pods_per_second,
            mass_restart: !a.no_restart,
        }
    }

    fn title(&self) -> String {
        format!(
            "{} nodes × {} pods at {} pods/s, {}; commit {}{}",
            self.nodes,
            self.pods_per_node,
            self.pods_per_second,
            if self.mass_restart {
                "with the mass restart"
            } else {
                "no restart"
            },
            if self.commit.is_empty() {
                "unknown"
            } else {
                &self.commit
            },
            if self.variant.is_empty() {
                String::new()
            } else {
                format!(" ({})", self.variant)
            }
        )
    }
}

/// The commit of the work tree `kcp-load` runs in.
fn commit() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// What of the node proxies and the apiserver differs from the shipped
/// configurations, for every topology of the series alike.
fn variant(a: &ScaleArgs) -> String {
    let mut v = Vec::new();
    for r in &a.node_uncached {
        v.push(format!("node proxies do not cache {r}"));
    }
    if let Some(e) = &a.node_upstream_encoding {
        v.push(format!("node proxies read upstream in {e}"));
    }
    if a.apiserver_profile_seconds > 0 {
        v.push(format!(
            "apiserver profiled {} s",
            a.apiserver_profile_seconds
        ));
    }
    v.join(", ")
}

/// The topologies of round `round`: `topologies` rotated left by it.
pub fn order(topologies: &[Topology], round: usize) -> Vec<Topology> {
    let mut v = topologies.to_vec();
    if !v.is_empty() {
        let n = round % v.len();
        v.rotate_left(n);
    }
    v
}

/// An API call's p99 and its SLO, in seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApiP99 {
    /// "verb scope resource".
    pub call: String,
    pub p99_s: f64,
    pub slo_s: f64,
}

/// The mass restart's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RestartRecord {
    pub converged_s: f64,
    pub apiserver_cpu_s: f64,
    pub lists: f64,
    pub list_bytes: f64,
    pub watch_bytes: f64,
    pub init_events: f64,
    pub api_p99: Vec<ApiP99>,
}

/// One run: a line of the results file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Record {
    #[serde(flatten)]
    pub series: Series,
    pub round: usize,
    pub topology: String,
    /// Seconds since the Unix epoch at the run's start, and the load
    /// average then.
    pub unix_time: u64,
    pub load_average: String,
    /// Why the run stopped, if it did not finish.
    pub error: Option<String>,
    pub seconds: f64,
    /// Pod startup: pods, and p50 / p90 / p99 / max in seconds.
    pub startup_count: usize,
    pub startup_p50_s: f64,
    pub startup_p90_s: f64,
    pub startup_p99_s: f64,
    pub startup_max_s: f64,
    /// API call p99 per call over the load (the mass restart apart).
    pub api_p99: Vec<ApiP99>,
    pub apiserver_cpu_s: f64,
    pub apiserver_peak_rss: u64,
    pub etcd_cpu_s: f64,
    pub watches: f64,
    pub lists: f64,
    pub list_bytes: f64,
    pub proxy_cpu_per_node_s: Option<f64>,
    pub proxy_rss_per_node: Option<u64>,
    pub tier_cpu_s: Option<f64>,
    pub tier_rss: Option<u64>,
    pub hollow_rss_per_node: u64,
    pub restart: Option<RestartRecord>,
    /// The pods slowest to start, step by step.
    pub slowest: Vec<PodTimes>,
}

fn api_p99(p: &BTreeMap<super::ApiCall, (f64, f64)>) -> Vec<ApiP99> {
    p.iter()
        .map(|((v, s, r), (p99, slo))| ApiP99 {
            call: format!("{v} {s} {r}"),
            p99_s: *p99,
            slo_s: *slo,
        })
        .collect()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Record {
    /// A run about to start: its series, round and topology, the time and
    /// the load average.
    pub fn start(series: &Series, round: usize, topology: Topology) -> Record {
        Record {
            series: series.clone(),
            round,
            topology: topology.as_str().into(),
            unix_time: unix_now(),
            load_average: load_average(),
            ..Record::default()
        }
    }

    /// With a finished run's figures.
    pub fn with(self, f: &Figures) -> Record {
        let s = |us: u64| us as f64 / 1e6;
        Record {
            seconds: f.seconds,
            startup_count: f.startup.count,
            startup_p50_s: s(f.startup.p50),
            startup_p90_s: s(f.startup.p90),
            startup_p99_s: s(f.startup.p99),
            startup_max_s: s(f.startup.max),
            api_p99: api_p99(&f.api_p99),
            apiserver_cpu_s: f.apiserver_cpu,
            apiserver_peak_rss: f.apiserver_peak_rss,
            etcd_cpu_s: f.etcd_cpu,
            watches: f.watches,
            lists: f.lists,
            list_bytes: f.list_bytes,
            proxy_cpu_per_node_s: f.proxy_cpu_per_node,
            proxy_rss_per_node: f.proxy_rss_per_node,
            tier_cpu_s: f.tier_cpu,
            tier_rss: f.tier_rss,
            hollow_rss_per_node: f.hollow_rss_per_node,
            restart: f.restart.as_ref().map(|r| RestartRecord {
                converged_s: r.converged.as_secs_f64(),
                apiserver_cpu_s: r.apiserver_cpu,
                lists: r.lists,
                list_bytes: r.list_bytes,
                watch_bytes: r.watch_bytes,
                init_events: r.init_events,
                api_p99: api_p99(&r.api_p99),
            }),
            slowest: f.slowest.clone(),
            ..self
        }
    }

    /// The worst API call p99 over the load as a multiple of its SLO.
    fn worst_api(&self) -> Option<f64> {
        self.api_p99
            .iter()
            .map(|c| c.p99_s / c.slo_s)
            .max_by(f64::total_cmp)
    }
}

/// Appends `r` to the results file.
pub fn append(path: &Path, r: &Record) -> Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{}", serde_json::to_string(r)?)?;
    Ok(())
}

/// Every record of the results file, oldest first; none if it does not
/// exist yet.
pub fn read(path: &Path) -> Result<Vec<Record>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| {
                format!("{}: line {} is not a run's record", path.display(), i + 1)
            })
        })
        .collect()
}

/// Whether `done` holds a finished run of `series`, `round`, `topology`.
pub fn done(done: &[Record], series: &Series, round: usize, topology: Topology) -> bool {
    done.iter().any(|r| {
        r.series == *series
            && r.round == round
            && r.topology == topology.as_str()
            && r.error.is_none()
    })
}

/// A figure of the report: its name, its decimals, how it is read from a
/// record.
struct Figure {
    name: &'static str,
    decimals: usize,
    value: fn(&Record) -> Option<f64>,
}

const FIGURES: [Figure; 6] = [
    Figure {
        name: "pod startup p50 (s)",
        decimals: 2,
        value: |r| Some(r.startup_p50_s),
    },
    Figure {
        name: "pod startup p90 (s)",
        decimals: 2,
        value: |r| Some(r.startup_p90_s),
    },
    Figure {
        name: "pod startup p99 (s)",
        decimals: 2,
        value: |r| Some(r.startup_p99_s),
    },
    Figure {
        name: "API call p99 over the load, the worst against its SLO (× its SLO)",
        decimals: 2,
        value: Record::worst_api,
    },
    Figure {
        name: "apiserver CPU (s)",
        decimals: 1,
        value: |r| Some(r.apiserver_cpu_s),
    },
    Figure {
        name: "mass restart converged (s)",
        decimals: 1,
        value: |r| r.restart.as_ref().map(|x| x.converged_s),
    },
];

/// The topologies in their usual order, then any other.
fn topology_rank(t: &str) -> (usize, String) {
    let i = ["direct", "proxies", "tier"]
        .iter()
        .position(|x| *x == t)
        .unwrap_or(3);
    (i, t.to_string())
}

/// One series' finished runs: by topology, by round (the newest of a
/// round and topology, when one was run again).
struct Runs<'a> {
    series: &'a Series,
    by_topology: BTreeMap<(usize, String), BTreeMap<usize, &'a Record>>,
    failed: Vec<&'a Record>,
}

impl<'a> Runs<'a> {
    /// Every series of `all`, in the order of their first records.
    fn of(all: &'a [Record]) -> Vec<Runs<'a>> {
        let mut out: Vec<Runs<'a>> = Vec::new();
        for r in all {
            let i = match out.iter().position(|s| *s.series == r.series) {
                Some(i) => i,
                None => {
                    out.push(Runs {
                        series: &r.series,
                        by_topology: BTreeMap::new(),
                        failed: Vec::new(),
                    });
                    out.len() - 1
                }
            };
            match &r.error {
                Some(_) => out[i].failed.push(r),
                None => {
                    out[i]
                        .by_topology
                        .entry(topology_rank(&r.topology))
                        .or_default()
                        .insert(r.round, r);
                }
            }
        }
        out
    }

    fn spread(&self, rounds: &BTreeMap<usize, &Record>, f: &Figure) -> Option<Spread> {
        let v: Vec<f64> = rounds.values().filter_map(|r| (f.value)(r)).collect();
        Spread::of(&v)
    }

    fn direct(&self) -> Option<&BTreeMap<usize, &'a Record>> {
        self.by_topology.get(&topology_rank("direct"))
    }
}

/// The report of every series in `all`: per topology each figure's median
/// and spread over the rounds; each topology against direct round by
/// round; the slowest pod of each run; the failed runs.
pub fn report(all: &[Record]) -> String {
    let mut out = String::new();
    for runs in Runs::of(all) {
        out.push_str(&series_report(&runs));
    }
    out
}

fn series_report(runs: &Runs) -> String {
    let mut out = format!("--- rounds: {}\n", runs.series.title());
    let topologies: Vec<&String> = runs.by_topology.keys().map(|(_, t)| t).collect();
    out.push_str(
        "Per topology, each figure over the rounds: median [min–max; the interquartile range \
         with 4 rounds or more] n=rounds.\n",
    );
    out.push_str(&format!(
        "| figure | {} |\n|---|{}\n",
        topologies
            .iter()
            .map(|t| t.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(topologies.len())
    ));
    for f in &FIGURES {
        let cells: Vec<String> = runs
            .by_topology
            .values()
            .map(|rounds| {
                runs.spread(rounds, f)
                    .map_or("—".into(), |s| s.show(f.decimals))
            })
            .collect();
        if cells.iter().all(|c| c == "—") {
            continue;
        }
        out.push_str(&format!("| {} | {} |\n", f.name, cells.join(" | ")));
    }
    match runs.direct() {
        None => out.push_str("No run of direct: nothing to pair with.\n"),
        Some(direct) => {
            let others: Vec<_> = runs
                .by_topology
                .iter()
                .filter(|((_, t), _)| t != "direct")
                .collect();
            if !others.is_empty() {
                out.push_str(&format!(
                    "Against direct, round by round: the topology's figure ÷ direct's of the same \
                     round, median [min–max]; the rounds above and below direct's; and whether the \
                     difference is beyond the run-to-run spread: the exact two-sided sign test of \
                     the paired differences (ties left out) at p ≤ {ALPHA} (5 rounds: all 5 on \
                     one side; fewer: never).\n| figure | {} |\n|---|{}\n",
                    others
                        .iter()
                        .map(|((_, t), _)| t.as_str())
                        .collect::<Vec<_>>()
                        .join(" | "),
                    "---|".repeat(others.len())
                ));
                for f in &FIGURES {
                    let cells: Vec<String> = others
                        .iter()
                        .map(|(_, rounds)| {
                            let pairs: Vec<(f64, f64)> = rounds
                                .iter()
                                .filter_map(|(round, r)| {
                                    Some(((f.value)(r)?, (f.value)(direct.get(round)?)?))
                                })
                                .collect();
                            if pairs.is_empty() {
                                "—".into()
                            } else {
                                Paired::of(&pairs).show()
                            }
                        })
                        .collect();
                    if cells.iter().all(|c| c == "—") {
                        continue;
                    }
                    out.push_str(&format!("| {} | {} |\n", f.name, cells.join(" | ")));
                }
            }
        }
    }
    out.push_str("The slowest pod of each run:\n");
    for ((_, t), rounds) in &runs.by_topology {
        for (round, r) in rounds {
            match r.slowest.first() {
                Some(p) => out.push_str(&format!("  round {round} {t}: {}\n", p.show())),
                None => out.push_str(&format!("  round {round} {t}: —\n")),
            }
        }
    }
    for r in &runs.failed {
        let again = runs
            .by_topology
            .get(&topology_rank(&r.topology))
            .is_some_and(|rounds| rounds.contains_key(&r.round));
        out.push_str(&format!(
            "  failed: round {} {}{}: {}\n",
            r.round,
            r.topology,
            if again { " (then run again)" } else { "" },
            r.error.as_deref().unwrap_or_default()
        ));
    }
    out
}

/// The chart of the newest series in `all` (the last record's): per
/// topology, the median over its rounds as the bar and their min–max as
/// the whisker, of pod startup p50 / p90 / p99, apiserver CPU, the worst
/// API call p99 against its SLO and the mass restart's convergence.
pub fn svg(all: &[Record]) -> Option<String> {
    use crate::chart::Panel;
    let newest = &all.last()?.series;
    let runs = Runs::of(all).into_iter().find(|r| r.series == newest)?;
    let panel = |title: &str, figures: &[&Figure]| {
        let mut p = Panel {
            title: title.into(),
            ..Panel::default()
        };
        for ((_, t), rounds) in &runs.by_topology {
            let spreads: Vec<Option<Spread>> =
                figures.iter().map(|f| runs.spread(rounds, f)).collect();
            p.groups.push((
                t.clone(),
                spreads.iter().map(|s| s.map(|s| s.median)).collect(),
            ));
            p.whiskers
                .push(spreads.iter().map(|s| s.map(|s| (s.min, s.max))).collect());
        }
        p
    };
    let mut panels = vec![
        panel(
            "pod startup (s): p50, p90, p99",
            &[&FIGURES[0], &FIGURES[1], &FIGURES[2]],
        ),
        panel("apiserver CPU (s)", &[&FIGURES[4]]),
        panel("API call p99, worst (× its SLO)", &[&FIGURES[3]]),
    ];
    if newest.mass_restart {
        panels.push(panel("mass restart converged (s)", &[&FIGURES[5]]));
    }
    let n = runs
        .by_topology
        .values()
        .map(BTreeMap::len)
        .max()
        .unwrap_or(0);
    let note = format!(
        "bars: the median over the rounds (up to {n}); whiskers: min–max.\n{}",
        newest.title()
    );
    let svg = crate::chart::bars_with_note(&panels, &[], 2, 305.0, 270.0, &note);
    Some(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::slowest::Steps;

    #[test]
    fn each_round_rotates_the_order() {
        use Topology::{Direct, Proxies, Tier};
        let all = [Direct, Proxies, Tier];
        assert_eq!(order(&all, 0), [Direct, Proxies, Tier]);
        assert_eq!(order(&all, 1), [Proxies, Tier, Direct]);
        assert_eq!(order(&all, 2), [Tier, Direct, Proxies]);
        assert_eq!(order(&all, 3), [Direct, Proxies, Tier]);
        assert_eq!(order(&[Direct, Tier], 1), [Tier, Direct]);
        assert!(order(&[], 1).is_empty());
    }

    fn run(round: usize, topology: &str, p99: f64, cpu: f64) -> Record {
        Record {
            series: Series {
                commit: "abc".into(),
                nodes: 50,
                pods_per_node: 30,
                pods_per_second: 10.0,
                mass_restart: true,
                ..Series::default()
            },
            round,
            topology: topology.into(),
            startup_p99_s: p99,
            apiserver_cpu_s: cpu,
            api_p99: vec![ApiP99 {
                call: "POST resource pods".into(),
                p99_s: 0.5,
                slo_s: 1.0,
            }],
            restart: Some(RestartRecord {
                converged_s: 40.0,
                ..RestartRecord::default()
            }),
            ..Record::default()
        }
    }

    #[test]
    fn records_go_through_the_file_and_resume() {
        let path =
            std::env::temp_dir().join(format!("kcp-load-rounds-{}.jsonl", uuid::Uuid::new_v4()));
        assert!(read(&path).unwrap().is_empty());
        let mut r = run(1, "tier", 2.0, 100.0);
        r.slowest.push(PodTimes {
            pod: "load-0/d-000-x".into(),
            status: Steps {
                ready_s: Some(3.0),
                ..Default::default()
            },
            ..PodTimes::default()
        });
        let failed = Record {
            error: Some("nodes not Ready".into()),
            ..run(2, "tier", 0.0, 0.0)
        };
        append(&path, &r).unwrap();
        append(&path, &failed).unwrap();
        let back = read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(back, [r.clone(), failed]);
        assert!(done(&back, &r.series, 1, Topology::Tier));
        // Failed: to be run again; another round, or another series: not
        // run yet.
        assert!(!done(&back, &r.series, 2, Topology::Tier));
        assert!(!done(&back, &r.series, 1, Topology::Direct));
        let other = Series {
            commit: "def".into(),
            ..r.series.clone()
        };
        assert!(!done(&back, &other, 1, Topology::Tier));
    }

    #[test]
    fn the_report_pairs_each_round_with_directs() {
        // Five rounds; the tier's p99 above direct's in every one, its CPU
        // on either side.
        let mut all = Vec::new();
        for (round, (d, t)) in [(1.0, 1.5), (2.0, 2.2), (1.2, 1.3), (1.1, 2.0), (1.4, 1.5)]
            .into_iter()
            .enumerate()
        {
            all.push(run(round, "direct", d, 100.0));
            let cpu = if round % 2 == 0 { 90.0 } else { 110.0 };
            all.push(run(round, "tier", t, cpu));
        }
        // A round run again: its newest counts.
        all.push(run(4, "tier", 1.6, 90.0));
        all.push(Record {
            error: Some("boom".into()),
            ..run(5, "tier", 0.0, 0.0)
        });
        let r = report(&all);
        assert!(
            r.contains("| pod startup p99 (s) | 1.20 [1.00–2.00; IQR 1.10–1.40] n=5 | 1.60 [1.30–2.20; IQR 1.50–2.00] n=5 |"),
            "{r}"
        );
        assert!(
            r.contains("| API call p99 over the load, the worst against its SLO (× its SLO) | 0.50 [0.50–0.50; IQR 0.50–0.50] n=5 |"),
            "{r}"
        );
        // 1.5, 1.1, 1.083, 1.818, 1.143: median 1.143.
        assert!(
            r.contains("| pod startup p99 (s) | 1.14× [1.08–1.82×]; higher in 5 of 5 rounds, lower in 0; sign test p = 0.0625: higher, beyond the spread |"),
            "{r}"
        );
        assert!(
            r.contains("| apiserver CPU (s) | 0.90× [0.90–1.10×]; higher in 2 of 5 rounds, lower in 3; sign test p = 1.0000: within the spread |"),
            "{r}"
        );
        assert!(r.contains("| mass restart converged (s) | 1.00× [1.00–1.00×]; higher in 0 of 5 rounds, lower in 0; sign test p = 1.0000: within the spread |"), "{r}");
        assert!(r.contains("  failed: round 5 tier: boom"), "{r}");
        assert!(r.contains("  round 0 direct: —"), "{r}");
        let chart = svg(&all).unwrap();
        assert!(
            chart.starts_with("<svg") && chart.ends_with("</svg>\n"),
            "{chart}"
        );
        // Every topology's medians, their whiskers where the rounds differ
        // (direct's and the tier's p99, the tier's CPU).
        assert!(chart.contains(">direct<") && chart.contains(">tier<"));
        assert!(chart.contains("bars: the median over the rounds (up to 5)"));
        assert_eq!(chart.matches("<path").count(), 3, "{chart}");
        assert_eq!(svg(&[]), None);
    }
}
