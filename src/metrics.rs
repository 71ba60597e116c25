//! Prometheus metrics: one `Metrics` struct on a registry passed in, no
//! globals. Names follow `kube_cache_proxy_<what>_<unit>`; labels are of low
//! cardinality only (verb, group, resource, code, source), never a
//! namespace, name or user.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Served from the watch cache.
    Cache,
    /// Passed through to the apiserver.
    Upstream,
    /// Answered by the proxy itself (an error it produced, e.g. `401`).
    Proxy,
}

impl Source {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::Upstream => "upstream",
            Source::Proxy => "proxy",
        }
    }
}

/// Every metric the proxy exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Requests completed, by verb, API group, resource, HTTP code and source.
    pub requests: IntCounterVec,
    /// Time from request to response headers, by verb, resource and source.
    pub request_duration: HistogramVec,
    /// Requests being served (including open watches), by source.
    pub in_flight: IntGaugeVec,
    /// Failures talking to the apiserver, by reason.
    pub upstream_errors: IntCounterVec,
    /// Open client connections.
    pub connections: IntGauge,
    /// TLS handshakes that failed, by reason.
    pub tls_handshake_errors: IntCounterVec,
    /// Time added by the proxy before a request is sent upstream.
    pub proxy_overhead: Histogram,
    /// 1 when /readyz passes, else 0 (set at scrape).
    pub ready: IntGauge,
    /// The serving certificate's notAfter (set at scrape).
    pub serving_certificate_expiry: IntGauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

const NS: &str = "kube_cache_proxy";

/// Latency buckets in seconds, from 0.25 ms (a cached get) to 60 s.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
];

// === impl Metrics ===

impl Metrics {
    /// Registers every metric on `registry`.
    ///
    /// # Errors
    /// When a metric is already registered there.
    pub fn new(registry: Registry) -> Result<Metrics, prometheus::Error> {
        let requests = IntCounterVec::new(
            Opts::new("requests_total", "Requests completed, by verb, API group, resource, HTTP code and source (cache|upstream|proxy).")
                .namespace(NS),
            &["verb", "group", "resource", "code", "source"],
        )?;
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "request_duration_seconds",
                "Time from receiving a request to sending its response headers, in seconds, by verb, resource and source.",
            )
            .namespace(NS)
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["verb", "resource", "source"],
        )?;
        let in_flight = IntGaugeVec::new(
            Opts::new(
                "requests_in_flight",
                "Requests being served, including open watches, by source.",
            )
            .namespace(NS),
            &["source"],
        )?;
        let upstream_errors = IntCounterVec::new(
            Opts::new("upstream_errors_total", "Pass-through failures talking to kube-apiserver, by reason (connect: TCP/TLS connection or its timeout; protocol: the request failed after connecting; credentials: the proxy's own token could not be produced; config).")
                .namespace(NS),
            &["reason"],
        )?;
        let connections = IntGauge::with_opts(
            Opts::new("client_connections", "Open client connections.").namespace(NS),
        )?;
        let tls_handshake_errors = IntCounterVec::new(
            Opts::new(
                "tls_handshake_errors_total",
                "Client TLS handshakes that failed, by reason (timeout|error).",
            )
            .namespace(NS),
            &["reason"],
        )?;
        let proxy_overhead = Histogram::with_opts(
            HistogramOpts::new(
                "passthrough_overhead_seconds",
                "Time spent in the proxy before a passed-through request is handed to the upstream connection pool, in seconds.",
            )
            .namespace(NS)
            .buckets(vec![0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01]),
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_duration.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(upstream_errors.clone()))?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(tls_handshake_errors.clone()))?;
        let ready = IntGauge::with_opts(
            Opts::new(
                "ready",
                "1 when every readiness check passes (as /readyz), else 0.",
            )
            .namespace(NS),
        )?;
        let serving_certificate_expiry = IntGauge::with_opts(
            Opts::new(
                "serving_certificate_expiry_timestamp_seconds",
                "When the serving certificate in use expires, in seconds since the Unix epoch.",
            )
            .namespace(NS),
        )?;
        registry.register(Box::new(proxy_overhead.clone()))?;
        registry.register(Box::new(ready.clone()))?;
        registry.register(Box::new(serving_certificate_expiry.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            request_duration,
            in_flight,
            upstream_errors,
            connections,
            tls_handshake_errors,
            proxy_overhead,
            ready,
            serving_certificate_expiry,
        })
    }

    /// The registry, for registering further metric families (cache, auth).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let families = self.registry.gather();
        prometheus::TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_registered_metrics() {
        let m = Metrics::new(Registry::new()).unwrap();
        m.requests
            .with_label_values(&["list", "", "pods", "200", "cache"])
            .inc();
        let text = m.encode();
        assert!(text.contains("kube_cache_proxy_requests_total{code=\"200\",group=\"\",resource=\"pods\",source=\"cache\",verb=\"list\"} 1"), "{text}");
    }
}
