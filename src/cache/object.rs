//! One cached object: the exact JSON the apiserver sent, kept once and
//! shared by every list and watcher, plus what requests filter on (labels
//! and selectable fields), extracted once at ingest.
//!
//! Nothing is decoded or re-encoded per request. Two byte-level views are
//! precomputed:
//! - the list-item form: kube-apiserver omits `kind`/`apiVersion` from the
//!   items of built-in lists, so the item is `{` + the bytes after those two
//!   fields;
//! - the span of `metadata.resourceVersion`, so a `DELETED` event that
//!   carries the previous object "at the event's RV" is produced by
//!   splicing, not by re-encoding.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

use apimachinery::resource::FieldSet;
use apimachinery::selector::Pairs;

/// Why an object from upstream could not be cached.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// Not a JSON object with `metadata`.
    #[error("object is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// `metadata.resourceVersion` is missing or not an unsigned integer.
    #[error("object {0:?} has no valid metadata.resourceVersion")]
    ResourceVersion(String),
    /// `metadata.name` is empty.
    #[error("object has no metadata.name")]
    Name,
    /// `metadata.namespace` is longer than any namespace can be.
    #[error("object's metadata.namespace is too long")]
    Namespace,
}

/// Selectable fields beyond `metadata.name` and `metadata.namespace`
/// (which the key holds): `spec.nodeName`, `status.phase`... Their names
/// are the kind's, kept once ([`FieldSet::extra_fields`]); an object keeps
/// its values end to end in one string and where each ends. For a pod's
/// eight fields that is 80 bytes in two allocations, where a table of the
/// names in every object took 240 (a tenth of a small pod's JSON).
#[derive(Debug, Clone, Default)]
struct ExtraFields {
    /// The end of each value in `values`, in the order of the names.
    ends: Box<[u32]>,
    values: Box<str>,
}

impl ExtraFields {
    /// The values of `names`, from what the field set extracted (a name it
    /// did not give reads as empty).
    fn new(names: &[&str], extracted: &[(&'static str, String)]) -> Self {
        let mut ends = Vec::with_capacity(names.len());
        let mut values = String::new();
        for name in names {
            let value = extracted
                .iter()
                .find(|(k, _)| k == name)
                .map_or("", |(_, v)| v.as_str());
            values.push_str(value);
            ends.push(values.len() as u32);
        }
        ExtraFields {
            ends: ends.into_boxed_slice(),
            values: values.into_boxed_str(),
        }
    }

    /// The value of `name`, one of `names` (those it was built with).
    fn get(&self, names: &[&str], name: &str) -> Option<&str> {
        let i = names.iter().position(|n| *n == name)?;
        let start = i
            .checked_sub(1)
            .map_or(Some(0), |p| self.ends.get(p).copied())?;
        self.values.get(start as usize..*self.ends.get(i)? as usize)
    }

    /// Bytes allocated for them, about.
    fn heap_size(&self) -> usize {
        std::mem::size_of_val(&*self.ends) + self.values.len()
    }
}

/// Where the labels are: byte ranges of each key and value in the object's
/// JSON (one small allocation, none without labels), or, in the rare case
/// a label needed JSON unescaping, owned strings.
#[derive(Debug, Clone)]
enum LabelStore {
    Spans(Box<[[u32; 4]]>),
    Owned(Box<[(Box<str>, Box<str>)]>),
}

/// An object's labels, for label selectors.
#[derive(Debug, Clone, Copy)]
pub struct Labels<'a> {
    json: &'a [u8],
    store: &'a LabelStore,
}

impl<'a> Labels<'a> {
    /// The value of label `key`.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        let json = self.json;
        let at = |s: u32, e: u32| json.get(s as usize..e as usize);
        match self.store {
            LabelStore::Spans(spans) => spans.iter().find_map(|&[ks, ke, vs, ve]| {
                (at(ks, ke)? == key.as_bytes())
                    .then(|| std::str::from_utf8(at(vs, ve)?).ok())
                    .flatten()
            }),
            LabelStore::Owned(pairs) => Pairs::get(&**pairs, key),
        }
    }
}

