//! What a reflector reads of the apiserver's answers, in JSON or in
//! protobuf (`application/vnd.kubernetes.protobuf`, what kubelet,
//! kube-proxy, Cilium's agent and the node proxy's caches ask for): a
//! list's resourceVersion and continue token, and each watch event's type
//! and resourceVersion. Nothing else of an object is decoded.

use anyhow::{Context as _, Result, anyhow, bail};
use apimachinery::protobuf::{fields, find_field, open_envelope};
use serde::Deserialize;

/// `ObjectMeta.resourceVersion`'s field number
/// (`k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta`); every built-in
/// object has its `ObjectMeta` as field 1.
const OBJECT_META_RESOURCE_VERSION: u32 = 6;
/// `ListMeta.resourceVersion` and `ListMeta.continue`; every built-in
/// list has its `ListMeta` as field 1.
const LIST_META_RESOURCE_VERSION: u32 = 2;
const LIST_META_CONTINUE: u32 = 3;
/// `Status.code`.
const STATUS_CODE: u32 = 6;

/// How an answer is encoded, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Protobuf,
}

impl Encoding {
    pub fn of(content_type: Option<&http::HeaderValue>) -> Encoding {
        match content_type {
            Some(v)
                if v.as_bytes()
                    .starts_with(apimachinery::protobuf::CONTENT_TYPE.as_bytes()) =>
            {
                Encoding::Protobuf
            }
            _ => Encoding::Json,
        }
    }
}

/// A list page's resourceVersion and continue token.
#[derive(Debug, PartialEq, Eq)]
pub struct Page {
    pub resource_version: String,
    pub continue_token: Option<String>,
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
    pub continue_token: Option<String>,
}

/// Reads a list page.
pub fn parse_page(body: &[u8], encoding: Encoding) -> Result<Page> {
    let (resource_version, continue_token) = match encoding {
        Encoding::Json => {
            let page: ListMeta = serde_json::from_slice(body)?;
            (page.metadata.resource_version, page.metadata.continue_token)
        }
        Encoding::Protobuf => {
            let (_, _, raw) = open_envelope(body).map_err(|e| anyhow!("a list: {}", e.0))?;
            let meta = field(raw, 1).unwrap_or_default();
            (
                text(meta, LIST_META_RESOURCE_VERSION)?,
                Some(text(meta, LIST_META_CONTINUE)?),
            )
        }
    };
    Ok(Page {
        resource_version,
        continue_token: continue_token.filter(|c| !c.is_empty()),
    })
}

/// One watch event, as far as a reflector needs it.
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

/// Parses one watch event line (JSON).
pub fn parse_event(line: &[u8]) -> Result<Event> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(Event::Blank);
    }
    let e: WireEvent = serde_json::from_slice(line).context("a malformed watch event")?;
    event(&e.kind, &e.object.metadata.resource_version, e.object.code)
}

/// Parses one protobuf watch frame's `WatchEvent{type, object: {raw}}`
/// (without the 4-byte length before it).
pub fn parse_frame(frame: &[u8]) -> Result<Event> {
    let kind = text(frame, 1)?;
    let raw_extension = field(frame, 2).ok_or_else(|| anyhow!("a {kind} frame, no object"))?;
    let envelope = field(raw_extension, 1).unwrap_or_default();
    let (_, _, object) = open_envelope(envelope).map_err(|e| anyhow!("a {kind} frame: {}", e.0))?;
    if kind == "ERROR" {
        let code = varint(object, STATUS_CODE).unwrap_or_default();
        return event(&kind, "", u16::try_from(code).unwrap_or_default());
    }
    let meta = field(object, 1).unwrap_or_default();
    event(&kind, &text(meta, OBJECT_META_RESOURCE_VERSION)?, 0)
}

/// Splits the next whole frame of a protobuf watch stream (a 4-byte
/// big-endian length, then the frame) off `buf`, if it holds one.
pub fn next_frame(buf: &mut bytes::BytesMut) -> Option<bytes::BytesMut> {
    let len = u32::from_be_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    if buf.len() < 4 + len {
        return None;
    }
    let mut frame = buf.split_to(4 + len);
    Some(frame.split_off(4))
}

fn event(kind: &str, resource_version: &str, code: u16) -> Result<Event> {
    let rv = || -> Result<u64> {
        resource_version
            .parse()
            .map_err(|_| anyhow!("a {kind} event without a resourceVersion"))
    };
    match kind {
        "ADDED" | "MODIFIED" | "DELETED" => Ok(Event::Object(rv()?)),
        "BOOKMARK" => Ok(Event::Bookmark(rv()?)),
        "ERROR" => Ok(Event::Error(code)),
        other => bail!("unknown watch event type {other:?}"),
    }
}

/// The body of length-delimited field `number` of `message`.
fn field(message: &[u8], number: u32) -> Option<&[u8]> {
    find_field(message, number).and_then(|r| message.get(r))
}

