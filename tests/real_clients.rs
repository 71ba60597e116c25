//! The client matrix against a real kube-apiserver v1.36: each client
//! library watches the same objects through the proxy and directly, and
//! must end with the same state, having seen the same changes.
//!
//! - kube-rs's `runtime::watcher` with a `reflector` store, with streaming
//!   lists (`sendInitialEvents`, `watcher::Config::streaming_lists`) and
//!   with list-then-watch (the default);
//! - the Python `kubernetes` client (`tests/python/`, from PyPI): a list,
//!   then `watch.Watch().stream` from its resourceVersion.
//!
//! The writes (creates, updates, deletes) go to the apiserver directly,
//! after every watcher has synced. Skipped where there is no control
//! plane.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

fn cm(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": {"v": v}}))
    .unwrap()
}

/// With `a` already there: creates `b`, updates `a`, creates `c`, deletes
/// `b`, updates `c`, directly; returns the final state, name → RV.
async fn write_sequence(api: &Api<ConfigMap>) -> BTreeMap<String, String> {
    let update = |name: &'static str| async move {
        let mut o = api.get(name).await.unwrap();
        o.data = Some([("v".to_string(), "2".to_string())].into());
        api.replace(name, &PostParams::default(), &o).await.unwrap();
    };
    api.create(&PostParams::default(), &cm("b", "1"))
        .await
        .unwrap();
    update("a").await;
    api.create(&PostParams::default(), &cm("c", "1"))
        .await
        .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    update("c").await;
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
    truth
}

/// Watches of configmaps the proxy has served from its cache.
async fn configmap_watches_from_the_cache(env: &RealEnv) -> f64 {
    let (_, metrics) = env.running.admin_get("/metrics").await;
    metric_sum(
        &metrics,
        "kube_cache_proxy_cache_reads_total",
        &[
            ("resource", "configmaps"),
            ("verb", "WATCH"),
            ("source", "cache"),
        ],
    )
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

    let truth = write_sequence(&api).await;

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
    let served = configmap_watches_from_the_cache(&env).await;
    assert!(served >= 2.0, "{served} watches served from the cache");
    for (_, _, _, _, task) in watchers {
        task.abort();
    }
}

/// A virtualenv with `tests/python/requirements.txt` installed, made once
/// under the test binary's target directory; `None` (the test skips, and
/// says why) where python3, its venv module or PyPI is unavailable.
fn python() -> Option<PathBuf> {
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/requirements.txt");
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-clients");
    let python = venv.join("bin/python");
    let stamp = venv.join("requirements.txt");
    if python.exists() && std::fs::read(&stamp).ok() == std::fs::read(&requirements).ok() {
        return Some(python);
    }
    let _ = std::fs::remove_dir_all(&venv);
    let run = |program: &Path, args: &[&std::ffi::OsStr]| {
        std::process::Command::new(program)
            .args(args)
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .output()
            .map(|o| {
                (
                    o.status.success(),
                    String::from_utf8_lossy(&o.stderr).into_owned(),
                )
            })
    };
    match run(
        Path::new("python3"),
        &["-m".as_ref(), "venv".as_ref(), venv.as_os_str()],
    ) {
        Ok((true, _)) => {}
        other => {
            eprintln!("skipping the Python client: no python3 venv: {other:?}");
            return None;
        }
    }
    match run(
        &python,
        &[
            "-m".as_ref(),
            "pip".as_ref(),
            "install".as_ref(),
            "--disable-pip-version-check".as_ref(),
            "--quiet".as_ref(),
            "-r".as_ref(),
            requirements.as_os_str(),
        ],
    ) {
        Ok((true, _)) => {}
        other => {
            eprintln!("skipping the Python client: pip install failed: {other:?}");
            return None;
        }
    }
    std::fs::copy(&requirements, &stamp).unwrap();
    Some(python)
}

/// What the Python client saw: its events and its final state.
struct PythonRun {
    events: Vec<(String, String, String)>,
    last: BTreeMap<String, String>,
}

/// Starts `tests/python/watch_configmaps.py` on `kubeconfig`, waits until it
/// has listed; the returned task ends with what it saw after `count` events.
async fn python_client(
    python: &Path,
    kubeconfig: &Path,
    ns: &str,
    count: usize,
) -> tokio::task::JoinHandle<PythonRun> {
    use tokio::io::AsyncBufReadExt;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/watch_configmaps.py");
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .arg(kubeconfig)
        .arg(ns)
        .arg(count.to_string())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the Python client lists within 60 s")
        .unwrap()
        .expect("the Python client lists");
    let ready: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert!(ready["ready"].is_string(), "{first}");
    tokio::spawn(async move {
        let _child = child;
        let mut run = PythonRun {
            events: Vec::new(),
            last: BTreeMap::new(),
        };
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await
        {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if let Some(last) = v.get("final") {
                run.last = serde_json::from_value(last.clone()).unwrap();
                break;
            }
            let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            run.events.push((field("type"), field("name"), field("rv")));
        }
        run
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_watch_stream_ends_identical_through_the_proxy_and_directly() {
    let Some(env) = RealEnv::start_with(support::cache_configmaps).await else {
        return;
    };
    let Some(python) = python() else {
        return;
    };
    let ns = env.namespace("clients-python").await;
    let admin = env.cp.admin();
    let direct_kc = env.dir.join("python-direct.kubeconfig");
    std::fs::write(
        &direct_kc,
        env.cp.kubeconfig_text(&env.cp.url(), "admin", admin),
    )
    .unwrap();
    let proxy_kc = env.dir.join("python-proxy.kubeconfig");
    std::fs::write(
        &proxy_kc,
        kube_cache_proxy::kubeconfig::with_certificate(
            &env.proxy_url,
            &env.proxy_ca_pem,
            "admin",
            &admin.cert_pem,
            &admin.key_pem,
        ),
    )
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(
        client(&env.cp.kubeconfig_text(&env.cp.url(), "admin", admin)).await,
        &ns,
    );
    api.create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    let through = python_client(&python, &proxy_kc, &ns, 5).await;
    let direct = python_client(&python, &direct_kc, &ns, 5).await;
    let truth = write_sequence(&api).await;
    let (through, direct) = (through.await.unwrap(), direct.await.unwrap());
    let kinds: Vec<(&str, &str)> = direct
        .events
        .iter()
        .map(|(t, n, _)| (t.as_str(), n.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("ADDED", "b"),
            ("MODIFIED", "a"),
            ("ADDED", "c"),
            ("DELETED", "b"),
            ("MODIFIED", "c")
        ]
    );
    assert_eq!(through.events, direct.events, "the same events, in order");
    assert_eq!(direct.last, truth);
    assert_eq!(through.last, truth);
    println!(
        "Python kubernetes client (Watch().stream): the same 5 events and final state through the proxy and directly"
    );
    let served = configmap_watches_from_the_cache(&env).await;
    assert!(served >= 1.0, "{served} watches served from the cache");
}
