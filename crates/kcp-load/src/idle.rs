//! `idle`: idle watches opened in steps, and the proxy's resident memory
//! after each (`/proc/<pid>/status`): its memory per watch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::client::Target;
use crate::common::target::{Env, TargetArgs, list_rv, resolve};
use crate::common::watchers::{Counters, open_watchers, wait_started};
use crate::fixtures;
use crate::stats::{self, mib};

#[derive(Debug, Clone, Args)]
pub struct IdleArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Idle watches.
    #[arg(long, default_value_t = 5000)]
    pub watchers: usize,
    /// Watch streams per HTTP/2 connection (the proxy allows 1000).
    #[arg(long, default_value_t = 500)]
    pub watchers_per_conn: usize,
    /// Watch path; `{i}` is the watcher's number, `{node}` a node name
    /// (node-00000...), `{rv}` the resourceVersion of a list of --rv-path.
    #[arg(
        long,
        default_value = "/api/v1/pods?watch=1&allowWatchBookmarks=true&fieldSelector=spec.nodeName%3D{node}&resourceVersion={rv}&timeoutSeconds=3600"
    )]
    pub path: String,
    /// List whose resourceVersion replaces `{rv}`.
    #[arg(long, default_value = "/api/v1/pods?limit=1")]
    pub rv_path: String,
    /// Process whose memory to measure (default with --sim --proxy-bin: the
    /// proxy).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Steps in which the watches are opened (memory is read after each).
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Seconds to hold the watches open after the last step.
    #[arg(long, default_value_t = 5)]
    pub hold: u64,
}

/// Per-watcher memory measured by `idle`.
#[derive(Debug, Default)]
pub struct IdleReport {
    pub per_watcher: f64,
    pub errors: usize,
}

pub async fn idle(a: &IdleArgs) -> Result<IdleReport> {
    let (target, env) = resolve(&a.target).await?;
    let result = idle_on(&target, env.as_ref(), a).await;
    if let Some(env) = env {
        env.stop().await;
    }
    result
}

pub async fn idle_on(target: &Target, env: Option<&Env>, a: &IdleArgs) -> Result<IdleReport> {
    let proto = a.target.proto;
    let pid = match (a.pid, env) {
        (Some(p), _) => p,
        (None, Some(env)) => {
            if !env.proxy_is_separate() {
                println!(
                    "idle: the proxy runs in this process, with the sim and the clients: give --proxy-bin to measure it alone"
                );
            }
            env.proxy_pid()
        }
        (None, None) => bail!("--pid (the proxy's process id) is required without --sim"),
    };
    let rv = list_rv(target, proto, &a.rv_path).await?;
    let template = a.path.replace("{rv}", &rv);
    let path = |i: usize| {
        template
            .replace("{i}", &i.to_string())
            .replace("{node}", &fixtures::node(i))
    };
    println!("idle: {} watches of {}", a.watchers, path(0));
    let settle = || tokio::time::sleep(Duration::from_secs(2));
    let stop = CancellationToken::new();
    let counters = Arc::new(Counters {
        started: AtomicUsize::new(0),
        delivered: AtomicU64::new(0),
    });
    settle().await;
    let base = stats::rss_of(pid).ok_or_else(|| anyhow!("cannot read /proc/{pid}/status"))?;
    println!("idle: pid {pid} RSS {} with no watches", mib(base));
    let steps = a.steps.max(1);
    let mut tasks = Vec::new();
    let mut opened = 0;
    let mut points = vec![(0usize, base)];
    for s in 0..steps {
        let upto = a.watchers * (s + 1) / steps;
        let n = upto - opened;
        tasks.extend(
            open_watchers(
                target,
                proto,
                n,
                a.watchers_per_conn,
                opened,
                &path,
                &stop,
                &counters,
            )
            .await?,
        );
        opened = upto;
        wait_started(&counters, opened, Duration::from_secs(120)).await?;
        settle().await;
        let rss = stats::rss_of(pid).unwrap_or(0);
        println!(
            "idle: {opened:>6} watches: RSS {} (+{} since none, {:.0} B per watch)",
            mib(rss),
            mib(rss.saturating_sub(base)),
            rss.saturating_sub(base) as f64 / opened as f64
        );
        points.push((opened, rss));
    }
    tokio::time::sleep(Duration::from_secs(a.hold)).await;
    let held = stats::rss_of(pid).unwrap_or(0);
    let errors_so_far = tasks.iter().filter(|t| t.is_finished()).count();
    println!(
        "idle: after {}s: RSS {}; {} watches ended early",
        a.hold,
        mib(held),
        errors_so_far
    );
    stop.cancel();
    let mut errors = 0;
    let mut last = None;
    for t in tasks {
        if let Some(e) = t.await?.error {
            errors += 1;
            last = Some(e);
        }
    }
    let per_watcher = held.saturating_sub(base) as f64 / a.watchers.max(1) as f64;
    // The slope over the second half excludes what the first watches pay
    // once (connections, allocator arenas, index maps growing).
    let (n0, r0) = points[points.len() / 2];
    let (n1, r1) = points[points.len() - 1];
    let marginal = if n1 > n0 {
        r1.saturating_sub(r0) as f64 / (n1 - n0) as f64
    } else {
        per_watcher
    };
    println!("--- results");
    println!(
        "idle: {} watches ({} per HTTP/2 connection): {:.0} B ({:.2} KiB) per watch on average, {:.0} B ({:.2} KiB) marginal ({n0}..{n1})",
        a.watchers,
        a.watchers_per_conn,
        per_watcher,
        per_watcher / 1024.0,
        marginal,
        marginal / 1024.0
    );
    println!("idle: watch errors: {errors}");
    if let Some(e) = last {
        println!("idle: last error: {e}");
    }
    Ok(IdleReport {
        per_watcher,
        errors,
    })
}
