//! Objects' JSON packed into shared chunks.
//!
//! Each cached object's JSON would otherwise be an allocation of its own,
//! rounded up to the allocator's next size class: from 4 KiB to 8 KiB
//! jemalloc's classes are 1 KiB apart ([jemalloc(3)], "Size classes"), so
//! a 4,296-byte pod takes 5,120 bytes, 19 % more than its JSON. In a big
//! store (at least [`MIN_STORE_BYTES`]), objects entering the store are
//! instead copied into chunks of [`CHUNK`] bytes, each object a `Bytes`
//! slice of its chunk, and a chunk is freed when the last slice of it is
//! dropped.
//!
//! A chunk lives as long as any object in it, so a chunk of which only a
//! few objects are still current would hold the memory of all of them.
//! The store counts, for each chunk, how many of the objects it placed
//! there are still current ([`Packs::left`]); once a chunk that is no
//! longer being filled has fewer than three quarters of its objects
//! current, the rest are copied out into allocations of their own
//! ([`State`](super::State) does, under its lock), and the chunk is freed
//! once the history and any reader let go of its old versions. For
//! longer than the history keeps events, a chunk is therefore kept only
//! while at least three quarters of its objects are current: about 4/3 of
//! their bytes at worst, against the size class's up to 5/4.
//!
//! A list that fills a store is packed as it is read ([`Listed`]), not
//! once it is complete: every object of a 10,000-pod list in an allocation
//! of its own until the store took them, then all freed at once, left the
//! allocator with as many dirty pages as the list's JSON, which an idle
//! proxy never gave back (docs/performance.md (c), "A first list packed
//! as it is read").
//!
//! [jemalloc(3)]: https://jemalloc.net/jemalloc.3.html

use std::collections::HashMap;
use std::sync::Arc;

use bytes::BytesMut;

use crate::cache::object::CachedObject;

/// Bytes per chunk: a size class of its own (a multiple of the page), so
/// the allocator adds nothing to it.
pub const CHUNK: usize = 128 * 1024;

/// Objects bigger than this keep an allocation of their own, so that the
/// tail a chunk cannot use when the next object does not fit stays under
/// an eighth of it.
pub const MAX_PACKED: usize = CHUNK / 8;

/// Stores smaller than this keep one allocation per object: an open chunk
/// could be most of a small store's memory.
pub const MIN_STORE_BYTES: usize = 1 << 20;

/// The chunks of one store and which of their objects are current.
#[derive(Debug, Default)]
pub struct Packs {
    /// The chunk being filled: its id and its unused capacity.
    open: Option<(u32, BytesMut)>,
    /// The last id given (0 is "not packed").
    last: u32,
    members: HashMap<u32, Members>,
}

/// The objects placed in one chunk.
#[derive(Debug, Default)]
struct Members {
    /// The key of every object placed (a key twice when two versions of an
    /// object were placed while the chunk was open).
    keys: Vec<Arc<str>>,
    /// How many of them are current in the store.
    live: usize,
}

impl Members {
    /// Whether so few of the chunk's objects are current that the rest
    /// should be copied out.
    fn sparse(&self) -> bool {
        self.live * 4 < self.keys.len() * 3
    }
}

/// The objects of an upstream list (or a snapshot) as they are read, for
/// [`State::replace`](super::State::replace). Packed ([`Listed::packed`]),
/// each object's JSON goes into a chunk as soon as it is read, and its own
/// allocation is freed at once and reused by the next object's, so that
/// the list never holds its objects twice. The store takes the chunks when
/// the list is its first fill of at least [`MIN_STORE_BYTES`]; otherwise it
/// copies the objects out.
#[derive(Debug, Default)]
pub struct Listed {
    items: Vec<CachedObject>,
    /// `Some` when packed.
    packs: Option<Packs>,
}

