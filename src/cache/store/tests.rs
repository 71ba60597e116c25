//! Tests of the store: dispatch through the index and shared filters,
//! replay and `too old`, snapshots at older RVs, relists as events, and
//! lagging, blocked and overrun watchers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use apimachinery::resource::FieldSet;
use apimachinery::selector::LabelSelector;

use crate::cache::event::EventType;
use crate::cache::filter::Filter;
use crate::cache::object::CachedObject;

use super::state::{Registration, Settings, Start, State, TooOld};
use super::watchers::{CatchUp, Delivery};

fn settings(cap: usize, buffer: usize) -> Settings {
    Settings {
        history_capacity: cap,
        history_max_age: Duration::from_secs(300),
        watcher_buffer: buffer,
        blocked_budget: Duration::from_secs(10),
        node_indexed: true,
        namespaced: true,
        field_set: FieldSet::Pod,
        history_bytes: None,
    }
}

fn pod(name: &str, rv: u64, node: &str, app: &str) -> CachedObject {
    let json = format!(
        r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}","labels":{{"app":"{app}"}}}},"spec":{{"nodeName":"{node}"}}}}"#
    );
    CachedObject::from_json(json.as_bytes(), FieldSet::Pod, true).unwrap()
}

fn all() -> Arc<Filter> {
    Arc::new(Filter::default())
}

fn on_node(n: &str) -> Arc<Filter> {
    Arc::new(Filter {
        fields: apimachinery::selector::FieldSelector::parse(&format!("spec.nodeName={n}"))
            .unwrap(),
        ..Filter::default()
    })
}

fn types(rx: &mut mpsc::Receiver<Delivery>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(d) = rx.try_recv() {
        let frame = d
            .event
            .frame(d.which, crate::cache::negotiate::Representation::JSON, None)
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&frame).unwrap();
        out.push(format!(
            "{} {} {}",
            v["type"].as_str().unwrap(),
            v["object"]["metadata"]["name"].as_str().unwrap(),
            d.rv
        ));
    }
    out
}

fn synced(cap: usize, buffer: usize) -> State {
    let mut s = State::new(settings(cap, buffer));
    s.replace(
        vec![pod("a", 5, "n1", "x"), pod("b", 6, "n2", "x")],
        10,
        Instant::now(),
    );
    s
}

#[test]
fn dispatch_uses_the_node_index() {
    let mut s = synced(100, 10);
    let mut r1 = s.register(on_node("n1"), Start::After(10)).unwrap();
    let mut r2 = s.register(on_node("n2"), Start::After(10)).unwrap();
    let mut rall = s.register(all(), Start::After(10)).unwrap();
    let now = Instant::now();
    let o = s.apply(EventType::Modified, pod("a", 11, "n1", "y"), now);
    assert_eq!(o.dispatched, 2);
    assert_eq!(types(&mut r1.rx), vec!["MODIFIED a 11"]);
    assert!(types(&mut r2.rx).is_empty());
    assert_eq!(types(&mut rall.rx), vec!["MODIFIED a 11"]);
    // Stale events are ignored.
    assert!(
        s.apply(EventType::Modified, pod("a", 11, "n1", "z"), now)
            .stale
    );
    s.apply(EventType::Deleted, pod("b", 12, "n2", "x"), now);
    assert_eq!(types(&mut r2.rx), vec!["DELETED b 12"]);
    assert_eq!(s.objects().len(), 1);
}

#[test]
fn watchers_with_equal_selectors_share_one_filter_and_each_get_the_event() {
    let mut s = synced(100, 10);
    let app = |v: &str| {
        Arc::new(Filter {
            labels: LabelSelector::parse(&format!("app={v}")).unwrap(),
            ..Filter::default()
        })
    };
    let mut xs: Vec<Registration> = (0..3)
        .map(|_| s.register(app("x"), Start::After(10)).unwrap())
        .collect();
    let mut y = s.register(app("y"), Start::After(10)).unwrap();
    assert_eq!(s.filters().len(), 2);
    assert_eq!(s.filters().get(&app("x")), Some(&3));
    // `a` leaves `app=x` for `app=y`: the three `x` watchers see it go,
    // the `y` watcher sees it come.
    let o = s.apply(EventType::Modified, pod("a", 11, "n1", "y"), Instant::now());
    assert_eq!(o.dispatched, 4);
    for r in &mut xs {
        assert_eq!(types(&mut r.rx), vec!["DELETED a 11"]);
    }
    assert_eq!(types(&mut y.rx), vec!["ADDED a 11"]);
    for r in &xs {
        s.unregister(r.id);
    }
    assert_eq!(s.filters().len(), 1);
    s.unregister(y.id);
    assert!(s.filters().is_empty());
}

