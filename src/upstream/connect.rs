//! The upstream stage of [`crate::run`]: the apiserver's side built from
//! `upstream` (kubeconfig, identity, client-side balancing, fallback),
//! and the checks of its identity there.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::Fuse;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::balance::BalancerMetrics;
use super::error::UpstreamError;
use super::failover::Upstream;
use super::identity::{Identity, NodeCredential, TierImpersonation, confirm_node_access};
use super::kubeconfig::load_kube_config;
use super::server::ServerInfo;
use crate::component::config::UpstreamConfig;
use crate::component::metrics::Metrics;
use crate::component::ready::Readiness;

/// The connection to the apiserver, and who the proxy is there.
pub struct Connected {
    pub upstream: Upstream,
    /// The kubeconfig it was built from (the snapshots are keyed by its
    /// cluster).
    pub kube_config: kube::Config,
    pub identity: Identity,
    /// `upstream.connectTimeoutSeconds`.
    connect_timeout: Duration,
    /// `upstream.clientSideBalancing.probeIntervalSeconds`.
    balancer_probe_interval: Duration,
}

/// Loads the kubeconfig, works out the proxy's identity (`node_name` is
/// the node's, for a node proxy) and builds the client: balanced across
/// the apiservers with `clientSideBalancing`, with the fallback
/// kubeconfig behind it if one is set.
///
/// # Errors
/// [`UpstreamError::Config`] for a kubeconfig that cannot be loaded or
/// used, an identity that cannot be worked out, or a fallback that would
/// give the proxy another identity.
pub async fn connect(config: &UpstreamConfig, node_name: &str) -> Result<Connected, UpstreamError> {
    let kube_config =
        load_kube_config(config.kubeconfig.as_deref(), config.context.clone()).await?;
    let identity = Identity::detect(&kube_config, config.identity, node_name)
        .map_err(UpstreamError::Config)?;
    let connect_timeout = Duration::from_secs(config.connect_timeout_seconds);
    let idle_timeout = Duration::from_secs(config.idle_timeout_seconds);
    let balancing = &config.client_side_balancing;
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
    if let Some(fallback) = &config.fallback {
        let fallback_config =
            load_kube_config(Some(&fallback.kubeconfig), fallback.context.clone()).await?;
        let same = Identity::detect(&fallback_config, config.identity, node_name)
            .map_err(UpstreamError::Config)?;
        if same != identity {
            return Err(UpstreamError::Config(format!(
                "{}: upstream.fallback gives the proxy another identity ({same:?}) than \
                 upstream.kubeconfig ({identity:?})",
                fallback.kubeconfig.display()
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
    Ok(Connected {
        upstream,
        kube_config,
        identity,
        connect_timeout,
        balancer_probe_interval: Duration::from_secs(balancing.probe_interval_seconds),
    })
}

/// What the identity checks report while the proxy runs.
pub struct IdentityChecks {
    /// Resolves with the operator's message when the apiserver will not
    /// let the proxy act as its node(s): the proxy stops. Fused, as it is
    /// polled in more than one `select!`.
    pub refused: Fuse<oneshot::Receiver<String>>,
    /// How a tier may act as its nodes (learnt in the background).
    pub node_impersonation: Arc<TierImpersonation>,
}

impl Connected {
    /// Starts the upstream side's background work, reporting to `metrics`:
    /// re-reading rotated client certificates and CA files every
    /// `reload_interval`, learning the apiserver's version, returning to the
    /// primary from the fallback, and (with `clientSideBalancing`) probing
    /// the apiservers, waiting until they are known so that the caches'
    /// lists and watches start on a balanced connection rather than on the
    /// configured address's, which would be retired. Returns what is
    /// learnt of the apiserver.
    pub async fn start_background(
        &self,
        metrics: &Metrics,
        reload_interval: Duration,
        token: &CancellationToken,
    ) -> Arc<ServerInfo> {
        let upstream = &self.upstream;
        upstream.spawn_reloader(reload_interval, token.clone());
        upstream.set_fallback_gauge(metrics.upstream_fallback_active.clone());
        let server_info = Arc::new(ServerInfo::default());
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
            balancer.set_metrics(BalancerMetrics {
                apiservers: metrics.upstream_apiservers.clone(),
                connections: metrics.upstream_apiserver_connections.clone(),
            });
        }
        upstream.spawn_balancer(self.balancer_probe_interval, token.clone());
        if let Some(balancer) = upstream.balancer() {
            balancer.wait_known(self.connect_timeout).await;
        }
        server_info
    }

    /// Starts the checks of the proxy's identity upstream. A node proxy
    /// acting as its node by constrained impersonation proves once that it
    /// may (a readiness check until then), or stops: it would be refused
    /// everything, forever. A tier learns how it may act as its nodes, or
    /// stops: without either kind of node impersonation every node
    /// request would be refused. Not a readiness check: a tier restarted
    /// while the apiserver is down serves its caches meanwhile; until the
    /// answer, node requests go upstream by constrained impersonation. It
    /// learns again when node requests are refused.
    pub fn spawn_identity_checks(
        &self,
        readiness: &Readiness,
        token: &CancellationToken,
    ) -> IdentityChecks {
        let (refused_tx, refused) = oneshot::channel::<String>();
        let mut refused_tx = Some(refused_tx);
        if let Identity::Node {
            name,
            credential: NodeCredential::AssociatedServiceAccount,
        } = &self.identity
        {
            const CHECK: &str = "upstream-identity";
            readiness.register(
                CHECK,
                &format!(
                    "not yet confirmed that the apiserver lets the proxy act as node {name:?}"
                ),
            );
            let (upstream, name, readiness, token, refused_tx) = (
                self.upstream.clone(),
                name.clone(),
                readiness.clone(),
                token.clone(),
                refused_tx.take(),
            );
            tokio::spawn(async move {
                match confirm_node_access(&upstream, &name, &token).await {
                    Ok(()) => readiness.set(CHECK, Ok(())),
                    Err(message) => {
                        readiness.set(CHECK, Err(message.clone()));
                        if let Some(refused) = refused_tx {
                            let _ = refused.send(message);
                        }
                    }
                }
            });
        }
        let node_impersonation = Arc::new(TierImpersonation::default());
        if self.identity == Identity::Tier {
            let (upstream, token, mode, refused_tx) = (
                self.upstream.clone(),
                token.clone(),
                node_impersonation.clone(),
                refused_tx.take(),
            );
            tokio::spawn(async move {
                mode.run(&upstream, &token, |message| {
                    if let Some(refused) = refused_tx {
                        let _ = refused.send(message);
                    }
                })
                .await;
            });
        }
        IdentityChecks {
            refused: refused.fuse(),
            node_impersonation,
        }
    }
}
