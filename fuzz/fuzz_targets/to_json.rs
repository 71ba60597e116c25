//! The protobuf → JSON transcoder (`apimachinery::protobuf::to_json`),
//! which reads what upstream sends: for any bytes and message it never
//! panics, and what it writes is JSON that reads back, through the JSON →
//! protobuf transcoder, into the same JSON. Seed the corpus with real
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
        if apimachinery::protobuf::to_json(data, message, Some((kind, version)), &mut json).is_err() {
            continue;
        }
        serde_json::from_slice::<serde_json::Value>(&json).expect("valid JSON");
        let mut pb = Vec::new();
        if apimachinery::protobuf::transcode(&json, message, &mut pb).is_err() {
            continue;
        }
        let mut again = Vec::new();
        apimachinery::protobuf::to_json(&pb, message, Some((kind, version)), &mut again)
            .expect("its own protobuf");
        assert_eq!(
            String::from_utf8_lossy(&json),
            String::from_utf8_lossy(&again),
            "{kind}: not the same JSON"
        );
    }
});
