//! The faults the run injects, one at a time, at moments and on targets
//! drawn from the seeded generator.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use tokio::sync::watch;

use crate::reference::Reference;
use crate::relay::Mode;
use crate::topology::{Role, Topology, start_process, wait_ready};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// One kube-apiserver `kill -9` (the others serve), restarted after
    /// 0–2 s.
    ApiserverKill,
    /// One kube-apiserver `SIGSTOP` for 1–20 s (the others serve).
    ApiserverPause,
    /// One apiserver's etcd member stopped for 5–20 s: its watch cache
    /// falls behind the others' (stacked etcd; skipped with one member).
    ApiserverLag,
    /// The etcd leader `kill -9`, restarted after 1–5 s (skipped with one
    /// member).
    EtcdLeaderKill,
    /// Every apiserver restarted in turn (`SIGTERM`, as kubelet stops a
    /// static pod), 1–4 s apart.
    RollingRestart,
    /// Every apiserver restarted in turn as the next (or previous) minor
    /// version, 2–6 s apart, so both versions serve at once: 1.35 to 1.36
    /// and back (skipped where the other version is not at hand).
    RollingUpgrade,
    /// etcd restored from a backup taken minutes earlier (at the run's
    /// start, or after the last restore), every apiserver restarted, as
    /// documented: `etcdutl snapshot restore --bump-revision
    /// --mark-compacted` (emulated). The run's clients restart after it.
    EtcdRestore,
    /// The same, the older way: without the bump, resourceVersions go back
    /// in time.
    EtcdRestoreNoBump,
    /// etcd compacted at its current revision (after the reference has
    /// recorded it), so resumes from before get `410`.
    Compaction,
    /// Nothing crosses between a proxy and its upstream for 2–20 s.
    Blackhole,
    /// 50–500 ms added to every chunk between a proxy and its upstream,
    /// for 5–20 s.
    Latency,
    /// A node proxy `kill -9`, restarted from its snapshots after 0–2 s.
    ProxyKill,
    /// A second process of a node proxy takes its sockets over, mid-stream.
    Takeover,
    /// A tier replica `kill -9`, restarted after 1–5 s.
    TierKill,
    /// A watcher stops reading for 5–30 s.
    StalledWatcher,
    /// A node proxy `kill -9`, one of its snapshots corrupted (bytes
    /// flipped), restarted.
    SnapshotCorrupt,
    /// The same, with a snapshot truncated.
    SnapshotTruncate,
    /// A node proxy's snapshot directory full for a while (past a periodic
    /// snapshot write in the long run), then a takeover (which writes
    /// them) while it is still full.
    SnapshotDirFull,
}

impl FaultKind {
    pub const ALL: [FaultKind; 18] = [
        FaultKind::EtcdRestore,
        FaultKind::EtcdRestoreNoBump,
        FaultKind::ApiserverKill,
        FaultKind::ApiserverPause,
        FaultKind::ApiserverLag,
        FaultKind::EtcdLeaderKill,
        FaultKind::RollingRestart,
        FaultKind::RollingUpgrade,
        FaultKind::Compaction,
        FaultKind::Blackhole,
        FaultKind::Latency,
        FaultKind::ProxyKill,
        FaultKind::Takeover,
        FaultKind::TierKill,
        FaultKind::StalledWatcher,
        FaultKind::SnapshotCorrupt,
        FaultKind::SnapshotTruncate,
        FaultKind::SnapshotDirFull,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::ApiserverKill => "apiserver-kill",
            FaultKind::ApiserverPause => "apiserver-pause",
            FaultKind::ApiserverLag => "apiserver-lag",
            FaultKind::EtcdLeaderKill => "etcd-leader-kill",
            FaultKind::RollingRestart => "rolling-restart",
            FaultKind::RollingUpgrade => "rolling-upgrade",
            FaultKind::EtcdRestore => "etcd-restore",
            FaultKind::EtcdRestoreNoBump => "etcd-restore-no-bump",
            FaultKind::Compaction => "compaction",
            FaultKind::Blackhole => "blackhole",
            FaultKind::Latency => "latency",
            FaultKind::ProxyKill => "proxy-kill",
            FaultKind::Takeover => "takeover",
            FaultKind::TierKill => "tier-kill",
            FaultKind::StalledWatcher => "stalled-watcher",
            FaultKind::SnapshotCorrupt => "snapshot-corrupt",
            FaultKind::SnapshotTruncate => "snapshot-truncate",
            FaultKind::SnapshotDirFull => "snapshot-dir-full",
        }
    }

    /// How often it is drawn, relative to the others.
    fn weight(self) -> u32 {
        match self {
            FaultKind::ApiserverKill | FaultKind::SnapshotDirFull => 1,
            // The control plane's own events, rarer in a cluster than a
            // node's, but drawn as often as the others here: a long run
            // has at least five of each.
            FaultKind::RollingRestart
            | FaultKind::RollingUpgrade
            | FaultKind::EtcdRestore
            | FaultKind::EtcdRestoreNoBump
            | FaultKind::ApiserverPause
            | FaultKind::Compaction
            | FaultKind::ApiserverLag
            | FaultKind::EtcdLeaderKill
            | FaultKind::TierKill
            | FaultKind::SnapshotCorrupt
            | FaultKind::SnapshotTruncate => 2,
            _ => 3,
        }
    }
}

