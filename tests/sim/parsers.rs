#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every parser of client input, on arbitrary input: no panics, and
//! selectors print back to what they parsed. The same targets run
//! coverage-guided under cargo-fuzz in `fuzz/`.

use apimachinery::request::RequestInfo;
use apimachinery::resource::FieldSet;
use apimachinery::selector::{FieldSelector, LabelSelector};
use bytes::BytesMut;
use http::{HeaderMap, HeaderValue, Method};
use kube_cache_proxy::auth::{bearer_token, impersonation};
use kube_cache_proxy::cache::negotiate::{Verb, negotiate};
use kube_cache_proxy::cache::object::CachedObject;
use kube_cache_proxy::cache::serve::{continue_token, query};
use kube_cache_proxy::component::config::Config;
use proptest::prelude::*;

/// Strings made of the characters selector and query grammars care about.
fn selectorish() -> impl Strategy<Value = String> {
    proptest::string::string_regex(r"[a-z0-9=!,()<> \\./_-]{0,40}|(in|notin|!=|==)[ a-z(),]{0,20}")
        .unwrap()
}

const ALL_FIELD_SETS: [FieldSet; 12] = [
    FieldSet::Default,
    FieldSet::Pod,
    FieldSet::Node,
    FieldSet::Service,
    FieldSet::Secret,
    FieldSet::Namespace,
    FieldSet::ReplicationController,
    FieldSet::CoreEvent,
    FieldSet::EventsV1Event,
    FieldSet::Job,
    FieldSet::CertificateSigningRequest,
    FieldSet::ResourceSlice,
];

/// JSON objects whose keys are mostly ones selectable fields are read from,
/// nested, with values of every type where an object is expected.
fn json_object() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let key = prop_oneof![
        3 => proptest::sample::select(vec![
            "metadata", "name", "namespace", "spec", "status", "nodeName", "phase", "podIPs",
            "podIP", "ip", "hostNetwork", "unschedulable", "type", "involvedObject", "regarding",
            "kind", "uid", "source", "deprecatedSource", "component", "reason",
            "reportingComponent", "reportingController", "succeeded", "replicas", "signerName",
            "driver", "clusterIP",
        ]).prop_map(str::to_string),
        1 => "[a-z]{1,3}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..300).prop_map(Value::from),
        "[a-z0-9.\\\"]{0,4}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            proptest::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
    .prop_map(|v| match v {
        Value::Object(_) => v,
        other => serde_json::json!({ "metadata": other }),
    })
}

