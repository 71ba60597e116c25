//! The real-apiserver tests that share one control plane without
//! disturbing each other, in one test binary (it links the proxy once and
//! starts one etcd and kube-apiserver, `kube-testenv`'s shared control
//! plane): every representation and resourceVersion rule compared with
//! the apiserver, authentication, clients, paths, tables, the tier's
//! credentials and WebSocket streams. The tests that pause, restart,
//! compact or restore the control plane, count the apiserver's own
//! watches, or turn on fault injection (which is process-wide) are
//! `tests/real_isolated/`, each on a control plane of its own. `cargo test --test real
//! <module>::` runs one module.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kcp_test_support as support;

mod api;
mod authentication;
mod clients;
mod paths;
mod protobuf;
mod protobuf_json;
mod tables;
mod tier_credentials;
mod websocket;
