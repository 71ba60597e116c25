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
//! - `tier`: N simulated nodes' upstream watch sets against a real
//!   kube-apiserver, directly and through a tier of proxies: the
//!   apiserver's watches, CPU, memory, events and bytes sent, and the
//!   relist storm after its restart (`docs/tier.md`).
//! - `--self-test`: all of the above, small, against `--sim`.
//!
//! Targets: a kubeconfig's server, `--sim` (the simulated apiserver and
//! the proxy, on 127.0.0.1) or `--real` (a real kube-apiserver from
//! `../shared/k8s/` and the proxy).
//!
//! `docs/performance.md` has the commands and figures.

mod client;
mod compare;
mod env;
mod fixtures;
mod hollow;
mod metrics;
mod real;
mod stats;
mod tier;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use apimachinery::resource::FieldSet;
use bytes::Bytes;
use clap::{Args, Parser, Subcommand, ValueEnum};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use kube_cache_proxy::cache::encode::ProtoCodec;
use kube_cache_proxy::cache::event::EventType;
use kube_cache_proxy::cache::object::CachedObject;
use kube_cache_proxy::cache::store::{Settings, State};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use client::{Conn, Proto, Target};
use env::{RunningProxy, SimArgs, SimEnv};
use metrics::Sample;
use real::{RealArgs, RealEnv, Skip};
use stats::{Summary, mib, micros, unix_nanos};

/// The annotation carrying a write's wall-clock time (Unix nanoseconds).
const SENT_ANNOTATION: &str = "kcp-load/sent-unix-nanos";
/// The label on every object the writers create.
const MANAGED_BY: &str = "app.kubernetes.io/managed-by=kcp-load";

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
    Watch(WatchArgs),
    /// List requests: latency and MB/s.
    List(ListArgs),
    /// Sequential GETs: request latency.
    Get(GetArgs),
    /// Idle watches: the proxy's memory per watcher.
    Idle(IdleArgs),
    /// Objects ingested into a cache State: memory per object.
    Ingest(IngestArgs),
    /// Cached reads by new identities: latency with a cold and a warm
    /// authorization decision (--sim only).
    Authz(AuthzArgs),
    /// A hollow kubelet (kubemark) through the proxy in front of a real
    /// kube-apiserver (kube-testenv), in protobuf or JSON: its CPU.
    Kubelet(hollow::KubeletArgs),
    /// The proxy and a real kube-apiserver side by side in one run, quiet
    /// and busy: lists, streaming lists, watch delivery, memory.
    Compare(compare::CompareArgs),
    /// Simulated nodes' watch sets against a real kube-apiserver, directly
    /// and through a tier of proxies: its watches, CPU, memory, events and
    /// bytes sent, and the relist storm after its restart.
    Tier(tier::TierArgs),
}

#[derive(Debug, Clone, Args)]
struct TargetArgs {
    /// Kubeconfig of the server to load (the proxy, or an apiserver).
    /// Unset, and without --sim: the in-cluster configuration.
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig.
    #[arg(long)]
    context: Option<String>,
    /// HTTP version.
    #[arg(long, value_enum, default_value_t = Proto::H2)]
    proto: Proto,
    /// What reads ask for: `json` (`application/json`), `protobuf`
    /// (`application/vnd.kubernetes.protobuf,application/json`, what
    /// kubelet and kube-proxy send), or `table` (what `kubectl get` sends).
    #[arg(long, value_enum, default_value_t = Encoding::Json)]
    encoding: Encoding,
    #[command(flatten)]
    sim: SimArgs,
    #[command(flatten)]
    real: RealArgs,
}

/// The `--encoding` of reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Encoding {
    Json,
    Protobuf,
    /// A `Table`, as `kubectl get` asks.
    Table,
}

impl Encoding {
    fn accept(self) -> &'static str {
        match self {
            Encoding::Json => "application/json",
            Encoding::Protobuf => "application/vnd.kubernetes.protobuf,application/json",
            Encoding::Table => {
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            }
        }
    }
}

#[derive(Debug, Clone, Args)]
struct ResourceArgs {
    /// Namespace of the written and watched objects.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// API group of the resource (empty: core).
    #[arg(long, default_value = "")]
    group: String,
    /// API version of the resource.
    #[arg(long, default_value = "v1")]
    version: String,
    /// Resource (plural).
    #[arg(long, default_value = "configmaps")]
    resource: String,
    /// Kind of the resource; derived for configmaps and secrets.
    #[arg(long)]
    kind: Option<String>,
}

#[derive(Debug, Clone, Args)]
struct WatchArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    resource: ResourceArgs,
    /// Watchers.
    #[arg(long, default_value_t = 100)]
    watchers: usize,
    /// Watch streams per HTTP/2 connection (HTTP/1.1: one per connection).
    #[arg(long, default_value_t = 100)]
    watchers_per_conn: usize,
    /// Writers, each on its own connection.
    #[arg(long, default_value_t = 1)]
    writers: usize,
    /// Writes per second, all writers together.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Seconds of writing.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Objects each writer cycles through.
    #[arg(long, default_value_t = 1)]
    objects_per_writer: usize,
    /// Size of the `payload` data entry of written configmaps and secrets.
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Most seconds to wait, after the last write, for watchers to receive
    /// every event.
    #[arg(long, default_value_t = 10)]
    drain: u64,
    /// List requests to time after the watch phase.
    #[arg(long, default_value_t = 0)]
    lists: usize,
    /// Path of those list requests.
    #[arg(long, default_value = "/api/v1/pods?resourceVersion=0")]
    list_path: String,
    /// Leave the written objects in place.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Clone, Args)]
struct ListArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// List requests per client, one after another.
    #[arg(long, default_value_t = 20)]
    requests: usize,
    /// Requests per client before measuring.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Path and query of the list (repeatable: each is measured in turn).
    #[arg(long = "path", default_value = "/api/v1/pods?resourceVersion=0")]
    paths: Vec<String>,
    #[command(flatten)]
    load: LoadArgs,
}

/// How `get` and `list` load their target, and what else happens meanwhile.
#[derive(Debug, Clone, Args)]
struct LoadArgs {
    /// Clients at once, each on its own connection, each sending its
    /// requests one after another.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Rounds, each through the proxy and then directly (when there is a
    /// direct server to compare with); figures are over all rounds, so
    /// that drift in the machine's load falls on both sides.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Writes per second to objects of the measured resource (creates, then
    /// updates with PUT, of 10 objects in turn) while measuring, sent to
    /// the apiserver directly: a busy resource. 0: a quiet one.
    #[arg(long, default_value_t = 0.0)]
    write_rate: f64,
    /// Collection that --write-rate writes to (configmaps, secrets or
    /// leases, namespaced). Default: the measured path's collection.
    #[arg(long, value_name = "PATH")]
    write_collection: Option<String>,
    /// Writes per second to Leases in `default` (another resource, as node
    /// heartbeats are) while measuring: the apiserver's resourceVersion
    /// moves while the measured resource stays quiet.
    #[arg(long, default_value_t = 0.0)]
    other_write_rate: f64,
    /// Also run the requests against this kubeconfig's server (the
    /// apiserver directly) for comparison, and read its /metrics for the
    /// requests that reached it. With --sim or --real: the apiserver started.
    #[arg(long, value_name = "FILE")]
    compare_kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
struct GetArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Requests per path and client, one after another on its connection.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Requests per path and client before measuring.
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Paths to GET (repeatable). Default with --sim or --real: a secret
    /// `default/kcp-load-get` (passed through: secrets are not cached) and
    /// a configmap of that name, consistent (RV unset: passed through) and
    /// with `resourceVersion=0` (from the cache), created first.
    #[arg(long = "path")]
    paths: Vec<String>,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Debug, Clone, Args)]
struct AuthzArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Identities (client certificates in system:masters), each on its own
    /// connection: its first request finds no cached decision.
    #[arg(long, default_value_t = 300)]
    identities: usize,
    /// Further requests per identity, with the decision cached.
    #[arg(long, default_value_t = 5)]
    warm: usize,
    /// The cached read.
    #[arg(
        long,
        default_value = "/api/v1/namespaces/default/configmaps?resourceVersion=0"
    )]
    path: String,
}

