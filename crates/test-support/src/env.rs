//! A test environment: the simulated apiserver and the real proxy in front
//! of it, started through `kube_cache_proxy::run` on port 0 over real
//! sockets and TLS.
//!
//! The proxy authenticates upstream as the sim's proxy user (a client
//! certificate), trusts the sim's CA for client certificates (as a real
//! deployment trusts the cluster's client CA), and serves its own
//! certificate from a separate CA.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use apimachinery::pki::Ca;
use kube_apiserver_sim::{Sim, SimConfig};
use kube_cache_proxy::component::config::Config;
use kube_cache_proxy::{Listeners, RunError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::client::{Auth, Client};

/// The sim, the proxy, and the files they share.
pub struct Env {
    pub sim: Sim,
    pub dir: PathBuf,
    pub proxy_url: String,
    pub admin: SocketAddr,
    pub proxy_ca_pem: String,
    pub config: Config,
    running: Running,
}

/// The proxy running in this test process through `kube_cache_proxy::run`
/// on the ports its configuration names (port 0: any free one). Dropping
/// it stops it.
pub struct Running {
    pub url: String,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// The metrics listener, when `metricsListen` is set.
    pub metrics: Option<SocketAddr>,
    /// The pods' listener, when `podNetwork.listen` is set.
    pub pods: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), RunError>>>,
}

impl Running {
    /// Validates `config`, binds its listeners and runs the proxy.
    pub async fn start(config: &Config) -> Running {
        config.validate().unwrap();
        let listeners = Listeners::bind(config).await.unwrap();
        Running::run(listeners, config)
    }

    /// A second proxy with `config` (`takeover.socketPath` set, the same
    /// addresses), taking the listening sockets over from the running one
    /// (`Listeners::acquire`), which drains once this one is ready.
    pub async fn take_over(config: &Config) -> Running {
        config.validate().unwrap();
        let listeners = Listeners::acquire(config).await.unwrap();
        assert!(
            listeners.predecessor.is_some(),
            "no proxy to take over from"
        );
        Running::run(listeners, config)
    }

