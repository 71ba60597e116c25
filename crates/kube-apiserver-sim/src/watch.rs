//! `watch`: streaming lists (`sendInitialEvents`), resuming from an RV, the
//! 410 for an RV older than the history, selector transitions, bookmarks
//! and timeouts (`/tmp/research/listwatch.md` §1a, §3, §4, §5, §7, §8).
//!
//! The response starts at once; one task per watch turns store events into
//! one body frame per `{"type":...,"object":...}\n` line.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::StreamBody;
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::accept::Output;
use super::errors;
use super::object;
use super::options::{ListOptions, parse_rv};
use super::resources::ResourceSpec;
use super::respond;
use super::selection::Selection;
use super::state::{Ctx, State};
use super::stats::WatchGuard;
use super::store::{Event, EventType, Initial, TooOld, WATCHER_QUEUE, WatchFrom};
use super::table;
use apimachinery::body::{self, Body, BoxError};
use apimachinery::go as json;
use apimachinery::selector::{FieldRequirement, FieldSelector};
use apimachinery::status::Status;

/// The annotation marking the end of a streaming list's initial events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

type FrameResult = Result<Frame<Bytes>, BoxError>;

#[derive(Serialize)]
struct WireEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    object: &'a Value,
}

/// Serves a watch of `spec` in `namespace`; `url_name` is the object name
/// of the legacy `/watch/.../<name>` form (empty otherwise).
pub async fn watch(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    url_name: &str,
    output: Output,
) -> Response<Body> {
    respond::either(start(ctx, spec, namespace, url_name, output).await)
}