/// A string field ("" when absent).
fn text(message: &[u8], number: u32) -> Result<String> {
    let bytes = field(message, number).unwrap_or_default();
    Ok(std::str::from_utf8(bytes)
        .context("a string field not in UTF-8")?
        .to_string())
}

/// A varint field.
fn varint(message: &[u8], number: u32) -> Option<u64> {
    let (_, _, range) = fields(message)?
        .into_iter()
        .find(|(n, wire, _)| *n == number && *wire == prost::encoding::WireType::Varint)?;
    let mut bytes = message.get(range)?;
    prost::encoding::decode_varint(&mut bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use apimachinery::protobuf::{envelope, field_number, message, put_bytes, put_varint};

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
        let json = br#"{"kind":"PodList","metadata":{"resourceVersion":"9","continue":"abc"},"items":[{"metadata":{"name":"x"}}]}"#;
        let page = Page {
            resource_version: "9".into(),
            continue_token: Some("abc".into()),
        };
        assert_eq!(parse_page(json, Encoding::Json).unwrap(), page);

        let mut meta = Vec::new();
        put_bytes(&mut meta, LIST_META_RESOURCE_VERSION, b"9");
        put_bytes(&mut meta, LIST_META_CONTINUE, b"abc");
        let mut list = Vec::new();
        put_bytes(&mut list, 1, &meta);
        put_bytes(&mut list, 2, b"an item");
        let (body, _) = envelope("v1", "PodList", &list);
        assert_eq!(parse_page(&body, Encoding::Protobuf).unwrap(), page);

        let mut last = Vec::new();
        put_bytes(&mut last, LIST_META_RESOURCE_VERSION, b"10");
        let mut list = Vec::new();
        put_bytes(&mut list, 1, &last);
        let (body, _) = envelope("v1", "PodList", &list);
        let page = parse_page(&body, Encoding::Protobuf).unwrap();
        assert_eq!(
            (page.resource_version.as_str(), page.continue_token),
            ("10", None)
        );
    }

    /// A protobuf watch frame of `kind` whose object has `meta` as field
    /// 1, as the apiserver writes it.
    fn frame(kind: &str, object_kind: &str, object: &[u8]) -> Vec<u8> {
        let (env, _) = envelope("v1", object_kind, object);
        apimachinery::protobuf::watch_frame(kind, &env)
    }

    #[test]
    fn parses_protobuf_frames() {
        let mut meta = Vec::new();
        put_bytes(&mut meta, 1, b"svc-000");
        put_bytes(&mut meta, OBJECT_META_RESOURCE_VERSION, b"1234");
        let mut service = Vec::new();
        put_bytes(&mut service, 1, &meta);
        put_bytes(&mut service, 2, b"spec");

        let mut stream = bytes::BytesMut::new();
        stream.extend_from_slice(&frame("MODIFIED", "Service", &service));
        stream.extend_from_slice(&frame("BOOKMARK", "Service", &service));
        let mut status = Vec::new();
        put_bytes(&mut status, 4, b"Expired");
        put_varint(&mut status, STATUS_CODE, 410);
        stream.extend_from_slice(&frame("ERROR", "Status", &status));
        let whole = stream.clone();
        // Fed a byte at a time, frames come out whole.
        let mut buf = bytes::BytesMut::new();
        let mut events = Vec::new();
        for b in whole {
            buf.extend_from_slice(&[b]);
            while let Some(f) = next_frame(&mut buf) {
                events.push(parse_frame(&f).unwrap());
            }
        }
        assert_eq!(
            events,
            [
                Event::Object(1234),
                Event::Bookmark(1234),
                Event::Error(410)
            ]
        );
        assert!(buf.is_empty());
        assert!(parse_frame(b"\x0a\x05ADDED").is_err());
    }

    #[test]
    fn field_numbers_are_the_schemas() {
        let number = |m: &str, f: &str| {
            field_number(
                message(&format!("k8s.io.apimachinery.pkg.apis.meta.v1.{m}")).unwrap(),
                f,
            )
        };
        assert_eq!(
            number("ObjectMeta", "resourceVersion"),
            Some(OBJECT_META_RESOURCE_VERSION)
        );
        assert_eq!(
            number("ListMeta", "resourceVersion"),
            Some(LIST_META_RESOURCE_VERSION)
        );
        assert_eq!(number("ListMeta", "continue"), Some(LIST_META_CONTINUE));
        assert_eq!(number("Status", "code"), Some(STATUS_CODE));
        assert_eq!(number("WatchEvent", "type"), Some(1));
        assert_eq!(number("WatchEvent", "object"), Some(2));
        for kind in ["Pod", "Service", "Node", "NetworkPolicy"] {
            let m = ["", "networking.k8s.io"]
                .iter()
                .find_map(|g| apimachinery::protobuf::message_for(g, "v1", kind));
            assert!(m.is_some_and(|m| field_number(m, "metadata") == Some(1)));
        }
        for list in ["PodList", "ServiceList", "NodeList"] {
            let m = apimachinery::protobuf::message_for("", "v1", list).unwrap();
            assert_eq!(field_number(m, "metadata"), Some(1));
        }
    }
}
