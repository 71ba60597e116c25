//! Protobuf to JSON: the bytes kube-apiserver's JSON serializer writes for
//! the object whose protobuf message it wrote.
//!
//! The apiserver encodes one decoded Go object in either form, so the JSON
//! is what Go's `encoding/json` (`json.NewEncoder`, HTML escaping on:
//! `staging/src/k8s.io/apimachinery/pkg/runtime/serializer/json/json.go`)
//! writes for the Go struct gogo-protobuf's generated `Unmarshal` makes of
//! the message:
//! - keys in the Go struct's declaration order ([`Message::json`]), an
//!   embedded struct's keys where it is declared, an embedded `TypeMeta`'s
//!   `kind` and `apiVersion` only where the caller gives them (an object,
//!   not a list item);
//! - `omitempty` leaves out an empty string, slice, map or `[]byte`, a zero
//!   number, `false`, a nil pointer, never a struct; `omitzero` on a
//!   `metav1.Time`, the zero time;
//! - a repeated field or map with no elements is nil (`null` unless
//!   omitted): the unmarshaller never makes an empty one, so an object
//!   stored in protobuf (the apiserver's default) reads back as `null`
//!   where its JSON said `[]`;
//! - a pointer or `[]byte` present in the message is set (`[]byte{}` when
//!   empty), absent is nil;
//! - map keys sorted; strings escaped as `encoding/json` escapes them
//!   (`<`, `>`, `&`, U+2028 and U+2029 as `\u` escapes, invalid UTF-8 as
//!   `\ufffd`); `[]byte` in standard base64; floats as `strconv`'s shortest
//!   form, exponent past 1e21 and under 1e-6;
//! - the special types as their `MarshalJSON` writes them: `Time`
//!   (`time_proto.go`: an empty message is the zero time, `null`; the
//!   nanoseconds are dropped on unmarshal) as RFC 3339 seconds in UTC,
//!   `MicroTime` with six fraction digits, `Quantity` as its string,
//!   `IntOrString` as a number or string, `RawExtension` and `FieldsV1` as
//!   their raw JSON compacted (with HTML escaping, as `encoding/json`
//!   compacts a `MarshalJSON`'s output), `Duration` as Go's
//!   `time.Duration.String()`.
//!
//! Strict: a field number the schema does not know (an apiserver newer
//! than the schema), a wire type other than the field's, a non-repeated
//! field seen twice, a duplicate map key, a message whose JSON keys the
//! schema lacks, a time outside years 0 to 9999, raw JSON that does not
//! parse: an error, never a silently different object.

use base64::Engine;

use super::schema::MESSAGES;
use super::schema_types::{
    Cardinality, Field, FieldKind, JsonKey, Message, Omit, Presence, Special, TYPE_META,
};
use super::transcode::{TranscodeError, ZERO_TIME_SECONDS, hidden};

type Result<T> = std::result::Result<T, TranscodeError>;

fn err(what: impl Into<String>) -> TranscodeError {
    TranscodeError(what.into())
}

/// Nesting deeper than this is refused (the JSON side's limit is 100).
const MAX_DEPTH: u32 = 100;

/// Appends the JSON object of `message`'s bytes `raw`; with `type_meta`
/// (`kind`, `apiVersion`), those keys where the type embeds `TypeMeta`
/// (an object as the apiserver sends it alone; a list's items carry none).
pub fn to_json(
    raw: &[u8],
    message: &'static Message,
    type_meta: Option<(&str, &str)>,
    out: &mut Vec<u8>,
) -> Result<()> {
    if message.special != Special::Plain {
        return Err(err(format!("{}: not a plain message", message.name)));
    }
    out.push(b'{');
    let mut first = true;
    object_fields(
        &mut Cx::default(),
        raw,
        message,
        type_meta,
        out,
        &mut first,
        0,
    )?;
    out.push(b'}');
    Ok(())
}

/// A field's value as it lies in the message.
#[derive(Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
}

