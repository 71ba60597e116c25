//! Identities of the simulated cluster, as clients of the sim itself.

use kube_apiserver_sim::Sim;

use crate::client::{Auth, Client};

/// Who a client is, in the simulated cluster.
#[derive(Debug, Clone)]
pub enum Identity {
    /// A client certificate with CN `user` and O `group`.
    Cert(String, Option<String>),
    /// A bearer token.
    Token(String),
    /// No credentials.
    Anonymous,
}

impl Identity {
    /// `CN=admin, O=system:masters`.
    pub fn admin() -> Self {
        Identity::Cert("admin".into(), Some("system:masters".into()))
    }

    /// `CN=system:node:<n>, O=system:nodes`.
    pub fn node(n: &str) -> Self {
        Identity::Cert(format!("system:node:{n}"), Some("system:nodes".into()))
    }

    /// A certificate user in no group.
    pub fn user(name: &str) -> Self {
        Identity::Cert(name.into(), None)
    }

    /// The credentials, issued by the sim's CA.
    pub fn auth(&self, sim: &Sim) -> Auth {
        match self {
            Identity::Cert(user, group) => Auth::Cert(sim.issue_client(user, group.as_deref())),
            Identity::Token(t) => Auth::Token(t.clone()),
            Identity::Anonymous => Auth::Anonymous,
        }
    }
}

impl Client {
    /// An HTTP/1.1 client of the sim itself.
    pub fn sim(sim: &Sim, identity: Identity) -> Client {
        Client::new(&sim.url(), &sim.ca_pem(), identity.auth(sim), false)
    }

    /// An HTTP/2 client of the sim itself.
    pub fn sim_h2(sim: &Sim, identity: Identity) -> Client {
        Client::new(&sim.url(), &sim.ca_pem(), identity.auth(sim), true)
    }
}
