//! Recording watchers: clients of every kind the proxy serves, each a
//! reflector as client-go's: a list, then a watch from its
//! resourceVersion with bookmarks; after a stream ends or breaks, a watch
//! from the last resourceVersion seen; after `410 Gone`, a new list (or
//! streaming list). Every watch request's stream is recorded as a
//! [`Segment`] for the validators.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow};
use bytes::{Buf, BytesMut};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use parking_lot_like::Mutex;
use prost::Message;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::model::{End, Filter, Kind, ObjectKey, Observed, ReadObservation, Segment, Start};

/// A plain `std::sync::Mutex` that ignores poisoning (a recorder never
/// panics while holding it).
mod parking_lot_like {
    #[derive(Debug, Default)]
    pub struct Mutex<T>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub fn new(v: T) -> Mutex<T> {
            Mutex(std::sync::Mutex::new(v))
        }

        pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }
}

/// How a watcher's requests are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// JSON over HTTP.
    Json,
    /// Protobuf over HTTP (kubelet's and kube-proxy's default).
    Protobuf,
    /// `PartialObjectMetadata` in JSON over HTTP (metadata informers).
    Metadata,
    /// JSON watch events over a WebSocket (kubectl, browsers).
    WebSocket,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Json => "json",
            Encoding::Protobuf => "protobuf",
            Encoding::Metadata => "metadata",
            Encoding::WebSocket => "websocket",
        }
    }

    fn list_accept(self) -> &'static str {
        match self {
            Encoding::Protobuf => "application/vnd.kubernetes.protobuf, application/json",
            Encoding::Metadata => {
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            }
            Encoding::Json | Encoding::WebSocket => "application/json",
        }
    }

    fn watch_accept(self) -> &'static str {
        match self {
            Encoding::Protobuf => {
                "application/vnd.kubernetes.protobuf;stream=watch, application/json"
            }
            Encoding::Metadata => "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
            Encoding::Json | Encoding::WebSocket => "application/json",
        }
    }
}

/// How a watcher starts, and restarts after `410 Gone`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A list (`resourceVersion=0` first; consistent and paginated after
    /// a `410`), then a watch from its resourceVersion.
    ListWatch,
    /// A streaming list (`sendInitialEvents=true`, resourceVersion unset:
    /// consistent), as client-go 1.35+ informers start.
    StreamingList,
}

/// One recording watcher.
#[derive(Debug, Clone)]
pub struct WatcherSpec {
    /// Unique in the run.
    pub name: String,
    /// The proxy (or `apiserver`) it reads from.
    pub target: String,
    pub client: Client,
    pub encoding: Encoding,
    pub mode: Mode,
    pub filter: Filter,
}

/// Where segments and reads go.
#[derive(Debug, Default)]
pub struct Recording {
    pub segments: Mutex<Vec<Segment>>,
    pub reads: Mutex<Vec<ReadObservation>>,
    /// Requests that failed, by reason (for the report).
    pub failures: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Each watcher's newest resourceVersion seen, live.
    pub progress: Mutex<std::collections::HashMap<String, u64>>,
}

impl Recording {
    pub fn new() -> Arc<Recording> {
        Arc::new(Recording::default())
    }

    pub fn failed(&self, reason: impl Into<String>) {
        *self.failures.lock().entry(reason.into()).or_default() += 1;
    }

    /// Every segment so far.
    pub fn segments(&self) -> Vec<Segment> {
        self.segments.lock().clone()
    }

    /// Every read so far.
    pub fn reads(&self) -> Vec<ReadObservation> {
        self.reads.lock().clone()
    }

    fn push(&self, s: Segment) {
        self.segments.lock().push(s);
    }
}

/// What one watch request turned into.
struct Outcome {
    events: Vec<Observed>,
    /// When each event arrived (Unix seconds).
    arrived: Vec<f64>,
    end: End,
    last_rv: Option<u64>,
}

