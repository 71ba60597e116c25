//! Watch-cache snapshots on the node's disk (`cache.persistence`), so a
//! restarted or upgraded proxy serves at once and resumes each upstream
//! watch from where the last process left off instead of listing every
//! resource again: a DaemonSet rollout then costs the apiserver one cheap
//! watch resume per resource and node, not a relist.
//!
//! One file per resource, written atomically (a temporary file, `fsync`,
//! `rename`, `fsync` of the directory), mode 0600 in a 0700 directory (it
//! holds cluster data the node may read):
//!
//! ```text
//! "KCPSNAP\n"  u32 format (LE)  u32 header length  header (JSON)
//! { u32 object length  object (the JSON the apiserver sent) } × objects
//! SHA-256 of everything before it (32 bytes)
//! ```
//!
//! The header names the resource, its cache scope, the identity the cache
//! reads as, the upstream it came from (a digest of the apiserver's URL and
//! CA) and its resourceVersion. A snapshot that is truncated, corrupt
//! (checksum), of another format, or from another upstream, resource or
//! scope is discarded with a log line, never served. Snapshots are bounded
//! in total size (`maxBytes`); a resource that does not fit is not
//! persisted (and lists on the next start).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::cache::object::CachedObject;
use crate::cache::resource::{ResourceCache, ResourceInfo};
use crate::cache::store::{Listed, Objects};

/// The file's first bytes.
const MAGIC: &[u8; 8] = b"KCPSNAP\n";
/// The layout written; any other is discarded.
const FORMAT: u32 = 1;
/// Longest header accepted.
const MAX_HEADER: u32 = 64 << 10;

/// Why a snapshot was not used.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Not a snapshot this proxy can trust: truncated, corrupt, another
    /// format, or another resource, scope or upstream.
    #[error("{0}")]
    Invalid(String),
}

/// What identifies the state a snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    /// `group/version/resource` (core group: `/v1/pods`).
    gvr: String,
    /// The upstream field selector the cache is limited to.
    scope: String,
    /// `Impersonate-User` of the cache's upstream reads.
    reads_as: String,
    /// Digest of the apiserver's URL and CA bundle.
    upstream: String,
    resource_version: u64,
    objects: u64,
}

/// The snapshot directory and its limits.
#[derive(Debug)]
pub struct Snapshots {
    dir: PathBuf,
    max_bytes: u64,
    upstream: String,
    /// Each resource's current file: its size (for the total bound) and
    /// resourceVersion.
    files: Mutex<HashMap<String, OnDisk>>,
    /// Whether the last process left the snapshots after a clean shutdown
    /// (`CLEAN`), with nothing served after them.
    clean_start: bool,
}

/// A snapshot file this process read or wrote.
#[derive(Debug, Clone, Copy)]
struct OnDisk {
    bytes: u64,
    rv: u64,
}

/// The file a cleanly stopped proxy leaves beside its snapshots: each was
/// written after its last request, so none is older than anything it
/// served. Read and removed at start; absent after a crash, whose
/// periodic snapshots may be older than what was served (`resource.rs`
/// `Resumed`).
const CLEAN: &str = "clean-shutdown";

