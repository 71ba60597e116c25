//! The state of one resource's watch cache: the current objects, a bounded
//! history of recent events, and the watchers with their dispatch index.
//! One writer (the reflector) and many readers share it behind one short
//! mutex that is never held across an `.await`.
//!
//! Mirrors the apiserver's `watchCache` + `Cacher` dispatch
//! (`staging/src/k8s.io/apiserver/pkg/storage/cacher/`), with two
//! departures:
//! - a relist does not close watchers: the difference between the cached
//!   and the new state is delivered as ordinary events, and the history
//!   stays continuous;
//! - dispatch never blocks: a watcher whose buffer is full is marked
//!   lagging and later catches up from the history on its own; one that
//!   stays blocked beyond a time budget, or whose resume point leaves the
//!   history, is closed so its client re-watches from its last RV.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use imbl::OrdMap;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use apimachinery::resource::FieldSet;

use super::event::{Event, EventType, Which};
use super::filter::{Filter, IndexKey};
use super::object::CachedObject;

/// The objects of a resource, by storage key, in the apiserver's order.
pub type Objects = OrdMap<Arc<str>, Arc<CachedObject>>;

/// How a store behaves.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Events kept for watches that resume from an older RV.
    pub history_capacity: usize,
    /// Events older than this leave the history even below capacity.
    pub history_max_age: Duration,
    /// Events buffered per watcher before it is marked lagging.
    pub watcher_buffer: usize,
    /// How long a watcher may stay blocked (lagging without catching up)
    /// before it is closed.
    pub blocked_budget: Duration,
    /// Whether watchers are indexed by `spec.nodeName` (pods).
    pub node_indexed: bool,
    /// Whether the resource is namespaced.
    pub namespaced: bool,
    /// How objects' selectable fields are computed (for synthesized events).
    pub field_set: FieldSet,
}

/// One event queued for a watcher, and which of its frames the watcher
/// gets (the watcher encodes it, outside the store lock).
#[derive(Debug, Clone)]
pub struct Delivery {
    pub rv: u64,
    pub event: Arc<Event>,
    pub which: Which,
}

/// Why a watcher was closed by the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Blocked beyond the time budget.
    Slow,
    /// Its resume point was evicted from the history while it lagged.
    HistoryOverrun,
    /// The cache was reset (a relist that could not be expressed as events).
    Reset,
}

impl CloseReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Slow => "slow",
            CloseReason::HistoryOverrun => "history_overrun",
            CloseReason::Reset => "reset",
        }
    }

    fn code(self) -> u8 {
        match self {
            CloseReason::Slow => 1,
            CloseReason::HistoryOverrun => 2,
            CloseReason::Reset => 3,
        }
    }
}

/// A lagging watcher's resume point.
#[derive(Debug, Clone, Copy)]
struct Lag {
    since: Instant,
    from_rv: u64,
}

/// State shared between the store's entry for a watcher and its stream.
#[derive(Debug, Default)]
pub struct WatcherLink {
    lag: Mutex<Option<Lag>>,
    closed: AtomicU8,
}

impl WatcherLink {
    /// Whether the watcher missed deliveries and must catch up.
    pub fn is_lagging(&self) -> bool {
        self.lag.lock().is_some()
    }

    /// Whether the cache closed the watcher.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) != 0
    }
}

struct Entry {
    filter: Arc<Filter>,
    tx: mpsc::Sender<Delivery>,
    link: Arc<WatcherLink>,
    index: IndexKey,
    min_rv: u64,
}

/// Watchers and their dispatch index.
#[derive(Default)]
struct Watchers {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    by_name: HashMap<Box<str>, HashSet<u64>>,
    by_node: HashMap<Box<str>, HashSet<u64>>,
    by_namespace: HashMap<Box<str>, HashSet<u64>>,
    unindexed: HashSet<u64>,
    lagging: usize,
    /// Each distinct filter once, with the number of watchers using it:
    /// watchers with equal selectors share one `Arc`, so that an event is
    /// matched once per distinct filter, not once per watcher.
    filters: HashMap<Arc<Filter>, usize>,
}

impl Watchers {
    fn intern(&mut self, filter: Arc<Filter>) -> Arc<Filter> {
        if let Some((shared, _)) = self.filters.get_key_value(&filter) {
            let shared = shared.clone();
            *self.filters.entry(shared.clone()).or_default() += 1;
            return shared;
        }
        self.filters.insert(filter.clone(), 1);
        filter
    }

