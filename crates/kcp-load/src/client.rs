//! HTTP/1.1 and HTTP/2 connections to any apiserver (or the proxy), built
//! from a kubeconfig with `kube`'s loader and rustls configuration, driven
//! with hyper directly so that the number of connections and of streams per
//! connection is under the tool's control (a pool would multiplex every
//! watch onto one connection).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, Uri, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::client::ConfigExt;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tower::ServiceExt;

/// The HTTP version to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Proto {
    /// HTTP/1.1: one request at a time per connection.
    H1,
    /// HTTP/2: many streams per connection.
    H2,
}

/// Where requests go and with which credentials.
#[derive(Clone)]
pub struct Target {
    /// `https://host:port` plus the kubeconfig server's path prefix.
    base: String,
    host: String,
    port: u16,
    https: bool,
    tls_h1: Arc<ClientConfig>,
    tls_h2: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    authorization: Option<HeaderValue>,
    /// The `Accept` of reads.
    accept: HeaderValue,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("base", &self.base).finish()
    }
}

/// One client connection.
pub enum Conn {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

/// A buffered response.
#[derive(Debug)]
pub struct Buffered {
    pub status: http::StatusCode,
    pub body: Bytes,
}

impl Target {
    /// Loads `path` (or the in-cluster configuration when `None`) the way
    /// the proxy loads its upstream.
    pub async fn from_kubeconfig(path: Option<&Path>, context: Option<String>) -> Result<Target> {
        let config = kube_cache_proxy::upstream::load_kube_config(path, context)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        Target::new(&config).await
    }

