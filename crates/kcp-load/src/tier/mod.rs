//! `tier`: N simulated nodes' upstream watch sets against a real
//! kube-apiserver v1.36 (`../shared/k8s/`, started by `kube-testenv`),
//! directly or through a tier of kube-cache-proxy processes
//! (`manifests/tier/config.yaml`, `upstream.identity: Tier`), and what the
//! apiserver pays for them.
//!
//! A simulated node is what one node proxy and its kubelet open upstream:
//! - one list+watch per resource of the node proxy's default caches
//!   ([`NODE_RESOURCES`]: pods with `spec.nodeName=<node>`, its own Node
//!   with `metadata.name=<node>`, and seven resources cluster-wide);
//! - kubelet's per-object watches of the ConfigMap and Secret its pod
//!   mounts (`fieldSelector=metadata.name=<name>`), which a node proxy
//!   passes through;
//!
//! each a reflector as the proxy's (`src/cache/ingest/reflector.rs`): a paginated
//! list (`limit=500`), then a watch from its resourceVersion with
//! `allowWatchBookmarks=true` and `timeoutSeconds` 300–600; a watch that
//! ends resumes from the last resourceVersion seen, after a jittered backoff
//! of 0.1–1 s when it failed; only `410 Gone` relists. Every node has its
//! own client certificate (`CN=system:node:<node>, O=system:nodes`, so the
//! Node authorizer decides), hence its own HTTP/2 connection carrying its
//! 11 watches.
//!
//! Per mode (`direct`, `tier`), on a fresh control plane:
//! 1. seed: N Nodes, and per node a pod bound to it mounting its own
//!    ConfigMap and Secret; `--services` Services and EndpointSlices;
//! 2. (tier) start `--replicas` tier processes (`--proxy-bin`), nodes
//!    assigned round-robin;
//! 3. start the nodes (`--start-rate` per second) until every watch is
//!    open;
//! 4. steady writes for `--duration` seconds (Service, EndpointSlice and
//!    pod status patches), measuring the apiserver's watches
//!    (`apiserver_longrunning_requests{verb="WATCH"}`), CPU
//!    (`process_cpu_seconds_total`), RSS, and the watch events and bytes
//!    it sent (`apiserver_watch_events_total`,
//!    `apiserver_watch_events_sizes_sum`), and the tier replicas' CPU and
//!    RSS;
//! 5. a relist storm: the apiserver restarted; the LISTs it then serves
//!    (`apiserver_request_total{verb="LIST"}` of the new process, less
//!    those of a restart with no client, measured before step 2), and
//!    the time until every simulated watch is open again and until a
//!    Service change made after the restart reached every node.
//!
//! `args` holds what to measure; `run` the runs and `restart` the relist
//! storm; `nodes` the simulated nodes, `wire` what they read of the
//! answers (JSON or protobuf), `seed` the objects and writes, `replicas`
//! the tier's processes, `report` the figures. `agents` reuses all but
//! `run` and `restart`.

mod args;
pub(crate) mod nodes;
pub(crate) mod replicas;
pub(crate) mod report;
mod restart;
mod run;
pub(crate) mod seed;
pub(crate) mod wire;

pub use args::TierArgs;
pub use run::tier;
