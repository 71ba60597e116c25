//! Dispatch: one upstream event applied to a `State` with many registered
//! watchers (`State::apply`: store update, history, index lookup, filter,
//! frame encoding once, `try_send` to each matching watcher).
//!
//! - `all_match/1000`: 1,000 unfiltered watchers; every one gets the event.
//! - `node_indexed/5000`: 5,000 watchers pinned by `spec.nodeName` to
//!   distinct nodes (kubelets); the event reaches one, found by the index.
//! - `label_unindexed/5000`: 5,000 watchers with a label selector each
//!   (not indexable); the event reaches one, but every filter is evaluated.
//!   The difference to `node_indexed` is what the index saves.
//!
//! Receivers are drained outside the timed section after every event, so
//! buffers never fill and no watcher goes lagging.
//!
//! `cargo bench --bench dispatch`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use apimachinery::resource::FieldSet;
use apimachinery::selector::{FieldSelector, LabelSelector};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kube_cache_proxy::cache::event::EventType;
use kube_cache_proxy::cache::filter::Filter;
use kube_cache_proxy::cache::object::CachedObject;
use kube_cache_proxy::cache::store::{Delivery, Settings, Start, State};
use tokio::sync::mpsc;

#[path = "../crates/kcp-load/src/fixtures.rs"]
mod fixtures;

const NAMESPACE: &str = "default";

fn settings() -> Settings {
    Settings {
        history_capacity: 1000,
        history_max_age: std::time::Duration::from_secs(300),
        watcher_buffer: 100,
        blocked_budget: Duration::from_secs(10),
        node_indexed: true,
        namespaced: true,
        field_set: FieldSet::Pod,
        history_bytes: None,
    }
}

fn pod(i: usize, node: usize, rv: u64) -> CachedObject {
    let json = fixtures::pod(i, NAMESPACE, &fixtures::node(node), rv);
    CachedObject::from_json(json.as_bytes(), FieldSet::Pod, true).unwrap()
}

/// A synced state holding `pods` pods (pod `i` on node `i`) at RV `pods`.
fn state(pods: usize) -> State {
    let mut s = State::new(settings());
    let items: Vec<_> = (0..pods).map(|i| pod(i, i, i as u64 + 1)).collect();
    s.replace(items, pods as u64, Instant::now());
    s
}

fn node_filter(node: usize) -> Arc<Filter> {
    let sel = FieldSelector::parse(&format!("spec.nodeName={}", fixtures::node(node))).unwrap();
    Arc::new(Filter {
        fields: FieldSet::Pod.convert(&sel).unwrap(),
        ..Filter::default()
    })
}

fn label_filter(i: usize) -> Arc<Filter> {
    Arc::new(Filter {
        labels: LabelSelector::parse(&format!("app={}", fixtures::app(i))).unwrap(),
        ..Filter::default()
    })
}

/// Applies `MODIFIED` events for pod `target` (on node `target`), timing
/// only `apply`; the new object is built and receivers are drained
/// outside the timed section. Panics unless every event reached
/// `expect` watchers.
fn run(
    b: &mut criterion::Bencher<'_>,
    s: &mut State,
    rxs: &mut [mpsc::Receiver<Delivery>],
    target: usize,
    expect: u64,
) {
    let mut rv = s.rv();
    b.iter_custom(|iters| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            rv += 1;
            let object = pod(target, target, rv);
            let start = Instant::now();
            let outcome = s.apply(EventType::Modified, object, start);
            total += start.elapsed();
            assert_eq!(outcome.dispatched, expect);
            for rx in rxs.iter_mut() {
                while rx.try_recv().is_ok() {}
            }
        }
        total
    });
}

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    g.throughput(Throughput::Elements(1));

    // 1,000 watchers, all matching.
    {
        let mut s = state(1);
        let rv = s.rv();
        let mut rxs: Vec<_> = (0..1000)
            .map(|_| {
                s.register(Arc::new(Filter::default()), Start::After(rv))
                    .unwrap()
                    .rx
            })
            .collect();
        g.bench_function(BenchmarkId::new("all_match", 1000), |b| {
            run(b, &mut s, &mut rxs, 0, 1000)
        });
    }

    // 5,000 kubelets, one per node; the event concerns one node.
    {
        let mut s = state(5000);
        let rv = s.rv();
        let mut rxs: Vec<_> = (0..5000)
            .map(|n| s.register(node_filter(n), Start::After(rv)).unwrap().rx)
            .collect();
        g.bench_function(BenchmarkId::new("node_indexed", 5000), |b| {
            run(b, &mut s, &mut rxs, 2500, 1)
        });
    }

    // The same fan-out without an index: 5,000 watchers with a label
    // selector each; only watcher 0's matches the pod that changes.
    {
        let mut s = state(5000);
        let rv = s.rv();
        let target = 2500;
        let mut rxs: Vec<_> = (0..5000)
            .map(|w| {
                let f = if w == 0 {
                    label_filter(target)
                } else {
                    Arc::new(Filter {
                        labels: LabelSelector::parse(&format!("app=other-{w}")).unwrap(),
                        ..Filter::default()
                    })
                };
                s.register(f, Start::After(rv)).unwrap().rx
            })
            .collect();
        g.bench_function(BenchmarkId::new("label_unindexed", 5000), |b| {
            run(b, &mut s, &mut rxs, target, 1)
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = dispatch
}
criterion_main!(benches);