#[derive(Debug, Clone, Args)]
struct IdleArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Idle watches.
    #[arg(long, default_value_t = 5000)]
    watchers: usize,
    /// Watch streams per HTTP/2 connection (the proxy allows 1000).
    #[arg(long, default_value_t = 500)]
    watchers_per_conn: usize,
    /// Watch path; `{i}` is the watcher's number, `{node}` a node name
    /// (node-00000...), `{rv}` the resourceVersion of a list of --rv-path.
    #[arg(
        long,
        default_value = "/api/v1/pods?watch=1&allowWatchBookmarks=true&fieldSelector=spec.nodeName%3D{node}&resourceVersion={rv}&timeoutSeconds=3600"
    )]
    path: String,
    /// List whose resourceVersion replaces `{rv}`.
    #[arg(long, default_value = "/api/v1/pods?limit=1")]
    rv_path: String,
    /// Process whose memory to measure (default with --sim --proxy-bin: the
    /// proxy).
    #[arg(long)]
    pid: Option<u32>,
    /// Steps in which the watches are opened (memory is read after each).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Seconds to hold the watches open after the last step.
    #[arg(long, default_value_t = 5)]
    hold: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum ObjectKind {
    /// A scheduled pod (about 5 KB).
    Pod,
    /// A small config map (about 260 B).
    Configmap,
    /// A worker node reporting 20 images (about 7.5 KB).
    Node,
    /// A service's endpoint slice with 3 endpoints (about 1.6 KB).
    Endpointslice,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum IngestPath {
    /// One `ADDED` event at a time (`State::apply`), history of 1.
    Apply,
    /// One list (`State::replace`), as the reflector's first fill.
    Replace,
}

#[derive(Debug, Clone, Args)]
struct IngestArgs {
    /// Objects.
    #[arg(long, default_value_t = 50_000)]
    objects: usize,
    /// What they are.
    #[arg(long, value_enum, default_value_t = ObjectKind::Pod)]
    kind: ObjectKind,
    /// How they enter the cache.
    #[arg(long, value_enum, default_value_t = IngestPath::Apply)]
    via: IngestPath,
    /// Also encode each object's protobuf form, as the first protobuf
    /// reader of an object version does: the memory with both encodings.
    #[arg(long)]
    protobuf: bool,
    /// With --protobuf: MiB of protobuf encodings kept, as the proxy's
    /// `cache.protobufCacheMib` (0: none kept).
    #[arg(long, default_value_t = 64)]
    protobuf_cache_mib: u64,
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
            (_, true) => self_test().await,
            (Some(Cmd::Watch(a)), _) => watch(&a).await.map(|_| ()),
            (Some(Cmd::List(a)), _) => list(&a).await,
            (Some(Cmd::Get(a)), _) => get(&a).await,
            (Some(Cmd::Idle(a)), _) => idle(&a).await.map(|_| ()),
            (Some(Cmd::Ingest(a)), _) => ingest(&a).map(|_| ()),
            (Some(Cmd::Authz(a)), _) => authz(&a).await.map(|_| ()),
            (Some(Cmd::Kubelet(a)), _) => hollow::kubelet(&a).await,
            (Some(Cmd::Tier(a)), _) => tier::tier(&a).await.map(|_| ()),
            (Some(Cmd::Compare(a)), _) => compare::compare(&a).await,
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

/// A started apiserver (simulated or real) and the proxy in front of it.
enum Env {
    Sim(SimEnv),
    Real(Box<RealEnv>),
}

impl Env {
    fn proxy(&self) -> &RunningProxy {
        match self {
            Env::Sim(e) => &e.proxy,
            Env::Real(e) => &e.proxy,
        }
    }

    /// A kubeconfig for admin (`system:masters`) reaching the proxy, or
    /// the apiserver when `direct`.
    fn kubeconfig(&self, direct: bool) -> Result<PathBuf> {
        match self {
            Env::Sim(e) => e.kubeconfig(direct),
            Env::Real(e) => e.kubeconfig(direct),
        }
    }

    /// The apiserver, directly, as admin.
    async fn direct(&self) -> Result<Target> {
        match self {
            Env::Sim(e) => Target::from_kubeconfig(Some(&e.kubeconfig(true)?), None).await,
            Env::Real(e) => Ok(e.direct.clone()),
        }
    }

    fn proxy_pid(&self) -> u32 {
        self.proxy().pid()
    }

    fn proxy_is_separate(&self) -> bool {
        self.proxy().is_separate()
    }

    async fn stop(self) {
        match self {
            Env::Sim(e) => e.stop().await,
            Env::Real(e) => e.stop().await,
        }
    }
}

/// The target: a started apiserver and proxy, or a kubeconfig's server.
async fn resolve(t: &TargetArgs) -> Result<(Target, Option<Env>)> {
    if t.real.real {
        let env = Env::Real(Box::new(RealEnv::start(&t.real, &t.sim).await?));
        let target = Target::from_kubeconfig(Some(&env.kubeconfig(false)?), None)
            .await?
            .with_accept(t.encoding.accept());
        println!("target: {} (the proxy)", target.base());
        Ok((target, Some(env)))
    } else if t.sim.sim {
        let env = Env::Sim(SimEnv::start(&t.sim).await?);
        let kubeconfig = env.kubeconfig(t.sim.direct)?;
        let target = Target::from_kubeconfig(Some(&kubeconfig), None)
            .await?
            .with_accept(t.encoding.accept());
        println!(
            "target: {} ({})",
            target.base(),
            if t.sim.direct {
                "the simulated apiserver, directly"
            } else {
                "the proxy"
            }
        );
        Ok((target, Some(env)))
    } else {
        let target = Target::from_kubeconfig(t.kubeconfig.as_deref(), t.context.clone())
            .await?
            .with_accept(t.encoding.accept());
        println!("target: {}", target.base());
        Ok((target, None))
    }
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

fn encode_query(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// `metadata.resourceVersion` of a list response.
async fn list_rv(target: &Target, proto: Proto, path: &str) -> Result<String> {
    let target = target.clone().with_accept("application/json");
    let mut conn = target.connect(proto).await?;
    let resp = target.fetch(&mut conn, Method::GET, path, None).await?;
    if resp.status != StatusCode::OK {
        bail!(
            "GET {path}: {} {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
    }
    let v: Value = serde_json::from_slice(&resp.body)?;
    v.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| anyhow!("GET {path}: no metadata.resourceVersion"))
}

// --- watchers ---

#[derive(Debug, Default)]
struct WatchOut {
    /// Delivery latencies (µs) of events carrying the annotation.
    latencies: Vec<u32>,
    /// Their write times (Unix ns), which identify the events.
    sent: Vec<u64>,
    /// Other events (bookmarks...).
    other: u64,
    bytes: u64,
    error: Option<String>,
}

struct Counters {
    started: AtomicUsize,
    delivered: AtomicU64,
}

/// The write time embedded in a watch event (a JSON line, or a protobuf
/// frame: the annotation's map entry is the key, then field 2, its
/// length and the digits), if any.
fn sent_at(line: &[u8]) -> Option<u64> {
    const NEEDLE: &[u8] = b"\"kcp-load/sent-unix-nanos\":\"";
    const KEY: &[u8] = b"kcp-load/sent-unix-nanos\x12";
    let at = match line.windows(NEEDLE.len()).position(|w| w == NEEDLE) {
        Some(at) => at + NEEDLE.len(),
        None => line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len() + 1,
    };
    let digits = line.get(at..)?;
    let end = digits.iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// The next whole event in `buf`: its length and where the one after it
/// starts (JSON lines, or protobuf frames: a 4-byte big-endian length and
/// the `WatchEvent`).
fn next_event(buf: &[u8], protobuf: bool) -> Option<(usize, usize)> {
    if protobuf {
        let len = u32::from_be_bytes(buf.get(..4)?.try_into().ok()?) as usize;
        (buf.len() >= 4 + len).then_some((4 + len, 4 + len))
    } else {
        let pos = buf.iter().position(|b| *b == b'\n')?;
        Some((pos, pos + 1))
    }
}

async fn watch_one(
    target: Target,
    mut conn: Conn,
    path: String,
    stop: CancellationToken,
    counters: Arc<Counters>,
) -> WatchOut {
    let mut out = WatchOut::default();
    let req = match target.request(&conn, Method::GET, &path, None) {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(e.to_string());
            counters.started.fetch_add(1, Ordering::Relaxed);
            return out;
        }
    };
    let resp = tokio::select! {
        _ = stop.cancelled() => return out,
        r = conn.send(req) => r,
    };
    counters.started.fetch_add(1, Ordering::Relaxed);
    let resp = match resp {
        Ok(r) if r.status() == StatusCode::OK => r,
        Ok(r) => {
            out.error = Some(format!("watch answered {}", r.status()));
            return out;
        }
        Err(e) => {
            out.error = Some(format!("{e:#}"));
            return out;
        }
    };
    let protobuf = target.protobuf();
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            f = body.frame() => f,
        };
        let data = match frame {
            None => {
                out.error = Some("watch ended".into());
                break;
            }
            Some(Err(e)) => {
                out.error = Some(format!("watch broke: {e}"));
                break;
            }
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
        };
        let now = unix_nanos();
        out.bytes += data.len() as u64;
        buf.extend_from_slice(&data);
        let mut start = 0;
        let mut events = 0;
        while let Some((line, next)) = next_event(&buf[start..], protobuf) {
            let line = &buf[start..start + line];
            start += next;
            match sent_at(line) {
                Some(sent) => {
                    let lat = Duration::from_nanos(now.saturating_sub(sent));
                    out.latencies.push(micros(lat));
                    out.sent.push(sent);
                    events += 1;
                }
                None => {
                    if line.starts_with(br#"{"type":"ERROR""#)
                        || (protobuf && line.get(4..11) == Some(b"\x0a\x05ERROR"))
                    {
                        out.error = Some(String::from_utf8_lossy(line).into_owned());
                    }
                    out.other += 1;
                }
            }
        }
        buf.drain(..start);
        counters.delivered.fetch_add(events, Ordering::Relaxed);
    }
    out
}

/// Opens `n` watches of `path(i)`, `per_conn` per HTTP/2 connection.
#[allow(clippy::too_many_arguments)]
async fn open_watchers(
    target: &Target,
    proto: Proto,
    n: usize,
    per_conn: usize,
    first: usize,
    path: impl Fn(usize) -> String,
    stop: &CancellationToken,
    counters: &Arc<Counters>,
) -> Result<Vec<tokio::task::JoinHandle<WatchOut>>> {
    let mut tasks = Vec::with_capacity(n);
    let mut conn: Option<Conn> = None;
    for i in 0..n {
        let c = match proto {
            Proto::H1 => target.connect(proto).await?,
            Proto::H2 => {
                if i % per_conn.max(1) == 0 || conn.is_none() {
                    conn = Some(target.connect(proto).await?);
                }
                conn.as_ref()
                    .and_then(Conn::share)
                    .ok_or_else(|| anyhow!("not an HTTP/2 connection"))?
            }
        };
        tasks.push(tokio::spawn(watch_one(
            target.clone(),
            c,
            path(first + i),
            stop.clone(),
            counters.clone(),
        )));
    }
    Ok(tasks)
}

async fn wait_started(counters: &Counters, n: usize, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while counters.started.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            bail!(
                "only {} of {n} watches started within {timeout:?}",
                counters.started.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

// --- writers ---

#[derive(Debug, Default)]
struct WriteOut {
    ok: u64,
    errors: u64,
    last_error: Option<String>,
    latencies: Vec<u32>,
}

/// The body of a write: a configmap or secret with `payload`, or a pod,
/// node or endpointslice shaped like the apiserver's (`fixtures`), with
/// kcp-load's name, label and write-time annotation.
fn object_body(kind: &str, api_version: &str, ns: &str, name: &str, payload: &str) -> Bytes {
    let realistic = match kind {
        "Pod" => Some(fixtures::pod(0, ns, &fixtures::node(0), 1)),
        "Node" => Some(fixtures::node_object(0, 20, 1)),
        "EndpointSlice" => Some(fixtures::endpoint_slice(0, ns, 10, 1)),
        _ => None,
    };
    if let Some(mut o) = realistic.and_then(|j| serde_json::from_str::<Value>(&j).ok()) {
        let mut metadata = json!({
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "kcp-load"},
            "annotations": {SENT_ANNOTATION: unix_nanos().to_string()},
        });
        if kind != "Node" {
            metadata["namespace"] = json!(ns);
        }
        o["metadata"] = metadata;
        return Bytes::from(serde_json::to_vec(&o).unwrap_or_default());
    }
    let mut o = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {"app.kubernetes.io/managed-by": "kcp-load"},
            "annotations": {SENT_ANNOTATION: unix_nanos().to_string()},
        },
    });
    if let Some(m) = o.as_object_mut() {
        match kind {
            "ConfigMap" | "Secret" if !payload.is_empty() => {
                m.insert("data".into(), json!({ "payload": payload }));
            }
            "Lease" => {
                m.insert(
                    "spec".into(),
                    json!({"holderIdentity": name, "leaseDurationSeconds": 40}),
                );
            }
            _ => {}
        }
    }
    Bytes::from(serde_json::to_vec(&o).unwrap_or_default())
}

/// `metadata.resourceVersion` of a JSON object.
fn resource_version_of(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(body)
        .ok()?
        .pointer("/metadata/resourceVersion")?
        .as_str()
        .map(str::to_string)
}

/// `body` (a JSON object) with `metadata.resourceVersion` set to `rv`.
fn with_resource_version(body: &Bytes, rv: &str) -> Bytes {
    match serde_json::from_slice::<Value>(body) {
        Ok(mut o) => {
            if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                m.insert("resourceVersion".into(), rv.into());
            }
            serde_json::to_vec(&o)
                .map(Bytes::from)
                .unwrap_or_else(|_| body.clone())
        }
        Err(_) => body.clone(),
    }
}