/// Reads a varint; advances `buf`.
#[inline]
fn varint(buf: &mut &[u8]) -> Result<u64> {
    let mut value = 0u64;
    for (i, &b) in buf.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            if i == 9 && b > 1 {
                break;
            }
            *buf = &buf[i + 1..];
            return Ok(value);
        }
    }
    Err(err("malformed varint"))
}

/// Reads one field: its number and value; advances `buf`.
#[inline]
fn next_field<'a>(buf: &mut &'a [u8]) -> Result<(u32, Wire<'a>)> {
    let key = varint(buf)?;
    let number = u32::try_from(key >> 3).map_err(|_| err("field number out of range"))?;
    if number == 0 {
        return Err(err("field number 0"));
    }
    let value = match key & 7 {
        0 => Wire::Varint(varint(buf)?),
        1 => {
            let (head, rest) = buf
                .split_first_chunk::<8>()
                .ok_or_else(|| err("truncated fixed64"))?;
            *buf = rest;
            Wire::Fixed64(u64::from_le_bytes(*head))
        }
        2 => {
            let len = usize::try_from(varint(buf)?).map_err(|_| err("length out of range"))?;
            if len > buf.len() {
                return Err(err("truncated field"));
            }
            let (value, rest) = buf.split_at(len);
            *buf = rest;
            Wire::Bytes(value)
        }
        other => return Err(err(format!("unsupported wire type {other}"))),
    };
    Ok((number, value))
}

/// Where each field of the messages being written lies: for each field
/// of each message open (a stack, one run of `fields.len()` entries per
/// message), the offset of its first occurrence in the message and how
/// many there are. Shared down the nesting so that no message zeroes or
/// allocates a table of its own.
#[derive(Default)]
struct Cx {
    slots: Vec<(u32, u32)>,
}

/// One message's run of [`Cx::slots`].
#[derive(Clone, Copy)]
struct Layout {
    base: usize,
}

impl Layout {
    /// Scans `raw`, a `message`, pushing its run; the caller truncates
    /// `cx.slots` to `base` when done with it.
    fn of(cx: &mut Cx, raw: &[u8], message: &'static Message) -> Result<Layout> {
        let base = cx.slots.len();
        cx.slots.resize(base + message.fields.len(), (0, 0));
        let slots = &mut cx.slots[base..];
        let mut buf = raw;
        while !buf.is_empty() {
            let at = (raw.len() - buf.len()) as u32;
            let (number, _) = next_field(&mut buf)?;
            let i = message
                .fields
                .binary_search_by_key(&number, |f| f.number)
                .ok()
                .filter(|&i| !hidden(message, message.fields[i].json))
                .ok_or_else(|| err(format!("{}: unknown field {number}", message.name)))?;
            let slot = &mut slots[i];
            if slot.1 == 0 {
                slot.0 = at;
            } else if message.fields[i].cardinality == Cardinality::One {
                return Err(err(format!("{}: field {number} seen twice", message.name)));
            }
            slot.1 += 1;
        }
        Ok(Layout { base })
    }

    /// How many values field `i` has.
    fn count(self, cx: &Cx, i: usize) -> u32 {
        cx.slots[self.base + i].1
    }

    /// Field `i`'s values, in order.
    fn values<'a>(
        self,
        cx: &Cx,
        raw: &'a [u8],
        i: usize,
        number: u32,
    ) -> impl Iterator<Item = Result<Wire<'a>>> + use<'a> {
        let (first, mut left) = cx.slots[self.base + i];
        let mut buf = &raw[first as usize..];
        std::iter::from_fn(move || {
            while left > 0 {
                match next_field(&mut buf) {
                    Ok((n, w)) if n == number => {
                        left -= 1;
                        return Some(Ok(w));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        left = 0;
                        return Some(Err(e));
                    }
                }
            }
            None
        })
    }

    /// Field `i`'s single value, if present.
    fn one<'a>(self, cx: &Cx, raw: &'a [u8], i: usize, number: u32) -> Result<Option<Wire<'a>>> {
        if self.count(cx, i) == 0 {
            return Ok(None);
        }
        self.values(cx, raw, i, number).next().transpose()
    }
}

