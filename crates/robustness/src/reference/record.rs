//! The reference fed from etcd: the state at the start revision, then
//! every event of an etcd watch in revision order (repeats of a resumed
//! watch ignored) and its progress notifications.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::{ObjectKey, Resource};

use super::history::History;
use super::version::{Change, Version};

/// etcd's history of every followed resource from a start revision.
#[derive(Debug)]
pub struct Reference {
    pub(super) start: u64,
    /// The newest revision of a recorded event (or `start`); events at or
    /// below it are repeats.
    last_event: u64,
    /// The etcd keys recorded at `last_event` (one, but for transactions).
    keys_at_last: Vec<String>,
    /// The newest revision a progress notification reported.
    progress: u64,
    pub(super) histories: BTreeMap<Resource, History>,
    len: usize,
    /// When each revision was first recorded (Unix seconds): etcd's watch
    /// delivers a change within milliseconds of its commit, so this is
    /// when the cluster had it (`validate::freshness`).
    committed: BTreeMap<u64, f64>,
}

impl Reference {
    /// An empty history starting at revision `start`, with the state at
    /// `start`: every followed object as (resource, key, `mod_revision`,
    /// full JSON value).
    pub fn new(start: u64, state: Vec<(Resource, ObjectKey, u64, Value)>) -> Reference {
        let mut base: BTreeMap<Resource, BTreeMap<ObjectKey, Version>> = Resource::ALL
            .iter()
            .map(|r| (*r, BTreeMap::new()))
            .collect();
        for (resource, key, rv, value) in state {
            let version = Version::new(rv, &key, &value);
            base.entry(resource).or_default().insert(key, version);
        }
        let histories = base
            .into_iter()
            .map(|(r, s)| (r, History::new(start, s)))
            .collect();
        Reference {
            start,
            last_event: start,
            keys_at_last: Vec::new(),
            progress: start,
            histories,
            len: 0,
            committed: BTreeMap::new(),
        }
    }

    /// Records one etcd event, in revision order: `rev` is the event's
    /// revision (a PUT's `mod_revision`, a DELETE's revision), `key` the
    /// etcd key (keys the run does not follow are ignored), `value` the
    /// new JSON for a PUT and `None` for a DELETE, `prev` the previous
    /// value when etcd sent `prev_kv`.
    ///
    /// Events below the newest recorded event's revision, or at it for a
    /// key already recorded there, are repeats (a resumed etcd watch) and
    /// ignored; so are events at or below the start revision. Progress
    /// notifications do not count here: a watch response's header revision
    /// may run ahead of its events.
    ///
    /// The previous version is the reference's own; `prev` only stands in
    /// (with resourceVersion 0) for a key the reference did not know.
    pub fn record(&mut self, rev: u64, key: &str, value: Option<Value>, prev: Option<Value>) {
        if rev < self.last_event
            || (rev == self.last_event
                && (rev == self.start || self.keys_at_last.iter().any(|k| k == key)))
        {
            return;
        }
        if rev > self.last_event {
            self.last_event = rev;
            self.keys_at_last.clear();
            self.committed.insert(rev, crate::model::unix_now());
        }
        self.keys_at_last.push(key.to_string());
        let Some((resource, key)) = Resource::of_etcd_key(key) else {
            return;
        };
        let start = self.start;
        let history = self
            .histories
            .entry(resource)
            .or_insert_with(|| History::new(start, BTreeMap::new()));
        let old = history
            .current
            .get(&key)
            .cloned()
            .or_else(|| prev.map(|p| Version::new(0, &key, &p)));
        let new = value.map(|v| Version::new(rev, &key, &v));
        if old.is_none() && new.is_none() {
            // A delete of something never seen: nothing a watcher could
            // have been told about.
            return;
        }
        history.push(Change { rev, key, old, new });
        self.len += 1;
    }

    /// Notes that etcd's revision reached `rev` (a watch progress
    /// notification), even if no followed key changed.
    pub fn progress(&mut self, rev: u64) {
        self.progress = self.progress.max(rev);
    }

    /// The newest revision known (of an event or a progress notification).
    pub fn head(&self) -> u64 {
        self.last_event.max(self.progress)
    }

    /// When revision `rev` was recorded (Unix seconds), if it was.
    pub fn committed_at(&self, rev: u64) -> Option<f64> {
        self.committed.get(&rev).copied()
    }

    /// The start revision.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The number of recorded changes (of every followed resource).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no change was recorded.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every recorded change, one line each in revision order per
    /// resource (`rev resource namespace/name old -> new`, a version as
    /// its trimmed object), for a post-mortem of an anomaly.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (resource, history) in &self.histories {
            for c in &history.changes {
                let version = |v: &Option<super::Version>| match v {
                    Some(v) => format!("{}@{}", v.object, v.rv),
                    None => "-".to_string(),
                };
                out.push_str(&format!(
                    "{} {resource} {}/{} {} -> {}\n",
                    c.rev,
                    c.key.namespace,
                    c.key.name,
                    version(&c.old),
                    version(&c.new)
                ));
            }
        }
        out
    }
}
