//! The apiserver's side: the connection to kube-apiserver (this module),
//! who the proxy is there ([`identity`]: its node, a tier, or its
//! credential as given) and its serving certificate issued through the
//! CSR API ([`csr`]).
//!
//! Configuration comes from a kubeconfig file or the in-cluster
//! service-account files, loaded by `kube`'s config loader (CA, client
//! certificate and key, static token or a token file that is re-read as it
//! rotates, exec plugins). A client certificate and key named by file
//! (kubelet's rotating `kubelet-client-current.pem`, a certificate an
//! operator renews) are re-read when the files change, as client-go does.
//! Requests go through a pooled hyper client over rustls that speaks
//! HTTP/2 when the apiserver offers it.
//!
//! Two pools exist because the apiserver authenticates a TLS client
//! certificate before a bearer token (its union authenticator tries x509
//! first): a request that must be authenticated by the client's own token
//! has to travel on a connection that carries no proxy certificate.
//!
//! - [`Credentials::Proxy`]: the proxy's own identity (its client
//!   certificate, its `Authorization` header). Used for the reflectors,
//!   TokenReview/SubjectAccessReview, and impersonated pass-through.
//! - [`Credentials::Client`]: no proxy credential at all; the request keeps
//!   the client's own `Authorization` header, a token the proxy knows to be
//!   valid.
//! - [`Credentials::ClientHttp1`]: the same, over HTTP/1.1 only: for
//!   requests the apiserver may not authenticate (no credential, or a
//!   token not known to be valid). kube-apiserver ends an HTTP/2
//!   connection after a request it did not authenticate or took as
//!   anonymous (its `UnauthenticatedHTTP2DOSMitigation`, GOAWAY then
//!   close), which would fail the other clients' requests multiplexed on
//!   the proxy's connection; over HTTP/1.1 it affects that request only.
//!
//! HTTP upgrades (exec, attach, port-forward) use a dedicated HTTP/1.1
//! connection per request, since HTTP/2 has no `Upgrade`.

pub mod csr;
pub mod identity;

mod balance;
mod connect;
mod discover;
mod error;
mod failover;
mod kubeconfig;
mod pool;
mod request;
mod server;
mod site;

pub use balance::{Balancer, BalancerMetrics, EndpointState};
pub use connect::{Connected, IdentityChecks, connect};
pub use error::{UpstreamError, error_chain};
pub use failover::Upstream;
pub use kubeconfig::load_kube_config;
pub use pool::UpstreamBody;
pub use server::{ServerInfo, filter_name};
pub use site::Credentials;
