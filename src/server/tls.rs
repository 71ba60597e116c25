//! Downstream TLS: the serving certificate and the client-CA bundle, both
//! read from PEM files and reloaded when the files change, without a
//! restart and without touching open connections (a reload only affects
//! handshakes that start afterwards).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use apimachinery::x509::AnyClientCert;
use parking_lot::RwLock;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::CertificateDer;

use crate::component::certs::{Stamp, read_certified_key, read_certs, spawn_every, stamp};
pub use crate::component::certs::{TlsError, provider};
use crate::component::config::{TlsConfig, TlsVersion};

/// Downstream TLS state: the rustls config handed to the acceptor plus the
/// reloadable parts behind it.
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: Arc<ServerConfig>,
    cert: Arc<ReloadingCert>,
    client_ca: Option<Arc<ReloadingClientCa>>,
}

// === impl ServerTls ===

impl ServerTls {
    /// Loads the certificate, key and optional client CA and builds the
    /// rustls config: ALPN `h2` and `http/1.1`, TLS 1.2 or 1.3 minimum,
    /// client certificates requested (not required) when a CA is given.
    ///
    /// # Errors
    /// [`TlsError`] naming the file that is missing or invalid.
    pub fn load(cfg: &TlsConfig) -> Result<ServerTls, TlsError> {
        let cert_file = cfg.cert_file.clone().ok_or_else(|| TlsError::File {
            path: PathBuf::new(),
            message: "no serving certificate configured".into(),
        })?;
        let key_file = cfg.private_key_file.clone().ok_or_else(|| TlsError::File {
            path: PathBuf::new(),
            message: "no private key configured".into(),
        })?;
        let provider = provider();
        let cert = Arc::new(ReloadingCert::load(cert_file, key_file, provider.clone())?);
        Self::build(cfg, cert, provider)
    }

    /// Like [`ServerTls::load`], but serves `initial` until the certificate
    /// and key files change (or [`ServerTls::reload_now`]): for a
    /// certificate managed by the proxy itself (`tls.csr`), whose files may
    /// not exist yet or hold an expired pair.
    ///
    /// # Errors
    /// [`TlsError`] when the client CA is missing or invalid.
    pub fn with_initial(
        cfg: &TlsConfig,
        cert_file: PathBuf,
        key_file: PathBuf,
        initial: CertifiedKey,
    ) -> Result<ServerTls, TlsError> {
        let provider = provider();
        let cert = Arc::new(ReloadingCert::with_initial(
            cert_file,
            key_file,
            provider.clone(),
            initial,
        ));
        Self::build(cfg, cert, provider)
    }

    fn build(
        cfg: &TlsConfig,
        cert: Arc<ReloadingCert>,
        provider: Arc<CryptoProvider>,
    ) -> Result<ServerTls, TlsError> {
        let client_ca = match &cfg.client_ca_file {
            Some(path) => Some(Arc::new(ReloadingClientCa::load(
                path.clone(),
                provider.clone(),
            )?)),
            None => None,
        };
        let versions: &[&'static rustls::SupportedProtocolVersion] = match cfg.min_version {
            TlsVersion::VersionTLS12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            TlsVersion::VersionTLS13 => &[&rustls::version::TLS13],
        };
        let builder = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(|source| TlsError::Rustls {
                path: PathBuf::new(),
                source,
            })?;
        let builder = match &client_ca {
            Some(ca) => builder.with_client_cert_verifier(ca.verifier.clone()),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(cert.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            config: Arc::new(config),
            cert,
            client_ca,
        })
    }

    /// The rustls server config.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.config.clone()
    }

    /// When the current serving certificate expires, in seconds since the
    /// Unix epoch.
    pub fn not_after(&self) -> Option<i64> {
        let key = self.cert.current.read().0.clone();
        let leaf = key.cert.first()?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
        Some(cert.validity().not_after.timestamp())
    }

    /// Whether the current serving certificate names `ip` among its IP
    /// subject alternative names (what a client connecting to `ip`
    /// verifies).
    pub fn names_ip(&self, ip: std::net::IpAddr) -> bool {
        use x509_parser::prelude::GeneralName;
        let key = self.cert.current.read().0.clone();
        let Some(leaf) = key.cert.first() else {
            return false;
        };
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) else {
            return false;
        };
        let octets = match ip {
            std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
            std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
        };
        cert.subject_alternative_name()
            .ok()
            .flatten()
            .is_some_and(|san| {
                san.value
                    .general_names
                    .iter()
                    .any(|n| matches!(n, GeneralName::IPAddress(b) if *b == octets.as_slice()))
            })
    }

    /// Whether a client's certificate chain (leaf first) chains to the
    /// current client-CA bundle and is valid now.
    pub fn verify_client(&self, chain: &[CertificateDer<'_>]) -> bool {
        self.client_ca
            .as_ref()
            .is_some_and(|ca| ca.verifier.verify(chain))
    }

    /// Re-reads the serving certificate and key now, whether or not the
    /// files look changed. On error the previous pair is kept.
    ///
    /// # Errors
    /// [`TlsError`] naming the file that could not be loaded.
    pub fn reload_now(&self) -> Result<(), TlsError> {
        self.cert.reload_now()
    }

    /// Re-reads files whose modification time or size changed. A file that
    /// fails to parse is logged and the previous material kept.
    pub fn reload_if_changed(&self) {
        self.cert.reload_if_changed();
        if let Some(ca) = &self.client_ca {
            ca.reload_if_changed();
        }
    }

    /// Spawns a task that calls [`ServerTls::reload_if_changed`] every
    /// `interval` until `shutdown` is cancelled.
    pub fn spawn_reloader(
        &self,
        interval: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let this = self.clone();
        spawn_every(interval, shutdown, move || this.reload_if_changed());
    }
}

