//! Watch-cache metrics, per resource (labels `group`, `resource`).
//!
//! Every label set known when a resource's cache is created is exported
//! from then on, at zero: the restart, event, termination, probe and
//! cache-read counters, and the read-wait histograms.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

const NS: &str = "kube_cache_proxy";

/// `reason` values of `upstream_watch_restarts_total`.
pub const WATCH_RESTART_REASONS: &[&str] =
    &["closed", "error", "expired", "heal", "rewound", "silent"];
/// `type` values of `cache_events_received_total`: the watch event types.
pub const EVENT_TYPES: &[&str] = &["ADDED", "MODIFIED", "DELETED", "BOOKMARK"];
/// `reason` values of `cache_watchers_terminated_total`.
pub const TERMINATION_REASONS: &[&str] = &["slow", "history_overrun", "reset"];
/// `kind` values of `cache_read_wait_seconds`.
pub const READ_WAIT_KINDS: &[&str] =
    &["consistent", "not_older_than", "ready", "consistency_check"];
/// `status` values of `consistency_checks_total`, as kube-apiserver's
/// `apiserver_storage_consistency_checks_total`.
const CONSISTENCY_CHECK_STATUSES: [&str; 3] = ["success", "failure", "error"];
/// `result` values of `cache_compaction_probes_total`.
const COMPACTION_PROBE_RESULTS: [&str; 3] = ["alive", "compacted", "error"];
/// `result` values of `cache_consistency_probes_total`.
pub const PROBE_RESULTS: &[&str] = &["ok", "busy", "error"];
/// `result` values of `cache_object_reads_total`.
pub const OBJECT_READ_RESULTS: &[&str] = &["ok", "error"];
/// `verb` values of `cache_reads_total`, as kube-apiserver names them.
pub const READ_VERBS: &[&str] = &["GET", "LIST", "WATCH"];
/// `representation` values of `cache_served_total`.
pub const REPRESENTATIONS: &[&str] = &["json", "protobuf", "metadata_json", "metadata_protobuf"];

/// A cache read's verb as kube-apiserver's metrics name it (`GET`, `LIST`,
/// `WATCH`).
fn read_verb(verb: &str) -> &'static str {
    match verb {
        "get" => "GET",
        "list" => "LIST",
        "watch" => "WATCH",
        _ => "other",
    }
}

/// A pass-through reason as a label value: snake_case, like every label
/// value the proxy exports (`not fresh` → `not_fresh`, `resourceVersion
/// older than the cache` → `resource_version_older_than_the_cache`).
pub fn reason_label(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len() + 4);
    for c in reason.chars() {
        if c.is_ascii_uppercase() {
            if !out.is_empty() && !out.ends_with('_') {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if c == ' ' || c == '-' {
            out.push('_');
        } else {
            out.push(c);
        }
    }
    out
}

/// `cache_snapshots_total`'s operations and their results.
const SNAPSHOT_RESULTS: &[(&str, &[&str])] = &[
    ("load", &["loaded", "absent", "discarded", "error"]),
    ("save", &["saved", "too_large", "error"]),
];
/// `upstream_watches`' kinds.
const UPSTREAM_WATCH_KINDS: [&str; 2] = ["reflector", "progress"];

/// The metric families.
#[derive(Clone)]
pub struct CacheMetrics {
    objects: IntGaugeVec,
    bytes: IntGaugeVec,
    history: IntGaugeVec,
    history_bytes: IntGaugeVec,
    resource_version: IntGaugeVec,
    relists: IntCounterVec,
    watch_restarts: IntCounterVec,
    watchers: IntGaugeVec,
    events_received: IntCounterVec,
    events_dispatched: IntCounterVec,
    watchers_terminated: IntCounterVec,
    read_wait: HistogramVec,
    reads: IntCounterVec,
    consistency_probes: IntCounterVec,
    object_reads: IntCounterVec,
    compaction_probes: IntCounterVec,
    consistency_checks: IntCounterVec,
    consistency_check_seconds: HistogramVec,
    progress_watches: IntCounterVec,
    snapshots: IntCounterVec,
    snapshot_bytes: IntGaugeVec,
    upstream_watches: IntGaugeVec,
    served: IntCounterVec,
    encoded_bytes: IntGaugeVec,
    encode_failures: IntCounterVec,
    upstream_json_fallbacks: IntCounterVec,
}

impl std::fmt::Debug for CacheMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheMetrics").finish_non_exhaustive()
    }
}

