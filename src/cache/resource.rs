//! One resource's watch cache: the store, its freshness (the cache RV as a
//! `watch` channel readers can wait on), bookmark frames, snapshots at
//! older versions for `Exact` and continued lists, and the coalesced
//! upstream probe behind consistent reads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use parking_lot::{Mutex, MutexGuard};
use serde_json::Value;
use tokio::sync::{Notify, watch};

use apimachinery::resource::{FieldSet, Gvr};
use apimachinery::selector::FieldSelector;

use super::compaction::{Compaction, Known, Verdict};
use super::encode::{self, ProtoCodec};
use super::event::EventType;
use super::metrics::ResourceMetrics;
use super::negotiate::Representation;
use super::object::CachedObject;
use super::probe::ProbeError;
use super::store::{Listed, Objects, Outcome, Settings, State};

/// What the cache knows about its resource.
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    pub gvr: Gvr,
    /// `Pod`.
    pub kind: String,
    /// `v1` or `group/version`.
    pub api_version: String,
    pub namespaced: bool,
    pub field_set: FieldSet,
    /// Whether list items omit `kind`/`apiVersion` (built-in types).
    pub strip_item_type_meta: bool,
    /// The upstream field selector the cache is limited to (empty: all).
    pub scope: FieldSelector,
    /// `Impersonate-User` of the cache's own upstream reads (the node,
    /// when the proxy acts as it by impersonation; see `identity`).
    pub reads_as: Option<http::HeaderValue>,
    /// How objects are encoded in protobuf: built-in kinds the generated
    /// schema knows (custom resources are served in JSON only).
    pub codec: Option<Arc<ProtoCodec>>,
    /// Whether the cache reads upstream in protobuf (`cache.upstreamEncoding`,
    /// for a kind with a codec), until an object cannot be transcoded
    /// ([`ResourceCache::read_upstream_in_json`]).
    pub upstream_protobuf: bool,
}

impl ResourceInfo {
    /// `PodList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The collection path within `namespace` (all namespaces, or a
    /// cluster-scoped resource, with `None`):
    /// `/api/v1/namespaces/ns/configmaps`.
    pub fn collection_path_in(&self, namespace: Option<&str>) -> String {
        let Some(ns) = namespace.filter(|_| self.namespaced) else {
            return self.collection_path();
        };
        if self.gvr.group.is_empty() {
            format!(
                "/api/{}/namespaces/{ns}/{}",
                self.gvr.version, self.gvr.resource
            )
        } else {
            format!(
                "/apis/{}/{}/namespaces/{ns}/{}",
                self.gvr.group, self.gvr.version, self.gvr.resource
            )
        }
    }

    /// The collection path: `/api/v1/pods`, `/apis/apps/v1/deployments`.
    pub fn collection_path(&self) -> String {
        if self.gvr.group.is_empty() {
            format!("/api/{}/{}", self.gvr.version, self.gvr.resource)
        } else {
            format!(
                "/apis/{}/{}/{}",
                self.gvr.group, self.gvr.version, self.gvr.resource
            )
        }
    }
}

/// Timing and sizing of reads.
#[derive(Debug, Clone)]
pub struct ReadSettings {
    /// Bookmark frequency for watchers that allow bookmarks.
    pub bookmark_interval: Duration,
    /// Watches without `timeoutSeconds` end after a random time in
    /// `[min_request_timeout, 2 × min_request_timeout)`.
    pub min_request_timeout: Duration,
    /// How long a consistent list or get waits for the cache to reach
    /// upstream's RV before passing through.
    pub consistent_list_wait: Duration,
    /// A consistent list of a scope holding at least this many objects
    /// (0: none) waits up to `large_list_wait` instead.
    pub large_list_objects: usize,
    pub large_list_wait: Duration,
    /// How long a consistent watch (streaming list) waits before passing
    /// through.
    pub consistent_watch_wait: Duration,
    /// How long progress watches keep rolling (one a second) after the
    /// last read that waited for freshness; zero: one per wait.
    pub progress_roll: Duration,
    /// How long a watch holds an event for more to write with it.
    pub watch_batch: Duration,
    /// How long a read "not older than N" waits before `504`.
    pub not_older_than_wait: Duration,
    /// How long a read waits for the first list before passing through.
    pub ready_wait: Duration,
}

/// A probe's answer: upstream's resourceVersion, and the cache's just
/// before the probe's request was sent.
type Probe = Shared<BoxFuture<'static, Result<Probed, ProbeError>>>;

#[derive(Debug, Clone, Copy)]
struct Probed {
    upstream_rv: u64,
    cache_rv_at_send: u64,
    /// When it was sent.
    sent_at: Instant,
}

/// How long consistent lists pass straight through, unprobed, after a
/// probe found the cache behind upstream: at most one probe per resource
/// per interval then.
pub const REPROBE_BEHIND: Duration = Duration::from_secs(1);

