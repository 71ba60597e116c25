//! One robustness run: stand the topology up, record etcd's history, start
//! the recording watchers, readers and writers, inject faults from the
//! seeded schedule, then validate every stream and report.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::etcd::{Etcd, WatchMsg};
use crate::faults::{self, Context, FaultKind, Injected};
use crate::model::{Filter, ObjectKey, Requirement, Resource, Segment, Start};
use crate::reference::Reference;
use crate::topology::{Shape, Topology, node_of};
use crate::traffic::{self, Traffic};
use crate::validate::{self, Anomaly, Property, WatcherState};
use crate::watcher::{self, Encoding, Mode, Recording, WatcherSpec};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seeds the fault schedule, the targets and the writes.
    pub seed: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// The kube-cache-proxy binary.
    pub proxy_bin: PathBuf,
    pub shape: Shape,
    /// Writes per second.
    pub rate: f64,
    /// Seconds between the end of one fault and the start of the next
    /// (drawn uniformly in the range).
    pub gap: (f64, f64),
    /// The faults drawn from.
    pub faults: Vec<FaultKind>,
    /// Where files and logs go (kept after a failed run).
    pub dir: Option<PathBuf>,
    /// How long the snapshot directory stays full, in seconds (drawn in
    /// the range): past the proxy's 60 s snapshot interval, a periodic
    /// write fails too; the takeover that follows always writes.
    pub dir_full: (f64, f64),
}

impl Options {
    /// The short run's defaults: a few minutes, every fault kind.
    pub fn short(proxy_bin: &Path) -> Options {
        Options {
            seed: 1,
            duration: Duration::from_secs(150),
            proxy_bin: proxy_bin.to_path_buf(),
            shape: Shape {
                direct_nodes: 2,
                tier_nodes: 2,
                tier_replicas: 2,
                kubelets: 2,
            },
            rate: 8.0,
            gap: (1.0, 4.0),
            faults: FaultKind::ALL.to_vec(),
            dir: None,
            dir_full: (5.0, 10.0),
        }
    }
}

/// Per property: how many anomalies and the first.
#[derive(Debug, Default, Clone)]
pub struct PropertyReport {
    pub count: u64,
    pub first: Option<Anomaly>,
}

/// One row of the fault × property table.
#[derive(Debug, Default, Clone)]
pub struct FaultRow {
    pub faults: u64,
    pub segments: usize,
    pub events: usize,
    pub anomalies: BTreeMap<Property, u64>,
}

/// What a run found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub seed: u64,
    pub duration: Duration,
    pub faults: Injected,
    /// Fault lines, in order, with their time since the start.
    pub timeline: Vec<(f64, String)>,
    /// Per fault kind: the watch requests whose streams were open while a
    /// fault of that kind was (or in the 5 s after it), the events they
    /// carried, and their anomalies by property.
    pub by_fault: BTreeMap<FaultKind, FaultRow>,
    pub watchers: usize,
    pub segments: usize,
    /// Object events validated against the reference.
    pub events: usize,
    /// Relist windows (a proxy's relist delivered as events) accepted.
    pub windows: usize,
    /// Reads validated.
    pub reads: usize,
    /// Changes in the reference (etcd's history of the followed keys).
    pub changes: usize,
    pub anomalies: BTreeMap<Property, PropertyReport>,
    pub failures: BTreeMap<String, u64>,
    /// The watchers with the most watch requests, and how their requests
    /// ended.
    pub busiest: Vec<(String, usize, String)>,
    pub written: BTreeMap<String, u64>,
    /// Where the run's files are.
    pub dir: PathBuf,
}

impl Report {
    /// Whether nothing was found.
    pub fn clean(&self) -> bool {
        self.anomalies.values().all(|p| p.count == 0)
    }

