//! The runs: per mode, on a fresh control plane, seed, start the tier and
//! the simulated nodes, measure the steady phase, then the relist storm;
//! the table of every mode.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use apimachinery::pki::Ca;
use kube_testenv::{AssetsError, ControlPlane, Options};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::args::{Mode, TierArgs};
use super::nodes::{NODE_RESOURCES, Shared, SimNode, WatchSpec, reflect};
use super::replicas::{TierReplica, tier_samples, tier_token};
use super::report::{TierReport, counter, growth, print_report, scrape, table_row};
use super::restart::relist_storm;
use super::seed::{NAMESPACE, apply, node_name, object_name, seed, writer};
use crate::client::Target;
use crate::env::temp_dir;
use crate::metrics::{self, Sample};
use crate::real::Skip;

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
        include_str!("../../../../manifests/tier/serviceaccount.yaml"),
        include_str!("../../../../manifests/tier/rbac.yaml"),
        include_str!("../../../../manifests/node/rbac.yaml"),
    ] {
        apply(admin, manifest).await?;
    }
    if !a.no_flowcontrol {
        apply(
            admin,
            include_str!("../../../../manifests/tier/flowcontrol.yaml"),
        )
        .await?;
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
            replicas.push(TierReplica::start(
                bin,
                &dir,
                i,
                cp,
                &ca,
                &token,
                a.watch_batch_ms,
            )?);
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
    print_start_flowcontrol(&m_before_start, &m_started, &replicas).await;
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

/// What API Priority and Fairness did to the start: the requests it
/// rejected, by priority level and reason, and the tier replicas'
/// authorization decisions so far by result and source (a review shed or
/// past its 2 s is `error`, or `allowed/last_known` where a last decision
/// stood in).
async fn print_start_flowcontrol(before: &[Sample], after: &[Sample], replicas: &[TierReplica]) {
    let mut decisions = Vec::new();
    for r in replicas {
        if let Ok(m) = r.metrics().await {
            decisions.extend(m);
        }
    }
    println!(
        "  start: APF rejected {}; tier authorization decisions {}",
        metrics::growth_line(
            before,
            after,
            "apiserver_flowcontrol_rejected_requests_total",
            &["priority_level", "reason"],
        ),
        metrics::growth_line(
            &[],
            &decisions,
            "kube_cache_proxy_authorization_total",
            &["result", "source"],
        ),
    );
}
