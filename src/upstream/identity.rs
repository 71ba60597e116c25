//! Who the proxy is upstream, and so what it may do there.
//!
//! A node-local proxy holds at most what its node may do (the Node
//! authorizer and NodeRestriction limit `system:node:<name>`):
//!
//! | upstream credential | identity | the proxy acts upstream |
//! |---|---|---|
//! | a client certificate with `CN=system:node:<name>` (kubelet's own, as OpenYurt's YurtHub uses it) | [`Identity::Node`] via [`NodeCredential::Certificate`] | as the node, with that certificate |
//! | a service-account token bound to node `<name>` (a pod's projected token; `kubernetes.io.node` claim) | [`Identity::Node`] via [`NodeCredential::AssociatedServiceAccount`] | as the node by constrained impersonation (`Impersonate-User: system:node:<name>`, authorized by `impersonate:associated-node` and `impersonate-on:associated-node:<verb>`; kube-apiserver 1.35+ with `ConstrainedImpersonation`, on by default from 1.36) for what a node may read, as the service account for the cache's other reads |
//! | anything else (an administrator's kubeconfig in tests, a dedicated identity) | [`Identity::AsGiven`] | with that credential; certificate clients by legacy impersonation |
//!
//! As a node, the proxy forwards only its own node's certificate requests
//! (kubelet's) and bearer-token requests (with the client's own token);
//! any other certificate user gets `403`: the proxy cannot act as them.
//! The pods and nodes caches are scoped to the node (`spec.nodeName`,
//! `metadata.name`), as the Node authorizer requires of a node's lists.
//!
//! The identity is decided at start from the credential alone (no request
//! upstream), so a proxy starts while the apiserver is down. With a
//! node-bound token, [`confirm_node_access`] then proves once that the
//! apiserver allows the impersonation, and the proxy stops with a clear
//! error where it does not (clusters before 1.35).

use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use base64::Engine;
use http::{HeaderValue, Method, StatusCode};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use apimachinery::user::UserInfo;

use super::failover::Upstream;
use crate::component::config::{CacheConfig, IdentityMode};

/// The user name of node `name`.
pub fn node_user(name: &str) -> String {
    format!("system:node:{name}")
}

/// How the proxy holds its node's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeCredential {
    /// The node's own client certificate.
    Certificate,
    /// A service-account token bound to the node, impersonating it.
    AssociatedServiceAccount,
}

/// Who the proxy is upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The credential as given.
    AsGiven,
    /// A tier proxy: the credential as given for its own reads; nodes'
    /// certificate requests as those nodes (`impersonate:arbitrary-node`).
    Tier,
    /// Node `name`.
    Node {
        name: String,
        credential: NodeCredential,
    },
}

/// Resources a node may list and watch (Node authorizer rules; pods and
/// nodes only scoped to the node). The cache's other resources are read
/// as the proxy's service account.
const NODE_READABLE: &[(&str, &str)] = &[
    ("", "pods"),
    ("", "nodes"),
    ("", "services"),
    ("node.k8s.io", "runtimeclasses"),
    ("storage.k8s.io", "csidrivers"),
];

/// Resources a node may read only object by object: never cached by a
/// node-identity proxy (kubelet's per-object watches pass through).
const NODE_PER_OBJECT: &[(&str, &str)] = &[("", "secrets"), ("", "configmaps")];

