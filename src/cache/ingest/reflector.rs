//! The upstream side of one resource's cache: a reflector that lists
//! (paginated, consistent), then watches from the list's RV with
//! `allowWatchBookmarks=true`. A dropped or timed-out watch resumes from the
//! cache's RV; `410 Gone` relists (and the store turns the difference into
//! events, so downstream watchers carry on). Failures back off
//! exponentially with jitter ([`BACKOFF`], the `backon` crate).
//!
//! Two short upstream requests support consistent reads:
//! - [`probe_rv`]: a `limit=1` list whose RV is upstream's current RV;
//! - a *progress watch*, opened when a reader waits for an RV the cache has
//!   not reached: a watch from the cache's RV with `timeoutSeconds=3`, so
//!   upstream sends its pre-timeout bookmark about a second later. Every
//!   event up to that bookmark's RV has then been seen on this stream, so
//!   the cache may advance to it even when the resource is quiet. Events
//!   arriving on both streams are applied once (older ones are ignored).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::upstream::UpstreamBody;
use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use bytes::BytesMut;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use crate::component::ready::Readiness;
use crate::upstream::{Credentials, Upstream, error_chain};

use super::persist::Snapshots;
use super::upstream_protobuf::{self, Undecodable};
use crate::cache::compaction::Verdict;
use crate::cache::event::EventType;
use crate::cache::object::CachedObject;
use crate::cache::probe::{PROBE_TIMEOUT, ProbeError};
use crate::cache::resource::{ResourceCache, ResourceInfo, Resumed};
use crate::cache::store::Listed;
use apimachinery::selector::{FieldRequirement, FieldSelector};

/// Items per upstream list page.
const PAGE_SIZE: u32 = 500;
/// Largest list page or probe body read, in bytes.
const MAX_LIST_PAGE_BYTES: usize = 1 << 30;
/// Longest watch event line, in bytes (objects are at most ~1.5 MiB in etcd).
const MAX_EVENT_BYTES: usize = 64 << 20;

/// Why an upstream interaction failed.
#[derive(Debug, thiserror::Error)]
pub enum ReflectorError {
    /// The request did not get a response.
    #[error("{0}")]
    Upstream(String),
    /// Upstream answered with an unexpected status.
    #[error("upstream answered {status}: {message}")]
    Status { status: StatusCode, message: String },
    /// The resourceVersion is too old (`410`): relist.
    #[error("resource version expired: {0}")]
    Expired(String),
    /// Upstream has not reached the resourceVersion asked for (`504` with
    /// the cause `ResourceVersionTooLarge`, after its wait: apiserver
    /// `storage.NewTooLargeResourceVersionError`): upstream is behind the
    /// cache (restored from a backup, or another apiserver behind).
    #[error("upstream is behind the resource version: {0}")]
    TooLarge(String),
    /// The body was not what the apiserver sends.
    #[error("malformed upstream response: {0}")]
    Malformed(String),
    /// An object read in protobuf could not be transcoded to its JSON
    /// exactly: the cache reads the resource in JSON from now on.
    #[error("cannot read upstream's protobuf: {0}")]
    Undecodable(String),
}

impl From<Undecodable> for ReflectorError {
    fn from(e: Undecodable) -> ReflectorError {
        ReflectorError::Undecodable(e.0)
    }
}

impl ReflectorError {
    /// Whether upstream refused the request (`401`, `403`).
    fn is_refusal(&self) -> bool {
        matches!(self, ReflectorError::Status { status, .. }
            if *status == StatusCode::UNAUTHORIZED || *status == StatusCode::FORBIDDEN)
    }
}

#[derive(Deserialize)]
struct ListBody<'a> {
    #[serde(borrow)]
    metadata: ListMeta<'a>,
    #[serde(borrow, default)]
    items: Vec<&'a RawValue>,
}

/// A list's (or a bookmark's) metadata on the wire: what the reflector
/// and the consistency checker read of it.
#[derive(Deserialize)]
pub(super) struct ListMeta<'a> {
    #[serde(rename = "resourceVersion", borrow, default)]
    pub(super) resource_version: Cow<'a, str>,
    #[serde(rename = "continue", borrow, default)]
    pub(super) continue_token: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WireEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    object: &'a RawValue,
}

#[derive(Deserialize)]
struct BookmarkObject<'a> {
    #[serde(borrow)]
    metadata: ListMeta<'a>,
}

#[derive(Deserialize)]
struct WireStatus {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
    #[serde(default)]
    details: WireDetails,
}

#[derive(Deserialize, Default)]
struct WireDetails {
    #[serde(default)]
    causes: Vec<WireCause>,
}

#[derive(Deserialize)]
struct WireCause {
    #[serde(default)]
    reason: String,
}

impl WireStatus {
    /// The error a Status stands for: by its code, and for `504` by its
    /// cause (`metav1.CauseTypeResourceVersionTooLarge`), never by its
    /// message's text.
    fn into_error(self, status: StatusCode) -> ReflectorError {
        let too_large = || {
            self.details
                .causes
                .iter()
                .any(|c| c.reason == "ResourceVersionTooLarge")
        };
        match status {
            StatusCode::GONE => ReflectorError::Expired(self.message),
            StatusCode::GATEWAY_TIMEOUT if too_large() => ReflectorError::TooLarge(self.message),
            status => ReflectorError::Status {
                status,
                message: self.message,
            },
        }
    }
}

/// What ended a watch stream.
enum WatchEnd {
    /// A clean end (upstream timeout): resume from the cache's RV.
    Closed,
    /// A progress watch got its bookmark.
    Progressed,
}

/// What an upstream watch is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The reflector's own watch.
    Reflector,
    /// A progress watch, ended at its first bookmark.
    Progress,
    /// A rolling progress watch, read to its end.
    Rolling,
}

/// Most rolling progress watches open at once per resource (each lasts
/// at most 3 s and one starts a second).
const MAX_ROLLING: usize = 4;

