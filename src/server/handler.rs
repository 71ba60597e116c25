//! Per-request dispatch: work out what the request is and who sent it,
//! then answer it from the watch cache or pass it through.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Instant;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;
use prometheus::IntGauge;
use tracing::Instrument;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::auth::access::{Attributes, Decision, forbidden};
use crate::auth::{
    Auth, AuthFailure, BearerHeader, ClientCertificate, Credential, EXTRA_SPACE_WARNING, UserInfo,
};
use crate::cache::Caches;
use crate::cache::resource::ResourceCache;
use crate::cache::serve::view::View;
use crate::cache::serve::{Answer, Read, serve};
use crate::component::metrics::{Metrics, RequestLabels, Source};
use crate::server::kubernetes_service::KubernetesService;
use crate::server::passthrough;
use crate::upstream::identity::{Identity, NodeCredential, NodeImpersonation, TierImpersonation};
use crate::upstream::{Credentials, Upstream};
use apimachinery::body::{self, Body};
use apimachinery::request::RequestInfo;
use apimachinery::status::Status;

/// What the proxy knows about the connection a request arrived on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The client's address.
    pub remote: SocketAddr,
    /// The client certificate presented, as the x509 authenticator judges
    /// it.
    pub cert: ClientCertificate,
}

/// Serves requests.
#[derive(Debug)]
pub struct Handler {
    upstream: Upstream,
    identity: Identity,
    metrics: Metrics,
    caches: Caches,
    auth: Auth,
    shutdown: CancellationToken,
    known_resources: HashSet<String>,
    /// A tier's way of acting as nodes, learnt from the apiserver.
    node_impersonation: Arc<TierImpersonation>,
    /// kubelet's view of the `default/kubernetes` Service
    /// (`podNetwork.kubernetesService`).
    kubernetes_service: Option<Arc<KubernetesService>>,
}