    fn release(&mut self, filter: &Arc<Filter>) {
        if let Some(n) = self.filters.get_mut(filter) {
            *n -= 1;
            if *n == 0 {
                self.filters.remove(filter);
            }
        }
    }
}

/// The decisions already taken for one event, per interned filter (by
/// pointer). Watchers sharing a selector (a DaemonSet's agents, a tier's
/// nodes watching services) cost one match per event between them.
#[derive(Default)]
struct Decisions(Vec<(*const Filter, Option<Which>)>);

impl Decisions {
    /// Distinct filters remembered per event; past this, filters are
    /// matched per watcher (per-node selectors rarely repeat).
    const MAX: usize = 8;

    fn which(&mut self, event: &Event, filter: &Arc<Filter>) -> Option<Which> {
        let ptr = Arc::as_ptr(filter);
        if let Some((_, w)) = self.0.iter().find(|(p, _)| *p == ptr) {
            return *w;
        }
        let w = event.which_for(filter);
        if self.0.len() < Self::MAX {
            self.0.push((ptr, w));
        }
        w
    }
}

/// Where a new watcher starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Every change after this RV, from the history.
    After(u64),
    /// The current state as synthetic `ADDED` events, then changes.
    Snapshot,
}

/// A registered watcher.
#[derive(Debug)]
pub struct Registration {
    pub id: u64,
    pub rx: mpsc::Receiver<Delivery>,
    pub link: Arc<WatcherLink>,
    /// History events to replay first (`Start::After`).
    pub replay: Vec<Arc<Event>>,
    /// The state to send first (`Start::Snapshot`) and its RV.
    pub snapshot: Option<(Objects, u64)>,
    /// Deliveries with an RV at or below this are skipped.
    pub min_rv: u64,
}

/// A watch that cannot start from the requested RV: it is older than the
/// history (`too old resource version: N (floor)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld {
    pub requested: u64,
    pub floor: u64,
}

/// Frames for a lagging watcher.
#[derive(Debug)]
pub enum CatchUp {
    /// Frames to send; `done` when the watcher is live again.
    Frames { frames: Vec<Delivery>, done: bool },
    /// The watcher was closed.
    Closed,
}

/// What a call changed, for metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Events added to the history.
    pub events: u64,
    /// Frames queued to watchers.
    pub dispatched: u64,
    /// Watchers closed, by reason.
    pub closed_slow: u64,
    pub closed_overrun: u64,
    pub closed_reset: u64,
    /// The upstream event was older than the cache and ignored.
    pub stale: bool,
}

impl Outcome {
    fn closed(&mut self, reason: CloseReason) {
        match reason {
            CloseReason::Slow => self.closed_slow += 1,
            CloseReason::HistoryOverrun => self.closed_overrun += 1,
            CloseReason::Reset => self.closed_reset += 1,
        }
    }
}

/// The state of one resource's cache.
pub struct State {
    settings: Settings,
    objects: Objects,
    rv: u64,
    history: VecDeque<Arc<Event>>,
    /// When each history event was applied (same length as `history`).
    history_at: VecDeque<Instant>,
    /// Every event with an RV above this is in the history.
    floor: u64,
    /// Intervals `(from, to)` of RVs the history skipped: a relist took the
    /// cache from `from` straight to `to`, its difference delivered as
    /// events at RVs that are not the changes' own (deletions at free RVs),
    /// valid for a client at `from` or before, not for one in between,
    /// whose state the cache never knew.
    skipped: VecDeque<(u64, u64)>,
    synced: bool,
    bytes: usize,
    watchers: Watchers,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("rv", &self.rv)
            .field("objects", &self.objects.len())
            .field("history", &self.history.len())
            .field("floor", &self.floor)
            .field("watchers", &self.watchers.entries.len())
            .finish()
    }
}

// === impl State ===

impl State {
    /// An empty, unsynced store.
    pub fn new(settings: Settings) -> State {
        State {
            settings,
            objects: Objects::new(),
            rv: 0,
            history: VecDeque::new(),
            history_at: VecDeque::new(),
            floor: 0,
            skipped: VecDeque::new(),
            synced: false,
            bytes: 0,
            watchers: Watchers::default(),
        }
    }

    /// Whether the first list has landed.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// The cache's resourceVersion: of the newest event or bookmark applied,
    /// or of the list it started from.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// The oldest RV a watch can resume from.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// The current objects (a cheap, immutable snapshot when cloned).
    pub fn objects(&self) -> &Objects {
        &self.objects
    }