/// Runs `spec` until `stop`. `stalled`: while true, the watcher stops
/// reading its stream (a slow client).
pub async fn run(
    spec: WatcherSpec,
    recording: Arc<Recording>,
    stop: CancellationToken,
    mut stalled: watch::Receiver<bool>,
) {
    let mut last_rv: Option<u64> = None;
    let mut relist = false;
    let mut failures = 0u32;
    while !stop.is_cancelled() {
        let started = crate::model::unix_now();
        let (start, result) = match (last_rv, spec.mode) {
            (Some(rv), _) if !relist => (
                Start::From(rv),
                watch_from(&spec, Some(rv), &recording, &stop, &mut stalled).await,
            ),
            (_, Mode::StreamingList) => (
                Start::InitialEvents,
                watch_from(&spec, None, &recording, &stop, &mut stalled).await,
            ),
            (_, Mode::ListWatch) => match list(&spec, relist).await {
                Ok((rv, items)) => {
                    let start = Start::Listed { rv, items };
                    (
                        start,
                        watch_from(&spec, Some(rv), &recording, &stop, &mut stalled).await,
                    )
                }
                Err(e) => {
                    recording.failed(format!("{}: list: {}", spec.target, short(&e)));
                    failures += 1;
                    backoff(failures, &stop).await;
                    continue;
                }
            },
        };
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                // No stream at all: nothing to validate, retry.
                recording.failed(format!("{}: watch: {}", spec.target, short(&e)));
                failures += 1;
                backoff(failures, &stop).await;
                // A list before a failed watch still set the state.
                if let Start::Listed { rv, items } = start {
                    recording.push(Segment {
                        watcher: spec.name.clone(),
                        target: spec.target.clone(),
                        filter: spec.filter.clone(),
                        start: Start::Listed { rv, items },
                        events: Vec::new(),
                        arrived: Vec::new(),
                        end: End::Broken(short(&e)),
                        started,
                        ended: crate::model::unix_now(),
                    });
                    last_rv = Some(rv);
                    relist = false;
                }
                continue;
            }
        };
        if let Some(rv) = outcome.last_rv.or(match &start {
            Start::Listed { rv, .. } | Start::From(rv) => Some(*rv),
            Start::InitialEvents => None,
        }) {
            last_rv = Some(rv);
        }
        relist = matches!(outcome.end, End::Error(410, _));
        match &outcome.end {
            End::Closed | End::Stopped => failures = 0,
            End::Error(code, _) => {
                if *code != 410 {
                    recording.failed(format!("{}: watch error {code}", spec.target));
                    failures += 1;
                }
            }
            End::Broken(why) => {
                recording.failed(format!("{}: watch broken: {why}", spec.target));
                failures += 1;
            }
        }
        // A streaming list that ended before its initial events completed
        // starts over.
        if matches!(start, Start::InitialEvents)
            && !outcome.events.iter().any(|e| {
                matches!(
                    e,
                    Observed::Bookmark {
                        initial_events_end: true,
                        ..
                    }
                )
            })
        {
            last_rv = None;
        }
        recording.push(Segment {
            watcher: spec.name.clone(),
            target: spec.target.clone(),
            filter: spec.filter.clone(),
            start,
            events: outcome.events,
            arrived: outcome.arrived,
            end: outcome.end,
            started,
            ended: crate::model::unix_now(),
        });
        if failures > 0 {
            backoff(failures, &stop).await;
        }
    }
}

fn short(e: &anyhow::Error) -> String {
    let s = format!("{e:#}");
    let s = s.split(": ").take(3).collect::<Vec<_>>().join(": ");
    s.chars().take(120).collect()
}

/// client-go's backoff: 0.1 s doubling to 1 s, with jitter.
async fn backoff(failures: u32, stop: &CancellationToken) {
    let base = 0.1 * 2f64.powi(failures.min(4) as i32 - 1).max(1.0);
    let d = Duration::from_secs_f64(base.min(1.0) * (1.0 + fastrand::f64()));
    tokio::select! {
        () = stop.cancelled() => {}
        () = tokio::time::sleep(d) => {}
    }
}

