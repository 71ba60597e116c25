//! What the streams are validated with besides the recordings: etcd's
//! history recorded into the reference, the relists each proxy logged,
//! and consistent lists straight from the apiserver at the end.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::etcd::{Etcd, WatchMsg};
use crate::model::{Filter, ObjectKey};
use crate::reference::Reference;
use crate::topology::Topology;

/// Records etcd's history into `reference` from `start + 1` until `stop`.
pub(super) async fn record(
    etcd: Etcd,
    reference: Arc<std::sync::Mutex<Reference>>,
    start: u64,
    stop: CancellationToken,
) {
    let mut from = start + 1;
    while !stop.is_cancelled() {
        let (tx, mut rx) = mpsc::channel::<WatchMsg>(1024);
        let etcd2 = etcd.clone();
        let watch = tokio::spawn(async move { etcd2.watch(from, &tx).await });
        loop {
            let msg = tokio::select! {
                () = stop.cancelled() => { watch.abort(); return; }
                m = rx.recv() => m,
            };
            let Some(msg) = msg else { break };
            let Ok(mut r) = reference.lock() else { return };
            match msg {
                WatchMsg::Progress(rev) => r.progress(rev),
                WatchMsg::Events(changes) => {
                    for c in changes {
                        let value = c
                            .value
                            .as_deref()
                            .and_then(|v| serde_json::from_slice(v).ok());
                        let prev = c
                            .prev
                            .as_deref()
                            .and_then(|v| serde_json::from_slice(v).ok());
                        let deleted = c.value.is_none();
                        if deleted
                            || value.is_some()
                            || crate::model::Resource::of_etcd_key(&c.key).is_none()
                        {
                            r.record(c.revision, &c.key, value, prev);
                        }
                        r.progress(c.revision);
                    }
                }
            }
            from = r.head() + 1;
        }
        if let Ok(Err(e)) = watch.await {
            eprintln!("reference: etcd watch ended: {e:#}; resuming from {from}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Relists each proxy logged (`listed from upstream`), by resource: the
/// resourceVersions where a relist window may end.
pub(super) fn relists(dir: &Path) -> HashMap<String, BTreeSet<u64>> {
    let mut out: HashMap<String, BTreeSet<u64>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("proxy.log")) else {
            continue;
        };
        for line in text.lines() {
            if !line.contains("listed from upstream") {
                continue;
            }
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let rv = v["rv"]
                .as_u64()
                .or_else(|| v["rv"].as_str().and_then(|s| s.parse().ok()));
            if let (Some(resource), Some(rv)) = (v["resource"].as_str(), rv) {
                out.entry(resource.to_string()).or_default().insert(rv);
            }
        }
    }
    out
}

/// The first difference between a watcher's state and a list, described.
pub(super) fn first_difference(
    a: &BTreeMap<ObjectKey, u64>,
    b: &BTreeMap<ObjectKey, u64>,
) -> String {
    for (k, v) in a {
        match b.get(k) {
            None => return format!("{k}@{v} only in the watcher"),
            Some(w) if w != v => return format!("{k}: watcher @{v}, list @{w}"),
            _ => {}
        }
    }
    for (k, v) in b {
        if !a.contains_key(k) {
            return format!("{k}@{v} only in the list");
        }
    }
    "none".into()
}

/// A consistent list of `filter` straight from the apiserver.
pub(super) async fn final_list(
    topo: &Topology,
    filter: &Filter,
) -> Result<(u64, BTreeMap<ObjectKey, u64>)> {
    let q = format!(
        "{}?{}",
        filter.resource.path(filter.namespace.as_deref()),
        filter.query().trim_start_matches('&')
    );
    let r = topo.admin.get(&q, None, Duration::from_secs(30)).await?;
    let v = r.json();
    let rv = v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("final list: {}", r.status))?;
    let mut items = BTreeMap::new();
    for item in v["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let m = &item["metadata"];
        if let Some(irv) = m["resourceVersion"].as_str().and_then(|s| s.parse().ok()) {
            items.insert(
                ObjectKey::new(
                    m["namespace"].as_str().unwrap_or(""),
                    m["name"].as_str().unwrap_or(""),
                ),
                irv,
            );
        }
    }
    Ok((rv, items))
}
