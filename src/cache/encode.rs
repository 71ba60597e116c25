//! The representations the cache answers in, from the JSON it holds:
//! JSON as received, protobuf (built-in types), and
//! `PartialObjectMetadata[List]` in either.
//!
//! Like the apiserver's `cachingObject`, an object version is encoded in
//! protobuf when a reader asks for it, and a kept envelope is shared by
//! every get, list and watch event that carries that version
//! ([`ProtoForm`]). The encodings are kept in [`ProtoForms`] from a
//! version's second read on, bounded in bytes, share of the cached
//! objects' bytes and idle time (`cache.protobufCacheMib`,
//! `cache.protobufCachePercent`): a version not kept is encoded again by
//! its next protobuf reader, so memory holds JSON once plus a bounded
//! working set, whatever was read in protobuf once.
//! The metadata-only forms are slices of what is
//! held: the `metadata` bytes of the object's JSON, or the `ObjectMeta`
//! field of its protobuf message, behind a fixed header. Watch frames are
//! built once per event and representation (`event.rs`).
//!
//! If an object cannot be encoded (a field the generated schema lacks: an
//! apiserver newer than the proxy), the resource's protobuf readers pass
//! through from then on ([`ProtoCodec::is_broken`]) and the metric
//! `cache_encode_failures_total` counts it.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use apimachinery::protobuf::{self, ENVELOPE_TAIL, Message};
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Response, header};
use prometheus::{IntCounter, IntGauge};

use apimachinery::body::{self, Body};
use apimachinery::status::Status;

use super::negotiate::{Encoding, ErrorEncoding, MetaVersion, Representation};
use super::object::CachedObject;

/// `application/json`.
pub const JSON: &str = "application/json";
/// A protobuf watch stream's content type.
pub const PROTOBUF_WATCH: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// How long an encoding nobody read stays in [`ProtoForms`].
const FORM_IDLE: Duration = Duration::from_secs(600);

/// Bytes counted per kept encoding beyond its envelope (the entry, the
/// key, the form's bookkeeping).
const FORM_OVERHEAD: usize = 160;

/// A kept encoding's key: the resource's index, the object's key and
/// resourceVersion.
type FormKey = (u32, Arc<str>, u64);

/// The protobuf encodings kept for cached objects, shared by all
/// resources: at most a budget of bytes and a share of the cached
/// objects' bytes, least recently and frequently used evicted first
/// (moka's TinyLFU), and none left unread for [`FORM_IDLE`]. A budget or
/// share of 0 keeps none: every protobuf read encodes.
#[derive(Clone)]
pub struct ProtoForms(Option<Arc<Kept>>);

/// The kept encodings and what bounds them.
struct Kept {
    map: moka::sync::Cache<FormKey, Arc<ProtoForm>>,
    /// The versions read once lately: one is kept on its second read.
    doorkeeper: Doorkeeper,
    /// Bytes of the kept encodings as weighed: added when one is kept,
    /// taken off when moka removes it (evicted, expired).
    weight: Arc<AtomicU64>,
    /// Bytes of all resources' cached objects ([`FormSlot::note_objects`]).
    objects: AtomicU64,
    /// The kept encodings' share of `objects`, in percent.
    percent: u64,
}

impl std::fmt::Debug for ProtoForms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ProtoForms")
            .field(
                &self
                    .0
                    .as_ref()
                    .map(|k| (k.map.policy().max_capacity(), k.percent)),
            )
            .finish()
    }
}

fn weigh(f: &ProtoForm) -> u64 {
    (f.envelope.len() + FORM_OVERHEAD) as u64
}

impl ProtoForms {
    /// Kept encodings of at most `budget` bytes in all, and at most
    /// `percent` % of the cached objects' bytes.
    pub fn new(budget: u64, percent: u64) -> Self {
        Self((budget > 0 && percent > 0).then(|| {
            let weight = Arc::new(AtomicU64::new(0));
            let removed = weight.clone();
            let map = moka::sync::Cache::builder()
                .max_capacity(budget)
                .weigher(|_: &FormKey, f: &Arc<ProtoForm>| {
                    u32::try_from(weigh(f)).unwrap_or(u32::MAX)
                })
                .eviction_listener(move |_, f: Arc<ProtoForm>, _| {
                    removed.fetch_sub(weigh(&f), Ordering::Relaxed);
                })
                .time_to_idle(FORM_IDLE)
                .build();
            Arc::new(Kept {
                map,
                doorkeeper: Doorkeeper::new(),
                weight,
                objects: AtomicU64::new(0),
                percent,
            })
        }))
    }

