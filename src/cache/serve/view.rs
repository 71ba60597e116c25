//! A view of a cache in which one object reads differently for the readers
//! given it: `podNetwork.kubernetesService`, where this node's kubelet sees
//! the `default/kubernetes` Service pointing at the node proxy (OpenYurt's
//! YurtHub does the same in its `masterservice` filter).
//!
//! The cache keeps objects and events as upstream sent them, shared by
//! every reader. A read with a view gets, for the view's one key, each
//! version rewritten: in a get, a list, a watch's initial events and its
//! events. A version is rewritten once and kept while it is among the last
//! few asked for; everything else is the cache's own, unchanged.
//!
//! A client that read the object through the view keeps what it read until
//! the object changes, so a view that changes (turned on or off) makes its
//! readers relist: [`View::expire_resumes`] until one of them lists again,
//! their watches resuming from a resourceVersion get `410 Expired`, as
//! after the apiserver's watch cache has moved past them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::cache::event::Event;
use crate::cache::object::CachedObject;
use crate::cache::store::Objects;

/// Rewrites one object version; `None` leaves it as it is.
pub type RewriteFn = dyn Fn(&CachedObject) -> Option<CachedObject> + Send + Sync;

/// How many rewritten versions (and events) are kept: the current one, and
/// the few a watch catching up from the history may still send.
const KEPT: usize = 4;

/// One object of a cache, rewritten for some readers.
pub struct View {
    key: Arc<str>,
    rewrite: Box<RewriteFn>,
    /// The last versions rewritten: (the cache's, the view's).
    objects: Mutex<Vec<(Arc<CachedObject>, Arc<CachedObject>)>>,
    /// The last events rewritten: (the cache's, the view's).
    events: Mutex<Vec<(Arc<Event>, Arc<Event>)>>,
    /// Whether the object is rewritten now; off, the view's readers see
    /// the cache's own (and still relist when it is turned on).
    on: AtomicBool,
    /// Set when the view changed: watches resuming with it get `410
    /// Expired` until a reader lists with it.
    expire_resumes: AtomicBool,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View").field("key", &self.key).finish()
    }
}

// === impl View ===

impl View {
    /// A view of the object at storage key `key` (`namespace/name`, or
    /// `name`), each version rewritten by `rewrite` while on (from the
    /// start).
    pub fn new(key: &str, rewrite: Box<RewriteFn>) -> View {
        View {
            key: Arc::from(key),
            rewrite,
            objects: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            on: AtomicBool::new(true),
            expire_resumes: AtomicBool::new(false),
        }
    }

    /// Turns the rewrite on or off; a change makes the view's readers
    /// relist ([`View::expire_resumes`]). `false` when it was so already.
    pub fn set_on(&self, on: bool) -> bool {
        if self.on.swap(on, Ordering::SeqCst) == on {
            return false;
        }
        self.expire_resumes();
        true
    }

    /// Whether the object is rewritten now.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    /// Whether `key` is the view's, rewritten now.
    fn rewrites(&self, key: &str) -> bool {
        key == &*self.key && self.is_on()
    }

    /// The storage key of the object the view rewrites.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// `o` as the view's readers see it.
    pub fn object(&self, o: &Arc<CachedObject>) -> Arc<CachedObject> {
        if !self.rewrites(o.key()) {
            return o.clone();
        }
        let mut kept = self.objects.lock();
        if let Some((_, seen)) = kept.iter().find(|(from, _)| Arc::ptr_eq(from, o)) {
            return seen.clone();
        }
        let seen = match (self.rewrite)(o) {
            Some(rewritten) => Arc::new(rewritten),
            None => o.clone(),
        };
        if kept.len() == KEPT {
            kept.remove(0);
        }
        kept.push((o.clone(), seen.clone()));
        seen
    }

    /// `objects` with the view's object, if there, as its readers see it:
    /// one update of the persistent map, sharing the rest.
    pub fn objects(&self, objects: &Objects) -> Objects {
        match objects.get(&*self.key) {
            Some(o) if self.is_on() => objects.update(self.key.clone(), self.object(o)),
            _ => objects.clone(),
        }
    }

    /// `items` (a list's page), the view's object among them as its
    /// readers see it.
    pub fn items(&self, items: &mut [Arc<CachedObject>]) {
        for item in items.iter_mut().filter(|o| self.rewrites(o.key())) {
            *item = self.object(item);
        }
    }

