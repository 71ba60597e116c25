//! Configuration: one YAML file, overridden by command-line flags, validated
//! before any socket is bound.
//!
//! The documented example with every field and its default is
//! `config/kube-cache-proxy.yaml`. Field names are camelCase, like the
//! Kubernetes component configs (`KubeletConfiguration`), and carry their
//! unit (`...Seconds`, `...Bytes`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The `apiVersion` a configuration file may declare.
pub const API_VERSION: &str = "kubecacheproxy.io/v1alpha1";
/// The `kind` a configuration file may declare.
pub const KIND: &str = "KubeCacheProxyConfiguration";

/// A configuration error, naming the offending field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML for this schema (unknown field, wrong type).
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A field holds a value that is not allowed.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

impl ConfigError {
    fn invalid(field: &str, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Config {
    /// Optional; when set must be [`API_VERSION`].
    pub api_version: Option<String>,
    /// Optional; when set must be [`KIND`].
    pub kind: Option<String>,
    /// Address (`host:port`) of the HTTPS listener clients connect to.
    /// Default `127.0.0.1:6444`: a node-local proxy is reached over loopback.
    pub listen: String,
    /// Address (`host:port`) of the plain-HTTP admin listener (`/metrics`,
    /// `/healthz`, `/livez`, `/readyz`), unauthenticated, so loopback
    /// only: `127.0.0.1`, `::1` (kubelet probes a hostNetwork pod there).
    /// It serves no cluster data. Default `127.0.0.1:9444`.
    pub admin_listen: String,
    /// Address (`host:port`) of the metrics listener, for Prometheus beyond
    /// loopback: HTTPS with the serving certificate of `tls`; `/metrics`
    /// only for a caller that authenticates (a client certificate of
    /// `tls.clientCAFile`, or a bearer token, by TokenReview) and is
    /// authorized `get` on the non-resource URL `/metrics`
    /// (SubjectAccessReview), as kubelet and kube-apiserver serve theirs;
    /// `/healthz`, `/livez` and `/readyz` open. Unset or empty (default):
    /// none.
    #[serde(deserialize_with = "empty_as_none")]
    pub metrics_listen: Option<String>,
    /// Downstream TLS.
    pub tls: TlsConfig,
    /// How to reach the kube-apiserver.
    pub upstream: UpstreamConfig,
    /// On SIGTERM/SIGINT, how long open connections may drain before they
    /// are closed. Default 30 s: below the kubelet's default
    /// `terminationGracePeriodSeconds` of 30 s plus the pre-stop margin.
    pub shutdown_grace_period_seconds: u64,
    /// Most client connections open at once. Past it, the connection idle
    /// longest (no request in flight; a watch keeps its connection busy) is
    /// closed to make room, and a new connection is refused only when none
    /// is idle (`conns.rs`). Default 10000.
    pub max_connections: usize,
    /// Most connections of one client (a verified certificate's user, a
    /// bearer token, or anonymous), with the same rule. Default 1000.
    pub max_connections_per_client: usize,
    /// Most requests of one client waiting for their response headers
    /// (a watch counts until it is established); past it, `429` with
    /// `Retry-After: 1`, as kube-apiserver's max-in-flight filter answers.
    /// Default 400.
    pub max_requests_in_flight_per_client: usize,
    /// This node's name, substituted for `${NODE_NAME}` in cache scopes.
    /// Default: the `NODE_NAME` environment variable (downward API) via the
    /// `--node-name` flag, else empty.
    pub node_name: String,
    /// The watch cache.
    pub cache: CacheConfig,
    /// How clients are authenticated.
    pub authentication: AuthenticationConfig,
    /// How reads served from the cache are authorized.
    pub authorization: AuthorizationConfig,
    /// Zero-downtime takeover by a successor process.
    pub takeover: TakeoverConfig,
}

/// Zero-downtime takeover (`takeover.rs`): a proxy started with the same
/// configuration while another runs takes over its listening sockets once
/// it is ready, and the running one drains.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TakeoverConfig {
    /// Unix socket a running proxy listens on for a successor (its
    /// directory is created 0700, the socket is 0600, and only a process
    /// of the same uid is answered). Unset (default): no takeover; a
    /// second proxy fails to bind the listeners.
    pub socket_path: Option<PathBuf>,
    /// How long a successor may take to become ready (caches filled and
    /// their upstream watches resumed) before the running proxy gives up
    /// on it and carries on; the successor then exits with an error.
    /// Default 120.
    pub ready_timeout_seconds: u64,
}

impl Default for TakeoverConfig {
    fn default() -> Self {
        TakeoverConfig {
            socket_path: None,
            ready_timeout_seconds: 120,
        }
    }
}

/// Client authentication.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct AuthenticationConfig {
    /// Requests without credentials.
    pub anonymous: AnonymousConfig,
    /// Bearer tokens, checked with a TokenReview upstream.
    pub token_review: TokenReviewConfig,
}

/// Anonymous requests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct AnonymousConfig {
    /// Treat requests without credentials as `system:anonymous` in
    /// `system:unauthenticated` (then authorized like any user), as
    /// kube-apiserver does by default. `false`: answer them `401`.
    /// Default true.
    pub enabled: bool,
}

impl Default for AnonymousConfig {
    fn default() -> Self {
        AnonymousConfig { enabled: true }
    }
}

/// The TokenReview cache.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TokenReviewConfig {
    /// How long an authenticated token is trusted, in seconds (never past
    /// a JWT's own expiry). Default 10: a deleted ServiceAccount's or
    /// revoked token stops working through the proxy within seconds, as it
    /// does at the apiserver (which verifies its own tokens at once),
    /// rather than after kube-apiserver's webhook default of 120 s.
    pub cache_ttl_seconds: u64,
    /// How long a rejected token stays rejected, in seconds. Default 10.
    pub failure_cache_ttl_seconds: u64,
    /// How long past its TTL a review's answer still stands in while the
    /// apiserver cannot be asked (unreachable, hung, `5xx`), in seconds;
    /// never past a JWT's expiry. Default 120: an apiserver restart does
    /// not take away the reads the cache can answer. 0: never.
    pub stale_if_unavailable_seconds: u64,
    /// Most tokens cached. Default 10000.
    pub cache_size: u64,
}

