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
use crate::upstream::Upstream;
use crate::upstream::identity::Identity;

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
    /// Binds `listen`, `adminListen` and `metricsListen` from a validated
    /// config.
    ///
    /// # Errors
    /// [`RunError::Bind`] or [`RunError::Config`].
    pub async fn bind(config: &Config) -> Result<Listeners, RunError> {
        let api_addr = config.listen_addr()?;
        let admin_addr = config.admin_listen_addr()?;
        let api = TcpListener::bind(api_addr)
            .await
            .map_err(|source| RunError::Bind {
                addr: api_addr,
                source,
            })?;
        let admin = TcpListener::bind(admin_addr)
            .await
            .map_err(|source| RunError::Bind {
                addr: admin_addr,
                source,
            })?;
        let metrics = match config.metrics_listen_addr()? {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| RunError::Bind { addr, source })?,
            ),
            None => None,
        };
        Ok(Listeners {
            api,
            admin,
            metrics,
            predecessor: None,
            socket_activated: false,
        })
    }

    /// The names of the listeners `config` asks for, in handover order.
    fn names(config: &Config) -> Vec<&'static str> {
        let mut names = vec!["api", "admin"];
        if config.metrics_listen.is_some() {
            names.push("metrics");
        }
        names
    }

    /// The listeners the binary serves on, in order of preference: taken
    /// over from a running proxy (`takeover.socketPath`: each socket it
    /// hands over that this configuration names at the same address, the
    /// rest bound); passed by systemd socket activation (`LISTEN_FDS`: the
    /// API socket, the admin one, then the metrics one if `metricsListen`
    /// is set); or bound (with takeover configured, retrying for up to a
    /// minute while a predecessor that cannot hand over holds an address).
    ///
    /// # Errors
    /// [`RunError::Bind`], [`RunError::Config`], or [`RunError::Takeover`]
    /// when a running proxy answered but the handover failed.
    pub async fn acquire(config: &Config) -> Result<Listeners, RunError> {
        let names = Listeners::names(config);
        if let Some(path) = &config.takeover.socket_path
            && let Some(mut received) = server::takeover::Predecessor::connect(path)
                .await
                .map_err(RunError::Takeover)?
        {
            tracing::info!(socket = %path.display(), "taking the listeners over from the running proxy");
            let mut take = async |name: &str, addr: SocketAddr| match received.take(name) {
                Some(l) if l.local_addr().ok() == Some(addr) => {
                    TcpListener::from_std(l).map_err(RunError::Takeover)
                }
                _ => bind_retrying(addr, true).await,
            };
            let api = take("api", config.listen_addr()?).await?;
            let admin = take("admin", config.admin_listen_addr()?).await?;
            let metrics = match config.metrics_listen_addr()? {
                Some(addr) => Some(take("metrics", addr).await?),
                None => None,
            };
            return Ok(Listeners {
                api,
                admin,
                metrics,
                predecessor: Some(received.predecessor),
                socket_activated: false,
            });
        }
        let mut fds = listenfd::ListenFd::from_env();
        if fds.len() > 0 {
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
            let mut activated = activated.into_iter();
            let (Some(api), Some(admin)) = (activated.next(), activated.next()) else {
                return Err(RunError::Takeover(std::io::Error::other(
                    "socket activation passed too few sockets",
                )));
            };
            return Ok(Listeners {
                api,
                admin,
                metrics: activated.next(),
                predecessor: None,
                socket_activated: true,
            });
        }
        // With takeover configured, an address in use is a predecessor that
        // cannot hand over (an older version, during a surge rollout): it
        // is about to be stopped.
        let retry = config.takeover.socket_path.is_some();
        let api = bind_retrying(config.listen_addr()?, retry).await?;
        let admin = bind_retrying(config.admin_listen_addr()?, retry).await?;
        let metrics = match config.metrics_listen_addr()? {
            Some(addr) => Some(bind_retrying(addr, retry).await?),
            None => None,
        };
        Ok(Listeners {
            api,
            admin,
            metrics,
            predecessor: None,
            socket_activated: false,
        })
    }
}