/// Lists (RV=0 first; after a 410, consistent and in pages of 50, as
/// client-go's pager): the list's resourceVersion and items.
async fn list(spec: &WatcherSpec, consistent: bool) -> Result<(u64, Vec<(ObjectKey, u64)>)> {
    let path = spec.filter.resource.path(spec.filter.namespace.as_deref());
    let mut items = Vec::new();
    let mut continue_token: Option<String> = None;
    let mut list_rv = None;
    loop {
        let mut q = format!("{path}?{}", spec.filter.query().trim_start_matches('&'));
        if consistent {
            q.push_str("&limit=50");
            if let Some(c) = &continue_token {
                q.push_str("&continue=");
                q.push_str(
                    &percent_encoding::utf8_percent_encode(c, percent_encoding::NON_ALPHANUMERIC)
                        .to_string(),
                );
            }
        } else {
            q.push_str("&resourceVersion=0");
        }
        let r = spec
            .client
            .get(
                &q,
                Some(spec.encoding.list_accept()),
                Duration::from_secs(30),
            )
            .await?;
        if !r.status.is_success() {
            return Err(anyhow!("list answered {}", r.status));
        }
        let (rv, page, next) =
            if spec.encoding == Encoding::Protobuf && r.body.starts_with(b"k8s\0") {
                decode_proto_list(&r.body)?
            } else {
                json_list(&r.json())?
            };
        list_rv.get_or_insert(rv);
        items.extend(page);
        continue_token = next;
        if continue_token.is_none() {
            break;
        }
    }
    Ok((list_rv.unwrap_or_default(), items))
}

type ListPage = (u64, Vec<(ObjectKey, u64)>, Option<String>);

fn json_list(v: &Value) -> Result<ListPage> {
    let rv = v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("list without resourceVersion"))?;
    let mut items = Vec::new();
    for item in v["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let (key, rv) = key_rv(&item["metadata"])?;
        items.push((key, rv));
    }
    let next = v["metadata"]["continue"]
        .as_str()
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    Ok((rv, items, next))
}

fn key_rv(meta: &Value) -> Result<(ObjectKey, u64)> {
    let rv = meta["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("object without resourceVersion: {meta}"))?;
    Ok((
        ObjectKey::new(
            meta["namespace"].as_str().unwrap_or(""),
            meta["name"].as_str().unwrap_or(""),
        ),
        rv,
    ))
}

// --- protobuf ---

type ObjectMeta = k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
type ListMeta = k8s_pb::apimachinery::pkg::apis::meta::v1::ListMeta;

/// Any object: field 1 is its `ObjectMeta`.
#[derive(Clone, PartialEq, Message)]
struct WithMeta {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
}

/// Any list: field 1 its `ListMeta`, field 2 its items.
#[derive(Clone, PartialEq, Message)]
struct AnyList {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ListMeta>,
    #[prost(message, repeated, tag = "2")]
    items: Vec<WithMeta>,
}

/// The payload of a `k8s\0` envelope (`runtime.Unknown`'s raw bytes).
fn unwrap_envelope(bytes: &[u8]) -> Result<Vec<u8>> {
    let body = bytes
        .strip_prefix(b"k8s\0")
        .ok_or_else(|| anyhow!("no protobuf envelope"))?;
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(body)?;
    Ok(unknown.raw.unwrap_or_default())
}

fn decode_proto_list(bytes: &[u8]) -> Result<ListPage> {
    let list = AnyList::decode(unwrap_envelope(bytes)?.as_slice())?;
    let meta = list.metadata.unwrap_or_default();
    let rv = meta
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("protobuf list without resourceVersion"))?;
    let mut items = Vec::new();
    for item in list.items {
        let m = item.metadata.unwrap_or_default();
        items.push(proto_key_rv(&m)?);
    }
    let next = meta.r#continue.filter(|c| !c.is_empty());
    Ok((rv, items, next))
}

fn proto_key_rv(m: &ObjectMeta) -> Result<(ObjectKey, u64)> {
    let rv = m
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("protobuf object without resourceVersion"))?;
    Ok((
        ObjectKey::new(
            m.namespace.as_deref().unwrap_or(""),
            m.name.as_deref().unwrap_or(""),
        ),
        rv,
    ))
}

/// One decoded watch event.
enum Wire {
    Observed(Observed),
    Error(u16, String),
}

