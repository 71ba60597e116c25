//! Prometheus metrics: one `Metrics` struct on a registry passed in, no
//! globals. Names follow `kube_cache_proxy_<what>_<unit>`; labels are of low
//! cardinality only (verb, group, resource, subresource, scope, code,
//! source), never a namespace, name or user. Request labels are
//! kube-apiserver's (`apiserver_request_total`): see [`RequestLabels`].

use http::{HeaderMap, Method};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use apimachinery::request::RequestInfo;

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

/// The labels a request is counted under, computed as kube-apiserver
/// computes them for `apiserver_request_total` and
/// `apiserver_request_duration_seconds`
/// (`staging/src/k8s.io/apiserver/pkg/endpoints/metrics/metrics.go`:
/// `CanonicalVerb`, `CleanVerb`, `cleanVerb`, and the installer's scope in
/// `endpoints/installer.go`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLabels {
    /// The HTTP method in upper case, except: `LIST` for a GET (or HEAD) of
    /// a collection; `WATCH` for a GET with `watch` set (not `0` or
    /// `false`) or on the legacy `/watch/` path; `APPLY` for a PATCH with
    /// `Content-Type: application/apply-patch+yaml`; `CONNECT` for the
    /// `log`, `exec`, `attach`, `portforward` and `proxy` subresources;
    /// `other` for a method outside kube-apiserver's list. As there, a
    /// create is `POST`, an update `PUT`, a delete of a collection
    /// `DELETE`.
    pub verb: &'static str,
    /// API group; empty for the core group and non-resource requests.
    pub group: String,
    /// Resource; `other` for one the proxy does not know (bounded
    /// cardinality), empty for non-resource requests.
    pub resource: String,
    /// Subresource; for a non-resource request its path, as kube-apiserver
    /// records `/healthz` or `/openapi/v2`; `other` when unknown.
    pub subresource: String,
    /// `resource` (a named object, or a create), `namespace` (a collection
    /// in one namespace), `cluster` (a cluster-scoped collection, or all
    /// namespaces), empty for non-resource requests.
    pub scope: &'static str,
}

/// Verbs kube-apiserver reports; any other is `other`
/// (`validRequestMethods`; `WATCHLIST` is reported as `WATCH`).
const VALID_VERBS: &[&str] = &[
    "APPLY",
    "CONNECT",
    "CREATE",
    "DELETE",
    "DELETECOLLECTION",
    "GET",
    "LIST",
    "PATCH",
    "POST",
    "PROXY",
    "PUT",
    "UPDATE",
    "WATCH",
];

/// Subresources reported as `CONNECT` (`validConnectRequests`).
const CONNECT_SUBRESOURCES: &[&str] = &["log", "exec", "portforward", "attach", "proxy"];

/// Subresources of Kubernetes' built-in and custom resources; any other
/// is `other`, so a client cannot grow the label set.
const KNOWN_SUBRESOURCES: &[&str] = &[
    "approval",
    "attach",
    "binding",
    "ephemeralcontainers",
    "eviction",
    "exec",
    "finalize",
    "log",
    "portforward",
    "proxy",
    "resize",
    "scale",
    "status",
    "token",
];

/// Non-resource paths reported by path (kube-apiserver's own); others are
/// `other`.
const KNOWN_PATHS: &[&str] = &[
    "/",
    "/.well-known/openid-configuration",
    "/api",
    "/apis",
    "/healthz",
    "/livez",
    "/metrics",
    "/openapi/v2",
    "/openapi/v3",
    "/openid/v1/jwks",
    "/readyz",
    "/version",
];

// === impl RequestLabels ===

