//! The protobuf → JSON transcoder (`apimachinery::protobuf::to_json`),
//! which reads what upstream sends: for any bytes and message it never
//! panics, and what it writes is well-formed JSON that reads back, through the JSON →
//! protobuf transcoder, into the same JSON: the same bytes, or else the same
//! value but for `null` members, where Go itself does not come back to the
//! same bytes (a string of invalid UTF-8 is written `\ufffd` and reads back
//! as U+FFFD; a set pointer to a zero time is written `null` and reads back
//! unset). Seed the corpus with real
//! objects' messages, e.g. the `raw` of protobuf gets from kube-apiserver.
#![no_main]

use libfuzzer_sys::fuzz_target;

const KINDS: [(&str, &str, &str); 8] = [
    ("", "v1", "Pod"),
    ("", "v1", "Node"),
    ("", "v1", "ConfigMap"),
    ("", "v1", "Service"),
    ("discovery.k8s.io", "v1", "EndpointSlice"),
    ("coordination.k8s.io", "v1", "Lease"),
    ("apps", "v1", "StatefulSet"),
    ("apps", "v1", "ControllerRevision"),
];

fuzz_target!(|data: &[u8]| {
    for (group, version, kind) in KINDS {
        let message = apimachinery::protobuf::message_for(group, version, kind).expect("known");
        let mut json = Vec::new();
        if apimachinery::protobuf::to_json(data, message, Some((kind, version)), &mut json).is_err()
        {
            continue;
        }
        serde_json::from_slice::<serde::de::IgnoredAny>(&json).expect("well-formed JSON");
        // Raw JSON (`FieldsV1`, `RawExtension`) is copied as Go's
        // `encoding/json` checks it, for syntax alone: a lone surrogate
        // escape or invalid UTF-8 in it passes there, not in a `Value`.
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(&json) else {
            continue;
        };
        let mut pb = Vec::new();
        if apimachinery::protobuf::transcode(&json, message, &mut pb).is_err() {
            continue;
        }
        let mut again = Vec::new();
        apimachinery::protobuf::to_json(&pb, message, Some((kind, version)), &mut again)
            .expect("its own protobuf");
        if json != again {
            let again: serde_json::Value = serde_json::from_slice(&again).expect("valid JSON");
            assert_eq!(
                without_nulls(value),
                without_nulls(again),
                "{kind}: not the same value"
            );
        }
    }
});

/// `v` without the object members whose value is `null`.
fn without_nulls(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => m
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k, without_nulls(v)))
            .collect(),
        serde_json::Value::Array(a) => a.into_iter().map(without_nulls).collect(),
        v => v,
    }
}
