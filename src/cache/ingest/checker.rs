//! The consistency checker: proof, while the proxy runs, that each cache
//! holds what upstream holds, and a heal when it does not.
//!
//! After kube-apiserver's (`DetectCacheInconsistency`, beta and on by
//! default since 1.34; `consistencyChecker` in
//! `staging/src/k8s.io/apiserver/pkg/storage/cacher/delegator.go`), which
//! lists its watch cache at the cache's resourceVersion and etcd at exactly
//! that revision and compares an FNV-1 digest of every object's
//! namespace, name and resourceVersion:
//! - per cached resource, the first check `period` to 1.5 × `period` after
//!   the start, each next one as long after the previous one ended;
//! - the cache's objects and resourceVersion `R` are taken together under
//!   the store lock; upstream is listed at exactly `R`
//!   (`resourceVersionMatch=Exact`, then the continue tokens, which pin
//!   `R`), metadata only (`as=PartialObjectMetadataList`), in pages of
//!   `page_size`, with the cache's own scope and identity;
//! - the two are compared by namespace/name and resourceVersion;
//! - `kube_cache_proxy_consistency_checks_total{status}` counts `success`,
//!   `failure` and `error` (as `apiserver_storage_consistency_checks_total`).
//!
//! Beyond the apiserver, which only stops serving exact reads from its
//! snapshots after a failure, the proxy **heals**: it logs the first
//! differing object and relists the resource, and the relist reaches every
//! watcher as ordinary events (`State::replace`: a version the cache
//! missed is delivered late, at a free resourceVersion, so no watcher is
//! cut off).
//!
//! When upstream has compacted `R` (a quiet resource whose cache trails
//! etcd's revision by more than the compaction interval), the check lists
//! upstream consistently instead, waits for the cache to reach that list's
//! resourceVersion `L` (a progress watch moves a quiet cache on), and
//! compares the state the cache rebuilds at `L`.
//!
//! Cost to upstream, per check: one metadata-only list of the resource in
//! pages (kube-apiserver 1.34+ serves an exact-revision list from its watch
//! cache's snapshots while it holds them, else from etcd), i.e. about the
//! objects' metadata bytes; nothing else.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::upstream::Upstream;

use super::reflector::{ListMeta, QUERY, ReflectorError, get_accepting, read_body};
use crate::cache::resource::ResourceCache;

/// Metadata-only lists: what the check needs (namespace, name,
/// resourceVersion), in a fraction of the objects' bytes.
const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// How long a check whose exact revision was compacted waits for the cache
/// to reach a consistent list's resourceVersion.
const CATCH_UP: Duration = Duration::from_secs(10);

#[derive(Deserialize)]
struct MetaList<'a> {
    #[serde(borrow)]
    metadata: ListMeta<'a>,
    /// `null` in an empty list: the apiserver builds a
    /// PartialObjectMetadataList by appending to a nil slice
    /// (handlers/response.go asPartialObjectMetadataList).
    #[serde(borrow, default)]
    items: Option<Vec<MetaItem<'a>>>,
}

#[derive(Deserialize)]
struct MetaItem<'a> {
    #[serde(borrow)]
    metadata: ItemMeta<'a>,
}

#[derive(Deserialize)]
struct ItemMeta<'a> {
    #[serde(borrow, default)]
    namespace: Cow<'a, str>,
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(rename = "resourceVersion", borrow, default)]
    resource_version: Cow<'a, str>,
}

/// The first object the two sides disagree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// `namespace/name` (or `name`).
    pub key: String,
    /// Its resourceVersion in the cache (`None`: the cache lacks it).
    pub cache: Option<u64>,
    /// Its resourceVersion upstream (`None`: upstream lacks it).
    pub upstream: Option<u64>,
}

/// How the two sides compare.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Comparison {
    /// Objects compared (upstream's count).
    pub objects: usize,
    /// Upstream only.
    pub missing: usize,
    /// The cache only.
    pub extra: usize,
    /// At another resourceVersion.
    pub differing: usize,
    /// The first disagreement, in key order.
    pub first: Option<Difference>,
}

impl Comparison {
    /// Whether the two sides hold the same objects at the same versions.
    pub fn consistent(&self) -> bool {
        self.first.is_none()
    }
}

