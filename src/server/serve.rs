//! The client-facing listener: accept, TLS handshake, and one task per
//! connection serving HTTP/2 or HTTP/1.1 (with upgrades), as ALPN chose.
//!
//! Connections are admitted by the [`Registry`](crate::server::conns::Registry):
//! past a limit the connection idle longest makes room, so a flood of idle
//! connections cannot lock anyone out; requests are limited per client.
//! Handshakes are bounded in time, and idle connections are closed as
//! kube-apiserver closes them (HTTP/1.1: no request headers within 32 s;
//! HTTP/2: no stream for 90 s). On shutdown the loop stops accepting and
//! open connections drain gracefully within the grace period, after which
//! the rest are closed.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::auth::{ClientCertificate, UserInfo};
use crate::cache::serve::watcher::BatchWindow;
use crate::component::metrics::Metrics;
use crate::component::woken::WokenOnly;
use crate::server::accept;
use crate::server::coalesce::{Coalesced, Polls};
use crate::server::conns::{ConnHandle, Limits, Registry, token_client, too_many_requests};
use crate::server::handler::{ConnInfo, Handler};
use crate::server::tls::ServerTls;

/// Bound on reading an HTTP/1.1 request's headers, the first request's
/// included: kube-apiserver's `ReadHeaderTimeout` (32 s) closes a
/// connection that sends nothing.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(32);
/// Concurrent HTTP/2 streams per client connection: 1000, as the
/// apiserver library recommends for servers whose clients multiplex many
/// watches on one connection (`RecommendedOptions`, aggregated
/// apiservers). kube-apiserver itself allows 100 when
/// `--http2-max-streams-per-connection` is unset; Go clients open another
/// connection past either limit, and so does the proxy upstream
/// (`upstream.rs`).
const MAX_CONCURRENT_STREAMS: u32 = 1000;
/// How often an HTTP/2 connection checks whether it has been idle for
/// [`crate::server::conns::H2_IDLE_TIMEOUT`].
const IDLE_CHECK: Duration = Duration::from_secs(5);

/// Listener settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub limits: Limits,
    pub grace_period: Duration,
    /// Set when a successor took the listening socket over, or the socket
    /// outlives this process (systemd socket activation): connections
    /// accepted just before then get [`HANDOVER_LINGER`] to send their
    /// requests before idle ones are closed.
    pub handed_over: Arc<std::sync::atomic::AtomicBool>,
}

/// How long, after a handover, connections accepted just before it may
/// take to send a request before idle connections are closed (an HTTP/1.1
/// connection closed before its first request would fail it).
const HANDOVER_LINGER: Duration = Duration::from_secs(1);