/// A resource's cache.
pub struct ResourceCache {
    info: ResourceInfo,
    pub read: ReadSettings,
    state: Mutex<State>,
    rv: watch::Sender<u64>,
    synced: watch::Sender<bool>,
    /// Counts relists that found upstream's history gone back (the cache
    /// reset): its snapshot on disk holds the old history, and is
    /// rewritten at once (`ingest/persist.rs`).
    history_resets: watch::Sender<u64>,
    progress_wanted: Notify,
    /// A relist asked for by the consistency checker, or because
    /// upstream's history went back.
    relist_wanted: Notify,
    /// Whether the relist asked for heals a divergence.
    healing: AtomicBool,
    /// Whether the relist asked for follows upstream's history back.
    rewinding: AtomicBool,
    /// A relist asked for by another cache's finding that upstream's
    /// history went back has not landed yet (one at a time, however many
    /// caches find it: [`ResourceCache::rewound_elsewhere`]).
    rewind_relist: AtomicBool,
    /// After a healing relist that had to reset the cache: watches from
    /// below this RV get `410` (their clients relist from the healed
    /// cache) instead of passing through to an apiserver that would
    /// replay only what they had not missed.
    expire_below: AtomicU64,
    bookmark_template: Mutex<Option<Value>>,
    snapshots: moka::sync::Cache<u64, Objects>,
    probe: Mutex<ProbeSlot>,
    /// What is known of upstream's compaction (`compaction.rs`).
    compaction: Mutex<Compaction>,
    /// When a probe last found the cache behind upstream, while it is.
    behind_since: Mutex<Option<Instant>>,
    /// Since when upstream could not be watched, if it cannot.
    upstream_down_since: Mutex<Option<Instant>>,
    /// Whether upstream refused the cache's last list or watch (`401`,
    /// `403`), until one succeeds: see [`ResourceCache::refused`].
    refused: AtomicBool,
    /// Whether an object read upstream in protobuf could not be
    /// transcoded to its JSON exactly: the cache reads upstream in JSON
    /// from then on ([`ResourceCache::read_upstream_in_json`]).
    upstream_json: AtomicBool,
    /// Whether what the cache holds may be older than what this proxy (or
    /// its predecessor) already served: see [`Resumed`].
    resumed: watch::Sender<Resumed>,
    /// After a crash: the resourceVersion of the snapshot the cache
    /// resumed from, until it has caught up with upstream and disowned
    /// what lies between ([`ResourceCache::resumed_after_crash`]); `0`
    /// otherwise. Read by every read with a resourceVersion: an atomic.
    crashed_at: AtomicU64,
    /// From which resourceVersion on the history this process applied is
    /// upstream's own, as every apiserver serves it (a kube-apiserver's
    /// watch: etcd's history); `u64::MAX` while it may not be: a relist's
    /// differences, given resourceVersions of the cache's choosing, or a
    /// watch served by another cache (a tier replica), whose relists
    /// choose their own ([`ResourceCache::note_timeline`]).
    timeline_from: AtomicU64,
    /// After a crash: whether the crashed process recorded that its
    /// history past the snapshot was upstream's own (its timeline mark,
    /// `ingest/persist.rs`).
    crashed_timeline_upstreams: AtomicBool,
    /// While a successor takes over: the reflector applies nothing (it
    /// stops reading upstream), so nothing is served past the snapshot the
    /// successor resumes from.
    frozen: watch::Sender<bool>,
    /// When the cache last changed (an event, a bookmark, a list), was
    /// last (re)listed, and last checked against upstream, with the
    /// check's result: for the operator's view (`status.rs`).
    times: Mutex<Times>,
    /// Watches served from the cache now, by the user they act as (for
    /// the operator's view; an entry leaves with its last watch).
    watchers_by_user: Mutex<HashMap<String, usize>>,
    /// The other caches of this proxy ([`Siblings::join`]).
    siblings: OnceLock<Arc<Siblings>>,
    pub metrics: ResourceMetrics,
}

/// The caches of one proxy, which all read one cluster, so one etcd and
/// one revision: when one of them finds upstream's history went back
/// ([`ResourceCache::rewound`]), every other is suspect too.
#[derive(Debug, Default)]
pub struct Siblings(Vec<Weak<ResourceCache>>);

impl Siblings {
    /// Makes `caches` siblings of one another.
    pub fn join<'a>(caches: impl IntoIterator<Item = &'a Arc<ResourceCache>>) {
        let caches: Vec<&Arc<ResourceCache>> = caches.into_iter().collect();
        let siblings = Arc::new(Siblings(caches.iter().map(|c| Arc::downgrade(c)).collect()));
        for c in caches {
            let _ = c.siblings.set(siblings.clone());
        }
    }

    /// Tells every cache but `from` that `from` found upstream's history
    /// went back at `revealed_at`.
    fn rewound(&self, from: &ResourceCache, revealed_at: Instant) {
        for sibling in self.0.iter().filter_map(Weak::upgrade) {
            if !std::ptr::eq(Arc::as_ptr(&sibling), from) {
                sibling.rewound_elsewhere(&from.info.gvr.resource, revealed_at);
            }
        }
    }
}

