//! The state of one resource's watch cache: the current objects, a bounded
//! history of recent events, and the watchers with their dispatch index.
//! One writer (the reflector) and many readers share it behind one short
//! mutex that is never held across an `.await`.
//!
//! Mirrors the apiserver's `watchCache` + `Cacher` dispatch
//! (`staging/src/k8s.io/apiserver/pkg/storage/cacher/`), with two
//! departures:
//! - a relist does not close watchers: the difference between the cached
//!   and the new state is delivered as ordinary events, and the history
//!   stays continuous;
//! - dispatch never blocks: a watcher whose buffer is full is marked
//!   lagging and later catches up from the history on its own; one that
//!   stays blocked beyond a time budget, or whose resume point leaves the
//!   history, is closed so its client re-watches from its last RV.
//!
//! `state` holds the objects and the history (events, relists,
//! snapshots, where a watcher starts); `watchers` the watchers, their
//! index and their dispatch, catch-up and closing.

mod pack;
mod state;
mod watchers;

pub use pack::Listed;
pub use state::{Keys, Objects, Registration, Settings, Start, State, TooOld};
pub use watchers::{CatchUp, CloseReason, Delivery, Outcome, WatcherLink};

#[cfg(test)]
mod tests;
