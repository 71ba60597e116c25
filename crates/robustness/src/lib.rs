//! The robustness run of kube-cache-proxy (issue: "Nothing lost, proven"):
//! a real etcd and kube-apiserver, node proxies and a tier of proxies on
//! the shipped configurations, hollow kubelets, steady writes, and faults
//! from a seeded schedule; every watch stream recorded by clients of every
//! kind is validated against etcd's own history.

pub mod balancer;
pub mod client;
pub mod etcd;
pub mod faults;
pub mod model;
pub mod reference;
pub mod relay;
pub mod run;
pub mod topology;
pub mod traffic;
pub mod validate;
pub mod watcher;
