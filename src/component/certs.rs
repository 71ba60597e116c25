//! Certificate files, as every side of the proxy reads them: PEM
//! certificates and keys loaded with the one crypto provider, and the
//! change stamps and loop the reloads (serving certificate, client CA,
//! upstream client certificate, CSR-issued certificate) are built on, as
//! `k8s.io/apiserver`'s `dynamiccertificates` reloads files without a
//! restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS configuration error, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds no usable item.
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    /// rustls rejected the material (key does not match certificate...).
    #[error("{path}: {source}")]
    Rustls {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// The crypto provider used everywhere (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Spawns a task that calls `f` every `interval` (the first time at once)
/// until `shutdown` is cancelled: the file-reload loops.
pub fn spawn_every(
    interval: Duration,
    shutdown: tokio_util::sync::CancellationToken,
    mut f: impl FnMut() + Send + 'static,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => f(),
            }
        }
    });
}

/// (modification time, length) of a file, to notice replacement.
pub type Stamp = Option<(SystemTime, u64)>;

pub fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::File {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::File {
            path: path.to_path_buf(),
            message: "no PEM certificate found".into(),
        });
    }
    Ok(certs)
}

pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// A certificate chain and the private key that matches its leaf, from PEM
/// files (which may be one and the same file).
pub fn read_certified_key(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let certs = read_certs(cert_file)?;
    let key = read_key(key_file)?;
    CertifiedKey::from_der(certs, key, provider).map_err(|source| TlsError::Rustls {
        path: key_file.to_path_buf(),
        source,
    })
}

/// A served certificate that whoever rewrites its files can tell to load
/// them now (the server's `ServerTls`, for the CSR manager).
pub trait ReloadNow: Send + Sync {
    /// Loads the certificate files now.
    ///
    /// # Errors
    /// [`TlsError`] when they cannot be read or do not match.
    fn reload_now(&self) -> Result<(), TlsError>;
}
