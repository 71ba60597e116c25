//! Transport: TLS from the sim's CA (client certificates requested but
//! optional, ALPN `h2` and `http/1.1`), one task per connection serving
//! HTTP/1.1 (with upgrades) or HTTP/2, and a stop that closes the listener
//! and every connection at once, like an apiserver going down.

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::RootCertStore;
use rustls::server::ServerConfig;

use apimachinery::x509::AnyClientCert;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

use super::authn::UserInfo;
use super::handler::{self, ConnInfo};
use super::shutdown::until_stopped;
use super::state::State;
use apimachinery::pki::Ca;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A running server.
#[derive(Debug)]
pub struct Server {
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The rustls configuration: a serving certificate for `localhost` and
/// 127.0.0.1 signed by `ca`, client certificates verified against `ca` when
/// presented.
///
/// # Errors
/// When certificate generation or the rustls setup fails.
pub fn tls_config(ca: &Ca) -> io::Result<(Arc<ServerConfig>, Arc<AnyClientCert>)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    let ca_der =
        CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).map_err(io::Error::other)?;
    roots.add(ca_der).map_err(io::Error::other)?;
    let verifier = Arc::new(AnyClientCert::new(roots, provider.clone()).map_err(io::Error::other)?);
    let issued = ca
        .issue_server(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
        .map_err(io::Error::other)?;
    let chain =
        vec![CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).map_err(io::Error::other)?];
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).map_err(io::Error::other)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_client_cert_verifier(verifier.clone())
        .with_single_cert(chain, key)
        .map_err(io::Error::other)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((Arc::new(config), verifier))
}

/// Binds `addr` with `SO_REUSEADDR`, so a restart can take the same port
/// while old connections linger in TIME_WAIT.
///
/// # Errors
/// When the address cannot be bound.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

// === impl Server ===

impl Server {
    /// Serves `listener` until stopped.
    pub fn spawn(state: Arc<State>, listener: TcpListener, tls: Arc<ServerConfig>) -> Server {
        let (shutdown, rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(state, listener, TlsAcceptor::from(tls), rx));
        Server { shutdown, task }
    }

    /// Asks the server to stop without waiting.
    pub fn signal(&self) {
        self.shutdown.send_replace(true);
    }

    /// Stops accepting, closes every connection, and waits until done.
    pub async fn stop(self) {
        self.signal();
        let _ = self.task.await;
    }
}

async fn accept_loop(
    state: Arc<State>,
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    let stopped = until_stopped(shutdown.clone());
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            () = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let span = tracing::debug_span!("sim_conn", %peer);
                    conns.spawn(serve(state.clone(), acceptor.clone(), tcp, shutdown.clone()).instrument(span));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "sim accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    // Closing the listener first makes new connections fail at once.
    drop(listener);
    conns.shutdown().await;
}

async fn serve(
    state: Arc<State>,
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    shutdown: watch::Receiver<bool>,
) {
    let _ = tcp.set_nodelay(true);
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "sim TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    // Like the apiserver's x509 authenticator: a presented certificate that
    // does not verify (or has no CN) fails authentication with a 401.
    let (cert_user, cert_rejected) = match tls.get_ref().1.peer_certificates() {
        None | Some([]) => (None, false),
        Some(chain) if state.client_certs.verify(chain) => {
            match UserInfo::from_certificate(&chain[0]) {
                Some(user) => (Some(user), false),
                None => (None, true),
            }
        }
        Some(_) => (None, true),
    };
    let conn = Arc::new(ConnInfo {
        cert_user,
        cert_rejected,
        shutdown,
    });
    let service = service_fn(move |req| {
        let state = state.clone();
        let conn = conn.clone();
        async move { Ok::<_, Infallible>(handler::handle(state, conn, req).await) }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    if let Err(e) = builder
        .serve_connection_with_upgrades(TokioIo::new(tls), service)
        .await
    {
        tracing::debug!(error = %e, "sim connection ended with an error");
    }
}
