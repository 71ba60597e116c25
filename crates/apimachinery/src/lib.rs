//! The parts of kube-apiserver's API machinery that both kube-cache-proxy
//! and the simulated kube-apiserver (`kube-apiserver-sim`) implement: the
//! `Status` errors and Go-compatible JSON the apiserver writes, label and
//! field selectors, the built-in resources and their selectable fields,
//! request info, user info and watch event types, client-certificate
//! handling, and the generated certificates and kubeconfigs the demo and
//! the tests use.
//!
//! It mirrors `k8s.io/apimachinery` and parts of `k8s.io/apiserver`, and
//! exists as its own crate so that the simulator does not depend on the
//! proxy: the proxy's optional `demo` feature depends on the simulator,
//! and cargo forbids a cycle between packages. The proxy's modules import
//! it directly (`apimachinery::selector`, ...).
#![forbid(unsafe_code)]

pub mod body;
pub mod go;
pub mod impersonation;
pub mod kubeconfig;
pub mod pki;
pub mod protobuf;
pub mod request;
pub mod resource;
pub mod selector;
pub mod status;
pub mod url;
pub mod user;
pub mod watch;
pub mod x509;
