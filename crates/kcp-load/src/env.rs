//! `--sim`: the simulated kube-apiserver, started in this process on
//! 127.0.0.1, with the proxy in front of it ([`RunningProxy`], also used by
//! `--real`), either in this process (`kube_cache_proxy::run`, as the
//! integration tests do) or as a separate process of the built
//! `kube-cache-proxy` binary (`--proxy-bin`), so its memory and CPU can be
//! measured on their own.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use apimachinery::pki::Ca;
use apimachinery::resource::Gvr;
use kube_apiserver_sim::{Sim, SimConfig};
use kube_cache_proxy::Listeners;
use kube_cache_proxy::component::config::{CachedResource, Config, UpstreamEncoding};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::fixtures;

/// What to start.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Start the simulated apiserver and the proxy in front of it on
    /// 127.0.0.1 instead of using --kubeconfig.
    #[arg(long)]
    pub sim: bool,
    /// With --sim: send the load to the simulated apiserver directly, not
    /// through the proxy (for comparison).
    #[arg(long, requires = "sim")]
    pub direct: bool,
    /// With --sim or --real: run the proxy as a separate process from this
    /// binary (e.g. target/release/kube-cache-proxy) instead of in this
    /// process.
    #[arg(long, value_name = "PATH")]
    pub proxy_bin: Option<PathBuf>,
    /// With --sim: pods created in the simulated apiserver before the proxy
    /// starts (about 5 KB each, spread over --sim-nodes nodes and 10
    /// namespaces).
    #[arg(long, default_value_t = 0, requires = "sim")]
    pub sim_pods: usize,
    /// With --sim: nodes the pods are spread over.
    #[arg(long, default_value_t = 100, requires = "sim")]
    pub sim_nodes: usize,
    /// With --sim: the proxy's per-watcher buffer (cache.watcherBufferEvents).
    #[arg(long, requires = "sim")]
    pub watcher_buffer: Option<usize>,
}

enum Proxy {
    InProcess {
        stop: Option<oneshot::Sender<()>>,
        task: JoinHandle<Result<(), kube_cache_proxy::RunError>>,
    },
    Child(Child),
}

/// Cache settings of a started proxy that differ from its defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tuning {
    /// `cache.watcherBufferEvents`.
    pub watcher_buffer: Option<usize>,
    /// `cache.consistentListWaitMilliseconds`.
    pub consistent_list_wait_ms: Option<u64>,
    /// `cache.protobufCacheMib`.
    pub protobuf_cache_mib: Option<u64>,
    /// `cache.protobufCachePercent`.
    pub protobuf_cache_percent: Option<u64>,
    /// `cache.progressWatchRollSeconds`.
    pub progress_roll_seconds: Option<u64>,
    /// `cache.upstreamEncoding: Protobuf` (the binary's default is JSON).
    pub upstream_protobuf: bool,
    /// A resource of the defaults left uncached (its reads pass through),
    /// for the proxy's memory caching none of it.
    pub uncached: Option<&'static str>,
}

impl Tuning {
    /// The watcher buffer alone.
    pub fn buffer(watcher_buffer: Option<usize>) -> Tuning {
        Tuning {
            watcher_buffer,
            ..Tuning::default()
        }
    }
}

/// The proxy, started in this process or as a child, and how to reach it.
pub struct RunningProxy {
    proxy: Proxy,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// The CA of its serving certificate, PEM.
    pub ca_pem: String,
    /// Its admin listener (`/metrics`, `/readyz`).
    pub admin: SocketAddr,
}

/// The running sim and proxy.
pub struct SimEnv {
    pub sim: Sim,
    pub dir: PathBuf,
    pub proxy: RunningProxy,
}

fn gvr(group: &str, version: &str, resource: &str) -> Gvr {
    Gvr {
        group: group.into(),
        version: version.into(),
        resource: resource.into(),
    }
}

/// A port that was free a moment ago.
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

fn create(sim: &Sim, gvr: &Gvr, object: Value) -> Result<()> {
    match sim.create(gvr, object) {
        Ok(_) => Ok(()),
        Err(s) if s.code == 409 => Ok(()),
        Err(s) => Err(anyhow!("creating a {}: {}", gvr.resource, s.message)),
    }
}

/// Pod `i` as a create request body (no resourceVersion or uid).
pub fn pod_for_create(i: usize, nodes: usize) -> Result<Value> {
    let ns = format!("ns-{}", i % 10);
    let text = fixtures::pod(i, &ns, &fixtures::node(i % nodes.max(1)), 1);
    let mut v: Value = serde_json::from_str(&text)?;
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("uid");
    }
    Ok(v)
}

