//! Client-side balancing across a highly available control plane's
//! apiservers (`upstream.clientSideBalancing`), as k3s and RKE2 agents do:
//! the apiservers are learnt from the `default/kubernetes` EndpointSlices
//! (the addresses the apiservers themselves publish for the `kubernetes`
//! Service), starting from the configured address; each new upstream
//! connection goes to the ready apiserver this proxy has the fewest
//! connections to; an apiserver that stops answering `/readyz` or a
//! consistent read, or whose consistent reads lag behind the others', is
//! left, its connections closed so that their watches resume elsewhere
//! from their resourceVersions.
//!
//! Only the TCP destination changes: TLS still verifies the configured
//! server name, so every apiserver's serving certificate must name it, as
//! it must behind a TCP load balancer (kubeadm's `controlPlaneEndpoint` is
//! in every apiserver's certificate).

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use parking_lot::{Mutex, RwLock};
use tokio::net::TcpStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use apimachinery::body::BoxError;

/// What the proxy knows of one apiserver.
#[derive(Debug)]
pub(super) struct Endpoint {
    pub(super) addr: SocketAddr,
    state: AtomicU8,
    /// The resourceVersion it was current at, at the last probe.
    rv: AtomicU64,
    /// Upstream connections open to it.
    connections: AtomicUsize,
    /// Cancelled when it is left: every connection to it closes.
    leave: Mutex<CancellationToken>,
}

/// An apiserver's state, as last probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EndpointState {
    /// Not probed yet: used, as the configured address would be.
    Unknown = 0,
    Ready = 1,
    /// `/readyz` did not answer `200` in time, or it could not be reached.
    NotReady = 2,
    /// What it serves is behind what another apiserver served
    /// `maxLagSeconds` earlier.
    Lagging = 3,
}

impl EndpointState {
    fn from_u8(v: u8) -> EndpointState {
        match v {
            1 => EndpointState::Ready,
            2 => EndpointState::NotReady,
            3 => EndpointState::Lagging,
            _ => EndpointState::Unknown,
        }
    }

    /// For logs and the metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointState::Unknown => "unknown",
            EndpointState::Ready => "ready",
            EndpointState::NotReady => "not-ready",
            EndpointState::Lagging => "lagging",
        }
    }

    fn usable(self) -> bool {
        matches!(self, EndpointState::Unknown | EndpointState::Ready)
    }
}

impl Endpoint {
    fn new(addr: SocketAddr) -> Endpoint {
        Endpoint {
            addr,
            state: AtomicU8::new(EndpointState::Unknown as u8),
            rv: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            leave: Mutex::new(CancellationToken::new()),
        }
    }

