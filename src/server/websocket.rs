//! Watches over WebSocket, served from the cache as kube-apiserver serves
//! them.
//!
//! A watch request carrying `Upgrade: websocket` and a `Connection` header
//! that mentions `upgrade` (`wsstream.IsWebSocketRequest`) is, once the
//! watch is established, answered by `golang.org/x/net/websocket`'s
//! handler (`serveWatchHandler` and `WatchServer.HandleWS` in
//! `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/watch.go`):
//!
//! - the handshake ([`handshake`]) checks, in this order: the method
//!   (`405`, `bad method`), `Upgrade`/`Connection` (`400`,
//!   `not websocket protocol`), `Sec-WebSocket-Key` (`400`,
//!   `mismatch challenge/response`), `Sec-WebSocket-Version: 13` (`400`
//!   with `Sec-WebSocket-Version: 13`, `missing or bad WebSocket
//!   Version`), the request's location (`400` with `url.Parse`'s error),
//!   an `Origin` header that `url.ParseRequestURI` accepts (`403`, empty
//!   body: the default `Handler` refuses a missing origin), and at most one
//!   subprotocol in the first `Sec-WebSocket-Protocol` header (`400`,
//!   empty body). A single subprotocol, whatever it is, is echoed back:
//!   the watch handler negotiates none (`base64.channel.k8s.io`,
//!   `v4.channel.k8s.io` and `base64.binary.k8s.io` frame exec, attach
//!   and logs, not watches). The refusals are written on the hijacked
//!   connection, which is then closed; so is each refusal here
//!   (`Connection: close`);
//! - `101 Switching Protocols` carries only `Upgrade`, `Connection`,
//!   `Sec-WebSocket-Accept` and the echoed subprotocol;
//! - each watch event is one unfragmented message: a text message holding
//!   the event's JSON line (with its newline) when the serializer encodes
//!   as text, a binary message holding the event's protobuf (without the
//!   `;stream=watch` length prefix) otherwise. `ERROR` events are events
//!   like any other;
//! - when the watch ends (`timeoutSeconds`, the server stopping, an
//!   `ERROR` event ending it) the server sends a close frame with status
//!   1000 and no reason, and closes the connection; messages from the
//!   client are read and ignored; a ping gets its pong; when the client
//!   closes, the server closes too.
//!
//! Errors before the watch starts (authentication, authorization, bad
//! options) are ordinary HTTP responses, as on the apiserver.
//!
//! Framing uses `tokio-tungstenite`. One difference: when the client
//! closes first, `tungstenite` echoes the client's close status where
//! `x/net/websocket` answers 1000.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};

use apimachinery::body::{self, Body};
use apimachinery::request::contains_upgrade;
pub use apimachinery::request::is_websocket_request;

/// `x/net/websocket`'s `DefaultMaxPayloadBytes`: the largest message it
/// reads from a client.
const MAX_PAYLOAD: usize = 32 << 20;

/// How long closing the connection may take once the watch ended.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A first header value as Go's `Header.Get` returns it (bytes as a
/// string; empty when absent).
fn first(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// An accepted handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// `Sec-WebSocket-Accept`.
    pub accept: String,
    /// The subprotocol echoed in `Sec-WebSocket-Protocol`.
    pub protocol: Option<String>,
}

