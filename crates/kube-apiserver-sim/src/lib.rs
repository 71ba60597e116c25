//! A simulated kube-apiserver for kube-cache-proxy's tests, benchmarks, load
//! tool (`kcp-load`) and demo.
//!
//! It serves HTTPS on 127.0.0.1 with its own CA and answers like the
//! recorded kube-apiserver v1.36 (the repository's
//! `tests/fixtures/real-apiserver-v1.36.json`):
//! lists, gets and watches with the apiserver's resourceVersion semantics,
//! pagination and errors; writes; discovery; authentication by client
//! certificate or bearer token, impersonation, and an authorizer with the
//! Node authorizer's behaviour; TokenReview and SubjectAccessReview. Tests
//! can inject faults (dropped watches, compaction, the server going down)
//! and read what it was asked ([`Sim::stats`], [`Sim::requests`]).
//!
//! It is its own crate so that the proxy's production binary can be built
//! without it. It depends on the `apimachinery` crate for what it shares
//! with the proxy (`Status`, selectors, resources, request and user info),
//! never on the proxy.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use kube_apiserver_sim::{Sim, SimConfig};
//! let sim = Sim::start(SimConfig::default()).await?;
//! let kubeconfig = sim.kubeconfig("admin", Some("system:masters"));
//! # let _ = kubeconfig;
//! # Ok(()) }
//! ```

// `Status` is what a client receives, so it is the error type throughout;
// boxing it on every path would only add noise to a test server whose
// error paths are not hot.
#![allow(clippy::result_large_err)]
#![forbid(unsafe_code)]

mod accept;
mod authn;
mod authorizer;
mod authz;
mod config;
mod continue_token;
mod discovery;
mod errors;
mod get;
mod gojson;
mod graph;
mod handler;
mod impersonate;
mod list;
mod node_authz;
mod object;
mod openapi;
mod options;
mod patch;
mod protobuf;
mod rbac;
mod remotecommand;
mod resources;
mod respond;
mod review;
mod selection;
mod server;
mod shell;
mod shutdown;
mod state;
mod stats;
mod store;
mod stream;
mod table;
mod watch;
mod write;
mod write_http;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;

pub use apimachinery::go::{GoFormatter, to_line as go_json_line, to_vec as go_json};
pub use authn::{AuthMethod, UserInfo};
pub use authorizer::{Attributes, Decision};
pub use authz::Policy;
pub use config::SimConfig;
pub use rbac::{Rule, Subject};
pub use resources::ResourceSpec;
pub use stats::{RequestRecord, Stats};
pub use store::Backup;

use apimachinery::pki::{self, Ca};
use apimachinery::resource::Gvr;
use apimachinery::status::Status;
use server::Server;
use state::State;
use write::{Preconditions, Target};

/// A running simulated apiserver. Dropping it stops the server.
#[derive(Debug)]
pub struct Sim {
    state: Arc<State>,
    tls: Arc<rustls::ServerConfig>,
    server: Mutex<Option<Server>>,
}

// === impl Sim ===