impl RequestLabels {
    /// The labels of a request. `known_resource` says whether the resource
    /// may be named (else it is `other`).
    pub fn of(
        method: &Method,
        query: Option<&str>,
        headers: &HeaderMap,
        info: &RequestInfo,
        known_resource: bool,
    ) -> RequestLabels {
        let scope = if !info.is_resource_request {
            ""
        } else if named_in_path(info) || *method == Method::POST {
            "resource"
        } else if !info.namespace.is_empty() {
            "namespace"
        } else {
            "cluster"
        };
        let upper = method.as_str().to_ascii_uppercase();
        // CanonicalVerb: GETs of collections are LISTs.
        let mut verb = match upper.as_str() {
            "GET" | "HEAD" if scope != "resource" && !scope.is_empty() => "LIST".to_string(),
            "HEAD" => "GET".to_string(),
            _ => upper,
        };
        // CleanVerb.
        if info.legacy_watch_path || (matches!(*method, Method::GET) && watch_requested(query)) {
            verb = "WATCH".into();
        }
        if *method == Method::PATCH
            && headers
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes() == b"application/apply-patch+yaml")
        {
            verb = "APPLY".into();
        }
        if info.is_resource_request && CONNECT_SUBRESOURCES.contains(&info.subresource.as_str()) {
            verb = "CONNECT".into();
        }
        let verb = VALID_VERBS
            .iter()
            .find(|v| **v == verb)
            .copied()
            .unwrap_or("other");
        let (group, resource, subresource) = if !info.is_resource_request {
            let path = info.path.trim_end_matches('/');
            let path = if path.is_empty() { "/" } else { path };
            let path = if path.starts_with("/openapi/v3/") {
                "/openapi/v3"
            } else {
                path
            };
            let known = KNOWN_PATHS.iter().find(|p| **p == path).copied();
            (
                String::new(),
                String::new(),
                known.unwrap_or("other").to_string(),
            )
        } else {
            let subresource = if info.subresource.is_empty()
                || KNOWN_SUBRESOURCES.contains(&info.subresource.as_str())
            {
                info.subresource.clone()
            } else {
                "other".to_string()
            };
            if known_resource {
                (info.api_group.clone(), info.resource.clone(), subresource)
            } else {
                (String::new(), "other".to_string(), subresource)
            }
        };
        RequestLabels {
            verb,
            group,
            resource,
            subresource,
            scope,
        }
    }
}

/// Whether the request path names an object (a field selector's
/// `metadata.name` does not count: the installer's scope is the route's).
fn named_in_path(info: &RequestInfo) -> bool {
    let collection_verb = info.verb == "list" || (info.verb == "watch" && !info.legacy_watch_path);
    !info.name.is_empty() && !collection_verb
}

/// `getVerbIfWatch`: the first `watch` parameter, unless `0` or `false`
/// (case-insensitive).
fn watch_requested(query: Option<&str>) -> bool {
    apimachinery::url::query_get(query, "watch")
        .is_some_and(|v| !matches!(v.to_ascii_lowercase().as_str(), "0" | "false"))
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
    /// 1 while `upstream.fallback` is used, else 0.
    pub upstream_fallback_active: IntGauge,
    /// 1, labeled by the upstream apiserver's version and impersonation
    /// filter, once learnt.
    pub upstream_info: IntGaugeVec,
    /// With client-side balancing: the apiservers known, by state.
    pub upstream_apiservers: IntGaugeVec,
    /// With client-side balancing: connections opened, by apiserver.
    pub upstream_apiserver_connections: IntCounterVec,
    /// kubelet's view of the `default/kubernetes` Service
    /// (`podNetwork.kubernetesService`).
    pub kubernetes_service: KubernetesServiceMetrics,
}

/// `podNetwork.kubernetesService` (`server::kubernetes_service`).
#[derive(Debug, Clone)]
pub struct KubernetesServiceMetrics {
    /// 1 while kubelet reads the Service rewritten.
    pub rewritten: IntGauge,
    /// kubelet's reads of Services, by verb and result.
    pub reads: IntCounterVec,
    /// Times the rewrite was turned on or off.
    pub changes: IntCounter,
}