/// `x/net/websocket`'s server handshake with the default `Handler`'s
/// origin check (see the module docs), on a request for `uri` over TLS.
/// `headers` are the request's, with `Sec-WebSocket-Protocol` as the
/// authentication filter left it.
///
/// # Errors
/// The refusal, as the apiserver writes it.
#[allow(clippy::result_large_err)]
pub fn handshake(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Accepted, Response<Body>> {
    if method != Method::GET {
        return Err(refusal(StatusCode::METHOD_NOT_ALLOWED, "bad method"));
    }
    if !first(headers, "upgrade").eq_ignore_ascii_case("websocket")
        || !contains_upgrade(first(headers, "connection").as_bytes())
    {
        return Err(refusal(StatusCode::BAD_REQUEST, "not websocket protocol"));
    }
    let key = first(headers, "sec-websocket-key");
    if key.is_empty() {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "mismatch challenge/response",
        ));
    }
    if first(headers, "sec-websocket-version") != "13" {
        let mut resp = refusal(StatusCode::BAD_REQUEST, "missing or bad WebSocket Version");
        resp.headers_mut()
            .insert("sec-websocket-version", HeaderValue::from_static("13"));
        return Err(resp);
    }
    // The location, `wss://` + Host + the request URI.
    let host = match headers.get(header::HOST) {
        Some(h) => String::from_utf8_lossy(h.as_bytes()).into_owned(),
        None => uri.authority().map(|a| a.to_string()).unwrap_or_default(),
    };
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    if let Err(e) = apimachinery::url::parse_request_uri(&format!("wss://{host}{target}")) {
        return Err(refusal(StatusCode::BAD_REQUEST, &e.to_string()));
    }
    let protocol = first(headers, "sec-websocket-protocol");
    let protocols: Vec<&str> = match protocol.trim() {
        "" => Vec::new(),
        p => p.split(',').map(str::trim).collect(),
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    // `checkOrigin`: an origin is required, and must parse.
    let origin = first(headers, "origin");
    if origin.is_empty() || apimachinery::url::parse_request_uri(&origin).is_err() {
        return Err(refusal(StatusCode::FORBIDDEN, ""));
    }
    if protocols.len() > 1 {
        return Err(refusal(StatusCode::BAD_REQUEST, ""));
    }
    Ok(Accepted {
        accept,
        protocol: protocols.first().map(|p| p.to_string()),
    })
}

/// A handshake refusal: the status, `body` as plain bytes, and the end of
/// the connection.
fn refusal(status: StatusCode, body: &str) -> Response<Body> {
    let mut resp = Response::new(body::full(Bytes::copy_from_slice(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// How the watch body's events are delimited, and sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Newline-terminated JSON: one text message per line, newline kept.
    JsonLines,
    /// `;stream=watch` protobuf: 4-byte big-endian length, then the event;
    /// one binary message per event, without the length.
    LengthPrefixed,
}

impl Framing {
    /// The framing of a watch response with this `Content-Type`.
    pub fn of(content_type: Option<&HeaderValue>) -> Option<Framing> {
        let t = content_type?.to_str().ok()?;
        if t.starts_with("application/json") {
            Some(Framing::JsonLines)
        } else if t.starts_with("application/vnd.kubernetes.protobuf") {
            Some(Framing::LengthPrefixed)
        } else {
            None
        }
    }
}

/// Splits a watch body into events.
#[derive(Debug)]
pub struct Events {
    framing: Framing,
    buf: BytesMut,
}

impl Events {
    pub fn new(framing: Framing) -> Events {
        Events {
            framing,
            buf: BytesMut::new(),
        }
    }

    /// Adds the body's next bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole event, if one has arrived.
    pub fn next_event(&mut self) -> Option<Bytes> {
        match self.framing {
            Framing::JsonLines => {
                let end = self.buf.iter().position(|b| *b == b'\n')?;
                Some(self.buf.split_to(end + 1).freeze())
            }
            Framing::LengthPrefixed => {
                let header: [u8; 4] = self.buf.get(..4)?.try_into().ok()?;
                let len = u32::from_be_bytes(header) as usize;
                if self.buf.len() < 4 + len {
                    return None;
                }
                self.buf.advance(4);
                Some(self.buf.split_to(len).freeze())
            }
        }
    }

    /// The message carrying `event`.
    fn message(&self, event: Bytes) -> Message {
        match self.framing {
            Framing::JsonLines => {
                let text = match std::str::from_utf8(&event) {
                    Ok(_) => tokio_tungstenite::tungstenite::Utf8Bytes::try_from(event)
                        .unwrap_or_default(),
                    // Go sends the bytes as a text message whatever they
                    // are; the cache's JSON is UTF-8.
                    Err(_) => String::from_utf8_lossy(&event).into_owned().into(),
                };
                Message::Text(text)
            }
            Framing::LengthPrefixed => Message::Binary(event),
        }
    }
}

/// Switches protocols and streams the watch `events` (a cache-served
/// watch's `200` response) as WebSocket messages once the client's
/// connection is handed over. Returns the `101`, or `events` unchanged
/// when its framing is unknown.
pub fn serve(on_upgrade: OnUpgrade, accepted: Accepted, events: Response<Body>) -> Response<Body> {
    let Some(framing) = Framing::of(events.headers().get(header::CONTENT_TYPE)) else {
        return events;
    };
    let body = events.into_body();
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(error) => {
                tracing::debug!(%error, "WebSocket upgrade was not completed");
                return;
            }
        };
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_PAYLOAD))
            .max_frame_size(Some(MAX_PAYLOAD));
        let ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config))
                .await;
        stream_events(ws, body, framing).await;
    });
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accepted.accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(v) = accepted
        .protocol
        .and_then(|p| HeaderValue::from_str(&p).ok())
    {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
    }
    resp
}

