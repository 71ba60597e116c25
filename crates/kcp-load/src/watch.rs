//! `watch`: watchers and writers on one resource in one namespace; the
//! events delivered, their delivery latency and the CPU spent, then
//! optionally timed lists.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use http::Method;
use tokio_util::sync::CancellationToken;

use crate::client::Target;
use crate::common::target::{Env, TargetArgs, encode_query, list_rv, resolve};
use crate::common::watchers::{Counters, open_watchers, wait_started};
use crate::common::writers::{MANAGED_BY, WriteOut, WriterPlan, writer};
use crate::list::list_run;
use crate::stats::{self, Summary, mib};

#[derive(Debug, Clone, Args)]
pub struct ResourceArgs {
    /// Namespace of the written and watched objects.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// API group of the resource (empty: core).
    #[arg(long, default_value = "")]
    pub group: String,
    /// API version of the resource.
    #[arg(long, default_value = "v1")]
    pub version: String,
    /// Resource (plural).
    #[arg(long, default_value = "configmaps")]
    pub resource: String,
    /// Kind of the resource; derived for configmaps and secrets.
    #[arg(long)]
    pub kind: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub resource: ResourceArgs,
    /// Watchers.
    #[arg(long, default_value_t = 100)]
    pub watchers: usize,
    /// Watch streams per HTTP/2 connection (HTTP/1.1: one per connection).
    #[arg(long, default_value_t = 100)]
    pub watchers_per_conn: usize,
    /// Writers, each on its own connection.
    #[arg(long, default_value_t = 1)]
    pub writers: usize,
    /// Writes per second, all writers together.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Seconds of writing.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Objects each writer cycles through.
    #[arg(long, default_value_t = 1)]
    pub objects_per_writer: usize,
    /// Size of the `payload` data entry of written configmaps and secrets.
    #[arg(long, default_value_t = 256)]
    pub payload_bytes: usize,
    /// Most seconds to wait, after the last write, for watchers to receive
    /// every event.
    #[arg(long, default_value_t = 10)]
    pub drain: u64,
    /// List requests to time after the watch phase.
    #[arg(long, default_value_t = 0)]
    pub lists: usize,
    /// Path of those list requests.
    #[arg(long, default_value = "/api/v1/pods?resourceVersion=0")]
    pub list_path: String,
    /// Leave the written objects in place.
    #[arg(long)]
    pub keep: bool,
}

/// What a watch run measured.
#[derive(Debug, Default)]
pub struct WatchReport {
    pub writes: u64,
    pub delivered: u64,
    pub expected: u64,
    pub errors: u64,
}

pub async fn watch(a: &WatchArgs) -> Result<WatchReport> {
    let (target, env) = resolve(&a.target).await?;
    let report = watch_on(&target, env.as_ref(), a).await;
    if let Some(env) = env {
        env.stop().await;
    }
    report
}

