//! The simulated nodes: each one connection with its own client
//! certificate carrying its watch set, each watch a reflector as the
//! proxy's (paginated list, watch from the last resourceVersion, backoff,
//! relist on `410 Gone`), reading JSON or protobuf as its connection
//! asks. `agents` uses the same for node agents and simulated node
//! proxies, and [`poll_gets`] for a log agent's GETs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::BytesMut;
use http::{HeaderName, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::wire::{Encoding, Event, next_frame, parse_event, parse_frame, parse_page};
use crate::client::{Conn, Proto, Target};

/// The node proxy's default caches (`CacheConfig::default`, scoped by
/// `Identity::scope_caches`): collection path and field selector, where
/// `{node}` is the node's name.
pub const NODE_RESOURCES: [(&str, Option<&str>); 9] = [
    ("/api/v1/pods", Some("spec.nodeName={node}")),
    ("/api/v1/nodes", Some("metadata.name={node}")),
    ("/api/v1/services", None),
    ("/apis/discovery.k8s.io/v1/endpointslices", None),
    ("/api/v1/namespaces", None),
    ("/apis/node.k8s.io/v1/runtimeclasses", None),
    ("/apis/storage.k8s.io/v1/csidrivers", None),
    ("/apis/storage.k8s.io/v1/csinodes", None),
    ("/apis/networking.k8s.io/v1/servicecidrs", None),
];

/// Items per list page, as the proxy's reflector.
const PAGE_SIZE: u32 = 500;

/// One client's connection (a node's, with its own client certificate; or
/// an agent's, with its token), shared by its watches and opened again
/// when it breaks.
pub struct SimNode {
    pub target: Target,
    pub conn: Mutex<Option<Conn>>,
}

impl SimNode {
    async fn conn(&self) -> Result<Conn> {
        let mut c = self.conn.lock().await;
        if let Some(conn) = c.as_ref().filter(|c| !c.is_closed())
            && let Some(shared) = conn.share()
        {
            return Ok(shared);
        }
        let fresh = self.target.connect(Proto::H2).await?;
        let shared = fresh
            .share()
            .ok_or_else(|| anyhow!("not an HTTP/2 connection"))?;
        *c = Some(fresh);
        Ok(shared)
    }
}

/// One watched collection and the last resourceVersion seen.
pub struct WatchSpec {
    path: String,
    field_selector: Option<String>,
    label_selector: Option<String>,
    /// Headers its requests carry in place of the connection's
    /// (`Authorization`, `Accept`): what a node proxy passes through on its
    /// one connection for clients' tokens carries each client's own.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Where its arrivals of written objects are recorded
    /// ([`Shared::arrivals`]), if at all: an index the run gives it.
    tracked: Option<u32>,
    pub rv: AtomicU64,
}

/// What a [`WatchSpec`] has beyond its collection and field selector.
#[derive(Debug, Default, Clone)]
pub struct WatchOptions {
    pub label_selector: Option<String>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub tracked: Option<u32>,
}

impl WatchSpec {
    pub fn new(path: String, field_selector: Option<String>) -> Arc<WatchSpec> {
        WatchSpec::with(path, field_selector, WatchOptions::default())
    }

    pub fn with(path: String, field_selector: Option<String>, o: WatchOptions) -> Arc<WatchSpec> {
        Arc::new(WatchSpec {
            path,
            field_selector,
            label_selector: o.label_selector,
            headers: o.headers,
            tracked: o.tracked,
            rv: AtomicU64::new(0),
        })
    }

    fn query(&self, extra: &str) -> String {
        let mut q = format!("{}?{extra}", self.path);
        for (name, value) in [
            ("labelSelector", &self.label_selector),
            ("fieldSelector", &self.field_selector),
        ] {
            if let Some(v) = value {
                q.push_str(&format!(
                    "&{name}={}",
                    percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC)
                ));
            }
        }
        q
    }

    /// A request for `query` on `conn`, with this watch's own headers.
    fn request(
        &self,
        node: &SimNode,
        conn: &Conn,
        query: &str,
    ) -> Result<http::Request<http_body_util::Full<bytes::Bytes>>> {
        let mut req = node.target.request(conn, Method::GET, query, None)?;
        for (name, value) in &self.headers {
            req.headers_mut().insert(name, value.clone());
        }
        Ok(req)
    }
}

/// An arrival of a written object's event at a tracked watch.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    /// The object's resourceVersion (the write's).
    pub rv: u64,
    /// The watch's [`WatchOptions::tracked`].
    pub watch: u32,
    pub at: Instant,
}

