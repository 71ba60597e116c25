//! [`Upstream`]: the primary server and `upstream.fallback`, which of them
//! is active (consecutive connect failures counted, the primary probed
//! again while on the fallback), and requests sent to the active one.

use std::sync::Arc;
use std::time::Duration;

use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use hyper::body::Incoming;

use super::error::UpstreamError;
use super::kubeconfig::load_kube_config;
use super::pool::UpstreamBody;
use super::site::{Credentials, Site};
use crate::component::config::UpstreamConfig;
use apimachinery::body::Body;

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
    pub(super) sites: Arc<[Site]>,
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
    /// Bumped by [`Upstream::reconnect`]: watches end and resume over new
    /// connections.
    reconnects: tokio::sync::watch::Sender<u64>,
    /// When an upstream watch last delivered anything (an event, a
    /// bookmark): milliseconds since `epoch` ([`Upstream::heard`]).
    heard_ms: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
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
        Upstream::build(kube_config, connect_timeout, idle_timeout, None)
    }

    /// [`Upstream::new`] with client-side balancing across the apiservers
    /// (`upstream.clientSideBalancing`; [`Upstream::spawn_balancer`]
    /// learns and probes them): an apiserver whose watch cache is below
    /// what another served `max_lag` earlier is left.
    ///
    /// # Errors
    /// [`UpstreamError::Config`] when its TLS material is invalid.
    pub fn balanced(
        kube_config: &kube::Config,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_lag: Duration,
    ) -> Result<Upstream, UpstreamError> {
        Upstream::build(kube_config, connect_timeout, idle_timeout, Some(max_lag))
    }

    fn build(
        kube_config: &kube::Config,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_lag: Option<Duration>,
    ) -> Result<Upstream, UpstreamError> {
        let site = Site::new(kube_config, connect_timeout, idle_timeout, max_lag)?;
        Ok(Upstream {
            sites: Arc::from(vec![site]),
            state: Arc::new(SiteState {
                failures: std::sync::atomic::AtomicU32::new(0),
                active: tokio::sync::watch::Sender::new(0),
                gauge: std::sync::OnceLock::new(),
                reconnects: tokio::sync::watch::Sender::new(0),
                heard_ms: std::sync::atomic::AtomicU64::new(0),
                epoch: std::time::Instant::now(),
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
        let fallback = Site::new(kube_config, connect_timeout, idle_timeout, None)?;
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
    /// should end and resume on it), or [`Upstream::reconnect`] is called.
    pub fn site_changed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut active = self.state.active.subscribe();
        let mut reconnects = self.state.reconnects.subscribe();
        async move {
            tokio::select! {
                _ = active.changed() => {}
                _ = reconnects.changed() => {}
            }
        }
    }

    /// Notes that an upstream watch delivered something (an event, a
    /// bookmark): the server behind it is current as far as it knows.
    pub fn heard(&self) {
        let ms = u64::try_from(self.state.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.state
            .heard_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long since an upstream watch last delivered anything
    /// ([`Upstream::heard`]), or since the upstream was made.
    pub fn silent_for(&self) -> Duration {
        let heard = self
            .state
            .heard_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        self.state
            .epoch
            .elapsed()
            .saturating_sub(Duration::from_millis(heard))
    }

    /// Sends the proxy's own requests over new connections from now on,
    /// and ends its watches (they resume over them): the server behind
    /// the connections in use answers no more, or lags (behind a load
    /// balancer, a new connection may reach another apiserver; with
    /// client-side balancing, the balancer picks one).
    pub fn reconnect(&self) {
        let site = &self.sites[*self.state.active.borrow()];
        site.reset_proxy_connections();
        self.state.reconnects.send_modify(|n| *n += 1);
        self.heard();
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

    /// The primary server's balancer, with client-side balancing.
    pub fn balancer(&self) -> Option<&Arc<super::balance::Balancer>> {
        self.sites[0].balancer.as_ref()
    }

    /// With client-side balancing, probes the apiservers every `interval`
    /// (each probe allowed as long; see [`super::balance`]) until
    /// `shutdown`, the first round at once. Nothing without.
    pub fn spawn_balancer(
        &self,
        interval: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let site = self.sites[0].clone();
        let Some(balancer) = site.balancer.clone() else {
            return;
        };
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    () = super::discover::probe_round(&site, &balancer, interval) => {}
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
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

    /// Sends one of the proxy's own small requests (as itself:
    /// SelfSubjectReviews, `/version`, a check of a Node or of the
    /// impersonation filter) and reads the whole answer, at most 64 KiB.
    ///
    /// # Errors
    /// The request's failure, or the body's (cut off, or past the limit).
    pub(crate) async fn own_exchange(
        &self,
        req: Request<Body>,
    ) -> Result<(http::StatusCode, bytes::Bytes), String> {
        use http_body_util::{BodyExt, Limited};
        let resp = self
            .send(req, Credentials::Proxy)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), 64 * 1024)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
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
