//! `tier`: N simulated nodes' upstream watch sets against a real
//! kube-apiserver v1.36 (`../shared/k8s/`, started by `kube-testenv`),
//! directly or through a tier of kube-cache-proxy processes
//! (`manifests/tier/config.yaml`, `upstream.identity: Tier`), and what the
//! apiserver pays for them.
//!
//! A simulated node is what one node proxy and its kubelet open upstream:
//! - one list+watch per resource of the node proxy's default caches
//!   ([`NODE_RESOURCES`]: pods with `spec.nodeName=<node>`, its own Node
//!   with `metadata.name=<node>`, and seven resources cluster-wide);
//! - kubelet's per-object watches of the ConfigMap and Secret its pod
//!   mounts (`fieldSelector=metadata.name=<name>`), which a node proxy
//!   passes through;
//!
//! each a reflector as the proxy's (`src/cache/reflector.rs`): a paginated
//! list (`limit=500`), then a watch from its resourceVersion with
//! `allowWatchBookmarks=true` and `timeoutSeconds` 300–600; a watch that
//! ends resumes from the last resourceVersion seen, after a jittered backoff
//! of 0.1–1 s when it failed; only `410 Gone` relists. Every node has its
//! own client certificate (`CN=system:node:<node>, O=system:nodes`, so the
//! Node authorizer decides), hence its own HTTP/2 connection carrying its
//! 11 watches.
//!
//! Per mode (`direct`, `tier`), on a fresh control plane:
//! 1. seed: N Nodes, and per node a pod bound to it mounting its own
//!    ConfigMap and Secret; `--services` Services and EndpointSlices;
//! 2. (tier) start `--replicas` tier processes (`--proxy-bin`), nodes
//!    assigned round-robin;
//! 3. start the nodes (`--start-rate` per second) until every watch is
//!    open;
//! 4. steady writes for `--duration` seconds (Service, EndpointSlice and
//!    pod status patches), measuring the apiserver's watches
//!    (`apiserver_longrunning_requests{verb="WATCH"}`), CPU
//!    (`process_cpu_seconds_total`), RSS, and the watch events and bytes
//!    it sent (`apiserver_watch_events_total`,
//!    `apiserver_watch_events_sizes_sum`), and the tier replicas' CPU and
//!    RSS;
//! 5. a relist storm: the apiserver restarted; the LISTs it then serves
//!    (`apiserver_request_total{verb="LIST"}` of the new process, less
//!    those of a restart with no client, measured before step 2), and
//!    the time until every simulated watch is open again and until a
//!    Service change made after the restart reached every node.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use apimachinery::pki::Ca;
use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use kube_cache_proxy::component::config::{Config, IdentityMode};
use kube_testenv::{AssetsError, ControlPlane, Options};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::client::{Conn, Proto, Target};
use crate::env::temp_dir;
use crate::metrics::{self, Sample};
use crate::real::Skip;
use crate::stats::{self, mib};

/// The node proxy's default caches (`CacheConfig::default`, scoped by
/// `Identity::scope_caches`): collection path and field selector, where
/// `{node}` is the node's name.
pub const NODE_RESOURCES: [(&str, Option<&str>); 9] = [
    ("/api/v1/pods", Some("spec.nodeName={node}")),
    ("/api/v1/nodes", Some("metadata.name={node}")),
    ("/api/v1/services", None),
    ("/apis/discovery.k8s.io/v1/endpointslices", None),
    ("/api/v1/namespaces", None),
    ("/apis/node.k8s.io/v1/runtimeclasses", None),
    ("/apis/storage.k8s.io/v1/csidrivers", None),
    ("/apis/storage.k8s.io/v1/csinodes", None),
    ("/apis/networking.k8s.io/v1/servicecidrs", None),
];

/// Where the seeded objects live.
const NAMESPACE: &str = "kcp-tier";

/// Items per list page, as the proxy's reflector.
const PAGE_SIZE: u32 = 500;

/// The tier's shipped configuration.
const TIER_CONFIG: &str = include_str!("../../../manifests/tier/config.yaml");

/// What to measure.
#[derive(Debug, Clone, clap::Args)]
pub struct TierArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// Modes to measure, in order, each on a fresh control plane.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Direct, Mode::Tier])]
    pub modes: Vec<Mode>,
    /// Tier replicas (processes of --proxy-bin).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// The kube-cache-proxy binary the tier runs (e.g.
    /// target/release/kube-cache-proxy); required for mode tier.
    #[arg(long, value_name = "PATH")]
    pub proxy_bin: Option<PathBuf>,
    /// Seconds of steady writes measured.
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Services, and as many EndpointSlices, seeded.
    #[arg(long, default_value_t = 20)]
    pub services: usize,
    /// Service patches per second, during the steady phase.
    #[arg(long, default_value_t = 2.0)]
    pub service_writes: f64,
    /// EndpointSlice patches per second.
    #[arg(long, default_value_t = 2.0)]
    pub slice_writes: f64,
    /// Pod status patches per second (round-robin over the nodes' pods).
    #[arg(long, default_value_t = 10.0)]
    pub pod_writes: f64,
    /// Simulated nodes started per second.
    #[arg(long, default_value_t = 200.0)]
    pub start_rate: f64,
    /// Skip the relist storm (the apiserver's restart).
    #[arg(long)]
    pub no_restart: bool,
    /// How long to wait for every watch after the restart, in seconds.
    #[arg(long, default_value_t = 180)]
    pub recovery_timeout: u64,
}

/// Where the simulated nodes' watches go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// To the apiserver itself.
    Direct,
    /// To the tier replicas, round-robin.
    Tier,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Tier => "tier",
        }
    }
}

/// One mode's figures.
#[derive(Debug, Clone, Default)]
pub struct TierReport {
    pub mode: String,
    pub nodes: usize,
    pub watches_per_node: usize,
    /// Time for every node's watches to open.
    pub started_in: Duration,
    /// LISTs the apiserver served while the nodes started.
    pub start_lists: f64,
    /// The apiserver's open watches during the steady phase, and before
    /// the tier and the nodes started (its own).
    pub apiserver_watches: f64,
    pub apiserver_watches_before: f64,
    pub apiserver_cpu_cores: f64,
    pub apiserver_rss: u64,
    pub watch_events_sent: f64,
    pub watch_bytes_sent: f64,
    pub steady_seconds: f64,
    pub writes: u64,
    /// Events the simulated nodes received (bookmarks apart).
    pub node_events: u64,
    /// From a Service or EndpointSlice patch's sending to its event at
    /// each node, over the steady phase.
    pub delivery: crate::stats::Summary,
    /// Per tier replica: CPU (cores) and RSS over the steady phase.
    pub tier: Vec<(f64, u64)>,
    /// Relist storm.
    pub restart: Option<RestartReport>,
}