impl Sim {
    /// Starts a sim on `127.0.0.1:<free port>`.
    ///
    /// # Errors
    /// When the port cannot be bound or certificates cannot be generated.
    pub async fn start(config: SimConfig) -> io::Result<Sim> {
        let listener = server::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let addr = listener.local_addr()?;
        let ca = Ca::new("kube-cache-proxy-sim-ca").map_err(io::Error::other)?;
        let (tls, client_certs) = server::tls_config(&ca)?;
        let (drops, _) = tokio::sync::watch::channel(0);
        let state = Arc::new(State {
            store: store::Store::new(config.initial_resource_version, config.history_limit),
            registry: resources::Registry::new(),
            tokens: authn::Tokens::default(),
            policy: Policy::new(&config.proxy_user),
            impersonation_modes: apimachinery::impersonation::LastModes::default(),
            stats: Arc::new(stats::Collector::default()),
            drops,
            addr,
            ca,
            client_certs,
            config,
        });
        let server = Server::spawn(state.clone(), listener, tls.clone());
        tracing::info!(%addr, "simulated apiserver started");
        Ok(Sim {
            state,
            tls,
            server: Mutex::new(Some(server)),
        })
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.state.addr
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.state.addr)
    }

    /// The cluster CA certificate (PEM); it signs the serving certificate
    /// and the client certificates the sim accepts.
    pub fn ca_pem(&self) -> String {
        self.state.ca.cert_pem()
    }

    /// A client certificate for `user` in `group`, signed by the cluster CA.
    /// Both PEMs are empty if signing failed (it does not in practice).
    pub fn issue_client(&self, user: &str, group: Option<&str>) -> pki::Issued {
        self.state.ca.issue_client(user, group).unwrap_or_else(|e| {
            tracing::error!(error = %e, "sim could not issue a client certificate");
            pki::Issued {
                cert_pem: String::new(),
                key_pem: String::new(),
            }
        })
    }

    /// A kubeconfig (YAML) for [`Sim::url`] with the CA and a fresh client
    /// certificate for `user` in `group` embedded.
    pub fn kubeconfig(&self, user: &str, group: Option<&str>) -> String {
        let issued = self.issue_client(user, group);
        apimachinery::kubeconfig::with_certificate(
            &self.url(),
            &self.ca_pem(),
            user,
            &issued.cert_pem,
            &issued.key_pem,
        )
    }

    /// A kubeconfig (YAML) authenticating with bearer `token`.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        apimachinery::kubeconfig::with_token(&self.url(), &self.ca_pem(), token)
    }

    /// Accepts bearer `token` as `user` (also in TokenReviews).
    pub fn add_token(&self, token: &str, user: UserInfo) {
        self.state.tokens.add(token, user);
    }

    /// Stops accepting `token`: requests with it get 401.
    pub fn revoke_token(&self, token: &str) {
        self.state.tokens.revoke(token);
    }

    /// The authorization rules, changeable at run time.
    pub fn policy(&self) -> &Policy {
        &self.state.policy
    }

    /// A snapshot of the request counters.
    pub fn stats(&self) -> Stats {
        self.state.stats.snapshot()
    }

    /// The last 10 000 requests received, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state.stats.requests()
    }

    /// Lists received of `resource` (of every resource with `None`), but
    /// `limit=1` lists: a proxy's probes of the current resourceVersion,
    /// not lists of the objects.
    pub fn full_lists(&self, resource: Option<&str>) -> u64 {
        self.requests()
            .iter()
            .filter(|r| r.verb == "list" && resource.is_none_or(|res| r.resource == res))
            .filter(|r| !r.query.split('&').any(|p| p == "limit=1"))
            .count() as u64
    }

    /// Serves another resource (a custom resource, or another version).
    pub fn register_resource(&self, spec: ResourceSpec) {
        self.state.registry.register(spec);
    }

    fn spec(&self, gvr: &Gvr) -> Result<Arc<ResourceSpec>, Status> {
        self.state
            .registry
            .get_gvr(gvr)
            .ok_or_else(Status::path_not_found)
    }

    /// Creates `object` (its `metadata.namespace` names the namespace) as
    /// an HTTP create would, emitting an ADDED event. Returns the stored
    /// object.
    ///
    /// # Errors
    /// The `Status` the apiserver would answer (404 for an unknown
    /// resource, 409 AlreadyExists, 422 for a missing name...).
    pub fn create(&self, gvr: &Gvr, object: Value) -> Result<Value, Status> {
        let spec = self.spec(gvr)?;
        write::create(&self.state.store, &spec, None, object).map(|o| o.as_ref().clone())
    }

    /// Replaces the stored object (status included) with `object`, emitting
    /// a MODIFIED event unless nothing changed. A set
    /// `metadata.resourceVersion` must match the stored one.
    ///
    /// # Errors
    /// 404, 409 Conflict.
    pub fn update(&self, gvr: &Gvr, object: Value) -> Result<Value, Status> {
        let spec = self.spec(gvr)?;
        write::update(
            &self.state.store,
            &spec,
            None,
            object,
            Target::Main { keep_status: false },
        )
        .map(|o| o.as_ref().clone())
    }

    /// Deletes an object (`namespace` empty for cluster-scoped ones),
    /// emitting a DELETED event. Returns its last state.
    ///
    /// # Errors
    /// 404.
    pub fn delete(&self, gvr: &Gvr, namespace: &str, name: &str) -> Result<Value, Status> {
        let spec = self.spec(gvr)?;
        write::delete(
            &self.state.store,
            &spec,
            namespace,
            name,
            &Preconditions::default(),
        )
        .map(|o| o.as_ref().clone())
    }

    /// The stored object, if any.
    pub fn get(&self, gvr: &Gvr, namespace: &str, name: &str) -> Option<Value> {
        let spec = self.spec(gvr).ok()?;
        let key = object::storage_key(&spec, namespace, name);
        self.state
            .store
            .get(&spec, &key)
            .map(|o| o.as_ref().clone())
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.store.current_rv()
    }

    /// Aborts every open watch response mid-stream: clients see a broken
    /// body, as if the connection had been killed.
    pub fn drop_watches(&self) {
        self.state.drops.send_modify(|generation| *generation += 1);
    }

    /// Forgets all history: watches (and exact lists) from any RV older
    /// than now get 410 Expired.
    pub fn compact(&self) {
        self.state.store.compact();
    }

    /// Every object now: an etcd backup, for [`Sim::restore`].
    pub fn backup(&self) -> Backup {
        self.state.store.backup()
    }

    /// Restores `backup` as etcd restored without `--bump-revision` with
    /// every apiserver restarted: resourceVersions go back to the
    /// backup's, and the next writes reuse those the lost history gave
    /// (`Store::restore`). Call it while stopped ([`Sim::stop`]) for the
    /// apiserver's restart.
    pub fn restore(&self, backup: &Backup) {
        self.state.store.restore(backup);
    }

    /// Closes the listener and every connection (the apiserver goes down).
    /// New connections are refused until [`Sim::restart`]; state is kept.
    pub async fn stop(&self) {
        let server = self.server.lock().take();
        if let Some(server) = server {
            server.stop().await;
            tracing::info!(addr = %self.state.addr, "simulated apiserver stopped");
        }
    }

    /// Listens again on the same port with the same state. A no-op if
    /// running.
    ///
    /// # Errors
    /// When the port cannot be bound again.
    pub async fn restart(&self) -> io::Result<()> {
        if self.server.lock().is_some() {
            return Ok(());
        }
        let listener = server::bind(self.state.addr)?;
        let server = Server::spawn(self.state.clone(), listener, self.tls.clone());
        *self.server.lock() = Some(server);
        tracing::info!(addr = %self.state.addr, "simulated apiserver restarted");
        Ok(())
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(server) = self.server.lock().take() {
            server.signal();
        }
    }
}
