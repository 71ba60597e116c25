//! Shared support for the proxy's integration tests (`tests/sim/`,
//! `tests/real/`, `tests/real_isolated/`): clients, the proxy in front of
//! the simulated apiserver or a real control plane, the binary, raw HTTP,
//! the recording of a real apiserver and its differential replay. A test
//! binary names it `support` (`use kcp_test_support as support;`).
//! Failing is what a test's helpers are for: they panic with what went
//! wrong.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod binary;
pub mod client;
pub mod differential;
pub mod env;
pub mod kubectl;
pub mod pod_network;
pub mod python;
pub mod raw;
pub mod real;
pub mod recording;
pub mod sim;

pub use client::{Auth, Client, Next, Resp, WatchStream};
pub use env::Env;
pub use sim::Identity;

use std::path::{Path, PathBuf};
use std::time::Duration;

use apimachinery::resource::Gvr;
use kube_cache_proxy::component::config::{CachedResource, Config};

/// The repository's root (the proxy's package), for the files the tests
/// read: shipped configurations, manifests, fixtures.
pub fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The proxy's binary that cargo built for this test run, beside the test
/// binary (`target/<profile>/kube-cache-proxy`, what
/// `CARGO_BIN_EXE_kube-cache-proxy` names to a test crate).
pub fn proxy_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test>-<hash>
    let profile = exe.ancestors().nth(2).unwrap();
    profile.join(format!("kube-cache-proxy{}", std::env::consts::EXE_SUFFIX))
}

/// Cargo's directory for the tests' scratch files (`target/tmp`, what
/// `CARGO_TARGET_TMPDIR` names to a test crate).
pub fn target_tmpdir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test>-<hash>
    let target = exe.ancestors().nth(3).unwrap();
    target.join("tmp")
}

/// Core v1 configmaps, the resource most tests write and read.
pub fn configmaps() -> Gvr {
    Gvr {
        group: String::new(),
        version: "v1".into(),
        resource: "configmaps".into(),
    }
}

/// Adds configmaps (not in the default list) to the cached resources.
pub fn cache_configmaps(c: &mut Config) {
    c.cache.resources.push(CachedResource {
        version: "v1".into(),
        resource: "configmaps".into(),
        ..CachedResource::default()
    });
}

/// The names of a list's items, in order.
///
/// # Panics
/// When `list` has no `items` array or an item no name.
pub fn item_names(list: &serde_json::Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|i| i["metadata"]["name"].as_str().expect("a name").to_string())
        .collect()
}

/// For things expected promptly.
pub const SOON: Duration = Duration::from_secs(5);
/// For checking that nothing arrives.
pub const QUIET: Duration = Duration::from_millis(300);
