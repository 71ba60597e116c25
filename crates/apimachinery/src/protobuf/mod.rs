//! Kubernetes' protobuf wire format (`application/vnd.kubernetes.protobuf`)
//! for built-in types, as kube-apiserver writes it
//! (`staging/src/k8s.io/apimachinery/pkg/runtime/serializer/protobuf/`):
//!
//! - an object or a list: the 4-byte magic `k8s\0`, then a
//!   `runtime.Unknown{typeMeta{apiVersion, kind}, raw, contentEncoding,
//!   contentType}` whose `raw` is the object's message (a list is the typed
//!   `...List` message: `metadata` (`ListMeta`) and `items`);
//! - a watch stream (`;stream=watch`): frames of a 4-byte big-endian length
//!   and a `metav1.WatchEvent{type, object: RawExtension{raw}}` whose `raw`
//!   is the object's full envelope as above.
//!
//! Objects are transcoded from the JSON the apiserver sent ([`transcode`]),
//! driven by a schema generated from the Kubernetes `.proto` files and Go
//! types ([`schema`]).

pub mod schema;
pub mod schema_types;
mod stream;
pub mod to_json;
pub mod transcode;

use std::ops::Range;

use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};

pub use schema_types::Message;
pub use to_json::to_json;
pub use transcode::{TranscodeError, transcode, transcode_reference};

/// The prefix of every protobuf-encoded object.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// `application/vnd.kubernetes.protobuf`.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The message named `name` (`k8s.io.api.core.v1.Pod`).
pub fn message(name: &str) -> Option<&'static Message> {
    schema::MESSAGES
        .binary_search_by(|m| m.name.cmp(name))
        .ok()
        .and_then(|i| schema::MESSAGES.get(i))
}

/// The message of kind `kind` in a built-in group and version.
pub fn message_for(group: &str, version: &str, kind: &str) -> Option<&'static Message> {
    let (_, _, package) = schema::GROUP_VERSIONS
        .iter()
        .find(|(g, v, _)| *g == group && *v == version)?;
    message(&format!("{package}.{kind}"))
}

/// The field number of `json` in `message`.
pub fn field_number(message: &Message, json: &str) -> Option<u32> {
    message
        .fields
        .iter()
        .find(|f| f.json == json)
        .map(|f| f.number)
}

/// Appends a length-delimited field.
pub fn put_bytes(out: &mut Vec<u8>, number: u32, value: &[u8]) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

/// Appends the key and length of a length-delimited field of `len` bytes,
/// whose body the caller writes next.
pub fn put_header(out: &mut Vec<u8>, number: u32, len: usize) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
}

/// Appends a varint field.
pub fn put_varint(out: &mut Vec<u8>, number: u32, value: u64) {
    encode_key(number, WireType::Varint, out);
    encode_varint(value, out);
}

/// Bytes of a length-delimited field of `len` bytes.
pub fn field_len(number: u32, len: usize) -> usize {
    prost::encoding::key_len(number) + prost::encoding::encoded_len_varint(len as u64) + len
}

/// The `runtime.TypeMeta` message.
fn type_meta(api_version: &str, kind: &str) -> Vec<u8> {
    let mut tm = Vec::with_capacity(api_version.len() + kind.len() + 4);
    put_bytes(&mut tm, 1, api_version.as_bytes());
    put_bytes(&mut tm, 2, kind.as_bytes());
    tm
}

/// The head of an envelope whose `raw` is `raw_len` bytes: the magic, the
/// type meta and `raw`'s key and length. The body follows, then
/// [`ENVELOPE_TAIL`].
pub fn envelope_head(api_version: &str, kind: &str, raw_len: usize) -> Vec<u8> {
    let tm = type_meta(api_version, kind);
    let mut out = Vec::with_capacity(tm.len() + 16);
    out.extend_from_slice(MAGIC);
    put_bytes(&mut out, 1, &tm);
    put_header(&mut out, 2, raw_len);
    out
}

/// The end of an envelope: empty `contentEncoding` and `contentType`
/// (`Unknown.NestedMarshalTo` writes both always).
pub const ENVELOPE_TAIL: &[u8] = b"\x1a\x00\x22\x00";

/// An object's full envelope, and where `raw` (the object's message) lies
/// in it.
pub fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> (Vec<u8>, Range<usize>) {
    let mut out = envelope_head(api_version, kind, raw.len());
    out.reserve(raw.len() + ENVELOPE_TAIL.len());
    let start = out.len();
    out.extend_from_slice(raw);
    let end = out.len();
    out.extend_from_slice(ENVELOPE_TAIL);
    (out, start..end)
}

