//! Where the slowest pods' start-up went ([`PodTimes`]): for each of a
//! run's pods slowest to start, the steps from its creation to running,
//! on two clocks ([`Steps`]):
//! - **as watched**: when this tool's watch of every pod first saw each
//!   step, in seconds after the pod's `ADDED` (the start of its startup
//!   figure), to the millisecond: bound to a node (`spec.nodeName`); its
//!   kubelet's first status (`status.startTime` set); and each condition
//!   below first `True`. This is when the API showed it, after the
//!   kubelet's status write;
//! - **by its status** at the end of the load phase, in seconds after its
//!   `creationTimestamp`: `status.startTime` (the API's "acknowledged by
//!   the Kubelet", so the kubelet seeing it) and the `lastTransitionTime`
//!   of its conditions `PodScheduled` (bound by the scheduler),
//!   `Initialized` (init containers done: with none, as soon as the
//!   kubelet syncs it), `PodReadyToStartContainers` (its volumes mounted
//!   and its sandbox up), `ContainersReady` and `Ready`. These are the
//!   scheduler's and the kubelet's own times, taken before any status
//!   write, but whole seconds (Kubernetes writes times to the second), so
//!   each is ±1 s; and a hollow kubelet's fake runtime may turn
//!   `PodReadyToStartContainers` `True` after `Ready`.
//!
//! A step much later as watched than by its status is the kubelet's
//! status write's delay (its status manager writes one pod after another,
//! a `GET` and a `PATCH` each).

use std::time::Instant;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The conditions of a pod's start-up, in order, with their steps' names.
const CONDITIONS: [&str; 5] = [
    "PodScheduled",
    "Initialized",
    "PodReadyToStartContainers",
    "ContainersReady",
    "Ready",
];

/// What the watch keeps of one pod for [`PodTimes`].
#[derive(Debug, Default, Clone)]
pub(super) struct Status {
    /// `metadata.creationTimestamp`.
    created: Option<Timestamp>,
    /// `status.startTime`.
    started: Option<Timestamp>,
    /// Its conditions that are `True`, by type, with their
    /// `lastTransitionTime`, as of the latest event.
    conditions: Vec<(String, Option<Timestamp>)>,
    /// When the watch first saw it bound to a node, and first saw its
    /// `status.startTime`.
    bound: Option<Instant>,
    acknowledged: Option<Instant>,
    /// When the watch first saw each of [`CONDITIONS`] `True`.
    first_true: [Option<Instant>; 5],
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
                    time(&c["lastTransitionTime"]),
                ))
            })
            .collect();
        for (kind, first) in CONDITIONS.iter().zip(&mut self.first_true) {
            if self.conditions.iter().any(|(k, _)| k == kind) {
                first.get_or_insert(now);
            }
        }
    }
}

/// A pod's steps to running, each in seconds from its start (`None`: not
/// seen): scheduled, its kubelet's acknowledgement, then its conditions
/// `Initialized`, `PodReadyToStartContainers`, `ContainersReady`, `Ready`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Steps {
    pub scheduled_s: Option<f64>,
    pub kubelet_s: Option<f64>,
    pub initialized_s: Option<f64>,
    pub sandbox_s: Option<f64>,
    pub containers_ready_s: Option<f64>,
    pub ready_s: Option<f64>,
}