    /// The slot of the resource at `index`: its codec keeps its forms here.
    pub fn for_resource(&self, index: u32) -> FormSlot {
        FormSlot {
            forms: self.clone(),
            index,
            objects: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Applies pending evictions now (moka does it in the background of
    /// later calls), for measurements and tests.
    pub fn settle(&self) {
        if let Some(k) = &self.0 {
            let c = &k.map;
            // Each call works through a bounded batch of the pending ones.
            for _ in 0..64 {
                c.run_pending_tasks();
                if c.weighted_size() <= c.policy().max_capacity().unwrap_or(u64::MAX) {
                    break;
                }
            }
        }
    }

    /// Bytes of the kept encodings.
    pub fn kept_bytes(&self) -> u64 {
        self.0
            .as_ref()
            .map_or(0, |k| k.weight.load(Ordering::Relaxed))
    }
}

impl Kept {
    /// Whether one more encoding may be kept: while the kept ones are
    /// under their share of the cached objects' bytes. A share, unlike
    /// moka's byte budget, moves with the cache, so it is kept by
    /// admission: past it, a read's encoding is used and dropped, and
    /// room comes back as kept ones go unread for [`FORM_IDLE`] or are
    /// evicted for the budget.
    fn admits(&self) -> bool {
        let share = self.objects.load(Ordering::Relaxed) / 100 * self.percent;
        self.weight.load(Ordering::Relaxed) < share
    }
}

/// The object versions read in protobuf lately, as the bits of a hashed
/// set (TinyLFU's doorkeeper): a version is kept on its second read, so a
/// read of everything once (a client's first list, a relist) keeps
/// nothing, while versions read again (an object many nodes' agents
/// list, a controller's repeated lists) are kept. A false positive keeps
/// a version on its first read. Cleared once an eighth of its bits are
/// set, which keeps false positives under one in eight. Hashed with fixed
/// keys, so that which versions collide is the same from run to run (a
/// collision only keeps a form early, within the share).
struct Doorkeeper {
    bits: Box<[AtomicU64]>,
    set: AtomicU64,
    hasher: std::hash::BuildHasherDefault<std::hash::DefaultHasher>,
}

impl Doorkeeper {
    /// 2 Mi bits: 256 KiB, cleared after 256 Ki first reads.
    const BITS: usize = 1 << 21;

    fn new() -> Self {
        Self {
            bits: (0..Self::BITS / 64).map(|_| AtomicU64::new(0)).collect(),
            set: AtomicU64::new(0),
            hasher: Default::default(),
        }
    }

    /// Whether `key` was read since the last clearing; notes it read.
    fn read_before(&self, key: &FormKey) -> bool {
        use std::hash::BuildHasher;
        let bit = (self.hasher.hash_one(key) as usize) % Self::BITS;
        let mask = 1u64 << (bit % 64);
        if self.bits[bit / 64].fetch_or(mask, Ordering::Relaxed) & mask != 0 {
            return true;
        }
        if self.set.fetch_add(1, Ordering::Relaxed) + 1 >= (Self::BITS / 8) as u64 {
            self.set.store(0, Ordering::Relaxed);
            for word in &self.bits {
                word.store(0, Ordering::Relaxed);
            }
        }
        false
    }
}

/// A read of a version that is not kept, and is not to be kept now: it
/// encodes for itself.
struct NotKept;

/// One resource's place in [`ProtoForms`].
#[derive(Debug, Clone)]
pub struct FormSlot {
    forms: ProtoForms,
    /// The resource's index in the forms' keys.
    index: u32,
    /// The resource's part of [`Kept::objects`].
    objects: Arc<AtomicU64>,
}

impl FormSlot {
    /// Records the bytes of the resource's cached objects, which the kept
    /// encodings' share is of.
    pub fn note_objects(&self, bytes: u64) {
        let Some(k) = &self.forms.0 else { return };
        let before = self.objects.swap(bytes, Ordering::Relaxed);
        if bytes >= before {
            k.objects.fetch_add(bytes - before, Ordering::Relaxed);
        } else {
            k.objects.fetch_sub(before - bytes, Ordering::Relaxed);
        }
    }
}

/// How a resource's objects are encoded in protobuf.
#[derive(Debug)]
pub struct ProtoCodec {
    message: &'static Message,
    /// `v1`, `apps/v1`.
    pub api_version: String,
    pub kind: String,
    bytes: IntGauge,
    failures: IntCounter,
    broken: AtomicBool,
    slot: FormSlot,
}

/// An object version's protobuf envelope, and where its message and its
/// `metadata` field lie in it.
#[derive(Debug)]
pub struct ProtoForm {
    envelope: Bytes,
    raw: Range<u32>,
    metadata: Range<u32>,
    bytes: IntGauge,
}

impl Drop for ProtoForm {
    fn drop(&mut self) {
        self.bytes.sub(self.envelope.len() as i64);
    }
}

impl ProtoForm {
    /// `k8s\0` + `runtime.Unknown{typeMeta, raw}`: a get's body, a watch
    /// event's object.
    pub fn envelope(&self) -> &Bytes {
        &self.envelope
    }

    /// The object's message: a list item.
    pub fn raw(&self) -> Bytes {
        self.envelope
            .slice(self.raw.start as usize..self.raw.end as usize)
    }

    /// The `ObjectMeta` message.
    pub fn metadata(&self) -> Bytes {
        self.envelope
            .slice(self.metadata.start as usize..self.metadata.end as usize)
    }
}

// === impl ProtoCodec ===

impl ProtoCodec {
    /// The codec of a built-in kind, if the schema has it.
    pub fn new(
        group: &str,
        version: &str,
        kind: &str,
        api_version: &str,
        bytes: IntGauge,
        failures: IntCounter,
        slot: FormSlot,
    ) -> Option<ProtoCodec> {
        let message = protobuf::message_for(group, version, kind)?;
        // Every kind's ObjectMeta is field 1, which metadata-only reads
        // rely on.
        (protobuf::field_number(message, "metadata") == Some(1)).then(|| ProtoCodec {
            message,
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            bytes,
            failures,
            broken: AtomicBool::new(false),
            slot,
        })
    }

    /// The kind's protobuf message.
    pub fn message(&self) -> &'static Message {
        self.message
    }

    /// Applies pending evictions of the kept encodings (see
    /// [`ProtoForms::settle`]).
    pub fn settle_forms(&self) {
        self.slot.forms.settle();
    }

    /// `o`'s protobuf form: kept, or encoded now (and kept if the version
    /// was read before, within the budget and the share); `None` when it
    /// cannot be encoded.
    pub fn form(&self, o: &CachedObject) -> Option<Arc<ProtoForm>> {
        let form = match self.kept_form(o) {
            Ok(form) => form,
            Err(NotKept) => self.encode(o.json()).map(Arc::new),
        }?;
        o.note_proto_len(form.raw.len());
        Some(form)
    }

    /// Appends `o`'s message as field `number` (a list's item): its kept
    /// form's bytes, or, for a version not kept, encoded for this read
    /// alone into `out`, so that a list of versions read once holds
    /// nothing but its own body: straight after its header when an earlier
    /// read measured it (`CachedObject::proto_len`), else through
    /// `scratch`, then copied. `false` when it cannot be encoded.
    pub fn write_item(
        &self,
        o: &CachedObject,
        number: u32,
        out: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
    ) -> bool {
        match self.kept_form(o) {
            Ok(Some(form)) => {
                let raw = form.raw();
                o.note_proto_len(raw.len());
                protobuf::put_header(out, number, raw.len());
                out.extend_from_slice(&raw);
                true
            }
            Ok(None) => false,
            Err(NotKept) => {
                if let Some(len) = o.proto_len() {
                    let at = out.len();
                    protobuf::put_header(out, number, len);
                    let body = out.len();
                    if !self.transcode(o.json(), out) {
                        out.truncate(at);
                        return false;
                    }
                    if out.len() - body == len {
                        return true;
                    }
                    // Not the length measured, which the same JSON cannot
                    // give: written again with its own.
                    out.truncate(at);
                }
                scratch.clear();
                if !self.transcode(o.json(), scratch) {
                    return false;
                }
                o.note_proto_len(scratch.len());
                protobuf::put_header(out, number, scratch.len());
                out.extend_from_slice(scratch);
                true
            }
        }
    }

    /// The kept form of `o`'s version, or one encoded and kept now (read
    /// before, within the budget and the share; `Ok(None)` when it cannot
    /// be encoded); [`NotKept`] when this read encodes for itself.
    fn kept_form(&self, o: &CachedObject) -> Result<Option<Arc<ProtoForm>>, NotKept> {
        let Some(kept) = &self.slot.forms.0 else {
            return Err(NotKept);
        };
        let key = (self.slot.index, o.key_arc().clone(), o.rv);
        if let Some(f) = kept.map.get(&key) {
            return Ok(Some(f));
        }
        if !kept.doorkeeper.read_before(&key) || !kept.admits() {
            return Err(NotKept);
        }
        let Some(entry) = kept
            .map
            .entry(key)
            .or_optionally_insert_with(|| self.encode(o.json()).map(Arc::new))
        else {
            return Ok(None);
        };
        if entry.is_fresh() {
            kept.weight
                .fetch_add(weigh(entry.value()), Ordering::Relaxed);
        }
        Ok(Some(entry.into_value()))
    }

    /// Records the bytes of the resource's cached objects (see
    /// [`FormSlot::note_objects`]).
    pub fn note_objects(&self, bytes: u64) {
        self.slot.note_objects(bytes);
    }

    /// Whether an object of the resource failed to encode: protobuf reads
    /// pass through.
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Appends an object's message, from its JSON, to `out`; `false` (and
    /// the resource marked broken) when it cannot be encoded.
    fn transcode(&self, json: &[u8], out: &mut Vec<u8>) -> bool {
        let Err(error) = protobuf::transcode(json, self.message, out) else {
            return true;
        };
        self.failures.inc();
        if !self.broken.swap(true, Ordering::Relaxed) {
            tracing::warn!(kind = %self.kind, %error, "cannot encode an object in protobuf; protobuf reads of the resource pass through");
        }
        false
    }

    /// Encodes an object's JSON; `None` (and the resource marked broken)
    /// when it cannot be.
    pub fn encode(&self, json: &[u8]) -> Option<ProtoForm> {
        let mut raw = Vec::with_capacity(json.len() / 2);
        if !self.transcode(json, &mut raw) {
            return None;
        }
        let (envelope, range) = protobuf::envelope(&self.api_version, &self.kind, &raw);
        let metadata = protobuf::find_field(&raw, 1)?;
        let to = |r: Range<usize>| (r.start + range.start) as u32..(r.end + range.start) as u32;
        self.bytes.add(envelope.len() as i64);
        Some(ProtoForm {
            envelope: Bytes::from(envelope),
            raw: range.start as u32..range.end as u32,
            metadata: to(metadata),
            bytes: self.bytes.clone(),
        })
    }
}

/// `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":`
pub fn metadata_json_head(version: MetaVersion) -> &'static [u8] {
    match version {
        MetaVersion::V1 => {
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#
        }
        MetaVersion::V1beta1 => {
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1beta1","metadata":"#
        }
    }
}

/// The `PartialObjectMetadata` message of an `ObjectMeta` message.
fn metadata_message(metadata: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(metadata.len() + 6);
    protobuf::put_bytes(&mut out, 1, metadata);
    out
}

/// The body chunks of one object in `repr` (a get's body, without the
/// JSON newline); `None` when it cannot be encoded.
pub fn object_chunks(
    o: &CachedObject,
    codec: Option<&ProtoCodec>,
    repr: Representation,
) -> Option<Vec<Bytes>> {
    Some(match (repr.encoding, repr.metadata) {
        (Encoding::Json, None) => vec![o.json().clone()],
        (Encoding::Json, Some(v)) => vec![
            Bytes::from_static(metadata_json_head(v)),
            o.metadata_json(),
            Bytes::from_static(b"}"),
        ],
        (Encoding::Protobuf, None) => vec![codec?.form(o)?.envelope().clone()],
        (Encoding::Protobuf, Some(v)) => {
            let meta = codec?.form(o)?.metadata();
            let inner = protobuf::field_len(1, meta.len());
            let mut head = protobuf::envelope_head(v.api_version(), "PartialObjectMetadata", inner);
            protobuf::put_header(&mut head, 1, meta.len());
            vec![Bytes::from(head), meta, Bytes::from_static(ENVELOPE_TAIL)]
        }
    })
}

/// One object as a single buffer in `repr` (a watch event's object).
pub fn object_bytes(
    o: &CachedObject,
    codec: Option<&ProtoCodec>,
    repr: Representation,
) -> Option<Bytes> {
    if repr == Representation::JSON {
        return Some(o.json().clone());
    }
    if repr == Representation::PROTOBUF {
        return Some(codec?.form(o)?.envelope().clone());
    }
    let chunks = object_chunks(o, codec, repr)?;
    let mut out = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in chunks {
        out.extend_from_slice(&c);
    }
    Some(out.freeze())
}

/// Writes `{"type":"T","object":OBJ}\n`, the apiserver's JSON watch framing.
fn json_frame(kind: &str, object: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    out.freeze()
}

/// A watch event frame: JSON `{"type":T,"object":O}\n`, or a protobuf
/// length-prefixed `WatchEvent`.
pub fn frame(encoding: Encoding, event_type: &str, object: &[u8]) -> Bytes {
    match encoding {
        Encoding::Json => json_frame(event_type, object),
        Encoding::Protobuf => Bytes::from(protobuf::watch_frame(event_type, object)),
    }
}

/// A plain (non-metadata) object from its JSON, in `encoding`: for
/// objects the cache builds (bookmarks) rather than holds.
pub fn built_object(
    json: &[u8],
    codec: Option<&ProtoCodec>,
    repr: Representation,
) -> Option<Bytes> {
    match (repr.encoding, repr.metadata) {
        (Encoding::Json, None) => Some(Bytes::copy_from_slice(json)),
        (Encoding::Protobuf, None) => {
            let codec = codec?;
            let mut raw = Vec::new();
            protobuf::transcode(json, codec.message, &mut raw).ok()?;
            Some(Bytes::from(
                protobuf::envelope(&codec.api_version, &codec.kind, &raw).0,
            ))
        }
        (encoding, Some(v)) => {
            #[derive(serde::Deserialize)]
            struct Top<'a> {
                #[serde(borrow)]
                metadata: &'a serde_json::value::RawValue,
            }
            let top: Top<'_> = serde_json::from_slice(json).ok()?;
            let meta = top.metadata.get().as_bytes();
            match encoding {
                Encoding::Json => {
                    let mut out = metadata_json_head(v).to_vec();
                    out.extend_from_slice(meta);
                    out.push(b'}');
                    Some(Bytes::from(out))
                }
                Encoding::Protobuf => {
                    let object_meta =
                        protobuf::message("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta")?;
                    let mut raw = Vec::new();
                    protobuf::transcode(meta, object_meta, &mut raw).ok()?;
                    let pom = metadata_message(&raw);
                    Some(Bytes::from(
                        protobuf::envelope(v.api_version(), "PartialObjectMetadata", &pom).0,
                    ))
                }
            }
        }
    }
}