impl Default for TokenReviewConfig {
    fn default() -> Self {
        TokenReviewConfig {
            cache_ttl_seconds: 10,
            failure_cache_ttl_seconds: 10,
            stale_if_unavailable_seconds: 120,
            cache_size: 10_000,
        }
    }
}

/// Authorization of cached reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct AuthorizationConfig {
    /// The SubjectAccessReview decision cache.
    pub subject_access_review: SubjectAccessReviewConfig,
}

/// The SubjectAccessReview decision cache.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SubjectAccessReviewConfig {
    /// How long an allowed decision is reused, in seconds. Default 5: a
    /// revoked RoleBinding stops cached reads within seconds, as the
    /// apiserver's own RBAC evaluation does at once (not the 300 s of
    /// kube-apiserver's `--authorization-webhook-cache-authorized-ttl`).
    pub allowed_cache_ttl_seconds: u64,
    /// How long a denied decision is reused, in seconds. Default 10: a new
    /// grant takes effect within seconds.
    pub denied_cache_ttl_seconds: u64,
    /// How long past its TTL a decision still stands in while the apiserver
    /// cannot be asked (unreachable, hung, `5xx`), in seconds. Default 120:
    /// an apiserver restart does not take away the reads the cache can
    /// answer; a revocation made meanwhile reaches the proxy when the
    /// apiserver answers again (docs/security.md). 0: never.
    pub stale_if_unavailable_seconds: u64,
    /// Most decisions cached. Default 10000.
    pub cache_size: u64,
}

impl Default for SubjectAccessReviewConfig {
    fn default() -> Self {
        SubjectAccessReviewConfig {
            allowed_cache_ttl_seconds: 5,
            denied_cache_ttl_seconds: 10,
            stale_if_unavailable_seconds: 120,
            cache_size: 10_000,
        }
    }
}

/// The watch cache: which resources, and how reads behave.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct CacheConfig {
    /// Serve reads from the cache. `false` makes the proxy a pure
    /// pass-through. Default true.
    pub enabled: bool,
    /// Resources cached, each with one upstream list+watch. Default: what
    /// node agents watch (pods, nodes, services, endpointslices, namespaces,
    /// runtimeclasses, csidrivers, csinodes, servicecidrs).
    pub resources: Vec<CachedResource>,
    /// Events kept per resource for watches that resume from an older RV
    /// (older ones get `410 Expired` and relist). Default 10000: several
    /// minutes of a busy cluster's changes to one resource.
    pub history_capacity: usize,
    /// Events older than this many seconds leave the history even below
    /// `historyCapacity`, bounding the old object versions it keeps.
    /// Default 300: several minutes, where kube-apiserver's watch cache
    /// keeps about 75 s.
    pub history_max_age_seconds: u64,
    /// Events buffered per watcher before it is marked lagging and catches
    /// up from the history on its own. Default 100.
    pub watcher_buffer_events: usize,
    /// A watcher blocked (its client not reading) this long is closed; the
    /// client re-watches from its last RV. Default 10 s.
    pub slow_watcher_timeout_seconds: u64,
    /// Bookmark frequency for watchers that allow bookmarks. Default 60 s,
    /// as kube-apiserver.
    pub bookmark_interval_seconds: u64,
    /// Watches without `timeoutSeconds` end after a random time between
    /// this and twice this, like kube-apiserver's `--min-request-timeout`.
    /// Default 1800 s.
    pub min_request_timeout_seconds: u64,
    /// How long a consistent list (RV unset) waits for the cache to reach
    /// upstream's current RV before passing through. Default 0: a list the
    /// cache cannot prove fresh at once passes through without waiting.
    /// (A consistent get always passes through.)
    pub consistent_list_wait_milliseconds: u64,
    /// A consistent list whose scope (the namespace, or the whole
    /// resource) holds at least this many cached objects waits up to
    /// `largeListWaitMilliseconds` for the cache to be shown fresh instead
    /// of `consistentListWaitMilliseconds`: passing it through would cost
    /// the apiserver that many objects' encoding, while the wait (about a
    /// second for a quiet resource in a busy cluster) is shared by every
    /// request for the resource. 0: no list counts as large. Default 1000.
    pub large_list_objects: usize,
    /// How long a large consistent list (see `largeListObjects`) waits
    /// before passing through. Default 3000 ms, as kube-apiserver's cache.
    pub large_list_wait_milliseconds: u64,
    /// How long a consistent watch (streaming list with RV unset) waits
    /// before passing through. Default 3000 ms, as kube-apiserver's cache.
    pub consistent_watch_wait_milliseconds: u64,
    /// How long a read "not older than N" waits before `504 Timeout`.
    /// Default 3000 ms, as kube-apiserver's cache.
    pub not_older_than_wait_milliseconds: u64,
    /// How long a read waits for its resource's first list before passing
    /// through. Default 2000 ms.
    pub ready_wait_milliseconds: u64,
    /// MiB of protobuf encodings kept for cached objects, all resources
    /// together. An object version is encoded when a protobuf reader
    /// (kubelet, kube-proxy) first asks for it; kept encodings are
    /// evicted least recently and frequently used first, and after 10
    /// minutes unread, and re-encoded by their next reader (about 35 µs
    /// for a 5 KB pod). 0 keeps none. Default 64.
    pub protobuf_cache_mib: u64,
    /// Snapshots of the cache on the node's disk, so a restarted proxy
    /// resumes instead of relisting.
    pub persistence: PersistenceConfig,
    /// The periodic check that each cache holds what upstream holds at
    /// the same resourceVersion, and its healing relist.
    pub consistency_check: ConsistencyCheckConfig,
}

