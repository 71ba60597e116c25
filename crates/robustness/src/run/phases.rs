//! The run itself: stand the topology up, start recording etcd's history,
//! the watchers, readers and writers, inject faults from the seeded
//! schedule, settle, then validate every stream and fill the report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::faults::{self, Context, FaultKind, Injected};
use crate::model::{Resource, Segment, Start};
use crate::reference::Reference;
use crate::topology::{Topology, node_of};
use crate::traffic::{self, Traffic};
use crate::validate::{self, Anomaly, Property, WatcherState};
use crate::watcher::{self, Recording};

use super::report::Report;
use super::setup::{Options, watcher_specs};
use super::sources::{final_list, first_difference, record, relists};

/// Runs it.
///
/// # Errors
/// When the topology cannot start or a fault cannot be injected (a
/// failure of the harness, not an anomaly).
pub async fn run(opts: &Options) -> Result<Report> {
    let started = Instant::now();
    let dir = match &opts.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!(
            "kcp-robustness-{}-{}",
            std::process::id(),
            opts.seed
        )),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    println!(
        "robustness: seed {} (replay with --seed {}), files in {}",
        opts.seed,
        opts.seed,
        dir.display()
    );
    let mut rng = fastrand::Rng::with_seed(opts.seed);
    let mut topo = Topology::start(&opts.shape, &opts.proxy_bin, &dir).await?;
    println!(
        "topology ready in {:.1?}: {} tier replicas, {} node proxies, {} hollow kubelets",
        started.elapsed(),
        topo.tier.len(),
        topo.nodes.len(),
        topo.kubelets.len()
    );

    // The reference: etcd's state now, then every change.
    let start_rev = topo.etcd.revision().await?;
    let mut base = Vec::new();
    for r in Resource::ALL {
        for kv in topo.etcd.range_prefix(r.etcd_prefix(), start_rev).await? {
            if let Some((resource, key)) = Resource::of_etcd_key(&kv.key)
                && let Ok(v) = serde_json::from_slice(&kv.value)
            {
                base.push((resource, key, kv.mod_revision, v));
            }
        }
    }
    let reference = Arc::new(std::sync::Mutex::new(Reference::new(start_rev, base)));
    let stop_reference = CancellationToken::new();
    let recorder = tokio::spawn(record(
        topo.etcd.clone(),
        reference.clone(),
        start_rev,
        stop_reference.clone(),
    ));

    // Watchers, readers, writers.
    let recording = Recording::new();
    let stop_clients = CancellationToken::new();
    let specs = watcher_specs(&topo)?;
    let mut stalls = Vec::new();
    let mut tasks = Vec::new();
    for spec in specs.iter().cloned() {
        let (tx, rx) = watch::channel(false);
        stalls.push((spec.name.clone(), tx));
        tasks.push(tokio::spawn(watcher::run(
            spec,
            recording.clone(),
            stop_clients.clone(),
            rx,
        )));
    }
    for p in &topo.nodes {
        tasks.push(tokio::spawn(watcher::reader(
            format!("{}/reader", p.name),
            p.name.clone(),
            topo.client_of(p, true, true)?,
            Resource::Services,
            Duration::from_millis(500),
            recording.clone(),
            stop_clients.clone(),
        )));
    }
    let stop_writes = CancellationToken::new();
    let nodes: Vec<String> = topo.nodes.iter().map(|p| node_of(p).to_string()).collect();
    let kubelet_nodes = topo.kubelet_nodes.clone();
    let writer = tokio::spawn(traffic::run(
        Traffic {
            rate: opts.rate,
            nodes: nodes.clone(),
            relabel_nodes: nodes
                .iter()
                .filter(|n| !kubelet_nodes.contains(n))
                .cloned()
                .collect(),
        },
        topo.admin.clone(),
        fastrand::Rng::with_seed(opts.seed ^ 0x5eed),
        recording.clone(),
        stop_writes.clone(),
    ));

    // Faults.
    let ctx = Context {
        stalls,
        reference: reference.clone(),
        dir_full: opts.dir_full,
    };
    let mut injected = Injected::default();
    let mut timeline = Vec::new();
    let mut windows: Vec<(FaultKind, f64, f64)> = Vec::new();
    let faults_started = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Every kind once, in a seeded order, then drawn by weight.
    let mut first_pass = opts.faults.clone();
    rng.shuffle(&mut first_pass);
    while faults_started.elapsed() < opts.duration || !first_pass.is_empty() {
        let Some(kind) = first_pass
            .pop()
            .or_else(|| faults::draw(&mut rng, &opts.faults))
        else {
            break;
        };
        let at = faults_started.elapsed().as_secs_f64();
        let from = crate::model::unix_now();
        let what = faults::inject(kind, &mut topo, &ctx, &mut rng, &mut injected)
            .await
            .with_context(|| format!("injecting {kind} at {at:.0}s"))?;
        windows.push((kind, from, crate::model::unix_now()));
        println!("[{at:7.1}s] {kind}: {what}");
        timeline.push((at, format!("{kind}: {what}")));
        let gap = opts.gap.0 + (opts.gap.1 - opts.gap.0) * rng.f64();
        tokio::time::sleep(Duration::from_secs_f64(gap)).await;
    }

    drop(ctx);
    // Settle: writes stop; every proxy ready; watchers catch up.
    stop_writes.cancel();
    let written = writer.await.unwrap_or_default();
    for p in topo.proxies() {
        crate::topology::wait_ready(p, Duration::from_secs(120)).await?;
    }
    let final_rev = topo.etcd.revision().await?;
    let marker = topo.etcd.put("/kcp-robustness/marker", "end").await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while reference.lock().map(|r| r.head()).unwrap_or_default() < marker
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each watcher has seen every change of its own up to final_rev.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let behind: Vec<String> = specs
            .iter()
            .filter(|s| {
                let need = reference
                    .lock()
                    .map(|r| {
                        r.expected(&s.filter, 0, final_rev)
                            .last()
                            .map(|e| e.2)
                            .unwrap_or(0)
                    })
                    .unwrap_or(0);
                recording.progress.lock().get(&s.name).copied().unwrap_or(0) < need
            })
            .map(|s| s.name.clone())
            .collect();
        if behind.is_empty() || Instant::now() > deadline {
            if !behind.is_empty() {
                println!("still behind after the settle: {behind:?}");
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_clients.cancel();
    for t in tasks {
        let _ = t.await;
    }
    stop_reference.cancel();
    let _ = recorder.await;

    // Validate.
    let reference = Arc::try_unwrap(reference)
        .map_err(|_| anyhow!("the reference is still shared"))?
        .into_inner()
        .map_err(|_| anyhow!("the reference lock is poisoned"))?;
    let relists = relists(&dir);
    let mut report = Report {
        seed: opts.seed,
        duration: opts.duration,
        faults: injected,
        timeline,
        watchers: specs.len(),
        changes: reference.len(),
        failures: recording.failures.lock().clone(),
        written: written.ok,
        dir: dir.clone(),
        ..Report::default()
    };
    let segments = recording.segments();
    report.segments = segments.len();
    // Every stream, for a post-mortem.
    let dump: String = segments
        .iter()
        .map(|s| {
            format!(
                "{:.3} {:.3} {} via {}: {:?} -> {:?}, {} items: {:?}\n",
                s.started,
                s.ended,
                s.watcher,
                s.target,
                s.start_summary(),
                s.end,
                s.events.len(),
                s.events.iter().take(3).collect::<Vec<_>>()
            )
        })
        .collect();
    let _ = std::fs::write(dir.join("segments.txt"), dump);
    let mut by_watcher: BTreeMap<String, Vec<&Segment>> = BTreeMap::new();
    for s in &segments {
        by_watcher.entry(s.watcher.clone()).or_default().push(s);
    }
    let mut busiest: Vec<(String, usize, String)> = by_watcher
        .iter()
        .map(|(name, segs)| {
            let mut ends: BTreeMap<String, usize> = BTreeMap::new();
            for s in segs {
                let e = match &s.end {
                    crate::model::End::Closed if s.events.is_empty() => "closed empty".to_string(),
                    crate::model::End::Closed => "closed".to_string(),
                    crate::model::End::Broken(_) => "broken".to_string(),
                    crate::model::End::Error(c, _) => format!("error {c}"),
                    crate::model::End::Stopped => "stopped".to_string(),
                };
                *ends.entry(e).or_default() += 1;
            }
            let ends = ends
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ");
            (name.clone(), segs.len(), ends)
        })
        .collect();
    busiest.sort_by_key(|b| std::cmp::Reverse(b.1));
    busiest.truncate(5);
    report.busiest = busiest;
    let empty = BTreeSet::new();
    for (name, segs) in &by_watcher {
        let mut state: Option<WatcherState> = None;
        for seg in segs {
            let before = match seg.start {
                Start::From(_) => state.as_ref(),
                _ => None,
            };
            let rl = relists.get(seg.filter.resource.plural()).unwrap_or(&empty);
            let r = validate::validate_segment(&reference, seg, before, rl);
            report.events += r.events;
            report.windows += r.windows;
            let mut seen: BTreeSet<FaultKind> = BTreeSet::new();
            for (kind, from, to) in &windows {
                if seg.started <= to + 5.0 && seg.ended >= *from && seen.insert(*kind) {
                    let row = report.by_fault.entry(*kind).or_default();
                    row.segments += 1;
                    row.events += r.events;
                    for a in &r.anomalies {
                        *row.anomalies.entry(a.property).or_default() += 1;
                    }
                }
            }
            for a in r.anomalies {
                report.add(a);
            }
            state = Some(r.state);
        }
        // Final state: the watcher caught up with every change of its own
        // made before the writes stopped, and what it holds equals the
        // apiserver's consistent list (when nothing of its own changed
        // since its last resourceVersion).
        if let (Some(st), Some(spec)) = (&state, specs.iter().find(|s| &s.name == name)) {
            match final_list(&topo, &spec.filter).await {
                Ok((list_rv, items)) => {
                    let list_rv = list_rv.min(reference.head());
                    let need = reference
                        .expected(&spec.filter, 0, final_rev)
                        .last()
                        .map_or(0, |e| e.2);
                    let at_list = reference.state_at(&spec.filter, list_rv);
                    let anomaly = if at_list != items {
                        Some(format!(
                            "the reference disagrees with the apiserver's list at {list_rv} (first difference {}): a harness bug",
                            first_difference(&at_list, &items)
                        ))
                    } else if st.rv < need {
                        Some(format!(
                            "{}: behind at the end: its last resourceVersion {} is below its last change {need}",
                            spec.filter, st.rv
                        ))
                    } else if reference.expected(&spec.filter, st.rv, list_rv).is_empty()
                        && st.state != items
                    {
                        Some(format!(
                            "{}: state at {} differs from a consistent list at {list_rv}: {}",
                            spec.filter,
                            st.rv,
                            first_difference(&st.state, &items)
                        ))
                    } else {
                        None
                    };
                    if let Some(detail) = anomaly {
                        report.add(Anomaly {
                            property: Property::FinalState,
                            watcher: name.clone(),
                            target: spec.target.clone(),
                            detail,
                        });
                    }
                }
                Err(e) => {
                    *report
                        .failures
                        .entry(format!("final list: {e}"))
                        .or_default() += 1;
                }
            }
        }
    }
    for (kind, n) in &report.faults.by_kind {
        report.by_fault.entry(*kind).or_default().faults = *n;
    }
    let reads = recording.reads();
    report.reads = reads.len();
    // Reads are counted apart: a read is not a stream (the table's
    // requests are watch requests).
    for a in validate::validate_reads(&reads) {
        report.add(a);
    }
    topo.stop.cancel();
    for p in topo.nodes.iter().filter(|p| p.small_snapshot_fs) {
        crate::topology::unmount_small_fs(&p.snapshots);
    }
    Ok(report)
}
