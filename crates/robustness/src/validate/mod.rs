//! The validators: every recorded watch stream against etcd's own history
//! (the [`Reference`](crate::reference::Reference)), like etcd's
//! robustness suite validates watches, plus the Kubernetes properties
//! (selectors, lists, bookmarks) and the reads clients made.
//!
//! A watcher's streams are validated segment by segment (one per watch
//! request), each from the state the previous one left ([`WatcherState`]).
//! A segment is walked event by event against the events kube-apiserver
//! would have sent for the same filter from the same resourceVersion; the
//! first event that does not fit is classified ([`Property`]) and ends the
//! segment's validation: one anomaly per segment is enough, and the state
//! handed to the next segment is then etcd's, so one root cause is not
//! reported again and again.
//!
//! A proxy that relists (after a `410 Gone` upstream, or to heal a
//! divergence) does not cut its watchers off: it sends the difference
//! between its cache and the new list as ordinary events, with
//! resourceVersions between its old one and the list's, collapsing
//! intermediate versions. Such a relist window is accepted when it brings
//! the watcher exactly to etcd's state at the list's resourceVersion.
//!
//! `freshness`: how long after etcd each change reached each watcher, and
//! the bound a proxy's must keep; `report`: the properties, anomalies and
//! what a segment's validation returns; `segment`: one segment from its start to its end; `walk`: what
//! the walk carries, and relist windows; `reads`: clients' reads.

pub mod freshness;
mod reads;
mod report;
mod segment;
mod walk;

pub use reads::validate_reads;
pub use report::{Anomaly, Property, SegmentReport, WatcherState};
pub use segment::validate_segment;

#[cfg(test)]
mod tests;