/// Decrements an in-flight gauge when dropped.
struct InFlight(IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

// === impl Handler ===

impl Handler {
    /// A handler that answers reads of cached resources from `caches`
    /// (authorized by `auth`) and passes everything else to `upstream`.
    /// `shutdown` ends cache-served watches.
    pub fn new(
        upstream: Upstream,
        identity: Identity,
        metrics: Metrics,
        caches: Caches,
        auth: Auth,
        shutdown: CancellationToken,
    ) -> Handler {
        let known_resources = apimachinery::resource::BUILT_INS
            .iter()
            .map(|b| b.resource.to_string())
            .chain(caches.iter().map(|c| c.info().gvr.resource.clone()))
            .collect();
        Handler {
            upstream,
            identity,
            metrics,
            caches,
            auth,
            shutdown,
            known_resources,
            node_impersonation: Arc::default(),
            kubernetes_service: None,
        }
    }

    /// A tier's way of acting as nodes, as learnt from the apiserver
    /// ([`TierImpersonation::run`]); until then, constrained impersonation.
    #[must_use]
    pub fn with_node_impersonation(mut self, mode: Arc<TierImpersonation>) -> Handler {
        self.node_impersonation = mode;
        self
    }

    /// kubelet reads the `default/kubernetes` Service as `service` shows
    /// it (`podNetwork.kubernetesService`).
    #[must_use]
    pub fn with_kubernetes_service(mut self, service: Option<Arc<KubernetesService>>) -> Handler {
        self.kubernetes_service = service;
        self
    }

    /// The view `user` reads `info` with (`cache::serve::view`): this node's
    /// kubelet reading Services, with `podNetwork.kubernetesService` set
    /// (rewritten or not now: a change ends its watches).
    fn view_for(&self, user: Option<&UserInfo>, info: &RequestInfo) -> Option<&Arc<View>> {
        self.kubernetes_service
            .as_ref()
            .and_then(|s| s.view_for(user?, info))
    }

    /// A response answered from the cache with `view`: counted, and a
    /// watch ends when the view changes, so its client relists.
    fn viewed(&self, resp: Response<Body>, info: &RequestInfo, view: bool) -> Response<Body> {
        match &self.kubernetes_service {
            Some(service) if view => {
                let result = if service.is_active() {
                    "rewritten"
                } else {
                    "real"
                };
                service.count(&info.verb, result);
                if info.verb == "watch" {
                    service.ends_on_change(resp)
                } else {
                    resp
                }
            }
            _ => resp,
        }
    }

    /// The cache that may answer this request: a GET of a cached resource
    /// (no subresource) by get, list or watch, on a path the apiserver
    /// routes to exactly these fields ([`RequestInfo::routable`]). A
    /// namespace `.` or `..` (of a namespaced resource: the namespace
    /// `..` itself is a name the registry refuses) is left to the
    /// apiserver: its storage refuses the key (`500`, `invalid key:
    /// "/pods/."`), naming the resource's storage prefix, which the cache
    /// does not know.
    fn cache_for(
        &self,
        req: &Request<Incoming>,
        info: &RequestInfo,
    ) -> Option<&Arc<ResourceCache>> {
        if req.method() != http::Method::GET
            || !info.routable
            || !info.subresource.is_empty()
            || !info.is_read()
            || (matches!(info.namespace.as_str(), "." | "..") && info.resource != "namespaces")
        {
            return None;
        }
        self.caches
            .get(&info.api_group, &info.api_version, &info.resource)
    }

    /// Answers one request. Never fails: errors become `Status` responses.
    pub async fn handle(&self, req: Request<Incoming>, conn: &ConnInfo) -> Response<Body> {
        let start = Instant::now();
        let info = RequestInfo::parse(req.method(), req.uri().path(), req.uri().query());
        let labels = RequestLabels::of(
            req.method(),
            req.uri().query(),
            req.headers(),
            &info,
            self.known_resources.contains(&info.resource),
        );
        // Decoded from the path, these may hold any character: logged
        // escaped, so a `%0A` cannot forge a log line.
        let span = tracing::debug_span!(
            "request",
            k8s.verb = %info.verb,
            k8s.resource = %info.resource.escape_debug(),
            k8s.namespace = %info.namespace.escape_debug(),
        );
        let extra_space = BearerHeader::of(req.headers()) == BearerHeader::ExtraSpace;
        let (mut resp, source) = if info.malformed_path {
            (malformed_request_line(req.version()), Source::Proxy)
        } else {
            self.dispatch(req, &info, conn).instrument(span).await
        };
        if extra_space {
            warn_extra_space(&mut resp);
        }
        self.observe(&labels, &resp, source, start);
        resp
    }

    async fn dispatch(
        &self,
        req: Request<Incoming>,
        info: &RequestInfo,
        conn: &ConnInfo,
    ) -> (Response<Body>, Source) {
        let websocket = apimachinery::request::is_websocket_request(req.headers());
        let credential = match Credential::of(&conn.cert, req.headers(), websocket) {
            Ok(Credential::None) if !self.auth.anonymous_enabled() => None,
            Ok(credential) => Some(credential),
            Err(_) => None,
        };
        let Some(credential) = credential else {
            return (crate::auth::unauthorized().into_response(), Source::Proxy);
        };
        let mut req = req;
        // The user the request acts as, once known.
        let mut identity: Option<UserInfo> = None;
        let cache = self.cache_for(&req, info).filter(|cache| {
            match crate::cache::serve::passes_through_early(info, req.uri().query()) {
                Some(reason) => {
                    cache.metrics.read(&info.verb, "upstream", reason);
                    false
                }
                None => true,
            }
        });
        if let Some(cache) = cache {
            match self
                .auth
                .identify(&credential, req.headers(), info, req.uri().query())
                .await
            {
                Ok(user) => {
                    let attrs = Attributes::for_request(&user, info, req.uri().query());
                    identity = Some(user);
                    let view = self.view_for(identity.as_ref(), info);
                    match self.auth.authorize(&attrs).await {
                        Ok(Decision::Allow) => {
                            match self.answer_from_cache(cache, &req, info, view).await {
                                Ok(resp) => {
                                    let resp = self.viewed(resp, info, view.is_some());
                                    // Who watches what, for `status`.
                                    let resp = match &identity {
                                        Some(user) if info.verb == "watch" => {
                                            let (parts, body) = resp.into_parts();
                                            let watching = cache.watching(&user.name);
                                            Response::from_parts(
                                                parts,
                                                body::guarded(body, watching),
                                            )
                                        }
                                        _ => resp,
                                    };
                                    let resp = if websocket && info.verb == "watch" {
                                        upgrade_watch(&mut req, &credential, resp)
                                    } else {
                                        resp
                                    };
                                    return (resp, Source::Cache);
                                }
                                Err(reason)
                                    if info.verb == "watch"
                                        && crate::cache::serve::is_transient(reason) =>
                                {
                                    catch_up_only(&mut req);
                                }
                                Err(_) => {}
                            }
                        }
                        // The message quotes the request's names as Go's
                        // `%q`, exactly reproduced for ASCII: others are
                        // refused by the apiserver itself.
                        Ok(Decision::Deny(_)) if !attrs.quotes_exactly() => {}
                        Ok(Decision::Deny(reason)) => {
                            return (forbidden(&attrs, &reason).into_response(), Source::Proxy);
                        }
                        Err(error) => {
                            // The node reading what the proxy itself reads
                            // as that node (a node rebooted during an
                            // outage: no earlier answer to stand in): the
                            // apiserver authorized the cache's own
                            // list+watch of the whole scope as this node;
                            // nothing beyond the scope is served.
                            if identity.as_ref().is_some_and(|u| {
                                self.identity
                                    .reads_resource_as(u, &info.api_group, &info.resource)
                            }) {
                                tracing::debug!(%error, "authorization unavailable; the node reads its own cache");
                                if let Ok(resp) =
                                    self.answer_from_cache(cache, &req, info, view).await
                                {
                                    let resp = self.viewed(resp, info, view.is_some());
                                    let resp = if websocket && info.verb == "watch" {
                                        upgrade_watch(&mut req, &credential, resp)
                                    } else {
                                        resp
                                    };
                                    return (resp, Source::Cache);
                                }
                            }
                            // Upstream decides instead; it will authorize the
                            // request itself.
                            tracing::debug!(%error, "authorization unavailable; passing through");
                            if info.verb == "watch" {
                                catch_up_only(&mut req);
                            }
                        }
                    }
                }
                // A rejected `Authorization` token leaves the apiserver's
                // chain to try a token subprotocol: it decides.
                Err(AuthFailure::Unauthorized)
                    if websocket
                        && matches!(credential, Credential::Bearer(_))
                        && crate::auth::ProtocolToken::of(req.headers())
                            != crate::auth::ProtocolToken::None => {}
                Err(AuthFailure::Unauthorized) => {
                    return (crate::auth::unauthorized().into_response(), Source::Proxy);
                }
                Err(AuthFailure::Status(status)) => return (status.into_response(), Source::Proxy),
                Err(AuthFailure::Unavailable(error)) => {
                    tracing::debug!(%error, "authentication unavailable; passing through");
                    if info.verb == "watch" {
                        catch_up_only(&mut req);
                    }
                }
            }
        }
        if let Some(service) = &self.kubernetes_service
            && identity
                .as_ref()
                .is_some_and(|user| service.is_kubelet_services_read(user, info))
        {
            service.count(&info.verb, "passed_through");
        }
        self.pass_through(req, info, conn, credential, identity)
            .await
    }

    /// Answers from the cache, or why the cache declines.
    async fn answer_from_cache(
        &self,
        cache: &Arc<ResourceCache>,
        req: &Request<Incoming>,
        info: &RequestInfo,
        view: Option<&Arc<View>>,
    ) -> Result<Response<Body>, &'static str> {
        let gauge = self
            .metrics
            .in_flight
            .with_label_values(&[Source::Cache.as_str()]);
        gauge.inc();
        let guard = InFlight(gauge);
        let read = Read {
            info,
            query: req.uri().query(),
            headers: req.headers(),
            arrived: Instant::now(),
            window: req.extensions().get(),
            view,
        };
        match serve(cache, &self.upstream, read, &self.shutdown).await {
            Answer::Served(resp) => {
                let (parts, body) = resp.into_parts();
                Ok(Response::from_parts(parts, body::guarded(body, guard)))
            }
            Answer::PassThrough(reason) => Err(reason),
        }
    }

    async fn pass_through(
        &self,
        req: Request<Incoming>,
        info: &RequestInfo,
        conn: &ConnInfo,
        credential: Credential,
        identity: Option<UserInfo>,
    ) -> (Response<Body>, Source) {
        // A tier's node request, forwarded by impersonation: a refusal
        // may mean the apiserver no longer treats it as the node.
        let mut node_impersonated = false;
        let (headers, credentials) = match &credential {
            // Certificate users travel on the proxy's credentials,
            // impersonated; what they asked to impersonate is checked first.
            // As a node, the proxy forwards only its node's own requests.
            Credential::Certificate(user) if self.identity.node().is_some() => {
                match self.as_node(user, req.headers()) {
                    Ok(headers) => (headers, Credentials::Proxy),
                    Err(status) => return (status.into_response(), Source::Proxy),
                }
            }
            // A tier forwards nodes (node proxies, their kubelets) as
            // themselves.
            Credential::Certificate(user) if self.identity == Identity::Tier => {
                node_impersonated = true;
                match as_any_node(user, req.headers(), self.node_impersonation.mode()) {
                    Ok(headers) => (headers, Credentials::Proxy),
                    Err(status) => return (status.into_response(), Source::Proxy),
                }
            }
            Credential::Certificate(user) => {
                let target = match identity {
                    Some(target) => target,
                    None if impersonation_requested(req.headers()) => {
                        match self
                            .auth
                            .identify(&credential, req.headers(), info, req.uri().query())
                            .await
                        {
                            Ok(target) => target,
                            Err(AuthFailure::Unauthorized) => {
                                return (
                                    crate::auth::unauthorized().into_response(),
                                    Source::Proxy,
                                );
                            }
                            Err(AuthFailure::Status(status)) => {
                                return (status.into_response(), Source::Proxy);
                            }
                            Err(AuthFailure::Unavailable(error)) => {
                                return (
                                    Status::service_unavailable(format!(
                                        "impersonation could not be authorized: {error}"
                                    ))
                                    .into_response(),
                                    Source::Proxy,
                                );
                            }
                        }
                    }
                    None => user.clone(),
                };
                let mut headers = without_identity_headers(req.headers());
                impersonate(&mut headers, &target);
                (headers, Credentials::Proxy)
            }
            // Tokens and anonymous requests travel as they are; the
            // apiserver authenticates and authorizes them itself. Over
            // HTTP/2 only a token known to be valid: the apiserver ends an
            // HTTP/2 connection after an unauthenticated or anonymous
            // request, and other clients' requests share it.
            Credential::Bearer(token) if self.auth.tokens().known_authenticated(token).await => {
                (req.headers().clone(), Credentials::Client)
            }
            Credential::Bearer(_) | Credential::WebSocket { .. } | Credential::None => {
                (req.headers().clone(), Credentials::ClientHttp1)
            }
        };
        let gauge = self
            .metrics
            .in_flight
            .with_label_values(&[Source::Upstream.as_str()]);
        gauge.inc();
        let guard = InFlight(gauge);
        // Subscribed before sending: a switch of upstream after it ends a
        // passed-through watch (its client re-watches, from the server that
        // is now active).
        let site_changed = self.upstream.site_changed();
        let result = if passthrough::is_upgrade(&req) {
            passthrough::forward_upgrade(&self.upstream, req, headers, credentials, conn.remote)
                .await
        } else {
            passthrough::forward(&self.upstream, req, headers, credentials, conn.remote).await
        };
        match result {
            Ok(resp) => {
                let (parts, mut body) = resp.into_parts();
                if node_impersonated && parts.status == http::StatusCode::FORBIDDEN {
                    self.node_impersonation.refused();
                }
                // A watch ends, cleanly, when this process stops serving:
                // its client re-watches (from the successor, after a
                // takeover) from its last resourceVersion.
                if info.verb == "watch" && parts.status == http::StatusCode::OK {
                    let shutdown = self.shutdown.child_token().cancelled_owned();
                    let moved = site_changed;
                    body = passthrough::drainable_watch(
                        body,
                        parts.headers.get(header::CONTENT_TYPE),
                        async move {
                            tokio::select! {
                                () = shutdown => {}
                                () = moved => {}
                            }
                        },
                    );
                }
                (
                    Response::from_parts(parts, body::guarded(body, guard)),
                    Source::Upstream,
                )
            }
            Err(err) => {
                self.metrics
                    .upstream_errors
                    .with_label_values(&[err.reason()])
                    .inc();
                tracing::warn!(error = %err, verb = %info.verb, path = %info.path.escape_debug(), "pass-through failed");
                (passthrough::error_response(&err), Source::Proxy)
            }
        }
    }

    /// The upstream headers of a certificate user's request when the proxy
    /// acts as its node: the node's own requests go as the node (by its
    /// certificate, or impersonated); anyone else's cannot be forwarded.
    fn as_node(&self, user: &UserInfo, headers: &HeaderMap) -> Result<HeaderMap, Box<Status>> {
        let Identity::Node { name, credential } = &self.identity else {
            return Err(Box::new(Status::new(
                http::StatusCode::FORBIDDEN,
                "Forbidden",
                "kube-cache-proxy does not act as a node",
            )));
        };
        let node = crate::upstream::identity::node_user(name);
        if user.name != node {
            return Err(Box::new(Status::new(
                http::StatusCode::FORBIDDEN,
                "Forbidden",
                format!(
                    "kube-cache-proxy acts upstream only as node {name:?}; the request of {:?} \
                     (client certificate) cannot be forwarded with the node's rights: send it \
                     with a bearer token, or to the apiserver directly",
                    user.name
                ),
            )));
        }
        if impersonation_requested(headers) {
            return Err(Box::new(Status::new(
                http::StatusCode::FORBIDDEN,
                "Forbidden",
                format!(
                    "kube-cache-proxy acts upstream as node {name:?} and cannot forward \
                     impersonation requested with a client certificate"
                ),
            )));
        }
        let mut out = without_identity_headers(headers);
        if *credential == NodeCredential::AssociatedServiceAccount
            && let Ok(v) = HeaderValue::from_str(&node)
        {
            out.insert("impersonate-user", v);
        }
        Ok(out)
    }

    fn observe(&self, l: &RequestLabels, resp: &Response<Body>, source: Source, start: Instant) {
        self.metrics
            .requests
            .with_label_values(&[
                l.verb,
                &l.group,
                &l.resource,
                &l.subresource,
                l.scope,
                resp.status().as_str(),
                source.as_str(),
            ])
            .inc();
        self.metrics
            .request_duration
            .with_label_values(&[
                l.verb,
                &l.group,
                &l.resource,
                &l.subresource,
                l.scope,
                source.as_str(),
            ])
            .observe(start.elapsed().as_secs_f64());
    }
}

