//! Unit tests of `persist.rs`.

use super::*;
use crate::cache::resource::tests::test_cache;

fn objects(n: usize) -> Objects {
    let mut out = Objects::new();
    for i in 0..n {
        let json = format!(
            r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"cm-{i}","namespace":"ns","resourceVersion":"{}","labels":{{"app":"a"}}}},"data":{{"k":"v"}}}}"#,
            10 + i
        );
        let o = Arc::new(
            CachedObject::from_json(
                json.as_bytes(),
                apimachinery::resource::FieldSet::Default,
                true,
            )
            .unwrap(),
        );
        out.insert(o.key_arc().clone(), o);
    }
    out
}

fn dir() -> PathBuf {
    std::env::temp_dir().join(format!("kcp-snap-{}", uuid::Uuid::new_v4()))
}

/// The timeline mark a crashed process leaves, as its successor reads
/// it: a resourceVersion, or nothing for "not upstream's own" and for
/// no mark at all.
#[test]
fn the_timeline_mark_is_read_back_by_the_next_process() {
    let d = dir();
    let info = test_cache().info().clone();
    let s = Snapshots::new(&d, 1 << 20, "up-1".into()).unwrap();
    assert_eq!(s.read_timeline(&info), None);
    s.write_timeline(&info, Some(42)).unwrap();
    let next = Snapshots::new(&d, 1 << 20, "up-1".into()).unwrap();
    assert_eq!(next.read_timeline(&info), Some(42));
    next.write_timeline(&info, None).unwrap();
    assert_eq!(next.read_timeline(&info), None);
    assert!(
        fs::read_dir(&d).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp-")),
        "no temporary file left"
    );
    let _ = fs::remove_dir_all(&d);
}

#[tokio::test]
async fn only_a_clean_stop_with_every_snapshot_current_marks_them_clean() {
    let d = dir();
    let cache = Arc::new(test_cache());
    let items: Vec<_> = objects(3)
        .values()
        .map(|o| {
            CachedObject::from_json(o.json(), apimachinery::resource::FieldSet::Default, true)
                .unwrap()
        })
        .collect();
    cache.replace(items, 20);
    let snapshots = Arc::new(Snapshots::new(&d, 1 << 20, "up-1".into()).unwrap());
    assert!(!snapshots.clean_start());
    let p = Arc::new(Persister::new(snapshots, vec![cache.clone()]));
    // A clean stop: the final snapshots, then the mark.
    let stop = CancellationToken::new();
    stop.cancel();
    p.clone().run(Duration::from_secs(3600), stop).await;
    let next = Snapshots::new(&d, 1 << 20, "up-1".into()).unwrap();
    assert!(next.clean_start(), "a clean stop is marked");
    // The mark is read once: a crash after that start is not clean.
    assert!(
        !Snapshots::new(&d, 1 << 20, "up-1".into())
            .unwrap()
            .clean_start()
    );
    // Not while a cache catches up after a crash.
    cache.set_resumed(crate::cache::resource::Resumed::CatchingUp);
    let stop = CancellationToken::new();
    stop.cancel();
    let p = Arc::new(Persister::new(Arc::new(next), vec![cache.clone()]));
    p.clone().run(Duration::from_secs(3600), stop).await;
    assert!(!d.join(CLEAN).exists());
    cache.set_resumed(crate::cache::resource::Resumed::Current);
    // A handover freezes the caches, writes and marks; a takeover that
    // did not happen unmarks and unfreezes.
    let next = Snapshots::new(&d, 1 << 20, "up-1".into()).unwrap();
    let p = Persister::new(Arc::new(next), vec![cache.clone()]);
    p.save_and_pause().await;
    assert!(d.join(CLEAN).exists());
    p.resume();
    assert!(!d.join(CLEAN).exists());
    tokio::time::timeout(Duration::from_secs(1), cache.wait_unfrozen())
        .await
        .unwrap();
    let _ = fs::remove_dir_all(&d);
}

/// A snapshot that cannot be written (the directory gone, a full disk)
/// is a warning once, then debug lines until it is written again.
#[tokio::test]
async fn a_snapshot_that_keeps_failing_is_warned_of_once() {
    #[derive(Clone, Default)]
    struct Buf(Arc<parking_lot::Mutex<Vec<u8>>>);
    impl io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let lines = |what: &str| {
        let text = String::from_utf8(buf.0.lock().clone()).unwrap();
        text.lines().filter(|l| l.contains(what)).count()
    };

    let d = dir();
    let cache = Arc::new(test_cache());
    cache.replace(Vec::new(), 20);
    let snapshots = Arc::new(Snapshots::new(&d, 1 << 20, "up-1".into()).unwrap());
    let p = Persister::new(snapshots, vec![cache.clone()]);
    // The directory replaced by a file: every write fails.
    fs::remove_dir_all(&d).unwrap();
    fs::write(&d, b"").unwrap();
    for _ in 0..3 {
        assert!(!p.save_all().await);
    }
    let text = String::from_utf8(buf.0.lock().clone()).unwrap();
    assert_eq!(lines("WARN"), 1, "one warning for three failures: {text}");
    fs::remove_file(&d).unwrap();
    create_private_dir(&d).unwrap();
    assert!(p.save_all().await);
    assert_eq!(lines("writing the snapshot works again"), 1);
    // Failing again is worth a warning again.
    cache.replace(Vec::new(), 21);
    fs::remove_dir_all(&d).unwrap();
    fs::write(&d, b"").unwrap();
    assert!(!p.save_all().await);
    assert_eq!(lines("WARN"), 2);
    let _ = fs::remove_file(&d);
}

