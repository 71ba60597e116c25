//! Lists from the cache: selecting a page from a snapshot and writing it as
//! the apiserver does, byte for byte: `{"kind":"PodList","apiVersion":"v1",
//! "metadata":{"resourceVersion":...,"continue":...,"remainingItemCount":...},
//! "items":[...]}` with items in storage-key order and, for built-in types,
//! without `kind`/`apiVersion`.
//!
//! Paging follows `Cacher.GetList`: with no selector, `remainingItemCount`
//! is reported; with one, a page is full after `limit` matches and a
//! continue token is issued as soon as any further object exists.

use std::ops::Bound;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt, stream};
use http::{HeaderValue, Response, header};
use http_body::Frame;
use http_body_util::StreamBody;

use apimachinery::body::{Body, BoxError};

use apimachinery::protobuf;

use super::continue_token;
use crate::cache::encode;
use crate::cache::filter::Filter;
use crate::cache::negotiate::{Encoding, MetaVersion, Representation};
use crate::cache::object::CachedObject;
use crate::cache::resource::ResourceInfo;
use crate::cache::store::{Keys, Objects};

/// Bytes per body frame: large enough to amortize framing, small enough to
/// keep a large list from sitting whole in memory.
const CHUNK: usize = 64 * 1024;

/// The size of a protobuf list's segments (see `protobuf_object_list`).
const SEGMENT: usize = 1 << 20;

/// One page of a list.
#[derive(Debug, Default)]
pub struct Page {
    pub items: Vec<Arc<CachedObject>>,
    pub continue_token: Option<String>,
    pub remaining: Option<i64>,
}

/// The key prefix of a list's scope: `ns/` in a namespace, empty across
/// namespaces or for cluster-scoped resources.
pub fn scope_prefix(namespace: Option<&str>) -> String {
    namespace.map(|ns| format!("{ns}/")).unwrap_or_default()
}

/// Whether the scope of `prefix` (a namespace's, or with `""` the whole
/// resource's) holds at least `n` objects; walks at most `n` of them.
pub fn scope_holds_at_least(objects: &Objects, prefix: &str, n: usize) -> bool {
    if prefix.is_empty() {
        return objects.len() >= n;
    }
    let upper = upper_bound(prefix);
    objects
        .range::<_, str>((Bound::Included(prefix), scope_end(&upper)))
        .take(n)
        .count()
        >= n
}

/// Selects a page from `objects`. `start` is a continue token's key
/// relative to the scope; `limit <= 0` means everything; `rv` is the
/// snapshot's RV, written into the continue token.
pub fn select(
    objects: &Objects,
    filter: &Filter,
    prefix: &str,
    start: Option<&str>,
    limit: i64,
    rv: u64,
) -> Page {
    let lower = format!("{prefix}{}", start.unwrap_or(""));
    let upper = upper_bound(prefix);
    let range = || objects.range::<_, str>((Bound::Included(lower.as_str()), scope_end(&upper)));
    let limit = usize::try_from(limit).unwrap_or(0);
    let mut page = Page::default();
    let mut has_more = false;
    if filter.is_unfiltered() {
        let mut total = 0usize;
        for (_, o) in range() {
            total += 1;
            if limit == 0 || page.items.len() < limit {
                page.items.push(o.clone());
            }
        }
        if limit > 0 && total > limit {
            has_more = true;
            page.remaining = Some((total - limit) as i64);
        }
    } else {
        for (_, o) in range() {
            if limit > 0 && page.items.len() >= limit {
                has_more = true;
                break;
            }
            if filter.matches(o) {
                page.items.push(o.clone());
            }
        }
    }
    if has_more {
        continue_after_last(&mut page, prefix, rv);
    }
    page
}

/// Sets a full page's continue token: its last item's key, relative to the
/// scope of `prefix`, at `rv`.
fn continue_after_last(page: &mut Page, prefix: &str, rv: u64) {
    if let Some(last) = page.items.last() {
        let relative = last.key().get(prefix.len()..).unwrap_or(last.key());
        page.continue_token = Some(continue_token::encode(rv, relative));
    }
}

