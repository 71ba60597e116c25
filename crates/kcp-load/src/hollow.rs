//! `kcp-load kubelet`: a hollow kubelet (`kubemark --morph=kubelet`, the
//! real kubelet code with a fake runtime) through the proxy in front of a
//! real kube-apiserver v1.36 (`kube-testenv`, `../shared/k8s/`), asking
//! for protobuf or JSON (`--kube-api-content-type`): its CPU while idle,
//! then while objects it watches change at `--rate` writes/s.
//!
//! The writes are merge patches of an annotation of `--services` Services
//! (the kubelet watches every Service, for its pods' environment, and
//! only decodes and stores the events) or, with `--write pods`, of the
//! `--pods` pods bound to the node (each event also makes the kubelet
//! sync the pod). The proxy runs in this process, so its CPU is not told
//! apart from the writer's here (`kcp-load watch` measures it alone).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use apimachinery::pki::Ca;
use clap::{Args, ValueEnum};
use http::{Method, Request};
use kube_cache_proxy::Listeners;
use kube_cache_proxy::component::config::Config;
use kube_testenv::{ControlPlane, Morph, Options};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::stats::cpu_of;

/// What the hollow kubelet asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ContentType {
    /// `application/vnd.kubernetes.protobuf` (the kubelet's default).
    Protobuf,
    /// `application/json`.
    Json,
}

impl ContentType {
    fn as_str(self) -> &'static str {
        match self {
            ContentType::Protobuf => "application/vnd.kubernetes.protobuf",
            ContentType::Json => "application/json",
        }
    }
}

/// The objects written while measuring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Written {
    Services,
    Pods,
}

#[derive(Debug, Clone, Args)]
pub struct KubeletArgs {
    /// The kubelet's `--kube-api-content-type`.
    #[arg(long, value_enum, default_value_t = ContentType::Protobuf)]
    content_type: ContentType,
    /// Point the kubelet at the apiserver directly, not at the proxy.
    #[arg(long)]
    direct: bool,
    /// Pods bound to the hollow node.
    #[arg(long, default_value_t = 20)]
    pods: usize,
    /// Services in the cluster.
    #[arg(long, default_value_t = 20)]
    services: usize,
    /// What the writes patch.
    #[arg(long, value_enum, default_value_t = Written::Services)]
    write: Written,
    /// Writes per second while measuring.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Seconds of each phase (idle, then writing).
    #[arg(long, default_value_t = 60)]
    duration: u64,
}

const NODE: &str = "kcp-load-hollow";
const NAMESPACE: &str = "default";

/// The proxy, in this process, in front of `cp`.
async fn start_proxy(
    cp: &ControlPlane,
    dir: &std::path::Path,
) -> Result<(String, String, oneshot::Sender<()>)> {
    let write = |name: &str, text: &str| -> Result<PathBuf> {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        Ok(p)
    };
    let proxy_ca = Ca::new("kcp-load-proxy-ca")?;
    let serving = proxy_ca.issue_server(&["localhost"], &[std::net::Ipv4Addr::LOCALHOST.into()])?;
    let mut config = Config {
        listen: "127.0.0.1:0".into(),
        admin_listen: "127.0.0.1:0".into(),
        shutdown_grace_period_seconds: 1,
        ..Config::default()
    };
    config.tls.cert_file = Some(write("tls.crt", &serving.cert_pem)?);
    config.tls.private_key_file = Some(write("tls.key", &serving.key_pem)?);
    config.tls.client_ca_file = Some(write("client-ca.crt", &cp.ca_pem())?);
    config.upstream.kubeconfig = Some(write(
        "upstream.kubeconfig",
        &cp.kubeconfig_text(&cp.url(), "admin", cp.admin()),
    )?);
    config.cache.ready_wait_milliseconds = 30_000;
    config.validate()?;
    let listeners = Listeners::bind(&config).await?;
    let url = format!("https://127.0.0.1:{}", listeners.api.local_addr()?.port());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(kube_cache_proxy::run(listeners, config, async move {
        let _ = stopped.await;
    }));
    Ok((url, proxy_ca.cert_pem(), stop))
}

/// Sends `body` to `path` as the control plane's admin.
async fn send(client: &kube::Client, method: Method, path: &str, body: Value) -> Result<Value> {
    let content_type = if method == Method::PATCH {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(serde_json::to_vec(&body)?)?;
    client
        .request::<Value>(req)
        .await
        .with_context(|| path.to_string())
}

fn service(i: usize) -> Value {
    let ports: Vec<Value> = (0..4)
        .map(|p| json!({"name": format!("p{p}"), "port": 8000 + p, "targetPort": 9000 + p, "protocol": "TCP"}))
        .collect();
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": format!("svc-{i}"), "labels": {"app.kubernetes.io/managed-by": "kcp-load", "app": format!("app-{i}")}},
           "spec": {"selector": {"app": format!("app-{i}")}, "ports": ports}})
}

fn pod(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("hollow-pod-{i}"), "labels": {"app.kubernetes.io/managed-by": "kcp-load", "app": format!("app-{}", i % 20)}},
           "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}},
                                    "env": [{"name": "A", "value": "b"}],
                                    "ports": [{"containerPort": 8080, "name": "http"}]}]}})
}

/// CPU of `pid` over `seconds`, in cores, while `during` runs.
async fn cpu_over<F: std::future::Future<Output = Result<u64>>>(
    pid: u32,
    seconds: u64,
    during: F,
) -> Result<(f64, u64)> {
    let before = cpu_of(pid).ok_or_else(|| anyhow!("cannot read /proc/{pid}/stat"))?;
    let start = Instant::now();
    let writes = during.await?;
    let rest = Duration::from_secs(seconds).saturating_sub(start.elapsed());
    tokio::time::sleep(rest).await;
    let after = cpu_of(pid).ok_or_else(|| anyhow!("cannot read /proc/{pid}/stat"))?;
    Ok((
        (after - before).as_secs_f64() / start.elapsed().as_secs_f64(),
        writes,
    ))
}

