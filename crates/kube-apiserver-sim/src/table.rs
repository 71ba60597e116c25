//! `meta.k8s.io` Tables, for `kubectl get` (`Accept: ...;as=Table`): a Name
//! and an Age column for every resource, plus Data (the number of keys)
//! for configmaps, as the recording's `list-configmaps-as-table` shows.

use serde_json::{Map, Value, json};

use super::resources::ResourceSpec;

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const DATA_DESCRIPTION: &str = "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.";
const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

fn column(name: &str, format: &str, description: &str) -> Value {
    json!({"name": name, "type": "string", "format": format, "description": description, "priority": 0})
}

fn is_configmaps(spec: &ResourceSpec) -> bool {
    spec.group.is_empty() && spec.resource == "configmaps"
}

/// The column definitions for `spec`.
pub fn columns(spec: &ResourceSpec) -> Vec<Value> {
    let mut cols = vec![column("Name", "name", NAME_DESCRIPTION)];
    if is_configmaps(spec) {
        cols.push(column("Data", "", DATA_DESCRIPTION));
    }
    cols.push(column("Age", "", AGE_DESCRIPTION));
    cols
}

/// One row for `object`. `include` is the `includeObject` parameter:
/// `None`, `Object`, or `Metadata` (the default).
pub fn row(spec: &ResourceSpec, object: &Value, include: &str, version: &str) -> Value {
    let name = object
        .pointer("/metadata/name")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    let mut cells = vec![name];
    if is_configmaps(spec) {
        let count = |k: &str| object.get(k).and_then(Value::as_object).map_or(0, Map::len);
        cells.push(json!(count("data") + count("binaryData")));
    }
    let age = object
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map_or_else(
            || "<unknown>".to_string(),
            |t| human_duration(jiff::Timestamp::now().as_second() - t.as_second()),
        );
    cells.push(Value::String(age));
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array(cells));
    match include {
        "None" => {}
        "Object" => {
            row.insert("object".into(), object.clone());
        }
        _ => {
            row.insert("object".into(), partial_metadata(object, version));
        }
    }
    Value::Object(row)
}

/// `PartialObjectMetadata` of `object`.
pub fn partial_metadata(object: &Value, version: &str) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A Table with `rows` and list metadata `meta`.
pub fn table(
    spec: &ResourceSpec,
    version: &str,
    meta: Map<String, Value>,
    rows: Vec<Value>,
) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": meta,
        "columnDefinitions": columns(spec),
        "rows": rows,
    })
}

/// `duration.HumanDuration` from `k8s.io/apimachinery`, on whole seconds.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{d}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(human_duration(3), "3s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(400 * 86400), "400d");
    }

    #[test]
    fn configmap_rows() {
        let spec = ResourceSpec::new("", "v1", "configmaps", "ConfigMap", true);
        let cm = json!({"metadata": {"name": "cm-0", "creationTimestamp": crate::object::now_rfc3339()}, "data": {"k": "0"}});
        let r = row(&spec, &cm, "", "v1");
        assert_eq!(r["cells"][0], "cm-0");
        assert_eq!(r["cells"][1], 1);
        assert_eq!(r["object"]["kind"], "PartialObjectMetadata");
        let names: Vec<_> = columns(&spec).iter().map(|c| c["name"].clone()).collect();
        assert_eq!(names, ["Name", "Data", "Age"]);
    }
}