/// Counts one watch of a user in [`ResourceCache::watchers_by_user`]
/// while it lives.
#[derive(Debug)]
pub struct Watching {
    cache: Arc<ResourceCache>,
    user: String,
}

impl Drop for Watching {
    fn drop(&mut self) {
        let mut m = self.cache.watchers_by_user.lock();
        if let Some(n) = m.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.user);
            }
        }
    }
}

/// See [`ResourceCache::times`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Times {
    pub changed: Option<Instant>,
    pub listed: Option<Instant>,
    pub checked: Option<(Instant, &'static str)>,
}

/// Where a cache filled from a snapshot stands. A restarted proxy's
/// snapshot can be older than what its predecessor served (it is written
/// every `intervalSeconds`), so until the cache has caught up with
/// upstream, a `resourceVersion=0` read from it could go back in time for
/// a client: such reads wait (`readyWaitMilliseconds`) for [`Current`],
/// then pass through. When upstream cannot be reached at all, the
/// snapshot is all there is (the apiserver's rules allow a stale answer),
/// and they are served from it.
///
/// [`Current`]: Resumed::Current
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// Filled from upstream, or caught up with it since.
    Current,
    /// Filled from a snapshot; catching up.
    CatchingUp,
    /// Filled from a snapshot; upstream unreachable.
    Unreachable,
}

impl std::fmt::Debug for ResourceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceCache")
            .field("gvr", &self.info.gvr)
            .finish_non_exhaustive()
    }
}

// === impl ResourceCache ===

impl ResourceCache {
    /// An empty cache, to be filled by its reflector.
    pub fn new(
        info: ResourceInfo,
        store: Settings,
        read: ReadSettings,
        metrics: ResourceMetrics,
    ) -> ResourceCache {
        let (rv, _) = watch::channel(0);
        let (synced, _) = watch::channel(false);
        ResourceCache {
            info,
            read,
            state: Mutex::new(State::new(store)),
            rv,
            synced,
            progress_wanted: Notify::new(),
            relist_wanted: Notify::new(),
            healing: AtomicBool::new(false),
            rewinding: AtomicBool::new(false),
            rewind_relist: AtomicBool::new(false),
            expire_below: AtomicU64::new(0),
            bookmark_template: Mutex::new(None),
            behind_since: Mutex::new(None),
            // Reconstructed snapshots, so paging through a list at one RV
            // does not rebuild it per page.
            snapshots: moka::sync::Cache::builder()
                .max_capacity(8)
                .time_to_live(Duration::from_secs(60))
                .build(),
            probe: Mutex::new(ProbeSlot::default()),
            compaction: Mutex::new(Compaction::default()),
            upstream_down_since: Mutex::new(None),
            refused: AtomicBool::new(false),
            upstream_json: AtomicBool::new(false),
            resumed: watch::channel(Resumed::Current).0,
            crashed_at: AtomicU64::new(0),
            timeline_from: AtomicU64::new(u64::MAX),
            crashed_timeline_upstreams: AtomicBool::new(false),
            history_resets: watch::channel(0).0,
            frozen: watch::channel(false).0,
            times: Mutex::new(Times::default()),
            watchers_by_user: Mutex::new(HashMap::new()),
            siblings: OnceLock::new(),
            metrics,
        }
    }

    /// What the cache holds.
    /// Whether the cache reads upstream in protobuf now
    /// (`ResourceInfo::upstream_protobuf`, until an object could not be
    /// transcoded).
    pub fn upstream_protobuf(&self) -> bool {
        self.info.upstream_protobuf && !self.upstream_json.load(Ordering::Relaxed)
    }

    /// Makes the cache read upstream in JSON from now on; `true` the first
    /// time.
    pub fn read_upstream_in_json(&self) -> bool {
        !self.upstream_json.swap(true, Ordering::Relaxed)
    }

    pub fn info(&self) -> &ResourceInfo {
        &self.info
    }

    /// The store, locked. Never hold across an `.await`.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// The cache's resourceVersion.
    pub fn rv(&self) -> u64 {
        *self.rv.borrow()
    }

    /// The cache's resourceVersion, to be told when it moves (an event, a
    /// relist, a bookmark's progress).
    pub fn subscribe_rv(&self) -> watch::Receiver<u64> {
        self.rv.subscribe()
    }

    /// Whether the first list has landed.
    pub fn is_synced(&self) -> bool {
        self.state.lock().is_synced()
    }

    // --- writer side (the reflector) ---