#[test]
fn replay_and_too_old() {
    let mut s = synced(2, 10);
    let now = Instant::now();
    for rv in 11..=14 {
        s.apply(EventType::Modified, pod("a", rv, "n1", "x"), now);
    }
    // History holds 13, 14: resumable from 12.
    assert_eq!(s.floor(), 12);
    assert_eq!(
        s.register(all(), Start::After(11)).unwrap_err(),
        TooOld {
            requested: 11,
            floor: 12
        }
    );
    let r = s.register(all(), Start::After(12)).unwrap();
    assert_eq!(
        r.replay.iter().map(|e| e.rv).collect::<Vec<_>>(),
        vec![13, 14]
    );
    let r = s.register(all(), Start::After(99)).unwrap();
    assert!(r.replay.is_empty());
    assert_eq!(r.min_rv, 99);
}

#[test]
fn snapshots_at_older_versions() {
    let mut s = synced(100, 10);
    let now = Instant::now();
    s.apply(EventType::Added, pod("c", 11, "n1", "x"), now);
    s.apply(EventType::Modified, pod("a", 12, "n1", "y"), now);
    s.apply(EventType::Deleted, pod("b", 13, "n2", "x"), now);
    let at = |rv| {
        s.snapshot_at(rv)
            .unwrap()
            .values()
            .map(|o| format!("{}@{}", o.name(), o.rv))
            .collect::<Vec<_>>()
    };
    assert_eq!(at(10), vec!["a@5", "b@6"]);
    assert_eq!(at(11), vec!["a@5", "b@6", "c@11"]);
    assert_eq!(at(12), vec!["a@12", "b@6", "c@11"]);
    assert_eq!(at(13), vec!["a@12", "c@11"]);
    assert!(s.snapshot_at(9).is_none());
    assert!(s.snapshot_at(14).is_none());
}

#[test]
fn relist_becomes_events_with_distinct_rvs() {
    let mut s = synced(100, 10);
    let mut r = s.register(all(), Start::After(10)).unwrap();
    // Upstream moved on to 20: a changed (rv 15), b gone, c new (rv 17).
    let o = s.replace(
        vec![pod("a", 15, "n1", "x"), pod("c", 17, "n1", "x")],
        20,
        Instant::now(),
    );
    assert_eq!(o.events, 3);
    assert_eq!(o.closed_reset, 0);
    assert_eq!(
        types(&mut r.rx),
        vec!["MODIFIED a 15", "ADDED c 17", "DELETED b 20"]
    );
    assert_eq!(s.rv(), 20);
    // History stays continuous: resuming from 10 replays the diff.
    let r2 = s.register(all(), Start::After(10)).unwrap();
    assert_eq!(r2.replay.len(), 3);
}

