//! Where the slowest pods' start-up went ([`PodTimes`]): for each of a
//! run's pods slowest to start, the steps from its creation to running.
//!
//! Two clocks, both kept:
//! - what this tool's watch of every pod saw, in seconds after the pod's
//!   `ADDED` (the start of its startup figure), to the millisecond: when
//!   it was first seen bound to a node (`spec.nodeName`), and when first
//!   with `status.startTime`, its kubelet's first status write;
//! - what the pod's own status says at the end of the load phase, in
//!   seconds after its `creationTimestamp`: `status.startTime` (the API's
//!   "acknowledged by the Kubelet", so the kubelet seeing it) and the
//!   `lastTransitionTime` of its conditions `PodScheduled` (bound by the
//!   scheduler), `Initialized` (init containers done: with none, as soon
//!   as the kubelet syncs it), `PodReadyToStartContainers` (its volumes
//!   mounted and its sandbox up), `ContainersReady` and `Ready`. These are
//!   whole seconds (Kubernetes writes times to the second), so each step
//!   is ±1 s; they are the kubelet's and the scheduler's own times, before
//!   any status write, so the gap between `Ready` here and running as
//!   watched is the status write's delay.

use std::time::Instant;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the watch keeps of one pod for [`PodTimes`].
#[derive(Debug, Default, Clone)]
pub(super) struct Status {
    /// `metadata.creationTimestamp`.
    created: Option<Timestamp>,
    /// `status.startTime`.
    started: Option<Timestamp>,
    /// Its conditions that are `True`, by type, with their
    /// `lastTransitionTime`, as of the latest event.
    conditions: Vec<(String, Timestamp)>,
    /// When the watch first saw it bound to a node, and first saw its
    /// `status.startTime`.
    bound: Option<Instant>,
    acknowledged: Option<Instant>,
}

impl Status {
    /// Takes in the pod of an event seen at `now`.
    pub(super) fn update(&mut self, pod: &Value, now: Instant) {
        let time = |v: &Value| v.as_str().and_then(|t| t.parse::<Timestamp>().ok());
        if let Some(t) = time(&pod["metadata"]["creationTimestamp"]) {
            self.created = Some(t);
        }
        if pod["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
        {
            self.bound.get_or_insert(now);
        }
        self.started = time(&pod["status"]["startTime"]);
        if self.started.is_some() {
            self.acknowledged.get_or_insert(now);
        }
        self.conditions = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] == "True")
            .filter_map(|c| {
                Some((
                    c["type"].as_str()?.to_string(),
                    time(&c["lastTransitionTime"])?,
                ))
            })
            .collect();
    }
}

/// One slow pod's start-up, step by step (the module's doc).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodTimes {
    /// `namespace/name`, and its node.
    pub pod: String,
    pub node: String,
    /// Seconds from `ADDED` to running with every container ready, as
    /// watched: its startup figure.
    pub startup_s: f64,
    /// As watched, seconds after `ADDED`: bound to its node; its kubelet's
    /// first status (`status.startTime` set).
    pub bound_s: Option<f64>,
    pub kubelet_status_s: Option<f64>,
    /// From its status, seconds after its `creationTimestamp` (whole
    /// seconds): `PodScheduled`, `status.startTime`, `Initialized`,
    /// `PodReadyToStartContainers`, `ContainersReady`, `Ready`.
    pub scheduled_s: Option<f64>,
    pub kubelet_s: Option<f64>,
    pub initialized_s: Option<f64>,
    pub sandbox_s: Option<f64>,
    pub containers_ready_s: Option<f64>,
    pub ready_s: Option<f64>,
}

