//! The apiserver's side: the connection to kube-apiserver (this module),
//! who the proxy is there ([`identity`]: its node, a tier, or its
//! credential as given) and its serving certificate issued through the
//! CSR API ([`csr`]).
//!
//! Configuration comes from a kubeconfig file or the in-cluster
//! service-account files, loaded by `kube`'s config loader (CA, client
//! certificate and key, static token or a token file that is re-read as it
//! rotates, exec plugins). A client certificate and key named by file
//! (kubelet's rotating `kubelet-client-current.pem`, a certificate an
//! operator renews) are re-read when the files change, as client-go does.
//! Requests go through a pooled hyper client over rustls that speaks
//! HTTP/2 when the apiserver offers it.
//!
//! Two pools exist because the apiserver authenticates a TLS client
//! certificate before a bearer token (its union authenticator tries x509
//! first): a request that must be authenticated by the client's own token
//! has to travel on a connection that carries no proxy certificate.
//!
//! - [`Credentials::Proxy`]: the proxy's own identity (its client
//!   certificate, its `Authorization` header). Used for the reflectors,
//!   TokenReview/SubjectAccessReview, and impersonated pass-through.
//! - [`Credentials::Client`]: no proxy credential at all; the request keeps
//!   the client's own `Authorization` header, a token the proxy knows to be
//!   valid.
//! - [`Credentials::ClientHttp1`]: the same, over HTTP/1.1 only: for
//!   requests the apiserver may not authenticate (no credential, or a
//!   token not known to be valid). kube-apiserver ends an HTTP/2
//!   connection after a request it did not authenticate or took as
//!   anonymous (its `UnauthenticatedHTTP2DOSMitigation`, GOAWAY then
//!   close), which would fail the other clients' requests multiplexed on
//!   the proxy's connection; over HTTP/1.1 it affects that request only.
//!
//! HTTP upgrades (exec, attach, port-forward) use a dedicated HTTP/1.1
//! connection per request, since HTTP/2 has no `Upgrade`.

pub mod csr;
pub mod identity;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::client::ConfigExt;
use kube::config::KubeconfigError;
use parking_lot::{Mutex, RwLock};
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, SignatureScheme};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

use crate::component::config::{UpstreamConfig, yaml_error};
use crate::server::tls::{Stamp, stamp};
use apimachinery::body::{Body, BoxError};
use apimachinery::status::Status;

/// Which credentials a request carries upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    /// The proxy's own client certificate and `Authorization` header.
    Proxy,
    /// None of the proxy's; the client's own headers are kept.
    Client,
    /// As `Client`, on HTTP/1.1 connections of their own: for requests the
    /// apiserver may answer as unauthenticated or anonymous (see the module
    /// documentation).
    ClientHttp1,
}

/// An error reaching the apiserver. Every variant is upstream-side.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The kubeconfig or in-cluster configuration could not be loaded.
    #[error("loading the upstream configuration: {0}")]
    Config(String),
    /// Opening the TCP or TLS connection failed or timed out.
    #[error("connecting to the apiserver: {0}")]
    Connect(String),
    /// The request failed after the connection was opened.
    #[error("apiserver request failed: {0}")]
    Request(String),
    /// The proxy's credentials could not be produced (exec plugin or token
    /// file failure).
    #[error("obtaining upstream credentials: {0}")]
    Credentials(String),
}

// === impl UpstreamError ===

impl UpstreamError {
    /// The metric label for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            UpstreamError::Config(_) => "config",
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Request(_) => "protocol",
            UpstreamError::Credentials(_) => "credentials",
        }
    }

    /// The `503 ServiceUnavailable` a client sees; with `Retry-After: 1`
    /// when the apiserver could not be reached, so client-go retries.
    pub fn to_status(&self) -> Status {
        let status = Status::service_unavailable(self.to_string());
        match self {
            UpstreamError::Config(_) => status,
            _ => status.with_details(apimachinery::status::Details {
                retry_after_seconds: Some(1),
                ..Default::default()
            }),
        }
    }
}

/// HTTP/2 PING and TCP keepalive interval to the apiserver, and how long a
/// PING may go unanswered.
const KEEPALIVE: Duration = Duration::from_secs(5);

type HttpsConnector = hyper_rustls::HttpsConnector<HttpConnector>;
type Pool = Client<TimeoutConnector<HttpsConnector>, Body>;
/// kube's auth layer wrapped around a service that answers with the headers
/// it was given: calling it yields the proxy's current `Authorization`.
type AuthService = BoxCloneSyncService<Request<Empty<Bytes>>, Response<Empty<Bytes>>, BoxError>;

