//! The TLS side of a test's client: a rustls configuration that trusts a
//! control plane's (or a proxy's) CA and presents a client certificate
//! issued by it, and the HTTPS connector of a hyper client with it, for
//! the proxy's tests and the robustness run alike.

use std::sync::Arc;

use apimachinery::pki::Issued;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a client configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key in PEM could not be read.
    #[error("reading PEM: {0}")]
    Pem(#[from] rustls_pki_types::pem::Error),
    /// rustls refused the roots, the protocol versions or the certificate.
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

/// A rustls client configuration (ring, TLS 1.2 and 1.3) trusting the
/// certificates of `ca_pem`, presenting `certificate` when given.
///
/// # Errors
/// [`TlsError`] when a PEM block does not parse or rustls refuses it.
pub fn client_config(
    ca_pem: &str,
    certificate: Option<&Issued>,
) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    Ok(match certificate {
        Some(issued) => {
            let chain = vec![CertificateDer::from_pem_slice(issued.cert_pem.as_bytes())?];
            let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes())?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    })
}

/// The connector of a hyper client for `https://` URLs only, with
/// `config`, speaking HTTP/2 when `h2`, else HTTP/1.1.
pub fn https_connector(config: rustls::ClientConfig, h2: bool) -> HttpsConnector<HttpConnector> {
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only();
    if h2 {
        builder.enable_http2().build()
    } else {
        builder.enable_http1().build()
    }
}