impl Identity {
    /// Decides the identity from the upstream credential.
    ///
    /// # Errors
    /// A message when `mode` is `Node` and the credential is not a node's,
    /// or `node_name` is set and names another node.
    pub fn detect(
        kube_config: &kube::Config,
        mode: IdentityMode,
        node_name: &str,
    ) -> Result<Identity, String> {
        match mode {
            IdentityMode::AsGiven => return Ok(Identity::AsGiven),
            IdentityMode::Tier => return Ok(Identity::Tier),
            IdentityMode::Auto | IdentityMode::Node => {}
        }
        let found = certificate_node(kube_config)
            .map(|n| (n, NodeCredential::Certificate))
            .or_else(|| {
                token_node(kube_config).map(|n| (n, NodeCredential::AssociatedServiceAccount))
            });
        match found {
            Some((name, credential)) => {
                if !node_name.is_empty() && node_name != name {
                    return Err(format!(
                        "the upstream credential is node {name:?}'s, but nodeName is {node_name:?}"
                    ));
                }
                Ok(Identity::Node { name, credential })
            }
            None if mode == IdentityMode::Node => Err(
                "upstream.identity is Node, but the upstream credential is neither a node's \
                 client certificate (CN=system:node:<name>) nor a service-account token bound \
                 to a node (a pod's projected token, or a TokenRequest with a Node boundObjectRef)"
                    .to_string(),
            ),
            None => Ok(Identity::AsGiven),
        }
    }

    /// The node, when the proxy acts as one.
    pub fn node(&self) -> Option<&str> {
        match self {
            Identity::Node { name, .. } => Some(name),
            Identity::AsGiven | Identity::Tier => None,
        }
    }

    /// Whether `user` is the node the proxy reads `group`/`resource` as
    /// upstream: its own list+watch of that resource is then the node's
    /// own, authorized by the apiserver for the cache's whole scope.
    /// Used only while authorization cannot be asked (`handler.rs`).
    pub fn reads_resource_as(&self, user: &UserInfo, group: &str, resource: &str) -> bool {
        let Identity::Node { name, credential } = self else {
            return false;
        };
        user.name == node_user(name)
            && user.groups.iter().any(|g| g == "system:nodes")
            && match credential {
                NodeCredential::Certificate => true,
                NodeCredential::AssociatedServiceAccount => {
                    NODE_READABLE.contains(&(group, resource))
                }
            }
    }

    /// The `Impersonate-User` value the proxy's own reads of a resource
    /// carry: the node's, for what a node may read, when the proxy holds
    /// the node's identity by impersonation.
    pub fn reads_as(&self, group: &str, resource: &str) -> Option<HeaderValue> {
        match self {
            Identity::Node {
                name,
                credential: NodeCredential::AssociatedServiceAccount,
            } if NODE_READABLE.contains(&(group, resource)) => {
                HeaderValue::from_str(&node_user(name)).ok()
            }
            _ => None,
        }
    }

    /// Scopes the pods and nodes caches to the node, as the Node
    /// authorizer lets a node list them, and refuses caches a node cannot
    /// fill.
    ///
    /// # Errors
    /// A message naming the resource.
    pub fn scope_caches(&self, cache: &mut CacheConfig) -> Result<(), String> {
        let Some(node) = self.node() else {
            return Ok(());
        };
        for r in &mut cache.resources {
            let gr = (r.group.as_str(), r.resource.as_str());
            if NODE_PER_OBJECT.contains(&gr) {
                return Err(format!(
                    "cache.resources: {} cannot be cached by a proxy acting as node {node:?}: a \
                     node may read only those of its own pods (kubelet's per-object watches \
                     pass through)",
                    r.resource
                ));
            }
            let required = match gr {
                ("", "pods") => "spec.nodeName",
                ("", "nodes") => "metadata.name",
                _ => continue,
            };
            let wanted = format!("{required}={node}");
            match &r.field_selector {
                None => r.field_selector = Some(wanted),
                Some(s) if s.replace("${NODE_NAME}", node) == wanted => {}
                Some(s) => {
                    return Err(format!(
                        "cache.resources: {} must be scoped with fieldSelector {wanted:?} (a \
                         node lists only its own), not {s:?}",
                        r.resource
                    ));
                }
            }
        }
        Ok(())
    }
}