/// A `Status` as a protobuf envelope (`apiVersion: v1`, `kind: Status`),
/// as the apiserver writes errors to a client that accepts protobuf.
pub fn status_protobuf(s: &Status) -> Option<Bytes> {
    let message = protobuf::message("k8s.io.apimachinery.pkg.apis.meta.v1.Status")?;
    let mut raw = Vec::new();
    protobuf::transcode(&s.to_json(), message, &mut raw).ok()?;
    Some(Bytes::from(protobuf::envelope("v1", "Status", &raw).0))
}

/// A `Status` as a watch stream's `ERROR` object in `encoding`.
pub fn status_object(s: &Status, encoding: Encoding) -> Bytes {
    match encoding {
        Encoding::Protobuf => status_protobuf(s).unwrap_or_else(|| s.to_json()),
        Encoding::Json => s.to_json(),
    }
}

/// An error answer: the `Status` in the negotiated error encoding
/// (`responsewriters.ErrorNegotiated`).
pub fn status_response(s: Status, errors: ErrorEncoding) -> Response<Body> {
    let body = match errors {
        ErrorEncoding::Json => return s.into_response(),
        ErrorEncoding::Protobuf => match status_protobuf(&s) {
            Some(b) => (b, protobuf::CONTENT_TYPE),
            None => return s.into_response(),
        },
        ErrorEncoding::IndentedJson => (Bytes::from(apimachinery::go::to_vec_indented(&s)), JSON),
    };
    let mut resp = s.into_response();
    *resp.body_mut() = body::full(body.0);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(body.1));
    resp
}

