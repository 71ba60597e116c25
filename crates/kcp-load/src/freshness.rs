//! `freshness`: how long a consistent read of a quiet resource in a busy
//! cluster waits for the proxy's cache to be shown fresh, with progress
//! watches one per wait (`progressWatchRollSeconds: 0`, as before) and
//! rolling (`--roll`), side by side with the apiserver itself.
//!
//! One control plane (`kube-testenv`, `../shared/k8s/`) with Lease writers
//! at `--busy` writes/s (node heartbeats: every write moves etcd's
//! revision, which a consistent read must reach, while the proxy's
//! configmaps cache learns of it only from bookmarks). For each setting a
//! fresh proxy (its own process) serves `--reads` reads of one namespace's
//! configmaps, one after another, separated by random gaps of 0 to
//! `--max-gap-ms` (so that they fall at every phase of the apiserver's
//! bookmark ticks): a streaming list (`sendInitialEvents=true`, timed to
//! its `initial-events-end`, what an informer starts with), and a
//! consistent LIST (the proxy with `consistentListWaitMilliseconds: 3000`,
//! so that it waits rather than passing through), and a streaming list of
//! one configmap (`fieldSelector=metadata.name=`, what kubelet starts for
//! each Secret and ConfigMap a new pod mounts, giving it 1 s to sync:
//! `pkg/kubelet/util/manager/watch_based_manager.go`). The same reads go
//! directly to the apiserver for reference. Printed: the latency
//! distribution of each, the proxy's progress watches per read, and how
//! many reads were served from the cache.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use http::Method;
use kube_testenv::{AssetsError, ControlPlane, Options};
use tokio_util::sync::CancellationToken;

use crate::client::{Proto, Target};
use crate::compare::{initial_events_end, lease_writers};
use crate::env::{RunningProxy, Tuning, temp_dir};
use crate::metrics;
use crate::real::Skip;
use crate::stats::{Summary, micros, ms};

#[derive(Debug, Clone, clap::Args)]
pub struct FreshnessArgs {
    /// The proxy binary, run as its own process.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "target/release/kube-cache-proxy"
    )]
    proxy_bin: std::path::PathBuf,
    /// Lease writes per second straight to the apiserver.
    #[arg(long, default_value_t = 50.0)]
    busy: f64,
    /// Reads per kind and setting.
    #[arg(long, default_value_t = 100)]
    reads: usize,
    /// Longest random gap between two reads, milliseconds.
    #[arg(long, default_value_t = 1500)]
    max_gap_ms: u64,
    /// The rolling setting measured after `progressWatchRollSeconds: 0`.
    #[arg(long, default_value_t = 10)]
    roll: u64,
}

const NAMESPACE: &str = "kcp-freshness";

pub async fn freshness(a: &FreshnessArgs) -> Result<()> {
    let cp = match ControlPlane::start(Options::default()).await {
        Ok(cp) => cp,
        Err(kube_testenv::Error::Assets(e @ AssetsError::Absent { .. })) => {
            return Err(Skip(format!("freshness: {e}")).into());
        }
        Err(e) => bail!("starting the control plane: {e}"),
    };
    println!("apiserver: {}", cp.url());
    let result = run(a, &cp).await;
    let cp_dir = cp.dir().to_path_buf();
    drop(cp);
    let _ = std::fs::remove_dir_all(cp_dir);
    result
}

async fn run(a: &FreshnessArgs, cp: &ControlPlane) -> Result<()> {
    let direct = Target::from_kubeconfig(Some(cp.admin_kubeconfig()), None).await?;
    seed(&direct).await?;
    let stop = CancellationToken::new();
    let leases = lease_writers(&direct, a.busy, &stop);
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut rows = Vec::new();
    let direct_stream = streaming(&direct, a, None).await?;
    let direct_list = lists(&direct, a, None).await?;
    let direct_one = one_object(&direct, a, None).await?;
    rows.push(("direct", direct_stream, direct_list, direct_one));
    for roll in [0, a.roll] {
        let dir = temp_dir()?;
        let proxy = RunningProxy::start(
            &dir,
            &cp.ca_pem(),
            &cp.kubeconfig_text(&cp.url(), "admin", cp.admin()),
            Tuning {
                consistent_list_wait_ms: Some(3000),
                progress_roll_seconds: Some(roll),
                ..Tuning::default()
            },
            Some(&a.proxy_bin),
        )
        .await?;
        let measured = async {
            proxy.ready(Duration::from_secs(120)).await?;
            let kubeconfig = dir.join("proxy.kubeconfig");
            std::fs::write(
                &kubeconfig,
                proxy.kubeconfig("admin", &cp.admin().cert_pem, &cp.admin().key_pem),
            )?;
            let through = Target::from_kubeconfig(Some(&kubeconfig), None).await?;
            let s = streaming(&through, a, Some(&proxy)).await?;
            let l = lists(&through, a, Some(&proxy)).await?;
            let o = one_object(&through, a, Some(&proxy)).await?;
            anyhow::Ok((s, l, o))
        }
        .await;
        proxy.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
        let (s, l, o) = measured?;
        rows.push((
            if roll == 0 {
                "proxy, one progress watch per wait (progressWatchRollSeconds: 0)"
            } else {
                "proxy, rolling progress watches"
            },
            s,
            l,
            o,
        ));
    }
    stop.cancel();
    for h in leases {
        h.await?;
    }

    println!("--- table");
    println!(
        "| side | read | p50 | p90 | p99 | max | over 1 s | served from the cache | progress watches per read |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (side, s, l, o) in rows {
        for (what, m) in [
            ("streaming list", s),
            ("consistent LIST", l),
            ("streaming list of one object", o),
        ] {
            println!(
                "| {side} | {what} | {} | {} | {} | {} | {:.0} % | {} | {} |",
                ms(m.lat.p50),
                ms(m.lat.p90),
                ms(m.lat.p99),
                ms(m.lat.max),
                m.over_1s * 100.0,
                m.from_cache
                    .map_or("—".into(), |v| format!("{:.0} %", v * 100.0)),
                m.progress.map_or("—".into(), |v| format!("{v:.2}")),
            );
        }
    }
    Ok(())
}

