//! Writers: creates, then updates with PUT, of configmaps, secrets, leases
//! or realistic pods, nodes and endpointslices at a rate, each carrying
//! its write time in the `kcp-load/sent-unix-nanos` annotation.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::client::{Proto, Target};
use crate::fixtures;
use crate::stats::{micros, unix_nanos};

/// The annotation carrying a write's wall-clock time (Unix nanoseconds).
const SENT_ANNOTATION: &str = "kcp-load/sent-unix-nanos";
/// The label on every object the writers create.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by=kcp-load";

#[derive(Debug, Default)]
pub struct WriteOut {
    pub ok: u64,
    pub errors: u64,
    pub last_error: Option<String>,
    pub latencies: Vec<u32>,
}

/// The body of a write: a configmap or secret with `payload`, or a pod,
/// node or endpointslice shaped like the apiserver's (`fixtures`), with
/// kcp-load's name, label and write-time annotation.
pub fn object_body(kind: &str, api_version: &str, ns: &str, name: &str, payload: &str) -> Bytes {
    let realistic = match kind {
        "Pod" => Some(fixtures::pod(0, ns, &fixtures::node(0), 1)),
        "Node" => Some(fixtures::node_object(0, 20, 1)),
        "EndpointSlice" => Some(fixtures::endpoint_slice(0, ns, 10, 1)),
        _ => None,
    };
    if let Some(mut o) = realistic.and_then(|j| serde_json::from_str::<Value>(&j).ok()) {
        let mut metadata = json!({
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "kcp-load"},
            "annotations": {SENT_ANNOTATION: unix_nanos().to_string()},
        });
        if kind != "Node" {
            metadata["namespace"] = json!(ns);
        }
        o["metadata"] = metadata;
        return Bytes::from(serde_json::to_vec(&o).unwrap_or_default());
    }
    let mut o = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {"app.kubernetes.io/managed-by": "kcp-load"},
            "annotations": {SENT_ANNOTATION: unix_nanos().to_string()},
        },
    });
    if let Some(m) = o.as_object_mut() {
        match kind {
            "ConfigMap" | "Secret" if !payload.is_empty() => {
                m.insert("data".into(), json!({ "payload": payload }));
            }
            "Lease" => {
                m.insert(
                    "spec".into(),
                    json!({"holderIdentity": name, "leaseDurationSeconds": 40}),
                );
            }
            _ => {}
        }
    }
    Bytes::from(serde_json::to_vec(&o).unwrap_or_default())
}

/// `metadata.resourceVersion` of a JSON object.
pub fn resource_version_of(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(body)
        .ok()?
        .pointer("/metadata/resourceVersion")?
        .as_str()
        .map(str::to_string)
}

/// `body` (a JSON object) with `metadata.resourceVersion` set to `rv`.
pub fn with_resource_version(body: &Bytes, rv: &str) -> Bytes {
    match serde_json::from_slice::<Value>(body) {
        Ok(mut o) => {
            if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                m.insert("resourceVersion".into(), rv.into());
            }
            serde_json::to_vec(&o)
                .map(Bytes::from)
                .unwrap_or_else(|_| body.clone())
        }
        Err(_) => body.clone(),
    }
}

pub struct WriterPlan {
    pub kind: String,
    pub api_version: String,
    pub namespace: String,
    pub collection: String,
    pub names: Vec<String>,
    pub payload: String,
    pub interval: Duration,
    pub end: Instant,
    /// Stops the writer before `end`.
    pub stop: CancellationToken,
}

pub async fn writer(target: Target, proto: Proto, plan: WriterPlan) -> WriteOut {
    let mut out = WriteOut::default();
    let mut conn = match target.connect(proto).await {
        Ok(c) => c,
        Err(e) => {
            out.errors += 1;
            out.last_error = Some(format!("{e:#}"));
            return out;
        }
    };
    let mut created = vec![false; plan.names.len()];
    // Each object's last resourceVersion: an update of a Lease must carry
    // one (`metadata.resourceVersion: must be specified for an update`).
    let mut rvs: Vec<Option<String>> = vec![None; plan.names.len()];
    let mut next = tokio::time::Instant::now();
    let mut i = 0usize;
    while Instant::now() < plan.end {
        tokio::select! {
            _ = plan.stop.cancelled() => break,
            _ = tokio::time::sleep_until(next) => {}
        }
        // Keep the rate, but do not burst to catch up after a stall.
        next = (next + plan.interval).max(tokio::time::Instant::now());
        let k = i % plan.names.len();
        i += 1;
        let name = &plan.names[k];
        let (method, path) = if created[k] {
            (Method::PUT, format!("{}/{name}", plan.collection))
        } else {
            (Method::POST, plan.collection.clone())
        };
        let mut body = object_body(
            &plan.kind,
            &plan.api_version,
            &plan.namespace,
            name,
            &plan.payload,
        );
        if let (true, Some(rv)) = (created[k], &rvs[k]) {
            body = with_resource_version(&body, rv);
        }
        let start = Instant::now();
        match target.fetch(&mut conn, method, &path, Some(body)).await {
            Ok(r) if r.status.is_success() => {
                out.ok += 1;
                out.latencies.push(micros(start.elapsed()));
                created[k] = true;
                rvs[k] = resource_version_of(&r.body);
            }
            Ok(r) if r.status == StatusCode::CONFLICT => {
                // Left over from an earlier run, or written meanwhile:
                // update it from its current resourceVersion.
                if created[k] {
                    out.errors += 1;
                    out.last_error =
                        Some(format!("{} {}", r.status, String::from_utf8_lossy(&r.body)));
                }
                created[k] = true;
                let current = target
                    .fetch(
                        &mut conn,
                        Method::GET,
                        &format!("{}/{name}", plan.collection),
                        None,
                    )
                    .await;
                rvs[k] = current.ok().and_then(|r| resource_version_of(&r.body));
            }
            Ok(r) => {
                out.errors += 1;
                out.last_error = Some(format!("{} {}", r.status, String::from_utf8_lossy(&r.body)));
            }
            Err(e) => {
                out.errors += 1;
                out.last_error = Some(format!("{e:#}"));
                match target.connect(proto).await {
                    Ok(c) => conn = c,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::watchers::sent_at;

    #[test]
    fn updates_carry_the_last_resource_version() {
        let body = object_body("Lease", "coordination.k8s.io/v1", "default", "l", "");
        assert_eq!(resource_version_of(&body), None);
        let updated = with_resource_version(&body, "42");
        assert_eq!(resource_version_of(&updated).as_deref(), Some("42"));
        let v: Value = serde_json::from_slice(&updated).unwrap();
        assert_eq!(v["spec"]["holderIdentity"], "l");
        assert!(sent_at(&updated).is_some());
    }
}