fn json_event(line: &[u8]) -> Result<Wire> {
    let v: Value = serde_json::from_slice(line)?;
    let object = &v["object"];
    let kind = match v["type"].as_str().unwrap_or("") {
        "ADDED" => Kind::Added,
        "MODIFIED" => Kind::Modified,
        "DELETED" => Kind::Deleted,
        "BOOKMARK" => {
            let rv = object["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| anyhow!("bookmark without resourceVersion"))?;
            let end = object["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true";
            return Ok(Wire::Observed(Observed::Bookmark {
                rv,
                initial_events_end: end,
            }));
        }
        "ERROR" => {
            return Ok(Wire::Error(
                object["code"].as_u64().unwrap_or(0) as u16,
                object["message"].as_str().unwrap_or("").to_string(),
            ));
        }
        other => return Err(anyhow!("unknown event type {other:?}")),
    };
    let (key, rv) = key_rv(&object["metadata"])?;
    Ok(Wire::Observed(Observed::Event { kind, key, rv }))
}

fn proto_event(frame: &[u8]) -> Result<Wire> {
    let e = k8s_pb::apimachinery::pkg::apis::meta::v1::WatchEvent::decode(frame)?;
    let raw = e.object.and_then(|o| o.raw).unwrap_or_default();
    let object = unwrap_envelope(&raw)?;
    let kind = match e.r#type.as_deref().unwrap_or("") {
        "ADDED" => Kind::Added,
        "MODIFIED" => Kind::Modified,
        "DELETED" => Kind::Deleted,
        "BOOKMARK" => {
            let m = WithMeta::decode(object.as_slice())?
                .metadata
                .unwrap_or_default();
            let rv = m
                .resource_version
                .as_deref()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| anyhow!("bookmark without resourceVersion"))?;
            let end = m
                .annotations
                .get("k8s.io/initial-events-end")
                .is_some_and(|v| v == "true");
            return Ok(Wire::Observed(Observed::Bookmark {
                rv,
                initial_events_end: end,
            }));
        }
        "ERROR" => {
            let s = k8s_pb::apimachinery::pkg::apis::meta::v1::Status::decode(object.as_slice())?;
            return Ok(Wire::Error(
                s.code.unwrap_or_default() as u16,
                s.message.unwrap_or_default(),
            ));
        }
        other => return Err(anyhow!("unknown event type {other:?}")),
    };
    let m = WithMeta::decode(object.as_slice())?
        .metadata
        .unwrap_or_default();
    let (key, rv) = proto_key_rv(&m)?;
    Ok(Wire::Observed(Observed::Event { kind, key, rv }))
}

/// Opens a watch from `rv` (or a streaming list when `None`) and records it
/// until it ends.
async fn watch_from(
    spec: &WatcherSpec,
    rv: Option<u64>,
    recording: &Recording,
    stop: &CancellationToken,
    stalled: &mut watch::Receiver<bool>,
) -> Result<Outcome> {
    let path = spec.filter.resource.path(spec.filter.namespace.as_deref());
    let timeout = 30 + fastrand::u64(0..60);
    let mut q = format!(
        "{path}?watch=1&allowWatchBookmarks=true&timeoutSeconds={timeout}{}",
        spec.filter.query()
    );
    match rv {
        Some(rv) => q.push_str(&format!("&resourceVersion={rv}")),
        None => q.push_str("&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"),
    }
    let mut out = Outcome {
        events: Vec::new(),
        arrived: Vec::new(),
        end: End::Closed,
        last_rv: None,
    };
    let note = |out: &mut Outcome, wire: Wire| -> bool {
        match wire {
            Wire::Observed(o) => {
                out.last_rv = Some(o.rv());
                let mut progress = recording.progress.lock();
                let p = progress.entry(spec.name.clone()).or_default();
                *p = (*p).max(o.rv());
                drop(progress);
                out.events.push(o);
                out.arrived.push(crate::model::unix_now());
                true
            }
            Wire::Error(code, message) => {
                out.end = End::Error(code, message);
                false
            }
        }
    };
    if spec.encoding == Encoding::WebSocket {
        let mut ws = spec.client.websocket(&q, Duration::from_secs(20)).await?;
        loop {
            wait_unstalled(stalled, stop).await;
            let msg = tokio::select! {
                () = stop.cancelled() => { out.end = End::Stopped; return Ok(out); }
                m = ws.next() => m,
            };
            use tokio_tungstenite::tungstenite::Message as M;
            match msg {
                None | Some(Ok(M::Close(_))) => return Ok(out),
                Some(Err(e)) => {
                    out.end = End::Broken(e.to_string());
                    return Ok(out);
                }
                Some(Ok(M::Text(t))) => {
                    if !note(&mut out, json_event(t.as_bytes())?) {
                        return Ok(out);
                    }
                }
                Some(Ok(M::Binary(b))) => {
                    if !note(&mut out, json_event(&b)?) {
                        return Ok(out);
                    }
                }
                Some(Ok(_)) => {}
            }
        }
    }
    let resp = spec
        .client
        .stream(
            &q,
            Some(spec.encoding.watch_accept()),
            Duration::from_secs(20),
        )
        .await?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        out.end = End::Error(
            status.as_u16(),
            v["message"].as_str().unwrap_or("").to_string(),
        );
        return Ok(out);
    }
    let proto = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/vnd.kubernetes.protobuf"));
    let mut body = resp.into_body();
    let mut buf = BytesMut::new();
    loop {
        wait_unstalled(stalled, stop).await;
        let frame = tokio::select! {
            () = stop.cancelled() => { out.end = End::Stopped; return Ok(out); }
            f = body.frame() => f,
        };
        let data = match frame {
            None => return Ok(out),
            Some(Err(e)) => {
                out.end = End::Broken(e.to_string());
                return Ok(out);
            }
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
        };
        buf.extend_from_slice(&data);
        loop {
            let wire = if proto {
                if buf.len() < 4 {
                    break;
                }
                let n = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                if buf.len() < 4 + n {
                    break;
                }
                buf.advance(4);
                let frame = buf.split_to(n);
                proto_event(&frame)?
            } else {
                let Some(pos) = buf.iter().position(|b| *b == b'\n') else {
                    break;
                };
                let line = buf.split_to(pos + 1);
                if line[..pos].iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                json_event(&line[..pos])?
            };
            if !note(&mut out, wire) {
                return Ok(out);
            }
        }
    }
}