#[test]
fn relist_delivers_missed_versions_late_at_free_rvs() {
    let mut s = synced(100, 10);
    let mut r = s.register(all(), Start::After(10)).unwrap();
    let now = Instant::now();
    // The cache missed a's change at 8 and c's creation at 9 (below
    // its RV, 10), then saw 11.
    s.apply(EventType::Added, pod("d", 11, "n1", "x"), now);
    assert_eq!(types(&mut r.rx), vec!["ADDED d 11"]);
    let o = s.replace(
        vec![
            pod("a", 8, "n1", "x"),
            pod("b", 6, "n2", "x"),
            pod("c", 9, "n1", "x"),
            pod("d", 11, "n1", "x"),
        ],
        14,
        now,
    );
    assert_eq!(o.closed_reset, 0);
    // Delivered at free RVs after 11, each object as upstream has it.
    let frames: Vec<(u64, String, String)> = {
        let mut out = Vec::new();
        while let Ok(d) = r.rx.try_recv() {
            let frame = d
                .event
                .frame(d.which, crate::cache::negotiate::Representation::JSON, None)
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&frame).unwrap();
            out.push((
                d.rv,
                v["type"].as_str().unwrap().to_string(),
                format!(
                    "{}@{}",
                    v["object"]["metadata"]["name"].as_str().unwrap(),
                    v["object"]["metadata"]["resourceVersion"].as_str().unwrap()
                ),
            ));
        }
        out
    };
    assert_eq!(
        frames,
        vec![
            (13, "MODIFIED".to_string(), "a@8".to_string()),
            (14, "ADDED".to_string(), "c@9".to_string()),
        ]
    );
    assert_eq!(s.rv(), 14);
    let state: Vec<String> = s
        .objects()
        .values()
        .map(|o| format!("{}@{}", o.name(), o.rv))
        .collect();
    assert_eq!(state, ["a@8", "b@6", "c@9", "d@11"]);
    // No free RV left for a third: the cache resets.
    let o = s.replace(vec![pod("e", 3, "n1", "x")], 14, now);
    assert_eq!(o.closed_reset, 1);
}

#[test]
fn a_relist_skips_the_rvs_between_and_closes_watchers_ahead_of_the_cache() {
    // The cache is at 10 (a snapshot, say); a client resumes from 15,
    // an RV it got from a process that was further on.
    let mut s = synced(100, 10);
    let ahead = s.register(all(), Start::After(15)).unwrap();
    let mut behind = s.register(all(), Start::After(10)).unwrap();
    // Upstream at 20: a changed at 12, b deleted (when? not said).
    s.replace(vec![pod("a", 12, "n1", "x")], 20, Instant::now());
    // The watcher at 15 held a state the difference was not made
    // from: closed, and a re-watch from 15 is refused (it passes
    // through upstream, which has the real history).
    assert!(ahead.link.is_closed());
    assert_eq!(types(&mut behind.rx), vec!["MODIFIED a 12", "DELETED b 20"]);
    assert!(s.register(all(), Start::After(15)).is_err());
    assert!(s.register(all(), Start::After(12)).is_err());
    assert!(s.snapshot_at(15).is_none());
    // From either end it is exact.
    assert!(s.register(all(), Start::After(10)).is_ok());
    assert!(s.register(all(), Start::After(20)).is_ok());
    assert_eq!(s.snapshot_at(10).unwrap().len(), 2);
    assert_eq!(s.snapshot_at(20).unwrap().len(), 1);
}

#[test]
fn after_a_crash_the_rvs_between_the_snapshot_and_the_caught_up_cache_are_disowned() {
    // Resumed from a crash's snapshot at 10; a client resumes from 14, an
    // RV the crashed process served, and waits for the cache to reach it.
    let mut s = synced(100, 10);
    let waiting = s.register(all(), Start::After(14)).unwrap();
    let mut from_snapshot = s.register(all(), Start::After(10)).unwrap();
    let now = Instant::now();
    s.apply(EventType::Modified, pod("a", 12, "n1", "x"), now);
    s.apply(EventType::Deleted, pod("b", 15, "n2", "x"), now);
    s.apply(EventType::Added, pod("c", 16, "n1", "x"), now);
    // Caught up at 16: 11..=15 are disowned.
    let (to, o) = s.disown_since(10);
    assert_eq!((to, o.closed_reset), (16, 1));
    assert!(waiting.link.is_closed());
    assert_eq!(
        types(&mut from_snapshot.rx),
        vec!["MODIFIED a 12", "DELETED b 15", "ADDED c 16"]
    );
    assert_eq!(
        s.register(all(), Start::After(14)).unwrap_err(),
        TooOld {
            requested: 14,
            floor: 16
        }
    );
    assert!(s.register(all(), Start::After(11)).is_err());
    assert!(s.snapshot_at(12).is_none());
    // The snapshot's own RV and the cache's are exact: a client that
    // lists now and watches from what it got is served.
    assert!(s.register(all(), Start::After(10)).is_ok());
    assert!(s.register(all(), Start::After(16)).is_ok());
    assert_eq!(s.snapshot_at(10).unwrap().len(), 2);
    // Nothing between (caught up at once): nothing is disowned.
    let mut s = synced(100, 10);
    s.progress(11);
    assert_eq!(s.disown_since(10).0, 11);
    assert!(s.register(all(), Start::After(10)).is_ok());
    assert!(s.register(all(), Start::After(11)).is_ok());
}