impl FaultKind {
    /// Whether it restores etcd (the run injects it itself: its clients
    /// and reference restart after it).
    pub fn is_restore(self) -> bool {
        matches!(self, FaultKind::EtcdRestore | FaultKind::EtcdRestoreNoBump)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FaultKind {
    type Err = String;
    fn from_str(s: &str) -> Result<FaultKind, String> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = FaultKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown fault {s:?}; one of {}", all.join(", "))
            })
    }
}

/// Draws the next fault among `kinds`, by weight.
pub fn draw(rng: &mut fastrand::Rng, kinds: &[FaultKind]) -> Option<FaultKind> {
    let total: u32 = kinds.iter().map(|k| k.weight()).sum();
    if total == 0 {
        return None;
    }
    let mut x = rng.u32(..total);
    for k in kinds {
        if x < k.weight() {
            return Some(*k);
        }
        x -= k.weight();
    }
    None
}

/// What the injector needs besides the topology.
pub struct Context {
    /// The stall switch of each watcher.
    pub stalls: Vec<(String, watch::Sender<bool>)>,
    pub reference: Arc<std::sync::Mutex<Reference>>,
    /// How long the snapshot directory stays full (seconds, a range).
    pub dir_full: (f64, f64),
}

/// What was injected.
#[derive(Debug, Default, Clone)]
pub struct Injected {
    pub by_kind: BTreeMap<FaultKind, u64>,
    /// Faults that could not be injected (skipped), by kind and why.
    pub skipped: BTreeMap<String, u64>,
    /// Times from a proxy's restart to ready, in seconds.
    pub restarts_ready: Vec<f64>,
    /// Times from an etcd restore's start until every proxy served the
    /// restored world, in seconds.
    pub restores_served: Vec<f64>,
}

fn secs(rng: &mut fastrand::Rng, lo: f64, hi: f64) -> Duration {
    Duration::from_secs_f64(lo + (hi - lo) * rng.f64())
}

