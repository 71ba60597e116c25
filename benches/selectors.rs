//! Label and field selectors: parsing (once per request) and matching
//! (once per object per list, per event per unindexed watcher), against
//! the labels and fields a pod carries after ingest.
//!
//! `cargo bench --bench selectors`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use apimachinery::resource::FieldSet;
use apimachinery::selector::{FieldSelector, LabelSelector};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kube_cache_proxy::cache::filter::Filter;
use kube_cache_proxy::cache::object::CachedObject;

#[path = "../crates/kcp-load/src/fixtures.rs"]
mod fixtures;

const LABELS: &[(&str, &str)] = &[
    ("equals", "app=web-3"),
    (
        "set",
        "app in (web-1,web-3,web-5),tier notin (canary),!deprecated",
    ),
    (
        "many",
        "app=web-3,app.kubernetes.io/name,pod-template-hash!=x,tier in (frontend,backend),environment notin (dev,test),!canary",
    ),
];

const FIELDS: &[(&str, &str)] = &[
    ("nodeName", "spec.nodeName=node-00003"),
    (
        "kubelet_like",
        "spec.nodeName=node-00003,status.phase!=Succeeded,status.phase!=Failed",
    ),
];

fn bench(c: &mut Criterion) {
    let json = fixtures::pod(3, "default", &fixtures::node(3), 42);
    let pod = CachedObject::from_json(json.as_bytes(), FieldSet::Pod, true).unwrap();

    let mut g = c.benchmark_group("selectors");
    for (name, text) in LABELS {
        g.bench_function(BenchmarkId::new("label_parse", name), |b| {
            b.iter(|| LabelSelector::parse(black_box(text)).unwrap())
        });
        let sel = LabelSelector::parse(text).unwrap();
        g.bench_function(BenchmarkId::new("label_match", name), |b| {
            b.iter(|| black_box(&sel).matches(&pod.labels()))
        });
    }
    for (name, text) in FIELDS {
        g.bench_function(BenchmarkId::new("field_parse_convert", name), |b| {
            b.iter(|| {
                FieldSet::Pod
                    .convert(&FieldSelector::parse(black_box(text)).unwrap())
                    .unwrap()
            })
        });
        let sel = FieldSet::Pod
            .convert(&FieldSelector::parse(text).unwrap())
            .unwrap();
        g.bench_function(BenchmarkId::new("field_match", name), |b| {
            b.iter(|| black_box(&sel).matches(&pod.fields()))
        });
    }
    let filter = Filter {
        namespace: Some("default".into()),
        labels: LabelSelector::parse(LABELS[1].1).unwrap(),
        fields: FieldSet::Pod
            .convert(&FieldSelector::parse(FIELDS[1].1).unwrap())
            .unwrap(),
    };
    g.bench_function("filter_match/namespace+labels+fields", |b| {
        b.iter(|| black_box(&filter).matches(&pod))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