/// One upstream server (an apiserver, or a tier proxy): base URL,
/// connection pools and credentials.
#[derive(Clone)]
struct Site {
    base: Uri,
    /// Connections carrying the proxy's client certificate; replaced when
    /// that certificate is re-read from its files.
    proxy: Arc<RwLock<Transport>>,
    client: Transport,
    client_http1: Transport,
    auth: Option<AuthService>,
    /// The proxy's client certificate and key files, when the kubeconfig
    /// names files rather than embedding the data.
    client_cert_files: Option<Arc<ClientCertFiles>>,
    /// The TLS configuration from the kubeconfig, before any re-read
    /// client certificate.
    proxy_tls: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    connect_timeout: Duration,
    idle_timeout: Duration,
}

/// A connection pool and the TLS configuration it was built with (for
/// HTTP/1.1 upgrade connections, outside the pool).
#[derive(Clone)]
struct Transport {
    pools: Arc<Pools>,
    tls_h1: Arc<ClientConfig>,
}

/// Concurrent requests (HTTP/2 streams) one upstream connection carries
/// before another is opened. kube-apiserver allows 100 concurrent streams
/// per connection (`--http2-max-streams-per-connection` unset); hyper
/// queues the streams past a server's limit on the connection, where a
/// request (a SubjectAccessReview, a lease update) would wait behind
/// long-lived watches. Go's HTTP/2 transport opens another connection
/// instead, and so does the proxy.
const STREAMS_PER_CONNECTION: usize = 90;
/// Upstream connections per pool at most; past that, requests share the
/// least-loaded one.
const MAX_CONNECTIONS: usize = 256;

/// Connection pools, each holding one HTTP/2 connection (or HTTP/1.1
/// connections), added as the ones before fill up.
struct Pools {
    make: Box<dyn Fn() -> Pool + Send + Sync>,
    slots: RwLock<Vec<Slot>>,
}

struct Slot {
    pool: Pool,
    streams: Arc<std::sync::atomic::AtomicUsize>,
}

/// One request's share of a pool, released when its response body ends or
/// is dropped.
#[derive(Debug)]
struct StreamGuard(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl Pools {
    fn new(make: Box<dyn Fn() -> Pool + Send + Sync>) -> Pools {
        Pools {
            make,
            slots: RwLock::new(Vec::new()),
        }
    }

    /// A pool with room for one more request, and the request's share.
    fn checkout(&self) -> (Pool, StreamGuard) {
        use std::sync::atomic::Ordering;
        let reserve = |slot: &Slot| {
            slot.streams
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < STREAMS_PER_CONNECTION).then_some(n + 1)
                })
                .is_ok()
                .then(|| (slot.pool.clone(), StreamGuard(slot.streams.clone())))
        };
        if let Some(found) = self.slots.read().iter().find_map(reserve) {
            return found;
        }
        let mut slots = self.slots.write();
        if let Some(found) = slots.iter().find_map(reserve) {
            return found;
        }
        if slots.len() >= MAX_CONNECTIONS
            && let Some(least) = slots
                .iter()
                .min_by_key(|s| s.streams.load(Ordering::Acquire))
        {
            least.streams.fetch_add(1, Ordering::AcqRel);
            return (least.pool.clone(), StreamGuard(least.streams.clone()));
        }
        let slot = Slot {
            pool: (self.make)(),
            streams: Arc::new(std::sync::atomic::AtomicUsize::new(1)),
        };
        let found = (slot.pool.clone(), StreamGuard(slot.streams.clone()));
        slots.push(slot);
        found
    }
}

