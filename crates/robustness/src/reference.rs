//! etcd's own history, the reference every watch stream is validated
//! against.
//!
//! kube-apiserver runs with `--storage-media-type=application/json`, so an
//! etcd value is the object's JSON; an object's resourceVersion is its etcd
//! `mod_revision`, and a deletion's resourceVersion is the revision of the
//! DELETE. The run records the state at a start revision (an etcd range)
//! and an etcd watch from there; [`Reference`] is fed with both, already
//! decoded, and answers what a watcher with a given [`Filter`] should have
//! seen: the state at a revision ([`Reference::state_at`]) and the watch
//! events for a range of revisions ([`Reference::expected`]).
//!
//! Storage, per resource: the base state, the changes sorted by revision,
//! each key's versions (for point queries), and checkpoints of the whole
//! state every `max(1000, number of objects)` changes, so that
//! [`Reference::state_at`] replays at most that many changes and the
//! checkpoints together hold no more entries than there are changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::Value;

use crate::model::{Filter, Kind, ObjectKey, Resource};

/// Changes between two checkpoints (at least; more when the state holds
/// more objects than this).
const CHECKPOINT_EVERY: usize = 1000;

/// One version of an object: its resourceVersion and what selectors read.
#[derive(Debug, Clone)]
pub struct Version {
    /// The resourceVersion (the etcd `mod_revision`). 0 when unknown: an
    /// object the reference learnt of only through an event's `prev_kv`.
    pub rv: u64,
    /// The object trimmed to `metadata.{name,namespace,labels}` and
    /// `spec.nodeName`, all [`Filter::matches`] reads.
    pub object: Arc<Value>,
    /// The same, packed in one buffer for [`Version::selected`], which the
    /// reference runs for every change and object a query covers.
    packed: Arc<str>,
}

impl PartialEq for Version {
    fn eq(&self, other: &Version) -> bool {
        self.rv == other.rv && self.object == other.object
    }
}

impl Version {
    /// A version of `key` from its full JSON (trimmed).
    pub fn new(rv: u64, key: &ObjectKey, object: &Value) -> Version {
        let object = trim(key, object);
        Version {
            rv,
            packed: pack(&object),
            object: Arc::new(object),
        }
    }

    /// Whether `filter` selects this version: [`Filter::matches`] on the
    /// object, computed from the packed form (one small buffer instead of
    /// a tree of maps: queries touch every change they cover).
    pub fn selected(&self, filter: &Filter) -> bool {
        let mut parts = self.packed.split('\0');
        let namespace = parts.next().unwrap_or("");
        let name = parts.next().unwrap_or("");
        let node = parts.next().unwrap_or("");
        if let Some(ns) = &filter.namespace
            && ns != namespace
        {
            return false;
        }
        let label = |key: &str| {
            let mut labels = parts.clone();
            while let (Some(k), Some(v)) = (labels.next(), labels.next()) {
                if k == key {
                    return Some(v);
                }
            }
            None
        };
        if !filter.labels.iter().all(|r| r.holds(label(r.key()))) {
            return false;
        }
        filter.fields.iter().all(|r| {
            let value = match r.key() {
                "metadata.name" => Some(name),
                "metadata.namespace" => Some(namespace),
                "spec.nodeName" => Some(node),
                _ => None,
            };
            r.holds(value)
        })
    }
}

/// A trimmed object packed as `namespace\0name\0nodeName` then
/// `\0key\0value` per label with a string value (names, label keys and
/// values cannot hold NUL).
fn pack(object: &Value) -> Arc<str> {
    let meta = &object["metadata"];
    let mut out = String::new();
    out.push_str(meta["namespace"].as_str().unwrap_or(""));
    out.push('\0');
    out.push_str(meta["name"].as_str().unwrap_or(""));
    out.push('\0');
    out.push_str(object["spec"]["nodeName"].as_str().unwrap_or(""));
    if let Some(labels) = meta["labels"].as_object() {
        for (k, v) in labels {
            if let Some(v) = v.as_str() {
                out.push('\0');
                out.push_str(k);
                out.push('\0');
                out.push_str(v);
            }
        }
    }
    out.into()
}