impl Steps {
    /// As "scheduled 0.11, kubelet 1.30, initialized 1.30, volumes and
    /// sandbox 20.10, containers ready 21.50, ready 21.50".
    fn show(&self, decimals: usize) -> String {
        let t = |t: Option<f64>| t.map_or("—".into(), |t| format!("{t:.decimals$}"));
        format!(
            "scheduled {}, kubelet {}, initialized {}, volumes and sandbox {}, containers ready {}, \
             ready {}",
            t(self.scheduled_s),
            t(self.kubelet_s),
            t(self.initialized_s),
            t(self.sandbox_s),
            t(self.containers_ready_s),
            t(self.ready_s),
        )
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
    /// As watched, seconds after `ADDED`.
    pub watched: Steps,
    /// By its status at the end of the load, seconds after its
    /// `creationTimestamp` (whole seconds).
    pub status: Steps,
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
                    .and_then(|(_, t)| *t),
            )
        };
        let [_, initialized, sandbox, containers_ready, ready] = s.first_true.map(watched);
        PodTimes {
            pod: pod.to_string(),
            node: node.to_string(),
            startup_s: running.saturating_duration_since(added).as_secs_f64(),
            watched: Steps {
                scheduled_s: watched(s.bound),
                kubelet_s: watched(s.acknowledged),
                initialized_s: initialized,
                sandbox_s: sandbox,
                containers_ready_s: containers_ready,
                ready_s: ready,
            },
            status: Steps {
                scheduled_s: condition(CONDITIONS[0]),
                kubelet_s: since_creation(s.started),
                initialized_s: condition(CONDITIONS[1]),
                sandbox_s: condition(CONDITIONS[2]),
                containers_ready_s: condition(CONDITIONS[3]),
                ready_s: condition(CONDITIONS[4]),
            },
        }
    }

    /// As "load-1/d-012-x on hollow-003: 21.52 s to running; as watched,
    /// s after its ADDED: scheduled 0.11, ...; by its status, whole s
    /// after its creation: scheduled 0, ...".
    pub fn show(&self) -> String {
        format!(
            "{} on {}: {:.2} s to running; as watched, s after its ADDED: {}; by its status, \
             whole s after its creation: {}",
            self.pod,
            self.node,
            self.startup_s,
            self.watched.show(2),
            self.status.show(0),
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
        let created = "2026-12-08T10:00:00Z";
        let second = |s: u32| format!("2026-12-08T10:00:{s:02}Z");
        // Each event's pod: bound or not, started or not, its conditions
        // (type, True, the second of their last transition).
        let pod = |bound: bool, started: bool, conditions: &[(&str, bool, u32)]| {
            json!({
                "metadata": {"creationTimestamp": created},
                "spec": if bound { json!({"nodeName": "hollow-003"}) } else { json!({}) },
                "status": {
                    "startTime": started.then(|| second(1)),
                    "conditions": conditions.iter().map(|(t, ok, s)| json!({
                        "type": t, "status": if *ok { "True" } else { "False" },
                        "lastTransitionTime": second(*s)})).collect::<Vec<_>>(),
                },
            })
        };
        let mut s = Status::default();
        s.update(&pod(false, false, &[]), t0);
        s.update(&pod(true, false, &[("PodScheduled", true, 0)]), at(110));
        let mut c = vec![
            ("PodScheduled", true, 0),
            ("Initialized", true, 1),
            ("PodReadyToStartContainers", false, 1),
            ("ContainersReady", false, 1),
            ("Ready", false, 1),
        ];
        s.update(&pod(true, true, &c), at(1300));
        c[2] = ("PodReadyToStartContainers", true, 20);
        s.update(&pod(true, true, &c), at(20_100));
        c[3] = ("ContainersReady", true, 21);
        c[4] = ("Ready", true, 21);
        s.update(&pod(true, true, &c), at(21_520));
        let p = PodTimes::of("load-1/d-012-x", "hollow-003", t0, at(21_520), &s);
        assert_eq!(
            p.show(),
            "load-1/d-012-x on hollow-003: 21.52 s to running; as watched, s after its ADDED: \
             scheduled 0.11, kubelet 1.30, initialized 1.30, volumes and sandbox 20.10, \
             containers ready 21.52, ready 21.52; by its status, whole s after its creation: \
             scheduled 0, kubelet 1, initialized 1, volumes and sandbox 20, containers ready 21, \
             ready 21"
        );
        // A pod never bound: its steps unknown, said so.
        let p = PodTimes::of("p", "", t0, t0, &Status::default());
        assert_eq!(p.watched, Steps::default());
        assert_eq!(p.status, Steps::default());
        assert!(p.show().contains("ADDED: scheduled —, kubelet —,"));
    }
}