/// A response body from upstream; its request's share of the connection
/// is released when it ends or is dropped.
#[derive(Debug)]
pub struct UpstreamBody {
    inner: Incoming,
    stream: Option<StreamGuard>,
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.stream = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The proxy's client certificate and key files, and what they looked like
/// when last read.
#[derive(Debug)]
struct ClientCertFiles {
    cert: PathBuf,
    key: PathBuf,
    stamps: Mutex<(Stamp, Stamp)>,
}

/// Always presents one client certificate.
#[derive(Debug)]
struct FixedClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for FixedClientCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl std::fmt::Debug for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// The upstream: the server the proxy forwards to and fills its caches
/// from (`upstream.kubeconfig`: kube-apiserver, or a tier proxy), and
/// optionally a fallback (`upstream.fallback`: the apiserver itself, when
/// the primary is a tier). Requests go to the active one. After
/// [`FAILOVER_AFTER`] consecutive failures to connect to the primary, the
/// fallback becomes active; a probe of the primary every
/// [`PRIMARY_RECHECK`] (±50 % jitter, so a fleet of node proxies does not
/// return at once) makes the primary active again once it answers.
/// Watches of the inactive server end (the reflector's resume from their
/// resourceVersion on the active one: resourceVersions are etcd's, the
/// same through either).
#[derive(Clone)]
pub struct Upstream {
    sites: Arc<[Site]>,
    state: Arc<SiteState>,
}

/// Which server is active.
#[derive(Debug)]
struct SiteState {
    /// Consecutive connect failures of the primary.
    failures: std::sync::atomic::AtomicU32,
    /// The active site's index; its changes wake watches to move.
    active: tokio::sync::watch::Sender<usize>,
    /// `kube_cache_proxy_upstream_fallback_active`, once set.
    gauge: std::sync::OnceLock<prometheus::IntGauge>,
}

/// Consecutive failures to connect to the primary before the fallback is
/// used.
const FAILOVER_AFTER: u32 = 3;
/// How often, on the fallback, the primary is tried again (±50 %).
const PRIMARY_RECHECK: Duration = Duration::from_secs(10);

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base", self.base())
            .field("sites", &self.sites.len())
            .finish_non_exhaustive()
    }
}

// === impl Upstream ===

impl Upstream {
    /// Loads the configuration (kubeconfig file, or in-cluster) and builds
    /// the pools. Connects lazily.
    ///
    /// # Errors
    /// [`UpstreamError::Config`] when the kubeconfig cannot be read, its
    /// context is missing, or its TLS material is invalid.
    pub async fn from_config(cfg: &UpstreamConfig) -> Result<Upstream, UpstreamError> {
        let kube_config = load_kube_config(cfg.kubeconfig.as_deref(), cfg.context.clone()).await?;
        Upstream::new(
            &kube_config,
            Duration::from_secs(cfg.connect_timeout_seconds),
            Duration::from_secs(cfg.idle_timeout_seconds),
        )
    }

