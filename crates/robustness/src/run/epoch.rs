//! An epoch: a span of the run between etcd restores, with its own
//! reference (etcd's history from the epoch's start), watchers, readers
//! and writer. A restore ends one (its clients stop, as the documented
//! procedure restarts every component), restores etcd, waits until every
//! proxy serves the restored world, and starts the next: each epoch is
//! validated against its own history, and the next epoch's first lists
//! through the proxies against the restored world (a proxy serving an
//! object version from before the restore would fail `initial state`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::model::Resource;
use crate::reference::Reference;
use crate::topology::{Topology, node_of};
use crate::traffic::{self, Traffic, Written};
use crate::watcher::{self, Recording, WatcherSpec};

use super::setup::Options;
use super::sources::record;

/// A running epoch.
pub(super) struct Epoch {
    pub index: u64,
    pub reference: Arc<std::sync::Mutex<Reference>>,
    pub recording: Arc<Recording>,
    pub stalls: Vec<(String, watch::Sender<bool>)>,
    stop_reference: CancellationToken,
    recorder: JoinHandle<()>,
    stop_clients: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    stop_writes: CancellationToken,
    writer: Option<JoinHandle<Written>>,
    written: Written,
}

/// What an ended epoch leaves to validate.
pub(super) struct Ended {
    pub index: u64,
    pub reference: Reference,
    pub recording: Arc<Recording>,
    pub written: Written,
}

impl Epoch {
    /// Records etcd's state now and every change from here, and starts the
    /// watchers of `specs`, a reader per node proxy and the writer.
    pub async fn start(
        topo: &Topology,
        specs: &[WatcherSpec],
        opts: &Options,
        index: u64,
    ) -> Result<Epoch> {
        let start_rev = topo.etcd.revision().await?;
        let mut base = Vec::new();
        for r in Resource::ALL {
            for kv in topo.etcd.range_prefix(r.etcd_prefix(), start_rev).await? {
                if let Some((resource, key)) = Resource::of_etcd_key(&kv.key)
                    && let Some(v) = crate::etcd::object_value(&kv.value)
                {
                    base.push((resource, key, kv.mod_revision, v));
                }
            }
        }
        let reference = Arc::new(std::sync::Mutex::new(Reference::new(start_rev, base)));
        let stop_reference = CancellationToken::new();
        let recorder = tokio::spawn(record(
            topo.etcd.clone(),
            reference.clone(),
            start_rev,
            stop_reference.clone(),
        ));

        let recording = Recording::new();
        let stop_clients = CancellationToken::new();
        let mut stalls = Vec::new();
        let mut tasks = Vec::new();
        for spec in specs.iter().cloned() {
            let (tx, rx) = watch::channel(false);
            stalls.push((spec.name.clone(), tx));
            tasks.push(tokio::spawn(watcher::run(
                spec,
                recording.clone(),
                stop_clients.clone(),
                rx,
            )));
        }
        for p in &topo.nodes {
            tasks.push(tokio::spawn(watcher::reader(
                format!("{}/reader", p.name),
                p.name.clone(),
                topo.client_of(p, true, true)?,
                Resource::Services,
                Duration::from_millis(500),
                recording.clone(),
                stop_clients.clone(),
            )));
        }
        let stop_writes = CancellationToken::new();
        let nodes: Vec<String> = topo.nodes.iter().map(|p| node_of(p).to_string()).collect();
        let writer = tokio::spawn(traffic::run(
            Traffic {
                rate: opts.rate,
                relabel_nodes: nodes
                    .iter()
                    .filter(|n| !topo.kubelet_nodes.contains(n))
                    .cloned()
                    .collect(),
                nodes,
                first_serial: index * 1_000_000,
            },
            topo.admin.clone(),
            fastrand::Rng::with_seed(opts.seed ^ 0x5eed ^ index),
            recording.clone(),
            stop_writes.clone(),
        ));
        Ok(Epoch {
            index,
            reference,
            recording,
            stalls,
            stop_reference,
            recorder,
            stop_clients,
            tasks,
            stop_writes,
            writer: Some(writer),
            written: Written::default(),
        })
    }