pub async fn kubelet(a: &KubeletArgs) -> Result<()> {
    let cp = ControlPlane::start(Options::default())
        .await
        .context("starting etcd and kube-apiserver (kube-testenv)")?;
    println!("apiserver: {} ({})", cp.url(), cp.dir().display());
    let admin = cp
        .admin_client()
        .await
        .map_err(|e| anyhow!("admin client: {e}"))?;
    let dir = cp.dir().join("kcp-load");
    std::fs::create_dir_all(&dir)?;
    let (proxy_url, proxy_ca_pem, stop) = start_proxy(&cp, &dir).await?;
    println!("proxy: in this process, {proxy_url}");

    for i in 0..a.services {
        send(
            &admin,
            Method::POST,
            &format!("/api/v1/namespaces/{NAMESPACE}/services"),
            service(i),
        )
        .await?;
    }
    let user = format!("system:node:{NODE}");
    let cert = cp
        .issue_client(&user, Some("system:nodes"))
        .map_err(|e| anyhow!("node certificate: {e}"))?;
    let kubeconfig_text = if a.direct {
        cp.kubeconfig_text(&cp.url(), &user, &cert)
    } else {
        apimachinery::kubeconfig::with_certificate(
            &proxy_url,
            &proxy_ca_pem,
            &user,
            &cert.cert_pem,
            &cert.key_pem,
        )
    };
    let kubeconfig = dir.join("kubelet.kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_text)?;
    let extra = [format!(
        "--kube-api-content-type={}",
        a.content_type.as_str()
    )];
    let kubelet = cp
        .hollow(Morph::Kubelet, NODE, &kubeconfig, &extra)
        .map_err(|e| anyhow!("starting the hollow kubelet: {e}"))?;
    let pid = kubelet.pid();
    println!(
        "kubelet: pid {pid}, {} {}, log {}",
        if a.direct {
            "direct to the apiserver"
        } else {
            "through the proxy"
        },
        extra.join(" "),
        cp.dir().join(format!("kubelet-{NODE}.log")).display()
    );

    // The node registers and becomes Ready; then its pods run.
    wait_for(
        &admin,
        &format!("/api/v1/nodes/{NODE}"),
        Duration::from_secs(120),
        |n| {
            n["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        },
    )
    .await
    .context("the hollow node is not Ready")?;
    // No controller manager runs: the namespace's service account, which
    // admission wants for a pod, is made here.
    send(
        &admin,
        Method::POST,
        &format!("/api/v1/namespaces/{NAMESPACE}/serviceaccounts"),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
    )
    .await?;
    for i in 0..a.pods {
        send(
            &admin,
            Method::POST,
            &format!("/api/v1/namespaces/{NAMESPACE}/pods"),
            pod(i),
        )
        .await?;
    }
    wait_for(
        &admin,
        &format!("/api/v1/namespaces/{NAMESPACE}/pods?fieldSelector=spec.nodeName%3D{NODE}"),
        Duration::from_secs(180),
        |l| {
            l["items"].as_array().is_some_and(|items| {
                items.len() == a.pods && items.iter().all(|p| p["status"]["phase"] == "Running")
            })
        },
    )
    .await
    .context("the hollow node's pods are not Running")?;
    println!("{} pods Running on {NODE}; settling 10 s", a.pods);
    tokio::time::sleep(Duration::from_secs(10)).await;

    let (idle, _) = cpu_over(pid, a.duration, async { Ok(0) }).await?;
    println!("kubelet CPU, idle {} s: {:.4} cores", a.duration, idle);

    let (count, collection, prefix) = match a.write {
        Written::Services => (a.services, "services", "svc-"),
        Written::Pods => (a.pods, "pods", "hollow-pod-"),
    };
    if count == 0 {
        bail!("no {collection} to write");
    }
    let interval = Duration::from_secs_f64(1.0 / a.rate.max(0.001));
    let (busy, writes) = cpu_over(pid, a.duration, async {
        let mut tick = tokio::time::interval(interval);
        let end = Instant::now() + Duration::from_secs(a.duration);
        let mut n = 0u64;
        while Instant::now() < end {
            tick.tick().await;
            let i = n as usize % count;
            send(
                &admin,
                Method::PATCH,
                &format!("/api/v1/namespaces/{NAMESPACE}/{collection}/{prefix}{i}"),
                json!({"metadata": {"annotations": {"kcp-load/n": n.to_string()}}}),
            )
            .await?;
            n += 1;
        }
        Ok(n)
    })
    .await?;
    println!(
        "kubelet CPU, {writes} {collection} writes in {} s ({:.1}/s): {:.4} cores",
        a.duration,
        writes as f64 / a.duration as f64,
        busy
    );
    if writes > 0 {
        println!(
            "kubelet CPU per event over idle: {:.1} µs",
            (busy - idle).max(0.0) * a.duration as f64 / writes as f64 * 1e6
        );
    }
    drop(kubelet);
    let _ = stop.send(());
    Ok(())
}

/// Polls `path` until `ok` holds for its body.
async fn wait_for(
    client: &kube::Client,
    path: &str,
    timeout: Duration,
    ok: impl Fn(&Value) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let req = Request::builder().uri(path).body(Vec::new())?;
        if let Ok(v) = client.request::<Value>(req).await
            && ok(&v)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{path}: not as expected after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