/// Binds `addr`; with `retry`, waits up to [`BIND_RETRY`] while it is in
/// use.
async fn bind_retrying(addr: SocketAddr, retry: bool) -> Result<TcpListener, RunError> {
    let deadline = tokio::time::Instant::now() + BIND_RETRY;
    loop {
        match TcpListener::bind(addr).await {
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
/// # Errors
/// [`RunError`] when TLS material, the upstream configuration or metrics
/// cannot be set up. Once serving, it returns after shutdown, or with
/// [`RunError::Config`] for `upstream.identity` when the apiserver refuses
/// to let a node-bound token act as its node
/// ([`upstream::identity::confirm_node_access`]).
pub async fn run(
    listeners: Listeners,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RunError> {
    let metrics = Metrics::new(prometheus::Registry::new())?;
    // Every family is registered before the admin port serves a scrape.
    let cache_metrics = cache::metrics::CacheMetrics::new(metrics.registry())?;
    let auth_metrics = auth::metrics::AuthMetrics::new(metrics.registry())?;
    let readiness = Readiness::default();
    // With tls.csr, the certificate is the one the proxy obtains itself.
    let csr = upstream::csr::CsrManager::new(&config)?;
    let tls = match &csr {
        Some(csr) => ServerTls::with_initial(
            &config.tls,
            csr.current_file().to_path_buf(),
            csr.current_file().to_path_buf(),
            csr.initial(),
        )?,
        None => ServerTls::load(&config.tls)?,
    };
    let kube_config = upstream::load_kube_config(
        config.upstream.kubeconfig.as_deref(),
        config.upstream.context.clone(),
    )
    .await?;
    let identity = Identity::detect(&kube_config, config.upstream.identity, &config.node_name)
        .map_err(upstream::UpstreamError::Config)?;
    let connect_timeout = Duration::from_secs(config.upstream.connect_timeout_seconds);
    let idle_timeout = Duration::from_secs(config.upstream.idle_timeout_seconds);
    let balancing = &config.upstream.client_side_balancing;
    let mut upstream = if balancing.enabled {
        Upstream::balanced(
            &kube_config,
            connect_timeout,
            idle_timeout,
            Duration::from_secs(balancing.max_lag_seconds),
        )?
    } else {
        Upstream::new(&kube_config, connect_timeout, idle_timeout)?
    };
    if let Some(fallback) = &config.upstream.fallback {
        let fallback_config =
            upstream::load_kube_config(Some(&fallback.kubeconfig), fallback.context.clone())
                .await?;
        let same = Identity::detect(
            &fallback_config,
            config.upstream.identity,
            &config.node_name,
        )
        .map_err(upstream::UpstreamError::Config)?;
        if same != identity {
            return Err(RunError::Upstream(upstream::UpstreamError::Config(
                format!(
                    "{}: upstream.fallback gives the proxy another identity ({same:?}) than \
                 upstream.kubeconfig ({identity:?})",
                    fallback.kubeconfig.display()
                ),
            )));
        }
        upstream = upstream.with_fallback(&fallback_config, connect_timeout, idle_timeout)?;
    }
    match identity.node() {
        Some(node) => {
            tracing::info!(upstream = %upstream.base(), %node, "upstream configured; acting as the node")
        }
        None => {
            tracing::info!(upstream = %upstream.base(), "upstream configured; acting with the credential as given")
        }
    }

    let token = CancellationToken::new();
    let admin_token = CancellationToken::new();
    // As a node by constrained impersonation: proven once, or the proxy
    // stops (it would be refused everything, forever).
    let (identity_refused, refused) = tokio::sync::oneshot::channel::<String>();
    let mut identity_refused = Some(identity_refused);
    // Fused: polled in two selects, it must not be polled after it ended.
    let mut refused = futures_util::FutureExt::fuse(refused);
    if let Identity::Node {
        name,
        credential: upstream::identity::NodeCredential::AssociatedServiceAccount,
    } = &identity
    {
        const CHECK: &str = "upstream-identity";
        readiness.register(
            CHECK,
            &format!("not yet confirmed that the apiserver lets the proxy act as node {name:?}"),
        );
        let (upstream, name, readiness, token, identity_refused) = (
            upstream.clone(),
            name.clone(),
            readiness.clone(),
            token.clone(),
            identity_refused.take(),
        );
        tokio::spawn(async move {
            match upstream::identity::confirm_node_access(&upstream, &name, &token).await {
                Ok(()) => readiness.set(CHECK, Ok(())),
                Err(message) => {
                    readiness.set(CHECK, Err(message.clone()));
                    if let Some(refused) = identity_refused {
                        let _ = refused.send(message);
                    }
                }
            }
        });
    }
    // A tier learns how it may act as its nodes, or stops: without either
    // kind of node impersonation every node request would be refused.
    // Not a readiness check: a tier restarted while the apiserver is down
    // serves its caches meanwhile; until the answer, node requests go
    // upstream by constrained impersonation. It learns again when node
    // requests are refused.
    let node_impersonation = Arc::new(upstream::identity::TierImpersonation::default());
    if identity == Identity::Tier {
        let (upstream, token, mode, identity_refused) = (
            upstream.clone(),
            token.clone(),
            node_impersonation.clone(),
            identity_refused.take(),
        );
        tokio::spawn(async move {
            mode.run(&upstream, &token, |message| {
                if let Some(refused) = identity_refused {
                    let _ = refused.send(message);
                }
            })
            .await;
        });
    }
    tls.spawn_reloader(TLS_RELOAD_INTERVAL, token.clone());
    upstream.spawn_reloader(TLS_RELOAD_INTERVAL, token.clone());
    upstream.set_fallback_gauge(metrics.upstream_fallback_active.clone());
    let server_info = Arc::new(upstream::ServerInfo::default());
    {
        let (server_info, upstream, gauge, token) = (
            server_info.clone(),
            upstream.clone(),
            metrics.upstream_info.clone(),
            token.clone(),
        );
        tokio::spawn(async move { server_info.run(upstream, gauge, token).await });
    }
    upstream.spawn_primary_recheck(token.clone());
    if let Some(balancer) = upstream.balancer() {
        balancer.set_metrics(upstream::BalancerMetrics {
            apiservers: metrics.upstream_apiservers.clone(),
            connections: metrics.upstream_apiserver_connections.clone(),
        });
    }
    upstream.spawn_balancer(
        Duration::from_secs(balancing.probe_interval_seconds),
        token.clone(),
    );
    if let Some(balancer) = upstream.balancer() {
        // The caches' lists and watches start on a balanced connection
        // rather than on the configured address's, which would be retired.
        balancer.wait_known(connect_timeout).await;
    }
    let mut admin = Admin {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        tls: Some(tls.clone()),
        caches: None,
        upstream: Some(upstream.clone()),
    };
    if let Some(csr) = csr {
        csr.spawn(&upstream, Arc::new(tls.clone()), &readiness, &token);
    }

    let mut cache_config = config.cache.clone();
    identity
        .scope_caches(&mut cache_config)
        .map_err(|message| component::config::ConfigError::Invalid {
            field: "cache.resources".into(),
            message,
        })?;
    let caches = cache::Caches::new(&cache_config, &config.node_name, &identity, &cache_metrics)?;
    admin.caches = Some(caches.iter().cloned().collect());
    let snapshots = snapshots(&config.cache.persistence, &kube_config);
    caches.spawn_reflectors(
        &upstream,
        &readiness,
        snapshots.as_ref(),
        &config.cache.consistency_check,
        &token,
    );
    let persister = snapshots.map(|s| {
        Arc::new(cache::persist::Persister::new(
            s,
            caches.iter().cloned().collect(),
        ))
    });
    let Listeners {
        api,
        admin: admin_listener,
        metrics: metrics_listener,
        predecessor,
        socket_activated,
    } = listeners;
    // Copies of the listening sockets, for a successor.
    let offer = match &config.takeover.socket_path {
        Some(_) => {
            let mut offer = server::takeover::Offer::default();
            offer.add("api", &api).map_err(RunError::Takeover)?;
            offer
                .add("admin", &admin_listener)
                .map_err(RunError::Takeover)?;
            if let Some(l) = &metrics_listener {
                offer.add("metrics", l).map_err(RunError::Takeover)?;
            }
            Some(offer)
        }
        None => None,
    };
    let metrics_server = match metrics_listener {
        Some(listener) => {
            let metrics_listener = admin::metrics_listener::MetricsListener {
                // Beyond the node: metrics and health only.
                admin: Admin {
                    metrics: metrics.clone(),
                    readiness: readiness.clone(),
                    tls: Some(tls.clone()),
                    caches: None,
                    upstream: None,
                },
                tls: tls.clone(),
                auth: auth::Auth::new(
                    &upstream,
                    &config.authentication,
                    &config.authorization,
                    auth_metrics.clone(),
                ),
            };
            Some((metrics_listener, listener))
        }
        None => None,
    };
    let auth = auth::Auth::new(
        &upstream,
        &config.authentication,
        &config.authorization,
        auth_metrics,
    )
    .with_server_info(server_info);
    let handler = Arc::new(
        Handler::new(
            upstream,
            identity,
            metrics.clone(),
            caches,
            auth,
            token.clone(),
        )
        .with_node_impersonation(node_impersonation),
    );
    let ready_timeout = Duration::from_secs(config.takeover.ready_timeout_seconds);
    let mut shutdown = std::pin::pin!(shutdown);

    // Taking over: serve nothing until ready (the predecessor serves
    // meanwhile), then tell it to drain.
    if let Some(predecessor) = predecessor {
        let ready = tokio::select! {
            _ = &mut shutdown => {
                tracing::info!("stopped before taking over; the running proxy carries on");
                token.cancel();
                return Ok(());
            }
            Ok(message) = &mut refused => {
                token.cancel();
                return Err(RunError::Config(component::config::ConfigError::Invalid {
                    field: "upstream.identity".into(),
                    message,
                }));
            }
            ready = wait_ready(&readiness, ready_timeout) => ready,
        };
        if !ready {
            token.cancel();
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
        if let Err(error) = predecessor.take_over().await {
            token.cancel();
            return Err(RunError::Takeover(error));
        }
        tracing::info!("took over from the running proxy");
    }

    let persister_task = persister.clone().map(|p| {
        let interval = Duration::from_secs(config.cache.persistence.interval_seconds);
        tokio::spawn(p.run(interval, token.clone()))
    });
    let admin_task = tokio::spawn(admin.serve(admin_listener, admin_token.clone()));
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
    if let Ok(addr) = api.local_addr() {
        tracing::info!(%addr, "serving");
    }
    let serving = tokio::spawn(server::serve::serve(
        api,
        tls.clone(),
        handler,
        metrics,
        options,
        token.clone(),
    ));

    // Waiting for a successor, or the signal to stop.
    let handover = RunHandover {
        persister: persister.clone(),
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
        // The next process accepts on systemd's sockets: a connection this
        // one accepted just before the stop gets the same time to send its
        // request as after a handover, not closed idle.
        if socket_activated {
            handed_over.store(true, Ordering::SeqCst);
        }
    }
    // Stops accepting, ends every watch (cached and passed through) at an
    // event boundary, stops the reflectors.
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
        // Exiting would have kubelet restart this process, which would take
        // the sockets back.
        tracing::info!("drained; idle until stopped");
        shutdown.await;
    }
    tracing::info!("stopped");
    match failure {
        Some(message) => Err(RunError::Config(component::config::ConfigError::Invalid {
            field: "upstream.identity".into(),
            message,
        })),
        None => Ok(()),
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
    persister: Option<Arc<cache::persist::Persister>>,
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

/// The snapshot directory, if configured and usable (a directory that
/// cannot be created is logged and the proxy runs without snapshots).
fn snapshots(
    config: &component::config::PersistenceConfig,
    kube_config: &kube::Config,
) -> Option<Arc<cache::persist::Snapshots>> {
    let dir = config.directory.as_ref()?;
    let upstream = cache::persist::upstream_digest(
        &kube_config.cluster_url.to_string(),
        kube_config.root_cert.as_deref().unwrap_or_default(),
    );
    match cache::persist::Snapshots::new(dir, config.max_bytes, upstream) {
        Ok(s) => Some(Arc::new(s)),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot use the snapshot directory; running without snapshots");
            None
        }
    }
}
