//! Command-line interface. Flags are named like kube-apiserver's where
//! they mean the same thing, and override the configuration file.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{IdentityMode, Overrides, TlsVersion};

/// A caching proxy for kube-apiserver: answers list, get and watch from a
/// watch cache fed by one upstream list+watch per resource, and passes
/// every other request through.
#[derive(Debug, Parser)]
#[command(name = "kube-cache-proxy", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

/// Subcommands. Without one, the proxy serves.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve (the default).
    Serve(ServeArgs),
    /// Start a simulated kube-apiserver with sample objects and the proxy in
    /// front of it, and print the kubeconfig and curl lines to reach it.
    #[cfg(feature = "demo")]
    Demo(DemoArgs),
}

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Flags of `serve`.
#[derive(Debug, Clone, Args, Default)]
pub struct ServeArgs {
    /// Configuration file (YAML). See config/kube-cache-proxy.yaml.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address (host:port) of the HTTPS listener. Default 127.0.0.1:6444.
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// Address (host:port) of the plain-HTTP admin listener (/metrics,
    /// /healthz, /livez, /readyz); loopback only. Default 127.0.0.1:9444.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin_listen: Option<String>,
    /// Address (host:port) of the HTTPS metrics listener: /metrics for
    /// authenticated and authorized callers. Default: none.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
    /// Kubeconfig of the upstream kube-apiserver. Unset: in-cluster
    /// service-account configuration.
    #[arg(long, value_name = "FILE")]
    pub upstream_kubeconfig: Option<PathBuf>,
    /// Context of the upstream kubeconfig. Unset: its current context.
    #[arg(long, value_name = "NAME")]
    pub upstream_context: Option<String>,
    /// Who the proxy is upstream: Auto, Node or AsGiven (upstream.identity).
    #[arg(long, value_name = "MODE", value_parser = parse_identity)]
    pub upstream_identity: Option<IdentityMode>,
    /// PEM serving certificate (chain), like kube-apiserver's flag.
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the serving certificate.
    #[arg(long, value_name = "FILE")]
    pub tls_private_key_file: Option<PathBuf>,
    /// PEM bundle of CAs whose client certificates authenticate users
    /// (CN = user, O = groups), like kube-apiserver's flag.
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// Lowest TLS version accepted.
    #[arg(long, value_name = "VERSION", value_parser = parse_tls_version)]
    pub tls_min_version: Option<TlsVersion>,
    /// Seconds open connections may drain after SIGTERM. Default 30.
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_grace_period_seconds: Option<u64>,
    /// This node's name, for `${NODE_NAME}` in cache scopes (set it from the
    /// downward API's `spec.nodeName`).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
}

/// Flags of `demo`.
#[cfg(feature = "demo")]
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Address (host:port) of the proxy's HTTPS listener.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:6444")]
    pub listen: String,
    /// Address (host:port) of the proxy's admin listener.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9444")]
    pub admin_listen: String,
    /// Directory for the generated kubeconfig and certificates.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

fn parse_tls_version(s: &str) -> Result<TlsVersion, String> {
    match s {
        "VersionTLS12" => Ok(TlsVersion::VersionTLS12),
        "VersionTLS13" => Ok(TlsVersion::VersionTLS13),
        _ => Err(format!(
            "{s:?} is not a supported TLS version (VersionTLS12, VersionTLS13)"
        )),
    }
}

// === impl ServeArgs ===

impl ServeArgs {
    /// The overrides these flags make to the file.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            admin_listen: self.admin_listen.clone(),
            metrics_listen: self.metrics_listen.clone(),
            upstream_kubeconfig: self.upstream_kubeconfig.clone(),
            upstream_context: self.upstream_context.clone(),
            upstream_identity: self.upstream_identity,
            tls_cert_file: self.tls_cert_file.clone(),
            tls_private_key_file: self.tls_private_key_file.clone(),
            client_ca_file: self.client_ca_file.clone(),
            tls_min_version: self.tls_min_version,
            shutdown_grace_period_seconds: self.shutdown_grace_period_seconds,
            node_name: self.node_name.clone(),
        }
    }
}

fn parse_identity(s: &str) -> Result<IdentityMode, String> {
    match s {
        "Auto" => Ok(IdentityMode::Auto),
        "Node" => Ok(IdentityMode::Node),
        "AsGiven" => Ok(IdentityMode::AsGiven),
        other => Err(format!("{other:?}: expected Auto, Node or AsGiven")),
    }
}