impl Pairs for Labels<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        Labels::get(self, key)
    }
}

/// An object's selectable fields, for field selectors.
#[derive(Debug, Clone, Copy)]
pub struct Fields<'a> {
    object: &'a CachedObject,
}

impl Pairs for Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.object.field(key)
    }
}

/// An object as cached.
#[derive(Debug)]
pub struct CachedObject {
    /// Storage key: `namespace/name`, or `name` when cluster-scoped. Sorted
    /// bytewise, this is the apiserver's list order.
    key: Arc<str>,
    /// Length of the namespace prefix of `key` (0 when cluster-scoped): a
    /// namespace is a DNS label of at most 63 bytes. Two bytes, not four,
    /// keep the struct in 144 bytes (`the_struct_fits_its_size_class`).
    ns_len: u16,
    /// `metadata.resourceVersion`.
    pub rv: u64,
    /// The full object, with `kind` and `apiVersion`.
    json: Bytes,
    /// Offset of the first field after `kind` and `apiVersion`, or 0 when the
    /// object does not start with exactly those two.
    item_offset: u32,
    /// Byte range of the `metadata.resourceVersion` string's contents.
    rv_span: (u32, u32),
    /// Byte range of the `metadata` value (a `PartialObjectMetadata`'s).
    meta_span: (u32, u32),
    /// Whether `metadata.namespace` is a selectable field.
    namespaced: bool,
    /// The kind's selectable fields: the names of `fields`' values.
    field_set: FieldSet,
    /// The store's chunk `json` is a slice of, or 0 when it is an
    /// allocation of its own (`store::pack`).
    pack: u32,
    /// The length of this version's protobuf message, once a read has
    /// encoded it, or 0. A protobuf list's envelope carries the list's
    /// length before its items; when every item's is known, the list is
    /// sent as it is encoded (`serve::list::streamed_protobuf_list`).
    proto_len: AtomicU32,
    labels: LabelStore,
    fields: ExtraFields,
}

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow)]
    metadata: &'a RawValue,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(default, borrow)]
    name: Cow<'a, str>,
    #[serde(default, borrow)]
    namespace: Cow<'a, str>,
    #[serde(rename = "resourceVersion", borrow)]
    resource_version: Option<&'a RawValue>,
    #[serde(default, borrow)]
    labels: Option<BTreeMap<Str<'a>, Str<'a>>>,
}

/// A JSON string borrowed from the input when it has no escapes (serde
/// borrows a `Cow` only as a field marked `borrow`, not inside a map).
#[derive(Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct Str<'a>(#[serde(borrow)] Cow<'a, str>);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TypeMeta<'a> {
    #[serde(borrow, rename = "kind")]
    _kind: Cow<'a, str>,
    #[serde(borrow, rename = "apiVersion")]
    _api_version: Cow<'a, str>,
}

/// Byte offset of `inner` within `outer`; `inner` must borrow from `outer`.
fn offset_in(outer: &[u8], inner: &str) -> Option<usize> {
    let start = outer.as_ptr() as usize;
    let at = inner.as_ptr() as usize;
    (at >= start && at + inner.len() <= start + outer.len()).then(|| at - start)
}

// === impl CachedObject ===

