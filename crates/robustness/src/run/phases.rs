//! The run itself: stand the topology up, start recording etcd's history,
//! the watchers, readers and writers, inject faults from the seeded
//! schedule, settle, then validate every stream and fill the report.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};

use crate::faults::{self, Context, FaultKind, Injected};
use crate::model::{Observed, Segment, Start};
use crate::reference::Reference;
use crate::topology::Topology;
use crate::validate::{self, Anomaly, Property, WatcherState};

use super::epoch::{Ended, Epoch, wait_served};
use super::report::Report;
use super::setup::{Options, watcher_specs};
use super::sources::{final_list, final_state, relists};

/// Per watcher, the apiserver's consistent list of its filter at the end:
/// (resourceVersion, each object's resourceVersion), or why not.
type FinalLists = BTreeMap<String, Result<(u64, BTreeMap<crate::model::ObjectKey, u64>), String>>;

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
    let mut shape = opts.shape.clone();
    shape.mixed_versions = opts.faults.contains(&FaultKind::RollingUpgrade);
    let mut topo = Topology::start(&shape, &opts.proxy_bin, &dir).await?;
    println!(
        "topology ready in {:.1?}: {} tier replicas, {} node proxies, {} hollow kubelets",
        started.elapsed(),
        topo.tier.len(),
        topo.nodes.len(),
        topo.kubelets.len()
    );

    // The first epoch; a backup of etcd for the first restore.
    let specs = watcher_specs(&topo)?;
    let mut epoch = Epoch::start(&topo, &specs, opts, 0).await?;
    let mut ended: Vec<Ended> = Vec::new();
    let mut backup = topo.cp.etcd_backup().map_err(|e| anyhow!("{e}"))?;
    let mut backup_at = Instant::now();

    // Faults.
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
        let what = if kind.is_restore() {
            // The epoch ends with its clients, etcd is restored, and the
            // next starts once every proxy serves the restored world.
            let index = epoch.index + 1;
            ended.push(epoch.end().await?);
            let (age, backup_rev) = (backup_at.elapsed(), backup.1);
            let started = Instant::now();
            let (before, after) = topo
                .cp
                .etcd_restore(&backup.0, kind == FaultKind::EtcdRestore)
                .await
                .map_err(|e| anyhow!("restoring etcd: {e}"))?;
            let ready = started.elapsed();
            let served = wait_served(&topo, Duration::from_secs(120))
                .await
                .with_context(|| format!("after {kind}"))?;
            let slowest = served.iter().map(|(_, d)| *d).max().unwrap_or_default();
            injected
                .restores_served
                .push((ready + slowest).as_secs_f64());
            epoch = Epoch::start(&topo, &specs, opts, index).await?;
            backup = topo.cp.etcd_backup().map_err(|e| anyhow!("{e}"))?;
            backup_at = Instant::now();
            *injected.by_kind.entry(kind).or_default() += 1;
            format!(
                "etcd restored from a backup {age:.0?} old at revision {backup_rev}: {before} -> {after}; apiservers ready {ready:.1?} after it began, every proxy served the restored world {slowest:.1?} after that"
            )
        } else {
            let ctx = Context {
                stalls: epoch.stalls.clone(),
                reference: epoch.reference.clone(),
                dir_full: opts.dir_full,
            };
            faults::inject(kind, &mut topo, &ctx, &mut rng, &mut injected)
                .await
                .with_context(|| format!("injecting {kind} at {at:.0}s"))?
        };
        windows.push((kind, from, crate::model::unix_now()));
        println!("[{at:7.1}s] {kind}: {what}");
        timeline.push((at, format!("{kind}: {what}")));
        let gap = opts.gap.0 + (opts.gap.1 - opts.gap.0) * rng.f64();
        tokio::time::sleep(Duration::from_secs_f64(gap)).await;
    }

    // Settle: writes stop; every proxy ready; watchers catch up.
    epoch.stop_writes().await;
    for p in topo.proxies() {
        crate::topology::wait_ready(p, Duration::from_secs(120)).await?;
    }
    let final_rev = topo.etcd.revision().await?;
    let marker = topo.etcd.put("/kcp-robustness/marker", "end").await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while epoch.reference.lock().map(|r| r.head()).unwrap_or_default() < marker
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
                let need = epoch
                    .reference
                    .lock()
                    .map(|r| {
                        r.expected(&s.filter, 0, final_rev)
                            .last()
                            .map(|e| e.2)
                            .unwrap_or(0)
                    })
                    .unwrap_or(0);
                epoch
                    .recording
                    .progress
                    .lock()
                    .get(&s.name)
                    .copied()
                    .unwrap_or(0)
                    < need
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
    // The apiserver's consistent lists, taken while the reference still
    // follows etcd: anything outside the harness (a hollow kubelet's
    // late status update) may write after the writes stopped, so the
    // reference must reach each list's resourceVersion before the two
    // are compared.
    let mut finals: FinalLists = BTreeMap::new();
    for s in &specs {
        let listed = final_list(&topo, &s.filter).await;
        if let Ok((rv, _)) = &listed {
            let deadline = Instant::now() + Duration::from_secs(10);
            while epoch.reference.lock().map(|r| r.head()).unwrap_or_default() < *rv
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        finals.insert(s.name.clone(), listed.map_err(|e| e.to_string()));
    }
    ended.push(epoch.end().await?);

    // Validate, each epoch against its own history.
    let relists = relists(&dir);
    let mut report = Report {
        seed: opts.seed,
        duration: opts.duration,
        faults: injected,
        timeline,
        watchers: specs.len(),
        dir: dir.clone(),
        topology: format!(
            "{} kube-apiserver(s) ({}) on {} etcd member(s), behind {}; {} tier replicas, {} node proxies, {} hollow kubelets",
            topo.cp.apiserver_count(),
            topo.cp.version(),
            topo.cp.etcd_member_count(),
            topo.balancer.kind,
            topo.tier.len(),
            topo.nodes.len(),
            topo.kubelets.len()
        ),
        ..Report::default()
    };
    let epochs = ended.len();
    let mut all_segments = Vec::new();
    for e in &ended {
        report.changes += e.reference.len();
        // Etcd's history as the reference recorded it, for a post-mortem.
        let _ = std::fs::write(
            dir.join(format!("history-{}.txt", e.index)),
            e.reference.dump(),
        );
        for (k, v) in e.recording.failures.lock().iter() {
            *report.failures.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &e.written.ok {
            *report.written.entry(k.clone()).or_default() += v;
        }
        let last = e.index + 1 == epochs as u64;
        let segments = e.recording.segments();
        report.segments += segments.len();
        validate_epoch(
            &mut report,
            &specs,
            &e.reference,
            &segments,
            &relists,
            &windows,
            last.then_some((final_rev, &finals)),
        )
        .await;
        let reads = e.recording.reads();
        report.reads += reads.len();
        // Reads are counted apart: a read is not a stream (the table's
        // requests are watch requests).
        for a in validate::validate_reads(&reads) {
            report.add(a);
        }
        all_segments.extend(segments.into_iter().map(|s| (e.index, s)));
    }
    // Every stream, for a post-mortem.
    let dump: String = all_segments
        .iter()
        .map(|(epoch, s)| {
            format!(
                "{:.3} {:.3} epoch {epoch} {} via {}: {:?} -> {:?}, {} items: {}\n",
                s.started,
                s.ended,
                s.watcher,
                s.target,
                s.start_summary(),
                s.end,
                s.events.len(),
                s.events.iter().map(brief).collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    let _ = std::fs::write(dir.join("segments.txt"), dump);
    let mut by_watcher: BTreeMap<String, Vec<&Segment>> = BTreeMap::new();
    for (_, s) in &all_segments {
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
    for (kind, n) in &report.faults.by_kind {
        report.by_fault.entry(*kind).or_default().faults = *n;
    }
    topo.stop.cancel();
    for p in topo.nodes.iter().filter(|p| p.small_snapshot_fs) {
        crate::topology::unmount_small_fs(&p.snapshots);
    }
    Ok(report)
}

/// Validates one epoch's segments against its reference: each watcher's
/// segments in order; with `final_rev` (the last epoch), each watcher's
/// final state against the apiserver's consistent list.
#[allow(clippy::too_many_arguments)]
async fn validate_epoch(
    report: &mut Report,
    specs: &[crate::watcher::WatcherSpec],
    reference: &Reference,
    segments: &[Segment],
    relists: &std::collections::HashMap<String, BTreeSet<u64>>,
    windows: &[(FaultKind, f64, f64)],
    finals: Option<(u64, &FinalLists)>,
) {
    let mut by_watcher: BTreeMap<String, Vec<&Segment>> = BTreeMap::new();
    for s in segments {
        by_watcher.entry(s.watcher.clone()).or_default().push(s);
    }
    let empty = BTreeSet::new();
    for (name, segs) in &by_watcher {
        let mut state: Option<WatcherState> = None;
        for seg in segs {
            let before = match seg.start {
                Start::From(_) => state.as_ref(),
                _ => None,
            };
            let rl = relists.get(seg.filter.resource.plural()).unwrap_or(&empty);
            let mut r = validate::validate_segment(reference, seg, before, rl);
            r.anomalies.extend(crate::validate::freshness::measure(
                reference,
                seg,
                windows,
                &mut report.freshness,
            ));
            report.events += r.events;
            report.windows += r.windows;
            let mut seen: BTreeSet<FaultKind> = BTreeSet::new();
            for (kind, from, to) in windows {
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
        let Some((final_rev, finals)) = finals else {
            continue;
        };
        // Final state ([`final_state`]).
        if let (Some(st), Some(spec)) = (&state, specs.iter().find(|s| &s.name == name)) {
            match finals
                .get(name)
                .cloned()
                .unwrap_or_else(|| Err("not taken".into()))
            {
                Ok((list_rv, items)) => {
                    let anomaly =
                        final_state(reference, &spec.filter, st, final_rev, list_rv, &items);
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
}

/// An observed item in a few characters: `A ns/name@rv`, `B@rv` (a
/// bookmark; `B@rv*` ending the initial events).
fn brief(o: &Observed) -> String {
    match o {
        Observed::Event { kind, key, rv } => {
            format!(
                "{} {}/{}@{rv}",
                &kind.as_str()[..1],
                key.namespace,
                key.name
            )
        }
        Observed::Bookmark {
            rv,
            initial_events_end,
        } => format!("B@{rv}{}", if *initial_events_end { "*" } else { "" }),
    }
}
