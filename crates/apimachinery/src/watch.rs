//! Watch events, as `k8s.io/apimachinery/pkg/watch` names them: the
//! `type` of every event of a watch stream. The proxy's watch cache writes
//! these events and the simulated apiserver serves them, so both read the
//! same names from here.

/// The type of a watch event. Its discriminant (0, 1, 2) indexes
/// per-type tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The `type` of the JSON watch event.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}