/// The consistency checker (`cache/checker.rs`), after kube-apiserver's
/// (`DetectCacheInconsistency`, `staging/src/k8s.io/apiserver/pkg/storage/
/// cacher/delegator.go`): per cached resource, every `periodSeconds` to
/// 1.5 × that after the previous check ended, a metadata-only list of the
/// resource upstream at exactly the cache's resourceVersion, in pages of
/// `pageSize`, compared with the cache by namespace, name and
/// resourceVersion. A mismatch logs the first differing object and relists
/// the resource; watchers see the difference as ordinary events.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ConsistencyCheckConfig {
    /// Seconds between checks of one resource (plus up to 50 % jitter).
    /// Default 300, as kube-apiserver's. 0 disables the checker.
    pub period_seconds: u64,
    /// Objects per upstream list page. Default 500.
    pub page_size: u32,
}

impl Default for ConsistencyCheckConfig {
    fn default() -> Self {
        ConsistencyCheckConfig {
            period_seconds: 300,
            page_size: 500,
        }
    }
}

/// Cache snapshots on disk (`cache/persist.rs`): written periodically, at
/// shutdown and when a successor takes over; read at start, when the
/// proxy serves from them at once and resumes each upstream watch from
/// the snapshot's resourceVersion, listing only if the apiserver answers
/// `410 Gone`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PersistenceConfig {
    /// Directory of the snapshots, created 0700 if missing; files are
    /// 0600. Unset (default): no snapshots.
    pub directory: Option<PathBuf>,
    /// Seconds between writes of the snapshots of resources that changed.
    /// Default 60.
    pub interval_seconds: u64,
    /// Most bytes all snapshots may take; a resource that would not fit is
    /// not persisted. Default 536870912 (512 MiB).
    pub max_bytes: u64,
}

impl Default for PersistenceConfig {
    fn default() -> Self {
        PersistenceConfig {
            directory: None,
            interval_seconds: 60,
            max_bytes: 512 << 20,
        }
    }
}

/// One cached resource (a GVR).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CachedResource {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version, e.g. `v1`.
    pub version: String,
    /// Resource (plural, lowercase), e.g. `pods`.
    pub resource: String,
    /// Kind, e.g. `Pod`. Required for resources the proxy does not know
    /// (custom resources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Whether the resource is namespaced. Required for resources the proxy
    /// does not know.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaced: Option<bool>,
    /// Upstream scope: a field selector the cache's list+watch uses, e.g.
    /// `spec.nodeName=${NODE_NAME}`. Requests whose field selector does not
    /// include it pass through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<String>,
    /// Overrides `cache.historyCapacity` for this resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_capacity: Option<usize>,
}

impl CachedResource {
    pub(crate) fn new(group: &str, version: &str, resource: &str) -> CachedResource {
        CachedResource {
            group: group.to_string(),
            version: version.to_string(),
            resource: resource.to_string(),
            ..CachedResource::default()
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            enabled: true,
            resources: vec![
                CachedResource::new("", "v1", "pods"),
                CachedResource::new("", "v1", "nodes"),
                CachedResource::new("", "v1", "services"),
                CachedResource::new("discovery.k8s.io", "v1", "endpointslices"),
                CachedResource::new("", "v1", "namespaces"),
                CachedResource::new("node.k8s.io", "v1", "runtimeclasses"),
                CachedResource::new("storage.k8s.io", "v1", "csidrivers"),
                CachedResource::new("storage.k8s.io", "v1", "csinodes"),
                CachedResource::new("networking.k8s.io", "v1", "servicecidrs"),
            ],
            history_capacity: 10_000,
            history_max_age_seconds: 300,
            watcher_buffer_events: 100,
            slow_watcher_timeout_seconds: 10,
            bookmark_interval_seconds: 60,
            min_request_timeout_seconds: 1800,
            consistent_list_wait_milliseconds: 0,
            large_list_objects: 1000,
            large_list_wait_milliseconds: 3000,
            consistent_watch_wait_milliseconds: 3000,
            not_older_than_wait_milliseconds: 3000,
            ready_wait_milliseconds: 2000,
            protobuf_cache_mib: 64,
            persistence: PersistenceConfig::default(),
            consistency_check: ConsistencyCheckConfig::default(),
        }
    }
}

