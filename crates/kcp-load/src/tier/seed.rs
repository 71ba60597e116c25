//! The seeded objects (Nodes, each with a pod mounting its own ConfigMap
//! and Secret; Services and EndpointSlices), the RBAC manifests applied,
//! and the steady phase's patches.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::nodes::Shared;
use super::wire::ListMeta;
use crate::client::{Conn, Proto, Target};

/// Where the seeded objects live.
pub const NAMESPACE: &str = "kcp-tier";

pub fn node_name(i: usize) -> String {
    format!("sim-node-{i:05}")
}

/// The ConfigMap or Secret node `i`'s pod mounts.
pub fn object_name(kind: &str, i: usize) -> String {
    let prefix = if kind == "configmaps" { "cm" } else { "sec" };
    format!("{prefix}-{i:05}")
}

/// The seeded objects, in creation order: collection path and body.
pub fn seed_objects(nodes: usize, services: usize) -> Vec<(String, Value)> {
    let ns = NAMESPACE;
    let mut out = vec![
        (
            "/api/v1/namespaces".to_string(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        ),
        (
            format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        ),
    ];
    for i in 0..services {
        let name = format!("svc-{i:03}");
        out.push((
            format!("/api/v1/namespaces/{ns}/services"),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                   "spec": {"selector": {"app": name},
                            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
        ));
        out.push((
            format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": format!("{name}-0"),
                                "labels": {"kubernetes.io/service-name": name}},
                   "addressType": "IPv4",
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
                   "endpoints": [{"addresses": [format!("10.1.{}.{}", i / 250, i % 250 + 1)],
                                  "conditions": {"ready": true}}]}),
        ));
    }
    for i in 0..nodes {
        let node = node_name(i);
        let (cm, sec) = (object_name("configmaps", i), object_name("secrets", i));
        out.push((
            "/api/v1/nodes".to_string(),
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}),
        ));
        out.push((
            format!("/api/v1/namespaces/{ns}/configmaps"),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm},
                   "data": {"config": "x".repeat(200)}}),
        ));
        out.push((
            format!("/api/v1/namespaces/{ns}/secrets"),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": sec},
                   "stringData": {"token": "y".repeat(64)}}),
        ));
        out.push((
            format!("/api/v1/namespaces/{ns}/pods"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("pod-{i:05}")},
                   "spec": {"nodeName": node, "automountServiceAccountToken": false,
                            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                            "volumes": [{"name": "cfg", "configMap": {"name": cm}},
                                        {"name": "sec", "secret": {"secretName": sec}}]}}),
        ));
    }
    out
}