/// How long [`confirm_node_access`] waits between attempts while the
/// apiserver cannot answer, at most.
const CONFIRM_MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Proves, once at start, that the apiserver lets the proxy act as node
/// `name` by constrained impersonation: a `get` of the node's own Node
/// object with `Impersonate-User: system:node:<name>` (the verbs
/// `impersonate:associated-node` and `impersonate-on:associated-node:get`
/// of `manifests/rbac.yaml`). `200` or `404` (the Node does not exist
/// yet) prove it. `403` is definitive: the apiserver does not support
/// constrained impersonation (before 1.35, or 1.35 without the
/// `ConstrainedImpersonation` feature) or the RBAC is not applied; the
/// proxy would be refused every cache fill and every kubelet request
/// forever, so the caller stops it with this error. Anything else (the
/// apiserver down, `401` while a token rotates, `5xx`) is retried, with a
/// backoff up to 30 s, until an answer or `shutdown`.
///
/// # Errors
/// The message for the operator, with the apiserver's version and answer.
pub async fn confirm_node_access(
    upstream: &Upstream,
    name: &str,
    shutdown: &CancellationToken,
) -> Result<(), String> {
    let user = node_user(name);
    let path = format!("/api/v1/nodes/{name}");
    let mut backoff = Duration::from_millis(500);
    loop {
        let answer = async {
            let mut req = upstream
                .own_request(Method::GET, &path, None)
                .map_err(|e| e.to_string())?;
            let value = HeaderValue::from_str(&user).map_err(|e| e.to_string())?;
            req.headers_mut().insert("impersonate-user", value);
            upstream.own_exchange(req).await
        }
        .await;
        let reason = match answer {
            Ok((StatusCode::OK | StatusCode::NOT_FOUND, _)) => return Ok(()),
            Ok((StatusCode::FORBIDDEN, body)) => {
                let message = serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["message"].as_str().map(str::to_string))
                    .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
                let version = apiserver_version(upstream).await;
                return Err(format!(
                    "kube-apiserver {version} does not let this proxy act as node {name:?} by \
                     constrained impersonation: {message}. A service-account token bound to the \
                     node needs kube-apiserver 1.35 or later with the ConstrainedImpersonation \
                     feature (on by default from 1.36) and manifests/rbac.yaml applied; on older \
                     clusters run the proxy with the node's own client certificate \
                     (manifests/node/, docs/security.md)"
                ));
            }
            Ok((status, _)) => format!("{status}"),
            Err(e) => e,
        };
        tracing::warn!(node = %name, %reason, retry_in = ?backoff, "cannot yet confirm that the apiserver lets the proxy act as its node");
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(CONFIRM_MAX_BACKOFF);
    }
}

/// How a tier acts upstream as the nodes behind it (their certificate
/// requests), learnt from the apiserver's own answer
/// ([`learn_node_impersonation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeImpersonation {
    /// Constrained impersonation (`impersonate:arbitrary-node` on
    /// `nodes.authentication.k8s.io`, kube-apiserver 1.36, or 1.35 with
    /// `ConstrainedImpersonation`): `Impersonate-User: system:node:<name>`
    /// alone; the apiserver gives the node its fixed groups
    /// (`system:nodes`), and refuses a node impersonation that names
    /// groups.
    Constrained,
    /// Legacy impersonation (`impersonate` on `users` and on the group
    /// `system:nodes`): the apiserver gives the impersonated user only the
    /// groups asked for (and `system:authenticated`), so
    /// `Impersonate-Group: system:nodes` is sent too, which the Node
    /// authorizer requires.
    Legacy,
}

/// The user a tier impersonates to learn how the apiserver treats its
/// node impersonation (no such node need exist).
const PROBE_NODE: &str = "system:node:kube-cache-proxy-impersonation-check";

/// The least time between two re-learnings after refused node requests
/// (the first follows the first refusal at once).
const RELEARN_INTERVAL: Duration = Duration::from_secs(30);

