//! A raw HTTP/1.1-over-TLS client: sends a request line and headers byte
//! for byte (a path exactly as written, percent-encodings and all, which
//! an HTTP library might normalize or refuse), reads the response to the
//! end of the connection (`Connection: close`), and parses it by hand, so
//! a test sees exactly what a server wrote: the status line, every header,
//! the body (chunked encoding removed). Also opens WebSocket connections
//! over TLS with `tokio-tungstenite`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::client::{Auth, tls_config};

/// One server reached over TLS with one identity.
#[derive(Clone)]
pub struct Raw {
    pub addr: String,
    tls: Arc<rustls::ClientConfig>,
    token: Option<String>,
}

/// A response as written on the wire.
#[derive(Debug, Clone)]
pub struct RawResp {
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: String,
    pub status: u16,
    /// Header names lowercased, in the order written.
    pub headers: Vec<(String, String)>,
    /// The body, chunked encoding removed.
    pub body: Vec<u8>,
}

impl RawResp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

impl Raw {
    /// A client of `base` (`https://host:port`) trusting `ca_pem`.
    pub fn new(base: &str, ca_pem: &str, auth: Auth) -> Raw {
        let mut cfg = tls_config(ca_pem, &auth);
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Raw {
            addr: base.trim_start_matches("https://").to_string(),
            tls: Arc::new(cfg),
            token: match auth {
                Auth::Token(t) => Some(t),
                _ => None,
            },
        }
    }

    /// A TLS connection to the server.
    pub async fn connect(&self) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(&self.addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .unwrap()
    }

    /// The request head: `GET <target> HTTP/1.1`, `Host`, the identity's
    /// token, `headers`, and `Connection: close` unless `headers` name a
    /// `Connection`.
    pub fn head(&self, method: &str, target: &str, headers: &[(&str, &str)]) -> String {
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        if let Some(t) = &self.token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("connection"))
        {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        head
    }

    /// Sends a GET of `target` exactly as given and reads the whole
    /// response (the server closes the connection after it).
    pub async fn get(&self, target: &str, headers: &[(&str, &str)]) -> RawResp {
        self.send("GET", target, headers).await
    }

    /// Like [`Raw::get`] with any method (no body).
    pub async fn send(&self, method: &str, target: &str, headers: &[(&str, &str)]) -> RawResp {
        let mut tls = self.connect().await;
        tls.write_all(self.head(method, target, headers).as_bytes())
            .await
            .unwrap();
        tls.flush().await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), async {
            let mut chunk = [0u8; 16384];
            loop {
                match tls.read(&mut chunk).await {
                    Ok(0) => break,
                    Ok(n) => {
                        buf.extend_from_slice(&chunk[..n]);
                        // A response with a known length is complete
                        // once that much arrived (the server may keep the
                        // connection open despite `Connection: close`).
                        if let Some(resp) = parse_complete(&buf) {
                            return Some(resp);
                        }
                    }
                    // A TLS connection closed without close_notify still
                    // delivered what it delivered.
                    Err(_) => break,
                }
            }
            None
        })
        .await
        .unwrap_or_else(|_| panic!("no complete response to {target} in 30 s"));
        read.unwrap_or_else(|| parse(&buf).unwrap_or_else(|| panic!("bad response: {buf:?}")))
    }
}

/// The head's end (after `\r\n\r\n`).
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// A response parsed from everything received up to the end of the
/// connection.
pub fn parse(buf: &[u8]) -> Option<RawResp> {
    let end = head_end(buf)?;
    let (mut resp, chunked) = parse_head(&buf[..end])?;
    let rest = &buf[end..];
    resp.body = if chunked {
        dechunk(rest)?.0
    } else {
        rest.to_vec()
    };
    Some(resp)
}