/// The relist storm's figures.
#[derive(Debug, Clone, Default)]
pub struct RestartReport {
    /// LISTs the restarted apiserver served, less those of a restart with
    /// no client.
    pub lists: f64,
    /// Of which the simulated nodes' own (counted by them).
    pub node_lists: u64,
    /// Node watches that got `410 Gone` and relisted.
    pub node_relists: u64,
    /// From the restart's start (SIGTERM) to the apiserver's readiness.
    pub apiserver_ready: Duration,
    /// Whether any simulated watch broke.
    pub broke: bool,
    /// From the restart's start until every simulated watch was open
    /// again (`None`: not within the timeout, or none broke).
    pub watches_back: Option<Duration>,
    /// Lowest number of open simulated watches seen meanwhile.
    pub min_open: usize,
    /// From the apiserver's readiness until a Service patch made then
    /// reached every node.
    pub marker_everywhere: Option<Duration>,
    /// The restarted apiserver's CPU seconds by then, less those of a
    /// restart with no client.
    pub apiserver_cpu_seconds: f64,
}

/// Runs every mode and prints the table.
pub async fn tier(a: &TierArgs) -> Result<Vec<TierReport>> {
    if a.modes.contains(&Mode::Tier) && a.proxy_bin.is_none() {
        bail!("mode tier needs --proxy-bin (e.g. target/release/kube-cache-proxy)");
    }
    let mut reports = Vec::new();
    for &mode in &a.modes {
        let r = run_mode(a, mode).await?;
        print_report(&r);
        reports.push(r);
    }
    println!();
    println!(
        "| mode | N | apiserver watches (before the nodes) | apiserver CPU (cores) | apiserver RSS | watch events/s sent | watch MB/s sent | relist LISTs | watches back after ready | change everywhere after ready | tier CPU (cores) / RSS per replica |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &reports {
        println!("{}", table_row(r));
    }
    Ok(reports)
}

