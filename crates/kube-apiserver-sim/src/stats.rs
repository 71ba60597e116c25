//! What the sim has been asked: counters per verb and resource, open and
//! started watches, and a bounded log of requests, so tests can assert how
//! much load a proxy put on its upstream.

use std::collections::{BTreeMap, VecDeque};

use parking_lot::Mutex;

use super::authn::AuthMethod;

/// How many requests [`Stats`]'s log keeps.
pub const REQUEST_LOG_LIMIT: usize = 10_000;

/// One request, as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// Raw query string, without `?`.
    pub query: String,
    /// The apiserver verb (`list`, `watch`, `get`...; lowercase method for
    /// non-resource requests).
    pub verb: String,
    /// `resource` or `resource/subresource`; the path for non-resource
    /// requests.
    pub resource: String,
    pub namespace: String,
    pub name: String,
    /// The user the request acted as (after impersonation).
    pub user: String,
    /// Its groups.
    pub groups: Vec<String>,
    /// The user who authenticated (the impersonator, if impersonating).
    pub authenticated_user: String,
    pub auth_method: AuthMethod,
    /// Whether `Impersonate-*` headers were honoured.
    pub impersonated: bool,
    /// Whether the request carried an `Authorization` header.
    pub has_authorization: bool,
    /// The `Accept` header, if any.
    pub accept: String,
    /// The response status code.
    pub status: u16,
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests by (verb, resource); see [`RequestRecord::resource`].
    pub requests_by_verb_resource: BTreeMap<(String, String), u64>,
    /// Watches open now, by resource.
    pub watches_open_by_resource: BTreeMap<String, i64>,
    /// Watches started (streams begun), by resource.
    pub watches_started_by_resource: BTreeMap<String, u64>,
    /// Every request received.
    pub total_requests: u64,
}

// === impl Stats ===

impl Stats {
    /// Requests with `verb` on `resource` (e.g. `("list", "pods")`).
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.requests_by_verb_resource
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Lists of `resource` received.
    pub fn lists(&self, resource: &str) -> u64 {
        self.count("list", resource)
    }

    /// Watch requests of `resource` received (including refused ones).
    pub fn watches(&self, resource: &str) -> u64 {
        self.count("watch", resource)
    }

    /// Watch streams of `resource` open now.
    pub fn watches_open(&self, resource: &str) -> i64 {
        self.watches_open_by_resource
            .get(resource)
            .copied()
            .unwrap_or(0)
    }

    /// Watch streams of `resource` started so far.
    pub fn watches_started(&self, resource: &str) -> u64 {
        self.watches_started_by_resource
            .get(resource)
            .copied()
            .unwrap_or(0)
    }
}

/// The live counters behind [`Stats`].
#[derive(Debug, Default)]
pub struct Collector {
    stats: Mutex<Stats>,
    log: Mutex<VecDeque<RequestRecord>>,
}

// === impl Collector ===

impl Collector {
    /// Counts a request.
    pub fn request(&self, verb: &str, resource: &str) {
        let mut s = self.stats.lock();
        s.total_requests += 1;
        *s.requests_by_verb_resource
            .entry((verb.to_string(), resource.to_string()))
            .or_default() += 1;
    }

    /// Logs a finished request, dropping the oldest beyond the limit.
    pub fn record(&self, record: RequestRecord) {
        let mut log = self.log.lock();
        if log.len() >= REQUEST_LOG_LIMIT {
            log.pop_front();
        }
        log.push_back(record);
    }

    /// A watch stream of `resource` began; the guard ends it when dropped.
    pub fn watch_started(self: &std::sync::Arc<Self>, resource: &str) -> WatchGuard {
        let mut s = self.stats.lock();
        *s.watches_started_by_resource
            .entry(resource.to_string())
            .or_default() += 1;
        *s.watches_open_by_resource
            .entry(resource.to_string())
            .or_default() += 1;
        WatchGuard {
            collector: self.clone(),
            resource: resource.to_string(),
        }
    }

    /// A snapshot of the counters.
    pub fn snapshot(&self) -> Stats {
        self.stats.lock().clone()
    }

    /// The request log, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.log.lock().iter().cloned().collect()
    }
}

/// Counts one open watch until dropped.
#[derive(Debug)]
pub struct WatchGuard {
    collector: std::sync::Arc<Collector>,
    resource: String,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let mut s = self.collector.stats.lock();
        *s.watches_open_by_resource
            .entry(self.resource.clone())
            .or_default() -= 1;
    }
}
