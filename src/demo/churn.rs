//! What changes in the demo cluster, so that `kubectl get pods -A -w` has
//! something to show: a fixed, bounded schedule driven by a tick counter
//! (one tick every [`TICK`]).
//!
//! - every tick, ConfigMap `demo/heartbeat`'s `data.tick` is set to the
//!   tick's number;
//! - ticks 1, 4, 7… create Pod `demo/churn-<k>` (`k` = tick / 3), Pending
//!   (`ContainerCreating`); the next tick it is Running; the tick after
//!   that it is deleted: at most one churn pod exists at a time;
//! - ticks 5, 10, 15… Pod `demo/flaky-0`'s container crashes
//!   (`CrashLoopBackOff`, one more restart); two ticks later it runs again,
//!   and `kubectl get pods` shows its restarts as `n (Xs ago)`.

use std::time::Duration;

use serde_json::{Value, json};

use super::objects::{ContainerState, FLAKY, gvr, pod};
use kube_apiserver_sim::Sim;

/// The interval between two ticks.
pub const TICK: Duration = Duration::from_secs(2);
/// The node the churn pods and `flaky-0` run on.
const CHURN_NODE: usize = 2;

/// The churn's state between ticks.
#[derive(Debug, Default)]
pub struct Churn {
    tick: u64,
    restarts: u32,
    last_crash: Option<String>,
}

/// `now` as `metav1.Time` encodes it.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

// === impl Churn ===

impl Churn {
    /// Applies the next tick's changes to `sim`. Errors are logged and
    /// skipped: the demo goes on.
    pub fn step(&mut self, sim: &Sim) {
        self.tick += 1;
        let tick = self.tick;
        let now = now_rfc3339();
        let pods = gvr("", "v1", "pods");
        let cms = gvr("", "v1", "configmaps");
        update(sim, &cms, "heartbeat", |cm| {
            cm["data"]["tick"] = json!(tick.to_string());
        });
        let k = tick / 3;
        let churn = |k: u64| format!("churn-{k}");
        match tick % 3 {
            1 => {
                let p = pod(
                    "demo",
                    &churn(k),
                    "churn",
                    CHURN_NODE,
                    100 + (k % 100) as usize,
                    &ContainerState::Creating,
                    &now,
                );
                if let Err(status) = sim.create(&pods, p) {
                    tracing::warn!(message = %status.message, "demo churn: create");
                }
            }
            2 => {
                let running = pod(
                    "demo",
                    &churn(k),
                    "churn",
                    CHURN_NODE,
                    100 + (k % 100) as usize,
                    &ContainerState::Running {
                        restarts: 0,
                        last_finished: None,
                    },
                    &now,
                );
                update(sim, &pods, &churn(k), |p| {
                    p["status"] = running["status"].clone()
                });
            }
            _ => {
                if let Err(status) = sim.delete(&pods, "demo", &churn(k - 1)) {
                    tracing::warn!(message = %status.message, "demo churn: delete");
                }
            }
        }
        let state = match tick % 5 {
            0 => {
                self.restarts += 1;
                self.last_crash = Some(now.clone());
                Some(ContainerState::CrashLoopBackOff {
                    restarts: self.restarts,
                    last_finished: now.clone(),
                })
            }
            2 if self.restarts > 0 => Some(ContainerState::Running {
                restarts: self.restarts,
                last_finished: self.last_crash.clone(),
            }),
            _ => None,
        };
        if let Some(state) = state {
            let next = pod("demo", FLAKY, "flaky", CHURN_NODE, 99, &state, &now);
            update(sim, &pods, FLAKY, |p| p["status"] = next["status"].clone());
        }
    }
}

/// Rewrites `demo/<name>` with `change` applied.
fn update(
    sim: &Sim,
    gvr: &apimachinery::resource::Gvr,
    name: &str,
    change: impl FnOnce(&mut Value),
) {
    let Some(mut object) = sim.get(gvr, "demo", name) else {
        return;
    };
    change(&mut object);
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    if let Err(status) = sim.update(gvr, object) {
        tracing::warn!(%name, message = %status.message, "demo churn: update");
    }
}
