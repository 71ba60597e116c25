//! A change to the cache, and its watch-event frames.
//!
//! Frames are encoded at most once per event and type, when the first
//! watcher needs them, and then shared by every watcher (a `Bytes` clone is
//! a reference count).

use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};

pub use apimachinery::watch::EventType;

use super::filter::Filter;
use super::object::CachedObject;

/// One change, as held in the history.
#[derive(Debug)]
pub struct Event {
    /// The event's resourceVersion.
    pub rv: u64,
    pub kind: EventType,
    /// The object after the change; for `Deleted`, its last state at the
    /// deletion's resourceVersion.
    pub object: Arc<CachedObject>,
    /// The object before the change (`Modified`, `Deleted`).
    pub prev: Option<Arc<CachedObject>>,
    added: OnceLock<Bytes>,
    modified: OnceLock<Bytes>,
    deleted: OnceLock<Bytes>,
    left: OnceLock<Bytes>,
}

/// Writes `{"type":"T","object":OBJ}\n`, the apiserver's JSON watch framing.
pub fn frame(kind: &str, object: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    out.freeze()
}

// === impl Event ===

impl Event {
    /// A new event.
    pub fn new(
        rv: u64,
        kind: EventType,
        object: Arc<CachedObject>,
        prev: Option<Arc<CachedObject>>,
    ) -> Event {
        Event {
            rv,
            kind,
            object,
            prev,
            added: OnceLock::new(),
            modified: OnceLock::new(),
            deleted: OnceLock::new(),
            left: OnceLock::new(),
        }
    }

    /// The frame a watcher with `filter` receives, if any, following the
    /// apiserver's `cacheWatcher.convertToWatchEvent`: entering the
    /// selection is `ADDED`, staying is `MODIFIED`, leaving is `DELETED`
    /// carrying the previous object stamped with the event's
    /// resourceVersion, and a delete of a selected object is `DELETED`.
    pub fn frame_for(&self, filter: &Filter) -> Option<Bytes> {
        match self.kind {
            EventType::Deleted => filter.matches(&self.object).then(|| self.deleted_frame()),
            EventType::Added | EventType::Modified => {
                let cur = filter.matches(&self.object);
                let old = self.prev.as_ref().is_some_and(|p| filter.matches(p));
                match (cur, old) {
                    (true, false) => Some(self.added_frame()),
                    (true, true) => Some(self.modified_frame()),
                    (false, true) => self.prev.as_ref().map(|p| self.left_frame(p)),
                    (false, false) => None,
                }
            }
        }
    }

    fn added_frame(&self) -> Bytes {
        self.added
            .get_or_init(|| frame("ADDED", self.object.json()))
            .clone()
    }

    fn modified_frame(&self) -> Bytes {
        self.modified
            .get_or_init(|| frame("MODIFIED", self.object.json()))
            .clone()
    }

    fn deleted_frame(&self) -> Bytes {
        self.deleted
            .get_or_init(|| frame("DELETED", self.object.json()))
            .clone()
    }

    fn left_frame(&self, prev: &CachedObject) -> Bytes {
        self.left
            .get_or_init(|| frame("DELETED", &prev.with_resource_version(self.rv)))
            .clone()
    }

    /// Bytes held by the event beyond the objects (which may be shared with
    /// the store).
    pub fn encoded_size(&self) -> usize {
        [&self.added, &self.modified, &self.deleted, &self.left]
            .iter()
            .filter_map(|c| c.get())
            .map(Bytes::len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::FieldSet;
    use crate::selector::LabelSelector;

    fn cm(name: &str, rv: u64, app: &str) -> Arc<CachedObject> {
        let json = format!(
            r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}","labels":{{"app":"{app}"}}}}}}"#
        );
        Arc::new(CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).unwrap())
    }

    fn app_a() -> Filter {
        Filter {
            labels: LabelSelector::parse("app=a").unwrap(),
            ..Filter::default()
        }
    }

    fn kind_of(frame: &Bytes) -> String {
        let v: serde_json::Value = serde_json::from_slice(frame).unwrap();
        format!(
            "{} {}",
            v["type"].as_str().unwrap(),
            v["object"]["metadata"]["resourceVersion"].as_str().unwrap()
        )
    }

    #[test]
    fn selector_transitions() {
        let f = app_a();
        let enter = Event::new(
            11,
            EventType::Modified,
            cm("x", 11, "a"),
            Some(cm("x", 10, "b")),
        );
        assert_eq!(kind_of(&enter.frame_for(&f).unwrap()), "ADDED 11");
        let stay = Event::new(
            12,
            EventType::Modified,
            cm("x", 12, "a"),
            Some(cm("x", 11, "a")),
        );
        assert_eq!(kind_of(&stay.frame_for(&f).unwrap()), "MODIFIED 12");
        let leave = Event::new(
            13,
            EventType::Modified,
            cm("x", 13, "b"),
            Some(cm("x", 12, "a")),
        );
        let frame = leave.frame_for(&f).unwrap();
        assert_eq!(kind_of(&frame), "DELETED 13");
        let v: serde_json::Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(
            v["object"]["metadata"]["labels"]["app"], "a",
            "carries the previous object"
        );
        let outside = Event::new(
            14,
            EventType::Modified,
            cm("x", 14, "c"),
            Some(cm("x", 13, "b")),
        );
        assert!(outside.frame_for(&f).is_none());
        let delete = Event::new(
            15,
            EventType::Deleted,
            cm("y", 15, "a"),
            Some(cm("y", 9, "a")),
        );
        assert_eq!(kind_of(&delete.frame_for(&f).unwrap()), "DELETED 15");
        assert!(frame.ends_with(b"}\n"));
    }
}