#[test]
fn relist_that_cannot_be_expressed_resets() {
    let mut s = synced(100, 10);
    let r = s.register(all(), Start::After(10)).unwrap();
    // Two deletions but only one free RV in (10, 11].
    let o = s.replace(vec![], 11, Instant::now());
    assert_eq!(o.closed_reset, 1);
    assert!(r.link.is_closed());
    assert_eq!(s.floor(), 11);
    assert_eq!(s.objects().len(), 0);
}

#[test]
fn full_buffer_lags_then_catches_up_from_history() {
    let mut s = synced(100, 2);
    let mut r = s.register(all(), Start::After(10)).unwrap();
    let now = Instant::now();
    for rv in 11..=15 {
        s.apply(EventType::Modified, pod("a", rv, "n1", "x"), now);
    }
    assert!(r.link.is_lagging());
    assert_eq!(types(&mut r.rx), vec!["MODIFIED a 11", "MODIFIED a 12"]);
    let CatchUp::Frames { frames, done } = s.catch_up(r.id, 2, now) else {
        panic!("closed");
    };
    assert_eq!(
        frames.iter().map(|d| d.rv).collect::<Vec<_>>(),
        vec![13, 14]
    );
    assert!(!done);
    let CatchUp::Frames { frames, done } = s.catch_up(r.id, 2, now) else {
        panic!("closed");
    };
    assert_eq!(frames.iter().map(|d| d.rv).collect::<Vec<_>>(), vec![15]);
    assert!(done);
    assert!(!r.link.is_lagging());
    s.apply(EventType::Modified, pod("a", 16, "n1", "x"), now);
    assert_eq!(types(&mut r.rx), vec!["MODIFIED a 16"]);
}

#[test]
fn blocked_watcher_is_closed_after_budget_without_slowing_others() {
    let mut s = synced(100, 1);
    let slow = s.register(all(), Start::After(10)).unwrap();
    let mut fast = s.register(all(), Start::After(10)).unwrap();
    let t0 = Instant::now();
    // Fast drains as it goes; slow never reads.
    s.apply(EventType::Modified, pod("a", 11, "n1", "x"), t0);
    assert_eq!(types(&mut fast.rx).len(), 1);
    s.apply(EventType::Modified, pod("a", 12, "n1", "x"), t0);
    assert_eq!(types(&mut fast.rx).len(), 1);
    assert!(slow.link.is_lagging());
    assert!(!fast.link.is_lagging());
    let later = t0 + Duration::from_secs(11);
    let o = s.apply(EventType::Modified, pod("a", 13, "n1", "x"), later);
    assert_eq!(types(&mut fast.rx).len(), 1);
    assert_eq!(o.closed_slow, 1);
    assert!(slow.link.is_closed());
    assert_eq!(s.watcher_count(), 1);
}

#[test]
fn lagging_watcher_overrun_by_history_is_closed() {
    let mut s = synced(3, 1);
    let r = s.register(all(), Start::After(10)).unwrap();
    let now = Instant::now();
    for rv in 11..=20 {
        s.apply(EventType::Modified, pod("a", rv, "n1", "x"), now);
    }
    assert!(r.link.is_closed());
    assert!(matches!(s.catch_up(r.id, 10, now), CatchUp::Closed));
}

