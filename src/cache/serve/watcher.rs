//! A watch served from the cache, as a response body that produces
//! frames when the client reads.
//!
//! It first sends the initial state (a snapshot taken when the watcher was
//! registered, as `ADDED` events in key order, then the
//! `k8s.io/initial-events-end` bookmark when asked) or replays the history
//! after the requested RV, then live events. Frames ready together are
//! written together. Nothing runs while the client does not read: its
//! buffer fills, the dispatcher marks it lagging, and it catches up from
//! the history when it reads again.

use std::ops::Bound;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::Response;
use http_body::Frame;
use http_body_util::StreamBody;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::component::woken::WokenOnly;

use apimachinery::body::{Body, BoxError};
use apimachinery::status::Status;

use super::list::{response_with, upper_bound};
use super::view::View;
use crate::cache::encode::{self, ProtoCodec};
use crate::cache::event::{Event, Which};
use crate::cache::filter::Filter;
use crate::cache::negotiate::{Encoding, Representation};
use crate::cache::resource::ResourceCache;
use crate::cache::store::{CatchUp, Delivery, Objects, Start, TooOld, WatcherLink};

/// Bytes gathered into one body frame before it is written.
const CHUNK: usize = 64 * 1024;
/// History events read per catch-up step (under the store lock).
const CATCH_UP_BATCH: usize = 256;

/// The batch window shared by one HTTP/2 connection's held watches
/// (`cache.watchBatchMilliseconds`): the first event held on the
/// connection opens it, and every held watch whose first event arrives
/// while it is open is written when it closes, so that a node's watches (a
/// tier's Services and EndpointSlices) share one poll, TLS record and
/// write of the connection instead of one each. No event is held longer
/// than the batch; one that joins an open window is held less.
#[derive(Debug, Default)]
pub struct BatchWindow(parking_lot::Mutex<Option<Instant>>);

impl BatchWindow {
    /// When an event held from `now` for at most `batch` is written: when
    /// the open window closes, or a new window, opened now, does.
    pub fn close(&self, now: Instant, batch: Duration) -> Instant {
        let mut open = self.0.lock();
        match *open {
            Some(at) if at > now && at <= now + batch => at,
            _ => *open.insert(now + batch),
        }
    }
}

/// How a watch should run.
#[derive(Debug, Clone)]
pub struct WatchParams {
    pub filter: Arc<Filter>,
    pub start: Start,
    /// Key prefix of the watch's scope (`ns/` or empty), for the snapshot.
    pub prefix: String,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// Send the `k8s.io/initial-events-end` bookmark after the snapshot.
    pub initial_events_end: bool,
    /// When the stream ends.
    pub timeout: Duration,
    /// What the events carry, and how they are encoded.
    pub repr: Representation,
    /// The connection's batch window, shared with its other watches (an
    /// HTTP/2 connection's; none over HTTP/1.1, one watch per connection).
    pub window: Option<Arc<BatchWindow>>,
    /// What the watcher sees differently from the cache (`view.rs`).
    pub view: Option<Arc<View>>,
}

enum Phase {
    Snapshot {
        objects: Objects,
        lower: String,
        upper: Option<String>,
        cursor: Option<Arc<str>>,
        rv: u64,
        /// The history after `rv`, sent after the snapshot (`Start::Given`
        /// when the cache had passed its RV already).
        then: Vec<Arc<Event>>,
    },
    Replay {
        events: Vec<Arc<Event>>,
        next: usize,
    },
    Live,
}

struct Watch {
    cache: Arc<ResourceCache>,
    id: u64,
    rx: mpsc::Receiver<Delivery>,
    link: Arc<WatcherLink>,
    filter: Arc<Filter>,
    phase: Phase,
    initial_events_end: bool,
    min_rv: u64,
    /// The resourceVersion the watch's initial events reach: its start,
    /// its snapshot's, or the last event of the history it replayed. A
    /// periodic bookmark is written only beyond it, whatever events were
    /// written since: kube-apiserver's cacher passes a watcher an event
    /// only when newer than that (`cacheWatcher.processInterval`, then
    /// `process`), so a watcher that selects every change still gets its
    /// bookmark a minute, at the last event's resourceVersion.
    initial_rv: u64,
    bookmarks: bool,
    next_bookmark: Option<Instant>,
    /// The bookmark timer fired; the bookmark waits for the events
    /// before it (`settled_rv`).
    bookmark_due: bool,
    interval: Duration,
    /// How long an event waits for more to be written with it
    /// (`cache.watchBatchMilliseconds`).
    batch: Duration,
    window: Option<Arc<BatchWindow>>,
    deadline: Instant,
    /// The timers and the shutdown signal live as long as the watch, so
    /// that waiting for the next event does not register and remove them
    /// again each time. `bookmark_timer` is armed when `next_bookmark` is
    /// set.
    deadline_timer: Pin<Box<Sleep>>,
    bookmark_timer: Pin<Box<Sleep>>,
    /// Polled only when it fires: a token's future locks its mutex on
    /// every poll, and a watch is polled for every event it sends.
    shutdown: WokenOnly<WaitForCancellationFutureOwned>,
    done: bool,
    repr: Representation,
    codec: Option<Arc<ProtoCodec>>,
    view: Option<Arc<View>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.cache.watcher_left(self.id);
    }
}

