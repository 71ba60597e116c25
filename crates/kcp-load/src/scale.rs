//! `scale`: SIG Scalability's measures on hollow nodes, direct and through
//! kube-cache-proxy, side by side in one run (issue 33).
//!
//! For each topology, a fresh control plane (`kube-testenv`: etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, from
//! `../shared/k8s/`) and `--nodes` hollow nodes (`kubemark`: a kubelet and
//! a kube-proxy each):
//! - `direct`: their kubeconfigs point at the apiserver;
//! - `proxies`: each node's at its own node proxy (a child process running
//!   the shipped `manifests/node/config.yaml` as the node itself);
//! - `tier`: those node proxies in front of a tier of two replicas
//!   (`manifests/tier/config.yaml`), half the nodes on each.
//!
//! The workload follows clusterloader2's load test, scaled to the machine:
//! Deployments of 5 to 50 replicas (each with a Service, and a ConfigMap
//! and a Secret its pods mount) adding up to `--pods-per-node` pods per
//! node, created at `--pods-per-second`; once every pod runs, a **mass
//! restart** (every hollow kubelet and kube-proxy stopped and started at
//! once); then each Deployment scaled to half, rolling-updated, and
//! deleted.
//!
//! Measured per topology:
//! - pod startup latency (clusterloader2's: from the pod's creation to it
//!   running with every container ready, as a watch observes both; here
//!   the creation is the watch's `ADDED`, not the whole-second
//!   `creationTimestamp`);
//! - API call latency p99 per call as clusterloader2 groups them (verb,
//!   scope, resource and subresource), from the apiserver's own
//!   `apiserver_request_duration_seconds` over the load (from the nodes
//!   Ready to the end, the mass restart apart; not 5-minute windows),
//!   against the SLOs (mutating and single-object reads ≤ 1 s, namespace
//!   lists ≤ 5 s, cluster lists ≤ 30 s);
//! - the apiserver's CPU seconds and peak RSS (`VmHWM`), its watches
//!   (`apiserver_longrunning_requests`) once the workload runs, its LIST
//!   count and bytes; etcd's CPU seconds;
//! - the node proxies' CPU and RSS per node, and the tier's;
//! - the memory per hollow node (its kubelet's and kube-proxy's RSS);
//! - for the mass restart: the apiserver's CPU and LIST bytes during it,
//!   and the time until every node has posted its status again and every
//!   pod runs; and the mean latency of the calls each kubelet's status
//!   manager makes per pod, at the apiserver and at the node proxies.
//!
//! `--node-uncached RESOURCE` leaves a resource of the node configuration
//! uncached by the node proxies, to weigh its node cache (another agent
//! than the kubelet then cannot read it through them).
//!
//! For each run, the pods slowest to start, step by step: bound, seen by
//! their kubelet, volumes mounted and sandbox up, containers ready, ready
//! (`slowest`: as watched, and from their status conditions at the end of
//! the load).
//!
//! `--rounds N` runs the topologies interleaved N times, the order
//! rotated each round, each run on a fresh control plane; `--results FILE`
//! appends each run's figures to FILE (a JSON object per line) and skips
//! the runs FILE already holds, so that the same command resumes a
//! measurement; `--report-only` runs nothing and reports FILE. The report
//! gives each figure's median and spread over the rounds per topology, and
//! each topology against direct round by round, with whether the
//! difference is beyond the run-to-run spread (`rounds`, `spread`).
//!
//! `--svg` writes a chart of pod startup latency, apiserver CPU, the worst
//! API call against its SLO and the mass restart's convergence by
//! topology: the median over the rounds as the bar, their min–max as the
//! whisker.

mod rounds;
mod slowest;
mod spread;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, anyhow, bail};
use apimachinery::pki::Ca;
use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use kube_cache_proxy::component::config::{Config, IdentityMode};
use kube_testenv::{ControlPlane, Morph, Options, Process};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::client::{Proto, Target};
use crate::env::temp_dir;
use crate::metrics::{self, Sample};
use crate::real::Skip;
use crate::stats::{self, Summary, micros, ms};
use crate::tier::replicas::{TierReplica, tier_samples, tier_token};
use crate::tier::seed::apply;

/// The node proxies' shipped configuration.
const NODE_CONFIG: &str = include_str!("../../../manifests/node/config.yaml");

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Topology {
    /// The hollow nodes talk to the apiserver.
    Direct,
    /// Each through its own node proxy.
    Proxies,
    /// Through node proxies in front of a tier of two replicas.
    Tier,
}

impl Topology {
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Direct => "direct",
            Topology::Proxies => "proxies",
            Topology::Tier => "tier",
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// The proxy binary (node proxies and tier replicas, each its own
    /// process).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "target/release/kube-cache-proxy"
    )]
    proxy_bin: PathBuf,
    /// Hollow nodes.
    #[arg(long, default_value_t = 50)]
    nodes: usize,
    /// Pods per node of the load (clusterloader2's load test: 30).
    #[arg(long, default_value_t = 30)]
    pods_per_node: usize,
    /// Pods created per second (as Deployments).
    #[arg(long, default_value_t = 10.0)]
    pods_per_second: f64,
    /// The topologies, in order (repeatable; default all three): round
    /// 0's order, rotated left by one each round.
    #[arg(long, value_enum)]
    topology: Vec<Topology>,
    /// Rounds: the topologies run this many times, interleaved, the
    /// order rotated each round (by default round 0 runs direct, proxies,
    /// tier; round 1 proxies, tier, direct; ...).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Append each run's figures to this file (a JSON object per line),
    /// and leave out the runs of this measurement (the same commit,
    /// variant and sizes) it already holds finished: the same command
    /// resumes. The report and the chart are then of the whole file.
    #[arg(long, value_name = "FILE")]
    results: Option<PathBuf>,
    /// Run nothing: report `--results` (and write `--svg`).
    #[arg(long, requires = "results")]
    report_only: bool,
    /// Write the chart here (SVG): of `--results`' newest measurement, or
    /// of this invocation's runs.
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
    /// Skip the mass restart.
    #[arg(long)]
    no_restart: bool,
    /// Keep each topology's directories (the control plane's and the
    /// hollow nodes' logs, the proxies' logs and configuration) instead
    /// of removing them at its end.
    #[arg(long)]
    keep_logs: bool,
    /// A resource (plural, e.g. `endpointslices`) the node proxies do not
    /// cache, though the shipped node configuration does (repeatable), to
    /// weigh what its node cache costs. Its reads pass through only for
    /// the kubelet: a node proxy acts upstream as its node alone, so it
    /// refuses to pass through another agent's request (kube-proxy's of
    /// Services and EndpointSlices), which then gets nothing.
    #[arg(long, value_name = "RESOURCE")]
    node_uncached: Vec<String>,
    /// How the node proxies' caches read upstream (`cache.upstreamEncoding`:
    /// `JSON` or `Protobuf`), in place of the shipped node configuration's
    /// choice, to weigh one against the other.
    #[arg(long, value_name = "ENCODING")]
    node_upstream_encoding: Option<String>,
    /// Take a CPU profile of kube-apiserver this long during the load,
    /// from 10 s after its first Deployment (`--profiling=true`), and
    /// print where its CPU went (`pprof.rs`); at most 50 (the apiserver
    /// cuts requests at 60 s). 0: none.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=50))]
    apiserver_profile_seconds: u64,
}

/// One topology's figures.
#[derive(Debug, Default, Clone)]
struct Figures {
    topology: String,
    startup: Summary,
    /// p99 seconds by API call, and the SLO.
    api_p99: BTreeMap<ApiCall, (f64, f64)>,
    apiserver_cpu: f64,
    apiserver_peak_rss: u64,
    etcd_cpu: f64,
    watches: f64,
    lists: f64,
    list_bytes: f64,
    proxy_cpu_per_node: Option<f64>,
    proxy_rss_per_node: Option<u64>,
    tier_cpu: Option<f64>,
    tier_rss: Option<u64>,
    hollow_rss_per_node: u64,
    restart: Option<Restart>,
    /// Where the apiserver's CPU went during the load's profile.
    profile: Option<crate::pprof::Breakdown>,
    /// The pods slowest to start, step by step.
    slowest: Vec<slowest::PodTimes>,
    seconds: f64,
}