/// A probe's outcome, at most [`PROBE_TIMEOUT`] away.
async fn bounded_probe<T>(
    probe: impl Future<Output = Result<T, ReflectorError>>,
) -> Result<T, ProbeError> {
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Err(_) => Err(ProbeError::Unanswered),
        Ok(Err(e @ ReflectorError::Status { status, .. }))
            if status == StatusCode::TOO_MANY_REQUESTS =>
        {
            Err(ProbeError::Shed(e.to_string()))
        }
        Ok(r) => r.map_err(|e| ProbeError::Failed(e.to_string())),
    }
}

/// A header every response of kube-apiserver's own handler chain carries
/// (API Priority and Fairness, on by default: the FlowSchema that
/// classified the request, watches included), and one the proxy does not
/// send: a watch answered with it streams an apiserver's events, etcd's
/// history, which every apiserver serves alike; one without it, another
/// cache's (a tier replica), whose relists give resourceVersions of their
/// own choosing ([`ResourceCache::note_timeline`]). Without API Priority
/// and Fairness the proxy takes every upstream for such a cache: the safe
/// side (after a crash, `410` for watches from past its snapshot).
const APISERVER_RESPONSE_HEADER: &str = "x-kubernetes-pf-flowschema-uid";

/// How long upstream may be unwatchable before readiness reports the cache
/// stale.
const STALE_AFTER: Duration = Duration::from_secs(5);

/// Retry delays after a failed list or watch: 0.1 s doubling up to 1 s,
/// each plus a random jitter of up to 100 % (as client-go's reflector), so
/// 0.1–0.2 s at first and 1–2 s at most. Reset by every successful list
/// and every watch that ends cleanly. The cap is low so that the cache
/// resumes within about 2 s of the apiserver's return; what a retry costs
/// a down apiserver is a connection attempt, and a resumed watch costs it
/// little (a relist after its restart is the same for the proxy as for
/// every informer).
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_max_delay(Duration::from_secs(1))
    .with_factor(2.0)
    .with_jitter()
    .without_max_times();

/// The next delay of a backoff built from [`BACKOFF`] (never exhausted).
fn next_delay(backoff: &mut ExponentialBackoff) -> Duration {
    backoff.next().unwrap_or(Duration::from_secs(2))
}

/// Where a [`Reflector`] is, named as kube-rs's `watcher` names its
/// states (client-go's `Reflector.ListAndWatch` keeps the same ones in
/// its loop): it lists when it has nothing upstream gave it, and watches
/// from the cache's resourceVersion otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing to watch from (the start without a snapshot; after `410
    /// Gone`, upstream behind the cache, or a relist asked for to heal a
    /// divergence): list.
    Empty,
    /// Filled from a snapshot: watch from its resourceVersion, verifying
    /// upstream's history first.
    Resumed,
    /// Listed or resumed: watch from the cache's resourceVersion. With
    /// `verify`, the watch resumes from an RV upstream gave before (a
    /// broken watch, a snapshot), whose history may have gone back since
    /// (an etcd restore): the checker compares before it.
    Watching { verify: bool },
    /// Shut down.
    Stopped,
}

/// Runs one resource's reflector until `shutdown`.
#[derive(Debug, Clone)]
pub struct Reflector {
    pub cache: Arc<ResourceCache>,
    pub upstream: Upstream,
    pub readiness: Readiness,
    pub shutdown: CancellationToken,
    /// Where to resume from instead of listing, if anywhere.
    pub snapshots: Option<Arc<Snapshots>>,
}

// === impl Reflector ===

impl Reflector {
    fn check_name(&self) -> String {
        let gvr = &self.cache.info().gvr;
        if gvr.group.is_empty() {
            format!("cache:{}", gvr.resource)
        } else {
            format!("cache:{}.{}", gvr.resource, gvr.group)
        }
    }

    /// Lists and watches until shutdown: the state machine of [`State`],
    /// one step at a time.
    pub async fn run(self) {
        let check = self.check_name();
        self.readiness.register(&check, "initial list not done");
        let progress = tokio::spawn(self.clone().progress_loop());
        let mut backoff = BACKOFF.build();
        let mut state = if self.load_snapshot(&check).await {
            State::Resumed
        } else {
            State::Empty
        };
        loop {
            state = match state {
                State::Empty | State::Resumed if self.shutdown.is_cancelled() => State::Stopped,
                State::Empty => self.list_step(&check, &mut backoff).await,
                State::Resumed => {
                    self.synced(&check, &mut backoff);
                    // A watch from an RV upstream gave before: its history
                    // may have gone back since.
                    State::Watching { verify: true }
                }
                State::Watching { verify } => self.watch_step(&check, verify, &mut backoff).await,
                State::Stopped => break,
            };
        }
        progress.abort();
    }

    /// [`State::Empty`]: lists; on failure, waits its backoff and lists
    /// again.
    async fn list_step(&self, check: &str, backoff: &mut ExponentialBackoff) -> State {
        match self.list().await {
            Ok(()) => {
                self.cache.upstream_up();
                self.synced(check, backoff);
                State::Watching { verify: false }
            }
            Err(error) => {
                tracing::warn!(resource = %check, %error, "upstream list failed");
                self.refused(check, &error);
                if !self.cache.is_synced() {
                    self.readiness
                        .set(check, Err(format!("initial list not done: {error}")));
                } else {
                    self.upstream_down(check);
                }
                if self.sleep(next_delay(backoff)).await {
                    State::Empty
                } else {
                    State::Stopped
                }
            }
        }
    }

    /// The cache holds a state upstream gave (listed, or resumed from a
    /// snapshot): the backoff starts over, and the cache is ready unless
    /// upstream is down.
    fn synced(&self, check: &str, backoff: &mut ExponentialBackoff) {
        *backoff = BACKOFF.build();
        if self.cache.upstream_down_since().is_none() {
            self.readiness.set(check, Ok(()));
        }
    }

