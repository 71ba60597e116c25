//! Unit tests of `watcher.rs`.

use super::*;
use crate::cache::event::EventType;
use crate::cache::object::CachedObject;
use crate::cache::resource::tests::test_cache;
use apimachinery::resource::FieldSet;

fn cm(i: u64) -> CachedObject {
    let json = format!(
        r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"cm-{i}","namespace":"ns","resourceVersion":"{i}"}}}}"#
    );
    CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).unwrap()
}

fn rvs(chunk: &[u8]) -> Vec<u64> {
    std::str::from_utf8(chunk)
        .unwrap()
        .lines()
        .map(|l| {
            let e: serde_json::Value = serde_json::from_str(l).unwrap();
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

fn version(name: &str, rv: u64, data: &str) -> CachedObject {
    let json = format!(
        r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"k":"{data}"}}}}"#
    );
    CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).unwrap()
}

/// A JSON watch of `filter` from `start`, without bookmarks.
fn json_watch(filter: Filter, start: Start) -> WatchParams {
    WatchParams {
        filter: Arc::new(filter),
        start,
        prefix: String::new(),
        bookmarks: false,
        initial_events_end: false,
        timeout: Duration::from_secs(60),
        repr: Representation::JSON,
        window: None,
        view: None,
    }
}

/// `(type, name, resourceVersion, initial-events-end)` of each event.
fn events(chunk: &[u8]) -> Vec<(String, String, u64, bool)> {
    std::str::from_utf8(chunk)
        .unwrap()
        .lines()
        .map(|l| {
            let e: serde_json::Value = serde_json::from_str(l).unwrap();
            let m = &e["object"]["metadata"];
            (
                e["type"].as_str().unwrap().to_string(),
                m["name"].as_str().unwrap_or_default().to_string(),
                m["resourceVersion"].as_str().unwrap().parse().unwrap(),
                m["annotations"]["k8s.io/initial-events-end"] == "true",
            )
        })
        .collect()
}

/// An empty cache at RV 1 whose watches of a whole resource are held
/// for `window`.
fn held_cache(window: Duration) -> Arc<ResourceCache> {
    let cache = Arc::new(crate::cache::resource::tests::test_cache_tuned(
        &prometheus::Registry::new(),
        |r| r.watch_batch = window,
    ));
    cache.replace(Vec::new(), 1);
    cache
}

/// A JSON watch from RV 1 with the field selector `fields`.
fn fields_watch(fields: &str) -> WatchParams {
    let filter = Filter {
        fields: apimachinery::selector::FieldSelector::parse(fields).unwrap(),
        ..Filter::default()
    };
    json_watch(filter, Start::After(1))
}