/// The content type of a get or list answer in `encoding`.
pub fn content_type(encoding: Encoding) -> &'static str {
    match encoding {
        Encoding::Json => JSON,
        Encoding::Protobuf => protobuf::CONTENT_TYPE,
    }
}

/// The content type of a watch in `encoding`.
pub fn watch_content_type(encoding: Encoding) -> &'static str {
    match encoding {
        Encoding::Json => JSON,
        Encoding::Protobuf => PROTOBUF_WATCH,
    }
}

/// The label of `repr` in `cache_served_total`.
pub fn representation_label(repr: Representation) -> &'static str {
    match (repr.encoding, repr.metadata) {
        (Encoding::Json, None) => "json",
        (Encoding::Protobuf, None) => "protobuf",
        (Encoding::Json, Some(_)) => "metadata_json",
        (Encoding::Protobuf, Some(_)) => "metadata_protobuf",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apimachinery::resource::FieldSet;

    fn codec(forms: ProtoForms, bytes: &IntGauge) -> ProtoCodec {
        ProtoCodec::new(
            "",
            "v1",
            "ConfigMap",
            "v1",
            bytes.clone(),
            IntCounter::new("f", "f").unwrap(),
            forms.for_resource(0),
        )
        .unwrap()
    }

    fn cm(i: usize, rv: u64) -> CachedObject {
        let json = format!(
            r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"cm-{i}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"k":"{}"}}}}"#,
            "x".repeat(1000)
        );
        CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).unwrap()
    }

    #[test]
    fn kept_encodings_are_shared_and_bounded() {
        let bytes = IntGauge::new("b", "b").unwrap();
        let c = codec(ProtoForms::new(16 * 1024, 100), &bytes);
        c.note_objects(1 << 30);
        let o = cm(0, 5);
        let once = c.form(&o).unwrap();
        assert!(
            !Arc::ptr_eq(&once, &c.form(&o).unwrap()),
            "kept on the second read"
        );
        let first = c.form(&o).unwrap();
        assert!(Arc::ptr_eq(&first, &c.form(&o).unwrap()), "kept, shared");
        // A new version of the object is a new encoding.
        let newer = cm(0, 6);
        c.form(&newer).unwrap();
        assert!(!Arc::ptr_eq(&first, &c.form(&newer).unwrap()));
        drop(first);
        // Past the budget (about 15 of these), the oldest go.
        let objects: Vec<_> = (0..100).map(|i| cm(i, 7)).collect();
        for o in objects.iter().chain(&objects) {
            c.form(o).unwrap();
        }
        c.settle_forms();
        let kept = c.slot.forms.0.as_ref().unwrap().map.weighted_size();
        assert!(kept > 0 && kept <= 16 * 1024, "{kept} bytes kept");
        assert_eq!(c.slot.forms.kept_bytes(), kept, "counted as moka weighs");
        // Evicted encodings are freed once the map's epoch-based
        // reclamation runs: the memory alive stays near the budget however
        // many are encoded.
        let more: Vec<_> = (100..2100).map(|i| cm(i, 7)).collect();
        for o in more.iter().chain(&more) {
            c.form(o).unwrap();
        }
        c.settle_forms();
        let alive = bytes.get();
        assert!(alive < 4 * 16 * 1024, "{alive} bytes alive");
        // Evicted ones are encoded again, identically.
        let again = c.form(&objects[0]).unwrap();
        let fresh = c.encode(objects[0].json()).unwrap();
        assert_eq!(again.envelope(), fresh.envelope());
    }

    #[test]
    fn a_budget_of_zero_keeps_none() {
        let bytes = IntGauge::new("b", "b").unwrap();
        let c = codec(ProtoForms::new(0, 100), &bytes);
        let o = cm(0, 5);
        let form = c.form(&o).unwrap();
        assert!(bytes.get() > 0, "alive while read");
        drop(form);
        assert_eq!(bytes.get(), 0, "and gone after");
        assert!(!Arc::ptr_eq(&c.form(&o).unwrap(), &c.form(&o).unwrap()));
    }

    #[test]
    fn a_measured_item_not_kept_is_written_after_its_header_the_same() {
        let bytes = IntGauge::new("b", "b").unwrap();
        let c = codec(ProtoForms::new(0, 100), &bytes);
        let objects: Vec<_> = (0..20).map(|i| cm(i, 300)).collect();
        let mut want = Vec::new();
        for o in &objects {
            let raw = c.encode(o.json()).unwrap().raw();
            protobuf::put_header(&mut want, 2, raw.len());
            want.extend_from_slice(&raw);
        }
        let (mut first, mut scratch) = (Vec::new(), Vec::new());
        for o in &objects {
            assert!(c.write_item(o, 2, &mut first, &mut scratch));
        }
        assert!(objects.iter().all(|o| o.proto_len().is_some()), "measured");
        scratch = Vec::new();
        let mut second = Vec::new();
        for o in &objects {
            assert!(c.write_item(o, 2, &mut second, &mut scratch));
        }
        assert_eq!(scratch.capacity(), 0, "written straight into the list");
        // A recorded length that is wrong (the same JSON cannot give one)
        // costs a second encoding, not a wrong item.
        objects[3].note_proto_len(objects[3].proto_len().unwrap() + 200);
        let mut third = Vec::new();
        for o in &objects {
            assert!(c.write_item(o, 2, &mut third, &mut scratch));
        }
        assert!(first == want && second == want && third == want);
    }

    #[test]
    fn list_items_read_once_are_written_without_forms() {
        let bytes = IntGauge::new("b", "b").unwrap();
        let c = codec(ProtoForms::new(64 << 20, 100), &bytes);
        c.note_objects(1 << 30);
        let objects: Vec<_> = (0..50).map(|i| cm(i, 7)).collect();
        let expected = |o: &CachedObject| {
            let raw = c.encode(o.json()).unwrap().raw();
            let mut want = Vec::new();
            protobuf::put_header(&mut want, 2, raw.len());
            want.extend_from_slice(&raw);
            want
        };
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        for o in &objects {
            assert!(c.write_item(o, 2, &mut out, &mut scratch));
        }
        assert_eq!(out, objects.iter().flat_map(expected).collect::<Vec<u8>>());
        assert_eq!(bytes.get(), 0, "no form alive");
        c.settle_forms();
        assert_eq!(c.slot.forms.kept_bytes(), 0, "none kept");
        // Listed again: kept, and written from the kept forms, the same.
        let mut again = Vec::new();
        for o in &objects {
            assert!(c.write_item(o, 2, &mut again, &mut scratch));
        }
        assert_eq!(again, out);
        c.settle_forms();
        assert!(c.slot.forms.kept_bytes() > 0);
    }

    #[test]
    fn kept_encodings_stay_within_their_share_of_the_objects() {
        let bytes = IntGauge::new("b", "b").unwrap();
        let c = codec(ProtoForms::new(64 << 20, 10), &bytes);
        let objects: Vec<_> = (0..200).map(|i| cm(i, 7)).collect();
        let json: usize = objects.iter().map(|o| o.json().len()).sum();
        // Nothing cached yet: nothing kept.
        c.form(&objects[0]).unwrap();
        assert_eq!(c.slot.forms.kept_bytes(), 0);
        c.note_objects(json as u64);
        // Read once each: none kept (but the first, read twice).
        for o in &objects {
            c.form(o).unwrap();
        }
        c.settle_forms();
        assert!(c.slot.forms.kept_bytes() <= weigh(&c.encode(objects[0].json()).unwrap()));
        // Read again: kept, up to the share.
        for o in &objects {
            c.form(o).unwrap();
        }
        c.settle_forms();
        let kept = c.slot.forms.kept_bytes();
        let form = c.encode(objects[0].json()).unwrap();
        let one = weigh(&form);
        // Admitted while under 10 %: at most one form past it.
        assert!(kept > 0, "some kept");
        assert!(kept < json as u64 / 10 + one, "{kept} of {json}");
        // A kept one is shared; one read past the share is encoded afresh.
        assert!(Arc::ptr_eq(
            &c.form(&objects[0]).unwrap(),
            &c.form(&objects[0]).unwrap()
        ));
        let last = objects.last().unwrap();
        assert!(!Arc::ptr_eq(&c.form(last).unwrap(), &c.form(last).unwrap()));
        // The cache shrinking leaves no room for more.
        c.note_objects(0);
        let o = cm(999, 7);
        c.form(&o).unwrap();
        assert!(!Arc::ptr_eq(&c.form(&o).unwrap(), &c.form(&o).unwrap()));
    }
}