    /// [`State::Watching`]: one upstream watch from the cache's RV, and
    /// what its end makes of the state.
    async fn watch_step(
        &self,
        check: &str,
        verify: bool,
        backoff: &mut ExponentialBackoff,
    ) -> State {
        if verify {
            self.verify_history();
        }
        let rv = self.cache.rv();
        let timeout = 300 + fastrand::u64(0..300);
        let started = Instant::now();
        let result = tokio::select! {
            _ = self.shutdown.cancelled() => return State::Stopped,
            why = self.cache.relist_requested() => {
                self.cache.metrics.watch_restart(why);
                if why == "heal" {
                    tracing::warn!(resource = %check, rv, "relisting to heal a divergence from upstream");
                }
                return State::Empty;
            }
            r = self.watch(rv, timeout, Kind::Reflector) => r,
        };
        match result {
            Ok(_) => {
                self.cache.metrics.watch_restart("closed");
                *backoff = BACKOFF.build();
                // Ended by upstream before its timeout (an apiserver
                // stopping, a switch of servers): verify the next.
                State::Watching {
                    verify: started.elapsed() + Duration::from_secs(5)
                        < Duration::from_secs(timeout),
                }
            }
            // Resumed at once, in JSON.
            Err(ReflectorError::Undecodable(error)) => {
                self.cache.metrics.watch_restart("error");
                self.fall_back_to_json(&error);
                State::Watching { verify: false }
            }
            Err(ReflectorError::Expired(message)) => {
                self.cache.metrics.watch_restart("expired");
                tracing::info!(resource = %check, %message, "upstream watch expired; relisting");
                State::Empty
            }
            // Upstream is behind the cache (restored from a backup, or a
            // snapshot from before that): only a list helps.
            Err(ReflectorError::TooLarge(message)) => {
                self.cache.metrics.watch_restart("expired");
                tracing::warn!(resource = %check, %message, "upstream is behind the cache; relisting");
                State::Empty
            }
            Err(error) => {
                self.cache.metrics.watch_restart("error");
                tracing::warn!(resource = %check, %error, rv, "upstream watch failed; resuming");
                self.refused(check, &error);
                if self.cache.resumed() == Resumed::CatchingUp {
                    self.cache.set_resumed(Resumed::Unreachable);
                }
                self.upstream_down(check);
                if self.sleep(next_delay(backoff)).await {
                    State::Watching { verify: true }
                } else {
                    State::Stopped
                }
            }
        }
    }