struct WriterPlan {
    kind: String,
    api_version: String,
    namespace: String,
    collection: String,
    names: Vec<String>,
    payload: String,
    interval: Duration,
    end: Instant,
    /// Stops the writer before `end`.
    stop: CancellationToken,
}

async fn writer(target: Target, proto: Proto, plan: WriterPlan) -> WriteOut {
    let mut out = WriteOut::default();
    let mut conn = match target.connect(proto).await {
        Ok(c) => c,
        Err(e) => {
            out.errors += 1;
            out.last_error = Some(format!("{e:#}"));
            return out;
        }
    };
    let mut created = vec![false; plan.names.len()];
    // Each object's last resourceVersion: an update of a Lease must carry
    // one (`metadata.resourceVersion: must be specified for an update`).
    let mut rvs: Vec<Option<String>> = vec![None; plan.names.len()];
    let mut next = tokio::time::Instant::now();
    let mut i = 0usize;
    while Instant::now() < plan.end {
        tokio::select! {
            _ = plan.stop.cancelled() => break,
            _ = tokio::time::sleep_until(next) => {}
        }
        // Keep the rate, but do not burst to catch up after a stall.
        next = (next + plan.interval).max(tokio::time::Instant::now());
        let k = i % plan.names.len();
        i += 1;
        let name = &plan.names[k];
        let (method, path) = if created[k] {
            (Method::PUT, format!("{}/{name}", plan.collection))
        } else {
            (Method::POST, plan.collection.clone())
        };
        let mut body = object_body(
            &plan.kind,
            &plan.api_version,
            &plan.namespace,
            name,
            &plan.payload,
        );
        if let (true, Some(rv)) = (created[k], &rvs[k]) {
            body = with_resource_version(&body, rv);
        }
        let start = Instant::now();
        match target.fetch(&mut conn, method, &path, Some(body)).await {
            Ok(r) if r.status.is_success() => {
                out.ok += 1;
                out.latencies.push(micros(start.elapsed()));
                created[k] = true;
                rvs[k] = resource_version_of(&r.body);
            }
            Ok(r) if r.status == StatusCode::CONFLICT => {
                // Left over from an earlier run, or written meanwhile:
                // update it from its current resourceVersion.
                if created[k] {
                    out.errors += 1;
                    out.last_error =
                        Some(format!("{} {}", r.status, String::from_utf8_lossy(&r.body)));
                }
                created[k] = true;
                let current = target
                    .fetch(
                        &mut conn,
                        Method::GET,
                        &format!("{}/{name}", plan.collection),
                        None,
                    )
                    .await;
                rvs[k] = current.ok().and_then(|r| resource_version_of(&r.body));
            }
            Ok(r) => {
                out.errors += 1;
                out.last_error = Some(format!("{} {}", r.status, String::from_utf8_lossy(&r.body)));
            }
            Err(e) => {
                out.errors += 1;
                out.last_error = Some(format!("{e:#}"));
                match target.connect(proto).await {
                    Ok(c) => conn = c,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
    }
    out
}

// --- watch ---

/// What a watch run measured.
#[derive(Debug, Default)]
struct WatchReport {
    writes: u64,
    delivered: u64,
    expected: u64,
    errors: u64,
}

async fn watch(a: &WatchArgs) -> Result<WatchReport> {
    let (target, env) = resolve(&a.target).await?;
    let report = watch_on(&target, env.as_ref(), a).await;
    if let Some(env) = env {
        env.stop().await;
    }
    report
}

async fn watch_on(target: &Target, env: Option<&Env>, a: &WatchArgs) -> Result<WatchReport> {
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

// --- list ---

async fn list(a: &ListArgs) -> Result<()> {
    let (target, env) = resolve(&a.target).await?;
    let result = list_on(&target, env.as_ref(), a).await;
    if let Some(env) = env {
        env.stop().await;
    }
    result.map(|_| ())
}

async fn list_on(target: &Target, env: Option<&Env>, a: &ListArgs) -> Result<Vec<Compared>> {
    let plan = Plan::new(target, env, &a.target, &a.load).await?;
    plan.run(&a.paths, a.requests, a.warmup).await
}

/// Times `n` sequential lists of `path` on one connection.
async fn list_run(target: &Target, proto: Proto, path: &str, n: usize) -> Result<u64> {
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

// --- get ---

async fn get(a: &GetArgs) -> Result<()> {
    let (target, env) = resolve(&a.target).await?;
    let result = get_on(&target, env.as_ref(), a).await;
    if let Some(env) = env {
        env.stop().await;
    }
    result.map(|_| ())
}

async fn get_on(target: &Target, env: Option<&Env>, a: &GetArgs) -> Result<Vec<Compared>> {
    let mut paths = a.paths.clone();
    if let Some(env) = env {
        // A secret (not cached: passed through) and a configmap (cached).
        let direct = env.direct().await?;
        for (resource, kind, extra) in [
            ("secrets", "Secret", json!({"data": {"k": "dmFsdWU="}})),
            ("configmaps", "ConfigMap", json!({"data": {"k": "value"}})),
        ] {
            let mut o = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": "kcp-load-get", "namespace": "default"}});
            if let (Some(m), Some(e)) = (o.as_object_mut(), extra.as_object()) {
                m.extend(e.clone());
            }
            real::create(
                &direct,
                &format!("/api/v1/namespaces/default/{resource}"),
                &o,
            )
            .await?;
        }
        if paths.is_empty() {
            paths = vec![
                "/api/v1/namespaces/default/secrets/kcp-load-get".into(),
                "/api/v1/namespaces/default/configmaps/kcp-load-get".into(),
                "/api/v1/namespaces/default/configmaps/kcp-load-get?resourceVersion=0".into(),
            ];
        }
        // Let the cache see the new configmap.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if paths.is_empty() {
        bail!("--path is required without --sim or --real");
    }
    let plan = Plan::new(target, env, &a.target, &a.load).await?;
    plan.run(&paths, a.requests, a.warmup).await
}

// --- concurrent clients, compared ---

/// The resource a request path names: `(group, resource, verb)`, the verb
/// as kube-apiserver's metrics name it (`GET` with a name, else `LIST`).
fn path_resource(path: &str) -> Option<(String, String, &'static str)> {
    let path = path.split('?').next().unwrap_or(path);
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, r, tail @ ..] if !r.is_empty() => {
            let mut v = vec![*r];
            v.extend(tail);
            v
        }
        other => other.to_vec(),
    };
    match rest.as_slice() {
        [r] => Some((group, r.to_string(), "LIST")),
        [r, _name] => Some((group, r.to_string(), "GET")),
        _ => None,
    }
}

/// A namespaced collection path: `(apiVersion, namespace, resource)`.
fn parse_collection(path: &str) -> Option<(String, String, String)> {
    let path = path.split('?').next().unwrap_or(path);
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api", v, "namespaces", ns, r, ..] => Some((v.to_string(), ns.to_string(), r.to_string())),
        ["apis", g, v, "namespaces", ns, r, ..] => {
            Some((format!("{g}/{v}"), ns.to_string(), r.to_string()))
        }
        _ => None,
    }
}

/// What one run of concurrent clients measured.
#[derive(Debug, Default)]
struct LoadOut {
    /// Latency of each measured request answered 200 (µs).
    latencies: Vec<u32>,
    /// Time to its first body byte (µs).
    first_byte: Vec<u32>,
    /// Measured requests sent.
    requests: usize,
    errors: usize,
    last_error: Option<String>,
    bytes: u64,
    /// Items of a list response.
    items: Option<usize>,
    /// From the clients' start to the last one's end, summed over rounds.
    wall: Duration,
    /// Growth of `apiserver_request_total` by verb, group, resource.
    apiserver: Option<BTreeMap<Vec<String>, f64>>,
    /// Growth of the proxy's `cache_reads_total` by resource, verb,
    /// source, reason.
    reads: Option<BTreeMap<Vec<String>, f64>>,
    /// Growth of the proxy's `cache_consistency_probes_total` by resource,
    /// result.
    probes: Option<BTreeMap<Vec<String>, f64>>,
    /// Growth of the proxy's `cache_progress_watches_total` by resource.
    progress: Option<BTreeMap<Vec<String>, f64>>,
}

fn merge_maps(a: &mut Option<BTreeMap<Vec<String>, f64>>, b: Option<BTreeMap<Vec<String>, f64>>) {
    if let Some(b) = b {
        let a = a.get_or_insert_with(BTreeMap::new);
        for (k, v) in b {
            *a.entry(k).or_default() += v;
        }
    }
}

impl LoadOut {
    fn merge(&mut self, o: LoadOut) {
        self.latencies.extend(o.latencies);
        self.first_byte.extend(o.first_byte);
        self.requests += o.requests;
        self.errors += o.errors;
        if o.last_error.is_some() {
            self.last_error = o.last_error;
        }
        self.bytes += o.bytes;
        self.items = self.items.or(o.items);
        self.wall += o.wall;
        merge_maps(&mut self.apiserver, o.apiserver);
        merge_maps(&mut self.reads, o.reads);
        merge_maps(&mut self.probes, o.probes);
        merge_maps(&mut self.progress, o.progress);
    }

    /// Records what the metrics grew by between two snapshots.
    fn record_growth(&mut self, before: &Snapshot, after: &Snapshot) {
        if let (Some(b), Some(a)) = (&before.1, &after.1) {
            self.apiserver = Some(metrics::growth(
                b,
                a,
                "apiserver_request_total",
                &["verb", "group", "resource"],
            ));
        }
        if let (Some(b), Some(a)) = (&before.0, &after.0) {
            self.reads = Some(metrics::growth(
                b,
                a,
                "kube_cache_proxy_cache_reads_total",
                &["resource", "verb", "source", "reason"],
            ));
            self.probes = Some(metrics::growth(
                b,
                a,
                "kube_cache_proxy_cache_consistency_probes_total",
                &["resource", "result"],
            ));
            self.progress = Some(metrics::growth(
                b,
                a,
                "kube_cache_proxy_cache_progress_watches_total",
                &["resource"],
            ));
        }
    }

    fn per_second(&self) -> f64 {
        self.requests as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Upstream requests the measured requests caused, per request: reads
    /// (GET, LIST, WATCH) of `resource` and SubjectAccessReviews, from the
    /// apiserver's metrics.
    fn upstream_per_request(&self, resource: &(String, String, &str)) -> Option<f64> {
        let m = self.apiserver.as_ref()?;
        let n: f64 = m
            .iter()
            .filter(|(k, _)| {
                (k[1] == resource.0
                    && k[2] == resource.1
                    && matches!(k[0].as_str(), "GET" | "LIST" | "WATCH"))
                    || k[2] == "subjectaccessreviews"
            })
            .fold(0.0, |a, (_, v)| a + v);
        Some(n / self.requests.max(1) as f64)
    }

    /// The share of the measured reads the proxy served from its cache.
    fn cache_share(&self, resource: &(String, String, &str)) -> Option<f64> {
        let m = self.reads.as_ref()?;
        let (mut cache, mut all) = (0.0, 0.0);
        for (k, v) in m {
            if k[0] == resource.1 && k[1] == resource.2 {
                all += v;
                if k[2] == "cache" {
                    cache += v;
                }
            }
        }
        (all > 0.0).then_some(cache / all)
    }

    fn probes_per_request(&self, resource: &(String, String, &str)) -> Option<f64> {
        let m = self.probes.as_ref()?;
        let n: f64 = m
            .iter()
            .filter(|(k, _)| k[0] == resource.1)
            .fold(0.0, |a, (_, v)| a + v);
        Some(n / self.requests.max(1) as f64)
    }
}

/// Where metrics are read before and after a run.
struct Meters<'a> {
    proxy: Option<&'a RunningProxy>,
    apiserver: Option<&'a Target>,
}

type Snapshot = (Option<Vec<Sample>>, Option<Vec<Sample>>);

impl Meters<'_> {
    async fn snapshot(&self) -> Snapshot {
        let proxy = match self.proxy {
            Some(p) => match p.admin_get("/metrics").await {
                Ok((200, text)) => Some(metrics::parse(&text)),
                _ => None,
            },
            None => None,
        };
        let apiserver = match self.apiserver {
            Some(t) => {
                async {
                    let mut conn = t.connect(Proto::H1).await.ok()?;
                    let r = t
                        .fetch(&mut conn, Method::GET, "/metrics", None)
                        .await
                        .ok()?;
                    (r.status == StatusCode::OK)
                        .then(|| metrics::parse(&String::from_utf8_lossy(&r.body)))
                }
                .await
            }
            None => None,
        };
        (proxy, apiserver)
    }
}

/// One GET on `conn`: status, body bytes, time to first byte, and the body
/// when `keep`.
async fn timed_get(
    target: &Target,
    conn: &mut Conn,
    path: &str,
    keep: bool,
) -> Result<(StatusCode, u64, Duration, Vec<u8>)> {
    let req = target.request(conn, Method::GET, path, None)?;
    let start = Instant::now();
    let resp = conn.send(req).await?;
    let status = resp.status();
    let mut body = resp.into_body();
    let mut len = 0u64;
    let mut first = None;
    let mut kept = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.context("reading the response")?.into_data() {
            first.get_or_insert_with(|| start.elapsed());
            len += data.len() as u64;
            if keep || status != StatusCode::OK {
                kept.extend_from_slice(&data);
            }
        }
    }
    Ok((status, len, first.unwrap_or_else(|| start.elapsed()), kept))
}

