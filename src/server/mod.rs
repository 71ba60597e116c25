//! The client-facing side: what node agents connect to.
//!
//! In a request's order: [`serve`] accepts a connection on the listener
//! (taken over from a predecessor by [`takeover`]), admits it by client
//! identity ([`conns`]), completes the TLS handshake with the reloadable
//! serving certificate ([`tls`]) and serves HTTP/2 (writes batched by
//! [`coalesce`]) or HTTP/1.1; [`handler`] dispatches each request: the
//! cache answers reads it can answer exactly (watches over WebSocket in
//! [`websocket`]), and everything else goes to the apiserver untouched by
//! [`passthrough`]. With `podNetwork.kubernetesService`, this node's
//! kubelet reads the `default/kubernetes` Service rewritten to the pods'
//! listener ([`kubernetes_service`]).

pub mod accept;
pub mod coalesce;
pub mod conns;
pub mod handler;
pub mod kubernetes_service;
pub mod passthrough;
pub mod serve;
pub mod takeover;
pub mod tls;
pub mod websocket;
