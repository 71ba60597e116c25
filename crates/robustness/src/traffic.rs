//! Steady writes: creates, updates and deletes of pods, services,
//! endpointslices and configmaps in the run's namespaces, and label
//! changes of the nodes without a kubelet, at a fixed rate, from a seeded
//! generator. Label changes move objects in and out of the watchers'
//! selectors; pods are bound to the run's nodes, so they move in and out
//! of each node's scope only by being created and deleted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::model::Resource;
use crate::topology::NAMESPACES;
use crate::watcher::Recording;

/// The label values writers pick from; watchers select on some.
pub const APPS: [&str; 3] = ["a", "b", "c"];

/// Objects per resource and namespace the writers keep between.
const MIN_OBJECTS: usize = 3;
const MAX_OBJECTS: usize = 15;

/// What the writers do.
#[derive(Debug, Clone)]
pub struct Traffic {
    /// Operations per second, over all resources.
    pub rate: f64,
    /// The nodes pods are bound to.
    pub nodes: Vec<String>,
    /// Nodes whose Node object the writers may relabel (no kubelet).
    pub relabel_nodes: Vec<String>,
    /// The first serial of the names it creates (a writer after an etcd
    /// restore starts past the names the restored world may hold).
    pub first_serial: u64,
}

/// Counts of what was written.
#[derive(Debug, Default, Clone)]
pub struct Written {
    pub ok: BTreeMap<String, u64>,
}

/// Writes until `stop`, with `rng` (seeded).
pub async fn run(
    traffic: Traffic,
    admin: Client,
    mut rng: fastrand::Rng,
    recording: Arc<Recording>,
    stop: CancellationToken,
) -> Written {
    let mut written = Written::default();
    let mut live: BTreeMap<(Resource, &str), Vec<String>> = BTreeMap::new();
    let mut serial = traffic.first_serial;
    let period = Duration::from_secs_f64(1.0 / traffic.rate.max(0.01));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let resources = [
        Resource::Pods,
        Resource::Pods,
        Resource::Services,
        Resource::EndpointSlices,
        Resource::EndpointSlices,
        Resource::ConfigMaps,
        Resource::ConfigMaps,
        Resource::Nodes,
    ];
    loop {
        tokio::select! {
            () = stop.cancelled() => return written,
            _ = tick.tick() => {}
        }
        let resource = resources[rng.usize(..resources.len())];
        if resource == Resource::Nodes {
            if traffic.relabel_nodes.is_empty() {
                continue;
            }
            let node = &traffic.relabel_nodes[rng.usize(..traffic.relabel_nodes.len())];
            let body = json!({"metadata": {"labels": {"app": APPS[rng.usize(..APPS.len())]}}});
            let path = format!("{}/{node}", Resource::Nodes.path(None));
            note(
                &recording,
                &mut written,
                "nodes update",
                patch(&admin, &path, &body).await,
            );
            continue;
        }
        let ns = NAMESPACES[rng.usize(..NAMESPACES.len())];
        let names = live.entry((resource, ns)).or_default();
        let op = if names.len() < MIN_OBJECTS {
            0
        } else if names.len() >= MAX_OBJECTS {
            2
        } else {
            match rng.u8(..10) {
                0..=2 => 0,
                3..=7 => 1,
                _ => 2,
            }
        };
        let collection = resource.path(Some(ns));
        match op {
            0 => {
                serial += 1;
                let name = format!("{}-{serial}", &resource.plural()[..3]);
                let body = object(resource, ns, &name, &traffic, &mut rng);
                let r = admin
                    .send(
                        Method::POST,
                        &collection,
                        Some(body.to_string().into_bytes()),
                        "application/json",
                        Duration::from_secs(10),
                    )
                    .await;
                if r.as_ref().is_ok_and(|r| r.status.as_u16() == 201) {
                    names.push(name);
                }
                note(
                    &recording,
                    &mut written,
                    &format!("{resource} create"),
                    r.map(|r| r.status.as_u16()),
                );
            }
            1 => {
                let name = names[rng.usize(..names.len())].clone();
                let body = change(resource, &mut rng);
                let r = patch(&admin, &format!("{collection}/{name}"), &body).await;
                if r.as_ref().is_ok_and(|s| *s == 404) {
                    names.retain(|n| *n != name);
                }
                note(&recording, &mut written, &format!("{resource} update"), r);
            }
            _ => {
                let i = rng.usize(..names.len());
                let name = names[i].clone();
                let r = admin
                    .send(
                        Method::DELETE,
                        &format!("{collection}/{name}?gracePeriodSeconds=0"),
                        None,
                        "",
                        Duration::from_secs(10),
                    )
                    .await
                    .map(|r| r.status.as_u16());
                if r.as_ref().is_ok_and(|s| *s == 200 || *s == 404) {
                    names.retain(|n| *n != name);
                }
                note(&recording, &mut written, &format!("{resource} delete"), r);
            }
        }
    }
}

fn note(recording: &Recording, written: &mut Written, what: &str, r: anyhow::Result<u16>) {
    match r {
        Ok(s) if (200..300).contains(&s) => *written.ok.entry(what.to_string()).or_default() += 1,
        Ok(s) => recording.failed(format!("write: {what}: {s}")),
        Err(e) => recording.failed(format!(
            "write: {what}: {}",
            e.to_string().chars().take(60).collect::<String>()
        )),
    }
}

async fn patch(admin: &Client, path: &str, body: &Value) -> anyhow::Result<u16> {
    admin
        .send(
            Method::PATCH,
            path,
            Some(body.to_string().into_bytes()),
            "application/merge-patch+json",
            Duration::from_secs(10),
        )
        .await
        .map(|r| r.status.as_u16())
}

fn app(rng: &mut fastrand::Rng) -> &'static str {
    APPS[rng.usize(..APPS.len())]
}

/// A new object.
fn object(resource: Resource, ns: &str, name: &str, t: &Traffic, rng: &mut fastrand::Rng) -> Value {
    let labels = json!({"app": app(rng), "kcp-robustness": "true"});
    match resource {
        Resource::Pods => json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "nodeName": t.nodes[rng.usize(..t.nodes.len())],
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]
            }
        }),
        Resource::Services => json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}], "selector": {"app": app(rng)}}
        }),
        Resource::EndpointSlices => json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"app": app(rng), "kubernetes.io/service-name": format!("ser-{}", rng.u8(1..10))}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [format!("10.1.{}.{}", rng.u8(0..255), rng.u8(1..255))]}],
            "ports": [{"port": 80, "protocol": "TCP"}]
        }),
        Resource::ConfigMaps => json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "data": {"v": rng.u32(..).to_string()}
        }),
        Resource::Nodes => json!({}),
    }
}

/// A merge patch: a label change (half the time), or some content.
fn change(resource: Resource, rng: &mut fastrand::Rng) -> Value {
    if rng.bool() {
        return json!({"metadata": {"labels": {"app": app(rng)}}});
    }
    match resource {
        Resource::Pods | Resource::Services => {
            json!({"metadata": {"annotations": {"kcp-robustness/tick": rng.u32(..).to_string()}}})
        }
        Resource::EndpointSlices => json!({
            "endpoints": [{"addresses": [format!("10.1.{}.{}", rng.u8(0..255), rng.u8(1..255))]}]
        }),
        Resource::ConfigMaps => json!({"data": {"v": rng.u32(..).to_string()}}),
        Resource::Nodes => json!({}),
    }
}
