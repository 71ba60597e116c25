//! Shared support for the proxy's integration tests.
#![allow(dead_code, unused_imports)]

pub mod client;
pub mod env;
pub mod kubectl;
pub mod recording;
pub mod sim;

pub use client::{Auth, Client, Next, Resp, WatchStream};
pub use env::Env;
pub use sim::Identity;

use std::time::Duration;

/// For things expected promptly.
pub const SOON: Duration = Duration::from_secs(5);
/// For checking that nothing arrives.
pub const QUIET: Duration = Duration::from_millis(300);
