//! The simulated nodes: each one connection with its own client
//! certificate carrying its watch set, each watch a reflector as the
//! proxy's (paginated list, watch from the last resourceVersion, backoff,
//! relist on `410 Gone`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::BytesMut;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

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

/// One node's connection (its own client certificate), shared by its
/// watches and opened again when it breaks.
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
    pub rv: AtomicU64,
}

impl WatchSpec {
    pub fn new(path: String, field_selector: Option<String>) -> Arc<WatchSpec> {
        Arc::new(WatchSpec {
            path,
            field_selector,
            rv: AtomicU64::new(0),
        })
    }

    fn query(&self, extra: &str) -> String {
        match &self.field_selector {
            Some(s) => format!(
                "{}?{extra}&fieldSelector={}",
                self.path,
                percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
            ),
            None => format!("{}?{extra}", self.path),
        }
    }
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
    /// Events received, bookmarks apart.
    pub events: AtomicU64,
    /// Requests that failed (no response, or a status other than 200 and
    /// 410).
    pub failures: AtomicU64,
    /// When each Service and EndpointSlice patch of the steady phase was
    /// sent, by the resourceVersion it made.
    pub written: std::sync::Mutex<std::collections::HashMap<u64, Instant>>,
    /// From a patch's sending to its event's arrival at a node, for every
    /// node it reached (µs).
    pub delivery: std::sync::Mutex<Vec<u32>>,
}

/// Decrements the open count when a watch ends.
struct OpenGuard<'a>(&'a AtomicUsize);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The proxy reflector's backoff (`src/cache/reflector.rs`): 0.1 s
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
    /// The stream ended (its timeout): watch again from the last RV.
    Closed,
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
            watch(&node, &w, &shared).await.map(|end| {
                if end == WatchEnd::Gone {
                    shared.relists.fetch_add(1, Ordering::Relaxed);
                    listed = false;
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
            Err(_) => {
                shared.failures.fetch_add(1, Ordering::Relaxed);
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
        let r = node
            .target
            .fetch(&mut conn, Method::GET, &w.query(&extra), None)
            .await?;
        if r.status != StatusCode::OK {
            bail!("list {}: {}", w.path, r.status);
        }
        let page: ListMeta = serde_json::from_slice(&r.body)?;
        if rv.is_none() {
            rv = Some(page.metadata.resource_version.parse()?);
        }
        continue_token = page.metadata.continue_token.filter(|c| !c.is_empty());
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
    let req = node
        .target
        .request(&conn, Method::GET, &w.query(&extra), None)?;
    let resp = conn.send(req).await?;
    match resp.status() {
        StatusCode::OK => {}
        StatusCode::GONE => return Ok(WatchEnd::Gone),
        s => bail!("watch {}: {s}", w.path),
    }
    shared.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(&shared.open);
    let mut body = resp.into_body();
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line = buf.split_to(pos + 1);
            match parse_event(&line[..pos])? {
                Event::Blank => {}
                Event::Object(rv) => {
                    shared.events.fetch_add(1, Ordering::Relaxed);
                    w.rv.fetch_max(rv, Ordering::Relaxed);
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
    Ok(WatchEnd::Closed)
}

#[derive(Deserialize)]
pub struct ListMeta {
    pub metadata: Meta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default)]
    pub resource_version: String,
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

#[derive(Deserialize)]
struct WireEvent {
    #[serde(rename = "type")]
    kind: String,
    object: WireObject,
}

#[derive(Deserialize)]
struct WireObject {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    code: u16,
}

/// One watch event line, as far as a reflector needs it.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// An empty line.
    Blank,
    /// ADDED, MODIFIED or DELETED, with the object's resourceVersion.
    Object(u64),
    /// BOOKMARK, with its resourceVersion.
    Bookmark(u64),
    /// ERROR, with the Status's code.
    Error(u16),
}

/// Parses one watch event line (JSON).
pub fn parse_event(line: &[u8]) -> Result<Event> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(Event::Blank);
    }
    let e: WireEvent = serde_json::from_slice(line).context("a malformed watch event")?;
    let rv = || -> Result<u64> {
        e.object
            .metadata
            .resource_version
            .parse()
            .map_err(|_| anyhow!("a {} event without a resourceVersion", e.kind))
    };
    match e.kind.as_str() {
        "ADDED" | "MODIFIED" | "DELETED" => Ok(Event::Object(rv()?)),
        "BOOKMARK" => Ok(Event::Bookmark(rv()?)),
        "ERROR" => Ok(Event::Error(e.object.code)),
        other => bail!("unknown watch event type {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_watch_events() {
        let added = br#"{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"a","resourceVersion":"42"},"spec":{}}}"#;
        assert_eq!(parse_event(added).unwrap(), Event::Object(42));
        let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"77","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;
        assert_eq!(parse_event(bookmark).unwrap(), Event::Bookmark(77));
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}}"#;
        assert_eq!(parse_event(gone).unwrap(), Event::Error(410));
        assert_eq!(parse_event(b"  ").unwrap(), Event::Blank);
        assert!(parse_event(br#"{"type":"ADDED","object":{"metadata":{}}}"#).is_err());
        assert!(parse_event(br#"{"type":"WHAT","object":{}}"#).is_err());
        assert!(parse_event(b"{").is_err());
    }

    #[test]
    fn list_metadata() {
        let page: ListMeta = serde_json::from_slice(
            br#"{"kind":"PodList","metadata":{"resourceVersion":"9","continue":"abc"},"items":[{"metadata":{"name":"x"}}]}"#,
        )
        .unwrap();
        assert_eq!(page.metadata.resource_version, "9");
        assert_eq!(page.metadata.continue_token.as_deref(), Some("abc"));
    }

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
    }
}
