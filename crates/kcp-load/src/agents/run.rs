//! The runs: per topology, on a fresh control plane, seed, start the tier
//! and the real node proxies, start each node (its agents, or its
//! simulated node proxy), measure the steady phase.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use apimachinery::pki::{Ca, Issued};
use http::{HeaderName, HeaderValue, header};
use kube_cache_proxy::component::config::UpstreamEncoding;
use kube_testenv::{AssetsError, ControlPlane, Options};
use serde_json::json;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::args::{AgentsArgs, Topology};
use super::kinds::{AGENTS, Agent, NodeProxyUpstream, PROTOBUF_ACCEPT, Watch};
use super::proxies::{self, Planned, Server};
use super::report::{self, Apiserver, NodeProxies, Reach, Report};
use crate::client::{Proto, Target};
use crate::env::temp_dir;
use crate::metrics::{self, Sample};
use crate::real::Skip;
use crate::stats;
use crate::tier::nodes::{Shared, SimNode, WatchOptions, WatchSpec, poll_gets, reflect};
use crate::tier::replicas::{TierReplica, service_account_token, tier_samples, tier_token};
use crate::tier::report::{counter, scrape};
use crate::tier::seed::{self, NAMESPACE, apply, node_name, seed, writer};

/// Runs every topology, then prints the table (and writes the chart).
pub async fn agents(a: &AgentsArgs) -> Result<()> {
    let mut reports = Vec::new();
    if !a.report_only {
        for &t in &a.modes {
            println!("== {}: {} nodes", t.as_str(), a.nodes);
            let r = match run_topology(a, t).await {
                Ok(r) => r,
                Err(e) if e.downcast_ref::<Skip>().is_some() => return Err(e),
                Err(e) => Report {
                    topology: t.as_str().into(),
                    variant: variant(a, t),
                    nodes: a.nodes,
                    error: Some(format!("{e:#}")),
                    ..Report::default()
                },
            };
            report::print_report(&r);
            if let Some(path) = &a.results {
                report::append(path, &r)?;
            }
            reports.push(r);
        }
    }
    let all = match &a.results {
        Some(path) => report::read(path)?,
        None => reports,
    };
    println!();
    print!("{}", report::table(&all));
    if let Some(path) = &a.svg {
        std::fs::write(path, report::svg(&all))?;
        println!("chart: {}", path.display());
    }
    Ok(())
}