impl CachedObject {
    /// Ingests one object. `json` must be the complete object including
    /// `kind` and `apiVersion`; it is copied into an allocation of its own
    /// so that it never pins a larger read buffer (a big store then moves
    /// it into a shared chunk of its own making: `store::pack`).
    ///
    /// # Errors
    /// [`IngestError`] when the object is malformed.
    pub fn from_json(
        json: &[u8],
        field_set: FieldSet,
        namespaced: bool,
    ) -> Result<CachedObject, IngestError> {
        let json = Bytes::copy_from_slice(json);
        let top: Top<'_> = serde_json::from_slice(&json)?;
        let meta: Meta<'_> = serde_json::from_str(top.metadata.get())?;
        if meta.name.is_empty() {
            return Err(IngestError::Name);
        }
        let rv_raw = meta
            .resource_version
            .ok_or_else(|| IngestError::ResourceVersion(meta.name.to_string()))?;
        let rv_text = rv_raw.get();
        let rv = rv_text
            .strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| IngestError::ResourceVersion(meta.name.to_string()))?;
        let rv_at = offset_in(&json, rv_text)
            .ok_or_else(|| IngestError::ResourceVersion(meta.name.to_string()))?;
        let rv_span = ((rv_at + 1) as u32, (rv_at + rv_text.len() - 1) as u32);
        let meta_at = offset_in(&json, top.metadata.get()).ok_or(IngestError::Name)?;
        let meta_span = (meta_at as u32, (meta_at + top.metadata.get().len()) as u32);
        let item_offset = item_offset(&json, meta_at).unwrap_or(0) as u32;

