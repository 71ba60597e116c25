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
use crate::body::{self, Body};
use crate::cache::Caches;
use crate::cache::resource::ResourceCache;
use crate::cache::serve::{Answer, Read, serve};
use crate::identity::{Identity, NodeCredential};
use crate::metrics::{Metrics, RequestLabels, Source};
use crate::proxy;
use crate::request::RequestInfo;
use crate::status::Status;
use crate::upstream::{Credentials, Upstream};

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
        let known_resources = crate::resource::BUILT_INS
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
        }
    }

    /// The cache that may answer this request: a GET of a cached resource
    /// (no subresource) by get, list or watch.
    fn cache_for(
        &self,
        req: &Request<Incoming>,
        info: &RequestInfo,
    ) -> Option<&Arc<ResourceCache>> {
        if req.method() != http::Method::GET
            || !info.is_resource_request
            || !info.subresource.is_empty()
            || !info.is_read()
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
        let span = tracing::debug_span!(
            "request",
            k8s.verb = %info.verb,
            k8s.resource = %info.resource,
            k8s.namespace = %info.namespace,
        );
        let extra_space = BearerHeader::of(req.headers()) == BearerHeader::ExtraSpace;
        let (mut resp, source) = self.dispatch(req, &info, conn).instrument(span).await;
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
        let credential = match Credential::of(&conn.cert, req.headers()) {
            Ok(Credential::None) if !self.auth.anonymous_enabled() => None,
            Ok(credential) => Some(credential),
            Err(_) => None,
        };
        let Some(credential) = credential else {
            return (crate::auth::unauthorized().into_response(), Source::Proxy);
        };
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
                    match self.auth.authorize(&attrs).await {
                        Ok(Decision::Allow) => {
                            if let Some(resp) = self.answer_from_cache(cache, &req, info).await {
                                return (resp, Source::Cache);
                            }
                        }
                        Ok(Decision::Deny(reason)) => {
                            return (forbidden(&attrs, &reason).into_response(), Source::Proxy);
                        }
                        Err(error) => {
                            // Upstream decides instead; it will authorize the
                            // request itself.
                            tracing::debug!(%error, "authorization unavailable; passing through");
                        }
                    }
                }
                Err(AuthFailure::Unauthorized) => {
                    return (crate::auth::unauthorized().into_response(), Source::Proxy);
                }
                Err(AuthFailure::Status(status)) => return (status.into_response(), Source::Proxy),
                Err(AuthFailure::Unavailable(error)) => {
                    tracing::debug!(%error, "authentication unavailable; passing through");
                }
            }
        }
        self.pass_through(req, info, conn, credential, identity)
            .await
    }

    /// Answers from the cache, or `None` when the cache declines.
    async fn answer_from_cache(
        &self,
        cache: &Arc<ResourceCache>,
        req: &Request<Incoming>,
        info: &RequestInfo,
    ) -> Option<Response<Body>> {
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
        };
        match serve(cache, &self.upstream, read, &self.shutdown).await {
            Answer::Served(resp) => {
                let (parts, body) = resp.into_parts();
                Some(Response::from_parts(parts, body::guarded(body, guard)))
            }
            Answer::PassThrough(_) => None,
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
            Credential::Bearer(_) | Credential::None => {
                (req.headers().clone(), Credentials::ClientHttp1)
            }
        };
        let gauge = self
            .metrics
            .in_flight
            .with_label_values(&[Source::Upstream.as_str()]);
        gauge.inc();
        let guard = InFlight(gauge);
        let result = if proxy::is_upgrade(&req) {
            proxy::forward_upgrade(&self.upstream, req, headers, credentials, conn.remote).await
        } else {
            proxy::forward(&self.upstream, req, headers, credentials, conn.remote).await
        };
        match result {
            Ok(resp) => {
                let (parts, mut body) = resp.into_parts();
                // A watch ends, cleanly, when this process stops serving:
                // its client re-watches (from the successor, after a
                // takeover) from its last resourceVersion.
                if info.verb == "watch" && parts.status == http::StatusCode::OK {
                    body = proxy::drainable_watch(
                        body,
                        parts.headers.get(header::CONTENT_TYPE),
                        self.shutdown.clone(),
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
                tracing::warn!(error = %err, verb = %info.verb, path = %info.path, "pass-through failed");
                (proxy::error_response(&err), Source::Proxy)
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
        let node = crate::identity::node_user(name);
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
