//! One segment's walk: what validating it carries along (the anomalies,
//! the events seen), and the relist windows that may explain a stretch of
//! its stream: a proxy's relist delivered as ordinary events.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::iter::Peekable;
use std::ops::Bound;

use crate::model::{Filter, Kind, ObjectKey, Observed, Segment};
use crate::reference::{Expected, Reference};

use super::report::{Anomaly, Property, SegmentReport, WatcherState};

/// A relist window that explains the stream from some position.
pub(super) struct Window {
    /// The list's resourceVersion.
    list: u64,
    /// The position after the window.
    next: usize,
    state: BTreeMap<ObjectKey, u64>,
    /// The newest resourceVersion in the window (bookmarks included), and
    /// of its events.
    max_rv: Option<u64>,
    max_event_rv: Option<u64>,
    events: Vec<(Kind, ObjectKey, u64)>,
}

/// One segment's walk.
pub(super) struct Walk<'a> {
    pub(super) reference: &'a Reference,
    pub(super) segment: &'a Segment,
    pub(super) filter: &'a Filter,
    pub(super) relists: &'a BTreeSet<u64>,
    pub(super) anomalies: Vec<Anomaly>,
    pub(super) events: usize,
    pub(super) windows: usize,
    /// Object events seen in the segment.
    pub(super) seen: HashSet<(Kind, ObjectKey, u64)>,
}

impl<'a> Walk<'a> {
    pub(super) fn anomaly(&mut self, property: Property, detail: String) {
        self.anomalies.push(Anomaly {
            property,
            watcher: self.segment.watcher.clone(),
            target: self.segment.target.clone(),
            detail: format!("{}: {detail}", self.filter),
        });
    }

    /// The report of a segment whose validation stopped at an anomaly: the
    /// state is etcd's at the newest resourceVersion the segment showed.
    pub(super) fn stopped(self, floor: u64) -> SegmentReport {
        let e = self
            .segment
            .events
            .iter()
            .map(Observed::rv)
            .fold(floor, u64::max);
        SegmentReport {
            state: WatcherState {
                state: self.reference.state_at(self.filter, e),
                rv: e,
            },
            anomalies: self.anomalies,
            events: self.events,
            windows: self.windows,
        }
    }

    pub(super) fn queue(&self, from: u64) -> Peekable<Expected<'a>> {
        self.reference
            .expected_iter(self.filter, from, self.reference.head())
            .peekable()
    }

    /// Whether etcd's history has the event's object version (a deletion:
    /// a change of the key at that revision).
    pub(super) fn in_reference(&self, kind: Kind, key: &ObjectKey, rv: u64) -> bool {
        let r = self.filter.resource;
        match kind {
            Kind::Added | Kind::Modified => self.reference.has_version(r, key, rv),
            Kind::Deleted => self.reference.has_change(r, key, rv),
        }
    }

    /// A relist window (with a list resourceVersion above `floor`) that
    /// explains the stream from position `i`, given the state so far and
    /// the resourceVersion reached.
    pub(super) fn window(
        &self,
        i: usize,
        state: &BTreeMap<ObjectKey, u64>,
        last: u64,
        floor: u64,
    ) -> Option<Window> {
        let items = &self.segment.events;
        let resource = self.filter.resource;
        // Lists beyond what the segment shows are tried once: a window the
        // segment was cut right after.
        let shown = items[i..].iter().map(Observed::rv).max().unwrap_or(last);
        let mut beyond = false;
        'candidates: for &list in self
            .relists
            .range((Bound::Excluded(last.max(floor)), Bound::Unbounded))
        {
            if list > shown {
                if beyond {
                    break;
                }
                beyond = true;
            }
            let mut state = state.clone();
            let mut prev = last;
            let mut max_rv = None;
            let mut max_event_rv = None;
            let mut events = Vec::new();
            let mut deleted = Vec::new();
            let mut next = i;
            while let Some(item) = items.get(next).filter(|o| o.rv() <= list) {
                next += 1;
                max_rv = max_rv.max(Some(item.rv()));
                let Observed::Event { kind, key, rv } = item else {
                    continue;
                };
                let rv = *rv;
                if rv <= prev {
                    continue 'candidates;
                }
                prev = rv;
                match kind {
                    Kind::Added | Kind::Modified => {
                        // The object's version as of the list, selected.
                        let fits = self
                            .reference
                            .version_at(resource, key, list)
                            .is_some_and(|v| v.rv == rv && self.filter.matches(&v.object));
                        if !fits {
                            continue 'candidates;
                        }
                        state.insert(key.clone(), rv);
                    }
                    Kind::Deleted => {
                        // Something the watcher has, gone from the list.
                        if state.remove(key).is_none() {
                            continue 'candidates;
                        }
                        deleted.push(key);
                    }
                }
                max_event_rv = Some(rv);
                events.push((*kind, key.clone(), rv));
            }
            let target = self.reference.state_at(self.filter, list);
            if state == target && deleted.iter().all(|k| !target.contains_key(*k)) {
                return Some(Window {
                    list,
                    next,
                    state,
                    max_rv,
                    max_event_rv,
                    events,
                });
            }
        }
        None
    }
}

/// Takes an accepted relist window: its events are validated, the state is
/// etcd's at the list's resourceVersion. Returns that resourceVersion, where
/// the expected changes continue.
pub(super) fn accept(
    walk: &mut Walk<'_>,
    w: Window,
    state: &mut BTreeMap<ObjectKey, u64>,
    last: &mut u64,
    last_event: &mut u64,
    i: &mut usize,
) -> u64 {
    walk.windows += 1;
    walk.events += w.events.len();
    walk.seen.extend(w.events);
    *state = w.state;
    // Lenient: the resourceVersion reached is the newest the window showed
    // (later events are above the list's anyway).
    *last = (*last).max(w.max_rv.unwrap_or(0));
    *last_event = (*last_event).max(w.max_event_rv.unwrap_or(0));
    *i = w.next;
    w.list
}
