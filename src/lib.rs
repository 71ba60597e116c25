//! kube-cache-proxy: a caching proxy in front of kube-apiserver.
//!
//! It terminates client TLS, answers list, get and watch from a watch cache
//! fed by one upstream list+watch per resource, and passes everything else
//! through untouched. See `README.md` for the design.
#![forbid(unsafe_code)]

pub mod body;
pub mod config;
pub mod pki;
pub mod request;
pub mod resource;
pub mod selector;
pub mod sim;
pub mod status;