    /// Builds the pools from an already-loaded `kube::Config`.
    ///
    /// # Errors
    /// [`UpstreamError::Config`] when its TLS material is invalid.
    pub fn new(
        kube_config: &kube::Config,
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Result<Upstream, UpstreamError> {
        let site = Site::new(kube_config, connect_timeout, idle_timeout)?;
        Ok(Upstream {
            sites: Arc::from(vec![site]),
            state: Arc::new(SiteState {
                failures: std::sync::atomic::AtomicU32::new(0),
                active: tokio::sync::watch::Sender::new(0),
                gauge: std::sync::OnceLock::new(),
            }),
        })
    }

    /// This upstream with `fallback` (built from another kubeconfig) for
    /// when this one cannot be reached.
    ///
    /// # Errors
    /// [`UpstreamError::Config`] when its TLS material is invalid.
    pub fn with_fallback(
        self,
        kube_config: &kube::Config,
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Result<Upstream, UpstreamError> {
        let fallback = Site::new(kube_config, connect_timeout, idle_timeout)?;
        let primary = self.sites[0].clone();
        Ok(Upstream {
            sites: Arc::from(vec![primary, fallback]),
            state: self.state,
        })
    }

    fn site(&self) -> &Site {
        let i = *self.state.active.borrow();
        &self.sites[i.min(self.sites.len() - 1)]
    }

    /// Reports whether the fallback is active in `gauge`.
    pub fn set_fallback_gauge(&self, gauge: prometheus::IntGauge) {
        gauge.set(i64::from(self.on_fallback()));
        let _ = self.state.gauge.set(gauge);
    }

    /// Whether the fallback is active.
    pub fn on_fallback(&self) -> bool {
        *self.state.active.borrow() != 0
    }

    /// Resolves when the active server changes (a watch of the other one
    /// should end and resume on it).
    pub fn site_changed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.state.active.subscribe();
        async move {
            let _ = rx.changed().await;
        }
    }

    fn activate(&self, i: usize) {
        let changed = self.state.active.send_if_modified(|a| {
            let changed = *a != i;
            *a = i;
            changed
        });
        if changed {
            self.state
                .failures
                .store(0, std::sync::atomic::Ordering::SeqCst);
            if let Some(g) = self.state.gauge.get() {
                g.set(i64::from(i != 0));
            }
            if i == 0 {
                tracing::info!(upstream = %self.sites[0].base, "the primary upstream answers again; using it");
            } else {
                tracing::warn!(primary = %self.sites[0].base, fallback = %self.sites[i].base, "the primary upstream cannot be reached; using the fallback");
            }
        }
    }

    /// Counts the outcome of a request to the primary.
    fn record<B>(&self, site: usize, result: &Result<Response<B>, UpstreamError>) {
        if site != 0 || self.sites.len() < 2 {
            return;
        }
        match result {
            Err(UpstreamError::Connect(_)) => {
                let n = self
                    .state
                    .failures
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                    + 1;
                if n >= FAILOVER_AFTER {
                    self.activate(1);
                }
            }
            Ok(_) => self
                .state
                .failures
                .store(0, std::sync::atomic::Ordering::SeqCst),
            Err(_) => {}
        }
    }

    /// While the fallback is active, tries the primary every
    /// [`PRIMARY_RECHECK`] (jittered) with `GET /version` (any HTTP answer
    /// means it is back), until `shutdown`. Nothing without a fallback.
    pub fn spawn_primary_recheck(&self, shutdown: tokio_util::sync::CancellationToken) {
        if self.sites.len() < 2 {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let mut rx = this.state.active.subscribe();
            loop {
                if !this.on_fallback() {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        r = rx.changed() => if r.is_err() { return },
                    }
                    continue;
                }
                let wait = PRIMARY_RECHECK.mul_f64(0.5 + fastrand::f64());
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                let primary = &this.sites[0];
                let Ok(req) = primary.own_request(http::Method::GET, "/version", None) else {
                    continue;
                };
                if primary.send(req, Credentials::ClientHttp1).await.is_ok() {
                    this.activate(0);
                }
            }
        });
    }

    /// Re-reads each server's client certificate if its files changed
    /// (see [`Site::reload_client_certificate_if_changed`]); whether any
    /// was replaced.
    pub fn reload_client_certificate_if_changed(&self) -> bool {
        // Every site is re-read (no short circuit).
        let reloaded: Vec<bool> = self
            .sites
            .iter()
            .map(Site::reload_client_certificate_if_changed)
            .collect();
        reloaded.contains(&true)
    }

    /// Spawns the client-certificate reloader of each server.
    pub fn spawn_reloader(
        &self,
        interval: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        for s in self.sites.iter() {
            s.spawn_reloader(interval, shutdown.clone());
        }
    }

    /// The active server's base URL.
    pub fn base(&self) -> &Uri {
        &self.site().base
    }

    /// Each server (the primary, then `upstream.fallback`'s): its URL
    /// (without any user information) and whether it is the active one;
    /// and the primary's consecutive connect failures. For the operator's
    /// view.
    pub fn servers(&self) -> (Vec<(String, bool)>, u32) {
        let active = *self.state.active.borrow();
        let servers = self
            .sites
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let authority = s.base.authority().map_or("", |a| {
                    a.as_str()
                        .rsplit_once('@')
                        .map_or(a.as_str(), |(_, host)| host)
                });
                let scheme = s.base.scheme_str().unwrap_or("https");
                let path = s.base.path().trim_end_matches('/');
                (format!("{scheme}://{authority}{path}"), i == active)
            })
            .collect();
        (
            servers,
            self.state
                .failures
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The URI of a request's path and query on the active server.
    ///
    /// # Errors
    /// When the joined URI is invalid.
    pub fn uri(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, UpstreamError> {
        self.site().uri(path_and_query)
    }

    /// A request the proxy makes for itself; see [`Site::own_request`].
    ///
    /// # Errors
    /// When `path_and_query` does not make a valid URI.
    pub fn own_request(
        &self,
        method: http::Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Request<Body>, UpstreamError> {
        self.site().own_request(method, path_and_query, body)
    }

    /// The index of the active site, and `req`'s URI moved onto it if it
    /// was built for another.
    fn retarget(&self, req: &mut Request<Body>) -> Result<usize, UpstreamError> {
        let active = (*self.state.active.borrow()).min(self.sites.len() - 1);
        if self.sites.len() > 1 {
            let uri = req.uri().clone();
            for (i, s) in self.sites.iter().enumerate() {
                if i != active
                    && uri.authority() == s.base.authority()
                    && uri.scheme() == s.base.scheme()
                {
                    let prefix = s.base.path().trim_end_matches('/');
                    let pq = uri.path_and_query().map_or("/", PathAndQuery::as_str);
                    let rest = pq.strip_prefix(prefix).unwrap_or(pq);
                    let rest: PathAndQuery = rest
                        .parse()
                        .map_err(|e| UpstreamError::Request(format!("invalid path: {e}")))?;
                    *req.uri_mut() = self.sites[active].uri(Some(&rest))?;
                    break;
                }
            }
        }
        Ok(active)
    }

    /// Sends a request to the active server; see [`Site::send`].
    ///
    /// # Errors
    /// [`UpstreamError`] when the server cannot be reached or the request
    /// fails before response headers arrive.
    pub async fn send(
        &self,
        mut req: Request<Body>,
        credentials: Credentials,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let site = self.retarget(&mut req)?;
        let result = self.sites[site].send(req, credentials).await;
        self.record(site, &result);
        result
    }

    /// Sends an upgrade request to the active server; see
    /// [`Site::send_upgrade`].
    ///
    /// # Errors
    /// [`UpstreamError`] when the connection or handshake fails.
    pub async fn send_upgrade(
        &self,
        mut req: Request<Body>,
        credentials: Credentials,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let site = self.retarget(&mut req)?;
        let result = self.sites[site].send_upgrade(req, credentials).await;
        self.record(site, &result);
        result
    }
}

// === impl Site ===

impl Site {
    /// Builds the pools from an already-loaded `kube::Config`.
    ///
    /// # Errors
    /// [`UpstreamError::Config`] when its TLS material is invalid.
    fn new(
        kube_config: &kube::Config,
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Result<Site, UpstreamError> {
        let cfg_err = |e: kube::Error| UpstreamError::Config(e.to_string());
        let proxy_tls = kube_config.rustls_client_config().map_err(cfg_err)?;
        let mut anonymous = kube_config.clone();
        anonymous.auth_info = kube::config::AuthInfo::default();
        let client_tls = anonymous.rustls_client_config().map_err(cfg_err)?;

        let base = kube_config.cluster_url.clone();
        let host = base
            .host()
            .ok_or_else(|| UpstreamError::Config(format!("server URL {base} has no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let name = kube_config.tls_server_name.clone().unwrap_or(host);
        let server_name = ServerName::try_from(name.clone())
            .map_err(|e| UpstreamError::Config(format!("invalid TLS server name {name:?}: {e}")))?;

        let auth = kube_config.auth_layer().map_err(cfg_err)?.map(|layer| {
            let identity = tower::service_fn(|req: Request<Empty<Bytes>>| async move {
                let mut echo = Response::new(Empty::new());
                *echo.headers_mut() = req.headers().clone();
                Ok::<_, BoxError>(echo)
            });
            BoxCloneSyncService::new(layer.layer(identity))
        });

        // client-go re-reads a client certificate named by file (kubelet's
        // kubelet-client-current.pem rotates); data embedded in the
        // kubeconfig cannot change.
        let info = &kube_config.auth_info;
        let client_cert_files = match (&info.client_certificate, &info.client_key) {
            (Some(cert), Some(key))
                if info.client_certificate_data.is_none() && info.client_key_data.is_none() =>
            {
                let (cert, key) = (PathBuf::from(cert), PathBuf::from(key));
                let stamps = (stamp(&cert), stamp(&key));
                Some(Arc::new(ClientCertFiles {
                    cert,
                    key,
                    stamps: Mutex::new(stamps),
                }))
            }
            _ => None,
        };

        let proxy = Transport::new(
            proxy_tls.clone(),
            &server_name,
            connect_timeout,
            idle_timeout,
            true,
        );
        let client = Transport::new(
            client_tls.clone(),
            &server_name,
            connect_timeout,
            idle_timeout,
            true,
        );
        let client_http1 = Transport::new(
            client_tls,
            &server_name,
            connect_timeout,
            idle_timeout,
            false,
        );
        Ok(Site {
            base,
            proxy: Arc::new(RwLock::new(proxy)),
            client,
            client_http1,
            auth,
            client_cert_files,
            proxy_tls: Arc::new(proxy_tls),
            server_name,
            connect_timeout,
            idle_timeout,
        })
    }

    /// Re-reads the proxy's client certificate and key if their files
    /// changed, and if they load, sends new requests over new connections
    /// that present them (requests in flight finish on the old ones). A
    /// pair that does not load (a rotation half-written, a key that does
    /// not match) is logged and the current one kept. Returns whether the
    /// certificate was replaced.
    pub fn reload_client_certificate_if_changed(&self) -> bool {
        let Some(files) = &self.client_cert_files else {
            return false;
        };
        let stamps = (stamp(&files.cert), stamp(&files.key));
        let mut seen = files.stamps.lock();
        if *seen == stamps {
            return false;
        }
        let provider = self.proxy_tls.crypto_provider().clone();
        let key = match crate::server::tls::read_certified_key(&files.cert, &files.key, &provider) {
            Ok(key) => key,
            Err(error) => {
                tracing::warn!(%error, "upstream client certificate changed but could not be loaded; keeping the previous one");
                return false;
            }
        };
        let mut tls = (*self.proxy_tls).clone();
        tls.client_auth_cert_resolver = Arc::new(FixedClientCert(Arc::new(key)));
        // No resumption of sessions made with the previous certificate: a
        // resumed session keeps the identity it was established with.
        tls.resumption = rustls::client::Resumption::default();
        let transport = Transport::new(
            tls,
            &self.server_name,
            self.connect_timeout,
            self.idle_timeout,
            true,
        );
        *self.proxy.write() = transport;
        *seen = stamps;
        tracing::info!(cert = %files.cert.display(), "reloaded the upstream client certificate");
        true
    }

    /// Spawns a task that calls
    /// [`Upstream::reload_client_certificate_if_changed`] every `interval`
    /// until `shutdown` is cancelled; nothing when the kubeconfig embeds
    /// its client certificate or has none.
    pub fn spawn_reloader(
        &self,
        interval: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        if self.client_cert_files.is_none() {
            return;
        }
        let this = self.clone();
        crate::server::tls::spawn_every(interval, shutdown, move || {
            this.reload_client_certificate_if_changed();
        });
    }

    fn transport(&self, credentials: Credentials) -> Transport {
        match credentials {
            Credentials::Proxy => self.proxy.read().clone(),
            Credentials::Client => self.client.clone(),
            Credentials::ClientHttp1 => self.client_http1.clone(),
        }
    }

    /// The upstream URI for a request's path and query, under the base
    /// URL's path (some clusters serve the API under a prefix).
    ///
    /// # Errors
    /// When the joined URI is invalid.
    pub fn uri(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, UpstreamError> {
        let prefix = self.base.path().trim_end_matches('/');
        let pq = path_and_query.map_or("/", PathAndQuery::as_str);
        let mut parts = self.base.clone().into_parts();
        parts.path_and_query = Some(
            format!("{prefix}{pq}")
                .parse()
                .map_err(|e| UpstreamError::Request(format!("invalid path: {e}")))?,
        );
        Uri::from_parts(parts).map_err(|e| UpstreamError::Request(format!("invalid URI: {e}")))
    }

    /// A request the proxy makes for itself (reflector lists and watches,
    /// reviews, its CSR): `path_and_query` under the base URL, accepting
    /// JSON, sending `body` as JSON if any, with the proxy's `User-Agent`.
    /// Send it with [`Credentials::Proxy`].
    ///
    /// # Errors
    /// When `path_and_query` does not make a valid URI.
    pub fn own_request(
        &self,
        method: http::Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Request<Body>, UpstreamError> {
        let pq = path_and_query
            .parse()
            .map_err(|e| UpstreamError::Request(format!("invalid path: {e}")))?;
        let uri = self.uri(Some(&pq))?;
        let has_body = body.is_some();
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .body(body.map_or_else(apimachinery::body::empty, apimachinery::body::full))
            .map_err(|e| UpstreamError::Request(e.to_string()))?;
        let h = req.headers_mut();
        let json = HeaderValue::from_static("application/json");
        if has_body {
            h.insert(http::header::CONTENT_TYPE, json.clone());
        }
        h.insert(http::header::ACCEPT, json);
        h.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(concat!("kube-cache-proxy/", env!("CARGO_PKG_VERSION"))),
        );
        Ok(req)
    }

    /// Sends a request whose URI is already an upstream URI (see
    /// [`Upstream::uri`]) and returns the response headers; the body
    /// streams.
    ///
    /// # Errors
    /// [`UpstreamError`] when the apiserver cannot be reached or the
    /// request fails before response headers arrive.
    pub async fn send(
        &self,
        mut req: Request<Body>,
        credentials: Credentials,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        if credentials == Credentials::Proxy {
            self.authorize(req.headers_mut()).await?;
        }
        let (pool, stream) = self.transport(credentials).pools.checkout();
        let resp = pool.request(req).await.map_err(|e| {
            if e.is_connect() {
                UpstreamError::Connect(error_chain(&e))
            } else {
                UpstreamError::Request(error_chain(&e))
            }
        })?;
        Ok(resp.map(|inner| UpstreamBody {
            inner,
            stream: Some(stream),
        }))
    }

    /// Sets the proxy's `Authorization` header (a no-op when it
    /// authenticates by client certificate only).
    async fn authorize(&self, headers: &mut http::HeaderMap) -> Result<(), UpstreamError> {
        let Some(auth) = &self.auth else {
            headers.remove(http::header::AUTHORIZATION);
            return Ok(());
        };
        let probe = auth
            .clone()
            .oneshot(Request::new(Empty::new()))
            .await
            .map_err(|e| UpstreamError::Credentials(e.to_string()))?;
        match probe.headers().get(http::header::AUTHORIZATION) {
            Some(v) => {
                headers.insert(http::header::AUTHORIZATION, v.clone());
            }
            None => {
                headers.remove(http::header::AUTHORIZATION);
            }
        }
        Ok(())
    }

    /// Sends an upgrade request (exec, attach, port-forward) on a new
    /// HTTP/1.1 connection. The returned response, if `101`, can be
    /// upgraded with `hyper::upgrade::on`.
    ///
    /// # Errors
    /// [`UpstreamError`] when the connection or handshake fails.
    pub async fn send_upgrade(
        &self,
        mut req: Request<Body>,
        credentials: Credentials,
    ) -> Result<Response<Incoming>, UpstreamError> {
        if credentials == Credentials::Proxy {
            self.authorize(req.headers_mut()).await?;
        }
        let tls = self.transport(credentials).tls_h1;
        let io = tokio::time::timeout(self.connect_timeout, self.dial(tls))
            .await
            .map_err(|_| UpstreamError::Connect("timed out".into()))??;
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| UpstreamError::Connect(error_chain(&e)))?;
        tokio::spawn(async move {
            if let Err(error) = conn.with_upgrades().await {
                tracing::debug!(%error, "upstream upgrade connection ended");
            }
        });
        // HTTP/1.1 wants origin-form on the wire, with Host set.
        let authority = self.base.authority().map(|a| a.as_str().to_string());
        if let Some(pq) = req.uri().path_and_query().cloned() {
            *req.uri_mut() = Uri::from(pq);
        }
        if let Some(a) = authority.and_then(|a| HeaderValue::from_str(&a).ok()) {
            req.headers_mut().insert(http::header::HOST, a);
        }
        sender
            .send_request(req)
            .await
            .map_err(|e| UpstreamError::Request(error_chain(&e)))
    }

    async fn dial(&self, tls: Arc<ClientConfig>) -> Result<Box<dyn Io>, UpstreamError> {
        let host = self.base.host().unwrap_or("localhost");
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let https = self.base.scheme() != Some(&Scheme::HTTP);
        let port = self.base.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| UpstreamError::Connect(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        if !https {
            return Ok(Box::new(tcp));
        }
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| UpstreamError::Connect(e.to_string()))?;
        Ok(Box::new(stream))
    }
}

impl Transport {
    fn new(
        tls: ClientConfig,
        server_name: &ServerName<'static>,
        connect_timeout: Duration,
        idle_timeout: Duration,
        http2: bool,
    ) -> Transport {
        let mut tls_h1 = tls.clone();
        tls_h1.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        // A peer host that vanished (not a hung process: its kernel would
        // still answer) is noticed within about 15 s even on HTTP/1.1.
        http.set_keepalive(Some(KEEPALIVE));
        http.set_keepalive_interval(Some(KEEPALIVE));
        http.set_keepalive_retries(Some(2));
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
                server_name.clone(),
            ))
            .enable_http1();
        let https = if http2 {
            builder.enable_http2().wrap_connector(http)
        } else {
            builder.wrap_connector(http)
        };
        // The connect timeout above covers TCP only; this one also bounds
        // the TLS handshake.
        let connector = TimeoutConnector {
            inner: https,
            timeout: connect_timeout,
        };
        // Each pool made holds its own connection (see `Pools`).
        let make = move || {
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(idle_timeout)
                .pool_timer(hyper_util::rt::TokioTimer::new())
                // A hung apiserver (or a black-holed path) is noticed within
                // 2 × KEEPALIVE: its watches, pass-through requests and
                // probes on the connection fail and are retried elsewhere.
                .http2_keep_alive_interval(Some(KEEPALIVE))
                .http2_keep_alive_timeout(KEEPALIVE)
                .timer(hyper_util::rt::TokioTimer::new())
                .build(connector.clone())
        };
        Transport {
            pools: Arc::new(Pools::new(Box::new(make))),
            tls_h1: Arc::new(tls_h1),
        }
    }
}

/// A connector that bounds the whole connect (TCP and TLS) by a timeout.
#[derive(Clone)]
struct TimeoutConnector<C> {
    inner: C,
    timeout: Duration,
}

impl<C> tower::Service<Uri> for TimeoutConnector<C>
where
    C: tower::Service<Uri> + Send,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connect = self.inner.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connect).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Err(format!("connect timed out after {timeout:?}").into()),
            }
        })
    }
}