    fn add(&mut self, a: Anomaly) {
        let p = self.anomalies.entry(a.property).or_default();
        p.count += 1;
        if p.first.is_none() {
            p.first = Some(a);
        }
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let w = |out: &mut String, s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        w(
            &mut out,
            format!(
                "== robustness run: seed {} ({:.0?} of faults; files in {})",
                self.seed,
                self.duration,
                self.dir.display()
            ),
        );
        let total: u64 = self.faults.by_kind.values().sum();
        w(&mut out, format!("faults injected: {total}"));
        for (k, n) in &self.faults.by_kind {
            w(&mut out, format!("  {:<20} {n}", k.as_str()));
        }
        for (k, n) in &self.faults.skipped {
            w(&mut out, format!("  skipped: {k}: {n}"));
        }
        w(
            &mut out,
            format!(
                "validated: {} watchers, {} watch requests, {} events ({} relist windows), {} reads, against {} changes in etcd",
                self.watchers, self.segments, self.events, self.windows, self.reads, self.changes
            ),
        );
        let written: u64 = self.written.values().sum();
        w(
            &mut out,
            format!(
                "writes: {written} ({})",
                self.written
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        w(&mut out, "fault x property (watch requests open during a fault or the 5 s after it; events they carried; anomalies):".into());
        let mut header = format!(
            "  {:<18} {:>6} {:>8} {:>8}",
            "fault", "faults", "requests", "events"
        );
        for p in Property::ALL {
            header.push_str(&format!(" {:>4}", short_property(p)));
        }
        w(&mut out, header);
        for (k, row) in &self.by_fault {
            let mut line = format!(
                "  {:<18} {:>6} {:>8} {:>8}",
                k.as_str(),
                row.faults,
                row.segments,
                row.events
            );
            for p in Property::ALL {
                line.push_str(&format!(
                    " {:>4}",
                    row.anomalies.get(&p).copied().unwrap_or(0)
                ));
            }
            w(&mut out, line);
        }
        w(
            &mut out,
            format!(
                "  columns: {}",
                Property::ALL
                    .iter()
                    .map(|p| format!("{}={}", short_property(*p), p.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        w(&mut out, "watchers with the most watch requests:".into());
        for (name, n, ends) in &self.busiest {
            w(&mut out, format!("  {n:>6}  {name}: {ends}"));
        }
        w(&mut out, "anomalies by property:".into());
        for p in Property::ALL {
            let r = self.anomalies.get(&p).cloned().unwrap_or_default();
            w(&mut out, format!("  {:<22} {}", p.as_str(), r.count));
            if let Some(a) = r.first {
                w(
                    &mut out,
                    format!("      first: {} via {}: {}", a.watcher, a.target, a.detail),
                );
            }
        }
        w(&mut out, "failed requests by reason (allowed while an upstream is unreachable; never a wrong answer):".into());
        if self.failures.is_empty() {
            w(&mut out, "  none".into());
        }
        for (k, n) in &self.failures {
            w(&mut out, format!("  {n:>6}  {k}"));
        }
        if !self.faults.restarts_ready.is_empty() {
            let mut r = self.faults.restarts_ready.clone();
            r.sort_by(f64::total_cmp);
            w(
                &mut out,
                format!(
                    "node proxy restarts: ready in median {:.2}s, max {:.2}s",
                    r[r.len() / 2],
                    r[r.len() - 1]
                ),
            );
        }
        w(
            &mut out,
            if self.clean() {
                "RESULT: no anomaly".into()
            } else {
                "RESULT: ANOMALIES FOUND".into()
            },
        );
        out
    }
}

/// A property's column name in the fault table.
fn short_property(p: Property) -> &'static str {
    match p {
        Property::Ordered => "ord",
        Property::Unique => "uniq",
        Property::Reliable => "rel",
        Property::Valid => "val",
        Property::Resumable => "res",
        Property::Bookmarkable => "bkm",
        Property::SelectorTransitions => "sel",
        Property::InitialState => "init",
        Property::FinalState => "fin",
        Property::Reads => "read",
    }
}

/// Records etcd's history into `reference` from `start + 1` until `stop`.
async fn record(
    etcd: Etcd,
    reference: Arc<std::sync::Mutex<Reference>>,
    start: u64,
    stop: CancellationToken,
) {
    let mut from = start + 1;
    while !stop.is_cancelled() {
        let (tx, mut rx) = mpsc::channel::<WatchMsg>(1024);
        let etcd2 = etcd.clone();
        let watch = tokio::spawn(async move { etcd2.watch(from, &tx).await });
        loop {
            let msg = tokio::select! {
                () = stop.cancelled() => { watch.abort(); return; }
                m = rx.recv() => m,
            };
            let Some(msg) = msg else { break };
            let Ok(mut r) = reference.lock() else { return };
            match msg {
                WatchMsg::Progress(rev) => r.progress(rev),
                WatchMsg::Events(changes) => {
                    for c in changes {
                        let value = c
                            .value
                            .as_deref()
                            .and_then(|v| serde_json::from_slice(v).ok());
                        let prev = c
                            .prev
                            .as_deref()
                            .and_then(|v| serde_json::from_slice(v).ok());
                        let deleted = c.value.is_none();
                        if deleted
                            || value.is_some()
                            || crate::model::Resource::of_etcd_key(&c.key).is_none()
                        {
                            r.record(c.revision, &c.key, value, prev);
                        }
                        r.progress(c.revision);
                    }
                }
            }
            from = r.head() + 1;
        }
        if let Ok(Err(e)) = watch.await {
            eprintln!("reference: etcd watch ended: {e:#}; resuming from {from}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The watchers of one node proxy, and a couple straight to the apiserver.
fn watcher_specs(topo: &Topology) -> Result<Vec<WatcherSpec>> {
    let mut specs = Vec::new();
    let eq = |k: &str, v: &str| Requirement::Equals(k.to_string(), v.to_string());
    for p in &topo.nodes {
        let node = node_of(p).to_string();
        let on_node = vec![eq("spec.nodeName", &node)];
        let mut add = |kind: &str,
                       encoding: Encoding,
                       mode: Mode,
                       h2: bool,
                       as_node: bool,
                       filter: Filter|
         -> Result<()> {
            specs.push(WatcherSpec {
                name: format!("{}/{kind}", p.name),
                target: p.name.clone(),
                client: topo.client_of(p, as_node, h2)?,
                encoding,
                mode,
                filter,
            });
            Ok(())
        };
        let pods = |labels: Vec<Requirement>| Filter {
            resource: Resource::Pods,
            namespace: None,
            labels,
            fields: on_node.clone(),
        };
        // kubelet's watch, in each representation and way of starting.
        add(
            "pods-json",
            Encoding::Json,
            Mode::ListWatch,
            false,
            true,
            pods(vec![]),
        )?;
        add(
            "pods-protobuf",
            Encoding::Protobuf,
            Mode::ListWatch,
            true,
            true,
            pods(vec![]),
        )?;
        add(
            "pods-streaming",
            Encoding::Json,
            Mode::StreamingList,
            true,
            true,
            pods(vec![]),
        )?;
        add(
            "pods-websocket",
            Encoding::WebSocket,
            Mode::ListWatch,
            false,
            true,
            pods(vec![]),
        )?;
        // Label selectors, as controllers' informers use, within the node.
        add(
            "pods-app-a",
            Encoding::Json,
            Mode::ListWatch,
            true,
            true,
            pods(vec![eq("app", "a")]),
        )?;
        // kube-proxy's: services and endpointslices, cluster-wide.
        add(
            "services-metadata",
            Encoding::Metadata,
            Mode::ListWatch,
            true,
            true,
            Filter {
                labels: vec![Requirement::In("app".into(), vec!["a".into(), "b".into()])],
                ..Filter::all(Resource::Services)
            },
        )?;
        add(
            "endpointslices-protobuf",
            Encoding::Protobuf,
            Mode::StreamingList,
            true,
            true,
            Filter {
                labels: vec![Requirement::NotEquals("app".into(), "c".into())],
                ..Filter::all(Resource::EndpointSlices)
            },
        )?;
        // Its own Node, by name.
        add(
            "node",
            Encoding::Json,
            Mode::ListWatch,
            true,
            true,
            Filter {
                fields: vec![eq("metadata.name", &node)],
                ..Filter::all(Resource::Nodes)
            },
        )?;
        // An agent with a token: configmaps of one namespace by label
        // (passed through by a node proxy, cached by the tier).
        add(
            "configmaps-token",
            Encoding::Json,
            Mode::ListWatch,
            false,
            false,
            Filter {
                namespace: Some(crate::topology::NAMESPACES[0].to_string()),
                labels: vec![eq("app", "b")],
                ..Filter::all(Resource::ConfigMaps)
            },
        )?;
    }
    // Controls: the apiserver itself, so the validators are checked too.
    for (kind, filter) in [
        ("pods", Filter::all(Resource::Pods)),
        ("configmaps", Filter::all(Resource::ConfigMaps)),
    ] {
        specs.push(WatcherSpec {
            name: format!("apiserver/{kind}"),
            target: "apiserver".into(),
            client: topo.direct_reader(true)?,
            encoding: Encoding::Json,
            mode: Mode::ListWatch,
            filter,
        });
    }
    Ok(specs)
}

/// Relists each proxy logged (`listed from upstream`), by resource: the
/// resourceVersions where a relist window may end.
fn relists(dir: &Path) -> HashMap<String, BTreeSet<u64>> {
    let mut out: HashMap<String, BTreeSet<u64>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("proxy.log")) else {
            continue;
        };
        for line in text.lines() {
            if !line.contains("listed from upstream") {
                continue;
            }
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let rv = v["rv"]
                .as_u64()
                .or_else(|| v["rv"].as_str().and_then(|s| s.parse().ok()));
            if let (Some(resource), Some(rv)) = (v["resource"].as_str(), rv) {
                out.entry(resource.to_string()).or_default().insert(rv);
            }
        }
    }
    out
}

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

fn first_difference(a: &BTreeMap<ObjectKey, u64>, b: &BTreeMap<ObjectKey, u64>) -> String {
    for (k, v) in a {
        match b.get(k) {
            None => return format!("{k}@{v} only in the watcher"),
            Some(w) if w != v => return format!("{k}: watcher @{v}, list @{w}"),
            _ => {}
        }
    }
    for (k, v) in b {
        if !a.contains_key(k) {
            return format!("{k}@{v} only in the list");
        }
    }
    "none".into()
}

/// A consistent list of `filter` straight from the apiserver.
async fn final_list(topo: &Topology, filter: &Filter) -> Result<(u64, BTreeMap<ObjectKey, u64>)> {
    let q = format!(
        "{}?{}",
        filter.resource.path(filter.namespace.as_deref()),
        filter.query().trim_start_matches('&')
    );
    let r = topo.admin.get(&q, None, Duration::from_secs(30)).await?;
    let v = r.json();
    let rv = v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("final list: {}", r.status))?;
    let mut items = BTreeMap::new();
    for item in v["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let m = &item["metadata"];
        if let Some(irv) = m["resourceVersion"].as_str().and_then(|s| s.parse().ok()) {
            items.insert(
                ObjectKey::new(
                    m["namespace"].as_str().unwrap_or(""),
                    m["name"].as_str().unwrap_or(""),
                ),
                irv,
            );
        }
    }
    Ok((rv, items))
}