    /// Number of events in the history.
    pub fn history_len(&self) -> usize {
        self.history.len()
    }

    /// Bytes held by the current objects.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of registered watchers.
    pub fn watcher_count(&self) -> usize {
        self.watchers.entries.len()
    }

    /// Applies an upstream event. Events at or below the cache's RV are
    /// ignored (a resumed or duplicate stream).
    pub fn apply(&mut self, kind: EventType, object: CachedObject, now: Instant) -> Outcome {
        if object.rv <= self.rv {
            return Outcome {
                stale: true,
                ..Outcome::default()
            };
        }
        let object = Arc::new(object);
        let prev = self.objects.get(object.key()).cloned();
        let kind = match (kind, &prev) {
            // A MODIFIED for an object we never saw is, to a watcher, new.
            (EventType::Modified, None) => EventType::Added,
            // An ADDED over an existing key replaced it.
            (EventType::Added, Some(_)) => EventType::Modified,
            (k, _) => k,
        };
        if kind == EventType::Deleted && prev.is_none() {
            // Deleting what we do not hold changes nothing but the RV.
            self.rv = object.rv;
            return Outcome::default();
        }
        let event = Arc::new(Event::new(object.rv, kind, object, prev));
        self.push(event, now)
    }

    /// Records upstream progress (a bookmark). Returns whether the RV moved.
    pub fn progress(&mut self, rv: u64) -> bool {
        if rv > self.rv {
            self.rv = rv;
            true
        } else {
            false
        }
    }

    fn push(&mut self, event: Arc<Event>, now: Instant) -> Outcome {
        let mut outcome = Outcome {
            events: 1,
            ..Outcome::default()
        };
        let key = event.object.key_arc().clone();
        if let Some(prev) = &event.prev {
            self.bytes = self.bytes.saturating_sub(prev.heap_size());
        }
        match event.kind {
            EventType::Deleted => {
                self.objects.remove(&key);
            }
            EventType::Added | EventType::Modified => {
                self.bytes += event.object.heap_size();
                self.objects.insert(key, event.object.clone());
            }
        }
        self.rv = event.rv;
        self.dispatch(&event, now, &mut outcome);
        self.history.push_back(event);
        self.history_at.push_back(now);
        // Bounded by count, and by age as the apiserver's watch cache is
        // (it keeps about `eventFreshDuration`, 75 s, of events): old
        // versions of big objects (nodes) would otherwise stay in memory
        // for hours in a quiet cluster.
        let too_old = now.checked_sub(self.settings.history_max_age);
        while self.history.len() > self.settings.history_capacity.max(1)
            || too_old.is_some_and(|t| self.history_at.front().is_some_and(|at| *at < t))
        {
            let Some(old) = self.history.pop_front() else {
                break;
            };
            self.history_at.pop_front();
            self.floor = old.rv;
            while self
                .skipped
                .front()
                .is_some_and(|(_, to)| *to <= self.floor)
            {
                self.skipped.pop_front();
            }
            if self.watchers.lagging > 0 {
                self.close_overrun(&mut outcome);
            }
        }
        outcome
    }

    fn dispatch(&mut self, event: &Arc<Event>, now: Instant, outcome: &mut Outcome) {
        let mut candidates: Vec<u64> = Vec::new();
        {
            let w = &self.watchers;
            let mut take = |set: Option<&HashSet<u64>>| {
                if let Some(set) = set {
                    candidates.extend(set.iter().copied());
                }
            };
            let obj = &event.object;
            take(w.by_name.get(obj.key()));
            take(w.by_namespace.get(obj.namespace()));
            if self.settings.node_indexed {
                let node = obj.field("spec.nodeName").unwrap_or("");
                take(w.by_node.get(node));
                if let Some(prev_node) = event.prev.as_ref().and_then(|p| p.field("spec.nodeName"))
                    && prev_node != node
                {
                    take(w.by_node.get(prev_node));
                }
            }
            candidates.extend(w.unindexed.iter().copied());
        }
        let mut to_close: Vec<(u64, CloseReason)> = Vec::new();
        let mut to_remove: Vec<u64> = Vec::new();
        let mut decisions = Decisions::default();
        for id in candidates {
            let Some(entry) = self.watchers.entries.get(&id) else {
                continue;
            };
            if event.rv <= entry.min_rv {
                continue;
            }
            let Some(which) = decisions.which(event, &entry.filter) else {
                continue;
            };
            let mut lag = entry.link.lag.lock();
            if let Some(l) = *lag {
                if now.saturating_duration_since(l.since) > self.settings.blocked_budget {
                    drop(lag);
                    to_close.push((id, CloseReason::Slow));
                }
                continue;
            }
            match entry.tx.try_send(Delivery {
                rv: event.rv,
                event: event.clone(),
                which,
            }) {
                Ok(()) => outcome.dispatched += 1,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    *lag = Some(Lag {
                        since: now,
                        from_rv: event.rv,
                    });
                    self.watchers.lagging += 1;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => to_remove.push(id),
            }
        }
        for (id, reason) in to_close {
            self.close(id, reason);
            outcome.closed(reason);
        }
        for id in to_remove {
            self.unregister(id);
        }
    }