/// Registers a watcher and returns its streaming response.
///
/// # Errors
/// [`TooOld`] when the start RV is older than the history; the caller
/// answers with an `ERROR` event.
pub fn start(
    cache: Arc<ResourceCache>,
    params: WatchParams,
    shutdown: CancellationToken,
) -> Result<Response<Body>, TooOld> {
    let encoding = params.repr.encoding;
    let watch = Watch::register(cache, params, shutdown)?;
    let stream = futures_util::stream::unfold(watch, |mut w| async move {
        let chunk = w.next_chunk().await?;
        Some((Ok::<_, BoxError>(Frame::data(chunk)), w))
    });
    Ok(response_with(
        Body::new(StreamBody::new(stream)),
        encode::watch_content_type(encoding),
    ))
}

/// A watch response whose only event is `ERROR` with `status`, as the
/// apiserver answers a watch it cannot start (`410 Expired`, `504`).
pub fn error_response(status: &Status, encoding: Encoding) -> Response<Body> {
    let object = encode::status_object(status, encoding);
    response_with(
        apimachinery::body::full(encode::frame(encoding, "ERROR", &object)),
        encode::watch_content_type(encoding),
    )
}

/// The frame `which` of `e` in `repr`, as `view` shows it.
fn event_frame(
    view: Option<&Arc<View>>,
    e: &Arc<Event>,
    which: Which,
    repr: Representation,
    codec: Option<&ProtoCodec>,
) -> Option<Bytes> {
    match view {
        Some(view) => view.event(e).frame(which, repr, codec),
        None => e.frame(which, repr, codec),
    }
}

/// What a live watch writes next.
enum Live {
    /// Events, held for the batch window (`Watch::batched`).
    Events(Bytes),
    /// A bookmark, written at once: it is rare (one a minute, and one
    /// before the timeout), and it is what a consistent read behind this
    /// watch waits for (a node proxy's progress watch of a tier replica:
    /// docs/design.md, "Consistent reads"), so holding it would save
    /// nothing and delay those reads by up to the window. Events that
    /// arrive after it follow it, in order.
    Bookmark(Bytes),
}

/// What a lagging watcher does next.
enum CatchUpStep {
    /// Frames to write (none when it was live again with nothing new).
    Frames(Option<Bytes>),
    /// The cache closed the watcher.
    Closed,
}

// === impl Watch ===