/// One resource's metric handles.
#[derive(Clone)]
pub struct ResourceMetrics {
    group: String,
    resource: String,
    families: CacheMetrics,
    pub objects: IntGauge,
    pub bytes: IntGauge,
    pub history: IntGauge,
    /// Bytes the history holds beyond the current objects.
    pub history_bytes: IntGauge,
    pub resource_version: IntGauge,
    pub relists: IntCounter,
    pub watchers: IntGauge,
    pub events_dispatched: IntCounter,
    pub progress_watches: IntCounter,
    pub snapshot_bytes: IntGauge,
    /// Bytes of the protobuf encodings held for cached objects.
    pub protobuf_bytes: IntGauge,
    pub encode_failures: IntCounter,
    /// The cache went back to reading upstream in JSON.
    pub upstream_json_fallback: IntCounter,
}

impl std::fmt::Debug for ResourceMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceMetrics")
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

fn gauge(name: &str, help: &str) -> Result<IntGaugeVec, prometheus::Error> {
    IntGaugeVec::new(Opts::new(name, help).namespace(NS), &["group", "resource"])
}

fn counter(name: &str, help: &str, extra: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
    let mut labels = vec!["group", "resource"];
    labels.extend_from_slice(extra);
    IntCounterVec::new(Opts::new(name, help).namespace(NS), &labels)
}

// === impl CacheMetrics ===