    /// Fills the cache from its snapshot, if there is a usable one, and
    /// returns whether it did; an unusable one is discarded with a log
    /// line. Readiness waits for the first upstream watch from it.
    async fn load_snapshot(&self, check: &str) -> bool {
        let Some(snapshots) = self.snapshots.clone() else {
            return false;
        };
        let clean = snapshots.clean_start();
        let info = self.cache.info().clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let r = snapshots.load(&info);
            if r.is_err() {
                snapshots.discard(&info);
            }
            r
        })
        .await;
        let metrics = &self.cache.metrics;
        match loaded {
            Ok(Ok(Some((rv, items)))) => {
                let objects = items.len();
                self.cache.replace(items, rv);
                // After a crash, the periodic snapshot may be older than
                // what the last process served; whether that was
                // upstream's own history, its timeline mark says.
                if !clean {
                    let info = self.cache.info().clone();
                    let snapshots = self.snapshots.clone();
                    let upstreams = tokio::task::spawn_blocking(move || {
                        snapshots.and_then(|s| s.read_timeline(&info))
                    })
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|from| from <= rv);
                    self.cache.resumed_after_crash(rv, upstreams);
                }
                self.cache.upstream_down();
                self.readiness.set(
                    check,
                    Err(format!(
                        "resuming the upstream watch from a snapshot at resourceVersion {rv}"
                    )),
                );
                metrics.snapshot("load", "loaded");
                tracing::info!(resource = %check, objects, rv, "loaded the cache from its snapshot; resuming the upstream watch");
                true
            }
            Ok(Ok(None)) => {
                metrics.snapshot("load", "absent");
                false
            }
            Ok(Err(error)) => {
                metrics.snapshot("load", "discarded");
                tracing::warn!(resource = %check, %error, "discarded the cache's snapshot; listing");
                false
            }
            Err(error) => {
                metrics.snapshot("load", "error");
                tracing::warn!(resource = %check, %error, "reading the cache's snapshot failed; listing");
                false
            }
        }
    }

    /// Notes that upstream could not be watched; once that has lasted
    /// [`STALE_AFTER`], readiness says so: the cache still answers what
    /// may be answered from a stale cache, but it is no longer current.
    fn upstream_down(&self, check: &str) {
        let since = self.cache.upstream_down();
        if since.elapsed() >= STALE_AFTER {
            self.readiness.set(
                check,
                Err(format!(
                    "upstream watch down for {}s; serving state at resourceVersion {}",
                    since.elapsed().as_secs(),
                    self.cache.rv()
                )),
            );
        }
    }

    /// Notes a refusal of the cache's list or watch: its reads pass
    /// through until one succeeds ([`ResourceCache::refused`]).
    fn refused(&self, check: &str, error: &ReflectorError) {
        if error.is_refusal() && !self.cache.upstream_refused() {
            tracing::warn!(resource = %check, %error, "upstream refuses the cache's reads; they pass through until it allows them");
        }
    }

    /// Notes that an upstream watch is open again.
    fn upstream_up(&self, check: &str) {
        if self.cache.upstream_up() {
            if self.cache.resumed() == Resumed::Current {
                self.readiness.set(check, Ok(()));
            } else {
                // Ready once caught up (`catch_up`).
                self.readiness.set(
                    check,
                    Err(format!(
                        "catching up with upstream from a snapshot at resourceVersion {}",
                        self.cache.rv()
                    )),
                );
            }
        }
    }

    /// Sleeps unless shut down first; returns whether to go on.
    async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }

    /// After resuming from a crash's snapshot, proves the cache has caught
    /// up with upstream, so it holds at least what the crashed process
    /// served: upstream's current RV from a consistent `limit=1` list,
    /// reached by the cache (its resumed watch, or a progress watch for a
    /// quiet resource). Until then `resourceVersion=0` reads wait. (Not a
    /// bookmark: behind a tier, the replica the cache resumed on may be
    /// behind the one the crashed process read from; a consistent read is
    /// answered as the apiserver's current state by any replica.)
    async fn catch_up(self) {
        let mut delay = Duration::from_millis(200);
        while self.cache.resumed() == Resumed::CatchingUp && !self.shutdown.is_cancelled() {
            // Through `upstream_rv`: a target below the cache's RV is
            // upstream's history gone back, not a cache caught up.
            let (upstream, info) = (self.upstream.clone(), self.cache.info().clone());
            let target = self
                .cache
                .upstream_rv(Instant::now(), move || probe_rv(upstream, &info))
                .await;
            let caught_up = match target {
                Ok(target) => {
                    self.cache
                        .wait_fresh(target, Duration::from_secs(5), "ready")
                        .await
                }
                Err(_) => false,
            };
            if caught_up {
                self.cache.set_resumed(Resumed::Current);
                if self.cache.upstream_down_since().is_none() {
                    self.readiness.set(&self.check_name(), Ok(()));
                }
                tracing::info!(resource = %self.check_name(), rv = self.cache.rv(), "caught up with upstream after resuming from a snapshot");
                return;
            }
            if !self.sleep(delay).await {
                return;
            }
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }

    /// Checks, in the background, that upstream's history did not go back
    /// below the cache's RV (a consistent `limit=1` list, shared with
    /// concurrent consistent reads): a watch resumed from an RV of a
    /// history etcd no longer has would be accepted, and wait silently for
    /// the new history to reach it. If it did, the running watch stops and
    /// the cache relists ([`ResourceCache::rewound`]).
    /// While upstream cannot answer (an apiserver restarting on a restored
    /// etcd), it asks again every second, for up to a minute.
    fn verify_history(&self) {
        let (cache, upstream) = (self.cache.clone(), self.upstream.clone());
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            for _ in 0..60 {
                let (upstream, info) = (upstream.clone(), cache.info().clone());
                let answer = cache
                    .upstream_rv(Instant::now(), move || probe_rv(upstream, &info))
                    .await;
                match answer {
                    Ok(_) => return,
                    Err(ProbeError::Rewound) => return,
                    Err(_) => {}
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
    }

    /// Opens progress watches while readers wait for freshness.
    ///
    /// A progress watch's bookmark comes at the apiserver's first bookmark
    /// tick (every 1 s ± 25 %) in the second its pre-timeout bookmark is
    /// due, 0 to 2.25 s after it starts (`cacher.go`
    /// `watcherBookmarkTimeBuckets`). One opened when a reader starts to
    /// wait makes the reader wait that long. *Rolling*: while readers keep
    /// waiting (until `progress_roll` after the last one) one is opened
    /// every second and read to its end, so that a watch is due at every
    /// tick and a reader waits for the next tick only. `progress_roll` of
    /// zero: one watch per wait, closed at its first bookmark.
    async fn progress_loop(self) {
        let roll = self.cache.read.progress_roll;
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = self.cache.progress_wanted() => {}
            }
            if !self.cache.is_synced() {
                continue;
            }
            if roll.is_zero() {
                if !self.progress_watch(false).await {
                    return;
                }
                continue;
            }
            let mut last_want = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = self.shutdown.cancelled() => return,
                    _ = self.cache.progress_wanted() => last_want = Instant::now(),
                    _ = tick.tick() => {
                        if last_want.elapsed() >= roll {
                            break;
                        }
                        if !self.cache.is_synced()
                            || open.load(std::sync::atomic::Ordering::Relaxed) >= MAX_ROLLING
                        {
                            continue;
                        }
                        open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let (this, open) = (self.clone(), open.clone());
                        tokio::spawn(async move {
                            this.progress_watch(true).await;
                            open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                        });
                    }
                }
            }
        }
    }

    /// One progress watch from the cache's RV, `timeoutSeconds=3`: to its
    /// first bookmark, or to its end when `to_end` (it may then carry a
    /// second bookmark, a tick later). Returns false when shutting down.
    async fn progress_watch(&self, to_end: bool) -> bool {
        self.cache.metrics.progress_watches.inc();
        let rv = self.cache.rv();
        let watch = self.watch(
            rv,
            3,
            if to_end {
                Kind::Rolling
            } else {
                Kind::Progress
            },
        );
        let result = tokio::select! {
            _ = self.shutdown.cancelled() => return false,
            r = watch => r,
        };
        if let Err(error) = result {
            tracing::debug!(%error, "progress watch failed");
            // Do not spin when upstream is failing.
            return self.sleep(Duration::from_millis(500)).await;
        }
        true
    }

    fn query(&self, extra: &str) -> String {
        let info = self.cache.info();
        let mut q = format!("{}?{extra}", info.collection_path());
        if !info.scope.is_empty() {
            q.push_str("&fieldSelector=");
            q.push_str(
                &percent_encoding::utf8_percent_encode(&info.scope.to_string(), QUERY).to_string(),
            );
        }
        q
    }

    async fn list(&self) -> Result<(), ReflectorError> {
        match self.list_once().await {
            Err(ReflectorError::Undecodable(error)) => {
                self.fall_back_to_json(&error);
                self.list_once().await
            }
            r => r,
        }
    }

    /// Notes what the history applied from now on is
    /// ([`ResourceCache::note_timeline`]) and, with snapshots, records a
    /// change on disk before anything past it is applied.
    async fn note_timeline(&self, upstreams_from: Option<u64>) {
        let Some(mark) = self.cache.note_timeline(upstreams_from) else {
            return;
        };
        let Some(snapshots) = self.snapshots.clone() else {
            return;
        };
        let info = self.cache.info().clone();
        let written =
            tokio::task::spawn_blocking(move || snapshots.write_timeline(&info, mark)).await;
        if let Ok(Err(error)) = written {
            tracing::warn!(resource = %self.check_name(), %error, "recording the cache's timeline mark failed; after a crash, watches from past its snapshot get 410");
        }
    }

    /// Reads the resource in JSON from now on, after `error` in protobuf.
    fn fall_back_to_json(&self, error: &str) {
        if self.cache.read_upstream_in_json() {
            self.cache.metrics.upstream_json_fallback.inc();
            tracing::warn!(resource = %self.check_name(), %error, "cannot read an object upstream sent in protobuf exactly as its JSON; reading the resource upstream in JSON from now on");
        }
    }

    /// One page of the list, its items added to `listed`: its
    /// resourceVersion and continue token, read in protobuf when the cache
    /// reads upstream so.
    async fn list_page(
        &self,
        extra: &str,
        listed: &mut Listed,
    ) -> Result<(String, Option<String>), ReflectorError> {
        let info = self.cache.info();
        let codec = info
            .codec
            .as_deref()
            .filter(|_| self.cache.upstream_protobuf());
        let resp = get_accepting(
            &self.upstream,
            &self.query(extra),
            info.reads_as.as_ref(),
            codec.map(|_| upstream_protobuf::LIST_ACCEPT),
        )
        .await?;
        let protobuf = upstream_protobuf::is_protobuf(resp.headers());
        let bytes = read_body(resp).await?;
        if let (Some(codec), true) = (codec, protobuf) {
            let page =
                upstream_protobuf::list_page(&bytes, codec, |item| match CachedObject::from_json(
                    item,
                    info.field_set,
                    info.namespaced,
                ) {
                    Ok(o) => listed.push(o),
                    Err(error) => tracing::warn!(%error, "skipping malformed list item"),
                })?;
            return Ok((page.resource_version, page.continue_token));
        }
        let page: ListBody<'_> =
            serde_json::from_slice(&bytes).map_err(|e| ReflectorError::Malformed(e.to_string()))?;
        for item in page.items {
            match CachedObject::from_list_item(
                item.get().as_bytes(),
                &info.kind,
                &info.api_version,
                info.field_set,
                info.namespaced,
            ) {
                Ok(o) => listed.push(o),
                Err(error) => tracing::warn!(%error, "skipping malformed list item"),
            }
        }
        Ok((
            page.metadata.resource_version.into_owned(),
            page.metadata.continue_token.map(Cow::into_owned),
        ))
    }

    async fn list_once(&self) -> Result<(), ReflectorError> {
        let info = self.cache.info().clone();
        // The first list fills the store: packed as it is read
        // (`store::pack`). A relist's objects mostly replace nothing.
        let mut listed = if self.cache.is_synced() {
            Listed::unpacked()
        } else {
            Listed::packed()
        };
        let mut continue_token: Option<String> = None;
        let mut list_rv = 0;
        loop {
            let mut extra = format!("limit={PAGE_SIZE}");
            if let Some(c) = &continue_token {
                extra.push_str("&continue=");
                extra.push_str(&percent_encoding::utf8_percent_encode(c, QUERY).to_string());
            }
            let (rv, next) = self.list_page(&extra, &mut listed).await?;
            if continue_token.is_none() {
                list_rv = rv
                    .parse()
                    .map_err(|_| ReflectorError::Malformed("list has no resourceVersion".into()))?;
            }
            continue_token = next.filter(|c| !c.is_empty());
            if continue_token.is_none() {
                break;
            }
        }
        self.cache.metrics.relists.inc();
        self.cache.wait_unfrozen().await;
        // The relist's differences get resourceVersions of the cache's
        // choosing: not upstream's own history.
        self.note_timeline(None).await;
        let encoding = if self.cache.upstream_protobuf() {
            "protobuf"
        } else {
            "json"
        };
        tracing::info!(resource = %info.gvr.resource, objects = listed.len(), rv = list_rv, encoding, "listed from upstream");
        self.cache.replace(listed, list_rv);
        // A consistent list is upstream's current state.
        self.cache.set_resumed(Resumed::Current);
        Ok(())
    }

    /// Watches from `rv`; with `progress`, returns at the first bookmark.
    async fn watch(
        &self,
        rv: u64,
        timeout_seconds: u64,
        kind: Kind,
    ) -> Result<WatchEnd, ReflectorError> {
        let progress = kind != Kind::Reflector;
        let extra = format!(
            "watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds={timeout_seconds}"
        );
        // Counted from before the request until the stream is dropped, so
        // that the gauge covers every moment upstream serves the watch.
        let _open =
            self.cache
                .metrics
                .upstream_watch(if progress { "progress" } else { "reflector" });
        // A watch of a server that is no longer the active upstream (a
        // fallback's, once the primary is back) ends, and resumes on it.
        let site_changed = self.upstream.site_changed();
        tokio::pin!(site_changed);
        let codec = self
            .cache
            .info()
            .codec
            .clone()
            .filter(|_| self.cache.upstream_protobuf());
        let resp = get_accepting(
            &self.upstream,
            &self.query(&extra),
            self.cache.info().reads_as.as_ref(),
            codec.as_ref().map(|_| upstream_protobuf::WATCH_ACCEPT),
        )
        .await?;
        let codec = codec.filter(|_| upstream_protobuf::is_protobuf(resp.headers()));
        self.note_timeline(
            resp.headers()
                .contains_key(APISERVER_RESPONSE_HEADER)
                .then_some(rv),
        )
        .await;
        if !progress {
            if self.cache.resumed() != Resumed::Current {
                self.cache.set_resumed(Resumed::CatchingUp);
                tokio::spawn(self.clone().catch_up());
            }
            self.upstream_up(&self.check_name());
        }
        let mut body = resp.into_body();
        let mut buf = BytesMut::new();
        loop {
            // Handing over to a successor: read nothing more (see
            // `ResourceCache::set_frozen`).
            self.cache.wait_unfrozen().await;
            let frame = tokio::select! {
                f = body.frame() => f,
                () = &mut site_changed => return Ok(WatchEnd::Closed),
            };
            let Some(frame) = frame else {
                return Ok(WatchEnd::Closed);
            };
            let frame = frame.map_err(|e| ReflectorError::Upstream(error_chain(&e)))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            self.upstream.heard();
            buf.extend_from_slice(&data);
            if let Some(codec) = &codec {
                // Frames: a 4-byte big-endian length, then a `WatchEvent`.
                while let Some(len) = upstream_protobuf::frame_len(&buf) {
                    if len > MAX_EVENT_BYTES {
                        return Err(ReflectorError::Malformed("watch event too large".into()));
                    }
                    if buf.len() < 4 + len {
                        break;
                    }
                    let frame = buf.split_to(4 + len);
                    let (event_type, object) = upstream_protobuf::event(&frame[4..], codec)
                        .inspect_err(|e| self.fall_back_to_json(&e.0))?;
                    if self.handle_event(&event_type, &object)? && kind == Kind::Progress {
                        return Ok(WatchEnd::Progressed);
                    }
                }
                continue;
            }
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line = buf.split_to(pos + 1);
                if self.handle_line(&line[..pos])? && kind == Kind::Progress {
                    return Ok(WatchEnd::Progressed);
                }
            }
            if buf.len() > MAX_EVENT_BYTES {
                return Err(ReflectorError::Malformed("watch event too large".into()));
            }
        }
    }

    /// Applies one watch event line. Returns whether it was a bookmark.
    fn handle_line(&self, line: &[u8]) -> Result<bool, ReflectorError> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(false);
        }
        let event: WireEvent<'_> =
            serde_json::from_slice(line).map_err(|e| ReflectorError::Malformed(e.to_string()))?;
        self.handle_event(&event.kind, event.object.get().as_bytes())
    }

    /// Applies one watch event: its type and its object's JSON. Returns
    /// whether it was a bookmark.
    fn handle_event(&self, event_type: &str, object: &[u8]) -> Result<bool, ReflectorError> {
        let info = self.cache.info();
        let kind = match event_type {
            "ADDED" => EventType::Added,
            "MODIFIED" => EventType::Modified,
            "DELETED" => EventType::Deleted,
            "BOOKMARK" => {
                let b: BookmarkObject<'_> = serde_json::from_slice(object)
                    .map_err(|e| ReflectorError::Malformed(e.to_string()))?;
                if let Ok(rv) = b.metadata.resource_version.parse::<u64>() {
                    self.cache.set_bookmark_template(object);
                    self.cache.progress(rv);
                }
                self.cache.metrics.event_received("BOOKMARK");
                return Ok(true);
            }
            "ERROR" => {
                let s: WireStatus = serde_json::from_slice(object).unwrap_or(WireStatus {
                    code: 0,
                    message: String::from_utf8_lossy(object).into_owned(),
                    details: WireDetails::default(),
                });
                let status =
                    StatusCode::from_u16(s.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                return Err(s.into_error(status));
            }
            other => {
                return Err(ReflectorError::Malformed(format!(
                    "unknown event type {other:?}"
                )));
            }
        };
        self.cache.metrics.event_received(kind.as_str());
        // A fault for tests: the event is lost, as a bug in this path would
        // lose it; only the consistency checker can notice.
        #[cfg(feature = "failpoints")]
        if fail::eval(
            &format!("reflector::drop_event::{}", info.gvr.resource),
            |_| (),
        )
        .is_some()
        {
            tracing::warn!(resource = %info.gvr.resource, "failpoint: dropped an upstream event");
            return Ok(false);
        }
        match CachedObject::from_json(object, info.field_set, info.namespaced) {
            Ok(o) => self.cache.apply(kind, o),
            Err(error) => tracing::warn!(%error, "skipping malformed watch event"),
        }
        Ok(false)
    }
}

