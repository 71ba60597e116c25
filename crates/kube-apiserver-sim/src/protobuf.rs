//! Just enough of the Kubernetes protobuf encoding to read review
//! requests: typed clients (`kubectl auth can-i`, `kubectl auth whoami`)
//! send them as `application/vnd.kubernetes.protobuf`. The envelope is the
//! magic `k8s\0` and a `runtime.Unknown` whose `raw` field holds the
//! object; the field numbers below are those of `k8s.io/api`'s
//! `generated.proto` for `authentication/v1` and `authorization/v1`.

use serde_json::{Map, Value, json};

/// One decoded field: a length-delimited one with its number and bytes,
/// or a scalar (the reviews' requests carry none the sim reads).
#[derive(Debug, Clone)]
enum Field<'a> {
    Bytes(u32, &'a [u8]),
    Scalar,
}

fn varint(data: &[u8], pos: &mut usize) -> Option<u64> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*pos)?;
        *pos += 1;
        out |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(out);
        }
    }
    None
}

/// The fields of one message, in order; `None` if malformed.
fn fields(data: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let key = varint(data, &mut pos)?;
        let number = u32::try_from(key >> 3).ok()?;
        match key & 7 {
            0 => {
                varint(data, &mut pos)?;
                out.push(Field::Scalar);
            }
            1 => pos += 8,
            2 => {
                let len = usize::try_from(varint(data, &mut pos)?).ok()?;
                let end = pos.checked_add(len)?;
                out.push(Field::Bytes(number, data.get(pos..end)?));
                pos = end;
            }
            5 => pos += 4,
            _ => return None,
        }
    }
    (pos == data.len()).then_some(out)
}

fn bytes_of<'a>(fs: &[Field<'a>], number: u32) -> impl Iterator<Item = &'a [u8]> {
    fs.iter().filter_map(move |f| match f {
        Field::Bytes(n, b) if *n == number => Some(*b),
        _ => None,
    })
}

/// Copies string fields `names` (field number = index + 1, empty skipped)
/// into a JSON object.
fn strings(data: &[u8], names: &[&str]) -> Option<Map<String, Value>> {
    let fs = fields(data)?;
    let mut out = Map::new();
    for (i, name) in names.iter().enumerate() {
        let number = u32::try_from(i + 1).ok()?;
        if name.is_empty() {
            continue;
        }
        if let Some(b) = bytes_of(&fs, number).last() {
            out.insert(
                (*name).to_string(),
                Value::String(String::from_utf8_lossy(b).into_owned()),
            );
        }
    }
    Some(out)
}

fn repeated_strings(fs: &[Field<'_>], number: u32) -> Vec<Value> {
    bytes_of(fs, number)
        .map(|b| Value::String(String::from_utf8_lossy(b).into_owned()))
        .collect()
}

/// `{rawSelector, requirements: [{key, operator, values}]}`.
fn selector(data: &[u8]) -> Option<Value> {
    let fs = fields(data)?;
    let mut out = strings(data, &["rawSelector"])?;
    let reqs: Vec<Value> = bytes_of(&fs, 2)
        .filter_map(|r| {
            let mut m = strings(r, &["key", "operator"])?;
            let values = repeated_strings(&fields(r)?, 3);
            if !values.is_empty() {
                m.insert("values".into(), Value::Array(values));
            }
            Some(Value::Object(m))
        })
        .collect();
    if !reqs.is_empty() {
        out.insert("requirements".into(), Value::Array(reqs));
    }
    Some(Value::Object(out))
}

fn resource_attributes(data: &[u8]) -> Option<Value> {
    let fs = fields(data)?;
    let mut out = strings(
        data,
        &[
            "namespace",
            "verb",
            "group",
            "version",
            "resource",
            "subresource",
            "name",
        ],
    )?;
    if let Some(b) = bytes_of(&fs, 8).last() {
        out.insert("fieldSelector".into(), selector(b)?);
    }
    if let Some(b) = bytes_of(&fs, 9).last() {
        out.insert("labelSelector".into(), selector(b)?);
    }
    Some(Value::Object(out))
}

/// A SubjectAccessReview(-like) spec: attributes, then for non-self reviews
/// user (3), groups (4), extra (5), uid (6).
fn access_review_spec(data: &[u8]) -> Option<Value> {
    let fs = fields(data)?;
    let mut out = Map::new();
    if let Some(b) = bytes_of(&fs, 1).last() {
        out.insert("resourceAttributes".into(), resource_attributes(b)?);
    }
    if let Some(b) = bytes_of(&fs, 2).last() {
        out.insert(
            "nonResourceAttributes".into(),
            Value::Object(strings(b, &["path", "verb"])?),
        );
    }
    let named = strings(data, &["", "", "user", "", "", "uid"])?;
    out.extend(named);
    let groups = repeated_strings(&fs, 4);
    if !groups.is_empty() {
        out.insert("groups".into(), Value::Array(groups));
    }
    let mut extra = Map::new();
    for entry in bytes_of(&fs, 5) {
        let e = fields(entry)?;
        let key = bytes_of(&e, 1)
            .last()
            .map(|b| String::from_utf8_lossy(b).into_owned())?;
        let items = bytes_of(&e, 2).last().map_or_else(Vec::new, |v| {
            fields(v)
                .map(|f| repeated_strings(&f, 1))
                .unwrap_or_default()
        });
        extra.insert(key, Value::Array(items));
    }
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    Some(Value::Object(out))
}

/// Decodes a protobuf-encoded review request of `resource` into its JSON
/// form (`{"spec": ...}`); `None` when the bytes are not one.
pub fn decode_review(resource: &str, body: &[u8]) -> Option<Value> {
    let unknown = body.strip_prefix(b"k8s\0")?;
    let envelope = fields(unknown)?;
    let raw = bytes_of(&envelope, 2).last()?;
    let object = fields(raw)?;
    let spec = bytes_of(&object, 2).last();
    let spec = match (resource, spec) {
        ("selfsubjectreviews", _) => json!({}),
        ("tokenreviews", Some(s)) => {
            let fs = fields(s)?;
            let mut m = strings(s, &["token"])?;
            let auds = repeated_strings(&fs, 2);
            if !auds.is_empty() {
                m.insert("audiences".into(), Value::Array(auds));
            }
            Value::Object(m)
        }
        (_, Some(s)) => access_review_spec(s)?,
        (_, None) => json!({}),
    };
    Some(json!({ "spec": spec }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![
            u8::try_from(number << 3 | 2).unwrap(),
            u8::try_from(payload.len()).unwrap(),
        ];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn decodes_a_self_subject_access_review() {
        let mut attrs = field(2, b"list");
        attrs.extend(field(5, b"pods"));
        attrs.extend(field(1, b"ns"));
        let spec = field(1, &attrs);
        let object = field(2, &spec);
        let mut envelope = field(1, &[]);
        envelope.extend(field(2, &object));
        let mut body = b"k8s\0".to_vec();
        body.extend(envelope);
        let v = decode_review("selfsubjectaccessreviews", &body).unwrap();
        assert_eq!(
            v,
            json!({"spec": {"resourceAttributes": {"namespace": "ns", "verb": "list", "resource": "pods"}}})
        );
        assert!(decode_review("tokenreviews", b"{}").is_none());
    }
}