impl CacheMetrics {
    /// Registers the families on `registry`.
    ///
    /// # Errors
    /// When a family is already registered.
    pub fn new(registry: &Registry) -> Result<CacheMetrics, prometheus::Error> {
        let m = CacheMetrics {
            objects: gauge("cache_objects", "Objects in the watch cache.")?,
            bytes: gauge("cache_bytes", "Bytes held by the watch cache's current objects (their JSON plus extracted labels and fields).")?,
            history: gauge("cache_history_events", "Events in the watch cache's history.")?,
            history_bytes: gauge("cache_history_bytes", "Bytes the watch cache's history holds beyond the current objects: the object versions only it keeps (each version an event replaced, and a deleted object's last state) and the watch-event frames encoded for its events, in every representation asked for.")?,
            resource_version: gauge("cache_resource_version", "The watch cache's resourceVersion (newest event or bookmark applied).")?,
            relists: counter("upstream_relists_total", "Upstream lists (the first, and relists after 410 Gone).", &[])?,
            watch_restarts: counter("upstream_watch_restarts_total", "Upstream watches restarted, by reason (closed|error|expired|heal|rewound|silent).", &["reason"])?,
            watchers: gauge("cache_watchers", "Open watches served from the cache.")?,
            events_received: counter("cache_events_received_total", "Events received from upstream, by type.", &["type"])?,
            events_dispatched: counter("cache_events_dispatched_total", "Event frames queued to watchers (one per watcher an event reaches).", &[])?,
            watchers_terminated: counter("cache_watchers_terminated_total", "Watchers closed by the cache, by reason (slow|history_overrun|reset).", &["reason"])?,
            read_wait: HistogramVec::new(
                HistogramOpts::new("cache_read_wait_seconds", "Time reads waited for the cache to be fresh or ready, in seconds, by kind (consistent|not_older_than|ready|consistency_check).")
                    .namespace(NS)
                    .buckets(vec![0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0]),
                &["group", "resource", "kind"],
            )?,
            reads: counter("cache_reads_total", "Reads of cached resources, by verb (GET|LIST|WATCH) and how they were answered (cache|upstream) and why (snake_case reason).", &["verb", "source", "reason"])?,
            consistency_probes: counter("cache_consistency_probes_total", "Upstream resourceVersion probes (a consistent limit=1 list) for consistent reads and resumed watches, by result (ok|busy: shed or unanswered in 10 s|error).", &["result"])?,
            object_reads: counter("cache_object_reads_total", "Consistent reads of one object upstream, each starting a consistent streaming list of that object alone (kubelet's watch of a Secret, a ConfigMap or its Node) that a probe found the cache behind for, instead of waiting for the cache to catch up; by result (ok|error: the watch waited for the cache instead).", &["result"])?,
            compaction_probes: counter("cache_compaction_probes_total", "Upstream probes of whether a resourceVersion an exact read asks for is compacted (a limit=1 list with resourceVersionMatch=Exact), by result (alive|compacted|error).", &["result"])?,
            consistency_checks: counter("consistency_checks_total", "Consistency checks of the cache against upstream at the cache's resourceVersion, by status (success|failure|error); a failure relists the resource.", &["status"])?,
            consistency_check_seconds: HistogramVec::new(
                HistogramOpts::new("consistency_check_duration_seconds", "Time a consistency check took (its upstream list pages and the comparison), in seconds.")
                    .namespace(NS)
                    .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
                &["group", "resource"],
            )?,
            progress_watches: counter("cache_progress_watches_total", "Short upstream watches opened to learn the cache is fresh.", &[])?,
            snapshots: counter("cache_snapshots_total", "Cache snapshots on disk, by operation (load|save) and result (load: loaded|absent|discarded|error; save: saved|too_large|error).", &["operation", "result"])?,
            snapshot_bytes: gauge("cache_snapshot_bytes", "Size of the resource's snapshot on disk, in bytes (0: none).")?,
            upstream_watches: IntGaugeVec::new(
                Opts::new("upstream_watches", "Upstream watches the cache holds open, by kind (reflector|progress).").namespace(NS),
                &["group", "resource", "kind"],
            )?,
            served: counter("cache_served_total", "Reads answered from the cache, by verb (GET|LIST|WATCH) and representation (json|protobuf|metadata_json|metadata_protobuf).", &["verb", "representation"])?,
            encoded_bytes: IntGaugeVec::new(
                Opts::new("cache_encoded_bytes", "Bytes of the encodings the cache holds beyond the objects' JSON, by encoding (protobuf): each object version is encoded once, when the first reader asks for it.").namespace(NS),
                &["group", "resource", "encoding"],
            )?,
            encode_failures: counter("cache_encode_failures_total", "Objects the cache could not encode in protobuf (a field the proxy's schema lacks); protobuf reads of the resource pass through from then on.", &[])?,
            upstream_json_fallbacks: counter("upstream_json_fallbacks_total", "Times the cache, reading upstream in protobuf (cache.upstreamEncoding), met an object it could not transcode exactly to the apiserver's JSON (a field the proxy's schema lacks) and went back to reading the resource in JSON.", &[])?,
        };
        registry.register(Box::new(m.objects.clone()))?;
        registry.register(Box::new(m.bytes.clone()))?;
        registry.register(Box::new(m.history.clone()))?;
        registry.register(Box::new(m.history_bytes.clone()))?;
        registry.register(Box::new(m.resource_version.clone()))?;
        registry.register(Box::new(m.relists.clone()))?;
        registry.register(Box::new(m.upstream_json_fallbacks.clone()))?;
        registry.register(Box::new(m.watch_restarts.clone()))?;
        registry.register(Box::new(m.watchers.clone()))?;
        registry.register(Box::new(m.events_received.clone()))?;
        registry.register(Box::new(m.events_dispatched.clone()))?;
        registry.register(Box::new(m.watchers_terminated.clone()))?;
        registry.register(Box::new(m.read_wait.clone()))?;
        registry.register(Box::new(m.reads.clone()))?;
        registry.register(Box::new(m.consistency_probes.clone()))?;
        registry.register(Box::new(m.object_reads.clone()))?;
        registry.register(Box::new(m.compaction_probes.clone()))?;
        registry.register(Box::new(m.consistency_checks.clone()))?;
        registry.register(Box::new(m.consistency_check_seconds.clone()))?;
        registry.register(Box::new(m.progress_watches.clone()))?;
        registry.register(Box::new(m.snapshots.clone()))?;
        registry.register(Box::new(m.snapshot_bytes.clone()))?;
        registry.register(Box::new(m.upstream_watches.clone()))?;
        registry.register(Box::new(m.served.clone()))?;
        registry.register(Box::new(m.encoded_bytes.clone()))?;
        registry.register(Box::new(m.encode_failures.clone()))?;
        Ok(m)
    }

