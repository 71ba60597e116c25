//! kube-cache-proxy: a caching proxy in front of kube-apiserver.
//!
//! It terminates client TLS, answers list, get and watch from a watch cache
//! fed by one upstream list+watch per resource, and passes everything else
//! through untouched. See `README.md` for the design.
#![forbid(unsafe_code)]

// The proxy's two sides, and what runs the process (docs/architecture.md):
// clients come in through `server`, are authenticated and authorized by
// `auth`, are answered from `cache` or passed to `upstream`, the
// apiserver's side; `component` makes it a Kubernetes component
// (configuration, CLI, logging, metrics, readiness, certificate files);
// `admin` serves operators (health, metrics, the caches' status).
pub mod admin;
pub mod auth;
pub mod cache;
pub mod component;
pub mod server;
pub mod upstream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::admin::Admin;
use crate::component::config::Config;
use crate::component::metrics::Metrics;
use crate::component::ready::Readiness;
use crate::server::handler::Handler;
use crate::server::serve::ServeOptions;
use crate::server::tls::ServerTls;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A listener could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] component::config::ConfigError),
    /// The serving certificate or client CA could not be loaded.
    #[error("TLS: {0}")]
    Tls(#[from] component::certs::TlsError),
    /// The upstream configuration could not be loaded.
    #[error("upstream: {0}")]
    Upstream(#[from] upstream::UpstreamError),
    /// Metrics could not be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// Taking over from a running proxy failed; it carries on.
    #[error("takeover: {0}")]
    Takeover(std::io::Error),
}

/// The listeners, and the running proxy they were taken over from, if
/// any.
#[derive(Debug)]
pub struct Listeners {
    /// Client (HTTPS) traffic.
    pub api: TcpListener,
    /// Admin (plain HTTP, loopback) traffic.
    pub admin: TcpListener,
    /// Metrics (HTTPS, authenticated), when `metricsListen` is set.
    pub metrics: Option<TcpListener>,
    /// Client (HTTPS) traffic from pods, when `podNetwork.listen` is set.
    pub pods: Option<TcpListener>,
    /// The proxy these listeners were received from: it drains once this
    /// one is ready.
    pub predecessor: Option<server::takeover::Predecessor>,
    /// Passed by systemd (`LISTEN_FDS`): the sockets outlive this process,
    /// and the next one accepts on them, so a stop lingers like a handover
    /// for connections accepted just before it.
    pub socket_activated: bool,
}

/// How long a second proxy retries binding an address in use by one that
/// cannot hand it over (and will be stopped: a rolling update).
const BIND_RETRY: Duration = Duration::from_secs(60);

// === impl Listeners ===

impl Listeners {
    /// Binds `listen`, `adminListen`, `metricsListen` and
    /// `podNetwork.listen` from a validated config.
    ///
    /// # Errors
    /// [`RunError::Bind`] or [`RunError::Config`].
    pub async fn bind(config: &Config) -> Result<Listeners, RunError> {
        let mut bound = Vec::new();
        for (name, addr) in Listeners::addresses(config)? {
            let listener = bind_listener(name, addr)
                .await
                .map_err(|source| RunError::Bind { addr, source })?;
            bound.push(listener);
        }
        Listeners::of(config, bound, None, false)
    }

    /// The listeners `config` asks for, by name, in handover (and socket
    /// activation) order: `api`, `admin`, then `metrics` and `pods` when
    /// set.
    fn addresses(config: &Config) -> Result<Vec<(&'static str, SocketAddr)>, RunError> {
        let mut addresses = vec![
            ("api", config.listen_addr()?),
            ("admin", config.admin_listen_addr()?),
        ];
        if let Some(addr) = config.metrics_listen_addr()? {
            addresses.push(("metrics", addr));
        }
        if let Some(addr) = config.pod_listen_addr()? {
            addresses.push(("pods", addr));
        }
        Ok(addresses)
    }

    /// The listeners of [`Listeners::addresses`], given in its order.
    fn of(
        config: &Config,
        listeners: Vec<TcpListener>,
        predecessor: Option<server::takeover::Predecessor>,
        socket_activated: bool,
    ) -> Result<Listeners, RunError> {
        let mut listeners = listeners.into_iter();
        let (Some(api), Some(admin)) = (listeners.next(), listeners.next()) else {
            return Err(RunError::Takeover(std::io::Error::other(
                "too few listening sockets",
            )));
        };
        let metrics = config.metrics_listen_addr()?.and_then(|_| listeners.next());
        let pods = config.pod_listen_addr()?.and_then(|_| listeners.next());
        Ok(Listeners {
            api,
            admin,
            metrics,
            pods,
            predecessor,
            socket_activated,
        })
    }

    /// Copies of the listening sockets, to hand to a successor, when
    /// `takeover.socketPath` is set.
    ///
    /// # Errors
    /// [`RunError::Takeover`] when a socket cannot be copied.
    fn offer(&self, config: &Config) -> Result<Option<server::takeover::Offer>, RunError> {
        if config.takeover.socket_path.is_none() {
            return Ok(None);
        }
        let mut offer = server::takeover::Offer::default();
        let named = [
            ("api", Some(&self.api)),
            ("admin", Some(&self.admin)),
            ("metrics", self.metrics.as_ref()),
            ("pods", self.pods.as_ref()),
        ];
        for (name, listener) in named {
            if let Some(l) = listener {
                offer.add(name, l).map_err(RunError::Takeover)?;
            }
        }
        Ok(Some(offer))
    }

    /// The listeners the binary serves on, in order of preference: taken
    /// over from a running proxy (`takeover.socketPath`: each socket it
    /// hands over that this configuration names at the same address, the
    /// rest bound); passed by systemd socket activation (`LISTEN_FDS`: the
    /// API socket, the admin one, then the metrics one if `metricsListen`
    /// is set and the pods' one if `podNetwork.listen` is); or bound (with
    /// takeover configured, retrying for up to a minute while a
    /// predecessor that cannot hand over holds an address).
    ///
    /// # Errors
    /// [`RunError::Bind`], [`RunError::Config`], or [`RunError::Takeover`]
    /// when a running proxy answered but the handover failed.
    pub async fn acquire(config: &Config) -> Result<Listeners, RunError> {
        let addresses = Listeners::addresses(config)?;
        if let Some(path) = &config.takeover.socket_path
            && let Some(mut received) = server::takeover::Predecessor::connect(path)
                .await
                .map_err(RunError::Takeover)?
        {
            tracing::info!(socket = %path.display(), "taking the listeners over from the running proxy");
            let mut taken = Vec::new();
            for (name, addr) in addresses {
                taken.push(match received.take(name) {
                    Some(l) if l.local_addr().ok() == Some(addr) => {
                        TcpListener::from_std(l).map_err(RunError::Takeover)?
                    }
                    _ => bind_retrying(name, addr, true).await?,
                });
            }
            return Listeners::of(config, taken, Some(received.predecessor), false);
        }
        let mut fds = listenfd::ListenFd::from_env();
        if fds.len() > 0 {
            let names: Vec<&str> = addresses.iter().map(|(name, _)| *name).collect();
            if fds.len() != names.len() {
                return Err(RunError::Takeover(std::io::Error::other(format!(
                    "systemd passed {} sockets (LISTEN_FDS), the configuration needs {} ({})",
                    fds.len(),
                    names.len(),
                    names.join(", ")
                ))));
            }
            let mut activated = Vec::new();
            for i in 0..names.len() {
                let l = match fds.take_tcp_listener(i) {
                    Ok(Some(l)) => l,
                    Ok(None) => {
                        return Err(RunError::Takeover(std::io::Error::other(format!(
                            "socket-activated descriptor {i} is not a TCP listener"
                        ))));
                    }
                    Err(e) => return Err(RunError::Takeover(e)),
                };
                l.set_nonblocking(true).map_err(RunError::Takeover)?;
                activated.push(TcpListener::from_std(l).map_err(RunError::Takeover)?);
            }
            tracing::info!(
                sockets = names.join(", "),
                "serving on the sockets systemd passed (LISTEN_FDS)"
            );
            return Listeners::of(config, activated, None, true);
        }
        // With takeover configured, an address in use is a predecessor that
        // cannot hand over (an older version, during a surge rollout): it
        // is about to be stopped.
        let retry = config.takeover.socket_path.is_some();
        let mut bound = Vec::new();
        for (name, addr) in addresses {
            bound.push(bind_retrying(name, addr, retry).await?);
        }
        Listeners::of(config, bound, None, false)
    }
}

/// Binds the listener `name` at `addr`. The pods' one
/// (`podNetwork.listen`) binds with `IP_FREEBIND`: its node-local address
/// may be configured after the proxy starts (a dummy interface the node's
/// network configuration brings up), and is served from when it is; the
/// `default/kubernetes` Service is rewritten to it only while it is
/// (`server::kubernetes_service`).
async fn bind_listener(name: &str, addr: SocketAddr) -> std::io::Result<TcpListener> {
    if name != "pods" {
        return TcpListener::bind(addr).await;
    }
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    if addr.is_ipv4() {
        rustix::net::sockopt::set_ip_freebind(&socket, true)?;
    } else {
        rustix::net::sockopt::set_ipv6_freebind(&socket, true)?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Binds the listener `name` at `addr`; with `retry`, waits up to
/// [`BIND_RETRY`] while it is in use.
async fn bind_retrying(name: &str, addr: SocketAddr, retry: bool) -> Result<TcpListener, RunError> {
    let deadline = tokio::time::Instant::now() + BIND_RETRY;
    loop {
        match bind_listener(name, addr).await {
            Ok(l) => return Ok(l),
            Err(source)
                if retry
                    && source.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tracing::warn!(%addr, "address in use; waiting for it");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(source) => return Err(RunError::Bind { addr, source }),
        }
    }
}

/// How often certificate files are checked for changes.
const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Runs the proxy on bound listeners until `shutdown` completes, then stops
/// accepting, reports not-ready, and drains open connections within
/// `shutdownGracePeriodSeconds`.
///
/// The stages follow a request's path (docs/architecture.md): the
/// process's metrics and readiness; the server's TLS; the upstream side
/// and the checks of the proxy's identity there; the caches; the admin
/// endpoints; authentication, authorization and the handler; then, after
/// taking over from a predecessor if there is one, serving until stopped
/// or succeeded.
///
/// # Errors
/// [`RunError`] when TLS material, the upstream configuration or metrics
/// cannot be set up. Once serving, it returns after shutdown, or with
/// [`RunError::Config`] for `upstream.identity` when the apiserver refuses
/// to let a node-bound token act as its node
/// ([`upstream::identity::confirm_node_access`]).
pub async fn run(
    mut listeners: Listeners,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RunError> {
    // Every metric family is registered before the admin port serves a
    // scrape.
    let metrics = Metrics::new(prometheus::Registry::new())?;
    let cache_metrics = cache::metrics::CacheMetrics::new(metrics.registry())?;
    let auth_metrics = auth::metrics::AuthMetrics::new(metrics.registry())?;
    let readiness = Readiness::default();
    let token = CancellationToken::new();
    // Whatever run() returns with, the background work stops.
    let _stop = token.clone().drop_guard();

    let (tls, csr) = serving_tls(&config)?;
    if let Some(pods) = config.pod_listen_addr()?
        && csr.is_none()
        && !tls.names_ip(pods.ip())
    {
        // Pods connecting there verify the address (client-go, kube-rs
        // and the Python client all do); the CSR's template names it
        // (checked by `validate`).
        tracing::warn!(
            address = %pods.ip(),
            "the serving certificate does not name podNetwork.listen's address: pods' clients will \
             refuse it (docs/pods.md)"
        );
    }

    let connected = upstream::connect(&config.upstream, &config.node_name).await?;
    let upstream::IdentityChecks {
        refused,
        node_impersonation,
    } = connected.spawn_identity_checks(&readiness, &token);
    tls.spawn_reloader(TLS_RELOAD_INTERVAL, token.clone());
    let server_info = connected
        .start_background(&metrics, TLS_RELOAD_INTERVAL, &token)
        .await;
    let upstream::Connected {
        upstream,
        kube_config,
        identity,
        ..
    } = connected;
    if let Some(csr) = csr {
        csr.spawn(&upstream, Arc::new(tls.clone()), &readiness, &token);
    }

    let (caches, persister) = cache::Caches::start(
        &config,
        &identity,
        &cache_metrics,
        &upstream,
        &kube_config,
        &readiness,
        &token,
    )?;
    let kubernetes_service =
        server::kubernetes_service::KubernetesService::new(&config, &metrics.kubernetes_service);
    if let Some(service) = &kubernetes_service {
        let nodes = caches.get("", "v1", "nodes").cloned();
        tokio::spawn(service.clone().run(nodes, token.clone()));
    }
    let admin = Admin {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        tls: Some(tls.clone()),
        caches: Some(caches.iter().cloned().collect()),
        upstream: Some(upstream.clone()),
        kubernetes_service: kubernetes_service.clone(),
    };

    let auth = |metrics| {
        auth::Auth::new(
            &upstream,
            &config.authentication,
            &config.authorization,
            metrics,
        )
    };
    // Before the metrics listener is taken: a successor gets it too.
    let offer = listeners.offer(&config)?;
    let metrics_server = listeners.metrics.take().map(|listener| {
        let server = admin::metrics_listener::MetricsListener {
            admin: admin.metrics_only(),
            tls: tls.clone(),
            auth: auth(auth_metrics.clone()),
        };
        (server, listener)
    });
    let auth = auth(auth_metrics).with_server_info(server_info);
    let handler = Handler::new(
        upstream,
        identity,
        metrics.clone(),
        caches,
        auth,
        token.clone(),
    )
    .with_node_impersonation(node_impersonation)
    .with_kubernetes_service(kubernetes_service);

    App {
        listeners,
        metrics_server,
        offer,
        admin,
        handler: Arc::new(handler),
        tls,
        metrics,
        persister,
        readiness,
        token,
    }
    .serve(&config, std::pin::pin!(shutdown), refused)
    .await
}

/// The serving certificate: the one the proxy obtains itself through the
/// CSR API with `tls.csr` (and the manager that renews it), or the files.
fn serving_tls(
    config: &Config,
) -> Result<(ServerTls, Option<upstream::csr::CsrManager>), RunError> {
    let csr = upstream::csr::CsrManager::new(config)?;
    let tls = match &csr {
        Some(csr) => ServerTls::with_initial(
            &config.tls,
            csr.current_file().to_path_buf(),
            csr.current_file().to_path_buf(),
            csr.initial(),
        )?,
        None => ServerTls::load(&config.tls)?,
    };
    Ok((tls, csr))
}

/// Taking over from a running proxy: serves nothing until ready (the
/// predecessor serves meanwhile), then tells it to drain. `Ok(false)`
/// when stopped before that.
async fn take_over(
    predecessor: server::takeover::Predecessor,
    readiness: &Readiness,
    ready_timeout: Duration,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
    refused: &mut Refused,
) -> Result<bool, RunError> {
    let ready = tokio::select! {
        _ = shutdown => {
            tracing::info!("stopped before taking over; the running proxy carries on");
            return Ok(false);
        }
        Ok(message) = refused => return Err(identity_refused(message)),
        ready = wait_ready(readiness, ready_timeout) => ready,
    };
    if !ready {
        let not_ready: Vec<String> = readiness
            .report()
            .into_iter()
            .filter_map(|(name, r)| r.err().map(|e| format!("{name}: {e}")))
            .collect();
        return Err(RunError::Takeover(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "not ready within {ready_timeout:?} ({}); the running proxy carries on",
                not_ready.join("; ")
            ),
        )));
    }
    predecessor.take_over().await.map_err(RunError::Takeover)?;
    tracing::info!("took over from the running proxy");
    Ok(true)
}

/// Resolves when the apiserver refuses the proxy's identity
/// ([`upstream::IdentityChecks`]).
type Refused = futures_util::future::Fuse<tokio::sync::oneshot::Receiver<String>>;

/// The proxy stops: the apiserver will not let it act as its node(s).
fn identity_refused(message: String) -> RunError {
    RunError::Config(component::config::ConfigError::Invalid {
        field: "upstream.identity".into(),
        message,
    })
}

/// Everything [`run`] built, ready to serve.
struct App {
    listeners: Listeners,
    metrics_server: Option<(admin::metrics_listener::MetricsListener, TcpListener)>,
    /// Copies of the listening sockets, for a successor.
    offer: Option<server::takeover::Offer>,
    admin: Admin,
    handler: Arc<Handler>,
    tls: ServerTls,
    metrics: Metrics,
    persister: Option<Arc<cache::ingest::persist::Persister>>,
    readiness: Readiness,
    /// Cancelled to stop serving, the reflectors and the background work.
    token: CancellationToken,
}

impl App {
    /// Takes over from a predecessor, when there is one, once the caches
    /// are ready; then serves until `shutdown` completes, a successor takes
    /// over, or the apiserver refuses the proxy's identity (`refused`);
    /// then drains.
    async fn serve(
        self,
        config: &Config,
        mut shutdown: impl Future<Output = ()> + Unpin,
        mut refused: Refused,
    ) -> Result<(), RunError> {
        let App {
            mut listeners,
            metrics_server,
            offer,
            admin,
            handler,
            tls,
            metrics,
            persister,
            readiness,
            token,
        } = self;
        let ready_timeout = Duration::from_secs(config.takeover.ready_timeout_seconds);
        if let Some(predecessor) = listeners.predecessor.take() {
            let taken = take_over(
                predecessor,
                &readiness,
                ready_timeout,
                &mut shutdown,
                &mut refused,
            )
            .await;
            if !matches!(taken, Ok(true)) {
                return taken.map(|_| ());
            }
        }
        let admin_token = CancellationToken::new();
        let persister_task = persister.clone().map(|p| {
            let interval = Duration::from_secs(config.cache.persistence.interval_seconds);
            tokio::spawn(p.run(interval, token.clone()))
        });
        let admin_task = tokio::spawn(admin.serve(listeners.admin, admin_token.clone()));
        if let Some((server, listener)) = metrics_server {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving metrics (HTTPS, authenticated)");
            }
            tokio::spawn(server.serve(listener, admin_token.clone()));
        }
        let handed_over = Arc::new(AtomicBool::new(false));
        let options = ServeOptions {
            limits: server::conns::Limits {
                max_connections: config.max_connections,
                max_connections_per_client: config.max_connections_per_client,
                max_requests_in_flight_per_client: config.max_requests_in_flight_per_client,
            },
            grace_period: Duration::from_secs(config.shutdown_grace_period_seconds),
            handed_over: handed_over.clone(),
        };
        if let Ok(addr) = listeners.api.local_addr() {
            tracing::info!(%addr, "serving");
        }
        let mut clients = vec![listeners.api];
        if let Some(pods) = listeners.pods {
            if let Ok(addr) = pods.local_addr() {
                tracing::info!(%addr, "serving pods (podNetwork.listen)");
            }
            clients.push(pods);
        }
        let serving = tokio::spawn(server::serve::serve(
            clients,
            tls,
            handler,
            metrics,
            options,
            token.clone(),
        ));

        // Waiting for a successor, or the signal to stop.
        let handover = RunHandover {
            persister,
            in_progress: AtomicBool::new(false),
        };
        let server = match (&config.takeover.socket_path, offer) {
            (Some(path), Some(offer)) => match server::takeover::Server::bind(path) {
                Ok(server) => Some((server, offer)),
                Err(error) => {
                    tracing::warn!(socket = %path.display(), %error, "cannot listen for a successor; takeover is off");
                    None
                }
            },
            _ => None,
        };
        let mut takeover = Box::pin(async {
            match &server {
                Some((server, offer)) => server.serve(offer, &handover, ready_timeout).await,
                None => std::future::pending().await,
            }
        });
        let mut failure = None;
        let (successor, stop_requested) = tokio::select! {
            _ = &mut shutdown => {
                // A successor in the middle of taking over gets to finish.
                let successor = if handover.in_progress.load(Ordering::SeqCst) {
                    tracing::info!("stopping once the successor taking over is ready");
                    tokio::time::timeout(ready_timeout, &mut takeover).await.ok()
                } else {
                    None
                };
                (successor, true)
            }
            Ok(message) = &mut refused => {
                tracing::error!(error = %message, "stopping: the proxy cannot act as its node");
                failure = Some(message);
                (None, true)
            }
            successor = &mut takeover => (Some(successor), false),
        };
        readiness.set_shutting_down();
        if successor.is_some() {
            tracing::info!("a successor took over; draining");
            handed_over.store(true, Ordering::SeqCst);
            admin_token.cancel();
        } else {
            tracing::info!("shutting down");
            // The next process accepts on systemd's sockets: a connection
            // this one accepted just before the stop gets the same time to
            // send its request as after a handover, not closed idle.
            if listeners.socket_activated {
                handed_over.store(true, Ordering::SeqCst);
            }
        }
        // Stops accepting, ends every watch (cached and passed through) at
        // an event boundary, stops the reflectors.
        token.cancel();
        if let Some(successor) = successor {
            successor.confirm().await;
        }
        drop(takeover);
        drop(server);
        let _ = serving.await;
        if let Some(task) = persister_task {
            // The final snapshots, after the last request (none after a
            // handover: the successor writes them now).
            let _ = task.await;
        }
        admin_token.cancel();
        let _ = admin_task.await;
        if !stop_requested {
            // Exiting would have kubelet restart this process, which would
            // take the sockets back.
            tracing::info!("drained; idle until stopped");
            shutdown.await;
        }
        tracing::info!("stopped");
        match failure {
            Some(message) => Err(identity_refused(message)),
            None => Ok(()),
        }
    }
}

/// Waits until every readiness check passes, for at most `timeout`.
async fn wait_ready(readiness: &Readiness, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while !readiness.is_ready() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// What this process does when a successor takes over.
struct RunHandover {
    persister: Option<Arc<cache::ingest::persist::Persister>>,
    in_progress: AtomicBool,
}

impl server::takeover::Handover for RunHandover {
    async fn prepare(&self) {
        self.in_progress.store(true, Ordering::SeqCst);
        if let Some(p) = &self.persister {
            p.save_and_pause().await;
        }
    }

    fn abort(&self) {
        self.in_progress.store(false, Ordering::SeqCst);
        if let Some(p) = &self.persister {
            p.resume();
        }
    }
}
