//! What a run is asked to do ([`Options`]), and the recording watchers it
//! starts: per node proxy, kubelet's, controllers', kube-proxy's and an
//! agent's watches in every encoding; two straight to the apiserver.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;

use crate::faults::FaultKind;
use crate::model::{Filter, Requirement, Resource};
use crate::topology::{Shape, Topology, node_of};
use crate::watcher::{Encoding, Mode, WatcherSpec};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seeds the fault schedule, the targets and the writes.
    pub seed: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// The kube-cache-proxy binary.
    pub proxy_bin: PathBuf,
    pub shape: Shape,
    /// Writes per second.
    pub rate: f64,
    /// Seconds between the end of one fault and the start of the next
    /// (drawn uniformly in the range).
    pub gap: (f64, f64),
    /// The faults drawn from.
    pub faults: Vec<FaultKind>,
    /// Where files and logs go (kept after a failed run).
    pub dir: Option<PathBuf>,
    /// How long the snapshot directory stays full, in seconds (drawn in
    /// the range): past the proxy's 60 s snapshot interval, a periodic
    /// write fails too; the takeover that follows always writes.
    pub dir_full: (f64, f64),
}

impl Options {
    /// The short run's defaults: a few minutes, every fault kind.
    pub fn short(proxy_bin: &Path) -> Options {
        Options {
            seed: 1,
            duration: Duration::from_secs(150),
            proxy_bin: proxy_bin.to_path_buf(),
            shape: Shape {
                apiservers: 3,
                etcd_members: 3,
                mixed_versions: true,
                direct_nodes: 2,
                tier_nodes: 2,
                tier_replicas: 2,
                kubelets: 2,
            },
            rate: 8.0,
            gap: (1.0, 4.0),
            faults: FaultKind::ALL.to_vec(),
            dir: None,
            dir_full: (5.0, 10.0),
        }
    }
}

/// The watchers of one node proxy, and a couple straight to the apiserver.
pub(super) fn watcher_specs(topo: &Topology) -> Result<Vec<WatcherSpec>> {
    let mut specs = Vec::new();
    let eq = |k: &str, v: &str| Requirement::Equals(k.to_string(), v.to_string());
    for p in &topo.nodes {
        let node = node_of(p).to_string();
        let on_node = vec![eq("spec.nodeName", &node)];
        let mut add = |kind: &str,
                       encoding: Encoding,
                       mode: Mode,
                       h2: bool,
                       as_node: bool,
                       filter: Filter|
         -> Result<()> {
            specs.push(WatcherSpec {
                name: format!("{}/{kind}", p.name),
                target: p.name.clone(),
                client: topo.client_of(p, as_node, h2)?,
                encoding,
                mode,
                filter,
            });
            Ok(())
        };
        let pods = |labels: Vec<Requirement>| Filter {
            resource: Resource::Pods,
            namespace: None,
            labels,
            fields: on_node.clone(),
        };
        // kubelet's watch, in each representation and way of starting.
        add(
            "pods-json",
            Encoding::Json,
            Mode::ListWatch,
            false,
            true,
            pods(vec![]),
        )?;
        add(
            "pods-protobuf",
            Encoding::Protobuf,
            Mode::ListWatch,
            true,
            true,
            pods(vec![]),
        )?;
        add(
            "pods-streaming",
            Encoding::Json,
            Mode::StreamingList,
            true,
            true,
            pods(vec![]),
        )?;
        add(
            "pods-websocket",
            Encoding::WebSocket,
            Mode::ListWatch,
            false,
            true,
            pods(vec![]),
        )?;
        // Label selectors, as controllers' informers use, within the node.
        add(
            "pods-app-a",
            Encoding::Json,
            Mode::ListWatch,
            true,
            true,
            pods(vec![eq("app", "a")]),
        )?;
        // kube-proxy's: services and endpointslices, cluster-wide.
        add(
            "services-metadata",
            Encoding::Metadata,
            Mode::ListWatch,
            true,
            true,
            Filter {
                labels: vec![Requirement::In("app".into(), vec!["a".into(), "b".into()])],
                ..Filter::all(Resource::Services)
            },
        )?;
        add(
            "endpointslices-protobuf",
            Encoding::Protobuf,
            Mode::StreamingList,
            true,
            true,
            Filter {
                labels: vec![Requirement::NotEquals("app".into(), "c".into())],
                ..Filter::all(Resource::EndpointSlices)
            },
        )?;
        // Its own Node, by name.
        add(
            "node",
            Encoding::Json,
            Mode::ListWatch,
            true,
            true,
            Filter {
                fields: vec![eq("metadata.name", &node)],
                ..Filter::all(Resource::Nodes)
            },
        )?;
        // An agent with a token: configmaps of one namespace by label
        // (passed through by a node proxy, cached by the tier).
        add(
            "configmaps-token",
            Encoding::Json,
            Mode::ListWatch,
            false,
            false,
            Filter {
                namespace: Some(crate::topology::NAMESPACES[0].to_string()),
                labels: vec![eq("app", "b")],
                ..Filter::all(Resource::ConfigMaps)
            },
        )?;
    }
    // Controls: the apiserver itself, so the validators are checked too.
    for (kind, filter) in [
        ("pods", Filter::all(Resource::Pods)),
        ("configmaps", Filter::all(Resource::ConfigMaps)),
    ] {
        specs.push(WatcherSpec {
            name: format!("apiserver/{kind}"),
            target: "apiserver".into(),
            client: topo.direct_reader(true)?,
            encoding: Encoding::Json,
            mode: Mode::ListWatch,
            filter,
        });
    }
    Ok(specs)
}
