//! JSON to protobuf, as kube-apiserver's Go marshaller would write the
//! object the JSON decodes to.
//!
//! The JSON is parsed once, guided by the schema (each key's field says how
//! to read its value), then written in field-number order: a
//! non-pointer Go field written even when empty (absent from JSON because
//! of `omitempty`); pointers, `[]byte` and named slices only when set;
//! repeated fields element by element; maps in sorted key order; the
//! special types (`Time`, `MicroTime`, `Quantity`, `IntOrString`,
//! `RawExtension`, `FieldsV1`) as their custom marshallers write them
//! (`staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/time_proto.go` and
//! friends). Varints and keys are written with `prost`.
//!
//! Strict: a JSON key the type does not have, or a value of the wrong JSON
//! type, is an error, never silently dropped (the object then is not
//! served in protobuf).
//!
//! [`transcode`] first tries the streaming transcoder (`protobuf::stream`),
//! which writes the same bytes without the parsed tree, about 1.7 times as
//! fast; what it does not take (duplicate keys, an embedded struct's keys
//! apart, anything it doubts) is parsed here.

use std::borrow::Cow;
use std::fmt;

use base64::Engine;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
use serde::de::{Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::schema::MESSAGES;
use super::schema_types::{Cardinality, Field, FieldKind, Message, Presence, Special};

/// Why JSON could not be transcoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranscodeError(pub String);

impl fmt::Display for TranscodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TranscodeError {}

type Result<T> = std::result::Result<T, TranscodeError>;

fn err(what: impl Into<String>) -> TranscodeError {
    TranscodeError(what.into())
}

/// `time.Time{}.Unix()`: the zero time, which marshals as an empty message.
pub(super) const ZERO_TIME_SECONDS: i64 = -62_135_596_800;

/// A JSON string, borrowed when it has no escapes.
struct Str<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Wrap<'a>(#[serde(borrow)] Cow<'a, str>);
        Wrap::deserialize(d).map(|w| Str(w.0))
    }
}

/// A message's JSON object, parsed in one pass guided by the schema: the
/// field each key is, and its value.
struct Obj<'a>(Vec<(&'static Field, V<'a>)>);