    /// Fills (first list) or reconciles (relist) the cache.
    pub fn replace(&self, items: impl Into<Listed>, list_rv: u64) {
        let mut reset = false;
        let outcome = {
            let mut s = self.state.lock();
            let before = s.rv();
            if s.is_synced() && list_rv < before {
                reset = true;
                // Upstream's history went back (etcd restored from a
                // backup without `--bump-revision`): the resourceVersions
                // up to `before` named versions of another history, which
                // the new one may give again to other objects. A watch
                // from any of them gets `410`, and its client relists.
                self.expire_below.fetch_max(before + 1, Ordering::AcqRel);
                tracing::warn!(resource = %self.info.gvr.resource, list_rv, before, "upstream listed below the cache's resourceVersion: its history went back; the cache is reset, and watches from resourceVersions up to the old one get 410 Gone");
            }
            let o = s.replace(items, list_rv, Instant::now());
            self.observe(&s, &o);
            self.times.lock().listed = Some(Instant::now());
            self.rewind_relist.store(false, Ordering::Release);
            o
        };
        if self.healing.swap(false, Ordering::AcqRel) && outcome.closed_reset > 0 {
            self.expire_below.fetch_max(list_rv, Ordering::AcqRel);
        }
        self.snapshots.invalidate_all();
        self.synced
            .send_if_modified(|s| !std::mem::replace(s, true));
        if reset {
            self.history_resets.send_modify(|n| *n += 1);
        }
        tracing::debug!(resource = %self.info.gvr.resource, rv = list_rv, events = outcome.events, "cache replaced from list");
    }

    /// Applies an upstream event.
    pub fn apply(&self, kind: EventType, object: CachedObject) {
        let mut s = self.state.lock();
        let o = s.apply(kind, object, Instant::now());
        self.observe(&s, &o);
    }

    /// The history's bounds: events, and age.
    #[cfg(test)]
    pub fn history_bounds(&self) -> (usize, Duration) {
        let s = self.state.lock();
        (s.settings().history_capacity, s.settings().history_max_age)
    }

    /// Applies upstream progress (a bookmark).
    pub fn progress(&self, rv: u64) {
        let mut s = self.state.lock();
        // Bookmarks come in quiet times too: the last burst's frames are
        // released without waiting for the next event.
        s.release_frames(Instant::now());
        if s.progress(rv) {
            self.observe(&s, &Outcome::default());
        }
    }

    /// When the cache last changed, was listed and was checked.
    pub fn times(&self) -> Times {
        *self.times.lock()
    }

    /// Counts a watch of `user` served from the cache until the returned
    /// guard is dropped (with the response body).
    pub fn watching(self: &Arc<Self>, user: &str) -> Watching {
        *self
            .watchers_by_user
            .lock()
            .entry(user.to_string())
            .or_default() += 1;
        Watching {
            cache: self.clone(),
            user: user.to_string(),
        }
    }

    /// The `n` users with the most watches served from the cache now, most
    /// first (ties by name).
    pub fn top_watchers(&self, n: usize) -> Vec<(String, usize)> {
        let mut all: Vec<(String, usize)> = self
            .watchers_by_user
            .lock()
            .iter()
            .map(|(u, c)| (u.clone(), *c))
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    /// Records a consistency check's result (`success`, `failure`,
    /// `error`).
    pub fn note_check(&self, result: &'static str) {
        self.times.lock().checked = Some((Instant::now(), result));
    }

    fn observe(&self, s: &State, o: &Outcome) {
        self.times.lock().changed = Some(Instant::now());
        let m = &self.metrics;
        m.objects.set(s.objects().len() as i64);
        m.bytes.set(s.bytes() as i64);
        if let Some(codec) = &self.info.codec {
            codec.note_objects(s.bytes() as u64);
        }
        m.history.set(s.history_len() as i64);
        m.resource_version
            .set(i64::try_from(s.rv()).unwrap_or(i64::MAX));
        m.watchers.set(s.watcher_count() as i64);
        m.events_dispatched.inc_by(o.dispatched);
        m.watchers_terminated("slow", o.closed_slow);
        m.watchers_terminated("history_overrun", o.closed_overrun);
        m.watchers_terminated("reset", o.closed_reset);
        let rv = s.rv();
        self.rv.send_if_modified(|cur| {
            let moved = *cur != rv;
            *cur = rv;
            moved
        });
    }

    /// Updates the watcher gauge after a watcher left.
    pub(crate) fn watcher_left(&self, id: u64) {
        let mut s = self.state.lock();
        s.unregister(id);
        self.metrics.watchers.set(s.watcher_count() as i64);
    }

    /// Remembers the shape of upstream's bookmark objects (the apiserver
    /// encodes an empty object of the kind), so the cache's bookmarks look
    /// the same.
    pub fn set_bookmark_template(&self, object: &[u8]) {
        let mut t = self.bookmark_template.lock();
        if t.is_none()
            && let Ok(v) = serde_json::from_slice::<Value>(object)
            && v.get("metadata").is_some_and(Value::is_object)
        {
            *t = Some(v);
        }
    }

    /// A `BOOKMARK` frame at `rv` in `repr`; with `initial_events_end`,
    /// annotated `k8s.io/initial-events-end: "true"` as the end of a
    /// streaming list's initial events. A metadata-only watch gets the
    /// bookmark object's `PartialObjectMetadata`, as the apiserver
    /// transforms every event object.
    pub fn bookmark_frame(
        &self,
        rv: u64,
        initial_events_end: bool,
        repr: Representation,
    ) -> Option<Bytes> {
        let json = self.bookmark_json(rv, initial_events_end);
        let object = encode::built_object(&json, self.info.codec.as_deref(), repr)?;
        Some(encode::frame(repr.encoding, "BOOKMARK", &object))
    }

    /// The JSON of a bookmark object at `rv`.
    fn bookmark_json(&self, rv: u64, initial_events_end: bool) -> Vec<u8> {
        let mut object = self.bookmark_template.lock().clone().unwrap_or_else(|| {
            serde_json::json!({
                "kind": self.info.kind,
                "apiVersion": self.info.api_version,
                "metadata": {"resourceVersion": ""},
            })
        });
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
            meta.remove("annotations");
            if initial_events_end {
                meta.insert(
                    "annotations".into(),
                    serde_json::json!({"k8s.io/initial-events-end": "true"}),
                );
            }
        }
        serde_json::to_vec(&object).unwrap_or_default()
    }

