//! Reading upstream in protobuf (`cache.upstreamEncoding: Protobuf`): a
//! list page or a watch event as kube-apiserver sends it
//! (`staging/src/k8s.io/apimachinery/pkg/runtime/serializer/protobuf/`,
//! see `apimachinery::protobuf`), turned into the JSON the apiserver would
//! have sent for the same objects (`apimachinery::protobuf::to_json`), which
//! is what the cache holds.
//!
//! An object that cannot be transcoded exactly is [`Undecodable`]: the
//! reflector then reads the resource in JSON from then on.

use apimachinery::protobuf::{self, Message, fields, find_field, to_json};

use crate::cache::encode::ProtoCodec;

/// A list's `Accept`: protobuf, or JSON from a server that cannot encode
/// the kind in protobuf (as client-go asks,
/// `application/vnd.kubernetes.protobuf,application/json`).
pub const LIST_ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";
/// A watch's `Accept`: length-prefixed frames, or JSON as for a list.
pub const WATCH_ACCEPT: &str = "application/vnd.kubernetes.protobuf;stream=watch, application/json";

/// What could not be read as the apiserver's protobuf, or not written as
/// its JSON.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Undecodable(pub String);

fn undecodable(what: impl Into<String>) -> Undecodable {
    Undecodable(what.into())
}

/// Whether a response's `Content-Type` is protobuf (an apiserver answers
/// JSON for what it cannot encode in protobuf).
pub fn is_protobuf(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(protobuf::CONTENT_TYPE))
}

/// A `runtime.Unknown` envelope (after the magic): its type meta's
/// `apiVersion` and `kind`, and its `raw`.
fn envelope(body: &[u8]) -> Result<(&str, &str, &[u8]), Undecodable> {
    protobuf::open_envelope(body).map_err(|e| undecodable(e.0))
}

fn status_message() -> Option<&'static Message> {
    protobuf::message("k8s.io.apimachinery.pkg.apis.meta.v1.Status")
}

/// The JSON of a `Status` sent in protobuf (an error's body), if `body` is
/// one.
pub fn status_json(body: &[u8]) -> Option<Vec<u8>> {
    let (api_version, kind, raw) = envelope(body).ok()?;
    if kind != "Status" {
        return None;
    }
    let mut out = Vec::new();
    to_json(raw, status_message()?, Some((kind, api_version)), &mut out).ok()?;
    Some(out)
}

/// One page of a list: its resourceVersion and continue token.
#[derive(Debug)]
pub struct ListPage {
    pub resource_version: String,
    pub continue_token: Option<String>,
}

/// Reads a list page of `codec`'s kind, giving `item` each item in turn as
/// the JSON object the apiserver sends alone (with `kind` and
/// `apiVersion`). One buffer serves every item: a page's items held as
/// JSON at once were 1.5 MB of a 500-pod page, left to the allocator
/// when the page was done.
pub fn list_page(
    body: &[u8],
    codec: &ProtoCodec,
    mut item: impl FnMut(&[u8]),
) -> Result<ListPage, Undecodable> {
    let (_, kind, raw) = envelope(body)?;
    if kind != format!("{}List", codec.kind) {
        return Err(undecodable(format!("a {kind}, not a {}List", codec.kind)));
    }
    let mut page = ListPage {
        resource_version: String::new(),
        continue_token: None,
    };
    let mut json = Vec::new();
    let string = |b: &[u8]| {
        std::str::from_utf8(b)
            .map(str::to_string)
            .map_err(|_| undecodable("list metadata"))
    };
    // `XList`: metadata (`ListMeta`) 1, items 2.
    for (n, _, r) in fields(raw).ok_or_else(|| undecodable("malformed list"))? {
        let value = &raw[r];
        match n {
            1 => {
                // `ListMeta`: selfLink 1, resourceVersion 2, continue 3,
                // remainingItemCount 4.
                for (m, _, r) in fields(value).ok_or_else(|| undecodable("malformed list"))? {
                    match m {
                        2 => page.resource_version = string(&value[r])?,
                        3 => page.continue_token = Some(string(&value[r])?),
                        _ => {}
                    }
                }
            }
            2 => {
                json.clear();
                json.reserve(value.len() * 2);
                to_json(
                    value,
                    codec.message(),
                    Some((&codec.kind, &codec.api_version)),
                    &mut json,
                )
                .map_err(|e| undecodable(e.to_string()))?;
                item(&json);
            }
            _ => return Err(undecodable(format!("list field {n}"))),
        }
    }
    Ok(page)
}

/// The length of the watch frame at the start of `buf` (its 4-byte
/// big-endian prefix), if `buf` holds the prefix.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    let head: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    Some(u32::from_be_bytes(head) as usize)
}

/// A watch frame's `WatchEvent` (after the length): its type and its
/// object as the JSON the apiserver sends in a JSON watch.
pub fn event(frame: &[u8], codec: &ProtoCodec) -> Result<(String, Vec<u8>), Undecodable> {
    let (mut kind, mut object) = (None, None);
    for (n, _, r) in fields(frame).ok_or_else(|| undecodable("malformed watch event"))? {
        match n {
            1 => {
                kind = Some(
                    std::str::from_utf8(&frame[r])
                        .map_err(|_| undecodable("event type"))?
                        .to_string(),
                );
            }
            // `RawExtension{raw: 1}`.
            2 => {
                let ext = &frame[r];
                object = find_field(ext, 1).map(|raw| &ext[raw]);
            }
            _ => return Err(undecodable(format!("watch event field {n}"))),
        }
    }
    let (kind, object) = kind
        .zip(object)
        .ok_or_else(|| undecodable("watch event without type or object"))?;
    let (api_version, object_kind, raw) = envelope(object)?;
    let message = if object_kind == codec.kind {
        codec.message()
    } else if object_kind == "Status" {
        status_message().ok_or_else(|| undecodable("no Status message"))?
    } else {
        return Err(undecodable(format!(
            "a {object_kind} in a watch of {}",
            codec.kind
        )));
    };
    let mut json = Vec::with_capacity(raw.len() * 2);
    to_json(raw, message, Some((object_kind, api_version)), &mut json)
        .map_err(|e| undecodable(e.to_string()))?;
    Ok((kind, json))
}
