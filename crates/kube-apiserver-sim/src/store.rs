//! The object store: one global resourceVersion counter, objects per
//! resource in storage-key order, a bounded history of events per resource,
//! and the watchers each write is dispatched to.
//!
//! One mutex guards everything. Writers bump the RV, append the event and
//! hand it to every watcher while holding it, and a watcher is registered
//! (and reads the history or the snapshot it starts from) while holding it
//! too, so a watch can neither miss nor duplicate an event.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::object;
use super::resources::ResourceSpec;
use apimachinery::status::Status;

pub use apimachinery::watch::EventType;

/// One change to one object.
#[derive(Debug)]
pub struct Event {
    /// The RV the write produced.
    pub rv: u64,
    pub kind: EventType,
    /// Storage key (`ns/name` or `name`).
    pub key: String,
    /// The new state; for a delete, the last state with the delete's RV.
    pub object: Arc<Value>,
    /// The state before the write (with its own RV), if there was one.
    pub prev: Option<Arc<Value>>,
    /// What every watcher would otherwise recompute: selector attributes
    /// and encoded lines, computed once per event.
    pub cache: EventCache,
}

/// Per-event values shared by all watchers.
#[derive(Debug, Default)]
pub struct EventCache {
    /// Labels and selectable fields of `object` and of `prev`.
    pub object_attrs: OnceLock<Attrs>,
    pub prev_attrs: OnceLock<Attrs>,
    /// The JSON watch line `{"type":T,"object":object}` per event type.
    pub lines: [OnceLock<Bytes>; 3],
}

/// An object's labels and selectable fields.
#[derive(Debug, Clone, Default)]
pub struct Attrs {
    pub labels: Vec<(String, String)>,
    pub fields: Vec<(&'static str, String)>,
}

/// Objects with their storage keys, in key order.
pub type Keyed = Vec<(String, Arc<Value>)>;

/// Where a watcher receives the events of one resource.
pub type Watcher = mpsc::Sender<Arc<Event>>;

/// Events a watcher may queue before it is dropped as too slow (the
/// apiserver closes watchers that cannot keep up rather than block writers).
pub const WATCHER_QUEUE: usize = 4096;

/// What a write does, decided by the caller from the current object.
#[derive(Debug)]
pub enum Mutation {
    /// Store this object (create or replace). Its RV is set by the store.
    Put(Value),
    /// Delete the current object.
    Delete,
    /// Nothing changed: no RV bump, no event (like etcd's no-op updates).
    Unchanged,
}

/// Where a new watch starts.
#[derive(Debug, Clone, Copy)]
pub enum WatchFrom {
    /// Synthetic `ADDED` events for the current state, then changes.
    Snapshot,
    /// Every change with an RV greater than this one.
    After(u64),
    /// Changes after the RV at registration, nothing before.
    Now,
}

/// What a newly registered watcher must send before live events.
#[derive(Debug)]
pub enum Initial {
    /// The current objects (for `WatchFrom::Snapshot`), in key order.
    Objects(Vec<Arc<Value>>),
    /// Past events (for `WatchFrom::After`), oldest first.
    Events(Vec<Arc<Event>>),
}

/// A registered watcher's starting point.
#[derive(Debug)]
pub struct Registered {
    /// The global RV at registration.
    pub rv: u64,
    pub initial: Initial,
}

/// A resourceVersion older than the retained history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld {
    /// The oldest RV a watch can still start from.
    pub oldest: u64,
}

#[derive(Debug)]
struct Collection {
    objects: BTreeMap<String, Arc<Value>>,
    history: VecDeque<Arc<Event>>,
    /// Oldest resumable RV while no event has been evicted: the RV the
    /// store started at or was last compacted to.
    start_rv: u64,
    /// RV of the last event evicted from `history`, 0 if none.
    last_evicted: u64,
    watchers: Vec<Watcher>,
}

#[derive(Debug)]
struct Inner {
    rv: u64,
    /// The RV new collections start at (initial RV, or the last compaction).
    base_rv: u64,
    collections: HashMap<(String, String), Collection>,
}

/// The store.
#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    rv_tx: watch::Sender<u64>,
    history_limit: usize,
}

// === impl Collection ===

impl Collection {
    fn new(start_rv: u64) -> Self {
        Collection {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            start_rv,
            last_evicted: 0,
            watchers: Vec::new(),
        }
    }

    /// The smallest RV a watch can start from (the `M` of
    /// `too old resource version: N (M)`).
    fn oldest_resumable(&self) -> u64 {
        if self.last_evicted == 0 {
            return self.start_rv;
        }
        self.history
            .front()
            .map_or(self.last_evicted, |e| e.rv.saturating_sub(1))
    }