/// A chunk whose current objects should be copied out: its id, and the
/// keys of the objects placed in it. Those still in the store with this
/// chunk's id are its current objects.
#[derive(Debug)]
pub struct Sparse {
    pub id: u32,
    pub keys: Vec<Arc<str>>,
}

// === impl Listed ===

impl Listed {
    /// A list whose objects are packed as they come: the first fill of a
    /// store.
    pub fn packed() -> Listed {
        Listed {
            items: Vec::new(),
            packs: Some(Packs::default()),
        }
    }

    /// A list whose objects keep their own allocations: a relist, whose
    /// objects mostly replace nothing (`State::replace`).
    pub fn unpacked() -> Listed {
        Listed::default()
    }

    /// Adds the next object of the list.
    pub fn push(&mut self, mut object: CachedObject) {
        if let Some(packs) = &mut self.packs {
            // Every object of the list is current: no chunk is sparse.
            let _ = packs.place(&mut object, usize::MAX);
        }
        self.items.push(object);
    }

    /// The objects so far.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The objects so far (for tests).
    #[cfg(test)]
    pub fn items(&self) -> &[CachedObject] {
        &self.items
    }

    /// The objects, and their chunks when packed.
    pub fn into_parts(self) -> (Vec<CachedObject>, Option<Packs>) {
        (self.items, self.packs)
    }
}

impl From<Vec<CachedObject>> for Listed {
    /// Objects read already, unpacked: the store packs a first fill of
    /// them under its lock, copying each again.
    fn from(items: Vec<CachedObject>) -> Listed {
        Listed { items, packs: None }
    }
}

// === impl Packs ===

impl Packs {
    /// Moves `object`'s JSON into the open chunk, when the store holds at
    /// least [`MIN_STORE_BYTES`] (`store_bytes`) and the object is at most
    /// [`MAX_PACKED`]; `object` is entering the store. Returns a chunk
    /// closed to make room, when it is already sparse.
    pub fn place(&mut self, object: &mut CachedObject, store_bytes: usize) -> Option<Sparse> {
        let len = object.json().len();
        if store_bytes < MIN_STORE_BYTES || len > MAX_PACKED || len == 0 {
            return None;
        }
        let mut closed = None;
        if self
            .open
            .as_ref()
            .is_none_or(|(_, buf)| buf.capacity() < len)
        {
            if let Some((id, _)) = self.open.take() {
                closed = self.closed(id);
            }
            self.last = self.last.wrapping_add(1).max(1);
            self.open = Some((self.last, BytesMut::with_capacity(CHUNK)));
        }
        let (id, buf) = self.open.as_mut()?;
        buf.extend_from_slice(object.json());
        let json = buf.split().freeze();
        object.set_packed(json, *id);
        let m = self.members.entry(*id).or_default();
        m.keys.push(object.key_arc().clone());
        m.live += 1;
        closed
    }

    /// Records that an object placed in chunk `id` left the store (it was
    /// replaced or deleted). Returns the chunk when it is now sparse and
    /// no longer being filled.
    pub fn left(&mut self, id: u32) -> Option<Sparse> {
        let m = self.members.get_mut(&id)?;
        m.live = m.live.saturating_sub(1);
        if m.live == 0 {
            self.members.remove(&id);
            return None;
        }
        if self.open.as_ref().is_some_and(|(open, _)| *open == id) {
            return None;
        }
        self.closed(id)
    }

    /// A chunk no longer filled, when it is sparse.
    fn closed(&mut self, id: u32) -> Option<Sparse> {
        if !self.members.get(&id)?.sparse() {
            return None;
        }
        let m = self.members.remove(&id)?;
        Some(Sparse { id, keys: m.keys })
    }

    /// Forgets every chunk (the store's objects were all replaced). Ids go
    /// on from the last one, so an old object never names a new chunk.
    pub fn clear(&mut self) {
        self.open = None;
        self.members.clear();
    }

    /// Chunks with objects current in the store (for tests).
    #[cfg(test)]
    pub fn chunks(&self) -> usize {
        self.members.len()
    }
}