/// Waits while the watcher is told to stop reading.
async fn wait_unstalled(stalled: &mut watch::Receiver<bool>, stop: &CancellationToken) {
    while *stalled.borrow_and_update() {
        tokio::select! {
            () = stop.cancelled() => return,
            r = stalled.changed() => if r.is_err() { return },
        }
    }
}

/// A client's reads: every `every`, a `resourceVersion=0` list, then one
/// not older than the newest resourceVersion it has seen.
pub async fn reader(
    name: String,
    target: String,
    client: Client,
    resource: crate::model::Resource,
    every: Duration,
    recording: Arc<Recording>,
    stop: CancellationToken,
) {
    let mut newest: Option<u64> = None;
    let path = resource.path(None);
    while !stop.is_cancelled() {
        for not_older_than in [None, newest] {
            if not_older_than.is_none() && newest.is_some() && fastrand::bool() {
                continue;
            }
            let q = match not_older_than {
                None => format!("{path}?resourceVersion=0&limit=1"),
                Some(n) => {
                    format!("{path}?resourceVersion={n}&resourceVersionMatch=NotOlderThan&limit=1")
                }
            };
            match client.get(&q, None, Duration::from_secs(10)).await {
                Ok(r) if r.status.is_success() => {
                    if let Some(rv) = r.json()["metadata"]["resourceVersion"]
                        .as_str()
                        .and_then(|s| s.parse::<u64>().ok())
                    {
                        recording.reads.lock().push(ReadObservation {
                            client: name.clone(),
                            target: target.clone(),
                            resource,
                            not_older_than,
                            rv,
                            at: crate::model::unix_now(),
                        });
                        newest = Some(newest.map_or(rv, |n| n.max(rv)));
                    }
                }
                Ok(r) => recording.failed(format!("{target}: read answered {}", r.status)),
                Err(e) => recording.failed(format!("{target}: read: {}", short(&e))),
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_events() {
        let Wire::Observed(o) = json_event(br#"{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"n","resourceVersion":"7"}}}"#).unwrap() else {
            panic!()
        };
        assert_eq!(
            o,
            Observed::Event {
                kind: Kind::Added,
                key: ObjectKey::new("n", "a"),
                rv: 7
            }
        );
        let Wire::Observed(o) = json_event(br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}}"#).unwrap() else {
            panic!()
        };
        assert_eq!(
            o,
            Observed::Bookmark {
                rv: 9,
                initial_events_end: true
            }
        );
        let Wire::Error(code, _) = json_event(
            br#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(code, 410);
    }
}
