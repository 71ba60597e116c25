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
//! - `list`: K list requests (latency, time to first byte, MB/s).
//! - `get`: sequential GETs of one object, through the proxy and (with
//!   `--sim`) directly, for the pass-through or cache latency added.
//! - `idle`: N idle watches over HTTP/2, and the proxy's resident memory
//!   before and after (`/proc/<pid>/status`), per watcher.
//! - `ingest`: N objects ingested into a cache `State` in this process; the
//!   resident memory added, relative to the objects' JSON size.
//! - `--self-test`: all of the above, small, against `--sim`.
//!
//! `docs/performance.md` has the commands and figures.

mod client;
mod env;
mod fixtures;
mod hollow;
mod stats;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand, ValueEnum};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use kube_cache_proxy::cache::encode::ProtoCodec;
use kube_cache_proxy::cache::event::EventType;
use kube_cache_proxy::cache::object::CachedObject;
use kube_cache_proxy::cache::store::{Settings, State};
use kube_cache_proxy::resource::FieldSet;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use client::{Conn, Proto, Target};
use env::{SimArgs, SimEnv};
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
    /// List requests, one after another.
    #[arg(long, default_value_t = 20)]
    requests: usize,
    /// Path and query of the list.
    #[arg(long, default_value = "/api/v1/pods?resourceVersion=0")]
    path: String,
}