    /// Stops (`true`) or resumes applying upstream changes: see `frozen`.
    pub fn set_frozen(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// Waits while the cache is frozen.
    pub async fn wait_unfrozen(&self) {
        let mut rx = self.frozen.subscribe();
        let _ = rx.wait_for(|f| !*f).await;
    }

    /// Where a cache filled from a snapshot stands.
    pub fn resumed(&self) -> Resumed {
        *self.resumed.borrow()
    }

    /// Sets where a cache filled from a snapshot stands. A cache resumed
    /// after a crash that has now caught up disowns the resourceVersions
    /// between its snapshot's and its own first (see
    /// [`ResourceCache::resumed_after_crash`]).
    pub fn set_resumed(&self, r: Resumed) {
        let from = match r {
            Resumed::Current => self.crashed_at.swap(0, Ordering::AcqRel),
            _ => 0,
        };
        // What the crashed process served past its snapshot, and what this
        // one applied since, were both upstream's own history: one
        // timeline, which a client resuming in it may go on with.
        if from > 0
            && self.crashed_timeline_upstreams.load(Ordering::Acquire)
            && self.timeline_from.load(Ordering::Acquire) <= from
        {
            tracing::info!(resource = %self.info.gvr.resource, from, to = self.rv(), "caught up after a crash; the history past the snapshot is upstream's own, so watches from it go on");
        } else if from > 0 {
            let (to, closed) = {
                let mut s = self.state.lock();
                let (to, o) = s.disown_since(from);
                self.observe(&s, &o);
                (to, o.closed_reset)
            };
            self.expire_below.fetch_max(to, Ordering::AcqRel);
            self.snapshots.invalidate_all();
            if to > from + 1 {
                tracing::info!(resource = %self.info.gvr.resource, from, to, closed, "caught up after a crash: watches from between the snapshot's resourceVersion and the cache's get 410 Gone, and their clients list again");
            }
        }
        self.resumed
            .send_if_modified(|cur| std::mem::replace(cur, r) != r);
    }

    /// Marks a cache filled from the snapshot at `rv` after the previous
    /// process crashed: [`Resumed::CatchingUp`]. The crashed process may
    /// have served resourceVersions past `rv`, and the timeline it served
    /// is lost with it: the events this cache receives for them from
    /// upstream can differ (behind a tier, two replicas' relists give a
    /// deletion different free resourceVersions), so a client resuming
    /// from one of them could be sent changes it already has, or miss
    /// some. Reads and watches from past `rv` wait until the cache has
    /// caught up ([`ResourceCache::crashed_at`]); then the resourceVersions
    /// strictly between `rv` and the cache's are disowned: a watch from
    /// one gets `410 Gone` and its client lists again, as after a
    /// kube-apiserver's restart, whose watch cache starts at its first
    /// list (docs/reliability.md, finding 9).
    ///
    /// Unless `timeline_upstreams`: the crashed process recorded that what
    /// it applied past `rv` was upstream's own history (no relist, only
    /// watches a kube-apiserver served), and this process's catching up is
    /// too ([`ResourceCache::note_timeline`]); then there is one timeline,
    /// and the clients' resourceVersions in it are kept.
    pub fn resumed_after_crash(&self, rv: u64, timeline_upstreams: bool) {
        self.crashed_timeline_upstreams
            .store(timeline_upstreams, Ordering::Release);
        self.crashed_at.store(rv, Ordering::Release);
        self.set_resumed(Resumed::CatchingUp);
    }

    /// Notes what the history applied from now on is: upstream's own from
    /// `Some(rv)` on (a watch a kube-apiserver serves, from `rv`; kept
    /// from earlier if it was already), or not (`None`: a relist, or a
    /// watch served by another cache). Returns the new mark when it
    /// changed, to be recorded on disk before anything past it is served.
    pub fn note_timeline(&self, upstreams_from: Option<u64>) -> Option<Option<u64>> {
        let new = upstreams_from.unwrap_or(u64::MAX);
        let old = self.timeline_from.load(Ordering::Acquire);
        let new = if new != u64::MAX && old != u64::MAX {
            old
        } else {
            new
        };
        (self.timeline_from.swap(new, Ordering::AcqRel) != new)
            .then_some((new != u64::MAX).then_some(new))
    }

    /// The resourceVersion of the crash snapshot the cache resumed from,
    /// while it catches up (see [`ResourceCache::resumed_after_crash`]).
    pub fn crashed_at(&self) -> Option<u64> {
        Some(self.crashed_at.load(Ordering::Acquire)).filter(|at| *at > 0)
    }

    /// Waits up to `timeout` until a `resourceVersion=0` read may be
    /// answered without going back in time (see [`Resumed`]); returns
    /// whether it may.
    pub async fn wait_current(&self, timeout: Duration) -> bool {
        let ok = |r: &Resumed| *r != Resumed::CatchingUp;
        if ok(&self.resumed()) {
            return true;
        }
        let start = Instant::now();
        let mut rx = self.resumed.subscribe();
        let reached = tokio::time::timeout(timeout, rx.wait_for(ok))
            .await
            .is_ok_and(|r| r.is_ok());
        self.metrics
            .read_wait("ready", start.elapsed().as_secs_f64());
        reached
    }

    /// Records that upstream could not be watched; returns since when.
    pub fn upstream_down(&self) -> Instant {
        *self
            .upstream_down_since
            .lock()
            .get_or_insert_with(Instant::now)
    }

    /// Since when upstream could not be watched, if it cannot.
    pub fn upstream_down_since(&self) -> Option<Instant> {
        *self.upstream_down_since.lock()
    }

    /// Records that an upstream watch is open (or a list succeeded);
    /// returns whether it was down.
    pub fn upstream_up(&self) -> bool {
        self.refused.store(false, Ordering::Release);
        self.upstream_down_since.lock().take().is_some()
    }

    /// Records that upstream refused the cache's own list or watch (`401`
    /// or `403`); returns whether it already had.
    pub fn upstream_refused(&self) -> bool {
        self.refused.swap(true, Ordering::AcqRel)
    }

    /// Whether upstream refuses the cache's reads: until it allows them
    /// again, the cache's reads pass through. Upstream answers, so it is
    /// not down, and what the cache holds is what the proxy may no longer
    /// read: kept from before its rights were taken away, or from before
    /// etcd was restored, while restarted apiservers refuse it until
    /// their authorizers are ready (docs/reliability.md, finding 10).
    /// Serving it (as when upstream cannot be reached at all) would show
    /// what the apiserver would not; passed through, the request gets the
    /// apiserver's own answer for the client.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Acquire)
    }