/// Learns, from the apiserver's own answer, how a tier's credential acts
/// as a node: a SelfSubjectReview impersonating a node, first with
/// `Impersonate-Group: system:nodes` (only legacy impersonation accepts a
/// group with a node), then, if that is refused, with the user alone
/// (constrained impersonation, `impersonate-on:arbitrary-node:create` on
/// `selfsubjectreviews`). The mode is the first whose answer puts the node
/// in `system:nodes`.
///
/// Legacy comes first because, for a credential allowed both, the
/// apiserver's choice for a node user alone is not fixed: it tries first
/// the mode that last succeeded for the same requestor
/// (`staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation/constrained_impersonation.go`
/// `getImpersonatedUser`, its mode cache keyed by the requestor's name),
/// so one legacy impersonation by that credential (a `kubectl --as` with
/// `super-admin.conf`) turns every later node impersonation without a
/// group into a user in `system:authenticated` alone, refused by the Node
/// authorizer. With the group named, only legacy applies, always; and
/// 1.34, or 1.35 without `ConstrainedImpersonation`, has no other.
///
/// `Ok(None)`: neither is allowed. `Err`: no answer (the apiserver down,
/// `5xx`): try again.
///
/// # Errors
/// The reason no answer came.
pub async fn learn_node_impersonation(
    upstream: &Upstream,
) -> Result<Option<(NodeImpersonation, Vec<String>)>, String> {
    let nodes = apimachinery::impersonation::NODES_GROUP;
    for mode in [NodeImpersonation::Legacy, NodeImpersonation::Constrained] {
        let group = (mode == NodeImpersonation::Legacy).then_some(nodes);
        let Some(groups) = impersonated_review(upstream, PROBE_NODE, group).await? else {
            continue;
        };
        if groups.iter().any(|g| g == nodes) {
            return Ok(Some((mode, groups)));
        }
        tracing::warn!(
            ?mode,
            ?groups,
            "node impersonation does not put the node in system:nodes"
        );
    }
    Ok(None)
}

/// A tier's way of acting as the nodes behind it: learnt at start, and
/// learnt again when the apiserver refuses node requests (RBAC changed,
/// an apiserver of another version took over), at most every 30 s.
#[derive(Debug, Default)]
pub struct TierImpersonation {
    /// 0 while not known (constrained impersonation is used), else
    /// `1 + NodeImpersonation as u8`.
    mode: AtomicU8,
    relearn: tokio::sync::Notify,
}

impl TierImpersonation {
    /// The mode node requests go upstream with now.
    pub fn mode(&self) -> NodeImpersonation {
        match self.mode.load(Ordering::Relaxed) {
            2 => NodeImpersonation::Legacy,
            _ => NodeImpersonation::Constrained,
        }
    }

    fn set(&self, mode: NodeImpersonation) {
        let v = match mode {
            NodeImpersonation::Constrained => 1,
            NodeImpersonation::Legacy => 2,
        };
        self.mode.store(v, Ordering::Relaxed);
    }

    /// A node request forwarded by impersonation was refused (`403`):
    /// learn the mode again.
    pub fn refused(&self) {
        self.relearn.notify_one();
    }