/// A watch served from the cache, as a WebSocket when the request asks
/// for one (see [`crate::server::websocket`]): once the watch is established
/// (`200`), the handshake is checked against the request as the
/// authentication filter left it (a token subprotocol that authenticated
/// the request removed), and the watch switches protocols or is refused.
/// Watches that could not start (errors) are answered as they are.
fn upgrade_watch(
    req: &mut Request<Incoming>,
    credential: &Credential,
    resp: Response<Body>,
) -> Response<Body> {
    if resp.status() != http::StatusCode::OK {
        return resp;
    }
    // hyper hands the connection over only for `Connection: upgrade`
    // (a token); Go also takes `Connection: upgraded`.
    let Some(on_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return resp;
    };
    let rewritten;
    let headers = match credential {
        Credential::WebSocket { protocols, .. } => {
            let mut h = req.headers().clone();
            h.remove(header::SEC_WEBSOCKET_PROTOCOL);
            if let Ok(v) = HeaderValue::from_str(protocols) {
                h.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
            }
            rewritten = h;
            &rewritten
        }
        _ => req.headers(),
    };
    match crate::server::websocket::handshake(req.method(), req.uri(), headers) {
        Ok(accepted) => crate::server::websocket::serve(on_upgrade, accepted, resp),
        Err(refusal) => refusal,
    }
}

