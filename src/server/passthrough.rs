//! Pass-through: a request the cache does not answer goes to the apiserver
//! untouched (method, path, query, headers minus hop-by-hop), with bodies
//! streamed both ways frame by frame, so a watch response reaches the client
//! event by event and a 50 MB list never sits whole in memory. HTTP
//! upgrades (SPDY/3.1 and WebSocket: exec, attach, port-forward) are bridged
//! byte for byte.

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use std::future::Future;

use http_body_util::BodyExt;

use crate::upstream::{Credentials, Upstream, UpstreamError};
use apimachinery::body::{self, Body};
use apimachinery::status::Status;

/// Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus
/// `Host`, which the upstream client sets from the upstream URI.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

/// Whether the request asks for an HTTP/1.1 protocol upgrade.
pub fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && req
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Appends the client address to `X-Forwarded-For`, which the apiserver
/// records as the request's source IP in audit logs.
fn forwarded_for(headers: &mut HeaderMap, remote: SocketAddr) {
    let ip = remote.ip().to_string();
    let value = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) if !prev.is_empty() => format!("{prev}, {ip}"),
        _ => ip,
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert("x-forwarded-for", v);
    }
}

/// Forwards `req` upstream and returns the upstream response with its body
/// streaming. `headers` are the request headers to send (already adjusted
/// for the identity the request travels with).
///
/// # Errors
/// [`UpstreamError`] when the apiserver cannot be reached; the caller turns
/// it into a `503` Status.
pub async fn forward(
    upstream: &Upstream,
    req: Request<Incoming>,
    mut headers: HeaderMap,
    credentials: Credentials,
    remote: SocketAddr,
) -> Result<Response<Body>, UpstreamError> {
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    forwarded_for(&mut headers, remote);
    let (parts, incoming) = req.into_parts();
    let mut out = Request::new(body::boxed(incoming));
    *out.method_mut() = parts.method;
    *out.uri_mut() = upstream.uri(parts.uri.path_and_query())?;
    *out.version_mut() = Version::HTTP_11;
    *out.headers_mut() = headers;
    let resp = upstream.send(out, credentials).await?;
    let (mut parts, incoming) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.version = Version::HTTP_11;
    Ok(Response::from_parts(parts, body::boxed(incoming)))
}

/// A passed-through watch's response body that ends cleanly when `drain`
/// completes (shutdown, a successor took over, or the upstream it came
/// from is no longer the active one): at the first event
/// boundary from then on, so the client gets whole events and a clean end
/// of stream, and re-watches from its last resourceVersion (to the
/// successor). Boundaries: a newline in JSON streams; the end of a
/// length-prefixed frame in `application/vnd.kubernetes.protobuf;stream=watch`
/// streams. An unknown framing ends at once.
pub fn drainable_watch(
    body: Body,
    content_type: Option<&HeaderValue>,
    drain: impl Future<Output = ()> + Send + 'static,
) -> Body {
    let framing = match content_type.and_then(|v| v.to_str().ok()) {
        Some(t) if t.starts_with("application/vnd.kubernetes.protobuf") => {
            Framing::LengthPrefixed {
                header: [0; 4],
                header_len: 0,
                remaining: 0,
            }
        }
        Some(t) if t.starts_with("application/json") => Framing::Lines { at_boundary: true },
        _ => Framing::Unknown,
    };
    DrainableWatch {
        inner: body,
        framing,
        drain: Box::pin(drain),
        draining: false,
        done: false,
    }
    .boxed_unsync()
}

/// Where a watch stream's event boundaries are.
enum Framing {
    /// Newline-delimited JSON events.
    Lines {
        at_boundary: bool,
    },
    /// 4-byte big-endian length, then that many bytes.
    LengthPrefixed {
        header: [u8; 4],
        header_len: usize,
        remaining: usize,
    },
    Unknown,
}

impl Framing {
    fn at_boundary(&self) -> bool {
        match self {
            Framing::Lines { at_boundary } => *at_boundary,
            Framing::LengthPrefixed {
                header_len,
                remaining,
                ..
            } => *header_len == 0 && *remaining == 0,
            Framing::Unknown => true,
        }
    }

    /// Consumes `data`; returns the length of its prefix that ends at the
    /// first boundary (`None`: no boundary in it).
    fn first_boundary(&mut self, data: &[u8]) -> Option<usize> {
        let mut first = None;
        match self {
            Framing::Lines { at_boundary } => {
                first = data.iter().position(|b| *b == b'\n').map(|i| i + 1);
                if let Some(last) = data.last() {
                    *at_boundary = *last == b'\n';
                }
            }
            Framing::LengthPrefixed {
                header,
                header_len,
                remaining,
            } => {
                let mut i = 0;
                while i < data.len() {
                    if *remaining > 0 {
                        let take = (*remaining).min(data.len() - i);
                        *remaining -= take;
                        i += take;
                        if *remaining == 0 && first.is_none() {
                            first = Some(i);
                        }
                    } else {
                        header[*header_len] = data[i];
                        *header_len += 1;
                        i += 1;
                        if *header_len == 4 {
                            *remaining = u32::from_be_bytes(*header) as usize;
                            *header_len = 0;
                            if *remaining == 0 && first.is_none() {
                                first = Some(i);
                            }
                        }
                    }
                }
            }
            Framing::Unknown => first = Some(0),
        }
        first
    }
}

struct DrainableWatch {
    inner: Body,
    framing: Framing,
    drain: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    draining: bool,
    done: bool,
}

