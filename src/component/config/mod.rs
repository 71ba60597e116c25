//! Configuration: one YAML file, overridden by command-line flags, validated
//! before any socket is bound.
//!
//! The documented example with every field and its default is
//! `config/kube-cache-proxy.yaml`. Field names are camelCase, like the
//! Kubernetes component configs (`KubeletConfiguration`), and carry their
//! unit (`...Seconds`, `...Bytes`).
//!
//! `schema` holds the types, their YAML names and defaults; `load` reads the
//! file and applies the flags; `validate` checks every field; `error` names
//! the offending file or field. Every item is re-exported here.

mod error;
mod load;
mod schema;
mod validate;

pub use error::ConfigError;
pub use load::{Overrides, yaml_error};
pub use schema::{
    API_VERSION, AnonymousConfig, AuthenticationConfig, AuthorizationConfig, CacheConfig,
    CachedResource, Config, ConsistencyCheckConfig, CsrConfig, FallbackConfig, IdentityMode, KIND,
    KubernetesServiceMode, PersistenceConfig, PodNetworkConfig, SubjectAccessReviewConfig,
    TakeoverConfig, TlsConfig, TlsVersion, TokenReviewConfig, UpstreamConfig, UpstreamEncoding,
};
pub use validate::MIN_CSR_EXPIRATION_SECONDS;