impl crate::component::certs::ReloadNow for ServerTls {
    fn reload_now(&self) -> Result<(), TlsError> {
        ServerTls::reload_now(self)
    }
}

/// The serving certificate, swapped atomically on reload.
#[derive(Debug)]
struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<(Arc<CertifiedKey>, Stamp, Stamp)>,
}

impl ReloadingCert {
    fn load(
        cert_file: PathBuf,
        key_file: PathBuf,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let key = read_certified_key(&cert_file, &key_file, &provider)?;
        let stamps = (stamp(&cert_file), stamp(&key_file));
        Ok(ReloadingCert {
            cert_file,
            key_file,
            provider,
            current: RwLock::new((Arc::new(key), stamps.0, stamps.1)),
        })
    }

    /// Serves `initial`; the files are read once they change.
    fn with_initial(
        cert_file: PathBuf,
        key_file: PathBuf,
        provider: Arc<CryptoProvider>,
        initial: CertifiedKey,
    ) -> Self {
        let stamps = (stamp(&cert_file), stamp(&key_file));
        ReloadingCert {
            cert_file,
            key_file,
            provider,
            current: RwLock::new((Arc::new(initial), stamps.0, stamps.1)),
        }
    }

    fn reload_now(&self) -> Result<(), TlsError> {
        let stamps = (stamp(&self.cert_file), stamp(&self.key_file));
        let key = read_certified_key(&self.cert_file, &self.key_file, &self.provider)?;
        *self.current.write() = (Arc::new(key), stamps.0, stamps.1);
        tracing::info!(cert = %self.cert_file.display(), "loaded serving certificate");
        Ok(())
    }

    fn reload_if_changed(&self) {
        let stamps = (stamp(&self.cert_file), stamp(&self.key_file));
        {
            let cur = self.current.read();
            if cur.1 == stamps.0 && cur.2 == stamps.1 {
                return;
            }
        }
        match read_certified_key(&self.cert_file, &self.key_file, &self.provider) {
            Ok(key) => {
                *self.current.write() = (Arc::new(key), stamps.0, stamps.1);
                tracing::info!(cert = %self.cert_file.display(), "reloaded serving certificate");
            }
            Err(error) => {
                // Keep serving with the old pair; a half-written file is
                // retried on the next tick.
                tracing::warn!(%error, "serving certificate changed but could not be loaded; keeping the previous one");
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().0.clone())
    }
}

/// The client-CA bundle file behind an [`AnyClientCert`], re-read when it
/// changes.
#[derive(Debug)]
struct ReloadingClientCa {
    path: PathBuf,
    verifier: Arc<AnyClientCert>,
    stamp: parking_lot::Mutex<Stamp>,
}

impl ReloadingClientCa {
    fn load(path: PathBuf, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let st = stamp(&path);
        let verifier = AnyClientCert::new(Self::read(&path)?, provider)
            .map_err(|e| Self::unusable(&path, &e))?;
        Ok(ReloadingClientCa {
            path,
            verifier: Arc::new(verifier),
            stamp: parking_lot::Mutex::new(st),
        })
    }

    fn read(path: &Path) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in read_certs(path)? {
            roots.add(cert).map_err(|source| TlsError::Rustls {
                path: path.to_path_buf(),
                source,
            })?;
        }
        Ok(roots)
    }

