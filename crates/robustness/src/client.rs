//! HTTPS clients of the apiserver and the proxies, with a client
//! certificate or a bearer token, over HTTP/1.1 or HTTP/2, and watches
//! over WebSocket.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use apimachinery::pki::Issued;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::ServerName;

/// Who a client is.
#[derive(Debug, Clone)]
pub enum Auth {
    /// A client certificate.
    Cert(Issued),
    /// A bearer token.
    Token(String),
}

/// A buffered response.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Resp {
    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A client of one server (`https://127.0.0.1:<port>`), one identity.
#[derive(Clone)]
pub struct Client {
    inner: HyperClient<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    tls: Arc<rustls::ClientConfig>,
    pub base: String,
    auth: Auth,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// A rustls configuration trusting `ca_pem`, presenting `auth`'s
/// certificate if it has one.
pub fn tls_config(ca_pem: &str, auth: &Auth) -> Result<rustls::ClientConfig> {
    let certificate = match auth {
        Auth::Cert(issued) => Some(issued),
        Auth::Token(_) => None,
    };
    Ok(kube_testenv::tls::client_config(ca_pem, certificate)?)
}

impl Client {
    /// A client of `base` trusting `ca_pem`; HTTP/2 when `h2`.
    pub fn new(base: &str, ca_pem: &str, auth: Auth, h2: bool) -> Result<Client> {
        let cfg = tls_config(ca_pem, &auth)?;
        let connector = kube_testenv::tls::https_connector(cfg.clone(), h2);
        let mut b = HyperClient::builder(TokioExecutor::new());
        b.http2_only(h2).pool_max_idle_per_host(4);
        Ok(Client {
            inner: b.build(connector),
            tls: Arc::new(cfg),
            base: base.trim_end_matches('/').to_string(),
            auth,
        })
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        accept: Option<&str>,
        body: Option<Vec<u8>>,
        content_type: &str,
    ) -> Result<Request<Full<Bytes>>> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Auth::Token(t) = &self.auth {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        if body.is_some() {
            req = req.header("content-type", content_type);
        }
        Ok(req.body(Full::new(Bytes::from(body.unwrap_or_default())))?)
    }

    /// Sends a request and reads the whole answer, within `timeout`.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        content_type: &str,
        timeout: Duration,
    ) -> Result<Resp> {
        let req = self.request(method, path, None, body, content_type)?;
        self.read_whole(req, timeout).await
    }

    /// A GET, read whole, with `accept`.
    pub async fn get(&self, path: &str, accept: Option<&str>, timeout: Duration) -> Result<Resp> {
        let req = self.request(Method::GET, path, accept, None, "")?;
        self.read_whole(req, timeout).await
    }

    /// Sends `req` and reads the whole answer, within `timeout`.
    async fn read_whole(&self, req: Request<Full<Bytes>>, timeout: Duration) -> Result<Resp> {
        tokio::time::timeout(timeout, async {
            let resp = self.inner.request(req).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, anyhow::Error>(Resp { status, body })
        })
        .await
        .map_err(|_| anyhow!("no answer in {timeout:?}"))?
    }

    /// A GET whose body is read as it comes (a watch).
    pub async fn stream(
        &self,
        path: &str,
        accept: Option<&str>,
        timeout: Duration,
    ) -> Result<http::Response<Incoming>> {
        let req = self.request(Method::GET, path, accept, None, "")?;
        tokio::time::timeout(timeout, self.inner.request(req))
            .await
            .map_err(|_| anyhow!("no answer in {timeout:?}"))?
            .map_err(|e| anyhow!("{e}"))
    }

    /// Opens a WebSocket to `path` (a watch), as kubectl and client
    /// libraries do: TLS, then the handshake with an `Origin`.
    pub async fn websocket(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<
        tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    > {
        let authority = self.base.trim_start_matches("https://").to_string();
        tokio::time::timeout(timeout, async {
            let tcp = tokio::net::TcpStream::connect(&authority).await?;
            let connector = tokio_rustls::TlsConnector::from(self.tls.clone());
            let tls = connector
                .connect(ServerName::try_from("127.0.0.1")?.to_owned(), tcp)
                .await?;
            let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
            let mut req = Request::builder()
                .uri(format!("wss://{authority}{path}"))
                .header("host", &authority)
                .header("origin", format!("https://{authority}"))
                .header("connection", "Upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-version", "13")
                .header("sec-websocket-key", key);
            if let Auth::Token(t) = &self.auth {
                req = req.header("authorization", format!("Bearer {t}"));
            }
            let (ws, _) = tokio_tungstenite::client_async(req.body(())?, tls)
                .await
                .context("websocket handshake")?;
            Ok(ws)
        })
        .await
        .map_err(|_| anyhow!("no websocket in {timeout:?}"))?
    }
}
