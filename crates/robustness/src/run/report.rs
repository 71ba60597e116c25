//! What a run found: anomalies by property, the fault × property table,
//! the busiest watchers, failed requests; and the report as text.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::faults::{FaultKind, Injected};
use crate::validate::{Anomaly, Property};

/// Per property: how many anomalies and the first.
#[derive(Debug, Default, Clone)]
pub struct PropertyReport {
    pub count: u64,
    pub first: Option<Anomaly>,
}

/// One row of the fault × property table.
#[derive(Debug, Default, Clone)]
pub struct FaultRow {
    pub faults: u64,
    pub segments: usize,
    pub events: usize,
    pub anomalies: BTreeMap<Property, u64>,
}

/// What a run found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub seed: u64,
    pub duration: Duration,
    /// What ran, in a line.
    pub topology: String,
    pub faults: Injected,
    /// Fault lines, in order, with their time since the start.
    pub timeline: Vec<(f64, String)>,
    /// Per fault kind: the watch requests whose streams were open while a
    /// fault of that kind was (or in the 5 s after it), the events they
    /// carried, and their anomalies by property.
    pub by_fault: BTreeMap<FaultKind, FaultRow>,
    pub watchers: usize,
    pub segments: usize,
    /// Object events validated against the reference.
    pub events: usize,
    /// Relist windows (a proxy's relist delivered as events) accepted.
    pub windows: usize,
    /// Reads validated.
    pub reads: usize,
    /// Changes in the reference (etcd's history of the followed keys).
    pub changes: usize,
    pub anomalies: BTreeMap<Property, PropertyReport>,
    pub failures: BTreeMap<String, u64>,
    /// The watchers with the most watch requests, and how their requests
    /// ended.
    pub busiest: Vec<(String, usize, String)>,
    pub written: BTreeMap<String, u64>,
    /// Staleness and `410 Gone` by who served and by fault
    /// (`validate::freshness`).
    pub freshness: crate::validate::freshness::Freshness,
    /// Where the run's files are.
    pub dir: PathBuf,
}

impl Report {
    /// Whether nothing was found.
    pub fn clean(&self) -> bool {
        self.anomalies.values().all(|p| p.count == 0)
    }

    pub(super) fn add(&mut self, a: Anomaly) {
        let p = self.anomalies.entry(a.property).or_default();
        p.count += 1;
        if p.first.is_none() {
            p.first = Some(a);
        }
    }

