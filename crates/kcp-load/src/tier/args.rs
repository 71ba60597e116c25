//! What `tier` measures (`TierArgs`), and where the simulated nodes'
//! watches go (`Mode`).

use std::path::PathBuf;

/// What to measure.
#[derive(Debug, Clone, clap::Args)]
pub struct TierArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// Modes to measure, in order, each on a fresh control plane.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Direct, Mode::Tier])]
    pub modes: Vec<Mode>,
    /// Tier replicas (processes of --proxy-bin).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// The kube-cache-proxy binary the tier runs (e.g.
    /// target/release/kube-cache-proxy); required for mode tier.
    #[arg(long, value_name = "PATH")]
    pub proxy_bin: Option<PathBuf>,
    /// Seconds of steady writes measured.
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Services, and as many EndpointSlices, seeded.
    #[arg(long, default_value_t = 20)]
    pub services: usize,
    /// Service patches per second, during the steady phase.
    #[arg(long, default_value_t = 2.0)]
    pub service_writes: f64,
    /// EndpointSlice patches per second.
    #[arg(long, default_value_t = 2.0)]
    pub slice_writes: f64,
    /// Pod status patches per second (round-robin over the nodes' pods).
    #[arg(long, default_value_t = 10.0)]
    pub pod_writes: f64,
    /// Simulated nodes started per second.
    #[arg(long, default_value_t = 200.0)]
    pub start_rate: f64,
    /// Skip the relist storm (the apiserver's restart).
    #[arg(long)]
    pub no_restart: bool,
    /// The replicas' `cache.watchBatchMilliseconds` (default: the shipped
    /// `manifests/tier/config.yaml`'s).
    #[arg(long, value_name = "MS")]
    pub watch_batch_ms: Option<u64>,
    /// Leave out `manifests/tier/flowcontrol.yaml` (the tier's own
    /// priority level): its requests then fall to the default FlowSchema
    /// `kube-system-service-accounts` (level `workload-high`).
    #[arg(long)]
    pub no_flowcontrol: bool,
    /// How long to wait for every watch after the restart, in seconds.
    #[arg(long, default_value_t = 180)]
    pub recovery_timeout: u64,
}

/// Where the simulated nodes' watches go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// To the apiserver itself.
    Direct,
    /// To the tier replicas, round-robin.
    Tier,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Tier => "tier",
        }
    }
}
