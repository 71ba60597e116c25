//! Issuance and renewal: [`CsrManager`] reads what is on disk at start; its
//! task requests a certificate, installs what is issued, renews it at 70–90 %
//! of its lifetime, retries with backoff, and keeps the `serving-certificate`
//! readiness check current.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use parking_lot::Mutex;
use rcgen::KeyPair;

use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::certificate::{LeafInfo, Template, parse_pair, temporary, timestamp, unix_now};
use super::state::{CURRENT_FILE, PENDING_KEY_FILE, ensure_dir, load_current, write_atomic};
use crate::component::certs::{ReloadNow, TlsError};
use crate::component::config::Config;
use crate::component::ready::Readiness;
use crate::upstream::Upstream;

/// The readiness check that fails until an issued certificate is served.
pub const READY_CHECK: &str = "serving-certificate";

/// Why a certificate could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    /// The apiserver could not be reached or answered an error.
    #[error("{0}")]
    Upstream(String),
    /// The request was denied or failed: a new key and request follow,
    /// after backoff.
    #[error("CSR {name} was {condition}: {reason}")]
    Refused {
        name: String,
        condition: String,
        reason: String,
    },
    /// The request disappeared while waited for (deleted, or
    /// garbage-collected).
    #[error("CSR {0} was deleted before it was issued")]
    Gone(String),
    /// What was issued is unusable (wrong key, expired, not PEM).
    #[error("CSR {name}: the issued certificate is unusable: {message}")]
    Unusable { name: String, message: String },
    /// A local failure (key generation, files).
    #[error("{0}")]
    Local(String),
}

impl CsrError {
    pub(super) fn local(context: &str, e: impl std::fmt::Display) -> CsrError {
        CsrError::Local(format!("{context}: {e}"))
    }
}

/// An issued certificate being served.
#[derive(Debug, Clone)]
pub(super) struct Served {
    pub(super) leaf: LeafInfo,
    /// When renewal starts (Unix seconds, fractional).
    pub(super) renew_at: f64,
    /// Whether it has the configured subject and SANs.
    pub(super) satisfies_template: bool,
}

impl Served {
    pub(super) fn new(leaf: LeafInfo, template: &Template) -> Served {
        // client-go's nextRotationDeadline: 70 % to 90 % of the lifetime.
        let lifetime = (leaf.not_after - leaf.not_before).max(0) as f64;
        let renew_at = leaf.not_before as f64 + lifetime * (0.7 + 0.2 * fastrand::f64());
        Served {
            satisfies_template: template.satisfied_by(&leaf),
            leaf,
            renew_at,
        }
    }
}

/// Longest single timer: long waits (renewal after months) are re-checked
/// against the wall clock, which keeps running while a node is suspended.
const MAX_SLEEP: Duration = Duration::from_secs(600);

/// Sleeps until the wall-clock time `at` (Unix seconds).
async fn sleep_until_unix(at: f64) {
    loop {
        let left = at - unix_now();
        if left <= 0.0 {
            return;
        }
        let step = Duration::try_from_secs_f64(left).map_or(MAX_SLEEP, |d| d.min(MAX_SLEEP));
        tokio::time::sleep(step).await;
    }
}

/// Retry delays (the `backon` crate): a nominal delay doubling from
/// `min` up to `max`, each plus a random jitter of up to 100 %, so many
/// nodes retrying after one outage spread out. Rebuilt (reset) on success.
const fn backoff(min: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
}

/// Failures that may pass by themselves (upstream unreachable, a watch
/// that broke): 0.5–1 s at first, 15–30 s at most.
pub(super) const TRANSIENT: ExponentialBuilder =
    backoff(Duration::from_millis(500), Duration::from_secs(15));
/// A request the signer or an approver refused, or an unusable
/// certificate: 1.5–3 s at first, 150–300 s at most.
const REFUSED: ExponentialBuilder = backoff(Duration::from_millis(1500), Duration::from_secs(150));

/// The next delay (the backoffs above never run out).
pub(super) fn next_delay(backoff: &mut impl Iterator<Item = Duration>) -> Duration {
    backoff.next().unwrap_or(Duration::from_secs(300))
}

/// The CSR-managed serving certificate: what was found on disk, and the
/// task that obtains and renews it.
#[derive(Debug)]
pub struct CsrManager {
    pub(super) signer_name: String,
    pub(super) expiration_seconds: Option<i32>,
    pub(super) node_name: String,
    pub(super) template: Template,
    directory: PathBuf,
    current_file: PathBuf,
    pub(super) pending_key_file: PathBuf,
    /// The issued certificate found on disk, if still valid.
    pub(super) served: Option<Served>,
    /// What the listener starts with.
    initial: CertifiedKey,
}