    // --- reader side ---

    /// The state at exactly `rv`, if the history reaches back that far.
    pub fn snapshot_at(&self, rv: u64) -> Option<Objects> {
        if let Some(s) = self.snapshots.get(&rv) {
            return Some(s);
        }
        let snapshot = self.state.lock().snapshot_at(rv)?;
        self.snapshots.insert(rv, snapshot.clone());
        Some(snapshot)
    }

    /// Waits until the cache's RV is at least `target`, for at most
    /// `timeout`, asking the reflector for progress meanwhile. Returns
    /// whether it got there. `kind` labels the wait metric.
    pub async fn wait_fresh(&self, target: u64, timeout: Duration, kind: &str) -> bool {
        if self.rv() >= target {
            return true;
        }
        let start = Instant::now();
        self.progress_wanted.notify_one();
        let mut rx = self.rv.subscribe();
        let reached = tokio::time::timeout(timeout, rx.wait_for(|rv| *rv >= target))
            .await
            .is_ok_and(|r| r.is_ok());
        self.metrics.read_wait(kind, start.elapsed().as_secs_f64());
        reached
    }

    /// Changes each time a relist found upstream's history gone back.
    pub fn history_resets(&self) -> watch::Receiver<u64> {
        self.history_resets.subscribe()
    }

