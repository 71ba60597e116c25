//! kube-cache-proxy: a caching proxy in front of kube-apiserver.
//!
//! It terminates client TLS, answers list, get and watch from a watch cache
//! fed by one upstream list+watch per resource, and passes everything else
//! through untouched. See `README.md` for the design.
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod cache;
pub mod cli;
pub mod config;
pub mod csr;
// Only with the `demo` feature, which brings in the simulated apiserver;
// the production image is built without it.
#[cfg(feature = "demo")]
pub mod demo;
pub mod handler;
pub mod identity;
pub mod logging;
pub mod metrics;
pub mod proxy;
pub mod ready;
pub mod serve;
pub mod tls;
pub mod upstream;

// The API machinery the proxy shares with the simulated apiserver lives in
// the `apimachinery` crate (so the simulator need not depend on the proxy);
// re-exported under the paths the proxy has always used.
pub use apimachinery::{body, go, kubeconfig, pki, request, resource, selector, status};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::admin::Admin;
use crate::config::Config;
use crate::handler::Handler;
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::ready::Readiness;
use crate::serve::ServeOptions;
use crate::tls::ServerTls;
use crate::upstream::Upstream;

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
    Config(#[from] config::ConfigError),
    /// The serving certificate or client CA could not be loaded.
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    /// The upstream configuration could not be loaded.
    #[error("upstream: {0}")]
    Upstream(#[from] upstream::UpstreamError),
    /// Metrics could not be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// The two bound listeners.
#[derive(Debug)]
pub struct Listeners {
    /// Client (HTTPS) traffic.
    pub api: TcpListener,
    /// Admin (plain HTTP) traffic.
    pub admin: TcpListener,
}

// === impl Listeners ===

impl Listeners {
    /// Binds `listen` and `adminListen` from a validated config.
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
        Ok(Listeners { api, admin })
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
/// cannot be set up. Once serving, it only returns after shutdown.
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
    let csr = csr::CsrManager::new(&config)?;
    let tls = match &csr {
        Some(csr) => csr.server_tls(&config.tls)?,
        None => ServerTls::load(&config.tls)?,
    };
    let kube_config = upstream::load_kube_config(
        config.upstream.kubeconfig.as_deref(),
        config.upstream.context.clone(),
    )
    .await?;
    let identity = Identity::detect(&kube_config, config.upstream.identity, &config.node_name)
        .map_err(upstream::UpstreamError::Config)?;
    let upstream = Upstream::new(
        &kube_config,
        Duration::from_secs(config.upstream.connect_timeout_seconds),
        Duration::from_secs(config.upstream.idle_timeout_seconds),
    )?;
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
    tls.spawn_reloader(TLS_RELOAD_INTERVAL, token.clone());
    upstream.spawn_reloader(TLS_RELOAD_INTERVAL, token.clone());
    let admin = Admin {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        tls: Some(tls.clone()),
    };
    let admin_task = tokio::spawn(admin.serve(listeners.admin, admin_token.clone()));
    if let Some(csr) = csr {
        csr.spawn(&upstream, &tls, &readiness, &token);
    }

    let mut cache_config = config.cache.clone();
    identity
        .scope_caches(&mut cache_config)
        .map_err(|message| config::ConfigError::Invalid {
            field: "cache.resources".into(),
            message,
        })?;
    let caches = cache::Caches::new(&cache_config, &config.node_name, &identity, &cache_metrics)?;
    caches.spawn_reflectors(&upstream, &readiness, &token);
    let auth = auth::Auth::new(
        &upstream,
        &config.authentication,
        &config.authorization,
        auth_metrics,
    );
    let handler = Arc::new(Handler::new(
        upstream,
        identity,
        metrics.clone(),
        caches,
        auth,
        token.clone(),
    ));
    let options = ServeOptions {
        max_connections: config.max_connections,
        grace_period: Duration::from_secs(config.shutdown_grace_period_seconds),
    };
    if let Ok(addr) = listeners.api.local_addr() {
        tracing::info!(%addr, "serving");
    }
    let serving = serve::serve(
        listeners.api,
        tls.clone(),
        handler,
        metrics,
        options,
        token.clone(),
    );
    tokio::pin!(serving);
    tokio::select! {
        _ = shutdown => {
            tracing::info!("shutting down");
            readiness.set_shutting_down();
            token.cancel();
            serving.await;
        }
        _ = &mut serving => {}
    }
    admin_token.cancel();
    let _ = admin_task.await;
    tracing::info!("stopped");
    Ok(())
}
