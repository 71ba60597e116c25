//! A bounded cache whose entries each carry their own time to live, keyed
//! by a digest, where concurrent misses for one key share one fetch
//! (moka's `try_get_with`) and failures are not cached. Both review caches
//! (tokens and access decisions) are this.
//!
//! Each answer is also kept, for a bounded time past its TTL that its
//! fetch sets, as the *last known* answer: when upstream cannot be asked
//! (unreachable, hung, `5xx`), that answer is used instead of failing, so
//! an apiserver restart does not take away reads the cache can still
//! answer (docs/security.md, "While the apiserver is unreachable").

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A 32-byte digest.
pub type Key = [u8; 32];

struct Entry<V> {
    value: V,
    ttl: Duration,
    /// How long, from the fetch, the answer may stand in while upstream
    /// cannot be asked (at least `ttl`).
    last_known: Duration,
}

/// An answer fetched from upstream, with how long it is fresh and how long
/// (from now, at least `ttl`) it may stand in while upstream cannot be
/// asked.
#[derive(Debug, Clone)]
pub struct Fetched<V> {
    pub value: V,
    pub ttl: Duration,
    pub last_known: Duration,
}

struct Expiry;

impl<V> moka::Expiry<Key, Arc<Entry<V>>> for Expiry {
    fn expire_after_create(
        &self,
        _key: &Key,
        entry: &Arc<Entry<V>>,
        _at: std::time::Instant,
    ) -> Option<Duration> {
        Some(entry.ttl)
    }
}

struct LastKnownExpiry;

impl<V> moka::Expiry<Key, Arc<Entry<V>>> for LastKnownExpiry {
    fn expire_after_create(
        &self,
        _key: &Key,
        entry: &Arc<Entry<V>>,
        _at: std::time::Instant,
    ) -> Option<Duration> {
        Some(entry.last_known.max(entry.ttl))
    }
}

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A cached entry (or another request's fetch in flight).
    Cache,
    /// This call fetched it.
    Upstream,
    /// Upstream could not be asked; the last known answer, past its TTL.
    LastKnown,
}

impl Source {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::Upstream => "upstream",
            Source::LastKnown => "last_known",
        }
    }
}

/// The cache.
pub struct TtlCache<V> {
    cache: moka::future::Cache<Key, Arc<Entry<V>>>,
    last_known: moka::sync::Cache<Key, Arc<Entry<V>>>,
    /// Until when upstream counts as unavailable after a fetch found it
    /// so: meanwhile a key with a last known answer is not fetched (each
    /// read would otherwise wait for the fetch to time out).
    unavailable_until: parking_lot::Mutex<Option<Instant>>,
}

/// How long upstream counts as unavailable after a fetch found it so.
const UNAVAILABLE_FOR: Duration = Duration::from_secs(5);

impl<V> std::fmt::Debug for TtlCache<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TtlCache")
            .field("entries", &self.cache.entry_count())
            .finish()
    }
}

// === impl TtlCache ===