    /// Handles for one resource. Its label sets known now are exported
    /// from now on, at zero.
    pub fn resource(&self, group: &str, resource: &str) -> ResourceMetrics {
        let l = [group, resource];
        let l3 = |third: &'static str| [group, resource, third];
        for reason in WATCH_RESTART_REASONS {
            self.watch_restarts.with_label_values(&l3(reason));
        }
        for kind in EVENT_TYPES {
            self.events_received.with_label_values(&l3(kind));
        }
        for reason in TERMINATION_REASONS {
            self.watchers_terminated.with_label_values(&l3(reason));
        }
        for kind in READ_WAIT_KINDS {
            self.read_wait.with_label_values(&l3(kind));
        }
        for result in PROBE_RESULTS {
            self.consistency_probes.with_label_values(&l3(result));
        }
        for result in OBJECT_READ_RESULTS {
            self.object_reads.with_label_values(&l3(result));
        }
        for result in COMPACTION_PROBE_RESULTS {
            self.compaction_probes.with_label_values(&l3(result));
        }
        for status in CONSISTENCY_CHECK_STATUSES {
            self.consistency_checks.with_label_values(&l3(status));
        }
        self.consistency_check_seconds.with_label_values(&l);
        for verb in READ_VERBS {
            self.reads
                .with_label_values(&[group, resource, verb, "cache", ""]);
        }
        for (operation, results) in SNAPSHOT_RESULTS {
            for result in *results {
                self.snapshots
                    .with_label_values(&[group, resource, operation, result]);
            }
        }
        for kind in UPSTREAM_WATCH_KINDS {
            self.upstream_watches.with_label_values(&l3(kind));
        }
        for verb in READ_VERBS {
            for representation in REPRESENTATIONS {
                self.served
                    .with_label_values(&[group, resource, verb, representation]);
            }
        }
        ResourceMetrics {
            group: group.to_string(),
            resource: resource.to_string(),
            families: self.clone(),
            objects: self.objects.with_label_values(&l),
            bytes: self.bytes.with_label_values(&l),
            history: self.history.with_label_values(&l),
            history_bytes: self.history_bytes.with_label_values(&l),
            resource_version: self.resource_version.with_label_values(&l),
            relists: self.relists.with_label_values(&l),
            watchers: self.watchers.with_label_values(&l),
            events_dispatched: self.events_dispatched.with_label_values(&l),
            progress_watches: self.progress_watches.with_label_values(&l),
            snapshot_bytes: self.snapshot_bytes.with_label_values(&l),
            protobuf_bytes: self
                .encoded_bytes
                .with_label_values(&[group, resource, "protobuf"]),
            encode_failures: self.encode_failures.with_label_values(&l),
            upstream_json_fallback: self.upstream_json_fallbacks.with_label_values(&l),
        }
    }
}

// === impl ResourceMetrics ===

