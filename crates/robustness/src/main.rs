//! `kcp-robustness`: the robustness run (see the library's documentation
//! and docs/reliability.md). Exit status: 0 no anomaly, 1 anomalies found,
//! 2 the run itself failed, 3 no control plane to run against.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kcp_robustness::faults::FaultKind;
use kcp_robustness::run::{Options, run};

/// Faults injected under load against a real control plane, every watch
/// stream validated against etcd's history.
#[derive(Debug, Parser)]
#[command(name = "kcp-robustness", version)]
struct Args {
    /// The kube-cache-proxy binary the proxies run (e.g.
    /// target/release/kube-cache-proxy).
    #[arg(long, value_name = "PATH")]
    proxy_bin: PathBuf,
    /// Seeds the fault schedule, targets and writes: the same seed replays
    /// the same run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds of fault injection.
    #[arg(long, default_value_t = 150)]
    duration: u64,
    /// Writes per second.
    #[arg(long, default_value_t = 8.0)]
    rate: f64,
    /// Fewest and most seconds between two faults.
    #[arg(long, num_args = 2, value_names = ["MIN", "MAX"], default_values_t = [1.0, 4.0])]
    gap: Vec<f64>,
    /// The faults to draw from (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    faults: Vec<FaultKind>,
    /// kube-apiservers behind the balancer (HAProxy where installed).
    #[arg(long, default_value_t = 3)]
    apiservers: usize,
    /// etcd members (as many as apiservers: each apiserver on its own).
    #[arg(long, default_value_t = 3)]
    etcd_members: usize,
    /// Node proxies straight to the apiservers (through the balancer).
    #[arg(long, default_value_t = 2)]
    direct_nodes: usize,
    /// Node proxies behind the tier.
    #[arg(long, default_value_t = 2)]
    tier_nodes: usize,
    /// Tier replicas.
    #[arg(long, default_value_t = 2)]
    tier_replicas: usize,
    /// Hollow kubelets (at most one on a direct node and one on a tier
    /// node).
    #[arg(long, default_value_t = 2)]
    kubelets: usize,
    /// Fewest and most seconds the snapshot directory stays full.
    #[arg(long, num_args = 2, value_names = ["MIN", "MAX"], default_values_t = [5.0, 10.0])]
    dir_full: Vec<f64>,
    /// Where the run's files and logs go.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Also write the report to this file.
    #[arg(long)]
    report: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let a = Args::parse();
    let mut o = Options::short(&a.proxy_bin);
    o.seed = a.seed;
    o.duration = Duration::from_secs(a.duration);
    o.rate = a.rate;
    o.gap = (a.gap[0], a.gap[1]);
    if !a.faults.is_empty() {
        o.faults = a.faults;
    }
    o.shape.apiservers = a.apiservers;
    o.shape.etcd_members = a.etcd_members;
    o.shape.direct_nodes = a.direct_nodes;
    o.shape.tier_nodes = a.tier_nodes;
    o.shape.tier_replicas = a.tier_replicas;
    o.shape.kubelets = a.kubelets;
    o.dir = a.dir;
    o.dir_full = (a.dir_full[0], a.dir_full[1]);
    match run(&o).await {
        Ok(report) => {
            let text = report.text();
            println!("{text}");
            if let Some(p) = a.report
                && let Err(e) = std::fs::write(&p, &text)
            {
                eprintln!("kcp-robustness: writing {}: {e}", p.display());
            }
            if report.clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            let text = format!("{e:#}");
            if [
                "no Kubernetes control plane",
                "no etcd cluster member",
                "no kube-apiserver 1.",
            ]
            .iter()
            .any(|absent| text.contains(absent))
            {
                eprintln!("kcp-robustness: skipping: {e:#}");
                return ExitCode::from(3);
            }
            eprintln!("kcp-robustness: {e:#}");
            ExitCode::from(2)
        }
    }
}
