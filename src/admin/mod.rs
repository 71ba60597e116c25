//! The operator's side: the admin listener ([`endpoints`]: plain HTTP on
//! loopback, `/healthz`, `/livez`, `/readyz`, `/metrics`, `/debug/caches`)
//! and the authenticated [`metrics_listener`] (`metricsListen`). They read
//! every other part (the caches, the upstream servers, readiness), so they
//! sit above them, next to `run()`.

pub mod endpoints;
pub mod metrics_listener;

pub use endpoints::Admin;