    /// Returns when the cache is synced (its first list landed, or it
    /// resumed from a snapshot).
    pub async fn synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Waits for the first list to land, for at most `timeout`. Returns
    /// whether the cache is synced.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        if *self.synced.borrow() {
            return true;
        }
        let start = Instant::now();
        let mut rx = self.synced.subscribe();
        let ok = tokio::time::timeout(timeout, rx.wait_for(|s| *s))
            .await
            .is_ok_and(|r| r.is_ok());
        self.metrics
            .read_wait("ready", start.elapsed().as_secs_f64());
        ok
    }

    /// Whether a probe found the cache behind upstream less than
    /// [`REPROBE_BEHIND`] ago: a consistent list then passes straight
    /// through instead of paying for a probe that would most likely find
    /// the same. A quiet resource in a busy cluster stays behind, because
    /// the probe returns etcd's revision, which every write anywhere moves,
    /// while the cache learns newer revisions only from its own events and
    /// bookmarks.
    pub fn known_behind(&self) -> bool {
        self.behind_since
            .lock()
            .is_some_and(|at| at.elapsed() < REPROBE_BEHIND)
    }

    /// Records what a probe found: the cache fresh, or behind (then a
    /// progress watch is asked for, so a resource that is only briefly
    /// behind catches up within about a second).
    pub fn note_probe(&self, fresh: bool) {
        *self.behind_since.lock() = (!fresh).then(Instant::now);
        if !fresh {
            self.progress_wanted.notify_one();
        }
    }

    /// Asks the reflector to relist now: the consistency checker found the
    /// cache diverged from upstream. The relist reaches watchers as
    /// ordinary events (`State::replace`).
    pub fn request_relist(&self) {
        self.healing.store(true, Ordering::Release);
        self.relist_wanted.notify_one();
    }

    /// Resolves when a relist is asked for, with why: `heal` (the
    /// consistency checker) or `rewound` (upstream's history went back).
    pub async fn relist_requested(&self) -> &'static str {
        self.relist_wanted.notified().await;
        if self.rewinding.swap(false, Ordering::AcqRel) {
            "rewound"
        } else {
            "heal"
        }
    }

    /// Whether `upstream_rv`, upstream's current resourceVersion from a
    /// consistent read, is below `cache_rv`, the cache's resourceVersion
    /// before that read was sent: upstream's history went back (etcd
    /// restored from a backup without `--bump-revision`; a consistent
    /// read's resourceVersion is at least every revision etcd gave before
    /// it was sent, unless its history was replaced). The reflector is
    /// then asked to relist. (Not the cache's RV when the answer arrives:
    /// the watch may have carried it past the read's revision meanwhile.)
    /// The other caches of the proxy that have not listed since the read
    /// was sent (`sent_at`, after the restore) are asked too
    /// ([`Siblings`]); one that has listed since holds the new history.
    pub fn rewound(&self, upstream_rv: u64, cache_rv: u64, sent_at: Instant) -> bool {
        if !self.is_synced() || upstream_rv >= cache_rv {
            return false;
        }
        if !self.rewinding.swap(true, Ordering::AcqRel) {
            tracing::warn!(resource = %self.info.gvr.resource, upstream_rv, cache_rv, "upstream's current resourceVersion is below the cache's: its history went back (etcd restored from a backup without --bump-revision?); relisting");
            if let Some(siblings) = self.siblings.get() {
                siblings.rewound(self, sent_at);
            }
        }
        self.relist_wanted.notify_one();
        true
    }

    /// Another cache of this proxy (`by`) found upstream's history went
    /// back at `revealed_at`. This one may hold versions of the lost
    /// history at resourceVersions the new history has passed since, which
    /// no probe of its own can tell (its resourceVersion is below
    /// upstream's again), and a watch resumed there is accepted, so it
    /// would serve a world that never existed until a consistency check
    /// (docs/reliability.md, finding 11). Unless it has listed since, it
    /// relists: an object whose listed version is older than the cached
    /// one resets the cache, and watches from its older resourceVersions
    /// get `410 Gone`, as after a heal.
    fn rewound_elsewhere(&self, by: &str, revealed_at: Instant) {
        if !self.is_synced()
            || self.times.lock().listed.is_some_and(|t| t >= revealed_at)
            || self.rewind_relist.swap(true, Ordering::AcqRel)
        {
            return;
        }
        if !self.rewinding.swap(true, Ordering::AcqRel) {
            tracing::warn!(resource = %self.info.gvr.resource, by, "another cache found upstream's history went back (etcd restored from a backup without --bump-revision?); relisting");
        }
        self.healing.store(true, Ordering::Release);
        self.relist_wanted.notify_one();
    }

    /// Watches from below this RV get `410` (see the field).
    pub fn expire_below(&self) -> u64 {
        self.expire_below.load(Ordering::Acquire)
    }

    /// Resolves when a reader waits for freshness the cache lacks.
    pub async fn progress_wanted(&self) {
        self.progress_wanted.notified().await;
    }

    /// Upstream's current resourceVersion, from a probe that started no
    /// earlier than `arrived`, so that it reflects every write completed
    /// before the request. At most one probe per resource is in flight: a
    /// request joins the probe in flight if that one started after it
    /// arrived, else the one queued to start when the in-flight probe
    /// ends; 200 concurrent consistent lists cost at most two probes.
    ///
    /// # Errors
    /// The probe's failure; [`ProbeError::Rewound`] when upstream's
    /// resourceVersion is below the cache's as it was when the probe was
    /// sent ([`ResourceCache::rewound`]).
    pub async fn upstream_rv(
        &self,
        arrived: Instant,
        start_probe: impl FnOnce() -> BoxFuture<'static, Result<u64, ProbeError>>,
    ) -> Result<u64, ProbeError> {
        // Counted once per upstream probe, not per request sharing it.
        let metrics = self.metrics.clone();
        let rv = &self.rv;
        let probe = self.probe.lock().join(arrived, move || {
            // Only for a new probe, not for every request joining one.
            let cache_rv = rv.subscribe();
            let probe = start_probe();
            async move {
                // Read before the request is sent: `start_probe`'s future
                // sends it when first polled.
                let cache_rv_at_send = *cache_rv.borrow();
                let sent_at = Instant::now();
                let result = probe.await;
                metrics.probe(match &result {
                    Ok(_) => "ok",
                    Err(e) if e.is_busy() => "busy",
                    Err(_) => "error",
                });
                result.map(|upstream_rv| Probed {
                    upstream_rv,
                    cache_rv_at_send,
                    sent_at,
                })
            }
            .boxed()
        });
        let probed = probe.await?;
        if self.rewound(probed.upstream_rv, probed.cache_rv_at_send, probed.sent_at) {
            return Err(ProbeError::Rewound);
        }
        Ok(probed.upstream_rv)
    }
}

