//! A watch that says nothing while upstream moves on: the apiserver behind
//! the proxy's connection lags (its etcd member stopped or cut off: its
//! watch cache stops, yet it answers HTTP/2 PINGs and, from its stale
//! cache, `/readyz`), so a load balancer's health check keeps it, and the
//! proxy's watches on it would wait for as long as it lags. A hung one
//! (no PING answered) is found by the connection's keepalive within 20 s
//! (`upstream/pool.rs`); with client-side balancing, a lagging one by the
//! balancer's probes (`upstream/balance.rs`).
//!
//! So, when no upstream watch has delivered anything (an event or a
//! bookmark: kube-apiserver sends every watcher one a minute once its
//! cache has moved past it) for [`SILENCE`], the proxy asks, with one
//! consistency probe (a consistent `limit=1` list) on its connection,
//! whether upstream answers a consistent read: one that cannot reach
//! etcd's current revision (refused, failed, or no answer in
//! [`PROBE_TIMEOUT`]) means
//! the server behind the connection is not current, and the proxy
//! reconnects: its watches resume over new connections, which a load
//! balancer may give another apiserver ([`Upstream::reconnect`]). A shed
//! probe (`429`) is an apiserver that answers: nothing is done. A quiet
//! cluster costs one probe per [`SILENCE`]; a busy one, whose watches
//! deliver, none.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::upstream::Upstream;

use super::reflector::probe_rv;
use crate::cache::probe::ProbeError;
use crate::cache::resource::ResourceCache;

/// How long every upstream watch may say nothing before upstream is asked
/// whether it is current. Above a healthy apiserver's bookmark interval
/// would be quieter (one probe a minute less in an idle cluster), but a
/// lagging one sends none at all, and 30 s bounds how long the proxy
/// follows it.
pub const SILENCE: Duration = Duration::from_secs(30);
/// How often the silence is looked at.
const CHECK: Duration = Duration::from_secs(5);
/// How long the probe may take. Shorter than a consistent read's own
/// probe (10 s, which rides out API Priority and Fairness's queues on a
/// loaded apiserver): an apiserver whose watches are all silent is not
/// one that is busy serving them. So a lagging upstream is left within
/// [`SILENCE`] + [`CHECK`] + this, 40 s.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Watches `upstream` for silence, probing with `cache`'s resource, until
/// `shutdown`.
pub async fn watchdog(upstream: Upstream, cache: Arc<ResourceCache>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(CHECK) => {}
        }
        // Only an upstream watch that is open can be silent: not before
        // the first list, nor while upstream cannot be reached (the
        // reflectors retry on their own).
        if upstream.silent_for() < SILENCE
            || !cache.is_synced()
            || cache.upstream_down_since().is_some()
        {
            continue;
        }
        let info = cache.info().clone();
        let probed = tokio::time::timeout(PROBE_TIMEOUT, probe_rv(upstream.clone(), &info))
            .await
            .unwrap_or(Err(ProbeError::Unanswered));
        match probed {
            Ok(_) | Err(ProbeError::Shed(_)) => upstream.heard(),
            Err(error) => {
                cache.metrics.watch_restart("silent");
                tracing::warn!(
                    silent_seconds = SILENCE.as_secs(),
                    %error,
                    "no upstream watch delivered anything and a consistent read failed: the \
                     server behind the connection is not current; reconnecting"
                );
                upstream.reconnect();
            }
        }
    }
}
