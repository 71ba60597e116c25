//! Requests to one server: their URI under its base URL, the proxy's own
//! requests, the proxy's `Authorization`, sending on a pool chosen by
//! [`Credentials`], and HTTP/1.1 connections of their own for upgrades.

use std::sync::Arc;

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tower::ServiceExt;

use super::error::{UpstreamError, error_chain};
use super::pool::UpstreamBody;
use super::site::{Credentials, Site};
use apimachinery::body::Body;

impl Site {
    /// The upstream URI for a request's path and query, under the base
    /// URL's path (some clusters serve the API under a prefix).
    ///
    /// # Errors
    /// When the joined URI is invalid.
    pub fn uri(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, UpstreamError> {
        let prefix = self.base.path().trim_end_matches('/');
        let pq = path_and_query.map_or("/", PathAndQuery::as_str);
        let mut parts = self.base.clone().into_parts();
        parts.path_and_query = Some(
            format!("{prefix}{pq}")
                .parse()
                .map_err(|e| UpstreamError::Request(format!("invalid path: {e}")))?,
        );
        Uri::from_parts(parts).map_err(|e| UpstreamError::Request(format!("invalid URI: {e}")))
    }

    /// A request the proxy makes for itself (reflector lists and watches,
    /// reviews, its CSR): `path_and_query` under the base URL, accepting
    /// JSON, sending `body` as JSON if any, with the proxy's `User-Agent`.
    /// Send it with [`Credentials::Proxy`].
    ///
    /// # Errors
    /// When `path_and_query` does not make a valid URI.
    pub fn own_request(
        &self,
        method: http::Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Request<Body>, UpstreamError> {
        let pq = path_and_query
            .parse()
            .map_err(|e| UpstreamError::Request(format!("invalid path: {e}")))?;
        let uri = self.uri(Some(&pq))?;
        let has_body = body.is_some();
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .body(body.map_or_else(apimachinery::body::empty, apimachinery::body::full))
            .map_err(|e| UpstreamError::Request(e.to_string()))?;
        let h = req.headers_mut();
        let json = HeaderValue::from_static("application/json");
        if has_body {
            h.insert(http::header::CONTENT_TYPE, json.clone());
        }
        h.insert(http::header::ACCEPT, json);
        h.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(concat!("kube-cache-proxy/", env!("CARGO_PKG_VERSION"))),
        );
        Ok(req)
    }

    /// Sends a request whose URI is already an upstream URI (see
    /// [`Upstream::uri`](crate::upstream::Upstream::uri)) and returns the response headers; the body
    /// streams.
    ///
    /// # Errors
    /// [`UpstreamError`] when the apiserver cannot be reached or the
    /// request fails before response headers arrive.
    pub async fn send(
        &self,
        mut req: Request<Body>,
        credentials: Credentials,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        if credentials == Credentials::Proxy {
            self.authorize(req.headers_mut()).await?;
        }
        let (pool, stream) = self.transport(credentials).pools.checkout();
        let resp = pool.request(req).await.map_err(|e| {
            if e.is_connect() {
                UpstreamError::Connect(error_chain(&e))
            } else {
                UpstreamError::Request(error_chain(&e))
            }
        })?;
        Ok(resp.map(|inner| UpstreamBody {
            inner,
            stream: Some(stream),
        }))
    }

    /// Sets the proxy's `Authorization` header (a no-op when it
    /// authenticates by client certificate only).
    async fn authorize(&self, headers: &mut http::HeaderMap) -> Result<(), UpstreamError> {
        let Some(auth) = &self.auth else {
            headers.remove(http::header::AUTHORIZATION);
            return Ok(());
        };
        let probe = auth
            .clone()
            .oneshot(Request::new(Empty::new()))
            .await
            .map_err(|e| UpstreamError::Credentials(e.to_string()))?;
        match probe.headers().get(http::header::AUTHORIZATION) {
            Some(v) => {
                headers.insert(http::header::AUTHORIZATION, v.clone());
            }
            None => {
                headers.remove(http::header::AUTHORIZATION);
            }
        }
        Ok(())
    }

    /// Sends an upgrade request (exec, attach, port-forward) on a new
    /// HTTP/1.1 connection. The returned response, if `101`, can be
    /// upgraded with `hyper::upgrade::on`.
    ///
    /// # Errors
    /// [`UpstreamError`] when the connection or handshake fails.
    pub async fn send_upgrade(
        &self,
        mut req: Request<Body>,
        credentials: Credentials,
    ) -> Result<Response<Incoming>, UpstreamError> {
        if credentials == Credentials::Proxy {
            self.authorize(req.headers_mut()).await?;
        }
        let tls = self.transport(credentials).tls_h1;
        let io = tokio::time::timeout(self.connect_timeout, self.dial(tls))
            .await
            .map_err(|_| UpstreamError::Connect("timed out".into()))??;
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| UpstreamError::Connect(error_chain(&e)))?;
        tokio::spawn(async move {
            if let Err(error) = conn.with_upgrades().await {
                tracing::debug!(%error, "upstream upgrade connection ended");
            }
        });
        // HTTP/1.1 wants origin-form on the wire, with Host set.
        let authority = self.base.authority().map(|a| a.as_str().to_string());
        if let Some(pq) = req.uri().path_and_query().cloned() {
            *req.uri_mut() = Uri::from(pq);
        }
        if let Some(a) = authority.and_then(|a| HeaderValue::from_str(&a).ok()) {
            req.headers_mut().insert(http::header::HOST, a);
        }
        sender
            .send_request(req)
            .await
            .map_err(|e| UpstreamError::Request(error_chain(&e)))
    }