impl ResourceMetrics {
    fn l3<'a>(&'a self, third: &'a str) -> [&'a str; 3] {
        [&self.group, &self.resource, third]
    }

    /// Counts a read answered from the cache in `representation`.
    pub fn served(&self, verb: &str, representation: &str) {
        self.families
            .served
            .with_label_values(&[&self.group, &self.resource, read_verb(verb), representation])
            .inc();
    }

    /// Counts a snapshot load or save.
    pub fn snapshot(&self, operation: &str, result: &str) {
        self.families
            .snapshots
            .with_label_values(&[&self.group, &self.resource, operation, result])
            .inc();
    }

    /// Counts an upstream watch restart.
    pub fn watch_restart(&self, reason: &str) {
        self.families
            .watch_restarts
            .with_label_values(&self.l3(reason))
            .inc();
    }

    /// Counts an upstream event.
    pub fn event_received(&self, kind: &str) {
        self.families
            .events_received
            .with_label_values(&self.l3(kind))
            .inc();
    }

    /// Counts watchers closed by the cache.
    pub fn watchers_terminated(&self, reason: &str, n: u64) {
        if n > 0 {
            self.families
                .watchers_terminated
                .with_label_values(&self.l3(reason))
                .inc_by(n);
        }
    }

    /// Observes a wait for freshness or readiness.
    pub fn read_wait(&self, kind: &str, seconds: f64) {
        self.families
            .read_wait
            .with_label_values(&self.l3(kind))
            .observe(seconds);
    }

    /// Counts a read (`verb` as the request info has it: `get`, `list`,
    /// `watch`) by how it was answered, and why it passed through.
    pub fn read(&self, verb: &str, source: &str, reason: &str) {
        let reason = reason_label(reason);
        self.families
            .reads
            .with_label_values(&[
                &self.group,
                &self.resource,
                read_verb(verb),
                source,
                &reason,
            ])
            .inc();
    }

    /// Counts an upstream watch of `kind` (`reflector`|`progress`) as
    /// open until the returned guard is dropped.
    pub fn upstream_watch(&self, kind: &str) -> UpstreamWatch {
        let gauge = self
            .families
            .upstream_watches
            .with_label_values(&self.l3(kind));
        gauge.inc();
        UpstreamWatch(gauge)
    }

    /// Counts a consistency check that took `seconds`.
    pub fn consistency_check(&self, status: &str, seconds: f64) {
        self.families
            .consistency_checks
            .with_label_values(&self.l3(status))
            .inc();
        self.families
            .consistency_check_seconds
            .with_label_values(&[&self.group, &self.resource])
            .observe(seconds);
    }

    /// Counts a compaction probe.
    pub fn compaction_probe(&self, result: &str) {
        self.families
            .compaction_probes
            .with_label_values(&self.l3(result))
            .inc();
    }

    /// Counts a read of one object upstream for a consistent watch of it.
    pub fn object_read(&self, result: &str) {
        self.families
            .object_reads
            .with_label_values(&self.l3(result))
            .inc();
    }

    /// Counts a consistency probe.
    pub fn probe(&self, result: &str) {
        self.families
            .consistency_probes
            .with_label_values(&self.l3(result))
            .inc();
    }
}

/// An open upstream watch, counted in `kube_cache_proxy_upstream_watches`
/// until dropped.
#[derive(Debug)]
pub struct UpstreamWatch(IntGauge);

impl Drop for UpstreamWatch {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_snake_case() {
        for (reason, label) in [
            ("", ""),
            ("not fresh", "not_fresh"),
            ("history_overrun", "history_overrun"),
            (
                "resourceVersion older than the cache",
                "resource_version_older_than_the_cache",
            ),
            ("unparseable timeoutSeconds", "unparseable_timeout_seconds"),
            ("continue token at latest", "continue_token_at_latest"),
        ] {
            assert_eq!(reason_label(reason), label);
        }
    }

    #[test]
    fn known_label_sets_exist_from_start() {
        let registry = Registry::new();
        let m = CacheMetrics::new(&registry).unwrap();
        let r = m.resource("", "pods");
        r.read("list", "upstream", "not fresh");
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        for series in [
            "kube_cache_proxy_upstream_watch_restarts_total{group=\"\",reason=\"expired\",resource=\"pods\"} 0",
            "kube_cache_proxy_cache_events_received_total{group=\"\",resource=\"pods\",type=\"BOOKMARK\"} 0",
            "kube_cache_proxy_cache_watchers_terminated_total{group=\"\",reason=\"history_overrun\",resource=\"pods\"} 0",
            "kube_cache_proxy_cache_read_wait_seconds_count{group=\"\",kind=\"consistent\",resource=\"pods\"} 0",
            "kube_cache_proxy_cache_consistency_probes_total{group=\"\",resource=\"pods\",result=\"error\"} 0",
            "kube_cache_proxy_cache_reads_total{group=\"\",reason=\"\",resource=\"pods\",source=\"cache\",verb=\"WATCH\"} 0",
            "kube_cache_proxy_cache_reads_total{group=\"\",reason=\"not_fresh\",resource=\"pods\",source=\"upstream\",verb=\"LIST\"} 1",
        ] {
            assert!(text.contains(series), "{series}\n{text}");
        }
    }
}