#[derive(Debug, Clone, Args)]
struct GetArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Requests per path, one after another on one connection.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Requests per path before measuring.
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Paths to GET (repeatable). Default with --sim: a secret (passed
    /// through, secrets are not cached) and a configmap (cached), created
    /// first.
    #[arg(long = "path")]
    paths: Vec<String>,
    /// Also run the same requests against this kubeconfig's server (the
    /// apiserver directly), for comparison. With --sim this is the sim.
    #[arg(long, value_name = "FILE")]
    compare_kubeconfig: Option<PathBuf>,
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    println!("$ {}", command_line());
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
            (None, false) => Err(anyhow!(
                "a subcommand or --self-test is required (see --help)"
            )),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
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

/// The target: a started sim and proxy, or a kubeconfig's server.
async fn resolve(t: &TargetArgs) -> Result<(Target, Option<SimEnv>)> {
    if t.sim.sim {
        let env = SimEnv::start(&t.sim).await?;
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
    if matches!(kind, "ConfigMap" | "Secret")
        && !payload.is_empty()
        && let Some(m) = o.as_object_mut()
    {
        m.insert("data".into(), json!({ "payload": payload }));
    }
    Bytes::from(serde_json::to_vec(&o).unwrap_or_default())
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
    let mut next = tokio::time::Instant::now();
    let mut i = 0usize;
    while Instant::now() < plan.end {
        tokio::time::sleep_until(next).await;
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
        let body = object_body(
            &plan.kind,
            &plan.api_version,
            &plan.namespace,
            name,
            &plan.payload,
        );
        let start = Instant::now();
        match target.fetch(&mut conn, method, &path, Some(body)).await {
            Ok(r) if r.status.is_success() => {
                out.ok += 1;
                out.latencies.push(micros(start.elapsed()));
                created[k] = true;
            }
            Ok(r) if r.status == StatusCode::CONFLICT && !created[k] => {
                // Left over from an earlier run: update it from now on.
                created[k] = true;
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

async fn watch_on(target: &Target, env: Option<&SimEnv>, a: &WatchArgs) -> Result<WatchReport> {
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

    let pid = env.filter(|e| e.proxy_is_separate()).map(SimEnv::proxy_pid);
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
    let result = list_run(&target, a.target.proto, &a.path, a.requests).await;
    if let (Ok(_), Some(env)) = (&result, &env)
        && !a.target.sim.direct
    {
        println!("--- the same, directly against the simulated apiserver");
        let direct = Target::from_kubeconfig(Some(&env.kubeconfig(true)?), None)
            .await?
            .with_accept(a.target.encoding.accept());
        list_run(&direct, a.target.proto, &a.path, a.requests).await?;
    }
    if let Some(env) = env {
        env.stop().await;
    }
    result.map(|_| ())
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
    result
}

async fn get_on(target: &Target, env: Option<&SimEnv>, a: &GetArgs) -> Result<()> {
    let proto = a.target.proto;
    let mut paths = a.paths.clone();
    if let Some(env) = env {
        // A secret (not cached: passed through) and a configmap (cached).
        for (resource, kind, extra) in [
            ("secrets", "Secret", json!({"data": {"k": "dmFsdWU="}})),
            ("configmaps", "ConfigMap", json!({"data": {"k": "value"}})),
        ] {
            let mut o = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": "kcp-load-get", "namespace": "default"}});
            if let (Some(m), Some(e)) = (o.as_object_mut(), extra.as_object()) {
                m.extend(e.clone());
            }
            let gvr = kube_cache_proxy::resource::Gvr {
                group: String::new(),
                version: "v1".into(),
                resource: resource.into(),
            };
            match env.sim.create(&gvr, o) {
                Ok(_) => {}
                Err(s) if s.code == 409 => {}
                Err(s) => bail!("creating a {kind}: {}", s.message),
            }
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
        bail!("--path is required without --sim");
    }
    let compare = match (env, &a.compare_kubeconfig) {
        (_, Some(k)) => Some(Target::from_kubeconfig(Some(k), None).await?),
        (Some(env), None) if !a.target.sim.direct => {
            Some(Target::from_kubeconfig(Some(&env.kubeconfig(true)?), None).await?)
        }
        _ => None,
    };
    for path in &paths {
        let through = get_run(target, proto, path, a.requests, a.warmup).await?;
        println!("get {path} via {}: {through}", target.base());
        if let Some(direct) = &compare {
            let d = get_run(direct, proto, path, a.requests, a.warmup).await?;
            println!("get {path} via {} (direct): {d}", direct.base());
            let diff = |a: u64, b: u64| format!("{:+.3}ms", (a as f64 - b as f64) / 1000.0);
            println!(
                "get {path}: added p50 {} p90 {} p99 {}",
                diff(through.p50, d.p50),
                diff(through.p90, d.p90),
                diff(through.p99, d.p99)
            );
        }
    }
    Ok(())
}

async fn get_run(
    target: &Target,
    proto: Proto,
    path: &str,
    n: usize,
    warmup: usize,
) -> Result<Summary> {
    let mut conn = target.connect(proto).await?;
    let mut lat = Vec::with_capacity(n);
    for i in 0..warmup + n {
        let start = Instant::now();
        let r = target.fetch(&mut conn, Method::GET, path, None).await?;
        let took = start.elapsed();
        if r.status != StatusCode::OK {
            bail!(
                "GET {path}: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
        }
        if i >= warmup {
            lat.push(micros(took));
        }
    }
    Ok(Summary::of(&mut lat))
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
            kube_cache_proxy::kubeconfig::with_certificate(
                &env.proxy_url,
                &env.proxy_ca_pem,
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

async fn idle_on(target: &Target, env: Option<&SimEnv>, a: &IdleArgs) -> Result<IdleReport> {
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
                prometheus::IntGauge::new("encoded_bytes", "-")?,
                prometheus::IntCounter::new("encode_failures", "-")?,
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
            o.proto(codec)
                .ok_or_else(|| anyhow!("the {what} fixture does not encode in protobuf"))?;
        }
        Ok(o)
    };
    let mut proto_bytes = 0u64;
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
                proto_bytes += o.proto_size() as u64;
                state.apply(EventType::Added, o, Instant::now());
            }
        }
        IngestPath::Replace => {
            let mut items = Vec::with_capacity(a.objects);
            for i in 0..a.objects {
                let text = json(i);
                json_bytes += text.len() as u64;
                let o = cached(&text)?;
                proto_bytes += o.proto_size() as u64;
                items.push(o);
            }
            state.replace(items, a.objects as u64 + 2, Instant::now());
        }
    }
    let took = started.elapsed();
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
    };
    let env = SimEnv::start(&sim_args).await?;
    let target = Target::from_kubeconfig(Some(&env.kubeconfig(false)?), None).await?;
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

    println!("=== get: 50 requests per path");
    get_on(
        &target,
        Some(&env),
        &GetArgs {
            target: target_args.clone(),
            requests: 50,
            warmup: 5,
            paths: Vec::new(),
            compare_kubeconfig: None,
        },
    )
    .await?;

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
    let z = authz_on(
        &env,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