fn key(out: &mut Vec<u8>, first: &mut bool, name: &str) {
    if !*first {
        out.push(b',');
    }
    *first = false;
    out.push(b'"');
    // The schema's JSON names need no escaping (Go identifiers' tags).
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
}

fn sub(kind: FieldKind) -> Result<&'static Message> {
    match kind {
        FieldKind::M(i) => MESSAGES
            .get(usize::from(i))
            .ok_or_else(|| err("schema index out of range")),
        _ => Err(err("not a message")),
    }
}

/// Writes the keys of `message` (its bytes `raw`) into the object being
/// written; `first`: no key written yet.
fn object_fields(
    cx: &mut Cx,
    raw: &[u8],
    message: &'static Message,
    type_meta: Option<(&str, &str)>,
    out: &mut Vec<u8>,
    first: &mut bool,
    depth: u32,
) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(err("nested too deep"));
    }
    if message.json.is_empty() && !message.fields.is_empty() {
        return Err(err(format!("{}: no JSON form", message.name)));
    }
    let layout = Layout::of(cx, raw, message)?;
    for &JsonKey { field: at, omit } in message.json {
        if at == TYPE_META {
            if let Some((kind, api_version)) = type_meta {
                for (name, value) in [("kind", kind), ("apiVersion", api_version)] {
                    if !value.is_empty() {
                        key(out, first, name);
                        string(out, value.as_bytes());
                    }
                }
            }
            continue;
        }
        let i = usize::from(at);
        let field = message
            .fields
            .get(i)
            .ok_or_else(|| err("JSON key out of range"))?;
        match field.cardinality {
            Cardinality::One => one_field(cx, raw, layout, i, field, omit, out, first, depth)?,
            Cardinality::Repeated => {
                if layout.count(cx, i) == 0 {
                    nil(out, first, field, omit);
                    continue;
                }
                key(out, first, field.json);
                out.push(b'[');
                let type_meta = nested_type_meta(message, field);
                for (n, value) in layout.values(cx, raw, i, field.number).enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    match (type_meta, value?) {
                        (Some(tm), Wire::Bytes(b)) => {
                            let inner = sub(field.kind)?;
                            out.push(b'{');
                            let mut first = true;
                            object_fields(cx, b, inner, Some(tm), out, &mut first, depth + 1)?;
                            out.push(b'}');
                        }
                        (_, value) => value_json(cx, value, field, out, depth)?,
                    }
                }
                out.push(b']');
            }
            Cardinality::Map => {
                if layout.count(cx, i) == 0 {
                    nil(out, first, field, omit);
                    continue;
                }
                key(out, first, field.json);
                map_json(cx, raw, layout, i, field, out, depth)?;
            }
        }
    }
    cx.slots.truncate(layout.base);
    Ok(())
}

/// A nil slice, map or pointer: `null`, unless `omitempty` leaves it out.
fn nil(out: &mut Vec<u8>, first: &mut bool, field: &Field, omit: Omit) {
    if omit == Omit::Never {
        key(out, first, field.json);
        out.extend_from_slice(b"null");
    }
}

/// The `TypeMeta` the apiserver gives objects nested in a field, which
/// protobuf does not carry: a StatefulSet's `volumeClaimTemplates` are
/// `PersistentVolumeClaim`s of `v1` (set by the conversion from the
/// internal type, `pkg/apis/apps/{v1,v1beta1,v1beta2}/conversion.go`,
/// `Convert_apps_StatefulSetSpec_To_*_StatefulSetSpec`). The only such
/// conversion in the v1.36 tree.
fn nested_type_meta(
    message: &'static Message,
    field: &Field,
) -> Option<(&'static str, &'static str)> {
    match (message.name, field.json) {
        (
            "k8s.io.api.apps.v1.StatefulSetSpec"
            | "k8s.io.api.apps.v1beta1.StatefulSetSpec"
            | "k8s.io.api.apps.v1beta2.StatefulSetSpec",
            "volumeClaimTemplates",
        ) => Some(("PersistentVolumeClaim", "v1")),
        _ => None,
    }
}

