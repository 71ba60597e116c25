//! The client-facing listener: accept, TLS handshake, and one task per
//! connection serving HTTP/1.1 (with upgrades) and HTTP/2.
//!
//! A semaphore bounds connections before accept; handshakes are bounded in
//! time; on shutdown the loop stops accepting and open connections drain
//! gracefully within the grace period, after which the rest are closed.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::auth::{ClientCertificate, UserInfo};
use crate::handler::{ConnInfo, Handler};
use crate::metrics::Metrics;
use crate::tls::ServerTls;

/// Bound on a client's TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on reading an HTTP/1.1 request's headers (slow-loris defence).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Concurrent HTTP/2 streams per client connection, like kube-apiserver's
/// default `--http2-max-streams-per-connection`.
const MAX_CONCURRENT_STREAMS: u32 = 1000;

/// Listener settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub max_connections: usize,
    pub grace_period: Duration,
    /// Set when a successor took the listening socket over: connections
    /// accepted just before then get [`HANDOVER_LINGER`] to send their
    /// requests before idle ones are closed.
    pub handed_over: Arc<std::sync::atomic::AtomicBool>,
}

/// How long, after a handover, connections accepted just before it may
/// take to send a request before idle connections are closed (an HTTP/1.1
/// connection closed before its first request would fail it).
const HANDOVER_LINGER: Duration = Duration::from_secs(1);

/// Accepts and serves connections on `listener` until `shutdown` is
/// cancelled, then drains them within the grace period.
pub async fn serve(
    listener: TcpListener,
    server_tls: ServerTls,
    handler: Arc<Handler>,
    metrics: Metrics,
    options: ServeOptions,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(server_tls.config());
    let permits = Arc::new(Semaphore::new(options.max_connections));
    let graceful = GracefulShutdown::new();
    let mut tasks = JoinSet::new();
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (tcp, remote) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(error) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let server_tls = server_tls.clone();
        let handler = handler.clone();
        let metrics = metrics.clone();
        let watcher = graceful.watcher();
        let span = tracing::debug_span!("conn", client.addr = %remote);
        tasks.spawn(
            async move {
                let _permit = permit;
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(error)) => {
                        metrics
                            .tls_handshake_errors
                            .with_label_values(&["error"])
                            .inc();
                        tracing::debug!(%error, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        metrics
                            .tls_handshake_errors
                            .with_label_values(&["timeout"])
                            .inc();
                        tracing::debug!("TLS handshake timed out");
                        return;
                    }
                };
                let cert = client_certificate(&server_tls, tls.get_ref().1.peer_certificates());
                let conn = Arc::new(ConnInfo { remote, cert });
                metrics.connections.inc();
                let svc = service_fn(move |req| {
                    let handler = handler.clone();
                    let conn = conn.clone();
                    // Boxed: hyper keeps each HTTP/2 stream's future inline
                    // in the stream's task for the stream's whole life, so
                    // an unboxed handler (kilobytes of state) would stay
                    // allocated under every idle watch after it returned.
                    Box::pin(async move { Ok::<_, Infallible>(handler.handle(req, &conn).await) })
                });
                let mut builder = auto::Builder::new(TokioExecutor::new());
                builder
                    .http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT);
                builder
                    .http2()
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
                    .keep_alive_interval(Duration::from_secs(30))
                    .keep_alive_timeout(Duration::from_secs(20));
                let conn = builder
                    .serve_connection_with_upgrades(TokioIo::new(tls), svc)
                    .into_owned();
                if let Err(error) = watcher.watch(conn).await {
                    tracing::debug!(%error, "connection ended with an error");
                }
                metrics.connections.dec();
            }
            .instrument(span),
        );
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    if options
        .handed_over
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        tokio::time::sleep(HANDOVER_LINGER).await;
    }
    tracing::info!(
        connections = graceful.count(),
        grace_period = ?options.grace_period,
        "stopped accepting; draining connections"
    );
    if tokio::time::timeout(options.grace_period, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("grace period over; closing the remaining connections");
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
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
