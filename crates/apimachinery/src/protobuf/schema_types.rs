//! The shape of the generated schema ([`super::schema`]).

/// A protobuf message: a Kubernetes Go type as `go-to-protobuf` generated it.
#[derive(Debug)]
pub struct Message {
    /// Full protobuf name, e.g. `k8s.io.api.core.v1.Pod`.
    pub name: &'static str,
    /// How its JSON form maps to its fields.
    pub special: Special,
    /// Fields in field-number order, the order the Go marshaller writes.
    pub fields: &'static [Field],
    /// JSON keys the type has that protobuf does not carry (`kind` and
    /// `apiVersion` of an embedded `TypeMeta`).
    pub ignored: &'static [&'static str],
    /// A plain message's JSON keys in the order Go's `encoding/json` writes
    /// them: the Go struct's declaration order, an embedded struct's keys
    /// where it is declared (a [`Presence::Inline`] field), `TypeMeta`'s as
    /// [`TM`]. Empty for the special types.
    pub json: &'static [JsonKey],
}

/// One JSON key of a message: its field (an index into
/// [`Message::fields`], or [`TM`]) and when `encoding/json` leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonKey {
    pub field: u8,
    pub omit: Omit,
}

/// The [`JsonKey::field`] of an embedded `metav1.TypeMeta`: `kind`, then
/// `apiVersion`, each `omitempty`.
pub const TYPE_META: u8 = u8::MAX;

/// An embedded `metav1.TypeMeta`'s place among a message's JSON keys.
pub(super) const TM: JsonKey = JsonKey {
    field: TYPE_META,
    omit: Omit::Empty,
};

/// When Go's `encoding/json` leaves a struct field out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Omit {
    /// Never (no `omitempty`, or a struct value, which `omitempty` keeps).
    Never,
    /// `omitempty`: an empty string, slice, map or `[]byte`, a zero number,
    /// `false`, a nil pointer.
    Empty,
    /// `omitzero` on a `metav1.Time` or `MicroTime`: the zero time.
    Zero,
}

/// One field.
#[derive(Debug)]
pub struct Field {
    /// Its JSON key (empty for a struct embedded in JSON).
    pub json: &'static str,
    pub number: u32,
    pub kind: FieldKind,
    pub cardinality: Cardinality,
    pub presence: Presence,
}

/// A field's value type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    Str,
    Bytes,
    Bool,
    I32,
    I64,
    F64,
    /// A message, by index into [`super::schema::MESSAGES`].
    M(u16),
}

/// Single, repeated, or a `map<string, V>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cardinality {
    One,
    Repeated,
    Map,
}

/// When the Go marshaller writes a single field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Always, empty or not (a non-pointer Go field).
    Always,
    /// Only when set (a pointer, `[]byte` or a named slice type): present
    /// and not `null` in JSON.
    IfSet,
    /// A struct embedded in JSON (`json:",inline"`): its fields are keys of
    /// the enclosing JSON object; always written.
    Inline,
}

/// Types whose JSON form is not an object of their fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// A JSON object of the fields.
    Plain,
    /// `metav1.Time`: an RFC 3339 string (or `null`), whole seconds.
    Time,
    /// `metav1.MicroTime`: an RFC 3339 string with microseconds.
    MicroTime,
    /// `resource.Quantity`: its canonical string.
    Quantity,
    /// `intstr.IntOrString`: a JSON number or string.
    IntOrString,
    /// `runtime.RawExtension`: any JSON value, kept as its bytes.
    RawExtension,
    /// `metav1.FieldsV1`: a JSON object, kept as its bytes.
    FieldsV1,
    /// `metav1.Duration`: a Go duration string.
    Duration,
    /// A named slice type (`ExtraValue []string`): a JSON array.
    Wrapped,
    /// A type with a JSON form of its own the transcoder does not model.
    Unsupported,
}

pub(super) const fn f(
    json: &'static str,
    number: u32,
    kind: FieldKind,
    cardinality: Cardinality,
    presence: Presence,
) -> Field {
    Field {
        json,
        number,
        kind,
        cardinality,
        presence,
    }
}

pub(super) const fn m(
    name: &'static str,
    special: Special,
    fields: &'static [Field],
    ignored: &'static [&'static str],
    json: &'static [JsonKey],
) -> Message {
    Message {
        name,
        special,
        fields,
        ignored,
        json,
    }
}

pub(super) const fn j(field: u8, omit: Omit) -> JsonKey {
    JsonKey { field, omit }
}