/// One row of the summary table.
pub fn table_row(r: &TierReport) -> String {
    let per_s = |v: f64| v / r.steady_seconds.max(1e-9);
    let back = |s: &RestartReport| match (s.broke, s.watches_back) {
        (false, _) => "none broke".to_string(),
        (true, Some(d)) => format!("{:.1} s", d.saturating_sub(s.apiserver_ready).as_secs_f64()),
        (true, None) => "not within the timeout".into(),
    };
    let (lists, back, everywhere) = match &r.restart {
        Some(s) => (
            format!("{:.0} ({} by nodes)", s.lists, s.node_lists),
            back(s),
            s.marker_everywhere
                .map(|d| format!("{:.1} s", d.as_secs_f64()))
                .unwrap_or_else(|| "not within the timeout".into()),
        ),
        None => ("—".into(), "—".into(), "—".into()),
    };
    let tier = if r.tier.is_empty() {
        "—".to_string()
    } else {
        r.tier
            .iter()
            .map(|(c, m)| format!("{c:.3} / {:.0} MiB", *m as f64 / 1048576.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "| {} | {} | {:.0} ({:.0}) | {:.3} | {:.0} MiB | {:.0} | {:.2} | {lists} | {back} | {everywhere} | {tier} |",
        r.mode,
        r.nodes,
        r.apiserver_watches,
        r.apiserver_watches_before,
        r.apiserver_cpu_cores,
        r.apiserver_rss as f64 / 1048576.0,
        per_s(r.watch_events_sent),
        per_s(r.watch_bytes_sent) / 1e6,
    )
}

fn print_report(r: &TierReport) {
    println!(
        "{}: N={} ({} watches each): all open in {:.1}s ({:.0} LISTs); steady {:.0}s, {} writes: \
         apiserver {:.0} watches ({:.0} before the nodes), {:.3} cores, RSS {}, sent {:.0} watch events ({:.1} MB); nodes \
         received {} events",
        r.mode,
        r.nodes,
        r.watches_per_node,
        r.started_in.as_secs_f64(),
        r.start_lists,
        r.steady_seconds,
        r.writes,
        r.apiserver_watches,
        r.apiserver_watches_before,
        r.apiserver_cpu_cores,
        mib(r.apiserver_rss),
        r.watch_events_sent,
        r.watch_bytes_sent / 1e6,
        r.node_events,
    );
    println!(
        "  delivery of Service and EndpointSlice patches to the nodes (from the patch's sending): {}",
        r.delivery
    );
    for (i, (cpu, rss)) in r.tier.iter().enumerate() {
        println!("  tier replica {i}: {cpu:.3} cores, RSS {}", mib(*rss));
    }
    if let Some(s) = &r.restart {
        println!(
            "  restart: apiserver ready after {:.1}s; {:.0} LISTs ({} by the nodes, {} relists on \
             410); watches (lowest {} open) all back after {}; a change after the restart \
             everywhere after {}; apiserver CPU {:.1}s",
            s.apiserver_ready.as_secs_f64(),
            s.lists,
            s.node_lists,
            s.node_relists,
            s.min_open,
            match (s.broke, s.watches_back) {
                (false, _) => "(none broke)".to_string(),
                (true, Some(d)) => format!("{:.1}s", d.as_secs_f64()),
                (true, None) => "(not within the timeout)".into(),
            },
            s.marker_everywhere
                .map(|d| format!("{:.1}s", d.as_secs_f64()))
                .unwrap_or_else(|| "(not within the timeout)".into()),
            s.apiserver_cpu_seconds,
        );
    }
}

// === the run ===

async fn run_mode(a: &TierArgs, mode: Mode) -> Result<TierReport> {
    println!("== mode {}: {} nodes", mode.as_str(), a.nodes);
    let started = Instant::now();
    let cp = match ControlPlane::start(Options::default()).await {
        Ok(cp) => Arc::new(cp),
        Err(kube_testenv::Error::Assets(e @ AssetsError::Absent { .. })) => {
            return Err(Skip(format!("tier: {e}")).into());
        }
        Err(e) => bail!("starting the control plane: {e}"),
    };
    println!(
        "apiserver: {} ready in {:.1}s; files in {}",
        cp.url(),
        started.elapsed().as_secs_f64(),
        cp.dir().display()
    );
    let admin = Target::from_kubeconfig(Some(cp.admin_kubeconfig()), None).await?;
    let result = run_on(a, mode, &cp, &admin).await;
    let dir = cp.dir().to_path_buf();
    drop(cp);
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(dir);
    } else {
        println!("(kept {} for its logs)", dir.display());
    }
    result
}

async fn run_on(
    a: &TierArgs,
    mode: Mode,
    cp: &Arc<ControlPlane>,
    admin: &Target,
) -> Result<TierReport> {
    for manifest in [
        include_str!("../../../manifests/tier/serviceaccount.yaml"),
        include_str!("../../../manifests/tier/rbac.yaml"),
        include_str!("../../../manifests/node/rbac.yaml"),
    ] {
        apply(admin, manifest).await?;
    }
    seed(admin, a.nodes, a.services).await?;

    // The LISTs and CPU of a restart with no client, to subtract.
    let calibration = if a.no_restart {
        None
    } else {
        let t = Instant::now();
        cp.restart_apiserver(Duration::from_secs(10), Duration::from_millis(500))
            .await
            .map_err(|e| anyhow!("restarting the apiserver: {e}"))?;
        let ready = t.elapsed();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let m = scrape(admin).await?;
        let c = (
            counter(&m, "apiserver_request_total", &[("verb", "LIST")]),
            counter(&m, "process_cpu_seconds_total", &[]),
        );
        println!(
            "calibration: a restart with no client: ready after {:.1}s, {:.0} LISTs and {:.1} CPU \
             seconds by 5 s later",
            ready.as_secs_f64(),
            c.0,
            c.1
        );
        Some(c)
    };

    let m_base = scrape(admin).await?;
    let dir = temp_dir()?;
    let mut replicas = Vec::new();
    if mode == Mode::Tier {
        let bin = a
            .proxy_bin
            .as_deref()
            .ok_or_else(|| anyhow!("mode tier needs --proxy-bin"))?;
        let token = tier_token(admin).await?;
        // One serving CA for every replica, which the nodes trust.
        let ca = Ca::new("kcp-load-tier-ca")?;
        for i in 0..a.replicas {
            replicas.push(TierReplica::start(bin, &dir, i, cp, &ca, &token)?);
        }
        for r in &replicas {
            r.ready(Duration::from_secs(180)).await?;
        }
        println!("tier: {} replicas ready", replicas.len());
    }
    let targets: Vec<String> = if replicas.is_empty() {
        vec![cp.url()]
    } else {
        replicas.iter().map(|r| r.url.clone()).collect()
    };
    let server_ca = if replicas.is_empty() {
        cp.ca_pem()
    } else {
        replicas[0].ca_pem.clone()
    };

    // The nodes.
    let shared = Arc::new(Shared::default());
    let stop = CancellationToken::new();
    let m_before_start = scrape(admin).await?;
    let t_start = Instant::now();
    let mut nodes = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..a.nodes {
        let name = node_name(i);
        let user = format!("system:node:{name}");
        let cert = cp
            .issue_client(&user, Some("system:nodes"))
            .map_err(|e| anyhow!("issuing {user}'s certificate: {e}"))?;
        let server = &targets[i % targets.len()];
        let text = apimachinery::kubeconfig::with_certificate(
            server,
            &server_ca,
            &user,
            &cert.cert_pem,
            &cert.key_pem,
        );
        let kc = kube::config::Kubeconfig::from_yaml(&text)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        let node = Arc::new(SimNode {
            target: Target::new(&config).await?,
            conn: Mutex::new(None),
        });
        let mut watches = Vec::new();
        for (path, selector) in NODE_RESOURCES {
            watches.push(WatchSpec::new(
                path.to_string(),
                selector.map(|s| s.replace("{node}", &name)),
            ));
        }
        for kind in ["configmaps", "secrets"] {
            watches.push(WatchSpec::new(
                format!("/api/v1/namespaces/{NAMESPACE}/{kind}"),
                Some(format!("metadata.name={}", object_name(kind, i))),
            ));
        }
        for w in &watches {
            tasks.push(tokio::spawn(reflect(
                node.clone(),
                w.clone(),
                shared.clone(),
                stop.clone(),
            )));
        }
        nodes.push(watches);
        // Paced: node i starts at i / start_rate seconds.
        let due = t_start + Duration::from_secs_f64((i + 1) as f64 / a.start_rate.max(0.1));
        tokio::time::sleep_until(due.into()).await;
    }
    let watches_per_node = NODE_RESOURCES.len() + 2;
    let total = a.nodes * watches_per_node;
    wait_open(&shared, total, Duration::from_secs(600)).await?;
    let started_in = t_start.elapsed();
    let m_started = scrape(admin).await?;
    let start_lists = growth(
        &m_before_start,
        &m_started,
        "apiserver_request_total",
        "LIST",
    );
    println!(
        "nodes: {total} watches open after {:.1}s ({} LISTs by the nodes, {} failed requests)",
        started_in.as_secs_f64(),
        shared.lists.load(Ordering::Relaxed),
        shared.failures.load(Ordering::Relaxed),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Steady writes.
    let m0 = scrape(admin).await?;
    let tier0 = tier_samples(&replicas);
    let events0 = shared.events.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let writes_stop = CancellationToken::new();
    let writers = [
        ("services", a.service_writes),
        ("endpointslices", a.slice_writes),
        ("pods", a.pod_writes),
    ]
    .into_iter()
    .filter(|(_, rate)| *rate > 0.0)
    .map(|(kind, rate)| {
        tokio::spawn(writer(
            admin.clone(),
            kind,
            rate,
            if kind == "pods" { a.nodes } else { a.services },
            writes_stop.clone(),
            shared.clone(),
        ))
    })
    .collect::<Vec<_>>();
    tokio::time::sleep(Duration::from_secs(a.duration)).await;
    let m1 = scrape(admin).await?;
    let tier1 = tier_samples(&replicas);
    let steady = t0.elapsed().as_secs_f64();
    writes_stop.cancel();
    let mut writes = 0;
    for w in writers {
        writes += w.await??;
    }
    let node_events = shared.events.load(Ordering::Relaxed) - events0;
    let delivery = shared
        .delivery
        .lock()
        .map(|mut d| crate::stats::Summary::of(&mut d))
        .unwrap_or_default();
    let mut report = TierReport {
        mode: mode.as_str().into(),
        nodes: a.nodes,
        watches_per_node,
        started_in,
        start_lists,
        apiserver_watches: counter(&m1, "apiserver_longrunning_requests", &[("verb", "WATCH")]),
        apiserver_watches_before: counter(
            &m_base,
            "apiserver_longrunning_requests",
            &[("verb", "WATCH")],
        ),
        apiserver_cpu_cores: (counter(&m1, "process_cpu_seconds_total", &[])
            - counter(&m0, "process_cpu_seconds_total", &[]))
            / steady,
        apiserver_rss: counter(&m1, "process_resident_memory_bytes", &[]) as u64,
        watch_events_sent: counter(&m1, "apiserver_watch_events_total", &[])
            - counter(&m0, "apiserver_watch_events_total", &[]),
        watch_bytes_sent: counter(&m1, "apiserver_watch_events_sizes_sum", &[])
            - counter(&m0, "apiserver_watch_events_sizes_sum", &[]),
        steady_seconds: steady,
        writes,
        node_events,
        delivery,
        tier: tier0
            .iter()
            .zip(&tier1)
            .map(|(b, e)| ((e.0 - b.0).as_secs_f64() / steady, e.1))
            .collect(),
        restart: None,
    };
    // The steady figures first, in case the restart fails.
    print_report(&report);
    if let Some(calibration) = calibration {
        report.restart =
            Some(relist_storm(a, cp, admin, &shared, &nodes, total, calibration).await?);
    }
    stop.cancel();
    for t in tasks {
        t.abort();
    }
    for r in replicas {
        r.stop().await;
    }
    let _ = std::fs::remove_dir_all(dir);
    Ok(report)
}

/// Restarts the apiserver and measures the recovery.
async fn relist_storm(
    a: &TierArgs,
    cp: &Arc<ControlPlane>,
    admin: &Target,
    shared: &Arc<Shared>,
    nodes: &[Vec<Arc<WatchSpec>>],
    total: usize,
    (calibration_lists, calibration_cpu): (f64, f64),
) -> Result<RestartReport> {
    let lists0 = shared.lists.load(Ordering::Relaxed);
    let relists0 = shared.relists.load(Ordering::Relaxed);
    let t = Instant::now();
    let restart = {
        let cp = cp.clone();
        tokio::spawn(async move {
            cp.restart_apiserver(Duration::from_secs(10), Duration::from_millis(500))
                .await
        })
    };
    let deadline = t + Duration::from_secs(a.recovery_timeout);
    let mut min_open = total;
    let mut broke = false;
    let mut watches_back = None;
    let mut apiserver_ready = None;
    let mut marker: Option<(u64, Instant)> = None;
    let mut marker_everywhere = None;
    let mut restart = Some(restart);
    while Instant::now() < deadline {
        let open = shared.open.load(Ordering::Relaxed);
        min_open = min_open.min(open);
        if open < total {
            broke = true;
            watches_back = None;
        } else if broke && watches_back.is_none() {
            watches_back = Some(t.elapsed());
        }
        if restart.as_ref().is_some_and(|r| r.is_finished())
            && let Some(r) = restart.take()
        {
            r.await?
                .map_err(|e| anyhow!("restarting the apiserver: {e}"))?;
            apiserver_ready = Some(t.elapsed());
            let rv = patch(admin, "services", 0, 1_000_000).await?;
            marker = Some((rv, Instant::now()));
        }
        if let Some((rv, at)) = marker
            && marker_everywhere.is_none()
            && nodes.iter().all(|w| w[2].rv.load(Ordering::Relaxed) >= rv)
        {
            marker_everywhere = Some(at.elapsed());
        }
        if apiserver_ready.is_some()
            && marker_everywhere.is_some()
            && (watches_back.is_some() || !broke)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(r) = restart {
        r.abort();
        bail!(
            "the apiserver did not restart within {}s",
            a.recovery_timeout
        );
    }
    // What the tier relisted, and what the nodes did, settles within a
    // few seconds more.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let m = scrape(admin).await?;
    Ok(RestartReport {
        lists: counter(&m, "apiserver_request_total", &[("verb", "LIST")]) - calibration_lists,
        node_lists: shared.lists.load(Ordering::Relaxed) - lists0,
        node_relists: shared.relists.load(Ordering::Relaxed) - relists0,
        apiserver_ready: apiserver_ready.unwrap_or_default(),
        broke,
        watches_back,
        min_open,
        marker_everywhere,
        apiserver_cpu_seconds: counter(&m, "process_cpu_seconds_total", &[]) - calibration_cpu,
    })
}

async fn wait_open(shared: &Shared, total: usize, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_print = Instant::now();
    loop {
        let open = shared.open.load(Ordering::Relaxed);
        if open >= total {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {open} of {total} watches open after {timeout:?}");
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            println!(
                "  {open}/{total} watches open, {} LISTs, {} failed requests",
                shared.lists.load(Ordering::Relaxed),
                shared.failures.load(Ordering::Relaxed)
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// === metrics ===

async fn scrape(target: &Target) -> Result<Vec<Sample>> {
    let mut conn = target.connect(Proto::H1).await?;
    let r = target
        .fetch(&mut conn, Method::GET, "/metrics", None)
        .await?;
    if r.status != StatusCode::OK {
        bail!("GET /metrics: {}", r.status);
    }
    Ok(metrics::parse(&String::from_utf8_lossy(&r.body)))
}

/// The sum of `name`'s series whose labels match `labels`.
pub fn counter(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == *v))
        .map(|s| s.value)
        .sum()
}

fn growth(before: &[Sample], after: &[Sample], name: &str, verb: &str) -> f64 {
    counter(after, name, &[("verb", verb)]) - counter(before, name, &[("verb", verb)])
}

/// Each replica's CPU time so far and RSS (`/proc`).
fn tier_samples(replicas: &[TierReplica]) -> Vec<(Duration, u64)> {
    replicas
        .iter()
        .map(|r| {
            let pid = r.child.id();
            (
                stats::cpu_of(pid).unwrap_or_default(),
                stats::rss_of(pid).unwrap_or_default(),
            )
        })
        .collect()
}

// === seeding and writing ===

fn node_name(i: usize) -> String {
    format!("sim-node-{i:05}")
}

/// The ConfigMap or Secret node `i`'s pod mounts.
fn object_name(kind: &str, i: usize) -> String {
    let prefix = if kind == "configmaps" { "cm" } else { "sec" };
    format!("{prefix}-{i:05}")
}

/// The seeded objects, in creation order: collection path and body.
pub fn seed_objects(nodes: usize, services: usize) -> Vec<(String, Value)> {
    let ns = NAMESPACE;
    let mut out = vec![
        (
            "/api/v1/namespaces".to_string(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        ),
        (
            format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        ),
    ];
    for i in 0..services {
        let name = format!("svc-{i:03}");
        out.push((
            format!("/api/v1/namespaces/{ns}/services"),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                   "spec": {"selector": {"app": name},
                            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
        ));
        out.push((
            format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": format!("{name}-0"),
                                "labels": {"kubernetes.io/service-name": name}},
                   "addressType": "IPv4",
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
                   "endpoints": [{"addresses": [format!("10.1.{}.{}", i / 250, i % 250 + 1)],
                                  "conditions": {"ready": true}}]}),
        ));
    }
    for i in 0..nodes {
        let node = node_name(i);
        let (cm, sec) = (object_name("configmaps", i), object_name("secrets", i));
        out.push((
            "/api/v1/nodes".to_string(),
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}),
        ));
        out.push((
            format!("/api/v1/namespaces/{ns}/configmaps"),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm},
                   "data": {"config": "x".repeat(200)}}),
        ));
        out.push((
            format!("/api/v1/namespaces/{ns}/secrets"),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": sec},
                   "stringData": {"token": "y".repeat(64)}}),
        ));
        out.push((
            format!("/api/v1/namespaces/{ns}/pods"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("pod-{i:05}")},
                   "spec": {"nodeName": node, "automountServiceAccountToken": false,
                            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                            "volumes": [{"name": "cfg", "configMap": {"name": cm}},
                                        {"name": "sec", "secret": {"secretName": sec}}]}}),
        ));
    }
    out
}