/// With `watchBatchMilliseconds`, what reaches a watch of the whole
/// resource within the window after an event goes out with it, in one
/// chunk; a watch pinned to one object is never held.
/// On tokio's paused clock: the times asserted are exact.
#[tokio::test(start_paused = true)]
async fn a_watch_of_the_resource_holds_events_for_the_batch_window() {
    let window = Duration::from_millis(500);
    let cache = held_cache(window);
    let params = fields_watch;
    let mut all = Watch::register(cache.clone(), params(""), CancellationToken::new()).unwrap();
    let mut one = Watch::register(
        cache.clone(),
        params("metadata.name=cm-2"),
        CancellationToken::new(),
    )
    .unwrap();
    cache.apply(EventType::Added, cm(2));
    let t = Instant::now();
    assert_eq!(rvs(&one.next_chunk().await.unwrap()), [2]);
    assert_eq!(t.elapsed(), Duration::ZERO, "a pinned watch is not held");
    let held = tokio::spawn(async move {
        let chunk = all.next_chunk().await.unwrap();
        (chunk, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    cache.apply(EventType::Added, cm(3));
    let (chunk, at) = held.await.unwrap();
    assert_eq!(rvs(&chunk), [2, 3], "one chunk");
    assert_eq!(at - t, window, "held for the window");
}

/// Watches sharing a connection's batch window are written when it
/// closes: the second watch's event, held after the first's, goes out
/// with it, not a whole window later.
#[tokio::test(start_paused = true)]
async fn watches_of_one_connection_share_its_batch_window() {
    let window = Duration::from_millis(400);
    let cache = held_cache(window);
    let shared = Arc::new(BatchWindow::default());
    let params = |fields: &str| WatchParams {
        window: Some(shared.clone()),
        ..fields_watch(fields)
    };
    let watch = |fields: &str| {
        let mut w =
            Watch::register(cache.clone(), params(fields), CancellationToken::new()).unwrap();
        tokio::spawn(async move {
            let chunk = w.next_chunk().await.unwrap();
            (rvs(&chunk), Instant::now())
        })
    };
    let (first, second) = (watch("metadata.name!=cm-3"), watch("metadata.name!=cm-2"));
    let t = Instant::now();
    cache.apply(EventType::Added, cm(2));
    tokio::time::sleep(window / 2).await;
    cache.apply(EventType::Added, cm(3));
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!((first.0, second.0), (vec![2], vec![3]));
    assert_eq!(first.1 - t, window, "held for the window");
    assert_eq!(second.1, first.1, "written when the window closes");
}

/// A held watch writes a bookmark at once, not when the window would
/// close: a consistent read behind it waits for that bookmark. Events
/// after it are held as before.
#[tokio::test(start_paused = true)]
async fn a_held_watch_writes_bookmarks_at_once() {
    let window = Duration::from_secs(2);
    let cache = Arc::new(crate::cache::resource::tests::test_cache_tuned(
        &prometheus::Registry::new(),
        |r| {
            r.watch_batch = window;
            r.bookmark_interval = Duration::from_millis(100);
        },
    ));
    cache.replace(Vec::new(), 1);
    let params = WatchParams {
        bookmarks: true,
        ..fields_watch("metadata.name!=cm-2")
    };
    let mut w = Watch::register(cache.clone(), params, CancellationToken::new()).unwrap();
    // Progress the watch is not sent an event for.
    cache.apply(EventType::Added, cm(2));
    let t = Instant::now();
    let chunk = w.next_chunk().await.unwrap();
    let events = std::str::from_utf8(&chunk).unwrap();
    assert!(events.starts_with(r#"{"type":"BOOKMARK""#), "{events}");
    assert!(
        t.elapsed() <= Duration::from_millis(100),
        "written at its interval, not the window's end: {:?}",
        t.elapsed()
    );
    cache.apply(EventType::Added, cm(3));
    let t = Instant::now();
    assert_eq!(rvs(&w.next_chunk().await.unwrap()), [3]);
    assert_eq!(t.elapsed(), window, "the event after it is held");
}

/// A bookmark never runs ahead of an event the watch still has to
/// send: a downstream cache (a node proxy behind a tier) takes the
/// bookmark's resourceVersion as its own and ignores an event at or
/// below it as a repeat, so one that came after would be lost. The
/// watch selects every other change and is due a bookmark every
/// millisecond, while another thread applies changes as fast as the
/// watch reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bookmark_never_overtakes_an_event() {
    let cache = Arc::new(crate::cache::resource::tests::test_cache_tuned(
        &prometheus::Registry::new(),
        |r| r.bookmark_interval = Duration::from_millis(1),
    ));
    cache.replace(Vec::new(), 1);
    let params = WatchParams {
        bookmarks: true,
        ..json_watch(
            Filter {
                labels: apimachinery::selector::LabelSelector::parse("even").unwrap(),
                ..Filter::default()
            },
            Start::After(1),
        )
    };
    let mut w = Watch::register(cache.clone(), params, CancellationToken::new()).unwrap();
    const LAST: u64 = 100_000;
    // What the watch has read: the writer stays within the history
    // (100 events) of it.
    let read = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let writer = {
        let (cache, read) = (cache.clone(), read.clone());
        std::thread::spawn(move || {
            for i in 2..=LAST {
                while i > read.load(std::sync::atomic::Ordering::Relaxed) + 50 {
                    std::thread::yield_now();
                }
                let label = if i % 2 == 0 {
                    r#","labels":{"even":""}"#
                } else {
                    ""
                };
                let json = format!(
                    r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"cm-{i}","namespace":"ns","resourceVersion":"{i}"{label}}}}}"#
                );
                let o = CachedObject::from_json(json.as_bytes(), FieldSet::Default, true);
                cache.apply(EventType::Added, o.unwrap());
            }
        })
    };
    let (mut bookmark, mut last, mut bookmarks) = (0, 0, 0);
    while last < LAST {
        let chunk = w.next_chunk().await.expect("the watch goes on");
        for (kind, _, rv, _) in events(&chunk) {
            if kind == "BOOKMARK" {
                assert!(rv >= last, "a bookmark at {rv} after an event at {last}");
                bookmark = rv;
                bookmarks += 1;
            } else {
                assert!(
                    rv > bookmark,
                    "event at {rv} after a bookmark at {bookmark}"
                );
                assert_eq!(rv, last.max(1) + if last == 0 { 1 } else { 2 });
                last = rv;
            }
        }
        read.store(last.max(bookmark), std::sync::atomic::Ordering::Relaxed);
    }
    writer.join().unwrap();
    assert!(bookmarks > 10, "{bookmarks}");
}

