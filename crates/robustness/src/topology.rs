//! What the run stands up: a real etcd and kube-apiserver (JSON storage,
//! so etcd's values are readable as the reference), a tier of proxies on
//! the shipped tier configuration and RBAC, node proxies on the shipped
//! node configuration with their nodes' client certificates (some straight
//! to the apiserver, some behind the tier with the apiserver as fallback),
//! each behind a fault relay, and hollow kubelets on some nodes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use apimachinery::kubeconfig;
use apimachinery::pki::{Ca, Issued};
use kube_testenv::{ControlPlane, Morph, Options, Process};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::balancer::Balancer;
use crate::client::{Auth, Client};
use crate::etcd::Etcd;
use crate::relay::Relay;

/// The shipped configurations and RBAC the proxies run with.
const NODE_CONFIG: &str = include_str!("../../../manifests/node/config.yaml");
const NODE_RBAC: &str = include_str!("../../../manifests/node/rbac.yaml");
const TIER_CONFIG: &str = include_str!("../../../manifests/tier/config.yaml");
const TIER_RBAC: &str = include_str!("../../../manifests/tier/rbac.yaml");
const TIER_SERVICE_ACCOUNT: &str = include_str!("../../../manifests/tier/serviceaccount.yaml");
const TIER_FLOWCONTROL: &str = include_str!("../../../manifests/tier/flowcontrol.yaml");
/// For apiservers without constrained impersonation (1.34, 1.35 by
/// default): the tier's legacy impersonation of its nodes.
const TIER_LEGACY_RBAC: &str =
    include_str!("../../../manifests/tier/rbac-legacy-impersonation.yaml");

/// How big.
#[derive(Debug, Clone)]
pub struct Shape {
    /// kube-apiservers, behind the balancer.
    pub apiservers: usize,
    /// etcd members (with as many apiservers, each apiserver on its own:
    /// kubeadm's stacked topology).
    pub etcd_members: usize,
    /// Whether apiservers of another minor version may serve (a rolling
    /// upgrade).
    pub mixed_versions: bool,
    /// Node proxies straight to the apiserver.
    pub direct_nodes: usize,
    /// Node proxies behind the tier.
    pub tier_nodes: usize,
    /// Tier replicas.
    pub tier_replicas: usize,
    /// Hollow kubelets: on the first node of each kind, up to this many.
    pub kubelets: usize,
}

/// Which upstream a proxy has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A tier replica (upstream: the apiserver, as the tier's account).
    Tier,
    /// A node proxy for `node`, to the apiserver.
    Node { node: String, behind_tier: bool },
}

/// One proxy: its configuration, its process (none while it is down), and
/// the relay between it and its upstream.
#[derive(Debug)]
pub struct Proxy {
    pub name: String,
    pub role: Role,
    pub dir: PathBuf,
    pub config: PathBuf,
    /// `https://127.0.0.1:<port>`, the same across restarts.
    pub url: String,
    pub admin: SocketAddr,
    /// Between it and its upstream (for a tier-backed node proxy: in
    /// front of every replica, as a Service).
    pub relay: Relay,
    /// The snapshot directory.
    pub snapshots: PathBuf,
    /// Whether the snapshot directory is a small tmpfs of its own (for the
    /// "directory full" fault).
    pub small_snapshot_fs: bool,
    pub process: Option<Process>,
    /// Processes started so far (restarts and takeovers count).
    pub generation: u32,
    pub node_cert: Option<Issued>,
}

