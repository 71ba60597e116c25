//! Freshness: how long after etcd had a change each watcher was sent it
//! (its *staleness*), by the fault the change came in, for the proxies'
//! watchers and, as the reference measured the same way on the same run,
//! the apiserver's own (the control watchers straight to it, served by its
//! watch cache); and the `410 Gone` each fault caused, both ways.
//!
//! A change's time is when the reference's etcd watch delivered it
//! (milliseconds after its commit); a watcher's, when its event arrived.
//! Only changes (not a list's or a streaming list's initial state) count.
//!
//! **The bound.** A proxy that could be told must tell: for a change made
//! while an apiserver was ready and reachable from the proxy, the proxy's
//! watchers get it within [`bound`] of etcd: 5 s in steady traffic, more
//! in the faults that take an apiserver away (the proxy must notice and
//! resume elsewhere: a killed one at once, a hung one by its connection's
//! keepalive within 20 s, a lagging one by the silence watchdog within
//! 40 s). Faults that cut the proxy itself off (its path blackholed or
//! slowed, the proxy or its tier replica killed or taken over, a watcher
//! that stopped reading) have no bound: their staleness is that of the
//! fault, and it is reported, not judged. A change counts under every
//! fault whose window (from its start to [`AFTER`] past its end) holds it;
//! the most lenient one decides.

use std::collections::BTreeMap;

use crate::faults::FaultKind;
use crate::model::{End, Observed, Segment, Start};
use crate::reference::Reference;

use super::report::{Anomaly, Property};

/// How long after a fault ends its changes still count as its own: the
/// time to notice it is over and catch up.
pub const AFTER: f64 = 10.0;

/// Who served a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Served {
    /// kube-apiserver's own watch cache (the control watchers).
    Apiserver,
    /// A tier replica.
    Tier,
    /// A node proxy (straight to the balancer, or behind the tier).
    NodeProxy,
}

impl Served {
    /// Who served `target` (a proxy's name, or `apiserver`).
    pub fn of(target: &str) -> Served {
        if target == "apiserver" {
            Served::Apiserver
        } else if target.starts_with("tier") {
            Served::Tier
        } else {
            Served::NodeProxy
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Served::Apiserver => "apiserver",
            Served::Tier => "tier",
            Served::NodeProxy => "node proxy",
        }
    }
}

/// The staleness, in seconds, a proxy's watchers may show for a change
/// made during `fault` (`None`: steady traffic); `None` when the fault
/// cuts the proxy off and nothing is bounded.
pub fn bound(fault: Option<FaultKind>) -> Option<f64> {
    match fault {
        None => Some(5.0),
        // A killed apiserver breaks the connections at once; a restart
        // closes them; an election or a compaction (a relist) takes
        // seconds.
        Some(
            FaultKind::ApiserverKill
            | FaultKind::RollingRestart
            | FaultKind::RollingUpgrade
            | FaultKind::EtcdLeaderKill
            | FaultKind::Compaction,
        ) => Some(15.0),
        // A hung apiserver: found by the connection's keepalive (5 s idle,
        // then a PING unanswered for 15 s), or resumed when it is.
        Some(FaultKind::ApiserverPause) => Some(30.0),
        // A lagging one: the silence watchdog (30 s silent, then a
        // consistent read failed in 5 s), or caught up when its member is
        // back.
        Some(FaultKind::ApiserverLag) => Some(50.0),
        // The proxy cut off from upstream, or its clients' streams broken.
        Some(
            FaultKind::Blackhole
            | FaultKind::Latency
            | FaultKind::ProxyKill
            | FaultKind::Takeover
            | FaultKind::TierKill
            | FaultKind::StalledWatcher
            | FaultKind::SnapshotCorrupt
            | FaultKind::SnapshotTruncate
            | FaultKind::SnapshotDirFull
            | FaultKind::EtcdRestore
            | FaultKind::EtcdRestoreNoBump,
        ) => None,
    }
}