    /// Learns the mode at start (retrying with a backoff up to 30 s while
    /// the apiserver cannot answer), then again whenever
    /// [`TierImpersonation::refused`] asks, until `shutdown`.
    ///
    /// # Errors
    /// At start, neither mode is allowed: the message for the operator
    /// names both rights (the tier would be refused every node request).
    pub async fn run(
        &self,
        upstream: &Upstream,
        shutdown: &CancellationToken,
        refused_at_start: impl FnOnce(String),
    ) {
        let mut refused_at_start = Some(refused_at_start);
        let mut backoff = Duration::from_millis(500);
        let mut last_relearn = None;
        loop {
            let reason = match learn_node_impersonation(upstream).await {
                Ok(Some((mode, groups))) => {
                    if refused_at_start.take().is_some() {
                        tracing::info!(impersonation = ?mode, ?groups, "the tier acts upstream as its nodes by impersonation");
                    } else if mode != self.mode() {
                        tracing::warn!(impersonation = ?mode, was = ?self.mode(), ?groups, "the tier now acts upstream as its nodes by another impersonation");
                    }
                    self.set(mode);
                    backoff = Duration::from_millis(500);
                    None
                }
                Ok(None) => {
                    let version = apiserver_version(upstream).await;
                    let message = neither_message(&version);
                    match refused_at_start.take() {
                        Some(refused) => return refused(message),
                        None => tracing::error!(%message, "node requests are refused"),
                    }
                    None
                }
                Err(e) => Some(e),
            };
            match reason {
                Some(reason) => {
                    tracing::warn!(%reason, retry_in = ?backoff, "cannot yet learn how the tier may act as its nodes");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(CONFIRM_MAX_BACKOFF);
                }
                None => {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = self.relearn.notified() => {}
                    }
                    if let Some(last) = last_relearn {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep_until(last + RELEARN_INTERVAL) => {}
                        }
                    }
                    last_relearn = Some(tokio::time::Instant::now());
                }
            }
        }
    }
}

fn neither_message(version: &str) -> String {
    format!(
        "kube-apiserver {version} does not let this tier's credential act as the nodes behind \
         it: it may neither impersonate nodes by constrained impersonation (verb \
         \"impersonate:arbitrary-node\" on nodes.authentication.k8s.io, and \
         \"impersonate-on:arbitrary-node:<verb>\" on what nodes read and write; kube-apiserver \
         1.36, or 1.35 with the ConstrainedImpersonation feature) nor by legacy impersonation \
         (verb \"impersonate\" on users and on the group \"system:nodes\"); every node request \
         would be refused. Apply manifests/tier/rbac.yaml to the tier's ServiceAccount, or \
         grant one of these (docs/tier.md)"
    )
}