impl KubernetesServiceMetrics {
    fn new(registry: &Registry) -> Result<KubernetesServiceMetrics, prometheus::Error> {
        let rewritten = IntGauge::with_opts(
            Opts::new(
                "kubernetes_service_rewritten",
                "1 while this node's kubelet reads the default/kubernetes Service rewritten to \
                 podNetwork.listen (podNetwork.kubernetesService), else 0.",
            )
            .namespace(NS),
        )?;
        let reads = IntCounterVec::new(
            Opts::new(
                "kubernetes_service_reads_total",
                "Reads of Services by this node's kubelet with podNetwork.kubernetesService set, \
                 by verb and result: rewritten (answered from the cache, default/kubernetes \
                 rewritten), real (answered from the cache while the rewrite is off) or \
                 passed_through (the cache declined: the apiserver's answer, the real Service).",
            )
            .namespace(NS),
            &["verb", "result"],
        )?;
        let changes = IntCounter::with_opts(
            Opts::new(
                "kubernetes_service_changes_total",
                "Times the default/kubernetes Service rewrite for kubelet was turned on or off \
                 (NodeLabel mode: the node's label); each ends kubelet's watches of Services so \
                 that it relists.",
            )
            .namespace(NS),
        )?;
        registry.register(Box::new(rewritten.clone()))?;
        registry.register(Box::new(reads.clone()))?;
        registry.register(Box::new(changes.clone()))?;
        for verb in ["get", "list", "watch"] {
            for result in ["rewritten", "real", "passed_through"] {
                reads.with_label_values(&[verb, result]);
            }
        }
        Ok(KubernetesServiceMetrics {
            rewritten,
            reads,
            changes,
        })
    }
}

/// `reason` values of `upstream_errors_total` (from
/// `UpstreamError::reason`), present from start.
pub const UPSTREAM_ERROR_REASONS: &[&str] = &["connect", "protocol", "credentials", "config"];
/// `reason` values of `tls_handshake_errors_total`, present from start.
pub const TLS_HANDSHAKE_ERROR_REASONS: &[&str] = &["timeout", "error"];

/// What the binary was built from, for `kube_cache_proxy_build_info`: like
/// Kubernetes components' `kubernetes_build_info`
/// (`component-base/metrics/prometheus/version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildInfo {
    /// The crate version (`CARGO_PKG_VERSION`).
    pub version: &'static str,
    /// The git commit, when the build was given one
    /// (`KUBE_CACHE_PROXY_GIT_COMMIT` at build time), else empty.
    pub git_commit: &'static str,
    /// `rustc --version` of the compiler that built it.
    pub rust_version: &'static str,
    /// The target triple, e.g. `x86_64-unknown-linux-gnu`.
    pub platform: &'static str,
}

mod built_info {
    include!(concat!(env!("OUT_DIR"), "/built.rs"));
}

