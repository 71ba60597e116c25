//! One upstream server ([`Site`]): its base URL, its connection pools, one
//! per kind of [`Credentials`], the proxy's `Authorization` from `kube`'s
//! auth layer, and its client certificate re-read when its files change.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Empty;
use kube::client::ConfigExt;
use parking_lot::{Mutex, RwLock};
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, SignatureScheme};
use rustls_pki_types::ServerName;
use tower::Layer;
use tower::util::BoxCloneSyncService;

use super::balance::Balancer;
use super::error::UpstreamError;
use super::pool::Transport;
use crate::component::certs::{Stamp, stamp};
use apimachinery::body::BoxError;

/// Which credentials a request carries upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    /// The proxy's own client certificate and `Authorization` header.
    Proxy,
    /// None of the proxy's; the client's own headers are kept.
    Client,
    /// As `Client`, on HTTP/1.1 connections of their own: for requests the
    /// apiserver may answer as unauthenticated or anonymous (see the
    /// [`crate::upstream`] documentation).
    ClientHttp1,
}

/// kube's auth layer wrapped around a service that answers with the headers
/// it was given: calling it yields the proxy's current `Authorization`.
pub(super) type AuthService =
    BoxCloneSyncService<Request<Empty<Bytes>>, Response<Empty<Bytes>>, BoxError>;

/// One upstream server (an apiserver, or a tier proxy): base URL,
/// connection pools and credentials.
#[derive(Clone)]
pub(super) struct Site {
    pub(super) base: Uri,
    /// Connections carrying the proxy's client certificate; replaced when
    /// that certificate is re-read from its files.
    pub(super) proxy: Arc<RwLock<Transport>>,
    pub(super) client: Transport,
    pub(super) client_http1: Transport,
    pub(super) auth: Option<AuthService>,
    /// The proxy's client certificate and key files, when the kubeconfig
    /// names files rather than embedding the data.
    pub(super) client_cert_files: Option<Arc<ClientCertFiles>>,
    /// The TLS configuration from the kubeconfig, before any re-read
    /// client certificate.
    pub(super) proxy_tls: Arc<ClientConfig>,
    pub(super) server_name: ServerName<'static>,
    pub(super) connect_timeout: Duration,
    pub(super) idle_timeout: Duration,
    /// With `upstream.clientSideBalancing`: the apiservers its
    /// connections are spread across.
    pub(super) balancer: Option<Arc<Balancer>>,
}

/// The proxy's client certificate and key files, and what they looked like
/// when last read.
#[derive(Debug)]
pub(super) struct ClientCertFiles {
    cert: PathBuf,
    key: PathBuf,
    stamps: Mutex<(Stamp, Stamp)>,
}

/// Always presents one client certificate.
#[derive(Debug)]
struct FixedClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for FixedClientCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl std::fmt::Debug for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

// === impl Site ===

