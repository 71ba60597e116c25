//! The serving certificate the proxy obtains and renews itself through the
//! Kubernetes CSR API (`tls.csr`), like kubelet's certificate manager does
//! for its own serving certificate (`k8s.io/client-go/util/certificate`).
//!
//! - On start, an issued certificate still valid in `tls.csr.directory` is
//!   served. Otherwise the listener starts with a temporary self-signed
//!   certificate (no client trusts it) and the `serving-certificate`
//!   readiness check fails until an issued one is installed.
//! - A fresh ECDSA P-256 key is generated (kept in the directory, 0600,
//!   while its request is outstanding, so a restart resumes the same
//!   request), and a `certificates.k8s.io/v1` CertificateSigningRequest is
//!   created upstream with the proxy's own credentials. Its name is derived
//!   from the key and what is requested, so creating it again finds the
//!   same object.
//! - The request is watched until it is issued (`Approved` and
//!   `status.certificate` set), `Denied` or `Failed`. Someone must approve
//!   it: kube-controller-manager never approves
//!   `kubernetes.io/kubelet-serving` requests; the log says how.
//! - The issued certificate and its key are written to one file,
//!   atomically (temporary file, then rename), and served to new
//!   handshakes at once; open connections are not touched.
//! - Renewal starts at a random point between 70 % and 90 % of the
//!   certificate's lifetime, with a new key; the old certificate is served
//!   until the new one is issued. Refusals and failures are retried with
//!   exponential backoff.

use std::future::Future;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::{Bytes, BytesMut};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, WatchEvent};
use parking_lot::Mutex;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PublicKeyData, SanType};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::component::config::{Config, CsrConfig, TlsConfig};
use crate::component::ready::Readiness;
use crate::server::tls::{ServerTls, TlsError};
use crate::upstream::{Credentials, Upstream};
use apimachinery::body;

/// The issued certificate chain and its key, PEM, in one file (0600).
pub const CURRENT_FILE: &str = "kube-cache-proxy-serving-current.pem";
/// The key of the request being waited for (0600), removed once issued.
pub const PENDING_KEY_FILE: &str = "kube-cache-proxy-serving-pending.key";
/// The readiness check that fails until an issued certificate is served.
pub const READY_CHECK: &str = "serving-certificate";
/// `spec.usages`: what the `kubernetes.io/kubelet-serving` signer allows
/// for an ECDSA key.
pub const USAGES: [&str; 2] = ["digital signature", "server auth"];
/// The group the `kubernetes.io/kubelet-serving` signer requires.
const NODES_GROUP: &str = "system:nodes";

const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
/// Largest response body read (a CSR with its certificate is a few KiB).
const MAX_BODY_BYTES: usize = 1 << 20;
/// Bound on one create or get.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one watch of a request lasts; the approval hint is logged again
/// each time one ends while the request is pending.
const WATCH_SECONDS: u64 = 300;
/// Lifetime of the temporary self-signed certificate.
const TEMPORARY_VALIDITY_SECONDS: i64 = 24 * 3600;

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
    fn local(context: &str, e: impl std::fmt::Display) -> CsrError {
        CsrError::Local(format!("{context}: {e}"))
    }
}

/// What the certificate must contain.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Template {
    common_name: String,
    organization: String,
    dns_names: Vec<String>,
    ip_addresses: Vec<IpAddr>,
}

impl Template {
    fn new(csr: &CsrConfig, node_name: &str) -> Template {
        Template {
            common_name: format!("system:node:{node_name}"),
            organization: NODES_GROUP.to_string(),
            dns_names: csr.dns_names(node_name),
            ip_addresses: csr.ip_addresses(),
        }
    }

    fn params(&self) -> Result<CertificateParams, rcgen::Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, self.organization.as_str());
        params
            .distinguished_name
            .push(DnType::CommonName, self.common_name.as_str());
        for name in &self.dns_names {
            params
                .subject_alt_names
                .push(SanType::DnsName(name.clone().try_into()?));
        }
        for ip in &self.ip_addresses {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        Ok(params)
    }

    /// The PEM certificate request for `key`.
    fn request(&self, key: &KeyPair) -> Result<String, rcgen::Error> {
        self.params()?.serialize_request(key)?.pem()
    }

    /// Whether a certificate's subject and SANs are exactly these.
    fn satisfied_by(&self, leaf: &LeafInfo) -> bool {
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v.dedup();
            v
        };
        let mut ips = self.ip_addresses.clone();
        ips.sort();
        ips.dedup();
        leaf.common_name == self.common_name
            && leaf.organizations == [self.organization.clone()]
            && sorted(&leaf.dns_names) == sorted(&self.dns_names)
            && leaf.ip_addresses == ips
    }
}

