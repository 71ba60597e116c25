//! What makes the proxy a Kubernetes component, as `k8s.io/component-base`
//! does for kube-apiserver and kubelet: its [`config`]uration (one YAML
//! file, overridden by the [`cli`]'s flags), [`logging`] (klog's verbosity,
//! text or JSON), Prometheus [`metrics`], the [`admin`] listener
//! (`/healthz`, `/livez`, `/readyz` from [`ready`], `/metrics`,
//! `/debug/caches`) and the authenticated [`metrics_listener`].

pub mod admin;
pub mod cli;
pub mod config;
pub mod logging;
pub mod metrics;
pub mod metrics_listener;
pub mod ready;