/// Counters over every simulated watch.
#[derive(Debug, Default)]
pub struct Shared {
    /// Watches open now (response headers received, stream not ended).
    pub open: AtomicUsize,
    /// List requests (pages).
    pub lists: AtomicU64,
    /// Relists after `410 Gone`.
    pub relists: AtomicU64,
    /// Watches that ended without an error (their timeout, or the server
    /// ended them) and resumed, and how long each had lived (ms).
    pub resumes: AtomicU64,
    pub resumed_after: std::sync::Mutex<Vec<u32>>,
    /// Events received, bookmarks apart.
    pub events: AtomicU64,
    /// Requests that failed (no response, or a status other than 200 and
    /// 410), and how many by status (0: no response).
    pub failures: AtomicU64,
    pub failures_by_status: std::sync::Mutex<std::collections::BTreeMap<u16, u64>>,
    /// When each Service and EndpointSlice patch of the steady phase was
    /// sent, by the resourceVersion it made.
    pub written: std::sync::Mutex<std::collections::HashMap<u64, Instant>>,
    /// Which of them were Service patches, in order.
    pub services_written: std::sync::Mutex<Vec<u64>>,
    /// From a patch's sending to its event's arrival at a node, for every
    /// node it reached (µs).
    pub delivery: std::sync::Mutex<Vec<u32>>,
    /// Every event at a tracked watch, matched with `written` afterwards:
    /// an event may arrive before its patch's answer.
    pub arrivals: std::sync::Mutex<Vec<Arrival>>,
    /// GETs by [`poll_gets`], and their latencies (µs).
    pub gets: AtomicU64,
    pub get_latency: std::sync::Mutex<Vec<u32>>,
}

/// A request answered with a status other than the one wanted.
#[derive(Debug)]
struct Refused {
    what: String,
    status: StatusCode,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.status)
    }
}

impl std::error::Error for Refused {}

impl Shared {
    /// Counts a failed request, by its status if it got one.
    fn failed(&self, e: &anyhow::Error) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let status = e.downcast_ref::<Refused>().map_or(0, |r| r.status.as_u16());
        if let Ok(mut m) = self.failures_by_status.lock() {
            *m.entry(status).or_default() += 1;
        }
    }
}

/// Decrements the open count when a watch ends.
struct OpenGuard<'a>(&'a AtomicUsize);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The proxy reflector's backoff (`src/cache/ingest/reflector.rs`): 0.1 s
/// doubling to 1 s, with jitter.
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_max_delay(Duration::from_secs(1))
    .with_factor(2.0)
    .with_jitter()
    .without_max_times();

/// How a watch ended.
#[derive(Debug, PartialEq, Eq)]
enum WatchEnd {
    /// The stream ended (its timeout) after it lived this long: watch
    /// again from the last RV.
    Closed(Duration),
    /// `410 Gone`: relist.
    Gone,
}