#[derive(Default)]
struct ClientOut {
    latencies: Vec<u32>,
    first_byte: Vec<u32>,
    requests: usize,
    errors: usize,
    last_error: Option<String>,
    bytes: u64,
    items: Option<usize>,
}

/// `clients` clients, each on its own connection, each sending `warmup`
/// then `requests` GETs of `path` one after another; all start measuring
/// together, once every client has warmed up. Metrics are read between
/// the warm-up and the measured requests, and after.
async fn load(
    target: &Target,
    proto: Proto,
    path: &str,
    clients: usize,
    requests: usize,
    warmup: usize,
    meters: &Meters<'_>,
) -> Result<LoadOut> {
    let clients = clients.max(1);
    let warmed = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let go = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        let (target, path, warmed, go) =
            (target.clone(), path.to_string(), warmed.clone(), go.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = ClientOut::default();
            let mut conn = match target.connect(proto).await {
                Ok(conn) => Some(conn),
                Err(e) => {
                    out.last_error = Some(format!("{e:#}"));
                    None
                }
            };
            if let Some(conn) = conn.as_mut() {
                for _ in 0..warmup {
                    if let Err(e) = timed_get(&target, conn, &path, false).await {
                        out.last_error = Some(format!("warm-up: {e:#}"));
                        break;
                    }
                }
            }
            // Every client waits at both barriers, connected or not.
            warmed.wait().await;
            go.wait().await;
            let Some(mut conn) = conn else {
                out.errors = requests;
                out.requests = requests;
                return out;
            };
            for i in 0..requests {
                out.requests += 1;
                let start = Instant::now();
                let keep = c == 0 && i == 0;
                match timed_get(&target, &mut conn, &path, keep).await {
                    Ok((StatusCode::OK, len, first, body)) => {
                        out.latencies.push(micros(start.elapsed()));
                        out.first_byte.push(micros(first));
                        out.bytes += len;
                        if keep {
                            out.items = serde_json::from_slice::<Value>(&body).ok().and_then(|v| {
                                v.get("items").and_then(Value::as_array).map(Vec::len)
                            });
                        }
                    }
                    Ok((status, _, _, body)) => {
                        out.errors += 1;
                        let text = String::from_utf8_lossy(&body);
                        out.last_error = Some(format!(
                            "{status} {}",
                            text.chars().take(300).collect::<String>()
                        ));
                    }
                    Err(e) => {
                        out.errors += 1;
                        out.last_error = Some(format!("{e:#}"));
                        match target.connect(proto).await {
                            Ok(c) => conn = c,
                            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                        }
                    }
                }
            }
            out
        }));
    }
    warmed.wait().await;
    let before = meters.snapshot().await;
    go.wait().await;
    let started = Instant::now();
    let mut out = LoadOut::default();
    for t in tasks {
        let c = t.await?;
        out.latencies.extend(c.latencies);
        out.first_byte.extend(c.first_byte);
        out.requests += c.requests;
        out.errors += c.errors;
        if c.last_error.is_some() {
            out.last_error = c.last_error;
        }
        out.bytes += c.bytes;
        out.items = out.items.or(c.items);
    }
    out.wall = started.elapsed();
    let after = meters.snapshot().await;
    out.record_growth(&before, &after);
    Ok(out)
}

