//! A bounded cache whose entries each carry their own time to live, keyed
//! by a digest, where concurrent misses for one key share one fetch
//! (moka's `try_get_with`) and failures are not cached. Both review caches
//! (tokens and access decisions) are this.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A 32-byte digest.
pub type Key = [u8; 32];

struct Entry<V> {
    value: V,
    ttl: Duration,
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

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A cached entry (or another request's fetch in flight).
    Cache,
    /// This call fetched it.
    Upstream,
}

impl Source {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::Upstream => "upstream",
        }
    }
}

/// The cache.
pub struct TtlCache<V> {
    cache: moka::future::Cache<Key, Arc<Entry<V>>>,
}

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
        }
    }

    /// The value for `key`, fetched with `fetch` (value and its TTL) on a
    /// miss. A failed fetch is returned, not cached.
    ///
    /// # Errors
    /// The fetch's error.
    pub async fn get_or_fetch<E, F>(&self, key: Key, fetch: F) -> (Result<V, E>, Source)
    where
        E: Clone + Send + Sync + 'static,
        F: Future<Output = Result<(V, Duration), E>>,
    {
        let fetched = AtomicBool::new(false);
        let result = self
            .cache
            .try_get_with(key, async {
                fetched.store(true, Ordering::Relaxed);
                fetch
                    .await
                    .map(|(value, ttl)| Arc::new(Entry { value, ttl }))
            })
            .await;
        let source = if fetched.load(Ordering::Relaxed) {
            Source::Upstream
        } else {
            Source::Cache
        };
        (
            result.map(|e| e.value.clone()).map_err(|e| (*e).clone()),
            source,
        )
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
        self.cache.insert(key, Arc::new(Entry { value, ttl })).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn entries_expire_by_their_own_ttl_and_errors_are_not_cached() {
        let c: TtlCache<u32> = TtlCache::new(10);
        let (v, s) = c
            .get_or_fetch::<(), _>([1; 32], async { Ok((1, Duration::from_millis(50))) })
            .await;
        assert_eq!((v, s), (Ok(1), Source::Upstream));
        let (v, s) = c
            .get_or_fetch::<(), _>([1; 32], async { Ok((2, Duration::from_secs(60))) })
            .await;
        assert_eq!((v, s), (Ok(1), Source::Cache));
        tokio::time::sleep(Duration::from_millis(80)).await;
        let (v, _) = c
            .get_or_fetch::<(), _>([1; 32], async { Ok((3, Duration::from_secs(60))) })
            .await;
        assert_eq!(v, Ok(3));
        let (v, _) = c
            .get_or_fetch([2; 32], async { Err::<(u32, Duration), _>("down") })
            .await;
        assert_eq!(v, Err("down"));
        let (v, s) = c
            .get_or_fetch::<&str, _>([2; 32], async { Ok((4, Duration::from_secs(60))) })
            .await;
        assert_eq!((v, s), (Ok(4), Source::Upstream));
    }
}