/// Creates the seeded objects, 32 at a time (the first two, the
/// namespace and its ServiceAccount, first).
pub async fn seed(admin: &Target, nodes: usize, services: usize) -> Result<()> {
    let started = Instant::now();
    let mut objects = seed_objects(nodes, services);
    let rest = objects.split_off(2);
    for (path, body) in &objects {
        create(admin, &mut admin.connect(Proto::H1).await?, path, body).await?;
    }
    let n = rest.len();
    let rest = Arc::new(rest);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (admin, rest, next) = (admin.clone(), rest.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = admin.connect(Proto::H2).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((path, body)) = rest.get(i) else {
                    return Ok::<_, anyhow::Error>(());
                };
                create(&admin, &mut conn, path, body).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    println!(
        "seed: {} objects ({nodes} nodes, each with a pod, a ConfigMap and a Secret; {services} \
         Services and EndpointSlices) in {:.1}s",
        n + 2,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub async fn create(target: &Target, conn: &mut Conn, path: &str, body: &Value) -> Result<()> {
    let body = Bytes::from(serde_json::to_vec(body)?);
    let r = target.fetch(conn, Method::POST, path, Some(body)).await?;
    match r.status {
        StatusCode::CREATED | StatusCode::OK | StatusCode::CONFLICT => Ok(()),
        s => bail!("POST {path}: {s} {}", String::from_utf8_lossy(&r.body)),
    }
}

/// Creates the objects of a manifest, the namespaced ones in kube-system
/// (as the manifests' kustomizations do).
pub async fn apply(admin: &Target, manifest: &str) -> Result<()> {
    let mut conn = admin.connect(Proto::H1).await?;
    for o in kube_testenv::manifest::objects(manifest, "kube-system")? {
        create(admin, &mut conn, &o.collection, &o.body).await?;
    }
    Ok(())
}

/// The patch of object `i` of `kind` (an annotation, or a pod's status
/// condition) to `n`: path and merge-patch body.
fn patch_request(kind: &str, i: usize, n: u64) -> (String, Value) {
    let ns = NAMESPACE;
    match kind {
        "services" => (
            format!("/api/v1/namespaces/{ns}/services/svc-{i:03}"),
            json!({"metadata": {"annotations": {"kcp-load/tick": n.to_string()}}}),
        ),
        "endpointslices" => (
            format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/svc-{i:03}-0"),
            json!({"metadata": {"annotations": {"kcp-load/tick": n.to_string()}}}),
        ),
        _ => (
            format!("/api/v1/namespaces/{ns}/pods/pod-{i:05}/status"),
            json!({"status": {"conditions": [{"type": "kcp-load.io/tick", "status": "True",
                                              "message": n.to_string()}]}}),
        ),
    }
}

/// Patches object `i` of `kind` on a new connection; returns its new
/// resourceVersion.
pub async fn patch(admin: &Target, kind: &str, i: usize, n: u64) -> Result<u64> {
    let (path, body) = patch_request(kind, i, n);
    let mut conn = admin.connect(Proto::H1).await?;
    patch_on(admin, &mut conn, &path, &body).await
}

async fn patch_on(admin: &Target, conn: &mut Conn, path: &str, body: &Value) -> Result<u64> {
    let mut req = admin.request(
        conn,
        Method::PATCH,
        path,
        Some(Bytes::from(serde_json::to_vec(body)?)),
    )?;
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/merge-patch+json"),
    );
    let resp = conn.send(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if status != StatusCode::OK {
        bail!("PATCH {path}: {status} {}", String::from_utf8_lossy(&body));
    }
    let v: ListMeta = serde_json::from_slice(&body)?;
    v.metadata
        .resource_version
        .parse()
        .map_err(|_| anyhow!("PATCH {path}: no resourceVersion"))
}

/// Patches `kind` objects round-robin at `rate` per second until `stop`;
/// returns how many it made.
pub async fn writer(
    admin: Target,
    kind: &'static str,
    rate: f64,
    objects: usize,
    stop: CancellationToken,
    shared: Arc<Shared>,
) -> Result<u64> {
    let mut conn = admin.connect(Proto::H2).await?;
    let started = tokio::time::Instant::now();
    let mut n: u64 = 0;
    loop {
        let due = started + Duration::from_secs_f64(n as f64 / rate);
        tokio::select! {
            () = stop.cancelled() => return Ok(n),
            () = tokio::time::sleep_until(due) => {}
        }
        let (path, body) = patch_request(kind, (n as usize) % objects.max(1), n);
        let sent = Instant::now();
        let rv = patch_on(&admin, &mut conn, &path, &body)
            .await
            .with_context(|| format!("writing {kind}"))?;
        // Cluster-wide: every node gets its event.
        if kind != "pods"
            && let Ok(mut m) = shared.written.lock()
        {
            m.insert(rv, sent);
        }
        if kind == "services"
            && let Ok(mut s) = shared.services_written.lock()
        {
            s.push(rv);
        }
        n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_a_pod_per_node_mounting_its_own_objects() {
        let objects = seed_objects(3, 2);
        assert_eq!(objects.len(), 2 + 2 * 2 + 3 * 4);
        let pods: Vec<&Value> = objects
            .iter()
            .filter(|(p, _)| p.ends_with("/pods"))
            .map(|(_, v)| v)
            .collect();
        assert_eq!(pods.len(), 3);
        assert_eq!(pods[1]["spec"]["nodeName"], "sim-node-00001");
        assert_eq!(
            pods[1]["spec"]["volumes"][0]["configMap"]["name"],
            "cm-00001"
        );
        assert_eq!(
            pods[1]["spec"]["volumes"][1]["secret"]["secretName"],
            "sec-00001"
        );
    }
}