/// A single (not repeated) field.
#[allow(clippy::too_many_arguments)]
fn one_field(
    cx: &mut Cx,
    raw: &[u8],
    layout: Layout,
    i: usize,
    field: &'static Field,
    omit: Omit,
    out: &mut Vec<u8>,
    first: &mut bool,
    depth: u32,
) -> Result<()> {
    let value = layout.one(cx, raw, i, field.number)?;
    if field.presence == Presence::Inline {
        let inner = sub(field.kind)?;
        let bytes = match value {
            Some(Wire::Bytes(b)) => b,
            None => &[],
            Some(_) => return Err(err(format!("{}: wrong wire type", field.json))),
        };
        return object_fields(cx, bytes, inner, None, out, first, depth + 1);
    }
    let Some(value) = value else {
        return match field.presence {
            // A nil pointer, `[]byte` or named slice.
            Presence::IfSet => {
                nil(out, first, field, omit);
                Ok(())
            }
            // Always written by the marshaller; absent, the zero value.
            _ => {
                if omit != Omit::Never && zero_scalar(field.kind) {
                    return Ok(());
                }
                if let FieldKind::M(_) = field.kind
                    && omit == Omit::Zero
                {
                    return Ok(());
                }
                key(out, first, field.json);
                zero_json(cx, field, out, depth)
            }
        };
    };
    match omit {
        Omit::Empty if field.presence == Presence::Always && is_zero_scalar(value, field)? => {
            return Ok(());
        }
        // `omitempty` leaves out an empty `[]byte` or named slice, set or
        // not; a set pointer is written.
        Omit::Empty
            if field.presence == Presence::IfSet
                && (field.kind == FieldKind::Bytes || is_wrapped(field.kind))
                && matches!(value, Wire::Bytes([])) =>
        {
            return Ok(());
        }
        Omit::Zero if is_zero_time(value, field)? => return Ok(()),
        _ => {}
    }
    key(out, first, field.json);
    value_json(cx, value, field, out, depth)
}

fn is_wrapped(kind: FieldKind) -> bool {
    sub(kind).is_ok_and(|m| m.special == Special::Wrapped)
}

/// Whether a scalar kind's zero value is what `omitempty` leaves out.
fn zero_scalar(kind: FieldKind) -> bool {
    !matches!(kind, FieldKind::M(_))
}

/// Whether a present scalar is its type's zero value (`""`, `0`, `false`).
fn is_zero_scalar(value: Wire<'_>, field: &Field) -> Result<bool> {
    Ok(match (field.kind, value) {
        (FieldKind::M(_), _) => false,
        (FieldKind::Str | FieldKind::Bytes, Wire::Bytes(b)) => b.is_empty(),
        (FieldKind::Bool | FieldKind::I64, Wire::Varint(v)) => v == 0,
        (FieldKind::I32, Wire::Varint(v)) => v as u32 == 0,
        (FieldKind::F64, Wire::Fixed64(v)) => f64::from_bits(v) == 0.0,
        _ => return Err(err(format!("{}: wrong wire type", field.json))),
    })
}

/// Whether a `Time` or `MicroTime` value is the zero time.
fn is_zero_time(value: Wire<'_>, field: &Field) -> Result<bool> {
    let Wire::Bytes(b) = value else {
        return Err(err(format!("{}: wrong wire type", field.json)));
    };
    Ok(timestamp(b, sub(field.kind)?.special == Special::MicroTime)?.is_none())
}

/// The zero value of an always-written field the message lacks.
fn zero_json(cx: &mut Cx, field: &Field, out: &mut Vec<u8>, depth: u32) -> Result<()> {
    match field.kind {
        FieldKind::Str => out.extend_from_slice(b"\"\""),
        FieldKind::Bytes => out.extend_from_slice(b"null"),
        FieldKind::Bool => out.extend_from_slice(b"false"),
        FieldKind::I32 | FieldKind::I64 | FieldKind::F64 => out.push(b'0'),
        FieldKind::M(_) => message_json(cx, &[], sub(field.kind)?, out, depth + 1)?,
    }
    Ok(())
}

