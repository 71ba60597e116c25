//! The validators: every recorded watch stream against etcd's own history
//! (the [`Reference`]), like etcd's robustness suite validates watches,
//! plus the Kubernetes properties (selectors, lists, bookmarks) and the
//! reads clients made.
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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::iter::Peekable;
use std::ops::Bound;

use crate::model::{Filter, Kind, ObjectKey, Observed, ReadObservation, Segment, Start};
use crate::reference::{Expected, Reference};

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
}

impl Property {
    /// Every property, in the order of reports.
    pub const ALL: [Property; 10] = [
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

/// An event as reports show it: `MODIFIED ns/name@12`.
fn show(kind: Kind, key: &ObjectKey, rv: u64) -> String {
    format!("{} {key}@{rv}", kind.as_str())
}

fn show_event(e: &(Kind, ObjectKey, u64)) -> String {
    show(e.0, &e.1, e.2)
}

/// The first key where two states differ, described (`None`: equal).
fn first_difference(
    got: &BTreeMap<ObjectKey, u64>,
    want: &BTreeMap<ObjectKey, u64>,
) -> Option<String> {
    let keys: BTreeSet<&ObjectKey> = got.keys().chain(want.keys()).collect();
    keys.into_iter().find_map(|k| {
        let describe = |v: Option<&u64>| v.map_or("absent".to_string(), |rv| format!("at {rv}"));
        let (g, w) = (got.get(k), want.get(k));
        (g != w).then(|| format!("{k} is {}, etcd has it {}", describe(g), describe(w)))
    })
}

/// A relist window that explains the stream from some position.
struct Window {
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
struct Walk<'a> {
    reference: &'a Reference,
    segment: &'a Segment,
    filter: &'a Filter,
    relists: &'a BTreeSet<u64>,
    anomalies: Vec<Anomaly>,
    events: usize,
    windows: usize,
    /// Object events seen in the segment.
    seen: HashSet<(Kind, ObjectKey, u64)>,
}

impl<'a> Walk<'a> {
    fn anomaly(&mut self, property: Property, detail: String) {
        self.anomalies.push(Anomaly {
            property,
            watcher: self.segment.watcher.clone(),
            target: self.segment.target.clone(),
            detail: format!("{}: {detail}", self.filter),
        });
    }

    /// The report of a segment whose validation stopped at an anomaly: the
    /// state is etcd's at the newest resourceVersion the segment showed.
    fn stopped(self, floor: u64) -> SegmentReport {
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

    fn queue(&self, from: u64) -> Peekable<Expected<'a>> {
        self.reference
            .expected_iter(self.filter, from, self.reference.head())
            .peekable()
    }

    /// Whether etcd's history has the event's object version (a deletion:
    /// a change of the key at that revision).
    fn in_reference(&self, kind: Kind, key: &ObjectKey, rv: u64) -> bool {
        let r = self.filter.resource;
        match kind {
            Kind::Added | Kind::Modified => self.reference.has_version(r, key, rv),
            Kind::Deleted => self.reference.has_change(r, key, rv),
        }
    }

    /// A relist window (with a list resourceVersion above `floor`) that
    /// explains the stream from position `i`, given the state so far and
    /// the resourceVersion reached.
    fn window(
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

/// Validates one segment of a watcher's stream against `reference`.
///
/// `before` is the watcher's state after its previous segment (`None` for
/// its first segment, or after a relist: then the segment starts with a
/// list or initial events). `relists` holds the resourceVersions at which
/// some proxy relisted this resource: the relist windows the stream may
/// contain.
///
/// The start: `From(s)` continues from `before` when it reached `s` (else
/// from etcd's state at `s`); `Listed` and `InitialEvents` must be etcd's
/// state at their resourceVersion. Then every event is compared with the
/// next one kube-apiserver would send; a mismatch not explained by a relist
/// window is classified (ordered, unique, bookmarkable, selector
/// transitions, valid, reliable or resumable) and ends the validation of
/// the segment. At the end the rebuilt state must be etcd's at the newest
/// resourceVersion reached (final state).
pub fn validate_segment(
    reference: &Reference,
    segment: &Segment,
    before: Option<&WatcherState>,
    relists: &BTreeSet<u64>,
) -> SegmentReport {
    let filter = &segment.filter;
    let items = &segment.events;
    let mut walk = Walk {
        reference,
        segment,
        filter,
        relists,
        anomalies: Vec::new(),
        events: 0,
        windows: 0,
        seen: HashSet::new(),
    };

    // The start: the state, the resourceVersion and where the changes begin.
    let (mut state, s, first) = match &segment.start {
        Start::From(s) => {
            let state = match before {
                Some(b) if b.rv == *s => b.state.clone(),
                _ => reference.state_at(filter, *s),
            };
            (state, *s, 0)
        }
        Start::Listed { rv, items: listed } => {
            let mut state = BTreeMap::new();
            for (key, item_rv) in listed {
                if let Some(old) = state.insert(key.clone(), *item_rv) {
                    walk.anomaly(
                        Property::InitialState,
                        format!("list at {rv} has {key} twice (at {old} and {item_rv})"),
                    );
                    return walk.stopped(*rv);
                }
            }
            let want = reference.state_at(filter, *rv);
            if let Some(d) = first_difference(&state, &want) {
                walk.anomaly(
                    Property::InitialState,
                    format!(
                        "list at {rv} ({} items, etcd {}): {d}",
                        state.len(),
                        want.len()
                    ),
                );
                return walk.stopped(*rv);
            }
            (state, *rv, 0)
        }
        Start::InitialEvents => {
            let mut state = BTreeMap::new();
            let mut end = None;
            for (i, item) in items.iter().enumerate() {
                match item {
                    Observed::Bookmark {
                        rv,
                        initial_events_end: true,
                    } => {
                        end = Some((i, *rv));
                        break;
                    }
                    Observed::Bookmark { .. } => {}
                    Observed::Event {
                        kind: Kind::Added,
                        key,
                        rv,
                    } => {
                        if !walk.seen.insert((Kind::Added, key.clone(), *rv)) {
                            walk.anomaly(
                                Property::Unique,
                                format!(
                                    "initial event {} delivered twice",
                                    show(Kind::Added, key, *rv)
                                ),
                            );
                            return walk.stopped(0);
                        }
                        if let Some(old) = state.insert(key.clone(), *rv) {
                            walk.anomaly(
                                Property::InitialState,
                                format!("initial events have {key} twice (at {old} and {rv})"),
                            );
                            return walk.stopped(0);
                        }
                    }
                    Observed::Event { kind, key, rv } => {
                        walk.anomaly(
                            Property::InitialState,
                            format!(
                                "{} among the initial events, before the initial-events-end bookmark",
                                show(*kind, key, *rv)
                            ),
                        );
                        return walk.stopped(0);
                    }
                }
            }
            let Some((i, s)) = end else {
                // Cut before the end of the initial events: nothing to
                // compare, and nothing to resume from.
                return SegmentReport {
                    anomalies: walk.anomalies,
                    events: 0,
                    windows: 0,
                    state: WatcherState { state, rv: 0 },
                };
            };
            let want = reference.state_at(filter, s);
            if let Some(d) = first_difference(&state, &want) {
                walk.anomaly(
                    Property::InitialState,
                    format!(
                        "initial events up to the bookmark at {s} ({} objects, etcd {}): {d}",
                        state.len(),
                        want.len()
                    ),
                );
                return walk.stopped(s);
            }
            walk.events += state.len();
            (state, s, i + 1)
        }
    };

    // The changes.
    let mut last = s;
    // The newest resourceVersion of an event (or the start).
    let mut last_event = s;
    // Whether an object event followed the start.
    let mut moved = false;
    // The list resourceVersion of the last window accepted.
    let mut window_floor = 0;
    let mut queue = walk.queue(s);
    let mut i = first;
    while let Some(item) = items.get(i) {
        match item {
            Observed::Bookmark { rv, .. } => {
                let rv = *rv;
                if rv < last {
                    walk.anomaly(
                        Property::Ordered,
                        format!("bookmark at {rv} after resourceVersion {last}"),
                    );
                    return walk.stopped(s);
                }
                if let Some(missed) = queue.peek().filter(|e| e.2 <= rv).cloned() {
                    if let Some(w) = walk.window(i, &state, last, window_floor) {
                        window_floor =
                            accept(&mut walk, w, &mut state, &mut last, &mut last_event, &mut i);
                        queue = walk.queue(window_floor);
                        moved = true;
                        continue;
                    }
                    walk.anomaly(
                        Property::Reliable,
                        format!("missed {} before the bookmark at {rv}", show_event(&missed)),
                    );
                    return walk.stopped(s);
                }
                last = rv;
                i += 1;
            }
            Observed::Event { kind, key, rv } => {
                let (kind, rv) = (*kind, *rv);
                let observed = (kind, key.clone(), rv);
                if rv <= last {
                    let (property, detail) = if walk.seen.contains(&observed) {
                        (
                            Property::Unique,
                            format!("{} delivered twice", show_event(&observed)),
                        )
                    } else if rv > last_event {
                        (
                            Property::Bookmarkable,
                            format!("{} after a bookmark at {last}", show_event(&observed)),
                        )
                    } else if !moved && rv <= s {
                        (
                            Property::Resumable,
                            format!("watch from {s} delivered {} first", show_event(&observed)),
                        )
                    } else {
                        (
                            Property::Ordered,
                            format!("{} after resourceVersion {last}", show_event(&observed)),
                        )
                    };
                    walk.anomaly(property, detail);
                    return walk.stopped(s);
                }
                if queue.peek() == Some(&observed) {
                    queue.next();
                    match kind {
                        Kind::Added | Kind::Modified => {
                            state.insert(key.clone(), rv);
                        }
                        Kind::Deleted => {
                            state.remove(key);
                        }
                    }
                    walk.seen.insert(observed);
                    walk.events += 1;
                    last = rv;
                    last_event = rv;
                    moved = true;
                    i += 1;
                    continue;
                }
                if let Some(w) = walk.window(i, &state, last, window_floor) {
                    window_floor =
                        accept(&mut walk, w, &mut state, &mut last, &mut last_event, &mut i);
                    queue = walk.queue(window_floor);
                    moved = true;
                    continue;
                }
                let (property, detail) = classify(&walk, &queue, i, &observed, moved, s);
                walk.anomaly(property, detail);
                return walk.stopped(s);
            }
        }
    }

    // The end: the rebuilt state is etcd's.
    let want = reference.state_at(filter, last);
    if let Some(d) = first_difference(&state, &want) {
        walk.anomaly(
            Property::FinalState,
            format!("state rebuilt from {s} to {last} differs: {d}"),
        );
        return walk.stopped(last);
    }
    SegmentReport {
        anomalies: walk.anomalies,
        events: walk.events,
        windows: walk.windows,
        state: WatcherState { state, rv: last },
    }
}

/// Takes an accepted relist window: its events are validated, the state is
/// etcd's at the list's resourceVersion. Returns that resourceVersion, where
/// the expected changes continue.
fn accept(
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

/// Why `observed`, at position `i`, is not the next expected event (no
/// relist window explaining it).
fn classify(
    walk: &Walk<'_>,
    queue: &Peekable<Expected<'_>>,
    i: usize,
    observed: &(Kind, ObjectKey, u64),
    moved: bool,
    s: u64,
) -> (Property, String) {
    let (kind, key, rv) = observed;
    let obs = show_event(observed);
    let next = queue.clone().peek().cloned();
    if let Some(ex) = &next
        && ex.1 == *key
        && ex.2 == *rv
    {
        return (
            Property::SelectorTransitions,
            format!("expected {}, observed {obs}", show_event(ex)),
        );
    }
    if !walk.in_reference(*kind, key, *rv) {
        let expected = next.as_ref().map_or("nothing".to_string(), show_event);
        let head = walk.reference.head();
        let beyond = if *rv > head {
            format!(", etcd's history recorded up to {head}")
        } else {
            String::new()
        };
        return (
            Property::Valid,
            format!("observed {obs}, which etcd never had (expected {expected}{beyond})"),
        );
    }
    if let Some(ex) = &next {
        let queued = || {
            queue
                .clone()
                .take_while(|e| e.2 <= *rv)
                .any(|e| e.1 == *key && e.2 == *rv)
        };
        if ex.2 < *rv || queued() {
            let later = walk.segment.events[i..].iter().any(|o| {
                matches!(o, Observed::Event { kind, key, rv } if *kind == ex.0 && *key == ex.1 && *rv == ex.2)
            });
            if later {
                return (
                    Property::Ordered,
                    format!("observed {obs} before {}", show_event(ex)),
                );
            }
            let property = if moved {
                Property::Reliable
            } else {
                Property::Resumable
            };
            let context = if moved {
                String::new()
            } else {
                format!(" (the first change after {s})")
            };
            return (
                property,
                format!("missed {}{context}, observed {obs}", show_event(ex)),
            );
        }
    }
    let expected = next.as_ref().map_or("nothing".to_string(), show_event);
    (
        Property::SelectorTransitions,
        format!("observed {obs}, which the filter does not select at {rv} (expected {expected})"),
    )
}

/// Validates reads: per client, in order, each list's resourceVersion is
/// at least its `NotOlderThan` one and at least the client's previous
/// reads' (no read goes back in time). One anomaly per read at most.
pub fn validate_reads(reads: &[ReadObservation]) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    // Per client: the newest resourceVersion read, and what read it.
    let mut newest: HashMap<&str, &ReadObservation> = HashMap::new();
    for read in reads {
        let detail = if let Some(n) = read.not_older_than
            && read.rv < n
        {
            Some(format!(
                "{} list not older than {n} got resourceVersion {}",
                read.resource, read.rv
            ))
        } else if let Some(prev) = newest.get(read.client.as_str())
            && read.rv < prev.rv
        {
            Some(format!(
                "{} list {} at {} (t={:.3}) after a {} list at {} (via {}, t={:.3})",
                read.resource,
                read.not_older_than
                    .map_or("resourceVersion=0".to_string(), |n| format!(
                        "not older than {n}"
                    )),
                read.rv,
                read.at,
                prev.resource,
                prev.rv,
                prev.target,
                prev.at
            ))
        } else {
            None
        };
        if let Some(detail) = detail {
            anomalies.push(Anomaly {
                property: Property::Reads,
                watcher: read.client.clone(),
                target: read.target.clone(),
                detail,
            });
        }
        let entry = newest.entry(read.client.as_str()).or_insert(read);
        if read.rv > entry.rv {
            *entry = read;
        }
    }
    anomalies
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{End, Requirement, Resource};
    use serde_json::{Value, json};

    fn pod(ns: &str, name: &str, app: &str, node: &str) -> Value {
        json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeName": node},
        })
    }

    fn k(ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(ns, name)
    }

    fn put(r: &mut Reference, rev: u64, ns: &str, name: &str, app: &str, node: &str) {
        let key = format!("/registry/pods/{ns}/{name}");
        r.record(rev, &key, Some(pod(ns, name, app, node)), None);
    }

    fn del(r: &mut Reference, rev: u64, ns: &str, name: &str) {
        r.record(rev, &format!("/registry/pods/{ns}/{name}"), None, None);
    }

    /// Start 10: a/p1 (web, n1) at 5, a/p2 (web, n2) at 8, b/p3 (db, n1)
    /// at 9, b/p6 (db, n2) at 7. Then:
    /// 11 create a/p4 (web, n1); 12 update a/p1; 13 a/p2 -> db;
    /// 14 delete a/p4; 15 b/p3 -> web; 16 update a/p1;
    /// 17 create a/p5 (web, n2); 18 update a/p1; 19 update b/p6 (db);
    /// progress to 20.
    ///
    /// For app=web from 10: ADDED p4@11, MODIFIED p1@12, DELETED p2@13,
    /// DELETED p4@14, ADDED p3@15, MODIFIED p1@16, ADDED p5@17,
    /// MODIFIED p1@18.
    fn reference() -> Reference {
        let mut r = Reference::new(
            10,
            vec![
                (Resource::Pods, k("a", "p1"), 5, pod("a", "p1", "web", "n1")),
                (Resource::Pods, k("a", "p2"), 8, pod("a", "p2", "web", "n2")),
                (Resource::Pods, k("b", "p3"), 9, pod("b", "p3", "db", "n1")),
                (Resource::Pods, k("b", "p6"), 7, pod("b", "p6", "db", "n2")),
            ],
        );
        put(&mut r, 11, "a", "p4", "web", "n1");
        put(&mut r, 12, "a", "p1", "web", "n1");
        put(&mut r, 13, "a", "p2", "db", "n2");
        del(&mut r, 14, "a", "p4");
        put(&mut r, 15, "b", "p3", "web", "n1");
        put(&mut r, 16, "a", "p1", "web", "n1");
        put(&mut r, 17, "a", "p5", "web", "n2");
        put(&mut r, 18, "a", "p1", "web", "n1");
        put(&mut r, 19, "b", "p6", "db", "n2");
        r.progress(20);
        r
    }

    fn web() -> Filter {
        Filter {
            labels: vec![Requirement::Equals("app".into(), "web".into())],
            ..Filter::all(Resource::Pods)
        }
    }

    fn ev(kind: Kind, ns: &str, name: &str, rv: u64) -> Observed {
        Observed::Event {
            kind,
            key: k(ns, name),
            rv,
        }
    }

    fn bm(rv: u64) -> Observed {
        Observed::Bookmark {
            rv,
            initial_events_end: false,
        }
    }

    fn end(rv: u64) -> Observed {
        Observed::Bookmark {
            rv,
            initial_events_end: true,
        }
    }

    use Kind::{Added as A, Deleted as D, Modified as M};

    /// The full correct stream for app=web from 10.
    fn full() -> Vec<Observed> {
        vec![
            ev(A, "a", "p4", 11),
            ev(M, "a", "p1", 12),
            ev(D, "a", "p2", 13),
            ev(D, "a", "p4", 14),
            ev(A, "b", "p3", 15),
            ev(M, "a", "p1", 16),
            ev(A, "a", "p5", 17),
            ev(M, "a", "p1", 18),
            bm(20),
        ]
    }

    fn segment(filter: Filter, start: Start, events: Vec<Observed>) -> Segment {
        Segment {
            watcher: "node-1/pods".into(),
            target: "proxy-1".into(),
            filter,
            start,
            events,
            end: End::Closed,
            started: 0.0,
            ended: 0.0,
        }
    }

    fn run(seg: &Segment, before: Option<&WatcherState>, relists: &[u64]) -> SegmentReport {
        let r = reference();
        validate_segment(&r, seg, before, &relists.iter().copied().collect())
    }

    fn map(items: &[(ObjectKey, u64)]) -> BTreeMap<ObjectKey, u64> {
        items.iter().cloned().collect()
    }

    fn final_web() -> BTreeMap<ObjectKey, u64> {
        map(&[(k("a", "p1"), 18), (k("a", "p5"), 17), (k("b", "p3"), 15)])
    }

    /// The single anomaly's property, and its detail.
    fn only(report: &SegmentReport) -> (Property, String) {
        assert_eq!(report.anomalies.len(), 1, "{:?}", report.anomalies);
        let a = &report.anomalies[0];
        assert_eq!(a.watcher, "node-1/pods");
        assert_eq!(a.target, "proxy-1");
        (a.property, a.detail.clone())
    }

    /// The one anomaly of the web watcher's stream from RV 10 carrying
    /// `events`.
    fn anomaly_from_10(events: Vec<Observed>) -> (Property, String) {
        only(&run(&segment(web(), Start::From(10), events), None, &[]))
    }

    #[test]
    fn property_names() {
        assert_eq!(
            Property::SelectorTransitions.to_string(),
            "selector transitions"
        );
        assert_eq!(Property::InitialState.as_str(), "initial state");
        let names: BTreeSet<&str> = Property::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(names.len(), 10);
        assert!(Property::ALL.iter().all(|p| !p.description().is_empty()));
    }

    #[test]
    fn exact_match() {
        let seg = segment(web(), Start::From(10), full());
        let report = run(&seg, None, &[]);
        assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
        assert_eq!(report.events, 8);
        assert_eq!(report.windows, 0);
        assert_eq!(
            report.state,
            WatcherState {
                state: final_web(),
                rv: 20
            }
        );
    }

    #[test]
    fn resumes_from_previous_segment() {
        let r = reference();
        let none = BTreeSet::new();
        let first = segment(web(), Start::From(10), full()[..3].to_vec());
        let a = validate_segment(&r, &first, None, &none);
        assert!(a.anomalies.is_empty(), "{:?}", a.anomalies);
        assert_eq!(a.state.rv, 13);
        let second = segment(web(), Start::From(13), full()[3..].to_vec());
        let b = validate_segment(&r, &second, Some(&a.state), &none);
        assert!(b.anomalies.is_empty(), "{:?}", b.anomalies);
        assert_eq!(b.events, 5);
        assert_eq!(b.state.state, final_web());
        // A resume from an RV the watcher got elsewhere: etcd's state.
        let other = WatcherState {
            state: BTreeMap::new(),
            rv: 3,
        };
        let c = validate_segment(&r, &second, Some(&other), &none);
        assert!(c.anomalies.is_empty(), "{:?}", c.anomalies);
    }

    #[test]
    fn missed_event_is_unreliable() {
        let mut events = full();
        events.remove(1); // MODIFIED a/p1@12
        let report = run(&segment(web(), Start::From(10), events), None, &[]);
        let (p, detail) = only(&report);
        assert_eq!(p, Property::Reliable);
        assert!(detail.contains("pods [app=web]"), "{detail}");
        assert!(detail.contains("MODIFIED a/p1@12"), "{detail}");
        assert!(detail.contains("DELETED a/p2@13"), "{detail}");
        assert_eq!(report.events, 1);
        // The state handed on is etcd's at the newest RV seen.
        assert_eq!(
            report.state,
            WatcherState {
                state: final_web(),
                rv: 20
            }
        );
    }

    #[test]
    fn missed_before_bookmark() {
        let mut events = full()[..2].to_vec();
        events.push(bm(14));
        let (p, detail) = anomaly_from_10(events);
        assert_eq!(p, Property::Reliable);
        assert!(
            detail.contains("missed DELETED a/p2@13 before the bookmark at 14"),
            "{detail}"
        );
    }

    #[test]
    fn first_event_skipped_is_unresumable() {
        let mut events = full();
        events.remove(0);
        let (p, detail) = anomaly_from_10(events);
        assert_eq!(p, Property::Resumable);
        assert!(detail.contains("ADDED a/p4@11"), "{detail}");
        // An event at or before the start.
        let events = vec![ev(M, "b", "p3", 9)];
        let (p, _) = anomaly_from_10(events);
        assert_eq!(p, Property::Resumable);
    }

    #[test]
    fn duplicate_is_not_unique() {
        let mut events = full();
        events.insert(2, ev(M, "a", "p1", 12));
        let (p, detail) = anomaly_from_10(events);
        assert_eq!(p, Property::Unique);
        assert!(
            detail.contains("MODIFIED a/p1@12 delivered twice"),
            "{detail}"
        );
    }

    #[test]
    fn out_of_order() {
        // 11, 13, 12: the "missed" event comes later.
        let mut events = full();
        events.swap(1, 2);
        let (p, detail) = anomaly_from_10(events);
        assert_eq!(p, Property::Ordered);
        assert!(detail.contains("before MODIFIED a/p1@12"), "{detail}");
        // An older event that was never delivered.
        let events = vec![
            ev(A, "a", "p4", 11),
            ev(M, "a", "p1", 12),
            ev(A, "b", "p3", 11),
        ];
        let (p, _) = anomaly_from_10(events);
        assert_eq!(p, Property::Ordered);
        // A bookmark going back.
        let events = vec![ev(A, "a", "p4", 11), ev(M, "a", "p1", 12), bm(11)];
        let (p, detail) = anomaly_from_10(events);
        assert_eq!(p, Property::Ordered);
        assert!(detail.contains("bookmark at 11"), "{detail}");
    }

    #[test]
    fn event_below_bookmark() {
        let mut events = full();
        events.push(ev(M, "a", "p1", 19));
        let (p, detail) = anomaly_from_10(events);
        assert_eq!(p, Property::Bookmarkable);
        assert!(
            detail.contains("MODIFIED a/p1@19 after a bookmark at 20"),
            "{detail}"
        );
    }

    #[test]
    fn selector_transitions() {
        // Moving out of the selector: DELETED expected, MODIFIED observed.
        let mut events = full();
        events[2] = ev(M, "a", "p2", 13);
        let (p, detail) = anomaly_from_10(events);
        assert_eq!(p, Property::SelectorTransitions);
        assert!(
            detail.contains("expected DELETED a/p2@13, observed MODIFIED a/p2@13"),
            "{detail}"
        );
        // Moving in: ADDED expected, MODIFIED observed.
        let mut events = full();
        events[4] = ev(M, "b", "p3", 15);
        let (p, _) = anomaly_from_10(events);
        assert_eq!(p, Property::SelectorTransitions);
        // An object the selector does not pick.
        let mut events = full();
        events.insert(8, ev(M, "b", "p6", 19));
        let (p, detail) = anomaly_from_10(events);
        assert_eq!(p, Property::SelectorTransitions);
        assert!(detail.contains("does not select"), "{detail}");
        // The nodeName field selector: p2 never was on n1.
        let n1 = Filter {
            fields: vec![Requirement::Equals("spec.nodeName".into(), "n1".into())],
            ..Filter::all(Resource::Pods)
        };
        let events = vec![
            ev(A, "a", "p4", 11),
            ev(M, "a", "p1", 12),
            ev(M, "a", "p2", 13),
        ];
        let (p, _) = only(&run(
            &segment(n1.clone(), Start::From(10), events),
            None,
            &[],
        ));
        assert_eq!(p, Property::SelectorTransitions);
        // ... and p3 was on n1 all along: MODIFIED at 15.
        let events = vec![
            ev(A, "a", "p4", 11),
            ev(M, "a", "p1", 12),
            ev(D, "a", "p4", 14),
            ev(M, "b", "p3", 15),
            bm(15),
        ];
        let report = run(&segment(n1, Start::From(10), events), None, &[]);
        assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
    }

    #[test]
    fn fabricated_events_are_invalid() {
        let mut events = full();
        events[2] = ev(M, "a", "p1", 13);
        let (p, detail) = anomaly_from_10(events);
        assert_eq!(p, Property::Valid);
        assert!(detail.contains("MODIFIED a/p1@13"), "{detail}");
        assert!(detail.contains("DELETED a/p2@13"), "{detail}");
        // A deletion etcd never saw.
        let mut events = full();
        events.insert(8, ev(D, "a", "p5", 19));
        let (p, _) = anomaly_from_10(events);
        assert_eq!(p, Property::Valid);
        // Beyond etcd's head.
        let mut events = full();
        events.push(ev(A, "a", "zz", 25));
        let (p, _) = anomaly_from_10(events);
        assert_eq!(p, Property::Valid);
    }

    /// The proxy was at 13 when it relisted at 18: p4's deletion at a free
    /// resourceVersion (16), p1 at its version of 18 only.
    fn window_stream() -> Vec<Observed> {
        vec![
            ev(A, "a", "p4", 11),
            ev(M, "a", "p1", 12),
            ev(D, "a", "p2", 13),
            ev(A, "b", "p3", 15),
            ev(D, "a", "p4", 16),
            ev(A, "a", "p5", 17),
            ev(M, "a", "p1", 18),
            bm(20),
        ]
    }

    #[test]
    fn relist_window_accepted() {
        let seg = segment(web(), Start::From(10), window_stream());
        let report = run(&seg, None, &[17, 18]);
        assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
        assert_eq!(report.windows, 1);
        assert_eq!(report.events, 7);
        assert_eq!(
            report.state,
            WatcherState {
                state: final_web(),
                rv: 20
            }
        );
        // A window collapsing a create and a delete (p4), from the start.
        let events = vec![
            ev(M, "a", "p1", 12),
            ev(D, "a", "p2", 13),
            ev(A, "b", "p3", 15),
            ev(M, "a", "p1", 16),
        ];
        let report = run(&segment(web(), Start::From(10), events), None, &[14]);
        assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
        assert_eq!(report.windows, 1);
        assert_eq!(report.state.rv, 16);
        // A segment cut right after a window whose list is newer than its
        // events.
        let events = window_stream()[..7].to_vec();
        let report = run(&segment(web(), Start::From(10), events), None, &[19]);
        assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
        assert_eq!(report.windows, 1);
        assert_eq!(report.state.rv, 18);
    }

    #[test]
    fn relist_window_rejected() {
        // No relist at 18.
        let seg = segment(web(), Start::From(10), window_stream());
        let (p, detail) = only(&run(&seg, None, &[17]));
        assert_eq!(p, Property::Reliable);
        assert!(detail.contains("missed DELETED a/p4@14"), "{detail}");
        // Not converging: p1's version of 18 missing.
        let mut events = window_stream();
        events.remove(6);
        let (p, _) = only(&run(&segment(web(), Start::From(10), events), None, &[18]));
        assert_eq!(p, Property::Reliable);
        // Deleting what the list still has.
        let mut events = window_stream();
        events.insert(6, ev(D, "b", "p3", 17));
        let report = run(&segment(web(), Start::From(10), events), None, &[18]);
        assert_eq!(report.windows, 0);
        assert_eq!(only(&report).0, Property::Reliable);
    }

    #[test]
    fn empty_relist_window() {
        // x created at 2 and deleted at 3: a proxy relisting at 3 sends
        // nothing for it.
        let mut r = Reference::new(1, vec![]);
        put(&mut r, 2, "a", "x", "web", "n1");
        del(&mut r, 3, "a", "x");
        put(&mut r, 4, "a", "y", "web", "n1");
        let seg = segment(web(), Start::From(1), vec![ev(A, "a", "y", 4), bm(4)]);
        let with = validate_segment(&r, &seg, None, &[3].into_iter().collect());
        assert!(with.anomalies.is_empty(), "{:?}", with.anomalies);
        assert_eq!(with.windows, 1);
        assert_eq!(with.state.state, map(&[(k("a", "y"), 4)]));
        let without = validate_segment(&r, &seg, None, &BTreeSet::new());
        assert_eq!(only(&without).0, Property::Resumable);
        // Before a bookmark.
        let seg = segment(web(), Start::From(1), vec![bm(3)]);
        let with = validate_segment(&r, &seg, None, &[3].into_iter().collect());
        assert!(with.anomalies.is_empty(), "{:?}", with.anomalies);
        let without = validate_segment(&r, &seg, None, &BTreeSet::new());
        assert_eq!(only(&without).0, Property::Reliable);
    }

    #[test]
    fn listed_start() {
        let items = vec![(k("a", "p1"), 12), (k("a", "p2"), 8), (k("a", "p4"), 11)];
        let events = full()[2..].to_vec();
        let good = run(
            &segment(
                web(),
                Start::Listed {
                    rv: 12,
                    items: items.clone(),
                },
                events.clone(),
            ),
            None,
            &[],
        );
        assert!(good.anomalies.is_empty(), "{:?}", good.anomalies);
        assert_eq!(good.events, 6);
        assert_eq!(good.state.state, final_web());
        // p1 at an older version.
        let mut stale = items.clone();
        stale[0].1 = 5;
        let bad = run(
            &segment(
                web(),
                Start::Listed {
                    rv: 12,
                    items: stale,
                },
                events.clone(),
            ),
            None,
            &[],
        );
        let (p, detail) = only(&bad);
        assert_eq!(p, Property::InitialState);
        assert!(
            detail.contains("a/p1 is at 5, etcd has it at 12"),
            "{detail}"
        );
        // An object missing.
        let bad = run(
            &segment(
                web(),
                Start::Listed {
                    rv: 12,
                    items: items[..2].to_vec(),
                },
                events,
            ),
            None,
            &[],
        );
        assert_eq!(only(&bad).0, Property::InitialState);
    }

    #[test]
    fn initial_events_start() {
        let mut events = vec![
            ev(A, "a", "p1", 12),
            bm(12),
            ev(A, "a", "p2", 8),
            ev(A, "a", "p4", 11),
            end(12),
        ];
        events.extend(full()[2..].to_vec());
        let good = run(
            &segment(web(), Start::InitialEvents, events.clone()),
            None,
            &[],
        );
        assert!(good.anomalies.is_empty(), "{:?}", good.anomalies);
        assert_eq!(good.events, 9);
        assert_eq!(
            good.state,
            WatcherState {
                state: final_web(),
                rv: 20
            }
        );
        // An initial event repeated after the end.
        let mut dup = events.clone();
        dup.insert(5, ev(A, "a", "p2", 8));
        assert_eq!(
            only(&run(&segment(web(), Start::InitialEvents, dup), None, &[])).0,
            Property::Unique
        );
        // A missing object.
        let mut missing = events.clone();
        missing.remove(2);
        let (p, detail) = only(&run(
            &segment(web(), Start::InitialEvents, missing),
            None,
            &[],
        ));
        assert_eq!(p, Property::InitialState);
        assert!(
            detail.contains("a/p2 is absent, etcd has it at 8"),
            "{detail}"
        );
        // A MODIFIED before the end.
        let mut modified = events.clone();
        modified[0] = ev(M, "a", "p1", 12);
        let (p, _) = only(&run(
            &segment(web(), Start::InitialEvents, modified),
            None,
            &[],
        ));
        assert_eq!(p, Property::InitialState);
        // Cut before the end: only duplicates count.
        let cut = run(
            &segment(web(), Start::InitialEvents, events[..4].to_vec()),
            None,
            &[],
        );
        assert!(cut.anomalies.is_empty());
        assert_eq!(cut.events, 0);
        assert_eq!(cut.state.rv, 0);
        let cut_dup = vec![ev(A, "a", "p1", 12), ev(A, "a", "p1", 12)];
        let report = run(&segment(web(), Start::InitialEvents, cut_dup), None, &[]);
        assert_eq!(only(&report).0, Property::Unique);
    }

    #[test]
    fn diverged_state_is_a_final_state_anomaly() {
        let before = WatcherState {
            state: map(&[(k("a", "p1"), 5), (k("a", "p2"), 8), (k("a", "zz"), 3)]),
            rv: 10,
        };
        let report = run(&segment(web(), Start::From(10), full()), Some(&before), &[]);
        let (p, detail) = only(&report);
        assert_eq!(p, Property::FinalState);
        assert!(
            detail.contains("a/zz is at 3, etcd has it absent"),
            "{detail}"
        );
        assert_eq!(report.state.state, final_web());
    }

    #[test]
    fn empty_segment() {
        let report = run(&segment(web(), Start::From(12), vec![]), None, &[]);
        assert!(report.anomalies.is_empty());
        assert_eq!(report.state.rv, 12);
        assert_eq!(
            report.state.state,
            map(&[(k("a", "p1"), 12), (k("a", "p2"), 8), (k("a", "p4"), 11)])
        );
    }

    fn read(client: &str, not_older_than: Option<u64>, rv: u64) -> ReadObservation {
        ReadObservation {
            client: client.into(),
            target: "proxy-1".into(),
            resource: Resource::Pods,
            not_older_than,
            rv,
            at: 0.0,
        }
    }

    #[test]
    fn reads() {
        let reads = vec![
            read("c1", None, 10),
            read("c2", Some(5), 5),
            read("c1", Some(12), 12),
            read("c1", None, 11),
            read("c2", Some(9), 8),
            read("c1", Some(3), 12),
            read("c2", None, 7),
        ];
        let anomalies = validate_reads(&reads);
        assert_eq!(anomalies.len(), 3, "{anomalies:?}");
        assert!(anomalies.iter().all(|a| a.property == Property::Reads));
        assert_eq!(anomalies[0].watcher, "c1");
        assert!(
            anomalies[0]
                .detail
                .contains("resourceVersion=0 at 11 (t=0.000) after a pods list at 12"),
            "{}",
            anomalies[0].detail
        );
        assert_eq!(anomalies[1].watcher, "c2");
        assert!(
            anomalies[1]
                .detail
                .contains("not older than 9 got resourceVersion 8"),
            "{}",
            anomalies[1].detail
        );
        assert_eq!(anomalies[2].watcher, "c2");
        assert!(validate_reads(&reads[..3]).is_empty());
    }
}