/// Objects shaped like the kinds with selectable fields: every path a field
/// is read from, each present or not, holding a value of any type.
fn shaped_object() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let value = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..300).prop_map(Value::from),
        "[a-z0-9.]{0,3}".prop_map(Value::from),
        proptest::collection::vec(
            "[0-9.]{0,3}".prop_map(|ip| serde_json::json!({ "ip": ip })),
            0..3
        )
        .prop_map(Value::Array),
    ];
    let inner_keys = vec![
        "name",
        "namespace",
        "nodeName",
        "restartPolicy",
        "schedulerName",
        "serviceAccountName",
        "hostNetwork",
        "phase",
        "podIPs",
        "podIP",
        "nominatedNodeName",
        "unschedulable",
        "clusterIP",
        "type",
        "replicas",
        "succeeded",
        "signerName",
        "driver",
        "kind",
        "uid",
        "apiVersion",
        "resourceVersion",
        "fieldPath",
        "component",
        "other",
    ];
    let inner =
        proptest::collection::vec((proptest::sample::select(inner_keys), value.clone()), 0..8)
            .prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            });
    let top_keys = vec![
        "metadata",
        "spec",
        "status",
        "type",
        "involvedObject",
        "regarding",
        "source",
        "deprecatedSource",
        "reason",
        "reportingComponent",
        "reportingController",
        "data",
    ];
    proptest::collection::vec(
        (
            proptest::sample::select(top_keys),
            prop_oneof![3 => inner, 1 => value],
        ),
        0..8,
    )
    .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn label_selectors_round_trip(s in prop_oneof![selectorish(), any::<String>()]) {
        if let Ok(sel) = LabelSelector::parse(&s) {
            let printed = sel.to_string();
            prop_assert_eq!(LabelSelector::parse(&printed).unwrap(), sel);
        }
    }

    #[test]
    fn field_selectors_round_trip(s in prop_oneof![selectorish(), any::<String>()]) {
        if let Ok(sel) = FieldSelector::parse(&s) {
            // Term order follows the raw text, as the apiserver's does (it
            // sorts the unparsed parts), so compare the terms as a multiset.
            let printed = sel.to_string();
            let terms = |sel: &FieldSelector| {
                let mut t: Vec<_> = sel.terms().iter().map(|t| (t.field.clone(), t.not_equals, t.value.clone())).collect();
                t.sort_unstable();
                t
            };
            prop_assert_eq!(terms(&FieldSelector::parse(&printed).unwrap()), terms(&sel));
            for fs in [FieldSet::Default, FieldSet::Pod, FieldSet::Node, FieldSet::EventsV1Event, FieldSet::Job] {
                let _ = fs.convert(&sel);
            }
        }
    }

    #[test]
    fn queries_and_tokens_never_panic(s in prop_oneof![
        "(watch|resourceVersion|resourceVersionMatch|labelSelector|fieldSelector|limit|continue|timeoutSeconds|allowWatchBookmarks|sendInitialEvents)=[^&]{0,12}(&(watch|resourceVersion|resourceVersionMatch|limit|continue|sendInitialEvents)=[^&]{0,12}){0,4}",
        any::<String>(),
    ]) {
        let _ = query::parse(Some(&s), false);
        let _ = query::parse(Some(&s), true);
        let _ = query::parse_resource_version(&s);
        let _ = continue_token::decode(&s);
    }

    #[test]
    fn paths_never_panic(path in "(/[a-z0-9.%-]{0,10}){0,8}", q in "[a-z=&%.-]{0,30}") {
        for m in [Method::GET, Method::POST, Method::DELETE, Method::PUT, Method::PATCH] {
            let _ = RequestInfo::parse(&m, &path, Some(&q));
        }
    }

    #[test]
    fn paths_decode_as_a_reference_decoder_and_escaping_changes_nothing(
        path in "(/(api|apis|v1|namespaces|ns|pods|watch|%2F|%2f|%25|%2E|%61|%FF|%zz|%2|[a-z0-9.%+-]{0,6}){0,8}/?)",
        q in "(watch=1|fieldSelector=metadata.name%3D[a-z%0-9]{0,4}|labelSelector=[a-z%=;]{0,5}|[a-z=&%;+.-]{0,10})(&[a-z=%;]{0,6}){0,2}",
    ) {
        let decoded = apimachinery::url::decode_path(&path);
        if let Some(d) = &decoded {
            let reference: Vec<u8> = percent_encoding::percent_decode_str(&path).collect();
            prop_assert_eq!(&d[..], &reference[..]);
        }
        for m in [Method::GET, Method::DELETE] {
            let info = RequestInfo::parse(&m, &path, Some(&q));
            prop_assert_eq!(info.malformed_path, decoded.is_none());
            let Some(d) = &decoded else { continue };
            let escaped: String = d.iter().map(|b| format!("%{b:02X}")).collect();
            prop_assert_eq!(&info, &RequestInfo::parse(&m, &escaped, Some(&q)));
            if info.routable {
                prop_assert!(info.path.starts_with("/api/") || info.path.starts_with("/apis/"));
                prop_assert!(!info.path.trim_end_matches('/').contains("//"));
            }
        }
    }

    #[test]
    fn headers_never_panic(v in "[ -~]{0,60}", key in "[a-z0-9%.-]{0,12}") {
        let value = HeaderValue::from_str(&v).unwrap();
        let mut accept = HeaderMap::new();
        accept.insert(http::header::ACCEPT, value.clone());
        for verb in [Verb::Get, Verb::List, Verb::Watch] {
            let _ = negotiate(&accept, None, verb, true);
        }
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, value.clone());
        if let Ok(n) = http::HeaderName::from_bytes(format!("impersonate-extra-{key}").as_bytes()) {
            h.append(n, value.clone());
        }
        h.append("impersonate-group", value);
        let _ = bearer_token(&h);
        for filter in [impersonation::Filter::Constrained, impersonation::Filter::Legacy] {
            let _ = impersonation::requested(&h, filter);
        }
    }

    #[test]
    fn upstream_objects_never_panic(json in prop_oneof![
        any::<Vec<u8>>(),
        "\\{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":\\{\"name\":\"[a-z]{0,3}\",\"namespace\":\"[a-z]{0,3}\",\"resourceVersion\":\"[0-9a-z]{0,4}\"(,\"labels\":\\{\"[a-z]{1,3}\":\"[a-z]{0,3}\"\\})?\\}(,\"spec\":\\{\"nodeName\":\"n\"\\})?\\}".prop_map(String::into_bytes),
    ]) {
        for fs in [FieldSet::Default, FieldSet::Pod] {
            if let Ok(o) = CachedObject::from_json(&json, fs, true) {
                prop_assert_eq!(&o.json()[..], &json[..]);
                let mut item = BytesMut::new();
                o.write_item(&mut item, true);
                let again = CachedObject::from_json(&o.with_resource_version(o.rv + 1), fs, true).unwrap();
                prop_assert_eq!(again.rv, o.rv + 1);
            }
            let _ = CachedObject::from_list_item(&json, "Pod", "v1", fs, true);
        }
    }

    /// Labels are read from the object's bytes: the same as a JSON decoder
    /// sees, escapes, duplicates (the last wins) and all.
    #[test]
    fn labels_read_from_bytes_match_a_decoder(
        labels in proptest::collection::vec(("[a-z/\\\\]{1,4}", "[a-z./\\\\]{0,4}"), 0..5),
        escape_slash in any::<bool>(),
    ) {
        let esc = |s: &str| {
            let j = serde_json::to_string(s).unwrap();
            if escape_slash { j.replace('/', "\\/") } else { j }
        };
        let body: Vec<String> = labels.iter().map(|(k, v)| format!("{}:{}", esc(k), esc(v))).collect();
        let json = format!(
            r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"c","namespace":"n","resourceVersion":"1","labels":{{{}}}}}}}"#,
            body.join(",")
        );
        let o = CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).unwrap();
        let decoded: serde_json::Value = serde_json::from_str(&json).unwrap();
        let decoded = decoded["metadata"]["labels"].as_object().unwrap();
        for (k, v) in decoded {
            prop_assert_eq!(o.labels().get(k), v.as_str());
        }
        prop_assert_eq!(o.labels().get("absent-key"), None);
    }

    /// Selectable fields read from the JSON without decoding the whole
    /// object are the ones read from the fully decoded object.
    #[test]
    fn selectable_fields_read_from_bytes_match_a_decoder(
        object in prop_oneof![shaped_object(), json_object()],
        escape_keys in any::<bool>(),
        namespaced in any::<bool>(),
    ) {
        let mut json = serde_json::to_string(&object).unwrap();
        if escape_keys {
            json = json.replace("\"name\":", "\"n\\u0061me\":").replace("\"spec\":", "\"sp\\u0065c\":");
        }
        let decoded: serde_json::Value = serde_json::from_str(&json).unwrap();
        for fs in ALL_FIELD_SETS {
            prop_assert_eq!(fs.extract_json(json.as_bytes(), namespaced).unwrap(), fs.extract(&decoded, namespaced));
        }
    }

    #[test]
    fn config_files_never_panic(s in prop_oneof![
        any::<String>(),
        "(listen|adminListen|cache|tls|upstream|authentication): [a-z0-9:.{}\\[\\] ]{0,20}\n( +[a-zA-Z]{1,12}: [a-z0-9]{0,6}\n){0,3}",
    ]) {
        if let Ok(c) = Config::from_yaml(&s) {
            let _ = c.validate();
        }
    }
}