/// The whole topology.
pub struct Topology {
    pub cp: ControlPlane,
    /// In front of the apiservers: what every proxy and the run's own
    /// clients reach them through.
    pub balancer: Balancer,
    /// The minor version each apiserver runs now (a rolling upgrade
    /// changes them).
    pub versions: Vec<String>,
    pub etcd: Etcd,
    pub admin: Client,
    pub dir: PathBuf,
    pub proxy_bin: PathBuf,
    /// The proxies' serving CA (every client of a proxy trusts it).
    pub serving_ca: Ca,
    pub tier: Vec<Proxy>,
    pub nodes: Vec<Proxy>,
    pub kubelets: Vec<Process>,
    /// The nodes with a hollow kubelet.
    pub kubelet_nodes: Vec<String>,
    /// A token of the `kcp-robustness` ServiceAccount, which may read
    /// everything the run writes (a DaemonSet agent's token).
    pub reader_token: String,
    pub stop: CancellationToken,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

/// A free port below the kernel's ephemeral range: a proxy restarted
/// after `kill -9` binds it again, and an outgoing connection's local port
/// (drawn from the ephemeral range) cannot have taken it meanwhile.
fn free_port() -> Result<u16> {
    kube_testenv::stable_port().map_err(|e| anyhow!("{e}"))
}

/// The namespaces the run writes in.
pub const NAMESPACES: [&str; 2] = ["rb-0", "rb-1"];

impl Topology {
    /// Starts everything and waits until every proxy is ready.
    pub async fn start(shape: &Shape, proxy_bin: &Path, dir: &Path) -> Result<Topology> {
        let cp = ControlPlane::start(Options {
            apiservers: shape.apiservers,
            etcd_members: shape.etcd_members,
            ..Options::default()
        })
        .await
        .map_err(|e| anyhow!("starting the control plane: {e}"))?;
        let stop = CancellationToken::new();
        let backends: Vec<SocketAddr> = (0..cp.apiserver_count())
            .filter_map(|i| {
                cp.apiserver_url(i)
                    .trim_start_matches("https://")
                    .parse()
                    .ok()
            })
            .collect();
        let balancer = Balancer::start(&backends, dir, stop.clone()).await?;
        println!(
            "control plane: {} apiserver(s) {} behind {} {}, etcd {} (files in {})",
            cp.apiserver_count(),
            cp.version(),
            balancer.kind,
            balancer.addr,
            cp.etcd_urls().join(","),
            cp.dir().display()
        );
        let admin = Client::new(
            &balancer.url(),
            &cp.ca_pem(),
            Auth::Cert(cp.admin().clone()),
            false,
        )?;
        for manifest in [NODE_RBAC, TIER_SERVICE_ACCOUNT, TIER_RBAC, TIER_FLOWCONTROL] {
            apply(&admin, manifest).await?;
        }
        // Where an apiserver without constrained impersonation serves, now
        // or during a rolling upgrade (1.35 by default), the tier acts as
        // its nodes by legacy impersonation (docs/operations.md, "Upgrades").
        if !cp.has_constrained_impersonation() || shape.mixed_versions {
            apply(&admin, TIER_LEGACY_RBAC).await?;
        }
        let reader_token = reader_account(&admin).await?;
        for ns in NAMESPACES {
            create(
                &admin,
                "/api/v1/namespaces",
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .await?;
            create(&admin, &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})).await?;
        }
        let serving_ca = Ca::new("kcp-robustness-proxies")?;
        let minor = format!("1.{}", cp.minor());
        let mut topo = Topology {
            etcd: Etcd::cluster(&cp.etcd_urls()),
            versions: vec![minor; cp.apiserver_count()],
            balancer,
            cp,
            admin,
            dir: dir.to_path_buf(),
            proxy_bin: proxy_bin.to_path_buf(),
            serving_ca,
            tier: Vec::new(),
            nodes: Vec::new(),
            kubelets: Vec::new(),
            kubelet_nodes: Vec::new(),
            reader_token,
            stop,
        };
        let apiserver = topo.balancer.addr;

