//! Client certificates at the TLS layer, as kube-apiserver takes them:
//! requested, never required, and judged after the handshake by its x509
//! authenticator (`k8s.io/apiserver/pkg/authentication/request/x509`).
//! The proxy's downstream listener and the simulated apiserver both serve
//! TLS this way, so both use [`AnyClientCert`].

use std::sync::Arc;

use parking_lot::RwLock;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

/// Requests client certificates and accepts any at the TLS layer, like Go's
/// `tls.RequestClientCert` that kube-apiserver uses: whether a certificate
/// authenticates anyone is decided after the handshake with
/// [`AnyClientCert::verify`], so an untrusted one gets `401`, not a failed
/// handshake. The handshake still proves the client holds the key.
///
/// The trusted roots can be replaced ([`AnyClientCert::set_roots`]) while
/// the verifier is in use: handshakes and checks that start afterwards see
/// the new ones.
#[derive(Debug)]
pub struct AnyClientCert {
    provider: Arc<CryptoProvider>,
    inner: RwLock<Arc<dyn ClientCertVerifier>>,
}

impl AnyClientCert {
    /// Trusting `roots`.
    ///
    /// # Errors
    /// When the roots are unusable.
    pub fn new(
        roots: RootCertStore,
        provider: Arc<CryptoProvider>,
    ) -> Result<AnyClientCert, rustls::server::VerifierBuilderError> {
        let inner = Self::webpki(roots, provider.clone())?;
        Ok(AnyClientCert {
            provider,
            inner: RwLock::new(inner),
        })
    }

    fn webpki(
        roots: RootCertStore,
        provider: Arc<CryptoProvider>,
    ) -> Result<Arc<dyn ClientCertVerifier>, rustls::server::VerifierBuilderError> {
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .allow_unauthenticated()
            .build()
    }

    /// Trusts `roots` instead of the current ones.
    ///
    /// # Errors
    /// When the roots are unusable; the current ones are kept.
    pub fn set_roots(
        &self,
        roots: RootCertStore,
    ) -> Result<(), rustls::server::VerifierBuilderError> {
        let inner = Self::webpki(roots, self.provider.clone())?;
        *self.inner.write() = inner;
        Ok(())
    }

    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        self.inner.read().clone()
    }

    /// Whether `chain` (leaf first) chains to the roots and is valid now.
    pub fn verify(&self, chain: &[CertificateDer<'_>]) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return false;
        };
        self.current()
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .is_ok()
    }
}

impl ClientCertVerifier for AnyClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: clients then send any certificate they hold (Go and rustls
    /// clients do), as with kube-apiserver's empty-hint default.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use rustls_pki_types::pem::PemObject;

    use super::*;
    use crate::pki::Ca;

    fn roots(ca: &Ca) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap())
            .unwrap();
        roots
    }

    fn chain(ca: &Ca) -> Vec<CertificateDer<'static>> {
        let issued = ca.issue_client("alice", Some("devs")).unwrap();
        vec![CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap()]
    }

    #[test]
    fn verifies_against_the_current_roots() {
        let (old, new) = (Ca::new("old").unwrap(), Ca::new("new").unwrap());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = AnyClientCert::new(roots(&old), provider).unwrap();
        assert!(verifier.offer_client_auth() && !verifier.client_auth_mandatory());
        assert!(verifier.verify(&chain(&old)));
        assert!(!verifier.verify(&chain(&new)));
        assert!(!verifier.verify(&[]));
        verifier.set_roots(roots(&new)).unwrap();
        assert!(verifier.verify(&chain(&new)));
        assert!(!verifier.verify(&chain(&old)));
    }
}