/// Objects of the kinds node proxies read upstream in protobuf, as
/// kube-apiserver writes them (without `TypeMeta`, as in protobuf), and
/// their protobuf messages: the seeds the transcoder property mutates.
fn protobuf_seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let objects = [
        (
            "v1",
            "Pod",
            serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                             "creationTimestamp": "2026-12-07T00:00:00Z", "labels": {"app": "a"},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "o", "controller": true}]},
                "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
                         "tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 300}]},
                "status": {"phase": "Running", "podIP": "10.0.0.1",
                           "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-07T00:00:01Z"}]}
            }),
        ),
        (
            "v1",
            "ConfigMap",
            serde_json::json!({
                "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "8"},
                "data": {"a": "1", "b": "<&>"}, "binaryData": {"bin": "AAEC"}
            }),
        ),
        (
            "v1",
            "Service",
            serde_json::json!({
                "metadata": {"name": "s", "namespace": "ns", "resourceVersion": "9"},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 6443, "protocol": "TCP"},
                                   {"port": 53, "targetPort": "dns", "protocol": "UDP"}],
                         "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"], "type": "ClusterIP"}
            }),
        ),
        (
            "v1",
            "Node",
            serde_json::json!({
                "metadata": {"name": "n", "resourceVersion": "10", "labels": {"kubernetes.io/hostname": "n"}},
                "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                           "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-12-07T00:00:02Z", "lastTransitionTime": "2026-12-07T00:00:02Z"}],
                           "images": [{"names": ["i"], "sizeBytes": 1000}]}
            }),
        ),
    ];
    objects
        .into_iter()
        .map(|(version, kind, json)| {
            let message = apimachinery::protobuf::message_for("", version, kind).unwrap();
            let mut pb = Vec::new();
            apimachinery::protobuf::transcode(
                &serde_json::to_vec(&json).unwrap(),
                message,
                &mut pb,
            )
            .unwrap();
            (version, kind, pb)
        })
        .collect()
}

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

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// The protobuf → JSON transcoder (what a node proxy reads upstream)
    /// and back, on real objects' messages with bytes flipped, inserted
    /// or cut, and on arbitrary bytes: it never panics; what it writes is
    /// JSON; and that JSON, transcoded to protobuf and back, is the same
    /// value (as `fuzz/fuzz_targets/to_json.rs` checks coverage-guided).
    #[test]
    fn protobuf_transcoding_round_trips_and_never_panics(
        seed in 0usize..4,
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in prop::option::of(any::<usize>()),
        arbitrary in prop::option::weighted(0.2, prop::collection::vec(any::<u8>(), 0..256)),
    ) {
        let seeds = protobuf_seeds();
        let (version, kind, pb) = &seeds[seed];
        let message = apimachinery::protobuf::message_for("", version, kind).unwrap();
        let mut data = arbitrary.unwrap_or_else(|| pb.clone());
        if !data.is_empty() {
            for (at, b) in flips {
                let i = at % data.len();
                data[i] ^= b;
            }
            if let Some(at) = cut {
                data.truncate(at % (data.len() + 1));
            }
        }
        let mut json = Vec::new();
        if apimachinery::protobuf::to_json(&data, message, Some((kind, version)), &mut json).is_ok() {
            serde_json::from_slice::<serde::de::IgnoredAny>(&json).expect("well-formed JSON");
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&json) {
                let mut pb = Vec::new();
                if apimachinery::protobuf::transcode(&json, message, &mut pb).is_ok() {
                    let mut again = Vec::new();
                    apimachinery::protobuf::to_json(&pb, message, Some((kind, version)), &mut again)
                        .expect("its own protobuf");
                    if json != again {
                        let again: serde_json::Value = serde_json::from_slice(&again).unwrap();
                        prop_assert_eq!(without_nulls(value), without_nulls(again));
                    }
                }
            }
        }
    }
}
