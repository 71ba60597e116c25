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

/// A client connection idle this long gets its first TCP keep-alive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// The time between unanswered TCP keep-alive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes after which the kernel closes the connection.
const KEEPALIVE_PROBES: u32 = 2;
/// How long data the client has not acknowledged may stay so before the
/// kernel closes the connection (`TCP_USER_TIMEOUT`): keep-alive probes
/// go out only while nothing is in flight.
const USER_TIMEOUT: Duration = Duration::from_secs(50);

/// Lets the kernel find a client that vanished (a node powered off, a
/// network partition) without the proxy's help: TCP keep-alive probes
/// after [`KEEPALIVE_IDLE`] of silence, and [`USER_TIMEOUT`] for data
/// left unacknowledged, so such a connection and its watches are closed
/// within about 50 s.
///
/// kube-apiserver relies on TCP keep-alive alone (`secure_serving.go`,
/// `tcpKeepAliveListener`, a 3-minute period) and sends its clients no
/// HTTP/2 PING. Neither does the proxy: hyper's keep-alive polls a timer
/// on every poll of the connection, which a tier replica's many
/// connections of a few watches each paid per delivered event
/// (docs/tier.md).
pub fn keep_alive(tcp: &TcpStream) -> std::io::Result<()> {
    use rustix::net::sockopt;
    sockopt::set_socket_keepalive(tcp, true)?;
    sockopt::set_tcp_keepidle(tcp, KEEPALIVE_IDLE)?;
    sockopt::set_tcp_keepintvl(tcp, KEEPALIVE_INTERVAL)?;
    sockopt::set_tcp_keepcnt(tcp, KEEPALIVE_PROBES)?;
    sockopt::set_tcp_user_timeout(tcp, USER_TIMEOUT.as_millis() as u32)?;
    Ok(())
}

/// The next connection on `listener` (`listener` names it in the warning
/// of a failed accept), or `None` once `shutdown` is cancelled.
pub async fn next(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    name: &'static str,
) -> Option<(TcpStream, SocketAddr)> {
    next_of(std::slice::from_ref(listener), shutdown, name).await
}

/// The next connection on any of `listeners` (the client listener and the
/// pods' one serve alike), or `None` once `shutdown` is cancelled.
pub async fn next_of(
    listeners: &[TcpListener],
    shutdown: &CancellationToken,
    name: &'static str,
) -> Option<(TcpStream, SocketAddr)> {
    let accept = || {
        std::future::poll_fn(|cx| {
            for l in listeners {
                if let std::task::Poll::Ready(r) = l.poll_accept(cx) {
                    return std::task::Poll::Ready(r);
                }
            }
            std::task::Poll::Pending
        })
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            r = accept() => match r {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rustix::net::sockopt;

    /// An accepted connection carries the keep-alive options.
    #[tokio::test]
    async fn accepted_connections_are_kept_alive_by_the_kernel() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (tcp, _) = next(&listener, &CancellationToken::new(), "test")
            .await
            .unwrap();
        assert!(!sockopt::socket_keepalive(&tcp).unwrap());
        keep_alive(&tcp).unwrap();
        assert!(sockopt::socket_keepalive(&tcp).unwrap());
        assert_eq!(sockopt::tcp_keepidle(&tcp).unwrap(), KEEPALIVE_IDLE);
        assert_eq!(sockopt::tcp_keepintvl(&tcp).unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(sockopt::tcp_keepcnt(&tcp).unwrap(), KEEPALIVE_PROBES);
        assert_eq!(
            sockopt::tcp_user_timeout(&tcp).unwrap(),
            USER_TIMEOUT.as_millis() as u32
        );
    }
}