/// A value in an [`Obj`]. A plain message's object, a repeated field's
/// elements and a map's entries are parsed in the same pass; scalars and
/// the special types stay JSON text, read when encoded. (Parsing each
/// level from its text again cost a scan of the object per level of
/// nesting: more than half of a pod's encoding.)
enum V<'a> {
    Raw(&'a RawValue),
    Str(Cow<'a, str>),
    Msg(Obj<'a>),
    List(Vec<V<'a>>),
    Map(Vec<(Str<'a>, V<'a>)>),
    Null,
}

impl<'a> V<'a> {
    fn is_null(&self) -> bool {
        match self {
            V::Null => true,
            V::Raw(r) => r.get() == "null",
            _ => false,
        }
    }

    /// A string field's value (`null`: empty).
    fn text(&self, what: &str) -> Result<Cow<'a, str>> {
        match self {
            V::Str(s) => Ok(s.clone()),
            V::Null => Ok(Cow::Borrowed("")),
            V::Raw(r) if r.get() == "null" => Ok(Cow::Borrowed("")),
            V::Raw(r) => Ok(parse::<Str<'a>>(r.get(), what)?.0),
            _ => Err(err(format!("{what}: not a string"))),
        }
    }

    /// The JSON text of a scalar or special-type value.
    fn raw(&self, what: &str) -> Result<&'a RawValue> {
        match self {
            V::Raw(r) => Ok(r),
            V::Null => parse("null", what),
            _ => Err(err(format!("{what}: not a scalar"))),
        }
    }
}

/// What a JSON key of a message is.
enum Key {
    Field(&'static Field),
    Ignored,
}

/// The fields a test hides from the schema: an older proxy's, which does
/// not know fields a newer apiserver sends (feature `test-schema`).
#[cfg(feature = "test-schema")]
static HIDDEN: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// Hides fields from the schema, as if this build were older than the
/// apiserver: each `(message, json)` is a message's full protobuf name
/// (`k8s.io.api.core.v1.PodSpec`) and a field's JSON name. Only the first
/// call counts. Test-only (feature `test-schema`).
#[cfg(feature = "test-schema")]
pub fn hide_fields(fields: Vec<(String, String)>) {
    let _ = HIDDEN.set(fields);
}

#[cfg(feature = "test-schema")]
pub(super) fn hidden(message: &Message, key: &str) -> bool {
    HIDDEN
        .get()
        .is_some_and(|h| h.iter().any(|(m, k)| m == message.name && k == key))
}

/// Whether a test hid any field (the streaming transcoder then leaves
/// every object to this one, which knows how to hide them).
#[cfg(feature = "test-schema")]
pub(super) fn any_hidden() -> bool {
    HIDDEN.get().is_some_and(|h| !h.is_empty())
}

#[cfg(not(feature = "test-schema"))]
pub(super) fn any_hidden() -> bool {
    false
}

#[cfg(not(feature = "test-schema"))]
pub(super) fn hidden(_: &Message, _: &str) -> bool {
    false
}

/// The field of `message` (or of a struct it embeds) that `key` is.
fn key_of(message: &'static Message, key: &str) -> Option<Key> {
    if hidden(message, key) {
        return None;
    }
    for f in message.fields {
        match f.presence {
            Presence::Inline => {
                if let FieldKind::M(i) = f.kind
                    && let Some(found) = MESSAGES.get(usize::from(i)).and_then(|m| key_of(m, key))
                {
                    return Some(found);
                }
            }
            _ if f.json == key => return Some(Key::Field(f)),
            _ => {}
        }
    }
    message.ignored.contains(&key).then_some(Key::Ignored)
}

/// A plain message's object (strict: a key the type does not have is an
/// error).
#[derive(Clone, Copy)]
struct MsgSeed(&'static Message);

impl<'de> DeserializeSeed<'de> for MsgSeed {
    type Value = Obj<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Obj<'de>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MsgSeed {
    type Value = Obj<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a JSON object ({})", self.0.name)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Obj<'de>, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8));
        while let Some(key) = map.next_key::<Str<'de>>()? {
            match key_of(self.0, &key.0) {
                Some(Key::Field(f)) => {
                    let value = map.next_value_seed(FieldSeed(f))?;
                    entries.push((f, value));
                }
                Some(Key::Ignored) => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
                None => {
                    return Err(serde::de::Error::custom(format!(
                        "{} has no field {:?}",
                        self.0.name, key.0
                    )));
                }
            }
        }
        Ok(Obj(entries))
    }
}

/// A field's value: one, repeated (a JSON array) or a map (a JSON object).
#[derive(Clone, Copy)]
struct FieldSeed(&'static Field);

impl<'de> DeserializeSeed<'de> for FieldSeed {
    type Value = V<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<V<'de>, D::Error> {
        match self.0.cardinality {
            Cardinality::One => ElemSeed(self.0.kind).deserialize(d),
            Cardinality::Repeated | Cardinality::Map => d.deserialize_option(self),
        }
    }
}

impl<'de> Visitor<'de> for FieldSeed {
    type Value = V<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: a JSON array or object", self.0.json)
    }
    fn visit_none<E: serde::de::Error>(self) -> std::result::Result<V<'de>, E> {
        Ok(V::Null)
    }
    fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<V<'de>, E> {
        Ok(V::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<V<'de>, D::Error> {
        match self.0.cardinality {
            Cardinality::Map => d.deserialize_map(self),
            _ => d.deserialize_seq(self),
        }
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<V<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(4));
        while let Some(item) = seq.next_element_seed(ElemSeed(self.0.kind))? {
            items.push(item);
        }
        Ok(V::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<V<'de>, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(4));
        while let Some(key) = map.next_key::<Str<'de>>()? {
            let value = map.next_value_seed(ElemSeed(self.0.kind))?;
            entries.push((key, value));
        }
        Ok(V::Map(entries))
    }
}

/// One value of a field's kind: a plain message's object parsed now,
/// anything else kept as its text.
#[derive(Clone, Copy)]
struct ElemSeed(FieldKind);

