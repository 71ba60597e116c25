//! The agents of a node and what each reads, and what a node proxy opens
//! upstream for them (the simulated node proxies beyond the real ones).

use anyhow::{Result, anyhow, bail};
use kube_cache_proxy::component::config::{Config, IdentityMode, UpstreamEncoding};

use crate::tier::seed::{NAMESPACE, object_name};

/// The node proxies' shipped configuration.
pub const NODE_CONFIG: &str = include_str!("../../../../manifests/node/config.yaml");

/// What protobuf readers ask for: protobuf, JSON for what has none, as
/// client-go's `ContentType: protobuf` and the proxy's caches ask.
pub const PROTOBUF_ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

/// kube-proxy's informers' label selector (`cmd/kube-proxy/app/server.go`:
/// no `service.kubernetes.io/service-proxy-name`, not headless), on
/// Services, EndpointSlices and ServiceCIDRs.
const KUBE_PROXY_LABELS: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// A node's agents, each with its own identity and connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    /// The node's client certificate (`system:node:<node>`).
    Kubelet,
    /// kube-system/kube-proxy, bound to `system:node-proxier`.
    KubeProxy,
    /// A CNI agent (Cilium's reads): kube-system/kcp-load-cni.
    Cni,
    /// A log agent (Fluent Bit's, Vector's): kube-system/kcp-load-log.
    Log,
    /// A metrics agent: kube-system/kcp-load-metrics.
    Metrics,
}

pub const AGENTS: [Agent; 5] = [
    Agent::Kubelet,
    Agent::KubeProxy,
    Agent::Cni,
    Agent::Log,
    Agent::Metrics,
];

/// One watch: collection path, field and label selectors, and whether it
/// is a watch of Services (whose changes are timed to every agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    pub path: String,
    pub field_selector: Option<String>,
    pub label_selector: Option<String>,
    pub services: bool,
}

impl Watch {
    fn all(path: &str) -> Watch {
        Watch {
            path: path.to_string(),
            field_selector: None,
            label_selector: None,
            services: path == SERVICES,
        }
    }

    fn field(path: &str, selector: String) -> Watch {
        Watch {
            field_selector: Some(selector),
            ..Watch::all(path)
        }
    }

    fn labels(path: &str, selector: &str) -> Watch {
        Watch {
            label_selector: Some(selector.to_string()),
            ..Watch::all(path)
        }
    }
}

const PODS: &str = "/api/v1/pods";
const NODES: &str = "/api/v1/nodes";
const SERVICES: &str = "/api/v1/services";
const NAMESPACES: &str = "/api/v1/namespaces";
const ENDPOINTSLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";

impl Agent {
    pub fn name(self) -> &'static str {
        match self {
            Agent::Kubelet => "kubelet",
            Agent::KubeProxy => "kube-proxy",
            Agent::Cni => "cni",
            Agent::Log => "log",
            Agent::Metrics => "metrics",
        }
    }

    /// Whether it reads protobuf: kubelet and kube-proxy do by default
    /// (`--kube-api-content-type`, `clientConnection.contentType`), and
    /// Cilium's agent for built-in types (`pkg/k8s/client/cell.go`); log
    /// and metrics agents mostly read JSON (client-go's default, kube-rs).
    pub fn protobuf(self) -> bool {
        matches!(self, Agent::Kubelet | Agent::KubeProxy | Agent::Cni)
    }

    /// Its ServiceAccount in kube-system (`rbac.yaml`); kubelet has the
    /// node's certificate instead.
    pub fn service_account(self) -> Option<&'static str> {
        match self {
            Agent::Kubelet => None,
            Agent::KubeProxy => Some("kube-proxy"),
            Agent::Cni => Some("kcp-load-cni"),
            Agent::Log => Some("kcp-load-log"),
            Agent::Metrics => Some("kcp-load-metrics"),
        }
    }

    /// What it lists and watches on node `i`, named `node`.
    pub fn watches(self, i: usize, node: &str) -> Vec<Watch> {
        let pods = || Watch::field(PODS, format!("spec.nodeName={node}"));
        let own_node = || Watch::field(NODES, format!("metadata.name={node}"));
        match self {
            Agent::Kubelet => vec![
                pods(),
                own_node(),
                Watch::all(SERVICES),
                Watch::all("/apis/node.k8s.io/v1/runtimeclasses"),
                Watch::all("/apis/storage.k8s.io/v1/csidrivers"),
                kubelet_object("configmaps", i),
                kubelet_object("secrets", i),
            ],
            Agent::KubeProxy => vec![
                Watch::labels(SERVICES, KUBE_PROXY_LABELS),
                Watch::labels(ENDPOINTSLICES, KUBE_PROXY_LABELS),
                Watch::labels("/apis/networking.k8s.io/v1/servicecidrs", KUBE_PROXY_LABELS),
                own_node(),
            ],
            Agent::Cni => vec![
                pods(),
                Watch::all(NODES),
                Watch::all(NAMESPACES),
                Watch::all("/apis/networking.k8s.io/v1/networkpolicies"),
                Watch::all(SERVICES),
                Watch::all(ENDPOINTSLICES),
            ],
            Agent::Log => vec![Watch::all(NAMESPACES)],
            Agent::Metrics => vec![pods(), own_node()],
        }
    }

    /// What it GETs periodically: the log agent, each of its node's pods
    /// (one here) by name, a consistent read.
    pub fn gets(self, i: usize) -> Vec<String> {
        match self {
            Agent::Log => vec![format!("/api/v1/namespaces/{NAMESPACE}/pods/pod-{i:05}")],
            _ => Vec::new(),
        }
    }
}

