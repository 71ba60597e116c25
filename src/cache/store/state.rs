//! The objects and bounded history of one resource (`State`): upstream
//! events and bookmarks applied, a relist turned into events (or a reset),
//! snapshots at older RVs, and where a new watcher starts.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use imbl::OrdMap;
use prometheus::IntGauge;
use tokio::sync::mpsc;

use apimachinery::resource::FieldSet;

use crate::cache::event::{Event, EventType};
use crate::cache::filter::Filter;
use crate::cache::object::CachedObject;

use super::pack::{Listed, MIN_STORE_BYTES, Packs, Sparse};
use super::watchers::{CatchUp, Delivery, Outcome, WatcherLink, Watchers};

/// The objects of a resource, by storage key, in the apiserver's order.
pub type Objects = OrdMap<Arc<str>, Arc<CachedObject>>;

/// The storage keys of some of a resource's objects, sorted (the
/// apiserver's order).
pub type Keys = Vec<Arc<str>>;

/// The keys of a pod cache's objects by `spec.nodeName` (`""`: not yet
/// scheduled), the index kube-apiserver's watch cache keeps for pods
/// (`pkg/registry/core/pod/storage`, `NodeNameTriggerFunc` and the
/// `spec.nodeName` indexer) and lists a node's pods from. A node's keys
/// are a sorted vector, 16 bytes a pod (a persistent set took about 0.01×
/// of the pods' JSON more: docs/performance.md, (i)), copied under the
/// lock for a list: a node's pods are a few dozen.
type NodeIndex = HashMap<Arc<str>, Keys>;

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
    /// Where the bytes the history holds beyond the current objects are
    /// counted (`cache_history_bytes`): the versions only it keeps, and
    /// the watch-event frames of its events.
    pub history_bytes: Option<IntGauge>,
}

/// Where a new watcher starts.
#[derive(Debug, Clone)]
pub enum Start {
    /// Every change after this RV, from the history.
    After(u64),
    /// The current state as synthetic `ADDED` events, then changes.
    Snapshot,
    /// The given objects, upstream's state of the watch's selection at the
    /// given RV (a consistent read of them), as synthetic `ADDED` events,
    /// then every change after that RV: from the history if the cache has
    /// passed it, else as the cache reaches it (changes at or below it are
    /// in the objects already, and skipped).
    Given(Objects, u64),
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

/// The state of one resource's cache.
pub struct State {
    settings: Settings,
    objects: Objects,
    /// `Some` when `settings.node_indexed`.
    by_node: Option<NodeIndex>,
    rv: u64,
    history: VecDeque<Arc<Event>>,
    /// When each history event was applied (same length as `history`).
    history_at: VecDeque<Instant>,
    /// The history events before this index have released their frames
    /// (`release_frames`).
    framed_from: usize,
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
    /// The chunks the objects' JSON is packed into.
    packs: Packs,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("rv", &self.rv)
            .field("objects", &self.objects.len())
            .field("history", &self.history.len())
            .field("floor", &self.floor)
            .field("watchers", &self.watchers.count())
            .finish()
    }
}

// === impl State ===

