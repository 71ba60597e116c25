//! `podNetwork.kubernetesService`: this node's kubelet, reading Services
//! through the proxy, sees the `default/kubernetes` Service pointing at the
//! proxy's pod-network listener (`podNetwork.listen`), so every container
//! it starts gets `KUBERNETES_SERVICE_HOST`/`PORT` for the node proxy and
//! in-cluster clients use it unchanged (docs/pods.md).
//!
//! kubelet builds a container's service variables from its informer of
//! Services (`pkg/kubelet/kubelet_pods.go` `getServiceEnvVarMap`: the
//! `kubernetes` Service of `default` always, from `spec.clusterIP` and
//! `spec.ports`, `envvars.FromServices`). OpenYurt's YurtHub rewrites the
//! same fields for kubelet's list and watch of Services
//! (`pkg/yurthub/filter/masterservice/filter.go`): `clusterIP`,
//! `clusterIPs` and the port named `https`. Here only the user
//! `system:node:<nodeName>` in `system:nodes` sees it, in every read the
//! cache answers (get, list, a watch's initial events and events:
//! `cache::serve::view`); every other client, kube-proxy above all, reads the real
//! Service. A read the cache cannot answer passes through and gets the
//! real one (counted as such).
//!
//! Turned on or off (the node label, in `NodeLabel` mode), the kubelet's
//! watches of Services end with `410 Expired` and its resumed watches get
//! the same until it lists again: its informer then holds the Service as
//! the proxy now shows it, and the next container started gets it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::Response;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use parking_lot::Mutex;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::auth::UserInfo;
use crate::cache::encode;
use crate::cache::negotiate::Encoding;
use crate::cache::object::CachedObject;
use crate::cache::resource::ResourceCache;
use crate::cache::serve::view::View;
use crate::cache::status::KubernetesServiceStatus;
use crate::component::config::{Config, KubernetesServiceMode};
use crate::component::metrics::KubernetesServiceMetrics;
use apimachinery::body::{Body, BoxError};
use apimachinery::request::RequestInfo;
use apimachinery::resource::FieldSet;
use apimachinery::status::Status;

/// The label that turns the rewrite on for a node in `NodeLabel` mode, and
/// its value.
pub const NODE_LABEL: &str = "kubecacheproxy.io/kubernetes-service";
/// The value of [`NODE_LABEL`] that turns it on.
pub const NODE_LABEL_VALUE: &str = "node-local";
/// How often the rewrite looks again whether its address is the node's.
pub const ADDRESS_CHECK: Duration = Duration::from_secs(5);
/// The annotation a rewritten Service carries: what it was.
pub const REWRITTEN_FROM: &str = "kubecacheproxy.io/rewritten-from";

/// The rewrite of `default/kubernetes` for this node's kubelet.
#[derive(Debug)]
pub struct KubernetesService {
    mode: KubernetesServiceMode,
    /// `system:node:<nodeName>`.
    kubelet: String,
    node_name: String,
    /// What the Service is rewritten to: `podNetwork.listen`.
    target: SocketAddr,
    /// kubelet's view of Services, on while the Service is rewritten.
    view: Arc<View>,
    /// Whether `target`'s address was the node's when last looked at.
    address_local: AtomicBool,
    /// Cancelled when the rewrite is turned on or off, replaced by a new
    /// one: kubelet's watches of Services end then.
    changed: Mutex<CancellationToken>,
    metrics: KubernetesServiceMetrics,
}

// === impl KubernetesService ===

impl KubernetesService {
    /// The rewrite `config` asks for, counted in `metrics`; `None` with
    /// `podNetwork.kubernetesService: Never`.
    pub fn new(config: &Config, metrics: &KubernetesServiceMetrics) -> Option<Arc<Self>> {
        let mode = config.pod_network.kubernetes_service;
        let Ok(Some(target)) = config.pod_listen_addr() else {
            return None;
        };
        if mode == KubernetesServiceMode::Never {
            return None;
        }
        let metrics = metrics.clone();
        let service = Arc::new(KubernetesService {
            mode,
            kubelet: format!("system:node:{}", config.node_name),
            node_name: config.node_name.clone(),
            target,
            view: Arc::new(View::new(
                "default/kubernetes",
                Box::new(move |o| rewrite(o, target)),
            )),
            address_local: AtomicBool::new(false),
            changed: Mutex::new(CancellationToken::new()),
            metrics,
        });
        // Off until `run` finds it wanted and the address on the node.
        service.view.set_on(false);
        // What kubelet holds from before this process started is unknown
        // (another mode, or the label changed meanwhile): its watches that
        // resume get `410` until it lists once, from this process.
        service.view.expire_resumes();
        service
            .metrics
            .rewritten
            .set(i64::from(service.is_active()));
        Some(service)
    }

