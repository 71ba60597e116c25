//! The integration tests that need no real control plane, in one test
//! binary (it links the proxy once): the simulated apiserver
//! (`kube-apiserver-sim`), the proxy's binary, recorded exchanges and
//! property tests. Each module was once a test binary of its own; `cargo
//! test --test sim <module>::` runs one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kcp_test_support as support;

mod binary;
mod cache_faults;
mod cache_property;
mod cache_recording;
mod cache_semantics;
mod connections;
mod csr;
mod demo;
mod fallback;
mod kubectl;
mod parsers;
mod passthrough;
mod paths;
mod pods;
mod restart;
mod security;
mod sim_behaviour;
mod sim_kubectl;
mod sim_recording;
mod takeover;
mod websocket;