/// A path's figures through the target and directly.
#[derive(Debug)]
struct Compared {
    path: String,
    target: LoadOut,
    direct: Option<LoadOut>,
}

/// Who is measured, against what, and what runs meanwhile.
struct Plan<'a> {
    target: &'a Target,
    /// The target is the proxy started here.
    proxy: Option<&'a RunningProxy>,
    /// The apiserver directly, to compare with.
    direct: Option<Target>,
    /// Where writes and `/metrics` of the apiserver go.
    apiserver: Option<Target>,
    proto: Proto,
    load: &'a LoadArgs,
}

impl<'a> Plan<'a> {
    async fn new(
        target: &'a Target,
        env: Option<&'a Env>,
        t: &TargetArgs,
        load: &'a LoadArgs,
    ) -> Result<Plan<'a>> {
        let direct = match (env, &load.compare_kubeconfig) {
            (_, Some(k)) => Some(Target::from_kubeconfig(Some(k), None).await?),
            (Some(env), None) if !t.sim.direct => Some(env.direct().await?),
            _ => None,
        };
        // Compared in the same representation; writes and metrics in JSON.
        let direct = direct.map(|d| d.with_accept(t.encoding.accept()));
        let apiserver = match (&direct, env) {
            (Some(d), _) => Some(d.clone().with_accept("application/json")),
            (None, Some(env)) => Some(env.direct().await?),
            (None, None) => None,
        };
        Ok(Plan {
            target,
            proxy: env.filter(|_| !t.sim.direct).map(Env::proxy),
            direct,
            apiserver,
            proto: t.proto,
            load,
        })
    }

    /// Starts a writer of `rate` writes/s to 10 objects of `collection`
    /// (sent to the apiserver directly when known).
    fn writer(
        &self,
        collection: &str,
        rate: f64,
        stop: &CancellationToken,
    ) -> Result<tokio::task::JoinHandle<WriteOut>> {
        let (api_version, namespace, resource) = parse_collection(collection)
            .ok_or_else(|| anyhow!("{collection}: not a namespaced collection to write to"))?;
        let kind = match resource.as_str() {
            "configmaps" => "ConfigMap",
            "secrets" => "Secret",
            "leases" => "Lease",
            other => bail!("writing {other} is not supported (configmaps, secrets, leases)"),
        };
        let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        println!("write: {rate:.1} writes/s to 10 {kind}s of {collection}, directly");
        Ok(tokio::spawn(writer(
            self.apiserver
                .clone()
                .unwrap_or_else(|| self.target.clone()),
            Proto::H2,
            WriterPlan {
                kind: kind.into(),
                api_version,
                namespace,
                collection: collection.split('?').next().unwrap_or(collection).into(),
                names: (0..10).map(|k| format!("kcp-load-{run_id}-{k}")).collect(),
                payload: "A".repeat(64),
                interval: Duration::from_secs_f64(1.0 / rate.max(0.001)),
                end: Instant::now() + Duration::from_secs(24 * 3600),
                stop: stop.clone(),
            },
        )))
    }

    /// Measures every path, `rounds` times through the target and directly,
    /// while the writers run; prints and returns the figures.
    async fn run(&self, paths: &[String], requests: usize, warmup: usize) -> Result<Vec<Compared>> {
        let l = self.load;
        let stop = CancellationToken::new();
        let mut writers = Vec::new();
        let started = Instant::now();
        if l.write_rate > 0.0 {
            let collection = match &l.write_collection {
                Some(c) => c.clone(),
                None => {
                    let (v, ns, r) =
                        paths
                            .first()
                            .and_then(|p| parse_collection(p))
                            .ok_or_else(|| {
                                anyhow!(
                                    "--write-collection is required: the path is not namespaced"
                                )
                            })?;
                    if v.contains('/') {
                        format!("/apis/{v}/namespaces/{ns}/{r}")
                    } else {
                        format!("/api/{v}/namespaces/{ns}/{r}")
                    }
                }
            };
            writers.push(self.writer(&collection, l.write_rate, &stop)?);
        }
        if l.other_write_rate > 0.0 {
            writers.push(self.writer(
                "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                l.other_write_rate,
                &stop,
            )?);
        }
        if !writers.is_empty() {
            // Let the writers create their objects and reach their rate.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let result = self.measure(paths, requests, warmup).await;
        stop.cancel();
        let secs = started.elapsed().as_secs_f64();
        for w in writers {
            let o = w.await?;
            println!(
                "write: {} ok ({:.1}/s), {} errors{}",
                o.ok,
                o.ok as f64 / secs,
                o.errors,
                o.last_error
                    .map(|e| format!("; last: {e}"))
                    .unwrap_or_default()
            );
        }
        result
    }

    async fn measure(
        &self,
        paths: &[String],
        requests: usize,
        warmup: usize,
    ) -> Result<Vec<Compared>> {
        let l = self.load;
        let through = Meters {
            proxy: self.proxy,
            apiserver: self.apiserver.as_ref(),
        };
        let direct_meters = Meters {
            proxy: None,
            apiserver: self.apiserver.as_ref(),
        };
        let name = if self.proxy.is_some() {
            "proxy"
        } else {
            "target"
        };
        let mut all = Vec::new();
        for path in paths {
            println!(
                "--- GET {path}: {} clients x {requests} requests (after {warmup}), {} round(s)",
                l.concurrency, l.rounds
            );
            let mut t = LoadOut::default();
            let mut d = self.direct.as_ref().map(|_| LoadOut::default());
            for _ in 0..l.rounds.max(1) {
                t.merge(
                    load(
                        self.target,
                        self.proto,
                        path,
                        l.concurrency,
                        requests,
                        warmup,
                        &through,
                    )
                    .await?,
                );
                if let (Some(direct), Some(d)) = (&self.direct, d.as_mut()) {
                    d.merge(
                        load(
                            direct,
                            self.proto,
                            path,
                            l.concurrency,
                            requests,
                            warmup,
                            &direct_meters,
                        )
                        .await?,
                    );
                }
            }
            let resource = path_resource(path);
            report(name, self.target.base(), &mut t, resource.as_ref());
            if let (Some(direct), Some(d)) = (&self.direct, d.as_mut()) {
                report("direct", direct.base(), d, resource.as_ref());
                compare(path, l.concurrency, &mut t, d, resource.as_ref());
            }
            all.push(Compared {
                path: path.clone(),
                target: t,
                direct: d,
            });
        }
        Ok(all)
    }
}

