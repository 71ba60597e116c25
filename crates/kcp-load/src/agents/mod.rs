//! `agents`: N simulated nodes' agents against a real kube-apiserver
//! v1.36 (`../shared/k8s/`, started by `kube-testenv`), and what the
//! apiserver pays for them in three topologies (issue 59, deliverable 5):
//! - `direct`: every agent connects to the apiserver;
//! - `proxies`: each node's agents connect to that node's proxy
//!   (`manifests/node/config.yaml`, as the node), whose upstream is the
//!   apiserver;
//! - `tier`: the node proxies' upstream is a tier of `--replicas`
//!   (`manifests/tier/config.yaml`), the apiserver their fallback.
//!
//! A node has five agents ([`kinds::Agent`]), each its own identity and
//! HTTP/2 connection: kubelet (the node's certificate), kube-proxy
//! (kube-system/kube-proxy bound to `system:node-proxier`), a CNI agent, a
//! log agent (consistent GETs of its node's pods every
//! `--log-get-interval`) and a metrics agent (a ServiceAccount each, all
//! nodes' agents of a kind sharing its token). Each watch is an informer:
//! a list, a watch from its resourceVersion, a resume, a relist on `410`
//! (`tier::nodes::reflect`), in protobuf for kubelet, kube-proxy and the
//! CNI agent and JSON for the others, as they ask.
//!
//! Behind a node proxy: the first `--real-proxies` nodes get a real one (a
//! kube-cache-proxy process), their agents connecting to its loopback
//! listener; beyond them a node proxy is simulated by what it opens
//! upstream ([`kinds::NodeProxyUpstream`]: its caches' list+watches,
//! kubelet's per-object watches, the CNI agent's watch of every Node, the
//! log agent's GETs), and the figures say which is which.
//!
//! Measured over `--duration` seconds of steady writes (the `tier`
//! subcommand's: Service, EndpointSlice and pod status patches): the
//! apiserver's watches, watch events and bytes sent per second, CPU and
//! RSS; how long each Service change took to reach every agent that
//! watches Services (kubelet, kube-proxy, the CNI agent) and every
//! simulated node proxy; the real node proxies' CPU and RSS.
//!
//! `args` holds what to measure, `kinds` the agents and what a node proxy
//! opens for them, `proxies` the real node proxies, `run` the runs,
//! `report` the figures, the table and the chart.

mod args;
mod kinds;
mod proxies;
mod report;
mod run;

pub use args::AgentsArgs;
pub use run::agents;
