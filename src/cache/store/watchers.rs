//! The watchers of one resource and their dispatch index: registration,
//! equal selectors shared as one filter, each event queued to the watchers
//! it concerns without blocking, and the catch-up or closing of lagging ones.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::cache::event::{Event, Which};
use crate::cache::filter::{Filter, IndexKey};

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

struct Entry {
    filter: Arc<Filter>,
    tx: mpsc::Sender<Delivery>,
    link: Arc<WatcherLink>,
    index: IndexKey,
    min_rv: u64,
}

/// Watchers and their dispatch index.
#[derive(Default)]
pub(super) struct Watchers {
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

// === impl Watchers ===

impl Watchers {
    /// Number of registered watchers.
    pub(super) fn count(&self) -> usize {
        self.entries.len()
    }

    /// The distinct filters and how many watchers use each.
    #[cfg(test)]
    pub(super) fn filters(&self) -> &HashMap<Arc<Filter>, usize> {
        &self.filters
    }

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

    /// Adds a watcher under `index` with a buffer of `buffer` deliveries;
    /// deliveries with an RV at or below `min_rv` are skipped.
    pub(super) fn register(
        &mut self,
        filter: Arc<Filter>,
        index: IndexKey,
        min_rv: u64,
        buffer: usize,
    ) -> (u64, mpsc::Receiver<Delivery>, Arc<WatcherLink>) {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        let link = Arc::new(WatcherLink::default());
        let filter = self.intern(filter);
        self.next_id += 1;
        let id = self.next_id;
        match &index {
            IndexKey::Name(k) => self.by_name.entry(k.clone()).or_default().insert(id),
            IndexKey::Node(k) => self.by_node.entry(k.clone()).or_default().insert(id),
            IndexKey::Namespace(k) => self.by_namespace.entry(k.clone()).or_default().insert(id),
            IndexKey::None => self.unindexed.insert(id),
        };
        self.entries.insert(
            id,
            Entry {
                filter,
                tx,
                link: link.clone(),
                index,
                min_rv,
            },
        );
        (id, rx, link)
    }

    /// Removes a watcher (its stream ended).
    pub(super) fn unregister(&mut self, id: u64) {
        let Some(entry) = self.entries.remove(&id) else {
            return;
        };
        if entry.link.lag.lock().take().is_some() {
            self.lagging = self.lagging.saturating_sub(1);
        }
        self.release(&entry.filter);
        let remove = |map: &mut HashMap<Box<str>, HashSet<u64>>, k: &str| {
            if let Some(set) = map.get_mut(k) {
                set.remove(&id);
                if set.is_empty() {
                    map.remove(k);
                }
            }
        };
        match &entry.index {
            IndexKey::Name(k) => remove(&mut self.by_name, k),
            IndexKey::Node(k) => remove(&mut self.by_node, k),
            IndexKey::Namespace(k) => remove(&mut self.by_namespace, k),
            IndexKey::None => {
                self.unindexed.remove(&id);
            }
        }
    }

    /// Queues `event` to every watcher it concerns, found through the
    /// index (by `spec.nodeName` when `node_indexed`). A watcher whose
    /// buffer is full is marked lagging; one lagging for longer than
    /// `blocked_budget` is closed.
    pub(super) fn dispatch(
        &mut self,
        event: &Arc<Event>,
        now: Instant,
        node_indexed: bool,
        blocked_budget: Duration,
        outcome: &mut Outcome,
    ) {
        let mut candidates: Vec<u64> = Vec::new();
        {
            let mut take = |set: Option<&HashSet<u64>>| {
                if let Some(set) = set {
                    candidates.extend(set.iter().copied());
                }
            };
            let obj = &event.object;
            take(self.by_name.get(obj.key()));
            take(self.by_namespace.get(obj.namespace()));
            if node_indexed {
                let node = obj.field("spec.nodeName").unwrap_or("");
                take(self.by_node.get(node));
                if let Some(prev_node) = event.prev.as_ref().and_then(|p| p.field("spec.nodeName"))
                    && prev_node != node
                {
                    take(self.by_node.get(prev_node));
                }
            }
            candidates.extend(self.unindexed.iter().copied());
        }
        let mut to_close: Vec<(u64, CloseReason)> = Vec::new();
        let mut to_remove: Vec<u64> = Vec::new();
        let mut decisions = Decisions::default();
        for id in candidates {
            let Some(entry) = self.entries.get(&id) else {
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
                if now.saturating_duration_since(l.since) > blocked_budget {
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
                    self.lagging += 1;
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

    /// Closes the lagging watchers whose resume point is at or below
    /// `floor`, the history's new floor.
    pub(super) fn close_overrun(&mut self, floor: u64, outcome: &mut Outcome) {
        if self.lagging == 0 {
            return;
        }
        let overrun: Vec<u64> = self
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

    /// Closes (`Reset`) the watchers that start strictly between `from`
    /// and `to`.
    pub(super) fn close_between(&mut self, from: u64, to: u64, outcome: &mut Outcome) {
        let ahead: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.min_rv > from && e.min_rv < to)
            .map(|(id, _)| *id)
            .collect();
        for id in ahead {
            self.close(id, CloseReason::Reset);
            outcome.closed(CloseReason::Reset);
        }
    }

    /// Closes (`Reset`) every watcher.
    pub(super) fn reset(&mut self, outcome: &mut Outcome) {
        let ids: Vec<u64> = self.entries.keys().copied().collect();
        for id in ids {
            self.close(id, CloseReason::Reset);
            outcome.closed(CloseReason::Reset);
        }
    }

    fn close(&mut self, id: u64, reason: CloseReason) {
        if let Some(entry) = self.entries.get(&id) {
            entry.link.closed.store(reason.code(), Ordering::Release);
        }
        self.unregister(id);
    }

    /// The next frames for a lagging watcher, at most `max`, read from
    /// `history`, whose floor is `floor`. When they reach the present, the
    /// watcher is live again: deliveries resume through its buffer.
    pub(super) fn catch_up(
        &mut self,
        id: u64,
        max: usize,
        now: Instant,
        history: &VecDeque<Arc<Event>>,
        floor: u64,
    ) -> CatchUp {
        let Some(entry) = self.entries.get(&id) else {
            return CatchUp::Closed;
        };
        let mut lag = entry.link.lag.lock();
        let Some(current) = *lag else {
            return CatchUp::Frames {
                frames: Vec::new(),
                done: true,
            };
        };
        if current.from_rv <= floor {
            drop(lag);
            self.close(id, CloseReason::HistoryOverrun);
            return CatchUp::Closed;
        }
        let from = history.partition_point(|e| e.rv < current.from_rv);
        let mut frames = Vec::new();
        let mut next = None;
        for event in history.range(from..) {
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
                self.lagging = self.lagging.saturating_sub(1);
            }
        }
        CatchUp::Frames { frames, done }
    }

    /// Drops every watcher (cache shutdown).
    pub(super) fn close_all(&mut self) {
        let ids: Vec<u64> = self.entries.keys().copied().collect();
        for id in ids {
            self.unregister(id);
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