/// What one kind of read measured.
struct Measured {
    lat: Summary,
    /// Share of the reads that took over 1 s (kubelet's sync limit for a
    /// per-object watch).
    over_1s: f64,
    /// Share of the reads the proxy served from its cache.
    from_cache: Option<f64>,
    progress: Option<f64>,
}

/// A namespace with a few configmaps, never written again.
async fn seed(direct: &Target) -> Result<()> {
    let mut conn = direct.connect(Proto::H2).await?;
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    direct
        .fetch(
            &mut conn,
            Method::POST,
            "/api/v1/namespaces",
            Some(ns.to_string().into()),
        )
        .await?;
    for i in 0..10 {
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("cm-{i}"), "namespace": NAMESPACE},
            "data": {"k": "v"}});
        let r = direct
            .fetch(
                &mut conn,
                Method::POST,
                &format!("/api/v1/namespaces/{NAMESPACE}/configmaps"),
                Some(cm.to_string().into()),
            )
            .await?;
        if !r.status.is_success() {
            bail!("creating a configmap: {}", r.status);
        }
    }
    Ok(())
}

/// Counters of the proxy: configmap reads served from the cache and
/// progress watches opened.
async fn counters(proxy: Option<&RunningProxy>) -> Option<(f64, f64)> {
    let (200, text) = proxy?.admin_get("/metrics").await.ok()? else {
        return None;
    };
    let samples = metrics::parse(&text);
    let sum = |name: &str, filter: &dyn Fn(&metrics::Sample) -> bool| -> f64 {
        samples
            .iter()
            .filter(|s| s.name == name && s.label("resource") == "configmaps" && filter(s))
            .map(|s| s.value)
            .sum()
    };
    Some((
        sum("kube_cache_proxy_cache_reads_total", &|s| {
            s.label("source") == "cache"
        }),
        sum("kube_cache_proxy_cache_progress_watches_total", &|_| true),
    ))
}

async fn measure<F, Fut>(
    a: &FreshnessArgs,
    proxy: Option<&RunningProxy>,
    mut read: F,
) -> Result<Measured>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Duration>>,
{
    // One read first, so that the proxy's cache and connection are warm.
    read().await?;
    let before = counters(proxy).await;
    let mut latencies = Vec::with_capacity(a.reads);
    for _ in 0..a.reads {
        let gap = fastrand::u64(0..=a.max_gap_ms);
        tokio::time::sleep(Duration::from_millis(gap)).await;
        latencies.push(micros(read().await?));
    }
    let after = counters(proxy).await;
    let n = a.reads.max(1) as f64;
    let growth = before.zip(after);
    let over_1s = latencies.iter().filter(|&&l| l > 1_000_000).count() as f64 / n;
    Ok(Measured {
        over_1s,
        lat: Summary::of(&mut latencies),
        from_cache: growth.map(|(b, a)| (a.0 - b.0) / n),
        progress: growth.map(|(b, a)| (a.1 - b.1) / n),
    })
}

async fn streaming(
    t: &Target,
    a: &FreshnessArgs,
    proxy: Option<&RunningProxy>,
) -> Result<Measured> {
    let path = format!(
        "/api/v1/namespaces/{NAMESPACE}/configmaps?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=60"
    );
    let m = measure(a, proxy, || {
        let (t, path) = (t.clone(), path.clone());
        async move {
            let mut conn = t.connect(Proto::H2).await?;
            initial_events_end(&t, &mut conn, &path).await
        }
    })
    .await?;
    println!("streaming list: {}", m.lat);
    Ok(m)
}

/// kubelet's watch of one object: a streaming list of one configmap, timed
/// to its `initial-events-end`.
async fn one_object(
    t: &Target,
    a: &FreshnessArgs,
    proxy: Option<&RunningProxy>,
) -> Result<Measured> {
    let m = measure(a, proxy, || {
        let t = t.clone();
        let path = format!(
            "/api/v1/namespaces/{NAMESPACE}/configmaps?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=60&fieldSelector=metadata.name%3Dcm-{}",
            fastrand::usize(0..10)
        );
        async move {
            let mut conn = t.connect(Proto::H2).await?;
            initial_events_end(&t, &mut conn, &path).await
        }
    })
    .await?;
    println!("streaming list of one object: {}", m.lat);
    Ok(m)
}

async fn lists(t: &Target, a: &FreshnessArgs, proxy: Option<&RunningProxy>) -> Result<Measured> {
    let path = format!("/api/v1/namespaces/{NAMESPACE}/configmaps");
    let m = measure(a, proxy, || {
        let (t, path) = (t.clone(), path.clone());
        async move {
            let mut conn = t.connect(Proto::H2).await?;
            let start = Instant::now();
            let r = t.fetch(&mut conn, Method::GET, &path, None).await?;
            if !r.status.is_success() {
                bail!("{path}: {}", r.status);
            }
            Ok(start.elapsed())
        }
    })
    .await?;
    println!("consistent list: {}", m.lat);
    Ok(m)
}