impl Watch {
    /// Registers a watcher with the cache.
    fn register(
        cache: Arc<ResourceCache>,
        params: WatchParams,
        shutdown: CancellationToken,
    ) -> Result<Watch, TooOld> {
        let reg = {
            let mut state = cache.lock();
            let reg = state.register(params.filter.clone(), params.start)?;
            cache.metrics.watchers.set(state.watcher_count() as i64);
            reg
        };
        let now = Instant::now();
        let deadline = now + params.timeout;
        let interval = cache.read.bookmark_interval;
        // Only watches a change of any object may reach (a resource, a
        // namespace, a label selector) are held: those are the fan-out
        // that costs CPU per watcher. One pinned to an object or a node's
        // objects (kubelet's pods, its Node, a Secret) gets few events,
        // and they are the ones a pod's start waits for.
        let pinned = ["metadata.name", "spec.nodeName"]
            .iter()
            .any(|f| params.filter.fields.requires_exact_match(f).is_some());
        let batch = if pinned {
            Duration::ZERO
        } else {
            cache.read.watch_batch
        };
        let (phase, initial_rv) = match reg.snapshot {
            Some((objects, rv)) => {
                let upper = upper_bound(&params.prefix);
                (
                    Phase::Snapshot {
                        objects,
                        lower: params.prefix.clone(),
                        upper,
                        cursor: None,
                        rv,
                        then: reg.replay,
                    },
                    rv,
                )
            }
            None => (
                Phase::Replay {
                    events: reg.replay,
                    next: 0,
                },
                reg.min_rv,
            ),
        };
        let mut watch = Watch {
            cache,
            id: reg.id,
            rx: reg.rx,
            link: reg.link,
            filter: params.filter,
            phase,
            initial_events_end: params.initial_events_end,
            min_rv: reg.min_rv,
            initial_rv,
            bookmarks: params.bookmarks,
            next_bookmark: None,
            bookmark_due: false,
            interval,
            batch,
            window: params.window,
            deadline,
            deadline_timer: Box::pin(tokio::time::sleep_until(deadline)),
            bookmark_timer: Box::pin(tokio::time::sleep_until(deadline)),
            // A child token: polled on every wait of every watcher, the
            // server-wide token's mutex would be contended by all of them.
            shutdown: WokenOnly::new(shutdown.child_token().cancelled_owned()),
            done: false,
            repr: params.repr,
            codec: None,
            view: params.view,
        };
        watch.codec = watch.cache.info().codec.clone();
        watch.set_next_bookmark(now);
        Ok(watch)
    }

    /// The next bookmark time after `now`: one interval on, or two seconds
    /// before the deadline if sooner; none once that has passed (the
    /// apiserver's `cacheWatcher.nextBookmarkTime`).
    fn bookmark_after(&self, now: Instant) -> Option<Instant> {
        if !self.bookmarks {
            return None;
        }
        let heartbeat = now + self.interval;
        let pre_timeout = self.deadline.checked_sub(Duration::from_secs(2))?;
        let at = heartbeat.min(pre_timeout);
        (at > now).then_some(at)
    }

    /// Schedules the next bookmark after `now`.
    fn set_next_bookmark(&mut self, now: Instant) {
        self.next_bookmark = self.bookmark_after(now);
        if let Some(at) = self.next_bookmark {
            self.bookmark_timer.as_mut().reset(at);
        }
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        loop {
            match &mut self.phase {
                Phase::Snapshot { .. } => {
                    if let Some(chunk) = self.snapshot_chunk() {
                        return Some(chunk);
                    }
                }
                Phase::Replay { events, next } => {
                    let mut buf = BytesMut::new();
                    while *next < events.len() && buf.len() < CHUNK {
                        let e = &events[*next];
                        *next += 1;
                        if let Some(which) = e.which_for(&self.filter) {
                            match event_frame(
                                self.view.as_ref(),
                                e,
                                which,
                                self.repr,
                                self.codec.as_deref(),
                            ) {
                                Some(f) => buf.extend_from_slice(&f),
                                None => {
                                    self.done = true;
                                    break;
                                }
                            }
                        }
                        self.initial_rv = self.initial_rv.max(e.rv);
                    }
                    if *next >= events.len() {
                        self.phase = Phase::Live;
                    }
                    if !buf.is_empty() {
                        return Some(buf.freeze());
                    }
                }
                Phase::Live => {
                    return match self.live_chunk().await? {
                        Live::Events(chunk) => Some(self.batched(chunk).await),
                        Live::Bookmark(chunk) => Some(chunk),
                    };
                }
            }
        }
    }