/// kubelet's watch of one ConfigMap or Secret its pod mounts.
fn kubelet_object(kind: &str, i: usize) -> Watch {
    Watch::field(
        &format!("/api/v1/namespaces/{NAMESPACE}/{kind}"),
        format!("metadata.name={}", object_name(kind, i)),
    )
}

/// What a node proxy with the shipped configuration opens upstream for
/// node `i` and its agents: on its own connection (the node's
/// certificate), a list+watch per cache of `manifests/node/config.yaml`
/// and kubelet's per-object watches, which it passes through; on its
/// connection for clients' tokens, the CNI agent's watch of every Node (it
/// caches only its own). The log agent's GETs it passes through as well
/// ([`Agent::gets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeProxyUpstream {
    pub as_node: Vec<Watch>,
    pub cni_token: Vec<Watch>,
    /// Whether its caches read protobuf (`cache.upstreamEncoding`).
    pub protobuf: bool,
}

impl NodeProxyUpstream {
    pub fn of(i: usize, node: &str) -> Result<NodeProxyUpstream> {
        let config = Config::from_yaml(NODE_CONFIG).map_err(|e| anyhow!("{e}"))?;
        if config.upstream.identity != IdentityMode::Node {
            bail!("manifests/node/config.yaml is not a node proxy's configuration");
        }
        let mut as_node = Vec::new();
        for r in &config.cache.resources {
            let path = if r.group.is_empty() {
                format!("/api/{}/{}", r.version, r.resource)
            } else {
                format!("/apis/{}/{}/{}", r.group, r.version, r.resource)
            };
            let mut w = Watch::all(&path);
            w.field_selector = r
                .field_selector
                .as_ref()
                .map(|s| s.replace("${NODE_NAME}", node));
            as_node.push(w);
        }
        // What kubelet reads that the caches cannot answer.
        let cached = as_node.clone();
        for w in Agent::Kubelet.watches(i, node) {
            if !cached.iter().any(|c| c.path == w.path) {
                as_node.push(w);
            }
        }
        // The other agents' reads no cache answers: a cache of a resource
        // answers every selector, but `nodes` holds the node's own.
        let cni_token = Agent::Cni
            .watches(i, node)
            .into_iter()
            .filter(|w| {
                !cached.iter().any(|c| {
                    c.path == w.path
                        && (c.field_selector.is_none() || c.field_selector == w.field_selector)
                })
            })
            .collect();
        Ok(NodeProxyUpstream {
            as_node,
            cni_token,
            protobuf: config.cache.upstream_encoding == UpstreamEncoding::Protobuf,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::nodes::NODE_RESOURCES;

    #[test]
    fn a_node_has_twenty_watches_directly() {
        let n: usize = AGENTS
            .iter()
            .map(|a| a.watches(7, "sim-node-00007").len())
            .sum();
        assert_eq!(n, 20);
        let services = AGENTS
            .iter()
            .flat_map(|a| a.watches(7, "sim-node-00007"))
            .filter(|w| w.services)
            .count();
        assert_eq!(services, 3, "kubelet, kube-proxy and the CNI agent");
        assert_eq!(
            Agent::Log.gets(7),
            ["/api/v1/namespaces/kcp-tier/pods/pod-00007"]
        );
    }

    #[test]
    fn a_node_proxy_opens_its_caches_and_what_they_cannot_answer() {
        let u = NodeProxyUpstream::of(7, "sim-node-00007").unwrap();
        assert!(u.protobuf);
        // The tier's simulated node (its caches then) and networkpolicies.
        for (path, selector) in NODE_RESOURCES {
            let w = u.as_node.iter().find(|w| w.path == path).unwrap();
            assert_eq!(
                w.field_selector,
                selector.map(|s| s.replace("{node}", "sim-node-00007"))
            );
        }
        assert!(
            u.as_node
                .iter()
                .any(|w| w.path == "/apis/networking.k8s.io/v1/networkpolicies")
        );
        let per_object: Vec<_> = u
            .as_node
            .iter()
            .filter(|w| w.path.starts_with("/api/v1/namespaces/"))
            .map(|w| w.field_selector.clone().unwrap())
            .collect();
        assert_eq!(
            per_object,
            ["metadata.name=cm-00007", "metadata.name=sec-00007"]
        );
        assert_eq!(u.as_node.len(), 12);
        assert_eq!(u.cni_token, [Watch::all(NODES)]);
        assert_eq!(u.as_node.iter().filter(|w| w.services).count(), 1);
    }
}