async fn start(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    url_name: &str,
    output: Output,
) -> Result<Response<Body>, Status> {
    let mut opts = ListOptions::parse(&ctx.query, true, spec.fields)?;
    if !url_name.is_empty() {
        if opts.field_selector.is_empty() {
            opts.field_selector = FieldSelector::from_terms(vec![FieldRequirement {
                field: "metadata.name".into(),
                not_equals: false,
                value: url_name.to_string(),
            }]);
        } else if opts.field_selector.requires_exact_match("metadata.name") != Some(url_name) {
            return Err(Status::bad_request(
                "fieldSelector metadata.name doesn't match requested name",
            ));
        }
    }
    // Cacher.Watch returns the versioner's error as is: a 500, no reason.
    let rv = parse_rv(&opts.resource_version).map_err(errors::unknown_500)?;
    let timeout = match opts.timeout_seconds {
        Some(t) if t != 0 => Duration::from_secs(u64::try_from(t).unwrap_or(0)),
        _ => Duration::from_secs(fastrand::u64(1800..3600)),
    };
    let deadline = Instant::now() + timeout;
    let sel = Selection {
        spec: spec.clone(),
        namespace: namespace.to_string(),
        labels: opts.label_selector.clone(),
        fields: opts.field_selector.clone(),
    };
    let state = ctx.state.clone();
    let mut drops = state.drops.subscribe();
    drops.borrow_and_update();
    let (tx, rx) = mpsc::channel(WATCHER_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<FrameResult>(16);
    let mut task = Task {
        state: state.clone(),
        sel,
        output,
        include_object: opts.include_object.clone(),
        events: rx,
        out: out_tx,
        min_rv: rv,
        last_sent: rv,
        bookmarks: opts.allow_watch_bookmarks,
        deadline,
        drops,
        _guard: state.stats.watch_started(&spec.resource),
    };
    let mut initial = Vec::new();
    let closing = task.register(&mut initial, &opts, rv, tx).await;
    tokio::spawn(task.run(initial, closing));
    let stream = futures_util::stream::poll_fn(move |cx| out_rx.poll_recv(cx));
    let mut response = Response::new(body::boxed(StreamBody::new(stream)));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// One watch's stream.
struct Task {
    state: Arc<State>,
    sel: Selection,
    output: Output,
    include_object: String,
    events: mpsc::Receiver<Arc<Event>>,
    out: mpsc::Sender<FrameResult>,
    /// Live events at or below this RV were already covered.
    min_rv: u64,
    /// RV of the last event or bookmark sent; bookmarks must exceed it.
    last_sent: u64,
    bookmarks: bool,
    deadline: Instant,
    drops: watch::Receiver<u64>,
    _guard: WatchGuard,
}

// === impl Task ===

impl Task {
    /// Registers with the store and queues what must be sent before live
    /// events into `initial`. Returns whether the stream ends after them
    /// (an ERROR event).
    async fn register(
        &mut self,
        initial: &mut Vec<Bytes>,
        opts: &ListOptions,
        rv: u64,
        tx: mpsc::Sender<Arc<Event>>,
    ) -> bool {
        let state = self.state.clone();
        let store = &state.store;
        let spec = self.sel.spec.clone();
        let prefix = self.sel.prefix();
        let from = match opts.send_initial_events {
            Some(true) => {
                // Not older than `rv` (or consistent: the store is always
                // fresh), bounded like waitUntilFreshLocked.
                if rv > 0 && !store.wait_for_rv(rv, state.config.too_large_rv_wait).await {
                    let status = Status::too_large_resource_version(rv, store.current_rv());
                    initial.push(error_line(&status));
                    return true;
                }
                WatchFrom::Snapshot
            }
            Some(false) if rv == 0 => WatchFrom::Now,
            _ => WatchFrom::After(rv),
        };
        let registered = match store.watch(&spec, from, &prefix, tx) {
            Ok(r) => r,
            Err(TooOld { oldest }) => {
                let status = Status::expired(format!("too old resource version: {rv} ({oldest})"));
                initial.push(error_line(&status));
                return true;
            }
        };
        match registered.initial {
            Initial::Objects(objects) => {
                for obj in objects.iter().filter(|o| self.sel.matches(o)) {
                    initial.push(self.line(EventType::Added.as_str(), obj));
                }
                self.min_rv = registered.rv;
                self.last_sent = registered.rv;
                if self.bookmarks {
                    initial.push(self.bookmark_line(registered.rv, true));
                }
            }
            Initial::Events(events) => {
                if matches!(from, WatchFrom::Now) {
                    self.min_rv = registered.rv;
                    self.last_sent = registered.rv;
                }
                for event in events {
                    if let Some(line) = self.convert(&event) {
                        initial.push(line);
                    }
                }
            }
        }
        false
    }

    async fn run(mut self, initial: Vec<Bytes>, closing: bool) {
        for line in initial {
            if !self.send(line).await {
                return;
            }
        }
        if closing {
            return;
        }
        let interval = self.state.config.bookmark_interval;
        let mut pre_done = false;
        let mut next = schedule(Instant::now(), interval, self.deadline, pre_done);
        loop {
            tokio::select! {
                biased;
                _ = self.drops.changed() => {
                    let _ = self.out.send(Err("watch dropped by the simulated apiserver".into())).await;
                    return;
                }
                () = tokio::time::sleep_until(self.deadline) => return,
                () = self.out.closed() => return,
                event = self.events.recv() => match event {
                    Some(event) => {
                        if let Some(line) = self.convert(&event) {
                            if !self.send(line).await {
                                return;
                            }
                        }
                    }
                    // Dropped by the store as too slow: end the stream.
                    None => return,
                },
                () = sleep_opt(next.map(|(at, _)| at)), if self.bookmarks => {
                    if next.is_some_and(|(_, pre)| pre) {
                        pre_done = true;
                    }
                    if !self.bookmark().await {
                        return;
                    }
                    next = schedule(Instant::now(), interval, self.deadline, pre_done);
                }
            }
        }
    }

    /// Sends a periodic bookmark at the current RV if it is newer than what
    /// this watcher has seen. Events already queued are delivered first so
    /// that the bookmark never precedes an event it covers.
    async fn bookmark(&mut self) -> bool {
        let rv = self.state.store.current_rv();
        while let Ok(event) = self.events.try_recv() {
            if let Some(line) = self.convert(&event) {
                if !self.send(line).await {
                    return false;
                }
            }
        }
        if rv > self.last_sent {
            let line = self.bookmark_line(rv, false);
            return self.send(line).await;
        }
        true
    }

    async fn send(&mut self, line: Bytes) -> bool {
        self.out.send(Ok(Frame::data(line))).await.is_ok()
    }

    /// `convertToWatchEvent`: ADDED when the object starts matching,
    /// DELETED (previous state, event RV) when it stops, MODIFIED when it
    /// matches before and after.
    fn convert(&mut self, event: &Event) -> Option<Bytes> {
        if event.rv <= self.min_rv {
            return None;
        }
        let cache = &event.cache;
        let cur = event.kind != EventType::Deleted
            && self.sel.matches_cached(&event.object, &cache.object_attrs);
        let old = event
            .prev
            .as_ref()
            .is_some_and(|p| self.sel.matches_cached(p, &cache.prev_attrs));
        let line = match (cur, old) {
            (true, false) => self.event_line(event, EventType::Added),
            (true, true) => self.event_line(event, EventType::Modified),
            (false, true) => match event.kind {
                EventType::Deleted => self.event_line(event, EventType::Deleted),
                _ => {
                    let prev = event.prev.as_ref()?;
                    let obj = object::with_rv(prev, event.rv);
                    self.line("DELETED", &obj)
                }
            },
            (false, false) => return None,
        };
        self.last_sent = event.rv;
        Some(line)
    }

    /// The line for `event.object` as event type `kind`; JSON lines are
    /// encoded once and shared by every watcher.
    fn event_line(&self, event: &Event, kind: EventType) -> Bytes {
        if self.output == Output::Json {
            return event.cache.lines[kind as usize]
                .get_or_init(|| self.line(kind.as_str(), &event.object))
                .clone();
        }
        self.line(kind.as_str(), &event.object)
    }

    /// An event line with `obj` in the negotiated form.
    fn line(&self, kind: &str, obj: &Value) -> Bytes {
        let spec = &self.sel.spec;
        match &self.output {
            Output::Json => json::to_line(&WireEvent { kind, object: obj }),
            Output::Table(version) => {
                let mut meta = Map::new();
                meta.insert(
                    "resourceVersion".into(),
                    Value::String(object::meta_str(obj, "resourceVersion").to_string()),
                );
                let row = table::row(spec, obj, &self.include_object, version);
                let t = table::table(spec, version, meta, vec![row]);
                json::to_line(&WireEvent { kind, object: &t })
            }
            Output::PartialMetadata(version) => {
                let p = table::partial_metadata(obj, version);
                json::to_line(&WireEvent { kind, object: &p })
            }
        }
    }

    /// A BOOKMARK: an object of the watched kind carrying only the RV (and
    /// the initial-events-end annotation for a streaming list).
    fn bookmark_line(&mut self, rv: u64, initial_end: bool) -> Bytes {
        self.last_sent = rv;
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({INITIAL_EVENTS_END: "true"});
        }
        let spec = &self.sel.spec;
        let obj = object::normalize(spec, json!({"metadata": meta}));
        match &self.output {
            Output::Json => json::to_line(&WireEvent {
                kind: "BOOKMARK",
                object: &obj,
            }),
            Output::Table(version) => {
                let mut m = Map::new();
                m.insert("resourceVersion".into(), Value::String(rv.to_string()));
                let t = table::table(spec, version, m, Vec::new());
                json::to_line(&WireEvent {
                    kind: "BOOKMARK",
                    object: &t,
                })
            }
            Output::PartialMetadata(version) => {
                let p = table::partial_metadata(&obj, version);
                json::to_line(&WireEvent {
                    kind: "BOOKMARK",
                    object: &p,
                })
            }
        }
    }
}

/// An ERROR event carrying `status`.
fn error_line(status: &Status) -> Bytes {
    let value = serde_json::to_value(status).unwrap_or(Value::Null);
    json::to_line(&WireEvent {
        kind: "ERROR",
        object: &value,
    })
}

/// When the next bookmark is due (`nextBookmarkTime`): `interval` from now,
/// or 2 s before the deadline if sooner, and never once that has passed.
/// The flag says whether it is the pre-deadline one.
fn schedule(
    now: Instant,
    interval: Duration,
    deadline: Instant,
    pre_done: bool,
) -> Option<(Instant, bool)> {
    if pre_done {
        return None;
    }
    let pre = deadline.checked_sub(Duration::from_secs(2))?;
    if pre <= now {
        return None;
    }
    let heartbeat = now + interval;
    if pre <= heartbeat {
        Some((pre, true))
    } else {
        Some((heartbeat, false))
    }
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bookmark_schedule() {
        let now = Instant::now();
        let minute = Duration::from_secs(60);
        let far = now + Duration::from_secs(1800);
        assert_eq!(
            schedule(now, minute, far, false),
            Some((now + minute, false))
        );
        let soon = now + Duration::from_secs(30);
        assert_eq!(
            schedule(now, minute, soon, false),
            Some((soon - Duration::from_secs(2), true))
        );
        assert_eq!(schedule(now, minute, soon, true), None);
        // A 2 s watch is past its pre-deadline time at once: no bookmarks.
        assert_eq!(
            schedule(now, minute, now + Duration::from_secs(2), false),
            None
        );
    }
}
