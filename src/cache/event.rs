//! A change to the cache, and its watch-event frames.
//!
//! Frames are encoded at most once per event, kind of frame and
//! representation, by the first watcher that needs them (outside the store
//! lock), and then shared by every watcher (a `Bytes` clone is a reference
//! count).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parking_lot::Mutex;
use prometheus::IntGauge;

pub use apimachinery::watch::EventType;

use super::encode::{self, ProtoCodec};
use super::filter::Filter;
use super::negotiate::Representation;
use super::object::CachedObject;
use apimachinery::resource::FieldSet;

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
    /// The previous object stamped with the event's RV, for watchers it
    /// leaves (built once, when first needed).
    left: OnceLock<Option<Arc<CachedObject>>>,
    /// Frames built so far, by [`Which`] and representation.
    frames: Mutex<Vec<(u8, Bytes)>>,
    /// Where the frames' bytes are counted while the event lives
    /// (`cache_history_bytes`).
    frame_bytes: Option<IntGauge>,
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(gauge) = &self.frame_bytes {
            gauge.sub(self.encoded_size() as i64);
        }
    }
}

/// Which frame of an event a watcher receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// `ADDED` with the object (it entered the watcher's selection).
    Added,
    /// `MODIFIED` with the object.
    Modified,
    /// `DELETED` with the object (deleted).
    Deleted,
    /// `DELETED` with the previous object at the event's RV (it left the
    /// selection).
    Left,
}

impl Which {
    fn event_type(self) -> &'static str {
        match self {
            Which::Added => "ADDED",
            Which::Modified => "MODIFIED",
            Which::Deleted | Which::Left => "DELETED",
        }
    }
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
            left: OnceLock::new(),
            frames: Mutex::new(Vec::new()),
            frame_bytes: None,
        }
    }

    /// The event, its frames' bytes counted in `gauge` from when each is
    /// built until the event is dropped.
    pub fn counted_in(mut self, gauge: Option<IntGauge>) -> Event {
        self.frame_bytes = gauge;
        self
    }

    /// The frame a watcher with `filter` receives, if any, following the
    /// apiserver's `cacheWatcher.convertToWatchEvent`: entering the
    /// selection is `ADDED`, staying is `MODIFIED`, leaving is `DELETED`
    /// carrying the previous object stamped with the event's
    /// resourceVersion, and a delete of a selected object is `DELETED`.
    pub fn which_for(&self, filter: &Filter) -> Option<Which> {
        match self.kind {
            EventType::Deleted => filter.matches(&self.object).then_some(Which::Deleted),
            EventType::Added | EventType::Modified => {
                let cur = filter.matches(&self.object);
                let old = self.prev.as_ref().is_some_and(|p| filter.matches(p));
                match (cur, old) {
                    (true, false) => Some(Which::Added),
                    (true, true) => Some(Which::Modified),
                    (false, true) if self.prev.is_some() => Some(Which::Left),
                    _ => None,
                }
            }
        }
    }

    /// The frame `which` in `repr`, built by the first caller; `None` when
    /// the object cannot be encoded so.
    pub fn frame(
        &self,
        which: Which,
        repr: Representation,
        codec: Option<&ProtoCodec>,
    ) -> Option<Bytes> {
        let key = (repr.index() * 4 + which as usize) as u8;
        let mut frames = self.frames.lock();
        if let Some((_, f)) = frames.iter().find(|(k, _)| *k == key) {
            return Some(f.clone());
        }
        let object = match which {
            Which::Left => self.left_object()?,
            _ => self.object.clone(),
        };
        let body = encode::object_bytes(&object, codec, repr)?;
        let f = encode::frame(repr.encoding, which.event_type(), &body);
        if let Some(gauge) = &self.frame_bytes {
            gauge.add(f.len() as i64);
        }
        frames.push((key, f.clone()));
        Some(f)
    }

    fn left_object(&self) -> Option<Arc<CachedObject>> {
        self.left
            .get_or_init(|| {
                let prev = self.prev.as_ref()?;
                let json = prev.with_resource_version(self.rv);
                CachedObject::from_json(&json, FieldSet::Default, prev.is_namespaced())
                    .ok()
                    .map(Arc::new)
            })
            .clone()
    }

    /// Bytes of the object versions the event alone keeps once it is not
    /// the newest change of its object: the version it replaced (one
    /// version, counted once: it is no other event's `prev`) and, for a
    /// deletion, the last state stamped with the deletion's RV.
    pub fn retained_size(&self) -> usize {
        let prev = self.prev.as_ref().map_or(0, |p| p.heap_size());
        match self.kind {
            EventType::Deleted => prev + self.object.heap_size(),
            EventType::Added | EventType::Modified => prev,
        }
    }

    /// Drops the frames built so far; a later caller builds them again.
    /// Does nothing while a caller is building one (a watch resuming from
    /// the history): the store's lock is held, and never waits on it.
    pub fn release_frames(&self) {
        let Some(mut frames) = self.frames.try_lock() else {
            return;
        };
        let frames = std::mem::take(&mut *frames);
        if let Some(gauge) = &self.frame_bytes {
            gauge.sub(frames.iter().map(|(_, f)| f.len() as i64).sum());
        }
    }

    /// Bytes held by the event's frames.
    pub fn encoded_size(&self) -> usize {
        self.frames.lock().iter().map(|(_, f)| f.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apimachinery::resource::FieldSet;
    use apimachinery::selector::LabelSelector;

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

    fn frame_for(e: &Event, f: &Filter) -> Option<Bytes> {
        e.which_for(f)
            .and_then(|w| e.frame(w, Representation::JSON, None))
    }

    fn kind_of(frame: &Bytes) -> String {
        let frame = &frame[..];
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
        assert_eq!(kind_of(&frame_for(&enter, &f).unwrap()), "ADDED 11");
        let stay = Event::new(
            12,
            EventType::Modified,
            cm("x", 12, "a"),
            Some(cm("x", 11, "a")),
        );
        assert_eq!(kind_of(&frame_for(&stay, &f).unwrap()), "MODIFIED 12");
        let leave = Event::new(
            13,
            EventType::Modified,
            cm("x", 13, "b"),
            Some(cm("x", 12, "a")),
        );
        let frame = frame_for(&leave, &f).unwrap();
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
        assert!(frame_for(&outside, &f).is_none());
        let delete = Event::new(
            15,
            EventType::Deleted,
            cm("y", 15, "a"),
            Some(cm("y", 9, "a")),
        );
        assert_eq!(kind_of(&frame_for(&delete, &f).unwrap()), "DELETED 15");
        assert!(frame.ends_with(b"}\n"));
    }
}