/// What the proxy reads from a certificate.
#[derive(Debug, Clone)]
struct LeafInfo {
    not_before: i64,
    not_after: i64,
    common_name: String,
    /// Sorted.
    organizations: Vec<String>,
    dns_names: Vec<String>,
    /// Sorted, deduplicated.
    ip_addresses: Vec<IpAddr>,
}

impl LeafInfo {
    fn parse(der: &[u8]) -> Result<LeafInfo, String> {
        use x509_parser::prelude::{GeneralName, ParsedExtension};
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
        let validity = cert.validity();
        let subject = cert.subject();
        let mut info = LeafInfo {
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
            common_name: subject
                .iter_common_name()
                .find_map(|a| a.as_str().ok())
                .unwrap_or_default()
                .to_string(),
            organizations: subject
                .iter_organization()
                .filter_map(|a| a.as_str().ok())
                .map(str::to_string)
                .collect(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
        };
        info.organizations.sort();
        for ext in cert.extensions() {
            if let ParsedExtension::SubjectAlternativeName(san) = ext.parsed_extension() {
                for name in &san.general_names {
                    match name {
                        GeneralName::DNSName(d) => info.dns_names.push((*d).to_string()),
                        GeneralName::IPAddress(b) => {
                            if let Ok(v4) = <[u8; 4]>::try_from(*b) {
                                info.ip_addresses.push(IpAddr::from(v4));
                            } else if let Ok(v6) = <[u8; 16]>::try_from(*b) {
                                info.ip_addresses.push(IpAddr::from(v6));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        info.ip_addresses.sort();
        info.ip_addresses.dedup();
        Ok(info)
    }
}

/// An issued certificate being served.
#[derive(Debug, Clone)]
struct Served {
    leaf: LeafInfo,
    /// When renewal starts (Unix seconds, fractional).
    renew_at: f64,
    /// Whether it has the configured subject and SANs.
    satisfies_template: bool,
}

impl Served {
    fn new(leaf: LeafInfo, template: &Template) -> Served {
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

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
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

fn timestamp(secs: i64) -> String {
    jiff::Timestamp::from_second(secs).map_or_else(|_| secs.to_string(), |t| t.to_string())
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
const TRANSIENT: ExponentialBuilder = backoff(Duration::from_millis(500), Duration::from_secs(15));
/// A request the signer or an approver refused, or an unusable
/// certificate: 1.5–3 s at first, 150–300 s at most.
const REFUSED: ExponentialBuilder = backoff(Duration::from_millis(1500), Duration::from_secs(150));

/// The next delay (the backoffs above never run out).
fn next_delay(backoff: &mut impl Iterator<Item = Duration>) -> Duration {
    backoff.next().unwrap_or(Duration::from_secs(300))
}

/// The CSR-managed serving certificate: what was found on disk, and the
/// task that obtains and renews it.
#[derive(Debug)]
pub struct CsrManager {
    signer_name: String,
    expiration_seconds: Option<i32>,
    node_name: String,
    template: Template,
    directory: PathBuf,
    current_file: PathBuf,
    pending_key_file: PathBuf,
    /// The issued certificate found on disk, if still valid.
    served: Option<Served>,
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

    /// The downstream TLS state, serving the issued certificate found on
    /// disk or the temporary one, and reloading the issued certificate's file.
    ///
    /// # Errors
    /// [`TlsError`] when the client CA cannot be loaded.
    pub fn server_tls(&self, tls: &TlsConfig) -> Result<ServerTls, TlsError> {
        ServerTls::with_initial(
            tls,
            self.current_file.clone(),
            self.current_file.clone(),
            self.initial.clone(),
        )
    }

    /// `kube-cache-proxy-<node>-<digest>`: the digest covers the public key
    /// and everything requested, so the same request gets the same name.
    fn request_name(&self, key: &KeyPair) -> String {
        let m = self;
        let mut h = Sha256::new();
        let mut part = |b: &[u8]| {
            h.update((b.len() as u64).to_be_bytes());
            h.update(b);
        };
        part(&key.subject_public_key_info());
        part(m.signer_name.as_bytes());
        part(USAGES.join(",").as_bytes());
        part(m.template.common_name.as_bytes());
        part(m.template.organization.as_bytes());
        for n in &m.template.dns_names {
            part(n.as_bytes());
        }
        for ip in &m.template.ip_addresses {
            part(ip.to_string().as_bytes());
        }
        part(&m.expiration_seconds.unwrap_or(0).to_be_bytes());
        let digest: String = h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        const PREFIX: &str = "kube-cache-proxy-";
        let room = 253 - PREFIX.len() - 1 - digest.len();
        let node: String = m.node_name.chars().take(room).collect();
        let node = node.trim_end_matches(['.', '-']);
        format!("{PREFIX}{node}-{digest}")
    }

    /// Registers the `serving-certificate` readiness check and spawns the
    /// task that obtains and renews the certificate, until `shutdown`.
    pub fn spawn(
        self,
        upstream: &Upstream,
        tls: &ServerTls,
        readiness: &Readiness,
        shutdown: &CancellationToken,
    ) {
        let task = Task {
            manager: self,
            upstream: upstream.clone(),
            tls: tls.clone(),
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

/// Reads the issued certificate and key, and checks they match and are
/// valid now.
fn load_current(path: &Path, template: &Template) -> Result<(LeafInfo, CertifiedKey), String> {
    if !path.exists() {
        return Err("not found".into());
    }
    let pem = std::fs::read(path).map_err(|e| e.to_string())?;
    let (leaf, key) = parse_pair(&pem)?;
    let now = unix_now();
    if (leaf.not_after as f64) <= now {
        return Err(format!("expired at {}", timestamp(leaf.not_after)));
    }
    if !template.satisfied_by(&leaf) {
        tracing::info!(
            "the issued certificate on disk does not have the configured subject and names; a new one will be requested"
        );
    }
    Ok((leaf, key))
}

/// A certificate chain and its key from PEM.
fn parse_pair(pem: &[u8]) -> Result<(LeafInfo, CertifiedKey), String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let leaf = chain.first().ok_or("no PEM certificate")?;
    let info = LeafInfo::parse(leaf)?;
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("private key: {e}"))?;
    let certified = CertifiedKey::from_der(chain, key, &crate::server::tls::provider())
        .map_err(|e| e.to_string())?;
    Ok((info, certified))
}

/// A self-signed certificate for the configured names, served until an
/// issued one arrives. No client trusts it: it only lets the listener
/// start.
fn temporary(template: &Template) -> Result<CertifiedKey, String> {
    let err = |e: rcgen::Error| format!("generating a temporary certificate: {e}");
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(err)?;
    let mut params = template.params().map_err(err)?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(
        DnType::CommonName,
        "kube-cache-proxy temporary certificate (awaiting CSR approval)",
    );
    let now = x509_parser::time::ASN1Time::now().timestamp();
    let at = |t: i64| {
        x509_parser::time::ASN1Time::from_timestamp(t)
            .map(|t| t.to_datetime())
            .map_err(|e| e.to_string())
    };
    params.not_before = at(now - 60)?;
    params.not_after = at(now + TEMPORARY_VALIDITY_SECONDS)?;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.self_signed(&key).map_err(err)?;
    let key_der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    CertifiedKey::from_der(
        vec![cert.der().clone()],
        key_der,
        &crate::server::tls::provider(),
    )
    .map_err(|e| e.to_string())
}

/// Writes `data` to `path` through a temporary file in the same directory
/// and a rename, so readers see the old or the new content, never a mix.
/// The file is 0600.
fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", uuid::Uuid::new_v4().simple()));
    let result = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp)?;
        file.write_all(data)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    // Make the rename durable; not every filesystem allows this.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Creates `dir` (and parents) 0700 if missing.
fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// What a request's status says.
enum Outcome {
    Pending,
    Issued(Vec<u8>),
    Refused { condition: String, reason: String },
}

/// Whether the request carries an `Approved` condition that is not
/// `False`.
fn approved(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Approved" && c.status != "False")
        })
}

/// `WaitForCertificate`: denied or failed wins; a certificate counts once
/// the request is approved.
fn outcome(csr: &CertificateSigningRequest) -> Outcome {
    let Some(status) = &csr.status else {
        return Outcome::Pending;
    };
    let conditions = status.conditions.as_deref().unwrap_or_default();
    for c in conditions {
        if (c.type_ == "Denied" || c.type_ == "Failed") && c.status != "False" {
            let reason = [c.reason.as_deref(), c.message.as_deref()]
                .into_iter()
                .flatten()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(": ");
            return Outcome::Refused {
                condition: c.type_.to_ascii_lowercase(),
                reason: if reason.is_empty() {
                    "no reason given".into()
                } else {
                    reason
                },
            };
        }
    }
    match &status.certificate {
        Some(cert) if approved(csr) && !cert.0.is_empty() => Outcome::Issued(cert.0.clone()),
        _ => Outcome::Pending,
    }
}

/// The running manager.
struct Task {
    manager: CsrManager,
    upstream: Upstream,
    tls: ServerTls,
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

    fn set_note(&self, note: &str) {
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

    /// The key of the outstanding request, or a new one (persisted first,
    /// so that a restart finds the same request).
    fn pending_key(&self) -> Result<KeyPair, CsrError> {
        let path = &self.manager.pending_key_file;
        if let Ok(pem) = std::fs::read_to_string(path) {
            match KeyPair::from_pem(&pem) {
                Ok(key) => return Ok(key),
                Err(error) => {
                    tracing::warn!(file = %path.display(), %error, "unreadable pending key; generating a new one");
                }
            }
        }
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| CsrError::local("generating a key", e))?;
        write_atomic(path, key.serialize_pem().as_bytes())
            .map_err(|e| CsrError::local(&path.display().to_string(), e))?;
        Ok(key)
    }

    fn forget_key(&self) {
        let path = &self.manager.pending_key_file;
        if let Err(error) = std::fs::remove_file(path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %path.display(), %error, "could not remove the pending key");
        }
    }

    async fn create(
        &self,
        name: &str,
        request: &str,
        key: &KeyPair,
    ) -> Result<CertificateSigningRequest, CsrError> {
        let m = &self.manager;
        let object = CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.as_bytes().to_vec()),
                signer_name: m.signer_name.clone(),
                usages: Some(USAGES.iter().map(|u| u.to_string()).collect()),
                expiration_seconds: m.expiration_seconds,
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        };
        let body = serde_json::to_vec(&object).map_err(|e| CsrError::local("encoding", e))?;
        let (status, bytes) = self.call(Method::POST, CSR_PATH, Some(body)).await?;
        if status == StatusCode::CREATED || status == StatusCode::OK {
            let csr = decode(&bytes)?;
            tracing::warn!(
                csr = name,
                signer = %m.signer_name,
                "CSR {name} for {} is pending approval: kubectl certificate approve {name}",
                m.signer_name
            );
            return Ok(csr);
        }
        if status != StatusCode::CONFLICT {
            return Err(upstream_status("creating", name, status, &bytes));
        }
        // Created before (a retry, or a restart): it must be ours.
        let existing = self.get(name).await?;
        let theirs = existing.spec.request.0.clone();
        if !same_key(&theirs, key) || existing.spec.signer_name != m.signer_name {
            return Err(CsrError::Refused {
                name: name.to_string(),
                condition: "taken".into(),
                reason: "a CSR of that name exists for another key or signer".into(),
            });
        }
        tracing::info!(csr = name, "resuming the CSR created earlier");
        if matches!(outcome(&existing), Outcome::Pending) {
            tracing::warn!(
                csr = name,
                signer = %m.signer_name,
                "CSR {name} for {} is pending approval: kubectl certificate approve {name}",
                m.signer_name
            );
        }
        Ok(existing)
    }

    /// Waits for the request to be issued, denied or failed: a watch from
    /// the last seen state, re-established (after a fresh get) when it
    /// ends or breaks.
    async fn wait(
        &self,
        name: &str,
        mut csr: CertificateSigningRequest,
    ) -> Result<Vec<u8>, CsrError> {
        let signer = &self.manager.signer_name;
        let mut backoff = TRANSIENT.build();
        let mut rounds = 0u32;
        loop {
            match outcome(&csr) {
                Outcome::Issued(cert) => return Ok(cert),
                Outcome::Refused { condition, reason } => {
                    return Err(CsrError::Refused {
                        name: name.to_string(),
                        condition,
                        reason,
                    });
                }
                Outcome::Pending => {}
            }
            if approved(&csr) {
                self.set_note(&format!(
                    "CSR {name} for {signer} is approved, waiting for the signer to issue it"
                ));
            } else {
                self.set_note(&format!(
                    "CSR {name} for {signer} is pending approval: kubectl certificate approve {name}"
                ));
                if rounds > 0 {
                    tracing::warn!(
                        csr = name,
                        "CSR {name} for {signer} is still pending approval: kubectl certificate approve {name}"
                    );
                }
            }
            rounds += 1;
            let rv = csr.metadata.resource_version.clone().unwrap_or_default();
            let started = tokio::time::Instant::now();
            match self.watch(name, &rv).await {
                Ok(Some(next)) => {
                    csr = next;
                    backoff = TRANSIENT.build();
                    continue;
                }
                // A watch that ends at once (410 Expired) is retried from a
                // fresh get, but not in a tight loop.
                Ok(None) if started.elapsed() < Duration::from_secs(1) => {
                    tokio::time::sleep(next_delay(&mut backoff)).await;
                }
                Ok(None) => backoff = TRANSIENT.build(),
                Err(e @ CsrError::Gone(_)) => return Err(e),
                Err(error) => {
                    tracing::warn!(csr = name, %error, "watching the CSR failed; polling it");
                    tokio::time::sleep(next_delay(&mut backoff)).await;
                }
            }
            csr = self.get(name).await?;
        }
    }

    /// One watch of the request from `rv`. `Some` at the first event that
    /// settles it (issued, denied, failed); `None` when the watch ends.
    async fn watch(
        &self,
        name: &str,
        rv: &str,
    ) -> Result<Option<CertificateSigningRequest>, CsrError> {
        let seconds = WATCH_SECONDS + fastrand::u64(0..60);
        let path = format!(
            "{CSR_PATH}?watch=1&fieldSelector=metadata.name%3D{name}&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds={seconds}"
        );
        let req = self.request(Method::GET, &path, None)?;
        let resp =
            tokio::time::timeout(REQUEST_TIMEOUT, self.upstream.send(req, Credentials::Proxy))
                .await
                .map_err(|_| CsrError::Upstream("watch: timed out".into()))?
                .map_err(|e| CsrError::Upstream(e.to_string()))?;
        let status = resp.status();
        if status != StatusCode::OK {
            let bytes = read_limited(resp.into_body()).await.unwrap_or_default();
            return Err(upstream_status("watching", name, status, &bytes));
        }
        let mut body = resp.into_body();
        let mut buf = BytesMut::new();
        let read = async {
            loop {
                let Some(frame) = body.frame().await else {
                    return Ok(None);
                };
                let frame = frame.map_err(|e| CsrError::Upstream(e.to_string()))?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                buf.extend_from_slice(&data);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line = buf.split_to(pos + 1);
                    let event: WatchEvent<CertificateSigningRequest> =
                        serde_json::from_slice(&line[..pos]).map_err(|e| {
                            CsrError::Upstream(format!("malformed watch event: {e}"))
                        })?;
                    match event {
                        WatchEvent::Added(csr) | WatchEvent::Modified(csr) => {
                            if !matches!(outcome(&csr), Outcome::Pending) {
                                return Ok(Some(csr));
                            }
                            if approved(&csr) {
                                // Let the caller update its note.
                                return Ok(Some(csr));
                            }
                        }
                        WatchEvent::Deleted(_) => return Err(CsrError::Gone(name.to_string())),
                        WatchEvent::Bookmark { .. } => {}
                        // 410 Expired and the like: get and watch again.
                        WatchEvent::ErrorStatus(_) | WatchEvent::ErrorOther(_) => {
                            return Ok(None);
                        }
                    }
                }
                if buf.len() > MAX_BODY_BYTES {
                    return Err(CsrError::Upstream("watch event too large".into()));
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(seconds + 30), read)
            .await
            .unwrap_or(Ok(None))
    }

    async fn get(&self, name: &str) -> Result<CertificateSigningRequest, CsrError> {
        let (status, bytes) = self
            .call(Method::GET, &format!("{CSR_PATH}/{name}"), None)
            .await?;
        match status {
            StatusCode::OK => decode(&bytes),
            StatusCode::NOT_FOUND => Err(CsrError::Gone(name.to_string())),
            _ => Err(upstream_status("getting", name, status, &bytes)),
        }
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Request<body::Body>, CsrError> {
        self.upstream
            .own_request(method, path, body)
            .map_err(|e| CsrError::Upstream(e.to_string()))
    }

    /// A short request with the proxy's credentials: status and body.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), CsrError> {
        let req = self.request(method, path, body)?;
        let exchange = async {
            let resp = self
                .upstream
                .send(req, Credentials::Proxy)
                .await
                .map_err(|e| CsrError::Upstream(e.to_string()))?;
            let status = resp.status();
            Ok((status, read_limited(resp.into_body()).await?))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| CsrError::Upstream(format!("{path}: timed out")))?
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

/// Whether the PEM request `request` names `key`'s public key.
fn same_key(request: &[u8], key: &KeyPair) -> bool {
    use x509_parser::prelude::FromDer;
    let Ok(der) = rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(request) else {
        return false;
    };
    x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref()).is_ok_and(
        |(_, csr)| csr.certification_request_info.subject_pki.raw == key.subject_public_key_info(),
    )
}

fn decode(bytes: &[u8]) -> Result<CertificateSigningRequest, CsrError> {
    serde_json::from_slice(bytes)
        .map_err(|e| CsrError::Upstream(format!("malformed CertificateSigningRequest: {e}")))
}

fn upstream_status(doing: &str, name: &str, status: StatusCode, body: &[u8]) -> CsrError {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    CsrError::Upstream(format!("{doing} CSR {name}: {status}: {message}"))
}

async fn read_limited(body: crate::upstream::UpstreamBody) -> Result<Bytes, CsrError> {
    Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| CsrError::Upstream(format!("reading the answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> Template {
        Template::new(
            &CsrConfig {
                enabled: true,
                ..CsrConfig::default()
            },
            "node-1",
        )
    }

    #[test]
    fn request_has_the_signers_subject_and_names() {
        use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension};
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let pem = template().request(&key).unwrap();
        let der =
            rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(pem.as_bytes()).unwrap();
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
                .unwrap();
        let subject = &csr.certification_request_info.subject;
        let cn: Vec<_> = subject
            .iter_common_name()
            .map(|a| a.as_str().unwrap())
            .collect();
        let o: Vec<_> = subject
            .iter_organization()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(cn, ["system:node:node-1"]);
        assert_eq!(o, ["system:nodes"]);
        let mut names = Vec::new();
        for ext in csr.requested_extensions().unwrap() {
            if let ParsedExtension::SubjectAlternativeName(san) = ext {
                for n in &san.general_names {
                    names.push(match n {
                        GeneralName::DNSName(d) => d.to_string(),
                        GeneralName::IPAddress(b) => format!("{b:?}"),
                        other => format!("{other:?}"),
                    });
                }
            }
        }
        assert_eq!(names, ["localhost", "node-1", "[127, 0, 0, 1]"]);
        assert!(same_key(pem.as_bytes(), &key));
        let other = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        assert!(!same_key(pem.as_bytes(), &other));
    }

    #[test]
    fn signed_certificate_satisfies_the_template() {
        let ca = apimachinery::pki::Ca::new("signer").unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let t = template();
        let cert = ca
            .sign_csr(&t.request(&key).unwrap(), Duration::from_secs(100))
            .unwrap();
        let mut pem = cert.into_bytes();
        pem.extend_from_slice(key.serialize_pem().as_bytes());
        let (leaf, _) = parse_pair(&pem).unwrap();
        assert!(t.satisfied_by(&leaf));
        assert!((99..=101).contains(&(leaf.not_after - leaf.not_before)));
        let served = Served::new(leaf.clone(), &t);
        let lifetime = (leaf.not_after - leaf.not_before) as f64;
        let at = (served.renew_at - leaf.not_before as f64) / lifetime;
        assert!((0.7..=0.9).contains(&at), "{at}");
        // Another node's template is not satisfied.
        let other = Template::new(
            &CsrConfig {
                enabled: true,
                ..CsrConfig::default()
            },
            "node-2",
        );
        assert!(!other.satisfied_by(&leaf));
        // A key that is not the certificate's is refused.
        let wrong = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut pem = ca
            .sign_csr(&t.request(&key).unwrap(), Duration::from_secs(100))
            .unwrap()
            .into_bytes();
        pem.extend_from_slice(wrong.serialize_pem().as_bytes());
        assert!(parse_pair(&pem).is_err());
    }

    #[test]
    fn temporary_certificate_loads() {
        let key = temporary(&template()).unwrap();
        let leaf = LeafInfo::parse(&key.cert[0]).unwrap();
        assert_eq!(leaf.dns_names, ["localhost", "node-1"]);
    }

    #[test]
    fn atomic_write_is_private() {
        let dir = std::env::temp_dir().join(format!("kcp-csr-{}", uuid::Uuid::new_v4()));
        ensure_dir(&dir.join("pki")).unwrap();
        let path = dir.join("pki").join("f");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let mode = std::fs::metadata(dir.join("pki"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700);
        }
        assert_eq!(std::fs::read_dir(dir.join("pki")).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn manager(node: &str) -> CsrManager {
        let dir = std::env::temp_dir().join(format!("kcp-csr-{}", uuid::Uuid::new_v4()));
        let mut config = Config {
            node_name: node.to_string(),
            ..Config::default()
        };
        config.tls.csr.enabled = true;
        config.tls.csr.directory = dir;
        CsrManager::new(&config).unwrap().unwrap()
    }

    #[test]
    fn request_names_are_stable_and_valid() {
        let m = manager("node-1");
        assert!(m.served.is_none());
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let name = m.request_name(&key);
        assert!(name.starts_with("kube-cache-proxy-node-1-"), "{name}");
        assert_eq!(name, m.request_name(&key));
        let other = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        assert_ne!(name, m.request_name(&other));
        let long = format!("{}.{}", "a".repeat(63), "b-".repeat(100));
        let name = manager(&long).request_name(&key);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(
            apimachinery::selector::is_dns1123_subdomain(&name).is_empty(),
            "{name}"
        );
    }

    #[test]
    fn outcome_follows_the_conditions() {
        let csr = |status: serde_json::Value| -> CertificateSigningRequest {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "certificates.k8s.io/v1",
                "kind": "CertificateSigningRequest",
                "metadata": {"name": "x"},
                "spec": {"request": "", "signerName": "kubernetes.io/kubelet-serving"},
                "status": status,
            }))
            .unwrap()
        };
        let approved = serde_json::json!({"type": "Approved", "status": "True"});
        let denied =
            serde_json::json!({"type": "Denied", "status": "True", "reason": "R", "message": "M"});
        let cert = "Y2VydA==";
        assert!(matches!(
            outcome(&csr(serde_json::json!({}))),
            Outcome::Pending
        ));
        // A certificate counts only once approved.
        assert!(matches!(
            outcome(&csr(serde_json::json!({"certificate": cert}))),
            Outcome::Pending
        ));
        assert!(matches!(
            outcome(&csr(serde_json::json!({"conditions": [approved]}))),
            Outcome::Pending
        ));
        match outcome(&csr(
            serde_json::json!({"conditions": [approved], "certificate": cert}),
        )) {
            Outcome::Issued(c) => assert_eq!(c, b"cert"),
            _ => panic!("not issued"),
        }
        match outcome(&csr(
            serde_json::json!({"conditions": [approved, denied], "certificate": cert}),
        )) {
            Outcome::Refused { condition, reason } => {
                assert_eq!(condition, "denied");
                assert_eq!(reason, "R: M");
            }
            _ => panic!("not refused"),
        }
        let failed = serde_json::json!({"type": "Failed", "status": "True"});
        assert!(matches!(
            outcome(&csr(serde_json::json!({"conditions": [approved, failed]}))),
            Outcome::Refused { .. }
        ));
    }

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