/// A hex SHA-256 of the upstream's URL and CA certificates (DER): a
/// snapshot from another cluster does not match.
pub fn upstream_digest(url: &str, ca_certificates: &[Vec<u8>]) -> String {
    let mut h = Sha256::new();
    h.update(url.as_bytes());
    for c in ca_certificates {
        h.update((c.len() as u64).to_le_bytes());
        h.update(c);
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A writer that hashes what it writes.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    written: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

// === impl Snapshots ===

impl Snapshots {
    /// The snapshot directory of `cache.persistence`, if configured and
    /// usable (a directory that cannot be created is logged and the proxy
    /// runs without snapshots), for the cluster of `kube_config`.
    pub fn open(
        config: &crate::component::config::PersistenceConfig,
        kube_config: &kube::Config,
    ) -> Option<Arc<Snapshots>> {
        let dir = config.directory.as_ref()?;
        let upstream = upstream_digest(
            &kube_config.cluster_url.to_string(),
            kube_config.root_cert.as_deref().unwrap_or_default(),
        );
        match Snapshots::new(dir, config.max_bytes, upstream) {
            Ok(s) => Some(Arc::new(s)),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot use the snapshot directory; running without snapshots");
                None
            }
        }
    }

    /// Snapshots in `dir` (created 0700 if missing), at most `max_bytes`
    /// in all, for the apiserver `upstream` identifies.
    ///
    /// # Errors
    /// When the directory cannot be created.
    pub fn new(dir: &Path, max_bytes: u64, upstream: String) -> io::Result<Snapshots> {
        create_private_dir(dir)?;
        let marker = dir.join(CLEAN);
        let clean_start = marker.exists();
        match fs::remove_file(&marker) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(Snapshots {
            dir: dir.to_path_buf(),
            max_bytes,
            upstream,
            files: Mutex::new(HashMap::new()),
            clean_start,
        })
    }

    /// Whether the previous process stopped cleanly, its snapshots written
    /// after its last request.
    pub fn clean_start(&self) -> bool {
        self.clean_start
    }

    /// Removes the clean mark (the process that wrote it serves on).
    fn unmark_clean(&self) {
        let _ = fs::remove_file(self.dir.join(CLEAN));
    }

    /// Marks the snapshots as written after the last request (a clean
    /// shutdown).
    fn mark_clean(&self) -> io::Result<()> {
        let path = self.dir.join(CLEAN);
        let f = File::create(&path)?;
        f.sync_all()?;
        #[cfg(unix)]
        File::open(&self.dir)?.sync_all()?;
        Ok(())
    }

    /// The file name of `info`'s snapshot.
    pub fn file_name(info: &ResourceInfo) -> String {
        let g = &info.gvr;
        if g.group.is_empty() {
            format!("{}.{}.snapshot", g.resource, g.version)
        } else {
            format!("{}.{}.{}.snapshot", g.resource, g.version, g.group)
        }
    }

    /// Where `info`'s snapshot lives.
    pub fn path(&self, info: &ResourceInfo) -> PathBuf {
        self.dir.join(Self::file_name(info))
    }

    fn header(&self, info: &ResourceInfo, rv: u64, objects: u64) -> Header {
        let g = &info.gvr;
        Header {
            gvr: format!("{}/{}/{}", g.group, g.version, g.resource),
            scope: info.scope.to_string(),
            reads_as: info
                .reads_as
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            upstream: self.upstream.clone(),
            resource_version: rv,
            objects,
        }
    }

    /// Reads `info`'s snapshot: its resourceVersion and objects (packed as
    /// they are read: a snapshot is read to fill a store), `None` when
    /// there is none.
    ///
    /// # Errors
    /// [`SnapshotError`] when it cannot be read or must not be used; the
    /// caller discards it.
    pub fn load(&self, info: &ResourceInfo) -> Result<Option<(u64, Listed)>, SnapshotError> {
        let path = self.path(info);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let len = file.metadata()?.len();
        if len > self.max_bytes {
            return Err(invalid(format!(
                "{len} bytes, over the {} allowed",
                self.max_bytes
            )));
        }
        let mut data = Vec::with_capacity(len as usize);
        file.take(self.max_bytes).read_to_end(&mut data)?;
        let (rv, objects) = self.decode(info, &data)?;
        self.files
            .lock()
            .insert(Self::file_name(info), OnDisk { bytes: len, rv });
        Ok(Some((rv, objects)))
    }

    fn decode(&self, info: &ResourceInfo, data: &[u8]) -> Result<(u64, Listed), SnapshotError> {
        if data.len() < MAGIC.len() + 8 + 32 || !data.starts_with(MAGIC) {
            return Err(invalid("not a snapshot, or truncated".into()));
        }
        let (body, sum) = data.split_at(data.len() - 32);
        if Sha256::digest(body).as_slice() != sum {
            return Err(invalid("checksum mismatch (truncated or corrupt)".into()));
        }
        let mut r = Reader {
            data: body,
            at: MAGIC.len(),
        };
        let format = r.u32()?;
        if format != FORMAT {
            return Err(invalid(format!(
                "format {format}, this proxy reads {FORMAT}"
            )));
        }
        let header_len = r.u32()?;
        if header_len > MAX_HEADER {
            return Err(invalid("header too long".into()));
        }
        let header: Header = serde_json::from_slice(r.bytes(header_len as usize)?)
            .map_err(|e| invalid(format!("header: {e}")))?;
        let expected = self.header(info, header.resource_version, header.objects);
        if header != expected {
            return Err(invalid(format!(
                "written for {} (scope {:?}, as {:?}, upstream {}), not this cache's {} \
                 (scope {:?}, as {:?}, upstream {})",
                header.gvr,
                header.scope,
                header.reads_as,
                short(&header.upstream),
                expected.gvr,
                expected.scope,
                expected.reads_as,
                short(&expected.upstream),
            )));
        }
        let mut objects = Listed::packed();
        for _ in 0..header.objects {
            let len = r.u32()? as usize;
            let json = r.bytes(len)?;
            let o = CachedObject::from_json(json, info.field_set, info.namespaced)
                .map_err(|e| invalid(format!("object: {e}")))?;
            objects.push(o);
        }
        if r.at != body.len() {
            return Err(invalid("trailing bytes".into()));
        }
        Ok((header.resource_version, objects))
    }

    /// Writes `info`'s snapshot of `objects` at `rv` atomically, unless
    /// that would take the snapshots over `maxBytes` in all (then any old
    /// one is removed: it would only lead to a relist). Returns the bytes
    /// written, or `None` when it did not fit.
    ///
    /// # Errors
    /// When writing fails (any partial file is removed).
    pub fn save(
        &self,
        info: &ResourceInfo,
        objects: &Objects,
        rv: u64,
    ) -> Result<Option<u64>, SnapshotError> {
        let name = Self::file_name(info);
        let path = self.dir.join(&name);
        let size = MAGIC.len() as u64
            + 8
            + serde_json::to_vec(&self.header(info, rv, objects.len() as u64))
                .map_err(|e| invalid(e.to_string()))?
                .len() as u64
            + objects
                .values()
                .map(|o| 4 + o.json().len() as u64)
                .sum::<u64>()
            + 32;
        let others: u64 = self
            .files
            .lock()
            .iter()
            .filter(|(k, _)| **k != name)
            .map(|(_, f)| f.bytes)
            .sum();
        if others + size > self.max_bytes {
            self.files.lock().remove(&name);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
            return Ok(None);
        }
        let tmp = self.dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let result = self.write_file(&tmp, info, objects, rv);
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(e.into());
        }
        if let Err(e) = fs::rename(&tmp, &path).and_then(|()| sync_dir(&self.dir)) {
            let _ = fs::remove_file(&tmp);
            return Err(e.into());
        }
        self.files.lock().insert(name, OnDisk { bytes: size, rv });
        Ok(Some(size))
    }

    fn write_file(
        &self,
        tmp: &Path,
        info: &ResourceInfo,
        objects: &Objects,
        rv: u64,
    ) -> io::Result<()> {
        let file = private_file(tmp)?;
        let mut w = Hashing {
            inner: BufWriter::with_capacity(1 << 16, file),
            hash: Sha256::new(),
            written: 0,
        };
        let header = serde_json::to_vec(&self.header(info, rv, objects.len() as u64))
            .map_err(io::Error::other)?;
        w.write_all(MAGIC)?;
        w.write_all(&FORMAT.to_le_bytes())?;
        w.write_all(
            &u32::try_from(header.len())
                .map_err(io::Error::other)?
                .to_le_bytes(),
        )?;
        w.write_all(&header)?;
        for o in objects.values() {
            let json = o.json();
            w.write_all(
                &u32::try_from(json.len())
                    .map_err(io::Error::other)?
                    .to_le_bytes(),
            )?;
            w.write_all(json)?;
        }
        let sum = w.hash.finalize_reset();
        let mut inner = w.inner;
        inner.write_all(&sum)?;
        let file = inner.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()
    }

    /// Where `info`'s timeline mark lives: from which resourceVersion on
    /// the history this process applied is upstream's own
    /// ([`ResourceCache::note_timeline`]).
    fn timeline_path(&self, info: &ResourceInfo) -> PathBuf {
        self.dir.join(format!("{}.timeline", Self::file_name(info)))
    }

    /// Records that this process's history of `info` is upstream's own
    /// from `from` on (`None`: it may not be), atomically and on disk
    /// before anything past it is served: a successor after a crash reads
    /// it ([`Snapshots::read_timeline`]).
    ///
    /// # Errors
    /// When the file cannot be written; the previous mark is then removed
    /// (best effort: no mark reads as "not upstream's own", the safe side).
    pub fn write_timeline(&self, info: &ResourceInfo, from: Option<u64>) -> io::Result<()> {
        let path = self.timeline_path(info);
        let tmp = self.dir.join(format!(
            ".{}.timeline.tmp-{}",
            Self::file_name(info),
            std::process::id()
        ));
        let text = from.map_or_else(|| "none".to_string(), |rv| rv.to_string());
        let written = private_file(&tmp)
            .and_then(|mut f| {
                f.write_all(text.as_bytes())?;
                f.sync_all()
            })
            .and_then(|()| fs::rename(&tmp, &path))
            .and_then(|()| sync_dir(&self.dir));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
            let _ = fs::remove_file(&path);
        }
        written
    }

    /// What the previous process recorded with
    /// [`Snapshots::write_timeline`]: the resourceVersion from which its
    /// history of `info` was upstream's own, or `None` (none recorded, or
    /// it was not).
    pub fn read_timeline(&self, info: &ResourceInfo) -> Option<u64> {
        fs::read_to_string(self.timeline_path(info))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The resourceVersion of `info`'s snapshot on disk, when this process
    /// read or wrote it.
    pub fn rv_on_disk(&self, info: &ResourceInfo) -> Option<u64> {
        self.files.lock().get(&Self::file_name(info)).map(|f| f.rv)
    }

    /// Removes `info`'s snapshot (after it was found unusable).
    pub fn discard(&self, info: &ResourceInfo) {
        self.files.lock().remove(&Self::file_name(info));
        let _ = fs::remove_file(self.path(info));
    }
}