    /// The view `user` reads `info` with: for this node's kubelet reading
    /// Services, on or off (turned on or off, its watches must end).
    pub fn view_for(&self, user: &UserInfo, info: &RequestInfo) -> Option<&Arc<View>> {
        self.is_kubelet_services_read(user, info)
            .then_some(&self.view)
    }

    /// Whether `user` is this node's kubelet reading core Services.
    pub fn is_kubelet_services_read(&self, user: &UserInfo, info: &RequestInfo) -> bool {
        info.api_group.is_empty()
            && info.api_version == "v1"
            && info.resource == "services"
            && user.name == self.kubelet
            && user.groups.iter().any(|g| g == "system:nodes")
    }

    /// Whether kubelet sees the rewritten Service now.
    pub fn is_active(&self) -> bool {
        self.view.is_on()
    }

    /// Counts a read of Services by kubelet: answered from the cache with
    /// the rewrite (`rewritten`) or without, while it is off (`real`), or
    /// passed through (`passed_through`: the apiserver's answer).
    pub fn count(&self, verb: &str, result: &str) {
        self.metrics.reads.with_label_values(&[verb, result]).inc();
    }

    /// Turns the rewrite on or off: kubelet's open watches of Services
    /// end, and its resumed ones get `410` until it lists again.
    fn set_active(&self, on: bool) {
        if !self.view.set_on(on) {
            return;
        }
        let old = std::mem::replace(&mut *self.changed.lock(), CancellationToken::new());
        old.cancel();
        self.metrics.rewritten.set(i64::from(on));
        self.metrics.changes.inc();
        tracing::info!(
            rewritten = on,
            target = %self.target,
            "kubelet's view of the default/kubernetes Service changed"
        );
    }