    fn unusable(path: &Path, e: &rustls::server::VerifierBuilderError) -> TlsError {
        TlsError::File {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }

    fn reload_if_changed(&self) {
        let st = stamp(&self.path);
        let mut current = self.stamp.lock();
        if *current == st {
            return;
        }
        let loaded = Self::read(&self.path).and_then(|roots| {
            self.verifier
                .set_roots(roots)
                .map_err(|e| Self::unusable(&self.path, &e))
        });
        match loaded {
            Ok(()) => {
                *current = st;
                tracing::info!(ca = %self.path.display(), "reloaded client CA bundle");
            }
            Err(error) => {
                tracing::warn!(%error, "client CA bundle changed but could not be loaded; keeping the previous one");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apimachinery::pki::Ca;
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn loads_and_reloads() {
        let dir = tempdir();
        let ca = Ca::new("ca").unwrap();
        let s1 = ca.issue_server(&["localhost"], &[]).unwrap();
        let cfg = TlsConfig {
            cert_file: Some(write(&dir, "tls.crt", &s1.cert_pem)),
            private_key_file: Some(write(&dir, "tls.key", &s1.key_pem)),
            client_ca_file: Some(write(&dir, "ca.crt", &ca.cert_pem())),
            min_version: TlsVersion::VersionTLS12,
            ..TlsConfig::default()
        };
        let tls = ServerTls::load(&cfg).unwrap();
        let before = tls.cert.current.read().0.clone();
        // Same files: nothing changes.
        tls.reload_if_changed();
        assert!(Arc::ptr_eq(&before, &tls.cert.current.read().0));
        // A broken replacement keeps the old key.
        std::fs::write(dir.join("tls.crt"), "garbage").unwrap();
        tls.reload_if_changed();
        assert!(Arc::ptr_eq(&before, &tls.cert.current.read().0));
        // A valid replacement is picked up.
        let s2 = ca.issue_server(&["localhost"], &[]).unwrap();
        std::fs::write(dir.join("tls.crt"), &s2.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), &s2.key_pem).unwrap();
        tls.reload_if_changed();
        assert!(!Arc::ptr_eq(&before, &tls.cert.current.read().0));
        let not_after = tls.not_after().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!(not_after > now);
    }

    #[test]
    fn client_ca_reloads() {
        let dir = tempdir();
        let old = Ca::new("old").unwrap();
        let new = Ca::new("new").unwrap();
        let served = old.issue_server(&["localhost"], &[]).unwrap();
        let cfg = TlsConfig {
            cert_file: Some(write(&dir, "tls.crt", &served.cert_pem)),
            private_key_file: Some(write(&dir, "tls.key", &served.key_pem)),
            client_ca_file: Some(write(&dir, "ca.crt", &old.cert_pem())),
            ..TlsConfig::default()
        };
        let tls = ServerTls::load(&cfg).unwrap();
        let chain = |ca: &Ca| {
            let issued = ca.issue_client("alice", Some("devs")).unwrap();
            vec![CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap()]
        };
        assert!(tls.verify_client(&chain(&old)));
        assert!(!tls.verify_client(&chain(&new)));
        assert!(!tls.verify_client(&[]));
        // A broken bundle keeps the old roots.
        std::fs::write(dir.join("ca.crt"), "garbage").unwrap();
        tls.reload_if_changed();
        assert!(tls.verify_client(&chain(&old)));
        // A new bundle replaces them, for the verifier the live config holds.
        std::fs::write(dir.join("ca.crt"), new.cert_pem()).unwrap();
        tls.reload_if_changed();
        assert!(tls.verify_client(&chain(&new)));
        assert!(!tls.verify_client(&chain(&old)));
    }

    #[test]
    fn initial_pair_until_the_files_load() {
        let dir = tempdir();
        let ca = Ca::new("ca").unwrap();
        let initial = ca.issue_server(&["localhost"], &[]).unwrap();
        let key = CertifiedKey::from_der(
            vec![CertificateDer::from_pem_slice(initial.cert_pem.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(initial.key_pem.as_bytes()).unwrap(),
            &provider(),
        )
        .unwrap();
        let file = dir.join("current.pem");
        let tls = ServerTls::with_initial(&TlsConfig::default(), file.clone(), file.clone(), key)
            .unwrap();
        let before = tls.cert.current.read().0.clone();
        // No file yet: the initial pair stays, and a forced reload fails.
        tls.reload_if_changed();
        assert!(Arc::ptr_eq(&before, &tls.cert.current.read().0));
        assert!(tls.reload_now().is_err());
        assert!(Arc::ptr_eq(&before, &tls.cert.current.read().0));
        // Certificate and key in one file.
        let issued = ca.issue_server(&["localhost"], &[]).unwrap();
        std::fs::write(&file, format!("{}{}", issued.cert_pem, issued.key_pem)).unwrap();
        tls.reload_now().unwrap();
        assert!(!Arc::ptr_eq(&before, &tls.cert.current.read().0));
    }

    #[test]
    fn the_serving_certificate_names_its_ip_addresses() {
        let dir = tempdir();
        let ca = apimachinery::pki::Ca::new("t").unwrap();
        let pair = ca
            .issue_server(
                &["localhost"],
                &[
                    "127.0.0.1".parse().unwrap(),
                    "169.254.64.1".parse().unwrap(),
                ],
            )
            .unwrap();
        let cfg = TlsConfig {
            cert_file: Some(write(&dir, "tls.crt", &pair.cert_pem)),
            private_key_file: Some(write(&dir, "tls.key", &pair.key_pem)),
            ..TlsConfig::default()
        };
        let tls = ServerTls::load(&cfg).unwrap();
        assert!(tls.names_ip("169.254.64.1".parse().unwrap()));
        assert!(tls.names_ip("127.0.0.1".parse().unwrap()));
        assert!(!tls.names_ip("169.254.64.2".parse().unwrap()));
    }

    #[test]
    fn missing_file_is_named() {
        let cfg = TlsConfig {
            cert_file: Some("/nonexistent/tls.crt".into()),
            private_key_file: Some("/nonexistent/tls.key".into()),
            ..TlsConfig::default()
        };
        let err = ServerTls::load(&cfg).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/tls.crt"), "{err}");
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("kcp-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
