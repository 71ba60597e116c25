//! What validation reports: the properties a watch stream (or a client's
//! reads) must have, an anomaly (a property violated), and what one
//! segment's validation returns and hands to the next.

use std::collections::BTreeMap;
use std::fmt;

use crate::model::ObjectKey;

/// A property a watch stream (or a client's reads) must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Property {
    /// Events arrive in increasing resourceVersion order; a bookmark never
    /// goes back.
    Ordered,
    /// No event is delivered twice.
    Unique,
    /// No event is missed: every change the filter selects is delivered,
    /// and before a bookmark every change up to its resourceVersion.
    Reliable,
    /// Every event is one etcd recorded: its object existed at that
    /// resourceVersion (a deletion: the key changed at that revision).
    Valid,
    /// A watch started from a resourceVersion continues exactly after it:
    /// its first event is the first change that followed.
    Resumable,
    /// After a bookmark, no event has a resourceVersion at or below the
    /// bookmark's.
    Bookmarkable,
    /// Selector transitions are delivered as kube-apiserver does: an
    /// object moving into the selector is ADDED, out of it DELETED, and
    /// objects the selector does not pick are not delivered.
    SelectorTransitions,
    /// A list (or a streaming list's initial events) is exactly etcd's
    /// state at its resourceVersion.
    InitialState,
    /// The state rebuilt from a stream is etcd's state at the stream's
    /// last resourceVersion.
    FinalState,
    /// No read goes back in time: a list is not older than asked, nor
    /// older than the client's previous reads.
    Reads,
    /// A change reaches a proxy's watchers within a bound of etcd having
    /// it, once an apiserver could tell the proxy (`freshness.rs`).
    Fresh,
}

impl Property {
    /// Every property, in the order of reports.
    pub const ALL: [Property; 11] = [
        Property::Ordered,
        Property::Unique,
        Property::Reliable,
        Property::Valid,
        Property::Resumable,
        Property::Bookmarkable,
        Property::SelectorTransitions,
        Property::InitialState,
        Property::FinalState,
        Property::Reads,
        Property::Fresh,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Property::Ordered => "ordered",
            Property::Unique => "unique",
            Property::Reliable => "reliable",
            Property::Valid => "valid",
            Property::Resumable => "resumable",
            Property::Bookmarkable => "bookmarkable",
            Property::SelectorTransitions => "selector transitions",
            Property::InitialState => "initial state",
            Property::FinalState => "final state",
            Property::Reads => "reads",
            Property::Fresh => "fresh",
        }
    }

    /// What the property asserts, in a sentence (for reports).
    pub fn description(self) -> &'static str {
        match self {
            Property::Ordered => {
                "events arrive in increasing resourceVersion order; bookmarks never go back"
            }
            Property::Unique => "no event is delivered twice",
            Property::Reliable => {
                "no event is missed, and none before a bookmark up to its resourceVersion"
            }
            Property::Valid => "every event is a change etcd recorded, at its resourceVersion",
            Property::Resumable => {
                "a watch from a resourceVersion continues with the first change after it"
            }
            Property::Bookmarkable => {
                "no event after a bookmark has a resourceVersion at or below the bookmark's"
            }
            Property::SelectorTransitions => {
                "objects entering a selector are ADDED, leaving it DELETED, others not sent"
            }
            Property::InitialState => {
                "a list or the initial events are etcd's state at their resourceVersion"
            }
            Property::FinalState => {
                "the state rebuilt from a stream is etcd's at the stream's last resourceVersion"
            }
            Property::Reads => "no read is older than asked, nor than the client's previous reads",
            Property::Fresh => {
                "a change reaches a proxy's watchers within the bound for the fault it came in"
            }
        }
    }
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A violation of a property by a watcher's (or client's) stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anomaly {
    pub property: Property,
    /// The watcher (or, for reads, the client).
    pub watcher: String,
    /// The proxy (or `apiserver`) it talked to.
    pub target: String,
    pub detail: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} via {}: {}",
            self.property, self.watcher, self.target, self.detail
        )
    }
}

/// Per watcher, what validation carries from one segment to the next: the
/// state the stream built (key -> resourceVersion) and the resourceVersion
/// it reached (0: none, the next segment starts afresh).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatcherState {
    pub state: BTreeMap<ObjectKey, u64>,
    pub rv: u64,
}

/// What validating one segment found.
#[derive(Debug, Clone)]
pub struct SegmentReport {
    pub anomalies: Vec<Anomaly>,
    /// Object events validated (initial events and relist windows' events
    /// included).
    pub events: usize,
    /// Relist windows accepted.
    pub windows: usize,
    /// The watcher's state after the segment.
    pub state: WatcherState,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn property_names() {
        assert_eq!(
            Property::SelectorTransitions.to_string(),
            "selector transitions"
        );
        assert_eq!(Property::InitialState.as_str(), "initial state");
        let names: BTreeSet<&str> = Property::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            names.len(),
            Property::ALL.len(),
            "property names are unique"
        );
        assert!(Property::ALL.iter().all(|p| !p.description().is_empty()));
    }
}