    /// Stops the writer; what it wrote.
    pub async fn stop_writes(&mut self) -> Written {
        self.stop_writes.cancel();
        if let Some(writer) = self.writer.take() {
            self.written = writer.await.unwrap_or_default();
        }
        self.written.clone()
    }

    /// Stops the writer, the clients and the reference; what is left to
    /// validate.
    pub async fn end(mut self) -> Result<Ended> {
        let written = self.stop_writes().await;
        self.stop_clients.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        self.stop_reference.cancel();
        let _ = self.recorder.await;
        drop(self.stalls);
        let reference = Arc::try_unwrap(self.reference)
            .map_err(|_| anyhow!("the reference is still shared"))?
            .into_inner()
            .map_err(|_| anyhow!("the reference lock is poisoned"))?;
        Ok(Ended {
            index: self.index,
            reference,
            recording: self.recording,
            written,
        })
    }
}

/// Waits until every proxy serves the world the apiserver serves (the
/// run's writes stopped): ready (`/readyz`: every cache's upstream watch
/// open), and a `resourceVersion=0` list of services, of its node's pods
/// and of its Node through each node proxy, and of services and the ConfigMaps the
/// token watchers read through each tier replica, equal by name and
/// resourceVersion to a consistent list from the apiserver. Returns how
/// long it took, per proxy.
pub(super) async fn wait_served(
    topo: &Topology,
    timeout: Duration,
) -> Result<Vec<(String, Duration)>> {
    let started = Instant::now();
    let mut lists: Vec<(String, crate::client::Client, String)> = Vec::new();
    for p in topo.proxies() {
        crate::topology::wait_ready(p, timeout.saturating_sub(started.elapsed())).await?;
        let as_node = matches!(p.role, crate::topology::Role::Node { .. });
        let client = topo.client_of(p, as_node, true)?;
        lists.push((p.name.clone(), client.clone(), "/api/v1/services".into()));
        if !as_node {
            lists.push((
                p.name.clone(),
                client.clone(),
                "/api/v1/namespaces/rb-0/configmaps".into(),
            ));
        }
        if as_node {
            lists.push((
                p.name.clone(),
                client.clone(),
                format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{}", node_of(p)),
            ));
            // Its own Node: that watch may resume later than the others
            // after a restore (restarted 1.35 apiservers refused it for
            // 24 s: docs/reliability.md, finding 10).
            lists.push((
                p.name.clone(),
                client,
                format!("/api/v1/nodes?fieldSelector=metadata.name%3D{}", node_of(p)),
            ));
        }
    }
    let mut took: Vec<(String, Duration)> = Vec::new();
    for (name, client, path) in lists {
        loop {
            // The apiserver's own view may move too (its controllers).
            let want = names_and_rvs(&topo.admin, &path).await;
            let sep = if path.contains('?') { '&' } else { '?' };
            let got = names_and_rvs(&client, &format!("{path}{sep}resourceVersion=0")).await;
            if got.is_some() && got == want {
                break;
            }
            if started.elapsed() > timeout {
                let want = names_and_rvs(&topo.admin, &path).await;
                return Err(anyhow!(
                    "{name} does not serve the restored world after {timeout:?}: {path}: it serves {got:?}, the apiserver {want:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match took.iter_mut().find(|(n, _)| *n == name) {
            Some((_, d)) => *d = started.elapsed(),
            None => took.push((name, started.elapsed())),
        }
    }
    Ok(took)
}

/// The names and resourceVersions of a list's items.
async fn names_and_rvs(
    client: &crate::client::Client,
    path: &str,
) -> Option<Vec<(String, String, String)>> {
    let r = client.get(path, None, Duration::from_secs(10)).await.ok()?;
    if r.status.as_u16() != 200 {
        return None;
    }
    let v = r.json();
    let mut out: Vec<(String, String, String)> = v["items"]
        .as_array()?
        .iter()
        .map(|i| {
            let m = &i["metadata"];
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
            (s("namespace"), s("name"), s("resourceVersion"))
        })
        .collect();
    out.sort();
    Some(out)
}
