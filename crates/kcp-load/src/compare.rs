//! `compare`: the proxy and a real kube-apiserver v1.36 side by side, in
//! one run, in a quiet cluster and in busy ones (issue 23's report).
//!
//! One control plane (`kube-testenv`, `../shared/k8s/`) and one proxy (the
//! release binary, its own process, so that its CPU and memory are read
//! from `/proc/<pid>` alone), both used as admin (`system:masters`). For
//! each cluster state (quiet, then a Lease writer at each `--busy` rate,
//! as node heartbeats are: a resource the proxy does not cache) the same
//! requests go through the proxy and directly, one side after the other:
//!
//! - LIST of every pod at `resourceVersion=0`, consistent (unset), and a
//!   streaming list (`sendInitialEvents=true`, timed to its
//!   `initial-events-end` bookmark), in JSON and in protobuf: latency, and
//!   the apiserver's pod reads (`apiserver_request_total`) per request;
//! - watch delivery over HTTP/2 and HTTP/1.1: configmaps of
//!   `--payload-bytes` written directly to the apiserver at `--rate`
//!   writes/s, watched by `--h2-watchers`/`--h1-watchers`: delivery
//!   latency, and CPU per delivered event — the proxy's process, and the
//!   apiserver's *beyond* what it spent on the same writes with the proxy
//!   as its one watcher (so that the Lease writer's and the writes' own
//!   cost fall out of the direct figure).
//!
//! Memory per cached object, once: the growth of each process's resident
//! memory while the pods are created (the proxy already running, so that
//! it caches them from its watch) ÷ the pods' JSON bytes, and again after
//! one protobuf list of them on each side.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use kube_testenv::{AssetsError, ControlPlane, Options};
use tokio_util::sync::CancellationToken;

use crate::client::{Proto, Target};
use crate::common::load::{LoadOut, Meters, load};
use crate::common::target::{Encoding, encode_query, list_rv};
use crate::common::watchers::{Counters, open_watchers, wait_started};
use crate::common::writers::{MANAGED_BY, WriteOut, WriterPlan, writer};
use crate::env::{RunningProxy, Tuning, temp_dir};
use crate::metrics;
use crate::real::{Skip, seed};
use crate::stats::{self, Summary, micros};

#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// The proxy binary, run as its own process.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "target/release/kube-cache-proxy"
    )]
    proxy_bin: PathBuf,
    /// Pods created (about 4.6 KB each, over 100 nodes and 10 namespaces).
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Lease writes per second of each busy cluster measured after the
    /// quiet one (repeatable; 0 values are skipped).
    #[arg(long = "busy", default_values_t = [50.0, 500.0])]
    busy: Vec<f64>,
    /// Measured lists (and streaming lists) per kind and side, after one.
    #[arg(long, default_value_t = 5)]
    lists: usize,
    /// HTTP/2 watchers (100 per connection); 0: none.
    #[arg(long, default_value_t = 1000)]
    h2_watchers: usize,
    /// HTTP/1.1 watchers (one connection each); 0: none.
    #[arg(long, default_value_t = 500)]
    h1_watchers: usize,
    /// Configmap writes per second while watched.
    #[arg(long, default_value_t = 50.0)]
    rate: f64,
    /// Seconds of writing per watch run.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Size of the written configmaps' `payload` entry.
    #[arg(long, default_value_t = 2048)]
    payload_bytes: usize,
    /// The proxy's `cache.consistentListWaitMilliseconds` (default: its
    /// own default, 0).
    #[arg(long)]
    consistent_list_wait_ms: Option<u64>,
    /// The proxy's `cache.protobufCacheMib` (default: its own, 64).
    #[arg(long)]
    protobuf_cache_mib: Option<u64>,
    /// The proxy's `cache.protobufCachePercent` (default: its own, 5).
    #[arg(long)]
    protobuf_cache_percent: Option<u64>,
}

/// One figure on both sides.
struct Row {
    cluster: String,
    what: String,
    direct: String,
    proxy: String,
    ratio: String,
    upstream: String,
}

/// A read measured on one side.
struct Reads {
    lat: Summary,
    errors: usize,
    /// The apiserver's pod reads (requests) per request.
    upstream: Option<f64>,
    from_cache: Option<f64>,
    /// Bytes of pods the apiserver sent per request: its LIST responses
    /// (`apiserver_response_sizes_sum`) and watch events
    /// (`apiserver_watch_events_sizes_sum`).
    upstream_bytes: Option<f64>,
}