impl CacheConfig {
    fn validate(&self, node_name: &str) -> Result<(), ConfigError> {
        if self.history_capacity == 0 {
            return Err(ConfigError::invalid(
                "cache.historyCapacity",
                "must be at least 1",
            ));
        }
        if self.history_max_age_seconds == 0 {
            return Err(ConfigError::invalid(
                "cache.historyMaxAgeSeconds",
                "must be at least 1",
            ));
        }
        if self.watcher_buffer_events == 0 {
            return Err(ConfigError::invalid(
                "cache.watcherBufferEvents",
                "must be at least 1",
            ));
        }
        if self.bookmark_interval_seconds == 0 {
            return Err(ConfigError::invalid(
                "cache.bookmarkIntervalSeconds",
                "must be at least 1",
            ));
        }
        if self.min_request_timeout_seconds == 0 {
            return Err(ConfigError::invalid(
                "cache.minRequestTimeoutSeconds",
                "must be at least 1",
            ));
        }
        if self.consistency_check.page_size == 0 {
            return Err(ConfigError::invalid(
                "cache.consistencyCheck.pageSize",
                "must be at least 1",
            ));
        }
        if self.persistence.interval_seconds == 0 {
            return Err(ConfigError::invalid(
                "cache.persistence.intervalSeconds",
                "must be at least 1",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, r) in self.resources.iter().enumerate() {
            let field = |f: &str| format!("cache.resources[{i}].{f}");
            if r.resource.is_empty() || r.resource.contains('/') {
                return Err(ConfigError::invalid(
                    &field("resource"),
                    "must be a resource name, e.g. pods",
                ));
            }
            if r.version.is_empty() {
                return Err(ConfigError::invalid(&field("version"), "required"));
            }
            if !seen.insert((r.group.clone(), r.version.clone(), r.resource.clone())) {
                return Err(ConfigError::invalid(&field("resource"), "listed twice"));
            }
            if r.history_capacity == Some(0) {
                return Err(ConfigError::invalid(
                    &field("historyCapacity"),
                    "must be at least 1",
                ));
            }
            let known =
                apimachinery::resource::built_in(&r.group, &r.version, &r.resource).is_some();
            if !known && r.kind.as_deref().is_none_or(str::is_empty) {
                return Err(ConfigError::invalid(
                    &field("kind"),
                    "required for a resource the proxy does not know",
                ));
            }
            if !known && r.namespaced.is_none() {
                return Err(ConfigError::invalid(
                    &field("namespaced"),
                    "required for a resource the proxy does not know",
                ));
            }
            if let Some(sel) = &r.field_selector {
                r.scope(node_name).map_err(|m| {
                    ConfigError::invalid(&field("fieldSelector"), format!("{sel:?}: {m}"))
                })?;
            }
        }
        Ok(())
    }
}

impl CachedResource {
    /// The upstream scope with `${NODE_NAME}` substituted, parsed and
    /// converted for the resource.
    ///
    /// # Errors
    /// Why the selector is not usable.
    pub fn scope(&self, node_name: &str) -> Result<apimachinery::selector::FieldSelector, String> {
        let Some(raw) = &self.field_selector else {
            return Ok(apimachinery::selector::FieldSelector::default());
        };
        if raw.contains("${NODE_NAME}") && node_name.is_empty() {
            return Err(
                "uses ${NODE_NAME} but no node name is set (nodeName, --node-name or NODE_NAME)"
                    .into(),
            );
        }
        let raw = raw.replace("${NODE_NAME}", node_name);
        let parsed = apimachinery::selector::FieldSelector::parse(&raw)?;
        if parsed.terms().iter().any(|t| t.not_equals) {
            return Err("only field=value terms can scope a cache".into());
        }
        apimachinery::resource::FieldSet::of(&self.group, &self.version, &self.resource)
            .convert(&parsed)
    }
}

/// Downstream TLS settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TlsConfig {
    /// PEM serving certificate chain. Required to serve.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the serving certificate. Required to serve.
    pub private_key_file: Option<PathBuf>,
    /// PEM bundle of CAs whose client certificates are accepted
    /// (like kube-apiserver's `--client-ca-file`). Optional.
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
    /// Lowest TLS version accepted: `VersionTLS12` (default) or
    /// `VersionTLS13`, named like kube-apiserver's `--tls-min-version`.
    pub min_version: TlsVersion,
    /// A serving certificate the proxy obtains and renews itself through
    /// the Kubernetes CSR API. When enabled, `certFile` and
    /// `privateKeyFile` are not used.
    pub csr: CsrConfig,
}

/// The serving certificate requested through the Kubernetes CSR API
/// (`certificates.k8s.io/v1` CertificateSigningRequests), like kubelet's
/// `serverTLSBootstrap`. The subject is the one the
/// `kubernetes.io/kubelet-serving` signer requires:
/// `CN=system:node:<nodeName>, O=system:nodes`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct CsrConfig {
    /// Obtain the serving certificate through the CSR API. Default false.
    pub enabled: bool,
    /// `spec.signerName` of the requests. Default
    /// `kubernetes.io/kubelet-serving`.
    pub signer_name: String,
    /// DNS subject alternative names; `${NODE_NAME}` is replaced by the
    /// node name. Default `["localhost", "${NODE_NAME}"]`.
    pub dns_names: Vec<String>,
    /// IP subject alternative names. Default `["127.0.0.1"]`.
    pub ip_addresses: Vec<String>,
    /// Where the key and the issued certificate are kept (created 0700 if
    /// missing; files 0600). Default `/var/lib/kube-cache-proxy/pki`.
    pub directory: PathBuf,
    /// Requested lifetime (`spec.expirationSeconds`), at least 600; 0
    /// leaves it to the signer (kube-controller-manager:
    /// `--cluster-signing-duration`, one year by default). Default 0.
    pub requested_duration_seconds: u64,
}

impl Default for CsrConfig {
    fn default() -> Self {
        CsrConfig {
            enabled: false,
            signer_name: "kubernetes.io/kubelet-serving".to_string(),
            dns_names: vec!["localhost".to_string(), "${NODE_NAME}".to_string()],
            ip_addresses: vec!["127.0.0.1".to_string()],
            directory: PathBuf::from("/var/lib/kube-cache-proxy/pki"),
            requested_duration_seconds: 0,
        }
    }
}

/// The shortest `spec.expirationSeconds` the apiserver accepts.
pub const MIN_CSR_EXPIRATION_SECONDS: u64 = 600;

impl CsrConfig {
    /// The DNS names with `${NODE_NAME}` replaced.
    pub fn dns_names(&self, node_name: &str) -> Vec<String> {
        self.dns_names
            .iter()
            .map(|n| n.replace("${NODE_NAME}", node_name))
            .collect()
    }

    /// The parsed IP addresses (invalid ones are skipped; see
    /// [`CsrConfig::validate`]).
    pub fn ip_addresses(&self) -> Vec<std::net::IpAddr> {
        self.ip_addresses
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect()
    }

