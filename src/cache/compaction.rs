//! What the proxy knows of upstream's compaction, so that history ends
//! where the apiserver's does.
//!
//! kube-apiserver answers a read at an exact resourceVersion it has
//! compacted with `410 Expired`: a `continue` token ("The provided
//! continue parameter is too old to display a consistent list result...",
//! with an inconsistent-continue token), and a list with
//! `resourceVersionMatch=Exact` or `limit` with a resourceVersion ("The
//! resourceVersion for the provided list is too old."). It knows the
//! revision because its own compactor made it (`--etcd-compaction-interval`,
//! default 5 minutes: each tick compacts etcd to the revision the previous
//! tick saw). The proxy's cache can rebuild any state its history covers,
//! and a quiet resource's history is trimmed only when events arrive, so
//! without this it kept answering such reads long after the apiserver
//! refused them.
//!
//! No API says which revision the apiserver has compacted to, and a
//! revision the proxy saw a second ago may have reached etcd minutes
//! before, so neither the proxy's clock nor the compaction interval can
//! tell. The apiserver can: a `limit=1` list with
//! `resourceVersionMatch=Exact` at the read's resourceVersion answers
//! `200` (alive) or `410` (compacted), from the apiserver's own watch
//! cache snapshot or one key of etcd. So an exact read is served from the
//! cache only after such a probe, and passes through when the revision is
//! compacted (the apiserver then gives its own `410`, inconsistent
//! continue token included). What a probe proves is kept:
//! - every revision at or below one answered `410` stays compacted;
//! - every revision at or above one answered `200` is alive at that moment,
//!   trusted for [`ALIVE_FOR`] (a compaction may land right after; the
//!   apiserver's own compactor runs every few minutes).
//!
//! One probe per resource is in flight at a time; a read whose revision is
//! at or above the one being probed waits for it, so a paginated list
//! costs one probe per [`ALIVE_FOR`], whatever its page count.
//!
//! Watches are not probed: kube-apiserver serves a watch from any revision
//! its own watch cache still holds events after, compacted or not (seen on
//! v1.36.2: a watch from a compacted revision of a quiet resource opens
//! with no error), so the proxy's window answers as the apiserver's does.
//! A watch from a revision a probe already found compacted passes through,
//! so the apiserver decides.

use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};

/// How long a revision a probe found alive is trusted to stay so.
pub const ALIVE_FOR: Duration = Duration::from_secs(5);

/// What a probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The apiserver serves the revision.
    Alive,
    /// The apiserver answers `410 Expired` for it.
    Compacted,
}

type Probe = Shared<BoxFuture<'static, Result<Verdict, String>>>;

/// What is known of upstream's compaction, and the probe in flight.
#[derive(Default)]
pub struct Compaction {
    /// Every revision at or below this is compacted.
    compacted: u64,
    /// The lowest revision found alive, and when.
    alive: Option<(u64, Instant)>,
    /// The probe in flight and its revision.
    inflight: Option<(u64, Probe)>,
}

impl std::fmt::Debug for Compaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compaction")
            .field("compacted", &self.compacted)
            .field("alive", &self.alive.map(|a| a.0))
            .finish_non_exhaustive()
    }
}

/// What a caller does next.
pub enum Known {
    /// Known without asking.
    Now(Verdict),
    /// Wait for this probe, then record its result with [`Compaction::record`].
    Wait(u64, Probe),
}

impl Compaction {
    /// Every revision at or below this is known to be compacted.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// What is known of `rv` now, or the probe to wait for (joined if one
    /// in flight covers `rv`, else started with `start_probe(rv)`).
    pub fn check(
        &mut self,
        rv: u64,
        now: Instant,
        start_probe: impl FnOnce(u64) -> BoxFuture<'static, Result<Verdict, String>>,
    ) -> Known {
        if rv <= self.compacted {
            return Known::Now(Verdict::Compacted);
        }
        if self
            .alive
            .is_some_and(|(a, at)| rv >= a && now.saturating_duration_since(at) < ALIVE_FOR)
        {
            return Known::Now(Verdict::Alive);
        }
        if let Some((p, probe)) = &self.inflight
            && *p <= rv
            && probe.peek().is_none()
        {
            return Known::Wait(*p, probe.clone());
        }
        let probe = start_probe(rv).shared();
        self.inflight = Some((rv, probe.clone()));
        Known::Wait(rv, probe)
    }

