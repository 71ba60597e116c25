//! What `agents` measures (`AgentsArgs`), and where the nodes' agents
//! connect (`Topology`).

use std::path::PathBuf;

/// What to measure.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentsArgs {
    /// Simulated nodes, each with its five agents.
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// Topologies to measure, in order, each on a fresh control plane.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Topology::Direct, Topology::Proxies, Topology::Tier])]
    pub modes: Vec<Topology>,
    /// Nodes whose agents go through a real node proxy (a kube-cache-proxy
    /// process each), the first ones; beyond them a node proxy is
    /// simulated by what it opens upstream.
    #[arg(long, default_value_t = 100)]
    pub real_proxies: usize,
    /// Tier replicas (mode tier).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// The kube-cache-proxy binary the node proxies and the tier run.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "target/release/kube-cache-proxy"
    )]
    pub proxy_bin: PathBuf,
    /// Seconds of steady writes measured.
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Services, and as many EndpointSlices, seeded.
    #[arg(long, default_value_t = 20)]
    pub services: usize,
    /// NetworkPolicies seeded (the CNI agent watches them).
    #[arg(long, default_value_t = 20)]
    pub network_policies: usize,
    /// Service patches per second, during the steady phase.
    #[arg(long, default_value_t = 2.0)]
    pub service_writes: f64,
    /// EndpointSlice patches per second.
    #[arg(long, default_value_t = 2.0)]
    pub slice_writes: f64,
    /// Pod status patches per second (round-robin over the nodes' pods).
    #[arg(long, default_value_t = 10.0)]
    pub pod_writes: f64,
    /// Nodes started per second (all of a node's agents, or its simulated
    /// node proxy, at once).
    #[arg(long, default_value_t = 50.0)]
    pub start_rate: f64,
    /// Seconds between a log agent's GETs of each of its node's pods.
    #[arg(long, default_value_t = 10.0)]
    pub log_get_interval: f64,
    /// The tier replicas' `cache.watchBatchMilliseconds` (default: the
    /// shipped `manifests/tier/config.yaml`'s).
    #[arg(long, value_name = "MS")]
    pub watch_batch_ms: Option<u64>,
    /// The tier replicas' `cache.upstreamEncoding` (`JSON` or `Protobuf`;
    /// default: the shipped configuration's).
    #[arg(long, value_name = "ENCODING")]
    pub tier_upstream_encoding: Option<String>,
    /// Stop a run when the machine's available memory (`MemAvailable`)
    /// falls below this many MiB, before the kernel's OOM killer picks a
    /// process of someone else's: the machine is shared.
    #[arg(long, default_value_t = 3072)]
    pub min_available_mib: u64,
    /// Seconds between every watch open and the steady phase: longer
    /// than a catch-up watch lives (60 s), which a proxy whose reviews
    /// failed during the start passed through (docs/tier.md).
    #[arg(long, default_value_t = 75)]
    pub settle: u64,
    /// How long to wait for every watch to open, in seconds.
    #[arg(long, default_value_t = 600)]
    pub start_timeout: u64,
    /// Append each run's figures to this file (a JSON object per line),
    /// for the ratios against direct and the chart across runs.
    #[arg(long, value_name = "FILE")]
    pub results: Option<PathBuf>,
    /// Write a chart (SVG) of the runs in `--results` (the newest of each
    /// N and topology), or of this invocation's runs without it.
    #[arg(long, value_name = "PATH")]
    pub svg: Option<PathBuf>,
    /// Run nothing: print the table and write `--svg` from `--results`.
    #[arg(long)]
    pub report_only: bool,
    /// Keep the proxies' directories (configuration, logs).
    #[arg(long)]
    pub keep_logs: bool,
}

/// Where the nodes' agents connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Topology {
    /// To the apiserver.
    Direct,
    /// To their node's proxy, whose upstream is the apiserver.
    Proxies,
    /// To their node's proxy, whose upstream is a tier replica (the
    /// apiserver as its fallback).
    Tier,
    /// No agent at all, the same objects and writes: what the apiserver
    /// sends its own watchers (its admission plugins' informers), which
    /// every topology's figures include.
    Baseline,
}

impl Topology {
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Direct => "direct",
            Topology::Proxies => "proxies",
            Topology::Tier => "tier",
            Topology::Baseline => "baseline",
        }
    }
}