pub async fn watch_on(target: &Target, env: Option<&Env>, a: &WatchArgs) -> Result<WatchReport> {
    let proto = a.target.proto;
    let r = &a.resource;
    let kind = kind_of(r)?;
    let api_version = if r.group.is_empty() {
        r.version.clone()
    } else {
        format!("{}/{}", r.group, r.version)
    };
    let coll = collection(r);
    let selector = encode_query(MANAGED_BY);
    let rv = list_rv(
        target,
        proto,
        &format!("{coll}?limit=1&labelSelector={selector}"),
    )
    .await?;
    let watch_path = format!(
        "{coll}?watch=1&allowWatchBookmarks=true&resourceVersion={rv}&labelSelector={selector}&timeoutSeconds=3600"
    );
    println!(
        "watch: {} watchers ({:?}, {} per connection) on {watch_path}",
        a.watchers, proto, a.watchers_per_conn
    );
    let stop = CancellationToken::new();
    let counters = Arc::new(Counters {
        started: AtomicUsize::new(0),
        delivered: AtomicU64::new(0),
    });
    let opened = Instant::now();
    let watchers = open_watchers(
        target,
        proto,
        a.watchers,
        a.watchers_per_conn,
        0,
        |_| watch_path.clone(),
        &stop,
        &counters,
    )
    .await?;
    wait_started(&counters, a.watchers, Duration::from_secs(120)).await?;
    println!(
        "watch: {} watches open in {:.2}s",
        a.watchers,
        opened.elapsed().as_secs_f64()
    );

    let pid = env.filter(|e| e.proxy_is_separate()).map(Env::proxy_pid);
    let cpu0 = pid.and_then(stats::cpu_of);
    let self_cpu0 = stats::cpu_of(std::process::id());
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let per_writer = a.rate / a.writers.max(1) as f64;
    let interval = Duration::from_secs_f64(1.0 / per_writer.max(0.001));
    let payload = "A".repeat(a.payload_bytes / 4 * 4);
    let start = Instant::now();
    let end = start + Duration::from_secs(a.duration);
    println!(
        "write: {} writers, {:.1} writes/s in all, for {}s, {} objects each ({kind} {}, payload {} B)",
        a.writers,
        a.rate,
        a.duration,
        a.objects_per_writer,
        coll,
        payload.len()
    );
    let mut names_all = Vec::new();
    let writers: Vec<_> = (0..a.writers)
        .map(|w| {
            let names: Vec<String> = (0..a.objects_per_writer.max(1))
                .map(|k| format!("kcp-load-{run_id}-w{w}-{k}"))
                .collect();
            names_all.extend(names.iter().cloned());
            tokio::spawn(writer(
                target.clone(),
                proto,
                WriterPlan {
                    kind: kind.clone(),
                    api_version: api_version.clone(),
                    namespace: r.namespace.clone(),
                    collection: coll.clone(),
                    names,
                    payload: payload.clone(),
                    interval,
                    end,
                    stop: CancellationToken::new(),
                },
            ))
        })
        .collect();
    let mut writes = WriteOut::default();
    for w in writers {
        let o = w.await?;
        writes.ok += o.ok;
        writes.errors += o.errors;
        if o.last_error.is_some() {
            writes.last_error = o.last_error;
        }
        writes.latencies.extend(o.latencies);
    }
    let write_secs = start.elapsed().as_secs_f64();
    let expected = writes.ok * a.watchers as u64;
    let drain_deadline = Instant::now() + Duration::from_secs(a.drain);
    while counters.delivered.load(Ordering::Relaxed) < expected && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let all_secs = start.elapsed().as_secs_f64();
    let cpu1 = pid.and_then(stats::cpu_of);
    let self_cpu1 = stats::cpu_of(std::process::id());
    stop.cancel();
    let mut latencies = Vec::new();
    let mut watch_errors = 0u64;
    let mut last_watch_error = None;
    let mut other = 0;
    let mut bytes = 0;
    // Per event: when the first and the last watcher got it.
    let mut per_event: std::collections::HashMap<u64, (u32, u32)> = Default::default();
    for w in watchers {
        let o = w.await?;
        for (sent, lat) in o.sent.iter().zip(&o.latencies) {
            let e = per_event.entry(*sent).or_insert((u32::MAX, 0));
            e.0 = e.0.min(*lat);
            e.1 = e.1.max(*lat);
        }
        latencies.extend(o.latencies);
        other += o.other;
        bytes += o.bytes;
        if let Some(e) = o.error {
            watch_errors += 1;
            last_watch_error = Some(e);
        }
    }
    let delivered = latencies.len() as u64;
    let summary = Summary::of(&mut latencies);
    let write_summary = Summary::of(&mut writes.latencies);
    println!("--- results");
    println!(
        "writes: {} ok ({:.1}/s), {} errors; write latency {}",
        writes.ok,
        writes.ok as f64 / write_secs,
        writes.errors,
        write_summary
    );
    if let Some(e) = &writes.last_error {
        println!("writes: last error: {e}");
    }
    println!(
        "delivered: {delivered} of {expected} events ({:.1}%), {:.0} events/s over the {:.1}s of writing ({:.0}/s until the last arrived, {:.1}s), {} other frames, {} received",
        if expected > 0 {
            delivered as f64 * 100.0 / expected as f64
        } else {
            100.0
        },
        delivered as f64 / write_secs,
        write_secs,
        delivered as f64 / all_secs,
        all_secs,
        other,
        mib(bytes)
    );
    if delivered > 0 {
        println!(
            "bytes per delivered event: {:.0} (all frames received / events)",
            bytes as f64 / delivered as f64
        );
    }
    println!("delivery latency: {summary}");
    let (mut first, mut last): (Vec<u32>, Vec<u32>) = per_event.values().copied().unzip();
    println!(
        "delivery latency, first watcher per event: {}",
        Summary::of(&mut first)
    );
    println!(
        "delivery latency, last watcher per event (all have it): {}",
        Summary::of(&mut last)
    );
    println!("watch errors: {watch_errors}");
    if let Some(e) = &last_watch_error {
        println!("watch errors: last: {e}");
    }
    if let (Some(c0), Some(c1)) = (cpu0, cpu1) {
        println!(
            "proxy CPU: {:.2} cores on average over {:.1}s",
            (c1 - c0).as_secs_f64() / all_secs,
            all_secs
        );
    }
    if let (Some(c0), Some(c1)) = (self_cpu0, self_cpu1) {
        println!(
            "kcp-load{} CPU: {:.2} cores on average",
            if env.is_some() { " (with the sim)" } else { "" },
            (c1 - c0).as_secs_f64() / all_secs
        );
    }

    if a.lists > 0 {
        list_run(target, proto, &a.list_path, a.lists).await?;
    }
    if !a.keep {
        let mut conn = target.connect(proto).await?;
        for name in &names_all {
            let _ = target
                .fetch(&mut conn, Method::DELETE, &format!("{coll}/{name}"), None)
                .await;
        }
    }
    Ok(WatchReport {
        writes: writes.ok,
        delivered,
        expected,
        errors: writes.errors + watch_errors,
    })
}

/// The collection path of a namespaced resource.
fn collection(r: &ResourceArgs) -> String {
    if r.resource == "nodes" {
        return "/api/v1/nodes".into();
    }
    if r.group.is_empty() {
        format!(
            "/api/{}/namespaces/{}/{}",
            r.version, r.namespace, r.resource
        )
    } else {
        format!(
            "/apis/{}/{}/namespaces/{}/{}",
            r.group, r.version, r.namespace, r.resource
        )
    }
}

fn kind_of(r: &ResourceArgs) -> Result<String> {
    match (&r.kind, r.resource.as_str()) {
        (Some(k), _) => Ok(k.clone()),
        (None, "configmaps") => Ok("ConfigMap".into()),
        (None, "secrets") => Ok("Secret".into()),
        (None, other) => bail!("--kind is required for resource {other}"),
    }
}