/// Characters escaped in query values.
pub(super) const QUERY: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// A GET upstream with the proxy's credentials, expecting `200`.
async fn get(
    upstream: &Upstream,
    path_and_query: &str,
    reads_as: Option<&http::HeaderValue>,
) -> Result<http::Response<UpstreamBody>, ReflectorError> {
    get_accepting(upstream, path_and_query, reads_as, None).await
}

/// [`get`], with an `Accept` header.
pub(super) async fn get_accepting(
    upstream: &Upstream,
    path_and_query: &str,
    reads_as: Option<&http::HeaderValue>,
    accept: Option<&'static str>,
) -> Result<http::Response<UpstreamBody>, ReflectorError> {
    let mut req = upstream
        .own_request(Method::GET, path_and_query, None)
        .map_err(|e| ReflectorError::Upstream(e.to_string()))?;
    if let Some(user) = reads_as {
        req.headers_mut().insert("impersonate-user", user.clone());
    }
    if let Some(accept) = accept {
        req.headers_mut()
            .insert(http::header::ACCEPT, http::HeaderValue::from_static(accept));
    }
    let resp = upstream
        .send(req, Credentials::Proxy)
        .await
        .map_err(|e| ReflectorError::Upstream(e.to_string()))?;
    if resp.status() == StatusCode::OK {
        return Ok(resp);
    }
    let status = resp.status();
    let mut bytes = read_body(resp).await.unwrap_or_default();
    // Asked for protobuf, an error comes as a protobuf `Status`.
    if let Some(json) = upstream_protobuf::status_json(&bytes) {
        bytes = json.into();
    }
    let s = serde_json::from_slice::<WireStatus>(&bytes).unwrap_or_else(|_| WireStatus {
        code: status.as_u16(),
        message: String::from_utf8_lossy(&bytes).into_owned(),
        details: WireDetails::default(),
    });
    Err(s.into_error(status))
}