/// Creates the seeded objects, 32 at a time (the first two, the
/// namespace and its ServiceAccount, first).
async fn seed(admin: &Target, nodes: usize, services: usize) -> Result<()> {
    let started = Instant::now();
    let mut objects = seed_objects(nodes, services);
    let rest = objects.split_off(2);
    for (path, body) in &objects {
        create(admin, &mut admin.connect(Proto::H1).await?, path, body).await?;
    }
    let n = rest.len();
    let rest = Arc::new(rest);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (admin, rest, next) = (admin.clone(), rest.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = admin.connect(Proto::H2).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((path, body)) = rest.get(i) else {
                    return Ok::<_, anyhow::Error>(());
                };
                create(&admin, &mut conn, path, body).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    println!(
        "seed: {} objects ({nodes} nodes, each with a pod, a ConfigMap and a Secret; {services} \
         Services and EndpointSlices) in {:.1}s",
        n + 2,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn create(target: &Target, conn: &mut Conn, path: &str, body: &Value) -> Result<()> {
    let body = Bytes::from(serde_json::to_vec(body)?);
    let r = target.fetch(conn, Method::POST, path, Some(body)).await?;
    match r.status {
        StatusCode::CREATED | StatusCode::OK | StatusCode::CONFLICT => Ok(()),
        s => bail!("POST {path}: {s} {}", String::from_utf8_lossy(&r.body)),
    }
}

/// Applies the ServiceAccount, ClusterRoles and ClusterRoleBindings of a
/// manifest.
async fn apply(admin: &Target, manifest: &str) -> Result<()> {
    let mut conn = admin.connect(Proto::H1).await?;
    for doc in manifest.split("\n---\n") {
        let obj: Value = match serde_saphyr::from_str(doc) {
            Ok(Value::Null) | Err(_) => continue,
            Ok(v) => v,
        };
        let path = match obj["kind"].as_str().unwrap_or_default() {
            "ClusterRole" => "/apis/rbac.authorization.k8s.io/v1/clusterroles".to_string(),
            "ClusterRoleBinding" => {
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".to_string()
            }
            "ServiceAccount" => format!(
                "/api/v1/namespaces/{}/serviceaccounts",
                obj["metadata"]["namespace"].as_str().unwrap_or("default")
            ),
            other => bail!("unexpected {other} in a manifest"),
        };
        create(admin, &mut conn, &path, &obj).await?;
    }
    Ok(())
}

/// The patch of object `i` of `kind` (an annotation, or a pod's status
/// condition) to `n`: path and merge-patch body.
fn patch_request(kind: &str, i: usize, n: u64) -> (String, Value) {
    let ns = NAMESPACE;
    match kind {
        "services" => (
            format!("/api/v1/namespaces/{ns}/services/svc-{i:03}"),
            json!({"metadata": {"annotations": {"kcp-load/tick": n.to_string()}}}),
        ),
        "endpointslices" => (
            format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/svc-{i:03}-0"),
            json!({"metadata": {"annotations": {"kcp-load/tick": n.to_string()}}}),
        ),
        _ => (
            format!("/api/v1/namespaces/{ns}/pods/pod-{i:05}/status"),
            json!({"status": {"conditions": [{"type": "kcp-load.io/tick", "status": "True",
                                              "message": n.to_string()}]}}),
        ),
    }
}

/// Patches object `i` of `kind` on a new connection; returns its new
/// resourceVersion.
async fn patch(admin: &Target, kind: &str, i: usize, n: u64) -> Result<u64> {
    let (path, body) = patch_request(kind, i, n);
    let mut conn = admin.connect(Proto::H1).await?;
    patch_on(admin, &mut conn, &path, &body).await
}

async fn patch_on(admin: &Target, conn: &mut Conn, path: &str, body: &Value) -> Result<u64> {
    let mut req = admin.request(
        conn,
        Method::PATCH,
        path,
        Some(Bytes::from(serde_json::to_vec(body)?)),
    )?;
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/merge-patch+json"),
    );
    let resp = conn.send(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if status != StatusCode::OK {
        bail!("PATCH {path}: {status} {}", String::from_utf8_lossy(&body));
    }
    let v: ListMeta = serde_json::from_slice(&body)?;
    v.metadata
        .resource_version
        .parse()
        .map_err(|_| anyhow!("PATCH {path}: no resourceVersion"))
}

/// Patches `kind` objects round-robin at `rate` per second until `stop`;
/// returns how many it made.
async fn writer(
    admin: Target,
    kind: &'static str,
    rate: f64,
    objects: usize,
    stop: CancellationToken,
    shared: Arc<Shared>,
) -> Result<u64> {
    let mut conn = admin.connect(Proto::H2).await?;
    let started = tokio::time::Instant::now();
    let mut n: u64 = 0;
    loop {
        let due = started + Duration::from_secs_f64(n as f64 / rate);
        tokio::select! {
            () = stop.cancelled() => return Ok(n),
            () = tokio::time::sleep_until(due) => {}
        }
        let (path, body) = patch_request(kind, (n as usize) % objects.max(1), n);
        let sent = Instant::now();
        let rv = patch_on(&admin, &mut conn, &path, &body)
            .await
            .with_context(|| format!("writing {kind}"))?;
        // Cluster-wide: every node gets its event.
        if kind != "pods"
            && let Ok(mut m) = shared.written.lock()
        {
            m.insert(rv, sent);
        }
        n += 1;
    }
}

// === the simulated nodes ===

/// One node's connection (its own client certificate), shared by its
/// watches and opened again when it breaks.
struct SimNode {
    target: Target,
    conn: Mutex<Option<Conn>>,
}

impl SimNode {
    async fn conn(&self) -> Result<Conn> {
        let mut c = self.conn.lock().await;
        if let Some(conn) = c.as_ref().filter(|c| !c.is_closed())
            && let Some(shared) = conn.share()
        {
            return Ok(shared);
        }
        let fresh = self.target.connect(Proto::H2).await?;
        let shared = fresh
            .share()
            .ok_or_else(|| anyhow!("not an HTTP/2 connection"))?;
        *c = Some(fresh);
        Ok(shared)
    }
}

/// One watched collection and the last resourceVersion seen.
pub struct WatchSpec {
    path: String,
    field_selector: Option<String>,
    rv: AtomicU64,
}

impl WatchSpec {
    fn new(path: String, field_selector: Option<String>) -> Arc<WatchSpec> {
        Arc::new(WatchSpec {
            path,
            field_selector,
            rv: AtomicU64::new(0),
        })
    }

    fn query(&self, extra: &str) -> String {
        match &self.field_selector {
            Some(s) => format!(
                "{}?{extra}&fieldSelector={}",
                self.path,
                percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
            ),
            None => format!("{}?{extra}", self.path),
        }
    }
}

/// Counters over every simulated watch.
#[derive(Debug, Default)]
struct Shared {
    /// Watches open now (response headers received, stream not ended).
    open: AtomicUsize,
    /// List requests (pages).
    lists: AtomicU64,
    /// Relists after `410 Gone`.
    relists: AtomicU64,
    /// Events received, bookmarks apart.
    events: AtomicU64,
    /// Requests that failed (no response, or a status other than 200 and
    /// 410).
    failures: AtomicU64,
    /// When each Service and EndpointSlice patch of the steady phase was
    /// sent, by the resourceVersion it made.
    written: std::sync::Mutex<std::collections::HashMap<u64, Instant>>,
    /// From a patch's sending to its event's arrival at a node, for every
    /// node it reached (µs).
    delivery: std::sync::Mutex<Vec<u32>>,
}

/// Decrements the open count when a watch ends.
struct OpenGuard<'a>(&'a AtomicUsize);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The proxy reflector's backoff (`src/cache/reflector.rs`): 0.1 s
/// doubling to 1 s, with jitter.
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_max_delay(Duration::from_secs(1))
    .with_factor(2.0)
    .with_jitter()
    .without_max_times();

/// How a watch ended.
#[derive(Debug, PartialEq, Eq)]
enum WatchEnd {
    /// The stream ended (its timeout): watch again from the last RV.
    Closed,
    /// `410 Gone`: relist.
    Gone,
}

async fn reflect(
    node: Arc<SimNode>,
    w: Arc<WatchSpec>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let mut backoff = BACKOFF.build();
    let mut listed = false;
    while !stop.is_cancelled() {
        let step = if listed {
            watch(&node, &w, &shared).await.map(|end| {
                if end == WatchEnd::Gone {
                    shared.relists.fetch_add(1, Ordering::Relaxed);
                    listed = false;
                }
            })
        } else {
            list(&node, &w, &shared).await.map(|rv| {
                w.rv.store(rv, Ordering::Relaxed);
                listed = true;
            })
        };
        match step {
            Ok(()) => backoff = BACKOFF.build(),
            Err(_) => {
                shared.failures.fetch_add(1, Ordering::Relaxed);
                let delay = backoff.next().unwrap_or(Duration::from_secs(1));
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// A paginated list; returns its resourceVersion.
async fn list(node: &SimNode, w: &WatchSpec, shared: &Shared) -> Result<u64> {
    let mut continue_token: Option<String> = None;
    let mut rv = None;
    loop {
        let mut extra = format!("limit={PAGE_SIZE}");
        if let Some(c) = &continue_token {
            extra.push_str("&continue=");
            extra.push_str(
                &percent_encoding::utf8_percent_encode(c, percent_encoding::NON_ALPHANUMERIC)
                    .to_string(),
            );
        }
        let mut conn = node.conn().await?;
        shared.lists.fetch_add(1, Ordering::Relaxed);
        let r = node
            .target
            .fetch(&mut conn, Method::GET, &w.query(&extra), None)
            .await?;
        if r.status != StatusCode::OK {
            bail!("list {}: {}", w.path, r.status);
        }
        let page: ListMeta = serde_json::from_slice(&r.body)?;
        if rv.is_none() {
            rv = Some(page.metadata.resource_version.parse()?);
        }
        continue_token = page.metadata.continue_token.filter(|c| !c.is_empty());
        if continue_token.is_none() {
            return rv.ok_or_else(|| anyhow!("no resourceVersion"));
        }
    }
}

/// One watch from the last resourceVersion, until it ends.
async fn watch(node: &SimNode, w: &WatchSpec, shared: &Shared) -> Result<WatchEnd> {
    let rv = w.rv.load(Ordering::Relaxed);
    let timeout = 300 + fastrand::u64(0..300);
    let extra =
        format!("watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds={timeout}");
    let mut conn = node.conn().await?;
    let req = node
        .target
        .request(&conn, Method::GET, &w.query(&extra), None)?;
    let resp = conn.send(req).await?;
    match resp.status() {
        StatusCode::OK => {}
        StatusCode::GONE => return Ok(WatchEnd::Gone),
        s => bail!("watch {}: {s}", w.path),
    }
    shared.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(&shared.open);
    let mut body = resp.into_body();
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line = buf.split_to(pos + 1);
            match parse_event(&line[..pos])? {
                Event::Blank => {}
                Event::Object(rv) => {
                    shared.events.fetch_add(1, Ordering::Relaxed);
                    w.rv.fetch_max(rv, Ordering::Relaxed);
                    let sent = shared.written.lock().ok().and_then(|m| m.get(&rv).copied());
                    if let (Some(sent), Ok(mut d)) = (sent, shared.delivery.lock()) {
                        d.push(crate::stats::micros(sent.elapsed()));
                    }
                }
                Event::Bookmark(rv) => {
                    w.rv.fetch_max(rv, Ordering::Relaxed);
                }
                Event::Error(410) => return Ok(WatchEnd::Gone),
                Event::Error(code) => bail!("watch {}: an ERROR event, code {code}", w.path),
            }
        }
    }
    Ok(WatchEnd::Closed)
}

#[derive(Deserialize)]
struct ListMeta {
    metadata: Meta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    resource_version: String,
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

#[derive(Deserialize)]
struct WireEvent {
    #[serde(rename = "type")]
    kind: String,
    object: WireObject,
}

#[derive(Deserialize)]
struct WireObject {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    code: u16,
}

/// One watch event line, as far as a reflector needs it.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// An empty line.
    Blank,
    /// ADDED, MODIFIED or DELETED, with the object's resourceVersion.
    Object(u64),
    /// BOOKMARK, with its resourceVersion.
    Bookmark(u64),
    /// ERROR, with the Status's code.
    Error(u16),
}

/// Parses one watch event line (JSON).
pub fn parse_event(line: &[u8]) -> Result<Event> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(Event::Blank);
    }
    let e: WireEvent = serde_json::from_slice(line).context("a malformed watch event")?;
    let rv = || -> Result<u64> {
        e.object
            .metadata
            .resource_version
            .parse()
            .map_err(|_| anyhow!("a {} event without a resourceVersion", e.kind))
    };
    match e.kind.as_str() {
        "ADDED" | "MODIFIED" | "DELETED" => Ok(Event::Object(rv()?)),
        "BOOKMARK" => Ok(Event::Bookmark(rv()?)),
        "ERROR" => Ok(Event::Error(e.object.code)),
        other => bail!("unknown watch event type {other:?}"),
    }
}

// === the tier ===

/// A ServiceAccount token for `kube-cache-proxy-tier`.
async fn tier_token(admin: &Target) -> Result<String> {
    let mut conn = admin.connect(Proto::H1).await?;
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                      "spec": {"expirationSeconds": 7200}});
    let r = admin
        .fetch(
            &mut conn,
            Method::POST,
            "/api/v1/namespaces/kube-system/serviceaccounts/kube-cache-proxy-tier/token",
            Some(Bytes::from(serde_json::to_vec(&body)?)),
        )
        .await?;
    if r.status != StatusCode::CREATED {
        bail!("TokenRequest: {}", r.status);
    }
    let v: Value = serde_json::from_slice(&r.body)?;
    v["status"]["token"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("TokenRequest: no token"))
}