/// Accepts and serves connections on `listeners` (the client listener,
/// and the pods' one with `podNetwork.listen`) until `shutdown` is
/// cancelled, then drains them within the grace period.
pub async fn serve(
    listeners: Vec<TcpListener>,
    server_tls: ServerTls,
    handler: Arc<Handler>,
    metrics: Metrics,
    options: ServeOptions,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(server_tls.config());
    let registry = Registry::new(options.limits);
    // Cancelled to close every connection gracefully.
    let drain = CancellationToken::new();
    // HTTP/2 connections are told at once when the proxy stops accepting
    // (GOAWAY): a client's next request opens a new connection, which a
    // successor accepts after a handover. A request on the old one would
    // get a watch that ends at once, and its client would resend it there
    // in a tight loop for as long as the connection lived.
    let h2_drain = CancellationToken::new();
    let mut tasks = JoinSet::new();
    while let Some((tcp, remote)) = accept::next_of(&listeners, &shutdown, "clients").await {
        let _ = tcp.set_nodelay(true);
        if let Err(error) = accept::keep_alive(&tcp) {
            tracing::debug!(%error, "setting TCP keep-alive failed");
        }
        let acceptor = acceptor.clone();
        let server_tls = server_tls.clone();
        let handler = handler.clone();
        let metrics = metrics.clone();
        let registry = registry.clone();
        let drain = drain.clone();
        let h2_drain = h2_drain.clone();
        let stopping = shutdown.clone();
        let span = tracing::debug_span!("conn", client.addr = %remote);
        tasks.spawn(
            async move {
                let tls = match accept::handshake(&acceptor, tcp).await {
                    Ok(tls) => tls,
                    Err(error) => {
                        metrics
                            .tls_handshake_errors
                            .with_label_values(&[error.reason()])
                            .inc();
                        tracing::debug!(%error, "TLS handshake failed");
                        return;
                    }
                };
                let cert = client_certificate(&server_tls, tls.get_ref().1.peer_certificates());
                let client: Arc<str> = match &cert {
                    ClientCertificate::Verified(user) => Arc::from(format!("user:{}", user.name)),
                    _ => token_client(None),
                };
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                let Ok(handle) = registry.admit(client) else {
                    tracing::debug!("no room for the connection; closing it");
                    return;
                };
                let handle = Arc::new(handle);
                let by_certificate = matches!(cert, ClientCertificate::Verified(_));
                let conn = Arc::new(ConnInfo { remote, cert });
                metrics.connections.inc();
                // The batch window of the connection's held watches
                // (`cache.watchBatchMilliseconds`), shared by its streams.
                let window = h2.then(|| Arc::new(BatchWindow::default()));
                let svc = {
                    let handle = handle.clone();
                    service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                        if let Some(window) = &window {
                            req.extensions_mut().insert(window.clone());
                        }
                        let handler = handler.clone();
                        let conn = conn.clone();
                        let handle = handle.clone();
                        let stopping = stopping.clone();
                        // Boxed: hyper keeps each HTTP/2 stream's future
                        // inline in the stream's task for the stream's whole
                        // life, so an unboxed handler (kilobytes of state)
                        // would stay allocated under every idle watch after
                        // it returned.
                        Box::pin(async move {
                            let http1 = req.version() < http::Version::HTTP_2;
                            let mut resp =
                                serve_request(&handler, &conn, &handle, by_certificate, req).await;
                            // Stopping (a handover's linger, or the drain):
                            // an HTTP/1.1 client's next request goes on a
                            // new connection (as kube-apiserver's
                            // `Connection: close` while shutting down).
                            if http1
                                && stopping.is_cancelled()
                                && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS
                            {
                                resp.headers_mut().insert(
                                    http::header::CONNECTION,
                                    http::HeaderValue::from_static("close"),
                                );
                            }
                            Ok::<_, Infallible>(resp)
                        })
                    })
                };
                let result = if h2 {
                    let polls = Polls::default();
                    let io = TokioIo::new(Coalesced::new(tls, polls.clone()));
                    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .timer(TokioTimer::new())
                        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
                        .serve_connection(io, svc);
                    drive(
                        std::pin::pin!(conn),
                        |c| c.graceful_shutdown(),
                        &handle,
                        &h2_drain,
                        Some(&polls),
                    )
                    .await
                } else {
                    let io = TokioIo::new(tls);
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_READ_TIMEOUT)
                        .serve_connection(io, svc)
                        .with_upgrades();
                    drive(
                        std::pin::pin!(conn),
                        |c| c.graceful_shutdown(),
                        &handle,
                        &drain,
                        None,
                    )
                    .await
                };
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended with an error");
                }
                metrics.connections.dec();
            }
            .instrument(span),
        );
        while tasks.try_join_next().is_some() {}
    }
    drop(listeners);
    h2_drain.cancel();
    if options
        .handed_over
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        tokio::time::sleep(HANDOVER_LINGER).await;
    }
    tracing::info!(
        connections = tasks.len(),
        grace_period = ?options.grace_period,
        "stopped accepting; draining connections"
    );
    drain.cancel();
    h2_drain.cancel();
    let drained = tokio::time::timeout(options.grace_period, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!("grace period over; closing the remaining connections");
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// One request: counted against its client's limits, then handled.
async fn serve_request(
    handler: &Handler,
    conn: &ConnInfo,
    handle: &ConnHandle,
    by_certificate: bool,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<apimachinery::body::Body> {
    // Without a verified certificate, the client is who its token says
    // (a digest of it; a WebSocket request's may be a subprotocol), or
    // anonymous.
    if !by_certificate {
        let client = token_client(crate::auth::request_token(req.headers()).as_deref());
        if handle.identify(&client).is_err() {
            return too_many_requests();
        }
    }
    let Ok(waiting) = handle.waiting() else {
        return too_many_requests();
    };
    let active = handle.active();
    let resp = handler.handle(req, conn).await;
    drop(waiting);
    let (parts, body) = resp.into_parts();
    http::Response::from_parts(parts, apimachinery::body::guarded(body, active))
}

/// Serves a connection until it ends, closing it gracefully when the
/// server drains, when the registry evicts it, or (HTTP/2, `polls` set:
/// its writes are [`Coalesced`]) when it has had no stream for
/// [`crate::server::conns::H2_IDLE_TIMEOUT`].
async fn drive<C>(
    mut conn: Pin<&mut C>,
    graceful: fn(Pin<&mut C>),
    handle: &ConnHandle,
    drain: &CancellationToken,
    polls: Option<&Polls>,
) -> Result<(), hyper::Error>
where
    C: Future<Output = Result<(), hyper::Error>>,
{
    let h2 = polls.is_some();
    // The connection's task is woken for every frame it writes: the drain
    // and eviction signals and the idle check are polled only when they
    // fire (`WokenOnly`; a token's future locks its mutex on every poll),
    // and the connection first.
    let mut drained = WokenOnly::new(drain.child_token().cancelled_owned());
    let mut evicted = WokenOnly::new(handle.closed().clone().cancelled_owned());
    let mut closing = false;
    let mut check = tokio::time::interval(IDLE_CHECK);
    check.tick().await;
    loop {
        tokio::select! {
            biased;
            result = Ticking { conn: conn.as_mut(), polls } => return result,
            _ = &mut drained, if !closing => {
                closing = true;
                graceful(conn.as_mut());
            }
            _ = &mut evicted, if !closing => {
                closing = true;
                graceful(conn.as_mut());
            }
            _ = WokenOnly::new(check.tick()), if h2 && !closing => {
                if handle
                    .idle_since()
                    .is_some_and(|since| since.elapsed() >= crate::server::conns::H2_IDLE_TIMEOUT)
                {
                    closing = true;
                    graceful(conn.as_mut());
                }
            }
        }
    }
}

/// `conn`, ticking `polls` as each of its polls starts.
struct Ticking<'a, C> {
    conn: Pin<&'a mut C>,
    polls: Option<&'a Polls>,
}

impl<C: Future> Future for Ticking<'_, C> {
    type Output = C::Output;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if let Some(polls) = self.polls {
            polls.tick();
        }
        self.conn.as_mut().poll(cx)
    }
}

/// The connection's client certificate, judged as the apiserver's x509
/// authenticator does: verified against the client CA (now, for client
/// authentication), the user its CN, groups its O. A failure is not a
/// handshake error: the request may still authenticate with a token.
pub(crate) fn client_certificate(
    server_tls: &ServerTls,
    chain: Option<&[rustls::pki_types::CertificateDer<'_>]>,
) -> ClientCertificate {
    match chain {
        None | Some([]) => ClientCertificate::None,
        Some(chain) if server_tls.verify_client(chain) => {
            match UserInfo::from_certificate(&chain[0]) {
                Some(user) => ClientCertificate::Verified(user.with_authenticated_group()),
                None => ClientCertificate::NoUser,
            }
        }
        Some(_) => ClientCertificate::Rejected,
    }
}