/// One value of a field (a single field's, or a repeated field's element).
fn value_json(
    cx: &mut Cx,
    value: Wire<'_>,
    field: &Field,
    out: &mut Vec<u8>,
    depth: u32,
) -> Result<()> {
    match (field.kind, value) {
        (FieldKind::Str, Wire::Bytes(b)) => string(out, b),
        (FieldKind::Bytes, Wire::Bytes(b)) => base64(out, b),
        (FieldKind::Bool, Wire::Varint(v)) => {
            out.extend_from_slice(if v != 0 { b"true" } else { b"false" });
        }
        (FieldKind::I32, Wire::Varint(v)) => {
            out.extend_from_slice(itoa::Buffer::new().format(v as i32).as_bytes());
        }
        (FieldKind::I64, Wire::Varint(v)) => {
            out.extend_from_slice(itoa::Buffer::new().format(v as i64).as_bytes());
        }
        (FieldKind::F64, Wire::Fixed64(v)) => float(out, f64::from_bits(v))?,
        (FieldKind::M(_), Wire::Bytes(b)) => message_json(cx, b, sub(field.kind)?, out, depth + 1)?,
        _ => return Err(err(format!("{}: wrong wire type", field.json))),
    }
    Ok(())
}

/// A map field's entries (messages of key 1 and value 2), sorted by key.
fn map_json(
    cx: &mut Cx,
    raw: &[u8],
    layout: Layout,
    i: usize,
    field: &Field,
    out: &mut Vec<u8>,
    depth: u32,
) -> Result<()> {
    let mut entries: Vec<(&[u8], Option<Wire<'_>>)> =
        Vec::with_capacity(layout.count(cx, i) as usize);
    for entry in layout.values(cx, raw, i, field.number) {
        let Wire::Bytes(mut buf) = entry? else {
            return Err(err(format!("{}: wrong wire type", field.json)));
        };
        let (mut k, mut v) = (None, None);
        while !buf.is_empty() {
            match next_field(&mut buf)? {
                (1, Wire::Bytes(b)) if k.is_none() => k = Some(b),
                (2, w) if v.is_none() => v = Some(w),
                _ => return Err(err(format!("{}: malformed map entry", field.json))),
            }
        }
        entries.push((k.unwrap_or_default(), v));
    }
    // The marshaller writes them sorted already.
    if !entries.windows(2).all(|w| w[0].0 < w[1].0) {
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        if entries.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(err(format!("{}: duplicate map key", field.json)));
        }
    }
    out.push(b'{');
    for (n, (k, v)) in entries.into_iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        string(out, k);
        out.push(b':');
        match v {
            Some(v) => value_json(cx, v, field, out, depth)?,
            // gogo's map unmarshal: an absent `[]byte` value is nil, any
            // other the zero value.
            None => zero_json(cx, field, out, depth)?,
        }
    }
    out.push(b'}');
    Ok(())
}