impl CsrManager {
    /// Reads what `tls.csr.directory` holds (it writes nothing). `None`
    /// when `tls.csr` is disabled.
    ///
    /// # Errors
    /// [`TlsError`] when not even a temporary certificate can be made.
    pub fn new(config: &Config) -> Result<Option<CsrManager>, TlsError> {
        let csr = &config.tls.csr;
        if !csr.enabled {
            return Ok(None);
        }
        if config.tls.cert_file.is_some() || config.tls.private_key_file.is_some() {
            tracing::warn!(
                "tls.certFile and tls.privateKeyFile are ignored with tls.csr.enabled: the serving certificate is kept in tls.csr.directory"
            );
        }
        let template = Template::new(csr, &config.node_name);
        let current_file = csr.directory.join(CURRENT_FILE);
        let (served, initial) = match load_current(&current_file, &template) {
            Ok((leaf, key)) => {
                tracing::info!(
                    file = %current_file.display(),
                    not_after = %timestamp(leaf.not_after),
                    "serving the issued certificate found on disk"
                );
                (Some(Served::new(leaf, &template)), key)
            }
            Err(why) => {
                tracing::info!(
                    file = %current_file.display(),
                    reason = %why,
                    "no usable issued certificate; serving a temporary self-signed one until a CSR is issued"
                );
                let key = temporary(&template).map_err(|message| TlsError::File {
                    path: csr.directory.clone(),
                    message,
                })?;
                (None, key)
            }
        };
        Ok(Some(CsrManager {
            signer_name: csr.signer_name.clone(),
            expiration_seconds: match csr.requested_duration_seconds {
                0 => None,
                s => Some(i32::try_from(s).unwrap_or(i32::MAX)),
            },
            node_name: config.node_name.clone(),
            template,
            directory: csr.directory.clone(),
            pending_key_file: csr.directory.join(PENDING_KEY_FILE),
            current_file,
            served,
            initial,
        }))
    }

    /// Where the issued certificate and its key are kept (one PEM file),
    /// for the server to serve and reload.
    pub fn current_file(&self) -> &std::path::Path {
        &self.current_file
    }

    /// What to serve until the files hold an issued certificate: the one
    /// found on disk, or a temporary self-signed one.
    pub fn initial(&self) -> CertifiedKey {
        self.initial.clone()
    }

    /// Registers the `serving-certificate` readiness check and spawns the
    /// task that obtains and renews the certificate, until `shutdown`.
    pub fn spawn(
        self,
        upstream: &Upstream,
        tls: Arc<dyn ReloadNow>,
        readiness: &Readiness,
        shutdown: &CancellationToken,
    ) {
        let task = Task {
            manager: self,
            upstream: upstream.clone(),
            tls,
            readiness: readiness.clone(),
            note: Mutex::new("no CSR created yet".to_string()),
        };
        task.publish();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = task.run() => {}
            }
        });
    }
}

/// The running manager.
pub(super) struct Task {
    pub(super) manager: CsrManager,
    pub(super) upstream: Upstream,
    /// The server's certificate, told to reload once the files are written.
    tls: Arc<dyn ReloadNow>,
    readiness: Readiness,
    /// What is going on, for the readiness reason.
    note: Mutex<String>,
}

impl Task {
    async fn run(mut self) {
        let mut transient = TRANSIENT.build();
        let mut refused = REFUSED.build();
        // A certificate that does not match the configuration is replaced
        // once per run, not in a loop (the signer may alter names).
        let mut requested = false;
        // A request left pending by the previous run is resumed at once:
        // it may have been approved meanwhile.
        let mut resume = self.manager.pending_key_file.exists();
        loop {
            if let Some(served) = &self.manager.served {
                let mismatch = !served.satisfies_template && !requested;
                if !mismatch && !resume && served.renew_at > unix_now() {
                    tracing::info!(
                        not_after = %timestamp(served.leaf.not_after),
                        renew_at = %timestamp(served.renew_at as i64),
                        "serving certificate valid; renewal scheduled"
                    );
                    self.guard(sleep_until_unix(served.renew_at)).await;
                }
                if resume {
                    tracing::info!("resuming the pending certificate request");
                } else if mismatch {
                    tracing::info!(
                        "the serving certificate does not have the configured subject and names; requesting a new one"
                    );
                } else {
                    tracing::info!(
                        not_after = %timestamp(served.leaf.not_after),
                        "renewing the serving certificate"
                    );
                }
            }
            requested = true;
            resume = false;
            match self.guard(self.rotate()).await {
                Ok(served) => {
                    tracing::info!(
                        not_after = %timestamp(served.leaf.not_after),
                        file = %self.manager.current_file.display(),
                        "serving the issued certificate"
                    );
                    self.manager.served = Some(served);
                    transient = TRANSIENT.build();
                    refused = REFUSED.build();
                    self.set_note("issued");
                }
                Err(error) => {
                    let delay = match error {
                        CsrError::Refused { .. } | CsrError::Unusable { .. } => {
                            next_delay(&mut refused)
                        }
                        _ => next_delay(&mut transient),
                    };
                    tracing::warn!(
                        %error,
                        retry_in_seconds = delay.as_secs_f64().round(),
                        "could not obtain a serving certificate"
                    );
                    self.set_note(&format!(
                        "{error}; retrying in {}s",
                        delay.as_secs_f64().round()
                    ));
                    self.guard(tokio::time::sleep(delay)).await;
                }
            }
        }
    }