impl<V: Clone + Send + Sync + 'static> TtlCache<V> {
    /// A cache of at most `capacity` entries.
    pub fn new(capacity: u64) -> TtlCache<V> {
        TtlCache {
            cache: moka::future::Cache::builder()
                .max_capacity(capacity)
                .expire_after(Expiry)
                .build(),
            last_known: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .expire_after(LastKnownExpiry)
                .build(),
            unavailable_until: parking_lot::Mutex::new(None),
        }
    }

    /// The value for `key`, fetched with `fetch` on a miss. A failed fetch
    /// is not cached; when `unavailable` says the failure means upstream
    /// could not be asked, the last known answer is returned if there is
    /// one, else the error.
    ///
    /// # Errors
    /// The fetch's error.
    pub async fn get_or_fetch<E, F>(
        &self,
        key: Key,
        fetch: F,
        unavailable: impl Fn(&E) -> bool,
    ) -> (Result<V, E>, Source)
    where
        E: Clone + Send + Sync + 'static,
        F: Future<Output = Result<Fetched<V>, E>>,
    {
        let down = self
            .unavailable_until
            .lock()
            .is_some_and(|until| Instant::now() < until);
        if down
            && self.cache.get(&key).await.is_none()
            && let Some(last) = self.last_known.get(&key)
        {
            return (Ok(last.value.clone()), Source::LastKnown);
        }
        let fetched = AtomicBool::new(false);
        let result = self
            .cache
            .try_get_with(key, async {
                fetched.store(true, Ordering::Relaxed);
                let f = match fetch.await {
                    Ok(f) => f,
                    Err(e) => {
                        if unavailable(&e) {
                            *self.unavailable_until.lock() = Some(Instant::now() + UNAVAILABLE_FOR);
                        }
                        return Err(e);
                    }
                };
                *self.unavailable_until.lock() = None;
                let entry = Arc::new(Entry {
                    value: f.value,
                    ttl: f.ttl,
                    last_known: f.last_known,
                });
                self.last_known.insert(key, entry.clone());
                Ok(entry)
            })
            .await;
        match result {
            Ok(e) if fetched.load(Ordering::Relaxed) => (Ok(e.value.clone()), Source::Upstream),
            Ok(e) => (Ok(e.value.clone()), Source::Cache),
            Err(e) if unavailable(&e) => match self.last_known.get(&key) {
                Some(last) => (Ok(last.value.clone()), Source::LastKnown),
                None => (Err((*e).clone()), Source::Upstream),
            },
            Err(e) => (Err((*e).clone()), Source::Upstream),
        }
    }

    /// The value for `key`, if cached and not expired; no fetch.
    pub async fn get(&self, key: &Key) -> Option<V> {
        self.cache.get(key).await.map(|e| e.value.clone())
    }

    /// Every entry, for inspection in tests.
    pub async fn entries(&self) -> Vec<(Key, V)> {
        self.cache.run_pending_tasks().await;
        self.cache
            .iter()
            .map(|(k, e)| (*k, e.value.clone()))
            .collect()
    }

    /// Inserts an entry (tests).
    pub async fn insert(&self, key: Key, value: V, ttl: Duration) {
        let entry = Arc::new(Entry {
            value,
            ttl,
            last_known: ttl,
        });
        self.last_known.insert(key, entry.clone());
        self.cache.insert(key, entry).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh<V>(value: V, ttl_ms: u64, last_known_ms: u64) -> Fetched<V> {
        Fetched {
            value,
            ttl: Duration::from_millis(ttl_ms),
            last_known: Duration::from_millis(last_known_ms),
        }
    }

    fn never(_: &&str) -> bool {
        false
    }

    // moka expires entries on its own clock (not tokio's, which these
    // tests cannot pause): every check that an entry is still there has
    // a margin of seconds to its expiry, and only the checks that one has
    // expired sleep, past it: neither can pass or fail by a slow machine.

    #[tokio::test]
    async fn entries_expire_by_their_own_ttl_and_errors_are_not_cached() {
        let c: TtlCache<u32> = TtlCache::new(10);
        let (v, s) = c
            .get_or_fetch([1; 32], async { Ok(fresh(1, 50, 50)) }, never)
            .await;
        assert_eq!((v, s), (Ok(1), Source::Upstream));
        let (v, s) = c
            .get_or_fetch([3; 32], async { Ok(fresh(30, 60_000, 0)) }, never)
            .await;
        assert_eq!((v, s), (Ok(30), Source::Upstream));
        tokio::time::sleep(Duration::from_millis(80)).await;
        // The short-lived entry is gone, the long-lived one is there.
        let (v, s) = c
            .get_or_fetch([1; 32], async { Ok(fresh(3, 60_000, 0)) }, never)
            .await;
        assert_eq!((v, s), (Ok(3), Source::Upstream));
        let (v, s) = c
            .get_or_fetch([3; 32], async { Ok(fresh(31, 60_000, 0)) }, never)
            .await;
        assert_eq!((v, s), (Ok(30), Source::Cache));
        let (v, _) = c.get_or_fetch([2; 32], async { Err("down") }, never).await;
        assert_eq!(v, Err("down"));
        let (v, s) = c
            .get_or_fetch([2; 32], async { Ok(fresh(4, 60_000, 0)) }, never)
            .await;
        assert_eq!((v, s), (Ok(4), Source::Upstream));
    }

    #[tokio::test]
    async fn the_last_known_answer_stands_in_only_while_upstream_is_unavailable() {
        let c: TtlCache<u32> = TtlCache::new(10);
        let unavailable = |e: &&str| *e == "unavailable";
        let (v, _) = c
            .get_or_fetch([1; 32], async { Ok(fresh(1, 20, 2_000)) }, unavailable)
            .await;
        assert_eq!(v, Ok(1));
        tokio::time::sleep(Duration::from_millis(40)).await;
        // Past its TTL: asked again. Any failure but unavailability is
        // returned.
        let (v, _) = c
            .get_or_fetch([1; 32], async { Err("forbidden") }, unavailable)
            .await;
        assert_eq!(v, Err("forbidden"));
        // Upstream unavailable: the last known answer.
        let (v, s) = c
            .get_or_fetch([1; 32], async { Err("unavailable") }, unavailable)
            .await;
        assert_eq!((v, s), (Ok(1), Source::LastKnown));
        // Meanwhile upstream is not asked again for a key with a last
        // known answer; one without fails as before.
        let (v, s) = c
            .get_or_fetch([1; 32], async { Ok(fresh(9, 60_000, 0)) }, unavailable)
            .await;
        assert_eq!((v, s), (Ok(1), Source::LastKnown));
        let (v, _) = c
            .get_or_fetch([2; 32], async { Err("unavailable") }, unavailable)
            .await;
        assert_eq!(v, Err("unavailable"));
        // Past its last-known lifetime (2 s from the fetch): the error.
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        let (v, _) = c
            .get_or_fetch([1; 32], async { Err("unavailable") }, unavailable)
            .await;
        assert_eq!(v, Err("unavailable"));
    }
}
