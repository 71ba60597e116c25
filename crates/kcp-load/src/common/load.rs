//! Concurrent clients GETting one path, each on its own connection, and
//! what they measured (`LoadOut`): latency, bytes, and the growth of the
//! proxy's and the apiserver's request metrics meanwhile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::client::{Conn, Proto, Target};
use crate::env::RunningProxy;
use crate::metrics::{self, Sample};
use crate::stats::micros;

/// What one run of concurrent clients measured.
#[derive(Debug, Default)]
pub struct LoadOut {
    /// Latency of each measured request answered 200 (µs).
    pub latencies: Vec<u32>,
    /// Time to its first body byte (µs).
    pub first_byte: Vec<u32>,
    /// Measured requests sent.
    pub requests: usize,
    pub errors: usize,
    pub last_error: Option<String>,
    pub bytes: u64,
    /// Items of a list response.
    pub items: Option<usize>,
    /// From the clients' start to the last one's end, summed over rounds.
    pub wall: Duration,
    /// Growth of `apiserver_request_total` by verb, group, resource.
    pub apiserver: Option<BTreeMap<Vec<String>, f64>>,
    /// Growth of the proxy's `cache_reads_total` by resource, verb,
    /// source, reason.
    pub reads: Option<BTreeMap<Vec<String>, f64>>,
    /// Growth of the proxy's `cache_consistency_probes_total` by resource,
    /// result.
    pub probes: Option<BTreeMap<Vec<String>, f64>>,
    /// Growth of the proxy's `cache_progress_watches_total` by resource.
    pub progress: Option<BTreeMap<Vec<String>, f64>>,
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
    pub fn merge(&mut self, o: LoadOut) {
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
    pub fn record_growth(&mut self, before: &Snapshot, after: &Snapshot) {
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

    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Upstream requests the measured requests caused, per request: reads
    /// (GET, LIST, WATCH) of `resource` and SubjectAccessReviews, from the
    /// apiserver's metrics.
    pub fn upstream_per_request(&self, resource: &(String, String, &str)) -> Option<f64> {
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
    pub fn cache_share(&self, resource: &(String, String, &str)) -> Option<f64> {
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

    pub fn probes_per_request(&self, resource: &(String, String, &str)) -> Option<f64> {
        let m = self.probes.as_ref()?;
        let n: f64 = m
            .iter()
            .filter(|(k, _)| k[0] == resource.1)
            .fold(0.0, |a, (_, v)| a + v);
        Some(n / self.requests.max(1) as f64)
    }
}

/// Where metrics are read before and after a run.
pub struct Meters<'a> {
    pub proxy: Option<&'a RunningProxy>,
    pub apiserver: Option<&'a Target>,
}

pub type Snapshot = (Option<Vec<Sample>>, Option<Vec<Sample>>);

impl Meters<'_> {
    pub async fn snapshot(&self) -> Snapshot {
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
pub async fn load(
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