/// Bytes of pods the apiserver has sent (LIST responses and watch events).
fn pod_bytes(samples: &[metrics::Sample]) -> f64 {
    samples
        .iter()
        .filter(|s| {
            s.label("resource") == "pods"
                && ((s.name == "apiserver_response_sizes_sum" && s.label("verb") == "LIST")
                    || s.name == "apiserver_watch_events_sizes_sum")
        })
        .map(|s| s.value)
        .sum()
}

/// A watch run measured on one side.
struct Delivery {
    delivered: u64,
    expected: u64,
    lat: Summary,
    proxy_cpu: Option<Duration>,
    apiserver_cpu: Duration,
    errors: u64,
}

pub async fn compare(a: &CompareArgs) -> Result<()> {
    let started = Instant::now();
    let cp = match ControlPlane::start(Options::default()).await {
        Ok(cp) => cp,
        Err(kube_testenv::Error::Assets(e @ AssetsError::Absent { .. })) => {
            return Err(Skip(format!("compare: {e}")).into());
        }
        Err(e) => bail!("starting the control plane: {e}"),
    };
    println!(
        "apiserver: {} (binaries from {}), pid {}, ready in {:.1}s",
        cp.url(),
        cp.assets().source,
        cp.apiserver_pid(),
        started.elapsed().as_secs_f64()
    );
    let dir = temp_dir()?;
    let proxy = RunningProxy::start(
        &dir,
        &cp.ca_pem(),
        &cp.kubeconfig_text(&cp.url(), "admin", cp.admin()),
        Tuning {
            watcher_buffer: None,
            consistent_list_wait_ms: a.consistent_list_wait_ms,
            protobuf_cache_mib: a.protobuf_cache_mib,
            protobuf_cache_percent: a.protobuf_cache_percent,
            ..Tuning::default()
        },
        Some(&a.proxy_bin),
    )
    .await?;
    let result = run(a, &cp, &proxy, &dir).await;
    proxy.stop().await;
    let cp_dir = cp.dir().to_path_buf();
    drop(cp);
    let _ = std::fs::remove_dir_all(cp_dir);
    let _ = std::fs::remove_dir_all(dir);
    result
}