/// Writes the caches' snapshots: periodically, when asked (a successor
/// taking over), and once more at shutdown.
#[derive(Debug)]
pub struct Persister {
    snapshots: Arc<Snapshots>,
    caches: Vec<Arc<ResourceCache>>,
    /// The RV each cache's snapshot was last written at.
    saved: tokio::sync::Mutex<HashMap<String, u64>>,
    /// The snapshots whose last write failed: a failure is logged as a
    /// warning once, not at every save (a full disk would repeat it for
    /// every cache every interval), until a write succeeds again.
    failing: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// A successor is taking over: it owns the snapshots now.
    paused: std::sync::atomic::AtomicBool,
}

impl Persister {
    /// A persister of `caches` into `snapshots`.
    pub fn new(snapshots: Arc<Snapshots>, caches: Vec<Arc<ResourceCache>>) -> Persister {
        Persister {
            snapshots,
            caches,
            saved: tokio::sync::Mutex::new(HashMap::new()),
            failing: parking_lot::Mutex::default(),
            paused: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Writes the snapshots one last time for a successor that takes over,
    /// then writes no more (unless [`Persister::resume`]d). The caches
    /// stop applying upstream changes first, so nothing newer than these
    /// snapshots is served before the successor, which resumes from them,
    /// takes over: they are marked clean, as at a clean shutdown.
    pub async fn save_and_pause(&self) {
        for c in &self.caches {
            c.set_frozen(true);
        }
        if self.save_all().await
            && self.all_current()
            && let Err(error) = self.snapshots.mark_clean()
        {
            tracing::warn!(%error, "marking the snapshots clean failed");
        }
        self.paused.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Writes snapshots again, and the caches follow upstream again (a
    /// takeover did not happen).
    pub fn resume(&self) {
        self.snapshots.unmark_clean();
        self.paused
            .store(false, std::sync::atomic::Ordering::SeqCst);
        for c in &self.caches {
            c.set_frozen(false);
        }
    }

    /// Writes the snapshot of every synced cache that changed since its
    /// last one. One call at a time; the files are written off the async
    /// runtime, from O(1) copies of the stores taken under their locks.
    /// Returns whether every cache's snapshot is now at its current RV.
    pub async fn save_all(&self) -> bool {
        let mut saved = self.saved.lock().await;
        if self.paused.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let mut all = true;
        for cache in &self.caches {
            let info = cache.info().clone();
            let name = Snapshots::file_name(&info);
            let (objects, rv) = {
                let s = cache.lock();
                if !s.is_synced() {
                    all = false;
                    continue;
                }
                (s.objects().clone(), s.rv())
            };
            if saved.get(&name) == Some(&rv) || self.snapshots.rv_on_disk(&info) == Some(rv) {
                continue;
            }
            let snapshots = self.snapshots.clone();
            let result =
                tokio::task::spawn_blocking(move || snapshots.save(&info, &objects, rv)).await;
            let metrics = &cache.metrics;
            if matches!(result, Ok(Ok(_))) && self.failing.lock().remove(&name) {
                tracing::info!(resource = %name, "writing the snapshot works again");
            }
            match result {
                Ok(Ok(Some(bytes))) => {
                    metrics.snapshot("save", "saved");
                    metrics
                        .snapshot_bytes
                        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
                    saved.insert(name, rv);
                }
                Ok(Ok(None)) => {
                    metrics.snapshot("save", "too_large");
                    metrics.snapshot_bytes.set(0);
                    tracing::warn!(resource = %name, "snapshot not written: it would take the snapshots over cache.persistence.maxBytes");
                    saved.insert(name, rv);
                }
                Ok(Err(error)) => {
                    all = false;
                    metrics.snapshot("save", "error");
                    self.failed(name, &error);
                }
                Err(error) => {
                    all = false;
                    metrics.snapshot("save", "error");
                    self.failed(name, &error);
                }
            }
        }
        all
    }

    /// Logs a failed write of snapshot `name`: a warning the first time,
    /// at debug level while it keeps failing (every one is counted in
    /// `kube_cache_proxy_cache_snapshots_total{operation="save",result="error"}`).
    fn failed(&self, name: String, error: &dyn std::fmt::Display) {
        if self.failing.lock().insert(name.clone()) {
            tracing::warn!(resource = %name, %error, "writing the snapshot failed; until it works again, further failures are logged at debug level");
        } else {
            tracing::debug!(resource = %name, %error, "writing the snapshot failed again");
        }
    }

    /// Saves each cache as soon as its first list lands (a node that
    /// loses the apiserver in its first minute has its snapshots to
    /// restart from), then every `interval` until `shutdown`, then once
    /// more.
    pub async fn run(self: Arc<Self>, interval: Duration, shutdown: CancellationToken) {
        let mut first: FuturesUnordered<_> = self.caches.iter().map(|c| c.synced()).collect();
        // A cache reset because upstream's history went back: its snapshot
        // holds the old history, which a restart after a crash would
        // serve (a `NotOlderThan` read below its resourceVersion does not
        // wait), so it is rewritten at once.
        let reset = |i: usize, mut rx: tokio::sync::watch::Receiver<u64>| async move {
            let alive = rx.changed().await.is_ok();
            (i, rx, alive)
        };
        let mut resets: FuturesUnordered<_> = self
            .caches
            .iter()
            .enumerate()
            .map(|(i, c)| reset(i, c.history_resets()))
            .collect();
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(()) = first.next() => { self.save_all().await; }
                Some((i, rx, alive)) = resets.next() => {
                    if let Some(cache) = self.caches.get(i) {
                        self.forget(cache).await;
                    }
                    self.save_all().await;
                    if alive {
                        resets.push(reset(i, rx));
                    }
                }
                _ = every.tick() => { self.save_all().await; }
            }
        }
        drop(first);
        drop(resets);
        // After the last request (the caller stops serving first): when
        // every snapshot is current, the next process may serve them as
        // they are.
        if self.save_all().await
            && self.all_current()
            && let Err(error) = self.snapshots.mark_clean()
        {
            tracing::warn!(%error, "marking the snapshots clean failed");
        }
    }

    /// Forgets which resourceVersion `cache`'s snapshot was written at, so
    /// the next save writes it even at the same number (of another
    /// history).
    async fn forget(&self, cache: &ResourceCache) {
        let name = Snapshots::file_name(cache.info());
        self.saved.lock().await.remove(&name);
        self.snapshots.files.lock().remove(&name);
    }

    /// Whether every cache is current: none is still catching up after a
    /// crash (its snapshot, even rewritten now, may be older than what the
    /// crashed process served).
    fn all_current(&self) -> bool {
        self.caches
            .iter()
            .all(|c| c.resumed() == crate::cache::resource::Resumed::Current)
    }
}

fn invalid(message: String) -> SnapshotError {
    SnapshotError::Invalid(message)
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.data.len())
            .ok_or_else(|| invalid("truncated".into()))?;
        let out = &self.data[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)
}

#[cfg(unix)]
fn private_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn private_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

#[cfg(test)]
#[path = "persist_tests.rs"]
mod tests;
