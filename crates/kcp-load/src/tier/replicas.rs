//! The tier: kube-cache-proxy replicas, child processes running the shipped
//! `manifests/tier/config.yaml` with a ServiceAccount token; their
//! readiness, CPU and RSS.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use apimachinery::pki::Ca;
use bytes::Bytes;
use http::{Method, StatusCode};
use kube_cache_proxy::component::config::{Config, IdentityMode};
use kube_testenv::ControlPlane;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{Proto, Target};
use crate::stats;

/// The tier's shipped configuration.
const TIER_CONFIG: &str = include_str!("../../../../manifests/tier/config.yaml");

/// A ServiceAccount token for `kube-cache-proxy-tier`.
pub async fn tier_token(admin: &Target) -> Result<String> {
    service_account_token(admin, "kube-cache-proxy-tier").await
}

/// A token (two hours) of ServiceAccount kube-system/`name`, from the
/// TokenRequest API.
pub async fn service_account_token(admin: &Target, name: &str) -> Result<String> {
    let mut conn = admin.connect(Proto::H1).await?;
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                      "spec": {"expirationSeconds": 7200}});
    let r = admin
        .fetch(
            &mut conn,
            Method::POST,
            &format!("/api/v1/namespaces/kube-system/serviceaccounts/{name}/token"),
            Some(Bytes::from(serde_json::to_vec(&body)?)),
        )
        .await?;
    if r.status != StatusCode::CREATED {
        bail!("TokenRequest for {name}: {}", r.status);
    }
    let v: Value = serde_json::from_slice(&r.body)?;
    v["status"]["token"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("TokenRequest: no token"))
}

/// The tier's configuration: the shipped `manifests/tier/config.yaml`
/// with what only exists in a pod (addresses, files) replaced.
pub fn tier_config(
    listen: &str,
    admin_listen: &str,
    tls: (&Path, &Path, &Path),
    upstream: &Path,
) -> Result<Config> {
    let mut c = Config::from_yaml(TIER_CONFIG).map_err(|e| anyhow!("{e}"))?;
    if c.upstream.identity != IdentityMode::Tier {
        bail!("manifests/tier/config.yaml is not a tier's configuration");
    }
    c.listen = listen.into();
    c.admin_listen = admin_listen.into();
    c.metrics_listen = None;
    c.tls.cert_file = Some(tls.0.to_path_buf());
    c.tls.private_key_file = Some(tls.1.to_path_buf());
    c.tls.client_ca_file = Some(tls.2.to_path_buf());
    c.upstream.kubeconfig = Some(upstream.to_path_buf());
    c.cache.persistence.directory = None;
    c.takeover.socket_path = None;
    c.shutdown_grace_period_seconds = 1;
    c.validate()?;
    Ok(c)
}

/// One tier replica (or node proxy), a child process.
pub struct TierReplica {
    child: Child,
    pub url: String,
    pub ca_pem: String,
    admin: std::net::SocketAddr,
}

impl TierReplica {
    /// Starts replica `i` with the shipped configuration, its
    /// `cache.watchBatchMilliseconds` replaced by `watch_batch_ms` if set.
    pub fn start(
        bin: &Path,
        dir: &Path,
        i: usize,
        cp: &ControlPlane,
        ca: &Ca,
        token: &str,
        watch_batch_ms: Option<u64>,
    ) -> Result<TierReplica> {
        TierReplica::start_with(bin, dir, i, cp, ca, token, |c| {
            if let Some(ms) = watch_batch_ms {
                c.cache.watch_batch_milliseconds = ms;
            }
        })
    }

