//! What every listener of the proxy does the same way before it serves a
//! connection: take the next one, backing off when `accept` fails (out of
//! file descriptors, `EMFILE`) instead of spinning, and complete a TLS
//! handshake within a bounded time, so a client that connects and sends
//! nothing holds no task for long. The client listener ([`super::serve`]),
//! the admin listener and the metrics listener use it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// How long a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long to wait after a failed `accept` before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The next connection on `listener` (`listener` names it in the warning
/// of a failed accept), or `None` once `shutdown` is cancelled.
pub async fn next(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    name: &'static str,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            r = listener.accept() => match r {
                Ok(c) => return Some(c),
                Err(error) => {
                    tracing::warn!(%error, listener = name, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
}

/// Why a TLS handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The client sent something that is not a TLS handshake rustls
    /// accepts, or went away.
    #[error(transparent)]
    Failed(#[from] std::io::Error),
    /// Not done within [`HANDSHAKE_TIMEOUT`].
    #[error("not done within {HANDSHAKE_TIMEOUT:?}")]
    TimedOut,
}

impl HandshakeError {
    /// The `reason` label of `kube_cache_proxy_tls_handshake_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            HandshakeError::Failed(_) => "error",
            HandshakeError::TimedOut => "timeout",
        }
    }
}

/// The server side of the TLS handshake on `tcp`, within
/// [`HANDSHAKE_TIMEOUT`].
///
/// # Errors
/// [`HandshakeError`] when it fails or takes too long.
pub async fn handshake(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
) -> Result<TlsStream<TcpStream>, HandshakeError> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(HandshakeError::TimedOut),
    }
}