/// The faults whose windows hold `t`, and of them the one that decides:
/// the most lenient (`None`: no fault, steady traffic).
fn fault_at(windows: &[(FaultKind, f64, f64)], t: f64) -> Option<FaultKind> {
    windows
        .iter()
        .filter(|(_, from, to)| t >= *from && t <= to + AFTER)
        .map(|(k, _, _)| *k)
        .max_by(|a, b| {
            let lenient = |k: &FaultKind| bound(Some(*k)).unwrap_or(f64::INFINITY);
            lenient(a).total_cmp(&lenient(b))
        })
}

/// Staleness samples (seconds) and `410 Gone` counts, by who served and by
/// fault (`None`: steady).
#[derive(Debug, Default, Clone)]
pub struct Freshness {
    pub staleness: BTreeMap<(Served, Option<FaultKind>), Vec<f64>>,
    pub gone: BTreeMap<(Served, Option<FaultKind>), u64>,
}

impl Freshness {
    /// Adds `other`'s samples and counts.
    pub fn merge(&mut self, other: Freshness) {
        for (k, v) in other.staleness {
            self.staleness.entry(k).or_default().extend(v);
        }
        for (k, n) in other.gone {
            *self.gone.entry(k).or_default() += n;
        }
    }

    /// p50, p99 and max of a sample set, in seconds.
    pub fn summary(samples: &[f64]) -> (f64, f64, f64) {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let at = |q: f64| {
            s.get(((s.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        (at(0.5), at(0.99), s.last().copied().unwrap_or(0.0))
    }
}

/// Measures one segment: the staleness of every change it carried, its
/// `410`, and an anomaly per change a proxy sent later than its bound.
pub fn measure(
    reference: &Reference,
    seg: &Segment,
    windows: &[(FaultKind, f64, f64)],
    into: &mut Freshness,
) -> Vec<Anomaly> {
    let served = Served::of(&seg.target);
    let mut anomalies = Vec::new();
    if matches!(seg.end, End::Error(410, _)) {
        *into
            .gone
            .entry((served, fault_at(windows, seg.ended)))
            .or_default() += 1;
    }
    if seg.arrived.len() != seg.events.len() {
        return anomalies;
    }
    // A streaming list's initial events are state, not changes.
    let mut initial = matches!(seg.start, Start::InitialEvents);
    let mut worst: Option<(f64, f64, u64)> = None;
    for (event, arrived) in seg.events.iter().zip(&seg.arrived) {
        match event {
            Observed::Bookmark {
                initial_events_end: true,
                ..
            } => initial = false,
            Observed::Event { rv, .. } if !initial => {
                let Some(committed) = reference.committed_at(*rv) else {
                    // A relist's deletion at a resourceVersion no change
                    // had, or one before the reference started.
                    continue;
                };
                let stale = (arrived - committed).max(0.0);
                let fault = fault_at(windows, committed);
                into.staleness
                    .entry((served, fault))
                    .or_default()
                    .push(stale);
                if served != Served::Apiserver
                    && let Some(limit) = bound(fault)
                    && stale > limit
                    && worst.is_none_or(|(w, _, _)| stale > w)
                {
                    worst = Some((stale, limit, *rv));
                }
            }
            Observed::Event { .. } | Observed::Bookmark { .. } => {}
        }
    }
    // One anomaly per segment, as the other properties.
    if let Some((stale, limit, rv)) = worst {
        let fault = fault_at(windows, reference.committed_at(rv).unwrap_or_default());
        anomalies.push(Anomaly {
            property: Property::Fresh,
            watcher: seg.watcher.clone(),
            target: seg.target.clone(),
            detail: format!(
                "the change at resourceVersion {rv} arrived {stale:.1} s after etcd had it, \
                 over the bound of {limit:.0} s for {}",
                fault.map_or("steady traffic", FaultKind::as_str)
            ),
        });
    }
    anomalies
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Filter, Kind, ObjectKey, Resource};
    use serde_json::json;

    fn reference() -> Reference {
        let mut r = Reference::new(10, Vec::new());
        for rev in 11..=13 {
            r.record(
                rev,
                &format!("/registry/pods/a/p{rev}"),
                Some(json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("p{rev}"), "namespace": "a"}})),
                None,
            );
        }
        r
    }

    fn added(rv: u64) -> Observed {
        Observed::Event {
            kind: Kind::Added,
            key: ObjectKey::new("a", &format!("p{rv}")),
            rv,
        }
    }