    /// Checks the section when it is enabled.
    ///
    /// # Errors
    /// The first invalid field, by its YAML path.
    pub fn validate(&self, node_name: &str) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if node_name.is_empty() {
            return Err(ConfigError::invalid(
                "nodeName",
                "required with tls.csr.enabled: the certificate's subject is \
                 CN=system:node:<nodeName> (set nodeName, --node-name or NODE_NAME)",
            ));
        }
        if let Some(problem) = apimachinery::selector::is_dns1123_subdomain(node_name)
            .into_iter()
            .next()
        {
            return Err(ConfigError::invalid(
                "nodeName",
                format!("{node_name:?} is not a node name: {problem}"),
            ));
        }
        let valid_signer = self
            .signer_name
            .split_once('/')
            .is_some_and(|(domain, path)| {
                domain.contains('.')
                    && apimachinery::selector::is_dns1123_subdomain(domain).is_empty()
                    && !path.is_empty()
                    && !path.contains(char::is_whitespace)
            });
        if !valid_signer {
            return Err(ConfigError::invalid(
                "tls.csr.signerName",
                format!(
                    "{:?} is not a signer name (<domain>/<name>, e.g. kubernetes.io/kubelet-serving)",
                    self.signer_name
                ),
            ));
        }
        for (i, raw) in self.dns_names.iter().enumerate() {
            let name = raw.replace("${NODE_NAME}", node_name);
            if let Some(problem) = apimachinery::selector::is_dns1123_subdomain(&name)
                .into_iter()
                .next()
            {
                return Err(ConfigError::invalid(
                    &format!("tls.csr.dnsNames[{i}]"),
                    format!("{raw:?} is not a DNS name: {problem}"),
                ));
            }
        }
        for (i, raw) in self.ip_addresses.iter().enumerate() {
            if let Err(e) = raw.parse::<std::net::IpAddr>() {
                return Err(ConfigError::invalid(
                    &format!("tls.csr.ipAddresses[{i}]"),
                    format!("{raw:?} is not an IP address: {e}"),
                ));
            }
        }
        if self.dns_names.is_empty() && self.ip_addresses.is_empty() {
            return Err(ConfigError::invalid(
                "tls.csr.ipAddresses",
                "the certificate needs at least one DNS name or IP address (clients connect to 127.0.0.1)",
            ));
        }
        if self.directory.as_os_str().is_empty() {
            return Err(ConfigError::invalid("tls.csr.directory", "required"));
        }
        if self.directory.exists() && !self.directory.is_dir() {
            return Err(ConfigError::invalid(
                "tls.csr.directory",
                format!("{}: not a directory", self.directory.display()),
            ));
        }
        let duration = self.requested_duration_seconds;
        if duration != 0 && !(MIN_CSR_EXPIRATION_SECONDS..=i32::MAX as u64).contains(&duration) {
            return Err(ConfigError::invalid(
                "tls.csr.requestedDurationSeconds",
                format!(
                    "must be 0 (the signer's default) or between {MIN_CSR_EXPIRATION_SECONDS} and {}",
                    i32::MAX
                ),
            ));
        }
        Ok(())
    }
}

/// A TLS protocol version, named as kube-apiserver names them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub enum TlsVersion {
    /// TLS 1.2.
    #[default]
    VersionTLS12,
    /// TLS 1.3.
    VersionTLS13,
}

/// `upstream.identity`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub enum IdentityMode {
    /// The node's identity if the credential is a node's, else as given.
    #[default]
    Auto,
    /// The node's identity, or an error at start.
    Node,
    /// The credential as given.
    AsGiven,
    /// A tier proxy, the upstream of node proxies (docs/tier.md): its own
    /// reads with the credential as given; a node's certificate requests
    /// forwarded as that node by constrained impersonation
    /// (`impersonate:arbitrary-node`); any other certificate user refused.
    Tier,
}

/// Upstream (kube-apiserver) settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct UpstreamConfig {
    /// Kubeconfig file for the apiserver. Unset: the in-cluster
    /// service-account configuration (`KUBERNETES_SERVICE_HOST`, the
    /// mounted token, which is re-read as it rotates, and `ca.crt`).
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig to use. Unset: its current context.
    pub context: Option<String>,
    /// Who the proxy is upstream (docs/security.md): `Auto` (default) acts
    /// as the node when the credential is a node's (a client certificate
    /// `CN=system:node:<name>`, or a service-account token bound to the
    /// node, which then impersonates it), else uses the credential as
    /// given; `Node` requires a node's credential and fails at start
    /// without one; `AsGiven` never acts as a node.
    pub identity: IdentityMode,
    /// Time allowed to open a TCP+TLS connection to the apiserver before the
    /// request fails with `503`. Default 5 s.
    pub connect_timeout_seconds: u64,
    /// Idle pooled connections are closed after this long. Default 90 s.
    pub idle_timeout_seconds: u64,
    /// Where to go when `kubeconfig`'s server cannot be reached: for a node
    /// proxy whose upstream is a tier of proxies (docs/tier.md), the
    /// apiserver itself. Unset (default): none.
    pub fallback: Option<FallbackConfig>,
}

/// `upstream.fallback`: another server, used while the primary cannot be
/// reached (three connection failures in a row), until it answers again
/// (tried every 10 s ±50 %). Its credential must give the proxy the same
/// identity.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FallbackConfig {
    /// Kubeconfig file of the fallback server.
    pub kubeconfig: PathBuf,
    /// Context of that kubeconfig. Unset: its current context.
    #[serde(default)]
    pub context: Option<String>,
}

// === impl Config ===

impl Default for Config {
    fn default() -> Self {
        Config {
            api_version: None,
            kind: None,
            listen: "127.0.0.1:6444".to_string(),
            admin_listen: "127.0.0.1:9444".to_string(),
            metrics_listen: None,
            tls: TlsConfig::default(),
            upstream: UpstreamConfig::default(),
            shutdown_grace_period_seconds: 30,
            max_connections: 10_000,
            max_connections_per_client: 1000,
            max_requests_in_flight_per_client: 400,
            node_name: String::new(),
            cache: CacheConfig::default(),
            authentication: AuthenticationConfig::default(),
            authorization: AuthorizationConfig::default(),
            takeover: TakeoverConfig::default(),
        }
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            kubeconfig: None,
            context: None,
            identity: IdentityMode::Auto,
            connect_timeout_seconds: 5,
            idle_timeout_seconds: 90,
            fallback: None,
        }
    }
}