    /// The objects as they were at `rv`, rebuilt by undoing newer events.
    fn state_at(&self, rv: u64) -> Result<BTreeMap<String, Arc<Value>>, TooOld> {
        let oldest = self.oldest_resumable();
        if rv < oldest {
            return Err(TooOld { oldest });
        }
        let mut state = self.objects.clone();
        for event in self.history.iter().rev().take_while(|e| e.rv > rv) {
            match (&event.kind, &event.prev) {
                (EventType::Added, _) => {
                    state.remove(&event.key);
                }
                (_, Some(prev)) => {
                    state.insert(event.key.clone(), prev.clone());
                }
                (_, None) => {}
            }
        }
        Ok(state)
    }

    fn push(&mut self, event: Arc<Event>, limit: usize) {
        self.history.push_back(event.clone());
        while self.history.len() > limit {
            if let Some(old) = self.history.pop_front() {
                self.last_evicted = old.rv;
            }
        }
        // A full or closed queue drops the watcher: its stream then ends.
        self.watchers.retain(|w| w.try_send(event.clone()).is_ok());
    }
}

// === impl Store ===

impl Store {
    /// An empty store whose RV starts at `initial_rv`, keeping
    /// `history_limit` events per resource.
    pub fn new(initial_rv: u64, history_limit: usize) -> Self {
        let (rv_tx, _) = watch::channel(initial_rv);
        Store {
            inner: Mutex::new(Inner {
                rv: initial_rv,
                base_rv: initial_rv,
                collections: HashMap::new(),
            }),
            rv_tx,
            history_limit,
        }
    }

    /// The current global RV.
    pub fn current_rv(&self) -> u64 {
        self.inner.lock().rv
    }