    /// `e` as the view's readers see it: the same change, carrying the
    /// view's versions of the object (and of the one before it).
    pub fn event(&self, e: &Arc<Event>) -> Arc<Event> {
        if !self.rewrites(e.object.key()) {
            return e.clone();
        }
        let mut kept = self.events.lock();
        if let Some((_, seen)) = kept.iter().find(|(from, _)| Arc::ptr_eq(from, e)) {
            return seen.clone();
        }
        let seen = Arc::new(Event::new(
            e.rv,
            e.kind,
            self.object(&e.object),
            e.prev.as_ref().map(|p| self.object(p)),
        ));
        if kept.len() == KEPT {
            kept.remove(0);
        }
        kept.push((e.clone(), seen.clone()));
        seen
    }

    /// The view changed: its readers must relist before they resume a
    /// watch ([`View::resumes_expire`]).
    pub fn expire_resumes(&self) {
        self.expire_resumes.store(true, Ordering::SeqCst);
    }

    /// Whether a watch with the view resuming from a resourceVersion gets
    /// `410 Expired`.
    pub fn resumes_expire(&self) -> bool {
        self.expire_resumes.load(Ordering::SeqCst)
    }

    /// A reader listed with the view (a list, or a watch's initial
    /// events): it holds what the view shows now.
    pub fn listed(&self) {
        self.expire_resumes.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apimachinery::resource::FieldSet;
    use apimachinery::watch::EventType;

    fn service(name: &str, rv: u64, ip: &str) -> Arc<CachedObject> {
        let json = format!(
            r#"{{"kind":"Service","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"default","resourceVersion":"{rv}"}},"spec":{{"clusterIP":"{ip}"}}}}"#
        );
        Arc::new(CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).unwrap())
    }

    fn view() -> View {
        View::new(
            "default/kubernetes",
            Box::new(|o| {
                let text = String::from_utf8(o.json().to_vec()).ok()?;
                let json = text.replace("10.96.0.1", "169.254.64.1");
                CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).ok()
            }),
        )
    }

    #[test]
    fn only_the_views_object_is_rewritten_once_per_version() {
        let v = view();
        let k = service("kubernetes", 5, "10.96.0.1");
        let other = service("other", 6, "10.96.0.1");
        let seen = v.object(&k);
        assert!(
            std::str::from_utf8(seen.json())
                .unwrap()
                .contains("169.254.64.1")
        );
        assert_eq!(seen.rv, 5);
        assert!(Arc::ptr_eq(&v.object(&k), &seen), "rewritten again");
        assert!(Arc::ptr_eq(&v.object(&other), &other));

        let objects: Objects = [
            (k.key_arc().clone(), k.clone()),
            (other.key_arc().clone(), other.clone()),
        ]
        .into_iter()
        .collect();
        let viewed = v.objects(&objects);
        assert!(Arc::ptr_eq(
            viewed.get("default/kubernetes").unwrap(),
            &seen
        ));
        assert!(Arc::ptr_eq(viewed.get("default/other").unwrap(), &other));
        // The cache's own map is untouched.
        assert!(Arc::ptr_eq(objects.get("default/kubernetes").unwrap(), &k));

        let mut items = vec![other.clone(), k.clone()];
        v.items(&mut items);
        assert!(Arc::ptr_eq(&items[1], &seen) && Arc::ptr_eq(&items[0], &other));
    }

    #[test]
    fn an_event_of_the_object_carries_both_versions_as_viewed() {
        let v = view();
        let before = service("kubernetes", 5, "10.96.0.1");
        let after = service("kubernetes", 9, "10.96.0.2");
        let e = Arc::new(Event::new(
            9,
            EventType::Modified,
            after.clone(),
            Some(before.clone()),
        ));
        let seen = v.event(&e);
        assert_eq!((seen.rv, seen.kind), (9, EventType::Modified));
        assert!(Arc::ptr_eq(&seen.object, &v.object(&after)));
        assert!(Arc::ptr_eq(seen.prev.as_ref().unwrap(), &v.object(&before)));
        assert!(Arc::ptr_eq(&v.event(&e), &seen), "rewritten again");
        let other = Arc::new(Event::new(
            10,
            EventType::Added,
            service("x", 10, "1.2.3.4"),
            None,
        ));
        assert!(Arc::ptr_eq(&v.event(&other), &other));
    }

    #[test]
    fn resumes_expire_from_a_change_until_a_list() {
        let v = view();
        assert!(!v.resumes_expire());
        v.expire_resumes();
        assert!(v.resumes_expire());
        v.listed();
        assert!(!v.resumes_expire());
        // Turned off: the cache's own, and a relist.
        let k = service("kubernetes", 5, "10.96.0.1");
        assert!(v.set_on(false));
        assert!(!v.set_on(false));
        assert!(v.resumes_expire());
        assert!(Arc::ptr_eq(&v.object(&k), &k));
        v.listed();
        assert!(v.set_on(true));
        assert!(v.resumes_expire());
        assert!(!Arc::ptr_eq(&v.object(&k), &k));
    }
}
