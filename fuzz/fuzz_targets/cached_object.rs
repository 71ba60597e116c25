//! Objects from upstream (watch events and list items): never panic; what
//! is accepted keeps its bytes and reports consistent views: labels and
//! selectable fields as a full JSON decoder sees them.
#![no_main]

use apimachinery::resource::FieldSet;
use bytes::BytesMut;
use kube_cache_proxy::cache::object::CachedObject;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for fs in [FieldSet::Default, FieldSet::Pod, FieldSet::CoreEvent] {
        if let Ok(o) = CachedObject::from_json(data, fs, true) {
            assert_eq!(&o.json()[..], data);
            let mut item = BytesMut::new();
            o.write_item(&mut item, true);
            let restamped = o.with_resource_version(o.rv + 1);
            let again =
                CachedObject::from_json(&restamped, fs, true).expect("a restamped object parses");
            assert_eq!(again.rv, o.rv + 1);
            assert_eq!(again.key(), o.key());
            // The metadata-only view is the `metadata` value.
            let meta = o.metadata_json();
            assert!(serde_json::from_slice::<serde_json::Value>(&meta).is_ok());
            // Any object transcodes to protobuf or is refused, never
            // panics; what is produced parses as a message.
            for kind in ["Pod", "Node", "ConfigMap"] {
                let message = apimachinery::protobuf::message_for("", "v1", kind).expect("known");
                let mut out = Vec::new();
                if apimachinery::protobuf::transcode(data, message, &mut out).is_ok() {
                    assert!(apimachinery::protobuf::fields(&out).is_some());
                }
            }
            // The labels read from the bytes are the labels a JSON decoder
            // sees (the last of duplicate keys).
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
                // So are the selectable fields, read without a full decode.
                assert_eq!(fs.extract_json(data, true).ok(), Some(fs.extract(&v, true)));
            }
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data)
                && let Some(labels) = v["metadata"]["labels"].as_object()
            {
                for (k, val) in labels {
                    if let Some(val) = val.as_str() {
                        assert_eq!(o.labels().get(k), Some(val), "label {k}");
                    }
                }
            }
        }
        let _ = CachedObject::from_list_item(data, "Pod", "v1", fs, true);
    }
});
