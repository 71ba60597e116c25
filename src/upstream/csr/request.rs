//! The CertificateSigningRequest: its name, its key (kept on disk while the
//! request is outstanding), creating it (or finding the one created
//! before), and watching it until it is issued, denied or failed.

use std::time::Duration;

use backon::BackoffBuilder;
use bytes::{Bytes, BytesMut};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, WatchEvent};
use rcgen::{KeyPair, PublicKeyData};
use rustls_pki_types::pem::PemObject;
use sha2::{Digest, Sha256};

use super::renew::{CsrError, CsrManager, TRANSIENT, Task, next_delay};
use super::state::write_atomic;
use crate::upstream::Credentials;
use apimachinery::body;

/// `spec.usages`: what the `kubernetes.io/kubelet-serving` signer allows
/// for an ECDSA key.
pub const USAGES: [&str; 2] = ["digital signature", "server auth"];

const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
/// Largest response body read (a CSR with its certificate is a few KiB).
const MAX_BODY_BYTES: usize = 1 << 20;
/// Bound on one create or get.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one watch of a request lasts; the approval hint is logged again
/// each time one ends while the request is pending.
const WATCH_SECONDS: u64 = 300;

impl CsrManager {
    /// `kube-cache-proxy-<node>-<digest>`: the digest covers the public key
    /// and everything requested, so the same request gets the same name.
    pub(super) fn request_name(&self, key: &KeyPair) -> String {
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

impl Task {
    /// The key of the outstanding request, or a new one (persisted first,
    /// so that a restart finds the same request).
    pub(super) fn pending_key(&self) -> Result<KeyPair, CsrError> {
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

    pub(super) fn forget_key(&self) {
        let path = &self.manager.pending_key_file;
        if let Err(error) = std::fs::remove_file(path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %path.display(), %error, "could not remove the pending key");
        }
    }

    pub(super) async fn create(
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
    pub(super) async fn wait(
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
    use super::super::certificate::Template;
    use super::*;
    use crate::component::config::{Config, CsrConfig};

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
}