/// The exclusive upper bound of the scope of `prefix` (the upper end of
/// [`upper_bound`]'s key, or none).
fn scope_end(upper: &Option<String>) -> Bound<&str> {
    match upper {
        Some(u) => Bound::Excluded(u.as_str()),
        None => Bound::Unbounded,
    }
}

/// [`select`], walking only `candidates` (the keys under the index the
/// filter pins: `State::candidates`) instead of every object of the scope,
/// with the same page: the same items, and a continue token when a full
/// page is followed by any object of the scope, selected or not, as the
/// walk gives it (and kube-apiserver's cache, which lists a node's pods
/// from its `spec.nodeName` index).
pub fn select_in(
    objects: &Objects,
    candidates: &Keys,
    filter: &Filter,
    prefix: &str,
    start: Option<&str>,
    limit: i64,
    rv: u64,
) -> Page {
    let lower = format!("{prefix}{}", start.unwrap_or(""));
    let upper_key = upper_bound(prefix);
    let limit = usize::try_from(limit).unwrap_or(0);
    let mut page = Page::default();
    let mut full_at = None;
    let first = candidates.partition_point(|k| **k < *lower);
    let below_upper = |k: &&Arc<str>| match &upper_key {
        Some(u) => ***k < **u,
        None => true,
    };
    for key in candidates[first..].iter().take_while(below_upper) {
        let Some(o) = objects.get(key) else {
            continue;
        };
        if filter.matches(o) {
            page.items.push(o.clone());
            if limit > 0 && page.items.len() >= limit {
                full_at = Some(key);
                break;
            }
        }
    }
    let has_more = full_at.is_some_and(|key| {
        objects
            .range::<_, str>((Bound::Excluded(&**key), scope_end(&upper_key)))
            .next()
            .is_some()
    });
    if has_more {
        continue_after_last(&mut page, prefix, rv);
    }
    page
}

/// The page of a list that reads one key (`Filter::single_key`): that
/// object if it exists, lies in the scope of `prefix` and is selected; no
/// continue token or remaining count, as kube-apiserver's single-key read
/// gives none. Walks nothing.
pub fn select_one(objects: &Objects, filter: &Filter, prefix: &str, key: &str) -> Page {
    Page {
        items: objects
            .get(key)
            .filter(|o| key.starts_with(prefix) && filter.matches(o))
            .cloned()
            .into_iter()
            .collect(),
        ..Page::default()
    }
}

/// The smallest key greater than every key with `prefix`, or `None` when
/// the prefix is empty.
pub(crate) fn upper_bound(prefix: &str) -> Option<String> {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0x7f {
            bytes.push(last + 1);
            return String::from_utf8(bytes).ok();
        }
    }
    None
}

/// The JSON list's `metadata`: `{"resourceVersion":...,"continue":...,
/// "remainingItemCount":...}`.
fn json_list_meta(out: &mut BytesMut, page: &Page, rv: u64) {
    out.extend_from_slice(b"{\"resourceVersion\":\"");
    out.extend_from_slice(rv.to_string().as_bytes());
    out.extend_from_slice(b"\"");
    if let Some(token) = &page.continue_token {
        out.extend_from_slice(b",\"continue\":\"");
        out.extend_from_slice(token.as_bytes());
        out.extend_from_slice(b"\"");
    }
    if let Some(n) = page.remaining {
        out.extend_from_slice(b",\"remainingItemCount\":");
        out.extend_from_slice(n.to_string().as_bytes());
    }
    out.extend_from_slice(b"}");
}

/// The list response in `repr`, streamed in chunks; `None` when an item
/// cannot be encoded so (the read passes through).
pub fn response(
    page: Page,
    info: &ResourceInfo,
    rv: u64,
    repr: Representation,
) -> Option<Response<Body>> {
    match repr.encoding {
        Encoding::Json => Some(json_list(page, info, rv, repr.metadata)),
        Encoding::Protobuf => protobuf_list(page, info, rv, repr.metadata),
    }
}