/// A message value: an object of its fields, or a special type's form.
fn message_json(
    cx: &mut Cx,
    raw: &[u8],
    message: &'static Message,
    out: &mut Vec<u8>,
    depth: u32,
) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(err("nested too deep"));
    }
    match message.special {
        Special::Plain => {
            out.push(b'{');
            let mut first = true;
            object_fields(cx, raw, message, None, out, &mut first, depth)?;
            out.push(b'}');
        }
        Special::Time | Special::MicroTime => {
            let micro = message.special == Special::MicroTime;
            match timestamp(raw, micro)? {
                None => out.extend_from_slice(b"null"),
                Some((seconds, nanos)) => rfc3339(out, seconds, micro.then_some(nanos))?,
            }
        }
        Special::Quantity => {
            let s = only_bytes(raw, 1, message)?
                .ok_or_else(|| err(format!("{}: no string", message.name)))?;
            string(out, s);
        }
        Special::IntOrString => {
            let (mut kind, mut int, mut s) = (0u64, 0u64, &[][..]);
            let mut buf = raw;
            while !buf.is_empty() {
                match next_field(&mut buf)? {
                    (1, Wire::Varint(v)) => kind = v,
                    (2, Wire::Varint(v)) => int = v,
                    (3, Wire::Bytes(b)) => s = b,
                    _ => return Err(err(format!("{}: malformed", message.name))),
                }
            }
            match kind {
                0 => out.extend_from_slice(itoa::Buffer::new().format(int as i32).as_bytes()),
                1 => string(out, s),
                _ => return Err(err(format!("{}: type {kind}", message.name))),
            }
        }
        Special::RawExtension | Special::FieldsV1 => match only_bytes(raw, 1, message)? {
            None => out.extend_from_slice(b"null"),
            Some(json) => compact(out, json)?,
        },
        Special::Duration => {
            let nanos = match raw {
                [] => 0,
                _ => {
                    let mut buf = raw;
                    match next_field(&mut buf)? {
                        (1, Wire::Varint(v)) if buf.is_empty() => v as i64,
                        _ => return Err(err(format!("{}: malformed", message.name))),
                    }
                }
            };
            out.push(b'"');
            go_duration(out, nanos);
            out.push(b'"');
        }
        Special::Wrapped => {
            let field = message.fields.first().ok_or_else(|| err(message.name))?;
            let layout = Layout::of(cx, raw, message)?;
            if layout.count(cx, 0) == 0 {
                out.extend_from_slice(b"null");
            } else {
                out.push(b'[');
                for (n, v) in layout.values(cx, raw, 0, field.number).enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    value_json(cx, v?, field, out, depth)?;
                }
                out.push(b']');
            }
            cx.slots.truncate(layout.base);
        }
        Special::Unsupported => return Err(err(format!("{} is not supported", message.name))),
    }
    Ok(())
}

/// The bytes of field `number`, the message's only field, if present.
fn only_bytes<'a>(raw: &'a [u8], number: u32, message: &Message) -> Result<Option<&'a [u8]>> {
    let mut buf = raw;
    let mut found = None;
    while !buf.is_empty() {
        match next_field(&mut buf)? {
            (n, Wire::Bytes(b)) if n == number && found.is_none() => found = Some(b),
            _ => return Err(err(format!("{}: malformed", message.name))),
        }
    }
    Ok(found)
}

/// A `Timestamp` message's seconds and nanoseconds as the Go type holds
/// them (`Time` drops the nanoseconds); `None` for the zero time (an empty
/// message, as `Time.Marshal` writes it).
fn timestamp(raw: &[u8], micro: bool) -> Result<Option<(i64, u32)>> {
    if raw.is_empty() {
        return Ok(None);
    }
    let (mut seconds, mut nanos) = (0i64, 0i64);
    let mut buf = raw;
    while !buf.is_empty() {
        match next_field(&mut buf)? {
            (1, Wire::Varint(v)) => seconds = v as i64,
            (2, Wire::Varint(v)) => nanos = i64::from(v as i32),
            _ => return Err(err("malformed Timestamp")),
        }
    }
    if !micro {
        nanos = 0;
    }
    // `time.Unix` normalizes nanoseconds outside [0, 1e9).
    seconds = seconds
        .checked_add(nanos.div_euclid(1_000_000_000))
        .ok_or_else(|| err("time out of range"))?;
    let nanos = nanos.rem_euclid(1_000_000_000) as u32;
    if seconds == ZERO_TIME_SECONDS && nanos == 0 {
        return Ok(None);
    }
    Ok(Some((seconds, nanos)))
}