    async fn dial(&self, tls: Arc<ClientConfig>) -> Result<Box<dyn Io>, UpstreamError> {
        let host = self.base.host().unwrap_or("localhost");
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let https = self.base.scheme() != Some(&Scheme::HTTP);
        let port = self.base.port_u16().unwrap_or(if https { 443 } else { 80 });
        // With client-side balancing, to the apiserver the balancer picks.
        // (None while no apiserver is usable: the configured address.)
        let routed = self.balancer.as_ref().and_then(|b| b.route(&self.base).1);
        let tcp = match routed {
            Some(addr) => tokio::net::TcpStream::connect(addr).await,
            None => tokio::net::TcpStream::connect((host, port)).await,
        }
        .map_err(|e| UpstreamError::Connect(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        if !https {
            return Ok(Box::new(tcp));
        }
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| UpstreamError::Connect(e.to_string()))?;
        Ok(Box::new(stream))
    }
}

/// A byte stream to the apiserver (TLS or plain TCP).
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::upstream::Upstream;

    fn upstream(url: &str) -> Upstream {
        let cfg = kube::Config::new(url.parse().unwrap());
        Upstream::new(&cfg, Duration::from_secs(1), Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn uri_keeps_base_prefix() {
        let u = upstream("https://example.com:6443/k8s/clusters/c-1/");
        let pq: PathAndQuery = "/api/v1/pods?watch=1".parse().unwrap();
        assert_eq!(
            u.uri(Some(&pq)).unwrap().to_string(),
            "https://example.com:6443/k8s/clusters/c-1/api/v1/pods?watch=1"
        );
        let u = upstream("https://10.0.0.1:6443");
        assert_eq!(
            u.uri(Some(&pq)).unwrap().to_string(),
            "https://10.0.0.1:6443/api/v1/pods?watch=1"
        );
    }

    #[tokio::test]
    async fn unreachable_is_a_fast_connect_error() {
        // Bind and drop to find a port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let u = upstream(&format!("https://127.0.0.1:{port}"));
        let req = Request::get(u.uri(Some(&"/api".parse().unwrap())).unwrap())
            .body(apimachinery::body::empty())
            .unwrap();
        let start = std::time::Instant::now();
        let err = u.send(req, Credentials::Client).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Connect(_)), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(1));
        let status = err.to_status();
        assert_eq!(status.code, 503);
        assert_eq!(status.into_response().headers()["retry-after"], "1");
    }
}