/// What Go's HTTP server answers when the request target does not parse
/// (`url.ParseRequestURI`: a malformed percent-escape), before any
/// handler: `400 Bad Request` in plain text, closing an HTTP/1.x
/// connection. (Over HTTP/2 it resets the stream instead.)
fn malformed_request_line(version: http::Version) -> Response<Body> {
    let mut resp = Response::new(body::full(bytes::Bytes::from_static(b"400 Bad Request")));
    *resp.status_mut() = http::StatusCode::BAD_REQUEST;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if version < http::Version::HTTP_2 {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// Adds the apiserver's warning about an ignored `Authorization: Bearer  x`
/// header, unless the response already carries it (the apiserver's own,
/// when the header was passed through).
fn warn_extra_space(resp: &mut Response<Body>) {
    let warning = HeaderValue::from_static(EXTRA_SPACE_WARNING);
    if !resp
        .headers()
        .get_all(header::WARNING)
        .iter()
        .any(|v| *v == warning)
    {
        resp.headers_mut().append(header::WARNING, warning);
    }
}

/// The upstream headers of a node's certificate request at a tier proxy:
/// `Impersonate-User: system:node:<n>` alone, which kube-apiserver (1.35+
/// with `ConstrainedImpersonation`, default from 1.36) decides by its
/// `arbitrary-node` mode (the tier's `impersonate:arbitrary-node` and
/// `impersonate-on:arbitrary-node:<verb>`), so the node is in exactly
/// `system:nodes` and the Node authorizer and NodeRestriction apply as to
/// the node's own credential. Anyone else's certificate request cannot be
/// forwarded.
fn as_any_node(
    user: &UserInfo,
    headers: &HeaderMap,
    mode: NodeImpersonation,
) -> Result<HeaderMap, Box<Status>> {
    let is_node = user.name.starts_with("system:node:")
        && user
            .groups
            .iter()
            .any(|g| g == apimachinery::impersonation::NODES_GROUP);
    if !is_node {
        return Err(Box::new(Status::new(
            http::StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "kube-cache-proxy is a tier proxy and acts upstream only as nodes; the request \
                 of {:?} (client certificate) cannot be forwarded: send it with a bearer \
                 token, or to the apiserver directly",
                user.name
            ),
        )));
    }
    if impersonation_requested(headers) {
        return Err(Box::new(Status::new(
            http::StatusCode::FORBIDDEN,
            "Forbidden",
            "kube-cache-proxy is a tier proxy and cannot forward impersonation requested with a \
             client certificate",
        )));
    }
    let mut out = without_identity_headers(headers);
    if let Ok(v) = HeaderValue::from_str(&user.name) {
        out.insert("impersonate-user", v);
    }
    if mode == NodeImpersonation::Legacy {
        out.insert(
            "impersonate-group",
            HeaderValue::from_static(apimachinery::impersonation::NODES_GROUP),
        );
    }
    Ok(out)
}

/// The longest a watch passed through only because its resourceVersion is
/// older than the cache's history may last upstream, in seconds.
const CATCH_UP_WATCH_SECONDS: u64 = 60;

/// Shortens a watch of a cached resource passed through only for a passing
/// reason: its resourceVersion older than the cache's history (the proxy,
/// or a tier, restarted), the cache not ready or not shown fresh yet, or
/// authentication or authorization unavailable for a moment. With
/// bookmarks allowed, its `timeoutSeconds` becomes at most
/// [`CATCH_UP_WATCH_SECONDS`]. The apiserver then ends it at that time
/// with a bookmark at its current resourceVersion two seconds before, so
/// the client's next watch starts within the cache's history and is served
/// from the cache, rather than keeping a watch on the apiserver for its
/// whole life (30-60 minutes). Ending a watch is always the server's
/// right; clients re-watch from their last resourceVersion.
fn catch_up_only<B>(req: &mut Request<B>) {
    use apimachinery::url::{Mode, query_get, unescape};
    let Some(query) = req.uri().query() else {
        return;
    };
    // Read as the apiserver's parameter codec reads them (the first value).
    let bookmarks = query_get(Some(query), "allowWatchBookmarks").as_deref() == Some("true");
    let short = query_get(Some(query), "timeoutSeconds")
        .is_some_and(|t| t.parse::<u64>().is_ok_and(|t| t <= CATCH_UP_WATCH_SECONDS));
    if !bookmarks || short {
        return;
    }
    // Every other parameter is kept byte for byte.
    let mut kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let key = pair.split_once('=').map_or(*pair, |(k, _)| k);
            !unescape(key, Mode::QueryComponent).is_ok_and(|k| &*k == b"timeoutSeconds")
        })
        .collect();
    let timeout = format!("timeoutSeconds={CATCH_UP_WATCH_SECONDS}");
    kept.push(&timeout);
    let pq = format!("{}?{}", req.uri().path(), kept.join("&"));
    let mut parts = req.uri().clone().into_parts();
    if let Ok(pq) = pq.parse() {
        parts.path_and_query = Some(pq);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
}