/// How many of a run's slowest pods are broken down.
const SLOWEST: usize = 5;

/// The LISTs this tool itself sends while it waits for the nodes
/// ([`nodes_ready`]: every node and Lease, twice a second), and their
/// bytes, so that the mass restart's figures leave them out: they are the
/// measurement's, not the nodes'.
static HARNESS_LISTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static HARNESS_LIST_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn harness_lists() -> (f64, f64) {
    use std::sync::atomic::Ordering::Relaxed;
    (
        HARNESS_LISTS.load(Relaxed) as f64,
        HARNESS_LIST_BYTES.load(Relaxed) as f64,
    )
}

#[derive(Debug, Default, Clone)]
struct Restart {
    converged: Duration,
    apiserver_cpu: f64,
    /// The apiserver's LIST bytes and LISTs during the restart, less this
    /// tool's own ([`HARNESS_LISTS`]).
    list_bytes: f64,
    lists: f64,
    /// Bytes of watch events the apiserver sent: a streaming list's
    /// initial events are these, not a LIST's.
    watch_bytes: f64,
    /// The largest shares of `watch_bytes`, by resource.
    watch_bytes_by_resource: Vec<(String, f64)>,
    /// Objects the apiserver's watch cache walked to start watches from
    /// their initial state (`apiserver_init_events_total`: every object
    /// of the watch's interval, sent or filtered out): a relist by
    /// streaming list.
    init_events: f64,
    /// API call p99 during the restart, as [`Figures::api_p99`].
    api_p99: BTreeMap<ApiCall, (f64, f64)>,
}

pub async fn scale(a: &ScaleArgs) -> Result<()> {
    let topologies = if a.topology.is_empty() {
        vec![Topology::Direct, Topology::Proxies, Topology::Tier]
    } else {
        a.topology.clone()
    };
    let series = rounds::Series::of(a);
    let mut records = Vec::new();
    let mut figures = Vec::new();
    if !a.report_only {
        let done = match &a.results {
            Some(path) => rounds::read(path)?,
            None => Vec::new(),
        };
        for round in 0..a.rounds as usize {
            for t in rounds::order(&topologies, round) {
                if rounds::done(&done, &series, round, t) {
                    println!("=== round {round}, {t:?}: in the results already; not run again");
                    continue;
                }
                println!(
                    "=== round {round}, {t:?}: {} hollow nodes, {} pods each",
                    a.nodes, a.pods_per_node
                );
                let record = rounds::Record::start(&series, round, t);
                let record = match run(a, t).await {
                    Ok(f) => {
                        print_figures(&f);
                        let r = record.with(&f);
                        figures.push(f);
                        r
                    }
                    Err(e) if e.downcast_ref::<Skip>().is_some() => return Err(e),
                    // The other runs go on: a measurement of hours is not
                    // lost to one run's failure, which the report lists.
                    Err(e) => {
                        println!("round {round}, {t:?} failed: {e:#}");
                        rounds::Record {
                            error: Some(format!("{e:#}")),
                            ..record
                        }
                    }
                };
                if let Some(path) = &a.results {
                    rounds::append(path, &record)?;
                }
                records.push(record);
            }
        }
        if a.rounds == 1 && !figures.is_empty() {
            println!("--- table");
            table(&figures);
        }
    }
    let failed = records.iter().filter(|r| r.error.is_some()).count();
    let ran = records.len();
    let all = match &a.results {
        Some(path) => rounds::read(path)?,
        None => records,
    };
    if a.report_only || a.rounds > 1 || a.results.is_some() {
        print!("{}", rounds::report(&all));
    }
    if let Some(path) = &a.svg {
        match rounds::svg(&all) {
            Some(svg) => {
                std::fs::write(path, svg)?;
                println!("chart: {}", path.display());
            }
            None => println!("chart: no run to draw"),
        }
    }
    if failed > 0 {
        bail!("{failed} of {ran} runs failed (above, and in the report)");
    }
    Ok(())
}

/// A hollow node: its kubelet and kube-proxy, and how to start them again.
struct Hollow {
    name: String,
    kubelet_kc: PathBuf,
    proxy_kc: PathBuf,
    kubelet: Option<Process>,
    kube_proxy: Option<Process>,
}

impl Hollow {
    fn start(&mut self, cp: &ControlPlane) -> Result<()> {
        self.kubelet = Some(
            cp.hollow(Morph::Kubelet, &self.name, &self.kubelet_kc, &[])
                .map_err(|e| anyhow!("{e}"))?,
        );
        self.kube_proxy = Some(
            cp.hollow(Morph::Proxy, &self.name, &self.proxy_kc, &[])
                .map_err(|e| anyhow!("{e}"))?,
        );
        Ok(())
    }

    /// Starts again whichever of its processes has exited: kubemark's
    /// kubelet binds a port picked free a moment before (`--kubelet-port`),
    /// which another process may take first with 100 processes starting
    /// at once ("bind: address already in use"). Returns how many.
    fn revive(&mut self, cp: &ControlPlane) -> Result<usize> {
        let mut revived = 0;
        for (morph, slot, kubeconfig) in [
            (Morph::Kubelet, &mut self.kubelet, &self.kubelet_kc),
            (Morph::Proxy, &mut self.kube_proxy, &self.proxy_kc),
        ] {
            if slot.as_ref().is_some_and(|p| p.exited().is_some()) {
                *slot = Some(
                    cp.hollow(morph, &self.name, kubeconfig, &[])
                        .map_err(|e| anyhow!("{e}"))?,
                );
                revived += 1;
            }
        }
        Ok(revived)
    }

    fn stop(&mut self) {
        for p in [self.kubelet.take(), self.kube_proxy.take()]
            .into_iter()
            .flatten()
        {
            p.kill();
        }
    }

    fn rss(&self) -> u64 {
        [&self.kubelet, &self.kube_proxy]
            .into_iter()
            .flatten()
            .filter_map(|p| stats::rss_of(p.pid()))
            .sum()
    }
}