#[test]
fn history_is_bounded_by_age() {
    let mut s = synced(100, 10);
    let t0 = Instant::now();
    s.apply(EventType::Modified, pod("a", 11, "n1", "x"), t0);
    s.apply(
        EventType::Modified,
        pod("a", 12, "n1", "x"),
        t0 + Duration::from_secs(200),
    );
    assert_eq!(s.history_len(), 2);
    assert!(s.register(all(), Start::After(10)).is_ok());
    // 301 s after the first: it leaves; the second (101 s old) stays.
    s.apply(
        EventType::Modified,
        pod("a", 13, "n1", "x"),
        t0 + Duration::from_secs(301),
    );
    assert_eq!(s.history_len(), 2);
    assert_eq!(
        s.register(all(), Start::After(10)).unwrap_err(),
        TooOld {
            requested: 10,
            floor: 11
        }
    );
    let r = s.register(all(), Start::After(11)).unwrap();
    assert_eq!(r.replay.iter().map(|e| e.rv).collect::<Vec<_>>(), [12, 13]);
}

#[test]
fn the_history_bytes_are_the_versions_only_it_keeps_and_its_frames() {
    let gauge = prometheus::IntGauge::new("h", "h").unwrap();
    let mut s = State::new(Settings {
        history_capacity: 2,
        history_bytes: Some(gauge.clone()),
        ..settings(2, 10)
    });
    let a5 = pod("a", 5, "n1", "x");
    let a5_size = a5.heap_size();
    s.replace(vec![a5], 10, Instant::now());
    assert_eq!(gauge.get(), 0, "the list's objects are current");
    let mut w = s.register(all(), Start::After(10)).unwrap();
    let a11 = pod("a", 11, "n1", "y");
    let a11_size = a11.heap_size();
    s.apply(EventType::Modified, a11, Instant::now());
    // `a` at 5 is kept by the event that replaced it; `a` at 11 is current.
    assert_eq!(gauge.get(), a5_size as i64);
    // The watcher's frame is built, and counted while the event lives.
    let d = w.rx.try_recv().unwrap();
    let frame = d
        .event
        .frame(d.which, crate::cache::negotiate::Representation::JSON, None)
        .unwrap();
    assert_eq!(gauge.get(), (a5_size + frame.len()) as i64);
    drop(d);
    let gone = pod("a", 12, "n1", "y");
    let gone_size = gone.heap_size();
    s.apply(EventType::Deleted, gone, Instant::now());
    assert_eq!(
        gauge.get(),
        (a5_size + frame.len() + a11_size + gone_size) as i64,
        "a deletion keeps the last state and the deleted object"
    );
    // Capacity 2: the first event leaves, with `a` at 5 and its frame
    // (the watcher's queue still holds the second).
    s.apply(EventType::Added, pod("b", 13, "n1", "x"), Instant::now());
    assert_eq!(gauge.get(), (a11_size + gone_size) as i64);
    // A reset empties the history.
    s.replace(Vec::new(), 5, Instant::now());
    drop(w);
    assert_eq!(gauge.get(), 0);
}

#[test]
fn frames_are_released_after_the_blocked_budget_and_built_again_on_replay() {
    let gauge = prometheus::IntGauge::new("h", "h").unwrap();
    let mut s = State::new(Settings {
        history_bytes: Some(gauge.clone()),
        ..settings(100, 10)
    });
    s.replace(Vec::new(), 10, Instant::now());
    let json = crate::cache::negotiate::Representation::JSON;
    let t0 = Instant::now();
    let mut w = s.register(all(), Start::After(10)).unwrap();
    s.apply(EventType::Added, pod("a", 11, "n1", "x"), t0);
    let d = w.rx.try_recv().unwrap();
    let frame = d.event.frame(d.which, json, None).unwrap();
    assert_eq!(gauge.get(), frame.len() as i64);
    // Within the budget (10 s) the frame stays, for watchers still
    // writing the event.
    s.apply(
        EventType::Added,
        pod("b", 12, "n1", "x"),
        t0 + Duration::from_secs(9),
    );
    assert_eq!(gauge.get(), frame.len() as i64);
    // Past it, the next event (or bookmark) releases it.
    s.release_frames(t0 + Duration::from_secs(11));
    assert_eq!(gauge.get(), 0);
    // A watch resuming from the history builds it again, the same bytes.
    let r = s.register(all(), Start::After(10)).unwrap();
    let again = r.replay[0]
        .frame(crate::cache::event::Which::Added, json, None)
        .unwrap();
    assert_eq!(again, frame);
    assert_eq!(gauge.get(), frame.len() as i64);
}