impl ResourceCache {
    /// Whether upstream still serves reads at exactly `rv` (it has not
    /// compacted it), from what earlier probes proved or a new one
    /// (`start_probe(rv)`, shared with concurrent reads it covers); see
    /// `compaction.rs`.
    ///
    /// # Errors
    /// The probe's failure, as text.
    pub async fn revision_alive(
        &self,
        rv: u64,
        start_probe: impl FnOnce(u64) -> BoxFuture<'static, Result<Verdict, String>>,
    ) -> Result<Verdict, String> {
        let started = Instant::now();
        let metrics = self.metrics.clone();
        let known = self.compaction.lock().check(rv, started, move |rv| {
            let probe = start_probe(rv);
            async move {
                let result = probe.await;
                metrics.compaction_probe(match &result {
                    Ok(Verdict::Alive) => "alive",
                    Ok(Verdict::Compacted) => "compacted",
                    Err(_) => "error",
                });
                result
            }
            .boxed()
        });
        match known {
            Known::Now(v) => Ok(v),
            Known::Wait(probed, probe) => {
                let verdict = probe.await?;
                self.compaction.lock().record(probed, started, verdict);
                Ok(verdict)
            }
        }
    }

    /// Every revision at or below this is known to be compacted upstream.
    pub fn compacted(&self) -> u64 {
        self.compaction.lock().compacted()
    }
}

/// One generation of the upstream probe.
#[derive(Clone)]
struct ProbeRun {
    /// No later than the moment the probe's request was sent.
    not_before: Instant,
    future: Probe,
}

/// The probe in flight (or last done) and the one queued after it.
#[derive(Default)]
struct ProbeSlot {
    current: Option<ProbeRun>,
    next: Option<ProbeRun>,
}

impl ProbeSlot {
    /// The probe a request that arrived at `arrived` may use.
    fn join(
        &mut self,
        arrived: Instant,
        start_probe: impl FnOnce() -> BoxFuture<'static, Result<Probed, ProbeError>>,
    ) -> Probe {
        let now = Instant::now();
        // The queued probe starts once the current one is done.
        if self
            .current
            .as_ref()
            .is_some_and(|c| c.future.peek().is_some())
            && let Some(next) = self.next.take()
        {
            self.current = Some(next);
        }
        match &self.current {
            Some(c) if c.not_before >= arrived => c.future.clone(),
            // In flight but started before this request: the queued probe
            // starts after it ends, which is after now, so after arrival.
            Some(c) if c.future.peek().is_none() => {
                let after = c.future.clone();
                self.next
                    .get_or_insert_with(|| {
                        let probe = start_probe();
                        ProbeRun {
                            not_before: now,
                            future: async move {
                                let _ = after.await;
                                probe.await
                            }
                            .boxed()
                            .shared(),
                        }
                    })
                    .future
                    .clone()
            }
            _ => {
                let future = start_probe().shared();
                self.current = Some(ProbeRun {
                    not_before: now,
                    future: future.clone(),
                });
                future
            }
        }
    }
}

#[cfg(test)]
#[path = "resource_tests.rs"]
pub(crate) mod tests;