    /// Waits until the global RV reaches `rv`, at most `timeout`. Returns
    /// whether it did.
    pub async fn wait_for_rv(&self, rv: u64, timeout: Duration) -> bool {
        let mut rx = self.rv_tx.subscribe();
        if *rx.borrow() >= rv {
            return true;
        }
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|v| *v >= rv)).await,
            Ok(Ok(_))
        )
    }

    /// Applies the mutation `decide` returns for the object at `key`.
    /// Returns the stored (or deleted, or unchanged) object.
    ///
    /// # Errors
    /// Whatever `decide` returns; a `Delete` of a missing object is a 404.
    pub fn mutate<F>(&self, spec: &ResourceSpec, key: &str, decide: F) -> Result<Arc<Value>, Status>
    where
        F: FnOnce(Option<&Arc<Value>>) -> Result<Mutation, Status>,
    {
        let mut inner = self.inner.lock();
        let base = inner.base_rv;
        let next = inner.rv + 1;
        let coll = inner
            .collections
            .entry((spec.group.clone(), spec.resource.clone()))
            .or_insert_with(|| Collection::new(base));
        let prev = coll.objects.get(key).cloned();
        let event = match decide(prev.as_ref())? {
            Mutation::Unchanged => {
                return prev.ok_or_else(|| Status::internal("no object to leave unchanged"));
            }
            Mutation::Put(mut obj) => {
                object::set_meta(&mut obj, "resourceVersion", Value::String(next.to_string()));
                let obj = Arc::new(object::normalize(spec, obj));
                coll.objects.insert(key.to_string(), obj.clone());
                Event {
                    cache: EventCache::default(),
                    rv: next,
                    kind: if prev.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    },
                    key: key.to_string(),
                    object: obj,
                    prev,
                }
            }
            Mutation::Delete => {
                let Some(prev) = prev else {
                    let (_, name) = split_key(spec, key);
                    return Err(Status::not_found(&spec.group, &spec.resource, name));
                };
                coll.objects.remove(key);
                Event {
                    cache: EventCache::default(),
                    rv: next,
                    kind: EventType::Deleted,
                    key: key.to_string(),
                    object: Arc::new(object::with_rv(&prev, next)),
                    prev: Some(prev),
                }
            }
        };
        let event = Arc::new(event);
        coll.push(event.clone(), self.history_limit);
        inner.rv = next;
        self.rv_tx.send_replace(next);
        Ok(event.object.clone())
    }

    /// The object at `key`.
    pub fn get(&self, spec: &ResourceSpec, key: &str) -> Option<Arc<Value>> {
        let inner = self.inner.lock();
        inner
            .collections
            .get(&(spec.group.clone(), spec.resource.clone()))
            .and_then(|c| c.objects.get(key).cloned())
    }

    /// The objects whose key starts with `prefix` and is at least `start`,
    /// in key order, as of `at` (exactly) or now, with the RV of the read
    /// (`at`, or the current RV).
    ///
    /// # Errors
    /// [`TooOld`] when `at` predates the retained history.
    pub fn list(
        &self,
        spec: &ResourceSpec,
        at: Option<u64>,
        prefix: &str,
        start: Option<&str>,
    ) -> Result<(u64, Keyed), TooOld> {
        let inner = self.inner.lock();
        let rv = at.unwrap_or(inner.rv);
        let Some(coll) = inner
            .collections
            .get(&(spec.group.clone(), spec.resource.clone()))
        else {
            if rv < inner.base_rv {
                return Err(TooOld {
                    oldest: inner.base_rv,
                });
            }
            return Ok((rv, Vec::new()));
        };
        let lower = start.unwrap_or(prefix).max(prefix).to_string();
        let collect = |m: &BTreeMap<String, Arc<Value>>| {
            m.range::<String, _>((Bound::Included(&lower), Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>()
        };
        let items = match at {
            None => collect(&coll.objects),
            Some(at) => collect(&coll.state_at(at)?),
        };
        Ok((rv, items))
    }

    /// Registers `watcher` for `spec`'s events after computing what it must
    /// send first, all under the store lock. `prefix` limits the initial
    /// objects/events to keys under it (a namespace).
    ///
    /// # Errors
    /// [`TooOld`] when `WatchFrom::After(n)` predates the retained history.
    pub fn watch(
        &self,
        spec: &ResourceSpec,
        from: WatchFrom,
        prefix: &str,
        watcher: Watcher,
    ) -> Result<Registered, TooOld> {
        let mut inner = self.inner.lock();
        let rv = inner.rv;
        let base = inner.base_rv;
        let coll = inner
            .collections
            .entry((spec.group.clone(), spec.resource.clone()))
            .or_insert_with(|| Collection::new(base));
        let initial = match from {
            WatchFrom::Snapshot => Initial::Objects(
                coll.objects
                    .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .map(|(_, v)| v.clone())
                    .collect(),
            ),
            WatchFrom::Now => Initial::Events(Vec::new()),
            WatchFrom::After(n) => {
                let oldest = coll.oldest_resumable();
                if n < oldest {
                    return Err(TooOld { oldest });
                }
                Initial::Events(
                    coll.history
                        .iter()
                        .filter(|e| e.rv > n && e.key.starts_with(prefix))
                        .cloned()
                        .collect(),
                )
            }
        };
        coll.watchers.push(watcher);
        Ok(Registered { rv, initial })
    }

    /// Runs `f` over the current objects of `group`/`resource`.
    pub fn scan<R>(
        &self,
        group: &str,
        resource: &str,
        f: impl FnOnce(&mut dyn Iterator<Item = &Value>) -> R,
    ) -> R {
        let inner = self.inner.lock();
        let mut iter = inner
            .collections
            .get(&(group.to_string(), resource.to_string()))
            .into_iter()
            .flat_map(|c| c.objects.values().map(|v| v.as_ref()));
        f(&mut iter)
    }

    /// Forgets all history: watches and exact reads from any RV older than
    /// now get 410.
    pub fn compact(&self) {
        let mut inner = self.inner.lock();
        let rv = inner.rv;
        inner.base_rv = rv;
        for coll in inner.collections.values_mut() {
            coll.history.clear();
            coll.start_rv = rv;
            coll.last_evicted = 0;
        }
    }
}

/// The objects of every resource at one resourceVersion: what an etcd
/// backup holds ([`Store::backup`], [`Store::restore`]).
#[derive(Debug, Clone)]
pub struct Backup {
    rv: u64,
    objects: HashMap<(String, String), BTreeMap<String, Arc<Value>>>,
}

impl Backup {
    /// The resourceVersion it was taken at.
    pub fn rv(&self) -> u64 {
        self.rv
    }
}

impl Store {
    /// The objects of every resource now, and the resourceVersion.
    pub fn backup(&self) -> Backup {
        let inner = self.inner.lock();
        Backup {
            rv: inner.rv,
            objects: inner
                .collections
                .iter()
                .map(|(k, c)| (k.clone(), c.objects.clone()))
                .collect(),
        }
    }

    /// Puts the store back to `backup`, as etcd restored from a snapshot
    /// without `--bump-revision`: the resourceVersion goes back to the
    /// backup's, the history after it is gone (a watch from below it gets
    /// `410`; one from above it waits for the new history, as a restarted
    /// kube-apiserver's does), and the next writes reuse the
    /// resourceVersions the lost history gave. Open watches are dropped
    /// (the apiserver restarts).
    pub fn restore(&self, backup: &Backup) {
        let mut inner = self.inner.lock();
        inner.rv = backup.rv;
        inner.base_rv = backup.rv;
        for (key, coll) in inner.collections.iter_mut() {
            coll.objects = backup.objects.get(key).cloned().unwrap_or_default();
            coll.history.clear();
            coll.start_rv = backup.rv;
            coll.last_evicted = 0;
            coll.watchers.clear();
        }
        self.rv_tx.send_replace(backup.rv);
    }
}

/// Splits a storage key into namespace and name.
pub fn split_key<'a>(spec: &ResourceSpec, key: &'a str) -> (&'a str, &'a str) {
    if spec.namespaced {
        key.split_once('/').unwrap_or(("", key))
    } else {
        ("", key)
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