impl PodTimes {
    /// Of a pod `added` and first `running` at those instants, with what
    /// the watch kept of it.
    pub(super) fn of(
        pod: &str,
        node: &str,
        added: Instant,
        running: Instant,
        s: &Status,
    ) -> PodTimes {
        let watched =
            |t: Option<Instant>| t.map(|t| t.saturating_duration_since(added).as_secs_f64());
        let since_creation = |t: Option<Timestamp>| {
            let (created, t) = (s.created?, t?);
            Some(t.duration_since(created).as_secs_f64())
        };
        let condition = |kind: &str| {
            since_creation(
                s.conditions
                    .iter()
                    .find(|(k, _)| k == kind)
                    .map(|(_, t)| *t),
            )
        };
        PodTimes {
            pod: pod.to_string(),
            node: node.to_string(),
            startup_s: running.saturating_duration_since(added).as_secs_f64(),
            bound_s: watched(s.bound),
            kubelet_status_s: watched(s.acknowledged),
            scheduled_s: condition("PodScheduled"),
            kubelet_s: since_creation(s.started),
            initialized_s: condition("Initialized"),
            sandbox_s: condition("PodReadyToStartContainers"),
            containers_ready_s: condition("ContainersReady"),
            ready_s: condition("Ready"),
        }
    }

    /// As "load-1/d-012-x on hollow-003: 21.52 s to running as watched
    /// (bound 0.11 s, its kubelet's first status 1.30 s); from its
    /// creation, whole seconds: scheduled 0, kubelet 1, initialized 1,
    /// volumes and sandbox 20, containers ready 21, ready 21".
    pub fn show(&self) -> String {
        let watched = |t: Option<f64>| t.map_or("—".into(), |t| format!("{t:.2} s"));
        let whole = |t: Option<f64>| t.map_or("—".into(), |t| format!("{t:.0}"));
        format!(
            "{} on {}: {:.2} s to running as watched (bound {}, its kubelet's first status {}); \
             from its creation, whole seconds: scheduled {}, kubelet {}, initialized {}, volumes \
             and sandbox {}, containers ready {}, ready {}",
            self.pod,
            self.node,
            self.startup_s,
            watched(self.bound_s),
            watched(self.kubelet_status_s),
            whole(self.scheduled_s),
            whole(self.kubelet_s),
            whole(self.initialized_s),
            whole(self.sandbox_s),
            whole(self.containers_ready_s),
            whole(self.ready_s),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn a_pods_steps_are_read_from_its_watch_and_its_conditions() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = Status::default();
        let created = "2026-12-08T10:00:00Z";
        s.update(
            &json!({"metadata": {"creationTimestamp": created}, "spec": {}}),
            t0,
        );
        s.update(
            &json!({"metadata": {"creationTimestamp": created}, "spec": {"nodeName": "hollow-003"},
                    "status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                               "lastTransitionTime": created}]}}),
            at(110),
        );
        let conditions = json!([
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": created},
            {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-08T10:00:01Z"},
            {"type": "PodReadyToStartContainers", "status": "True",
             "lastTransitionTime": "2026-12-08T10:00:20Z"},
            {"type": "ContainersReady", "status": "False", "lastTransitionTime": "2026-12-08T10:00:01Z"},
            {"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-08T10:00:01Z"},
        ]);
        let status = |conditions: &Value| {
            json!({"metadata": {"creationTimestamp": created}, "spec": {"nodeName": "hollow-003"},
                   "status": {"startTime": "2026-12-08T10:00:01Z", "conditions": conditions}})
        };
        s.update(&status(&conditions), at(1300));
        let mut conditions = conditions;
        conditions[3] = json!({"type": "ContainersReady", "status": "True",
                               "lastTransitionTime": "2026-12-08T10:00:21Z"});
        conditions[4] = json!({"type": "Ready", "status": "True",
                               "lastTransitionTime": "2026-12-08T10:00:21Z"});
        s.update(&status(&conditions), at(21_520));
        let p = PodTimes::of("load-1/d-012-x", "hollow-003", t0, at(21_520), &s);
        assert_eq!(
            p.show(),
            "load-1/d-012-x on hollow-003: 21.52 s to running as watched (bound 0.11 s, its \
             kubelet's first status 1.30 s); from its creation, whole seconds: scheduled 0, \
             kubelet 1, initialized 1, volumes and sandbox 20, containers ready 21, ready 21"
        );
        // A pod never bound: its steps unknown, said so.
        let p = PodTimes::of("p", "", t0, t0, &Status::default());
        assert_eq!((p.bound_s, p.scheduled_s, p.ready_s), (None, None, None));
        assert!(p.show().contains("bound —, its kubelet's first status —)"));
    }
}
