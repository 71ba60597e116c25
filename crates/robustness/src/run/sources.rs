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
use crate::validate::WatcherState;

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
                        let value = c.value.as_deref().and_then(crate::etcd::object_value);
                        let prev = c.prev.as_deref().and_then(crate::etcd::object_value);
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

/// What is wrong with a watcher's final state (`watcher`, after its last
/// segment) against the apiserver's consistent list of its filter at
/// `list_rv` (`items`), if anything: the watcher must have seen every
/// change of its own up to `final_rev` (when the harness's writes
/// stopped), and must hold what the list holds when nothing of its own
/// changed between its last resourceVersion and the list's. Watchers run
/// until every list is taken and hollow kubelets write on after the
/// harness's writes stop, so a watcher may have gone past its list: the
/// two are then compared only if the reference knows the whole interval
/// and no change of the watcher's own lies in it. A list the reference
/// disagrees with is the harness's bug.
pub(super) fn final_state(
    reference: &Reference,
    filter: &Filter,
    watcher: &WatcherState,
    final_rev: u64,
    list_rv: u64,
    items: &BTreeMap<ObjectKey, u64>,
) -> Option<String> {
    let list_rv = list_rv.min(reference.head());
    let need = reference
        .expected(filter, 0, final_rev)
        .last()
        .map_or(0, |e| e.2);
    let at_list = reference.state_at(filter, list_rv);
    let (lo, hi) = (watcher.rv.min(list_rv), watcher.rv.max(list_rv));
    let comparable = hi <= reference.head() && reference.expected(filter, lo, hi).is_empty();
    if &at_list != items {
        Some(format!(
            "the reference disagrees with the apiserver's list at {list_rv} (first difference {}): a harness bug",
            first_difference(&at_list, items)
        ))
    } else if watcher.rv < need {
        Some(format!(
            "{filter}: behind at the end: its last resourceVersion {} is below its last change {need}",
            watcher.rv
        ))
    } else if comparable && &watcher.state != items {
        Some(format!(
            "{filter}: state at {} differs from a consistent list at {list_rv}: {}",
            watcher.rv,
            first_difference(&watcher.state, items)
        ))
    } else {
        None
    }
}

/// The first difference between a watcher's state and a list, described.
fn first_difference(a: &BTreeMap<ObjectKey, u64>, b: &BTreeMap<ObjectKey, u64>) -> String {
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::{Requirement, Resource};

    fn k(name: &str) -> ObjectKey {
        ObjectKey::new("a", name)
    }

    fn put(r: &mut Reference, rev: u64, name: &str, app: &str) {
        let pod = json!({"metadata": {"name": name, "namespace": "a", "labels": {"app": app}}});
        r.record(rev, &format!("/registry/pods/a/{name}"), Some(pod), None);
    }

    fn web() -> Filter {
        Filter {
            labels: vec![Requirement::Equals("app".into(), "web".into())],
            ..Filter::all(Resource::Pods)
        }
    }

    /// Start 10 with a/p1 (web) at 5; 12 update a/p1; 14 create a/p9
    /// (db); 15 update a/p1 (a hollow kubelet's late write, after the
    /// writes stopped at 13); progress to 20.
    fn reference() -> Reference {
        let p1 = json!({"metadata": {"name": "p1", "namespace": "a", "labels": {"app": "web"}}});
        let mut r = Reference::new(10, vec![(Resource::Pods, k("p1"), 5, p1)]);
        put(&mut r, 12, "p1", "web");
        put(&mut r, 14, "p9", "db");
        put(&mut r, 15, "p1", "web");
        r.progress(20);
        r
    }

    fn watcher(rv: u64, items: &[(&str, u64)]) -> WatcherState {
        WatcherState {
            state: items.iter().map(|(n, v)| (k(n), *v)).collect(),
            rv,
        }
    }

    #[test]
    fn a_watcher_past_its_list_is_compared_only_without_a_change_of_its_own_between() {
        let r = reference();
        let list: BTreeMap<ObjectKey, u64> = [(k("p1"), 12)].into();
        // At the list, or past it by another filter's change only: compared.
        assert_eq!(
            final_state(&r, &web(), &watcher(13, &[("p1", 12)]), 13, 13, &list),
            None
        );
        assert_eq!(
            final_state(&r, &web(), &watcher(14, &[("p1", 12)]), 13, 13, &list),
            None
        );
        let lost = final_state(&r, &web(), &watcher(14, &[]), 13, 13, &list).unwrap();
        assert!(
            lost.contains("state at 14 differs from a consistent list at 13"),
            "{lost}"
        );
        // Past it by its own later change (the kubelet's write at 15): the
        // list says nothing of what the watcher holds.
        assert_eq!(
            final_state(&r, &web(), &watcher(15, &[("p1", 15)]), 13, 13, &list),
            None
        );
        // Past what the reference knows: nothing to compare with.
        assert_eq!(
            final_state(&r, &web(), &watcher(25, &[]), 13, 13, &list),
            None
        );
        // Behind its own last change before the writes stopped.
        let behind = final_state(&r, &web(), &watcher(11, &[("p1", 5)]), 13, 13, &list).unwrap();
        assert!(behind.contains("behind at the end"), "{behind}");
    }
}