/// A response parsed from `buf` if it is complete by its own framing
/// (Content-Length, or chunked with the last chunk).
fn parse_complete(buf: &[u8]) -> Option<RawResp> {
    let end = head_end(buf)?;
    let (mut resp, chunked) = parse_head(&buf[..end])?;
    let rest = &buf[end..];
    if chunked {
        let (body, complete) = dechunk(rest)?;
        if !complete {
            return None;
        }
        resp.body = body;
        return Some(resp);
    }
    let len: usize = resp.header("content-length")?.parse().ok()?;
    if rest.len() < len {
        return None;
    }
    resp.body = rest[..len].to_vec();
    Some(resp)
}

fn parse_head(head: &[u8]) -> Option<(RawResp, bool)> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next()?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next()?.to_string();
    let status = parts.next()?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    Some((
        RawResp {
            version,
            status,
            headers,
            body: Vec::new(),
        },
        chunked,
    ))
}

/// The data of a chunked body, and whether its last chunk arrived.
fn dechunk(mut rest: &[u8]) -> Option<(Vec<u8>, bool)> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Some((out, false));
        };
        let size_text = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some((out, true));
        }
        if rest.len() < size + 2 {
            out.extend_from_slice(&rest[..rest.len().min(size)]);
            return Some((out, false));
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// A WebSocket client connection over TLS.
pub type Ws = tokio_tungstenite::WebSocketStream<TlsStream<TcpStream>>;

/// The outcome of a WebSocket handshake.
pub enum Upgrade {
    /// `101`: the response head, and the connection.
    Switched(RawResp, Box<Ws>),
    /// Anything else: the whole response.
    Refused(RawResp),
}

impl Upgrade {
    pub fn switched(self) -> (RawResp, Ws) {
        match self {
            Upgrade::Switched(head, ws) => (head, *ws),
            Upgrade::Refused(r) => {
                panic!("not upgraded: {} {:?} {}", r.status, r.headers, r.text())
            }
        }
    }

    pub fn refused(self) -> RawResp {
        match self {
            Upgrade::Refused(r) => r,
            Upgrade::Switched(head, _) => panic!("upgraded: {:?}", head.headers),
        }
    }
}

/// The headers of a WebSocket handshake (key `dGhlIHNhbXBsZSBub25jZQ==`,
/// version 13), with `Origin: https://example.com`.
pub fn ws_headers() -> Vec<(&'static str, &'static str)> {
    vec![
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("Sec-WebSocket-Version", "13"),
        ("Origin", "https://example.com"),
    ]
}

/// `Sec-WebSocket-Accept` for [`ws_headers`]' key (RFC 6455 §1.3).
pub const WS_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

impl Raw {
    /// Sends a WebSocket handshake for `target` with exactly `headers` and
    /// returns the connection when the server switches protocols.
    pub async fn websocket(&self, target: &str, headers: &[(&str, &str)]) -> Upgrade {
        use tokio_tungstenite::tungstenite::protocol::Role;
        let mut tls = self.connect().await;
        tls.write_all(self.head("GET", target, headers).as_bytes())
            .await
            .unwrap();
        tls.flush().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16384];
        let end = loop {
            if let Some(end) = head_end(&buf) {
                break Some(end);
            }
            match tokio::time::timeout(Duration::from_secs(30), tls.read(&mut chunk))
                .await
                .expect("no response head in 30 s")
            {
                Ok(0) | Err(_) => break None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let Some(end) = end else {
            return Upgrade::Refused(
                parse(&buf).unwrap_or_else(|| panic!("bad response: {buf:?}")),
            );
        };
        let (head, _) = parse_head(&buf[..end]).unwrap();
        if head.status != 101 {
            // The rest of the response, to the end of the connection or
            // its length.
            loop {
                if let Some(resp) = parse_complete(&buf) {
                    return Upgrade::Refused(resp);
                }
                match tokio::time::timeout(Duration::from_secs(30), tls.read(&mut chunk))
                    .await
                    .expect("no response body in 30 s")
                {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            return Upgrade::Refused(parse(&buf).unwrap());
        }
        let rest = buf[end..].to_vec();
        let ws =
            tokio_tungstenite::WebSocketStream::from_partially_read(tls, rest, Role::Client, None)
                .await;
        Upgrade::Switched(head, Box::new(ws))
    }
}