pub async fn reflect(
    node: Arc<SimNode>,
    w: Arc<WatchSpec>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let mut backoff = BACKOFF.build();
    let mut listed = false;
    while !stop.is_cancelled() {
        let step = if listed {
            watch(&node, &w, &shared).await.map(|end| match end {
                WatchEnd::Gone => {
                    shared.relists.fetch_add(1, Ordering::Relaxed);
                    listed = false;
                }
                WatchEnd::Closed(lived) => {
                    shared.resumes.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut l) = shared.resumed_after.lock() {
                        l.push(crate::stats::micros(lived) / 1000);
                    }
                }
            })
        } else {
            list(&node, &w, &shared).await.map(|rv| {
                w.rv.store(rv, Ordering::Relaxed);
                listed = true;
            })
        };
        match step {
            Ok(()) => backoff = BACKOFF.build(),
            Err(e) => {
                shared.failed(&e);
                let delay = backoff.next().unwrap_or(Duration::from_secs(1));
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// A paginated list; returns its resourceVersion.
async fn list(node: &SimNode, w: &WatchSpec, shared: &Shared) -> Result<u64> {
    let mut continue_token: Option<String> = None;
    let mut rv = None;
    loop {
        let mut extra = format!("limit={PAGE_SIZE}");
        if let Some(c) = &continue_token {
            extra.push_str("&continue=");
            extra.push_str(
                &percent_encoding::utf8_percent_encode(c, percent_encoding::NON_ALPHANUMERIC)
                    .to_string(),
            );
        }
        let mut conn = node.conn().await?;
        shared.lists.fetch_add(1, Ordering::Relaxed);
        let resp = conn.send(w.request(node, &conn, &w.query(&extra))?).await?;
        let status = resp.status();
        let encoding = Encoding::of(resp.headers().get(header::CONTENT_TYPE));
        let body = resp.into_body().collect().await?.to_bytes();
        if status != StatusCode::OK {
            return Err(Refused {
                what: format!("list {}", w.path),
                status,
            }
            .into());
        }
        let page = parse_page(&body, encoding)?;
        if rv.is_none() {
            rv = Some(page.resource_version.parse()?);
        }
        continue_token = page.continue_token;
        if continue_token.is_none() {
            return rv.ok_or_else(|| anyhow!("no resourceVersion"));
        }
    }
}

/// One watch from the last resourceVersion, until it ends.
async fn watch(node: &SimNode, w: &WatchSpec, shared: &Shared) -> Result<WatchEnd> {
    let rv = w.rv.load(Ordering::Relaxed);
    let timeout = 300 + fastrand::u64(0..300);
    let extra =
        format!("watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds={timeout}");
    let mut conn = node.conn().await?;
    let resp = conn.send(w.request(node, &conn, &w.query(&extra))?).await?;
    match resp.status() {
        StatusCode::OK => {}
        StatusCode::GONE => return Ok(WatchEnd::Gone),
        status => {
            return Err(Refused {
                what: format!("watch {}", w.path),
                status,
            }
            .into());
        }
    }
    let opened = Instant::now();
    let encoding = Encoding::of(resp.headers().get(header::CONTENT_TYPE));
    shared.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(&shared.open);
    let mut body = resp.into_body();
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        loop {
            let event = match encoding {
                Encoding::Json => match buf.iter().position(|b| *b == b'\n') {
                    Some(pos) => {
                        let line = buf.split_to(pos + 1);
                        parse_event(&line[..pos])?
                    }
                    None => break,
                },
                Encoding::Protobuf => match next_frame(&mut buf) {
                    Some(frame) => parse_frame(&frame)?,
                    None => break,
                },
            };
            match event {
                Event::Blank => {}
                Event::Object(rv) => {
                    shared.events.fetch_add(1, Ordering::Relaxed);
                    w.rv.fetch_max(rv, Ordering::Relaxed);
                    if let (Some(watch), Ok(mut a)) = (w.tracked, shared.arrivals.lock()) {
                        a.push(Arrival {
                            rv,
                            watch,
                            at: Instant::now(),
                        });
                    }
                    let sent = shared.written.lock().ok().and_then(|m| m.get(&rv).copied());
                    if let (Some(sent), Ok(mut d)) = (sent, shared.delivery.lock()) {
                        d.push(crate::stats::micros(sent.elapsed()));
                    }
                }
                Event::Bookmark(rv) => {
                    w.rv.fetch_max(rv, Ordering::Relaxed);
                }
                Event::Error(410) => return Ok(WatchEnd::Gone),
                Event::Error(code) => bail!("watch {}: an ERROR event, code {code}", w.path),
            }
        }
    }
    Ok(WatchEnd::Closed(opened.elapsed()))
}

/// GETs `path` (a consistent read: no resourceVersion, as log agents
/// read a pod's metadata) every `interval`, the first at a random point
/// of the first interval so that a fleet's GETs spread out, until `stop`.
pub async fn poll_gets(
    node: Arc<SimNode>,
    w: Arc<WatchSpec>,
    interval: Duration,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let first = interval.mul_f64(fastrand::f64());
    let mut next = tokio::time::Instant::now() + first;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        next += interval;
        let t = Instant::now();
        let ok: Result<()> = async {
            let mut conn = node.conn().await?;
            let resp = conn.send(w.request(&node, &conn, &w.path)?).await?;
            let status = resp.status();
            resp.into_body().collect().await?;
            if status != StatusCode::OK {
                return Err(Refused {
                    what: format!("GET {}", w.path),
                    status,
                }
                .into());
            }
            Ok(())
        }
        .await;
        shared.gets.fetch_add(1, Ordering::Relaxed);
        match ok {
            Ok(()) => {
                if let Ok(mut l) = shared.get_latency.lock() {
                    l.push(crate::stats::micros(t.elapsed()));
                }
            }
            Err(e) => shared.failed(&e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_queries_carry_the_node_scope() {
        let w = WatchSpec::new(
            "/api/v1/pods".into(),
            Some("spec.nodeName=sim-node-00001".into()),
        );
        assert_eq!(
            w.query("watch=1"),
            "/api/v1/pods?watch=1&fieldSelector=spec%2EnodeName%3Dsim%2Dnode%2D00001"
        );
        let all = WatchSpec::new("/api/v1/services".into(), None);
        assert_eq!(all.query("limit=500"), "/api/v1/services?limit=500");
        let labelled = WatchSpec::with(
            "/api/v1/services".into(),
            None,
            WatchOptions {
                label_selector: Some("!a/b,!c".into()),
                ..WatchOptions::default()
            },
        );
        assert_eq!(
            labelled.query("limit=500"),
            "/api/v1/services?limit=500&labelSelector=%21a%2Fb%2C%21c"
        );
    }
}
