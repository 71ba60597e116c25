//! Ingest: `CachedObject::from_json` for one object, as the reflector does
//! for every upstream event and list item.
//!
//! `cargo bench --bench ingest`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use apimachinery::resource::FieldSet;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kube_cache_proxy::cache::object::CachedObject;

#[path = "../crates/kcp-load/src/fixtures.rs"]
mod fixtures;

fn ingest(c: &mut Criterion) {
    let pod = fixtures::pod(4242, "default", &fixtures::node(7), 123_456);
    let cm = fixtures::config_map(42, "default", 123_456);
    // A list item: kube-apiserver omits kind/apiVersion in built-in lists.
    let pod_item = pod.replacen(r#""kind":"Pod","apiVersion":"v1","#, "", 1);

    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Bytes(pod.len() as u64));
    g.bench_function(format!("pod_{}B", pod.len()), |b| {
        b.iter(|| CachedObject::from_json(black_box(pod.as_bytes()), FieldSet::Pod, true).unwrap())
    });
    g.throughput(Throughput::Bytes(pod_item.len() as u64));
    g.bench_function(format!("pod_list_item_{}B", pod_item.len()), |b| {
        b.iter(|| {
            CachedObject::from_list_item(
                black_box(pod_item.as_bytes()),
                "Pod",
                "v1",
                FieldSet::Pod,
                true,
            )
            .unwrap()
        })
    });
    // The pod's selectable fields as `from_json` reads them (only the
    // members they come from are materialized) and, for reference, what a
    // full parse into a `serde_json::Value` costs, as it did before.
    g.throughput(Throughput::Bytes(pod.len() as u64));
    g.bench_function("pod_selectable_fields", |b| {
        b.iter(|| {
            FieldSet::Pod
                .extract_json(black_box(pod.as_bytes()), true)
                .unwrap()
        })
    });
    g.bench_function("reference_pod_to_serde_json_value", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(pod.as_bytes())).unwrap())
    });
    g.throughput(Throughput::Bytes(cm.len() as u64));
    g.bench_function(format!("configmap_{}B", cm.len()), |b| {
        b.iter(|| {
            CachedObject::from_json(black_box(cm.as_bytes()), FieldSet::Default, true).unwrap()
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = ingest
}
criterion_main!(benches);
