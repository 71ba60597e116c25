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

mod certificate;
mod renew;
mod request;
mod state;

pub use renew::{CsrError, CsrManager, READY_CHECK};
pub use request::USAGES;
pub use state::{CURRENT_FILE, PENDING_KEY_FILE};