fn per(n: f64, requests: usize) -> String {
    format!("{:.3}", n / requests.max(1) as f64)
}

/// Prints one side's figures.
fn report(name: &str, base: &str, o: &mut LoadOut, resource: Option<&(String, String, &str)>) {
    let lat = Summary::of(&mut o.latencies);
    println!(
        "{name} ({base}): {} requests, {} errors, {:.1} requests/s; latency {lat}",
        o.requests,
        o.errors,
        o.per_second()
    );
    if let Some(items) = o.items {
        let ttfb = Summary::of(&mut o.first_byte);
        println!(
            "{name}: {items} items, {} per response, {:.1} MiB/s; time to first byte {ttfb}",
            mib(o.bytes / o.latencies.len().max(1) as u64),
            o.bytes as f64 / o.wall.as_secs_f64().max(1e-9) / (1024.0 * 1024.0),
        );
    }
    if let Some(e) = &o.last_error {
        println!("{name}: last error: {e}");
    }
    if let Some(m) = &o.apiserver {
        let lines: Vec<String> = m
            .iter()
            .map(|(k, v)| {
                let r = if k[1].is_empty() {
                    k[2].clone()
                } else {
                    format!("{}.{}", k[2], k[1])
                };
                format!(
                    "{} {} {v} ({}/req)",
                    k[0],
                    if r.is_empty() { "-" } else { &r },
                    per(*v, o.requests)
                )
            })
            .collect();
        let total = resource
            .and_then(|r| o.upstream_per_request(r))
            .map(|v| format!("{v:.3}"))
            .unwrap_or_else(|| "?".into());
        println!(
            "{name}: apiserver requests meanwhile (apiserver_request_total): reads of the resource and SubjectAccessReviews {total} per request; all: {}",
            if lines.is_empty() {
                "none".into()
            } else {
                lines.join(", ")
            }
        );
    }
    if let Some(m) = &o.reads {
        let lines: Vec<String> = m
            .iter()
            .map(|(k, v)| {
                format!(
                    "{} {} {}{} {v} ({}/req)",
                    k[1],
                    k[0],
                    k[2],
                    if k[3].is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", k[3])
                    },
                    per(*v, o.requests)
                )
            })
            .collect();
        let probes: Vec<String> = o
            .probes
            .iter()
            .flatten()
            .map(|(k, v)| format!("{} {} {v} ({}/req)", k[0], k[1], per(*v, o.requests)))
            .collect();
        let progress: Vec<String> = o
            .progress
            .iter()
            .flatten()
            .map(|(k, v)| format!("{} {v}", k[0]))
            .collect();
        println!(
            "{name}: proxy cache reads (kube_cache_proxy_cache_reads_total): {}; consistency probes: {}; progress watches: {}",
            if lines.is_empty() {
                "none".into()
            } else {
                lines.join(", ")
            },
            if probes.is_empty() {
                "none".into()
            } else {
                probes.join(", ")
            },
            if progress.is_empty() {
                "none".into()
            } else {
                progress.join(", ")
            },
        );
    }
}

/// Prints the difference and a table row for docs/performance.md.
fn compare(
    path: &str,
    clients: usize,
    t: &mut LoadOut,
    d: &mut LoadOut,
    resource: Option<&(String, String, &str)>,
) {
    let (ts, ds) = (Summary::of(&mut t.latencies), Summary::of(&mut d.latencies));
    let diff = |a: f64, b: f64| format!("{:+.3}", (a - b) / 1000.0);
    println!(
        "{path}: added by the proxy: p50 {}ms p90 {}ms p99 {}ms mean {}ms",
        diff(ts.p50 as f64, ds.p50 as f64),
        diff(ts.p90 as f64, ds.p90 as f64),
        diff(ts.p99 as f64, ds.p99 as f64),
        diff(ts.mean, ds.mean),
    );
    let opt = |v: Option<f64>, pct: bool| match v {
        Some(v) if pct => format!("{:.0} %", v * 100.0),
        Some(v) => format!("{v:.3}"),
        None => "?".into(),
    };
    let ms3 = |s: &Summary| {
        format!(
            "{:.2} / {:.2} / {:.2}",
            s.p50 as f64 / 1000.0,
            s.p99 as f64 / 1000.0,
            s.mean / 1000.0
        )
    };
    println!(
        "row: | `{path}` | {clients} | {} | {} | {} / {} | {:.0} / {:.0} | {} / {} | {} | {} |",
        ms3(&ts),
        ms3(&ds),
        diff(ts.p50 as f64, ds.p50 as f64),
        diff(ts.mean, ds.mean),
        t.per_second(),
        d.per_second(),
        opt(resource.and_then(|r| t.upstream_per_request(r)), false),
        opt(resource.and_then(|r| d.upstream_per_request(r)), false),
        opt(resource.and_then(|r| t.probes_per_request(r)), false),
        opt(resource.and_then(|r| t.cache_share(r)), true),
    );
}

// --- authz ---

/// What `authz` measured, in microseconds.
#[derive(Debug)]
struct AuthzReport {
    cold: Summary,
    warm: Summary,
    /// Mean decision time from the proxy's
    /// `kube_cache_proxy_authorization_duration_seconds`, by source.
    decision_cache_us: f64,
    decision_upstream_us: f64,
}

async fn authz(a: &AuthzArgs) -> Result<AuthzReport> {
    if !a.target.sim.sim || a.target.sim.direct {
        bail!("authz needs --sim (it mints client certificates) and the proxy as target");
    }
    let env = SimEnv::start(&a.target.sim).await?;
    let result = authz_on(&env, a).await;
    env.stop().await;
    result
}

async fn authz_on(env: &SimEnv, a: &AuthzArgs) -> Result<AuthzReport> {
    let proto = a.target.proto;
    let before = decision_times(env).await?;
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for i in 0..a.identities {
        let user = format!("kcp-load-user-{i}");
        let issued = env.sim.issue_client(&user, Some("system:masters"));
        let file = env.dir.join("authz.kubeconfig");
        std::fs::write(
            &file,
            apimachinery::kubeconfig::with_certificate(
                &env.proxy.url,
                &env.proxy.ca_pem,
                &user,
                &issued.cert_pem,
                &issued.key_pem,
            ),
        )?;
        let target = Target::from_kubeconfig(Some(&file), None).await?;
        let mut conn = target.connect(proto).await?;
        for n in 0..=a.warm {
            let start = Instant::now();
            let r = target.fetch(&mut conn, Method::GET, &a.path, None).await?;
            let took = micros(start.elapsed());
            if r.status != StatusCode::OK {
                bail!(
                    "GET {} as {user}: {} {}",
                    a.path,
                    r.status,
                    String::from_utf8_lossy(&r.body)
                );
            }
            if n == 0 {
                cold.push(took)
            } else {
                warm.push(took)
            }
        }
    }
    let after = decision_times(env).await?;
    let mean = |source: &str| -> f64 {
        let (sum, count) = (
            after[source].0 - before[source].0,
            after[source].1 - before[source].1,
        );
        if count > 0.0 {
            sum / count * 1e6
        } else {
            f64::NAN
        }
    };
    let report = AuthzReport {
        cold: Summary::of(&mut cold),
        warm: Summary::of(&mut warm),
        decision_cache_us: mean("cache"),
        decision_upstream_us: mean("upstream"),
    };
    println!(
        "authz: GET {} as {} new identities, each on its own connection",
        a.path, a.identities
    );
    println!(
        "authz: cold (first request, SubjectAccessReview upstream): {}",
        report.cold
    );
    println!(
        "authz: warm (the next {} requests, decision cached): {}",
        a.warm, report.warm
    );
    println!(
        "authz: added by a cold decision: p50 {:+.3}ms p99 {:+.3}ms",
        (report.cold.p50 as f64 - report.warm.p50 as f64) / 1000.0,
        (report.cold.p99 as f64 - report.warm.p99 as f64) / 1000.0
    );
    println!(
        "authz: decision time in the proxy (mean, its histogram): cached {:.1}us, upstream {:.1}us",
        report.decision_cache_us, report.decision_upstream_us
    );
    Ok(report)
}

