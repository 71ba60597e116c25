//! kcp-load: load and latency measurements for kube-cache-proxy, against
//! any kube-apiserver-compatible URL (the proxy, or an apiserver directly
//! for comparison) given a kubeconfig, or against the simulated apiserver
//! and the proxy started on 127.0.0.1 (`--sim`, no cluster needed).
//!
//! - `watch`: N watchers and M writers on one resource in one namespace
//!   (default configmaps). Writers create, then update, objects at a total
//!   rate, embedding the write time in an annotation; watchers measure
//!   delivery latency as receive time minus that time, and the tool reports
//!   events/s delivered, latency percentiles and errors; `--lists K` then
//!   times K list requests (latency, MB/s).
//! - `list`: list requests (latency, time to first byte, MB/s), from
//!   `--concurrency` clients at once, through the proxy and directly.
//! - `get`: GETs of one object, from `--concurrency` clients at once,
//!   through the proxy and directly, for the latency the proxy adds.
//!   `get` and `list` also report how many requests went upstream (the
//!   proxy's `kube_cache_proxy_cache_reads_total` and probes, and with a
//!   real apiserver its `apiserver_request_total`), optionally while the
//!   resource is written to (`--write-rate`) or the rest of the cluster is
//!   (`--other-write-rate`).
//! - `idle`: N idle watches over HTTP/2, and the proxy's resident memory
//!   before and after (`/proc/<pid>/status`), per watcher.
//! - `ingest`: N objects ingested into a cache `State` in this process; the
//!   resident memory added, relative to the objects' JSON size.
//! - `memory`: the proxy's resident memory per cached pod, pods created
//!   in a real kube-apiserver before it starts, against the same proxy
//!   caching none, ÷ the pods' JSON.
//! - `tier`: N simulated nodes' upstream watch sets against a real
//!   kube-apiserver, directly and through a tier of proxies: the
//!   apiserver's watches, CPU, memory, events and bytes sent, and the
//!   relist storm after its restart (`docs/tier.md`).
//! - `agents`: N simulated nodes' agents (kubelet, kube-proxy, a CNI,
//!   a log and a metrics agent, each its own identity and connection)
//!   against a real kube-apiserver: directly, through node proxies, and
//!   through node proxies and a tier; what the apiserver pays, and how
//!   fast a Service change reaches every agent (`docs/performance.md`).
//! - `--self-test`: all of the above, small, against `--sim`.
//!
//! Targets: a kubeconfig's server, `--sim` (the simulated apiserver and
//! the proxy, on 127.0.0.1) or `--real` (a real kube-apiserver from
//! `../shared/k8s/` and the proxy).
//!
//! `docs/performance.md` has the commands and figures.
//!
//! Each subcommand is a module of its own; `common` holds what they share
//! (targets, watchers, writers, concurrent clients and their figures).

mod agents;
mod authz;
mod chart;
mod client;
mod common;
mod compare;
mod env;
mod fixtures;
mod freshness;
mod get;
mod hollow;
mod idle;
mod ingest;
mod list;
mod memory;
mod metrics;
mod pprof;
mod real;
mod scale;
mod self_test;
mod stats;
mod tier;
mod watch;

use anyhow::anyhow;
use clap::{Parser, Subcommand};

use real::Skip;

/// Load and latency measurements for kube-cache-proxy.
#[derive(Debug, Parser)]
#[command(name = "kcp-load", about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Run every measurement, small, against the simulated apiserver and
    /// an in-process proxy; exit non-zero on any error.
    #[arg(long)]
    self_test: bool,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Watchers and writers: delivery latency and events/s.
    Watch(watch::WatchArgs),
    /// List requests: latency and MB/s.
    List(list::ListArgs),
    /// Sequential GETs: request latency.
    Get(get::GetArgs),
    /// Idle watches: the proxy's memory per watcher.
    Idle(idle::IdleArgs),
    /// Objects ingested into a cache State: memory per object.
    Ingest(ingest::IngestArgs),
    /// Cached reads by new identities: latency with a cold and a warm
    /// authorization decision (--sim only).
    Authz(authz::AuthzArgs),
    /// A hollow kubelet (kubemark) through the proxy in front of a real
    /// kube-apiserver (kube-testenv), in protobuf or JSON: its CPU.
    Kubelet(hollow::KubeletArgs),
    /// The proxy and a real kube-apiserver side by side in one run, quiet
    /// and busy: lists, streaming lists, watch delivery, memory.
    Compare(compare::CompareArgs),
    /// The proxy's resident memory per cached pod as a new user measures
    /// it: pods created in a real kube-apiserver, then the proxy started
    /// and listing them, against the same proxy caching none.
    Memory(memory::MemoryArgs),
    /// Simulated nodes' watch sets against a real kube-apiserver, directly
    /// and through a tier of proxies: its watches, CPU, memory, events and
    /// bytes sent, and the relist storm after its restart.
    Tier(tier::TierArgs),
    /// Simulated nodes' agents (kubelet, kube-proxy, CNI, log, metrics)
    /// against a real kube-apiserver, directly, through node proxies and
    /// through node proxies and a tier: what the apiserver pays, and how
    /// fast a Service change reaches every agent.
    Agents(agents::AgentsArgs),
    /// How long consistent reads of a quiet resource in a busy cluster
    /// wait for the cache to be shown fresh: progress watches one per
    /// wait, then rolling, and the apiserver itself.
    Freshness(freshness::FreshnessArgs),
    /// SIG Scalability's measures (pod startup, API call latency) and the
    /// control plane's cost on hollow nodes with a real scheduler and
    /// controller-manager: direct, through node proxies, and through a
    /// tier; then a mass restart.
    Scale(scale::ScaleArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    println!("$ {}", command_line());
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        println!(
            "load average: {}",
            load.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kcp-load: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match (cli.command, cli.self_test) {
            (_, true) => self_test::self_test().await,
            (Some(Cmd::Watch(a)), _) => watch::watch(&a).await.map(|_| ()),
            (Some(Cmd::List(a)), _) => list::list(&a).await,
            (Some(Cmd::Get(a)), _) => get::get(&a).await,
            (Some(Cmd::Idle(a)), _) => idle::idle(&a).await.map(|_| ()),
            (Some(Cmd::Ingest(a)), _) => ingest::ingest(&a).map(|_| ()),
            (Some(Cmd::Authz(a)), _) => authz::authz(&a).await.map(|_| ()),
            (Some(Cmd::Kubelet(a)), _) => hollow::kubelet(&a).await,
            (Some(Cmd::Tier(a)), _) => tier::tier(&a).await.map(|_| ()),
            (Some(Cmd::Agents(a)), _) => agents::agents(&a).await,
            (Some(Cmd::Compare(a)), _) => compare::compare(&a).await,
            (Some(Cmd::Memory(a)), _) => memory::memory(&a).await,
            (Some(Cmd::Freshness(a)), _) => freshness::freshness(&a).await,
            (Some(Cmd::Scale(a)), _) => scale::scale(&a).await,
            (None, false) => Err(anyhow!(
                "a subcommand or --self-test is required (see --help)"
            )),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<Skip>().is_some() => {
            println!("kcp-load: skipped: {e}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kcp-load: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// This invocation, quoted for a shell.
fn command_line() -> String {
    std::env::args()
        .enumerate()
        .map(|(i, a)| {
            let a = if i == 0 { "kcp-load".to_string() } else { a };
            if a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