impl<'de> DeserializeSeed<'de> for ElemSeed {
    type Value = V<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<V<'de>, D::Error> {
        match self.0 {
            FieldKind::M(i) => match MESSAGES.get(usize::from(i)) {
                Some(m) if m.special == Special::Plain => OptMsg(m).deserialize(d),
                _ => <&RawValue>::deserialize(d).map(V::Raw),
            },
            FieldKind::Str => d.deserialize_option(OptStr),
            _ => <&RawValue>::deserialize(d).map(V::Raw),
        }
    }
}

/// A string, or `null`.
struct OptStr;

impl<'de> Visitor<'de> for OptStr {
    type Value = V<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON string or null")
    }
    fn visit_none<E: serde::de::Error>(self) -> std::result::Result<V<'de>, E> {
        Ok(V::Null)
    }
    fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<V<'de>, E> {
        Ok(V::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<V<'de>, D::Error> {
        Str::deserialize(d).map(|s| V::Str(s.0))
    }
}

/// A plain message's object, or `null`.
#[derive(Clone, Copy)]
struct OptMsg(&'static Message);

impl<'de> DeserializeSeed<'de> for OptMsg {
    type Value = V<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<V<'de>, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for OptMsg {
    type Value = V<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a JSON object ({}) or null", self.0.name)
    }
    fn visit_none<E: serde::de::Error>(self) -> std::result::Result<V<'de>, E> {
        Ok(V::Null)
    }
    fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<V<'de>, E> {
        Ok(V::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<V<'de>, D::Error> {
        MsgSeed(self.0).deserialize(d).map(V::Msg)
    }
}

impl<'a> Obj<'a> {
    /// The value of `field` (Go's decoder keeps the last of duplicate
    /// keys); `null` counts as absent.
    fn get(&self, field: &'static Field) -> Option<&V<'a>> {
        self.0
            .iter()
            .rev()
            .find(|(f, _)| std::ptr::eq(*f, field))
            .map(|(_, v)| v)
            .filter(|v| !v.is_null())
    }
}

/// A JSON array as its elements' bytes.
struct Arr<'a>(Vec<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Arr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Arr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON array")
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Arr<'de>, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(4));
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    items.push(item);
                }
                Ok(Arr(items))
            }
        }
        d.deserialize_seq(V)
    }
}

fn parse<'a, T: Deserialize<'a>>(raw: &'a str, what: &str) -> Result<T> {
    serde_json::from_str(raw).map_err(|e| err(format!("{what}: {e}")))
}

fn parse_seed<'a, S: DeserializeSeed<'a>>(text: &'a str, seed: S, what: &str) -> Result<S::Value> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = seed
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| err(format!("{what}: {e}")))?;
    Ok(value)
}

/// Encodes the JSON object `json` as the protobuf message `message`
/// (without the `k8s\0` envelope), appending to `out`.
///
/// # Errors
/// [`TranscodeError`] when the JSON is not an object of that type.
pub fn transcode(json: &[u8], message: &'static Message, out: &mut Vec<u8>) -> Result<()> {
    let text = std::str::from_utf8(json).map_err(|e| err(format!("not UTF-8: {e}")))?;
    let start = out.len();
    if super::stream::transcode(text, message, out).is_ok() {
        return Ok(());
    }
    out.truncate(start);
    reference(text, message, out)
}

/// The same as [`transcode`] by the tree transcoder alone, which the
/// streaming one (`protobuf::stream`) falls back to: for the differential
/// tests and the bench.
///
/// # Errors
/// [`TranscodeError`] when the JSON is not an object of that type.
#[doc(hidden)]
pub fn transcode_reference(
    json: &[u8],
    message: &'static Message,
    out: &mut Vec<u8>,
) -> Result<()> {
    let text = std::str::from_utf8(json).map_err(|e| err(format!("not UTF-8: {e}")))?;
    reference(text, message, out)
}

fn reference(text: &str, message: &'static Message, out: &mut Vec<u8>) -> Result<()> {
    if message.special == Special::Plain {
        let value = parse_seed(text, OptMsg(message), message.name)?;
        return encode_message(&value, message, out);
    }
    let raw: &RawValue = parse(text, message.name)?;
    encode_body(raw.get(), message, out)
}

