//! `memory`: the proxy's resident memory per cached pod, measured as a
//! new user measures it (issue 59, deliverable 6): a real kube-apiserver
//! v1.36 (`kube-testenv`, `../shared/k8s/`) with `--pods` pods created
//! first, then the release proxy started as its own process and listing
//! them. Its RSS (`/proc/<pid>/status`) with the pods cached, less the RSS
//! of the same binary and configuration caching none (the pods left out of
//! its caches, started the same way and read at the same times), divided
//! by the pods' JSON as the apiserver serves each. Read `--settle` seconds
//! after the pods were cached (3 and 60 by default: what the allocator
//! keeps of the list does not go away by waiting), then 3 s after
//! `--protobuf-lists` protobuf lists of every pod through the proxy (with
//! their client's connection still open, and again 3 s after it closed), for
//! each `--upstream-encoding` (JSON, the binary's default; Protobuf, the
//! shipped node configuration's).
//!
//! `compare` measures the other way in: the proxy already running while
//! the pods are created, so that it caches them one watch event at a time.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use http::Method;
use kube_testenv::{AssetsError, ControlPlane, Options};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::client::{Proto, Target};
use crate::common::target::Encoding;
use crate::compare::wait_cached;
use crate::env::{RunningProxy, Tuning, temp_dir};
use crate::real::{Skip, seed};
use crate::stats;

#[derive(Debug, Clone, clap::Args)]
pub struct MemoryArgs {
    /// The proxy binary, run as its own process.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "target/release/kube-cache-proxy"
    )]
    proxy_bin: PathBuf,
    /// Pods created before the proxy starts.
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// `minimal`: a one-container pod as a new user writes it (about 2.3
    /// KB as served); `fixture`: kcp-load's scheduled pod (about 4.3 KB,
    /// as `compare` creates).
    #[arg(long, value_enum, default_value_t = Shape::Minimal)]
    shape: Shape,
    /// How the proxy reads upstream (repeatable): `json`, the binary's
    /// default, or `protobuf`, the shipped node configuration's.
    #[arg(long = "upstream-encoding", value_enum, default_values_t = [Upstream::Json, Upstream::Protobuf])]
    upstream: Vec<Upstream>,
    /// Seconds after the pods are cached at which the RSS is read
    /// (repeatable).
    #[arg(long = "settle", default_values_t = [3, 60])]
    settle: Vec<u64>,
    /// Protobuf lists of every pod through the proxy, after which the RSS
    /// is read again (3 s after the last).
    #[arg(long, default_value_t = 2)]
    protobuf_lists: usize,
    /// Exit non-zero when any ratio is above this.
    #[arg(long, value_name = "RATIO")]
    max_ratio: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Shape {
    Minimal,
    Fixture,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Upstream {
    Json,
    Protobuf,
}

/// One proxy's resident memory at each settle time, and after the lists:
/// with their client's connection still open, and once it closed.
struct Readings {
    at: Vec<Option<u64>>,
    after_lists: Option<u64>,
    after_close: Option<u64>,
}

pub async fn memory(a: &MemoryArgs) -> Result<()> {
    let started = Instant::now();
    let cp = match ControlPlane::start(Options::default()).await {
        Ok(cp) => cp,
        Err(kube_testenv::Error::Assets(e @ AssetsError::Absent { .. })) => {
            return Err(Skip(format!("memory: {e}")).into());
        }
        Err(e) => bail!("starting the control plane: {e}"),
    };
    println!(
        "apiserver: {} (binaries from {}), ready in {:.1}s",
        cp.url(),
        cp.assets().source,
        started.elapsed().as_secs_f64()
    );
    let result = run(a, &cp).await;
    let cp_dir = cp.dir().to_path_buf();
    drop(cp);
    let _ = std::fs::remove_dir_all(cp_dir);
    result
}

async fn run(a: &MemoryArgs, cp: &ControlPlane) -> Result<()> {
    let direct = Target::from_kubeconfig(Some(cp.admin_kubeconfig()), None).await?;
    let what = match a.shape {
        Shape::Minimal => "minimal-pods",
        Shape::Fixture => "pods",
    };
    seed(&direct, a.pods, what).await?;
    let json_bytes = served_json_bytes(&direct).await?;
    println!(
        "pods: {}, {} of JSON as served ({} B each)",
        a.pods,
        stats::mib(json_bytes),
        json_bytes / a.pods.max(1) as u64
    );
    let mut rows = Vec::new();
    let mut worst: f64 = 0.0;
    for &upstream in &a.upstream {
        let protobuf = upstream == Upstream::Protobuf;
        let none = measure(a, cp, protobuf, false).await?;
        let cached = measure(a, cp, protobuf, true).await?;
        let ratio = |with: Option<u64>, without: Option<u64>| {
            with.zip(without)
                .map(|(w, n)| w.saturating_sub(n) as f64 / json_bytes.max(1) as f64)
        };
        let mut figures = Vec::new();
        for (i, s) in a.settle.iter().enumerate() {
            let r = ratio(cached.at[i], none.at[i]);
            worst = worst.max(r.unwrap_or(f64::INFINITY));
            figures.push((format!("{s} s after the list"), cached.at[i], none.at[i], r));
        }
        if a.protobuf_lists > 0 {
            // Against the baseline's last reading: it served no list.
            let last = none.at.last().copied().flatten();
            for (when, rss) in [
                ("connection open", cached.after_lists),
                ("connection closed", cached.after_close),
            ] {
                let r = ratio(rss, last);
                worst = worst.max(r.unwrap_or(f64::INFINITY));
                figures.push((
                    format!("3 s after {} protobuf lists, {when}", a.protobuf_lists),
                    rss,
                    last,
                    r,
                ));
            }
        }
        for (when, with, without, r) in figures {
            rows.push(format!(
                "| {} | {when} | {} | {} | {} |",
                if protobuf { "Protobuf" } else { "JSON" },
                with.map_or("—".into(), stats::mib),
                without.map_or("—".into(), stats::mib),
                r.map_or("—".into(), |r| format!("{r:.2}×")),
            ));
        }
    }
    println!();
    println!(
        "| upstreamEncoding | when | RSS, pods cached | RSS, caching none | (cached − none) ÷ JSON |"
    );
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    if let Some(max) = a.max_ratio
        && worst > max
    {
        bail!("memory per cached pod {worst:.2}× its JSON, over {max:.2}×");
    }
    Ok(())
}

/// The bytes of every pod's JSON as the apiserver serves it alone (a GET:
/// `kind` and `apiVersion` first, then the list item's fields).
async fn served_json_bytes(direct: &Target) -> Result<u64> {
    #[derive(Deserialize)]
    struct List<'a> {
        #[serde(borrow)]
        items: Vec<&'a RawValue>,
    }
    let mut conn = direct.connect(Proto::H2).await?;
    let r = direct
        .fetch(
            &mut conn,
            Method::GET,
            "/api/v1/pods?resourceVersion=0",
            None,
        )
        .await?;
    let list: List<'_> = serde_json::from_slice(&r.body)?;
    // An item is `{"metadata":...}`; the object `{"kind":"Pod",
    // "apiVersion":"v1","metadata":...}`.
    let type_meta = r#""kind":"Pod","apiVersion":"v1","#.len() as u64;
    Ok(list
        .items
        .iter()
        .map(|i| i.get().len() as u64 + type_meta)
        .sum())
}

