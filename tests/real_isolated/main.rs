//! The real-apiserver tests that each need a control plane of their own,
//! in one test binary: they pause, restart, compact or restore the control
//! plane, count the apiserver's own watches, run hollow nodes and the
//! controllers, or turn on fault injection (which is process-wide). Each
//! test starts its own etcd and kube-apiserver through
//! [`support::real::Isolated`], which also makes it wait until no other
//! test of the binary holds one, so they run one at a time and stop their
//! processes when they end. The tests that can share one control plane
//! undisturbed are `tests/real/`. `cargo test --all-features --test
//! real_isolated <module>::` runs one module.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kcp_test_support as support;

mod autonomy;
mod compaction;
#[cfg(feature = "failpoints")]
mod consistency;
#[cfg(feature = "failpoints")]
mod ha;
mod kubemark;
mod least_privilege;
mod outage;
mod pods;
mod restart;
mod restore;
mod resumes;
mod robustness;
mod sidecar;
mod streams;
mod tier;