/// The parts of `object` selectors read; the name and namespace from
/// `key` when the object lacks them.
fn trim(key: &ObjectKey, object: &Value) -> Value {
    let meta = &object["metadata"];
    let mut m = serde_json::Map::new();
    let name = meta["name"].as_str().unwrap_or(&key.name);
    m.insert("name".to_string(), Value::String(name.to_string()));
    let namespace = meta["namespace"].as_str().unwrap_or(&key.namespace);
    if !namespace.is_empty() {
        m.insert(
            "namespace".to_string(),
            Value::String(namespace.to_string()),
        );
    }
    if let Some(labels) = meta.get("labels").filter(|l| l.is_object()) {
        m.insert("labels".to_string(), labels.clone());
    }
    let mut out = serde_json::Map::new();
    out.insert("metadata".to_string(), Value::Object(m));
    if let Some(node) = object["spec"]["nodeName"].as_str() {
        let mut spec = serde_json::Map::new();
        spec.insert("nodeName".to_string(), Value::String(node.to_string()));
        out.insert("spec".to_string(), Value::Object(spec));
    }
    Value::Object(out)
}

/// One change etcd recorded for a followed key.
#[derive(Debug, Clone)]
pub struct Change {
    /// The revision of the change (a PUT's `mod_revision`, a DELETE's
    /// revision).
    pub rev: u64,
    pub key: ObjectKey,
    /// The version before the change (`None`: a create).
    pub old: Option<Version>,
    /// The version after the change (`None`: a delete).
    pub new: Option<Version>,
}

impl Change {
    /// The watch event a watcher with `filter` gets for this change, if
    /// any, as kube-apiserver decides: by whether the old and the new
    /// object match.
    pub fn event(&self, filter: &Filter) -> Option<(Kind, ObjectKey, u64)> {
        let old = self.old.as_ref().is_some_and(|v| v.selected(filter));
        let new = self.new.as_ref().is_some_and(|v| v.selected(filter));
        let kind = match (old, new) {
            (true, true) => Kind::Modified,
            (false, true) => Kind::Added,
            (true, false) => Kind::Deleted,
            (false, false) => return None,
        };
        Some((kind, self.key.clone(), self.rev))
    }
}