/// Whether the client asks to impersonate someone.
fn impersonation_requested(headers: &HeaderMap) -> bool {
    headers
        .keys()
        .any(|k| k.as_str().starts_with("impersonate-"))
}

/// A copy of `headers` without credentials or identity assertions.
pub fn without_identity_headers(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    out.remove(header::AUTHORIZATION);
    let names: Vec<HeaderName> = out
        .keys()
        .filter(|k| {
            let k = k.as_str();
            k.starts_with("impersonate-") || k.starts_with("x-remote-")
        })
        .cloned()
        .collect();
    for name in names {
        out.remove(name);
    }
    out
}

/// Adds `Impersonate-User`, `-Uid`, `-Group` and `-Extra-*` for `user`.
/// `system:authenticated` is not sent: the apiserver adds it to every
/// impersonated user itself, and asking for it would need one more grant.
pub fn impersonate(headers: &mut HeaderMap, user: &UserInfo) {
    if let Ok(v) = HeaderValue::from_str(&user.name) {
        headers.insert("impersonate-user", v);
    }
    if !user.uid.is_empty()
        && let Ok(v) = HeaderValue::from_str(&user.uid)
    {
        headers.insert("impersonate-uid", v);
    }
    for g in &user.groups {
        if g == crate::auth::AUTHENTICATED_GROUP {
            continue;
        }
        if let Ok(v) = HeaderValue::from_str(g) {
            headers.append("impersonate-group", v);
        }
    }
    for (key, values) in &user.extra {
        // Header names are case-insensitive, so keys are percent-encoded
        // (and lowercased by the apiserver on the way back).
        let encoded = percent_encoding::utf8_percent_encode(key, EXTRA_KEY).to_string();
        let Ok(name) = HeaderName::from_bytes(format!("impersonate-extra-{encoded}").as_bytes())
        else {
            continue;
        };
        for v in values {
            if let Ok(v) = HeaderValue::from_str(v) {
                headers.append(name.clone(), v);
            }
        }
    }
}

