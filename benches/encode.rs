//! Encodings: JSON as held, protobuf transcoded from it, and the
//! metadata-only forms, for a pod, a node and an endpointslice shaped like
//! the apiserver's (`crates/kcp-load/src/fixtures.rs`).
//!
//! Prints, before timing, the bytes of each form (an object, a list item,
//! a watch event frame) and the memory a cached object holds with both
//! encodings present, relative to its JSON. Times:
//! - `transcode`: the one-time protobuf encoding of an object version
//!   (the first protobuf reader pays it, every other reader shares it);
//! - `transcoder/<kind>/{streaming,tree}`: the object's message alone, by
//!   the streaming transcoder and by the tree transcoder it falls back to;
//! - `frame/<kind>/<representation>`: building one watch event's frame
//!   for the first watcher in a representation (the others share it),
//!   from an object whose protobuf form is already held;
//! - `to_json/<kind>`: the object's message back to the apiserver's JSON
//!   (`apimachinery::protobuf::to_json`);
//! - `ingest/<kind>/{json,protobuf}`: what the reflector does with one
//!   upstream watch event before applying it, read in JSON (the event line
//!   parsed, the object ingested) or in protobuf (the frame read, the
//!   object written as JSON, then ingested: `cache.upstreamEncoding`).
//!
//! `cargo bench --bench encode`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use apimachinery::resource::FieldSet;
use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kube_cache_proxy::cache::encode::{self, ProtoCodec};
use kube_cache_proxy::cache::event::{Event, EventType, Which};
use kube_cache_proxy::cache::negotiate::{Encoding, MetaVersion, Representation};
use kube_cache_proxy::cache::object::CachedObject;
use prometheus::{IntCounter, IntGauge};

#[path = "../crates/kcp-load/src/fixtures.rs"]
mod fixtures;

struct Case {
    name: &'static str,
    json: String,
    group: &'static str,
    kind: &'static str,
    api_version: &'static str,
    field_set: FieldSet,
    namespaced: bool,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "pod",
            json: fixtures::pod(4242, "default", &fixtures::node(7), 123_456),
            group: "",
            kind: "Pod",
            api_version: "v1",
            field_set: FieldSet::Pod,
            namespaced: true,
        },
        Case {
            name: "node",
            json: fixtures::node_object(7, 20, 123_456),
            group: "",
            kind: "Node",
            api_version: "v1",
            field_set: FieldSet::Node,
            namespaced: false,
        },
        Case {
            name: "endpointslice",
            json: fixtures::endpoint_slice(7, "default", 10, 123_456),
            group: "discovery.k8s.io",
            kind: "EndpointSlice",
            api_version: "discovery.k8s.io/v1",
            field_set: FieldSet::Default,
            namespaced: true,
        },
    ]
}

fn codec(c: &Case) -> ProtoCodec {
    let codec = ProtoCodec::new(
        c.group,
        "v1",
        c.kind,
        c.api_version,
        IntGauge::new("b", "b").unwrap(),
        IntCounter::new("f", "f").unwrap(),
        encode::ProtoForms::new(64 << 20, 100).for_resource(0),
    )
    .unwrap();
    // Room to keep every form (the frames below read a kept one).
    codec.note_objects(1 << 30);
    codec
}

const META: Representation = Representation {
    encoding: Encoding::Protobuf,
    metadata: Some(MetaVersion::V1),
};
const META_JSON: Representation = Representation {
    encoding: Encoding::Json,
    metadata: Some(MetaVersion::V1),
};

fn sizes() {
    eprintln!(
        "{:<14} {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>9} {:>9} | {:>7} {:>7}",
        "bytes",
        "json obj",
        "json item",
        "json evt",
        "pb obj",
        "pb item",
        "pb evt",
        "meta json",
        "meta pb",
        "mem/json",
        "pb/json"
    );
    for c in cases() {
        let codec = codec(&c);
        let o = CachedObject::from_json(c.json.as_bytes(), c.field_set, c.namespaced).unwrap();
        let mut item = BytesMut::new();
        o.write_item(&mut item, true);
        let json_event = encode::frame(Encoding::Json, "MODIFIED", o.json()).len();
        let pb = codec.form(&o).expect("the fixture encodes");
        let pb_item = apimachinery::protobuf::field_len(2, pb.raw().len());
        let pb_event = encode::frame(Encoding::Protobuf, "MODIFIED", pb.envelope()).len();
        let meta_json = encode::object_bytes(&o, Some(&codec), META_JSON)
            .unwrap()
            .len();
        let meta_pb = encode::object_bytes(&o, Some(&codec), META).unwrap().len();
        // Memory: the object as cached (JSON, key, labels, fields,
        // bookkeeping) plus its protobuf form.
        let memory = o.heap_size() + pb.envelope().len() + std::mem::size_of::<encode::ProtoForm>();
        eprintln!(
            "{:<14} {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>9} {:>9} | {:>6.2}x {:>6.2}x",
            c.name,
            o.json().len(),
            item.len() + 1,
            json_event,
            pb.envelope().len(),
            pb_item,
            pb_event,
            meta_json,
            meta_pb,
            memory as f64 / o.json().len() as f64,
            pb.envelope().len() as f64 / o.json().len() as f64,
        );
    }
}