/// Starts the proxy caching the pods (`pods`) or not, reads its RSS at
/// each settle time after they are cached (after it is ready, without
/// them), then after the protobuf lists (with them), and stops it.
async fn measure(
    a: &MemoryArgs,
    cp: &ControlPlane,
    protobuf: bool,
    pods: bool,
) -> Result<Readings> {
    let dir = temp_dir()?;
    let proxy = RunningProxy::start(
        &dir,
        &cp.ca_pem(),
        &cp.kubeconfig_text(&cp.url(), "admin", cp.admin()),
        Tuning {
            upstream_protobuf: protobuf,
            uncached: (!pods).then_some("pods"),
            ..Tuning::default()
        },
        Some(&a.proxy_bin),
    )
    .await?;
    let result = readings(a, cp, &proxy, &dir, pods).await;
    proxy.stop().await;
    let _ = std::fs::remove_dir_all(dir);
    result
}

async fn readings(
    a: &MemoryArgs,
    cp: &ControlPlane,
    proxy: &RunningProxy,
    dir: &std::path::Path,
    pods: bool,
) -> Result<Readings> {
    proxy.ready(Duration::from_secs(120)).await?;
    if pods {
        wait_cached(proxy, a.pods, Duration::from_secs(120)).await?;
    }
    let cached = Instant::now();
    let pid = proxy.pid();
    let mut at = Vec::new();
    for s in &a.settle {
        let due = cached + Duration::from_secs(*s);
        tokio::time::sleep_until(due.into()).await;
        at.push(stats::rss_of(pid));
    }
    let (mut after_lists, mut after_close) = (None, None);
    if pods && a.protobuf_lists > 0 {
        let kubeconfig = dir.join("proxy.kubeconfig");
        std::fs::write(
            &kubeconfig,
            proxy.kubeconfig("admin", &cp.admin().cert_pem, &cp.admin().key_pem),
        )?;
        let through = Target::from_kubeconfig(Some(&kubeconfig), None)
            .await?
            .with_accept(Encoding::Protobuf.accept());
        let mut conn = through.connect(Proto::H2).await?;
        for _ in 0..a.protobuf_lists {
            let t = Instant::now();
            let r = through
                .fetch(
                    &mut conn,
                    Method::GET,
                    "/api/v1/pods?resourceVersion=0",
                    None,
                )
                .await?;
            println!(
                "protobuf list through the proxy: {} in {:.0} ms",
                stats::mib(r.body.len() as u64),
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        after_lists = stats::rss_of(pid);
        // What the proxy keeps for an idle client connection that read
        // large lists (its HTTP/2 and TLS buffers) falls out here.
        drop(conn);
        tokio::time::sleep(Duration::from_secs(3)).await;
        after_close = stats::rss_of(pid);
    }
    println!(
        "proxy (pods {}): RSS {:?} at {:?} s, {:?} after the lists, {:?} once their connection closed",
        if pods { "cached" } else { "not cached" },
        at,
        a.settle,
        after_lists,
        after_close
    );
    Ok(Readings {
        at,
        after_lists,
        after_close,
    })
}