        let labels = label_store(&json, meta.labels.unwrap_or_default());
        let fields = if field_set.needs_body() {
            ExtraFields::new(
                field_set.extra_fields(),
                &field_set.extract_json(&json, namespaced)?,
            )
        } else {
            ExtraFields::default()
        };
        let (key, ns_len): (Arc<str>, u16) = if meta.namespace.is_empty() {
            (Arc::from(&*meta.name), 0)
        } else {
            (
                Arc::from(format!("{}/{}", meta.namespace, meta.name)),
                u16::try_from(meta.namespace.len()).map_err(|_| IngestError::Namespace)?,
            )
        };
        Ok(CachedObject {
            key,
            ns_len,
            rv,
            json,
            item_offset,
            rv_span,
            meta_span,
            namespaced,
            field_set,
            pack: 0,
            proto_len: AtomicU32::new(0),
            labels,
            fields,
        })
    }

    /// Ingests a list item, which for built-in types lacks `kind` and
    /// `apiVersion`; they are prepended so the object can be sent in watch
    /// events as the apiserver sends it.
    ///
    /// # Errors
    /// [`IngestError`] when the item is malformed.
    pub fn from_list_item(
        item: &[u8],
        kind: &str,
        api_version: &str,
        field_set: FieldSet,
        namespaced: bool,
    ) -> Result<CachedObject, IngestError> {
        let has_type_meta = {
            #[derive(Deserialize)]
            struct Probe<'a> {
                #[serde(borrow)]
                kind: Option<&'a RawValue>,
            }
            serde_json::from_slice::<Probe<'_>>(item)?.kind.is_some()
        };
        if has_type_meta || item.first() != Some(&b'{') {
            return CachedObject::from_json(item, field_set, namespaced);
        }
        let rest = &item[1..];
        let mut full = Vec::with_capacity(item.len() + kind.len() + api_version.len() + 32);
        full.extend_from_slice(b"{\"kind\":");
        serde_json::to_writer(&mut full, kind)?;
        full.extend_from_slice(b",\"apiVersion\":");
        serde_json::to_writer(&mut full, api_version)?;
        if rest.first() != Some(&b'}') {
            full.push(b',');
        }
        full.extend_from_slice(rest);
        CachedObject::from_json(&full, field_set, namespaced)
    }

    /// The storage key (`namespace/name` or `name`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The storage key, shared.
    pub fn key_arc(&self) -> &Arc<str> {
        &self.key
    }

    /// `metadata.namespace` (empty when cluster-scoped).
    pub fn namespace(&self) -> &str {
        &self.key[..self.ns_len as usize]
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        if self.ns_len == 0 {
            &self.key
        } else {
            &self.key[self.ns_len as usize + 1..]
        }
    }

    /// The object JSON with `kind` and `apiVersion`, as sent in watch
    /// events and get responses.
    pub fn json(&self) -> &Bytes {
        &self.json
    }

    /// The `metadata` JSON (a `PartialObjectMetadata`'s), shared.
    pub fn metadata_json(&self) -> Bytes {
        self.json
            .slice(self.meta_span.0 as usize..self.meta_span.1 as usize)
    }

    /// Appends the object as a list item: without `kind`/`apiVersion` when
    /// `strip_type_meta` (built-in types) and the object starts with them.
    pub fn write_item(&self, out: &mut BytesMut, strip_type_meta: bool) {
        if strip_type_meta && self.item_offset > 0 {
            out.put_u8(b'{');
            out.extend_from_slice(&self.json[self.item_offset as usize..]);
        } else {
            out.extend_from_slice(&self.json);
        }
    }

    /// The object with `metadata.resourceVersion` replaced by `rv`.
    pub fn with_resource_version(&self, rv: u64) -> Bytes {
        let (start, end) = (self.rv_span.0 as usize, self.rv_span.1 as usize);
        let rv = rv.to_string();
        let mut out = BytesMut::with_capacity(self.json.len() + rv.len());
        out.extend_from_slice(&self.json[..start]);
        out.extend_from_slice(rv.as_bytes());
        out.extend_from_slice(&self.json[end..]);
        out.freeze()
    }

    /// The store's chunk the JSON is a slice of (0: none).
    pub(crate) fn pack_id(&self) -> u32 {
        self.pack
    }

    /// Puts the JSON in the store's chunk `pack`: `json` must be the same
    /// bytes, as a slice of that chunk.
    pub(crate) fn set_packed(&mut self, json: Bytes, pack: u32) {
        debug_assert_eq!(json, self.json);
        self.json = json;
        self.pack = pack;
    }

    /// The length of this version's protobuf message (a list item's
    /// bytes after its field header), once an encoding has recorded it.
    pub fn proto_len(&self) -> Option<usize> {
        match self.proto_len.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n as usize),
        }
    }

    /// Records the length of this version's protobuf message. The
    /// encoding of the same JSON is always the same, so any encoding's
    /// length is every later one's.
    pub fn note_proto_len(&self, len: usize) {
        if let Ok(n) = u32::try_from(len) {
            self.proto_len.store(n, Ordering::Relaxed);
        }
    }

    /// The same object with its JSON in an allocation of its own.
    pub(crate) fn unpacked(&self) -> CachedObject {
        CachedObject {
            key: self.key.clone(),
            ns_len: self.ns_len,
            rv: self.rv,
            json: Bytes::copy_from_slice(&self.json),
            item_offset: self.item_offset,
            rv_span: self.rv_span,
            meta_span: self.meta_span,
            namespaced: self.namespaced,
            field_set: self.field_set,
            pack: 0,
            proto_len: AtomicU32::new(self.proto_len.load(Ordering::Relaxed)),
            labels: self.labels.clone(),
            fields: self.fields.clone(),
        }
    }

    /// Whether the object is namespaced.
    pub fn is_namespaced(&self) -> bool {
        self.namespaced
    }

    /// The labels.
    pub fn labels(&self) -> Labels<'_> {
        Labels {
            json: &self.json,
            store: &self.labels,
        }
    }

    /// The selectable fields.
    pub fn fields(&self) -> Fields<'_> {
        Fields { object: self }
    }

    /// The value of a selectable field.
    pub fn field(&self, name: &str) -> Option<&str> {
        match name {
            "metadata.name" => Some(self.name()),
            "metadata.namespace" if self.namespaced => Some(self.namespace()),
            _ => self.fields.get(self.field_set.extra_fields(), name),
        }
    }

    /// Bytes held by this object, for the `bytes` metric and memory
    /// accounting: its JSON plus the extracted strings and bookkeeping.
    pub fn heap_size(&self) -> usize {
        let labels = match &self.labels {
            LabelStore::Spans(spans) => std::mem::size_of_val(&**spans),
            LabelStore::Owned(pairs) => pairs.iter().map(|(k, v)| k.len() + v.len() + 32).sum(),
        };
        std::mem::size_of::<CachedObject>()
            + self.json.len()
            + self.key.len()
            + labels
            + self.fields.heap_size()
    }
}