        // The tier.
        if shape.tier_nodes > 0 {
            let token = tier_token(&topo.admin).await?;
            for i in 0..shape.tier_replicas {
                let p = topo.tier_replica(i, apiserver, &token).await?;
                topo.tier.push(p);
            }
        }
        let tier_addrs: Vec<SocketAddr> = topo
            .tier
            .iter()
            .filter_map(|p| p.url.trim_start_matches("https://").parse().ok())
            .collect();
        // The node proxies.
        let mut small_fs_done = false;
        for i in 0..shape.direct_nodes + shape.tier_nodes {
            let behind_tier = i >= shape.direct_nodes;
            let node = format!("rb-node-{i}");
            let upstreams = if behind_tier {
                tier_addrs.clone()
            } else {
                vec![apiserver]
            };
            let small = !small_fs_done && !behind_tier;
            let p = topo
                .node_proxy(&node, behind_tier, upstreams, small)
                .await?;
            small_fs_done |= p.small_snapshot_fs;
            topo.nodes.push(p);
        }
        for p in topo.tier.iter_mut().chain(topo.nodes.iter_mut()) {
            let name = p.name.clone();
            start_process(&topo.proxy_bin, p).with_context(|| format!("starting {name}"))?;
        }
        for p in topo.tier.iter().chain(&topo.nodes) {
            wait_ready(p, Duration::from_secs(120)).await?;
        }
        // Nodes without a kubelet exist too (as if it were down).
        let with_kubelet: Vec<String> = [0, shape.direct_nodes]
            .into_iter()
            .filter(|i| *i < topo.nodes.len())
            .take(shape.kubelets)
            .map(|i| node_of(&topo.nodes[i]).to_string())
            .collect();
        for p in &topo.nodes {
            let node = node_of(p);
            if !with_kubelet.iter().any(|n| n == node) {
                create(&topo.admin, "/api/v1/nodes",
                    &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"kcp-robustness": "true"}}})).await?;
            }
        }
        if topo.cp.assets().has_kubemark() {
            for p in &topo.nodes {
                let node = node_of(p).to_string();
                if !with_kubelet.contains(&node) {
                    continue;
                }
                let Some(cert) = &p.node_cert else { continue };
                let kc = write(
                    &p.dir,
                    "kubelet.kubeconfig",
                    &kubeconfig::with_certificate(
                        &p.url,
                        &topo.serving_ca.cert_pem(),
                        &format!("system:node:{node}"),
                        &cert.cert_pem,
                        &cert.key_pem,
                    ),
                )?;
                let k = topo
                    .cp
                    .hollow(Morph::Kubelet, &node, &kc, &[])
                    .map_err(|e| anyhow!("{e}"))?;
                println!("hollow kubelet on {node}: pid {}", k.pid());
                topo.kubelets.push(k);
                topo.kubelet_nodes.push(node);
            }
        } else {
            println!("no kubemark: no hollow kubelets");
        }
        Ok(topo)
    }

    async fn tier_replica(&self, i: usize, apiserver: SocketAddr, token: &str) -> Result<Proxy> {
        let name = format!("tier-{i}");
        let dir = self.dir.join(&name);
        std::fs::create_dir_all(&dir)?;
        let relay = Relay::start(vec![apiserver], self.stop.clone()).await?;
        let upstream = write(
            &dir,
            "upstream.kubeconfig",
            &kubeconfig::with_token(
                &format!("https://{}", relay.addr()),
                &self.cp.ca_pem(),
                token,
            ),
        )?;
        let mut c = self.shipped(TIER_CONFIG, &dir)?;
        c["upstream"]["kubeconfig"] = json!(upstream);
        // No persistence or takeover in the tier's shipped configuration.
        self.proxy(name, Role::Tier, dir, c, relay, None, false)
    }

    async fn node_proxy(
        &self,
        node: &str,
        behind_tier: bool,
        upstreams: Vec<SocketAddr>,
        small_snapshot_fs: bool,
    ) -> Result<Proxy> {
        let dir = self.dir.join(node);
        std::fs::create_dir_all(&dir)?;
        let user = format!("system:node:{node}");
        let cert = self
            .cp
            .issue_client(&user, Some("system:nodes"))
            .map_err(|e| anyhow!("{e}"))?;
        let relay = Relay::start(upstreams, self.stop.clone()).await?;
        let relayed = format!("https://{}", relay.addr());
        let (server_ca, fallback) = if behind_tier {
            (self.serving_ca.cert_pem(), true)
        } else {
            (self.cp.ca_pem(), false)
        };
        let upstream = write(
            &dir,
            "upstream.kubeconfig",
            &kubeconfig::with_certificate(
                &relayed,
                &server_ca,
                &user,
                &cert.cert_pem,
                &cert.key_pem,
            ),
        )?;
        let mut c = self.shipped(NODE_CONFIG, &dir)?;
        c["nodeName"] = json!(node);
        c["upstream"]["kubeconfig"] = json!(upstream);
        if fallback {
            let kc = write(
                &dir,
                "apiserver.kubeconfig",
                &kubeconfig::with_certificate(
                    &self.balancer.url(),
                    &self.cp.ca_pem(),
                    &user,
                    &cert.cert_pem,
                    &cert.key_pem,
                ),
            )?;
            c["upstream"]["fallback"] = json!({"kubeconfig": kc});
        }
        let snapshots = dir.join("cache");
        std::fs::create_dir_all(&snapshots)?;
        let small = small_snapshot_fs && mount_small_fs(&snapshots);
        c["cache"]["persistence"]["directory"] = json!(snapshots);
        c["takeover"]["socketPath"] = json!(dir.join("takeover.sock"));
        let name = node.to_string();
        let mut p = self.proxy(
            name,
            Role::Node {
                node: node.to_string(),
                behind_tier,
            },
            dir,
            c,
            relay,
            Some(cert),
            small,
        )?;
        p.snapshots = snapshots;
        Ok(p)
    }

    /// A shipped configuration with what only exists on a node or in a
    /// pod replaced: addresses, files.
    fn shipped(&self, text: &str, dir: &Path) -> Result<Value> {
        let mut c: Value = serde_saphyr::from_str(text).map_err(|e| anyhow!("{e}"))?;
        let serving = self
            .serving_ca
            .issue_server(&["localhost"], &[std::net::Ipv4Addr::LOCALHOST.into()])?;
        c["listen"] = json!(format!("127.0.0.1:{}", free_port()?));
        c["adminListen"] = json!(format!("127.0.0.1:{}", free_port()?));
        c["metricsListen"] = Value::Null;
        c["tls"]["certFile"] = json!(write(dir, "tls.crt", &serving.cert_pem)?);
        c["tls"]["privateKeyFile"] = json!(write(dir, "tls.key", &serving.key_pem)?);
        c["tls"]["clientCAFile"] = json!(write(dir, "client-ca.crt", &self.cp.ca_pem())?);
        c["shutdownGracePeriodSeconds"] = json!(5);
        Ok(c)
    }

    #[allow(clippy::too_many_arguments)]
    fn proxy(
        &self,
        name: String,
        role: Role,
        dir: PathBuf,
        config: Value,
        relay: Relay,
        node_cert: Option<Issued>,
        small_snapshot_fs: bool,
    ) -> Result<Proxy> {
        let url = format!(
            "https://{}",
            config["listen"]
                .as_str()
                .ok_or_else(|| anyhow!("no listen"))?
        );
        let admin: SocketAddr = config["adminListen"]
            .as_str()
            .ok_or_else(|| anyhow!("no adminListen"))?
            .parse()?;
        let path = write(&dir, "config.yaml", &serde_json::to_string_pretty(&config)?)?;
        Ok(Proxy {
            name,
            role,
            snapshots: dir.join("cache"),
            dir,
            config: path,
            url,
            admin,
            relay,
            small_snapshot_fs,
            process: None,
            generation: 0,
            node_cert,
        })
    }

    /// Every proxy, tier first.
    pub fn proxies(&self) -> impl Iterator<Item = &Proxy> {
        self.tier.iter().chain(&self.nodes)
    }

    /// A client of `proxy` as its node (node proxies) or with the reader
    /// token.
    pub fn client_of(&self, proxy: &Proxy, as_node: bool, h2: bool) -> Result<Client> {
        let auth = match (&proxy.node_cert, as_node) {
            (Some(c), true) => Auth::Cert(c.clone()),
            _ => Auth::Token(self.reader_token.clone()),
        };
        Client::new(&proxy.url, &self.serving_ca.cert_pem(), auth, h2)
    }

    /// A client of the apiserver with the reader token.
    pub fn direct_reader(&self, h2: bool) -> Result<Client> {
        Client::new(
            &self.balancer.url(),
            &self.cp.ca_pem(),
            Auth::Token(self.reader_token.clone()),
            h2,
        )
    }
}