    /// The next chunk of initial `ADDED` events; `None` once the snapshot
    /// is exhausted and the phase moved on with nothing left to write.
    fn snapshot_chunk(&mut self) -> Option<Bytes> {
        let Phase::Snapshot {
            objects,
            lower,
            upper,
            cursor,
            rv,
            then,
        } = &mut self.phase
        else {
            return None;
        };
        let mut buf = BytesMut::new();
        let lower_bound = match cursor {
            Some(c) => Bound::Excluded(&**c),
            None => Bound::Included(lower.as_str()),
        };
        let upper_bound = match upper {
            Some(u) => Bound::Excluded(u.as_str()),
            None => Bound::Unbounded,
        };
        let mut last = None;
        let mut exhausted = true;
        for (key, o) in objects.range::<_, str>((lower_bound, upper_bound)) {
            if buf.len() >= CHUNK {
                exhausted = false;
                break;
            }
            last = Some(key.clone());
            if self.filter.matches(o) {
                let viewed;
                let o = match &self.view {
                    Some(view) => {
                        viewed = view.object(o);
                        &viewed
                    }
                    None => o,
                };
                if self.repr == Representation::JSON {
                    buf.extend_from_slice(b"{\"type\":\"ADDED\",\"object\":");
                    buf.extend_from_slice(o.json());
                    buf.extend_from_slice(b"}\n");
                    continue;
                }
                match encode::object_bytes(o, self.codec.as_deref(), self.repr) {
                    Some(object) => {
                        buf.extend_from_slice(&encode::frame(self.repr.encoding, "ADDED", &object));
                    }
                    None => {
                        self.done = true;
                        return (!buf.is_empty()).then(|| buf.freeze());
                    }
                }
            }
        }
        if let Some(k) = last {
            *cursor = Some(k);
        }
        if exhausted {
            let rv = *rv;
            if self.initial_events_end {
                match self.cache.bookmark_frame(rv, true, self.repr) {
                    Some(b) => buf.extend_from_slice(&b),
                    None => self.done = true,
                }
            }
            self.initial_rv = rv;
            let then = std::mem::take(then);
            self.phase = if then.is_empty() {
                Phase::Live
            } else {
                Phase::Replay {
                    events: then,
                    next: 0,
                }
            };
        }
        (!buf.is_empty()).then(|| buf.freeze())
    }

    /// The frames of `first` and of the deliveries already waiting, up to
    /// [`CHUNK`] bytes. A lone frame is returned as it is, shared with every
    /// other watcher, not copied.
    fn gather(&mut self, first: Option<Delivery>) -> Option<Bytes> {
        let mut lone: Option<Bytes> = None;
        let mut buf = BytesMut::new();
        let mut next = first;
        loop {
            let d = match next.take() {
                Some(d) => d,
                None => {
                    let held = lone.as_ref().map_or(buf.len(), Bytes::len);
                    if held >= CHUNK {
                        break;
                    }
                    match self.rx.try_recv() {
                        Ok(d) => d,
                        Err(_) => break,
                    }
                }
            };
            if d.rv <= self.min_rv {
                continue;
            }
            let Some(frame) = self.frame_of(&d) else {
                break;
            };
            match lone.take() {
                Some(prev) => {
                    buf.extend_from_slice(&prev);
                    buf.extend_from_slice(&frame);
                }
                None if buf.is_empty() => lone = Some(frame),
                None => buf.extend_from_slice(&frame),
            }
        }
        lone.or_else(|| (!buf.is_empty()).then(|| buf.freeze()))
    }

    /// One step of a lagging watcher's catch-up: first what its buffer
    /// still holds, then the next frames from the history.
    ///
    /// The buffer can have filled again since it was last drained (the
    /// dispatcher marks the watcher lagging when a delivery does not fit),
    /// and what it holds is older than the lag, so it goes first. It is
    /// drained under the store lock, with the history read: the dispatcher
    /// sends only under that lock and not while the watcher lags, so no
    /// delivery can slip in between.
    fn catch_up(&mut self) -> CatchUpStep {
        let mut pending = Vec::new();
        let step = {
            let mut state = self.cache.lock();
            while let Ok(d) = self.rx.try_recv() {
                pending.push(d);
            }
            state.catch_up(self.id, CATCH_UP_BATCH, std::time::Instant::now())
        };
        let mut buf = BytesMut::new();
        for d in pending {
            self.push(&mut buf, d);
        }
        match step {
            CatchUp::Closed => return CatchUpStep::Closed,
            CatchUp::Frames { frames, .. } => {
                for d in frames {
                    self.push(&mut buf, d);
                }
            }
        }
        CatchUpStep::Frames((!buf.is_empty()).then(|| buf.freeze()))
    }

    fn push(&mut self, buf: &mut BytesMut, d: Delivery) {
        if d.rv > self.min_rv
            && let Some(frame) = self.frame_of(&d)
        {
            buf.extend_from_slice(&frame);
        }
    }

