//! What a consistency probe may take and how it fails: the `limit=1`
//! list that learns upstream's current resourceVersion for a consistent
//! read (`cache::ingest::reflector` sends it, `cache::resource` shares one among
//! the reads waiting on it, `cache::serve` answers by its outcome).

use std::time::Duration;

/// How long a consistency probe may take. It is a `limit=1` list, which
/// an idle apiserver answers in milliseconds; a loaded one queues it in
/// API Priority and Fairness for up to a quarter of its request timeout
/// (15 s by default) before answering `429`, and the read it proves would
/// wait in the same queue if passed through, at the cost of a relist. So
/// the probe waits long enough to ride out a loaded apiserver, and what
/// still gets no answer is busy ([`ProbeError::Unanswered`]).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a consistency probe gave no resourceVersion to wait for.
///
/// When upstream shed it or did not answer ([`ProbeError::is_busy`]), the
/// read it was for is answered with an error to retry (`429` or `503`,
/// `Retry-After: 1`), never passed through, since a pass-through would
/// cost an overloaded apiserver a whole list where the probe cost it one
/// object (seen in a mass restart of 50 hollow nodes: docs/performance.md,
/// section (k)). Any other failure passes the read through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// Upstream shed it: `429`, API Priority and Fairness's answer when a
    /// request waited out its queue.
    #[error("upstream busy: {0}")]
    Shed(String),
    /// No answer within [`PROBE_TIMEOUT`].
    #[error("upstream busy: no answer in {PROBE_TIMEOUT:?}")]
    Unanswered,
    /// Upstream's current resourceVersion is below the cache's: its
    /// history went back ([`super::resource::ResourceCache::rewound`]).
    #[error("upstream's current resourceVersion is below the cache's: its history went back")]
    Rewound,
    /// Anything else: refused, an error status, an unreadable answer.
    #[error("{0}")]
    Failed(String),
}

impl ProbeError {
    /// Whether upstream shed the probe or left it unanswered.
    pub fn is_busy(&self) -> bool {
        matches!(self, ProbeError::Shed(_) | ProbeError::Unanswered)
    }
}