/// The whole body of `resp` (at most [`MAX_LIST_PAGE_BYTES`]), in one
/// buffer. Each frame is copied into it as it comes and freed at once, so
/// the allocator gives its memory to the next frame: collecting every
/// frame first held a list page twice, its frames in thousands of 8 KiB
/// read buffers, which an idle proxy kept as dirty pages after its first
/// list (4 MiB of a 10,000-pod list; docs/performance.md (c)).
pub(super) async fn read_body(
    resp: http::Response<UpstreamBody>,
) -> Result<bytes::Bytes, ReflectorError> {
    let mut body = resp.into_body();
    let hint =
        usize::try_from(http_body::Body::size_hint(&body).lower()).unwrap_or(MAX_LIST_PAGE_BYTES);
    let mut out = BytesMut::with_capacity(hint.min(MAX_LIST_PAGE_BYTES));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReflectorError::Upstream(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if out.len() + data.len() > MAX_LIST_PAGE_BYTES {
            return Err(ReflectorError::Upstream("length limit exceeded".into()));
        }
        out.extend_from_slice(&data);
    }
    Ok(out.freeze())
}

/// Whether upstream still serves reads at exactly `rv`: a `limit=1` list
/// with `resourceVersionMatch=Exact`, answered `200` (alive) or `410`
/// (compacted) from the apiserver's watch cache snapshot or one key of
/// etcd (`compaction.rs`).
pub fn probe_compaction(
    upstream: Upstream,
    info: &ResourceInfo,
    rv: u64,
) -> BoxFuture<'static, Result<Verdict, String>> {
    let mut q = format!(
        "{}?limit=1&resourceVersion={rv}&resourceVersionMatch=Exact",
        info.collection_path()
    );
    if !info.scope.is_empty() {
        q.push_str("&fieldSelector=");
        q.push_str(
            &percent_encoding::utf8_percent_encode(&info.scope.to_string(), QUERY).to_string(),
        );
    }
    let reads_as = info.reads_as.clone();
    let probe = async move {
        match get_accepting(&upstream, &q, reads_as.as_ref(), Some(PROBE_ACCEPT)).await {
            Ok(resp) => {
                // Read to the end, so the connection is reused.
                read_body(resp).await?;
                Ok(Verdict::Alive)
            }
            Err(ReflectorError::Expired(_)) => Ok(Verdict::Compacted),
            Err(e) => Err(e),
        }
    };
    async move { bounded_probe(probe).await.map_err(|e| e.to_string()) }.boxed()
}

