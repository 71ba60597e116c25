//! Answering get, list and watch from the cache with kube-apiserver's
//! semantics, or declining so the request passes through.
//!
//! resourceVersion rules (`staging/src/k8s.io/apiserver/pkg/storage/cacher/`,
//! "Kubernetes API Concepts"):
//!
//! | request | cache answers |
//! |---|---|
//! | RV unset (consistent) | after reaching upstream's current RV (see below), else pass through |
//! | RV `0` | at once, from the current state (a list ignores `limit`) |
//! | RV `N`, NotOlderThan | once the cache RV ≥ N; after 3 s, `504` with `Retry-After` |
//! | RV `N`, Exact (or `limit` with RV `N`) | the state at N rebuilt from history; older than history, or compacted upstream (`compaction.rs`): pass through |
//! | `continue` | the page at the token's RV, as above |
//! | watch from `N` | history after N; older than history: pass through (upstream replays or answers `410`) |
//! | watch, `sendInitialEvents` | snapshot, `k8s.io/initial-events-end` bookmark, changes |
//!
//! Consistent reads. An unset RV promises a result that reflects every
//! write completed before the request.
//! - A consistent **get** of one object passes straight through, before
//!   any authentication or authorization work: kube-apiserver itself reads
//!   single objects from etcd (`ConsistentListFromCache` covers lists
//!   only), and one object costs upstream no more than the proof of
//!   freshness would.
//! - A consistent **list** learns upstream's current RV with a cheap
//!   `limit=1` list (one in flight per resource, shared by every request
//!   that arrived before it started) and is served from the cache if the
//!   cache has reached that RV; otherwise it passes through at once
//!   (`consistentListWaitMilliseconds`, default 0, allows a wait), unless
//!   its scope holds `largeListObjects` (1000) cached objects or more: that
//!   one waits up to `largeListWaitMilliseconds` (3 s, as the apiserver's
//!   cache), as passing it through would cost upstream every object. Once a
//!   probe has found the cache behind, consistent lists pass straight
//!   through, unprobed, for a second, and a progress watch is asked for:
//!   a quiet resource in a busy cluster (the probe's RV is etcd's, moved
//!   by every write anywhere) then costs upstream what going direct
//!   costs, plus one probe a second, instead of two requests per list.
//! - A consistent **watch** (a streaming list) waits up to 3 s, asking the
//!   reflector for a progress watch, which advances a quiet resource
//!   within about a second: an informer's start can wait that long, and
//!   its whole watch is then served from the cache.
//! - A consistent **watch of one object** (`metadata.name=` in a
//!   namespace: kubelet's watch of each Secret and ConfigMap a new pod
//!   mounts, which kubelet gives 1 s to sync before it fails the mount
//!   and backs off; its watch of its own Node) does not wait: when the
//!   probe finds the cache behind, the object is read upstream with a
//!   consistent list of it alone, which costs upstream what a consistent
//!   get costs, and the watch starts from that: the object as `ADDED`,
//!   the `k8s.io/initial-events-end` bookmark at upstream's revision, then
//!   every change after it from the cache (`Start::Given`).
//!
//! Passing through is slower, never stale. Writes that went through the
//! proxy are covered because they complete before the client's next
//! request starts.
//!
//! The serving side of the cache: this dispatch, and its parts below. It
//! imports the shared core (`cache::{resource, store, object, event,
//! encode, negotiate, filter, probe, compaction}`) and, of the ingest side,
//! only the upstream reads that prove a consistent read
//! (`cache::ingest::reflector::{probe_rv, probe_compaction, read_one}`).

pub mod continue_token;
pub mod list;
pub mod query;
pub mod view;
pub mod watcher;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, Response, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use tokio_util::sync::CancellationToken;

use crate::upstream::Upstream;
use apimachinery::body::{Body, BoxError};
use apimachinery::request::RequestInfo;
use apimachinery::status::Status;

use self::query::{ListOptions, Match, QueryError};
use self::view::View;
use self::watcher::WatchParams;
use super::compaction::Verdict;
use super::encode;
use super::filter::Filter;
use super::negotiate::{Encoding, ErrorEncoding, Negotiated, Verb, negotiate};
use super::probe::{PROBE_TIMEOUT, ProbeError};
use super::resource::ResourceCache;
use super::store::Start;

// The serving side's one import from the ingest side: the upstream reads
// that prove a consistent read (docs/architecture.md).
use super::ingest::reflector::{probe_compaction, probe_rv, read_one};