/// Injects one fault of `kind`; returns a one-line description.
pub async fn inject(
    kind: FaultKind,
    topo: &mut Topology,
    ctx: &Context,
    rng: &mut fastrand::Rng,
    injected: &mut Injected,
) -> Result<String> {
    let what = match kind {
        FaultKind::EtcdRestore | FaultKind::EtcdRestoreNoBump => {
            return Err(anyhow!(
                "{kind} is injected by the run itself (run/epoch.rs)"
            ));
        }
        FaultKind::ApiserverKill => {
            let i = rng.usize(..topo.cp.apiserver_count());
            let down = secs(rng, 0.0, 2.0);
            topo.cp
                .kill_apiserver_of(i, down)
                .await
                .map_err(|e| anyhow!("restarting apiserver {i}: {e}"))?;
            format!("apiserver {i} killed, down {down:.1?}")
        }
        FaultKind::ApiserverPause => {
            let i = rng.usize(..topo.cp.apiserver_count());
            let d = secs(rng, 1.0, 20.0);
            topo.cp.pause_apiserver_of(i).map_err(|e| anyhow!("{e}"))?;
            tokio::time::sleep(d).await;
            topo.cp.resume_apiserver_of(i).map_err(|e| anyhow!("{e}"))?;
            format!("apiserver {i} stopped {d:.1?}")
        }
        FaultKind::ApiserverLag => {
            let members = topo.cp.etcd_member_count();
            if members < 2 {
                return Ok(skip(injected, kind, "one etcd member"));
            }
            let i = rng.usize(..members);
            let d = secs(rng, 5.0, 20.0);
            topo.cp.kill_etcd_member(i);
            tokio::time::sleep(d).await;
            topo.cp.start_etcd_member(i).map_err(|e| anyhow!("{e}"))?;
            format!("etcd member {i} (apiserver {i}'s) down {d:.1?}")
        }
        FaultKind::EtcdLeaderKill => {
            if topo.cp.etcd_member_count() < 2 {
                return Ok(skip(injected, kind, "one etcd member"));
            }
            let Some(leader) = topo.cp.etcd_leader() else {
                return Ok(skip(injected, kind, "no leader answered"));
            };
            let down = secs(rng, 1.0, 5.0);
            topo.cp.kill_etcd_member(leader);
            tokio::time::sleep(down).await;
            topo.cp
                .start_etcd_member(leader)
                .map_err(|e| anyhow!("{e}"))?;
            format!("etcd leader (member {leader}) killed, down {down:.1?}")
        }
        FaultKind::RollingRestart => {
            let mut took = Vec::new();
            for i in 0..topo.cp.apiserver_count() {
                let started = Instant::now();
                topo.cp
                    .restart_apiserver_of(i, Duration::from_secs(5), Duration::ZERO, None)
                    .await
                    .map_err(|e| anyhow!("restarting apiserver {i}: {e}"))?;
                took.push(format!("{:.1?}", started.elapsed()));
                tokio::time::sleep(secs(rng, 1.0, 4.0)).await;
            }
            format!("apiservers restarted in turn ({})", took.join(", "))
        }
        FaultKind::RollingUpgrade => {
            let from = topo.versions.first().cloned().unwrap_or_default();
            let Some(to) = other_version(&from) else {
                return Ok(skip(injected, kind, "no other minor version at hand"));
            };
            for i in 0..topo.cp.apiserver_count() {
                topo.cp
                    .restart_apiserver_of(i, Duration::from_secs(5), Duration::ZERO, Some(&to))
                    .await
                    .map_err(|e| anyhow!("restarting apiserver {i} as {to}: {e}"))?;
                topo.versions[i] = to.clone();
                // Both versions serve for a while.
                tokio::time::sleep(secs(rng, 2.0, 6.0)).await;
            }
            format!("apiservers rolled from {from} to {to}")
        }
        FaultKind::Compaction => {
            let rev = topo.etcd.revision().await?;
            // The reference must hold every change up to `rev` first: a
            // marker written after it, once recorded, proves it.
            let marker = topo
                .etcd
                .put("/kcp-robustness/marker", &rev.to_string())
                .await?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while ctx.reference.lock().map(|r| r.head()).unwrap_or_default() < marker {
                if Instant::now() > deadline {
                    return Err(anyhow!("the reference did not reach revision {marker}"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            topo.etcd.compact(rev).await?;
            format!("etcd compacted at {rev}")
        }
        FaultKind::Blackhole | FaultKind::Latency => {
            let n = topo.tier.len() + topo.nodes.len();
            let i = rng.usize(..n);
            let p = if i < topo.tier.len() {
                &topo.tier[i]
            } else {
                &topo.nodes[i - topo.tier.len()]
            };
            let (mode, d) = if kind == FaultKind::Blackhole {
                (Mode::Blackhole, secs(rng, 2.0, 20.0))
            } else {
                (Mode::Latency(secs(rng, 0.05, 0.5)), secs(rng, 5.0, 20.0))
            };
            p.relay.set(mode);
            tokio::time::sleep(d).await;
            p.relay.set(Mode::Pass);
            format!("{mode:?} upstream of {} for {d:.1?}", p.name)
        }
        FaultKind::ProxyKill | FaultKind::SnapshotCorrupt | FaultKind::SnapshotTruncate => {
            // A snapshot to damage: a node proxy that has written one.
            let with_snapshots: Vec<usize> = (0..topo.nodes.len())
                .filter(|i| kind == FaultKind::ProxyKill || has_snapshot(&topo.nodes[*i].snapshots))
                .collect();
            let Some(&i) = with_snapshots.get(rng.usize(..with_snapshots.len().max(1))) else {
                return Ok(skip(
                    injected,
                    kind,
                    "no node proxy has written a snapshot yet",
                ));
            };
            let bin = topo.proxy_bin.clone();
            let p = &mut topo.nodes[i];
            if let Some(proc) = p.process.take() {
                proc.kill();
            }
            let mut what = format!("{} killed", p.name);
            if kind != FaultKind::ProxyKill {
                match damage_snapshot(&p.snapshots, kind == FaultKind::SnapshotTruncate, rng) {
                    Some(file) => what.push_str(&format!(
                        ", {file} {}",
                        if kind == FaultKind::SnapshotTruncate {
                            "truncated"
                        } else {
                            "corrupted"
                        }
                    )),
                    None => {
                        // Not the fault it was to be: only a kill.
                        tokio::time::sleep(secs(rng, 0.0, 2.0)).await;
                        start_process(&bin, p)?;
                        let ready = wait_ready(p, Duration::from_secs(120)).await?;
                        injected.restarts_ready.push(ready.as_secs_f64());
                        *injected.by_kind.entry(FaultKind::ProxyKill).or_default() += 1;
                        let _ = skip(injected, kind, "its snapshot vanished");
                        return Ok(format!(
                            "{what} (no snapshot to damage: a proxy-kill); ready again in {ready:.1?}"
                        ));
                    }
                }
            }
            tokio::time::sleep(secs(rng, 0.0, 2.0)).await;
            start_process(&bin, p)?;
            let ready = wait_ready(p, Duration::from_secs(120)).await?;
            injected.restarts_ready.push(ready.as_secs_f64());
            format!("{what}; ready again in {ready:.1?}")
        }
        FaultKind::Takeover => {
            let i = rng.usize(..topo.nodes.len());
            let bin = topo.proxy_bin.clone();
            takeover(&bin, &mut topo.nodes[i]).await?
        }
        FaultKind::TierKill => {
            if topo.tier.is_empty() {
                *injected
                    .skipped
                    .entry(format!("{kind}: no tier"))
                    .or_default() += 1;
                return Ok("no tier".into());
            }
            let i = rng.usize(..topo.tier.len());
            let bin = topo.proxy_bin.clone();
            let p = &mut topo.tier[i];
            if let Some(proc) = p.process.take() {
                proc.kill();
            }
            let down = secs(rng, 1.0, 5.0);
            tokio::time::sleep(down).await;
            start_process(&bin, p)?;
            let ready = wait_ready(p, Duration::from_secs(120)).await?;
            format!("{} killed, down {down:.1?}, ready in {ready:.1?}", p.name)
        }
        FaultKind::StalledWatcher => {
            if ctx.stalls.is_empty() {
                return Ok("no watchers".into());
            }
            let (name, stall) = &ctx.stalls[rng.usize(..ctx.stalls.len())];
            let d = secs(rng, 5.0, 30.0);
            stall.send_replace(true);
            tokio::time::sleep(d).await;
            stall.send_replace(false);
            format!("{name} stopped reading for {d:.1?}")
        }
        FaultKind::SnapshotDirFull => {
            let Some(p) = topo.nodes.iter_mut().find(|p| p.small_snapshot_fs) else {
                *injected
                    .skipped
                    .entry(format!(
                        "{kind}: no small snapshot filesystem (needs root to mount a tmpfs)"
                    ))
                    .or_default() += 1;
                return Ok("skipped".into());
            };
            let filler = p.snapshots.join("filler");
            let mut f = std::fs::File::create(&filler)?;
            let chunk = vec![0u8; 4096];
            while f.write_all(&chunk).is_ok() {}
            drop(f);
            let d = secs(rng, ctx.dir_full.0, ctx.dir_full.1);
            tokio::time::sleep(d).await;
            // A takeover writes the snapshots while the disk is full.
            let bin = topo.proxy_bin.clone();
            let what = takeover(&bin, p).await;
            let _ = std::fs::remove_file(&filler);
            format!(
                "{}'s snapshot directory full for {d:.1?}, then {}",
                p.name, what?
            )
        }
    };
    *injected.by_kind.entry(kind).or_default() += 1;
    Ok(what)
}

/// Records a fault that could not be injected here, and why.
fn skip(injected: &mut Injected, kind: FaultKind, why: &str) -> String {
    *injected
        .skipped
        .entry(format!("{kind}: {why}"))
        .or_default() += 1;
    format!("skipped: {why}")
}

/// The minor version a rolling upgrade from `from` goes to: the next one,
/// or from the newest the one before (1.35 and 1.36 alternate), if its
/// apiserver is at hand.
fn other_version(from: &str) -> Option<String> {
    let minor: u32 = from.strip_prefix("1.")?.parse().ok()?;
    [minor + 1, minor.checked_sub(1)?]
        .into_iter()
        .map(|m| format!("1.{m}"))
        .find(|v| kube_testenv::Assets::version(v).is_ok())
}

/// A successor process takes `p`'s sockets over; the old one drains and
/// exits.
async fn takeover(bin: &std::path::Path, p: &mut crate::topology::Proxy) -> Result<String> {
    if !matches!(p.role, Role::Node { .. }) {
        return Ok("not a node proxy".into());
    }
    let old = p.process.take();
    let log = p.dir.join("proxy.log");
    let drained_before = count_lines(&log, "drained; idle until stopped");
    start_process(bin, p)?;
    let ready = wait_ready(p, Duration::from_secs(120)).await;
    // The predecessor drains (ends every watch at an event boundary,
    // finishes what is in flight), then idles until stopped, as its pod
    // or unit would be once the successor is ready.
    if let Some(old) = old {
        let deadline = Instant::now() + Duration::from_secs(30);
        while count_lines(&log, "drained; idle until stopped") <= drained_before {
            if Instant::now() > deadline || old.exited().is_some() {
                old.kill();
                return Err(anyhow!(
                    "{}: the predecessor did not drain after the takeover",
                    p.name
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::task::spawn_blocking(move || old.terminate(Duration::from_secs(10)))
            .await
            .map_err(|e| anyhow!("{e}"))?;
    }
    let ready = ready?;
    Ok(format!(
        "{} taken over, successor ready in {ready:.1?}",
        p.name
    ))
}

/// How many lines of `log` contain `needle`.
fn count_lines(log: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .map(|t| t.lines().filter(|l| l.contains(needle)).count())
        .unwrap_or(0)
}

/// Truncates or corrupts one snapshot file in `dir`; returns its name.
/// Whether `dir` holds a snapshot file (`*.snapshot`) to damage.
fn has_snapshot(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "snapshot"))
    })
}

fn damage_snapshot(
    dir: &std::path::Path,
    truncate: bool,
    rng: &mut fastrand::Rng,
) -> Option<String> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "snapshot"))
        .filter(|p| p.is_file() && p.metadata().is_ok_and(|m| m.len() > 16))
        .collect();
    files.sort();
    if files.is_empty() {
        return None;
    }
    let file = files[rng.usize(..files.len())].clone();
    let mut bytes = std::fs::read(&file).ok()?;
    if truncate {
        bytes.truncate(rng.usize(1..bytes.len()));
    } else {
        let at = rng.usize(..bytes.len());
        for b in bytes.iter_mut().skip(at).take(8) {
            *b ^= 0x5a;
        }
    }
    std::fs::write(&file, bytes).ok()?;
    file.file_name().map(|n| n.to_string_lossy().into_owned())
}
