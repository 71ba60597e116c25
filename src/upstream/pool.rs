//! Connection pools to one server: a [`Transport`] per kind of credentials,
//! each adding HTTP/2 connections as the ones before fill up
//! ([`STREAMS_PER_CONNECTION`]), with keepalives and a connect timeout that
//! covers TCP and TLS; and the [`UpstreamBody`] that frees its stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::RwLock;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;

use super::balance::{BalancedConnector, Balancer};
use apimachinery::body::{Body, BoxError};

/// HTTP/2 PING and TCP keepalive interval to the apiserver: a PING goes
/// out once nothing was read on a connection for this long.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// How long a PING may go unanswered before the connection, and every
/// stream on it, is given up: client-go's own default
/// (`HTTP2_PING_TIMEOUT_SECONDS`, 15 s, `k8s.io/apimachinery/pkg/util/net/http.go`).
/// A proxy must not give up on a slow apiserver sooner than the client it
/// stands in for: 5 s tore the node proxies' upstream connections down in
/// a mass restart on a busy control plane, where the kubelets direct kept
/// theirs (docs/performance.md (k), "The mass restart's convergence").
const PING_TIMEOUT: Duration = Duration::from_secs(15);

type HttpsConnector = hyper_rustls::HttpsConnector<BalancedConnector>;
pub(super) type Pool = Client<TimeoutConnector<HttpsConnector>, Body>;

/// A connection pool and the TLS configuration it was built with (for
/// HTTP/1.1 upgrade connections, outside the pool).
#[derive(Clone)]
pub(super) struct Transport {
    pub(super) pools: Arc<Pools>,
    pub(super) tls_h1: Arc<ClientConfig>,
}

/// Concurrent requests (HTTP/2 streams) one upstream connection carries
/// before another is opened. kube-apiserver allows 100 concurrent streams
/// per connection (`--http2-max-streams-per-connection` unset); hyper
/// queues the streams past a server's limit on the connection, where a
/// request (a SubjectAccessReview, a lease update) would wait behind
/// long-lived watches. Go's HTTP/2 transport opens another connection
/// instead, and so does the proxy.
const STREAMS_PER_CONNECTION: usize = 90;
/// Upstream connections per pool at most; past that, requests share the
/// least-loaded one.
const MAX_CONNECTIONS: usize = 256;

/// Connection pools, each holding one HTTP/2 connection (or HTTP/1.1
/// connections), added as the ones before fill up.
pub(super) struct Pools {
    make: Box<dyn Fn() -> Pool + Send + Sync>,
    slots: RwLock<Vec<Slot>>,
}

struct Slot {
    pool: Pool,
    streams: Arc<std::sync::atomic::AtomicUsize>,
}

/// One request's share of a pool, released when its response body ends or
/// is dropped.
#[derive(Debug)]
pub(super) struct StreamGuard(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl Pools {
    fn new(make: Box<dyn Fn() -> Pool + Send + Sync>) -> Pools {
        Pools {
            make,
            slots: RwLock::new(Vec::new()),
        }
    }

    /// New requests go over new connections from now on; requests in
    /// flight finish on the ones they have.
    pub(super) fn reset(&self) {
        self.slots.write().clear();
    }

    /// A pool with room for one more request, and the request's share.
    pub(super) fn checkout(&self) -> (Pool, StreamGuard) {
        use std::sync::atomic::Ordering;
        let reserve = |slot: &Slot| {
            slot.streams
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < STREAMS_PER_CONNECTION).then_some(n + 1)
                })
                .is_ok()
                .then(|| (slot.pool.clone(), StreamGuard(slot.streams.clone())))
        };
        if let Some(found) = self.slots.read().iter().find_map(reserve) {
            return found;
        }
        let mut slots = self.slots.write();
        if let Some(found) = slots.iter().find_map(reserve) {
            return found;
        }
        if slots.len() >= MAX_CONNECTIONS
            && let Some(least) = slots
                .iter()
                .min_by_key(|s| s.streams.load(Ordering::Acquire))
        {
            least.streams.fetch_add(1, Ordering::AcqRel);
            return (least.pool.clone(), StreamGuard(least.streams.clone()));
        }
        let slot = Slot {
            pool: (self.make)(),
            streams: Arc::new(std::sync::atomic::AtomicUsize::new(1)),
        };
        let found = (slot.pool.clone(), StreamGuard(slot.streams.clone()));
        slots.push(slot);
        found
    }
}

/// A response body from upstream; its request's share of the connection
/// is released when it ends or is dropped.
#[derive(Debug)]
pub struct UpstreamBody {
    pub(super) inner: Incoming,
    pub(super) stream: Option<StreamGuard>,
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.stream = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Transport {
    pub(super) fn new(
        tls: ClientConfig,
        server_name: &ServerName<'static>,
        connect_timeout: Duration,
        idle_timeout: Duration,
        http2: bool,
        balancer: Option<Arc<Balancer>>,
    ) -> Transport {
        let mut tls_h1 = tls.clone();
        tls_h1.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        // A peer host that vanished (not a hung process: its kernel would
        // still answer) is noticed within about 15 s even on HTTP/1.1.
        http.set_keepalive(Some(KEEPALIVE));
        http.set_keepalive_interval(Some(KEEPALIVE));
        http.set_keepalive_retries(Some(2));
        // With client-side balancing, each connection to the apiserver
        // the balancer picks (TLS still verifies the configured name).
        let http = BalancedConnector { http, balancer };
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
                server_name.clone(),
            ))
            .enable_http1();
        let https = if http2 {
            builder.enable_http2().wrap_connector(http)
        } else {
            builder.wrap_connector(http)
        };
        // The connect timeout above covers TCP only; this one also bounds
        // the TLS handshake.
        let connector = TimeoutConnector {
            inner: https,
            timeout: connect_timeout,
        };
        // Each pool made holds its own connection (see `Pools`).
        let make = move || {
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(idle_timeout)
                .pool_timer(hyper_util::rt::TokioTimer::new())
                // A hung apiserver (or a black-holed path) is noticed within
                // KEEPALIVE + PING_TIMEOUT: its watches, pass-through
                // requests and probes on the connection fail and are
                // retried elsewhere.
                .http2_keep_alive_interval(Some(KEEPALIVE))
                .http2_keep_alive_timeout(PING_TIMEOUT)
                .timer(hyper_util::rt::TokioTimer::new())
                .build(connector.clone())
        };
        Transport {
            pools: Arc::new(Pools::new(Box::new(make))),
            tls_h1: Arc::new(tls_h1),
        }
    }
}

/// A connector that bounds the whole connect (TCP and TLS) by a timeout.
#[derive(Clone)]
pub(super) struct TimeoutConnector<C> {
    inner: C,
    timeout: Duration,
}

impl<C> tower::Service<Uri> for TimeoutConnector<C>
where
    C: tower::Service<Uri> + Send,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connect = self.inner.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connect).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Err(format!("connect timed out after {timeout:?}").into()),
            }
        })
    }
}
