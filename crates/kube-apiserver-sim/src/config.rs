//! How the sim behaves: [`SimConfig`], in a module of its own so that the
//! parts that read it (`state`) need not point back at the crate root.

use std::time::Duration;

/// How the sim behaves.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The global resourceVersion before the first write. Default 100.
    pub initial_resource_version: u64,
    /// Events kept per resource; watches and exact lists from older RVs get
    /// 410. Default 1000.
    pub history_limit: usize,
    /// How often an idle watch with `allowWatchBookmarks` gets a bookmark
    /// (the apiserver's is one minute). Default 60 s.
    pub bookmark_interval: Duration,
    /// How long a read with a resourceVersion newer than the store waits
    /// before its 504 (the apiserver's `blockTimeout`). Default 3 s.
    pub too_large_rv_wait: Duration,
    /// Whether requests without credentials are `system:anonymous`
    /// (otherwise 401). Default true.
    pub anonymous_auth: bool,
    /// The user the proxy authenticates as upstream; it may read
    /// everything, create token and access reviews, and impersonate.
    /// Default `system:serviceaccount:kube-system:kube-cache-proxy`.
    pub proxy_user: String,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            initial_resource_version: 100,
            history_limit: 1000,
            bookmark_interval: Duration::from_secs(60),
            too_large_rv_wait: Duration::from_secs(3),
            anonymous_auth: true,
            proxy_user: "system:serviceaccount:kube-system:kube-cache-proxy".to_string(),
        }
    }
}