async fn run(a: &ScaleArgs, topology: Topology) -> Result<Figures> {
    let started = Instant::now();
    let cached = Config::from_yaml(NODE_CONFIG).map_err(|e| anyhow!("{e}"))?;
    if let Some(r) = a
        .node_uncached
        .iter()
        .find(|r| !cached.cache.resources.iter().any(|c| &c.resource == *r))
    {
        bail!("--node-uncached {r}: manifests/node/config.yaml does not cache it");
    }
    let options = Options {
        apiserver_args: if a.apiserver_profile_seconds > 0 {
            vec!["--profiling=true".into()]
        } else {
            Vec::new()
        },
        ..Options::default()
    };
    let cp = match ControlPlane::start(options).await {
        Ok(cp) => cp,
        Err(kube_testenv::Error::Assets(e)) => return Err(Skip(format!("scale: {e}")).into()),
        Err(e) => bail!("starting the control plane: {e}"),
    };
    if !cp.assets().has_kubemark() {
        return Err(Skip(format!(
            "scale: no kubemark in {}",
            cp.assets().dir.display()
        ))
        .into());
    }
    let _controllers = cp.start_controllers().map_err(|e| match e {
        kube_testenv::Error::Assets(e) => anyhow::Error::from(Skip(format!("scale: {e}"))),
        e => anyhow!("starting the controllers: {e}"),
    })?;
    let admin = Target::from_kubeconfig(Some(cp.admin_kubeconfig()), None).await?;
    apply(&admin, include_str!("../../../manifests/node/rbac.yaml")).await?;
    let dir = temp_dir()?;

    // The tier, then a node proxy per node (or none), then the nodes.
    let proxy_ca = Ca::new("kcp-load-scale-ca")?;
    let mut tier = Vec::new();
    if topology == Topology::Tier {
        apply(
            &admin,
            include_str!("../../../manifests/tier/serviceaccount.yaml"),
        )
        .await?;
        apply(&admin, include_str!("../../../manifests/tier/rbac.yaml")).await?;
        apply(
            &admin,
            include_str!("../../../manifests/tier/flowcontrol.yaml"),
        )
        .await?;
        let token = tier_token(&admin).await?;
        for i in 0..2 {
            tier.push(TierReplica::start(
                &a.proxy_bin,
                &dir,
                i,
                &cp,
                &proxy_ca,
                &token,
                None,
            )?);
        }
        for r in &tier {
            r.ready(Duration::from_secs(120)).await?;
        }
    }
    let kube_proxy_cert = cp.issue_client("system:kube-proxy", None)?;
    let mut proxies = Vec::new();
    let mut hollows = Vec::new();
    for i in 0..a.nodes {
        let name = format!("hollow-{i:03}");
        let user = format!("system:node:{name}");
        let cert = cp.issue_client(&user, Some("system:nodes"))?;
        let node_dir = dir.join(&name);
        std::fs::create_dir_all(&node_dir)?;
        let write = |file: &str, text: &str| -> Result<PathBuf> {
            let p = node_dir.join(file);
            std::fs::write(&p, text)?;
            Ok(p)
        };
        let (server, server_ca) = if topology == Topology::Direct {
            (cp.url(), cp.ca_pem())
        } else {
            let (upstream, upstream_ca) = match tier.get(i % 2) {
                Some(r) => (r.url.clone(), r.ca_pem.clone()),
                None => (cp.url(), cp.ca_pem()),
            };
            let serving =
                proxy_ca.issue_server(&["localhost"], &[std::net::Ipv4Addr::LOCALHOST.into()])?;
            let mut c = Config::from_yaml(NODE_CONFIG).map_err(|e| anyhow!("{e}"))?;
            if c.upstream.identity != IdentityMode::Node {
                bail!("manifests/node/config.yaml is not a node proxy's configuration");
            }
            c.node_name = name.clone();
            c.cache
                .resources
                .retain(|r| !a.node_uncached.contains(&r.resource));
            if let Some(e) = &a.node_upstream_encoding {
                c.cache.upstream_encoding = serde_json::from_value(serde_json::json!(e))
                    .map_err(|_| anyhow!("--node-upstream-encoding {e}: JSON or Protobuf"))?;
            }
            c.metrics_listen = None;
            c.tls.cert_file = Some(write("tls.crt", &serving.cert_pem)?);
            c.tls.private_key_file = Some(write("tls.key", &serving.key_pem)?);
            c.tls.client_ca_file = Some(write("client-ca.crt", &cp.ca_pem())?);
            c.upstream.kubeconfig = Some(write(
                "upstream.kubeconfig",
                &apimachinery::kubeconfig::with_certificate(
                    &upstream,
                    &upstream_ca,
                    &user,
                    &cert.cert_pem,
                    &cert.key_pem,
                ),
            )?);
            c.cache.persistence.directory = None;
            c.takeover.socket_path = None;
            c.shutdown_grace_period_seconds = 1;
            // Ports picked free a moment before the proxy binds them: with
            // a hundred processes starting, another may take one first, and
            // the proxy exits; then it starts again on others.
            let mut attempt = 0;
            let p = loop {
                attempt += 1;
                c.listen = format!("127.0.0.1:{}", kube_testenv::free_port()?);
                c.admin_listen = format!("127.0.0.1:{}", kube_testenv::free_port()?);
                c.validate()?;
                let p = TierReplica::spawn(
                    &a.proxy_bin,
                    &node_dir,
                    &format!("node proxy {name}"),
                    &c,
                    &proxy_ca,
                )?;
                match p.ready(Duration::from_secs(300)).await {
                    Ok(()) => break p,
                    Err(e) if attempt < 3 => println!("node proxy {name}: {e}; starting again"),
                    Err(e) => return Err(e),
                }
            };
            let url = p.url.clone();
            proxies.push(p);
            (url, proxy_ca.cert_pem())
        };
        let kubelet_kc = write(
            "kubelet.kubeconfig",
            &apimachinery::kubeconfig::with_certificate(
                &server,
                &server_ca,
                &user,
                &cert.cert_pem,
                &cert.key_pem,
            ),
        )?;
        let proxy_kc = write(
            "kube-proxy.kubeconfig",
            &apimachinery::kubeconfig::with_certificate(
                &server,
                &server_ca,
                "system:kube-proxy",
                &kube_proxy_cert.cert_pem,
                &kube_proxy_cert.key_pem,
            ),
        )?;
        hollows.push(Hollow {
            name,
            kubelet_kc,
            proxy_kc,
            kubelet: None,
            kube_proxy: None,
        });
    }
    let cpu0 = cpus(&cp, &proxies, &tier);
    let api0 = apiserver_metrics(&admin).await?;
    for h in &mut hollows {
        h.start(&cp)?;
    }
    let ready_in = nodes_ready(
        &admin,
        &cp,
        &mut hollows,
        a.nodes,
        None,
        Duration::from_secs(600),
    )
    .await?;
    println!("{} nodes Ready in {:.1}s", a.nodes, ready_in.as_secs_f64());
    // API call latency is taken from here, over the load, as
    // clusterloader2 takes it over a test on a cluster already up: the
    // nodes' registration burst (every kubelet's POST of its Node and
    // first GETs at once) is a start-up, not the load.
    let api_load0 = apiserver_metrics(&admin).await?;

    // The load.
    let pods = Pods::watch(&admin).await?;
    let plan = plan(a.nodes * a.pods_per_node);
    let created = Instant::now();
    let profiling = (a.apiserver_profile_seconds > 0).then(|| {
        let (admin, seconds, dir) = (admin.clone(), a.apiserver_profile_seconds, dir.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let mut conn = admin.connect(Proto::H1).await?;
            let path = format!("/debug/pprof/profile?seconds={seconds}");
            let r = admin.fetch(&mut conn, Method::GET, &path, None).await?;
            if !r.status.is_success() {
                bail!("{path}: {} {}", r.status, String::from_utf8_lossy(&r.body));
            }
            let file = dir.join("apiserver-cpu.pprof");
            std::fs::write(&file, &r.body)?;
            println!("apiserver CPU profile ({seconds} s): {}", file.display());
            crate::pprof::breakdown(&r.body)
        })
    });
    for (i, d) in plan.iter().enumerate() {
        create_deployment(&admin, d).await?;
        if i % 10 == 9 {
            println!("created {} deployments", i + 1);
        }
        tokio::time::sleep(Duration::from_secs_f64(
            d.replicas as f64 / a.pods_per_second,
        ))
        .await;
    }
    let total: usize = plan.iter().map(|d| d.replicas).sum();
    pods.wait_running(total, Duration::from_secs(1200)).await?;
    println!(
        "{total} pods running {:.1}s after the first was created",
        created.elapsed().as_secs_f64()
    );
    let startup = pods.startup();
    let profile = match profiling {
        Some(task) => match task.await? {
            Ok(b) => {
                println!("where the apiserver's CPU went during the load:\n{b}");
                Some(b)
            }
            Err(e) => {
                println!("apiserver CPU profile: {e:#}");
                None
            }
        },
        None => None,
    };
    let slowest = pods.slowest(SLOWEST);
    println!("the {SLOWEST} pods slowest to start:");
    for p in &slowest {
        println!("  {}", p.show());
    }
    let watches = metric_sum(
        &apiserver_metrics(&admin).await?,
        "apiserver_longrunning_requests",
        &[("verb", "WATCH")],
    );
    let hollow_rss = hollows.iter().map(Hollow::rss).sum::<u64>() / a.nodes.max(1) as u64;

    // The mass restart.
    let mut restart_window = None;
    let restart = if a.no_restart {
        None
    } else {
        let m0 = apiserver_metrics(&admin).await?;
        let p0 = proxies_metrics(&proxies).await;
        let c0 = stats::cpu_of(cp.apiserver_pid()).unwrap_or_default();
        for h in &mut hollows {
            h.stop();
        }
        let t0 = Instant::now();
        pods.mark(t0);
        let wall0 = SystemTime::now();
        let h0 = harness_lists();
        for h in &mut hollows {
            h.start(&cp)?;
        }
        let ready = nodes_ready(
            &admin,
            &cp,
            &mut hollows,
            a.nodes,
            Some(wall0),
            Duration::from_secs(900),
        )
        .await?;
        // Every pod's status written again by its new kubelet, running.
        pods.wait_for(total, Duration::from_secs(900), |p| p.changed > t0)
            .await?;
        let converged = t0.elapsed();
        let m1 = apiserver_metrics(&admin).await?;
        let p1 = proxies_metrics(&proxies).await;
        let c1 = stats::cpu_of(cp.apiserver_pid()).unwrap_or_default();
        let (harness_lists, harness_bytes) = {
            let (l1, b1) = harness_lists();
            (l1 - h0.0, b1 - h0.1)
        };
        let r = Restart {
            converged,
            apiserver_cpu: (c1 - c0).as_secs_f64(),
            list_bytes: growth(
                &m0,
                &m1,
                "apiserver_response_sizes_sum",
                &[("verb", "LIST")],
            ) - harness_bytes,
            lists: growth(&m0, &m1, "apiserver_request_total", &[("verb", "LIST")]) - harness_lists,
            watch_bytes: growth(&m0, &m1, "apiserver_watch_events_sizes_sum", &[]),
            watch_bytes_by_resource: {
                let mut v: Vec<_> =
                    growth_by(&m0, &m1, "apiserver_watch_events_sizes_sum", "resource")
                        .into_iter()
                        .collect();
                v.sort_by(|a, b| b.1.total_cmp(&a.1));
                v.truncate(4);
                v
            },
            init_events: growth(&m0, &m1, "apiserver_init_events_total", &[]),
            api_p99: latency_p99(&[(&m0, &m1)]),
        };
        println!(
            "mass restart: converged in {:.1}s; apiserver {:.1} CPU s, {} LISTs, {} (this tool's own {harness_lists} LISTs, {}, left out), watch events {} ({}), {} initial events",
            r.converged.as_secs_f64(),
            r.apiserver_cpu,
            r.lists,
            stats::mib(r.list_bytes as u64),
            stats::mib(harness_bytes as u64),
            stats::mib(r.watch_bytes as u64),
            r.watch_bytes_by_resource
                .iter()
                .map(|(r, b)| format!("{r} {}", stats::mib(*b as u64)))
                .collect::<Vec<_>>()
                .join(", "),
            r.init_events
        );
        println!(
            "  timeline: every node Ready with its Lease renewed at {:.1} s; {}",
            ready.as_secs_f64(),
            pods.restart_timeline(t0)
        );
        println!("  API call p99 during it, worst: {}", worst(&r.api_p99));
        println!(
            "  a status manager's calls per pod during it: {}",
            status_calls(&m0, &m1, &p0, &p1)
        );
        print_restart_lists(&m0, &m1);
        if !proxies.is_empty() {
            print_proxies_upstream("during the mass restart", &p0, &p1);
        }
        restart_window = Some((m0, m1));
        Some(r)
    };

    // Scale to half, roll, delete.
    for d in &plan {
        scale_deployment(&admin, d, d.replicas.div_ceil(2)).await?;
    }
    let half: usize = plan.iter().map(|d| d.replicas.div_ceil(2)).sum();
    pods.wait_running(half, Duration::from_secs(900)).await?;
    for d in &plan {
        roll_deployment(&admin, d).await?;
    }
    pods.wait_for(half, Duration::from_secs(900), |p| p.rolled)
        .await?;
    for d in &plan {
        delete(
            &admin,
            &format!(
                "/apis/apps/v1/namespaces/{}/deployments/{}",
                d.namespace, d.name
            ),
        )
        .await?;
    }
    pods.wait_running(0, Duration::from_secs(900)).await?;

    let api1 = apiserver_metrics(&admin).await?;
    println!(
        "  API Priority and Fairness, whole run: rejected {}",
        metrics::growth_line(
            &api0,
            &api1,
            "apiserver_flowcontrol_rejected_requests_total",
            &["priority_level", "flow_schema", "reason"],
        )
    );
    if !proxies.is_empty() {
        print_proxies_upstream("whole run", &[], &proxies_metrics(&proxies).await);
    }
    let cpu1 = cpus(&cp, &proxies, &tier);
    let n = a.nodes.max(1) as f64;
    let f = Figures {
        topology: format!("{topology:?}").to_lowercase(),
        startup,
        // The load test's SLO window: everything but the mass restart,
        // which clusterloader2's load test does not do (its own figures
        // are in `restart`).
        api_p99: match &restart_window {
            Some((m0, m1)) => latency_p99(&[(&api_load0, m0), (m1, &api1)]),
            None => latency_p99(&[(&api_load0, &api1)]),
        },
        apiserver_cpu: cpu1.apiserver - cpu0.apiserver,
        apiserver_peak_rss: stats::peak_rss_of(cp.apiserver_pid()).unwrap_or_default(),
        etcd_cpu: cpu1.etcd - cpu0.etcd,
        watches,
        lists: growth(&api0, &api1, "apiserver_request_total", &[("verb", "LIST")]),
        list_bytes: growth(
            &api0,
            &api1,
            "apiserver_response_sizes_sum",
            &[("verb", "LIST")],
        ),
        proxy_cpu_per_node: (!proxies.is_empty()).then(|| (cpu1.proxies - cpu0.proxies) / n),
        proxy_rss_per_node: (!proxies.is_empty()).then(|| {
            proxies
                .iter()
                .filter_map(|p| stats::rss_of(p.pid()))
                .sum::<u64>()
                / proxies.len() as u64
        }),
        tier_cpu: (!tier.is_empty()).then_some(cpu1.tier - cpu0.tier),
        tier_rss: (!tier.is_empty()).then(|| tier_samples(&tier).iter().map(|s| s.1).sum()),
        hollow_rss_per_node: hollow_rss,
        restart,
        profile,
        slowest,
        seconds: started.elapsed().as_secs_f64(),
    };
    pods.stop();
    for h in &mut hollows {
        h.stop();
    }
    for p in proxies {
        p.stop().await;
    }
    for r in tier {
        r.stop().await;
    }
    let cp_dir = cp.dir().to_path_buf();
    drop(_controllers);
    drop(cp);
    if a.keep_logs {
        println!(
            "kept: the control plane's and hollow nodes' logs in {}, the proxies' in {}",
            cp_dir.display(),
            dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(cp_dir);
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(f)
}

/// CPU seconds so far.
struct Cpus {
    apiserver: f64,
    etcd: f64,
    proxies: f64,
    tier: f64,
}

fn cpus(cp: &ControlPlane, proxies: &[TierReplica], tier: &[TierReplica]) -> Cpus {
    let of = |pid: u32| stats::cpu_of(pid).unwrap_or_default().as_secs_f64();
    Cpus {
        apiserver: of(cp.apiserver_pid()),
        etcd: of(cp.etcd_pid()),
        proxies: proxies.iter().map(|p| of(p.pid())).sum(),
        tier: tier.iter().map(|p| of(p.pid())).sum(),
    }
}

async fn apiserver_metrics(admin: &Target) -> Result<Vec<Sample>> {
    let mut conn = admin.connect(Proto::H1).await?;
    let r = admin
        .fetch(&mut conn, Method::GET, "/metrics", None)
        .await?;
    if !r.status.is_success() {
        bail!("/metrics: {}", r.status);
    }
    Ok(metrics::parse(&String::from_utf8_lossy(&r.body)))
}

fn metric_sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == *v))
        .map(|s| s.value)
        .sum()
}