fn json_list(
    page: Page,
    info: &ResourceInfo,
    rv: u64,
    metadata: Option<MetaVersion>,
) -> Response<Body> {
    let mut head = BytesMut::with_capacity(256);
    match metadata {
        None => {
            head.extend_from_slice(b"{\"kind\":\"");
            head.extend_from_slice(info.list_kind().as_bytes());
            head.extend_from_slice(b"\",\"apiVersion\":\"");
            head.extend_from_slice(info.api_version.as_bytes());
        }
        Some(v) => {
            head.extend_from_slice(b"{\"kind\":\"PartialObjectMetadataList\",\"apiVersion\":\"");
            head.extend_from_slice(v.api_version().as_bytes());
        }
    }
    head.extend_from_slice(b"\",\"metadata\":");
    json_list_meta(&mut head, &page, rv);
    let strip = info.strip_item_type_meta;
    let items = page.items;
    if metadata.is_some() && items.is_empty() {
        // The apiserver builds a PartialObjectMetadataList by appending to
        // a nil slice, which Go's encoding/json writes as `null`
        // (handlers/response.go asPartialObjectMetadataList).
        head.extend_from_slice(b",\"items\":null}\n");
        return json_response(apimachinery::body::full(head.freeze()));
    }
    head.extend_from_slice(b",\"items\":[");
    let mut next = 0usize;
    let mut buf = head;
    let mut done = false;
    let chunks = std::iter::from_fn(move || {
        if done {
            return None;
        }
        while next < items.len() && buf.len() < CHUNK {
            if next > 0 {
                buf.extend_from_slice(b",");
            }
            match metadata {
                None => items[next].write_item(&mut buf, strip),
                Some(v) => {
                    buf.extend_from_slice(encode::metadata_json_head(v));
                    buf.extend_from_slice(&items[next].metadata_json());
                    buf.extend_from_slice(b"}");
                }
            }
            next += 1;
        }
        if next == items.len() {
            buf.extend_from_slice(b"]}\n");
            done = true;
        }
        let out: Bytes = buf.split().freeze();
        Some(Ok::<_, BoxError>(Frame::data(out)))
    });
    json_response(Body::new(StreamBody::new(stream::iter(chunks))))
}

/// `metav1.ListMeta`: `selfLink` (always written, empty),
/// `resourceVersion`, `continue`, and `remainingItemCount` when set.
fn proto_list_meta(page: &Page, rv: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(64);
    protobuf::put_bytes(&mut m, 1, b"");
    protobuf::put_bytes(&mut m, 2, rv.to_string().as_bytes());
    protobuf::put_bytes(
        &mut m,
        3,
        page.continue_token.as_deref().unwrap_or("").as_bytes(),
    );
    if let Some(n) = page.remaining {
        protobuf::put_varint(&mut m, 4, n as u64);
    }
    m
}