#[test]
fn label_transitions_through_store() {
    let mut s = synced(100, 10);
    let f = Arc::new(Filter {
        labels: LabelSelector::parse("app=y").unwrap(),
        ..Filter::default()
    });
    let mut r = s.register(f, Start::After(10)).unwrap();
    let now = Instant::now();
    s.apply(EventType::Modified, pod("a", 11, "n1", "y"), now);
    s.apply(EventType::Modified, pod("a", 12, "n1", "x"), now);
    assert_eq!(types(&mut r.rx), vec!["ADDED a 11", "DELETED a 12"]);
}

/// A pod of about 4 KiB (`pad` bytes of annotation), as the packing tests
/// need a store of several chunks.
fn big_pod(name: &str, rv: u64, pad: usize) -> CachedObject {
    let json = format!(
        r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}","annotations":{{"pad":"{}"}}}},"spec":{{"nodeName":"n1"}}}}"#,
        "x".repeat(pad)
    );
    CachedObject::from_json(json.as_bytes(), FieldSet::Pod, true).unwrap()
}

/// Consecutive objects of one chunk lie end to end in it.
fn adjacent(a: &CachedObject, b: &CachedObject) -> bool {
    a.json().as_ptr() as usize + a.json().len() == b.json().as_ptr() as usize
}

#[test]
fn a_first_fill_is_packed_end_to_end() {
    use super::pack::{CHUNK, MIN_STORE_BYTES};
    let mut s = State::new(settings(100, 10));
    let n = 2 * MIN_STORE_BYTES / 4096;
    let items: Vec<_> = (0..n)
        .map(|i| big_pod(&format!("p{i:05}"), i as u64 + 1, 4000))
        .collect();
    let wanted: Vec<_> = items.iter().map(|o| o.json().clone()).collect();
    s.replace(items, n as u64 + 1, Instant::now());
    let objects: Vec<_> = s.objects().values().cloned().collect();
    assert_eq!(objects.len(), n);
    // The same bytes, every object in a chunk, neighbours end to end.
    for (o, json) in objects.iter().zip(&wanted) {
        assert_eq!(o.json(), json);
        assert_ne!(o.pack_id(), 0);
    }
    let per_chunk = CHUNK / objects[0].json().len();
    assert!(adjacent(&objects[0], &objects[1]));
    assert_eq!(objects[0].pack_id(), objects[per_chunk - 1].pack_id());
    assert_ne!(objects[0].pack_id(), objects[per_chunk].pack_id());
    assert_eq!(s.packs().chunks(), n.div_ceil(per_chunk));
}

#[test]
fn a_list_packed_as_it_is_read_fills_the_store_without_a_copy() {
    use super::pack::{CHUNK, Listed, MIN_STORE_BYTES};
    let n = 2 * MIN_STORE_BYTES / 4096;
    let mut listed = Listed::packed();
    for i in 0..n {
        listed.push(big_pod(&format!("p{i:05}"), i as u64 + 1, 4000));
    }
    // Each object's JSON went into a chunk as it was pushed.
    let items = listed.items();
    assert!(items.iter().all(|o| o.pack_id() != 0));
    assert!(adjacent(&items[0], &items[1]));
    let at: Vec<_> = items.iter().map(|o| o.json().as_ptr()).collect();
    let chunks = n.div_ceil(CHUNK / items[0].json().len());

    let mut s = State::new(settings(100, 10));
    s.replace(listed, n as u64 + 1, Instant::now());
    // The store took the chunks: the same bytes where they were.
    let objects: Vec<_> = s.objects().values().cloned().collect();
    assert_eq!(objects.len(), n);
    for (o, at) in objects.iter().zip(&at) {
        assert_eq!(o.json().as_ptr(), *at);
    }
    assert_eq!(s.packs().chunks(), chunks);

    // A relist's objects keep allocations of their own, even if packed.
    let mut relist = Listed::packed();
    relist.push(big_pod("p00000", n as u64 + 2, 4000));
    s.replace(relist, n as u64 + 2, Instant::now());
    assert_eq!(s.objects().get("ns/p00000").unwrap().pack_id(), 0);
}