    /// The frame of a delivery in the watch's representation; `None` (and
    /// the stream ends) when the object cannot be encoded so: the client
    /// watches again, and passes through.
    fn frame_of(&mut self, d: &Delivery) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let f = event_frame(
            self.view.as_ref(),
            &d.event,
            d.which,
            self.repr,
            self.codec.as_deref(),
        );
        if f.is_none() {
            self.done = true;
        }
        f
    }

    /// `first`, and the frames that reach the watcher until the
    /// connection's batch window closes, at most [`Watch::batch`] after it
    /// (up to [`CHUNK`] bytes), as one chunk: one body frame, so one
    /// wakeup, one TLS record and one write of the connection for all of
    /// them and the connection's other watches held in the same window.
    /// The watch sleeps meanwhile instead of receiving each delivery, so
    /// the deliveries do not wake it either; a watcher whose buffer fills
    /// meanwhile is marked lagging and catches up from the history, as a
    /// slow one does.
    async fn batched(&mut self, first: Bytes) -> Bytes {
        if self.batch.is_zero() || first.len() >= CHUNK || self.done {
            return first;
        }
        let now = Instant::now();
        let close = match &self.window {
            Some(window) => window.close(now, self.batch),
            None => now + self.batch,
        };
        let until = close.min(self.deadline);
        tokio::select! {
            biased;
            _ = &mut self.shutdown => {
                self.done = true;
                return first;
            }
            _ = tokio::time::sleep_until(until) => {}
        }
        match self.gather(None) {
            Some(more) => {
                let mut buf = BytesMut::with_capacity(first.len() + more.len());
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&more);
                buf.freeze()
            }
            None => first,
        }
    }

    /// The cache's resourceVersion, when every event up to it that this
    /// watcher selects has been written: read under the store lock with
    /// the buffer empty and the watcher not lagging (the dispatcher sends
    /// only under that lock). `None` while deliveries wait.
    ///
    /// A bookmark at a resourceVersion read otherwise (between finding
    /// the buffer empty and reading it, the reflector can apply and
    /// dispatch an event) could overtake that event. kube-apiserver's
    /// cacher sends bookmarks through the watcher's input channel, in
    /// order with the events (`cacheWatcher.processInterval`); a client
    /// takes a bookmark's resourceVersion as its own, and a cache behind
    /// this one (a node proxy behind a tier) ignores an event at or below
    /// it as a repeat, so the event would be lost.
    fn settled_rv(&self) -> Option<u64> {
        let state = self.cache.lock();
        (self.rx.is_empty() && !self.link.is_lagging()).then(|| state.rv())
    }

    async fn live_chunk(&mut self) -> Option<Live> {
        loop {
            if let Some(chunk) = self.gather(None) {
                return Some(Live::Events(chunk));
            }
            if self.done {
                return None;
            }
            if self.link.is_closed() {
                self.done = true;
                return None;
            }
            if self.link.is_lagging() {
                match self.catch_up() {
                    CatchUpStep::Closed => {
                        self.done = true;
                        return None;
                    }
                    CatchUpStep::Frames(Some(chunk)) => return Some(Live::Events(chunk)),
                    CatchUpStep::Frames(None) => continue,
                }
            }
            // A bookmark that came due is written once nothing is waiting
            // for this watcher: see `settled_rv`.
            if self.bookmark_due
                && let Some(rv) = self.settled_rv()
            {
                self.bookmark_due = false;
                // As the cacher: a bookmark beyond the initial events,
                // even at the resourceVersion of the last event written
                // (or of the last bookmark) when nothing moved since.
                if rv > self.initial_rv {
                    return self
                        .cache
                        .bookmark_frame(rv, false, self.repr)
                        .map(Live::Bookmark);
                }
            }
            // The deadline is checked here as well as polled below: with
            // the buffer polled first, a watcher that always has an event
            // waiting would otherwise never see its timer.
            if self.deadline_timer.is_elapsed() {
                self.done = true;
                return None;
            }
            let bookmark_armed = self.next_bookmark.is_some();
            // The buffer first: an event ready is written without polling
            // the shutdown signal and the timers, whose wakers are still
            // registered from the last time the buffer was empty (one poll
            // of each per idle period instead of per event).
            tokio::select! {
                biased;
                d = self.rx.recv() => match d {
                    Some(d) => {
                        if let Some(chunk) = self.gather(Some(d)) {
                            return Some(Live::Events(chunk));
                        }
                    }
                    None => {
                        self.done = true;
                        return None;
                    }
                },
                _ = &mut self.shutdown => {
                    self.done = true;
                    return None;
                }
                _ = self.deadline_timer.as_mut() => {
                    self.done = true;
                    return None;
                }
                _ = self.bookmark_timer.as_mut(), if bookmark_armed => {
                    self.set_next_bookmark(Instant::now());
                    self.bookmark_due = true;
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "watcher_tests.rs"]
mod tests;
