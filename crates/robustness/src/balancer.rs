//! What node proxies, the tier and the run's own clients reach the
//! apiservers through, as node agents reach a highly available control
//! plane: HAProxy, configured as kubeadm's HA guide configures it
//! (kubernetes/kubeadm `docs/ha-considerations.md`, "haproxy
//! configuration": TCP passthrough, round robin, a TLS health check of
//! `/healthz` every 2 s), where `haproxy` is installed (`.ci/run`
//! installs Debian's); else a round-robin TCP relay without health
//! checks, and the report says so.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use kube_testenv::Process;
use tokio_util::sync::CancellationToken;

use crate::relay::Relay;

/// The balancer in front of the apiservers.
#[derive(Debug)]
pub struct Balancer {
    pub addr: SocketAddr,
    /// `haproxy` or `relay`.
    pub kind: &'static str,
    _haproxy: Option<Process>,
    _relay: Option<Relay>,
}

/// kubeadm's HAProxy configuration (`docs/ha-considerations.md`), with
/// `${APISERVER_DEST_PORT}` and the servers filled in, on loopback.
fn haproxy_config(port: u16, backends: &[SocketAddr]) -> String {
    let servers: String = backends
        .iter()
        .enumerate()
        .map(|(i, a)| format!("    server apiserver-{i} {a} check verify none\n"))
        .collect();
    format!(
        "global
    log stdout format raw local0 warning

defaults
    mode                    http
    log                     global
    option                  httplog
    option                  dontlognull
    option http-server-close
    option forwardfor       except 127.0.0.0/8
    option                  redispatch
    retries                 1
    timeout http-request    10s
    timeout queue           20s
    timeout connect         5s
    timeout client          35s
    timeout server          35s
    timeout http-keep-alive 10s
    timeout check           10s

frontend apiserver
    bind 127.0.0.1:{port}
    mode tcp
    option tcplog
    default_backend apiserverbackend

backend apiserverbackend
    option httpchk
    http-check connect ssl
    http-check send meth GET uri /healthz
    http-check expect status 200
    mode tcp
    balance     roundrobin
{servers}"
    )
}

/// The `haproxy` binary, if installed.
fn haproxy_binary() -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|d| d.join("haproxy"))
        .find(|p| p.is_file())
}

impl Balancer {
    /// Starts HAProxy (or the relay) in front of `backends`.
    ///
    /// # Errors
    /// When HAProxy refuses its configuration or does not listen.
    pub async fn start(
        backends: &[SocketAddr],
        dir: &Path,
        stop: CancellationToken,
    ) -> Result<Balancer> {
        let Some(bin) = haproxy_binary() else {
            let relay = Relay::start(backends.to_vec(), stop).await?;
            return Ok(Balancer {
                addr: relay.addr(),
                kind: "relay",
                _haproxy: None,
                _relay: Some(relay),
            });
        };
        let port = kube_testenv::stable_port().map_err(|e| anyhow!("{e}"))?;
        let config = dir.join("haproxy.cfg");
        std::fs::write(&config, haproxy_config(port, backends))?;
        let check = std::process::Command::new(&bin)
            .arg("-c")
            .arg("-f")
            .arg(&config)
            .output()?;
        if !check.status.success() {
            bail!(
                "haproxy refuses {}: {}",
                config.display(),
                String::from_utf8_lossy(&check.stderr)
            );
        }
        let args = vec![
            "-db".to_string(),
            "-f".to_string(),
            config.display().to_string(),
        ];
        let process = Process::spawn("haproxy", &bin, &args, &dir.join("haproxy.log"))?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if let Some(status) = process.exited() {
                bail!("haproxy exited with {status}: {}", process.log_tail(2048));
            }
            if Instant::now() > deadline {
                bail!("haproxy does not listen on {addr}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Balancer {
            addr,
            kind: "haproxy",
            _haproxy: Some(process),
            _relay: None,
        })
    }

    /// `https://<addr>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}