/// A protobuf list: the envelope around the typed list message, `metadata`
/// (field 1) and `items` (field 2) — for `meta.k8s.io/v1beta1`'s
/// `PartialObjectMetadataList`, `items` is field 1 and `metadata` 2, and
/// the Go marshaller writes them in field order.
fn protobuf_list(
    page: Page,
    info: &ResourceInfo,
    rv: u64,
    metadata: Option<MetaVersion>,
) -> Option<Response<Body>> {
    let codec = info.codec.as_ref()?;
    if metadata.is_none() {
        return protobuf_object_list(page, info, codec, rv);
    }
    let mut items: Vec<Bytes> = Vec::with_capacity(page.items.len());
    for o in &page.items {
        let form = codec.form(o)?;
        items.push(match metadata {
            None => form.raw(),
            Some(_) => form.metadata(),
        });
    }
    let meta = proto_list_meta(&page, rv);
    // A metadata item is `PartialObjectMetadata{metadata: 1}` around the
    // ObjectMeta bytes.
    let item_len = move |b: &Bytes| match metadata {
        None => b.len(),
        Some(_) => protobuf::field_len(1, b.len()),
    };
    let (items_field, meta_field) = match metadata {
        Some(MetaVersion::V1beta1) => (1, 2),
        _ => (2, 1),
    };
    let list_len = protobuf::field_len(meta_field, meta.len())
        + items
            .iter()
            .map(|b| protobuf::field_len(items_field, item_len(b)))
            .sum::<usize>();
    let (api_version, kind) = match metadata {
        None => (info.api_version.clone(), info.list_kind()),
        Some(v) => (
            v.api_version().to_string(),
            "PartialObjectMetadataList".to_string(),
        ),
    };
    let head = protobuf::envelope_head(&api_version, &kind, list_len);
    let mut meta_field_bytes = Vec::with_capacity(meta.len() + 4);
    protobuf::put_bytes(&mut meta_field_bytes, meta_field, &meta);
    let mut buf = BytesMut::with_capacity(CHUNK + 1024);
    buf.extend_from_slice(&head);
    if meta_field == 1 {
        buf.extend_from_slice(&meta_field_bytes);
    }
    let mut next = 0usize;
    let mut done = false;
    let chunks = std::iter::from_fn(move || {
        if done {
            return None;
        }
        while next < items.len() && buf.len() < CHUNK {
            let item = &items[next];
            let mut h = Vec::with_capacity(12);
            protobuf::put_header(&mut h, items_field, item_len(item));
            if metadata.is_some() {
                protobuf::put_header(&mut h, 1, item.len());
            }
            buf.extend_from_slice(&h);
            buf.extend_from_slice(item);
            next += 1;
        }
        if next == items.len() {
            if meta_field == 2 {
                buf.extend_from_slice(&meta_field_bytes);
            }
            buf.extend_from_slice(protobuf::ENVELOPE_TAIL);
            done = true;
        }
        let out: Bytes = buf.split().freeze();
        Some(Ok::<_, BoxError>(Frame::data(out)))
    });
    Some(response_with(
        Body::new(StreamBody::new(stream::iter(chunks))),
        protobuf::CONTENT_TYPE,
    ))
}

/// A protobuf list of whole objects: the items written into segments of
/// about [`SEGMENT`] bytes, each a version's kept form or encoded for this
/// list alone (`ProtoCodec::write_item`), so the list holds its body and
/// no per-item form.
///
/// The envelope carries the list's length before its items (the
/// apiserver's `runtime/serializer/protobuf` writes `Size()` first). When
/// every item's length is already known (`CachedObject::proto_len`) and
/// the list is large, it is sent as it is encoded
/// ([`streamed_protobuf_list`]); otherwise it is written whole first.
fn protobuf_object_list(
    page: Page,
    info: &ResourceInfo,
    codec: &Arc<encode::ProtoCodec>,
    rv: u64,
) -> Option<Response<Body>> {
    let total: usize = page.items.iter().map(|o| o.json().len()).sum();
    let mut meta = Vec::with_capacity(64);
    protobuf::put_bytes(&mut meta, 1, &proto_list_meta(&page, rv));
    let head = |items_len: usize| {
        let mut head =
            protobuf::envelope_head(&info.api_version, &info.list_kind(), meta.len() + items_len);
        head.extend_from_slice(&meta);
        Bytes::from(head)
    };
    if total >= STREAMED_LIST_BYTES
        && let Some(items_len) = measured_items_len(&page.items)
    {
        let head = head(items_len);
        return Some(streamed_protobuf_list(
            head,
            page.items,
            codec.clone(),
            encoding_threads(total),
        ));
    }
    let segments = encode_items(&page.items, codec, encoding_threads(total))?;
    let head = head(segments.iter().map(Bytes::len).sum());
    let chunks = std::iter::once(head)
        .chain(segments)
        .chain(std::iter::once(Bytes::from_static(protobuf::ENVELOPE_TAIL)))
        .filter(|b| !b.is_empty())
        .map(|b| Ok::<_, BoxError>(Frame::data(b)));
    Some(response_with(
        Body::new(StreamBody::new(stream::iter(chunks))),
        protobuf::CONTENT_TYPE,
    ))
}

/// JSON bytes of a protobuf list from which, when its items' lengths are
/// known, it is sent as it is encoded: below, encoding it whole takes a
/// few milliseconds.
const STREAMED_LIST_BYTES: usize = 2 * SEGMENT;