    fn close_overrun(&mut self, outcome: &mut Outcome) {
        let floor = self.floor;
        let overrun: Vec<u64> = self
            .watchers
            .entries
            .iter()
            .filter(|(_, e)| e.link.lag.lock().is_some_and(|l| l.from_rv <= floor))
            .map(|(id, _)| *id)
            .collect();
        for id in overrun {
            self.close(id, CloseReason::HistoryOverrun);
            outcome.closed(CloseReason::HistoryOverrun);
        }
    }

    fn close(&mut self, id: u64, reason: CloseReason) {
        if let Some(entry) = self.watchers.entries.get(&id) {
            entry.link.closed.store(reason.code(), Ordering::Release);
        }
        self.unregister(id);
    }

    /// Replaces the state with a fresh upstream list at `list_rv`. The
    /// first time, this is the initial fill. Later (a relist after `410`),
    /// the difference is applied as ordinary events so watchers continue:
    /// new objects are `ADDED` and changed ones `MODIFIED` at their own
    /// RVs; vanished ones are `DELETED` at distinct RVs in
    /// `(cache RV, list RV]` not used by those (the apiserver does not say
    /// when they went; any such RV is a time at which they may already
    /// have gone), so every event has its own RV and a client resuming
    /// mid-way misses nothing. When that is impossible, watchers are closed
    /// and the history reset, as the apiserver's cacher always does.
    pub fn replace(&mut self, items: Vec<CachedObject>, list_rv: u64, now: Instant) -> Outcome {
        let mut fresh = Objects::new();
        for item in items {
            let item = Arc::new(item);
            fresh.insert(item.key_arc().clone(), item);
        }
        if !self.synced {
            self.bytes = fresh.values().map(|o| o.heap_size()).sum();
            self.objects = fresh;
            self.rv = list_rv;
            self.floor = list_rv;
            self.synced = true;
            return Outcome::default();
        }
        match self.diff(&fresh, list_rv) {
            Some(changes) => {
                let mut outcome = Outcome::default();
                let from = self.rv;
                // A watcher already past the cache's RV (it resumed from
                // an RV it got elsewhere: another process, a newer
                // snapshot) holds a state the difference was not computed
                // from: it is closed, and its client's re-watch goes
                // upstream (`skipped`).
                let ahead: Vec<u64> = self
                    .watchers
                    .entries
                    .iter()
                    .filter(|(_, e)| e.min_rv > from && e.min_rv < list_rv)
                    .map(|(id, _)| *id)
                    .collect();
                for id in ahead {
                    self.close(id, CloseReason::Reset);
                    outcome.closed(CloseReason::Reset);
                }
                if list_rv > from + 1 {
                    self.skipped.push_back((from, list_rv));
                }
                for event in changes {
                    let o = self.push(Arc::new(event), now);
                    outcome.events += o.events;
                    outcome.dispatched += o.dispatched;
                    outcome.closed_slow += o.closed_slow;
                    outcome.closed_overrun += o.closed_overrun;
                }
                self.progress(list_rv);
                outcome
            }
            None => {
                let mut outcome = Outcome::default();
                let ids: Vec<u64> = self.watchers.entries.keys().copied().collect();
                for id in ids {
                    self.close(id, CloseReason::Reset);
                    outcome.closed(CloseReason::Reset);
                }
                self.bytes = fresh.values().map(|o| o.heap_size()).sum();
                self.objects = fresh;
                self.history.clear();
                self.history_at.clear();
                self.skipped.clear();
                self.rv = list_rv;
                self.floor = list_rv;
                outcome
            }
        }
    }