/// A byte stream to the apiserver (TLS or plain TCP).
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Loads a kubeconfig file (with an optional context) or, with no path,
/// the in-cluster configuration.
///
/// # Errors
/// [`UpstreamError::Config`] describing what could not be loaded.
pub async fn load_kube_config(
    path: Option<&Path>,
    context: Option<String>,
) -> Result<kube::Config, UpstreamError> {
    let options = kube::config::KubeConfigOptions {
        context,
        ..Default::default()
    };
    match path {
        Some(path) => {
            let failed = |e: &KubeconfigError| {
                UpstreamError::Config(format!("{}: {}", path.display(), kubeconfig_error(e)))
            };
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| failed(&e))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| failed(&e))
        }
        None => kube::Config::incluster().map_err(|e| {
            UpstreamError::Config(format!(
                "no upstream kubeconfig given and the in-cluster configuration is unavailable: {e}"
            ))
        }),
    }
}

/// A kubeconfig error without the file's contents: a YAML error is the
/// parser's message and location only (a key file given by mistake, or a
/// kubeconfig holding a token, must not be echoed; [`yaml_error`]).
fn kubeconfig_error(e: &KubeconfigError) -> String {
    match e {
        KubeconfigError::Parse(yaml) => {
            format!("failed to parse kubeconfig YAML: {}", yaml_error(yaml))
        }
        other => error_chain(other),
    }
}

