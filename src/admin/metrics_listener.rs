//! The metrics listener (`metricsListen`): `/metrics` beyond loopback,
//! only for callers the apiserver would let read it.
//!
//! As kubelet and kube-apiserver serve their own `/metrics`: HTTPS with the
//! proxy's serving certificate; the caller authenticates with a client
//! certificate of `tls.clientCAFile` or a bearer token (a TokenReview
//! upstream), never anonymously (`401`), and must be allowed `get` on the
//! non-resource URL `/metrics` (a SubjectAccessReview; `403` otherwise),
//! which the built-in ClusterRole `system:monitoring` grants, as does
//! kube-prometheus's Prometheus role. Decisions and tokens are cached like
//! the proxy's others (`authentication`, `authorization`). `/healthz`,
//! `/livez` and `/readyz` are open, like kube-scheduler's
//! `--authorization-always-allow-paths`: they carry no cluster data. Any
//! other path is authorized first, then `404`.
//!
//! The plain-HTTP admin listener (`adminListen`) stays on loopback.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::endpoints::Admin;
use crate::auth::access::{Attributes, Decision, forbidden};
use crate::auth::{Auth, AuthFailure, ClientCertificate, Credential};
use crate::server::accept;
use crate::server::serve::client_certificate;
use crate::server::tls::ServerTls;
use apimachinery::body::Body;
use apimachinery::request::RequestInfo;
use apimachinery::status::Status;

/// Paths answered without authentication: health, no cluster data.
const ALWAYS_ALLOWED: &[&str] = &["/healthz", "/livez", "/readyz"];
/// Connections served at once (Prometheus needs one or two).
const MAX_CONNECTIONS: usize = 64;
/// Bound on reading an HTTP/1.1 request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves the admin endpoints to authenticated, authorized callers.
#[derive(Debug)]
pub struct MetricsListener {
    /// What the endpoints read (the admin listener's).
    pub admin: Admin,
    /// The serving certificate and client CA.
    pub tls: ServerTls,
    /// Authentication (TokenReview) and authorization
    /// (SubjectAccessReview) upstream.
    pub auth: Auth,
}

// === impl MetricsListener ===

impl MetricsListener {
    /// Serves on `listener` until `shutdown` is cancelled.
    pub async fn serve(self, listener: TcpListener, shutdown: CancellationToken) {
        let this = Arc::new(self);
        let acceptor = TlsAcceptor::from(this.tls.config());
        let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let permit = tokio::select! {
                _ = shutdown.cancelled() => return,
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let Some((tcp, _)) = accept::next(&listener, &shutdown, "metrics").await else {
                return;
            };
            let (this, acceptor, shutdown) = (this.clone(), acceptor.clone(), shutdown.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let tls = match accept::handshake(&acceptor, tcp).await {
                    Ok(tls) => tls,
                    Err(error) => {
                        tracing::debug!(%error, "metrics TLS handshake failed");
                        return;
                    }
                };
                let cert = Arc::new(client_certificate(
                    &this.tls,
                    tls.get_ref().1.peer_certificates(),
                ));
                let svc = service_fn(move |req| {
                    let (this, cert) = (this.clone(), cert.clone());
                    async move { Ok::<_, Infallible>(this.handle(&req, &cert).await) }
                });
                let mut builder = auto::Builder::new(TokioExecutor::new());
                builder
                    .http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT);
                let conn = builder.serve_connection(TokioIo::new(tls), svc);
                tokio::select! {
                    _ = conn => {}
                    _ = shutdown.cancelled() => {}
                }
            });
        }
    }

    /// Answers one request: health at once; anything else once the caller
    /// is authenticated (`401`) and authorized (`403`).
    pub async fn handle(
        &self,
        req: &Request<Incoming>,
        cert: &ClientCertificate,
    ) -> Response<Body> {
        let path = req.uri().path();
        if ALWAYS_ALLOWED.contains(&path) {
            return self.admin.handle(req);
        }
        let credential = match Credential::of(cert, req.headers(), false) {
            Ok(Credential::None) | Err(_) => return Status::unauthorized().into_response(),
            Ok(credential) => credential,
        };
        let info = RequestInfo::parse(req.method(), path, req.uri().query());
        let user = match self
            .auth
            .identify(&credential, req.headers(), &info, req.uri().query())
            .await
        {
            Ok(user) => user,
            Err(AuthFailure::Status(status)) => return status.into_response(),
            Err(AuthFailure::Unauthorized) => return Status::unauthorized().into_response(),
            // As the apiserver's token webhook: an error is no identity.
            Err(AuthFailure::Unavailable(error)) => {
                tracing::warn!(%error, "metrics: token review failed");
                return Status::unauthorized().into_response();
            }
        };
        let attrs = Attributes::for_request(&user, &info, req.uri().query());
        match self.auth.authorize(&attrs).await {
            Ok(Decision::Allow) => self.admin.handle(req),
            Ok(Decision::Deny(reason)) => forbidden(&attrs, &reason).into_response(),
            // As the apiserver's authorization filter: 500.
            Err(error) => {
                tracing::warn!(%error, "metrics: authorization failed");
                Status::internal(format!("Internal Server Error: {path:?}: {error}"))
                    .into_response()
            }
        }
    }
}
