//! Tests of [`validate_segment`]: the web watcher's streams from a small
//! history, each property violated once, relist windows, lists and
//! initial events.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::model::{End, Filter, Kind, ObjectKey, Observed, Requirement, Resource, Segment, Start};
use crate::reference::Reference;

use super::report::{Property, SegmentReport, WatcherState};
use super::segment::validate_segment;

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
        arrived: Vec::new(),
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
