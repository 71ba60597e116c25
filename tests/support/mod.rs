//! Shared support for the proxy's integration tests.
#![allow(dead_code, unused_imports)]

pub mod binary;
pub mod client;
pub mod differential;
pub mod env;
pub mod kubectl;
pub mod python;
pub mod raw;
pub mod real;
pub mod recording;
pub mod sim;

pub use client::{Auth, Client, Next, Resp, WatchStream};
pub use env::Env;
pub use sim::Identity;

use std::time::Duration;

use apimachinery::resource::Gvr;
use kube_cache_proxy::component::config::{CachedResource, Config};

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

/// For things expected promptly.
pub const SOON: Duration = Duration::from_secs(5);
/// For checking that nothing arrives.
pub const QUIET: Duration = Duration::from_millis(300);