/// An envelope's `apiVersion`, `kind` and `raw` (the object's message):
/// the inverse of [`envelope`]. `body` starts with the magic; fields 3 and
/// 4 (`contentEncoding`, `contentType`) must be empty, as the apiserver
/// writes them.
pub fn open_envelope(body: &[u8]) -> Result<(&str, &str, &[u8]), TranscodeError> {
    let bad = |what: &str| TranscodeError(what.to_string());
    let e = body
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| bad("no protobuf magic"))?;
    let (mut tm, mut raw) = (None, None);
    for (n, _, r) in fields(e).ok_or_else(|| bad("malformed envelope"))? {
        match n {
            1 => tm = Some(&e[r]),
            2 => raw = Some(&e[r]),
            3 | 4 if r.is_empty() => {}
            _ => return Err(TranscodeError(format!("envelope field {n}"))),
        }
    }
    let tm = tm.unwrap_or_default();
    let text = |n| match find_field(tm, n) {
        Some(r) => std::str::from_utf8(&tm[r]).map_err(|_| bad("type meta")),
        None => Ok(""),
    };
    Ok((text(1)?, text(2)?, raw.unwrap_or_default()))
}

/// The JSON the apiserver sends for a built-in object stored or sent in
/// protobuf (`body`: an envelope, as etcd holds it with the apiserver's
/// default `--storage-media-type`), with its `kind` and `apiVersion`.
pub fn object_json(body: &[u8]) -> Result<Vec<u8>, TranscodeError> {
    let (api_version, kind, raw) = open_envelope(body)?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let message = message_for(group, version, kind)
        .ok_or_else(|| TranscodeError(format!("no message for {api_version} {kind}")))?;
    let mut out = Vec::with_capacity(raw.len() * 2);
    to_json(raw, message, Some((kind, api_version)), &mut out)?;
    Ok(out)
}

/// A watch stream frame: the big-endian length, then
/// `WatchEvent{type, object: {raw: envelope}}`.
pub fn watch_frame(event_type: &str, envelope: &[u8]) -> Vec<u8> {
    let raw_ext = field_len(1, envelope.len());
    let event = field_len(1, event_type.len()) + field_len(2, raw_ext);
    let mut out = Vec::with_capacity(4 + event);
    out.extend_from_slice(&(event as u32).to_be_bytes());
    put_bytes(&mut out, 1, event_type.as_bytes());
    put_header(&mut out, 2, raw_ext);
    put_bytes(&mut out, 1, envelope);
    out
}

/// The byte range of the body of the first length-delimited field
/// `number` in `message`, if any.
pub fn find_field(message: &[u8], number: u32) -> Option<Range<usize>> {
    fields(message)?
        .into_iter()
        .find(|(n, wire, _)| *n == number && *wire == WireType::LengthDelimited)
        .map(|(_, _, range)| range)
}

/// The top-level fields of `message`: number, wire type, and the byte
/// range of the value (a length-delimited field's body, without its
/// length); `None` when the message is malformed.
pub fn fields(message: &[u8]) -> Option<Vec<(u32, WireType, Range<usize>)>> {
    let mut buf = message;
    let total = message.len();
    let mut out = Vec::new();
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf).ok()?;
        let at = total - buf.len();
        let len = match wire {
            WireType::Varint => {
                decode_varint(&mut buf).ok()?;
                out.push((tag, wire, at..total - buf.len()));
                continue;
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => usize::try_from(decode_varint(&mut buf).ok()?).ok()?,
            WireType::StartGroup | WireType::EndGroup => return None,
        };
        let start = total - buf.len();
        buf = buf.get(len..)?;
        out.push((tag, wire, start..start + len));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        let pod = message_for("", "v1", "Pod").unwrap();
        assert_eq!(pod.name, "k8s.io.api.core.v1.Pod");
        assert_eq!(field_number(pod, "metadata"), Some(1));
        assert!(message_for("discovery.k8s.io", "v1", "EndpointSlice").is_some());
        assert!(message_for("example.com", "v1", "Widget").is_none());
        let list =
            message("k8s.io.apimachinery.pkg.apis.meta.v1beta1.PartialObjectMetadataList").unwrap();
        assert_eq!(field_number(list, "items"), Some(1));
        // Sorted, so that binary search finds every name.
        assert!(schema::MESSAGES.windows(2).all(|w| w[0].name < w[1].name));
    }

    #[test]
    fn envelope_and_frame_layout() {
        let (env, raw) = envelope("v1", "Pod", b"\x0a\x00");
        assert_eq!(
            env,
            b"k8s\0\x0a\x09\x0a\x02v1\x12\x03Pod\x12\x02\x0a\x00\x1a\x00\x22\x00".to_vec()
        );
        assert_eq!(&env[raw], b"\x0a\x00");
        let frame = watch_frame("ADDED", &env);
        let len = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        assert_eq!(len, frame.len() - 4);
        let event = &frame[4..];
        let object = find_field(event, 2).unwrap();
        let raw = find_field(&event[object.clone()], 1).unwrap();
        assert_eq!(&event[object][raw], env.as_slice());
    }
}