/// Compares the cache's `key → resourceVersion` pairs, in key order (the
/// store's order), with upstream's.
pub fn compare<'a>(
    cache: impl Iterator<Item = (&'a str, u64)>,
    upstream: &BTreeMap<String, u64>,
) -> Comparison {
    let mut c = Comparison {
        objects: upstream.len(),
        ..Comparison::default()
    };
    let note = |c: &mut Comparison, key: &str, cache: Option<u64>, upstream: Option<u64>| {
        if c.first.is_none() {
            c.first = Some(Difference {
                key: key.to_string(),
                cache,
                upstream,
            });
        }
    };
    let mut cache = cache.peekable();
    let mut up = upstream.iter().peekable();
    loop {
        match (cache.peek().copied(), up.peek()) {
            (None, None) => break,
            (Some((k, rv)), None) => {
                c.extra += 1;
                note(&mut c, k, Some(rv), None);
                cache.next();
            }
            (None, Some((k, rv))) => {
                c.missing += 1;
                note(&mut c, k, None, Some(**rv));
                up.next();
            }
            (Some((ck, crv)), Some((uk, urv))) => match ck.cmp(uk.as_str()) {
                std::cmp::Ordering::Less => {
                    c.extra += 1;
                    note(&mut c, ck, Some(crv), None);
                    cache.next();
                }
                std::cmp::Ordering::Greater => {
                    c.missing += 1;
                    note(&mut c, uk, None, Some(**urv));
                    up.next();
                }
                std::cmp::Ordering::Equal => {
                    if crv != **urv {
                        c.differing += 1;
                        note(&mut c, ck, Some(crv), Some(**urv));
                    }
                    cache.next();
                    up.next();
                }
            },
        }
    }
    c
}

/// Runs the checks of one resource's cache until `shutdown`.
#[derive(Debug, Clone)]
pub struct Checker {
    pub cache: Arc<ResourceCache>,
    pub upstream: Upstream,
    pub shutdown: CancellationToken,
    /// Base time between checks.
    pub period: Duration,
    /// Objects per upstream page.
    pub page_size: u32,
}

/// Why a check could not compare.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cache is not ready")]
    NotReady,
    #[error("listing upstream: {0}")]
    Upstream(#[from] ReflectorError),
    #[error("{0}")]
    Other(String),
}

impl Checker {
    /// Checks every `period` (jittered, counted from the end of the last
    /// check) until shutdown. A period of zero disables it.
    pub async fn run(self) {
        if self.period.is_zero() {
            return;
        }
        let resource = self.cache.info().gvr.resource.clone();
        loop {
            let wait = self.period.mul_f64(1.0 + 0.5 * fastrand::f64());
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let started = Instant::now();
            let result = tokio::select! {
                () = self.shutdown.cancelled() => return,
                r = self.check() => r,
            };
            let seconds = started.elapsed().as_secs_f64();
            let metrics = &self.cache.metrics;
            match result {
                Ok((rv, c)) if c.consistent() => {
                    metrics.consistency_check("success", seconds);
                    self.cache.note_check("success");
                    tracing::debug!(%resource, rv, objects = c.objects, seconds, "cache consistency check passed");
                }
                Ok((rv, c)) => {
                    metrics.consistency_check("failure", seconds);
                    self.cache.note_check("failure");
                    let first = c.first.clone().unwrap_or(Difference {
                        key: String::new(),
                        cache: None,
                        upstream: None,
                    });
                    tracing::error!(
                        %resource,
                        rv,
                        objects = c.objects,
                        missing = c.missing,
                        extra = c.extra,
                        differing = c.differing,
                        first_key = %first.key,
                        first_cache_rv = ?first.cache,
                        first_upstream_rv = ?first.upstream,
                        "cache consistency check failed; relisting to heal"
                    );
                    self.cache.request_relist();
                }
                Err(error) => {
                    metrics.consistency_check("error", seconds);
                    self.cache.note_check("error");
                    tracing::warn!(%resource, %error, "cache consistency check error");
                }
            }
        }
    }