/// Characters escaped in `Impersonate-Extra-` keys: everything but
/// unreserved URL characters.
const EXTRA_KEY: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_catch_up_watch_is_capped_at_a_minute_with_bookmarks_only() {
        let capped = |uri: &str| {
            let mut req = Request::get(uri).body(()).unwrap();
            catch_up_only(&mut req);
            req.uri().to_string()
        };
        assert_eq!(
            capped("/api/v1/pods?watch=1&resourceVersion=5&allowWatchBookmarks=true"),
            "/api/v1/pods?watch=1&resourceVersion=5&allowWatchBookmarks=true&timeoutSeconds=60"
        );
        assert_eq!(
            capped(
                "/api/v1/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=1800&resourceVersion=5"
            ),
            "/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion=5&timeoutSeconds=60"
        );
        // Already short, or no bookmarks to carry the client forward: as is.
        for uri in [
            "/api/v1/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=30",
            "/api/v1/pods?watch=1&resourceVersion=5",
        ] {
            assert_eq!(capped(uri), uri);
        }
    }

    #[test]
    fn identity_headers_are_replaced_by_impersonation() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        h.insert("impersonate-user", HeaderValue::from_static("root"));
        h.insert("x-remote-user", HeaderValue::from_static("root"));
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(impersonation_requested(&h));
        let mut user = UserInfo::new("system:node:n1", &["system:nodes", "system:authenticated"]);
        user.extra
            .insert("example.com/Scope".into(), vec!["a".into()]);
        let mut out = without_identity_headers(&h);
        impersonate(&mut out, &user);
        assert!(!out.contains_key(header::AUTHORIZATION));
        assert!(!out.contains_key("x-remote-user"));
        assert_eq!(out["impersonate-user"], "system:node:n1");
        let groups: Vec<_> = out.get_all("impersonate-group").iter().collect();
        assert_eq!(groups, vec!["system:nodes"]);
        assert_eq!(out["impersonate-extra-example.com%2fscope"], "a");
        assert_eq!(out[header::ACCEPT], "application/json");
    }
}
