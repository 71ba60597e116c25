//! The configuration's types (`KubeCacheProxyConfiguration`): every field
//! with its YAML name (camelCase, with its unit) and its default, and what a
//! cached resource's `fieldSelector` scopes upstream.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The `apiVersion` a configuration file may declare.
pub const API_VERSION: &str = "kubecacheproxy.io/v1alpha1";
/// The `kind` a configuration file may declare.
pub const KIND: &str = "KubeCacheProxyConfiguration";

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
    /// Pods on the node's pod network (docs/pods.md): a listener they
    /// reach, and whether kubelet points their containers at it.
    pub pod_network: PodNetworkConfig,
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

/// `podNetwork`: pods on the node reach the proxy at a node-local address
/// (docs/pods.md), as OpenYurt's YurtHub serves an edge node's pods.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PodNetworkConfig {
    /// Address (`host:port`) of a second HTTPS listener, with the same
    /// certificate, authentication and authorization as `listen`, on an
    /// address of the node that its pods reach through their default route
    /// and nothing beyond the node does: a link-local address on a dummy
    /// interface (or the node's loopback), such as `169.254.64.1:6444`
    /// (docs/pods.md says how to add it). Not `0.0.0.0` or `::`,
    /// which would serve every network the node is on. Unset or empty
    /// (default): none.
    #[serde(deserialize_with = "empty_as_none")]
    pub listen: Option<String>,
    /// Whether kubelet, reading Services through this proxy, sees the
    /// `default/kubernetes` Service pointing at `listen` (its `clusterIP`,
    /// `clusterIPs` and `https` port), so that every container it starts
    /// gets `KUBERNETES_SERVICE_HOST`/`PORT` for this proxy. Only this
    /// node's kubelet (`system:node:<nodeName>`) sees it; every other
    /// client, kube-proxy above all, reads the real Service.
    pub kubernetes_service: KubernetesServiceMode,
}

/// `podNetwork.kubernetesService`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub enum KubernetesServiceMode {
    /// The real Service, for every client (default).
    #[default]
    Never,
    /// Rewritten for kubelet while the node carries the label
    /// `kubecacheproxy.io/kubernetes-service=node-local` (read from the
    /// proxy's own cache of its Node): turned on and off per node, without
    /// a restart.
    NodeLabel,
    /// Rewritten for kubelet.
    Always,
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
    /// How long a denied decision is reused, in seconds. Default 0: never,
    /// as the apiserver evaluates every request (concurrent requests with
    /// the same attributes still share one review). The Node authorizer's
    /// graph follows pods a moment behind their binding, so a kubelet's
    /// first read of a new pod's Secret or ConfigMap can be denied ("no
    /// relationship found") and is allowed when it retries a second
    /// later; a reused denial held it for its whole TTL, and the kubelet's
    /// backoff past it (docs/performance.md, section (k)).
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
            denied_cache_ttl_seconds: 0,
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
    /// runtimeclasses, csidrivers, csinodes, servicecidrs, networkpolicies).
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
    /// How long progress watches keep rolling after the last read that
    /// waited for the cache to be shown fresh (a consistent watch, a large
    /// or waiting consistent list): one short upstream watch
    /// (`timeoutSeconds=3`, no objects unless the resource changes) a
    /// second, so that one is due at each of the apiserver's bookmark
    /// ticks and such a read waits for the next tick only (about 1 s,
    /// instead of up to 2.25 s). 0: one progress watch per wait. Default
    /// 10 s.
    pub progress_watch_roll_seconds: u64,
    /// How long a watch holds an event for more to write with it, in
    /// milliseconds: the events that reach a watcher within that time are
    /// written as one HTTP/2 DATA frame (or HTTP/1.1 chunk), so its
    /// connection is woken, encrypts and writes once for them all. The
    /// held watches of one HTTP/2 connection share the window (a node's
    /// Services and EndpointSlices through a tier): those whose first
    /// event arrives while it is open are written together when it closes,
    /// so each is held at most this long, and the later ones less. Only
    /// watches that any object's change may reach are held (a resource, a
    /// namespace, a label selector: kube-proxy's Services and
    /// EndpointSlices), not those pinned by `metadata.name` or
    /// `spec.nodeName` (kubelet's pods, its Node, a Secret). Default 0:
    /// each event is written as soon as it is dispatched, as by
    /// kube-apiserver. An event is delayed by at most this much; a tier,
    /// whose every Service and EndpointSlice event goes to every node,
    /// trades that for CPU (docs/tier.md).
    pub watch_batch_milliseconds: u64,
    /// How long a read "not older than N" waits before `504 Timeout`.
    /// Default 3000 ms, as kube-apiserver's cache.
    pub not_older_than_wait_milliseconds: u64,
    /// How long a read waits for its resource's first list before passing
    /// through. Default 2000 ms.
    pub ready_wait_milliseconds: u64,
    /// MiB of protobuf encodings kept for cached objects, all resources
    /// together. An object version is encoded for each protobuf reader
    /// (kubelet, kube-proxy) that asks for it, and kept from its second
    /// read on; kept encodings are evicted least recently and frequently
    /// used first, and after 10 minutes unread, and encoded again by
    /// their next reader (about 20 µs for a 5 KB pod). 0 keeps none.
    /// Default 64.
    pub protobuf_cache_mib: u64,
    /// The kept protobuf encodings' ceiling as a percentage of the cached
    /// objects' bytes (`kube_cache_proxy_cache_bytes`, all resources),
    /// within `protobufCacheMib`: past it, a protobuf read's encodings are
    /// used and dropped, not kept. At most 100 (a pod's encoding is
    /// about 60 % of its JSON, so 100 keeps them all). 0 keeps none.
    /// Default 5.
    pub protobuf_cache_percent: u64,
    /// How the cache reads its resources upstream (its lists and watches):
    /// `JSON`, or `Protobuf` for the built-in kinds (custom resources stay
    /// in JSON). In protobuf, the apiserver (or a tier) sends about half the
    /// bytes (0.52× for an EndpointSlice, 0.47× for a pod) and encodes each
    /// event once for every protobuf watcher, kubelets' and kube-proxies'
    /// alike. The cache still holds and serves each object as the JSON
    /// kube-apiserver writes, transcoded from the protobuf message
    /// (`apimachinery::protobuf::to_json`; byte-equal with kube-apiserver
    /// 1.34 to 1.36 with etcd in protobuf, its default); a resource whose
    /// object it cannot transcode exactly (a field this build does not know,
    /// from a newer apiserver) is read in JSON from then on. With etcd in
    /// JSON (`--storage-media-type=application/json`), an empty list the
    /// apiserver writes as `[]` reads back as `null`: use `JSON`. Default
    /// `JSON`.
    pub upstream_encoding: UpstreamEncoding,
    /// Snapshots of the cache on the node's disk, so a restarted proxy
    /// resumes instead of relisting.
    pub persistence: PersistenceConfig,
    /// The periodic check that each cache holds what upstream holds at
    /// the same resourceVersion, and its healing relist.
    pub consistency_check: ConsistencyCheckConfig,
}

