//! `--real`: a real control plane (etcd and kube-apiserver v1.36 from
//! `../shared/k8s/`, started by `kube-testenv` on free 127.0.0.1 ports, as
//! the real-apiserver tests do) with the proxy in front of it
//! ([`RunningProxy`]: in this process, or `--proxy-bin`), the proxy acting
//! upstream as `admin` (`system:masters`) and the load as `admin` too,
//! through the proxy and, for comparison, directly.
//!
//! Where the binaries are absent, [`RealEnv::start`] fails with [`Skip`]:
//! the tool says why and exits 0.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use http::{Method, StatusCode};
use kube_testenv::{AssetsError, ControlPlane, Options};
use serde_json::{Value, json};

use crate::client::{Proto, Target};
use crate::env::{RunningProxy, SimArgs, Tuning, pod_for_create, temp_dir};
use crate::fixtures;

/// What to start.
#[derive(Debug, Clone, clap::Args)]
pub struct RealArgs {
    /// Start a real control plane (etcd and kube-apiserver from
    /// ../shared/k8s, via kube-testenv) and the proxy in front of it on
    /// 127.0.0.1, both used as admin (system:masters); `get` and `list`
    /// then run the same requests directly against the apiserver for
    /// comparison. Where the binaries are absent: a message, exit 0.
    #[arg(long, conflicts_with = "sim")]
    pub real: bool,
    /// With --real: pods created before the proxy starts (about 4.6 KB
    /// each, spread over 100 node names and 10 namespaces ns-0..ns-9).
    #[arg(long, default_value_t = 0, requires = "real")]
    pub pods: usize,
    /// With --real: configmaps created in `default` before the proxy starts
    /// (about 250 B each), for lists of a namespace's configmaps.
    #[arg(long, default_value_t = 0, requires = "real")]
    pub configmaps: usize,
}

/// The real control plane could not be started because its binaries are
/// absent: not a failure of the measurement.
#[derive(Debug)]
pub struct Skip(pub String);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skip {}

/// The running control plane and proxy.
pub struct RealEnv {
    cp: ControlPlane,
    dir: PathBuf,
    pub proxy: RunningProxy,
    /// The apiserver, directly, as admin.
    pub direct: Target,
}

impl RealEnv {
    /// Starts the control plane, seeds `args.pods` pods, starts the proxy
    /// and waits until it is ready.
    pub async fn start(args: &RealArgs, sim: &SimArgs) -> Result<RealEnv> {
        let started = Instant::now();
        let cp = match ControlPlane::start(Options::default()).await {
            Ok(cp) => cp,
            Err(kube_testenv::Error::Assets(e @ AssetsError::Absent { .. })) => {
                return Err(Skip(format!("--real: {e}")).into());
            }
            Err(e) => bail!("starting the control plane: {e}"),
        };
        let direct = Target::from_kubeconfig(Some(cp.admin_kubeconfig()), None).await?;
        let version = {
            let mut conn = direct.connect(Proto::H1).await?;
            let r = direct
                .fetch(&mut conn, Method::GET, "/version", None)
                .await?;
            serde_json::from_slice::<Value>(&r.body)
                .ok()
                .and_then(|v| v["gitVersion"].as_str().map(str::to_string))
                .unwrap_or_else(|| "?".into())
        };
        println!(
            "apiserver: kube-apiserver {version} at {} (binaries from {}), ready in {:.1}s; files in {}",
            cp.url(),
            cp.assets().source,
            started.elapsed().as_secs_f64(),
            cp.dir().display()
        );
        if args.pods > 0 {
            seed(&direct, args.pods, "pods").await?;
        }
        if args.configmaps > 0 {
            seed(&direct, args.configmaps, "configmaps").await?;
        }
        let dir = temp_dir()?;
        let proxy = RunningProxy::start(
            &dir,
            &cp.ca_pem(),
            &cp.kubeconfig_text(&cp.url(), "admin", cp.admin()),
            Tuning::buffer(sim.watcher_buffer),
            sim.proxy_bin.as_deref(),
        )
        .await?;
        let env = RealEnv {
            cp,
            dir,
            proxy,
            direct,
        };
        let ready = Instant::now();
        env.proxy.ready(Duration::from_secs(180)).await?;
        println!("proxy: ready in {:.1}s", ready.elapsed().as_secs_f64());
        Ok(env)
    }

