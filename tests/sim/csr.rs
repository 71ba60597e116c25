#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The serving certificate obtained through the Kubernetes CSR API
//! (`tls.csr`), end to end over real sockets and TLS: the real proxy
//! (`kube_cache_proxy::run`) in front of the simulated apiserver, with this
//! test playing the approver and the `kubernetes.io/kubelet-serving` signer
//! (kube-controller-manager), whose CA is the "cluster CA" clients trust.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use apimachinery::pki::Ca;
use apimachinery::resource::Gvr;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use kube_apiserver_sim::{Rule, Sim, SimConfig, Subject};
use kube_cache_proxy::component::config::Config;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateSigningRequestDer, ServerName};
use serde_json::{Value, json};
use support::env::{Running, tempdir};
use support::{Auth, Client, Identity, Next, SOON};
use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension};

const NODE: &str = "node-1";
const SIGNER: &str = "kubernetes.io/kubelet-serving";
const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

fn csrs() -> Gvr {
    Gvr {
        group: "certificates.k8s.io".into(),
        version: "v1".into(),
        resource: "certificatesigningrequests".into(),
    }
}

fn cms() -> Gvr {
    support::configmaps()
}

/// Waits until the serving-certificate check fails with a reason
/// containing `text`; returns the body.
async fn not_ready_because(proxy: &Running, text: &str) -> String {
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let (status, body) = proxy.admin_get("/readyz?verbose").await;
        if status == 500 && body.contains("[-]serving-certificate failed") && body.contains(text) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected serving-certificate not ready ({text}), got {status}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The leaf certificate a new handshake gets, verified against
/// `ca_pem` only; `None` when the handshake fails.
async fn served_leaf(proxy: &Running, ca_pem: &str) -> Option<Vec<u8>> {
    let cfg = support::client::tls_config(ca_pem, &Auth::Anonymous);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let name = ServerName::IpAddress(proxy.addr.ip().into());
    let tls = connector.connect(name, tcp).await.ok()?;
    let leaf = tls.get_ref().1.peer_certificates()?.first()?.to_vec();
    Some(leaf)
}

/// The sim with the proxy user allowed to create CSRs, as
/// manifests/components/csr-serving-cert/rbac.yaml allows it.
async fn sim() -> Sim {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    sim.policy().grant(
        Subject::User(SimConfig::default().proxy_user),
        Rule::new(
            &["create"],
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
        ),
    );
    sim
}

/// The proxy's configuration: the tests' usual one in CSR mode, keeping
/// its files in `pki` (no certificate files).
fn config(sim: &Sim, dir: &Path, pki: &Path) -> Config {
    let unused = Ca::new("unused").unwrap();
    let mut config = support::env::proxy_config(sim, dir, &unused);
    config.tls.cert_file = None;
    config.tls.private_key_file = None;
    config.node_name = NODE.into();
    config.tls.csr.enabled = true;
    config.tls.csr.directory = pki.to_path_buf();
    config
}

/// The names of the CSRs in the sim.
async fn csr_names(sim: &Sim) -> Vec<String> {
    let list = Client::sim(sim, Identity::admin())
        .get(CSR_PATH)
        .await
        .json();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// Waits for a CSR not in `seen`; returns it.
async fn new_csr(sim: &Sim, seen: &[String], within: Duration) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(name) = csr_names(sim).await.into_iter().find(|n| !seen.contains(n)) {
            return sim.get(&csrs(), "", &name).unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new CSR within {within:?} (seen {seen:?})"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn name(csr: &Value) -> String {
    csr["metadata"]["name"].as_str().unwrap().to_string()
}

/// The PEM request of a CSR object.
fn request_pem(csr: &Value) -> String {
    let b = B64
        .decode(csr["spec"]["request"].as_str().unwrap())
        .unwrap();
    String::from_utf8(b).unwrap()
}

/// Checks a CSR as an approver would: signer, usages, subject, names.
/// Returns the request's public key (SubjectPublicKeyInfo DER).
fn check_request(csr: &Value) -> Vec<u8> {
    assert_eq!(csr["spec"]["signerName"], SIGNER, "{csr}");
    assert_eq!(
        csr["spec"]["usages"],
        json!(["digital signature", "server auth"]),
        "{csr}"
    );
    assert!(name(csr).starts_with(&format!("kube-cache-proxy-{NODE}-")));
    let pem = request_pem(csr);
    let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes()).unwrap();
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
            .unwrap();
    let info = &req.certification_request_info;
    let cn: Vec<_> = info
        .subject
        .iter_common_name()
        .map(|a| a.as_str().unwrap())
        .collect();
    let o: Vec<_> = info
        .subject
        .iter_organization()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(cn, [format!("system:node:{NODE}")]);
    assert_eq!(o, ["system:nodes"]);
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for ext in req.requested_extensions().unwrap() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for n in &san.general_names {
                match n {
                    GeneralName::DNSName(d) => dns.push(d.to_string()),
                    GeneralName::IPAddress(b) => ips.push(b.to_vec()),
                    other => panic!("unexpected SAN {other:?}"),
                }
            }
        }
    }
    assert_eq!(dns, ["localhost", NODE]);
    assert_eq!(ips, [vec![127, 0, 0, 1]]);
    // ECDSA P-256.
    assert_eq!(
        info.subject_pki.algorithm.algorithm.to_id_string(),
        "1.2.840.10045.2.1"
    );
    info.subject_pki.raw.to_vec()
}