/// The state of a resource after a number of its changes.
#[derive(Debug)]
struct Checkpoint {
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
struct Entry {
    rev: u64,
    version: Option<Version>,
}

/// One resource's history.
#[derive(Debug)]
struct History {
    /// Sorted by revision; the first is the base state.
    checkpoints: Vec<Checkpoint>,
    /// Sorted by revision.
    changes: Vec<Change>,
    /// The state after every change.
    current: BTreeMap<ObjectKey, Version>,
    /// Each key's entries, sorted by revision.
    keys: HashMap<ObjectKey, Vec<Entry>>,
}

impl History {
    fn new(start: u64, state: BTreeMap<ObjectKey, Version>) -> History {
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

    fn push(&mut self, change: Change) {
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
    fn after(&self, rev: u64) -> usize {
        self.changes.partition_point(|c| c.rev <= rev)
    }

    fn state_at(&self, filter: &Filter, rev: u64) -> BTreeMap<ObjectKey, u64> {
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

/// etcd's history of every followed resource from a start revision.
#[derive(Debug)]
pub struct Reference {
    start: u64,
    /// The newest revision of a recorded event (or `start`); events at or
    /// below it are repeats.
    last_event: u64,
    /// The etcd keys recorded at `last_event` (one, but for transactions).
    keys_at_last: Vec<String>,
    /// The newest revision a progress notification reported.
    progress: u64,
    histories: BTreeMap<Resource, History>,
    len: usize,
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

    /// The start revision.
    pub fn start(&self) -> u64 {
        self.start
    }

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

    /// The number of recorded changes (of every followed resource).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no change was recorded.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of recorded changes of `r`.
    pub fn changes_of(&self, r: Resource) -> usize {
        self.histories.get(&r).map_or(0, |h| h.changes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Requirement;
    use serde_json::json;

    fn pod(ns: &str, name: &str, app: &str, node: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}, "uid": "x"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"},
        })
    }

    fn pkey(ns: &str, name: &str) -> String {
        format!("/registry/pods/{ns}/{name}")
    }

    fn k(ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(ns, name)
    }

    fn app(v: &str) -> Filter {
        Filter {
            labels: vec![Requirement::Equals("app".into(), v.into())],
            ..Filter::all(Resource::Pods)
        }
    }

    fn node(v: &str) -> Filter {
        Filter {
            fields: vec![Requirement::Equals("spec.nodeName".into(), v.into())],
            ..Filter::all(Resource::Pods)
        }
    }

    /// Start 10: a/p1 (web, n1) at 5, b/p2 (db, n2) at 8.
    /// 11: create a/p3 (web, n1)
    /// 12: update a/p1 -> db (moves out of app=web), still n1
    /// 13: update b/p2 -> n1 (moves into nodeName=n1)
    /// 14: delete a/p3
    /// 15: update a/p1 -> web again (moves back in)
    /// 16: create a configmap (another resource)
    /// 17: update b/p2 (no selector change)
    fn sample() -> Reference {
        let mut r = Reference::new(
            10,
            vec![
                (Resource::Pods, k("a", "p1"), 5, pod("a", "p1", "web", "n1")),
                (Resource::Pods, k("b", "p2"), 8, pod("b", "p2", "db", "n2")),
            ],
        );
        r.record(
            11,
            &pkey("a", "p3"),
            Some(pod("a", "p3", "web", "n1")),
            None,
        );
        r.record(
            12,
            &pkey("a", "p1"),
            Some(pod("a", "p1", "db", "n1")),
            Some(pod("a", "p1", "web", "n1")),
        );
        r.record(13, &pkey("b", "p2"), Some(pod("b", "p2", "db", "n1")), None);
        r.record(
            14,
            &pkey("a", "p3"),
            None,
            Some(pod("a", "p3", "web", "n1")),
        );
        r.record(
            15,
            &pkey("a", "p1"),
            Some(pod("a", "p1", "web", "n1")),
            None,
        );
        r.record(
            16,
            "/registry/configmaps/a/cm",
            Some(json!({"metadata": {"name": "cm", "namespace": "a"}})),
            None,
        );
        r.record(17, &pkey("b", "p2"), Some(pod("b", "p2", "db", "n1")), None);
        r
    }

    fn map(items: &[(ObjectKey, u64)]) -> BTreeMap<ObjectKey, u64> {
        items.iter().cloned().collect()
    }

    #[test]
    fn counts_and_head() {
        let mut r = sample();
        assert_eq!(r.start(), 10);
        assert_eq!(r.head(), 17);
        assert_eq!(r.len(), 7);
        assert!(!r.is_empty());
        assert_eq!(r.changes_of(Resource::Pods), 6);
        assert_eq!(r.changes_of(Resource::ConfigMaps), 1);
        assert_eq!(r.changes_of(Resource::Nodes), 0);
        r.progress(20);
        assert_eq!(r.head(), 20);
        r.progress(19);
        assert_eq!(r.head(), 20);
        assert_eq!(r.changes(Resource::Pods, 12, 14).len(), 2);
    }

    #[test]
    fn state_at_revisions() {
        let r = sample();
        let all = Filter::all(Resource::Pods);
        assert_eq!(
            r.state_at(&all, 10),
            map(&[(k("a", "p1"), 5), (k("b", "p2"), 8)])
        );
        assert_eq!(
            r.state_at(&all, 11),
            map(&[(k("a", "p1"), 5), (k("a", "p3"), 11), (k("b", "p2"), 8)])
        );
        assert_eq!(
            r.state_at(&all, 14),
            map(&[(k("a", "p1"), 12), (k("b", "p2"), 13)])
        );
        assert_eq!(
            r.state_at(&all, 17),
            map(&[(k("a", "p1"), 15), (k("b", "p2"), 17)])
        );
        // Clamped to the head and to the start.
        assert_eq!(r.state_at(&all, 100), r.state_at(&all, 17));
        assert_eq!(r.state_at(&all, 3), r.state_at(&all, 10));

        assert_eq!(r.state_at(&app("web"), 10), map(&[(k("a", "p1"), 5)]));
        assert_eq!(
            r.state_at(&app("web"), 11),
            map(&[(k("a", "p1"), 5), (k("a", "p3"), 11)])
        );
        assert_eq!(r.state_at(&app("web"), 12), map(&[(k("a", "p3"), 11)]));
        assert_eq!(r.state_at(&app("web"), 14), map(&[]));
        assert_eq!(r.state_at(&app("web"), 15), map(&[(k("a", "p1"), 15)]));

        assert_eq!(
            r.state_at(&node("n1"), 12),
            map(&[(k("a", "p1"), 12), (k("a", "p3"), 11)])
        );
        assert_eq!(r.state_at(&node("n1"), 13).len(), 3);
        assert_eq!(r.state_at(&node("n2"), 12), map(&[(k("b", "p2"), 8)]));
        assert_eq!(r.state_at(&node("n2"), 13), map(&[]));

        let in_b = Filter {
            namespace: Some("b".into()),
            ..Filter::all(Resource::Pods)
        };
        assert_eq!(r.state_at(&in_b, 17), map(&[(k("b", "p2"), 17)]));
        let cms = Filter::all(Resource::ConfigMaps);
        assert_eq!(r.state_at(&cms, 15), map(&[]));
        assert_eq!(r.state_at(&cms, 16), map(&[(k("a", "cm"), 16)]));
    }

    #[test]
    fn expected_events_follow_selectors() {
        let r = sample();
        use Kind::*;
        assert_eq!(
            r.expected(&Filter::all(Resource::Pods), 10, 17),
            vec![
                (Added, k("a", "p3"), 11),
                (Modified, k("a", "p1"), 12),
                (Modified, k("b", "p2"), 13),
                (Deleted, k("a", "p3"), 14),
                (Modified, k("a", "p1"), 15),
                (Modified, k("b", "p2"), 17),
            ]
        );
        assert_eq!(
            r.expected(&app("web"), 10, 17),
            vec![
                (Added, k("a", "p3"), 11),
                (Deleted, k("a", "p1"), 12),
                (Deleted, k("a", "p3"), 14),
                (Added, k("a", "p1"), 15),
            ]
        );
        assert_eq!(
            r.expected(&app("db"), 10, 17),
            vec![
                (Added, k("a", "p1"), 12),
                (Modified, k("b", "p2"), 13),
                (Deleted, k("a", "p1"), 15),
                (Modified, k("b", "p2"), 17),
            ]
        );
        assert_eq!(
            r.expected(&node("n2"), 10, 17),
            vec![(Deleted, k("b", "p2"), 13)]
        );
        assert_eq!(
            r.expected(&node("n1"), 12, 13),
            vec![(Added, k("b", "p2"), 13)]
        );
        // (from, to]: nothing at `from` itself.
        assert_eq!(
            r.expected(&app("web"), 11, 12),
            vec![(Deleted, k("a", "p1"), 12)]
        );
        assert!(r.expected(&app("web"), 15, 17).is_empty());
        assert!(r.expected(&app("web"), 17, 100).is_empty());
    }

    #[test]
    fn versions() {
        let r = sample();
        let p1 = k("a", "p1");
        let p3 = k("a", "p3");
        assert_eq!(r.version_at(Resource::Pods, &p1, 4), None);
        assert_eq!(r.version_at(Resource::Pods, &p1, 10).map(|v| v.rv), Some(5));
        assert_eq!(
            r.version_at(Resource::Pods, &p1, 12).map(|v| v.rv),
            Some(12)
        );
        assert_eq!(
            r.version_at(Resource::Pods, &p1, 14).map(|v| v.rv),
            Some(12)
        );
        assert_eq!(
            r.version_at(Resource::Pods, &p1, 99).map(|v| v.rv),
            Some(15)
        );
        assert_eq!(r.version_at(Resource::Pods, &p3, 10), None);
        assert_eq!(
            r.version_at(Resource::Pods, &p3, 13).map(|v| v.rv),
            Some(11)
        );
        assert_eq!(r.version_at(Resource::Pods, &p3, 14), None);
        assert_eq!(r.version_at(Resource::Services, &p1, 14), None);
        // Trimmed to what selectors read.
        let v = r
            .version_at(Resource::Pods, &p1, 12)
            .map(|v| v.object.clone());
        assert_eq!(
            v.as_deref(),
            Some(&json!({
                "metadata": {"name": "p1", "namespace": "a", "labels": {"app": "db"}},
                "spec": {"nodeName": "n1"},
            }))
        );

        assert!(r.has_version(Resource::Pods, &p1, 5));
        assert!(r.has_version(Resource::Pods, &p1, 12));
        assert!(r.has_version(Resource::Pods, &p1, 15));
        assert!(!r.has_version(Resource::Pods, &p1, 13));
        assert!(!r.has_version(Resource::Pods, &p3, 14));
        assert!(r.has_change(Resource::Pods, &p3, 14));
        assert!(!r.has_change(Resource::Pods, &p3, 13));
        assert!(!r.has_version(Resource::Pods, &k("x", "y"), 11));
    }

    #[test]
    fn repeated_and_old_events_are_ignored() {
        let mut r = sample();
        let all = Filter::all(Resource::Pods);
        let before = r.state_at(&all, 17);
        // A resumed etcd watch repeating the last and older events.
        r.record(17, &pkey("b", "p2"), Some(pod("b", "p2", "db", "n1")), None);
        r.record(14, &pkey("a", "p3"), None, None);
        r.record(
            12,
            &pkey("a", "p9"),
            Some(pod("a", "p9", "web", "n1")),
            None,
        );
        assert_eq!(r.len(), 7);
        assert_eq!(r.state_at(&all, 17), before);
        // At or below the start.
        let mut s = Reference::new(10, vec![]);
        s.record(10, &pkey("a", "x"), Some(pod("a", "x", "web", "n1")), None);
        s.record(9, &pkey("a", "y"), Some(pod("a", "y", "web", "n1")), None);
        assert_eq!(s.len(), 0);
        // Another key at the same revision (one transaction) is kept.
        s.record(11, &pkey("a", "x"), Some(pod("a", "x", "web", "n1")), None);
        s.record(11, &pkey("a", "y"), Some(pod("a", "y", "web", "n1")), None);
        s.record(11, &pkey("a", "y"), Some(pod("a", "y", "web", "n1")), None);
        assert_eq!(s.len(), 2);
        // Progress does not make later events repeats.
        s.progress(20);
        s.record(12, &pkey("a", "x"), None, None);
        assert_eq!(s.len(), 3);
        assert_eq!(s.state_at(&all, 20), map(&[(k("a", "y"), 11)]));
        // Keys the run does not follow.
        s.record(
            21,
            "/registry/leases/kube-node-lease/n1",
            Some(json!({})),
            None,
        );
        s.record(22, "/registry/events/a/e", Some(json!({})), None);
        assert_eq!(s.len(), 3);
        assert_eq!(s.head(), 22);
    }

    #[test]
    fn unknown_previous_from_prev_kv() {
        let mut r = Reference::new(10, vec![]);
        // Updating and deleting objects the start state lacked: the
        // previous value etcd sent decides the event.
        r.record(
            11,
            &pkey("a", "p"),
            Some(pod("a", "p", "db", "n1")),
            Some(pod("a", "p", "web", "n1")),
        );
        r.record(12, &pkey("a", "q"), None, Some(pod("a", "q", "web", "n1")));
        r.record(13, &pkey("a", "z"), None, None);
        assert_eq!(
            r.expected(&app("web"), 10, 13),
            vec![
                (Kind::Deleted, k("a", "p"), 11),
                (Kind::Deleted, k("a", "q"), 12)
            ]
        );
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn nodes_and_services_keys() {
        let mut r = Reference::new(
            1,
            vec![(
                Resource::Nodes,
                k("", "n1"),
                1,
                json!({"metadata": {"name": "n1", "labels": {"zone": "a"}}}),
            )],
        );
        r.record(
            2,
            "/registry/minions/n2",
            Some(json!({"metadata": {"name": "n2"}})),
            None,
        );
        r.record(
            3,
            "/registry/services/specs/a/s",
            Some(json!({"metadata": {"name": "s", "namespace": "a"}})),
            None,
        );
        r.record(4, "/registry/services/endpoints/a/s", Some(json!({})), None);
        let nodes = Filter::all(Resource::Nodes);
        assert_eq!(
            r.state_at(&nodes, 2),
            map(&[(k("", "n1"), 1), (k("", "n2"), 2)])
        );
        let zone = Filter {
            labels: vec![Requirement::Equals("zone".into(), "a".into())],
            ..nodes
        };
        assert_eq!(r.state_at(&zone, 4), map(&[(k("", "n1"), 1)]));
        assert_eq!(r.changes_of(Resource::Services), 1);
        assert_eq!(r.len(), 2);
    }

    /// Many changes: checkpoints give the same answers as a full replay.
    #[test]
    fn checkpoints_agree_with_replay() {
        let names: Vec<String> = (0..50).map(|i| format!("p{i}")).collect();
        let mut r = Reference::new(
            100,
            names
                .iter()
                .take(20)
                .map(|n| (Resource::Pods, k("a", n), 50, pod("a", n, "web", "n1")))
                .collect(),
        );
        let mut rng = fastrand::Rng::with_seed(7);
        let mut rev = 100;
        let mut live: BTreeMap<String, (String, String)> = names
            .iter()
            .take(20)
            .map(|n| (n.clone(), ("web".to_string(), "n1".to_string())))
            .collect();
        for _ in 0..5000 {
            rev += rng.u64(1..3);
            let n = &names[rng.usize(..names.len())];
            let apps = ["web", "db"];
            let nodes = ["n1", "n2"];
            if live.contains_key(n) && rng.u8(..4) == 0 {
                let (a, nd) = live.remove(n).unwrap_or_default();
                r.record(rev, &pkey("a", n), None, Some(pod("a", n, &a, &nd)));
            } else {
                let a = apps[rng.usize(..2)].to_string();
                let nd = nodes[rng.usize(..2)].to_string();
                r.record(rev, &pkey("a", n), Some(pod("a", n, &a, &nd)), None);
                live.insert(n.clone(), (a, nd));
            }
        }
        assert_eq!(r.len(), 5000);
        let history = &r.histories[&Resource::Pods];
        assert!(history.checkpoints.len() >= 5);
        for f in [Filter::all(Resource::Pods), app("web"), node("n2")] {
            // A naive replay from the base, by events.
            let mut state = r.state_at(&f, 100);
            let mut at = 100;
            for probe in [100, 150, 1000, 2500, 5001, 7000, rev] {
                for (kind, key, rv) in r.expected(&f, at, probe) {
                    match kind {
                        Kind::Added | Kind::Modified => {
                            state.insert(key, rv);
                        }
                        Kind::Deleted => {
                            state.remove(&key);
                        }
                    }
                }
                at = probe;
                assert_eq!(r.state_at(&f, probe), state, "{f} at {probe}");
            }
        }
        // The final state is the live one.
        let all = r.state_at(&Filter::all(Resource::Pods), rev);
        assert_eq!(
            all.keys().map(|k| k.name.clone()).collect::<Vec<_>>(),
            live.keys().cloned().collect::<Vec<_>>()
        );
    }

    /// The packed form selects exactly as `Filter::matches` on the JSON.
    #[test]
    fn selected_agrees_with_filter_matches() {
        let mut rng = fastrand::Rng::with_seed(3);
        let pick = |rng: &mut fastrand::Rng, xs: &[&str]| xs[rng.usize(..xs.len())].to_string();
        let values = ["a", "b", ""];
        let keys = [
            "app",
            "tier",
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "x.y",
        ];
        for _ in 0..3000 {
            let mut labels = serde_json::Map::new();
            for key in ["app", "tier"] {
                match rng.u8(..4) {
                    0 => {}
                    1 => {
                        labels.insert(key.into(), json!(7));
                    }
                    _ => {
                        labels.insert(key.into(), json!(pick(&mut rng, &values)));
                    }
                }
            }
            let mut object = json!({"metadata": {"name": pick(&mut rng, &["a", "b"])}});
            if rng.bool() {
                object["metadata"]["namespace"] = json!(pick(&mut rng, &["a", "b"]));
            }
            if rng.bool() {
                object["metadata"]["labels"] = Value::Object(labels);
            }
            if rng.bool() {
                object["spec"] = json!({"nodeName": pick(&mut rng, &values)});
            }
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let v = Version::new(1, &k(&ns, &name), &object);
            let mut filter = Filter::all(Resource::Pods);
            if rng.u8(..3) == 0 {
                filter.namespace = Some(pick(&mut rng, &["a", "b"]));
            }
            for _ in 0..rng.usize(..3) {
                let key = pick(&mut rng, &keys);
                let r = match rng.u8(..3) {
                    0 => Requirement::Equals(key, pick(&mut rng, &values)),
                    1 => Requirement::NotEquals(key, pick(&mut rng, &values)),
                    _ => {
                        Requirement::In(key, vec![pick(&mut rng, &values), pick(&mut rng, &values)])
                    }
                };
                if r.key().contains('.') {
                    filter.fields.push(r);
                } else {
                    filter.labels.push(r);
                }
            }
            assert_eq!(
                v.selected(&filter),
                filter.matches(&v.object),
                "{filter} on {}",
                v.object
            );
            assert_eq!(
                filter.matches(&v.object),
                filter.matches(&object),
                "{filter} on {object}"
            );
        }
    }
}