/// The tier's configuration: the shipped `manifests/tier/config.yaml`
/// with what only exists in a pod (addresses, files) replaced.
pub fn tier_config(
    listen: &str,
    admin_listen: &str,
    tls: (&Path, &Path, &Path),
    upstream: &Path,
) -> Result<Config> {
    let mut c = Config::from_yaml(TIER_CONFIG).map_err(|e| anyhow!("{e}"))?;
    if c.upstream.identity != IdentityMode::Tier {
        bail!("manifests/tier/config.yaml is not a tier's configuration");
    }
    c.listen = listen.into();
    c.admin_listen = admin_listen.into();
    c.metrics_listen = None;
    c.tls.cert_file = Some(tls.0.to_path_buf());
    c.tls.private_key_file = Some(tls.1.to_path_buf());
    c.tls.client_ca_file = Some(tls.2.to_path_buf());
    c.upstream.kubeconfig = Some(upstream.to_path_buf());
    c.cache.persistence.directory = None;
    c.takeover.socket_path = None;
    c.shutdown_grace_period_seconds = 1;
    c.validate()?;
    Ok(c)
}

/// One tier replica, a child process.
struct TierReplica {
    child: Child,
    url: String,
    ca_pem: String,
    admin: std::net::SocketAddr,
}

impl TierReplica {
    fn start(
        bin: &Path,
        dir: &Path,
        i: usize,
        cp: &ControlPlane,
        ca: &Ca,
        token: &str,
    ) -> Result<TierReplica> {
        let dir = dir.join(format!("tier-{i}"));
        std::fs::create_dir_all(&dir)?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
            Ok(p)
        };
        let serving = ca.issue_server(&["localhost"], &[std::net::Ipv4Addr::LOCALHOST.into()])?;
        let cert = write("tls.crt", &serving.cert_pem)?;
        let key = write("tls.key", &serving.key_pem)?;
        let client_ca = write("client-ca.crt", &cp.ca_pem())?;
        let upstream = write(
            "upstream.kubeconfig",
            &apimachinery::kubeconfig::with_token(&cp.url(), &cp.ca_pem(), token),
        )?;
        let port = kube_testenv::free_port().map_err(|e| anyhow!("{e}"))?;
        let admin_port = kube_testenv::free_port().map_err(|e| anyhow!("{e}"))?;
        let config = tier_config(
            &format!("127.0.0.1:{port}"),
            &format!("127.0.0.1:{admin_port}"),
            (&cert, &key, &client_ca),
            &upstream,
        )?;
        let path = write(
            "config.yaml",
            &serde_saphyr::to_string(&config).map_err(|e| anyhow!("{e}"))?,
        )?;
        let log = std::fs::File::create(dir.join("proxy.log"))?;
        let child = Command::new(bin)
            .args(["--config".as_ref(), path.as_os_str()])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        println!(
            "tier replica {i}: pid {}, https://127.0.0.1:{port}, log {}",
            child.id(),
            dir.join("proxy.log").display()
        );
        Ok(TierReplica {
            child,
            url: format!("https://127.0.0.1:{port}"),
            ca_pem: ca.cert_pem(),
            admin: std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, admin_port)),
        })
    }

    async fn admin_get(&self, path: &str) -> Result<String> {
        let mut s = tokio::net::TcpStream::connect(self.admin).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    async fn ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.admin_get("/readyz?verbose").await {
                Ok(r) if r.starts_with("HTTP/1.1 200") => return Ok(()),
                Ok(r) => r,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                bail!("a tier replica is not ready after {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TierReplica {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_watch_events() {
        let added = br#"{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"a","resourceVersion":"42"},"spec":{}}}"#;
        assert_eq!(parse_event(added).unwrap(), Event::Object(42));
        let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"77","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;
        assert_eq!(parse_event(bookmark).unwrap(), Event::Bookmark(77));
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}}"#;
        assert_eq!(parse_event(gone).unwrap(), Event::Error(410));
        assert_eq!(parse_event(b"  ").unwrap(), Event::Blank);
        assert!(parse_event(br#"{"type":"ADDED","object":{"metadata":{}}}"#).is_err());
        assert!(parse_event(br#"{"type":"WHAT","object":{}}"#).is_err());
        assert!(parse_event(b"{").is_err());
    }

    #[test]
    fn list_metadata() {
        let page: ListMeta = serde_json::from_slice(
            br#"{"kind":"PodList","metadata":{"resourceVersion":"9","continue":"abc"},"items":[{"metadata":{"name":"x"}}]}"#,
        )
        .unwrap();
        assert_eq!(page.metadata.resource_version, "9");
        assert_eq!(page.metadata.continue_token.as_deref(), Some("abc"));
    }

    #[test]
    fn watch_queries_carry_the_node_scope() {
        let w = WatchSpec::new(
            "/api/v1/pods".into(),
            Some("spec.nodeName=sim-node-00001".into()),
        );
        assert_eq!(
            w.query("watch=1"),
            "/api/v1/pods?watch=1&fieldSelector=spec%2EnodeName%3Dsim%2Dnode%2D00001"
        );
        let all = WatchSpec::new("/api/v1/services".into(), None);
        assert_eq!(all.query("limit=500"), "/api/v1/services?limit=500");
    }

    #[test]
    fn seeds_a_pod_per_node_mounting_its_own_objects() {
        let objects = seed_objects(3, 2);
        assert_eq!(objects.len(), 2 + 2 * 2 + 3 * 4);
        let pods: Vec<&Value> = objects
            .iter()
            .filter(|(p, _)| p.ends_with("/pods"))
            .map(|(_, v)| v)
            .collect();
        assert_eq!(pods.len(), 3);
        assert_eq!(pods[1]["spec"]["nodeName"], "sim-node-00001");
        assert_eq!(
            pods[1]["spec"]["volumes"][0]["configMap"]["name"],
            "cm-00001"
        );
        assert_eq!(
            pods[1]["spec"]["volumes"][1]["secret"]["secretName"],
            "sec-00001"
        );
    }

    #[test]
    fn the_tier_runs_the_shipped_configuration() {
        let dir = temp_dir().unwrap();
        let ca = Ca::new("test-ca").unwrap();
        let serving = ca.issue_server(&["localhost"], &[]).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let (cert, key) = (
            write("tls.crt", &serving.cert_pem),
            write("tls.key", &serving.key_pem),
        );
        let client_ca = write("ca.crt", &ca.cert_pem());
        let upstream = write(
            "upstream.kubeconfig",
            &apimachinery::kubeconfig::with_token("https://127.0.0.1:1", &ca.cert_pem(), "t"),
        );
        let c = tier_config(
            "127.0.0.1:1",
            "127.0.0.1:2",
            (&cert, &key, &client_ca),
            &upstream,
        )
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(c.upstream.identity, IdentityMode::Tier);
        let resources: Vec<&str> = c
            .cache
            .resources
            .iter()
            .map(|r| r.resource.as_str())
            .collect();
        for (path, _) in NODE_RESOURCES {
            let r = path.rsplit('/').next().unwrap();
            assert!(resources.contains(&r), "{r} not cached by the tier");
        }
        assert!(resources.contains(&"configmaps") && resources.contains(&"secrets"));
        // What the replica reads back is what was written.
        let text = serde_saphyr::to_string(&c).unwrap();
        assert_eq!(Config::from_yaml(&text).unwrap(), c);
    }

    #[test]
    fn table_rows() {
        let r = TierReport {
            mode: "tier".into(),
            nodes: 100,
            apiserver_watches: 40.0,
            apiserver_watches_before: 7.0,
            apiserver_cpu_cores: 0.05,
            apiserver_rss: 300 << 20,
            watch_events_sent: 600.0,
            watch_bytes_sent: 3e6,
            steady_seconds: 60.0,
            tier: vec![(0.1, 50 << 20)],
            restart: Some(RestartReport {
                lists: 33.0,
                node_lists: 0,
                watches_back: None,
                marker_everywhere: Some(Duration::from_millis(1500)),
                ..RestartReport::default()
            }),
            ..TierReport::default()
        };
        assert_eq!(
            table_row(&r),
            "| tier | 100 | 40 (7) | 0.050 | 300 MiB | 10 | 0.05 | 33 (0 by nodes) | none broke | 1.5 s | 0.100 / 50 MiB |"
        );
    }
}