/// Approves and signs `csr` with `ca` for `validity`, as
/// kube-controller-manager would after `kubectl certificate approve`.
/// Returns the certificate's DER.
fn approve_and_sign(sim: &Sim, csr: &Value, ca: &Ca, validity: Duration) -> Vec<u8> {
    let cert_pem = ca.sign_csr(&request_pem(csr), validity).unwrap();
    let mut obj = sim.get(&csrs(), "", &name(csr)).unwrap();
    obj["status"] = json!({
        "conditions": [{
            "type": "Approved", "status": "True", "reason": "TestApprove",
            "message": "approved by the test", "lastUpdateTime": "2026-01-01T00:00:00Z",
        }],
        "certificate": B64.encode(cert_pem.as_bytes()),
    });
    sim.update(&csrs(), obj).unwrap();
    CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .unwrap()
        .to_vec()
}

fn deny(sim: &Sim, csr: &Value) {
    let mut obj = sim.get(&csrs(), "", &name(csr)).unwrap();
    obj["status"] = json!({
        "conditions": [{
            "type": "Denied", "status": "True", "reason": "TestDenied",
            "message": "not this one",
        }],
    });
    sim.update(&csrs(), obj).unwrap();
}

/// Waits until new handshakes get `leaf` (verified against `ca_pem`).
async fn serves(proxy: &Running, ca_pem: &str, leaf: &[u8]) {
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        if served_leaf(proxy, ca_pem).await.as_deref() == Some(leaf) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the proxy does not serve the issued certificate"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn obtains_serves_and_renews_its_certificate() {
    let sim = sim().await;
    // The cluster CA: it signs kubelet-serving certificates, and it is all
    // the clients below trust.
    let cluster_ca = Ca::new("cluster-ca").unwrap();
    let cluster_ca_pem = cluster_ca.cert_pem();
    let dir = tempdir();
    let pki = dir.join("pki");
    let config = config(&sim, &dir, &pki);
    let mut proxy = Running::start(&config).await;

    // (1) A CSR appears; until it is issued, the proxy is not ready, says
    // what to do, and clients trusting the cluster CA do not trust it.
    let first = new_csr(&sim, &[], SOON).await;
    let first_key = check_request(&first);
    let body = not_ready_because(
        &proxy,
        &format!(
            "CSR {} for {SIGNER} is pending approval: kubectl certificate approve {}",
            name(&first),
            name(&first)
        ),
    )
    .await;
    assert!(body.contains("temporary self-signed"), "{body}");
    assert!(served_leaf(&proxy, &cluster_ca_pem).await.is_none());
    let trusting = Client::new(
        &proxy.url,
        &cluster_ca_pem,
        Identity::admin().auth(&sim),
        false,
    );
    assert!(
        trusting
            .try_send(http::Method::GET, "/api", &[], None)
            .await
            .is_err()
    );
    // The pending key is on disk, private.
    assert!(pki.join("kube-cache-proxy-serving-pending.key").exists());

    // (2) Issued: served at once, ready, and a client trusting only the
    // cluster CA gets answers.
    let leaf1 = approve_and_sign(&sim, &first, &cluster_ca, Duration::from_secs(8));
    let leaf1_expired = tokio::time::Instant::now() + Duration::from_secs(9);
    serves(&proxy, &cluster_ca_pem, &leaf1).await;
    proxy.ready().await;
    let resp = trusting.get("/api/v1/namespaces/default/configmaps").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let current = pki.join("kube-cache-proxy-serving-current.pem");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&current).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert!(!pki.join("kube-cache-proxy-serving-pending.key").exists());

    // A watch through the proxy, on a connection made with the first
    // certificate.
    let watcher = Client::new(
        &proxy.url,
        &cluster_ca_pem,
        Identity::admin().auth(&sim),
        false,
    );
    let rv = sim.resource_version();
    let mut watch = watcher
        .watch(
            &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"),
            &[],
        )
        .await;
    assert_eq!(watch.status, 200);
    sim.create(
        &cms(),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "before", "namespace": "default"}}),
    )
    .unwrap();
    let ev = watch.event(SOON).await;
    assert_eq!(ev["object"]["metadata"]["name"], "before");

    // (3) Renewal between 70 % and 90 % of the 8 s lifetime, with a new
    // key; the new certificate is served to new handshakes, the open watch
    // keeps streaming.
    let seen = vec![name(&first)];
    let second = new_csr(&sim, &seen, Duration::from_secs(10)).await;
    let second_key = check_request(&second);
    assert_ne!(first_key, second_key, "renewal must use a new key");
    // The old certificate is still served while the renewal is pending.
    assert_eq!(proxy.admin_get("/readyz?verbose").await.0, 200);
    let leaf2 = approve_and_sign(&sim, &second, &cluster_ca, Duration::from_secs(3600));
    serves(&proxy, &cluster_ca_pem, &leaf2).await;
    sim.create(
        &cms(),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after", "namespace": "default"}}),
    )
    .unwrap();
    // Once the first certificate has expired too, the connection made with
    // it is unaffected.
    tokio::time::sleep_until(leaf1_expired).await;
    match watch.next(SOON).await {
        Next::Event(ev) => assert_eq!(ev["object"]["metadata"]["name"], "after"),
        other => panic!("the watch opened before the renewal broke: {other:?}"),
    }
    proxy.ready().await;
    let resp = trusting.get("/api/v1/namespaces/default/configmaps").await;
    assert_eq!(resp.status, 200);

    // A restart serves the issued certificate from disk at once: ready
    // without a new CSR.
    proxy.stop().await.unwrap();
    let proxy = Running::start(&config).await;
    assert_eq!(served_leaf(&proxy, &cluster_ca_pem).await, Some(leaf2));
    proxy.ready().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(csr_names(&sim).await.len(), 2);
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn denied_request_keeps_it_not_ready_and_is_retried() {
    let sim = sim().await;
    let cluster_ca = Ca::new("cluster-ca").unwrap();
    let dir = tempdir();
    let pki = dir.join("pki");
    let proxy = Running::start(&config(&sim, &dir, &pki)).await;

    let first = new_csr(&sim, &[], SOON).await;
    let first_key = check_request(&first);
    deny(&sim, &first);
    // (4) Denied: not ready, saying so; a new request (new key) after
    // backoff (1.5-3 s), not at once.
    let body = not_ready_because(
        &proxy,
        &format!("CSR {} was denied: TestDenied: not this one", name(&first)),
    )
    .await;
    assert!(body.contains("retrying in"), "{body}");
    let denied_at = tokio::time::Instant::now();
    let second = new_csr(&sim, &[name(&first)], Duration::from_secs(10)).await;
    assert!(
        denied_at.elapsed() >= Duration::from_millis(1000),
        "retried after {:?}",
        denied_at.elapsed()
    );
    assert_ne!(check_request(&second), first_key);
    assert_eq!(proxy.admin_get("/readyz?verbose").await.0, 500);

    let leaf = approve_and_sign(&sim, &second, &cluster_ca, Duration::from_secs(3600));
    serves(&proxy, &cluster_ca.cert_pem(), &leaf).await;
    proxy.ready().await;
    assert_eq!(csr_names(&sim).await.len(), 2);
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn restart_resumes_the_pending_request() {
    let sim = sim().await;
    let cluster_ca = Ca::new("cluster-ca").unwrap();
    let dir = tempdir();
    let pki = dir.join("pki");
    let config = config(&sim, &dir, &pki);
    let mut proxy = Running::start(&config).await;
    let first = new_csr(&sim, &[], SOON).await;
    not_ready_because(
        &proxy,
        &format!("CSR {} for {SIGNER} is pending approval", name(&first)),
    )
    .await;
    proxy.stop().await.unwrap();

    // The restarted proxy waits for the same request: approving it (as
    // the operator was told to) is enough.
    let proxy = Running::start(&config).await;
    not_ready_because(
        &proxy,
        &format!("CSR {} for {SIGNER} is pending approval", name(&first)),
    )
    .await;
    assert_eq!(csr_names(&sim).await, [name(&first)]);
    let leaf = approve_and_sign(&sim, &first, &cluster_ca, Duration::from_secs(3600));
    serves(&proxy, &cluster_ca.cert_pem(), &leaf).await;
    proxy.ready().await;
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}