    /// Runs `fut`; if the served certificate expires meanwhile, readiness
    /// says so.
    async fn guard<F: Future>(&self, fut: F) -> F::Output {
        tokio::pin!(fut);
        if let Some(served) = &self.manager.served {
            let not_after = served.leaf.not_after as f64;
            if not_after > unix_now() {
                tokio::select! {
                    out = &mut fut => return out,
                    () = sleep_until_unix(not_after) => {
                        tracing::warn!(
                            not_after = %timestamp(served.leaf.not_after),
                            "the serving certificate has expired and no renewal has been issued"
                        );
                        self.publish();
                    }
                }
            }
        }
        fut.await
    }

    pub(super) fn set_note(&self, note: &str) {
        *self.note.lock() = note.to_string();
        self.publish();
    }

    /// Sets the readiness check from the served certificate and the note.
    fn publish(&self) {
        let note = self.note.lock().clone();
        let result = match &self.manager.served {
            Some(s) if (s.leaf.not_after as f64) > unix_now() => Ok(()),
            Some(s) => Err(format!(
                "the serving certificate expired at {}: {note}",
                timestamp(s.leaf.not_after)
            )),
            None => Err(format!(
                "no issued serving certificate yet (serving a temporary self-signed one): {note}"
            )),
        };
        self.readiness.set(READY_CHECK, result);
    }

    /// One request: key, CSR, wait, install.
    async fn rotate(&self) -> Result<Served, CsrError> {
        let m = &self.manager;
        ensure_dir(&m.directory)
            .map_err(|e| CsrError::local(&m.directory.display().to_string(), e))?;
        let key = self.pending_key()?;
        let request = m
            .template
            .request(&key)
            .map_err(|e| CsrError::local("creating the certificate request", e))?;
        let name = m.request_name(&key);
        let csr = match self.create(&name, &request, &key).await {
            Ok(csr) => csr,
            Err(e @ CsrError::Refused { .. }) => {
                self.forget_key();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let cert = match self.wait(&name, csr).await {
            Ok(cert) => cert,
            Err(e @ CsrError::Refused { .. }) => {
                // A new key, hence a new request, next time.
                self.forget_key();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        match self.install(&name, &key, &cert) {
            Ok(served) => Ok(served),
            Err(e @ CsrError::Unusable { .. }) => {
                self.forget_key();
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
    /// Checks and writes what was issued, then serves it.
    fn install(&self, name: &str, key: &KeyPair, cert_pem: &[u8]) -> Result<Served, CsrError> {
        let m = &self.manager;
        let unusable = |message: String| CsrError::Unusable {
            name: name.to_string(),
            message,
        };
        let mut pem = cert_pem.to_vec();
        if !pem.ends_with(b"\n") {
            pem.push(b'\n');
        }
        pem.extend_from_slice(key.serialize_pem().as_bytes());
        let (leaf, _) = parse_pair(&pem).map_err(unusable)?;
        if (leaf.not_after as f64) <= unix_now() {
            return Err(unusable(format!(
                "expired at {}",
                timestamp(leaf.not_after)
            )));
        }
        write_atomic(&m.current_file, &pem)
            .map_err(|e| CsrError::local(&m.current_file.display().to_string(), e))?;
        self.tls
            .reload_now()
            .map_err(|e| CsrError::local("loading the issued certificate", e))?;
        // Only now: until it is served, a retry resumes the same request.
        self.forget_key();
        Ok(Served::new(leaf, &m.template))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_resets() {
        let mut b = REFUSED.build();
        let d: Vec<_> = (0..10).map(|_| next_delay(&mut b).as_secs_f64()).collect();
        assert!((1.5..3.0).contains(&d[0]), "{d:?}");
        assert!((3.0..6.0).contains(&d[1]), "{d:?}");
        assert!((150.0..300.0).contains(&d[9]), "{d:?}");
        b = REFUSED.build();
        assert!(next_delay(&mut b) < Duration::from_secs(3));
        let mut t = TRANSIENT.build();
        assert!(next_delay(&mut t) < Duration::from_secs(1));
    }
}
