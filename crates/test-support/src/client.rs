//! An HTTPS test client for any server of these tests (the proxy or the
//! simulated apiserver): client-certificate, token or anonymous identity,
//! HTTP/1.1 or HTTP/2, buffered responses, and watch streams read event by
//! event.

use std::time::Duration;

use apimachinery::pki::Issued;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A buffered response.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// What reading a watch produced.
#[derive(Debug)]
pub enum Next {
    Event(Value),
    /// The body ended cleanly.
    End,
    /// The body broke (connection reset, aborted stream).
    Error(String),
    /// Nothing arrived in time.
    Timeout,
}

/// A streaming response being read.
pub struct WatchStream {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: Incoming,
    buf: Vec<u8>,
    /// Raw lines received, to check framing.
    pub raw: Vec<Vec<u8>>,
}

impl WatchStream {
    /// The next event, waiting at most `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Next {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                self.raw.push(line.clone());
                return Next::Event(serde_json::from_slice(&line).unwrap_or_else(|e| {
                    panic!("bad event line ({e}): {}", String::from_utf8_lossy(&line))
                }));
            }
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => return Next::Timeout,
                Ok(None) => return Next::End,
                Ok(Some(Err(e))) => return Next::Error(e.to_string()),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// The next DATA frame of the body as it arrived (over HTTP/1.1, one
    /// chunk of the chunked encoding: what the server wrote at once), or
    /// `None` at the end of the body, on an error, or after `timeout`.
    /// Only for a stream not yet read event by event (nothing buffered).
    pub async fn next_frame(&mut self, timeout: Duration) -> Option<Bytes> {
        assert!(self.buf.is_empty(), "next_frame after a partial event");
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Some(data);
                    }
                }
                _ => return None,
            }
        }
    }

    /// The next frame of a protobuf watch (`;stream=watch`): its 4-byte
    /// big-endian length and the `WatchEvent` bytes; `None` at the end of
    /// the body or after `timeout`.
    pub async fn next_protobuf(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])
                    as usize;
                if self.buf.len() >= 4 + len {
                    let frame: Vec<u8> = self.buf.drain(..4 + len).collect();
                    self.raw.push(frame.clone());
                    return Some(frame);
                }
            }
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) | Ok(None) | Ok(Some(Err(_))) => return None,
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// The next event, which must arrive within `timeout`.
    pub async fn event(&mut self, timeout: Duration) -> Value {
        match self.next(timeout).await {
            Next::Event(v) => v,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    /// `n` events, each within `timeout`.
    pub async fn events(&mut self, n: usize, timeout: Duration) -> Vec<Value> {
        let mut out = Vec::new();
        while out.len() < n {
            out.push(self.event(timeout).await);
        }
        out
    }

    /// Reads the whole remaining body.
    pub async fn rest(mut self) -> Bytes {
        let mut out = std::mem::take(&mut self.buf);
        while let Some(frame) = self.body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                out.extend_from_slice(&data);
            }
        }
        Bytes::from(out)
    }
}

/// Who a client is.
#[derive(Debug, Clone)]
pub enum Auth {
    /// A client certificate.
    Cert(Issued),
    /// A bearer token.
    Token(String),
    /// No credentials.
    Anonymous,
}

/// A client of one server with one identity.
#[derive(Clone)]
pub struct Client {
    inner: HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
    pub base: String,
    token: Option<String>,
}

/// A rustls client config trusting `ca_pem`, with the identity's
/// certificate if any.
pub fn tls_config(ca_pem: &str, auth: &Auth) -> rustls::ClientConfig {
    let certificate = match auth {
        Auth::Cert(issued) => Some(issued),
        Auth::Token(_) | Auth::Anonymous => None,
    };
    kube_testenv::tls::client_config(ca_pem, certificate).unwrap()
}

impl Client {
    /// A client of `base` (`https://host:port`) trusting `ca_pem`.
    pub fn new(base: &str, ca_pem: &str, auth: Auth, h2: bool) -> Client {
        let connector = kube_testenv::tls::https_connector(tls_config(ca_pem, &auth), h2);
        let mut b = HyperClient::builder(TokioExecutor::new());
        b.http2_only(h2);
        Client {
            inner: b.build(connector),
            base: base.to_string(),
            token: match auth {
                Auth::Token(t) => Some(t),
                _ => None,
            },
        }
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Request<Full<Bytes>> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(Full::new(Bytes::from(body.unwrap_or_default())))
            .unwrap()
    }

    /// Sends a request and buffers the response.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Resp {
        self.try_send(method, path, headers, body).await.unwrap()
    }

    /// Like [`Client::send`], returning transport errors.
    pub async fn try_send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<Resp, String> {
        let req = self.request(method, path, headers, body);
        let resp = tokio::time::timeout(Duration::from_secs(20), self.inner.request(req))
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| format!("{e:?}"))?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Resp {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(Method::GET, path, &[], None).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Resp {
        self.send(
            Method::POST,
            path,
            &[("content-type", "application/json")],
            Some(serde_json::to_vec(body).unwrap()),
        )
        .await
    }

    pub async fn put_json(&self, path: &str, body: &Value) -> Resp {
        self.send(
            Method::PUT,
            path,
            &[("content-type", "application/json")],
            Some(serde_json::to_vec(body).unwrap()),
        )
        .await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.send(Method::DELETE, path, &[], None).await
    }

    /// Starts a streaming request (a watch).
    pub async fn watch(&self, path: &str, headers: &[(&str, &str)]) -> WatchStream {
        self.try_watch(path, headers).await.unwrap()
    }

    /// Like [`Client::watch`], returning transport errors.
    pub async fn try_watch(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<WatchStream, String> {
        let req = self.request(Method::GET, path, headers, None);
        let resp = tokio::time::timeout(Duration::from_secs(20), self.inner.request(req))
            .await
            .map_err(|_| "watch did not start in time".to_string())?
            .map_err(|e| format!("{e:?}"))?;
        let (parts, body) = resp.into_parts();
        Ok(WatchStream {
            status: parts.status,
            headers: parts.headers,
            body,
            buf: Vec::new(),
            raw: Vec::new(),
        })
    }
}