    /// As [`TierReplica::start`], the configuration changed by `adjust`.
    pub fn start_with(
        bin: &Path,
        dir: &Path,
        i: usize,
        cp: &ControlPlane,
        ca: &Ca,
        token: &str,
        adjust: impl FnOnce(&mut Config),
    ) -> Result<TierReplica> {
        let dir = dir.join(format!("tier-{i}"));
        std::fs::create_dir_all(&dir)?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
            Ok(p)
        };
        let serving = ca.issue_server(&["localhost"], &[std::net::Ipv4Addr::LOCALHOST.into()])?;
        let cert = write("tls.crt", &serving.cert_pem)?;
        let key = write("tls.key", &serving.key_pem)?;
        let client_ca = write("client-ca.crt", &cp.ca_pem())?;
        let upstream = write(
            "upstream.kubeconfig",
            &apimachinery::kubeconfig::with_token(&cp.url(), &cp.ca_pem(), token),
        )?;
        let port = kube_testenv::free_port().map_err(|e| anyhow!("{e}"))?;
        let admin_port = kube_testenv::free_port().map_err(|e| anyhow!("{e}"))?;
        let mut config = tier_config(
            &format!("127.0.0.1:{port}"),
            &format!("127.0.0.1:{admin_port}"),
            (&cert, &key, &client_ca),
            &upstream,
        )?;
        adjust(&mut config);
        config.validate()?;
        TierReplica::spawn(bin, &dir, &format!("tier replica {i}"), &config, ca)
    }

    /// Runs `bin` with `config` (written to `dir`, its log there too), a
    /// kube-cache-proxy serving with a certificate of `ca`.
    pub fn spawn(
        bin: &Path,
        dir: &Path,
        what: &str,
        config: &Config,
        ca: &Ca,
    ) -> Result<TierReplica> {
        let path = dir.join("config.yaml");
        std::fs::write(
            &path,
            serde_saphyr::to_string(config).map_err(|e| anyhow!("{e}"))?,
        )?;
        let addr = |a: &str| -> Result<std::net::SocketAddr> {
            a.parse().with_context(|| format!("{what}: address {a}"))
        };
        let (listen, admin) = (addr(&config.listen)?, addr(&config.admin_listen)?);
        let log = std::fs::File::create(dir.join("proxy.log"))?;
        let mut command = Command::new(bin);
        command
            .args(["--config".as_ref(), path.as_os_str()])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Killed with this tool, however it ends (Ctrl-C included).
        let child = kube_testenv::process::spawn_tied(command)
            .with_context(|| format!("starting {}", bin.display()))?;
        println!(
            "{what}: pid {}, https://{listen}, log {}",
            child.id(),
            dir.join("proxy.log").display()
        );
        Ok(TierReplica {
            child,
            url: format!("https://{listen}"),
            ca_pem: ca.cert_pem(),
            admin,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn admin_get(&self, path: &str) -> Result<String> {
        self.admin_exchange(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
    }

    /// Its `/metrics` (asked in HTTP/1.0, so the body is not chunked).
    pub async fn metrics(&self) -> Result<Vec<crate::metrics::Sample>> {
        let out = self
            .admin_exchange(b"GET /metrics HTTP/1.0\r\n\r\n")
            .await?;
        let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Ok(crate::metrics::parse(body))
    }

    /// Writes `request` to its admin listener and reads the answer until
    /// the connection closes.
    async fn admin_exchange(&self, request: &[u8]) -> Result<String> {
        let mut s = tokio::net::TcpStream::connect(self.admin).await?;
        s.write_all(request).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    pub async fn ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            // Exited (a zombie until reaped): a port picked free was taken
            // before it bound it, say; another process may answer there.
            let pid = self.child.id();
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if state
                .rsplit_once(") ")
                .is_none_or(|(_, rest)| rest.starts_with('Z'))
            {
                bail!("the proxy (pid {pid}) exited before it was ready");
            }
            let last = match self.admin_get("/readyz?verbose").await {
                Ok(r) if r.starts_with("HTTP/1.1 200") => return Ok(()),
                Ok(r) => r,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                bail!("a tier replica is not ready after {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TierReplica {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Each replica's CPU time so far and RSS (`/proc`).
pub fn tier_samples(replicas: &[TierReplica]) -> Vec<(Duration, u64)> {
    replicas
        .iter()
        .map(|r| {
            let pid = r.child.id();
            (
                stats::cpu_of(pid).unwrap_or_default(),
                stats::rss_of(pid).unwrap_or_default(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::temp_dir;
    use crate::tier::nodes::NODE_RESOURCES;

    #[test]
    fn the_tier_runs_the_shipped_configuration() {
        let dir = temp_dir().unwrap();
        let ca = Ca::new("test-ca").unwrap();
        let serving = ca.issue_server(&["localhost"], &[]).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let (cert, key) = (
            write("tls.crt", &serving.cert_pem),
            write("tls.key", &serving.key_pem),
        );
        let client_ca = write("ca.crt", &ca.cert_pem());
        let upstream = write(
            "upstream.kubeconfig",
            &apimachinery::kubeconfig::with_token("https://127.0.0.1:1", &ca.cert_pem(), "t"),
        );
        let c = tier_config(
            "127.0.0.1:1",
            "127.0.0.1:2",
            (&cert, &key, &client_ca),
            &upstream,
        )
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(c.upstream.identity, IdentityMode::Tier);
        let resources: Vec<&str> = c
            .cache
            .resources
            .iter()
            .map(|r| r.resource.as_str())
            .collect();
        for (path, _) in NODE_RESOURCES {
            let r = path.rsplit('/').next().unwrap();
            assert!(resources.contains(&r), "{r} not cached by the tier");
        }
        assert!(resources.contains(&"configmaps") && resources.contains(&"secrets"));
        // What the replica reads back is what was written.
        let text = serde_saphyr::to_string(&c).unwrap();
        assert_eq!(Config::from_yaml(&text).unwrap(), c);
    }
}