fn encode(c: &mut Criterion) {
    sizes();
    let mut g = c.benchmark_group("transcode");
    for case in cases() {
        let codec = codec(&case);
        g.throughput(Throughput::Bytes(case.json.len() as u64));
        g.bench_function(case.name, |b| {
            b.iter(|| codec.encode(black_box(case.json.as_bytes())).unwrap())
        });
    }
    g.finish();

    // The object's message alone, by each of the two transcoders: the
    // streaming one (`apimachinery::protobuf::transcode`, which falls back
    // to the tree) and the tree transcoder alone.
    let mut g = c.benchmark_group("transcoder");
    for case in cases() {
        let message = apimachinery::protobuf::message_for(case.group, "v1", case.kind).unwrap();
        let json = case.json.as_bytes();
        let mut out = Vec::with_capacity(16 << 10);
        g.throughput(Throughput::Bytes(json.len() as u64));
        g.bench_function(format!("{}/streaming", case.name), |b| {
            b.iter(|| {
                out.clear();
                apimachinery::protobuf::transcode(black_box(json), message, &mut out).unwrap();
            })
        });
        g.bench_function(format!("{}/tree", case.name), |b| {
            b.iter(|| {
                out.clear();
                apimachinery::protobuf::transcode_reference(black_box(json), message, &mut out)
                    .unwrap();
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("to_json");
    for case in cases() {
        let message = apimachinery::protobuf::message_for(case.group, "v1", case.kind).unwrap();
        let mut pb = Vec::new();
        apimachinery::protobuf::transcode(case.json.as_bytes(), message, &mut pb).unwrap();
        let mut out = Vec::with_capacity(16 << 10);
        g.throughput(Throughput::Bytes(case.json.len() as u64));
        g.bench_function(case.name, |b| {
            b.iter(|| {
                out.clear();
                apimachinery::protobuf::to_json(
                    black_box(&pb),
                    message,
                    Some((case.kind, "v1")),
                    &mut out,
                )
                .unwrap();
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("ingest");
    for case in cases() {
        let codec = codec(&case);
        let line = encode::frame(Encoding::Json, "MODIFIED", case.json.as_bytes());
        let envelope = codec.encode(case.json.as_bytes()).unwrap();
        let frame = encode::frame(Encoding::Protobuf, "MODIFIED", envelope.envelope());
        #[derive(serde::Deserialize)]
        struct WireEvent<'a> {
            #[serde(rename = "type", borrow)]
            kind: std::borrow::Cow<'a, str>,
            #[serde(borrow)]
            object: &'a serde_json::value::RawValue,
        }
        g.bench_function(format!("{}/json", case.name), |b| {
            b.iter(|| {
                let e: WireEvent<'_> =
                    serde_json::from_slice(black_box(&line[..line.len() - 1])).unwrap();
                assert_eq!(e.kind, "MODIFIED");
                CachedObject::from_json(e.object.get().as_bytes(), case.field_set, case.namespaced)
                    .unwrap()
            })
        });
        g.bench_function(format!("{}/protobuf", case.name), |b| {
            b.iter(|| {
                let (kind, json) = kube_cache_proxy::cache::ingest::upstream_protobuf::event(
                    black_box(&frame[4..]),
                    &codec,
                )
                .unwrap();
                assert_eq!(kind, "MODIFIED");
                CachedObject::from_json(&json, case.field_set, case.namespaced).unwrap()
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("frame");
    for case in cases() {
        let codec = codec(&case);
        let o = Arc::new(
            CachedObject::from_json(case.json.as_bytes(), case.field_set, case.namespaced).unwrap(),
        );
        codec.form(&o).unwrap();
        for (label, repr) in [
            ("json", Representation::JSON),
            ("protobuf", Representation::PROTOBUF),
            ("metadata_json", META_JSON),
            ("metadata_protobuf", META),
        ] {
            g.bench_function(format!("{}/{label}", case.name), |b| {
                b.iter(|| {
                    let e = Event::new(123_457, EventType::Modified, o.clone(), Some(o.clone()));
                    e.frame(Which::Modified, black_box(repr), Some(&codec))
                        .unwrap()
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = encode
}
criterion_main!(benches);