    pub(super) fn state(&self) -> EndpointState {
        EndpointState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Sets its state; leaving a usable state closes its connections
    /// when `close` (a probe's verdict; a refused connection alone only
    /// sends new connections elsewhere).
    fn set_state(&self, state: EndpointState, close: bool) {
        let before = EndpointState::from_u8(self.state.swap(state as u8, Ordering::AcqRel));
        // Also when a refused connection made it unusable before a probe
        // did: connections that still hang on it close now.
        if close && !state.usable() && self.connections.load(Ordering::Acquire) > 0 {
            let mut leave = self.leave.lock();
            leave.cancel();
            *leave = CancellationToken::new();
        }
        if before == state {
            return;
        }
        if before.usable() && !state.usable() {
            if close {
                tracing::warn!(apiserver = %self.addr, state = state.as_str(), "leaving an apiserver; its connections close and their watches resume on another");
            } else {
                tracing::warn!(apiserver = %self.addr, "an apiserver refused a connection; new connections go elsewhere until a probe finds it ready");
            }
        } else if state.usable() && !before.usable() {
            tracing::info!(apiserver = %self.addr, "an apiserver is ready again; new connections may go to it");
        }
    }
}

/// The apiservers known, and the lag rule's recent history.
#[derive(Debug)]
pub struct Balancer {
    /// The configured server's `host:port` (the kubeconfig's): requests
    /// addressed to it are balanced; requests addressed to one
    /// apiserver's `ip:port` (the probes) go there.
    configured: String,
    endpoints: RwLock<Vec<Arc<Endpoint>>>,
    next: AtomicUsize,
    max_lag: Duration,
    /// Per probe round: when, and the newest resourceVersion any apiserver
    /// served.
    history: Mutex<VecDeque<(Instant, u64)>>,
    metrics: std::sync::OnceLock<BalancerMetrics>,
    /// Connections to the configured address (before any apiserver is
    /// known, or while none is usable), retired once one is.
    bootstrap: Arc<Endpoint>,
    /// Whether any apiserver is usable.
    known: tokio::sync::watch::Sender<bool>,
}

/// `kube_cache_proxy_upstream_apiservers{state}` and
/// `kube_cache_proxy_upstream_apiserver_connections_total{apiserver}`.
#[derive(Debug, Clone)]
pub struct BalancerMetrics {
    pub apiservers: prometheus::IntGaugeVec,
    pub connections: prometheus::IntCounterVec,
}

impl Balancer {
    pub(super) fn new(configured: String, max_lag: Duration) -> Balancer {
        Balancer {
            configured,
            endpoints: RwLock::new(Vec::new()),
            next: AtomicUsize::new(0),
            max_lag,
            history: Mutex::new(VecDeque::new()),
            metrics: std::sync::OnceLock::new(),
            bootstrap: Arc::new(Endpoint::new(SocketAddr::from(([0, 0, 0, 0], 0)))),
            known: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Waits until an apiserver is known and usable (the first probe
    /// round), at most `timeout`.
    pub async fn wait_known(&self, timeout: Duration) {
        let mut rx = self.known.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|k| *k)).await;
    }

    /// Once an apiserver is usable, closes the connections made to the
    /// configured address, so that what they carry moves to a balanced
    /// one (their watches resume from their resourceVersions).
    fn retire_bootstrap(&self) {
        let usable = self.endpoints.read().iter().any(|e| e.state().usable());
        self.known.send_if_modified(|k| {
            let changed = *k != usable;
            *k = usable;
            changed
        });
        if usable && self.bootstrap.connections.load(Ordering::Acquire) > 0 {
            let mut leave = self.bootstrap.leave.lock();
            leave.cancel();
            *leave = CancellationToken::new();
            tracing::info!("apiservers known; moving off the configured address's connections");
        }
    }

    /// Reports into `metrics` from now on.
    pub fn set_metrics(&self, metrics: BalancerMetrics) {
        let _ = self.metrics.set(metrics);
        self.report();
    }

    fn report(&self) {
        let Some(m) = self.metrics.get() else { return };
        let endpoints = self.endpoints.read();
        for state in [
            EndpointState::Unknown,
            EndpointState::Ready,
            EndpointState::NotReady,
            EndpointState::Lagging,
        ] {
            let n = endpoints.iter().filter(|e| e.state() == state).count();
            m.apiservers
                .with_label_values(&[state.as_str()])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The apiservers known, each with its state, the resourceVersion of
    /// its last consistent read and the connections open to it.
    pub fn endpoints(&self) -> Vec<(SocketAddr, EndpointState, u64, usize)> {
        self.endpoints
            .read()
            .iter()
            .map(|e| {
                (
                    e.addr,
                    e.state(),
                    e.rv.load(Ordering::Acquire),
                    e.connections.load(Ordering::Acquire),
                )
            })
            .collect()
    }

    pub(super) fn snapshot(&self) -> Vec<Arc<Endpoint>> {
        self.endpoints.read().clone()
    }

    /// Replaces the set of apiservers with `addrs` (from the EndpointSlices),
    /// keeping what is known of those that stay; an apiserver that is gone
    /// is left (its connections close). An empty set is ignored: the
    /// configured address alone cannot prove that every apiserver is gone.
    pub(super) fn set_addrs(&self, mut addrs: Vec<SocketAddr>) {
        addrs.sort();
        addrs.dedup();
        if addrs.is_empty() {
            return;
        }
        let mut endpoints = self.endpoints.write();
        if endpoints.iter().map(|e| e.addr).eq(addrs.iter().copied()) {
            return;
        }
        let mut next = Vec::with_capacity(addrs.len());
        for a in &addrs {
            match endpoints.iter().find(|e| e.addr == *a) {
                Some(e) => next.push(e.clone()),
                None => next.push(Arc::new(Endpoint::new(*a))),
            }
        }
        for gone in endpoints.iter().filter(|e| !addrs.contains(&e.addr)) {
            gone.set_state(EndpointState::NotReady, true);
        }
        tracing::info!(apiservers = ?addrs, "the apiservers, from the default/kubernetes EndpointSlices");
        *endpoints = next;
        drop(endpoints);
        self.retire_bootstrap();
        self.report();
    }

    /// Records one probe round: per apiserver, whether `/readyz` answered
    /// `200` and the resourceVersion of its consistent read (None: no
    /// answer).
    pub(super) fn record_round(&self, results: &[(Arc<Endpoint>, bool, Option<u64>)]) {
        let now = Instant::now();
        let newest = results.iter().filter_map(|r| r.2).max().unwrap_or(0);
        // The newest resourceVersion any apiserver served at least
        // `max_lag` ago: an apiserver still below it lags.
        let bar = {
            let mut history = self.history.lock();
            history.push_back((now, newest));
            while history.len() > 2
                && history
                    .get(1)
                    .is_some_and(|(t, _)| now.duration_since(*t) >= self.max_lag)
            {
                history.pop_front();
            }
            history
                .iter()
                .filter(|(t, _)| now.duration_since(*t) >= self.max_lag)
                .map(|(_, rv)| *rv)
                .max()
                .unwrap_or(0)
        };
        for (e, ready, rv) in results {
            if let Some(rv) = rv {
                e.rv.store(*rv, Ordering::Release);
            }
            let state = match (ready, rv) {
                (true, Some(rv)) if *rv < bar => EndpointState::Lagging,
                (true, Some(_)) => EndpointState::Ready,
                _ => EndpointState::NotReady,
            };
            e.set_state(state, true);
        }
        self.retire_bootstrap();
        self.report();
    }

    /// Where a new connection for `uri` goes, and what it is counted
    /// against: its own address when it names one apiserver (a probe),
    /// else the usable apiserver with the fewest connections (ties in
    /// turn), else the configured address (counted as the bootstrap).
    pub(super) fn route(&self, uri: &Uri) -> (Option<Arc<Endpoint>>, Option<SocketAddr>) {
        let authority = uri.authority().map_or("", |a| a.as_str());
        let endpoints = self.endpoints.read();
        if authority != self.configured {
            let pinned = endpoints
                .iter()
                .find(|e| authority == e.addr.to_string())
                .cloned();
            return (pinned, None);
        }
        let usable: Vec<&Arc<Endpoint>> = endpoints.iter().filter(|e| e.state().usable()).collect();
        if usable.is_empty() {
            return (Some(self.bootstrap.clone()), None);
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let chosen = (0..usable.len())
            .map(|i| usable[(start + i) % usable.len()])
            .min_by_key(|e| e.connections.load(Ordering::Acquire))
            .cloned();
        let addr = chosen.as_ref().map(|e| e.addr);
        (chosen, addr)
    }
}

/// The TCP connector of a balanced site: connects where
/// [`Balancer::route`] says, and ties the connection to its apiserver.
#[derive(Clone)]
pub(super) struct BalancedConnector {
    pub(super) http: HttpConnector,
    pub(super) balancer: Option<Arc<Balancer>>,
}

impl tower::Service<Uri> for BalancedConnector {
    type Response = Tracked;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Tracked, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        tower::Service::<Uri>::poll_ready(&mut self.http, cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (endpoint, target) = match &self.balancer {
            Some(b) => b.route(&uri),
            None => (None, None),
        };
        let bootstrap = match (&self.balancer, &endpoint) {
            (Some(b), Some(e)) => Arc::ptr_eq(&b.bootstrap, e),
            _ => false,
        };
        let dial = match target {
            Some(addr) => {
                let mut parts = uri.into_parts();
                parts.authority = addr.to_string().parse().ok();
                Uri::from_parts(parts).unwrap_or_default()
            }
            None => uri,
        };
        // Balanced connections are counted (a probe's, pinned to its
        // apiserver, are not).
        let balanced = target.is_some() || bootstrap;
        if balanced && let Some(m) = self.balancer.as_ref().and_then(|b| b.metrics.get()) {
            let label = match (&endpoint, bootstrap) {
                (Some(e), false) => e.addr.to_string(),
                _ => "configured".to_string(),
            };
            m.connections.with_label_values(&[&label]).inc();
        }
        #[cfg(feature = "failpoints")]
        let dial = dialled(dial);
        let connect = tower::Service::<Uri>::call(&mut self.http, dial);
        Box::pin(async move {
            let io = match connect.await {
                Ok(io) => io,
                Err(error) => {
                    // Refused or timed out: not ready until a probe says
                    // otherwise, so the next connection goes elsewhere.
                    if let Some(e) = endpoint.as_ref().filter(|_| !bootstrap) {
                        e.set_state(EndpointState::NotReady, false);
                    }
                    return Err(BoxError::from(error));
                }
            };
            Ok(match endpoint {
                Some(e) => {
                    e.connections.fetch_add(1, Ordering::AcqRel);
                    let leave = e.leave.lock().clone().cancelled_owned();
                    Tracked {
                        io,
                        endpoint: Some(e),
                        leave: Some(Box::pin(leave)),
                    }
                }
                None => Tracked {
                    io,
                    endpoint: None,
                    leave: None,
                },
            })
        })
    }
}

/// Test builds only: the address dialled for a published one. The
/// failpoint `upstream::balance::dial` returns `published=dialled,...`:
/// kube-apiserver refuses loopback addresses in EndpointSlices, and tests
/// listen on loopback only.
#[cfg(feature = "failpoints")]
fn dialled(uri: Uri) -> Uri {
    let Some(map) = fail::eval("upstream::balance::dial", |arg| arg.unwrap_or_default()) else {
        return uri;
    };
    let authority = uri.authority().map_or("", |a| a.as_str()).to_string();
    for pair in map.split(',') {
        if let Some((from, to)) = pair.split_once('=')
            && from.trim() == authority
        {
            let mut parts = uri.clone().into_parts();
            parts.authority = to.trim().parse().ok();
            return Uri::from_parts(parts).unwrap_or(uri);
        }
    }
    uri
}

/// A TCP connection to an apiserver, counted while open, and closed (its
/// reads and writes fail) when the balancer leaves that apiserver.
pub(super) struct Tracked {
    io: TokioIo<TcpStream>,
    endpoint: Option<Arc<Endpoint>>,
    leave: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(e) = &self.endpoint {
            e.connections.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Tracked {
    fn left(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let left = self
            .leave
            .as_mut()
            .is_some_and(|leave| leave.as_mut().poll(cx).is_ready());
        if left {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the balancer left this apiserver",
            ));
        }
        Ok(())
    }
}

impl hyper::rt::Read for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        self.left(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.left(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.left(cx)?;
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

impl Connection for Tracked {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balancer() -> Balancer {
        let b = Balancer::new("lb:6443".into(), Duration::from_millis(50));
        b.set_addrs(vec![
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        ]);
        b
    }

    #[test]
    fn connections_spread_and_probes_are_pinned() {
        let b = balancer();
        let lb: Uri = "https://lb:6443/api".parse().unwrap();
        let (first, _) = b.route(&lb);
        let first = first.unwrap();
        first.connections.fetch_add(1, Ordering::AcqRel);
        let (second, addr) = b.route(&lb);
        assert_ne!(second.unwrap().addr, first.addr);
        assert!(addr.is_some());
        let probe: Uri = "https://127.0.0.1:2/readyz".parse().unwrap();
        let (pinned, addr) = b.route(&probe);
        assert_eq!(pinned.unwrap().addr.port(), 2);
        assert_eq!(addr, None, "dialled as addressed");
    }

    #[test]
    fn an_apiserver_not_ready_or_lagging_is_left_and_taken_back() {
        let b = balancer();
        let eps = b.snapshot();
        let leave = eps[1].leave.lock().clone();
        eps[1].connections.fetch_add(1, Ordering::AcqRel);
        b.record_round(&[
            (eps[0].clone(), true, Some(10)),
            (eps[1].clone(), false, None),
        ]);
        assert_eq!(eps[1].state(), EndpointState::NotReady);
        assert!(leave.is_cancelled(), "its connections close");
        eps[1].connections.fetch_sub(1, Ordering::AcqRel);
        let lb: Uri = "https://lb:6443/".parse().unwrap();
        for _ in 0..4 {
            assert_eq!(b.route(&lb).0.unwrap().addr, eps[0].addr);
        }
        // Ready again but its cache behind what the other served
        // `max_lag` ago: lagging.
        std::thread::sleep(Duration::from_millis(60));
        b.record_round(&[
            (eps[0].clone(), true, Some(20)),
            (eps[1].clone(), true, Some(5)),
        ]);
        assert_eq!(eps[1].state(), EndpointState::Lagging);
        // Within `max_lag` of the newest: not lagging.
        b.record_round(&[
            (eps[0].clone(), true, Some(30)),
            (eps[1].clone(), true, Some(20)),
        ]);
        assert_eq!(eps[1].state(), EndpointState::Ready);
        // None usable: the configured address.
        b.record_round(&[(eps[0].clone(), false, None), (eps[1].clone(), false, None)]);
        let (to, addr) = b.route(&lb);
        assert!(Arc::ptr_eq(&to.unwrap(), &b.bootstrap) && addr.is_none());
        // Its connections are retired once an apiserver is usable again.
        b.bootstrap.connections.fetch_add(1, Ordering::AcqRel);
        let leave = b.bootstrap.leave.lock().clone();
        b.record_round(&[
            (eps[0].clone(), true, Some(40)),
            (eps[1].clone(), false, None),
        ]);
        assert!(leave.is_cancelled());
    }

    #[test]
    fn an_empty_set_is_ignored_and_a_removed_apiserver_left() {
        let b = balancer();
        let eps = b.snapshot();
        b.set_addrs(vec![]);
        assert_eq!(b.endpoints().len(), 2);
        b.set_addrs(vec![eps[0].addr]);
        assert_eq!(b.endpoints().len(), 1);
        assert_eq!(eps[1].state(), EndpointState::NotReady);
    }
}