/// Why a read passes through when its resourceVersion is older than the
/// cache's history.
pub const OLDER_THAN_THE_CACHE: &str = "resourceVersion older than the cache";
/// Why a read passes through while the cache has not completed its first
/// list.
pub const NOT_READY: &str = "not ready";
/// Why a read passes through while upstream refuses the cache's own list
/// or watch (`ResourceCache::refused`).
pub const UPSTREAM_REFUSED: &str = "upstream refused";
/// Why a consistent read passes through when upstream's resourceVersion
/// could not be learnt.
pub const PROBE_FAILED: &str = "probe failed";
/// Why a consistent read passes through when the cache could not be shown
/// fresh in time.
pub const NOT_FRESH: &str = "not fresh";

/// Why a continued list passes through when its token's resourceVersion
/// is newer than the cache's.
pub const CONTINUE_AHEAD: &str = "continue token ahead of the cache";

/// Why a `resourceVersion=0` read passes through when a cache resumed
/// after a crash has not caught up within [`CATCH_UP_WAIT`].
pub const CATCHING_UP: &str = "catching up";

/// How long a `resourceVersion=0` read waits for a cache resumed after a
/// crash to catch up (normally a fraction of a second: one `limit=1`
/// consistent list). Passing through sooner would hand the client
/// upstream's newer state, and the cache's answer a moment later would
/// go back in time.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(10);

/// Why a read at an exact resourceVersion passes through when upstream
/// has compacted it (the apiserver answers `410 Expired` itself).
pub const COMPACTED: &str = "compacted";

/// Whether a watch passed through for `reason` is one the cache could
/// serve a moment later (so it should not stay upstream for its whole
/// life): see `handler::catch_up_only`.
pub fn is_transient(reason: &str) -> bool {
    [
        OLDER_THAN_THE_CACHE,
        NOT_READY,
        PROBE_FAILED,
        NOT_FRESH,
        COMPACTED,
        CATCHING_UP,
        UPSTREAM_REFUSED,
    ]
    .contains(&reason)
}

/// The cache's decision on a read.
#[derive(Debug)]
pub enum Answer {
    /// Answered from the cache (including the apiserver's errors).
    Served(Response<Body>),
    /// Pass through; the reason labels metrics.
    PassThrough(&'static str),
}

/// A read request, as the cache needs it.
#[derive(Debug)]
pub struct Read<'a> {
    pub info: &'a RequestInfo,
    pub query: Option<&'a str>,
    /// The request's headers (`Accept`, `User-Agent`).
    pub headers: &'a HeaderMap,
    /// When the request arrived (consistent reads need a probe started
    /// after this).
    pub arrived: Instant,
    /// The connection's batch window for held watches (HTTP/2).
    pub window: Option<&'a Arc<watcher::BatchWindow>>,
    /// What the reader sees differently from the cache, if anything
    /// (`view.rs`).
    pub view: Option<&'a Arc<View>>,
}

/// Why a read must pass through whatever the cache holds, known from the
/// request alone: checked before authenticating or authorizing it for the
/// cache, so such reads cost no more than going direct.
pub fn passes_through_early(info: &RequestInfo, query: Option<&str>) -> Option<&'static str> {
    if info.verb != "get" {
        return None;
    }
    let rv = apimachinery::url::query_get(query, "resourceVersion");
    rv.is_none_or(|v| v.is_empty()).then_some("consistent get")
}

/// Answers `read` from `cache` or declines.
pub async fn serve(
    cache: &Arc<ResourceCache>,
    upstream: &Upstream,
    read: Read<'_>,
    shutdown: &CancellationToken,
) -> Answer {
    let answer = match negotiated(cache, &read) {
        Err(reason) => Answer::PassThrough(reason),
        Ok(neg) => match read.info.verb.as_str() {
            "get" => serve_get(cache, &read, neg).await,
            "list" => serve_list(cache, upstream, &read, neg).await,
            "watch" => serve_watch(cache, upstream, &read, neg, shutdown).await,
            _ => Answer::PassThrough("verb"),
        },
    };
    let source = match &answer {
        Answer::Served(_) => ("cache", ""),
        Answer::PassThrough(reason) => ("upstream", *reason),
    };
    cache.metrics.read(&read.info.verb, source.0, source.1);
    answer
}