    /// The staleness table (p50 / p99 / max seconds, and how many changes,
    /// by fault and by who served) and the `410 Gone` table.
    fn freshness_text(&self, out: &mut String) {
        use crate::validate::freshness::{Freshness, Served, bound};
        let served = [Served::Apiserver, Served::NodeProxy, Served::Tier];
        let label = |k: &Option<FaultKind>| k.map_or("steady", FaultKind::as_str);
        out.push_str("staleness, from etcd having a change to a watcher getting it (p50 / p99 / max s, changes; the bound a proxy must keep):\n");
        let mut faults: Vec<Option<FaultKind>> =
            self.freshness.staleness.keys().map(|(_, k)| *k).collect();
        faults.sort();
        faults.dedup();
        out.push_str(&format!(
            "  {:<20} {:>26} {:>26} {:>26} {:>6}\n",
            "fault", "apiserver", "node proxies", "tier", "bound"
        ));
        for k in &faults {
            let mut line = format!("  {:<20}", label(k));
            for s in served {
                let cell = match self.freshness.staleness.get(&(s, *k)) {
                    Some(v) if !v.is_empty() => {
                        let (p50, p99, max) = Freshness::summary(v);
                        format!("{p50:.2} / {p99:.2} / {max:.1} ({})", v.len())
                    }
                    _ => "-".into(),
                };
                line.push_str(&format!(" {cell:>26}"));
            }
            let b = bound(*k).map_or("-".to_string(), |b| format!("{b:.0} s"));
            line.push_str(&format!(" {b:>6}\n"));
            out.push_str(&line);
        }
        out.push_str("410 Gone sent to watchers, by fault (apiserver / node proxies / tier):\n");
        let mut gone: Vec<Option<FaultKind>> =
            self.freshness.gone.keys().map(|(_, k)| *k).collect();
        gone.sort();
        gone.dedup();
        if gone.is_empty() {
            out.push_str("  none\n");
        }
        for k in gone {
            let n = |s| self.freshness.gone.get(&(s, k)).copied().unwrap_or(0);
            out.push_str(&format!(
                "  {:<20} {} / {} / {}\n",
                label(&k),
                n(Served::Apiserver),
                n(Served::NodeProxy),
                n(Served::Tier)
            ));
        }
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let w = |out: &mut String, s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        w(
            &mut out,
            format!(
                "== robustness run: seed {} ({:.0?} of faults; files in {})",
                self.seed,
                self.duration,
                self.dir.display()
            ),
        );
        w(&mut out, format!("topology: {}", self.topology));
        let total: u64 = self.faults.by_kind.values().sum();
        w(&mut out, format!("faults injected: {total}"));
        for (k, n) in &self.faults.by_kind {
            w(&mut out, format!("  {:<20} {n}", k.as_str()));
        }
        for (k, n) in &self.faults.skipped {
            w(&mut out, format!("  skipped: {k}: {n}"));
        }
        w(
            &mut out,
            format!(
                "validated: {} watchers, {} watch requests, {} events ({} relist windows), {} reads, against {} changes in etcd",
                self.watchers, self.segments, self.events, self.windows, self.reads, self.changes
            ),
        );
        let written: u64 = self.written.values().sum();
        w(
            &mut out,
            format!(
                "writes: {written} ({})",
                self.written
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        w(&mut out, "fault x property (watch requests open during a fault or the 5 s after it; events they carried; anomalies):".into());
        let mut header = format!(
            "  {:<20} {:>6} {:>8} {:>8}",
            "fault", "faults", "requests", "events"
        );
        for p in Property::ALL {
            header.push_str(&format!(" {:>4}", short_property(p)));
        }
        w(&mut out, header);
        for (k, row) in &self.by_fault {
            let mut line = format!(
                "  {:<20} {:>6} {:>8} {:>8}",
                k.as_str(),
                row.faults,
                row.segments,
                row.events
            );
            for p in Property::ALL {
                line.push_str(&format!(
                    " {:>4}",
                    row.anomalies.get(&p).copied().unwrap_or(0)
                ));
            }
            w(&mut out, line);
        }
        w(
            &mut out,
            format!(
                "  columns: {}",
                Property::ALL
                    .iter()
                    .map(|p| format!("{}={}", short_property(*p), p.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        self.freshness_text(&mut out);
        w(&mut out, "watchers with the most watch requests:".into());
        for (name, n, ends) in &self.busiest {
            w(&mut out, format!("  {n:>6}  {name}: {ends}"));
        }
        w(&mut out, "anomalies by property:".into());
        for p in Property::ALL {
            let r = self.anomalies.get(&p).cloned().unwrap_or_default();
            w(&mut out, format!("  {:<22} {}", p.as_str(), r.count));
            if let Some(a) = r.first {
                w(
                    &mut out,
                    format!("      first: {} via {}: {}", a.watcher, a.target, a.detail),
                );
            }
        }
        w(&mut out, "failed requests by reason (allowed while an upstream is unreachable; never a wrong answer):".into());
        if self.failures.is_empty() {
            w(&mut out, "  none".into());
        }
        for (k, n) in &self.failures {
            w(&mut out, format!("  {n:>6}  {k}"));
        }
        if !self.faults.restarts_ready.is_empty() {
            let mut r = self.faults.restarts_ready.clone();
            r.sort_by(f64::total_cmp);
            w(
                &mut out,
                format!(
                    "node proxy restarts: ready in median {:.2}s, max {:.2}s",
                    r[r.len() / 2],
                    r[r.len() - 1]
                ),
            );
        }
        if !self.faults.restores_served.is_empty() {
            let r: Vec<String> = self
                .faults
                .restores_served
                .iter()
                .map(|s| format!("{s:.1}s"))
                .collect();
            w(
                &mut out,
                format!(
                    "etcd restores: every proxy served the restored world {} after the restore began",
                    r.join(", ")
                ),
            );
        }
        w(
            &mut out,
            if self.clean() {
                "RESULT: no anomaly".into()
            } else {
                "RESULT: ANOMALIES FOUND".into()
            },
        );
        out
    }
}

/// A property's column name in the fault table.
fn short_property(p: Property) -> &'static str {
    match p {
        Property::Ordered => "ord",
        Property::Unique => "uniq",
        Property::Reliable => "rel",
        Property::Valid => "val",
        Property::Resumable => "res",
        Property::Bookmarkable => "bkm",
        Property::SelectorTransitions => "sel",
        Property::InitialState => "init",
        Property::FinalState => "fin",
        Property::Reads => "read",
        Property::Fresh => "frsh",
    }
}