#[test]
fn a_small_first_fill_is_not_packed() {
    use super::pack::Listed;
    let mut s = State::new(settings(100, 10));
    let mut listed = Listed::packed();
    listed.push(pod("a", 5, "n1", "x"));
    listed.push(pod("b", 6, "n2", "x"));
    assert!(listed.into_parts().0.iter().all(|o| o.pack_id() != 0));
    let mut listed = Listed::packed();
    listed.push(pod("a", 5, "n1", "x"));
    listed.push(pod("b", 6, "n2", "x"));
    s.replace(listed, 10, Instant::now());
    assert!(s.objects().values().all(|o| o.pack_id() == 0));
    assert_eq!(s.packs().chunks(), 0);
}

#[test]
fn events_are_packed_once_the_store_is_big_and_a_sparse_chunk_is_unpacked() {
    use super::pack::{MAX_PACKED, MIN_STORE_BYTES};
    let mut s = synced(100_000, 10);
    let now = Instant::now();
    let mut rv = 10;
    let mut add = |s: &mut State, name: String, pad: usize| {
        rv += 1;
        s.apply(EventType::Added, big_pod(&name, rv, pad), now);
    };
    let n = 2 * MIN_STORE_BYTES / 4096;
    for i in 0..n {
        add(&mut s, format!("p{i:05}"), 4000);
    }
    // Too big to pack.
    add(&mut s, "huge".into(), MAX_PACKED + 1);
    let get = |s: &State, k: &str| s.objects().get(k).unwrap().clone();
    assert_eq!(
        get(&s, "ns/p00000").pack_id(),
        0,
        "a small store is not packed"
    );
    assert_eq!(get(&s, "ns/huge").pack_id(), 0);
    let last = get(&s, &format!("ns/p{:05}", n - 1));
    assert_ne!(last.pack_id(), 0);

    // A closed chunk: the one of an object in the second half.
    let chunk = get(&s, &format!("ns/p{:05}", n / 2)).pack_id();
    let members: Vec<String> = (0..n)
        .map(|i| format!("ns/p{i:05}"))
        .filter(|k| get(&s, k).pack_id() == chunk)
        .collect();
    assert!(members.len() > 8, "{} objects in a chunk", members.len());
    for w in members.windows(2) {
        assert!(adjacent(&get(&s, &w[0]), &get(&s, &w[1])));
    }
    let before: Vec<_> = members.iter().map(|k| get(&s, k).json().clone()).collect();
    // A quarter of its objects replaced: not yet sparse.
    let quarter = members.len() / 4;
    for k in &members[..quarter] {
        let name = k.strip_prefix("ns/").unwrap().to_string();
        add(&mut s, name, 3000);
    }
    assert!(
        members[quarter..]
            .iter()
            .all(|k| get(&s, k).pack_id() == chunk)
    );
    // One more: the rest are copied out, with the same bytes.
    let name = members[quarter].strip_prefix("ns/").unwrap().to_string();
    add(&mut s, name, 3000);
    for (k, json) in members.iter().zip(&before).skip(quarter + 1) {
        let o = get(&s, k);
        assert_eq!(o.pack_id(), 0, "{k} copied out");
        assert_eq!(o.json(), json);
    }
    // Deleting the rest of a chunk's objects forgets it.
    let chunks = s.packs().chunks();
    let last_chunk = last.pack_id();
    let open: Vec<String> = (0..n)
        .map(|i| format!("ns/p{i:05}"))
        .filter(|k| get(&s, k).pack_id() == last_chunk)
        .collect();
    for k in &open {
        let name = k.strip_prefix("ns/").unwrap();
        rv += 1;
        s.apply(EventType::Deleted, big_pod(name, rv, 4000), now);
    }
    assert!(s.packs().chunks() < chunks);
}

