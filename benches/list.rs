//! Lists from the cache: `list::select` over 10,000 pods and the full body
//! encoding (`list::response`, body read frame by frame), with no selector, with a
//! label selector (a tenth match) and with a kubelet's field selector (one
//! node's pods). Throughput is the body's size in bytes.
//! `list_10000_pods_protobuf`: the same list in protobuf on a runtime of
//! two workers, as the proxy's, with the default budget and share
//! (`protobufCacheMib` 64, `protobufCachePercent` 5): items are
//! transcoded from their JSON but for the few versions kept (5 % of the
//! JSON's bytes), as when a proxy lists its pods again.
//!
//! `select_in/field_nodeName`: the kubelet's list walking only its node's
//! keys, from the `spec.nodeName` index.
//!
//! `cargo bench --bench list`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use apimachinery::resource::{FieldSet, Gvr};
use apimachinery::selector::{FieldSelector, LabelSelector};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use http_body_util::BodyExt;
use kube_cache_proxy::cache::encode;
use kube_cache_proxy::cache::filter::Filter;
use kube_cache_proxy::cache::negotiate::Representation;
use kube_cache_proxy::cache::object::CachedObject;
use kube_cache_proxy::cache::resource::ResourceInfo;
use kube_cache_proxy::cache::serve::list;
use kube_cache_proxy::cache::store::{Keys, Objects};
use prometheus::{IntCounter, IntGauge};

#[path = "../crates/kcp-load/src/fixtures.rs"]
mod fixtures;

const PODS: usize = 10_000;
const NODES: usize = 100;
const NAMESPACES: usize = 10;
const RV: u64 = 1_000_000;

fn objects() -> (Objects, usize) {
    let mut json_bytes = 0;
    let objects = (0..PODS)
        .map(|i| {
            let ns = format!("ns-{}", i % NAMESPACES);
            let json = fixtures::pod(i, &ns, &fixtures::node(i % NODES), i as u64 + 1);
            json_bytes += json.len();
            let o =
                Arc::new(CachedObject::from_json(json.as_bytes(), FieldSet::Pod, true).unwrap());
            (o.key_arc().clone(), o)
        })
        .collect();
    (objects, json_bytes)
}

fn info() -> ResourceInfo {
    ResourceInfo {
        gvr: Gvr {
            group: String::new(),
            version: "v1".into(),
            resource: "pods".into(),
        },
        kind: "Pod".into(),
        api_version: "v1".into(),
        namespaced: true,
        field_set: FieldSet::Pod,
        strip_item_type_meta: true,
        reads_as: None,
        scope: FieldSelector::default(),
        codec: None,
        upstream_protobuf: false,
    }
}

/// [`info`] with the proxy's default protobuf codec for pods.
fn protobuf_info(json_bytes: usize) -> ResourceInfo {
    let codec = encode::ProtoCodec::new(
        "",
        "v1",
        "Pod",
        "v1",
        IntGauge::new("b", "b").unwrap(),
        IntCounter::new("f", "f").unwrap(),
        encode::ProtoForms::new(64 << 20, 5).for_resource(0),
    )
    .unwrap();
    codec.note_objects(json_bytes as u64);
    ResourceInfo {
        codec: Some(Arc::new(codec)),
        ..info()
    }
}

fn body_len(
    rt: &tokio::runtime::Runtime,
    objects: &Objects,
    filter: &Filter,
    info: &ResourceInfo,
) -> usize {
    let page = list::select(objects, filter, "", None, 0, RV);
    rt.block_on(drain(
        list::response(page, info, RV, Representation::JSON).expect("JSON always encodes"),
    ))
}

/// Reads the body frame by frame, dropping each as a server does once it
/// is written (collecting it whole would add a 50 MB copy and its page
/// faults to every iteration).
async fn drain(resp: http::Response<apimachinery::body::Body>) -> usize {
    let mut body = resp.into_body();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            len += data.len();
        }
    }
    len
}

fn bench(c: &mut Criterion) {
    let (objects, json_bytes) = objects();
    let info = info();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let filters = [
        ("none", Filter::default()),
        (
            "label_app=web-3",
            Filter {
                labels: LabelSelector::parse("app=web-3").unwrap(),
                ..Filter::default()
            },
        ),
        (
            "field_nodeName",
            Filter {
                fields: FieldSet::Pod
                    .convert(
                        &FieldSelector::parse(&format!("spec.nodeName={}", fixtures::node(3)))
                            .unwrap(),
                    )
                    .unwrap(),
                ..Filter::default()
            },
        ),
    ];
    eprintln!(
        "list: {PODS} pods, {json_bytes} bytes of object JSON ({} B/pod)",
        json_bytes / PODS
    );

    let mut g = c.benchmark_group("list_10000_pods");
    for (name, filter) in &filters {
        let len = body_len(&rt, &objects, filter, &info);
        eprintln!("list {name}: body {len} bytes");
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::new("select", name), |b| {
            b.iter(|| list::select(black_box(&objects), filter, "", None, 0, RV))
        });
        g.bench_function(BenchmarkId::new("select_and_encode", name), |b| {
            b.iter(|| {
                let page = list::select(black_box(&objects), filter, "", None, 0, RV);
                rt.block_on(drain(
                    list::response(page, &info, RV, Representation::JSON)
                        .expect("JSON always encodes"),
                ))
            })
        });
    }
    // One node's pods walked from the `spec.nodeName` index
    // (`State::candidates`), as a list of them is now, against the walk of
    // every pod above (`select/field_nodeName`).
    let (_, on_node) = &filters[2];
    let node = fixtures::node(3);
    let keys: Keys = objects
        .iter()
        .filter(|(_, o)| o.field("spec.nodeName") == Some(node.as_str()))
        .map(|(k, _)| k.clone())
        .collect();
    g.bench_function(BenchmarkId::new("select_in", "field_nodeName"), |b| {
        b.iter(|| list::select_in(black_box(&objects), &keys, on_node, "", None, 0, RV))
    });
    g.finish();

    let info = protobuf_info(json_bytes);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let protobuf = |info: &ResourceInfo| {
        let page = list::select(black_box(&objects), &Filter::default(), "", None, 0, RV);
        // Inside the runtime: a list of measured versions is encoded on
        // its blocking threads.
        rt.block_on(async {
            drain(list::response(page, info, RV, Representation::PROTOBUF).expect("pods encode"))
                .await
        })
    };
    let len = protobuf(&info);
    eprintln!("list none, protobuf: body {len} bytes");
    let mut g = c.benchmark_group("list_10000_pods_protobuf");
    g.throughput(Throughput::Bytes(len as u64));
    g.bench_function("select_and_encode/none", |b| b.iter(|| protobuf(&info)));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