/// The labels as byte ranges into `json`, which they borrow from; owned
/// when any needed unescaping (a label key or value cannot contain a
/// character JSON must escape, but an encoder may escape others).
fn label_store(json: &[u8], labels: BTreeMap<Str<'_>, Str<'_>>) -> LabelStore {
    let span = |s: &Str<'_>| match &s.0 {
        Cow::Borrowed(b) => offset_in(json, b).map(|at| (at as u32, (at + b.len()) as u32)),
        Cow::Owned(_) => None,
    };
    let spans: Option<Box<[[u32; 4]]>> = labels
        .iter()
        .map(|(k, v)| {
            let (ks, ke) = span(k)?;
            let (vs, ve) = span(v)?;
            Some([ks, ke, vs, ve])
        })
        .collect();
    match spans {
        Some(spans) => LabelStore::Spans(spans),
        None => LabelStore::Owned(
            labels
                .into_iter()
                .map(|(k, v)| (Box::from(&*k.0), Box::from(&*v.0)))
                .collect(),
        ),
    }
}

/// Where the list-item form starts: the position of the `"metadata"` key,
/// provided the object begins with exactly `kind` and `apiVersion`.
fn item_offset(json: &[u8], metadata_value_at: usize) -> Option<usize> {
    let before = &json[..metadata_value_at];
    let key_at = before.windows(11).rposition(|w| w == b"\"metadata\":")?;
    // Everything between the opening brace and the key must be exactly the
    // two type-meta fields.
    let head = json.get(1..key_at)?;
    let head = head.strip_suffix(b",")?;
    let mut probe = Vec::with_capacity(head.len() + 2);
    probe.push(b'{');
    probe.extend_from_slice(head);
    probe.push(b'}');
    serde_json::from_slice::<TypeMeta<'_>>(&probe).ok()?;
    Some(key_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CM: &str = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-0","namespace":"ns","uid":"u","resourceVersion":"326","labels":{"app":"a"}},"data":{"k":"0"}}"#;

    #[test]
    fn ingests_and_views() {
        let o = CachedObject::from_json(CM.as_bytes(), FieldSet::Default, true).unwrap();
        assert_eq!(
            (o.key(), o.namespace(), o.name(), o.rv),
            ("ns/cm-0", "ns", "cm-0", 326)
        );
        assert_eq!(o.labels().get("app"), Some("a"));
        assert_eq!(o.labels().get("ap"), None);
        assert_eq!(o.field("metadata.namespace"), Some("ns"));
        assert_eq!(o.field("metadata.name"), Some("cm-0"));
        assert_eq!(o.field("spec.nodeName"), None);
        let mut item = BytesMut::new();
        o.write_item(&mut item, true);
        assert_eq!(
            std::str::from_utf8(&item).unwrap(),
            r#"{"metadata":{"name":"cm-0","namespace":"ns","uid":"u","resourceVersion":"326","labels":{"app":"a"}},"data":{"k":"0"}}"#
        );
        let mut full = BytesMut::new();
        o.write_item(&mut full, false);
        assert_eq!(&full[..], CM.as_bytes());
        assert_eq!(
            std::str::from_utf8(&o.with_resource_version(339)).unwrap(),
            CM.replace("\"326\"", "\"339\"")
        );
    }

    #[test]
    fn list_items_get_type_meta() {
        let item =
            r#"{"metadata":{"name":"n1","resourceVersion":"5"},"spec":{"unschedulable":true}}"#;
        let o = CachedObject::from_list_item(item.as_bytes(), "Node", "v1", FieldSet::Node, false)
            .unwrap();
        assert!(
            o.json()
                .starts_with(br#"{"kind":"Node","apiVersion":"v1","metadata""#)
        );
        assert_eq!(o.field("spec.unschedulable"), Some("true"));
        assert_eq!(o.namespace(), "");
        assert_eq!(o.name(), "n1");
        let mut out = BytesMut::new();
        o.write_item(&mut out, true);
        assert_eq!(&out[..], item.as_bytes());
    }

    #[test]
    fn custom_resources_keep_their_order() {
        let cr = r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"ns","resourceVersion":"7"},"spec":{}}"#;
        let o = CachedObject::from_list_item(
            cr.as_bytes(),
            "Widget",
            "example.com/v1",
            FieldSet::Default,
            true,
        )
        .unwrap();
        assert_eq!(&o.json()[..], cr.as_bytes());
        let mut out = BytesMut::new();
        o.write_item(&mut out, false);
        assert_eq!(&out[..], cr.as_bytes());
    }

    #[test]
    fn rejects_malformed() {
        assert!(CachedObject::from_json(b"{", FieldSet::Default, true).is_err());
        assert!(
            CachedObject::from_json(br#"{"metadata":{"name":"x"}}"#, FieldSet::Default, true)
                .is_err()
        );
        assert!(
            CachedObject::from_json(
                br#"{"metadata":{"name":"x","resourceVersion":"a"}}"#,
                FieldSet::Default,
                true
            )
            .is_err()
        );
        assert!(
            CachedObject::from_json(
                br#"{"metadata":{"resourceVersion":"1"}}"#,
                FieldSet::Default,
                true
            )
            .is_err()
        );
    }

    #[test]
    fn labels_with_escapes_are_unescaped() {
        let cm = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c","namespace":"ns","resourceVersion":"1","labels":{"a\/b":"x","app":"w\u0065b","z":""}}}"#;
        let o = CachedObject::from_json(cm.as_bytes(), FieldSet::Default, true).unwrap();
        assert_eq!(o.labels().get("a/b"), Some("x"));
        assert_eq!(o.labels().get("app"), Some("web"));
        assert_eq!(o.labels().get("z"), Some(""));
        assert_eq!(o.labels().get("a\\/b"), None);
        let plain = CachedObject::from_json(CM.as_bytes(), FieldSet::Default, true).unwrap();
        assert!(matches!(plain.labels, LabelStore::Spans(_)));
        assert!(matches!(o.labels, LabelStore::Owned(_)));
        // Cluster-scoped: no namespace field.
        let node =
            r#"{"kind":"Node","apiVersion":"v1","metadata":{"name":"n","resourceVersion":"1"}}"#;
        let o = CachedObject::from_json(node.as_bytes(), FieldSet::Node, false).unwrap();
        assert_eq!(o.field("metadata.namespace"), None);
        assert_eq!(o.field("metadata.name"), Some("n"));
    }

    #[test]
    fn the_struct_fits_its_size_class() {
        // In an `Arc` (two counts, 16 bytes), 144 bytes fill jemalloc's
        // 160-byte size class; 8 more took a 192-byte slot: 32 bytes per
        // cached object.
        assert!(
            std::mem::size_of::<CachedObject>() <= 144,
            "{}",
            std::mem::size_of::<CachedObject>()
        );
        let long = format!(
            r#"{{"metadata":{{"name":"n","namespace":"{}","resourceVersion":"1"}}}}"#,
            "x".repeat(70_000)
        );
        assert!(matches!(
            CachedObject::from_json(long.as_bytes(), FieldSet::Default, true),
            Err(IngestError::Namespace)
        ));
    }

    #[test]
    fn pod_fields_from_body() {
        let pod = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"9"},"spec":{"nodeName":"n1"},"status":{"phase":"Running"}}"#;
        let o = CachedObject::from_json(pod.as_bytes(), FieldSet::Pod, true).unwrap();
        assert_eq!(o.field("spec.nodeName"), Some("n1"));
        assert_eq!(o.field("status.phase"), Some("Running"));
        assert_eq!(o.field("spec.hostNetwork"), Some("false"));
        // Every field of the kind, each its own value; no other.
        assert_eq!(o.field("spec.restartPolicy"), Some(""));
        assert_eq!(o.field("status.nominatedNodeName"), Some(""));
        assert_eq!(o.field("status.podIPs"), None);
        let copy = o.unpacked();
        for name in FieldSet::Pod.extra_fields() {
            assert_eq!(copy.field(name), o.field(name), "{name}");
        }
    }
}
