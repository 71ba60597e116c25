//! `kube-cache-proxy demo`: the simulated apiserver with sample objects
//! and the proxy in front of it, on this machine, with a kubeconfig and
//! curl lines printed to reach it. No cluster needed.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::DemoArgs;
use crate::config::{CachedResource, Config};
use crate::pki::Ca;
use crate::resource::Gvr;
use crate::{Listeners, RunError, kubeconfig};
use kube_apiserver_sim::{Sim, SimConfig};

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("generating certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    #[error("{0}")]
    Run(#[from] RunError),
    #[error("creating sample objects: {0}")]
    Objects(String),
}

fn gvr(group: &str, version: &str, resource: &str) -> Gvr {
    Gvr {
        group: group.into(),
        version: version.into(),
        resource: resource.into(),
    }
}

/// Sample objects: namespaces, nodes, pods spread over the nodes, services,
/// endpoint slices, config maps, a runtime class and a CSI driver.
fn sample_objects() -> Vec<(Gvr, Value)> {
    let mut out = Vec::new();
    for ns in ["default", "kube-system", "demo"] {
        out.push((gvr("", "v1", "namespaces"), json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}, "status": {"phase": "Active"}})));
    }
    for n in 1..=3 {
        out.push((gvr("", "v1", "nodes"), json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("node-{n}"), "labels": {"kubernetes.io/hostname": format!("node-{n}")}}, "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})));
    }
    for i in 0..12 {
        let node = format!("node-{}", i % 3 + 1);
        let ns = if i < 3 { "kube-system" } else { "demo" };
        out.push((gvr("", "v1", "pods"), json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("app-{i}"), "namespace": ns, "labels": {"app": if i % 2 == 0 { "web" } else { "db" }}}, "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}, "status": {"phase": "Running"}})));
    }
    for name in ["web", "db"] {
        out.push((gvr("", "v1", "services"), json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "demo"}, "spec": {"selector": {"app": name}, "ports": [{"port": 80}], "type": "ClusterIP"}})));
        out.push((gvr("discovery.k8s.io", "v1", "endpointslices"), json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": format!("{name}-1"), "namespace": "demo", "labels": {"kubernetes.io/service-name": name}}, "addressType": "IPv4", "endpoints": [], "ports": [{"port": 80}]})));
    }
    for i in 0..10 {
        out.push((gvr("", "v1", "configmaps"), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("settings-{i}"), "namespace": "demo", "labels": {"tier": if i < 5 { "frontend" } else { "backend" }}}, "data": {"index": i.to_string()}})));
    }
    out.push((gvr("", "v1", "configmaps"), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "heartbeat", "namespace": "demo"}, "data": {"tick": "0"}})));
    out.push((gvr("node.k8s.io", "v1", "runtimeclasses"), json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "runc"}, "handler": "runc"})));
    out.push((gvr("storage.k8s.io", "v1", "csidrivers"), json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "hostpath.csi.k8s.io"}, "spec": {}})));
    out
}

/// Runs the demo until `shutdown`.
///
/// # Errors
/// [`DemoError`] when a port is taken or files cannot be written.
pub async fn run(
    args: DemoArgs,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), DemoError> {
    let sim = Sim::start(SimConfig::default()).await?;
    for (gvr, object) in sample_objects() {
        sim.create(&gvr, object)
            .map_err(|s| DemoError::Objects(s.message))?;
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("kube-cache-proxy-demo"));
    std::fs::create_dir_all(&dir)?;
    let write = |name: &str, text: &str| -> std::io::Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    };

    // The proxy serves its own certificate and trusts the simulated
    // cluster's CA for client certificates, like a real deployment.
    let proxy_ca = Ca::new("kube-cache-proxy-demo-ca")?;
    let serving = proxy_ca.issue_server(
        &["localhost"],
        &["127.0.0.1"
            .parse()
            .map_err(|e| DemoError::Objects(format!("{e}")))?],
    )?;
    let admin = sim.issue_client("admin", Some("system:masters"));
    let ca_path = write("ca.crt", &proxy_ca.cert_pem())?;
    let admin_crt = write("admin.crt", &admin.cert_pem)?;
    let admin_key = write("admin.key", &admin.key_pem)?;

    let mut config = Config {
        listen: args.listen.clone(),
        admin_listen: args.admin_listen.clone(),
        ..Config::default()
    };
    config.tls.cert_file = Some(write("tls.crt", &serving.cert_pem)?);
    config.tls.private_key_file = Some(write("tls.key", &serving.key_pem)?);
    config.tls.client_ca_file = Some(write("client-ca.crt", &sim.ca_pem())?);
    config.upstream.kubeconfig = Some(write(
        "upstream.kubeconfig",
        &sim.kubeconfig(&SimConfig::default().proxy_user, None),
    )?);
    config.cache.resources.push(CachedResource {
        version: "v1".into(),
        resource: "configmaps".into(),
        ..CachedResource::default()
    });
    config.validate().map_err(RunError::Config)?;
    let listeners = Listeners::bind(&config).await?;
    let proxy_url = format!("https://{}", listeners.api.local_addr()?);
    let admin_url = format!("http://{}", listeners.admin.local_addr()?);
    let kubeconfig_path = write(
        "kubeconfig",
        &kubeconfig::with_certificate(
            &proxy_url,
            &proxy_ca.cert_pem(),
            "admin",
            &admin.cert_pem,
            &admin.key_pem,
        ),
    )?;

    println!(
        "kube-cache-proxy demo\n\
         \n  simulated kube-apiserver  {sim_url}  (sample namespaces, nodes, pods, services, configmaps...)\
         \n  kube-cache-proxy          {proxy_url}\
         \n  metrics and health        {admin_url}/metrics  {admin_url}/readyz?verbose\
         \n\nTry:\
         \n  export KUBECONFIG={kc}\
         \n  kubectl get configmaps -A\
         \n  kubectl get pods -A -w\
         \n  kubectl get --raw '/api/v1/namespaces/demo/configmaps?watch=1&resourceVersion=0'\
         \n  curl --cacert {ca} --cert {crt} --key {key} '{proxy_url}/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1'\
         \n  curl -s {admin_url}/metrics | grep kube_cache_proxy_cache_reads_total\
         \n\nThe configmap demo/heartbeat changes every 2 s. Ctrl-C stops the demo.",
        sim_url = sim.url(),
        kc = kubeconfig_path.display(),
        ca = ca_path.display(),
        crt = admin_crt.display(),
        key = admin_key.display(),
    );

    let heartbeat = tokio::spawn(async move {
        let cms = gvr("", "v1", "configmaps");
        let mut tick: u64 = 0;
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            tick += 1;
            if let Some(mut cm) = sim.get(&cms, "demo", "heartbeat") {
                cm["data"]["tick"] = json!(tick.to_string());
                if let Some(meta) = cm.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("resourceVersion");
                }
                let _ = sim.update(&cms, cm);
            }
        }
    });
    let result = crate::run(listeners, config, shutdown).await;
    heartbeat.abort();
    result.map_err(DemoError::from)
}