async fn run_topology(a: &AgentsArgs, t: Topology) -> Result<Report> {
    let started = Instant::now();
    let cp = match ControlPlane::start(Options::default()).await {
        Ok(cp) => cp,
        Err(kube_testenv::Error::Assets(e @ AssetsError::Absent { .. })) => {
            return Err(Skip(format!("agents: {e}")).into());
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
    let dir = temp_dir()?;
    let result = Run::new(a, t, &cp, &admin, &dir).go().await;
    let cp_dir = cp.dir().to_path_buf();
    drop(cp);
    if result.is_ok() && !a.keep_logs {
        let _ = std::fs::remove_dir_all(cp_dir);
        let _ = std::fs::remove_dir_all(dir);
    } else {
        println!(
            "(kept {} and {} for their logs)",
            cp_dir.display(),
            dir.display()
        );
    }
    result
}

/// What a node connects to: the apiserver, its real node proxy, or (for
/// a simulated node proxy) the proxy's upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Agents,
    SimulatedProxy,
}

/// Who a tracked watch of Services is, for the groups of [`Reach`].
#[derive(Debug, Clone, Copy)]
struct Tracked {
    node: usize,
    side: Side,
}

/// One run's state.
struct Run<'a> {
    a: &'a AgentsArgs,
    t: Topology,
    cp: &'a ControlPlane,
    admin: &'a Target,
    dir: &'a std::path::Path,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    tracked: Vec<Tracked>,
    watches: usize,
    /// The agents' tokens, by ServiceAccount.
    tokens: HashMap<&'static str, String>,
    /// Targets of token agents by server and agent, built once (their TLS
    /// configuration is shared; each node's agent opens its own
    /// connection).
    targets: HashMap<(String, &'static str), Target>,
}

impl<'a> Run<'a> {
    fn new(
        a: &'a AgentsArgs,
        t: Topology,
        cp: &'a ControlPlane,
        admin: &'a Target,
        dir: &'a std::path::Path,
    ) -> Run<'a> {
        Run {
            a,
            t,
            cp,
            admin,
            dir,
            shared: Arc::new(Shared::default()),
            stop: CancellationToken::new(),
            tasks: Vec::new(),
            tracked: Vec::new(),
            watches: 0,
            tokens: HashMap::new(),
            targets: HashMap::new(),
        }
    }

    async fn go(mut self) -> Result<Report> {
        let result = self.measure().await;
        self.stop.cancel();
        for t in self.tasks.drain(..) {
            t.abort();
        }
        result
    }

    async fn measure(&mut self) -> Result<Report> {
        let (a, t, cp, admin) = (self.a, self.t, self.cp, self.admin);
        let mut r = Report {
            topology: t.as_str().into(),
            variant: variant(a, t),
            nodes: a.nodes,
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default(),
            load_average: std::fs::read_to_string("/proc/loadavg")
                .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_default(),
            ..Report::default()
        };
        for manifest in [
            include_str!("../../../../manifests/node/rbac.yaml"),
            include_str!("rbac.yaml"),
        ] {
            apply(admin, manifest).await?;
        }
        if t == Topology::Tier {
            for manifest in [
                include_str!("../../../../manifests/tier/serviceaccount.yaml"),
                include_str!("../../../../manifests/tier/rbac.yaml"),
                include_str!("../../../../manifests/tier/flowcontrol.yaml"),
            ] {
                apply(admin, manifest).await?;
            }
        }
        check_file_limit(a, t)?;
        seed(admin, a.nodes, a.services).await?;
        seed_network_policies(admin, a.network_policies).await?;
        for agent in AGENTS {
            if let Some(sa) = agent.service_account() {
                self.tokens
                    .insert(sa, service_account_token(admin, sa).await?);
            }
        }
        let m_base = scrape(admin).await?;

        // The tier, then the real node proxies.
        let apiserver = Server {
            url: cp.url(),
            ca_pem: cp.ca_pem(),
        };
        let proxy_ca = Ca::new("kcp-load-agents-ca")?;
        let mut tier = Vec::new();
        if t == Topology::Tier {
            let token = tier_token(admin).await?;
            let encoding: Option<UpstreamEncoding> = match &a.tier_upstream_encoding {
                Some(e) => Some(
                    serde_json::from_value(json!(e))
                        .map_err(|_| anyhow!("--tier-upstream-encoding {e}: JSON or Protobuf"))?,
                ),
                None => None,
            };
            for i in 0..a.replicas.max(1) {
                tier.push(TierReplica::start_with(
                    &a.proxy_bin,
                    self.dir,
                    i,
                    cp,
                    &proxy_ca,
                    &token,
                    |c| {
                        if let Some(ms) = a.watch_batch_ms {
                            c.cache.watch_batch_milliseconds = ms;
                        }
                        if let Some(e) = encoding {
                            c.cache.upstream_encoding = e;
                        }
                    },
                )?);
            }
            for replica in &tier {
                replica.ready(Duration::from_secs(180)).await?;
            }
            println!("tier: {} replicas ready", tier.len());
        }
        let upstream_of = |i: usize| -> Server {
            match tier.get(i % tier.len().max(1)) {
                Some(replica) => Server {
                    url: replica.url.clone(),
                    ca_pem: replica.ca_pem.clone(),
                },
                None => apiserver.clone(),
            }
        };
        let proxied = matches!(t, Topology::Proxies | Topology::Tier);
        let real = if proxied {
            a.real_proxies.min(a.nodes)
        } else {
            0
        };
        r.real_proxies = real;
        r.simulated_proxies = if proxied { a.nodes - real } else { 0 };
        r.replicas = tier.len();
        let mut certs = Vec::with_capacity(a.nodes);
        for i in 0..a.nodes {
            let user = format!("system:node:{}", node_name(i));
            certs.push(
                cp.issue_client(&user, Some("system:nodes"))
                    .map_err(|e| anyhow!("issuing {user}'s certificate: {e}"))?,
            );
        }
        let mut planned = Vec::with_capacity(real);
        for (i, cert) in certs.iter().enumerate().take(real) {
            let name = node_name(i);
            let dir = self.dir.join(&name);
            std::fs::create_dir_all(&dir)?;
            let serving =
                proxy_ca.issue_server(&["localhost"], &[std::net::Ipv4Addr::LOCALHOST.into()])?;
            let config = proxies::node_config(
                &dir,
                &name,
                cert,
                &serving,
                &cp.ca_pem(),
                &upstream_of(i),
                (t == Topology::Tier).then_some(&apiserver),
            )?;
            planned.push(Planned { name, dir, config });
        }
        let t_proxies = Instant::now();
        let node_proxies = proxies::start_all(&a.proxy_bin, &proxy_ca, &mut planned).await?;
        if real > 0 {
            println!(
                "{real} node proxies ready in {:.1}s",
                t_proxies.elapsed().as_secs_f64()
            );
        }

        // The nodes, paced.
        let example = node_name(0);
        let u = NodeProxyUpstream::of(0, &example)?;
        println!(
            "per node: {} watches directly ({}); a simulated node proxy opens {} upstream, {} as \
             its node and {} with the CNI agent's token",
            AGENTS
                .iter()
                .map(|g| g.watches(0, &example).len())
                .sum::<usize>(),
            AGENTS
                .iter()
                .map(|g| format!("{} {}", g.name(), g.watches(0, &example).len()))
                .collect::<Vec<_>>()
                .join(", "),
            u.as_node.len() + u.cni_token.len(),
            u.as_node.len(),
            u.cni_token.len(),
        );
        let t_start = Instant::now();
        let nodes = if t == Topology::Baseline { 0 } else { a.nodes };
        for (i, cert) in certs.iter().enumerate().take(nodes) {
            if t == Topology::Direct {
                self.start_agents(i, cert, &apiserver).await?;
            } else if let Some(p) = node_proxies.get(i) {
                let server = Server {
                    url: p.url.clone(),
                    ca_pem: proxy_ca.cert_pem(),
                };
                self.start_agents(i, cert, &server).await?;
            } else {
                self.start_simulated_proxy(i, cert, &upstream_of(i)).await?;
            }
            let due = t_start + Duration::from_secs_f64((i + 1) as f64 / a.start_rate.max(0.1));
            tokio::time::sleep_until(due.into()).await;
            self.memory_guard()?;
        }
        r.watches_opened = self.watches;
        if let Err(e) = self.wait_open().await {
            return Err(match scrape(admin).await {
                Ok(m) => anyhow!(
                    "{e}; the apiserver then: {:.0} watches, RSS {}",
                    counter(&m, "apiserver_longrunning_requests", &[("verb", "WATCH")]),
                    stats::mib(counter(&m, "process_resident_memory_bytes", &[]) as u64)
                ),
                Err(scrape_error) => anyhow!("{e}; the apiserver's /metrics: {scrape_error:#}"),
            });
        }
        r.started_in_s = t_start.elapsed().as_secs_f64();
        r.start_failures = self.failures_by_status();
        println!(
            "nodes: {} watches open after {:.1}s ({} LISTs by this tool, {} failed requests: {})",
            self.watches,
            r.started_in_s,
            self.shared.lists.load(Ordering::Relaxed),
            self.shared.failures.load(Ordering::Relaxed),
            r.start_failures,
        );
        // What the start leaves running settles first: through a tier,
        // the node proxies' watches that reached a replica before it
        // could serve them go to the apiserver for up to 60 s
        // (docs/tier.md, "Catch-up watches").
        tokio::time::sleep(Duration::from_secs(a.settle)).await;

        // Steady writes.
        let m0 = scrape(admin).await?;
        let p0 = proxies::metrics(&node_proxies).await;
        let cpu0 = proxies::cpu(&node_proxies);
        let tier0 = tier_samples(&tier);
        let tm0 = proxies::metrics(&tier).await;
        let self0 = stats::cpu_of(std::process::id()).unwrap_or_default();
        let gets0 = self.shared.gets.load(Ordering::Relaxed);
        let resumes0 = self.shared.resumes.load(Ordering::Relaxed);
        if let Ok(mut l) = self.shared.resumed_after.lock() {
            l.clear();
        }
        if let Ok(mut l) = self.shared.get_latency.lock() {
            l.clear();
        }
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
                self.shared.clone(),
            ))
        })
        .collect::<Vec<_>>();
        let end = t0 + Duration::from_secs(a.duration);
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_secs(1).min(end - Instant::now())).await;
            if let Err(e) = self.memory_guard() {
                writes_stop.cancel();
                return Err(e);
            }
        }
        let m1 = scrape(admin).await?;
        let p1 = proxies::metrics(&node_proxies).await;
        let cpu1 = proxies::cpu(&node_proxies);
        let tier1 = tier_samples(&tier);
        let tm1 = proxies::metrics(&tier).await;
        let self1 = stats::cpu_of(std::process::id()).unwrap_or_default();
        let steady = t0.elapsed().as_secs_f64();
        writes_stop.cancel();
        for w in writers {
            r.writes += w.await??;
        }
        r.gets = self.shared.gets.load(Ordering::Relaxed) - gets0;
        r.resumes = self.shared.resumes.load(Ordering::Relaxed) - resumes0;
        let lived = self
            .shared
            .resumed_after
            .lock()
            .map(|mut l| stats::Summary::of(&mut l))
            .unwrap_or_default();
        r.resumed_after_ms = [lived.p50, lived.max].map(|ms| ms as f64);
        // The last changes' deliveries (a tier holds an event up to its
        // batch window).
        tokio::time::sleep(Duration::from_secs(3)).await;

        r.steady_s = steady;
        r.apiserver = apiserver_figures(&m_base, &m0, &m1, steady);
        r.reach = self.reach();
        if !tier.is_empty() {
            r.tier_requests = per_second(
                metrics::growth(
                    &tm0,
                    &tm1,
                    "kube_cache_proxy_requests_total",
                    &["verb", "resource", "source"],
                ),
                steady,
            );
            r.tier_diagnostics = diagnostics(&tm0, &tm1, steady);
        }
        r.tier = tier0
            .iter()
            .zip(&tier1)
            .map(|(b, e)| ((e.0 - b.0).as_secs_f64() / steady, e.1))
            .collect();
        if !node_proxies.is_empty() {
            let cpu: Vec<f64> = cpu0
                .iter()
                .zip(&cpu1)
                .map(|(b, e)| (*e - *b).as_secs_f64() / steady)
                .collect();
            let rss: Vec<f64> = node_proxies
                .iter()
                .map(|p| stats::rss_of(p.pid()).unwrap_or_default() as f64)
                .collect();
            let (cpu_mean, cpu_max) = proxies::mean_max(&cpu);
            let (rss_mean, rss_max) = proxies::mean_max(&rss);
            r.node_proxies = Some(NodeProxies {
                count: node_proxies.len(),
                cpu_mean,
                cpu_max,
                rss_mean: rss_mean as u64,
                rss_max: rss_max as u64,
                peak_rss_max: node_proxies
                    .iter()
                    .filter_map(|p| stats::peak_rss_of(p.pid()))
                    .max()
                    .unwrap_or_default(),
                requests: per_second(
                    metrics::growth(
                        &p0,
                        &p1,
                        "kube_cache_proxy_requests_total",
                        &["verb", "resource", "source"],
                    ),
                    steady,
                ),
                upstream_watches: counter(&p1, "kube_cache_proxy_upstream_watches", &[]),
                diagnostics: diagnostics(&p0, &p1, steady),
            });
            println!(
                "  node proxies' upstream watches by resource and kind: {}",
                metrics::growth_line(
                    &[],
                    &p1,
                    "kube_cache_proxy_upstream_watches",
                    &["resource", "kind"]
                )
            );
        }
        r.tool_cpu_cores = (self1 - self0).as_secs_f64() / steady;
        r.failures = self.shared.failures.load(Ordering::Relaxed);
        let gets = self
            .shared
            .get_latency
            .lock()
            .map(|mut l| stats::Summary::of(&mut l))
            .unwrap_or_default();
        r.get_p50_ms = gets.p50 as f64 / 1000.0;
        r.get_p99_ms = gets.p99 as f64 / 1000.0;

        for p in node_proxies {
            p.stop().await;
        }
        for replica in tier {
            replica.stop().await;
        }
        Ok(r)
    }

    /// A target for `server` with node `i`'s certificate (kubelet's), or
    /// with `agent`'s token.
    async fn target(
        &mut self,
        server: &Server,
        agent: Agent,
        i: usize,
        cert: &Issued,
    ) -> Result<Target> {
        let accept = if agent.protobuf() {
            PROTOBUF_ACCEPT
        } else {
            "application/json"
        };
        let Some(sa) = agent.service_account() else {
            let user = format!("system:node:{}", node_name(i));
            let text = apimachinery::kubeconfig::with_certificate(
                &server.url,
                &server.ca_pem,
                &user,
                &cert.cert_pem,
                &cert.key_pem,
            );
            return Ok(target_of(&text).await?.with_accept(accept));
        };
        let key = (server.url.clone(), sa);
        if let Some(t) = self.targets.get(&key) {
            return Ok(t.clone());
        }
        let token = self
            .tokens
            .get(sa)
            .ok_or_else(|| anyhow!("no token for {sa}"))?;
        let text = apimachinery::kubeconfig::with_token(&server.url, &server.ca_pem, token);
        let t = target_of(&text).await?.with_accept(accept);
        self.targets.insert(key, t.clone());
        Ok(t)
    }

    /// Node `i`'s five agents, each its own connection to `server`.
    async fn start_agents(&mut self, i: usize, cert: &Issued, server: &Server) -> Result<()> {
        let node = node_name(i);
        for agent in AGENTS {
            let conn = Arc::new(SimNode {
                target: self.target(server, agent, i, cert).await?,
                conn: Mutex::new(None),
            });
            for w in agent.watches(i, &node) {
                let tracked = self.track(&w, i, Side::Agents);
                self.spawn_watch(
                    &conn,
                    &w,
                    WatchOptions {
                        tracked,
                        ..WatchOptions::default()
                    },
                );
            }
            for path in agent.gets(i) {
                self.spawn_gets(&conn, path, Vec::new());
            }
        }
        Ok(())
    }

    /// What node `i`'s proxy opens upstream, at `upstream`: its caches and
    /// kubelet's per-object watches on the node's connection; the CNI
    /// agent's watch of every Node and the log agent's GETs, each with
    /// its agent's token, on one connection for clients' tokens.
    async fn start_simulated_proxy(
        &mut self,
        i: usize,
        cert: &Issued,
        upstream: &Server,
    ) -> Result<()> {
        let node = node_name(i);
        let u = NodeProxyUpstream::of(i, &node)?;
        let mut as_node = self.target(upstream, Agent::Kubelet, i, cert).await?;
        if !u.protobuf {
            as_node = as_node.with_accept("application/json");
        }
        let as_node = Arc::new(SimNode {
            target: as_node,
            conn: Mutex::new(None),
        });
        for w in &u.as_node {
            let tracked = self.track(w, i, Side::SimulatedProxy);
            self.spawn_watch(
                &as_node,
                w,
                WatchOptions {
                    tracked,
                    ..WatchOptions::default()
                },
            );
        }
        let clients = Arc::new(SimNode {
            target: self.target(upstream, Agent::Cni, i, cert).await?,
            conn: Mutex::new(None),
        });
        for w in &u.cni_token {
            self.spawn_watch(&clients, w, WatchOptions::default());
        }
        let sa = Agent::Log
            .service_account()
            .ok_or_else(|| anyhow!("the log agent has no ServiceAccount"))?;
        let token = self
            .tokens
            .get(sa)
            .ok_or_else(|| anyhow!("no token for {sa}"))?;
        let log_headers = vec![
            (
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {token}"))?,
            ),
            (header::ACCEPT, HeaderValue::from_static("application/json")),
        ];
        for path in Agent::Log.gets(i) {
            self.spawn_gets(&clients, path, log_headers.clone());
        }
        Ok(())
    }

    /// The tracked index of `w` if it watches Services.
    fn track(&mut self, w: &Watch, node: usize, side: Side) -> Option<u32> {
        if !w.services {
            return None;
        }
        self.tracked.push(Tracked { node, side });
        u32::try_from(self.tracked.len() - 1).ok()
    }

    fn spawn_watch(&mut self, conn: &Arc<SimNode>, w: &Watch, mut o: WatchOptions) {
        o.label_selector.clone_from(&w.label_selector);
        let spec = WatchSpec::with(w.path.clone(), w.field_selector.clone(), o);
        self.watches += 1;
        self.tasks.push(tokio::spawn(reflect(
            conn.clone(),
            spec,
            self.shared.clone(),
            self.stop.clone(),
        )));
    }

    fn spawn_gets(
        &mut self,
        conn: &Arc<SimNode>,
        path: String,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) {
        let spec = WatchSpec::with(
            path,
            None,
            WatchOptions {
                headers,
                ..WatchOptions::default()
            },
        );
        self.tasks.push(tokio::spawn(poll_gets(
            conn.clone(),
            spec,
            Duration::from_secs_f64(self.a.log_get_interval.max(0.1)),
            self.shared.clone(),
            self.stop.clone(),
        )));
    }

    async fn wait_open(&self) -> Result<()> {
        let timeout = Duration::from_secs(self.a.start_timeout);
        let deadline = Instant::now() + timeout;
        let mut last_print = Instant::now();
        loop {
            let open = self.shared.open.load(Ordering::Relaxed);
            if open >= self.watches {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "only {open} of {} watches open after {timeout:?} ({} failed requests: {})",
                    self.watches,
                    self.shared.failures.load(Ordering::Relaxed),
                    self.failures_by_status()
                );
            }
            if last_print.elapsed() > Duration::from_secs(10) {
                println!(
                    "  {open}/{} watches open, {} LISTs, {} failed requests",
                    self.watches,
                    self.shared.lists.load(Ordering::Relaxed),
                    self.shared.failures.load(Ordering::Relaxed)
                );
                last_print = Instant::now();
            }
            self.memory_guard()?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The failed requests so far by status ("none": no answer).
    fn failures_by_status(&self) -> String {
        self.shared
            .failures_by_status
            .lock()
            .map(|m| {
                m.iter()
                    .map(|(status, n)| match status {
                        0 => format!("no answer {n}"),
                        s => format!("{s} {n}"),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    }

    /// Fails when the machine's available memory is below the floor.
    fn memory_guard(&self) -> Result<()> {
        match mem_available_mib() {
            Some(mib) if mib < self.a.min_available_mib => bail!(
                "stopped: the machine's available memory fell to {mib} MiB (--min-available-mib \
                 {}), with {} of {} watches open",
                self.a.min_available_mib,
                self.shared.open.load(Ordering::Relaxed),
                self.watches
            ),
            _ => Ok(()),
        }
    }

    /// How fast the steady phase's Service changes reached every watch of
    /// each group.
    fn reach(&self) -> Vec<Reach> {
        let written: Vec<u64> = self
            .shared
            .services_written
            .lock()
            .map(|w| w.clone())
            .unwrap_or_default();
        let changes: Vec<(u64, Instant)> = self
            .shared
            .written
            .lock()
            .map(|m| {
                written
                    .iter()
                    .filter_map(|rv| m.get(rv).map(|at| (*rv, *at)))
                    .collect()
            })
            .unwrap_or_default();
        let arrivals = self
            .shared
            .arrivals
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default();
        let members = |pick: &dyn Fn(&Tracked) -> bool| -> Vec<u32> {
            self.tracked
                .iter()
                .enumerate()
                .filter(|(_, t)| pick(t))
                .filter_map(|(i, _)| u32::try_from(i).ok())
                .collect()
        };
        let real = self.a.real_proxies.min(self.a.nodes);
        let mut out = Vec::new();
        let agents = members(&|t| t.side == Side::Agents);
        let what = if self.t == Topology::Direct {
            format!("every agent ({} nodes)", self.a.nodes)
        } else {
            format!("the agents behind the {real} real node proxies")
        };
        if !agents.is_empty() {
            out.push(report::reach(&what, &agents, &changes, &arrivals));
        }
        if self.t == Topology::Direct && real < self.a.nodes {
            let first = members(&|t| t.side == Side::Agents && t.node < real);
            out.push(report::reach(
                &format!("agents of the first {real} nodes"),
                &first,
                &changes,
                &arrivals,
            ));
        }
        let simulated = members(&|t| t.side == Side::SimulatedProxy);
        if !simulated.is_empty() {
            out.push(report::reach(
                &format!("simulated node proxies ({})", self.a.nodes - real),
                &simulated,
                &changes,
                &arrivals,
            ));
        }
        out
    }
}

async fn target_of(kubeconfig: &str) -> Result<Target> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Target::new(&config).await
}

/// What of `t` differs from the shipped configurations.
fn variant(a: &AgentsArgs, t: Topology) -> String {
    let mut v = Vec::new();
    if t == Topology::Tier {
        if let Some(ms) = a.watch_batch_ms {
            v.push(format!("tier watch batch {ms} ms"));
        }
        if let Some(e) = &a.tier_upstream_encoding {
            v.push(format!("tier reads upstream {e}"));
        }
    }
    v.join(", ")
}

/// Fails at once when this tool would need more connections than a
/// process may open files here (each agent has its own connection, and
/// the apiserver, whose limit is the same, as many for direct).
fn check_file_limit(a: &AgentsArgs, t: Topology) -> Result<()> {
    let real = a.real_proxies.min(a.nodes);
    let connections = match t {
        Topology::Direct => a.nodes * AGENTS.len(),
        // A simulated node proxy: its own connection and the one for its
        // clients' tokens.
        Topology::Proxies | Topology::Tier => real * AGENTS.len() + (a.nodes - real) * 2,
        Topology::Baseline => 0,
    };
    let limit = open_files_limit().unwrap_or(u64::MAX);
    // Room for the rest: the control plane's files, the proxies' pipes,
    // listeners.
    if connections as u64 + 1000 > limit {
        bail!(
            "{} nodes {} need {connections} client connections, here more than a process may \
             open ({limit} files, `ulimit -n`; the apiserver has the same limit)",
            a.nodes,
            t.as_str()
        );
    }
    Ok(())
}

/// This process's limit of open files (`Max open files` of
/// `/proc/self/limits`, the soft limit).
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// NetworkPolicies in the seed's namespace, for the CNI agents to watch.
async fn seed_network_policies(admin: &Target, n: usize) -> Result<()> {
    let mut conn = admin.connect(Proto::H2).await?;
    for i in 0..n {
        let body = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": format!("np-{i:03}")},
            "spec": {"podSelector": {"matchLabels": {"app": format!("svc-{i:03}")}},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {}}],
                                  "ports": [{"protocol": "TCP", "port": 80}]}]}});
        seed::create(
            admin,
            &mut conn,
            &format!("/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies"),
            &body,
        )
        .await?;
    }
    Ok(())
}