/// The representation a read is answered in, or why it passes through.
fn negotiated(cache: &ResourceCache, read: &Read<'_>) -> Result<Negotiated, &'static str> {
    let verb = match read.info.verb.as_str() {
        "get" => Verb::Get,
        "list" => Verb::List,
        _ => Verb::Watch,
    };
    let info = cache.info();
    let neg = negotiate(read.headers, read.query, verb, info.strip_item_type_meta)?;
    if neg.body.encoding == Encoding::Protobuf || neg.errors == ErrorEncoding::Protobuf {
        match &info.codec {
            None => return Err("no protobuf schema"),
            Some(c) if c.is_broken() => return Err("protobuf encoding failed"),
            Some(_) => {}
        }
    }
    Ok(neg)
}

/// Counts an answer from the cache in `neg`'s representation.
fn served(cache: &ResourceCache, verb: &str, neg: Negotiated, resp: Response<Body>) -> Answer {
    cache
        .metrics
        .served(verb, encode::representation_label(neg.body));
    Answer::Served(resp)
}

fn status(s: Status, neg: Negotiated) -> Answer {
    Answer::Served(encode::status_response(s, neg.errors))
}

/// Waits for the first list, or declines; declines at once while upstream
/// refuses the cache's reads.
async fn ready(cache: &ResourceCache) -> Result<(), Answer> {
    if cache.refused() {
        return Err(Answer::PassThrough(UPSTREAM_REFUSED));
    }
    if cache.wait_synced(cache.read.ready_wait).await {
        Ok(())
    } else {
        Err(Answer::PassThrough(NOT_READY))
    }
}

/// Waits, for a `resourceVersion=0` read, until a cache resumed from a
/// crash's snapshot has caught up with upstream (or upstream is
/// unreachable), so no client sees it go back in time; or declines
/// (`resource.rs` `Resumed`).
async fn current(cache: &ResourceCache) -> Result<(), Answer> {
    if cache.wait_current(CATCH_UP_WAIT).await {
        Ok(())
    } else {
        Err(Answer::PassThrough(CATCHING_UP))
    }
}

/// Waits, for a read or watch from `rv`, until a cache resumed from a
/// crash's snapshot older than `rv` has caught up, after which `rv` is
/// either the cache's own or disowned (a watch from it gets `410 Gone`,
/// an exact read passes through); or declines (`resource.rs`
/// `ResourceCache::resumed_after_crash`). Until then, the events the
/// cache has received past its snapshot need not be those the crashed
/// process served the client.
async fn after_crash(cache: &ResourceCache, rv: u64) -> Result<(), Answer> {
    match cache.crashed_at() {
        Some(at) if rv > at => current(cache).await,
        _ => Ok(()),
    }
}

/// Waits, for a consistent read, until a cache resumed from a crash's
/// snapshot has caught up (see [`after_crash`]): answered sooner, from the
/// resourceVersion the cache has reached by then, the client would hold one
/// the catch-up may disown a moment later, and its next watch from it would
/// get `410 Gone` and a list more.
async fn caught_up(cache: &ResourceCache) -> Result<(), Answer> {
    match cache.crashed_at() {
        Some(_) => current(cache).await,
        None => Ok(()),
    }
}

/// Proves the cache holds upstream's current state (it has reached the RV
/// a probe started after the request arrived found upstream at), waiting
/// at most `wait` for it; or declines. A cache still catching up after a
/// crash is waited for first ([`caught_up`]). A probe upstream shed or left
/// unanswered ([`ProbeError::is_busy`]) is answered with an error to
/// retry, as the apiserver's own overload answers: `429` (what upstream
/// said) or `503`, each with `Retry-After: 1` (client-go's reflectors
/// retry a `429` watch without falling back to a list).
async fn consistent(
    cache: &ResourceCache,
    upstream: &Upstream,
    arrived: Instant,
    wait: Duration,
    neg: Negotiated,
) -> Result<(), Answer> {
    caught_up(cache).await?;
    if wait.is_zero() && cache.known_behind() {
        return Err(Answer::PassThrough(NOT_FRESH));
    }
    let info = cache.info().clone();
    let upstream = upstream.clone();
    let target = cache
        .upstream_rv(arrived, move || probe_rv(upstream, &info))
        .await
        .map_err(|e| match busy(&e) {
            Some(answer) => status(answer, neg),
            None => Answer::PassThrough(PROBE_FAILED),
        })?;
    let fresh = if wait.is_zero() {
        let fresh = cache.rv() >= target;
        cache.note_probe(fresh);
        fresh
    } else {
        cache.wait_fresh(target, wait, "consistent").await
    };
    if fresh {
        Ok(())
    } else {
        Err(Answer::PassThrough(NOT_FRESH))
    }
}

/// A consistent streaming list of the one object `name` (in `namespace`):
/// `None` when the cache is shown fresh, as for any consistent read; when
/// the probe finds it behind, the state to start from, read upstream
/// (upstream's revision and the object, if it exists), instead of waiting
/// for the cache to reach that revision (up to a bookmark tick, about a
/// second, for a quiet resource in a busy cluster). If that read fails,
/// the watch waits for the cache as any other.
#[allow(clippy::too_many_arguments)]
async fn consistent_one(
    cache: &ResourceCache,
    upstream: &Upstream,
    arrived: Instant,
    wait: Duration,
    neg: Negotiated,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<Start>, Answer> {
    caught_up(cache).await?;
    let info = cache.info().clone();
    let probe_upstream = upstream.clone();
    let target = cache
        .upstream_rv(arrived, move || probe_rv(probe_upstream, &info))
        .await
        .map_err(|e| match busy(&e) {
            Some(answer) => status(answer, neg),
            None => Answer::PassThrough(PROBE_FAILED),
        })?;
    if cache.rv() >= target {
        return Ok(None);
    }
    let read = read_one(upstream.clone(), cache.info(), namespace, name).await;
    match read {
        Ok((rv, objects)) if rv >= target => {
            cache.metrics.object_read("ok");
            let objects = objects
                .into_iter()
                .map(|o| (o.key_arc().clone(), Arc::new(o)))
                .collect();
            Ok(Some(Start::Given(objects, rv)))
        }
        read => {
            match read {
                Err(error) => {
                    tracing::debug!(%error, "reading one object upstream failed; waiting for the cache")
                }
                Ok((rv, _)) => tracing::debug!(
                    rv,
                    target,
                    "one object read upstream below the probe's revision; waiting for the cache"
                ),
            }
            cache.metrics.object_read("error");
            if cache.wait_fresh(target, wait, "consistent").await {
                Ok(None)
            } else {
                Err(Answer::PassThrough(NOT_FRESH))
            }
        }
    }
}

/// The answer to a read whose consistency probe upstream shed (`429`,
/// API Priority and Fairness's own words) or did not answer; `None` for
/// any other failure.
fn busy(error: &ProbeError) -> Option<Status> {
    let retry = apimachinery::status::Details {
        retry_after_seconds: Some(1),
        ..Default::default()
    };
    match error {
        ProbeError::Shed(_) => Some(
            Status::new(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                "Too many requests, please try again later.",
            )
            .with_details(retry),
        ),
        ProbeError::Unanswered => Some(
            Status::service_unavailable(format!(
                "the apiserver did not answer a consistency check in {:?}",
                PROBE_TIMEOUT
            ))
            .with_details(retry),
        ),
        ProbeError::Rewound | ProbeError::Failed(_) => None,
    }
}

/// How long a consistent list of the scope of `prefix` may wait for the
/// cache to be shown fresh: a large one (`cache.largeListObjects`) waits
/// like kube-apiserver's cache, since passing it through would cost
/// upstream the encoding of every object, and the wait, about a second
/// for a quiet resource in a busy cluster, is shared by every request for
/// the resource; a small one costs upstream little, so it does not wait
/// longer than `cache.consistentListWaitMilliseconds` (0: at once).
fn consistent_list_wait(cache: &ResourceCache, prefix: &str) -> Duration {
    let read = &cache.read;
    if read.large_list_objects == 0 || read.large_list_wait <= read.consistent_list_wait {
        return read.consistent_list_wait;
    }
    let objects = cache.lock().objects().clone();
    if list::scope_holds_at_least(&objects, prefix, read.large_list_objects) {
        read.large_list_wait
    } else {
        read.consistent_list_wait
    }
}

/// Waits until the cache RV is at least `rv`, or the apiserver's `504`.
async fn not_older_than(cache: &ResourceCache, rv: u64) -> Result<(), Status> {
    if cache
        .wait_fresh(rv, cache.read.not_older_than_wait, "not_older_than")
        .await
    {
        Ok(())
    } else {
        Err(Status::too_large_resource_version(rv, cache.rv()))
    }
}

async fn serve_get(cache: &Arc<ResourceCache>, read: &Read<'_>, neg: Negotiated) -> Answer {
    let mut rv_param: Option<String> = None;
    for (k, v) in apimachinery::url::query_pairs(read.query.unwrap_or("")) {
        match k.as_str() {
            "resourceVersion" if rv_param.is_none() => rv_param = Some(v),
            "resourceVersion" => {}
            _ => return Answer::PassThrough("unknown query parameter"),
        }
    }
    // The registry's key function rejects a name that cannot be a path
    // segment before the storage is asked (`NamespaceKeyFunc`,
    // `NoNamespaceKeyFunc` in staging/src/k8s.io/apiserver/pkg/registry/
    // generic/registry/store.go): `400`, whatever the cache holds.
    let name = &read.info.name;
    let invalid = apimachinery::request::path_segment_name_errors(name);
    if !invalid.is_empty() {
        // Go quotes the name with `%q`, exactly reproduced for ASCII.
        if !name.is_ascii() {
            return Answer::PassThrough("name outside ASCII");
        }
        return status(
            Status::bad_request(format!(
                "Name parameter invalid: {}: {}",
                apimachinery::go::quote(name),
                invalid.join(";")
            )),
            neg,
        );
    }
    if let Err(a) = ready(cache).await {
        return a;
    }
    match rv_param.as_deref() {
        // See `passes_through_early`.
        None | Some("") => return Answer::PassThrough("consistent get"),
        Some("0") => {
            if let Err(a) = current(cache).await {
                return a;
            }
        }
        Some(rv) => {
            let Ok(rv) = query::parse_resource_version(rv) else {
                return Answer::PassThrough("unparseable resourceVersion");
            };
            if let Err(a) = after_crash(cache, rv).await {
                return a;
            }
            if let Err(s) = not_older_than(cache, rv).await {
                return status(s, neg);
            }
        }
    }
    let info = cache.info();
    let key = if info.namespaced {
        format!("{}/{}", read.info.namespace, read.info.name)
    } else {
        read.info.name.clone()
    };
    let found = cache.lock().objects().get(key.as_str()).cloned();
    let found = match (found, read.view) {
        (Some(o), Some(view)) => Some(view.object(&o)),
        (found, _) => found,
    };
    match found {
        Some(o) => {
            let Some(mut chunks) = encode::object_chunks(&o, info.codec.as_deref(), neg.body)
            else {
                return Answer::PassThrough("protobuf encoding failed");
            };
            if neg.body.encoding == Encoding::Json {
                chunks.push(Bytes::from_static(b"\n"));
            }
            let frames = chunks
                .into_iter()
                .map(|b| Ok::<_, BoxError>(Frame::data(b)));
            let resp = list::response_with(
                Body::new(StreamBody::new(stream::iter(frames))),
                encode::content_type(neg.body.encoding),
            );
            served(cache, "get", neg, resp)
        }
        // A scoped cache holds only part of the resource: the object may
        // exist outside the scope (a pod on another node).
        None if !info.scope.is_empty() => Answer::PassThrough("not in the cached scope"),
        // The message quotes the name as Go's `%q`, exactly reproduced
        // for ASCII only (no object has another name).
        None if !read.info.name.is_ascii() => Answer::PassThrough("name outside ASCII"),
        None => status(
            Status::not_found(&info.gvr.group, &info.gvr.resource, &read.info.name),
            neg,
        ),
    }
}

fn query_error(e: QueryError, neg: Negotiated) -> Answer {
    match e {
        QueryError::Status(s) => status(*s, neg),
        QueryError::PassThrough(r) => Answer::PassThrough(r),
    }
}

fn bad_request(message: impl Into<String>) -> QueryError {
    QueryError::Status(Box::new(Status::bad_request(message)))
}

/// Parses options and builds the filter, with the apiserver's errors.
fn prepare(
    cache: &ResourceCache,
    read: &Read<'_>,
    watch: bool,
) -> Result<(ListOptions, Filter), QueryError> {
    let opts = query::parse(read.query, watch)?;
    let info = cache.info();
    let mut fields = info
        .field_set
        .convert(&opts.field_selector)
        .map_err(bad_request)?;
    // A name in the path (legacy /watch/.../name): the selector may only
    // repeat it (`ListResource`'s hasName branch).
    if !read.info.name.is_empty() {
        let name_selector = apimachinery::selector::FieldSelector::parse(&format!(
            "metadata.name={}",
            apimachinery::selector::escape_field_value(&read.info.name)
        ))
        .map_err(|_| QueryError::PassThrough("name"))?;
        if fields.is_empty() {
            fields = name_selector;
        } else if fields.requires_exact_match("metadata.name") != Some(read.info.name.as_str()) {
            return Err(bad_request(
                "fieldSelector metadata.name doesn't match requested name",
            ));
        }
    }
    if !info.scope.is_empty() && !fields.implies(&info.scope) {
        return Err(QueryError::PassThrough("outside the cached scope"));
    }
    let filter = Filter {
        namespace: (!read.info.namespace.is_empty()).then(|| read.info.namespace.clone()),
        labels: opts.label_selector.clone(),
        fields,
    };
    Ok((opts, filter))
}

async fn serve_list(
    cache: &Arc<ResourceCache>,
    upstream: &Upstream,
    read: &Read<'_>,
    neg: Negotiated,
) -> Answer {
    let (opts, filter) = match prepare(cache, read, false) {
        Ok(p) => p,
        Err(e) => return query_error(e, neg),
    };
    if let Err(a) = ready(cache).await {
        return a;
    }
    let prefix = list::scope_prefix(filter.namespace.as_deref());
    let rv_param = opts.resource_version.as_deref();

    // A continued list: the page at the token's RV.
    if let Some(token) = &opts.continue_token {
        let Some(token) = continue_token::decode(token) else {
            return Answer::PassThrough("continue token");
        };
        if rv_param.is_some_and(|rv| rv != "0") {
            return status(
                Status::bad_request(
                    "specifying resource version is not allowed when using continue",
                ),
                neg,
            );
        }
        let Ok(rv) = u64::try_from(token.rv) else {
            return Answer::PassThrough("continue token at latest");
        };
        // A token the cache has not reached was issued upstream (its first
        // page passed through): its pages come from there too, at once.
        // Waiting for the cache would mean waiting for a bookmark about a
        // second away on a quiet resource, where the apiserver answers a
        // page in milliseconds, for no saving (docs/design.md, "Consistent
        // reads").
        if rv > cache.rv() {
            return Answer::PassThrough(CONTINUE_AHEAD);
        }
        // The apiserver's cache ignores `limit` for RV "0", continued or not
        // (`computeListLimit` in staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go).
        let limit = if rv_param == Some("0") { 0 } else { opts.limit };
        return exact_list(
            cache,
            upstream,
            &filter,
            &prefix,
            Some(&token.start),
            limit,
            rv,
            neg,
            read.view,
        )
        .await;
    }

    let parsed = match rv_param.map(query::parse_resource_version).transpose() {
        Ok(rv) => rv,
        Err(message) => {
            return status(
                Status::bad_request(format!("invalid resource version: {message}")),
                neg,
            );
        }
    };
    let legacy_exact =
        opts.resource_version_match.is_none() && opts.limit > 0 && parsed.is_some_and(|rv| rv > 0);
    match (parsed, opts.resource_version_match) {
        (Some(rv), m) if m == Some(Match::Exact) || legacy_exact => {
            return exact_list(
                cache, upstream, &filter, &prefix, None, opts.limit, rv, neg, read.view,
            )
            .await;
        }
        (None, _) => {
            if let Err(a) = consistent(
                cache,
                upstream,
                read.arrived,
                consistent_list_wait(cache, &prefix),
                neg,
            )
            .await
            {
                return a;
            }
        }
        (Some(0), _) => {
            if let Err(a) = current(cache).await {
                return a;
            }
        }
        (Some(rv), _) => {
            if let Err(a) = after_crash(cache, rv).await {
                return a;
            }
            if let Err(s) = not_older_than(cache, rv).await {
                return status(s, neg);
            }
        }
    }
    // The apiserver's cache ignores `limit` for RV "0".
    let limit = if parsed == Some(0) { 0 } else { opts.limit };
    let single = filter.single_key(cache.info().namespaced);
    let (objects, candidates, rv) = {
        let s = cache.lock();
        let candidates = single.is_none().then(|| s.candidates(&filter)).flatten();
        (s.objects().clone(), candidates, s.rv())
    };
    let page = match (single, candidates) {
        (Some(key), _) => list::select_one(&objects, &filter, &prefix, &key),
        (None, Some(keys)) => list::select_in(&objects, &keys, &filter, &prefix, None, limit, rv),
        (None, None) => list::select(&objects, &filter, &prefix, None, limit, rv),
    };
    list_answer(cache, page, rv, neg, read.view)
}

fn list_answer(
    cache: &ResourceCache,
    mut page: list::Page,
    rv: u64,
    neg: Negotiated,
    view: Option<&Arc<View>>,
) -> Answer {
    if let Some(view) = view {
        view.items(&mut page.items);
        view.listed();
    }
    match list::response(page, cache.info(), rv, neg.body) {
        Some(resp) => served(cache, "list", neg, resp),
        None => Answer::PassThrough("protobuf encoding failed"),
    }
}

/// A list at exactly `rv` (Exact, legacy exact, or continued): from the
/// state rebuilt from history, unless upstream has compacted `rv`, when
/// the apiserver answers `410 Expired` (`compaction.rs`).
#[allow(clippy::too_many_arguments)]
async fn exact_list(
    cache: &Arc<ResourceCache>,
    upstream: &Upstream,
    filter: &Filter,
    prefix: &str,
    start: Option<&str>,
    limit: i64,
    rv: u64,
    neg: Negotiated,
    view: Option<&Arc<View>>,
) -> Answer {
    if let Err(a) = after_crash(cache, rv).await {
        return a;
    }
    if rv > cache.rv()
        && let Err(s) = not_older_than(cache, rv).await
    {
        return status(s, neg);
    }
    if rv < cache.lock().floor() {
        return Answer::PassThrough(OLDER_THAN_THE_CACHE);
    }
    if let Err(a) = not_compacted(cache, upstream, rv).await {
        return a;
    }
    let Some(objects) = cache.snapshot_at(rv) else {
        return Answer::PassThrough(OLDER_THAN_THE_CACHE);
    };
    // A continued list walks on from its token, as the apiserver's does
    // (`MatchesSingle` is false with a continue token).
    let page = match filter.single_key(cache.info().namespaced) {
        Some(key) if start.is_none() => list::select_one(&objects, filter, prefix, &key),
        _ => list::select(&objects, filter, prefix, start, limit, rv),
    };
    list_answer(cache, page, rv, neg, view)
}

/// Declines a read at exactly `rv` that upstream has compacted. While
/// upstream cannot be asked (down, or the probe failed), the state the
/// cache rebuilds at `rv` is still exact, so it is served: the apiserver,
/// if it answered, could only refuse it.
async fn not_compacted(cache: &ResourceCache, upstream: &Upstream, rv: u64) -> Result<(), Answer> {
    if rv <= cache.compacted() {
        return Err(Answer::PassThrough(COMPACTED));
    }
    if cache.upstream_down_since().is_some() {
        return Ok(());
    }
    let info = cache.info().clone();
    let upstream = upstream.clone();
    match cache
        .revision_alive(rv, move |rv| probe_compaction(upstream, &info, rv))
        .await
    {
        Ok(Verdict::Compacted) => Err(Answer::PassThrough(COMPACTED)),
        Ok(Verdict::Alive) | Err(_) => Ok(()),
    }
}

async fn serve_watch(
    cache: &Arc<ResourceCache>,
    upstream: &Upstream,
    read: &Read<'_>,
    neg: Negotiated,
    shutdown: &CancellationToken,
) -> Answer {
    let (opts, filter) = match prepare(cache, read, true) {
        Ok(p) => p,
        Err(e) => return query_error(e, neg),
    };
    // The cacher returns a bad RV as a plain error: HTTP 500, no reason.
    let parsed = match opts
        .resource_version
        .as_deref()
        .map(query::parse_resource_version)
        .transpose()
    {
        Ok(rv) => rv,
        Err(message) => {
            return status(
                Status::new(StatusCode::INTERNAL_SERVER_ERROR, "", message),
                neg,
            );
        }
    };
    if let Err(a) = ready(cache).await {
        return a;
    }
    let initial = opts.send_initial_events == Some(true);
    if let Some(rv) = parsed
        && let Err(a) = after_crash(cache, rv).await
    {
        return a;
    }
    let mut given = None;
    match parsed {
        None if initial
            && let Some((namespace, name)) = filter.single_object(cache.info().namespaced) =>
        {
            match consistent_one(
                cache,
                upstream,
                read.arrived,
                cache.read.consistent_watch_wait,
                neg,
                namespace,
                name,
            )
            .await
            {
                Ok(start) => given = start,
                Err(a) => return a,
            }
        }
        None => {
            if let Err(a) = consistent(
                cache,
                upstream,
                read.arrived,
                cache.read.consistent_watch_wait,
                neg,
            )
            .await
            {
                return a;
            }
        }
        Some(0) => {
            if let Err(a) = current(cache).await {
                return a;
            }
        }
        Some(rv) if initial => {
            if let Err(s) = not_older_than(cache, rv).await {
                return Answer::Served(watcher::error_response(&s, neg.body.encoding));
            }
        }
        Some(_) => {}
    }
    // A resourceVersion of a history upstream no longer has (etcd
    // restored without `--bump-revision`: `ResourceCache::replace`) that
    // the new one has not reached: the client relists, instead of waiting
    // for the new history to reach it and applying its changes to the old
    // one's state. Whether the new history reached it is upstream's
    // current resourceVersion (the probe consistent reads share); once it
    // has, the proxy cannot tell it from one it served since, and serves
    // it as the apiserver would (a cache briefly behind, a tier replica
    // behind another, must not send its clients into a relist loop).
    let rewound_rv = match (initial, parsed) {
        (false, Some(rv)) if rv > cache.rv() && rv < cache.expire_below() => {
            let info = cache.info().clone();
            let upstream = upstream.clone();
            let reached = cache
                .upstream_rv(read.arrived, move || probe_rv(upstream, &info))
                .await
                .is_ok_and(|up| up >= rv);
            !reached
        }
        _ => false,
    };
    let start = match (initial, parsed) {
        (true, _) => given.unwrap_or(Start::Snapshot),
        // A watch from a revision a probe found compacted: the apiserver
        // decides, from its own watch cache's window (`compaction.rs`).
        (false, Some(rv)) if rv > 0 && rv <= cache.compacted() => {
            return Answer::PassThrough(COMPACTED);
        }
        // The reader's view changed since it last listed: what it holds
        // is not what it would see now (`view.rs`).
        (false, Some(rv)) if rv > 0 && read.view.is_some_and(|v| v.resumes_expire()) => {
            return Answer::Served(watcher::error_response(
                &Status::expired(format!("too old resource version: {rv} ({})", cache.rv())),
                neg.body.encoding,
            ));
        }
        (false, Some(rv)) if rewound_rv => {
            return Answer::Served(watcher::error_response(
                &Status::expired(format!("too old resource version: {rv} ({})", cache.rv())),
                neg.body.encoding,
            ));
        }
        (false, Some(rv)) if rv > 0 => Start::After(rv),
        // sendInitialEvents=false from "now".
        (false, _) => Start::After(cache.rv()),
    };
    let timeout = match opts.timeout_seconds {
        Some(t) if t > 0 => Duration::from_secs(t as u64),
        Some(t) if t < 0 => Duration::ZERO,
        _ => {
            let min = cache.read.min_request_timeout.as_secs_f64();
            Duration::from_secs_f64(min * (1.0 + fastrand::f64()))
        }
    };
    let params = WatchParams {
        prefix: list::scope_prefix(filter.namespace.as_deref()),
        filter: Arc::new(filter),
        start,
        bookmarks: opts.allow_watch_bookmarks,
        initial_events_end: initial && opts.allow_watch_bookmarks,
        timeout,
        repr: neg.body,
        window: read.window.cloned(),
        view: read.view.cloned(),
    };
    if initial && let Some(view) = read.view {
        view.listed();
    }
    match watcher::start(cache.clone(), params, shutdown.clone()) {
        Ok(resp) => served(cache, "watch", neg, resp),
        // After a relist that healed a divergence by resetting the cache,
        // a client resuming from before it may hold what the cache had
        // wrong, and upstream would replay only what came after: it must
        // relist, as after the apiserver's own cache reinitializes.
        Err(too_old) if too_old.requested < cache.expire_below() => {
            Answer::Served(watcher::error_response(
                &Status::expired(format!(
                    "too old resource version: {} ({})",
                    too_old.requested, too_old.floor
                )),
                neg.body.encoding,
            ))
        }
        // Events between N and the cache's oldest are unknown here; upstream
        // may still hold them (its watch cache often reaches further back),
        // and answers `410 Expired` itself when it does not.
        Err(_too_old) => Answer::PassThrough(OLDER_THAN_THE_CACHE),
    }
}

#[cfg(test)]
mod busy_tests {
    use super::*;

    /// A shed probe is answered as API Priority and Fairness answers the
    /// request it sheds; an unanswered one `503`; both with
    /// `Retry-After: 1`.
    #[test]
    fn busy_probes_answer_429_or_503_with_retry_after() {
        let shed = busy(&ProbeError::Shed("429 Too Many Requests: m".into()))
            .unwrap()
            .into_response();
        assert_eq!(shed.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(shed.headers()["retry-after"], "1");
        let hung = busy(&ProbeError::Unanswered).unwrap();
        assert_eq!(hung.status_code(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(hung.into_response().headers()["retry-after"], "1");
        // Anything else passes the read through.
        assert!(busy(&ProbeError::Failed("refused".into())).is_none());
        assert!(busy(&ProbeError::Rewound).is_none());
    }
}

#[cfg(test)]
mod crash_tests {
    use super::*;
    use crate::cache::negotiate::Representation;
    use crate::cache::resource::Resumed;
    use crate::cache::resource::tests::test_cache;

    /// A consistent read of a cache resumed after a crash waits for the
    /// catch-up before it probes upstream: served at a resourceVersion the
    /// catch-up then disowns, its client's next watch would get `410
    /// Gone` (`ResourceCache::resumed_after_crash`). Upstream here refuses
    /// connections, so the probe fails at once when it is sent.
    #[tokio::test]
    async fn a_consistent_read_waits_for_a_crashed_cache_to_catch_up() {
        let cache = Arc::new(test_cache());
        cache.replace(Vec::new(), 10);
        cache.resumed_after_crash(10, false);
        let upstream = Upstream::new(
            &kube::Config::new("https://127.0.0.1:1".parse().unwrap()),
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .unwrap();
        let neg = Negotiated {
            body: Representation::JSON,
            errors: ErrorEncoding::Json,
        };
        let read = {
            let cache = cache.clone();
            tokio::spawn(async move {
                consistent(&cache, &upstream, Instant::now(), Duration::ZERO, neg).await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!read.is_finished(), "answered while catching up");
        cache.set_resumed(Resumed::Current);
        match read.await.unwrap() {
            Err(Answer::PassThrough(reason)) => assert_eq!(reason, PROBE_FAILED),
            other => panic!("{other:?}"),
        }
    }
}