/// The consistency checker (`cache/ingest/checker.rs`), after kube-apiserver's
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

/// Cache snapshots on disk (`cache/ingest/persist.rs`): written periodically, at
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
    /// Seconds between writes of the snapshots of resources that changed,
    /// after each cache's first snapshot (written as soon as its first
    /// list lands). Default 60.
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
    /// Overrides `cache.historyMaxAgeSeconds` for this resource: a
    /// resource whose objects are big and rewritten often (EndpointSlices
    /// under endpoint churn) keeps a shorter window of old versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_max_age_seconds: Option<u64>,
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
                CachedResource::new("networking.k8s.io", "v1", "networkpolicies"),
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
            progress_watch_roll_seconds: 10,
            watch_batch_milliseconds: 0,
            not_older_than_wait_milliseconds: 3000,
            ready_wait_milliseconds: 2000,
            protobuf_cache_mib: 64,
            protobuf_cache_percent: 5,
            upstream_encoding: UpstreamEncoding::default(),
            persistence: PersistenceConfig::default(),
            consistency_check: ConsistencyCheckConfig::default(),
        }
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
}

/// `cache.upstreamEncoding`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub enum UpstreamEncoding {
    /// `application/json`.
    #[default]
    #[serde(rename = "JSON")]
    Json,
    /// `application/vnd.kubernetes.protobuf` for built-in kinds.
    Protobuf,
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
    /// Spreading upstream connections across a highly available control
    /// plane's apiservers from the proxy itself (docs/operations.md,
    /// "Highly available control planes"). Off by default.
    pub client_side_balancing: ClientSideBalancingConfig,
}

/// `upstream.clientSideBalancing`: the apiservers learnt from the
/// `default/kubernetes` EndpointSlices (through the configured server at
/// first), each new connection to the ready one with the fewest; an
/// apiserver that fails its probe or lags is left, its connections closed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ClientSideBalancingConfig {
    /// On or off. Default off: every connection goes to the configured
    /// server (a load balancer, or one apiserver).
    pub enabled: bool,
    /// Seconds between probes of each apiserver (`GET /readyz` and a
    /// consistent list of the `default/kubernetes` EndpointSlices, each
    /// allowed as long). Default 10.
    pub probe_interval_seconds: u64,
    /// An apiserver whose consistent read's resourceVersion is still below
    /// what another apiserver served this many seconds earlier lags, and
    /// is left. Default 10.
    pub max_lag_seconds: u64,
}

impl Default for ClientSideBalancingConfig {
    fn default() -> Self {
        ClientSideBalancingConfig {
            enabled: false,
            probe_interval_seconds: 10,
            max_lag_seconds: 10,
        }
    }
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
            pod_network: PodNetworkConfig::default(),
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
            client_side_balancing: ClientSideBalancingConfig::default(),
        }
    }
}

/// An optional string where `""` means unset.
fn empty_as_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v: Option<String> = Option::deserialize(d)?;
    Ok(v.filter(|s| !s.is_empty()))
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

    /// The shipped manifests' commented-out review cache settings ("These
    /// are the defaults; uncomment to tune them") parse once uncommented,
    /// and are the defaults.
    #[test]
    fn commented_review_cache_defaults_in_the_manifests_are_the_defaults() {
        for file in [
            "manifests/node/config.yaml",
            "manifests/kube-cache-proxy.yaml",
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            let block: String = text
                .lines()
                .skip_while(|l| !l.contains("These are the defaults"))
                .skip(2)
                .take_while(|l| l.starts_with("# "))
                .map(|l| format!("{}\n", &l[2..]))
                .collect();
            assert!(block.contains("subjectAccessReview"), "{file}: {block}");
            let c = Config::from_yaml(&block).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(c.authentication, Config::default().authentication, "{file}");
            assert_eq!(c.authorization, Config::default().authorization, "{file}");
        }
    }
}
