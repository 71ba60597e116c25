//! `ingest`: objects ingested into a cache `State` in this process, and
//! the resident memory they add, relative to their JSON size.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use apimachinery::resource::FieldSet;
use clap::{Args, ValueEnum};
use kube_cache_proxy::cache::encode::ProtoCodec;
use kube_cache_proxy::cache::event::EventType;
use kube_cache_proxy::cache::object::CachedObject;
use kube_cache_proxy::cache::store::{Settings, State};

use crate::fixtures;
use crate::stats::{self, mib};

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ObjectKind {
    /// A scheduled pod (about 5 KB).
    Pod,
    /// A small config map (about 260 B).
    Configmap,
    /// A worker node reporting 20 images (about 7.5 KB).
    Node,
    /// A service's endpoint slice with 3 endpoints (about 1.6 KB).
    Endpointslice,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum IngestPath {
    /// One `ADDED` event at a time (`State::apply`), history of 1.
    Apply,
    /// One list (`State::replace`), as the reflector's first fill.
    Replace,
}

#[derive(Debug, Clone, Args)]
pub struct IngestArgs {
    /// Objects.
    #[arg(long, default_value_t = 50_000)]
    pub objects: usize,
    /// What they are.
    #[arg(long, value_enum, default_value_t = ObjectKind::Pod)]
    pub kind: ObjectKind,
    /// How they enter the cache.
    #[arg(long, value_enum, default_value_t = IngestPath::Apply)]
    pub via: IngestPath,
    /// Also encode each object's protobuf form, as the first protobuf
    /// reader of an object version does: the memory with both encodings.
    #[arg(long)]
    pub protobuf: bool,
    /// With --protobuf: MiB of protobuf encodings kept, as the proxy's
    /// `cache.protobufCacheMib` (0: none kept).
    #[arg(long, default_value_t = 64)]
    pub protobuf_cache_mib: u64,
    /// With --protobuf: the kept encodings' ceiling in percent of the
    /// cached objects' bytes, as the proxy's `cache.protobufCachePercent`.
    #[arg(long, default_value_t = 5)]
    pub protobuf_cache_percent: u64,
    /// With --protobuf: how many times each object is read in protobuf
    /// once cached (the proxy keeps an encoding on its second read).
    #[arg(long, default_value_t = 1)]
    pub protobuf_reads: usize,
}

/// Memory measured by `ingest`.
#[derive(Debug, Default)]
pub struct IngestReport {
    pub ratio: f64,
    pub accounted: usize,
}

pub fn ingest(a: &IngestArgs) -> Result<IngestReport> {
    let (field_set, what, namespaced) = match a.kind {
        ObjectKind::Pod => (FieldSet::Pod, "pods", true),
        ObjectKind::Configmap => (FieldSet::Default, "configmaps", true),
        ObjectKind::Node => (FieldSet::Node, "nodes", false),
        ObjectKind::Endpointslice => (FieldSet::Default, "endpointslices", true),
    };
    // Bytes of the protobuf forms alive (kept, or held by the state).
    let proto_gauge = prometheus::IntGauge::new("encoded_bytes", "-")?;
    let codec = if a.protobuf {
        let (group, kind, api_version) = match a.kind {
            ObjectKind::Pod => ("", "Pod", "v1"),
            ObjectKind::Configmap => ("", "ConfigMap", "v1"),
            ObjectKind::Node => ("", "Node", "v1"),
            ObjectKind::Endpointslice => {
                ("discovery.k8s.io", "EndpointSlice", "discovery.k8s.io/v1")
            }
        };
        Some(
            ProtoCodec::new(
                group,
                "v1",
                kind,
                api_version,
                proto_gauge.clone(),
                prometheus::IntCounter::new("encode_failures", "-")?,
                kube_cache_proxy::cache::encode::ProtoForms::new(
                    a.protobuf_cache_mib << 20,
                    a.protobuf_cache_percent,
                )
                .for_resource(0),
            )
            .ok_or_else(|| anyhow!("no protobuf schema for {kind}"))?,
        )
    } else {
        None
    };
    // The object as cached.
    let cached = |text: &str| -> Result<CachedObject> {
        Ok(CachedObject::from_json(
            text.as_bytes(),
            field_set,
            namespaced,
        )?)
    };
    // Its protobuf form, as a protobuf reader asks for it.
    let read = |o: &CachedObject| -> Result<()> {
        if let Some(codec) = &codec {
            codec
                .form(o)
                .ok_or_else(|| anyhow!("the {what} fixture does not encode in protobuf"))?;
        }
        Ok(())
    };
    let mut state = State::new(Settings {
        history_capacity: 1,
        history_max_age: Duration::from_secs(300),
        watcher_buffer: 100,
        blocked_budget: Duration::from_secs(10),
        node_indexed: a.kind == ObjectKind::Pod,
        namespaced,
        field_set,
        history_bytes: None,
    });
    let json = |i: usize| -> String {
        let ns = format!("ns-{}", i % 10);
        let rv = i as u64 + 2;
        match a.kind {
            ObjectKind::Pod => fixtures::pod(i, &ns, &fixtures::node(i % 100), rv),
            ObjectKind::Configmap => fixtures::config_map(i, &ns, rv),
            ObjectKind::Node => fixtures::node_object(i, 20, rv),
            ObjectKind::Endpointslice => fixtures::endpoint_slice(i, &ns, 3, rv),
        }
    };
    // Warm the allocator and the code paths with a throwaway state.
    {
        let mut warm = State::new(Settings {
            history_capacity: 1,
            history_max_age: Duration::from_secs(300),
            watcher_buffer: 1,
            blocked_budget: Duration::from_secs(1),
            node_indexed: false,
            namespaced,
            field_set,
            history_bytes: None,
        });
        warm.replace(Vec::new(), 1, Instant::now());
        for i in 0..100 {
            let o = cached(&json(i))?;
            if let Some(codec) = &codec {
                codec.encode(o.json());
            }
            warm.apply(EventType::Added, o, Instant::now());
        }
    }
    let before = stats::rss_self().ok_or_else(|| anyhow!("cannot read /proc/self/statm"))?;
    let started = Instant::now();
    let mut json_bytes = 0u64;
    match a.via {
        IngestPath::Apply => {
            state.replace(Vec::new(), 1, Instant::now());
            for i in 0..a.objects {
                let text = json(i);
                json_bytes += text.len() as u64;
                let o = cached(&text)?;
                state.apply(EventType::Added, o, Instant::now());
            }
        }
        IngestPath::Replace => {
            let mut items = Vec::with_capacity(a.objects);
            for i in 0..a.objects {
                let text = json(i);
                json_bytes += text.len() as u64;
                let o = cached(&text)?;
                items.push(o);
            }
            state.replace(items, a.objects as u64 + 2, Instant::now());
        }
    }
    // Then every object read in protobuf, the cache's bytes known
    // as the proxy's resource reports them after each change.
    if let Some(codec) = &codec {
        codec.note_objects(state.bytes() as u64);
        for _ in 0..a.protobuf_reads {
            for o in state.objects().values() {
                read(o)?;
            }
        }
        codec.settle_forms();
    }
    let took = started.elapsed();
    let proto_bytes = proto_gauge.get().max(0) as u64;
    let after = stats::rss_self().unwrap_or(0);
    let delta = after.saturating_sub(before);
    let ratio = delta as f64 / json_bytes.max(1) as f64;
    let accounted = state.bytes() as u64;
    println!("--- results");
    println!(
        "ingest: {} {what} via {:?} in {:.2}s ({:.0}/s): JSON {} ({:.0} B each)",
        a.objects,
        a.via,
        took.as_secs_f64(),
        a.objects as f64 / took.as_secs_f64(),
        mib(json_bytes),
        json_bytes as f64 / a.objects.max(1) as f64
    );
    println!(
        "ingest: RSS {} -> {}: +{} = {:.3}x the JSON, {:.0} B per object ({:.0} B over its JSON)",
        mib(before),
        mib(after),
        mib(delta),
        ratio,
        delta as f64 / a.objects.max(1) as f64,
        (delta as f64 - json_bytes as f64) / a.objects.max(1) as f64
    );
    if a.protobuf {
        println!(
            "ingest: protobuf forms {} ({:.0} B each, {:.3}x the JSON)",
            mib(proto_bytes),
            proto_bytes as f64 / a.objects.max(1) as f64,
            proto_bytes as f64 / json_bytes.max(1) as f64
        );
    }
    println!(
        "ingest: the cache's own accounting (State::bytes): {} = {:.3}x the JSON",
        mib(accounted),
        accounted as f64 / json_bytes.max(1) as f64
    );
    std::hint::black_box(&state);
    Ok(IngestReport {
        ratio,
        accounted: state.bytes(),
    })
}