    /// A segment of `target` that got each of `events` `delay` seconds
    /// after etcd had it.
    fn segment(
        r: &Reference,
        target: &str,
        start: Start,
        events: Vec<Observed>,
        delay: f64,
    ) -> Segment {
        let arrived = events
            .iter()
            .map(|e| r.committed_at(e.rv()).unwrap_or(0.0) + delay)
            .collect();
        Segment {
            watcher: "w".into(),
            target: target.into(),
            filter: Filter::all(Resource::Pods),
            start,
            events,
            arrived,
            end: End::Closed,
            started: 0.0,
            ended: 0.0,
        }
    }

    #[test]
    fn staleness_is_counted_by_who_served_and_bounded_for_proxies_only() {
        let r = reference();
        let mut f = Freshness::default();
        let fresh = segment(
            &r,
            "rb-node-1",
            Start::From(10),
            vec![added(11), added(12)],
            0.2,
        );
        assert!(measure(&r, &fresh, &[], &mut f).is_empty());
        let late = segment(&r, "rb-node-1", Start::From(12), vec![added(13)], 7.0);
        let found = measure(&r, &late, &[], &mut f);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].property, Property::Fresh);
        assert!(
            found[0].detail.contains("resourceVersion 13"),
            "{}",
            found[0].detail
        );
        // The apiserver's own are measured, not judged.
        let api = segment(&r, "apiserver", Start::From(10), vec![added(11)], 7.0);
        assert!(measure(&r, &api, &[], &mut f).is_empty());
        assert_eq!(f.staleness[&(Served::NodeProxy, None)].len(), 3);
        assert_eq!(f.staleness[&(Served::Apiserver, None)].len(), 1);
        let (p50, _, max) = Freshness::summary(&f.staleness[&(Served::NodeProxy, None)]);
        assert!(
            (p50 - 0.2).abs() < 1e-6 && (max - 7.0).abs() < 1e-6,
            "{p50} {max}"
        );
    }

    #[test]
    fn a_change_in_a_fault_counts_under_it_and_a_cut_off_proxy_is_not_judged() {
        let r = reference();
        let t = r.committed_at(12).unwrap();
        let mut f = Freshness::default();
        // Committed during a pause: 30 s allowed.
        let windows = [(FaultKind::ApiserverPause, t - 1.0, t + 1.0)];
        let seg = segment(&r, "rb-node-1", Start::From(11), vec![added(12)], 20.0);
        assert!(measure(&r, &seg, &windows, &mut f).is_empty());
        assert_eq!(
            f.staleness[&(Served::NodeProxy, Some(FaultKind::ApiserverPause))],
            [20.0]
        );
        // Overlapping a blackhole of the proxy's path: not judged.
        let windows = [
            (FaultKind::ApiserverPause, t - 1.0, t + 1.0),
            (FaultKind::Blackhole, t - 0.5, t),
        ];
        let seg = segment(&r, "rb-node-1", Start::From(11), vec![added(12)], 90.0);
        assert!(measure(&r, &seg, &windows, &mut f).is_empty());
        // Up to AFTER past the fault's end it is still the fault's.
        let windows = [(FaultKind::ApiserverKill, t - 20.0, t - AFTER + 1.0)];
        assert_eq!(fault_at(&windows, t), Some(FaultKind::ApiserverKill));
        let windows = [(FaultKind::ApiserverKill, t - 20.0, t - AFTER - 1.0)];
        assert_eq!(fault_at(&windows, t), None);
    }

    #[test]
    fn initial_events_are_not_changes_and_410s_are_counted() {
        let r = reference();
        let mut f = Freshness::default();
        let mut seg = segment(
            &r,
            "tier-0",
            Start::InitialEvents,
            vec![
                added(11),
                Observed::Bookmark {
                    rv: 12,
                    initial_events_end: true,
                },
                added(13),
            ],
            60.0,
        );
        seg.end = End::Error(410, "too old".into());
        // Only the change after the initial events counts: too late.
        assert_eq!(measure(&r, &seg, &[], &mut f).len(), 1);
        assert_eq!(f.staleness[&(Served::Tier, None)].len(), 1);
        assert_eq!(f.gone[&(Served::Tier, None)], 1);
    }
}