/// A message-typed value: a plain message's object, or the text of a
/// special type.
fn encode_message(value: &V<'_>, message: &'static Message, out: &mut Vec<u8>) -> Result<()> {
    match value {
        V::Msg(obj) => encode_fields(obj, message, out),
        V::Null if message.special == Special::Plain => {
            encode_fields(&Obj(Vec::new()), message, out)
        }
        other => encode_body(other.raw(message.name)?.get(), message, out),
    }
}

/// Writes `number` as a length-delimited field whose body `body` writes,
/// the length in front (reserved as one byte, widened if the body is
/// 128 bytes or more).
fn nested(
    out: &mut Vec<u8>,
    number: u32,
    body: impl FnOnce(&mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    encode_key(number, WireType::LengthDelimited, out);
    let at = out.len();
    out.push(0);
    body(out)?;
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
    } else {
        let mut prefix = Vec::with_capacity(encoded_len_varint(len as u64));
        encode_varint(len as u64, &mut prefix);
        out.splice(at..at + 1, prefix);
    }
    Ok(())
}

pub(super) fn bytes_field(out: &mut Vec<u8>, number: u32, value: &[u8]) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

pub(super) fn varint_field(out: &mut Vec<u8>, number: u32, value: u64) {
    encode_key(number, WireType::Varint, out);
    encode_varint(value, out);
}

/// A message's body from its JSON value's text (`null` is the zero value).
pub(super) fn encode_body(text: &str, message: &'static Message, out: &mut Vec<u8>) -> Result<()> {
    match message.special {
        Special::Plain => {
            if text == "null" {
                return encode_fields(&Obj(Vec::new()), message, out);
            }
            let obj = parse_seed(text, MsgSeed(message), message.name)?;
            encode_fields(&obj, message, out)
        }
        Special::Time | Special::MicroTime => {
            if text == "null" {
                return Ok(());
            }
            let s: Str<'_> = parse(text, message.name)?;
            let ts: jiff::Timestamp =
                s.0.parse()
                    .map_err(|e| err(format!("{}: {e}", message.name)))?;
            let (mut seconds, mut nanos) = (ts.as_second(), ts.subsec_nanosecond());
            if nanos < 0 {
                seconds -= 1;
                nanos += 1_000_000_000;
            }
            if seconds == ZERO_TIME_SECONDS && nanos == 0 {
                return Ok(());
            }
            let nanos = if message.special == Special::MicroTime {
                nanos - nanos % 1000
            } else {
                0
            };
            varint_field(out, 1, seconds as u64);
            varint_field(out, 2, i64::from(nanos) as u64);
            Ok(())
        }
        Special::Quantity => {
            let s = if text.starts_with('"') {
                parse::<Str<'_>>(text, message.name)?.0
            } else if text == "null" {
                Cow::Borrowed("0")
            } else {
                // A JSON number: its text.
                let _: serde_json::Number = parse(text, message.name)?;
                Cow::Borrowed(text)
            };
            bytes_field(out, 1, s.as_bytes());
            Ok(())
        }
        Special::IntOrString => {
            let (kind, int, s) = if text == "null" {
                (0, 0, Cow::Borrowed(""))
            } else if text.starts_with('"') {
                (1, 0, parse::<Str<'_>>(text, message.name)?.0)
            } else {
                (0, parse::<i32>(text, message.name)?, Cow::Borrowed(""))
            };
            varint_field(out, 1, kind);
            varint_field(out, 2, i64::from(int) as u64);
            bytes_field(out, 3, s.as_bytes());
            Ok(())
        }
        Special::RawExtension | Special::FieldsV1 => {
            if text != "null" && !text.is_empty() {
                bytes_field(out, 1, text.as_bytes());
            }
            Ok(())
        }
        Special::Duration => {
            let s: Str<'_> = parse(text, message.name)?;
            let nanos = go_duration(&s.0).ok_or_else(|| err(format!("bad duration {:?}", s.0)))?;
            varint_field(out, 1, nanos as u64);
            Ok(())
        }
        Special::Wrapped => {
            if text == "null" {
                return Ok(());
            }
            let field = message.fields.first().ok_or_else(|| err(message.name))?;
            let items: Arr<'_> = parse(text, message.name)?;
            for item in items.0 {
                encode_value(&V::Raw(item), field, out)?;
            }
            Ok(())
        }
        Special::Unsupported => Err(err(format!("{} is not supported", message.name))),
    }
}

fn sub(kind: FieldKind) -> Result<&'static Message> {
    match kind {
        FieldKind::M(i) => MESSAGES
            .get(usize::from(i))
            .ok_or_else(|| err("schema index out of range")),
        _ => Err(err("not a message")),
    }
}