/// Command-line values that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub metrics_listen: Option<String>,
    pub upstream_kubeconfig: Option<PathBuf>,
    pub upstream_context: Option<String>,
    pub upstream_identity: Option<IdentityMode>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub client_ca_file: Option<PathBuf>,
    pub tls_min_version: Option<TlsVersion>,
    pub shutdown_grace_period_seconds: Option<u64>,
    pub node_name: Option<String>,
    pub cache_persistence_directory: Option<PathBuf>,
    pub takeover_socket_path: Option<PathBuf>,
}

impl Config {
    /// Reads and parses a YAML file. Does not validate.
    ///
    /// # Errors
    /// [`ConfigError::Read`] or [`ConfigError::Parse`] (unknown field, wrong
    /// type), naming the file and the field.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_yaml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses YAML text. An empty document is the default configuration.
    ///
    /// # Errors
    /// The parser's message, which names the field.
    pub fn from_yaml(text: &str) -> Result<Config, String> {
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        serde_saphyr::from_str::<Config>(text).map_err(|e| yaml_error(&e))
    }

    /// The default configuration as a YAML document, with `apiVersion` and
    /// `kind` (what `--print-default-config` prints): serialized from
    /// [`Config::default`], so it cannot drift from the code.
    ///
    /// # Errors
    /// The serializer's message (none is expected).
    pub fn default_yaml() -> Result<String, String> {
        let config = Config {
            api_version: Some(API_VERSION.to_string()),
            kind: Some(KIND.to_string()),
            ..Config::default()
        };
        serde_saphyr::to_string(&config).map_err(|e| e.to_string())
    }

    /// Applies command-line overrides.
    pub fn apply(&mut self, o: &Overrides) {
        if let Some(v) = &o.listen {
            self.listen = v.clone();
        }
        if let Some(v) = &o.admin_listen {
            self.admin_listen = v.clone();
        }
        if let Some(v) = &o.metrics_listen {
            self.metrics_listen = Some(v.clone()).filter(|v| !v.is_empty());
        }
        if let Some(v) = &o.upstream_kubeconfig {
            self.upstream.kubeconfig = Some(v.clone());
        }
        if let Some(v) = o.upstream_identity {
            self.upstream.identity = v;
        }
        if let Some(v) = &o.upstream_context {
            self.upstream.context = Some(v.clone());
        }
        if let Some(v) = &o.tls_cert_file {
            self.tls.cert_file = Some(v.clone());
        }
        if let Some(v) = &o.tls_private_key_file {
            self.tls.private_key_file = Some(v.clone());
        }
        if let Some(v) = &o.client_ca_file {
            self.tls.client_ca_file = Some(v.clone());
        }
        if let Some(v) = o.tls_min_version {
            self.tls.min_version = v;
        }
        if let Some(v) = o.shutdown_grace_period_seconds {
            self.shutdown_grace_period_seconds = v;
        }
        if let Some(v) = &o.node_name {
            self.node_name = v.clone();
        }
        if let Some(v) = &o.cache_persistence_directory {
            self.cache.persistence.directory =
                Some(v.clone()).filter(|v| !v.as_os_str().is_empty());
        }
        if let Some(v) = &o.takeover_socket_path {
            self.takeover.socket_path = Some(v.clone()).filter(|v| !v.as_os_str().is_empty());
        }
    }

    /// Checks every field. Runs before anything is started.
    ///
    /// # Errors
    /// The first invalid field, by its YAML path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(v) = &self.api_version
            && v != API_VERSION
        {
            return Err(ConfigError::invalid(
                "apiVersion",
                format!("must be {API_VERSION:?}, got {v:?}"),
            ));
        }
        if let Some(k) = &self.kind
            && k != KIND
        {
            return Err(ConfigError::invalid(
                "kind",
                format!("must be {KIND:?}, got {k:?}"),
            ));
        }
        if self.takeover.ready_timeout_seconds == 0 {
            return Err(ConfigError::invalid(
                "takeover.readyTimeoutSeconds",
                "must be at least 1",
            ));
        }
        parse_addr("listen", &self.listen)?;
        let admin = parse_addr("adminListen", &self.admin_listen)?;
        if !admin.ip().is_loopback() {
            return Err(ConfigError::invalid(
                "adminListen",
                format!(
                    "{:?} is not a loopback address: the admin port answers /metrics without \
                     authentication, so it stays on 127.0.0.1 (kubelet probes a hostNetwork pod \
                     there); serve metrics beyond the node with metricsListen (HTTPS, \
                     authenticated and authorized)",
                    self.admin_listen
                ),
            ));
        }
        if self.listen == self.admin_listen && !self.listen.ends_with(":0") {
            return Err(ConfigError::invalid(
                "adminListen",
                "must differ from listen",
            ));
        }
        if let Some(metrics) = self.metrics_listen.as_ref().filter(|m| !m.is_empty()) {
            parse_addr("metricsListen", metrics)?;
            if (*metrics == self.listen || *metrics == self.admin_listen)
                && !metrics.ends_with(":0")
            {
                return Err(ConfigError::invalid(
                    "metricsListen",
                    "must differ from listen and adminListen",
                ));
            }
        }
        match (&self.tls.cert_file, &self.tls.private_key_file) {
            // The certificate comes from the CSR API; the files are unused.
            _ if self.tls.csr.enabled => self.tls.csr.validate(&self.node_name)?,
            (None, _) => {
                return Err(ConfigError::invalid(
                    "tls.certFile",
                    "required (--tls-cert-file)",
                ));
            }
            (_, None) => {
                return Err(ConfigError::invalid(
                    "tls.privateKeyFile",
                    "required (--tls-private-key-file)",
                ));
            }
            (Some(cert), Some(key)) => {
                readable("tls.certFile", cert)?;
                readable("tls.privateKeyFile", key)?;
            }
        }
        if let Some(ca) = &self.tls.client_ca_file {
            readable("tls.clientCAFile", ca)?;
        }
        if let Some(kc) = &self.upstream.kubeconfig {
            readable("upstream.kubeconfig", kc)?;
        }
        if let Some(f) = &self.upstream.fallback {
            readable("upstream.fallback.kubeconfig", &f.kubeconfig)?;
        }
        if self.upstream.connect_timeout_seconds == 0 {
            return Err(ConfigError::invalid(
                "upstream.connectTimeoutSeconds",
                "must be at least 1",
            ));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::invalid("maxConnections", "must be at least 1"));
        }
        if self.max_connections_per_client == 0 {
            return Err(ConfigError::invalid(
                "maxConnectionsPerClient",
                "must be at least 1",
            ));
        }
        if self.max_requests_in_flight_per_client == 0 {
            return Err(ConfigError::invalid(
                "maxRequestsInFlightPerClient",
                "must be at least 1",
            ));
        }
        self.cache.validate(&self.node_name)?;
        Ok(())
    }

    /// The parsed `listen` address. Valid after [`Config::validate`].
    ///
    /// # Errors
    /// When `listen` is not `host:port`.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        parse_addr("listen", &self.listen)
    }

    /// The parsed `adminListen` address.
    ///
    /// # Errors
    /// When `adminListen` is not `host:port`.
    pub fn admin_listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        parse_addr("adminListen", &self.admin_listen)
    }

    /// The parsed `metricsListen` address, if set.
    ///
    /// # Errors
    /// When `metricsListen` is not `host:port`.
    pub fn metrics_listen_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        self.metrics_listen
            .as_deref()
            .filter(|m| !m.is_empty())
            .map(|m| parse_addr("metricsListen", m))
            .transpose()
    }
}

