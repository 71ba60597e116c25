//! One segment of a watcher's stream validated against etcd's history:
//! its start (a resourceVersion, a list or initial events), every event
//! against the next one kube-apiserver would send, and the state it ends in.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::iter::Peekable;

use crate::model::{Kind, ObjectKey, Observed, Segment, Start};
use crate::reference::{Expected, Reference};

use super::report::{Property, SegmentReport, WatcherState};
use super::walk::{Walk, accept};

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