/// (sum in seconds, count) of the proxy's authorization decisions by
/// source (`cache`, `upstream`), from its metrics.
async fn decision_times(
    env: &SimEnv,
) -> Result<std::collections::HashMap<&'static str, (f64, f64)>> {
    let (_, metrics) = env.admin_get("/metrics").await?;
    let value = |suffix: &str, source: &str| -> f64 {
        let prefix = format!("kube_cache_proxy_authorization_duration_seconds_{suffix}{{");
        let label = format!("source=\"{source}\"");
        metrics
            .lines()
            .filter(|l| l.starts_with(&prefix) && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Ok(["cache", "upstream"]
        .into_iter()
        .map(|source| (source, (value("sum", source), value("count", source))))
        .collect())
}

// --- idle ---

/// Per-watcher memory measured by `idle`.
#[derive(Debug, Default)]
struct IdleReport {
    per_watcher: f64,
    errors: usize,
}

async fn idle(a: &IdleArgs) -> Result<IdleReport> {
    let (target, env) = resolve(&a.target).await?;
    let result = idle_on(&target, env.as_ref(), a).await;
    if let Some(env) = env {
        env.stop().await;
    }
    result
}

async fn idle_on(target: &Target, env: Option<&Env>, a: &IdleArgs) -> Result<IdleReport> {
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

// --- ingest ---

/// Memory measured by `ingest`.
#[derive(Debug, Default)]
struct IngestReport {
    ratio: f64,
    accounted: usize,
}

fn ingest(a: &IngestArgs) -> Result<IngestReport> {
    let (field_set, what, namespaced) = match a.kind {
        ObjectKind::Pod => (FieldSet::Pod, "pods", true),
        ObjectKind::Configmap => (FieldSet::Default, "configmaps", true),
        ObjectKind::Node => (FieldSet::Node, "nodes", false),
        ObjectKind::Endpointslice => (FieldSet::Default, "endpointslices", true),
    };
    // Bytes of the protobuf forms alive (kept, or held by the state).
    let proto_gauge = prometheus::IntGauge::new("encoded_bytes", "-")?;
    let codec = if a.protobuf {
        let (group, kind, api_version) = match a.kind {
            ObjectKind::Pod => ("", "Pod", "v1"),
            ObjectKind::Configmap => ("", "ConfigMap", "v1"),
            ObjectKind::Node => ("", "Node", "v1"),
            ObjectKind::Endpointslice => {
                ("discovery.k8s.io", "EndpointSlice", "discovery.k8s.io/v1")
            }
        };
        Some(
            ProtoCodec::new(
                group,
                "v1",
                kind,
                api_version,
                proto_gauge.clone(),
                prometheus::IntCounter::new("encode_failures", "-")?,
                kube_cache_proxy::cache::encode::ProtoForms::new(a.protobuf_cache_mib << 20)
                    .for_resource(0),
            )
            .ok_or_else(|| anyhow!("no protobuf schema for {kind}"))?,
        )
    } else {
        None
    };
    // The object as cached, with its protobuf form when asked for.
    let cached = |text: &str| -> Result<CachedObject> {
        let o = CachedObject::from_json(text.as_bytes(), field_set, namespaced)?;
        if let Some(codec) = &codec {
            codec
                .form(&o)
                .ok_or_else(|| anyhow!("the {what} fixture does not encode in protobuf"))?;
        }
        Ok(o)
    };
    let mut state = State::new(Settings {
        history_capacity: 1,
        history_max_age: Duration::from_secs(300),
        watcher_buffer: 100,
        blocked_budget: Duration::from_secs(10),
        node_indexed: a.kind == ObjectKind::Pod,
        namespaced,
        field_set,
    });
    let json = |i: usize| -> String {
        let ns = format!("ns-{}", i % 10);
        let rv = i as u64 + 2;
        match a.kind {
            ObjectKind::Pod => fixtures::pod(i, &ns, &fixtures::node(i % 100), rv),
            ObjectKind::Configmap => fixtures::config_map(i, &ns, rv),
            ObjectKind::Node => fixtures::node_object(i, 20, rv),
            ObjectKind::Endpointslice => fixtures::endpoint_slice(i, &ns, 3, rv),
        }
    };
    // Warm the allocator and the code paths with a throwaway state.
    {
        let mut warm = State::new(Settings {
            history_capacity: 1,
            history_max_age: Duration::from_secs(300),
            watcher_buffer: 1,
            blocked_budget: Duration::from_secs(1),
            node_indexed: false,
            namespaced,
            field_set,
        });
        warm.replace(Vec::new(), 1, Instant::now());
        for i in 0..100 {
            let o = cached(&json(i))?;
            warm.apply(EventType::Added, o, Instant::now());
        }
    }
    let before = stats::rss_self().ok_or_else(|| anyhow!("cannot read /proc/self/statm"))?;
    let started = Instant::now();
    let mut json_bytes = 0u64;
    match a.via {
        IngestPath::Apply => {
            state.replace(Vec::new(), 1, Instant::now());
            for i in 0..a.objects {
                let text = json(i);
                json_bytes += text.len() as u64;
                let o = cached(&text)?;
                state.apply(EventType::Added, o, Instant::now());
            }
        }
        IngestPath::Replace => {
            let mut items = Vec::with_capacity(a.objects);
            for i in 0..a.objects {
                let text = json(i);
                json_bytes += text.len() as u64;
                let o = cached(&text)?;
                items.push(o);
            }
            state.replace(items, a.objects as u64 + 2, Instant::now());
        }
    }
    let took = started.elapsed();
    if let Some(codec) = &codec {
        codec.settle_forms();
    }
    let proto_bytes = proto_gauge.get().max(0) as u64;
    let after = stats::rss_self().unwrap_or(0);
    let delta = after.saturating_sub(before);
    let ratio = delta as f64 / json_bytes.max(1) as f64;
    let accounted = state.bytes() as u64;
    println!("--- results");
    println!(
        "ingest: {} {what} via {:?} in {:.2}s ({:.0}/s): JSON {} ({:.0} B each)",
        a.objects,
        a.via,
        took.as_secs_f64(),
        a.objects as f64 / took.as_secs_f64(),
        mib(json_bytes),
        json_bytes as f64 / a.objects.max(1) as f64
    );
    println!(
        "ingest: RSS {} -> {}: +{} = {:.3}x the JSON, {:.0} B per object ({:.0} B over its JSON)",
        mib(before),
        mib(after),
        mib(delta),
        ratio,
        delta as f64 / a.objects.max(1) as f64,
        (delta as f64 - json_bytes as f64) / a.objects.max(1) as f64
    );
    if a.protobuf {
        println!(
            "ingest: protobuf forms {} ({:.0} B each, {:.3}x the JSON)",
            mib(proto_bytes),
            proto_bytes as f64 / a.objects.max(1) as f64,
            proto_bytes as f64 / json_bytes.max(1) as f64
        );
    }
    println!(
        "ingest: the cache's own accounting (State::bytes): {} = {:.3}x the JSON",
        mib(accounted),
        accounted as f64 / json_bytes.max(1) as f64
    );
    std::hint::black_box(&state);
    Ok(IngestReport {
        ratio,
        accounted: state.bytes(),
    })
}

// --- self-test ---

async fn self_test() -> Result<()> {
    let sim_args = SimArgs {
        sim: true,
        direct: false,
        proxy_bin: None,
        sim_pods: 300,
        sim_nodes: 10,
        watcher_buffer: None,
    };
    let target_args = TargetArgs {
        kubeconfig: None,
        context: None,
        proto: Proto::H2,
        encoding: Encoding::Json,
        sim: sim_args.clone(),
        real: RealArgs {
            real: false,
            pods: 0,
            configmaps: 0,
        },
    };
    let sim_env = SimEnv::start(&sim_args).await?;
    let target = Target::from_kubeconfig(Some(&sim_env.kubeconfig(false)?), None).await?;
    let env = Env::Sim(sim_env);
    let mut failures = Vec::new();

    for encoding in [Encoding::Json, Encoding::Protobuf] {
        println!("=== watch ({encoding:?}): 50 watchers, 1 writer at 20 writes/s for 3s");
        let target = target.clone().with_accept(encoding.accept());
        let w = watch_on(
            &target,
            Some(&env),
            &WatchArgs {
                target: TargetArgs {
                    encoding,
                    ..target_args.clone()
                },
                resource: ResourceArgs {
                    namespace: "default".into(),
                    group: String::new(),
                    version: "v1".into(),
                    resource: "configmaps".into(),
                    kind: None,
                },
                watchers: 50,
                watchers_per_conn: 20,
                writers: 1,
                rate: 20.0,
                duration: 3,
                objects_per_writer: 2,
                payload_bytes: 64,
                drain: 5,
                lists: 3,
                list_path: "/api/v1/pods?resourceVersion=0".into(),
                keep: false,
            },
        )
        .await?;
        if w.writes == 0 || w.delivered != w.expected || w.errors > 0 {
            failures.push(format!("watch ({encoding:?}): {w:?}"));
        }
    }

    let load_args = |concurrency: usize, write_rate: f64| LoadArgs {
        concurrency,
        rounds: 1,
        write_rate,
        write_collection: None,
        other_write_rate: if write_rate > 0.0 { 10.0 } else { 0.0 },
        compare_kubeconfig: None,
    };
    println!("=== get: 50 requests per path");
    let g = get_on(
        &target,
        Some(&env),
        &GetArgs {
            target: target_args.clone(),
            requests: 50,
            warmup: 5,
            paths: Vec::new(),
            load: load_args(1, 0.0),
        },
    )
    .await?;
    failures.extend(check_compared(&g));

    println!("=== get: 20 clients, a consistent GET (passed through, no probe)");
    let g = get_on(
        &target,
        Some(&env),
        &GetArgs {
            target: target_args.clone(),
            requests: 10,
            warmup: 1,
            paths: vec!["/api/v1/namespaces/default/configmaps/kcp-load-get".into()],
            load: load_args(20, 0.0),
        },
    )
    .await?;
    failures.extend(check_compared(&g));
    for c in &g {
        let reads = c.target.reads.clone().unwrap_or_default();
        let passed = reads
            .get(
                ["configmaps", "GET", "upstream", "consistent_get"]
                    .map(String::from)
                    .as_slice(),
            )
            .copied()
            .unwrap_or(0.0);
        let probes: f64 = c.target.probes.iter().flatten().map(|(_, v)| v).sum();
        if passed != c.target.requests as f64 || probes > 0.0 {
            failures.push(format!(
                "consistent get: {passed} of {} passed through early, {probes} probes: {reads:?}",
                c.target.requests
            ));
        }
    }

    println!("=== list: 20 clients, consistent and RV=0 lists, a writer at 20/s");
    let l = list_on(
        &target,
        Some(&env),
        &ListArgs {
            target: target_args.clone(),
            requests: 5,
            warmup: 1,
            paths: vec!["/api/v1/namespaces/default/configmaps".into()],
            load: load_args(20, 20.0),
        },
    )
    .await?;
    failures.extend(check_compared(&l));
    let l0 = list_on(
        &target,
        Some(&env),
        &ListArgs {
            target: target_args.clone(),
            requests: 5,
            warmup: 1,
            paths: vec!["/api/v1/namespaces/default/configmaps?resourceVersion=0".into()],
            load: load_args(20, 0.0),
        },
    )
    .await?;
    failures.extend(check_compared(&l0));
    for c in l.iter().chain(&l0) {
        let resource = path_resource(&c.path);
        let counted: f64 = c
            .target
            .reads
            .iter()
            .flatten()
            .filter(|(k, _)| k[0] == "configmaps" && k[1] == "LIST")
            .map(|(_, v)| v)
            .sum();
        if counted != c.target.requests as f64 {
            failures.push(format!(
                "list {}: the proxy counted {counted} reads of {}",
                c.path, c.target.requests
            ));
        }
        if c.path.ends_with("resourceVersion=0")
            && resource.and_then(|r| c.target.cache_share(&r)) != Some(1.0)
        {
            failures.push(format!("list {}: not all from the cache", c.path));
        }
    }

    println!("=== idle: 200 watches");
    let idle = idle_on(
        &target,
        Some(&env),
        &IdleArgs {
            target: target_args.clone(),
            watchers: 200,
            watchers_per_conn: 100,
            path: "/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3D{node}&resourceVersion={rv}&timeoutSeconds=600".into(),
            rv_path: "/api/v1/pods?limit=1".into(),
            pid: None,
            steps: 2,
            hold: 0,
        },
    )
    .await?;
    println!(
        "(idle: {:.0} B per watch, in-process: proxy, sim and clients together)",
        idle.per_watcher
    );
    if idle.errors > 0 {
        failures.push(format!("idle: {idle:?}"));
    }

    println!("=== authz: 20 identities");
    let Env::Sim(sim_env) = &env else {
        bail!("the self-test runs against --sim");
    };
    let z = authz_on(
        sim_env,
        &AuthzArgs {
            target: target_args.clone(),
            identities: 20,
            warm: 3,
            path: "/api/v1/namespaces/default/configmaps?resourceVersion=0".into(),
        },
    )
    .await?;
    if z.decision_cache_us.is_nan() || z.decision_upstream_us.is_nan() {
        failures.push(format!("authz: a decision source was never seen: {z:?}"));
    }
    env.stop().await;

    println!("=== ingest: 2000 pods");
    let i = ingest(&IngestArgs {
        objects: 2000,
        kind: ObjectKind::Pod,
        via: IngestPath::Apply,
        protobuf: true,
        protobuf_cache_mib: 64,
    })?;
    // The RSS figure means something only in a fresh process (`kcp-load
    // ingest`): here the sim's and proxy's freed memory is reused.
    println!(
        "(ingest RSS ratio {:.3}: not meaningful in the self-test's used process)",
        i.ratio
    );
    if i.accounted == 0 {
        failures.push(format!("ingest: {i:?}"));
    }

    if failures.is_empty() {
        println!("self-test: passed");
        Ok(())
    } else {
        Err(anyhow!("self-test failed: {}", failures.join("; ")))
    }
}

/// Errors of compared runs, as self-test failures.
fn check_compared(runs: &[Compared]) -> Vec<String> {
    let mut failures = Vec::new();
    for c in runs {
        for (side, o) in [("proxy", Some(&c.target)), ("direct", c.direct.as_ref())] {
            match o {
                Some(o) if o.errors > 0 || o.requests == 0 => failures.push(format!(
                    "{} via {side}: {} errors of {} requests: {:?}",
                    c.path, o.errors, o.requests, o.last_error
                )),
                None => failures.push(format!("{}: no direct run to compare with", c.path)),
                Some(_) => {}
            }
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_resource_of_a_path() {
        let r = |p: &str| path_resource(p).map(|(g, r, v)| format!("{g}/{r}/{v}"));
        assert_eq!(
            r("/api/v1/pods?resourceVersion=0").as_deref(),
            Some("/pods/LIST")
        );
        assert_eq!(
            r("/api/v1/namespaces/default/configmaps/x").as_deref(),
            Some("/configmaps/GET")
        );
        assert_eq!(
            r("/apis/coordination.k8s.io/v1/namespaces/d/leases").as_deref(),
            Some("coordination.k8s.io/leases/LIST")
        );
        assert_eq!(
            r("/api/v1/namespaces/default").as_deref(),
            Some("/namespaces/GET")
        );
        assert_eq!(r("/healthz"), None);
        assert_eq!(
            parse_collection("/api/v1/namespaces/default/configmaps/x?a=b"),
            Some(("v1".into(), "default".into(), "configmaps".into()))
        );
        assert_eq!(
            parse_collection("/apis/coordination.k8s.io/v1/namespaces/n/leases"),
            Some(("coordination.k8s.io/v1".into(), "n".into(), "leases".into()))
        );
        assert_eq!(parse_collection("/api/v1/pods"), None);
    }

    #[test]
    fn finds_the_write_time() {
        let line = br#"{"type":"MODIFIED","object":{"metadata":{"annotations":{"kcp-load/sent-unix-nanos":"1732190000123456789"}}}}"#;
        assert_eq!(sent_at(line), Some(1_732_190_000_123_456_789));
        assert_eq!(sent_at(br#"{"type":"BOOKMARK"}"#), None);
        let body = object_body("ConfigMap", "v1", "ns", "n", "AAAA");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["data"]["payload"], "AAAA");
        assert!(sent_at(&body).is_some());
    }

    #[test]
    fn updates_carry_the_last_resource_version() {
        let body = object_body("Lease", "coordination.k8s.io/v1", "default", "l", "");
        assert_eq!(resource_version_of(&body), None);
        let updated = with_resource_version(&body, "42");
        assert_eq!(resource_version_of(&updated).as_deref(), Some("42"));
        let v: Value = serde_json::from_slice(&updated).unwrap();
        assert_eq!(v["spec"]["holderIdentity"], "l");
        assert!(sent_at(&updated).is_some());
    }
}