async fn run(
    a: &CompareArgs,
    cp: &ControlPlane,
    proxy: &RunningProxy,
    dir: &std::path::Path,
) -> Result<()> {
    proxy.ready(Duration::from_secs(120)).await?;
    let kubeconfig = dir.join("proxy.kubeconfig");
    std::fs::write(
        &kubeconfig,
        proxy.kubeconfig("admin", &cp.admin().cert_pem, &cp.admin().key_pem),
    )?;
    let through = Target::from_kubeconfig(Some(&kubeconfig), None).await?;
    let direct = Target::from_kubeconfig(Some(cp.admin_kubeconfig()), None).await?;
    let (proxy_pid, api_pid) = (proxy.pid(), cp.apiserver_pid());
    let mut rows = Vec::new();

    // Memory: the growth while the pods are created and cached.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss0 = (stats::rss_of(proxy_pid), stats::rss_of(api_pid));
    seed(&direct, a.pods, "pods").await?;
    wait_cached(proxy, a.pods, Duration::from_secs(120)).await?;
    let json_bytes = {
        let mut conn = direct.connect(Proto::H2).await?;
        let r = direct
            .fetch(
                &mut conn,
                Method::GET,
                "/api/v1/pods?resourceVersion=0",
                None,
            )
            .await?;
        r.body.len() as u64
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss1 = (stats::rss_of(proxy_pid), stats::rss_of(api_pid));
    for t in [&through, &direct] {
        let t = t.clone().with_accept(Encoding::Protobuf.accept());
        let mut conn = t.connect(Proto::H2).await?;
        t.fetch(
            &mut conn,
            Method::GET,
            "/api/v1/pods?resourceVersion=0",
            None,
        )
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss2 = (stats::rss_of(proxy_pid), stats::rss_of(api_pid));
    println!(
        "memory: {} pods, {} of JSON; resident before {:?}, after creating {:?}, after a protobuf list {:?} (proxy, apiserver)",
        a.pods,
        stats::mib(json_bytes),
        rss0,
        rss1,
        rss2
    );
    let per = |before: Option<u64>, after: Option<u64>| {
        before
            .zip(after)
            .map(|(b, a)| a.saturating_sub(b) as f64 / json_bytes.max(1) as f64)
    };
    for (what, after) in [("JSON reads", rss1), ("after a protobuf list", rss2)] {
        let (p, d) = (per(rss0.0, after.0), per(rss0.1, after.1));
        rows.push(Row {
            cluster: "quiet".into(),
            what: format!("memory per cached pod ÷ its JSON, {what}"),
            direct: opt(d, |v| format!("{v:.2}×")),
            proxy: opt(p, |v| format!("{v:.2}×")),
            ratio: ratio(p, d),
            upstream: "—".into(),
        });
    }

    let mut states = vec![0.0];
    states.extend(a.busy.iter().copied().filter(|r| *r > 0.0));
    for rate in states {
        let cluster = if rate > 0.0 {
            format!("busy ({rate:.0} Lease writes/s)")
        } else {
            "quiet".to_string()
        };
        println!("=== {cluster}");
        let stop = CancellationToken::new();
        let leases = lease_writers(&direct, rate, &stop);
        if !leases.is_empty() {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let lease_start = Instant::now();
        measure_lists(a, proxy, &through, &direct, &cluster, &mut rows).await?;
        if rate == 0.0 {
            // What the allocator keeps after many large lists, JSON and
            // protobuf, were served: the resident memory an operator sees.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let rss3 = (stats::rss_of(proxy_pid), stats::rss_of(api_pid));
            println!("memory after the lists: {rss3:?} (proxy, apiserver)");
            let (p, d) = (per(rss0.0, rss3.0), per(rss0.1, rss3.1));
            rows.push(Row {
                cluster: cluster.clone(),
                what: "memory per cached pod ÷ its JSON, after the lists above".into(),
                direct: opt(d, |v| format!("{v:.2}×")),
                proxy: opt(p, |v| format!("{v:.2}×")),
                ratio: ratio(p, d),
                upstream: "—".into(),
            });
        }
        for (proto, watchers) in [(Proto::H2, a.h2_watchers), (Proto::H1, a.h1_watchers)] {
            if watchers == 0 {
                continue;
            }
            let p = delivery(
                a,
                &through,
                &direct,
                proto,
                watchers,
                Some(proxy_pid),
                api_pid,
            )
            .await?;
            let d = delivery(a, &direct, &direct, proto, watchers, None, api_pid).await?;
            delivery_rows(&cluster, proto, watchers, &p, &d, &mut rows);
        }
        stop.cancel();
        let secs = lease_start.elapsed().as_secs_f64();
        let mut w = WriteOut::default();
        for h in leases {
            let o = h.await?;
            w.ok += o.ok;
            w.errors += o.errors;
            w.last_error = o.last_error.or(w.last_error);
        }
        if rate > 0.0 {
            println!(
                "leases: {:.0} writes/s reached of {rate:.0} asked, {} errors{}",
                w.ok as f64 / secs,
                w.errors,
                w.last_error
                    .map(|e| format!("; last: {e}"))
                    .unwrap_or_default()
            );
            rows.push(Row {
                cluster: cluster.clone(),
                what: "Lease writes/s reached (to the apiserver)".into(),
                direct: format!("{:.0}", w.ok as f64 / secs),
                proxy: "—".into(),
                ratio: "—".into(),
                upstream: "—".into(),
            });
        }
    }

    println!("--- table");
    println!(
        "| cluster | measurement | direct | through the proxy | proxy ÷ direct | through the proxy: upstream LIST-equivalents per request (pods' bytes sent by the apiserver ÷ direct's) and requests |"
    );
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.cluster, r.what, r.direct, r.proxy, r.ratio, r.upstream
        );
    }
    Ok(())
}

/// Waits until the proxy's pod cache holds at least `n` objects.
pub(crate) async fn wait_cached(proxy: &RunningProxy, n: usize, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok((200, text)) = proxy.admin_get("/metrics").await {
            let objects = metrics::parse(&text)
                .into_iter()
                .find(|s| {
                    s.name == "kube_cache_proxy_cache_objects"
                        && s.labels.iter().any(|(k, v)| k == "resource" && v == "pods")
                })
                .map(|s| s.value as usize);
            if objects.is_some_and(|o| o >= n) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("the proxy did not cache {n} pods within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Lease writers reaching `rate` writes/s together (about 40/s each, on
/// their own connections), straight to the apiserver.
pub(crate) fn lease_writers(
    direct: &Target,
    rate: f64,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<WriteOut>> {
    if rate <= 0.0 {
        return Vec::new();
    }
    let n = (rate / 40.0).ceil().max(1.0) as usize;
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    (0..n)
        .map(|w| {
            tokio::spawn(writer(
                direct.clone(),
                Proto::H2,
                WriterPlan {
                    kind: "Lease".into(),
                    api_version: "coordination.k8s.io/v1".into(),
                    namespace: "default".into(),
                    collection: "/apis/coordination.k8s.io/v1/namespaces/default/leases".into(),
                    names: (0..10)
                        .map(|k| format!("kcp-load-{run_id}-{w}-{k}"))
                        .collect(),
                    payload: String::new(),
                    interval: Duration::from_secs_f64(n as f64 / rate),
                    end: Instant::now() + Duration::from_secs(24 * 3600),
                    stop: stop.clone(),
                },
            ))
        })
        .collect()
}

const PODS: (&str, &str, &str) = ("", "pods", "LIST");

async fn measure_lists(
    a: &CompareArgs,
    proxy: &RunningProxy,
    through: &Target,
    direct: &Target,
    cluster: &str,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let kinds: [(&str, &str, bool); 3] = [
        (
            "LIST at resourceVersion=0",
            "/api/v1/pods?resourceVersion=0",
            false,
        ),
        ("consistent LIST", "/api/v1/pods", false),
        (
            "streaming list, to initial-events-end",
            "/api/v1/pods?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=300",
            true,
        ),
    ];
    for (what, path, streaming) in kinds {
        for encoding in [Encoding::Json, Encoding::Protobuf] {
            let enc = if encoding == Encoding::Json {
                "JSON"
            } else {
                "protobuf"
            };
            let t = through.clone().with_accept(encoding.accept());
            let d = direct.clone().with_accept(encoding.accept());
            let apiserver = direct.clone().with_accept("application/json");
            let through_meters = Meters {
                proxy: Some(proxy),
                apiserver: Some(&apiserver),
            };
            let direct_meters = Meters {
                proxy: None,
                apiserver: Some(&apiserver),
            };
            let p = reads(&t, path, streaming, a.lists, &through_meters).await?;
            let d = reads(&d, path, streaming, a.lists, &direct_meters).await?;
            println!(
                "{what}, {enc}: proxy {} ({} errors, {} upstream/request, {} from the cache); direct {} ({} errors)",
                p.lat,
                p.errors,
                opt(p.upstream, |v| format!("{v:.2}")),
                opt(p.from_cache, |v| format!("{:.0} %", v * 100.0)),
                d.lat,
                d.errors
            );
            let ms = |s: &Summary| format!("{} / {} ms", ms1(s.p50), ms1(s.p99));
            rows.push(Row {
                cluster: cluster.into(),
                what: format!("{what}, {} pods, {enc}, p50 / p99", a.pods),
                direct: ms(&d.lat),
                proxy: ms(&p.lat),
                ratio: ratio(Some(p.lat.p50 as f64), Some(d.lat.p50 as f64)),
                upstream: format!(
                    "{} ({} requests; {} from the cache)",
                    ratio(p.upstream_bytes, d.upstream_bytes),
                    opt(p.upstream, |v| format!("{v:.2}")),
                    opt(p.from_cache, |v| format!("{:.0} %", v * 100.0))
                ),
            });
        }
    }
    Ok(())
}

/// `n` reads of `path` (after one), one after another on one HTTP/2
/// connection; a streaming list is timed to its `initial-events-end`.
async fn reads(
    target: &Target,
    path: &str,
    streaming: bool,
    n: usize,
    meters: &Meters<'_>,
) -> Result<Reads> {
    let before_bytes;
    let mut out = if streaming {
        let mut conn = target.connect(Proto::H2).await?;
        let _ = initial_events_end(target, &mut conn, path).await;
        let before = meters.snapshot().await;
        before_bytes = before.1.as_deref().map(pod_bytes);
        let mut o = LoadOut::default();
        for _ in 0..n {
            o.requests += 1;
            match initial_events_end(target, &mut conn, path).await {
                Ok(d) => o.latencies.push(micros(d)),
                Err(e) => {
                    o.errors += 1;
                    o.last_error = Some(format!("{e:#}"));
                    conn = target.connect(Proto::H2).await?;
                }
            }
        }
        // The apiserver counts a watch when it ends.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = meters.snapshot().await;
        o.record_growth(&before, &after);
        o
    } else {
        load(target, Proto::H2, path, 1, 1, 0, meters).await?;
        before_bytes = meters.snapshot().await.1.as_deref().map(pod_bytes);
        load(target, Proto::H2, path, 1, n, 0, meters).await?
    };
    if streaming {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let after_bytes = meters.snapshot().await.1.as_deref().map(pod_bytes);
    let upstream_bytes = before_bytes
        .zip(after_bytes)
        .map(|(b, a)| (a - b) / out.requests.max(1) as f64);
    if let Some(e) = &out.last_error {
        println!("{path}: last error: {e}");
    }
    let watch = (PODS.0.to_string(), PODS.1.to_string(), "WATCH");
    let list = (PODS.0.to_string(), PODS.1.to_string(), PODS.2);
    let key = if streaming { &watch } else { &list };
    Ok(Reads {
        lat: Summary::of(&mut out.latencies),
        errors: out.errors,
        upstream: out.upstream_per_request(key),
        from_cache: out.cache_share(key),
        upstream_bytes,
    })
}

/// Opens a streaming list and reads it until its `initial-events-end`
/// bookmark; the stream is then dropped (reset).
pub(crate) async fn initial_events_end(
    target: &Target,
    conn: &mut crate::client::Conn,
    path: &str,
) -> Result<Duration> {
    const MARK: &[u8] = b"k8s.io/initial-events-end";
    let req = target.request(conn, Method::GET, path, None)?;
    let start = Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(30), conn.send(req)).await??;
    if resp.status() != StatusCode::OK {
        bail!("{path}: {}", resp.status());
    }
    let mut body = resp.into_body();
    let mut tail: Vec<u8> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .map_err(|_| anyhow::anyhow!("{path}: no initial-events-end within 30s"))?;
        let Some(frame) = frame else {
            bail!("{path}: ended before initial-events-end");
        };
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        // The mark may straddle two frames: keep the last bytes.
        tail.extend_from_slice(&data);
        if tail.windows(MARK.len()).any(|w| w == MARK) {
            return Ok(start.elapsed());
        }
        let keep = tail.len().saturating_sub(MARK.len());
        tail.drain(..keep);
    }
}

/// Configmaps written straight to the apiserver, watched through `side`.
#[allow(clippy::too_many_arguments)]
async fn delivery(
    a: &CompareArgs,
    side: &Target,
    direct: &Target,
    proto: Proto,
    watchers: usize,
    proxy_pid: Option<u32>,
    api_pid: u32,
) -> Result<Delivery> {
    let coll = "/api/v1/namespaces/default/configmaps";
    let selector = encode_query(MANAGED_BY);
    let rv = list_rv(
        side,
        proto,
        &format!("{coll}?limit=1&labelSelector={selector}"),
    )
    .await?;
    let path = format!(
        "{coll}?watch=1&allowWatchBookmarks=true&resourceVersion={rv}&labelSelector={selector}&timeoutSeconds=3600"
    );
    let stop = CancellationToken::new();
    let counters = Arc::new(Counters {
        started: AtomicUsize::new(0),
        delivered: AtomicU64::new(0),
    });
    let tasks = open_watchers(
        side,
        proto,
        watchers,
        100,
        0,
        |_| path.clone(),
        &stop,
        &counters,
    )
    .await?;
    wait_started(&counters, watchers, Duration::from_secs(120)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu0 = (proxy_pid.and_then(stats::cpu_of), stats::cpu_of(api_pid));
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let names: Vec<String> = (0..10).map(|k| format!("kcp-load-{run_id}-{k}")).collect();
    let w = writer(
        direct.clone(),
        Proto::H2,
        WriterPlan {
            kind: "ConfigMap".into(),
            api_version: "v1".into(),
            namespace: "default".into(),
            collection: coll.into(),
            names: names.clone(),
            payload: "A".repeat(a.payload_bytes / 4 * 4),
            interval: Duration::from_secs_f64(1.0 / a.rate.max(0.001)),
            end: Instant::now() + Duration::from_secs(a.duration),
            stop: CancellationToken::new(),
        },
    )
    .await;
    let expected = w.ok * watchers as u64;
    let drain = Instant::now() + Duration::from_secs(10);
    while counters.delivered.load(Ordering::Relaxed) < expected && Instant::now() < drain {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cpu1 = (proxy_pid.and_then(stats::cpu_of), stats::cpu_of(api_pid));
    stop.cancel();
    let mut latencies = Vec::new();
    let mut errors = w.errors;
    for t in tasks {
        let o = t.await?;
        latencies.extend(o.latencies);
        errors += u64::from(o.error.is_some());
    }
    let mut conn = direct.connect(Proto::H2).await?;
    for name in &names {
        let _ = direct
            .fetch(&mut conn, Method::DELETE, &format!("{coll}/{name}"), None)
            .await;
    }
    let d = Delivery {
        delivered: latencies.len() as u64,
        expected,
        lat: Summary::of(&mut latencies),
        proxy_cpu: cpu0.0.zip(cpu1.0).map(|(b, a)| a.saturating_sub(b)),
        apiserver_cpu: cpu0
            .1
            .zip(cpu1.1)
            .map(|(b, a)| a.saturating_sub(b))
            .unwrap_or_default(),
        errors,
    };
    println!(
        "watch {proto:?} x{watchers} {}: {} of {} events, latency {}, proxy CPU {:?}, apiserver CPU {:?}, {} errors",
        if proxy_pid.is_some() {
            "through the proxy"
        } else {
            "direct"
        },
        d.delivered,
        d.expected,
        d.lat,
        d.proxy_cpu,
        d.apiserver_cpu,
        d.errors
    );
    Ok(d)
}

fn delivery_rows(
    cluster: &str,
    proto: Proto,
    watchers: usize,
    p: &Delivery,
    d: &Delivery,
    rows: &mut Vec<Row>,
) {
    let name = match proto {
        Proto::H2 => format!("{watchers} HTTP/2 watchers"),
        Proto::H1 => format!("{watchers} HTTP/1.1 watchers"),
    };
    let us = |cpu: Duration, events: u64| cpu.as_secs_f64() * 1e6 / events.max(1) as f64;
    let proxy_us = p.proxy_cpu.map(|c| us(c, p.delivered));
    // The apiserver's cost of delivering to the watchers: its CPU beyond
    // the same writes with the proxy as its one watcher.
    let direct_us = Some(us(
        d.apiserver_cpu.saturating_sub(p.apiserver_cpu),
        d.delivered
            .saturating_sub(d.delivered / watchers.max(1) as u64),
    ));
    rows.push(Row {
        cluster: cluster.into(),
        what: format!(
            "CPU per delivered event, {name} (direct: the apiserver's beyond the writes)"
        ),
        direct: opt(direct_us, |v| format!("{v:.1} µs")),
        proxy: opt(proxy_us, |v| format!("{v:.1} µs")),
        ratio: ratio(proxy_us, direct_us),
        upstream: format!(
            "apiserver CPU {:.1} µs/event with the proxy, {:.1} direct",
            us(p.apiserver_cpu, p.delivered),
            us(d.apiserver_cpu, d.delivered)
        ),
    });
    rows.push(Row {
        cluster: cluster.into(),
        what: format!("delivery latency, {name}, p50 / p99 (delivered)"),
        direct: format!(
            "{} / {} ms ({:.1} %)",
            ms1(d.lat.p50),
            ms1(d.lat.p99),
            d.delivered as f64 * 100.0 / d.expected.max(1) as f64
        ),
        proxy: format!(
            "{} / {} ms ({:.1} %)",
            ms1(p.lat.p50),
            ms1(p.lat.p99),
            p.delivered as f64 * 100.0 / p.expected.max(1) as f64
        ),
        ratio: ratio(Some(p.lat.p99 as f64), Some(d.lat.p99 as f64)),
        upstream: "—".into(),
    });
}

fn ms1(micros: u64) -> String {
    let ms = micros as f64 / 1000.0;
    if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.0}")
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "?".into())
}

fn ratio(p: Option<f64>, d: Option<f64>) -> String {
    match (p, d) {
        (Some(p), Some(d)) if d > 0.0 => format!("{:.2}", p / d),
        _ => "?".into(),
    }
}
