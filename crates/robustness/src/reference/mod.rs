//! etcd's own history, the reference every watch stream is validated
//! against.
//!
//! kube-apiserver runs with its default storage media type, so an etcd
//! value is the object's protobuf envelope, read back as the JSON the
//! apiserver would send (`apimachinery::protobuf::object_json`; a value in
//! JSON is read as it is); an object's resourceVersion is its etcd
//! `mod_revision`, and a deletion's resourceVersion is the revision of the
//! DELETE. The run records the state at a start revision (an etcd range)
//! and an etcd watch from there; [`Reference`] is fed with both, already
//! decoded, and answers what a watcher with a given
//! [`Filter`](crate::model::Filter) should have seen: the state at a
//! revision ([`Reference::state_at`]) and the watch events for a range of
//! revisions ([`Reference::expected`]).
//!
//! Storage, per resource: the base state, the changes sorted by revision,
//! each key's versions (for point queries), and checkpoints of the whole
//! state every `max(1000, number of objects)` changes, so that
//! [`Reference::state_at`] replays at most that many changes and the
//! checkpoints together hold no more entries than there are changes.
//!
//! `version`: an object's version as selectors see it, and a change;
//! `history`: one resource's history and its checkpoints; `record`: the
//! [`Reference`] fed from etcd; `queries`: what a watcher should have seen.

mod history;
mod queries;
mod record;
mod version;

pub use queries::Expected;
pub use record::Reference;
pub use version::{Change, Version};

#[cfg(test)]
mod tests;