/// The bytes of `items` as list items (field 2), when every item's
/// protobuf length is known.
fn measured_items_len(items: &[Arc<CachedObject>]) -> Option<usize> {
    items
        .iter()
        .map(|o| o.proto_len().map(|n| protobuf::field_len(2, n)))
        .sum()
}

/// A protobuf list whose length is known (`head` is its envelope's head
/// and `metadata`), sent as it is encoded: `parts` blocking tasks each
/// encode a run of about equal JSON bytes into segments of at most about
/// [`SEGMENT`] bytes, and the body sends the runs in order, each segment
/// as soon as it is written, so that sending overlaps encoding.
///
/// An item whose encoding is not the length recorded, which the same JSON
/// cannot give, ends the body with an error (the client sees a cut
/// response, never a wrong one). A client that goes away stops the
/// encoding at its next segment.
fn streamed_protobuf_list(
    head: Bytes,
    items: Vec<Arc<CachedObject>>,
    codec: Arc<encode::ProtoCodec>,
    parts: usize,
) -> Response<Body> {
    let items: Arc<[Arc<CachedObject>]> = items.into();
    let runs = runs(&items, parts);
    let receivers: Vec<_> = runs
        .into_iter()
        .map(|run| {
            let (items, codec) = (items.clone(), codec.clone());
            spawn_run(move |tx| encode_run(&items[run], &codec, tx))
        })
        .collect();
    let items = stream::iter(receivers).flat_map(|rx| {
        stream::unfold(rx, |mut rx| async move {
            let next = rx.recv().await?;
            Some((next, rx))
        })
    });
    let body = stream::once(std::future::ready(Ok(head)))
        .chain(items)
        .chain(stream::once(std::future::ready(Ok(Bytes::from_static(
            protobuf::ENVELOPE_TAIL,
        )))))
        .map(|b| b.map(Frame::data));
    response_with(Body::new(StreamBody::new(body)), protobuf::CONTENT_TYPE)
}

/// A segment of a streamed list, or why the list is cut.
type Segments = tokio::sync::mpsc::UnboundedSender<Result<Bytes, BoxError>>;

/// Runs `encode` on a blocking thread, sending segments on the channel it
/// returns; a panic sends an error, so that the body ends in an error
/// rather than short of its stated length.
fn spawn_run(
    encode: impl FnOnce(&Segments) + Send + 'static,
) -> tokio::sync::mpsc::UnboundedReceiver<Result<Bytes, BoxError>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::task::spawn_blocking(move || {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| encode(&tx))).is_err() {
            let _ = tx.send(Err("encoding a protobuf list panicked".into()));
        }
    });
    rx
}

/// Encodes `items` as list items into segments sent on `tx`, checking
/// each against its recorded length.
fn encode_run(items: &[Arc<CachedObject>], codec: &encode::ProtoCodec, tx: &Segments) {
    let mut segment: Vec<u8> = Vec::with_capacity(SEGMENT);
    let mut scratch = Vec::new();
    for o in items {
        let Some(expected) = o.proto_len().map(|n| protobuf::field_len(2, n)) else {
            let _ = tx.send(Err("a protobuf list item lost its length".into()));
            return;
        };
        if !segment.is_empty() && segment.len() + expected > SEGMENT {
            let full = std::mem::replace(&mut segment, Vec::with_capacity(SEGMENT));
            if tx.send(Ok(Bytes::from(full))).is_err() {
                return;
            }
        }
        let start = segment.len();
        if !codec.write_item(o, 2, &mut segment, &mut scratch) || segment.len() - start != expected
        {
            let _ = tx.send(Err(
                "a protobuf list item's encoding differs from its recorded length".into(),
            ));
            return;
        }
    }
    if !segment.is_empty() {
        let _ = tx.send(Ok(segment_bytes(segment)));
    }
}

/// JSON bytes of a protobuf list from which its items are encoded on
/// more than one thread (a list of 10,000 pods holds about 46 MB).
const PARALLEL_LIST_BYTES: usize = 4 << 20;

