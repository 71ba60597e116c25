//! What makes the proxy a Kubernetes component, as `k8s.io/component-base`
//! does for kube-apiserver and kubelet: its [`config`]uration (one YAML
//! file, overridden by the [`cli`]'s flags), [`logging`] (klog's verbosity,
//! text or JSON), the Prometheus [`metrics`] registry, [`ready`]iness, and
//! the certificate files every side reloads ([`certs`]), and a future
//! polled only when woken ([`woken`]). Every other module builds on these;
//! they import none of them.

pub mod certs;
pub mod cli;
pub mod config;
pub mod logging;
pub mod metrics;
pub mod ready;
pub mod woken;