#[test]
fn under_churn_the_chunks_are_as_many_as_the_current_objects_need() {
    use super::pack::{CHUNK, MIN_STORE_BYTES};
    let mut s = synced(100, 10);
    let now = Instant::now();
    let n = 2 * MIN_STORE_BYTES / 4096;
    let mut rv = 10;
    // Object `i` changes in rounds 1 to `i % 20`, then stays: each round's
    // chunks keep a few objects for good, which would otherwise hold them.
    for round in 0..20 {
        for i in (0..n).filter(|i| round <= i % 20) {
            rv += 1;
            let kind = if round == 0 {
                EventType::Added
            } else {
                EventType::Modified
            };
            s.apply(kind, big_pod(&format!("p{i:05}"), rv, 4000), now);
        }
    }
    // Every object is current in a chunk kept for it, or copied out; a
    // chunk is kept only while three quarters of its objects are current.
    let bytes: usize = s.objects().values().map(|o| o.json().len()).sum();
    let needed = (bytes * 4 / 3).div_ceil(CHUNK) + 1;
    assert!(
        s.packs().chunks() > 0 && s.packs().chunks() <= needed,
        "{} chunks tracked for {bytes} bytes of objects",
        s.packs().chunks()
    );
    assert_eq!(
        s.objects()
            .values()
            .filter(|o| o.json().len() > 4000)
            .count(),
        n
    );
}

/// The `spec.nodeName` index follows every change of the objects (a pod
/// bound, moved, deleted; a relist; a reset), so lists and a watch's
/// initial events read a node's pods from it.
#[test]
fn the_node_index_follows_the_objects() {
    let keys = |s: &State, node: &str| -> Vec<String> {
        s.candidates(&on_node(node))
            .unwrap()
            .iter()
            .map(|k| k.to_string())
            .collect()
    };
    let mut s = synced(100, 10);
    assert_eq!(keys(&s, "n1"), ["ns/a"]);
    assert_eq!(keys(&s, "n2"), ["ns/b"]);
    assert!(keys(&s, "n3").is_empty());
    // Unindexed selections walk everything.
    assert!(s.candidates(&all()).is_none());
    let now = Instant::now();
    s.apply(EventType::Added, pod("c", 11, "", "x"), now);
    assert_eq!(keys(&s, ""), ["ns/c"]);
    // Bound to n1, then moved (a Pod's node never changes once set; the
    // index does not rely on it).
    s.apply(EventType::Modified, pod("c", 12, "n1", "x"), now);
    assert!(keys(&s, "").is_empty());
    assert_eq!(keys(&s, "n1"), ["ns/a", "ns/c"]);
    s.apply(EventType::Modified, pod("a", 13, "n2", "y"), now);
    assert_eq!(keys(&s, "n1"), ["ns/c"]);
    assert_eq!(keys(&s, "n2"), ["ns/a", "ns/b"]);
    s.apply(EventType::Deleted, pod("b", 14, "n2", "x"), now);
    assert_eq!(keys(&s, "n2"), ["ns/a"]);
    // A watch's initial state is the node's pods alone.
    let r = s.register(on_node("n2"), Start::Snapshot).unwrap();
    let (objects, _) = r.snapshot.unwrap();
    assert_eq!(
        objects.keys().map(|k| k.to_string()).collect::<Vec<_>>(),
        ["ns/a"]
    );
    // A relist's difference enters as events.
    s.replace(
        vec![pod("a", 13, "n2", "y"), pod("d", 15, "n1", "x")],
        16,
        now,
    );
    assert_eq!(keys(&s, "n1"), ["ns/d"]);
    assert_eq!(keys(&s, "n2"), ["ns/a"]);
    // A reset (a list below the cache's RV) rebuilds it.
    s.replace(vec![pod("e", 3, "n3", "x")], 4, now);
    assert!(keys(&s, "n1").is_empty() && keys(&s, "n2").is_empty());
    assert_eq!(keys(&s, "n3"), ["ns/e"]);
    // Resources that are not pods keep no index.
    let unindexed = State::new(Settings {
        node_indexed: false,
        ..settings(10, 10)
    });
    assert!(unindexed.candidates(&on_node("n1")).is_none());
}