/// The apiserver's figures over the steady phase (`m0` to `m1`), its
/// watches before the run in `base`.
fn apiserver_figures(base: &[Sample], m0: &[Sample], m1: &[Sample], steady: f64) -> Apiserver {
    let grew = |name: &str| counter(m1, name, &[]) - counter(m0, name, &[]);
    let top = |name: &str, keys: &[&str], n: usize| {
        let mut v = per_second(metrics::growth(m0, m1, name, keys), steady);
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v.truncate(n);
        v
    };
    let reviews = |resource: &str| {
        counter(m1, "apiserver_request_total", &[("resource", resource)])
            - counter(m0, "apiserver_request_total", &[("resource", resource)])
    };
    Apiserver {
        watches: counter(m1, "apiserver_longrunning_requests", &[("verb", "WATCH")]),
        watches_before: counter(base, "apiserver_longrunning_requests", &[("verb", "WATCH")]),
        cpu_cores: grew("process_cpu_seconds_total") / steady,
        rss_bytes: counter(m1, "process_resident_memory_bytes", &[]) as u64,
        events_per_s: grew("apiserver_watch_events_total") / steady,
        bytes_per_s: grew("apiserver_watch_events_sizes_sum") / steady,
        events_by_resource: top("apiserver_watch_events_total", &["resource"], 6),
        bytes_by_resource: top("apiserver_watch_events_sizes_sum", &["resource"], 6),
        requests: top("apiserver_request_total", &["verb", "resource"], 10),
        watches_by_resource: {
            let mut v: Vec<(String, f64)> = metrics::growth(
                &[],
                m1,
                "apiserver_longrunning_requests",
                &["verb", "resource"],
            )
            .into_iter()
            .filter(|(k, _)| k.first().is_some_and(|v| v == "WATCH"))
            .map(|(k, v)| (k[1..].join("/"), v))
            .collect();
            v.sort_by(|a, b| b.1.total_cmp(&a.1));
            // Past these, the apiserver's own (one per resource).
            v.truncate(14);
            v
        },
        token_reviews_per_s: reviews("tokenreviews") / steady,
        access_reviews_per_s: reviews("subjectaccessreviews") / steady,
    }
}