    /// A kubeconfig for admin (`system:masters`) reaching the proxy, or
    /// the apiserver when `direct`.
    pub fn kubeconfig(&self, direct: bool) -> Result<PathBuf> {
        let cp = &self.cp;
        if direct {
            return Ok(cp.admin_kubeconfig().to_path_buf());
        }
        let p = self.dir.join("proxy.kubeconfig");
        std::fs::write(
            &p,
            self.proxy
                .kubeconfig("admin", &cp.admin().cert_pem, &cp.admin().key_pem),
        )?;
        Ok(p)
    }

    /// Stops the proxy and the control plane and removes their files.
    pub async fn stop(self) {
        let RealEnv { cp, dir, proxy, .. } = self;
        proxy.stop().await;
        let cp_dir = cp.dir().to_path_buf();
        drop(cp);
        let _ = std::fs::remove_dir_all(cp_dir);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Creates `path`'s object as admin; an existing one is fine.
pub async fn create(target: &Target, path: &str, object: &Value) -> Result<()> {
    let mut conn = target.connect(Proto::H1).await?;
    create_on(target, &mut conn, path, object).await
}

async fn create_on(
    target: &Target,
    conn: &mut crate::client::Conn,
    path: &str,
    object: &Value,
) -> Result<()> {
    let body = Bytes::from(serde_json::to_vec(object)?);
    let r = target.fetch(conn, Method::POST, path, Some(body)).await?;
    match r.status {
        StatusCode::CREATED | StatusCode::OK | StatusCode::CONFLICT => Ok(()),
        s => bail!("POST {path}: {s} {}", String::from_utf8_lossy(&r.body)),
    }
}

/// Pod `i` as a new user writes one: a single nginx container with a
/// port and a label, not scheduled (no kubelet, no scheduler). The
/// apiserver serves it with its defaults, its service account's projected
/// volume and `managedFields`: about 2.3 KB.
pub fn minimal_pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("web-{i}"), "namespace": format!("ns-{}", i % 10), "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]}
    })
}

/// Creates `n` pods (in namespaces ns-0..ns-9, made first, each with its
/// `default` ServiceAccount: no kube-controller-manager runs to make it,
/// and the ServiceAccount admission plugin requires it) or configmaps (in
/// `default`), 32 at a time. `what`: `pods` (`fixtures.rs`'s, scheduled),
/// `minimal-pods` ([`minimal_pod`]) or `configmaps`.
pub async fn seed(direct: &Target, n: usize, what: &'static str) -> Result<()> {
    let started = Instant::now();
    let pods = what.ends_with("pods");
    for i in (0..10).filter(|_| pods) {
        let ns = format!("ns-{i}");
        create(
            direct,
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await?;
        create(
            direct,
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        )
        .await?;
    }
    const WORKERS: usize = 32;
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        let (direct, next) = (direct.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = direct.connect(Proto::H2).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(());
                }
                let (path, object) = if pods {
                    let pod = if what == "minimal-pods" {
                        minimal_pod(i)
                    } else {
                        pod_for_create(i, 100)?
                    };
                    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("ns-0");
                    (format!("/api/v1/namespaces/{ns}/pods"), pod)
                } else {
                    let mut cm: Value =
                        serde_json::from_str(&fixtures::config_map(i, "default", 1))?;
                    if let Some(m) = cm.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.remove("resourceVersion");
                        m.remove("uid");
                        m.remove("creationTimestamp");
                    }
                    ("/api/v1/namespaces/default/configmaps".to_string(), cm)
                };
                create_on(&direct, &mut conn, &path, &object).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    println!(
        "seed: {n} {what} in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