impl Site {
    /// Builds the pools from an already-loaded `kube::Config`.
    ///
    /// # Errors
    /// [`UpstreamError::Config`] when its TLS material is invalid.
    pub(super) fn new(
        kube_config: &kube::Config,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_lag: Option<Duration>,
    ) -> Result<Site, UpstreamError> {
        let cfg_err = |e: kube::Error| UpstreamError::Config(e.to_string());
        let proxy_tls = kube_config.rustls_client_config().map_err(cfg_err)?;
        let mut anonymous = kube_config.clone();
        anonymous.auth_info = kube::config::AuthInfo::default();
        let client_tls = anonymous.rustls_client_config().map_err(cfg_err)?;

        let base = kube_config.cluster_url.clone();
        let host = base
            .host()
            .ok_or_else(|| UpstreamError::Config(format!("server URL {base} has no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let balancer = max_lag.map(|lag| {
            let authority = base.authority().map_or("", |a| a.as_str()).to_string();
            Arc::new(Balancer::new(authority, lag))
        });
        let name = kube_config.tls_server_name.clone().unwrap_or(host);
        let server_name = ServerName::try_from(name.clone())
            .map_err(|e| UpstreamError::Config(format!("invalid TLS server name {name:?}: {e}")))?;

        let auth = kube_config.auth_layer().map_err(cfg_err)?.map(|layer| {
            let identity = tower::service_fn(|req: Request<Empty<Bytes>>| async move {
                let mut echo = Response::new(Empty::new());
                *echo.headers_mut() = req.headers().clone();
                Ok::<_, BoxError>(echo)
            });
            BoxCloneSyncService::new(layer.layer(identity))
        });

        // client-go re-reads a client certificate named by file (kubelet's
        // kubelet-client-current.pem rotates); data embedded in the
        // kubeconfig cannot change.
        let info = &kube_config.auth_info;
        let client_cert_files = match (&info.client_certificate, &info.client_key) {
            (Some(cert), Some(key))
                if info.client_certificate_data.is_none() && info.client_key_data.is_none() =>
            {
                let (cert, key) = (PathBuf::from(cert), PathBuf::from(key));
                let stamps = (stamp(&cert), stamp(&key));
                Some(Arc::new(ClientCertFiles {
                    cert,
                    key,
                    stamps: Mutex::new(stamps),
                }))
            }
            _ => None,
        };

        let proxy = Transport::new(
            proxy_tls.clone(),
            &server_name,
            connect_timeout,
            idle_timeout,
            true,
            balancer.clone(),
        );
        let client = Transport::new(
            client_tls.clone(),
            &server_name,
            connect_timeout,
            idle_timeout,
            true,
            balancer.clone(),
        );
        let client_http1 = Transport::new(
            client_tls,
            &server_name,
            connect_timeout,
            idle_timeout,
            false,
            balancer.clone(),
        );
        Ok(Site {
            base,
            proxy: Arc::new(RwLock::new(proxy)),
            client,
            client_http1,
            auth,
            client_cert_files,
            proxy_tls: Arc::new(proxy_tls),
            server_name,
            connect_timeout,
            idle_timeout,
            balancer,
        })
    }

    /// Re-reads the proxy's client certificate and key if their files
    /// changed, and if they load, sends new requests over new connections
    /// that present them (requests in flight finish on the old ones). A
    /// pair that does not load (a rotation half-written, a key that does
    /// not match) is logged and the current one kept. Returns whether the
    /// certificate was replaced.
    pub fn reload_client_certificate_if_changed(&self) -> bool {
        let Some(files) = &self.client_cert_files else {
            return false;
        };
        let stamps = (stamp(&files.cert), stamp(&files.key));
        let mut seen = files.stamps.lock();
        if *seen == stamps {
            return false;
        }
        let provider = self.proxy_tls.crypto_provider().clone();
        let key = match crate::component::certs::read_certified_key(
            &files.cert,
            &files.key,
            &provider,
        ) {
            Ok(key) => key,
            Err(error) => {
                tracing::warn!(%error, "upstream client certificate changed but could not be loaded; keeping the previous one");
                return false;
            }
        };
        let mut tls = (*self.proxy_tls).clone();
        tls.client_auth_cert_resolver = Arc::new(FixedClientCert(Arc::new(key)));
        // No resumption of sessions made with the previous certificate: a
        // resumed session keeps the identity it was established with.
        tls.resumption = rustls::client::Resumption::default();
        let transport = Transport::new(
            tls,
            &self.server_name,
            self.connect_timeout,
            self.idle_timeout,
            true,
            self.balancer.clone(),
        );
        *self.proxy.write() = transport;
        *seen = stamps;
        tracing::info!(cert = %files.cert.display(), "reloaded the upstream client certificate");
        true
    }

    /// Spawns a task that calls
    /// [`Upstream::reload_client_certificate_if_changed`](crate::upstream::Upstream::reload_client_certificate_if_changed) every `interval`
    /// until `shutdown` is cancelled; nothing when the kubeconfig embeds
    /// its client certificate or has none.
    pub fn spawn_reloader(
        &self,
        interval: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        if self.client_cert_files.is_none() {
            return;
        }
        let this = self.clone();
        crate::component::certs::spawn_every(interval, shutdown, move || {
            this.reload_client_certificate_if_changed();
        });
    }

    /// New requests with the proxy's own credentials go over new
    /// connections ([`crate::upstream::Upstream::reconnect`]).
    pub(super) fn reset_proxy_connections(&self) {
        self.proxy.read().pools.reset();
    }

    pub(super) fn transport(&self, credentials: Credentials) -> Transport {
        match credentials {
            Credentials::Proxy => self.proxy.read().clone(),
            Credentials::Client => self.client.clone(),
            Credentials::ClientHttp1 => self.client_http1.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::{Upstream, load_kube_config};

    fn upstream(url: &str) -> Upstream {
        let cfg = kube::Config::new(url.parse().unwrap());
        Upstream::new(&cfg, Duration::from_secs(1), Duration::from_secs(1)).unwrap()
    }

    #[tokio::test]
    async fn client_certificate_files_are_reread_only_when_valid() {
        let dir = std::env::temp_dir().join(format!("kcp-upstream-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = apimachinery::pki::Ca::new("ca").unwrap();
        let pem = dir.join("client.pem");
        let first = ca.issue_client("proxy", None).unwrap();
        std::fs::write(&pem, format!("{}{}", first.cert_pem, first.key_pem)).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        let file = pem.to_str().unwrap();
        std::fs::write(
            &kubeconfig,
            apimachinery::kubeconfig::with_certificate_files(
                "https://127.0.0.1:1",
                &ca.cert_pem(),
                "proxy",
                file,
                file,
            ),
        )
        .unwrap();
        let cfg = load_kube_config(Some(&kubeconfig), None).await.unwrap();
        let u = Upstream::new(&cfg, Duration::from_secs(1), Duration::from_secs(1)).unwrap();
        assert!(u.sites[0].client_cert_files.is_some());
        // Unchanged.
        assert!(!u.reload_client_certificate_if_changed());
        // Half-written, and a key that belongs to another certificate: kept.
        std::fs::write(&pem, &first.cert_pem).unwrap();
        assert!(!u.reload_client_certificate_if_changed());
        let second = ca.issue_client("proxy", None).unwrap();
        std::fs::write(&pem, format!("{}{}", second.cert_pem, first.key_pem)).unwrap();
        assert!(!u.reload_client_certificate_if_changed());
        // Complete: taken, once.
        std::fs::write(&pem, format!("{}{}", second.cert_pem, second.key_pem)).unwrap();
        assert!(u.reload_client_certificate_if_changed());
        assert!(!u.reload_client_certificate_if_changed());
        // Embedded data cannot change: nothing to watch.
        assert!(
            upstream("https://127.0.0.1:1").sites[0]
                .client_cert_files
                .is_none()
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