fn growth(before: &[Sample], after: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sum(after, name, labels) - metric_sum(before, name, labels)
}

/// Every node proxy's metrics, concatenated (a sum over them is the
/// fleet's); a proxy that does not answer is left out, and said so.
async fn proxies_metrics(proxies: &[TierReplica]) -> Vec<Sample> {
    let mut all = Vec::new();
    for p in proxies {
        match p.metrics().await {
            Ok(m) => all.extend(m),
            Err(e) => println!("  a node proxy's metrics: {e}"),
        }
    }
    all
}

/// The calls a kubelet's status manager makes for each pod whose status
/// changed, one pod after the other (`pkg/kubelet/status/status_manager.go`,
/// `syncPod`: a consistent `GET` of the pod, then a `PATCH` of its
/// status), during the mass restart: their number and mean latency as the
/// apiserver measured them (`apiserver_request_duration_seconds`) and, in
/// front of it, as the node proxies did
/// (`kube_cache_proxy_request_duration_seconds`, passed through). The
/// difference is what the hops added to each call; a node's last pod
/// waits for two such calls per pod before it.
fn status_calls(m0: &[Sample], m1: &[Sample], p0: &[Sample], p1: &[Sample]) -> String {
    // Passed through (`source="upstream"`) at the node proxies; the
    // apiserver's samples have no `source`.
    let keys = ["verb", "resource", "subresource", "source"];
    let mean = |before: &[Sample], after: &[Sample], metric: &str, verb: &str, sub: &str| {
        let of = |suffix: &str| -> f64 {
            metrics::growth(before, after, &format!("{metric}_{suffix}"), &keys)
                .into_iter()
                .filter(|(k, _)| {
                    k[0] == verb
                        && k[1] == "pods"
                        && k[2] == sub
                        && matches!(k[3].as_str(), "" | "upstream")
                })
                .map(|(_, v)| v)
                .sum()
        };
        let (sum, count) = (of("sum"), of("count"));
        (count > 0.0).then(|| (count, sum / count))
    };
    let mut parts = Vec::new();
    for (verb, sub, call) in [
        ("GET", "", "GET pods"),
        ("PATCH", "status", "PATCH pods/status"),
    ] {
        let mut part = format!("{call}: apiserver ");
        match mean(m0, m1, "apiserver_request_duration_seconds", verb, sub) {
            Some((n, m)) => part.push_str(&format!("{n:.0} calls, mean {:.0} ms", m * 1e3)),
            None => part.push_str("none"),
        }
        if !p0.is_empty() || !p1.is_empty() {
            match mean(
                p0,
                p1,
                "kube_cache_proxy_request_duration_seconds",
                verb,
                sub,
            ) {
                Some((n, m)) => part.push_str(&format!(
                    "; node proxies {n:.0} passed through, mean {:.0} ms",
                    m * 1e3
                )),
                None => part.push_str("; node proxies none"),
            }
        }
        parts.push(part);
    }
    parts.join("; ")
}

