//! Real node proxies: kube-cache-proxy processes running the shipped
//! `manifests/node/config.yaml` as their node, one per node, its agents
//! connecting to its loopback listener (as host-network agents do); and
//! what they spend and do.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use apimachinery::pki::{Ca, Issued};
use kube_cache_proxy::component::config::{Config, FallbackConfig, IdentityMode};

use super::kinds::NODE_CONFIG;
use crate::metrics::Sample;
use crate::stats;
use crate::tier::replicas::TierReplica;

/// Where a node proxy's upstream is: its server and that server's CA.
#[derive(Debug, Clone)]
pub struct Server {
    pub url: String,
    pub ca_pem: String,
}

/// Node `name`'s proxy's configuration: the shipped one with what only
/// exists on a node replaced (its name, addresses, files), `upstream`
/// reached with the node's certificate `cert`, and `fallback` (the
/// apiserver, behind a tier) with the same.
pub fn node_config(
    dir: &Path,
    name: &str,
    cert: &Issued,
    serving: &Issued,
    client_ca_pem: &str,
    upstream: &Server,
    fallback: Option<&Server>,
) -> Result<Config> {
    let mut c = Config::from_yaml(NODE_CONFIG).map_err(|e| anyhow!("{e}"))?;
    if c.upstream.identity != IdentityMode::Node {
        bail!("manifests/node/config.yaml is not a node proxy's configuration");
    }
    let write = |file: &str, text: &str| -> Result<PathBuf> {
        let p = dir.join(file);
        std::fs::write(&p, text)?;
        Ok(p)
    };
    let kubeconfig = |s: &Server| {
        apimachinery::kubeconfig::with_certificate(
            &s.url,
            &s.ca_pem,
            &format!("system:node:{name}"),
            &cert.cert_pem,
            &cert.key_pem,
        )
    };
    c.node_name = name.to_string();
    c.metrics_listen = None;
    c.tls.cert_file = Some(write("tls.crt", &serving.cert_pem)?);
    c.tls.private_key_file = Some(write("tls.key", &serving.key_pem)?);
    c.tls.client_ca_file = Some(write("client-ca.crt", client_ca_pem)?);
    c.upstream.kubeconfig = Some(write("upstream.kubeconfig", &kubeconfig(upstream))?);
    if let Some(f) = fallback {
        c.upstream.fallback = Some(FallbackConfig {
            kubeconfig: write("fallback.kubeconfig", &kubeconfig(f))?,
            context: None,
        });
    }
    c.cache.persistence.directory = None;
    c.takeover.socket_path = None;
    c.shutdown_grace_period_seconds = 1;
    Ok(c)
}

/// One real node proxy to start: its directory and configuration.
pub struct Planned {
    pub name: String,
    pub dir: PathBuf,
    pub config: Config,
}

/// Starts every planned node proxy at once, then waits for each to be
/// ready. Their ports are picked free a moment before they bind them:
/// with a hundred processes starting, another may take one first and the
/// proxy exits; it is started again on others, up to three times.
pub async fn start_all(bin: &Path, ca: &Ca, planned: &mut [Planned]) -> Result<Vec<TierReplica>> {
    let spawn = |p: &mut Planned| -> Result<TierReplica> {
        p.config.listen = format!("127.0.0.1:{}", kube_testenv::free_port()?);
        p.config.admin_listen = format!("127.0.0.1:{}", kube_testenv::free_port()?);
        p.config.validate()?;
        TierReplica::spawn(
            bin,
            &p.dir,
            &format!("node proxy {}", p.name),
            &p.config,
            ca,
        )
    };
    let mut running = Vec::with_capacity(planned.len());
    for p in planned.iter_mut() {
        running.push(spawn(p)?);
    }
    for (p, slot) in planned.iter_mut().zip(running.iter_mut()) {
        let mut attempt = 1;
        while let Err(e) = slot.ready(Duration::from_secs(300)).await {
            if attempt == 3 {
                return Err(e);
            }
            println!("node proxy {}: {e}; starting again", p.name);
            attempt += 1;
            *slot = spawn(p)?;
        }
    }
    Ok(running)
}

/// The node proxies' CPU time so far, each.
pub fn cpu(proxies: &[TierReplica]) -> Vec<Duration> {
    proxies
        .iter()
        .map(|p| stats::cpu_of(p.pid()).unwrap_or_default())
        .collect()
}

/// Every node proxy's `/metrics`, concatenated.
pub async fn metrics(proxies: &[TierReplica]) -> Vec<Sample> {
    let mut out = Vec::new();
    for p in proxies {
        if let Ok(m) = p.metrics().await {
            out.extend(m);
        }
    }
    out
}

/// Mean and largest of `values`.
pub fn mean_max(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    (
        values.iter().sum::<f64>() / values.len() as f64,
        values.iter().copied().fold(0.0, f64::max),
    )
}
