//! A JSON value with only some paths kept, for [`super::FieldSet::extract_json`].

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Deserializes a value keeping only `paths` (each relative to the
/// document root, of which the first `.1` keys have been matched
/// already). Where an object is expected but something else is found,
/// the result is `null`: [`Value::get`] finds no member in either.
pub(super) struct Prune(pub Vec<&'static [&'static str]>, pub usize);

/// An object key, borrowed from the input unless it has escapes.
#[derive(Deserialize)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> DeserializeSeed<'de> for Prune {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Prune {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Prune(paths, depth) = self;
        let mut out = Map::new();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            let deeper: Vec<&'static [&'static str]> = paths
                .iter()
                .copied()
                .filter(|p| p.get(depth) == Some(&&*key))
                .collect();
            if deeper.is_empty() {
                map.next_value::<IgnoredAny>()?;
            } else if deeper.iter().any(|p| p.len() == depth + 1) {
                out.insert(key.into_owned(), map.next_value::<Value>()?);
            } else {
                let v = map.next_value_seed(Prune(deeper, depth + 1))?;
                out.insert(key.into_owned(), v);
            }
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }
}