/// `"2006-01-02T15:04:05Z"` (with `micro`, `.000000` before the `Z`: the
/// microseconds, truncated), as Go formats a UTC time; years outside 0 to
/// 9999 are refused (Go writes them otherwise).
fn rfc3339(out: &mut Vec<u8>, seconds: i64, micro: Option<u32>) -> Result<()> {
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    // Howard Hinnant's `civil_from_days`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if !(0..=9999).contains(&year) {
        return Err(err("time out of range"));
    }
    out.push(b'"');
    pad(out, year, 4);
    out.push(b'-');
    pad(out, month, 2);
    out.push(b'-');
    pad(out, day, 2);
    out.push(b'T');
    pad(out, secs / 3600, 2);
    out.push(b':');
    pad(out, secs / 60 % 60, 2);
    out.push(b':');
    pad(out, secs % 60, 2);
    if let Some(nanos) = micro {
        out.push(b'.');
        pad(out, i64::from(nanos / 1000), 6);
    }
    out.extend_from_slice(b"Z\"");
    Ok(())
}

/// `n` (not negative) in at least `width` digits.
fn pad(out: &mut Vec<u8>, n: i64, width: usize) {
    let mut buf = itoa::Buffer::new();
    let s = buf.format(n);
    out.extend(std::iter::repeat_n(b'0', width.saturating_sub(s.len())));
    out.extend_from_slice(s.as_bytes());
}

/// Go's `time.Duration.String()`: `1h2m3.5s`, `1.5ms`, `0s`.
fn go_duration(out: &mut Vec<u8>, nanos: i64) {
    let mut buf = [0u8; 32];
    let mut w = buf.len();
    let mut u = nanos.unsigned_abs();
    // The fraction of v / 10^prec, trailing zeros (and the point) left out.
    let frac = |buf: &mut [u8; 32], w: &mut usize, v: &mut u64, prec: u32| {
        let mut print = false;
        for _ in 0..prec {
            let digit = (*v % 10) as u8;
            print = print || digit != 0;
            if print {
                *w -= 1;
                buf[*w] = digit + b'0';
            }
            *v /= 10;
        }
        if print {
            *w -= 1;
            buf[*w] = b'.';
        }
    };
    let int = |buf: &mut [u8; 32], w: &mut usize, mut v: u64| {
        if v == 0 {
            *w -= 1;
            buf[*w] = b'0';
        }
        while v > 0 {
            *w -= 1;
            buf[*w] = (v % 10) as u8 + b'0';
            v /= 10;
        }
    };
    w -= 1;
    buf[w] = b's';
    if u < 1_000_000_000 {
        let prec;
        w -= 1;
        if u == 0 {
            buf[w] = b'0';
            out.extend_from_slice(&buf[w..]);
            return;
        } else if u < 1_000 {
            prec = 0;
            buf[w] = b'n';
        } else if u < 1_000_000 {
            prec = 3;
            // U+00B5, the micro sign.
            w -= 1;
            buf[w..w + 2].copy_from_slice("\u{b5}".as_bytes());
        } else {
            prec = 6;
            buf[w] = b'm';
        }
        frac(&mut buf, &mut w, &mut u, prec);
        int(&mut buf, &mut w, u);
    } else {
        frac(&mut buf, &mut w, &mut u, 9);
        int(&mut buf, &mut w, u % 60);
        u /= 60;
        if u > 0 {
            w -= 1;
            buf[w] = b'm';
            int(&mut buf, &mut w, u % 60);
            u /= 60;
            if u > 0 {
                w -= 1;
                buf[w] = b'h';
                int(&mut buf, &mut w, u);
            }
        }
    }
    if nanos < 0 {
        w -= 1;
        buf[w] = b'-';
    }
    out.extend_from_slice(&buf[w..]);
}

/// A float as `encoding/json` writes a `float64`: `strconv`'s shortest
/// form, in exponent form under 1e-6 and from 1e21 (`1e+21`, `1e-7`).
fn float(out: &mut Vec<u8>, f: f64) -> Result<()> {
    if !f.is_finite() {
        return Err(err("unsupported float value"));
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Rust writes `1e21` and `1e-7`; Go `1e+21` and `1e-7`.
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => {
                out.extend_from_slice(mantissa.as_bytes());
                out.extend_from_slice(b"e+");
                out.extend_from_slice(exp.as_bytes());
            }
            _ => out.extend_from_slice(s.as_bytes()),
        }
    } else {
        out.extend_from_slice(format!("{f}").as_bytes());
    }
    Ok(())
}

