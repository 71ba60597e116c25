//! Tests of one resource's watch cache, and the test caches other
//! modules' tests build on.

use super::*;
use crate::cache::metrics::CacheMetrics;
use std::sync::Arc;

pub(crate) fn test_cache() -> ResourceCache {
    test_cache_in(&prometheus::Registry::new())
}

/// A test cache whose metrics are registered in `registry`.
fn test_cache_in(registry: &prometheus::Registry) -> ResourceCache {
    test_cache_tuned(registry, |_| {})
}

/// A test cache with its read settings changed by `tune`.
pub(crate) fn test_cache_tuned(
    registry: &prometheus::Registry,
    tune: impl FnOnce(&mut ReadSettings),
) -> ResourceCache {
    let metrics = CacheMetrics::new(registry).unwrap();
    let mut read = ReadSettings {
        bookmark_interval: Duration::from_secs(60),
        watch_batch: Duration::ZERO,
        min_request_timeout: Duration::from_secs(1800),
        consistent_list_wait: Duration::from_millis(250),
        large_list_objects: 0,
        large_list_wait: Duration::from_secs(3),
        consistent_watch_wait: Duration::from_secs(3),
        progress_roll: Duration::from_secs(10),
        not_older_than_wait: Duration::from_secs(3),
        ready_wait: Duration::from_secs(5),
    };
    tune(&mut read);
    ResourceCache::new(
        ResourceInfo {
            gvr: Gvr {
                group: String::new(),
                version: "v1".into(),
                resource: "configmaps".into(),
            },
            kind: "ConfigMap".into(),
            api_version: "v1".into(),
            namespaced: true,
            field_set: FieldSet::Default,
            strip_item_type_meta: true,
            scope: FieldSelector::default(),
            reads_as: None,
            codec: None,
            upstream_protobuf: false,
        },
        Settings {
            history_capacity: 100,
            history_max_age: Duration::from_secs(300),
            watcher_buffer: 10,
            blocked_budget: Duration::from_secs(10),
            node_indexed: false,
            namespaced: true,
            field_set: FieldSet::Default,
            history_bytes: None,
        },
        read,
        metrics.resource("", "configmaps"),
    )
}

#[test]
fn bookmark_matches_recording() {
    let c = test_cache();
    assert_eq!(
        std::str::from_utf8(&c.bookmark_frame(339, true, Representation::JSON).unwrap()).unwrap(),
        "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"339\",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}}}}\n"
    );
    c.set_bookmark_template(br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"5","creationTimestamp":null}}"#);
    assert_eq!(
        std::str::from_utf8(&c.bookmark_frame(7, false, Representation::JSON).unwrap()).unwrap(),
        "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"7\",\"creationTimestamp\":null}}}\n"
    );
}