/// The fields of `message` when its JSON has none (an empty object or
/// `null`): its always-written fields' zero values.
pub(super) fn encode_zero_fields(message: &'static Message, out: &mut Vec<u8>) -> Result<()> {
    encode_fields(&Obj(Vec::new()), message, out)
}

/// The fields of `message`, from `obj` (the JSON object it, or the
/// message embedding it, was written as).
fn encode_fields(obj: &Obj<'_>, message: &'static Message, out: &mut Vec<u8>) -> Result<()> {
    for field in message.fields {
        if field.presence == Presence::Inline {
            let inner = sub(field.kind)?;
            nested(out, field.number, |out| encode_fields(obj, inner, out))?;
            continue;
        }
        let value = obj.get(field);
        match field.cardinality {
            Cardinality::One => match value {
                Some(v) => encode_value(v, field, out)?,
                None if field.presence == Presence::Always => encode_zero(field, out)?,
                None => {}
            },
            Cardinality::Repeated => match value {
                Some(V::List(items)) => {
                    for item in items {
                        encode_value(item, field, out)?;
                    }
                }
                Some(_) => return Err(err(format!("{}: not an array", field.json))),
                None => {}
            },
            Cardinality::Map => match value {
                Some(V::Map(map)) => {
                    let mut entries: Vec<&(Str<'_>, V<'_>)> = map.iter().collect();
                    // Go's decoder keeps the last of duplicate keys; the
                    // marshaller writes keys in sorted (byte) order.
                    entries.reverse();
                    entries.sort_by(|a, b| a.0.0.as_bytes().cmp(b.0.0.as_bytes()));
                    entries.dedup_by(|a, b| a.0.0 == b.0.0);
                    for (key, value) in entries {
                        encode_entry(&key.0, value, field, out)?;
                    }
                }
                Some(_) => return Err(err(format!("{}: not an object", field.json))),
                None => {}
            },
        }
    }
    Ok(())
}

/// One map entry: key 1, value 2. A `[]byte` value is written only when
/// not `null`; strings and messages always.
fn encode_entry(key: &str, value: &V<'_>, field: &Field, out: &mut Vec<u8>) -> Result<()> {
    nested(out, field.number, |out| {
        bytes_field(out, 1, key.as_bytes());
        let is_null = value.is_null();
        match field.kind {
            FieldKind::Str => bytes_field(out, 2, value.text(field.json)?.as_bytes()),
            FieldKind::Bytes if is_null => {}
            FieldKind::Bytes => bytes_field(out, 2, &base64_value(value.raw(field.json)?, field)?),
            FieldKind::M(_) => {
                let inner = sub(field.kind)?;
                nested(out, 2, |out| encode_message(value, inner, out))?;
            }
            _ => return Err(err(format!("{}: unsupported map value", field.json))),
        }
        Ok(())
    })
}

fn base64_value(value: &RawValue, field: &Field) -> Result<Vec<u8>> {
    base64_text(value.get(), field)
}

/// A `[]byte` value from its JSON text (a base64 string).
pub(super) fn base64_text(text: &str, field: &Field) -> Result<Vec<u8>> {
    let s: Str<'_> = parse(text, field.json)?;
    base64::engine::general_purpose::STANDARD
        .decode(s.0.as_bytes())
        .map_err(|e| err(format!("{}: {e}", field.json)))
}