    /// Keeps the rewrite on while it is wanted (`Always`, or in `NodeLabel`
    /// mode while this node's Node in `nodes`, the proxy's own cache of it,
    /// carries [`NODE_LABEL`]) and its address is the node's (else pods
    /// given it could not connect: the real Service is safer), until
    /// `shutdown`. Looks at the label when the Node changes, at the
    /// address every [`ADDRESS_CHECK`] (a socket bound and closed).
    pub async fn run(
        self: Arc<Self>,
        nodes: Option<Arc<ResourceCache>>,
        shutdown: CancellationToken,
    ) {
        let mut rv = nodes.as_ref().map(|n| n.subscribe_rv());
        let mut address_was_local = true;
        let mut address_local = is_local(self.target.ip());
        let mut next_check = tokio::time::Instant::now() + ADDRESS_CHECK;
        loop {
            let wanted = match self.mode {
                KubernetesServiceMode::Always => true,
                KubernetesServiceMode::NodeLabel => nodes.as_ref().is_some_and(|nodes| {
                    nodes
                        .lock()
                        .objects()
                        .get(self.node_name.as_str())
                        .is_some_and(|node| node.labels().get(NODE_LABEL) == Some(NODE_LABEL_VALUE))
                }),
                KubernetesServiceMode::Never => false,
            };
            if tokio::time::Instant::now() >= next_check {
                address_local = is_local(self.target.ip());
                next_check = tokio::time::Instant::now() + ADDRESS_CHECK;
            }
            if wanted && !address_local && address_was_local {
                tracing::warn!(
                    address = %self.target.ip(),
                    "podNetwork.listen's address is not the node's: kubelet reads the real \
                     default/kubernetes Service until it is"
                );
            }
            address_was_local = address_local;
            self.address_local.store(address_local, Ordering::SeqCst);
            self.set_active(wanted && address_local);
            let node_changed = async {
                match &mut rv {
                    Some(rv) => rv.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = node_changed => if !changed { return },
                _ = tokio::time::sleep_until(next_check) => {}
            }
        }
    }

    /// kubelet's watch of Services, answered with the rewrite: it ends with
    /// `410 Expired` (an `ERROR` event, as the apiserver's watch cache ends
    /// a watcher it dropped) when the rewrite is turned on or off, so that
    /// kubelet relists.
    pub fn ends_on_change(&self, resp: Response<Body>) -> Response<Body> {
        let changed = self.changed.lock().clone();
        let encoding = match resp.headers().get(http::header::CONTENT_TYPE) {
            Some(v)
                if v.as_bytes()
                    .starts_with(b"application/vnd.kubernetes.protobuf") =>
            {
                Encoding::Protobuf
            }
            _ => Encoding::Json,
        };
        let (parts, body) = resp.into_parts();
        Response::from_parts(parts, ends_on(body, changed, encoding))
    }

    /// For `status`: the mode, whether kubelet sees the rewrite, and what
    /// to.
    pub fn status(&self) -> KubernetesServiceStatus {
        KubernetesServiceStatus {
            mode: format!("{:?}", self.mode),
            rewritten: self.is_active(),
            target: self.target.to_string(),
            address_on_node: self.address_local.load(Ordering::SeqCst),
        }
    }
}

/// Whether `ip` is an address of this node: one a socket can be bound to
/// (`EADDRNOTAVAIL` otherwise).
fn is_local(ip: IpAddr) -> bool {
    std::net::TcpListener::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// `body`, cut at a frame boundary when `changed` is cancelled, with an
/// `ERROR` event `410 Expired` to end it.
fn ends_on(body: Body, changed: CancellationToken, encoding: Encoding) -> Body {
    let stream = futures_util::stream::unfold(Some((body, changed)), move |state| async move {
        let (mut body, changed) = state?;
        tokio::select! {
            biased;
            _ = changed.cancelled() => {
                let status = Status::expired(
                    "too old resource version: the proxy's view of the default/kubernetes \
                     Service changed",
                );
                let object = encode::status_object(&status, encoding);
                Some((Ok::<_, BoxError>(Frame::data(encode::frame(encoding, "ERROR", &object))), None))
            }
            frame = body.frame() => frame.map(|frame| (frame, Some((body, changed)))),
        }
    });
    Body::new(StreamBody::new(stream))
}

/// `o` (the `default/kubernetes` Service) pointing at `target`: its
/// `clusterIP`, `clusterIPs` (and `ipFamilies`) and the port named `https`,
/// as YurtHub rewrites it, and an annotation saying what they were.
/// `None` when it has no cluster IP to rewrite.
pub fn rewrite(o: &CachedObject, target: SocketAddr) -> Option<CachedObject> {
    let mut object: Value = serde_json::from_slice(o.json()).ok()?;
    let ip = target.ip().to_string();
    let spec = object.get_mut("spec")?.as_object_mut()?;
    let was_ip = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .filter(|ip| !ip.is_empty() && *ip != "None")?
        .to_string();
    spec.insert("clusterIP".into(), Value::from(ip.clone()));
    if spec.contains_key("clusterIPs") {
        spec.insert("clusterIPs".into(), Value::from(vec![ip]));
        if spec.contains_key("ipFamilies") {
            let family = if target.is_ipv4() { "IPv4" } else { "IPv6" };
            spec.insert("ipFamilies".into(), Value::from(vec![family]));
        }
    }
    let mut was_port = None;
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports {
            if port.get("name").and_then(Value::as_str) == Some("https")
                && let Some(p) = port.as_object_mut()
            {
                was_port = p.get("port").cloned();
                p.insert("port".into(), Value::from(target.port()));
            }
        }
    }
    let was = match was_port {
        Some(port) => format!("clusterIP {was_ip}, port https {port}"),
        None => format!("clusterIP {was_ip}"),
    };
    annotate(
        object.get_mut("metadata")?.as_object_mut()?,
        REWRITTEN_FROM,
        &was,
    );
    let json = apimachinery::go::to_vec(&object);
    CachedObject::from_json(&json, FieldSet::Service, true).ok()
}

/// Sets annotation `key` in `metadata` where kube-apiserver writes it: in
/// `annotations`, sorted by key (Go's map order), which comes after
/// `labels` and before `ownerReferences`, `finalizers` and `managedFields`
/// (`ObjectMeta`'s field order).
fn annotate(metadata: &mut Map<String, Value>, key: &str, value: &str) {
    if let Some(annotations) = metadata
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.insert(key.into(), Value::from(value));
        annotations.sort_keys();
        return;
    }
    let mut annotations = Map::new();
    annotations.insert(key.into(), Value::from(value));
    let mut rebuilt = Map::new();
    let mut pending = Some(Value::Object(annotations));
    for (k, v) in std::mem::take(metadata) {
        if matches!(
            k.as_str(),
            "ownerReferences" | "finalizers" | "managedFields"
        ) && let Some(a) = pending.take()
        {
            rebuilt.insert("annotations".into(), a);
        }
        rebuilt.insert(k, v);
    }
    if let Some(a) = pending {
        rebuilt.insert("annotations".into(), a);
    }
    *metadata = rebuilt;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubernetes_service(metadata_tail: &str) -> CachedObject {
        let json = format!(
            r#"{{"kind":"Service","apiVersion":"v1","metadata":{{"name":"kubernetes","namespace":"default","uid":"u","resourceVersion":"12","creationTimestamp":"2026-12-07T00:00:00Z","labels":{{"component":"apiserver","provider":"kubernetes"}}{metadata_tail}}},"spec":{{"ports":[{{"name":"https","protocol":"TCP","port":443,"targetPort":6443}}],"clusterIP":"10.96.0.1","clusterIPs":["10.96.0.1"],"type":"ClusterIP","sessionAffinity":"None","ipFamilies":["IPv4"],"ipFamilyPolicy":"SingleStack","internalTrafficPolicy":"Cluster"}},"status":{{"loadBalancer":{{}}}}}}"#
        );
        CachedObject::from_json(json.as_bytes(), FieldSet::Service, true).unwrap()
    }