impl SimEnv {
    /// Starts the sim (with `args.sim_pods` pods) and the proxy, and waits
    /// until the proxy is ready.
    pub async fn start(args: &SimArgs) -> Result<SimEnv> {
        let sim = Sim::start(SimConfig {
            history_limit: 100_000,
            ..SimConfig::default()
        })
        .await
        .context("starting the simulated apiserver")?;
        for ns in (0..10).map(|i| format!("ns-{i}")).chain(["default".into()]) {
            create(
                &sim,
                &gvr("", "v1", "namespaces"),
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )?;
        }
        for i in 0..args.sim_pods {
            create(
                &sim,
                &gvr("", "v1", "pods"),
                pod_for_create(i, args.sim_nodes)?,
            )?;
        }
        let dir = temp_dir()?;
        let proxy = RunningProxy::start(
            &dir,
            &sim.ca_pem(),
            &sim.kubeconfig(&SimConfig::default().proxy_user, None),
            Tuning::buffer(args.watcher_buffer),
            args.proxy_bin.as_deref(),
        )
        .await?;
        let env = SimEnv { sim, dir, proxy };
        println!("sim: {} ({} pods)", env.sim.url(), args.sim_pods);
        env.proxy.ready(Duration::from_secs(120)).await?;
        Ok(env)
    }

    /// Writes a kubeconfig for `admin` (system:masters) pointing at the
    /// proxy, or at the sim when `direct`.
    pub fn kubeconfig(&self, direct: bool) -> Result<PathBuf> {
        let issued = self.sim.issue_client("admin", Some("system:masters"));
        let (name, text) = if direct {
            (
                "direct.kubeconfig",
                self.sim.kubeconfig("admin", Some("system:masters")),
            )
        } else {
            (
                "proxy.kubeconfig",
                self.proxy
                    .kubeconfig("admin", &issued.cert_pem, &issued.key_pem),
            )
        };
        let p = self.dir.join(name);
        std::fs::write(&p, text)?;
        Ok(p)
    }