    /// One check: the cache against upstream at one resourceVersion.
    ///
    /// # Errors
    /// [`CheckError`] when the two could not be compared.
    pub async fn check(&self) -> Result<(u64, Comparison), CheckError> {
        if !self.cache.is_synced() {
            return Err(CheckError::NotReady);
        }
        let (objects, rv) = {
            let s = self.cache.lock();
            (s.objects().clone(), s.rv())
        };
        match self.list(Some(rv)).await {
            Ok((_, upstream)) => {
                let cache = objects.iter().map(|(k, o)| (&**k, o.rv));
                Ok((rv, compare(cache, &upstream)))
            }
            // Upstream has compacted the cache's revision: compare at a
            // newer one instead.
            Err(ReflectorError::Expired(_)) => {
                let (list_rv, upstream) = self.list(None).await?;
                if !self
                    .cache
                    .wait_fresh(list_rv, CATCH_UP, "consistency_check")
                    .await
                {
                    return Err(CheckError::Other(format!(
                        "the cache did not reach resourceVersion {list_rv} in {CATCH_UP:?}"
                    )));
                }
                let objects = self.cache.snapshot_at(list_rv).ok_or_else(|| {
                    CheckError::Other(format!(
                        "resourceVersion {list_rv} left the cache's history"
                    ))
                })?;
                let cache = objects.iter().map(|(k, o)| (&**k, o.rv));
                Ok((list_rv, compare(cache, &upstream)))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Lists upstream's `key → resourceVersion` at exactly `rv` (or
    /// consistently, when `None`), in pages; returns the list's
    /// resourceVersion too.
    async fn list(&self, rv: Option<u64>) -> Result<(u64, BTreeMap<String, u64>), ReflectorError> {
        let info = self.cache.info();
        let scope = (!info.scope.is_empty()).then(|| {
            format!(
                "&fieldSelector={}",
                percent_encoding::utf8_percent_encode(&info.scope.to_string(), QUERY)
            )
        });
        let mut out = BTreeMap::new();
        let mut continue_token: Option<String> = None;
        let mut list_rv = None;
        loop {
            let mut q = format!("{}?limit={}", info.collection_path(), self.page_size);
            match (&continue_token, rv) {
                (Some(c), _) => {
                    q.push_str("&continue=");
                    q.push_str(&percent_encoding::utf8_percent_encode(c, QUERY).to_string());
                }
                (None, Some(rv)) => {
                    q.push_str(&format!("&resourceVersion={rv}&resourceVersionMatch=Exact"));
                }
                (None, None) => {}
            }
            if let Some(s) = &scope {
                q.push_str(s);
            }
            let resp = get_accepting(
                &self.upstream,
                &q,
                info.reads_as.as_ref(),
                Some(METADATA_LIST),
            )
            .await?;
            let bytes = read_body(resp).await?;
            let page: MetaList<'_> = serde_json::from_slice(&bytes)
                .map_err(|e| ReflectorError::Malformed(e.to_string()))?;
            let page_rv: u64 = page
                .metadata
                .resource_version
                .parse()
                .map_err(|_| ReflectorError::Malformed("list has no resourceVersion".into()))?;
            match (list_rv, rv) {
                (None, Some(rv)) if page_rv != rv => {
                    return Err(ReflectorError::Malformed(format!(
                        "upstream listed at resourceVersion {page_rv}, not {rv}"
                    )));
                }
                (None, _) => list_rv = Some(page_rv),
                (Some(first), _) if first != page_rv => {
                    return Err(ReflectorError::Malformed(format!(
                        "a page at resourceVersion {page_rv}, not {first}"
                    )));
                }
                (Some(_), _) => {}
            }
            for item in page.items.into_iter().flatten() {
                let m = item.metadata;
                let key = if info.namespaced {
                    format!("{}/{}", m.namespace, m.name)
                } else {
                    m.name.into_owned()
                };
                let item_rv = m.resource_version.parse().map_err(|_| {
                    ReflectorError::Malformed(format!("{key} has no resourceVersion"))
                })?;
                out.insert(key, item_rv);
            }
            continue_token = page
                .metadata
                .continue_token
                .filter(|c| !c.is_empty())
                .map(Cow::into_owned);
            if continue_token.is_none() {
                return Ok((list_rv.unwrap_or_default(), out));
            }
            if self.shutdown.is_cancelled() {
                return Err(ReflectorError::Upstream("shutting down".into()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| ((*k).to_string(), *v)).collect()
    }

    #[test]
    fn equal_sides_are_consistent() {
        let up = map(&[("a/x", 5), ("b/y", 7)]);
        let c = compare([("a/x", 5), ("b/y", 7)].into_iter(), &up);
        assert!(c.consistent());
        assert_eq!(c.objects, 2);
        let c = compare(std::iter::empty(), &BTreeMap::new());
        assert!(c.consistent());
    }

    #[test]
    fn a_missed_write_a_missed_delete_and_a_stale_version() {
        // The cache missed c's creation, d's deletion and b's update.
        let up = map(&[("ns/a", 5), ("ns/b", 9), ("ns/c", 8)]);
        let c = compare([("ns/a", 5), ("ns/b", 6), ("ns/d", 4)].into_iter(), &up);
        assert!(!c.consistent());
        assert_eq!((c.missing, c.extra, c.differing), (1, 1, 1));
        assert_eq!(
            c.first,
            Some(Difference {
                key: "ns/b".into(),
                cache: Some(6),
                upstream: Some(9)
            })
        );
        // Only a missed write: the first difference is upstream's key.
        let c = compare([("ns/a", 5), ("ns/b", 9)].into_iter(), &up);
        assert_eq!((c.missing, c.extra, c.differing), (1, 0, 0));
        assert_eq!(
            c.first,
            Some(Difference {
                key: "ns/c".into(),
                cache: None,
                upstream: Some(8)
            })
        );
    }

    #[test]
    fn an_empty_metadata_list_has_null_items() {
        // kube-apiserver v1.36.2's answer for an empty resource.
        let body = br#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"42"},"items":null}"#;
        let page: MetaList<'_> = serde_json::from_slice(body).unwrap();
        assert_eq!(page.metadata.resource_version, "42");
        assert!(page.items.is_none());
        let missing: MetaList<'_> = serde_json::from_slice(br#"{"metadata":{}}"#).unwrap();
        assert!(missing.items.is_none());
    }
}
