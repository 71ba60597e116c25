//! The ingest side of the cache: what reads upstream and keeps each
//! resource's cache right. The reflector's list+watch (`reflector`, reading
//! protobuf through `upstream_protobuf`), snapshots on disk (`persist`),
//! the consistency checker (`checker`) and the silence watchdog
//! (`silence`). It imports the shared core (`cache::{resource, store,
//! object, event, encode, probe, compaction}`), never the serving side
//! (`cache::serve`).

pub mod checker;
pub mod persist;
pub mod reflector;
pub mod silence;
pub mod upstream_protobuf;