#[tokio::test]
async fn probes_are_shared_only_when_they_started_after_arrival() {
    let c = test_cache();
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let start = |calls: Arc<std::sync::atomic::AtomicU32>| {
        move || -> BoxFuture<'static, Result<u64, ProbeError>> {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(42)
            }
            .boxed()
        }
    };
    let before = Instant::now();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let (a, b) = tokio::join!(
        c.upstream_rv(before, start(calls.clone())),
        c.upstream_rv(before, start(calls.clone()))
    );
    assert_eq!((a, b), (Ok(42), Ok(42)));
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "coalesced"
    );
    // A request arriving after that probe started needs a new one.
    let later = Instant::now();
    assert_eq!(c.upstream_rv(later, start(calls.clone())).await, Ok(42));
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn one_probe_in_flight_and_one_queued() {
    let registry = prometheus::Registry::new();
    let c = Arc::new(test_cache_in(&registry));
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let start = |calls: Arc<std::sync::atomic::AtomicU32>| {
        move || -> BoxFuture<'static, Result<u64, ProbeError>> {
            async move {
                let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(u64::from(n) + 1)
            }
            .boxed()
        }
    };
    // The first request starts a probe.
    let first = {
        let (c, calls) = (c.clone(), calls.clone());
        tokio::spawn(async move { c.upstream_rv(Instant::now(), start(calls)).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Requests arriving while it is in flight all share the next one,
    // which starts when the first ends.
    let mut later = Vec::new();
    for _ in 0..50 {
        let (c, calls) = (c.clone(), calls.clone());
        later.push(tokio::spawn(async move {
            c.upstream_rv(Instant::now(), start(calls)).await
        }));
    }
    assert_eq!(first.await.unwrap(), Ok(1));
    for l in later {
        assert_eq!(l.await.unwrap(), Ok(2));
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    // The metric counts upstream probes, not the requests sharing them.
    let probes: f64 = registry
        .gather()
        .iter()
        .filter(|f| f.name() == "kube_cache_proxy_cache_consistency_probes_total")
        .flat_map(|f| f.get_metric())
        .filter(|m| m.get_label().iter().any(|l| l.value() == "ok"))
        .map(|m| m.get_counter().get_value())
        .sum();
    assert_eq!(probes, 2.0);
}

#[tokio::test]
async fn a_probe_overtaken_by_the_watch_is_not_a_rewind() {
    let c = Arc::new(test_cache());
    c.replace(Vec::new(), 197);
    // Upstream answers 197, but by the time the answer arrives the watch
    // has carried the cache to 200: not upstream's history going back.
    let overtaken = {
        let c = c.clone();
        move || -> BoxFuture<'static, Result<u64, ProbeError>> {
            async move {
                c.progress(200);
                Ok(197)
            }
            .boxed()
        }
    };
    assert_eq!(c.upstream_rv(Instant::now(), overtaken).await, Ok(197));
    // Upstream below what the cache had before asking: gone back.
    let behind = || -> BoxFuture<'static, Result<u64, ProbeError>> { async { Ok(150) }.boxed() };
    assert_eq!(
        c.upstream_rv(Instant::now(), behind).await,
        Err(ProbeError::Rewound)
    );
}

#[tokio::test]
async fn reads_wait_while_a_resumed_cache_catches_up() {
    let c = Arc::new(test_cache());
    c.replace(Vec::new(), 10);
    assert!(c.wait_current(Duration::ZERO).await);
    c.set_resumed(Resumed::CatchingUp);
    assert!(!c.wait_current(Duration::from_millis(20)).await);
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.wait_current(Duration::from_secs(2)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.set_resumed(Resumed::Current);
    assert!(waiter.await.unwrap());
    // Upstream unreachable: the snapshot is served.
    c.set_resumed(Resumed::Unreachable);
    assert!(c.wait_current(Duration::ZERO).await);
}

#[tokio::test]
async fn wait_fresh_wakes_on_progress() {
    let c = Arc::new(test_cache());
    c.replace(Vec::new(), 10);
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.wait_fresh(20, Duration::from_secs(2), "consistent").await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.progress(20);
    assert!(waiter.await.unwrap());
    assert!(
        !c.wait_fresh(30, Duration::from_millis(20), "consistent")
            .await
    );
}

/// A cache that finds upstream's history went back asks every sibling that
/// has not listed since the revealing read was sent to relist, once while
/// its relist is pending, however many caches find it.
#[tokio::test]
async fn a_rewind_found_by_one_cache_relists_its_siblings_once() {
    let caches: Vec<Arc<ResourceCache>> = (0..3).map(|_| Arc::new(test_cache())).collect();
    Siblings::join(caches.iter());
    for c in &caches {
        c.replace(Vec::new(), 10);
    }
    let asked = |c: &Arc<ResourceCache>| {
        let c = c.clone();
        async move {
            tokio::time::timeout(Duration::from_millis(100), c.relist_requested())
                .await
                .ok()
        }
    };
    let sent_at = Instant::now();
    // The third lists after the read was sent: it holds the new history.
    caches[2].replace(Vec::new(), 12);
    assert!(caches[0].rewound(5, 10, sent_at));
    assert_eq!(asked(&caches[0]).await, Some("rewound"));
    assert_eq!(asked(&caches[1]).await, Some("rewound"));
    assert_eq!(asked(&caches[2]).await, None);
    // Another cache's finding of the same restore, while the second's
    // relist is pending: not asked again.
    assert!(caches[2].rewound(5, 12, sent_at));
    assert_eq!(asked(&caches[1]).await, None);
    // Its relist landed: a later finding (a probe sent after it) asks
    // again; an earlier one does not.
    caches[1].replace(Vec::new(), 6);
    caches[0].rewinding.store(false, Ordering::Release);
    assert!(caches[0].rewound(5, 10, sent_at));
    assert_eq!(asked(&caches[1]).await, None);
    let later = Instant::now();
    caches[0].rewinding.store(false, Ordering::Release);
    assert!(caches[0].rewound(5, 10, later));
    assert_eq!(asked(&caches[1]).await, Some("rewound"));
}

/// What a timeline mark follows: upstream's own history from the first
/// watch a kube-apiserver serves, kept across the next, lost at a relist
/// or a watch another cache serves (`ResourceCache::note_timeline`);
/// only a change is returned, to be recorded.
#[test]
fn the_timeline_mark_follows_where_the_history_comes_from() {
    let c = test_cache();
    assert_eq!(c.note_timeline(Some(10)), Some(Some(10)));
    assert_eq!(c.note_timeline(Some(20)), None, "kept from 10");
    assert_eq!(c.note_timeline(None), Some(None));
    assert_eq!(c.note_timeline(None), None);
    assert_eq!(c.note_timeline(Some(30)), Some(Some(30)));
}

/// After a crash, the resourceVersions between the snapshot and the
/// caught-up cache are disowned (a watch from them gets `410`) unless the
/// crashed process's history past its snapshot and this one's were both
/// upstream's own: one timeline, whose resourceVersions a client may go on
/// from (issue 60: watchers of a proxy killed and restarted got `410`).
#[test]
fn after_a_crash_one_upstream_timeline_keeps_the_resource_versions_between() {
    let cm = |name: &str, rv: u64| {
        let json = format!(
            r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}}}}"#
        );
        CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).unwrap()
    };
    for (crashed, ours, disowned) in [
        // Both upstream's own: kept.
        (true, Some(10), false),
        // The crashed process relisted, or read a tier, past its snapshot.
        (false, Some(10), true),
        // This process relisted, or reads a tier.
        (true, None, true),
        // This process's history is upstream's only from past the snapshot.
        (true, Some(12), true),
    ] {
        let c = test_cache();
        c.replace(Vec::new(), 10);
        c.resumed_after_crash(10, crashed);
        if let Some(from) = ours {
            c.note_timeline(Some(from));
        } else {
            c.note_timeline(None);
        }
        for rv in 11..=15 {
            c.apply(EventType::Added, cm(&format!("c{rv}"), rv));
        }
        c.set_resumed(Resumed::Current);
        assert_eq!(
            c.expire_below() > 11,
            disowned,
            "crashed {crashed}, ours {ours:?}: expire below {}",
            c.expire_below()
        );
        assert_eq!(c.crashed_at(), None);
    }
}