/// The apiserver's LISTs during the mass restart by resource: count and
/// bytes (`apiserver_request_total`, `apiserver_response_sizes_sum`), the
/// largest first, to tell whole lists from metadata-only probes.
fn print_restart_lists(m0: &[Sample], m1: &[Sample]) {
    let lists: BTreeMap<Vec<String>, f64> =
        metrics::growth(m0, m1, "apiserver_request_total", &["verb", "resource"])
            .into_iter()
            .filter(|(k, _)| k[0] == "LIST")
            .map(|(k, v)| (vec![k[1].clone()], v))
            .collect();
    let mut bytes: Vec<(String, f64)> = metrics::growth(
        m0,
        m1,
        "apiserver_response_sizes_sum",
        &["verb", "resource"],
    )
    .into_iter()
    .filter(|(k, _)| k[0] == "LIST")
    .map(|(k, v)| (k[1].clone(), v))
    .collect();
    bytes.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!(
        "  apiserver LISTs during it by resource (count, bytes): {}",
        bytes
            .iter()
            .map(|(r, b)| format!(
                "{r} {:.0}, {}",
                lists.get(&vec![r.clone()]).copied().unwrap_or(0.0),
                stats::mib(*b as u64)
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

/// What the node proxies asked upstream for and why between two
/// snapshots of [`proxies_metrics`]: their consistency probes by result,
/// their authorization reviews by result, their own lists (the first and
/// relists) by resource, and the reads they passed through by reason and
/// resource.
fn print_proxies_upstream(when: &str, before: &[Sample], after: &[Sample]) {
    let by = |name: &str, labels: &[&str], filter: &[(&str, &str)]| {
        let keep = |samples: &[Sample]| -> Vec<Sample> {
            samples
                .iter()
                .filter(|s| s.name == name && filter.iter().all(|(k, v)| s.label(k) == *v))
                .cloned()
                .collect()
        };
        metrics::growth(&keep(before), &keep(after), name, labels)
            .into_iter()
            .map(|(k, v)| format!("{}={v:.0}", k.join("/")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "  node proxies, {when}: consistency probes {}; authorizations {}; upstream lists {}; reads passed through by reason {}",
        by(
            "kube_cache_proxy_cache_consistency_probes_total",
            &["result"],
            &[]
        ),
        by("kube_cache_proxy_authorization_total", &["result"], &[]),
        by(
            "kube_cache_proxy_upstream_relists_total",
            &["resource"],
            &[]
        ),
        by(
            "kube_cache_proxy_cache_reads_total",
            &["reason", "verb", "resource"],
            &[("source", "upstream")]
        ),
    );
}

/// [`metrics::growth`] of `name` by the value of one label.
fn growth_by(
    before: &[Sample],
    after: &[Sample],
    name: &str,
    label: &str,
) -> BTreeMap<String, f64> {
    metrics::growth(before, after, name, &[label])
        .into_iter()
        .map(|(mut k, v)| (k.pop().unwrap_or_default(), v))
        .collect()
}

/// The SLO of a (verb, scope): kubernetes/community
/// `sig-scalability/slos/api_call_latency.md`.
fn slo(verb: &str, scope: &str) -> f64 {
    match (verb, scope) {
        ("LIST", "cluster") => 30.0,
        ("LIST", _) => 5.0,
        _ => 1.0,
    }
}

/// An API call as clusterloader2's API call latency SLI counts one
/// (`APIResponsivenessPrometheus`): verb, scope, and resource with its
/// subresource (`pods/binding`).
type ApiCall = (String, String, String);

/// Subresources the SLI leaves out, as clusterloader2 does
/// (`subresource!~"log|exec|portforward|attach|proxy"`): long-running or
/// proxied to a kubelet.
const LONG_RUNNING_SUBRESOURCES: [&str; 5] = ["log", "exec", "portforward", "attach", "proxy"];

/// p99 of `apiserver_request_duration_seconds` by API call (verb, scope,
/// resource and subresource, as clusterloader2 groups them; long-running
/// verbs and subresources, and requests of no resource such as
/// `/openapi/v3` or `/healthz`, left out: the SLO is per resource), as
/// the smallest bucket bound holding 99 % of the requests made between
/// each pair of snapshots (before, after), the pairs taken together; with
/// each call's SLO.
fn latency_p99(intervals: &[(&[Sample], &[Sample])]) -> BTreeMap<ApiCall, (f64, f64)> {
    let name = "apiserver_request_duration_seconds_bucket";
    let mut buckets: BTreeMap<ApiCall, BTreeMap<u64, f64>> = BTreeMap::new();
    let signed = intervals
        .iter()
        .flat_map(|(before, after)| [(*after, 1.0), (*before, -1.0)]);
    for (samples, sign) in signed {
        for s in samples.iter().filter(|s| s.name == name) {
            let verb = s.label("verb");
            let subresource = s.label("subresource");
            if matches!(verb, "WATCH" | "CONNECT" | "WATCHLIST")
                || LONG_RUNNING_SUBRESOURCES.contains(&subresource)
                || s.label("resource").is_empty()
            {
                continue;
            }
            let le = match s.label("le") {
                "+Inf" => f64::INFINITY,
                le => le.parse().unwrap_or(f64::INFINITY),
            };
            let resource = match subresource {
                "" => s.label("resource").to_string(),
                sub => format!("{}/{sub}", s.label("resource")),
            };
            *buckets
                .entry((verb.to_string(), s.label("scope").to_string(), resource))
                .or_default()
                .entry(le.to_bits())
                .or_default() += sign * s.value;
        }
    }
    let mut out = BTreeMap::new();
    for (key, b) in buckets {
        let mut bounds: Vec<(f64, f64)> = b
            .into_iter()
            .map(|(le, n)| (f64::from_bits(le), n))
            .collect();
        bounds.sort_by(|x, y| x.0.total_cmp(&y.0));
        let count = bounds.last().map_or(0.0, |b| b.1);
        if count < 1.0 {
            continue;
        }
        let p99 = bounds
            .iter()
            .find(|(_, n)| *n >= 0.99 * count)
            .map_or(f64::INFINITY, |b| b.0);
        let limit = slo(&key.0, &key.1);
        out.insert(key, (p99, limit));
    }
    out
}

/// Waits until `n` nodes are Ready and, with `since`, each has renewed
/// its Lease since then (a kubelet back after a restart: a node stays
/// Ready through a restart shorter than the node-monitor grace period);
/// returns how long it took.
async fn nodes_ready(
    admin: &Target,
    cp: &ControlPlane,
    hollows: &mut [Hollow],
    n: usize,
    since: Option<SystemTime>,
    timeout: Duration,
) -> Result<Duration> {
    let start = Instant::now();
    let since = since.and_then(|t| jiff::Timestamp::try_from(t).ok());
    let items = |path: &'static str| async move {
        let mut conn = admin.connect(Proto::H1).await?;
        let r = admin.fetch(&mut conn, Method::GET, path, None).await?;
        HARNESS_LISTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        HARNESS_LIST_BYTES.fetch_add(r.body.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        anyhow::Ok(v["items"].as_array().cloned().unwrap_or_default())
    };
    loop {
        let ready = items("/api/v1/nodes")
            .await?
            .iter()
            .filter(|node| {
                node["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .count();
        let renewed = match since {
            None => n,
            Some(since) => items("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
                .await?
                .iter()
                .filter(|l| {
                    l["spec"]["renewTime"]
                        .as_str()
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        .is_some_and(|t| t > since)
                })
                .count(),
        };
        if ready >= n && renewed >= n {
            return Ok(start.elapsed());
        }
        for h in hollows.iter_mut() {
            let revived = h.revive(cp)?;
            if revived > 0 {
                println!(
                    "{}: {revived} hollow process(es) exited; started again",
                    h.name
                );
            }
        }
        if start.elapsed() > timeout {
            bail!("{ready} of {n} nodes Ready, {renewed} Leases renewed, after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A Deployment of the load.
struct Deployment {
    namespace: String,
    name: String,
    replicas: usize,
}

/// Deployments of 5, 10, 25 and 50 replicas in turn (the last cut to fit)
/// adding up to `total` pods, ten to a namespace.
fn plan(total: usize) -> Vec<Deployment> {
    let sizes = [5, 10, 25, 50];
    let mut out = Vec::new();
    let mut left = total;
    while left > 0 {
        let i = out.len();
        let replicas = sizes[i % sizes.len()].min(left);
        out.push(Deployment {
            namespace: format!("load-{}", i / 10),
            name: format!("d-{i:03}"),
            replicas,
        });
        left -= replicas;
    }
    out
}

async fn post(admin: &Target, path: &str, body: &Value) -> Result<()> {
    let mut conn = admin.connect(Proto::H1).await?;
    let r = admin
        .fetch(
            &mut conn,
            Method::POST,
            path,
            Some(Bytes::from(serde_json::to_vec(body)?)),
        )
        .await?;
    if !r.status.is_success() && r.status != http::StatusCode::CONFLICT {
        bail!(
            "POST {path}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    Ok(())
}

async fn delete(admin: &Target, path: &str) -> Result<()> {
    let mut conn = admin.connect(Proto::H1).await?;
    let r = admin.fetch(&mut conn, Method::DELETE, path, None).await?;
    if !r.status.is_success() && r.status != http::StatusCode::NOT_FOUND {
        bail!("DELETE {path}: {}", r.status);
    }
    Ok(())
}

async fn create_deployment(admin: &Target, d: &Deployment) -> Result<()> {
    let ns = &d.namespace;
    let name = &d.name;
    post(
        admin,
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await?;
    post(
        admin,
        &format!("/api/v1/namespaces/{ns}/configmaps"),
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{name}-config")}, "data": {"k": "v"}}),
    )
    .await?;
    post(
        admin,
        &format!("/api/v1/namespaces/{ns}/secrets"),
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-secret")}, "stringData": {"k": "v"}}),
    )
    .await?;
    post(
        admin,
        &format!("/api/v1/namespaces/{ns}/services"),
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}}),
    )
    .await?;
    post(
        admin,
        &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
        &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": d.replicas, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"automountServiceAccountToken": false,
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                            "volumeMounts": [{"name": "config", "mountPath": "/config"},
                                             {"name": "secret", "mountPath": "/secret"}]}],
                        "volumes": [{"name": "config", "configMap": {"name": format!("{name}-config")}},
                                    {"name": "secret", "secret": {"secretName": format!("{name}-secret")}}]}}}}),
    )
    .await
}

async fn scale_deployment(admin: &Target, d: &Deployment, replicas: usize) -> Result<()> {
    let (ns, name) = (&d.namespace, &d.name);
    let path = format!("/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale");
    let body = json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                      "metadata": {"name": name, "namespace": ns}, "spec": {"replicas": replicas}});
    let mut conn = admin.connect(Proto::H1).await?;
    let r = admin
        .fetch(
            &mut conn,
            Method::PUT,
            &path,
            Some(Bytes::from(serde_json::to_vec(&body)?)),
        )
        .await?;
    if !r.status.is_success() {
        bail!(
            "PUT {path}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    Ok(())
}

/// A rolling update: a new pod-template annotation (read, changed, written
/// back; again on a conflict).
async fn roll_deployment(admin: &Target, d: &Deployment) -> Result<()> {
    let path = format!(
        "/apis/apps/v1/namespaces/{}/deployments/{}",
        d.namespace, d.name
    );
    for _ in 0..10 {
        let mut conn = admin.connect(Proto::H1).await?;
        let r = admin.fetch(&mut conn, Method::GET, &path, None).await?;
        let mut v: Value = serde_json::from_slice(&r.body)?;
        v["spec"]["template"]["metadata"]["annotations"] = json!({"kcp-load/rolled": "1"});
        let r = admin
            .fetch(
                &mut conn,
                Method::PUT,
                &path,
                Some(Bytes::from(serde_json::to_vec(&v)?)),
            )
            .await?;
        if r.status.is_success() {
            return Ok(());
        }
        if r.status != http::StatusCode::CONFLICT {
            bail!("PUT {path}: {}", r.status);
        }
    }
    bail!("PUT {path}: conflicts")
}

/// What a watch of every pod has seen of one.
struct Seen {
    /// When `ADDED` was seen.
    added: Instant,
    /// When it was first seen running with every container ready.
    first_running: Option<Instant>,
    /// Whether it runs (every container ready) now.
    running: bool,
    /// When it last changed.
    changed: Instant,
    /// Whether it is of a rolled-out template (`kcp-load/rolled`).
    rolled: bool,
    /// `namespace/name`, and the node it is bound to once it is.
    name: String,
    node: String,
    /// Since [`Pods::mark`]: when it was first written again, and when it
    /// was first seen running again.
    rewritten: Option<Instant>,
    running_again: Option<Instant>,
    /// Its steps to running, for [`Pods::slowest`].
    status: slowest::Status,
}

/// What a watch of every pod has seen, by uid.
#[derive(Default)]
struct PodState {
    pods: HashMap<String, Seen>,
    /// The mass restart's start, once it is under way.
    mark: Option<Instant>,
}

/// A watch of every pod of the load (namespaces `load-*`), straight to
/// the apiserver as admin.
struct Pods {
    state: Arc<Mutex<PodState>>,
    stop: CancellationToken,
}

impl Pods {
    async fn watch(admin: &Target) -> Result<Pods> {
        let state = Arc::new(Mutex::new(PodState::default()));
        let stop = CancellationToken::new();
        let (admin, s, st) = (admin.clone(), state.clone(), stop.clone());
        tokio::spawn(async move {
            let mut rv = String::new();
            while !st.is_cancelled() {
                let watched = watch_pods(&admin, &s, &mut rv);
                tokio::select! {
                    _ = st.cancelled() => return,
                    r = watched => if let Err(e) = r {
                        println!("pod watch: {e:#}; again");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        Ok(Pods { state, stop })
    }

    /// Waits until exactly `n` pods exist and every one runs and
    /// satisfies `also`.
    async fn wait_for(
        &self,
        n: usize,
        timeout: Duration,
        also: impl Fn(&Seen) -> bool,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            let (total, ok) = {
                let s = self
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                (
                    s.pods.len(),
                    s.pods.values().filter(|p| p.running && also(p)).count(),
                )
            };
            if total == n && ok == n {
                return Ok(());
            }
            if start.elapsed() > timeout {
                bail!("{ok} of {n} pods as wanted ({total} exist) after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_running(&self, n: usize, timeout: Duration) -> Result<()> {
        self.wait_for(n, timeout, |_| true).await
    }

    /// Creation (`ADDED`) to running, of every pod seen running.
    fn startup(&self) -> Summary {
        let s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut v: Vec<u32> = s
            .pods
            .values()
            .filter_map(|p| p.first_running.map(|r| micros(r - p.added)))
            .collect();
        Summary::of(&mut v)
    }

    /// The `n` pods slowest to start (creation to running, of those
    /// seen running), step by step.
    fn slowest(&self, n: usize) -> Vec<slowest::PodTimes> {
        let s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut v: Vec<_> = s
            .pods
            .values()
            .filter_map(|p| p.first_running.map(|r| (r - p.added, p, r)))
            .collect();
        v.sort_by_key(|p| std::cmp::Reverse(p.0));
        v.into_iter()
            .take(n)
            .map(|(_, p, running)| {
                slowest::PodTimes::of(&p.name, &p.node, p.added, running, &p.status)
            })
            .collect()
    }

    /// From now on, note when each pod is first written again and first
    /// seen running again (the mass restart's timeline).
    fn mark(&self, t0: Instant) {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.mark = Some(t0);
        for p in s.pods.values_mut() {
            p.rewritten = None;
            p.running_again = None;
        }
    }

    /// The mass restart's timeline, from `t0`: when pods were first written
    /// again and first seen running again (p50 / p90 / p99 / max), and the
    /// nodes whose last pod ran again latest, with their first and last.
    fn restart_timeline(&self, t0: Instant) -> String {
        let s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let secs = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
        let quantiles = |times: &mut dyn Iterator<Item = Instant>| {
            let mut v: Vec<u32> = times
                .map(|t| micros(t.saturating_duration_since(t0)))
                .collect();
            let q = Summary::of(&mut v);
            let s = |us: u64| us as f64 / 1e6;
            format!(
                "{:.1} / {:.1} / {:.1} / {:.1} s",
                s(q.p50),
                s(q.p90),
                s(q.p99),
                s(q.max)
            )
        };
        let mut by_node: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for p in s.pods.values() {
            if let Some(t) = p.running_again.map(secs) {
                let e = by_node.entry(&p.node).or_insert((t, t));
                e.0 = e.0.min(t);
                e.1 = e.1.max(t);
            }
        }
        let mut nodes: Vec<_> = by_node.into_iter().collect();
        nodes.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        format!(
            "pods written again p50/p90/p99/max {}; running again {}; latest nodes (first-last pod running again): {}",
            quantiles(&mut s.pods.values().filter_map(|p| p.rewritten)),
            quantiles(&mut s.pods.values().filter_map(|p| p.running_again)),
            nodes
                .iter()
                .take(5)
                .map(|(n, (a, b))| format!("{n} {a:.1}-{b:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Pods {
    /// The watch ends with it, a failed run's too.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn running_and_ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c["ready"] == true))
}

async fn watch_pods(admin: &Target, state: &Mutex<PodState>, rv: &mut String) -> Result<()> {
    let mut conn = admin.connect(Proto::H2).await?;
    let path = if rv.is_empty() {
        "/api/v1/pods?watch=1".to_string()
    } else {
        format!("/api/v1/pods?watch=1&resourceVersion={rv}")
    };
    let req = admin.request(&conn, Method::GET, &path, None)?;
    let resp = conn.send(req).await?;
    if !resp.status().is_success() {
        rv.clear();
        bail!("{path}: {}", resp.status());
    }
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let e: Value = serde_json::from_slice(&line).context("a watch event")?;
            let pod = &e["object"];
            if e["type"] == "ERROR" {
                rv.clear();
                bail!("watch error: {e}");
            }
            if let Some(v) = pod["metadata"]["resourceVersion"].as_str() {
                *rv = v.to_string();
            }
            if !pod["metadata"]["namespace"]
                .as_str()
                .is_some_and(|ns| ns.starts_with("load-"))
            {
                continue;
            }
            let uid = pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let now = Instant::now();
            let mut s = state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mark = s.mark;
            if e["type"] == "DELETED" {
                s.pods.remove(&uid);
                continue;
            }
            let running = running_and_ready(pod);
            let seen = s.pods.entry(uid).or_insert_with(|| Seen {
                added: now,
                first_running: None,
                running: false,
                changed: now,
                rolled: false,
                name: format!(
                    "{}/{}",
                    pod["metadata"]["namespace"].as_str().unwrap_or_default(),
                    pod["metadata"]["name"].as_str().unwrap_or_default()
                ),
                node: String::new(),
                rewritten: None,
                running_again: None,
                status: slowest::Status::default(),
            });
            seen.status.update(pod, now);
            if let Some(node) = pod["spec"]["nodeName"].as_str() {
                node.clone_into(&mut seen.node);
            }
            if mark.is_some_and(|m| now > m) {
                seen.rewritten.get_or_insert(now);
                if running {
                    seen.running_again.get_or_insert(now);
                }
            }
            seen.running = running;
            seen.changed = now;
            seen.rolled = pod["metadata"]["annotations"]["kcp-load/rolled"] == "1";
            if running && seen.first_running.is_none() {
                seen.first_running = Some(now);
            }
        }
    }
    Ok(())
}

fn print_figures(f: &Figures) {
    println!(
        "{}: pod startup {}; apiserver {:.1} CPU s, peak RSS {}; etcd {:.1} CPU s; {} watches; {} LISTs, {}; {:.0}s",
        f.topology,
        f.startup,
        f.apiserver_cpu,
        stats::mib(f.apiserver_peak_rss),
        f.etcd_cpu,
        f.watches,
        f.lists,
        stats::mib(f.list_bytes as u64),
        f.seconds
    );
    for ((verb, scope, resource), (p99, slo)) in &f.api_p99 {
        let over = if p99 > slo { "  OVER" } else { "" };
        println!("  {verb} {scope} {resource}: p99 ≤ {p99}s (SLO {slo}s){over}");
    }
}

/// The p99 furthest over (or least under) its SLO, as "p99 of SLO (verb
/// scope resource)".
fn worst(p99s: &BTreeMap<ApiCall, (f64, f64)>) -> String {
    p99s.iter()
        .max_by(|a, b| (a.1.0 / a.1.1).total_cmp(&(b.1.0 / b.1.1)))
        .map_or("—".into(), |((v, s, r), (p, l))| {
            format!("{p}s of {l}s ({v} {s} {r})")
        })
}

/// The API calls whose p99 is over their SLO, as "verb scope resource
/// p99", or "none".
fn over_slo(p99s: &BTreeMap<ApiCall, (f64, f64)>) -> String {
    let over: Vec<String> = p99s
        .iter()
        .filter(|(_, (p, l))| p > l)
        .map(|((v, s, r), (p, _))| format!("{v} {s} {r} {p}s"))
        .collect();
    if over.is_empty() {
        "none".into()
    } else {
        over.join(", ")
    }
}

/// How a table row's cell is written from a topology's figures.
type Cell = Box<dyn Fn(&Figures) -> String>;

fn table(all: &[Figures]) {
    let col = |f: &dyn Fn(&Figures) -> String| all.iter().map(f).collect::<Vec<_>>().join(" | ");
    println!("| | {} |", col(&|f| f.topology.clone()));
    println!("|---|{}", "---|".repeat(all.len()));
    let rows: Vec<(&str, Cell)> = vec![
        (
            "pod startup p50 / p90 / p99",
            Box::new(|f: &Figures| {
                format!(
                    "{} / {} / {}",
                    ms(f.startup.p50),
                    ms(f.startup.p90),
                    ms(f.startup.p99)
                )
            }),
        ),
        (
            "API call p99 against its SLO, worst (verb scope resource), over the load",
            Box::new(|f: &Figures| worst(&f.api_p99)),
        ),
        (
            "API calls over their SLO, over the load",
            Box::new(|f: &Figures| over_slo(&f.api_p99)),
        ),
        (
            "API call p99 during the mass restart, worst",
            Box::new(|f: &Figures| f.restart.as_ref().map_or("—".into(), |r| worst(&r.api_p99))),
        ),
        (
            "apiserver CPU s",
            Box::new(|f: &Figures| format!("{:.1}", f.apiserver_cpu)),
        ),
        (
            "apiserver CPU in its load profile: serving watches / lists / gets / reviews / writes, of all",
            Box::new(|f: &Figures| {
                f.profile.as_ref().map_or("—".into(), |b| {
                    let share = |prefixes: &[&str]| {
                        let s: f64 = b
                            .parts
                            .iter()
                            .filter(|(n, _)| prefixes.iter().any(|p| n.starts_with(p)))
                            .map(|(_, s)| s)
                            .sum();
                        format!("{:.0} %", 100.0 * s / b.total.max(f64::MIN_POSITIVE))
                    };
                    format!(
                        "{} / {} / {} / {} / {}, of {:.1} CPU s",
                        share(&["watch:"]),
                        share(&["list"]),
                        share(&["get"]),
                        share(&["authentication and authorization reviews"]),
                        share(&["writes"]),
                        b.total
                    )
                })
            }),
        ),
        (
            "apiserver peak RSS",
            Box::new(|f: &Figures| stats::mib(f.apiserver_peak_rss)),
        ),
        (
            "etcd CPU s",
            Box::new(|f: &Figures| format!("{:.1}", f.etcd_cpu)),
        ),
        (
            "apiserver watches (loaded)",
            Box::new(|f: &Figures| format!("{:.0}", f.watches)),
        ),
        (
            "apiserver LISTs / bytes",
            Box::new(|f: &Figures| format!("{:.0} / {}", f.lists, stats::mib(f.list_bytes as u64))),
        ),
        (
            "node proxy CPU s / RSS per node",
            Box::new(
                |f: &Figures| match (f.proxy_cpu_per_node, f.proxy_rss_per_node) {
                    (Some(c), Some(r)) => format!("{c:.2} / {}", stats::mib(r)),
                    _ => "—".into(),
                },
            ),
        ),
        (
            "tier CPU s / RSS (2 replicas)",
            Box::new(|f: &Figures| match (f.tier_cpu, f.tier_rss) {
                (Some(c), Some(r)) => format!("{c:.1} / {}", stats::mib(r)),
                _ => "—".into(),
            }),
        ),
        (
            "hollow node RSS (kubelet + kube-proxy)",
            Box::new(|f: &Figures| stats::mib(f.hollow_rss_per_node)),
        ),
        (
            "mass restart: converged / apiserver CPU s / LISTs / LIST bytes / watch event bytes / initial events",
            Box::new(|f: &Figures| {
                f.restart.as_ref().map_or("—".into(), |r| {
                    format!(
                        "{:.1}s / {:.1} / {:.0} / {} / {} / {:.0}",
                        r.converged.as_secs_f64(),
                        r.apiserver_cpu,
                        r.lists,
                        stats::mib(r.list_bytes as u64),
                        stats::mib(r.watch_bytes as u64),
                        r.init_events
                    )
                })
            }),
        ),
    ];
    for (what, f) in rows {
        println!("| {what} | {} |", col(&|x| f(x)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(verb: &str, scope: &str, resource: &str, sub: &str, le: &str, n: f64) -> Sample {
        Sample {
            name: "apiserver_request_duration_seconds_bucket".into(),
            labels: [
                ("verb", verb),
                ("scope", scope),
                ("resource", resource),
                ("subresource", sub),
                ("le", le),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            value: n,
        }
    }

    #[test]
    fn api_call_p99_is_per_resource_and_subresource_within_the_interval() {
        let before = vec![
            bucket("POST", "resource", "pods", "", "1", 100.0),
            bucket("POST", "resource", "pods", "", "2", 100.0),
            bucket("POST", "resource", "pods", "", "+Inf", 100.0),
        ];
        let mut after = vec![
            // 100 more pod creations, 2 of them between 1 and 2 s.
            bucket("POST", "resource", "pods", "", "1", 198.0),
            bucket("POST", "resource", "pods", "", "2", 200.0),
            bucket("POST", "resource", "pods", "", "+Inf", 200.0),
            // Bindings all fast: a call of their own.
            bucket("POST", "resource", "pods", "binding", "1", 50.0),
            bucket("POST", "resource", "pods", "binding", "+Inf", 50.0),
            // Long-running: left out.
            bucket("POST", "resource", "pods", "exec", "1", 0.0),
            bucket("POST", "resource", "pods", "exec", "+Inf", 9.0),
            bucket("WATCH", "cluster", "pods", "", "+Inf", 9.0),
            // No resource (`/openapi/v3`): left out.
            bucket("GET", "", "", "/openapi/v3", "1", 0.0),
            bucket("GET", "", "", "/openapi/v3", "+Inf", 9.0),
        ];
        after.push(bucket("LIST", "namespace", "pods", "", "5", 10.0));
        after.push(bucket("LIST", "namespace", "pods", "", "+Inf", 10.0));
        let p = latency_p99(&[(&before, &after)]);
        let call = |v: &str, s: &str, r: &str| (v.to_string(), s.to_string(), r.to_string());
        assert_eq!(p.get(&call("POST", "resource", "pods")), Some(&(2.0, 1.0)));
        assert_eq!(
            p.get(&call("POST", "resource", "pods/binding")),
            Some(&(1.0, 1.0))
        );
        assert_eq!(p.get(&call("LIST", "namespace", "pods")), Some(&(5.0, 5.0)));
        assert_eq!(p.len(), 3, "{p:?}");
        assert_eq!(over_slo(&p), "POST resource pods 2s");
        assert_eq!(worst(&p), "2s of 1s (POST resource pods)");
    }

    fn sample(name: &str, labels: &[(&str, &str)], value: f64) -> Sample {
        Sample {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    #[test]
    fn status_calls_are_the_means_within_the_interval_at_each_side() {
        let apiserver = |sub: &str, verb: &str, sum: f64, count: f64| {
            let l = [("verb", verb), ("resource", "pods"), ("subresource", sub)];
            [
                sample("apiserver_request_duration_seconds_sum", &l, sum),
                sample("apiserver_request_duration_seconds_count", &l, count),
            ]
        };
        let m0: Vec<_> = [
            apiserver("", "GET", 10.0, 100.0),
            apiserver("status", "PATCH", 1.0, 10.0),
        ]
        .concat();
        // 100 more GETs of 0.1 s, 10 more PATCHes of 0.2 s; a LIST and a
        // GET of another resource left out.
        let mut m1: Vec<_> = [
            apiserver("", "GET", 20.0, 200.0),
            apiserver("status", "PATCH", 3.0, 20.0),
        ]
        .concat();
        m1.extend(apiserver("", "LIST", 99.0, 1.0));
        m1.push(sample(
            "apiserver_request_duration_seconds_sum",
            &[("verb", "GET"), ("resource", "nodes"), ("subresource", "")],
            99.0,
        ));
        assert_eq!(
            status_calls(&m0, &m1, &[], &[]),
            "GET pods: apiserver 100 calls, mean 100 ms; PATCH pods/status: apiserver 10 calls, mean 200 ms"
        );
        // At the node proxies: passed through only, not served from cache.
        let proxy = |source: &str, verb: &str, sub: &str, sum: f64, count: f64| {
            let l = [
                ("verb", verb),
                ("resource", "pods"),
                ("subresource", sub),
                ("source", source),
            ];
            [
                sample("kube_cache_proxy_request_duration_seconds_sum", &l, sum),
                sample("kube_cache_proxy_request_duration_seconds_count", &l, count),
            ]
        };
        let p1: Vec<_> = [
            proxy("upstream", "GET", "", 30.0, 100.0),
            proxy("cache", "GET", "", 1.0, 1000.0),
        ]
        .concat();
        assert_eq!(
            status_calls(&m0, &m1, &[], &p1),
            "GET pods: apiserver 100 calls, mean 100 ms; node proxies 100 passed through, mean 300 ms; PATCH pods/status: apiserver 10 calls, mean 200 ms; node proxies none"
        );
    }
}
