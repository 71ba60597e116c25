//! Command-line interface. Flags are named like kube-apiserver's where
//! they mean the same thing, and override the configuration file.

use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::component::config::{IdentityMode, Overrides, TlsVersion};

/// The exit statuses, as `--help` lists them (sysexits.h's `EX_USAGE` for
/// anything the operator must fix in the command line or configuration).
pub const EXIT_STATUSES: &str = "\
Exit status:
  0   stopped cleanly after SIGTERM or SIGINT (open connections drained); or
      --help, --version, --print-default-config, a valid --validate-config
  1   a runtime failure: a listener could not be bound (address in use,
      permission), or an internal error
  64  bad command line or configuration (EX_USAGE): an unknown flag or
      value, an invalid or unreadable configuration file, a serving
      certificate, key or client CA that cannot be loaded (missing, not
      PEM, key not matching the certificate), an upstream kubeconfig that
      cannot be loaded, upstream.identity Node without a node credential;
      the message names the field or file

Environment:
  RUST_LOG   tracing filter directives; when set, they replace -v
             (e.g. RUST_LOG=info,kube_cache_proxy::cache=debug)
  NODE_NAME  default of --node-name (the downward API's spec.nodeName)
  NO_COLOR   no colours in text logs (they are only used on a terminal)";

/// A caching proxy for kube-apiserver: answers list, get and watch from a
/// watch cache fed by one upstream list+watch per resource, and passes
/// every other request through.
#[derive(Debug, Parser)]
#[command(name = "kube-cache-proxy", version, about, long_about = None, after_help = EXIT_STATUSES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Log format, as Kubernetes components' --logging-format: text (one
    /// line per message; colours only on a terminal) or json (one JSON
    /// object per line: ts, caller, msg, v, err and the message's fields).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text, global = true, alias = "log-format")]
    pub logging_format: LogFormat,
    /// Log verbosity, as klog's -v/--v: 0-3 informational messages (the
    /// default, 0), 4-5 also debug, 6-7 also trace and the libraries'
    /// debug, 8 and up everything. RUST_LOG, when set, overrides it.
    #[arg(
        short = 'v',
        long = "v",
        value_name = "LEVEL",
        default_value_t = 0,
        global = true
    )]
    pub v: u8,
    /// Print the default configuration (every field with its default, as
    /// YAML) and exit.
    #[arg(long, conflicts_with_all = ["validate_config", "config"])]
    pub print_default_config: bool,
    /// Check FILE, with the other flags applied as when serving (fields and
    /// values, and the files it names: certificate and key loaded and
    /// matched, client CA, upstream kubeconfig), without binding or
    /// connecting; exit 0 if the proxy would start, 64 (naming the field
    /// or file) if not.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    pub validate_config: Option<PathBuf>,
}

/// Subcommands. Without one, the proxy serves.
#[derive(Debug, Subcommand)]
// Parsed once at start: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Serve (the default).
    Serve(ServeArgs),
    /// Start a simulated kube-apiserver with sample objects and the proxy in
    /// front of it, and print the kubeconfig and curl lines to reach it.
    #[cfg(feature = "demo")]
    Demo(DemoArgs),
    /// Create the node's state directory (snapshots, takeover socket) owned
    /// by the user the proxy runs as, mode 0700: for an init container
    /// running as root with only CAP_CHOWN, since the hostPath volume
    /// kubelet creates is root's.
    PrepareStateDir(PrepareStateDirArgs),
    /// GET a plain-HTTP URL on this host and exit 0 if it answers 200 (1
    /// otherwise): an exec probe of the loopback-only admin port where
    /// kubelet cannot reach it (a pod not on the host network).
    Probe(ProbeArgs),
    /// Print what a running proxy caches: per cache its objects,
    /// resourceVersion, history, watchers, bytes, and when it last
    /// changed, was listed and was checked against upstream; read from
    /// its admin port (`/debug/caches`).
    Status(StatusArgs),
}

/// Flags of `status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The proxy's admin listener (`adminListen`).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9444")]
    pub admin_address: String,
    /// `table` (like kubectl's) or `json` (the `/debug/caches` answer).
    #[arg(short = 'o', long, value_enum, default_value_t = StatusOutput::Table)]
    pub output: StatusOutput,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 3)]
    pub timeout_seconds: u64,
}

/// `status --output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    Table,
    Json,
}

/// Flags of `probe`.
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// The URL, e.g. http://127.0.0.1:9444/readyz.
    #[arg(long, value_name = "URL")]
    pub url: String,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 3)]
    pub timeout_seconds: u64,
}

/// Flags of `prepare-state-dir`.
#[derive(Debug, Clone, Args)]
pub struct PrepareStateDirArgs {
    /// The directory, e.g. /var/lib/kube-cache-proxy.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Its owner's uid.
    #[arg(long, default_value_t = 65532)]
    pub uid: u32,
    /// Its owner's gid.
    #[arg(long, default_value_t = 65532)]
    pub gid: u32,
}

/// Log output format (`--logging-format`).
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per message.
    Text,
    /// One JSON object per line, with Kubernetes' keys.
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
    /// Who the proxy is upstream (upstream.identity): Auto (the node when
    /// the credential is a node's, else as given), Node (the node, or exit
    /// 64), AsGiven, Tier (the upstream of node proxies: docs/tier.md).
    #[arg(long, value_name = "MODE", value_parser = identity_parser())]
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
    /// Lowest TLS version accepted, named as kube-apiserver's
    /// --tls-min-version names them. Default VersionTLS12.
    #[arg(long, value_name = "VERSION", value_parser = tls_version_parser())]
    pub tls_min_version: Option<TlsVersion>,
    /// Seconds open connections may drain after SIGTERM. Default 30.
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_grace_period_seconds: Option<u64>,
    /// This node's name, for `${NODE_NAME}` in cache scopes (set it from the
    /// downward API's `spec.nodeName`).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Directory of the cache snapshots (cache.persistence.directory); ""
    /// turns them off.
    #[arg(long, value_name = "DIR")]
    pub cache_persistence_directory: Option<PathBuf>,
    /// Unix socket a successor takes the listeners over on
    /// (takeover.socketPath); "" turns takeover off.
    #[arg(long, value_name = "PATH")]
    pub takeover_socket_path: Option<PathBuf>,
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

/// `VersionTLS12` or `VersionTLS13`, listed by `--help`.
fn tls_version_parser() -> impl clap::builder::TypedValueParser<Value = TlsVersion> {
    PossibleValuesParser::new(["VersionTLS12", "VersionTLS13"]).map(|s| match s.as_str() {
        "VersionTLS13" => TlsVersion::VersionTLS13,
        _ => TlsVersion::VersionTLS12,
    })
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
            cache_persistence_directory: self.cache_persistence_directory.clone(),
            takeover_socket_path: self.takeover_socket_path.clone(),
        }
    }
}

/// `Auto`, `Node`, `AsGiven` or `Tier`, listed by `--help`.
fn identity_parser() -> impl clap::builder::TypedValueParser<Value = IdentityMode> {
    PossibleValuesParser::new(["Auto", "Node", "AsGiven", "Tier"]).map(|s| match s.as_str() {
        "Node" => IdentityMode::Node,
        "AsGiven" => IdentityMode::AsGiven,
        "Tier" => IdentityMode::Tier,
        _ => IdentityMode::Auto,
    })
}