    /// A target from a loaded `kube::Config`.
    pub async fn new(config: &kube::Config) -> Result<Target> {
        let tls = config
            .rustls_client_config()
            .map_err(|e| anyhow!("TLS configuration: {e}"))?;
        let mut tls_h1 = tls.clone();
        tls_h1.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut tls_h2 = tls;
        tls_h2.alpn_protocols = vec![b"h2".to_vec()];
        let url = &config.cluster_url;
        let https = url.scheme_str() != Some("http");
        let host = url
            .host()
            .ok_or_else(|| anyhow!("server URL {url} has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let name = config.tls_server_name.clone().unwrap_or(host.clone());
        let server_name = ServerName::try_from(name.clone())
            .map_err(|e| anyhow!("invalid TLS server name {name:?}: {e}"))?;
        let base = url.to_string().trim_end_matches('/').to_string();
        let authorization = authorization(config).await?;
        Ok(Target {
            base,
            host,
            port,
            https,
            tls_h1: Arc::new(tls_h1),
            tls_h2: Arc::new(tls_h2),
            server_name,
            authorization,
            accept: HeaderValue::from_static("application/json"),
        })
    }

    /// Reads ask for `accept` (`application/json` by default).
    pub fn with_accept(mut self, accept: &'static str) -> Target {
        self.accept = HeaderValue::from_static(accept);
        self
    }

    /// Whether reads ask for protobuf.
    pub fn protobuf(&self) -> bool {
        self.accept
            .as_bytes()
            .starts_with(b"application/vnd.kubernetes.protobuf")
    }

    /// The server URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Opens a connection.
    pub async fn connect(&self, proto: Proto) -> Result<Conn> {
        let tcp = tokio::time::timeout(
            Duration::from_secs(10),
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| anyhow!("connecting to {}: timed out", self.base))?
        .with_context(|| format!("connecting to {}", self.base))?;
        tcp.set_nodelay(true)?;
        if !self.https {
            return handshake(TokioIo::new(tcp), proto).await;
        }
        let tls = match proto {
            Proto::H1 => self.tls_h1.clone(),
            Proto::H2 => self.tls_h2.clone(),
        };
        let stream = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_rustls::TlsConnector::from(tls).connect(self.server_name.clone(), tcp),
        )
        .await
        .map_err(|_| anyhow!("TLS handshake with {}: timed out", self.base))?
        .with_context(|| format!("TLS handshake with {}", self.base))?;
        let negotiated = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        if proto == Proto::H2 && negotiated.as_deref() != Some(b"h2") {
            bail!("{} did not negotiate HTTP/2", self.base);
        }
        handshake(TokioIo::new(stream), proto).await
    }

    /// A request for `path_and_query` (starting with `/`) on `conn`.
    pub fn request(
        &self,
        conn: &Conn,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> Result<Request<Full<Bytes>>> {
        let method_is_read = method == Method::GET;
        let url = format!("{}{path_and_query}", self.base);
        let uri: Uri = url.parse().with_context(|| format!("invalid URL {url}"))?;
        let mut b = Request::builder().method(method);
        b = match conn {
            // HTTP/2 wants the absolute form (:scheme, :authority).
            Conn::H2(_) => b.uri(uri),
            // HTTP/1.1 wants the origin form and a Host header.
            Conn::H1(_) => {
                let host = uri
                    .authority()
                    .map(|a| a.as_str().to_string())
                    .unwrap_or_default();
                let pq = uri
                    .path_and_query()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_else(|| "/".into());
                b.uri(pq).header(header::HOST, host)
            }
        };
        // Writes are answered in JSON, whatever the reads ask for.
        b = if method_is_read {
            b.header(header::ACCEPT, self.accept.clone())
        } else {
            b.header(header::ACCEPT, "application/json")
        };
        if let Some(a) = &self.authorization {
            b = b.header(header::AUTHORIZATION, a.clone());
        }
        if body.is_some() {
            b = b.header(header::CONTENT_TYPE, "application/json");
        }
        Ok(b.body(Full::new(body.unwrap_or_default()))?)
    }

    /// Sends a request and buffers the response.
    pub async fn fetch(
        &self,
        conn: &mut Conn,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> Result<Buffered> {
        let req = self.request(conn, method, path_and_query, body)?;
        let resp = conn.send(req).await?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .context("reading the response body")?
            .to_bytes();
        Ok(Buffered { status, body })
    }
}

impl Conn {
    /// Sends a request, waiting for a free stream (HTTP/2) or the previous
    /// response's end (HTTP/1.1).
    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>> {
        match self {
            Conn::H1(s) => {
                s.ready().await.context("connection closed")?;
                Ok(s.send_request(req).await?)
            }
            Conn::H2(s) => {
                s.ready().await.context("connection closed")?;
                Ok(s.send_request(req).await?)
            }
        }
    }

    /// Whether the connection can no longer send requests.
    pub fn is_closed(&self) -> bool {
        match self {
            Conn::H1(s) => s.is_closed(),
            Conn::H2(s) => s.is_closed(),
        }
    }

    /// Another handle on the same HTTP/2 connection (`None` for HTTP/1.1).
    pub fn share(&self) -> Option<Conn> {
        match self {
            Conn::H1(_) => None,
            Conn::H2(s) => Some(Conn::H2(s.clone())),
        }
    }
}

async fn handshake<T>(io: TokioIo<T>, proto: Proto) -> Result<Conn>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    match proto {
        Proto::H1 => {
            let (send, conn) = http1::Builder::new().handshake(io).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Conn::H1(send))
        }
        Proto::H2 => {
            let (send, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .initial_stream_window_size(4 << 20)
                .initial_connection_window_size(16 << 20)
                .max_concurrent_reset_streams(10_000)
                .handshake(io)
                .await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Conn::H2(send))
        }
    }
}

/// The `Authorization` header the kubeconfig's user sends (a static token,
/// a token file or an exec plugin), computed once, at start, through
/// `kube`'s auth layer; `None` for client-certificate users.
async fn authorization(config: &kube::Config) -> Result<Option<HeaderValue>> {
    let Some(layer) = config
        .auth_layer()
        .map_err(|e| anyhow!("credentials: {e}"))?
    else {
        return Ok(None);
    };
    let echo = tower::service_fn(|req: Request<Empty<Bytes>>| async move {
        let mut resp = Response::new(Empty::<Bytes>::new());
        *resp.headers_mut() = req.headers().clone();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(resp)
    });
    let service = tower::Layer::layer(&layer, echo);
    let resp = service
        .oneshot(Request::new(Empty::new()))
        .await
        .map_err(|e| anyhow!("credentials: {e}"))?;
    Ok(resp.headers().get(header::AUTHORIZATION).cloned())
}