impl State {
    /// An empty, unsynced store.
    pub fn new(settings: Settings) -> State {
        State {
            by_node: settings.node_indexed.then(NodeIndex::new),
            settings,
            objects: Objects::new(),
            rv: 0,
            history: VecDeque::new(),
            history_at: VecDeque::new(),
            framed_from: 0,
            floor: 0,
            skipped: VecDeque::new(),
            synced: false,
            bytes: 0,
            watchers: Watchers::default(),
            packs: Packs::default(),
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

    /// The keys of the current objects a selection can match, when it pins
    /// an index (a pod cache's `spec.nodeName`): a superset of its matches,
    /// to walk instead of every object. `None`: walk them all.
    pub fn candidates(&self, filter: &Filter) -> Option<Keys> {
        let index = self.by_node.as_ref()?;
        let node = filter.fields.requires_exact_match("spec.nodeName")?;
        Some(index.get(node).cloned().unwrap_or_default())
    }

    /// The current objects a selection can match: all of them, or those
    /// under the index it pins ([`State::candidates`]), for a watch's
    /// initial events.
    fn narrowed(&self, filter: &Filter) -> Objects {
        match self.candidates(filter) {
            None => self.objects.clone(),
            Some(keys) => keys
                .iter()
                .filter_map(|k| self.objects.get(k).map(|o| (k.clone(), o.clone())))
                .collect(),
        }
    }

    /// Sets the current objects, wholesale (a first list, or a reset), and
    /// rebuilds the index.
    fn set_objects(&mut self, fresh: Objects) {
        self.objects = fresh;
        if self.by_node.is_some() {
            let mut index = NodeIndex::new();
            // In key order: each node's keys come sorted.
            for (key, o) in &self.objects {
                if let Some(node) = o.field("spec.nodeName") {
                    index.entry(Arc::from(node)).or_default().push(key.clone());
                }
            }
            self.by_node = Some(index);
        }
    }

    /// Moves `key` in the index from `prev`'s node to `next`'s.
    fn reindex(
        &mut self,
        key: &Arc<str>,
        prev: Option<&CachedObject>,
        next: Option<&CachedObject>,
    ) {
        let Some(index) = &mut self.by_node else {
            return;
        };
        let before = prev.and_then(|o| o.field("spec.nodeName"));
        let after = next.and_then(|o| o.field("spec.nodeName"));
        if before == after {
            return;
        }
        if let Some(node) = before
            && let Some(keys) = index.get_mut(node)
        {
            if let Ok(i) = keys.binary_search(key) {
                keys.remove(i);
            }
            if keys.is_empty() {
                index.remove(node);
            }
        }
        if let Some(node) = after {
            match index.get_mut(node) {
                Some(keys) => {
                    if let Err(i) = keys.binary_search(key) {
                        keys.insert(i, key.clone());
                    }
                }
                None => {
                    index.insert(Arc::from(node), vec![key.clone()]);
                }
            }
        }
    }

    /// How the store behaves.
    #[cfg(test)]
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Number of events in the history.
    pub fn history_len(&self) -> usize {
        self.history.len()
    }

    /// Bytes held by the current objects.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The chunks the objects' JSON is packed into (for tests).
    #[cfg(test)]
    pub(super) fn packs(&self) -> &Packs {
        &self.packs
    }

    /// Number of registered watchers.
    pub fn watcher_count(&self) -> usize {
        self.watchers.count()
    }

    /// Applies an upstream event. Events at or below the cache's RV are
    /// ignored (a resumed or duplicate stream).
    pub fn apply(&mut self, kind: EventType, mut object: CachedObject, now: Instant) -> Outcome {
        if object.rv <= self.rv {
            return Outcome {
                stale: true,
                ..Outcome::default()
            };
        }
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
        // A deleted object's last state is only ever in the history.
        let closed = (kind != EventType::Deleted)
            .then(|| self.packs.place(&mut object, self.bytes))
            .flatten();
        let event = Event::new(object.rv, kind, Arc::new(object), prev)
            .counted_in(self.settings.history_bytes.clone());
        let outcome = self.push(Arc::new(event), now);
        if let Some(sparse) = closed {
            self.unpack(sparse);
        }
        outcome
    }

    /// Copies the objects still current in a sparse chunk into allocations
    /// of their own, so that the chunk is freed once the history and
    /// readers drop its old versions (`store::pack`).
    fn unpack(&mut self, sparse: Sparse) {
        for key in sparse.keys {
            let Some(o) = self.objects.get(&key) else {
                continue;
            };
            if o.pack_id() == sparse.id {
                let copy = Arc::new(o.unpacked());
                self.objects.insert(key, copy);
            }
        }
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

    /// Counts `delta` bytes of object versions in `cache_history_bytes`.
    fn account(&self, delta: i64) {
        if let Some(gauge) = &self.settings.history_bytes {
            gauge.add(delta);
        }
    }

    fn push(&mut self, event: Arc<Event>, now: Instant) -> Outcome {
        let mut outcome = Outcome {
            events: 1,
            ..Outcome::default()
        };
        let key = event.object.key_arc().clone();
        let mut sparse = None;
        if let Some(prev) = &event.prev {
            self.bytes = self.bytes.saturating_sub(prev.heap_size());
            if prev.pack_id() != 0 {
                sparse = self.packs.left(prev.pack_id());
            }
        }
        match event.kind {
            EventType::Deleted => {
                self.objects.remove(&key);
                self.reindex(&key, event.prev.as_deref(), None);
            }
            EventType::Added | EventType::Modified => {
                self.bytes += event.object.heap_size();
                self.reindex(&key, event.prev.as_deref(), Some(&event.object));
                self.objects.insert(key, event.object.clone());
            }
        }
        if let Some(sparse) = sparse {
            self.unpack(sparse);
        }
        self.rv = event.rv;
        self.watchers.dispatch(
            &event,
            now,
            self.settings.node_indexed,
            self.settings.blocked_budget,
            &mut outcome,
        );
        self.account(event.retained_size() as i64);
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
            self.account(-(old.retained_size() as i64));
            self.history_at.pop_front();
            self.framed_from = self.framed_from.saturating_sub(1);
            self.floor = old.rv;
            while self
                .skipped
                .front()
                .is_some_and(|(_, to)| *to <= self.floor)
            {
                self.skipped.pop_front();
            }
            self.watchers.close_overrun(self.floor, &mut outcome);
        }
        self.release_frames(now);
        outcome
    }

    /// Drops the watch-event frames of history events applied more than
    /// the blocked budget before `now`. Frames are shared while the
    /// watchers an event was dispatched to write it, within milliseconds;
    /// a watcher still behind it after the blocked budget is catching up
    /// from the history (or about to be closed as blocked). Kept longer,
    /// they would only sit in memory for the rest of the history's window
    /// (in a node proxy's EndpointSlice history, a third of its bytes:
    /// docs/performance.md (k)). A watcher that reads the event later
    /// encodes them again, once, and the event keeps them for the others
    /// (watches resuming with it).
    pub fn release_frames(&mut self, now: Instant) {
        let Some(before) = now.checked_sub(self.settings.blocked_budget) else {
            return;
        };
        while self
            .history_at
            .get(self.framed_from)
            .is_some_and(|at| *at < before)
        {
            self.history[self.framed_from].release_frames();
            self.framed_from += 1;
        }
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
    pub fn replace(&mut self, listed: impl Into<Listed>, list_rv: u64, now: Instant) -> Outcome {
        let (items, packs) = listed.into().into_parts();
        let mut fresh = Objects::new();
        // The first fill of 1 MiB or more is the whole store: its objects
        // are packed, best as the list was read (`Listed::packed`), so
        // that they are not copied again here under the lock. A smaller
        // first fill, and a later list's (after `410 Gone`, a rare event),
        // keep their own allocations, whether its changes enter the store
        // as events or it resets the store: packing would copy the list
        // again under the lock, before it is known which objects stay.
        let total: usize = items.iter().map(|o| o.json().len()).sum();
        let pack = !self.synced && total >= MIN_STORE_BYTES;
        if pack && let Some(packs) = packs {
            // Nothing was packed before the first fill: the list's chunks
            // are the store's, their ids its own.
            self.packs = packs;
        }
        for mut item in items {
            if pack && item.pack_id() == 0 {
                // Every object of the fill is current: no chunk is sparse.
                let _ = self.packs.place(&mut item, total);
            } else if !pack && item.pack_id() != 0 {
                item = item.unpacked();
            }
            let item = Arc::new(item);
            fresh.insert(item.key_arc().clone(), item);
        }
        if !self.synced {
            self.bytes = fresh.values().map(|o| o.heap_size()).sum();
            self.set_objects(fresh);
            self.rv = list_rv;
            self.floor = list_rv;
            self.synced = true;
            return Outcome::default();
        }
        // A list below the cache's RV (upstream's history went back) has
        // no free RVs to give its difference: the cache starts over.
        let changes = if list_rv < self.rv {
            None
        } else {
            self.diff(&fresh, list_rv)
        };
        match changes {
            Some(changes) => {
                let mut outcome = Outcome::default();
                let from = self.rv;
                // A watcher already past the cache's RV (it resumed from
                // an RV it got elsewhere: another process, a newer
                // snapshot) holds a state the difference was not computed
                // from: it is closed, and its client's re-watch goes
                // upstream (`skipped`).
                self.watchers.close_between(from, list_rv, &mut outcome);
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
                self.packs.clear();
                self.watchers.reset(&mut outcome);
                self.bytes = fresh.values().map(|o| o.heap_size()).sum();
                self.set_objects(fresh);
                let retained: usize = self.history.iter().map(|e| e.retained_size()).sum();
                self.account(-(retained as i64));
                self.history.clear();
                self.history_at.clear();
                self.framed_from = 0;
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
                changes.push(
                    Event::new(obj.rv, kind, obj.clone(), prev.cloned())
                        .counted_in(self.settings.history_bytes.clone()),
                );
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
            changes.push(
                Event::new(*rv, kind, obj, prev).counted_in(self.settings.history_bytes.clone()),
            );
        }
        for (prev, rv) in gone.into_iter().zip(gone_slots) {
            let stamped = CachedObject::from_json(
                &prev.with_resource_version(*rv),
                self.settings.field_set,
                self.settings.namespaced,
            )
            .ok()?;
            changes.push(
                Event::new(
                    *rv,
                    EventType::Deleted,
                    Arc::new(stamped),
                    Some(prev.clone()),
                )
                .counted_in(self.settings.history_bytes.clone()),
            );
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
        self.skipped_to(rv).is_some()
    }

    /// The end of the interval the history skipped that `rv` lies strictly
    /// inside, if any: where a client there may resume from.
    fn skipped_to(&self, rv: u64) -> Option<u64> {
        self.skipped
            .iter()
            .filter(|(from, to)| rv > *from && rv < *to)
            .map(|(_, to)| *to)
            .max()
    }

    /// Disowns the resourceVersions strictly between `from` and the
    /// cache's RV: after a crash, the cache resumed from a snapshot at
    /// `from` and has caught up with upstream since, but the events it
    /// received in between need not be those the crashed process served
    /// (behind a tier, another replica's relist gives deletions other free
    /// resourceVersions), and what that process served is lost with it. A
    /// watch or exact read from inside them is too old (`register`,
    /// `snapshot_at`), and the watchers already waiting there are closed,
    /// as a restarted kube-apiserver's watch cache starts its window at
    /// its first list. Returns the cache's RV.
    pub fn disown_since(&mut self, from: u64) -> (u64, Outcome) {
        let mut outcome = Outcome::default();
        let to = self.rv;
        if to > from + 1 {
            self.watchers.close_between(from, to, &mut outcome);
            if !self.skipped.contains(&(from, to)) {
                self.skipped.push_back((from, to));
            }
        }
        (to, outcome)
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
                    return Err(self.too_old(rv));
                }
                let from = self.history.partition_point(|e| e.rv <= rv);
                (self.history.range(from..).cloned().collect(), None, rv)
            }
            Start::Snapshot => (Vec::new(), Some((self.narrowed(&filter), self.rv)), self.rv),
            Start::Given(objects, rv) => {
                if rv < self.floor || self.in_skipped(rv) {
                    return Err(self.too_old(rv));
                }
                let from = self.history.partition_point(|e| e.rv <= rv);
                (
                    self.history.range(from..).cloned().collect(),
                    Some((objects, rv)),
                    rv,
                )
            }
        };
        let index = filter.index_key(self.settings.node_indexed, self.settings.namespaced);
        let (id, rx, link) =
            self.watchers
                .register(filter, index, min_rv, self.settings.watcher_buffer);
        Ok(Registration {
            id,
            rx,
            link,
            replay,
            snapshot,
            min_rv,
        })
    }

    /// Why a watch cannot start from `rv`: the oldest RV it could start
    /// from instead is the history's floor, or the end of the interval
    /// skipped around `rv`.
    fn too_old(&self, rv: u64) -> TooOld {
        TooOld {
            requested: rv,
            floor: self.skipped_to(rv).unwrap_or(self.floor),
        }
    }

    /// Removes a watcher (its stream ended).
    pub fn unregister(&mut self, id: u64) {
        self.watchers.unregister(id);
    }

    /// The next frames for a lagging watcher, at most `max`, read from the
    /// history. When they reach the present, the watcher is live again:
    /// deliveries resume through its buffer.
    pub fn catch_up(&mut self, id: u64, max: usize, now: Instant) -> CatchUp {
        self.watchers
            .catch_up(id, max, now, &self.history, self.floor)
    }

    /// Drops every watcher (cache shutdown).
    pub fn close_all(&mut self) {
        self.watchers.close_all();
    }

    /// The distinct filters of the watchers and how many use each.
    #[cfg(test)]
    pub(super) fn filters(&self) -> &std::collections::HashMap<Arc<Filter>, usize> {
        self.watchers.filters()
    }
}