#[tokio::test]
async fn a_cache_reset_to_another_history_is_written_at_once() {
    let d = dir();
    let cache = Arc::new(test_cache());
    let items = |n: usize| -> Vec<CachedObject> {
        objects(n)
            .values()
            .map(|o| {
                CachedObject::from_json(o.json(), apimachinery::resource::FieldSet::Default, true)
                    .unwrap()
            })
            .collect()
    };
    let snapshots = Arc::new(Snapshots::new(&d, 1 << 20, "up-1".into()).unwrap());
    let p = Arc::new(Persister::new(snapshots.clone(), vec![cache.clone()]));
    let stop = CancellationToken::new();
    let run = tokio::spawn(p.clone().run(Duration::from_secs(3600), stop.clone()));
    let info = cache.info().clone();
    let on_disk = |rv: u64| {
        let snapshots = snapshots.clone();
        let info = info.clone();
        async move {
            for _ in 0..200 {
                if snapshots.rv_on_disk(&info) == Some(rv) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        }
    };
    cache.replace(items(3), 40);
    assert!(on_disk(40).await, "the first list is written at once");
    // etcd restored without --bump-revision: the relist is below the
    // cache's resourceVersion, and the old history's snapshot is
    // replaced long before the next periodic write.
    cache.replace(items(1), 30);
    assert!(on_disk(30).await, "the reset is written at once");
    let reread = Snapshots::new(&d, 1 << 20, "up-1".into()).unwrap();
    let (rv, loaded) = reread.load(&info).unwrap().unwrap();
    assert_eq!((rv, loaded.len()), (30, 1));
    stop.cancel();
    run.await.unwrap();
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn round_trip_and_every_kind_of_bad_snapshot_is_refused() {
    let d = dir();
    let cache = test_cache();
    let info = cache.info();
    let s = Snapshots::new(&d, 1 << 20, "up-1".into()).unwrap();
    assert!(s.load(info).unwrap().is_none());
    let objs = objects(3);
    let written = s.save(info, &objs, 42).unwrap().unwrap();
    let on_disk = fs::metadata(s.path(info)).unwrap();
    assert_eq!(on_disk.len(), written);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(on_disk.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }
    let (rv, loaded) = s.load(info).unwrap().unwrap();
    let (loaded, _) = loaded.into_parts();
    assert_eq!(rv, 42);
    let names: Vec<_> = loaded.iter().map(|o| o.key().to_string()).collect();
    assert_eq!(names, vec!["ns/cm-0", "ns/cm-1", "ns/cm-2"]);
    assert_eq!(loaded[1].json(), objs.values().nth(1).unwrap().json());

    // Another upstream.
    let other = Snapshots::new(&d, 1 << 20, "up-2".into()).unwrap();
    assert!(matches!(other.load(info), Err(SnapshotError::Invalid(m)) if m.contains("upstream")));
    let good = fs::read(s.path(info)).unwrap();
    let refused = |bytes: &[u8]| {
        fs::write(s.path(info), bytes).unwrap();
        matches!(s.load(info), Err(SnapshotError::Invalid(_)))
    };
    // Truncated, anywhere.
    for cut in [0, 5, 20, good.len() / 2, good.len() - 1] {
        assert!(refused(&good[..cut]), "cut at {cut}");
    }
    // One bit flipped.
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 1;
    assert!(refused(&flipped));
    // Another format, checksum fixed up.
    let mut other_format = good[..good.len() - 32].to_vec();
    other_format[8] = 2;
    let sum = Sha256::digest(&other_format);
    other_format.extend_from_slice(&sum);
    assert!(refused(&other_format));
    let _ = fs::remove_dir_all(d);
}

#[test]
fn snapshots_stay_within_max_bytes() {
    let d = dir();
    let cache = test_cache();
    let info = cache.info();
    let s = Snapshots::new(&d, 600, "up".into()).unwrap();
    assert!(s.save(info, &objects(2), 11).unwrap().is_some());
    // Too big: not written, and the old one is gone.
    assert!(s.save(info, &objects(20), 29).unwrap().is_none());
    assert!(s.load(info).unwrap().is_none());
    let _ = fs::remove_dir_all(d);
}