impl http_body::Body for DrainableWatch {
    type Data = bytes::Bytes;
    type Error = body::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if !this.draining && this.drain.as_mut().poll(cx).is_ready() {
            this.draining = true;
        }
        if this.draining && this.framing.at_boundary() {
            this.done = true;
            return Poll::Ready(None);
        }
        let frame = match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let Some(data) = frame.data_ref() else {
            return Poll::Ready(Some(Ok(frame)));
        };
        let data = data.clone();
        match this.framing.first_boundary(&data) {
            Some(end) if this.draining => {
                this.done = true;
                Poll::Ready(Some(Ok(http_body::Frame::data(data.slice(..end)))))
            }
            _ => Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }
}

/// Bridges an upgrade request: sends it upstream on its own HTTP/1.1
/// connection and, when the apiserver answers `101`, splices the two
/// upgraded connections together until either side closes.
///
/// # Errors
/// [`UpstreamError`] when the apiserver cannot be reached.
pub async fn forward_upgrade(
    upstream: &Upstream,
    mut req: Request<Incoming>,
    mut headers: HeaderMap,
    credentials: Credentials,
    remote: SocketAddr,
) -> Result<Response<Body>, UpstreamError> {
    let client_upgrade = hyper::upgrade::on(&mut req);
    // Keep `Connection: Upgrade` and `Upgrade`: they are the request here.
    let upgrade = headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    forwarded_for(&mut headers, remote);
    if let Some(u) = upgrade {
        headers.insert(header::UPGRADE, u);
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    }
    let (parts, incoming) = req.into_parts();
    let mut out = Request::new(body::boxed(incoming));
    *out.method_mut() = parts.method;
    *out.uri_mut() = upstream.uri(parts.uri.path_and_query())?;
    *out.headers_mut() = headers;
    let mut resp = upstream.send_upgrade(out, credentials).await?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (mut parts, incoming) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        return Ok(Response::from_parts(parts, body::boxed(incoming)));
    }
    let upstream_upgrade = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        let (client, server) = match tokio::try_join!(client_upgrade, upstream_upgrade) {
            Ok(pair) => pair,
            Err(error) => {
                tracing::debug!(%error, "upgrade was not completed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut server = TokioIo::new(server);
        match tokio::io::copy_bidirectional(&mut client, &mut server).await {
            Ok((up, down)) => tracing::debug!(up, down, "upgraded stream closed"),
            Err(error) => tracing::debug!(%error, "upgraded stream failed"),
        }
    });
    // Relay the 101 with the headers the protocols need (Upgrade,
    // Connection, Sec-WebSocket-Accept, X-Stream-Protocol-Version).
    let (parts, _) = resp.into_parts();
    let mut out = Response::new(body::empty());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *out.headers_mut() = parts.headers;
    Ok(out)
}

/// The response for a failed pass-through.
pub fn error_response(err: &UpstreamError) -> Response<Body> {
    let status: Status = err.to_status();
    status.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    async fn drained(content_type: &str, chunks: &[&[u8]], drain_after: usize) -> Vec<u8> {
        let chunks: Vec<Result<http_body::Frame<bytes::Bytes>, body::BoxError>> = chunks
            .iter()
            .map(|c| Ok(http_body::Frame::data(bytes::Bytes::copy_from_slice(c))))
            .collect();
        let inner =
            http_body_util::StreamBody::new(futures_util::stream::iter(chunks)).boxed_unsync();
        let token = CancellationToken::new();
        let mut b = drainable_watch(
            inner,
            Some(&HeaderValue::from_str(content_type).unwrap()),
            token.clone().cancelled_owned(),
        );
        let mut out = Vec::new();
        let mut n = 0;
        while let Some(f) = b.frame().await {
            out.extend_from_slice(f.unwrap().data_ref().unwrap());
            n += 1;
            if n == drain_after {
                token.cancel();
            }
        }
        out
    }

    #[tokio::test]
    async fn a_drained_watch_ends_at_an_event_boundary() {
        // JSON: drained after a chunk that ends mid-event: the event is
        // completed, nothing after it is sent.
        let out = drained(
            "application/json",
            &[b"{\"a\":1}\n{\"b\"", b":2}\n{\"c\":3}\n"],
            1,
        )
        .await;
        assert_eq!(out, b"{\"a\":1}\n{\"b\":2}\n");
        // Drained at a boundary: ends there.
        let out = drained("application/json", &[b"{\"a\":1}\n", b"{\"b\":2}\n"], 1).await;
        assert_eq!(out, b"{\"a\":1}\n");
        // Protobuf frames: 4-byte length, then the frame.
        let frame = |payload: &[u8]| {
            let mut f = (payload.len() as u32).to_be_bytes().to_vec();
            f.extend_from_slice(payload);
            f
        };
        let (one, two, three) = (frame(b"abc"), frame(b"defgh"), frame(b"i"));
        let stream = [one.clone(), two.clone(), three].concat();
        let out = drained(
            "application/vnd.kubernetes.protobuf;stream=watch",
            &[&stream[..2], &stream[2..9], &stream[9..]],
            2,
        )
        .await;
        assert_eq!(out, [one, two].concat());
        // Not drained: everything.
        let out = drained("application/json", &[b"x\n", b"y\n"], 0).await;
        assert_eq!(out, b"x\ny\n");
    }

    #[test]
    fn strips_hop_by_hop_and_connection_named() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::ACCEPT));
    }

    #[test]
    fn forwarded_for_appends() {
        let mut h = HeaderMap::new();
        forwarded_for(&mut h, "10.0.0.1:5".parse().unwrap());
        forwarded_for(&mut h, "127.0.0.1:6".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
    }
}