    /// A GET on the proxy's admin port: status and the raw response.
    pub async fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        self.proxy.admin_get(path).await
    }

    /// Stops the proxy and removes the files.
    pub async fn stop(self) {
        self.proxy.stop().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh directory for the proxy's files.
pub fn temp_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kcp-load-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

// === impl RunningProxy ===

impl RunningProxy {
    /// Starts the proxy (files in `dir`) in front of the apiserver of
    /// `upstream_kubeconfig` (its text), trusting client certificates of
    /// `client_ca_pem`, with the default caches plus configmaps: in this
    /// process, or as `bin` in its own. Does not wait until it is ready.
    pub async fn start(
        dir: &Path,
        client_ca_pem: &str,
        upstream_kubeconfig: &str,
        tuning: Tuning,
        bin: Option<&Path>,
    ) -> Result<RunningProxy> {
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
            Ok(p)
        };
        let proxy_ca = Ca::new("kcp-load-proxy-ca")?;
        let serving = proxy_ca.issue_server(&["localhost"], &[Ipv4Addr::LOCALHOST.into()])?;
        let cert = write("tls.crt", &serving.cert_pem)?;
        let key = write("tls.key", &serving.key_pem)?;
        let client_ca = write("client-ca.crt", client_ca_pem)?;
        let upstream = write("upstream.kubeconfig", upstream_kubeconfig)?;

        let (proxy, url, admin) = match bin {
            None => {
                let mut config = Config {
                    listen: "127.0.0.1:0".into(),
                    admin_listen: "127.0.0.1:0".into(),
                    shutdown_grace_period_seconds: 1,
                    ..Config::default()
                };
                config.tls.cert_file = Some(cert);
                config.tls.private_key_file = Some(key);
                config.tls.client_ca_file = Some(client_ca);
                config.upstream.kubeconfig = Some(upstream);
                config.cache.resources.push(CachedResource {
                    version: "v1".into(),
                    resource: "configmaps".into(),
                    ..CachedResource::default()
                });
                config.cache.ready_wait_milliseconds = 30_000;
                if let Some(b) = tuning.watcher_buffer {
                    config.cache.watcher_buffer_events = b;
                }
                if let Some(ms) = tuning.consistent_list_wait_ms {
                    config.cache.consistent_list_wait_milliseconds = ms;
                }
                if let Some(mib) = tuning.protobuf_cache_mib {
                    config.cache.protobuf_cache_mib = mib;
                }
                if let Some(pct) = tuning.protobuf_cache_percent {
                    config.cache.protobuf_cache_percent = pct;
                }
                if tuning.upstream_protobuf {
                    config.cache.upstream_encoding = UpstreamEncoding::Protobuf;
                }
                if let Some(r) = tuning.uncached {
                    config.cache.resources.retain(|c| c.resource != r);
                }
                config.validate()?;
                let listeners = Listeners::bind(&config).await?;
                let port = listeners.api.local_addr()?.port();
                let admin = listeners.admin.local_addr()?;
                let (stop, stopped) = oneshot::channel::<()>();
                let task = tokio::spawn(kube_cache_proxy::run(listeners, config, async move {
                    let _ = stopped.await;
                }));
                println!("proxy: in this process, https://127.0.0.1:{port}");
                (
                    Proxy::InProcess {
                        stop: Some(stop),
                        task,
                    },
                    format!("https://127.0.0.1:{port}"),
                    admin,
                )
            }
            Some(bin) => {
                let port = free_port()?;
                let admin_port = free_port()?;
                let config = write(
                    "kube-cache-proxy.yaml",
                    &proxy_yaml(&cert, &key, &client_ca, &upstream, tuning),
                )?;
                let log = std::fs::File::create(dir.join("proxy.log"))?;
                let args = [
                    "--config".to_string(),
                    config.display().to_string(),
                    "--listen".into(),
                    format!("127.0.0.1:{port}"),
                    "--admin-listen".into(),
                    format!("127.0.0.1:{admin_port}"),
                ];
                println!("proxy: {} {}", bin.display(), args.join(" "));
                let mut command = Command::new(bin);
                command
                    .args(&args)
                    .env("RUST_LOG", "warn")
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log);
                // Killed with this tool, however it ends (Ctrl-C included).
                let child = kube_testenv::process::spawn_tied(command)
                    .with_context(|| format!("starting {}", bin.display()))?;
                println!(
                    "proxy: pid {}, log {}",
                    child.id(),
                    dir.join("proxy.log").display()
                );
                (
                    Proxy::Child(child),
                    format!("https://127.0.0.1:{port}"),
                    SocketAddr::from((Ipv4Addr::LOCALHOST, admin_port)),
                )
            }
        };
        Ok(RunningProxy {
            proxy,
            url,
            ca_pem: proxy_ca.cert_pem(),
            admin,
        })
    }

    /// The proxy process id (this process when in-process).
    pub fn pid(&self) -> u32 {
        match &self.proxy {
            Proxy::InProcess { .. } => std::process::id(),
            Proxy::Child(c) => c.id(),
        }
    }

    /// Whether the proxy runs in its own process.
    pub fn is_separate(&self) -> bool {
        matches!(self.proxy, Proxy::Child(_))
    }

    /// A kubeconfig text reaching the proxy as `user` with a client
    /// certificate.
    pub fn kubeconfig(&self, user: &str, cert_pem: &str, key_pem: &str) -> String {
        apimachinery::kubeconfig::with_certificate(&self.url, &self.ca_pem, user, cert_pem, key_pem)
    }

    /// A GET on the proxy's admin port: status and the raw response.
    pub async fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        let mut s = tokio::net::TcpStream::connect(self.admin).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        let status = out.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        Ok((status, out))
    }

    /// Waits until `/readyz` answers 200 (every cache has its first list).
    pub async fn ready(&self, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last;
        loop {
            match self.admin_get("/readyz?verbose").await {
                Ok((200, _)) => return Ok(()),
                Ok((_, body)) => last = body,
                Err(e) => last = e.to_string(),
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the proxy is not ready after {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the proxy: in process, through its shutdown signal; a child
    /// with SIGTERM, then SIGKILL after 10 s.
    pub async fn stop(mut self) {
        match &mut self.proxy {
            Proxy::InProcess { stop, task } => {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
                let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
            }
            Proxy::Child(child) => {
                // SIGTERM first, for a graceful exit (and complete profiles
                // when the proxy runs under a profiler).
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while std::time::Instant::now() < deadline {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        if let Proxy::Child(child) = &mut self.proxy {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The separate proxy's configuration: the default caches plus configmaps.
fn proxy_yaml(
    cert: &Path,
    key: &Path,
    client_ca: &Path,
    upstream: &Path,
    tuning: Tuning,
) -> String {
    let mut resources = String::new();
    for (g, r) in [
        ("", "pods"),
        ("", "nodes"),
        ("", "services"),
        ("discovery.k8s.io", "endpointslices"),
        ("", "namespaces"),
        ("node.k8s.io", "runtimeclasses"),
        ("storage.k8s.io", "csidrivers"),
        ("storage.k8s.io", "csinodes"),
        ("networking.k8s.io", "servicecidrs"),
        ("", "configmaps"),
    ]
    .into_iter()
    .filter(|(_, r)| tuning.uncached != Some(*r))
    {
        resources.push_str(&format!(
            "    - {{group: \"{g}\", version: v1, resource: {r}}}\n"
        ));
    }
    let mut buffer = String::new();
    if let Some(b) = tuning.watcher_buffer {
        buffer.push_str(&format!("  watcherBufferEvents: {b}\n"));
    }
    if let Some(ms) = tuning.consistent_list_wait_ms {
        buffer.push_str(&format!("  consistentListWaitMilliseconds: {ms}\n"));
    }
    if let Some(mib) = tuning.protobuf_cache_mib {
        buffer.push_str(&format!("  protobufCacheMib: {mib}\n"));
    }
    if let Some(pct) = tuning.protobuf_cache_percent {
        buffer.push_str(&format!("  protobufCachePercent: {pct}\n"));
    }
    if let Some(s) = tuning.progress_roll_seconds {
        buffer.push_str(&format!("  progressWatchRollSeconds: {s}\n"));
    }
    if tuning.upstream_protobuf {
        buffer.push_str("  upstreamEncoding: Protobuf\n");
    }
    format!(
        "shutdownGracePeriodSeconds: 1\ntls:\n  certFile: {}\n  privateKeyFile: {}\n  clientCAFile: {}\nupstream:\n  kubeconfig: {}\ncache:\n  readyWaitMilliseconds: 30000\n{buffer}  resources:\n{resources}",
        cert.display(),
        key.display(),
        client_ca.display(),
        upstream.display(),
    )
}
