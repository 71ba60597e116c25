//! The JSON → protobuf transcoder (`apimachinery::protobuf::transcode`)
//! against the tree transcoder it falls back to (`transcode_reference`):
//! for any input and message, the streaming path writes the tree's bytes,
//! or the same refusal. Seed the corpus with real objects, e.g. the items
//! of `tests/fixtures/real-apiserver-v1.36.json`, one per file.
#![no_main]

use libfuzzer_sys::fuzz_target;

const KINDS: [(&str, &str); 6] = [
    ("", "Pod"),
    ("", "Node"),
    ("", "ConfigMap"),
    ("", "Service"),
    ("discovery.k8s.io", "EndpointSlice"),
    ("coordination.k8s.io", "Lease"),
];

fuzz_target!(|data: &[u8]| {
    for (group, kind) in KINDS {
        let message = apimachinery::protobuf::message_for(group, "v1", kind).expect("known");
        let mut fast = vec![0xA5];
        let fast_ok = apimachinery::protobuf::transcode(data, message, &mut fast).is_ok();
        let mut tree = vec![0xA5];
        let tree_ok = apimachinery::protobuf::transcode_reference(data, message, &mut tree).is_ok();
        assert_eq!(fast_ok, tree_ok, "{kind}: taken by one transcoder only");
        if fast_ok {
            assert_eq!(fast, tree, "{kind}: different bytes");
        }
    }
});
