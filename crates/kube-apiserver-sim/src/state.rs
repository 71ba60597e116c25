//! The sim's shared state and the per-request context handlers receive.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use super::authn::{Tokens, UserInfo};
use super::authz::Policy;
use super::config::SimConfig;
use super::resources::Registry;
use super::stats::Collector;
use super::store::Store;
use apimachinery::pki::Ca;
use apimachinery::request::RequestInfo;

/// Everything the server and the `Sim` handle share.
#[derive(Debug)]
pub struct State {
    pub config: SimConfig,
    /// The cluster CA: signs the serving certificate and client certificates.
    pub ca: Ca,
    /// Decides, after the handshake, whether a client certificate
    /// authenticates anyone.
    pub client_certs: Arc<apimachinery::x509::AnyClientCert>,
    pub store: Store,
    pub registry: Registry,
    pub tokens: Tokens,
    pub policy: Policy,
    /// The impersonation mode that last succeeded, by requester.
    pub impersonation_modes: apimachinery::impersonation::LastModes,
    pub stats: Arc<Collector>,
    /// Bumped by `Sim::drop_watches`: every open watch aborts its body.
    pub drops: watch::Sender<u64>,
    /// The address served, fixed for the sim's life (restart reuses it).
    pub addr: SocketAddr,
}

/// A request being served, after authentication and impersonation.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub state: Arc<State>,
    pub info: RequestInfo,
    /// Raw query string, without `?`.
    pub query: String,
    /// The effective user.
    pub user: UserInfo,
    /// Fires when the server stops, for tasks outliving the request
    /// (upgraded connections).
    pub shutdown: watch::Receiver<bool>,
}

// === impl Ctx ===

impl Ctx {
    /// The first value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }
}