/// Bookmarks as kube-apiserver's cacher sends them: one each interval
/// once the cache has moved beyond the watch's initial events, even to
/// a watch that selects every change (the bookmark is then at its last
/// event's resourceVersion) and while nothing moves (at the same
/// resourceVersion again); none while the cache is where the watch
/// started.
#[tokio::test(start_paused = true)]
async fn a_watch_gets_its_bookmarks_whatever_it_was_sent() {
    let cache = Arc::new(crate::cache::resource::tests::test_cache_tuned(
        &prometheus::Registry::new(),
        |r| r.bookmark_interval = Duration::from_millis(40),
    ));
    cache.replace(Vec::new(), 1);
    let watch = |fields: &str| {
        let params = WatchParams {
            bookmarks: true,
            ..fields_watch(fields)
        };
        Watch::register(cache.clone(), params, CancellationToken::new()).unwrap()
    };
    let mut quiet = watch("");
    let none = tokio::time::timeout(Duration::from_millis(200), quiet.next_chunk()).await;
    assert!(none.is_err(), "a bookmark at the start: {none:?}");

    let mut all = watch("");
    let writer = {
        let cache = cache.clone();
        tokio::spawn(async move {
            for i in 2..=30 {
                cache.apply(EventType::Added, cm(i));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let (mut last, mut bookmarks) = (1, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    // Until two bookmarks after the last change, at its RV.
    while !bookmarks.ends_with(&[30, 30]) {
        let chunk = tokio::time::timeout_at(deadline, all.next_chunk()).await;
        let chunk = chunk.unwrap_or_else(|_| panic!("bookmarks: {bookmarks:?}"));
        for (kind, _, rv, _) in events(&chunk.unwrap()) {
            if kind == "BOOKMARK" {
                assert_eq!(rv, last, "a bookmark at the last event's RV");
                bookmarks.push(rv);
            } else {
                assert_eq!(rv, last + 1);
                last = rv;
            }
        }
    }
    writer.await.unwrap();
    assert!(
        bookmarks.iter().filter(|&&rv| rv < 30).count() >= 2,
        "while every change was sent: {bookmarks:?}"
    );
}

/// A watch started from a given state (a consistent read upstream of
/// its one object, at an RV the cache has not reached yet) sends that
/// object, the initial-events-end bookmark at that RV, then only the
/// changes after it as the cache reaches them; started once the cache
/// has passed that RV, the history after it follows the object.
#[tokio::test]
async fn a_watch_from_a_given_state_sends_the_changes_after_it_only() {
    let cache = Arc::new(test_cache());
    cache.replace(vec![version("a", 1, "old")], 1);
    let upstream = Arc::new(version("a", 3, "new"));
    let params = |at: u64| WatchParams {
        filter: Arc::new(Filter {
            namespace: Some("ns".into()),
            fields: apimachinery::selector::FieldSelector::parse("metadata.name=a").unwrap(),
            ..Filter::default()
        }),
        start: Start::Given(
            [(upstream.key_arc().clone(), upstream.clone())]
                .into_iter()
                .collect(),
            at,
        ),
        prefix: "ns/".into(),
        bookmarks: true,
        initial_events_end: true,
        timeout: Duration::from_secs(60),
        repr: Representation::JSON,
        window: None,
        view: None,
    };
    let mut w = Watch::register(cache.clone(), params(4), CancellationToken::new()).unwrap();
    let first = w.next_chunk().await.unwrap();
    assert_eq!(
        events(&first),
        [
            ("ADDED".into(), "a".into(), 3, false),
            ("BOOKMARK".into(), String::new(), 4, true)
        ]
    );
    // The cache catches up: what the given state holds already (a at
    // 3), another object, then a's next change.
    cache.apply(EventType::Modified, version("a", 3, "new"));
    cache.apply(EventType::Added, version("b", 4, "x"));
    cache.apply(EventType::Modified, version("a", 6, "newer"));
    let next = tokio::time::timeout(Duration::from_secs(5), w.next_chunk())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(events(&next), [("MODIFIED".into(), "a".into(), 6, false)]);
    assert!(w.gather(None).is_none());

    // Given at 4, the cache at 6 already: a's change at 6 comes from
    // the history, after the given state.
    let mut late = Watch::register(cache.clone(), params(4), CancellationToken::new()).unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let chunk = tokio::time::timeout(Duration::from_secs(5), late.next_chunk())
            .await
            .unwrap()
            .unwrap();
        seen.extend(events(&chunk));
    }
    assert_eq!(
        seen,
        [
            ("ADDED".into(), "a".into(), 3, false),
            ("BOOKMARK".into(), String::new(), 4, true),
            ("MODIFIED".into(), "a".into(), 6, false)
        ]
    );
    // Given inside the revisions a relist skipped (its history does
    // not hold them): too old, as a watch from there would be.
    cache.replace(vec![version("a", 20, "relisted")], 20);
    assert!(Watch::register(cache.clone(), params(10), CancellationToken::new()).is_err());
}

/// A watcher whose buffer filled up again after it last drained it,
/// and that was then marked lagging, sends what the buffer holds before
/// the history's frames: in order, nothing lost or repeated. (Found as
/// a rare out-of-order stream in `tests/sim/cache_property.rs` on a loaded
/// machine.)
#[tokio::test]
async fn catch_up_sends_the_buffer_before_the_history() {
    let cache = Arc::new(test_cache());
    cache.replace(Vec::new(), 1);
    let params = json_watch(Filter::default(), Start::After(1));
    let mut w = Watch::register(cache.clone(), params, CancellationToken::new()).unwrap();
    // The buffer holds 10 deliveries: the 11th marks the watcher
    // lagging, from RV 12 on.
    for rv in 2..=16 {
        cache.apply(EventType::Added, cm(rv));
    }
    assert!(w.link.is_lagging());
    let CatchUpStep::Frames(Some(chunk)) = w.catch_up() else {
        panic!("frames expected");
    };
    assert_eq!(rvs(&chunk), (2..=16).collect::<Vec<_>>());
    assert!(!w.link.is_lagging());
    // Live again: the next event comes through the buffer, shared.
    cache.apply(EventType::Added, cm(17));
    assert_eq!(rvs(&w.gather(None).unwrap()), [17]);
    assert!(w.gather(None).is_none());
}
