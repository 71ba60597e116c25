//! What a watcher should have seen, from the reference: the state at a
//! revision, the watch events of a range of revisions, and point queries
//! on one key's versions.

use std::collections::BTreeMap;

use crate::model::{Filter, Kind, ObjectKey, Resource};

use super::history::Entry;
use super::record::Reference;
use super::version::{Change, Version};

/// The watch events of a range of changes for one filter, computed as
/// they are read (see [`Reference::expected_iter`]).
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    changes: std::slice::Iter<'a, Change>,
    filter: &'a Filter,
    to: u64,
}

impl Iterator for Expected<'_> {
    type Item = (Kind, ObjectKey, u64);

    fn next(&mut self) -> Option<Self::Item> {
        for c in self.changes.by_ref() {
            if c.rev > self.to {
                self.changes = [].iter();
                return None;
            }
            if let Some(e) = c.event(self.filter) {
                return Some(e);
            }
        }
        None
    }
}

impl Reference {
    /// The state of `filter.resource` at revision `rev`, restricted to the
    /// objects `filter` selects: key -> resourceVersion. `rev` is clamped
    /// to `start..=head`.
    pub fn state_at(&self, filter: &Filter, rev: u64) -> BTreeMap<ObjectKey, u64> {
        let rev = rev.clamp(self.start, self.head());
        self.histories
            .get(&filter.resource)
            .map(|h| h.state_at(filter, rev))
            .unwrap_or_default()
    }

    /// The watch events kube-apiserver sends a watcher with `filter` for
    /// the changes in `(from, to]`, in order, as (kind, key,
    /// resourceVersion): a create that matches is `ADDED`; an update is
    /// `MODIFIED` if the old and the new object match, `ADDED` if only the
    /// new one does, `DELETED` (at the update's revision) if only the old
    /// one does, nothing if neither; a delete whose previous object matches
    /// is `DELETED` at the delete's revision.
    pub fn expected(&self, filter: &Filter, from: u64, to: u64) -> Vec<(Kind, ObjectKey, u64)> {
        self.expected_iter(filter, from, to).collect()
    }

    /// [`Reference::expected`], computed as it is read.
    pub fn expected_iter<'a>(&'a self, filter: &'a Filter, from: u64, to: u64) -> Expected<'a> {
        let changes = match self.histories.get(&filter.resource) {
            Some(h) => h.changes[h.after(from)..].iter(),
            None => [].iter(),
        };
        Expected {
            changes,
            filter,
            to,
        }
    }

    /// The changes of `resource` in `(from, to]`, in order.
    pub fn changes(&self, resource: Resource, from: u64, to: u64) -> &[Change] {
        match self.histories.get(&resource) {
            Some(h) => &h.changes[h.after(from)..h.after(to.max(from))],
            None => &[],
        }
    }

    /// The version of `key` in effect at `rev` (`None` if it did not exist,
    /// or the reference does not know: before the start, for an object
    /// created earlier and changed since).
    pub fn version_at(&self, resource: Resource, key: &ObjectKey, rev: u64) -> Option<&Version> {
        let entries = self.histories.get(&resource)?.keys.get(key)?;
        let i = entries.partition_point(|e| e.rev <= rev);
        entries.get(i.checked_sub(1)?)?.version.as_ref()
    }

    /// Whether `key` ever had resourceVersion `rv` (a PUT at that revision,
    /// or in the state at the start).
    pub fn has_version(&self, resource: Resource, key: &ObjectKey, rv: u64) -> bool {
        self.entry_at(resource, key, rv)
            .is_some_and(|e| e.version.as_ref().is_some_and(|v| v.rv == rv))
    }

    /// Whether `key` changed at revision `rev` (a PUT or a DELETE).
    pub fn has_change(&self, resource: Resource, key: &ObjectKey, rev: u64) -> bool {
        self.entry_at(resource, key, rev).is_some()
    }

    fn entry_at(&self, resource: Resource, key: &ObjectKey, rev: u64) -> Option<&Entry> {
        let entries = self.histories.get(&resource)?.keys.get(key)?;
        let i = entries.partition_point(|e| e.rev < rev);
        entries.get(i).filter(|e| e.rev == rev)
    }

    /// The number of recorded changes of `r`.
    pub fn changes_of(&self, r: Resource) -> usize {
        self.histories.get(&r).map_or(0, |h| h.changes.len())
    }
}
