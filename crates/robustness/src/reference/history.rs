//! One resource's history: the base state, the changes in revision
//! order, each key's versions, and checkpoints of the whole state.

use std::collections::{BTreeMap, HashMap};

use crate::model::{Filter, ObjectKey};

use super::version::{Change, Version};

/// Changes between two checkpoints (at least; more when the state holds
/// more objects than this).
const CHECKPOINT_EVERY: usize = 1000;

/// The state of a resource after a number of its changes.
#[derive(Debug)]
pub(super) struct Checkpoint {
    /// How many changes are applied.
    count: usize,
    /// The revision of the last applied change (the start revision for
    /// the base state).
    rev: u64,
    state: BTreeMap<ObjectKey, Version>,
}

/// One entry of a key's history: from revision `rev` on, the key held
/// `version` (`None`: it did not exist).
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) rev: u64,
    pub(super) version: Option<Version>,
}

/// One resource's history.
#[derive(Debug)]
pub(super) struct History {
    /// Sorted by revision; the first is the base state.
    pub(super) checkpoints: Vec<Checkpoint>,
    /// Sorted by revision.
    pub(super) changes: Vec<Change>,
    /// The state after every change.
    pub(super) current: BTreeMap<ObjectKey, Version>,
    /// Each key's entries, sorted by revision.
    pub(super) keys: HashMap<ObjectKey, Vec<Entry>>,
}

impl History {
    pub(super) fn new(start: u64, state: BTreeMap<ObjectKey, Version>) -> History {
        let mut keys: HashMap<ObjectKey, Vec<Entry>> = HashMap::new();
        for (key, version) in &state {
            keys.insert(
                key.clone(),
                vec![Entry {
                    rev: version.rv,
                    version: Some(version.clone()),
                }],
            );
        }
        History {
            checkpoints: vec![Checkpoint {
                count: 0,
                rev: start,
                state: state.clone(),
            }],
            changes: Vec::new(),
            current: state,
            keys,
        }
    }

    pub(super) fn push(&mut self, change: Change) {
        match &change.new {
            Some(v) => {
                self.current.insert(change.key.clone(), v.clone());
            }
            None => {
                self.current.remove(&change.key);
            }
        }
        self.keys
            .entry(change.key.clone())
            .or_default()
            .push(Entry {
                rev: change.rev,
                version: change.new.clone(),
            });
        let rev = change.rev;
        self.changes.push(change);
        let since = self
            .checkpoints
            .last()
            .map_or(0, |c| self.changes.len() - c.count);
        if since >= CHECKPOINT_EVERY.max(self.current.len()) {
            self.checkpoints.push(Checkpoint {
                count: self.changes.len(),
                rev,
                state: self.current.clone(),
            });
        }
    }

    /// Index of the first change after `rev`.
    pub(super) fn after(&self, rev: u64) -> usize {
        self.changes.partition_point(|c| c.rev <= rev)
    }

    pub(super) fn state_at(&self, filter: &Filter, rev: u64) -> BTreeMap<ObjectKey, u64> {
        let i = self.checkpoints.partition_point(|c| c.rev <= rev);
        let Some(cp) = self.checkpoints.get(i.saturating_sub(1)) else {
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        let selected =
            |(k, v): (&ObjectKey, &Version)| v.selected(filter).then(|| (k.clone(), v.rv));
        match &filter.namespace {
            Some(ns) => out.extend(
                cp.state
                    .range(ObjectKey::new(ns, "")..)
                    .take_while(|(k, _)| &k.namespace == ns)
                    .filter_map(selected),
            ),
            None => out.extend(cp.state.iter().filter_map(selected)),
        }
        for c in self.changes[cp.count..].iter().take_while(|c| c.rev <= rev) {
            match &c.new {
                Some(v) if v.selected(filter) => {
                    out.insert(c.key.clone(), v.rv);
                }
                _ => {
                    out.remove(&c.key);
                }
            }
        }
        out
    }
}
