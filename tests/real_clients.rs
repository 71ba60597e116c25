//! The client matrix against a real kube-apiserver v1.36: each client
//! library watches the same objects through the proxy and directly, and
//! must end with the same state, having seen the same changes.
//!
//! - kube-rs's `runtime::watcher` with a `reflector` store, with streaming
//!   lists (`sendInitialEvents`, `watcher::Config::streaming_lists`) and
//!   with list-then-watch (the default).
//!
//! The writes (creates, updates, deletes) go to the apiserver directly,
//! after every watcher has synced. Skipped where there is no control
//! plane.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use kube_runtime::reflector::{self, Store};
use kube_runtime::watcher::{self, Event};
use serde_json::json;
use support::real::{RealEnv, eventually, metric_sum};

/// What a watcher saw after its initial state: `(change, name, rv)`.
type Seen = Arc<Mutex<Vec<(&'static str, String, String)>>>;

async fn client(kubeconfig: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// A reflector of `ns`'s configmaps on `client`; its store and what it
/// saw after its initial state.
fn reflect(
    client: kube::Client,
    ns: &str,
    streaming: bool,
) -> (Store<ConfigMap>, Seen, tokio::task::JoinHandle<()>) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let config = if streaming {
        watcher::Config::default().streaming_lists()
    } else {
        watcher::Config::default()
    };
    let (store, writer) = reflector::store();
    let seen: Seen = Arc::default();
    let events = reflector::reflector(writer, watcher::watcher(api, config));
    let recorded = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let (change, object) = match event {
                Ok(Event::Apply(o)) => ("apply", o),
                Ok(Event::Delete(o)) => ("delete", o),
                Ok(_) => continue,
                Err(e) => panic!("watcher error: {e}"),
            };
            recorded.lock().unwrap().push((
                change,
                object.metadata.name.clone().unwrap_or_default(),
                object.metadata.resource_version.clone().unwrap_or_default(),
            ));
        }
    });
    (store, seen, task)
}

fn state(store: &Store<ConfigMap>) -> BTreeMap<String, String> {
    store
        .state()
        .iter()
        .map(|o| {
            (
                o.metadata.name.clone().unwrap_or_default(),
                o.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_watchers_end_identical_through_the_proxy_and_directly() {
    let Some(env) = RealEnv::start_with(support::cache_configmaps).await else {
        return;
    };
    let ns = env.namespace("clients-kube-rs").await;
    let admin = env.cp.admin();
    let direct = client(&env.cp.kubeconfig_text(&env.cp.url(), "admin", admin)).await;
    let proxied = client(&kube_cache_proxy::kubeconfig::with_certificate(
        &env.proxy_url,
        &env.proxy_ca_pem,
        "admin",
        &admin.cert_pem,
        &admin.key_pem,
    ))
    .await;
    let api: Api<ConfigMap> = Api::namespaced(direct.clone(), &ns);
    let cm = |name: &str, v: &str| -> ConfigMap {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": {"v": v}}))
        .unwrap()
    };
    api.create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();

    let mut watchers = Vec::new();
    for (side, c) in [("proxy", &proxied), ("direct", &direct)] {
        for streaming in [true, false] {
            let (store, seen, task) = reflect(c.clone(), &ns, streaming);
            tokio::time::timeout(Duration::from_secs(30), store.wait_until_ready())
                .await
                .unwrap_or_else(|_| panic!("{side} streaming={streaming}: no initial state"))
                .unwrap();
            seen.lock().unwrap().clear();
            watchers.push((side, streaming, store, seen, task));
        }
    }

    // Creates, updates, deletes.
    api.create(&PostParams::default(), &cm("b", "1"))
        .await
        .unwrap();
    api.replace("a", &PostParams::default(), &{
        let mut a = api.get("a").await.unwrap();
        a.data = Some([("v".to_string(), "2".to_string())].into());
        a
    })
    .await
    .unwrap();
    api.create(&PostParams::default(), &cm("c", "1"))
        .await
        .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    api.replace("c", &PostParams::default(), &{
        let mut c = api.get("c").await.unwrap();
        c.data = Some([("v".to_string(), "2".to_string())].into());
        c
    })
    .await
    .unwrap();
    let truth: BTreeMap<String, String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| {
            (
                o.metadata.name.clone().unwrap(),
                o.metadata.resource_version.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(truth.keys().collect::<Vec<_>>(), ["a", "c"]);

    for (side, streaming, store, _, _) in &watchers {
        eventually(Duration::from_secs(20), "the final state", || {
            let s = state(store);
            let truth = truth.clone();
            async move { (s == truth).then_some(()) }
        })
        .await;
        println!(
            "kube-rs watcher ({side}, streaming lists: {streaming}): final state as the apiserver's"
        );
    }
    // Every watcher saw the same five changes, in the same order, with the
    // same resourceVersions.
    let seen: Vec<_> = watchers
        .iter()
        .map(|(side, streaming, _, seen, _)| (*side, *streaming, seen.lock().unwrap().clone()))
        .collect();
    let expected = &seen[2].2;
    assert_eq!(
        expected
            .iter()
            .map(|(c, n, _)| (*c, n.as_str()))
            .collect::<Vec<_>>(),
        [
            ("apply", "b"),
            ("apply", "a"),
            ("apply", "c"),
            ("delete", "b"),
            ("apply", "c")
        ],
        "direct, streaming lists"
    );
    for (side, streaming, s) in &seen {
        assert_eq!(s, expected, "{side}, streaming lists: {streaming}");
    }
    // The proxy's watchers were served from its cache, not passed through.
    let (_, metrics) = env.running.admin_get("/metrics").await;
    let served = metric_sum(
        &metrics,
        "kube_cache_proxy_cache_reads_total",
        &[
            ("resource", "configmaps"),
            ("verb", "WATCH"),
            ("source", "cache"),
        ],
    );
    assert!(served >= 2.0, "{served} watches served from the cache");
    for (_, _, _, _, task) in watchers {
        task.abort();
    }
}