/// A consistency probe's field selector: the cache's scope and terms that
/// together with it select nothing, so the answer is an empty list
/// carrying the resourceVersion (about 120 bytes) and the apiserver reads
/// one key, or only what the scope picks:
/// - a scoped cache: for each of the scope's `=` terms, the same term with
///   `!=`. The apiserver still reads only what the scope picks, and
///   authorizes the probe as the scope: a `metadata.name` term is the one
///   key read (registry `Store.ListPredicate`, `MatchesSingle`) and the
///   request's name (`RequestInfoFactory`), which the Node authorizer
///   compares with the node's own; a Pod's `spec.nodeName` term is the
///   watch cache's index (`SelectionPredicate.MatcherIndex`) and what the
///   Node authorizer looks for among the terms; Go's `RequiresExactMatch`
///   takes the first `=` term, never a `!=` one.
/// - an unscoped cache (no `=` term): `metadata.name=P,metadata.name!=P`
///   and, for a namespaced resource, `metadata.namespace=default`, so that
///   `Store.ListPredicate` reads the one key `P` (`MatchesSingleNamespace`
///   puts the namespace in the request's context, without which the key
///   of a namespaced name cannot be made and every object would be
///   filtered). Every built-in resource and custom resource supports both
///   fields in selectors (`DefaultNamespaceScopedAttr`, and the core
///   group's field label conversions).
///
/// Before, a probe of a scoped cache returned one of its objects'
/// metadata, managedFields and all (a node proxy's pods probe: 2.7 KB on
/// average in a mass restart of hollow nodes, 0.2 KB with this selector),
/// and a probe of an unscoped one 1 to 3 KB (docs/performance.md, section
/// (k)). A consistent list is served from the watch cache on every
/// version this proxy supports (`ConsistentListFromCache`, GA and locked
/// in 1.34), and reads the one key or what the index picks.
fn probe_selector(scope: &FieldSelector, namespaced: bool) -> FieldSelector {
    let pinned: Vec<FieldRequirement> = scope
        .terms()
        .iter()
        .filter(|t| !t.not_equals)
        .cloned()
        .collect();
    let mut terms = scope.terms().to_vec();
    if pinned.is_empty() {
        let term = |field: &str, not_equals: bool, value: &str| FieldRequirement {
            field: field.into(),
            not_equals,
            value: value.into(),
        };
        if namespaced {
            terms.push(term("metadata.namespace", false, PROBE_NAMESPACE));
        }
        terms.push(term("metadata.name", false, PROBE_NAME));
        terms.push(term("metadata.name", true, PROBE_NAME));
    } else {
        terms.extend(pinned.into_iter().map(|t| FieldRequirement {
            not_equals: true,
            ..t
        }));
    }
    FieldSelector::from_terms(terms)
}

/// The one name an unscoped cache's probe reads ([`probe_selector`]); it
/// need not exist.
const PROBE_NAME: &str = "kube-cache-proxy-probe";

/// The namespace of a namespaced unscoped cache's probe: one every cluster
/// has (any valid name would do: `Store.ListPredicate` checks only that).
const PROBE_NAMESPACE: &str = "default";

/// What a probe accepts: the list's metadata, with its one item's metadata
/// alone (`PartialObjectMetadataList`, as client-go's metadata client
/// asks; handlers/response.go `asPartialObjectMetadataList`),
/// or plain JSON from a server that cannot convert. A probe needs only
/// the list's resourceVersion; a Node's or a Pod's spec and status are
/// most of its bytes.
const PROBE_ACCEPT: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// The part of a probe's answer it reads (`items` is `null` in an empty
/// `PartialObjectMetadataList`).
#[derive(Deserialize)]
struct ProbeBody<'a> {
    #[serde(borrow)]
    metadata: ListMeta<'a>,
}

/// Upstream's current resourceVersion: a `limit=1` list, which on
/// kube-apiserver 1.31+ is a consistent read served from its own watch
/// cache, so it is cheap; metadata only ([`PROBE_ACCEPT`]).
pub fn probe_rv(
    upstream: Upstream,
    info: &ResourceInfo,
) -> BoxFuture<'static, Result<u64, ProbeError>> {
    let mut q = format!("{}?limit=1", info.collection_path());
    let selector = probe_selector(&info.scope, info.namespaced);
    if !selector.is_empty() {
        q.push_str("&fieldSelector=");
        q.push_str(
            &percent_encoding::utf8_percent_encode(&selector.to_string(), QUERY).to_string(),
        );
    }
    let reads_as = info.reads_as.clone();
    let probe = async move {
        let resp = get_accepting(&upstream, &q, reads_as.as_ref(), Some(PROBE_ACCEPT)).await?;
        let bytes = read_body(resp).await?;
        let page: ProbeBody<'_> =
            serde_json::from_slice(&bytes).map_err(|e| ReflectorError::Malformed(e.to_string()))?;
        page.metadata
            .resource_version
            .parse::<u64>()
            .map_err(|_| ReflectorError::Malformed("probe list has no resourceVersion".into()))
    };
    bounded_probe(probe).boxed()
}