    #[test]
    fn the_service_points_at_the_target_and_says_what_it_was() {
        let target: SocketAddr = "169.254.64.1:6444".parse().unwrap();
        let o = kubernetes_service(r#","managedFields":[{"manager":"kube-apiserver"}]"#);
        let r = rewrite(&o, target).unwrap();
        assert_eq!(
            std::str::from_utf8(r.json()).unwrap(),
            r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"kubernetes","namespace":"default","uid":"u","resourceVersion":"12","creationTimestamp":"2026-12-07T00:00:00Z","labels":{"component":"apiserver","provider":"kubernetes"},"annotations":{"kubecacheproxy.io/rewritten-from":"clusterIP 10.96.0.1, port https 443"},"managedFields":[{"manager":"kube-apiserver"}]},"spec":{"ports":[{"name":"https","protocol":"TCP","port":6444,"targetPort":6443}],"clusterIP":"169.254.64.1","clusterIPs":["169.254.64.1"],"type":"ClusterIP","sessionAffinity":"None","ipFamilies":["IPv4"],"ipFamilyPolicy":"SingleStack","internalTrafficPolicy":"Cluster"},"status":{"loadBalancer":{}}}"#
        );
        assert_eq!((r.key(), r.rv), ("default/kubernetes", 12));
        assert_eq!(r.field("spec.clusterIP"), Some("169.254.64.1"));
        // Existing annotations keep Go's key order.
        let o = kubernetes_service(r#","annotations":{"z":"1","a":"2"}"#);
        let r = rewrite(&o, target).unwrap();
        assert!(
            std::str::from_utf8(r.json()).unwrap().contains(
                r#""annotations":{"a":"2","kubecacheproxy.io/rewritten-from":"clusterIP 10.96.0.1, port https 443","z":"1"}}"#
            ),
            "{}",
            std::str::from_utf8(r.json()).unwrap()
        );
        // IPv6 target.
        let r = rewrite(&o, "[fd00::64:1]:6444".parse().unwrap()).unwrap();
        let text = std::str::from_utf8(r.json()).unwrap();
        assert!(
            text.contains(r#""clusterIP":"fd00::64:1","clusterIPs":["fd00::64:1"]"#),
            "{text}"
        );
        assert!(text.contains(r#""ipFamilies":["IPv6"]"#), "{text}");
    }

    #[test]
    fn a_headless_service_is_left_alone() {
        let json = r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"kubernetes","namespace":"default","resourceVersion":"3"},"spec":{"clusterIP":"None"}}"#;
        let o = CachedObject::from_json(json.as_bytes(), FieldSet::Service, true).unwrap();
        assert!(rewrite(&o, "169.254.64.1:6444".parse().unwrap()).is_none());
    }
}