/// The error and its sources, joined, for messages and logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(url: &str) -> Upstream {
        let cfg = kube::Config::new(url.parse().unwrap());
        Upstream::new(&cfg, Duration::from_secs(1), Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn uri_keeps_base_prefix() {
        let u = upstream("https://example.com:6443/k8s/clusters/c-1/");
        let pq: PathAndQuery = "/api/v1/pods?watch=1".parse().unwrap();
        assert_eq!(
            u.uri(Some(&pq)).unwrap().to_string(),
            "https://example.com:6443/k8s/clusters/c-1/api/v1/pods?watch=1"
        );
        let u = upstream("https://10.0.0.1:6443");
        assert_eq!(
            u.uri(Some(&pq)).unwrap().to_string(),
            "https://10.0.0.1:6443/api/v1/pods?watch=1"
        );
    }

    #[tokio::test]
    async fn unreachable_is_a_fast_connect_error() {
        // Bind and drop to find a port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let u = upstream(&format!("https://127.0.0.1:{port}"));
        let req = Request::get(u.uri(Some(&"/api".parse().unwrap())).unwrap())
            .body(apimachinery::body::empty())
            .unwrap();
        let start = std::time::Instant::now();
        let err = u.send(req, Credentials::Client).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Connect(_)), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(1));
        let status = err.to_status();
        assert_eq!(status.code, 503);
        assert_eq!(status.into_response().headers()["retry-after"], "1");
    }

    #[tokio::test]
    async fn client_certificate_files_are_reread_only_when_valid() {
        let dir = std::env::temp_dir().join(format!("kcp-upstream-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = apimachinery::pki::Ca::new("ca").unwrap();
        let pem = dir.join("client.pem");
        let first = ca.issue_client("proxy", None).unwrap();
        std::fs::write(&pem, format!("{}{}", first.cert_pem, first.key_pem)).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        let file = pem.to_str().unwrap();
        std::fs::write(
            &kubeconfig,
            apimachinery::kubeconfig::with_certificate_files(
                "https://127.0.0.1:1",
                &ca.cert_pem(),
                "proxy",
                file,
                file,
            ),
        )
        .unwrap();
        let cfg = load_kube_config(Some(&kubeconfig), None).await.unwrap();
        let u = Upstream::new(&cfg, Duration::from_secs(1), Duration::from_secs(1)).unwrap();
        assert!(u.sites[0].client_cert_files.is_some());
        // Unchanged.
        assert!(!u.reload_client_certificate_if_changed());
        // Half-written, and a key that belongs to another certificate: kept.
        std::fs::write(&pem, &first.cert_pem).unwrap();
        assert!(!u.reload_client_certificate_if_changed());
        let second = ca.issue_client("proxy", None).unwrap();
        std::fs::write(&pem, format!("{}{}", second.cert_pem, first.key_pem)).unwrap();
        assert!(!u.reload_client_certificate_if_changed());
        // Complete: taken, once.
        std::fs::write(&pem, format!("{}{}", second.cert_pem, second.key_pem)).unwrap();
        assert!(u.reload_client_certificate_if_changed());
        assert!(!u.reload_client_certificate_if_changed());
        // Embedded data cannot change: nothing to watch.
        assert!(
            upstream("https://127.0.0.1:1").sites[0]
                .client_cert_files
                .is_none()
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