/// This binary's build information.
pub const BUILD_INFO: BuildInfo = BuildInfo {
    version: built_info::PKG_VERSION,
    git_commit: match option_env!("KUBE_CACHE_PROXY_GIT_COMMIT") {
        Some(c) => c,
        None => "",
    },
    rust_version: built_info::RUSTC_VERSION,
    platform: built_info::TARGET,
};

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
            Opts::new("requests_total", "Requests completed, by verb, API group, resource, subresource, scope (as kube-apiserver's apiserver_request_total), HTTP code and source (cache|upstream|proxy).")
                .namespace(NS),
            &["verb", "group", "resource", "subresource", "scope", "code", "source"],
        )?;
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "request_duration_seconds",
                "Time from receiving a request to sending its response headers, in seconds, by verb, API group, resource, subresource, scope and source.",
            )
            .namespace(NS)
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["verb", "group", "resource", "subresource", "scope", "source"],
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
        let upstream_fallback_active = IntGauge::with_opts(
            Opts::new(
                "upstream_fallback_active",
                "1 while upstream.fallback is used because upstream.kubeconfig's server cannot be reached, else 0.",
            )
            .namespace(NS),
        )?;
        registry.register(Box::new(upstream_fallback_active.clone()))?;
        let upstream_info = IntGaugeVec::new(
            Opts::new(
                "upstream_info",
                "A metric with a constant '1' value labeled by the upstream kube-apiserver's git_version (/version) and the impersonation filter it runs (constrained or legacy), as last learnt (at start, every 5 minutes, and when the upstream switches servers).",
            )
            .namespace(NS),
            &["git_version", "impersonation"],
        )?;
        registry.register(Box::new(upstream_info.clone()))?;
        let upstream_apiservers = IntGaugeVec::new(
            Opts::new(
                "upstream_apiservers",
                "With upstream.clientSideBalancing: the apiservers learnt from the default/kubernetes EndpointSlices, by state as last probed (unknown, ready, not-ready, lagging).",
            )
            .namespace(NS),
            &["state"],
        )?;
        registry.register(Box::new(upstream_apiservers.clone()))?;
        let upstream_apiserver_connections = IntCounterVec::new(
            Opts::new(
                "upstream_apiserver_connections_total",
                "With upstream.clientSideBalancing: upstream TCP connections opened, by apiserver (ip:port; configured: the kubeconfig's server, while no apiserver is known or ready).",
            )
            .namespace(NS),
            &["apiserver"],
        )?;
        registry.register(Box::new(upstream_apiserver_connections.clone()))?;
        // Present from start (0 without client-side balancing).
        for state in ["unknown", "ready", "not-ready", "lagging"] {
            upstream_apiservers.with_label_values(&[state]).set(0);
        }
        upstream_apiserver_connections.with_label_values(&["configured"]);
        registry.register(Box::new(proxy_overhead.clone()))?;
        registry.register(Box::new(ready.clone()))?;
        registry.register(Box::new(serving_certificate_expiry.clone()))?;
        let build_info = IntGaugeVec::new(
            Opts::new(
                "build_info",
                "A metric with a constant '1' value labeled by version, git_commit, rust_version and platform from which kube-cache-proxy was built.",
            )
            .namespace(NS),
            &["version", "git_commit", "rust_version", "platform"],
        )?;
        build_info
            .with_label_values(&[
                BUILD_INFO.version,
                BUILD_INFO.git_commit,
                BUILD_INFO.rust_version,
                BUILD_INFO.platform,
            ])
            .set(1);
        registry.register(Box::new(build_info))?;
        // process_cpu_seconds_total, process_resident_memory_bytes,
        // process_open_fds... as every Kubernetes component exports them.
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        // Label sets known at start are exported from start, at zero.
        for reason in UPSTREAM_ERROR_REASONS {
            upstream_errors.with_label_values(&[*reason]);
        }
        for reason in TLS_HANDSHAKE_ERROR_REASONS {
            tls_handshake_errors.with_label_values(&[*reason]);
        }
        for source in [Source::Cache, Source::Upstream] {
            in_flight.with_label_values(&[source.as_str()]);
        }
        let kubernetes_service = KubernetesServiceMetrics::new(&registry)?;
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
            upstream_fallback_active,
            upstream_info,
            upstream_apiservers,
            upstream_apiserver_connections,
            kubernetes_service,
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
            .with_label_values(&["LIST", "", "pods", "", "cluster", "200", "cache"])
            .inc();
        let text = m.encode();
        assert!(text.contains("kube_cache_proxy_requests_total{code=\"200\",group=\"\",resource=\"pods\",scope=\"cluster\",source=\"cache\",subresource=\"\",verb=\"LIST\"} 1"), "{text}");
        assert!(
            text.contains("kube_cache_proxy_upstream_errors_total{reason=\"connect\"} 0"),
            "{text}"
        );
        assert!(text.contains(&format!(
            "kube_cache_proxy_build_info{{git_commit=\"{}\",platform=\"{}\",rust_version=\"{}\",version=\"{}\"}} 1",
            BUILD_INFO.git_commit, BUILD_INFO.platform, BUILD_INFO.rust_version, BUILD_INFO.version
        )), "{text}");
        assert!(
            BUILD_INFO.rust_version.starts_with("rustc "),
            "{BUILD_INFO:?}"
        );
        #[cfg(target_os = "linux")]
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
    }

    /// kube-apiserver's verb and scope for each kind of request
    /// (`metrics.go`: `CleanVerb`, `CanonicalVerb`; the installer's scope).
    #[test]
    fn verbs_and_scopes_are_kube_apiservers() {
        let apply = {
            let mut h = HeaderMap::new();
            h.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/apply-patch+yaml"),
            );
            h
        };
        let none = HeaderMap::new();
        type Case<'a> = (
            Method,
            &'a str,
            Option<&'a str>,
            &'a HeaderMap,
            &'a str,
            &'a str,
            &'a str,
        );
        let cases: &[Case<'_>] = &[
            (
                Method::GET,
                "/api/v1/pods",
                None,
                &none,
                "LIST",
                "cluster",
                "",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods",
                Some("watch=true"),
                &none,
                "WATCH",
                "namespace",
                "",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods",
                Some("watch=false"),
                &none,
                "LIST",
                "namespace",
                "",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods",
                Some("watch=0&watch=1"),
                &none,
                "LIST",
                "namespace",
                "",
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/a/pods",
                None,
                &none,
                "WATCH",
                "namespace",
                "",
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/a/pods/p",
                None,
                &none,
                "WATCH",
                "resource",
                "",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods/p",
                None,
                &none,
                "GET",
                "resource",
                "",
            ),
            (
                Method::HEAD,
                "/api/v1/namespaces/a/pods/p",
                None,
                &none,
                "GET",
                "resource",
                "",
            ),
            (
                Method::HEAD,
                "/api/v1/pods",
                None,
                &none,
                "LIST",
                "cluster",
                "",
            ),
            // A field selector's name is not the route's: still a LIST.
            (
                Method::GET,
                "/api/v1/namespaces/a/secrets",
                Some("fieldSelector=metadata.name%3Ds"),
                &none,
                "LIST",
                "namespace",
                "",
            ),
            (
                Method::GET,
                "/api/v1/nodes/n",
                Some("watch=1"),
                &none,
                "WATCH",
                "resource",
                "",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/pods",
                None,
                &none,
                "POST",
                "resource",
                "",
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/a/pods/p",
                None,
                &none,
                "PUT",
                "resource",
                "",
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/a/pods/p/status",
                None,
                &none,
                "PUT",
                "resource",
                "status",
            ),
            (
                Method::PATCH,
                "/api/v1/nodes/n/status",
                None,
                &none,
                "PATCH",
                "resource",
                "status",
            ),
            (
                Method::PATCH,
                "/api/v1/nodes/n",
                None,
                &apply,
                "APPLY",
                "resource",
                "",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/pods/p",
                None,
                &none,
                "DELETE",
                "resource",
                "",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/pods",
                None,
                &none,
                "DELETE",
                "namespace",
                "",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/pods/p/exec",
                Some("command=ls"),
                &none,
                "CONNECT",
                "resource",
                "exec",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods/p/exec",
                Some("command=ls"),
                &none,
                "CONNECT",
                "resource",
                "exec",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods/p/log",
                None,
                &none,
                "CONNECT",
                "resource",
                "log",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/pods/p/portforward",
                None,
                &none,
                "CONNECT",
                "resource",
                "portforward",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/serviceaccounts/s/token",
                None,
                &none,
                "POST",
                "resource",
                "token",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/pods/p/eviction",
                None,
                &none,
                "POST",
                "resource",
                "eviction",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods/p/bogus",
                None,
                &none,
                "GET",
                "resource",
                "other",
            ),
            (
                Method::OPTIONS,
                "/api/v1/pods",
                None,
                &none,
                "other",
                "cluster",
                "",
            ),
            (Method::GET, "/version", None, &none, "GET", "", "/version"),
            (
                Method::GET,
                "/openapi/v3/apis/apps/v1",
                None,
                &none,
                "GET",
                "",
                "/openapi/v3",
            ),
            (Method::GET, "/random/path", None, &none, "GET", "", "other"),
        ];
        for (method, path, query, headers, verb, scope, subresource) in cases {
            let info = RequestInfo::parse(method, path, *query);
            let l = RequestLabels::of(method, *query, headers, &info, true);
            assert_eq!(
                (l.verb, l.scope, l.subresource.as_str()),
                (*verb, *scope, *subresource),
                "{method} {path}?{query:?}"
            );
        }
        let info = RequestInfo::parse(&Method::GET, "/apis/example.com/v1/widgets", None);
        let l = RequestLabels::of(&Method::GET, None, &none, &info, false);
        assert_eq!((l.group.as_str(), l.resource.as_str()), ("", "other"));
    }
}
