//! `list`: list requests through the proxy and directly
//! (`common::plan`), and the timed sequential lists of `watch --lists`.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use http::{Method, StatusCode};
use http_body_util::BodyExt;

use crate::client::{Proto, Target};
use crate::common::plan::{Compared, LoadArgs, Plan};
use crate::common::target::{Env, TargetArgs, resolve};
use crate::stats::{Summary, mib, micros};

#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// List requests per client, one after another.
    #[arg(long, default_value_t = 20)]
    pub requests: usize,
    /// Requests per client before measuring.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Path and query of the list (repeatable: each is measured in turn).
    #[arg(long = "path", default_value = "/api/v1/pods?resourceVersion=0")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub load: LoadArgs,
}

pub async fn list(a: &ListArgs) -> Result<()> {
    let (target, env) = resolve(&a.target).await?;
    let result = list_on(&target, env.as_ref(), a).await;
    if let Some(env) = env {
        env.stop().await;
    }
    result.map(|_| ())
}

pub async fn list_on(target: &Target, env: Option<&Env>, a: &ListArgs) -> Result<Vec<Compared>> {
    let plan = Plan::new(target, env, &a.target, &a.load).await?;
    plan.run(&a.paths, a.requests, a.warmup).await
}

/// Times `n` sequential lists of `path` on one connection.
pub async fn list_run(target: &Target, proto: Proto, path: &str, n: usize) -> Result<u64> {
    #[derive(serde::Deserialize)]
    struct Items {
        items: Vec<serde::de::IgnoredAny>,
    }
    let mut conn = target.connect(proto).await?;
    let mut total = Vec::with_capacity(n);
    let mut first_byte = Vec::with_capacity(n);
    let mut bytes = 0u64;
    let mut busy = Duration::ZERO;
    let mut items = 0;
    for i in 0..n {
        let req = target.request(&conn, Method::GET, path, None)?;
        let start = Instant::now();
        let resp = conn.send(req).await?;
        let status = resp.status();
        let mut body = resp.into_body();
        let mut len = 0u64;
        let mut first = None;
        let mut keep = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.context("reading the list")?.into_data() {
                first.get_or_insert_with(|| start.elapsed());
                len += data.len() as u64;
                if i == 0 {
                    keep.extend_from_slice(&data);
                }
            }
        }
        let took = start.elapsed();
        if status != StatusCode::OK {
            bail!("GET {path}: {status}");
        }
        if i == 0 {
            items = match protobuf_items(&keep) {
                Some(n) => n,
                None => serde_json::from_slice::<Items>(&keep)
                    .map(|l| l.items.len())
                    .unwrap_or(0),
            };
        }
        busy += took;
        bytes += len;
        total.push(micros(took));
        first_byte.push(micros(first.unwrap_or(took)));
    }
    let per = bytes / n.max(1) as u64;
    println!(
        "list: GET {path} x{n}: {items} items, {} per response",
        mib(per)
    );
    if items > 0 {
        println!(
            "bytes per listed object: {:.0} (response / items)",
            per as f64 / items as f64
        );
    }
    println!("list latency: {}", Summary::of(&mut total));
    println!("list time to first byte: {}", Summary::of(&mut first_byte));
    println!(
        "list throughput: {:.1} MiB/s ({:.1} lists/s)",
        bytes as f64 / busy.as_secs_f64() / (1024.0 * 1024.0),
        n as f64 / busy.as_secs_f64()
    );
    Ok(bytes)
}

/// The items of a protobuf list (`k8s\0`, a `runtime.Unknown` whose
/// `raw` (field 2) is the list: `metadata` field 1, `items` field 2), or
/// `None` when `body` is not protobuf.
fn protobuf_items(body: &[u8]) -> Option<usize> {
    use apimachinery::protobuf::{fields, find_field};
    let unknown = body.strip_prefix(b"k8s\0")?;
    let type_meta = &unknown[find_field(unknown, 1)?];
    let raw = &unknown[find_field(unknown, 2)?];
    // meta.k8s.io/v1beta1's PartialObjectMetadataList has its items at 1.
    let v1beta1 = type_meta.windows(7).any(|w| w == b"v1beta1")
        && type_meta
            .windows(25)
            .any(|w| w == b"PartialObjectMetadataList");
    let items = if v1beta1 { 1 } else { 2 };
    Some(fields(raw)?.iter().filter(|(n, _, _)| *n == items).count())
}