fn base64(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'"');
    let start = out.len();
    out.resize(start + base64::encoded_len(b.len(), true).unwrap_or(0), 0);
    let n = base64::engine::general_purpose::STANDARD
        .encode_slice(b, &mut out[start..])
        .unwrap_or(0);
    out.truncate(start + n);
    out.push(b'"');
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Bytes `encoding/json` writes as they are inside a string (with HTML
/// escaping): printable ASCII but `"`, `\`, `<`, `>`, `&`.
static PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0x20;
    while c < 0x80 {
        t[c] = !matches!(c as u8, b'"' | b'\\' | b'<' | b'>' | b'&');
        c += 1;
    }
    t
};

/// A JSON string as `encoding/json` writes a Go string.
fn string(out: &mut Vec<u8>, s: &[u8]) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    let mut start = 0;
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if PLAIN[usize::from(b)] {
            i += 1;
            continue;
        }
        if b < 0x80 {
            out.extend_from_slice(&s[start..i]);
            match b {
                b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
                0x08 => out.extend_from_slice(b"\\b"),
                0x0c => out.extend_from_slice(b"\\f"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                _ => out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ]),
            }
            i += 1;
            start = i;
            continue;
        }
        let width = match b {
            0xc2..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf4 => 4,
            _ => 0,
        };
        let valid = width > 0
            && s.get(i..i + width)
                .is_some_and(|c| std::str::from_utf8(c).is_ok());
        if !valid {
            out.extend_from_slice(&s[start..i]);
            out.extend_from_slice(b"\\ufffd");
            i += 1;
            start = i;
            continue;
        }
        if width == 3 && s[i + 1] == 0x80 && (s[i + 2] == 0xa8 || s[i + 2] == 0xa9) {
            // U+2028 and U+2029.
            out.extend_from_slice(&s[start..i]);
            out.extend_from_slice(b"\\u202");
            out.push(HEX[usize::from(s[i + 2] & 0xf)]);
            i += 3;
            start = i;
            continue;
        }
        i += width;
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

/// Raw JSON (a `RawExtension` or `FieldsV1`) as `encoding/json` writes a
/// `MarshalJSON`'s output: checked, whitespace outside strings removed,
/// `<`, `>`, `&`, U+2028 and U+2029 inside strings escaped.
fn compact(out: &mut Vec<u8>, json: &[u8]) -> Result<()> {
    serde_json::from_slice::<serde::de::IgnoredAny>(json)
        .map_err(|e| err(format!("raw JSON: {e}")))?;
    // As the apiserver stores it: compact, nothing to escape.
    if !json
        .iter()
        .any(|&b| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'<' | b'>' | b'&' | 0xe2))
    {
        out.extend_from_slice(json);
        return Ok(());
    }
    let mut in_string = false;
    let mut i = 0;
    while i < json.len() {
        let b = json[i];
        if !in_string {
            match b {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                b'"' => {
                    in_string = true;
                    out.push(b);
                }
                _ => out.push(b),
            }
            i += 1;
            continue;
        }
        match b {
            b'\\' => {
                out.extend_from_slice(json.get(i..i + 2).unwrap_or(&json[i..]));
                i += 2;
                continue;
            }
            b'"' => in_string = false,
            b'<' | b'>' | b'&' => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
                i += 1;
                continue;
            }
            0xe2 if json.get(i + 1) == Some(&0x80)
                && matches!(json.get(i + 2), Some(0xa8 | 0xa9)) =>
            {
                out.extend_from_slice(b"\\u202");
                out.push(HEX[usize::from(json[i + 2] & 0xf)]);
                i += 3;
                continue;
            }
            _ => {}
        }
        out.push(b);
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