/// How a WebSocket watch ended.
enum End {
    /// The watch ended (or failed): close with 1000.
    Watch,
    /// The client sent a close frame (tungstenite queued the reply).
    ClientClosed,
    /// The client went away, or sent what cannot be read: close with
    /// 1000 if the connection still takes it.
    Client,
}

async fn stream_events<S>(ws: WebSocketStream<S>, mut body: Body, framing: Framing)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut incoming) = ws.split();
    let mut events = Events::new(framing);
    let end = loop {
        tokio::select! {
            frame = body.frame() => match frame {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    events.push(&data);
                    let mut sent = Ok(());
                    while let Some(event) = events.next_event() {
                        sent = sink.feed(events.message(event)).await;
                        if sent.is_err() {
                            break;
                        }
                    }
                    if sent.is_err() || sink.flush().await.is_err() {
                        break End::Client;
                    }
                }
                Some(Err(_)) | None => break End::Watch,
            },
            message = incoming.next() => match message {
                // Read and ignored, as `wsstream.IgnoreReceives` does;
                // tungstenite answers pings on the next read.
                Some(Ok(Message::Close(_))) => break End::ClientClosed,
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break End::Client,
            },
        }
    };
    drop(body);
    let close = async {
        match end {
            End::Watch | End::Client => {
                let frame = CloseFrame {
                    code: CloseCode::Normal,
                    reason: "".into(),
                };
                let _ = sink.send(Message::Close(Some(frame))).await;
            }
            // Flushes the reply tungstenite queued.
            End::ClientClosed => {
                let _ = sink.close().await;
            }
        }
        // Go closes the connection at once (TLS close_notify, then FIN),
        // without waiting for the client's close frame.
        if let Ok(mut ws) = incoming.reunite(sink) {
            let _ = ws.get_mut().shutdown().await;
        }
    };
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, close).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    const GOOD: [(&str, &str); 6] = [
        ("host", "127.0.0.1:6443"),
        ("upgrade", "websocket"),
        ("connection", "Upgrade"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-version", "13"),
        ("origin", "https://example.com"),
    ];

    fn with(changes: &[(&str, Option<&str>)]) -> HeaderMap {
        let mut pairs: Vec<(&str, &str)> = GOOD
            .iter()
            .filter(|(k, _)| !changes.iter().any(|(c, _)| c == k))
            .copied()
            .collect();
        pairs.extend(changes.iter().filter_map(|(k, v)| v.map(|v| (*k, v))));
        headers(&pairs)
    }

    fn refused(h: &HeaderMap) -> (u16, String, Option<String>) {
        let uri: Uri = "/api/v1/pods?watch=1".parse().unwrap();
        let resp = handshake(&Method::GET, &uri, h).unwrap_err();
        let status = resp.status().as_u16();
        let version = resp
            .headers()
            .get("sec-websocket-version")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(resp.headers()[header::CONNECTION], "close");
        let body = futures_util::FutureExt::now_or_never(resp.into_body().collect())
            .unwrap()
            .unwrap()
            .to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap(), version)
    }

    #[test]
    fn detection_is_wsstreams() {
        assert!(is_websocket_request(&headers(&[
            ("upgrade", "WebSocket"),
            ("connection", "keep-alive, Upgrade")
        ])));
        assert!(is_websocket_request(&headers(&[
            ("upgrade", "websocket"),
            ("connection", "keep-alive"),
            ("connection", "upgraded")
        ])));
        assert!(!is_websocket_request(&headers(&[("upgrade", "websocket")])));
        assert!(!is_websocket_request(&headers(&[
            ("upgrade", "h2c"),
            ("connection", "upgrade")
        ])));
    }

    #[test]
    fn handshake_accepts_and_echoes_one_protocol() {
        let uri: Uri = "/api/v1/pods?watch=1".parse().unwrap();
        let ok = handshake(&Method::GET, &uri, &with(&[])).unwrap();
        assert_eq!(ok.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(ok.protocol, None);
        let ok = handshake(
            &Method::GET,
            &uri,
            &with(&[("sec-websocket-protocol", Some(" base64.channel.k8s.io "))]),
        )
        .unwrap();
        assert_eq!(ok.protocol.as_deref(), Some("base64.channel.k8s.io"));
        // Only the first header counts.
        let mut h = with(&[("sec-websocket-protocol", Some("a"))]);
        h.append("sec-websocket-protocol", HeaderValue::from_static("b"));
        assert_eq!(
            handshake(&Method::GET, &uri, &h)
                .unwrap()
                .protocol
                .as_deref(),
            Some("a")
        );
        // An opaque or path-only origin parses.
        for origin in ["foo:bar", "/x"] {
            assert!(handshake(&Method::GET, &uri, &with(&[("origin", Some(origin))])).is_ok());
        }
    }

    #[test]
    fn refusals_are_x_net_websockets() {
        let v13 = Some("13".to_string());
        for (changes, want) in [
            (vec![("origin", None)], (403, "", None)),
            (vec![("origin", Some("null"))], (403, "", None)),
            (vec![("origin", Some("http://[::1"))], (403, "", None)),
            (vec![("origin", Some("http://a:b"))], (403, "", None)),
            (
                vec![("sec-websocket-key", None)],
                (400, "mismatch challenge/response", None),
            ),
            (
                vec![("sec-websocket-version", Some("8"))],
                (400, "missing or bad WebSocket Version", v13.clone()),
            ),
            (
                vec![("sec-websocket-version", None)],
                (400, "missing or bad WebSocket Version", v13.clone()),
            ),
            (
                vec![("sec-websocket-protocol", Some("a, b"))],
                (400, "", None),
            ),
            (
                vec![("sec-websocket-protocol", Some("a,"))],
                (400, "", None),
            ),
            (
                vec![("connection", Some("keep-alive")), ("x", Some("y"))],
                (400, "not websocket protocol", None),
            ),
            (
                vec![("host", Some("a:b"))],
                (
                    400,
                    r#"parse "wss://a:b/api/v1/pods?watch=1": invalid port ":b" after host"#,
                    None,
                ),
            ),
        ] {
            let got = refused(&with(&changes));
            assert_eq!(
                (got.0, got.1.as_str(), got.2),
                (want.0, want.1, want.2),
                "{changes:?}"
            );
        }
        let uri: Uri = "/api/v1/pods".parse().unwrap();
        assert_eq!(
            handshake(&Method::POST, &uri, &with(&[]))
                .unwrap_err()
                .status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[test]
    fn events_split_by_framing() {
        let mut e = Events::new(Framing::JsonLines);
        e.push(b"{\"a\":1}\n{\"b\"");
        assert_eq!(e.next_event().as_deref(), Some(&b"{\"a\":1}\n"[..]));
        assert_eq!(e.next_event(), None);
        e.push(b":2}\n");
        assert_eq!(e.next_event().as_deref(), Some(&b"{\"b\":2}\n"[..]));
        assert!(
            matches!(e.message(Bytes::from_static(b"x\n")), Message::Text(t) if t.as_str() == "x\n")
        );

        let mut e = Events::new(Framing::LengthPrefixed);
        e.push(&[0, 0, 0, 3, b'a', b'b']);
        assert_eq!(e.next_event(), None);
        e.push(&[b'c', 0, 0, 0, 0, 0, 0]);
        assert_eq!(e.next_event().as_deref(), Some(&b"abc"[..]));
        assert_eq!(e.next_event().as_deref(), Some(&b""[..]));
        assert_eq!(e.next_event(), None);
        assert!(matches!(
            e.message(Bytes::from_static(b"\x00")),
            Message::Binary(_)
        ));
        assert_eq!(
            Framing::of(Some(&HeaderValue::from_static(
                "application/vnd.kubernetes.protobuf;stream=watch"
            ))),
            Some(Framing::LengthPrefixed)
        );
        assert_eq!(
            Framing::of(Some(&HeaderValue::from_static("text/plain"))),
            None
        );
    }
}