/// One value of `field` (a single value or a repeated element).
fn encode_value(value: &V<'_>, field: &Field, out: &mut Vec<u8>) -> Result<()> {
    let number = field.number;
    let scalar = || -> Result<(&RawValue, &str)> {
        let raw = value.raw(field.json)?;
        Ok((raw, raw.get()))
    };
    match field.kind {
        FieldKind::M(_) => {
            let inner = sub(field.kind)?;
            nested(out, number, |out| encode_message(value, inner, out))?;
        }
        FieldKind::Str => bytes_field(out, number, value.text(field.json)?.as_bytes()),
        FieldKind::Bytes => {
            let (value, text) = scalar()?;
            let b = if text == "null" {
                Vec::new()
            } else {
                base64_value(value, field)?
            };
            bytes_field(out, number, &b);
        }
        FieldKind::Bool => {
            let (_, text) = scalar()?;
            let b: Option<bool> = parse(text, field.json)?;
            varint_field(out, number, u64::from(b.unwrap_or(false)));
        }
        FieldKind::I32 => {
            let (_, text) = scalar()?;
            let n: Option<i32> = parse(text, field.json)?;
            varint_field(out, number, i64::from(n.unwrap_or(0)) as u64);
        }
        FieldKind::I64 => {
            let (_, text) = scalar()?;
            let n: Option<i64> = parse(text, field.json)?;
            varint_field(out, number, n.unwrap_or(0) as u64);
        }
        FieldKind::F64 => {
            let (_, text) = scalar()?;
            let n: Option<f64> = parse(text, field.json)?;
            encode_key(number, WireType::SixtyFourBit, out);
            out.extend_from_slice(&n.unwrap_or(0.0).to_bits().to_le_bytes());
        }
    }
    Ok(())
}

/// The zero value of an always-written field absent from JSON.
pub(super) fn encode_zero(field: &Field, out: &mut Vec<u8>) -> Result<()> {
    match field.kind {
        FieldKind::Str | FieldKind::Bytes => bytes_field(out, field.number, b""),
        FieldKind::Bool | FieldKind::I32 | FieldKind::I64 => varint_field(out, field.number, 0),
        FieldKind::F64 => {
            encode_key(field.number, WireType::SixtyFourBit, out);
            out.extend_from_slice(&[0; 8]);
        }
        FieldKind::M(_) => {
            let inner = sub(field.kind)?;
            nested(out, field.number, |out| encode_body("null", inner, out))?;
        }
    }
    Ok(())
}