/// The groups the apiserver gives `user` (with `group`, if any) when the
/// proxy's credential impersonates them, by a SelfSubjectReview;
/// `Ok(None)` when the impersonation is refused (`403`).
async fn impersonated_review(
    upstream: &Upstream,
    user: &str,
    group: Option<&str>,
) -> Result<Option<Vec<String>>, String> {
    let review = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "SelfSubjectReview",
    });
    let body = serde_json::to_vec(&review).map_err(|e| e.to_string())?;
    let mut req = upstream
        .own_request(
            Method::POST,
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            Some(body),
        )
        .map_err(|e| e.to_string())?;
    let h = req.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        "impersonate-user",
        HeaderValue::from_str(user).map_err(|e| e.to_string())?,
    );
    if let Some(group) = group {
        h.insert(
            "impersonate-group",
            HeaderValue::from_str(group).map_err(|e| e.to_string())?,
        );
    }
    let (status, body) = upstream.own_exchange(req).await?;
    match status {
        StatusCode::FORBIDDEN => Ok(None),
        StatusCode::CREATED | StatusCode::OK => {
            let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
            let groups = v["status"]["userInfo"]["groups"]
                .as_array()
                .map(|g| {
                    g.iter()
                        .filter_map(|g| g.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            Ok(Some(groups))
        }
        other => Err(format!("SelfSubjectReview: {other}")),
    }
}

/// The apiserver's `gitVersion` (`GET /version`, readable by anyone), for
/// messages; `(version unknown)` when it cannot be read.
async fn apiserver_version(upstream: &Upstream) -> String {
    let read = async {
        let req = upstream.own_request(Method::GET, "/version", None).ok()?;
        let (_, body) = upstream.own_exchange(req).await.ok()?;
        let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
        v["gitVersion"].as_str().map(str::to_string)
    };
    read.await
        .unwrap_or_else(|| "(version unknown)".to_string())
}

/// The node of a `CN=system:node:<name>` client certificate.
fn certificate_node(kube_config: &kube::Config) -> Option<String> {
    let info = &kube_config.auth_info;
    let pem = match (&info.client_certificate_data, &info.client_certificate) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .ok()?,
        (None, Some(path)) => std::fs::read(path).ok()?,
        (None, None) => return None,
    };
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    let name = cn.strip_prefix("system:node:")?;
    (!name.is_empty()).then(|| name.to_string())
}

/// The node a service-account token (a JWT) is bound to: the
/// `kubernetes.io.node.name` claim. Read, not verified: the apiserver
/// verifies it on every request; this only picks how to act.
fn token_node(kube_config: &kube::Config) -> Option<String> {
    use secrecy::ExposeSecret;
    let info = &kube_config.auth_info;
    let token = match (&info.token, &info.token_file) {
        (Some(t), _) => t.expose_secret().to_string(),
        (None, Some(path)) => std::fs::read_to_string(Path::new(path)).ok()?,
        (None, None) => return None,
    };
    node_of_jwt(token.trim())
}

#[derive(Deserialize)]
struct Claims {
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
}

#[derive(Deserialize)]
struct KubernetesClaims {
    serviceaccount: Option<Named>,
    node: Option<Named>,
}

#[derive(Deserialize)]
struct Named {
    name: String,
}

fn node_of_jwt(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: Claims = serde_json::from_slice(&bytes).ok()?;
    let k = claims.kubernetes?;
    k.serviceaccount?;
    k.node.map(|n| n.name).filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::config::CachedResource;

    fn jwt(claims: serde_json::Value) -> String {
        let enc = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.sig",
            enc(br#"{"alg":"RS256"}"#),
            enc(&serde_json::to_vec(&claims).unwrap())
        )
    }

    #[test]
    fn node_bound_tokens() {
        let bound = jwt(serde_json::json!({"kubernetes.io": {
            "namespace": "kube-system",
            "serviceaccount": {"name": "kube-cache-proxy", "uid": "u"},
            "node": {"name": "node-1", "uid": "n"}}}));
        assert_eq!(node_of_jwt(&bound).as_deref(), Some("node-1"));
        let unbound = jwt(serde_json::json!({"kubernetes.io": {
            "namespace": "kube-system", "serviceaccount": {"name": "x", "uid": "u"}}}));
        assert_eq!(node_of_jwt(&unbound), None);
        assert_eq!(node_of_jwt("not-a-jwt"), None);
    }

    /// A kubeconfig-derived configuration holding a client certificate
    /// for `cn`.
    fn with_certificate(cn: &str) -> kube::Config {
        let issued = apimachinery::pki::Ca::new("identity-test")
            .unwrap()
            .issue_client(cn, Some("system:nodes"))
            .unwrap();
        let mut cfg = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        cfg.auth_info.client_certificate_data =
            Some(base64::engine::general_purpose::STANDARD.encode(&issued.cert_pem));
        cfg
    }

    fn with_token(token: &str) -> kube::Config {
        let mut cfg = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        cfg.auth_info.token = Some(token.to_string().into());
        cfg
    }

    fn bound_token(node: &str) -> String {
        jwt(serde_json::json!({"kubernetes.io": {
            "namespace": "kube-system",
            "serviceaccount": {"name": "kube-cache-proxy", "uid": "u"},
            "node": {"name": node, "uid": "n"}}}))
    }

    #[test]
    fn detect_decides_from_the_credential() {
        use IdentityMode::{AsGiven, Auto, Node};
        let node = |name: &str, credential| Identity::Node {
            name: name.into(),
            credential,
        };
        let cert = with_certificate("system:node:n1");
        assert_eq!(
            Identity::detect(&cert, Auto, ""),
            Ok(node("n1", NodeCredential::Certificate))
        );
        assert_eq!(
            Identity::detect(&cert, Node, "n1"),
            Ok(node("n1", NodeCredential::Certificate))
        );
        assert_eq!(Identity::detect(&cert, AsGiven, ""), Ok(Identity::AsGiven));
        let token = with_token(&bound_token("n2"));
        assert_eq!(
            Identity::detect(&token, Node, ""),
            Ok(node("n2", NodeCredential::AssociatedServiceAccount))
        );
        // The same from files, as kubelet's certificate and a projected
        // token are given.
        let dir = std::env::temp_dir().join(format!("kcp-identity-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let pem = base64::engine::general_purpose::STANDARD
            .decode(cert.auth_info.client_certificate_data.as_deref().unwrap())
            .unwrap();
        std::fs::write(dir.join("client.pem"), pem).unwrap();
        std::fs::write(dir.join("token"), format!("{}\n", bound_token("n3"))).unwrap();
        let mut files = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        files.auth_info.client_certificate = Some(dir.join("client.pem").display().to_string());
        assert_eq!(
            Identity::detect(&files, Auto, ""),
            Ok(node("n1", NodeCredential::Certificate))
        );
        files.auth_info.client_certificate = None;
        files.auth_info.token_file = Some(dir.join("token").display().to_string());
        assert_eq!(
            Identity::detect(&files, Auto, ""),
            Ok(node("n3", NodeCredential::AssociatedServiceAccount))
        );
        let _ = std::fs::remove_dir_all(&dir);

        // Anything else is as given under Auto, and an error under Node.
        let unbound = jwt(serde_json::json!({"kubernetes.io": {
            "namespace": "kube-system", "serviceaccount": {"name": "x", "uid": "u"}}}));
        for other in [
            with_certificate("admin"),
            with_certificate("system:node:"),
            with_token(&unbound),
            with_token("opaque"),
            kube::Config::new("https://127.0.0.1:1".parse().unwrap()),
        ] {
            assert_eq!(Identity::detect(&other, Auto, "n1"), Ok(Identity::AsGiven));
            let err = Identity::detect(&other, Node, "n1").unwrap_err();
            assert!(err.contains("upstream.identity is Node"), "{err}");
            assert!(err.contains("CN=system:node:<name>"), "{err}");
        }
        // A node's credential for another node than nodeName.
        let err = Identity::detect(&cert, Auto, "n9").unwrap_err();
        assert!(err.contains("\"n1\"") && err.contains("\"n9\""), "{err}");
        assert!(Identity::detect(&token, Node, "n9").is_err());
    }

    #[test]
    fn caches_are_scoped_to_the_node() {
        let id = Identity::Node {
            name: "n1".into(),
            credential: NodeCredential::AssociatedServiceAccount,
        };
        let mut cache = CacheConfig::default();
        id.scope_caches(&mut cache).unwrap();
        let selector = |res: &str| {
            cache
                .resources
                .iter()
                .find(|r| r.resource == res)
                .and_then(|r| r.field_selector.clone())
        };
        assert_eq!(selector("pods").as_deref(), Some("spec.nodeName=n1"));
        assert_eq!(selector("nodes").as_deref(), Some("metadata.name=n1"));
        assert_eq!(selector("services"), None);
        assert!(id.reads_as("", "pods").is_some());
        assert!(id.reads_as("discovery.k8s.io", "endpointslices").is_none());

        let mut wide = CacheConfig::default();
        wide.resources
            .push(CachedResource::new("", "v1", "configmaps"));
        assert!(id.scope_caches(&mut wide).is_err());
        let mut other = CacheConfig::default();
        other.resources[0].field_selector = Some("spec.nodeName=n2".into());
        assert!(id.scope_caches(&mut other).is_err());
        let mut templated = CacheConfig::default();
        templated.resources[0].field_selector = Some("spec.nodeName=${NODE_NAME}".into());
        assert!(id.scope_caches(&mut templated).is_ok());
        assert!(Identity::AsGiven.reads_as("", "pods").is_none());
    }
}
