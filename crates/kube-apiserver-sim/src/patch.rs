//! Patches: JSON merge patch (RFC 7386; the sim also applies strategic
//! merge patches this way, replacing lists instead of merging them by key)
//! and JSON patch (RFC 6902).

use serde_json::Value;

/// Applies a JSON merge patch to `target`. New keys are appended, so
/// existing field order is kept.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(map) = target {
        for (k, v) in patch {
            if v.is_null() {
                map.shift_remove(k);
            } else {
                merge(map.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Applies a JSON patch (`add`, `remove`, `replace`, `move`, `copy`,
/// `test`) to `target`.
///
/// # Errors
/// A description of the failing operation (the handler answers 422).
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or_else(|| "json patch must be an array of operations".to_string())?;
    for op in ops {
        let name = op.get("op").and_then(Value::as_str).unwrap_or_default();
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("operation {name:?} is missing path"))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| format!("operation {name:?} on {path} is missing value"))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("operation {name:?} is missing from"))
        };
        match name {
            "add" => add(target, path, value()?)?,
            "remove" => {
                remove(target, path)?;
            }
            "replace" => {
                let slot = target.pointer_mut(path).ok_or_else(|| {
                    format!("replace operation does not apply: doc is missing key: {path}")
                })?;
                *slot = value()?;
            }
            "move" => {
                let v = remove(target, from()?)?;
                add(target, path, v)?;
            }
            "copy" => {
                let v = target.pointer(from()?).cloned().ok_or_else(|| {
                    format!("copy operation does not apply: doc is missing from path: {path}")
                })?;
                add(target, path, v)?;
            }
            "test" => {
                if target.pointer(path) != Some(&value()?) {
                    return Err(format!("testing value {path} failed"));
                }
            }
            other => return Err(format!("Unexpected kind: {other}")),
        }
    }
    Ok(())
}

fn split(path: &str) -> Result<(&str, String), String> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("invalid path: {path}"))?;
    Ok((parent, last.replace("~1", "/").replace("~0", "~")))
}

fn add(target: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *target = value;
        return Ok(());
    }
    let (parent, key) = split(path)?;
    let container = target
        .pointer_mut(parent)
        .ok_or_else(|| format!("add operation does not apply: doc is missing path: {path}"))?;
    match container {
        Value::Object(map) => {
            map.insert(key, value);
            Ok(())
        }
        Value::Array(items) => {
            let idx = if key == "-" {
                items.len()
            } else {
                key.parse::<usize>()
                    .map_err(|_| format!("invalid array index: {key}"))?
            };
            if idx > items.len() {
                return Err(format!(
                    "add operation does not apply: index out of bounds: {path}"
                ));
            }
            items.insert(idx, value);
            Ok(())
        }
        _ => Err(format!(
            "add operation does not apply: doc is missing path: {path}"
        )),
    }
}

fn remove(target: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, key) = split(path)?;
    let missing = || format!("remove operation does not apply: doc is missing path: {path}");
    match target.pointer_mut(parent).ok_or_else(missing)? {
        Value::Object(map) => map.shift_remove(&key).ok_or_else(missing),
        Value::Array(items) => {
            let idx = key.parse::<usize>().map_err(|_| missing())?;
            if idx >= items.len() {
                return Err(missing());
            }
            Ok(items.remove(idx))
        }
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge(
            &mut t,
            &json!({"a": "z", "c": {"f": null, "h": 1}, "l": [3], "n": {"x": 1}}),
        );
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"a":"z","c":{"d":"e","h":1},"l":[3],"n":{"x":1}}"#
        );
    }

    #[test]
    fn json_patch_ops() {
        let mut t = json!({"metadata": {"labels": {"a": "1"}}, "list": [1, 2]});
        json_patch(
            &mut t,
            &json!([
                {"op": "test", "path": "/metadata/labels/a", "value": "1"},
                {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
                {"op": "replace", "path": "/metadata/labels/a", "value": "3"},
                {"op": "add", "path": "/list/-", "value": 3},
                {"op": "remove", "path": "/list/0"},
                {"op": "copy", "from": "/list/0", "path": "/first"},
                {"op": "move", "from": "/first", "path": "/moved"}
            ]),
        )
        .unwrap();
        assert_eq!(
            t,
            json!({"metadata": {"labels": {"a": "3", "b/c": "2"}}, "list": [2, 3], "moved": 2})
        );
        assert!(
            json_patch(
                &mut t,
                &json!([{"op": "test", "path": "/moved", "value": 9}])
            )
            .is_err()
        );
        assert!(json_patch(&mut t, &json!([{"op": "remove", "path": "/nope"}])).is_err());
    }
}