    fn run(listeners: Listeners, config: &Config) -> Running {
        let addr = listeners.api.local_addr().unwrap();
        let admin = listeners.admin.local_addr().unwrap();
        let metrics = listeners.metrics.as_ref().map(|l| l.local_addr().unwrap());
        let pods = listeners.pods.as_ref().map(|l| l.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(kube_cache_proxy::run(
            listeners,
            config.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Running {
            url: format!("https://{addr}"),
            addr,
            admin,
            metrics,
            pods,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the proxy (as on SIGTERM) and waits for `run` to return.
    pub async fn stop(&mut self) -> Result<(), RunError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("proxy did not stop in time")
                .unwrap(),
            None => Ok(()),
        }
    }

    /// A plain-HTTP GET on the admin port: (status, body).
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        admin_get(self.admin, path).await.unwrap()
    }

    /// Waits until `/readyz` answers 200.
    pub async fn ready(&self) {
        self.ready_within(Duration::from_secs(10)).await;
    }

    /// Waits until `/readyz` answers 200, at most `timeout`.
    pub async fn ready_within(&self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (status, body) = self.admin_get("/readyz?verbose").await;
            if status == 200 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "proxy not ready: {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A free port on the loopback (bound once and released: a test that
/// needs the same address twice, for a restart or a takeover).
/// A plain-HTTP GET of `path` on a proxy's admin port at `addr`:
/// (status, body, de-chunked); an error when it does not answer.
pub async fn admin_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {out:?}")))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, dechunk(&body)))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fresh temporary directory.
pub fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("kcp-test-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The proxy's default test configuration, writing its files in `dir`.
pub fn proxy_config(sim: &Sim, dir: &std::path::Path, proxy_ca: &Ca) -> Config {
    // 127.0.0.2: where tests put the pods' listener (`podNetwork.listen`).
    let serving = proxy_ca
        .issue_server(
            &["localhost"],
            &["127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap()],
        )
        .unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let mut config = Config {
        listen: "127.0.0.1:0".into(),
        admin_listen: "127.0.0.1:0".into(),
        shutdown_grace_period_seconds: 2,
        ..Config::default()
    };
    config.tls.cert_file = Some(write("tls.crt", &serving.cert_pem));
    config.tls.private_key_file = Some(write("tls.key", &serving.key_pem));
    config.tls.client_ca_file = Some(write("client-ca.crt", &sim.ca_pem()));
    config.upstream.kubeconfig = Some(write(
        "upstream.kubeconfig",
        &sim.kubeconfig(&SimConfig::default().proxy_user, None),
    ));
    // Fast-moving caches for tests.
    config.cache.bookmark_interval_seconds = 1;
    config.cache.ready_wait_milliseconds = 5000;
    config
}

impl Env {
    /// The sim with `sim_config` and the proxy with the test configuration
    /// adjusted by `customize`.
    pub async fn start_with(sim_config: SimConfig, customize: impl FnOnce(&mut Config)) -> Env {
        let sim = Sim::start(sim_config).await.unwrap();
        Env::start_on(sim, customize).await
    }

    /// The proxy in front of an already started `sim`, with the test
    /// configuration adjusted by `customize`.
    pub async fn start_on(sim: Sim, customize: impl FnOnce(&mut Config)) -> Env {
        let dir = tempdir();
        let proxy_ca = Ca::new("kube-cache-proxy-test-ca").unwrap();
        let mut config = proxy_config(&sim, &dir, &proxy_ca);
        customize(&mut config);
        let running = Running::start(&config).await;
        Env {
            sim,
            dir,
            proxy_url: running.url.clone(),
            admin: running.admin,
            proxy_ca_pem: proxy_ca.cert_pem(),
            config,
            running,
        }
    }

    /// The default sim and proxy.
    pub async fn start() -> Env {
        Env::start_with(SimConfig::default(), |_| {}).await
    }

    /// A client certificate issued by the cluster CA.
    pub fn cert(&self, user: &str, group: Option<&str>) -> Auth {
        Auth::Cert(self.sim.issue_client(user, group))
    }

    /// `CN=admin, O=system:masters`.
    pub fn admin(&self) -> Auth {
        self.cert("admin", Some("system:masters"))
    }

    /// A client of the proxy (HTTP/1.1).
    pub fn proxy(&self, auth: Auth) -> Client {
        Client::new(&self.proxy_url, &self.proxy_ca_pem, auth, false)
    }

    /// A client of the proxy (HTTP/2).
    pub fn proxy_h2(&self, auth: Auth) -> Client {
        Client::new(&self.proxy_url, &self.proxy_ca_pem, auth, true)
    }

    /// A client of the proxy's pods' listener (`podNetwork.listen`), as a
    /// pod reaches it (HTTP/2).
    pub fn pods(&self, auth: Auth) -> Client {
        let addr = self.running.pods.expect("podNetwork.listen is not set");
        Client::new(&format!("https://{addr}"), &self.proxy_ca_pem, auth, true)
    }

    /// A client of the sim directly.
    pub fn direct(&self, auth: Auth) -> Client {
        Client::new(&self.sim.url(), &self.sim.ca_pem(), auth, false)
    }

    /// A plain-HTTP GET on the admin port: (status, body).
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        self.running.admin_get(path).await
    }

    /// Waits until `/readyz` answers 200.
    pub async fn ready(&self) {
        self.running.ready().await;
    }

    /// Stops the proxy (as on SIGTERM) and waits for `run` to return.
    pub async fn stop_proxy(&mut self) -> Result<(), RunError> {
        self.running.stop().await
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Decodes a chunked HTTP/1.1 body, or returns it unchanged.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((size, after)) = rest.split_once("\r\n") else {
            return body.to_string();
        };
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            return body.to_string();
        };
        if n == 0 {
            return out;
        }
        if after.len() < n {
            return body.to_string();
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
}