/// Go's `time.ParseDuration`, in nanoseconds.
fn go_duration(s: &str) -> Option<i64> {
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += number * unit;
    }
    let total = if neg { -total } else { total };
    (total.abs() < 9.3e18).then_some(total.round() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protobuf::message;

    fn enc(json: &str, name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        transcode(json.as_bytes(), message(name).unwrap(), &mut out).unwrap();
        out
    }

    #[test]
    fn object_meta_always_writes_non_pointer_fields() {
        let out = enc(
            r#"{"name":"a","resourceVersion":"5","creationTimestamp":null}"#,
            "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        );
        // name, generateName, namespace, selfLink, uid, resourceVersion,
        // generation, creationTimestamp (zero: empty).
        assert_eq!(
            out,
            b"\x0a\x01a\x12\x00\x1a\x00\x22\x00\x2a\x00\x32\x015\x38\x00\x42\x00".to_vec()
        );
    }

    #[test]
    fn special_types() {
        let t = enc(
            r#"{"creationTimestamp":"2024-01-02T03:04:05Z"}"#,
            "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        );
        let seconds = 1_704_164_645u64;
        let mut want = vec![0x42];
        let mut body = Vec::new();
        varint_field(&mut body, 1, seconds);
        varint_field(&mut body, 2, 0);
        want.push(body.len() as u8);
        want.extend(body);
        assert!(t.windows(want.len()).any(|w| w == want.as_slice()));
        let port = enc(
            r#"{"port":80,"targetPort":"http"}"#,
            "k8s.io.api.core.v1.ServicePort",
        );
        assert!(
            port.windows(12)
                .any(|w| w == b"\x22\x0a\x08\x01\x10\x00\x1a\x04http")
        );
        assert!(go_duration("1h2m3.5s") == Some(3_723_500_000_000));
        assert_eq!(go_duration("-300ms"), Some(-300_000_000));
        assert_eq!(go_duration("5"), None);
    }

    #[test]
    fn maps_are_sorted_and_unknown_keys_refused() {
        let a = enc(
            r#"{"labels":{"b":"2","a":"1"}}"#,
            "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        );
        let b = enc(
            r#"{"labels":{"a":"1","b":"2"}}"#,
            "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        );
        assert_eq!(a, b);
        let mut out = Vec::new();
        let e = transcode(
            br#"{"metadata":{},"bogus":1}"#,
            message("k8s.io.api.core.v1.ConfigMap").unwrap(),
            &mut out,
        )
        .unwrap_err();
        assert!(e.0.contains("bogus"), "{e}");
    }

    #[test]
    fn inline_structs_read_the_same_object() {
        let v = enc(
            r#"{"name":"v","configMap":{"name":"c"}}"#,
            "k8s.io.api.core.v1.Volume",
        );
        // name, then volumeSource (2) holding configMap (19).
        assert!(v.starts_with(b"\x0a\x01v\x12"));
        assert!(v.windows(2).any(|w| w == b"\x9a\x01"));
    }

    #[test]
    fn nulls_duplicates_and_escapes_read_as_go_decodes_them() {
        let meta = "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta";
        let same = |a: &str, b: &str| assert_eq!(enc(a, meta), enc(b, meta), "{a} vs {b}");
        // `null` is the zero value, for one, repeated and map fields.
        same(
            r#"{"name":"a","labels":null,"finalizers":null}"#,
            r#"{"name":"a"}"#,
        );
        same(r#"{"name":null}"#, r#"{}"#);
        // The last of duplicate keys wins, in objects and in maps.
        same(r#"{"name":"a","name":"b"}"#, r#"{"name":"b"}"#);
        same(r#"{"labels":{"k":"1","k":"2"}}"#, r#"{"labels":{"k":"2"}}"#);
        // Escapes are decoded.
        let out = enc(r#"{"name":"a\"\u00e9"}"#, meta);
        assert!(out.starts_with("\x0a\x04a\"é".as_bytes()), "{out:?}");
        // Repeated messages, each parsed with its type.
        let owners = enc(r#"{"ownerReferences":[{"name":"x","uid":"u"},null]}"#, meta);
        assert!(owners.windows(3).any(|w| w == b"\x1a\x01x"));
        // Wrong JSON types are errors, never dropped.
        for bad in [
            r#"{"name":1}"#,
            r#"{"finalizers":"a"}"#,
            r#"{"labels":[]}"#,
            r#"{"ownerReferences":[{"bogus":1}]}"#,
            r#"{"creationTimestamp":{}}"#,
            r#"[]"#,
        ] {
            let mut out = Vec::new();
            assert!(
                transcode(bad.as_bytes(), message(meta).unwrap(), &mut out).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn keys_in_any_order_encode_alike() {
        // Go writes keys in declaration order; anything else decodes to the
        // same struct, so encodes to the same bytes (fields in number
        // order), embedded structs' keys included.
        let volume = "k8s.io.api.core.v1.Volume";
        assert_eq!(
            enc(
                r#"{"name":"v","configMap":{"name":"c","optional":true}}"#,
                volume
            ),
            enc(
                r#"{"configMap":{"optional":true,"name":"c"},"name":"v"}"#,
                volume
            ),
        );
        let meta = "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta";
        assert_eq!(
            enc(
                r#"{"name":"a","namespace":"n","uid":"u","resourceVersion":"5","labels":{"x":"1"}}"#,
                meta
            ),
            enc(
                r#"{"labels":{"x":"1"},"resourceVersion":"5","uid":"u","name":"b","namespace":"n","name":"a"}"#,
                meta
            ),
        );
    }

    #[test]
    fn long_bodies_get_wide_lengths() {
        let long = "x".repeat(300);
        let out = enc(
            &format!(r#"{{"metadata":{{"name":"{long}"}}}}"#),
            "k8s.io.api.core.v1.ConfigMap",
        );
        // metadata: key 0x0a, then a two-byte length.
        assert_eq!(out[0], 0x0a);
        assert!(out[1] & 0x80 != 0);
    }
}