    /// The events that turn the cached state into `fresh`, sorted by RV,
    /// or `None` when they cannot be given distinct RVs in
    /// `(cache RV, list RV]`.
    ///
    /// An object changed upstream after the cache's RV becomes an event at
    /// its own RV. Changes the cache should already hold but does not (an
    /// object at or below the cache's RV that it lacks or holds at another
    /// version: a divergence the consistency checker found) and deletions
    /// (the apiserver does not say when they happened) take the free RVs
    /// in `(cache RV, list RV]`, newest first; a deleted object is stamped
    /// with its event's RV, as the apiserver stamps deletions, while a
    /// missed version keeps its own RV: it is the object as upstream has
    /// it, delivered late.
    fn diff(&self, fresh: &Objects, list_rv: u64) -> Option<Vec<Event>> {
        let mut changes: Vec<Event> = Vec::new();
        // Missed versions: (kind, object, previous), given a free RV below.
        let mut late: Vec<(EventType, Arc<CachedObject>, Option<Arc<CachedObject>>)> = Vec::new();
        for (key, obj) in fresh {
            let prev = self.objects.get(key);
            if prev.is_some_and(|p| p.rv == obj.rv) {
                continue;
            }
            if obj.rv > list_rv || prev.is_some_and(|p| p.rv > obj.rv) {
                // Upstream went back in time (restored from a backup).
                return None;
            }
            let kind = if prev.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            };
            if obj.rv > self.rv {
                changes.push(Event::new(obj.rv, kind, obj.clone(), prev.cloned()));
            } else {
                late.push((kind, obj.clone(), prev.cloned()));
            }
        }
        let used: HashSet<u64> = changes.iter().map(|e| e.rv).collect();
        let gone: Vec<&Arc<CachedObject>> = self
            .objects
            .iter()
            .filter(|(k, _)| !fresh.contains_key(*k))
            .map(|(_, o)| o)
            .collect();
        let mut free = (self.rv + 1..=list_rv)
            .rev()
            .filter(|rv| !used.contains(rv));
        let mut slots: Vec<u64> = Vec::with_capacity(late.len() + gone.len());
        for _ in 0..late.len() + gone.len() {
            slots.push(free.next()?);
        }
        slots.sort_unstable();
        let (late_slots, gone_slots) = slots.split_at(late.len());
        for ((kind, obj, prev), rv) in late.into_iter().zip(late_slots) {
            changes.push(Event::new(*rv, kind, obj, prev));
        }
        for (prev, rv) in gone.into_iter().zip(gone_slots) {
            let stamped = CachedObject::from_json(
                &prev.with_resource_version(*rv),
                self.settings.field_set,
                self.settings.namespaced,
            )
            .ok()?;
            changes.push(Event::new(
                *rv,
                EventType::Deleted,
                Arc::new(stamped),
                Some(prev.clone()),
            ));
        }
        changes.sort_by_key(|e| e.rv);
        Some(changes)
    }

    /// The state as it was at `rv`, reconstructed by undoing newer history
    /// events; `None` when `rv` is outside `[floor, cache RV]`.
    pub fn snapshot_at(&self, rv: u64) -> Option<Objects> {
        if rv < self.floor || rv > self.rv || !self.synced || self.in_skipped(rv) {
            return None;
        }
        let mut objects = self.objects.clone();
        for event in self.history.iter().rev().take_while(|e| e.rv > rv) {
            let key = event.object.key_arc().clone();
            match (&event.kind, &event.prev) {
                (EventType::Added, _) | (_, None) => {
                    objects.remove(&key);
                }
                (_, Some(prev)) => {
                    objects.insert(key, prev.clone());
                }
            }
        }
        Some(objects)
    }

    /// Whether `rv` lies strictly inside an interval the history skipped
    /// (see `skipped`).
    fn in_skipped(&self, rv: u64) -> bool {
        self.skipped.iter().any(|(from, to)| rv > *from && rv < *to)
    }

    /// Registers a watcher.
    ///
    /// # Errors
    /// [`TooOld`] when `start` is older than the history, or inside an
    /// interval it skipped.
    pub fn register(&mut self, filter: Arc<Filter>, start: Start) -> Result<Registration, TooOld> {
        let (replay, snapshot, min_rv) = match start {
            Start::After(rv) => {
                if rv < self.floor || self.in_skipped(rv) {
                    return Err(TooOld {
                        requested: rv,
                        floor: self.floor,
                    });
                }
                let from = self.history.partition_point(|e| e.rv <= rv);
                (self.history.range(from..).cloned().collect(), None, rv)
            }
            Start::Snapshot => (Vec::new(), Some((self.objects.clone(), self.rv)), self.rv),
        };
        let (tx, rx) = mpsc::channel(self.settings.watcher_buffer.max(1));
        let link = Arc::new(WatcherLink::default());
        let index = filter.index_key(self.settings.node_indexed, self.settings.namespaced);
        let w = &mut self.watchers;
        let filter = w.intern(filter);
        w.next_id += 1;
        let id = w.next_id;
        match &index {
            IndexKey::Name(k) => w.by_name.entry(k.clone()).or_default().insert(id),
            IndexKey::Node(k) => w.by_node.entry(k.clone()).or_default().insert(id),
            IndexKey::Namespace(k) => w.by_namespace.entry(k.clone()).or_default().insert(id),
            IndexKey::None => w.unindexed.insert(id),
        };
        w.entries.insert(
            id,
            Entry {
                filter,
                tx,
                link: link.clone(),
                index,
                min_rv,
            },
        );
        Ok(Registration {
            id,
            rx,
            link,
            replay,
            snapshot,
            min_rv,
        })
    }

    /// Removes a watcher (its stream ended).
    pub fn unregister(&mut self, id: u64) {
        let w = &mut self.watchers;
        let Some(entry) = w.entries.remove(&id) else {
            return;
        };
        if entry.link.lag.lock().take().is_some() {
            w.lagging = w.lagging.saturating_sub(1);
        }
        w.release(&entry.filter);
        let remove = |map: &mut HashMap<Box<str>, HashSet<u64>>, k: &str| {
            if let Some(set) = map.get_mut(k) {
                set.remove(&id);
                if set.is_empty() {
                    map.remove(k);
                }
            }
        };
        match &entry.index {
            IndexKey::Name(k) => remove(&mut w.by_name, k),
            IndexKey::Node(k) => remove(&mut w.by_node, k),
            IndexKey::Namespace(k) => remove(&mut w.by_namespace, k),
            IndexKey::None => {
                w.unindexed.remove(&id);
            }
        }
    }

    /// The next frames for a lagging watcher, at most `max`, read from the
    /// history. When they reach the present, the watcher is live again:
    /// deliveries resume through its buffer.
    pub fn catch_up(&mut self, id: u64, max: usize, now: Instant) -> CatchUp {
        let Some(entry) = self.watchers.entries.get(&id) else {
            return CatchUp::Closed;
        };
        let mut lag = entry.link.lag.lock();
        let Some(current) = *lag else {
            return CatchUp::Frames {
                frames: Vec::new(),
                done: true,
            };
        };
        if current.from_rv <= self.floor {
            drop(lag);
            self.close(id, CloseReason::HistoryOverrun);
            return CatchUp::Closed;
        }
        let from = self.history.partition_point(|e| e.rv < current.from_rv);
        let mut frames = Vec::new();
        let mut next = None;
        for event in self.history.range(from..) {
            if frames.len() >= max {
                next = Some(event.rv);
                break;
            }
            if event.rv <= entry.min_rv {
                continue;
            }
            if let Some(which) = event.which_for(&entry.filter) {
                frames.push(Delivery {
                    rv: event.rv,
                    event: event.clone(),
                    which,
                });
            }
        }
        let done = next.is_none();
        match next {
            Some(rv) => {
                *lag = Some(Lag {
                    since: now,
                    from_rv: rv,
                })
            }
            None => {
                *lag = None;
                drop(lag);
                self.watchers.lagging = self.watchers.lagging.saturating_sub(1);
            }
        }
        CatchUp::Frames { frames, done }
    }

    /// Drops every watcher (cache shutdown).
    pub fn close_all(&mut self) {
        let ids: Vec<u64> = self.watchers.entries.keys().copied().collect();
        for id in ids {
            self.unregister(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apimachinery::selector::LabelSelector;

    fn settings(cap: usize, buffer: usize) -> Settings {
        Settings {
            history_capacity: cap,
            history_max_age: Duration::from_secs(300),
            watcher_buffer: buffer,
            blocked_budget: Duration::from_secs(10),
            node_indexed: true,
            namespaced: true,
            field_set: FieldSet::Pod,
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
        assert_eq!(s.watchers.filters.len(), 2);
        assert_eq!(s.watchers.filters.get(&app("x")), Some(&3));
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
        assert_eq!(s.watchers.filters.len(), 1);
        s.unregister(y.id);
        assert!(s.watchers.filters.is_empty());
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
}