/// The node of a node proxy (the tier's name otherwise).
pub fn node_of(p: &Proxy) -> &str {
    match &p.role {
        Role::Node { node, .. } => node,
        Role::Tier => &p.name,
    }
}

/// Mounts a 512 KiB tmpfs on `dir`, for the "directory full" fault;
/// false where that is not allowed (not root): the fault is then skipped.
fn mount_small_fs(dir: &Path) -> bool {
    std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs"])
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Unmounts what [`mount_small_fs`] mounted.
pub fn unmount_small_fs(dir: &Path) {
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Starts (or restarts, or starts a successor of) `p`'s process: the
/// binary with its configuration, JSON logs appended to `proxy.log`.
pub fn start_process(bin: &Path, p: &mut Proxy) -> Result<()> {
    p.generation += 1;
    let log = p.dir.join("proxy.log");
    let mut args = vec![
        "--config".to_string(),
        p.config.display().to_string(),
        "--logging-format=json".to_string(),
    ];
    if let Role::Node { node, .. } = &p.role {
        args.push(format!("--node-name={node}"));
    }
    let process = Process::spawn(&format!("{}#{}", p.name, p.generation), bin, &args, &log)
        .with_context(|| format!("starting {}", bin.display()))?;
    p.process = Some(process);
    Ok(())
}

/// GET `path` on a proxy's admin listener.
pub async fn admin_get(admin: SocketAddr, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(admin),
    )
    .await
    .map_err(|_| anyhow!("connect timed out"))??;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .map_err(|_| anyhow!("read timed out"))??;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Waits until `/readyz` answers 200.
pub async fn wait_ready(p: &Proxy, timeout: Duration) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let last = match admin_get(p.admin, "/readyz?verbose").await {
            Ok((200, _)) => return Ok(started.elapsed()),
            Ok((code, body)) => format!("{code}: {}", body.trim()),
            Err(e) => e.to_string(),
        };
        if let Some(proc) = &p.process
            && let Some(status) = proc.exited()
        {
            bail!("{} exited with {status}: {}", p.name, proc.log_tail(2048));
        }
        if started.elapsed() > timeout {
            bail!("{} not ready after {timeout:?}: {last}", p.name);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create(admin: &Client, path: &str, body: &Value) -> Result<Value> {
    let r = admin
        .send(
            http::Method::POST,
            path,
            Some(serde_json::to_vec(body)?),
            "application/json",
            Duration::from_secs(30),
        )
        .await?;
    match r.status.as_u16() {
        200 | 201 | 409 => Ok(r.json()),
        s => bail!("POST {path}: {s} {}", String::from_utf8_lossy(&r.body)),
    }
}

/// Creates the objects of a manifest, the namespaced ones in kube-system
/// (as the manifests' kustomizations do).
async fn apply(admin: &Client, manifest: &str) -> Result<()> {
    for o in kube_testenv::manifest::objects(manifest, "kube-system")? {
        create(admin, &o.collection, &o.body).await?;
    }
    Ok(())
}

async fn token_for(admin: &Client, ns: &str, sa: &str) -> Result<String> {
    let r = create(
        admin,
        &format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"),
        &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 86400}}),
    )
    .await?;
    r["status"]["token"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("TokenRequest for {ns}/{sa}: no token"))
}

/// A token of `kube-cache-proxy-tier`.
async fn tier_token(admin: &Client) -> Result<String> {
    token_for(admin, "kube-system", "kube-cache-proxy-tier").await
}

/// The `kcp-robustness` ServiceAccount, allowed to read what the run
/// writes; its token.
async fn reader_account(admin: &Client) -> Result<String> {
    create(admin, "/api/v1/namespaces/kube-system/serviceaccounts",
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kcp-robustness"}})).await?;
    create(admin, "/apis/rbac.authorization.k8s.io/v1/clusterroles", &json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "kcp-robustness-reader"},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "services", "configmaps", "nodes", "namespaces"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        ]})).await?;
    create(admin, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", &json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "kcp-robustness-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kcp-robustness-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "kcp-robustness", "namespace": "kube-system"}]})).await?;
    token_for(admin, "kube-system", "kcp-robustness").await
}

/// Shared handle.
pub type Shared = Arc<tokio::sync::Mutex<Topology>>;