/// An optional string where `""` means unset.
fn empty_as_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v: Option<String> = Option::deserialize(d)?;
    Ok(v.filter(|s| !s.is_empty()))
}

fn parse_addr(field: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse::<SocketAddr>().map_err(|e| {
        ConfigError::invalid(
            field,
            format!("{value:?} is not an IP address and port (host:port): {e}"),
        )
    })
}

fn readable(field: &str, path: &Path) -> Result<(), ConfigError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| ConfigError::invalid(field, format!("{}: {e}", path.display())))
}

/// A YAML parse error without any of the text it was parsing: the
/// parser's message and location (`... at line L, column C`), and the
/// names of unknown, missing or duplicate fields, but no source snippet
/// and no quoted value. A file given by mistake (a private key, a
/// kubeconfig with a token) must never reach a log or a terminal.
pub fn yaml_error(e: &serde_saphyr::Error) -> String {
    let text = e.without_snippet().to_string();
    let first = text.lines().next().unwrap_or_default();
    redact_quoted(first)
}

/// `first` with the contents of every `"..."` and `` `...` `` replaced by
/// `…`, except field names (`` field `name` ``), which are the schema's
/// vocabulary or a misspelling of it.
fn redact_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(['"', '`']) {
        let quote = rest[start..].chars().next().unwrap_or('"');
        let Some(len) = rest[start + 1..].find(quote) else {
            break;
        };
        let before = &rest[..start];
        let inner = &rest[start + 1..start + 1 + len];
        out.push_str(before);
        out.push(quote);
        if before.ends_with("field ") {
            out.push_str(inner);
        } else {
            out.push('…');
        }
        out.push(quote);
        rest = &rest[start + 2 + len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_show_no_file_contents() {
        let key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSECRETSECRET\n-----END PRIVATE KEY-----\n";
        let err = Config::from_yaml(key).unwrap_err();
        assert!(err.contains("line 1, column 1"), "{err}");
        assert!(!err.contains("SECRET") && !err.contains("PRIVATE"), "{err}");
        for (yaml, secret, kept) in [
            (
                "upstream:\n  identity: hunter2secret\n",
                "hunter2secret",
                "line 2",
            ),
            ("listen: [topsecret]\n", "topsecret", "line 1"),
            ("maxConnections: topsecret\n", "topsecret", "line 1"),
            ("topsecret: 1\n", "zzz-never", "field `topsecret`"),
            ("listen: 'a\n", "zzz-never", "line 2"),
        ] {
            let err = Config::from_yaml(yaml).unwrap_err();
            assert!(!err.contains(secret), "{yaml}: {err}");
            assert!(err.contains(kept), "{yaml}: {err}");
            assert_eq!(err.lines().count(), 1, "{yaml}: {err}");
        }
        assert_eq!(
            redact_quoted(r#"unknown variant `x`, expected "y"; missing field `z` `q"#),
            r#"unknown variant `…`, expected "…"; missing field `z` `q"#
        );
    }

    #[test]
    fn empty_is_default() {
        assert_eq!(Config::from_yaml("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_field_is_named() {
        let err = Config::from_yaml("listen: 127.0.0.1:1\nbogus: 1\n").unwrap_err();
        assert!(err.contains("bogus"), "{err}");
        let err = Config::from_yaml("upstream:\n  kubeconfg: x\n").unwrap_err();
        assert!(err.contains("kubeconfg"), "{err}");
    }

    #[test]
    fn bad_address_names_field() {
        let c = Config {
            listen: "localhost".into(),
            ..Config::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.starts_with("listen:"), "{err}");
    }

    #[test]
    fn admin_port_stays_on_loopback() {
        let check = |admin: &str, metrics: Option<&str>| {
            let c = Config {
                admin_listen: admin.into(),
                metrics_listen: metrics.map(str::to_string),
                ..Config::default()
            };
            // The first error after the addresses is the missing certificate.
            let err = c.validate().unwrap_err().to_string();
            (!err.starts_with("tls.certFile:")).then_some(err)
        };
        assert_eq!(check("127.0.0.1:9444", None), None);
        assert_eq!(check("127.0.0.1:9444", Some("")), None);
        assert_eq!(check("[::1]:9444", Some("0.0.0.0:9445")), None);
        for addr in ["0.0.0.0:9444", "[::]:9444", "10.0.0.5:9444"] {
            let err = check(addr, None).unwrap();
            assert!(err.starts_with("adminListen:"), "{err}");
            assert!(err.contains("metricsListen"), "{err}");
        }
        let err = check("127.0.0.1:9444", Some("nowhere")).unwrap();
        assert!(err.starts_with("metricsListen:"), "{err}");
        let err = check("127.0.0.1:9444", Some("127.0.0.1:9444")).unwrap();
        assert!(err.starts_with("metricsListen:"), "{err}");
        let mut c = Config::default();
        c.apply(&Overrides {
            metrics_listen: Some("0.0.0.0:9445".into()),
            ..Overrides::default()
        });
        assert_eq!(c.metrics_listen.as_deref(), Some("0.0.0.0:9445"));
        c.apply(&Overrides {
            metrics_listen: Some(String::new()),
            ..Overrides::default()
        });
        assert_eq!(c.metrics_listen, None);
    }

    #[test]
    fn missing_cert_names_field() {
        let err = Config::default().validate().unwrap_err().to_string();
        assert!(err.starts_with("tls.certFile:"), "{err}");
    }

    #[test]
    fn cache_resources_are_validated() {
        let c = Config::from_yaml(
            "cache:\n  resources:\n  - {group: example.com, version: v1, resource: widgets}\n",
        )
        .unwrap();
        let err = c.cache.validate("").unwrap_err().to_string();
        assert!(err.starts_with("cache.resources[0].kind:"), "{err}");
        let c = Config::from_yaml("cache:\n  resources:\n  - {version: v1, resource: pods, fieldSelector: 'spec.nodeName=${NODE_NAME}'}\n").unwrap();
        let err = c.cache.validate("").unwrap_err().to_string();
        assert!(
            err.starts_with("cache.resources[0].fieldSelector:"),
            "{err}"
        );
        assert!(c.cache.validate("node-1").is_ok());
        assert_eq!(
            c.cache.resources[0].scope("node-1").unwrap().to_string(),
            "spec.nodeName=node-1"
        );
        let c = Config::from_yaml("cache:\n  resources:\n  - {version: v1, resource: configmaps, fieldSelector: 'spec.nodeName=x'}\n").unwrap();
        assert!(c.cache.validate("").is_err());
    }

    #[test]
    fn csr_section_is_validated() {
        let c = Config::from_yaml("tls:\n  csr: {enabled: true}\n").unwrap();
        assert_eq!(c.tls.csr.signer_name, "kubernetes.io/kubelet-serving");
        // No certificate files needed, but a node name is.
        let err = c.validate().unwrap_err().to_string();
        assert!(err.starts_with("nodeName:"), "{err}");
        let with = |yaml: &str| {
            let mut c = Config::from_yaml(yaml).unwrap();
            c.node_name = "node-1".into();
            c.validate().map_err(|e| e.to_string())
        };
        assert!(with("tls:\n  csr: {enabled: true}\n").is_ok());
        // Certificate files are ignored, not checked.
        assert!(with("tls:\n  certFile: /nonexistent\n  csr: {enabled: true}\n").is_ok());
        for (yaml, field) in [
            (
                "{enabled: true, dnsNames: ['-bad']}",
                "tls.csr.dnsNames[0]:",
            ),
            (
                "{enabled: true, ipAddresses: ['127.0.0.1', 'x']}",
                "tls.csr.ipAddresses[1]:",
            ),
            (
                "{enabled: true, signerName: kubelet-serving}",
                "tls.csr.signerName:",
            ),
            (
                "{enabled: true, requestedDurationSeconds: 60}",
                "tls.csr.requestedDurationSeconds:",
            ),
            (
                "{enabled: true, dnsNames: [], ipAddresses: []}",
                "tls.csr.ipAddresses:",
            ),
            ("{enabled: true, directory: ''}", "tls.csr.directory:"),
            (
                "{enabled: true, directory: /dev/null}",
                "tls.csr.directory:",
            ),
        ] {
            let err = with(&format!("tls:\n  csr: {yaml}\n")).unwrap_err();
            assert!(err.starts_with(field), "{yaml}: {err}");
        }
        assert!(with("tls:\n  csr: {enabled: true, requestedDurationSeconds: 3600}\n").is_ok());
        let mut c = Config::from_yaml("tls:\n  csr: {enabled: true}\n").unwrap();
        c.node_name = "Not_A_Node".into();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.starts_with("nodeName:"), "{err}");
        // Disabled: not checked, and the files are required as before.
        let err = Config::from_yaml("tls:\n  csr: {dnsNames: ['-bad']}\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tls.certFile:"), "{err}");
    }

    #[test]
    fn default_yaml_parses_back_to_the_defaults() {
        let yaml = Config::default_yaml().unwrap();
        assert!(
            yaml.starts_with(
                "apiVersion: kubecacheproxy.io/v1alpha1\nkind: KubeCacheProxyConfiguration\n"
            ),
            "{yaml}"
        );
        assert!(yaml.contains("clientCAFile:"), "{yaml}");
        assert!(yaml.contains("minVersion: VersionTLS12"), "{yaml}");
        let mut c = Config::from_yaml(&yaml).unwrap();
        c.api_version = None;
        c.kind = None;
        assert_eq!(c, Config::default());
    }

    #[test]
    fn overrides_win() {
        let mut c = Config::from_yaml("listen: 127.0.0.1:1\n").unwrap();
        c.apply(&Overrides {
            listen: Some("127.0.0.1:2".into()),
            ..Overrides::default()
        });
        assert_eq!(c.listen, "127.0.0.1:2");
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;

    /// The documented example parses, and lists every field with its default
    /// (except the paths it fills in).
    #[test]
    fn documented_example_matches_defaults() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/kube-cache-proxy.yaml");
        let mut c = Config::from_file(&path).unwrap();
        assert_eq!(c.api_version.as_deref(), Some(API_VERSION));
        assert_eq!(c.kind.as_deref(), Some(KIND));
        c.api_version = None;
        c.kind = None;
        c.tls.cert_file = None;
        c.tls.private_key_file = None;
        c.tls.client_ca_file = None;
        assert_eq!(c, Config::default());
    }
}
