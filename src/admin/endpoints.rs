//! The admin listener: plain HTTP on its own port, serving `/metrics`,
//! `/healthz`, `/livez`, `/readyz` and `/debug/caches` (the caches' counts,
//! resourceVersions and ages as JSON, for `kube-cache-proxy status`: see
//! [`crate::cache::status`]). It never serves cluster data, and,
//! unauthenticated, listens on loopback only (`adminListen`); metrics and
//! health beyond the node are the metrics listener's
//! ([`crate::admin::metrics_listener`]).
//!
//! Health bodies follow kube-apiserver's format: `ok`, or with `?verbose`
//! one `[+]check ok` / `[-]check failed: reason` line per check and a
//! closing `readyz check passed` / `readyz check failed`; failures answer
//! `500`, as the apiserver's health handlers do.

use std::convert::Infallible;
use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cache::resource::ResourceCache;
use crate::component::metrics::Metrics;
use crate::component::ready::Readiness;
use crate::server::accept;
use crate::server::kubernetes_service::KubernetesService;
use crate::server::tls::ServerTls;
use apimachinery::body::{self, Body};

/// What the admin endpoints read.
#[derive(Debug, Clone)]
pub struct Admin {
    pub metrics: Metrics,
    pub readiness: Readiness,
    /// The serving certificate, for its expiry metric.
    pub tls: Option<ServerTls>,
    /// The caches `/debug/caches` describes (none: it answers `404`).
    pub caches: Option<Vec<Arc<ResourceCache>>>,
    /// The upstream servers it describes.
    pub upstream: Option<crate::upstream::Upstream>,
    /// kubelet's view of the `default/kubernetes` Service it describes.
    pub kubernetes_service: Option<Arc<KubernetesService>>,
}

// === impl Admin ===

impl Admin {
    /// What the metrics listener, reachable beyond the node, may read:
    /// metrics and health only.
    pub fn metrics_only(&self) -> Admin {
        Admin {
            metrics: self.metrics.clone(),
            readiness: self.readiness.clone(),
            tls: self.tls.clone(),
            caches: None,
            upstream: None,
            kubernetes_service: None,
        }
    }

    /// Serves admin requests on `listener` until `shutdown` is cancelled.
    /// The admin port stays up during the drain so probes see not-ready.
    pub async fn serve(self, listener: TcpListener, shutdown: CancellationToken) {
        let admin = Arc::new(self);
        while let Some((tcp, _)) = accept::next(&listener, &shutdown, "admin").await {
            let admin = admin.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let admin = admin.clone();
                    async move { Ok::<_, Infallible>(admin.handle(&req)) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let conn = builder.serve_connection(TokioIo::new(tcp), svc);
                tokio::select! {
                    _ = conn => {}
                    _ = shutdown.cancelled() => {}
                }
            });
        }
    }

    /// Answers one admin request.
    pub fn handle(&self, req: &Request<Incoming>) -> Response<Body> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed\n".into(),
            );
        }
        let verbose = req.uri().query().is_some_and(|q| {
            q.split('&')
                .any(|p| p == "verbose" || p.starts_with("verbose="))
        });
        match req.uri().path() {
            "/metrics" => {
                self.metrics.ready.set(i64::from(self.readiness.is_ready()));
                if let Some(t) = self.tls.as_ref().and_then(ServerTls::not_after) {
                    self.metrics.serving_certificate_expiry.set(t);
                }
                let mut r = text(StatusCode::OK, self.metrics.encode());
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                r
            }
            "/livez" | "/healthz" => health("livez", vec![("ping".into(), Ok(()))], verbose),
            "/readyz" => {
                let mut checks = vec![("ping".to_string(), Ok(()))];
                checks.extend(self.readiness.report());
                health("readyz", checks, verbose)
            }
            "/debug/caches" if self.caches.is_some() => {
                let mut caches: Vec<_> = self
                    .caches
                    .iter()
                    .flatten()
                    .map(|c| crate::cache::status::of(c))
                    .collect();
                caches.sort_by(|a, b| (&a.group, &a.resource).cmp(&(&b.group, &b.resource)));
                let (servers, failures) = self
                    .upstream
                    .as_ref()
                    .map(crate::upstream::Upstream::servers)
                    .unwrap_or_default();
                let status = crate::cache::status::Status {
                    caches,
                    upstream: crate::cache::status::servers(servers),
                    primary_connect_failures: failures,
                    kubernetes_service: self.kubernetes_service.as_ref().map(|k| k.status()),
                };
                let json = serde_json::to_string_pretty(&status).unwrap_or_default();
                let mut r = text(StatusCode::OK, json + "\n");
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                r
            }
            _ => text(StatusCode::NOT_FOUND, "404 page not found\n".into()),
        }
    }
}

fn health(kind: &str, checks: Vec<(String, Result<(), String>)>, verbose: bool) -> Response<Body> {
    let failed = checks.iter().any(|(_, r)| r.is_err());
    if !verbose && !failed {
        return text(StatusCode::OK, "ok".into());
    }
    let mut out = String::new();
    for (name, result) in &checks {
        match result {
            Ok(()) => out.push_str(&format!("[+]{name} ok\n")),
            Err(reason) => out.push_str(&format!("[-]{name} failed: {reason}\n")),
        }
    }
    if failed {
        out.push_str(&format!("{kind} check failed\n"));
        text(StatusCode::INTERNAL_SERVER_ERROR, out)
    } else {
        out.push_str(&format!("{kind} check passed\n"));
        text(StatusCode::OK, out)
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(body::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}