/// What proxies did besides serving, per second over the steady phase,
/// all of them together: their clients' watches they ended (by reason),
/// their upstream watches restarted (by resource and reason), their
/// authentications and authorizations (by result and source).
fn diagnostics(before: &[Sample], after: &[Sample], steady: f64) -> Vec<(String, f64)> {
    [
        (
            "watchers ended",
            "kube_cache_proxy_cache_watchers_terminated_total",
            &["reason"][..],
        ),
        (
            "upstream watches restarted",
            "kube_cache_proxy_upstream_watch_restarts_total",
            &["resource", "reason"],
        ),
        (
            "authentications",
            "kube_cache_proxy_authentication_total",
            &["result", "source"],
        ),
        (
            "authorizations",
            "kube_cache_proxy_authorization_total",
            &["result", "source"],
        ),
    ]
    .into_iter()
    .flat_map(|(what, name, keys)| {
        per_second(metrics::growth(before, after, name, keys), steady)
            .into_iter()
            .map(move |(k, v)| (format!("{what} {k}"), v))
    })
    .collect()
}

fn per_second(
    growth: std::collections::BTreeMap<Vec<String>, f64>,
    seconds: f64,
) -> Vec<(String, f64)> {
    growth
        .into_iter()
        .map(|(k, v)| (k.join("/"), v / seconds.max(1e-9)))
        .collect()
}

/// `MemAvailable` of `/proc/meminfo`, in MiB.
fn mem_available_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_available_memory_and_the_file_limit() {
        assert!(mem_available_mib().is_some_and(|m| m > 0));
        assert!(open_files_limit().is_some_and(|n| n > 0));
    }
}