/// A consistent read upstream of the one object `name` (in `namespace`,
/// for a namespaced resource) within the cache's scope: upstream's current
/// resourceVersion and the object, if it exists. It costs upstream what a
/// consistent get costs (the apiserver reads one key: registry
/// `Store.ListPredicate`, `MatchesSingle`), and answers a consistent
/// streaming list of that object while the cache has not yet reached
/// upstream's revision (`serve/mod.rs` `consistent_one`).
pub fn read_one(
    upstream: Upstream,
    info: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
) -> BoxFuture<'static, Result<(u64, Vec<CachedObject>), ProbeError>> {
    let mut terms = info.scope.terms().to_vec();
    let pinned = FieldRequirement {
        field: "metadata.name".into(),
        not_equals: false,
        value: name.to_string(),
    };
    if !terms.contains(&pinned) {
        terms.push(pinned);
    }
    let selector = FieldSelector::from_terms(terms);
    let q = format!(
        "{}?fieldSelector={}",
        info.collection_path_in(namespace),
        percent_encoding::utf8_percent_encode(&selector.to_string(), QUERY)
    );
    let info = info.clone();
    let read = async move {
        let resp = get(&upstream, &q, info.reads_as.as_ref()).await?;
        let bytes = read_body(resp).await?;
        let list: ListBody<'_> =
            serde_json::from_slice(&bytes).map_err(|e| ReflectorError::Malformed(e.to_string()))?;
        let rv = list
            .metadata
            .resource_version
            .parse::<u64>()
            .map_err(|_| ReflectorError::Malformed("list has no resourceVersion".into()))?;
        let objects = list
            .items
            .iter()
            .map(|item| {
                CachedObject::from_list_item(
                    item.get().as_bytes(),
                    &info.kind,
                    &info.api_version,
                    info.field_set,
                    info.namespaced,
                )
                .map_err(|e| ReflectorError::Malformed(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((rv, objects))
    };
    bounded_probe(read).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe's selector keeps the scope's terms (the apiserver's key,
    /// index and the Node authorizer read those) and selects nothing.
    #[test]
    fn probe_selectors_keep_the_scope_and_select_nothing() {
        let probe = |scope: &str, namespaced: bool| {
            probe_selector(&FieldSelector::parse(scope).unwrap(), namespaced).to_string()
        };
        assert_eq!(
            probe("spec.nodeName=n1", true),
            "spec.nodeName!=n1,spec.nodeName=n1"
        );
        assert_eq!(
            probe("metadata.name=n\\,1", false),
            "metadata.name!=n\\,1,metadata.name=n\\,1"
        );
        assert_eq!(
            probe("status.phase!=Failed,spec.nodeName=n1", true),
            "spec.nodeName!=n1,spec.nodeName=n1,status.phase!=Failed"
        );
        let selector = probe_selector(&FieldSelector::parse("spec.nodeName=n1").unwrap(), true);
        assert_eq!(selector.requires_exact_match("spec.nodeName"), Some("n1"));
        for node in ["n1", "n2", ""] {
            let fields = vec![("spec.nodeName".to_string(), node.to_string())];
            assert!(!selector.matches(&fields), "{node}");
        }
        // Unscoped: the one key `P` (in `default`, for a namespaced
        // resource), which it then excludes.
        assert_eq!(
            probe("", false),
            "metadata.name!=kube-cache-proxy-probe,metadata.name=kube-cache-proxy-probe"
        );
        assert_eq!(
            probe("status.phase!=Failed", true),
            "metadata.name!=kube-cache-proxy-probe,metadata.name=kube-cache-proxy-probe,\
             metadata.namespace=default,status.phase!=Failed"
        );
        let selector = probe_selector(&FieldSelector::default(), true);
        assert_eq!(
            selector.requires_exact_match("metadata.name"),
            Some(PROBE_NAME)
        );
        assert_eq!(
            selector.requires_exact_match("metadata.namespace"),
            Some("default")
        );
        for (namespace, name) in [("default", PROBE_NAME), ("default", "x"), ("x", PROBE_NAME)] {
            let fields = vec![
                ("metadata.name".to_string(), name.to_string()),
                ("metadata.namespace".to_string(), namespace.to_string()),
            ];
            assert!(!selector.matches(&fields), "{namespace}/{name}");
        }
    }

    /// A probe upstream sheds (`429`) is busy (the read is then answered,
    /// not passed through); any other failure is not. (One left
    /// unanswered: `tests/real_isolated/outage.rs`, a hung apiserver.)
    #[tokio::test]
    async fn shed_probes_are_busy() {
        let status = |status| async move {
            Err::<u64, _>(ReflectorError::Status {
                status,
                message: "m".into(),
            })
        };
        let shed = bounded_probe(status(StatusCode::TOO_MANY_REQUESTS))
            .await
            .unwrap_err();
        assert!(shed.is_busy(), "{shed}");
        assert!(
            matches!(&shed, ProbeError::Shed(why) if why.contains("429")),
            "{shed}"
        );
        for failed in [
            bounded_probe(status(StatusCode::INTERNAL_SERVER_ERROR)).await,
            bounded_probe(async { Err(ReflectorError::Upstream("refused".into())) }).await,
        ] {
            assert!(!failed.unwrap_err().is_busy());
        }
        assert_eq!(bounded_probe(async { Ok(7) }).await, Ok(7));
    }

    #[test]
    fn backoff_doubles_with_jitter_caps_and_resets() {
        let mut b = BACKOFF.build();
        let d: Vec<f64> = (0..12).map(|_| next_delay(&mut b).as_secs_f64()).collect();
        assert!((0.1..0.2).contains(&d[0]), "{d:?}");
        assert!((0.2..0.4).contains(&d[1]), "{d:?}");
        assert!((0.8..1.6).contains(&d[3]), "{d:?}");
        assert!((1.0..2.0).contains(&d[11]), "{d:?}");
        // A success starts over.
        b = BACKOFF.build();
        assert!(next_delay(&mut b) < Duration::from_millis(200));
    }
}