/// Threads to encode a protobuf list of `json_bytes` on: one below
/// [`PARALLEL_LIST_BYTES`], else one per core (at most 4).
fn encoding_threads(json_bytes: usize) -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if json_bytes < PARALLEL_LIST_BYTES {
        return 1;
    }
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from));
    cores
        .clamp(1, 4)
        .min(json_bytes / (PARALLEL_LIST_BYTES / 2))
}

/// `items` as list items (field 2), in segments, encoded by `parts`
/// threads (this one included), each on a run of about equal JSON bytes,
/// concatenated in order; `None` when one cannot be encoded.
fn encode_items(
    items: &[Arc<CachedObject>],
    codec: &encode::ProtoCodec,
    parts: usize,
) -> Option<Vec<Bytes>> {
    if parts <= 1 {
        return protobuf_segments(items, codec);
    }
    let runs: Vec<&[Arc<CachedObject>]> =
        runs(items, parts).into_iter().map(|r| &items[r]).collect();
    let (first, rest) = runs.split_first()?;
    let encoded: Vec<Option<Vec<Bytes>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = rest
            .iter()
            .map(|run| scope.spawn(|| protobuf_segments(run, codec)))
            .collect();
        let mut out = vec![protobuf_segments(first, codec)];
        out.extend(handles.into_iter().map(|h| h.join().ok().flatten()));
        out
    });
    let mut segments = Vec::new();
    for run in encoded {
        segments.extend(run?);
    }
    Some(segments)
}

/// `items` split into `parts` runs (at least one) of about equal JSON
/// bytes, in order.
fn runs(items: &[Arc<CachedObject>], parts: usize) -> Vec<std::ops::Range<usize>> {
    let total: usize = items.iter().map(|o| o.json().len()).sum();
    let mut runs = Vec::with_capacity(parts.max(1));
    let (mut start, mut acc) = (0, 0);
    for (i, o) in items.iter().enumerate() {
        acc += o.json().len();
        if acc * parts >= total * (runs.len() + 1) && runs.len() + 1 < parts {
            runs.push(start..i + 1);
            start = i + 1;
        }
    }
    runs.push(start..items.len());
    runs
}

/// `items` as list items (field 2) written into segments of about
/// [`SEGMENT`] bytes; `None` when one cannot be encoded.
fn protobuf_segments(
    items: &[Arc<CachedObject>],
    codec: &encode::ProtoCodec,
) -> Option<Vec<Bytes>> {
    // Each segment sized for what is left, by the items' JSON (their
    // protobuf is smaller): a node's list of a few objects takes kilobytes,
    // not a whole segment.
    let mut left: usize = items.iter().map(|o| o.json().len()).sum();
    let sized = |left: usize| Vec::with_capacity(left.min(SEGMENT));
    let mut segments: Vec<Bytes> = Vec::new();
    let mut segment: Vec<u8> = sized(left);
    let mut scratch = Vec::new();
    for o in items {
        if !segment.is_empty() && segment.len() + o.json().len() > SEGMENT {
            let full = std::mem::replace(&mut segment, sized(left));
            segments.push(segment_bytes(full));
        }
        left -= o.json().len();
        if !codec.write_item(o, 2, &mut segment, &mut scratch) {
            return None;
        }
    }
    segments.push(segment_bytes(segment));
    Some(segments)
}

/// A written segment as `Bytes`, without holding much more memory than
/// its length while it waits to be sent.
fn segment_bytes(mut segment: Vec<u8>) -> Bytes {
    if segment.capacity() - segment.len() > segment.len() / 4 {
        segment.shrink_to_fit();
    }
    Bytes::from(segment)
}

/// A `200` with the apiserver's JSON headers.
pub fn json_response(body: Body) -> Response<Body> {
    response_with(body, "application/json")
}

/// A `200` with the apiserver's headers and `content_type`.
pub fn response_with(body: Body, content_type: &'static str) -> Response<Body> {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    if let Ok(id) = HeaderValue::from_str(&uuid::Uuid::new_v4().to_string()) {
        h.insert("audit-id", id);
    }
    resp
}

#[cfg(test)]
#[path = "list_tests.rs"]
mod tests;