    /// Records what a probe of `rv`, started no later than `started`,
    /// found.
    pub fn record(&mut self, rv: u64, started: Instant, verdict: Verdict) {
        match verdict {
            Verdict::Compacted => {
                self.compacted = self.compacted.max(rv);
                if self.alive.is_some_and(|(a, _)| a <= rv) {
                    self.alive = None;
                }
            }
            Verdict::Alive => {
                let replace = match self.alive {
                    None => true,
                    Some((a, at)) => rv <= a || started.saturating_duration_since(at) >= ALIVE_FOR,
                };
                if replace && rv > self.compacted {
                    self.alive = Some((rv, started));
                }
            }
        }
        if self
            .inflight
            .as_ref()
            .is_some_and(|(p, f)| *p == rv && f.peek().is_some())
        {
            self.inflight = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn probe(
        calls: &Arc<AtomicU32>,
        verdict: Verdict,
    ) -> impl FnOnce(u64) -> BoxFuture<'static, Result<Verdict, String>> {
        let calls = calls.clone();
        move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move { Ok(verdict) }.boxed()
        }
    }

    async fn resolve(
        c: &mut Compaction,
        rv: u64,
        now: Instant,
        f: impl FnOnce(u64) -> BoxFuture<'static, Result<Verdict, String>>,
    ) -> Verdict {
        match c.check(rv, now, f) {
            Known::Now(v) => v,
            Known::Wait(p, probe) => {
                let v = probe.await.unwrap();
                c.record(p, now, v);
                v
            }
        }
    }

    #[tokio::test]
    async fn alive_covers_newer_revisions_for_a_while() {
        let calls = Arc::new(AtomicU32::new(0));
        let mut c = Compaction::default();
        let t0 = Instant::now();
        assert_eq!(
            resolve(&mut c, 100, t0, probe(&calls, Verdict::Alive)).await,
            Verdict::Alive
        );
        // Newer revisions are alive too, without asking, for ALIVE_FOR.
        assert_eq!(
            resolve(&mut c, 150, t0, probe(&calls, Verdict::Alive)).await,
            Verdict::Alive
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // An older one needs its own probe.
        assert_eq!(
            resolve(&mut c, 90, t0, probe(&calls, Verdict::Alive)).await,
            Verdict::Alive
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // After ALIVE_FOR, asked again.
        let later = t0 + ALIVE_FOR;
        assert_eq!(
            resolve(&mut c, 150, later, probe(&calls, Verdict::Alive)).await,
            Verdict::Alive
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn compacted_is_forever_and_covers_older_revisions() {
        let calls = Arc::new(AtomicU32::new(0));
        let mut c = Compaction::default();
        let t0 = Instant::now();
        assert_eq!(
            resolve(&mut c, 100, t0, probe(&calls, Verdict::Alive)).await,
            Verdict::Alive
        );
        assert_eq!(
            resolve(
                &mut c,
                120,
                t0 + ALIVE_FOR,
                probe(&calls, Verdict::Compacted)
            )
            .await,
            Verdict::Compacted
        );
        assert_eq!(c.compacted(), 120);
        let much_later = t0 + ALIVE_FOR * 100;
        for rv in [1, 100, 120] {
            assert_eq!(
                resolve(&mut c, rv, much_later, probe(&calls, Verdict::Alive)).await,
                Verdict::Compacted
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // The stale alive mark below the compaction is gone.
        assert_eq!(
            resolve(&mut c, 121, much_later, probe(&calls, Verdict::Alive)).await,
            Verdict::Alive
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn concurrent_reads_share_a_probe_that_covers_them() {
        let calls = Arc::new(AtomicU32::new(0));
        let mut c = Compaction::default();
        let t0 = Instant::now();
        let slow = |calls: &Arc<AtomicU32>| {
            let calls = calls.clone();
            move |_| -> BoxFuture<'static, Result<Verdict, String>> {
                calls.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(Verdict::Alive)
                }
                .boxed()
            }
        };
        let Known::Wait(p1, f1) = c.check(100, t0, slow(&calls)) else {
            panic!()
        };
        // At or above 100: joins it.
        let Known::Wait(p2, _) = c.check(130, t0, slow(&calls)) else {
            panic!()
        };
        assert_eq!((p1, p2), (100, 100));
        // Below: needs its own.
        let Known::Wait(p3, _) = c.check(50, t0, slow(&calls)) else {
            panic!()
        };
        assert_eq!(p3, 50);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(f1.await, Ok(Verdict::Alive));
    }
}
