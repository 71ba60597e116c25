//! Authentication and authorization metrics.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

const NS: &str = "kube_cache_proxy";

/// Decisions by result and source, and their latency.
#[derive(Clone)]
pub struct AuthMetrics {
    authentication: IntCounterVec,
    authentication_duration: HistogramVec,
    authorization: IntCounterVec,
    authorization_duration: HistogramVec,
}

impl std::fmt::Debug for AuthMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthMetrics").finish_non_exhaustive()
    }
}

const BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
];

// === impl AuthMetrics ===

impl AuthMetrics {
    /// Registers the families on `registry`.
    ///
    /// # Errors
    /// When a family is already registered.
    pub fn new(registry: &Registry) -> Result<AuthMetrics, prometheus::Error> {
        let m = AuthMetrics {
            authentication: IntCounterVec::new(
                Opts::new("authentication_total", "Bearer-token authentications of requests served from the cache, by result (authenticated|unauthenticated|error) and source (cache|upstream TokenReview|last_known: upstream unavailable, the last answer stood in).").namespace(NS),
                &["result", "source"],
            )?,
            authentication_duration: HistogramVec::new(
                HistogramOpts::new("authentication_duration_seconds", "Time to authenticate a bearer token, in seconds, by source (cache|upstream).")
                    .namespace(NS)
                    .buckets(BUCKETS.to_vec()),
                &["source"],
            )?,
            authorization: IntCounterVec::new(
                Opts::new("authorization_total", "Authorization decisions (cached reads and impersonation checks), by result (allowed|denied|error) and source (cache|upstream SubjectAccessReview|last_known: upstream unavailable, the last decision stood in).").namespace(NS),
                &["result", "source"],
            )?,
            authorization_duration: HistogramVec::new(
                HistogramOpts::new("authorization_duration_seconds", "Time to authorize a request, in seconds, by source (cache|upstream).")
                    .namespace(NS)
                    .buckets(BUCKETS.to_vec()),
                &["source"],
            )?,
        };
        // Every label set is known: exported from start, at zero.
        for source in ["cache", "upstream"] {
            for result in ["authenticated", "unauthenticated", "error"] {
                m.authentication.with_label_values(&[result, source]);
            }
            for result in ["allowed", "denied", "error"] {
                m.authorization.with_label_values(&[result, source]);
            }
            m.authentication_duration.with_label_values(&[source]);
            m.authorization_duration.with_label_values(&[source]);
        }
        registry.register(Box::new(m.authentication.clone()))?;
        registry.register(Box::new(m.authentication_duration.clone()))?;
        registry.register(Box::new(m.authorization.clone()))?;
        registry.register(Box::new(m.authorization_duration.clone()))?;
        Ok(m)
    }

    /// Records an authentication.
    pub fn authenticated(&self, result: &str, source: &str, seconds: f64) {
        self.authentication
            .with_label_values(&[result, source])
            .inc();
        self.authentication_duration
            .with_label_values(&[source])
            .observe(seconds);
    }

    /// Records an authorization decision.
    pub fn authorized(&self, result: &str, source: &str, seconds: f64) {
        self.authorization
            .with_label_values(&[result, source])
            .inc();
        self.authorization_duration
            .with_label_values(&[source])
            .observe(seconds);
    }
}
