//! etcd restored from a backup, with every apiserver restarted, against a
//! real kube-apiserver: the documented way (`etcdutl snapshot restore
//! --bump-revision --mark-compacted`, emulated: resourceVersions jump
//! forward, and watches from before get `410`) and the older way (no
//! bump: resourceVersions go back in time, and the apiserver accepts a
//! watch from a resourceVersion its restored etcd has not reached, and
//! waits). In both, once the apiserver serves the restored world, the
//! proxy does too, and never again an object version from before the
//! restore: it finds out, lists, and watches from the old history get
//! `410 Gone` (a client relists), where the apiserver, without the bump,
//! would let them wait for the new history to reach them.
//!
//! Each case has a control plane of its own. Skipped, with one line,
//! where no control plane is available.

use crate::support;

use std::time::{Duration, Instant};

use kube_testenv::Options;
use serde_json::{Value, json};
use support::cache_configmaps;
use support::client::Next;
use support::real::{Isolated, RealEnv, eventually};

fn names(list: &Value) -> Vec<String> {
    let mut n: Vec<String> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    n.sort();
    n
}

async fn restore(bump: bool) {
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let cp = plane.cp();
    let env = RealEnv::start_on(cp, cache_configmaps).await;
    let ns = env.namespace("restore").await;
    let cms = format!("/api/v1/namespaces/{ns}/configmaps");
    let cm =
        |name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
    env.create(&cms, cm("before")).await;
    let (backup, backup_rv) = cp.etcd_backup().unwrap();
    for i in 0..20 {
        env.create(&cms, cm(&format!("after-{i:02}"))).await;
    }
    let proxy = env.proxy(env.admin());
    let apiserver = env.apiserver();
    let cached = format!("{cms}?resourceVersion=0");
    let listed = eventually(Duration::from_secs(20), "21 configmaps cached", || {
        let (proxy, cached) = (&proxy, &cached);
        async move {
            let l = proxy.get(cached).await.json();
            (names(&l).len() == 21).then_some(l)
        }
    })
    .await;
    let last_rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    // An informer's watch through the proxy, from its list.
    let mut watch = proxy
        .watch(&format!("{cms}?watch=1&resourceVersion={last_rv}"), &[])
        .await;
    assert_eq!(watch.status, 200);

    let started = Instant::now();
    let (before, after) = cp.etcd_restore(&backup, bump).await.unwrap();
    println!(
        "etcd restored{}: revision {before} -> {after} (backup at {backup_rv}), apiserver ready after {:?}",
        if bump {
            " with the revision bumped and compacted"
        } else {
            ""
        },
        started.elapsed()
    );
    if bump {
        assert!(after > before);
    } else {
        assert!(after < before);
    }
    // The apiserver serves the restored world.
    let restored = names(&apiserver.get(&cms).await.json());
    assert_eq!(restored, ["before"]);
    // The informer's watch through the proxy ends (its client relists),
    // or brings it to the restored world with events (a relist the proxy
    // delivers to its watchers, docs/design.md): it does not go on
    // waiting in the old world.
    let mut state: std::collections::BTreeSet<String> = names(&listed).into_iter().collect();
    loop {
        match watch.next(Duration::from_secs(30)).await {
            Next::Event(e) => {
                let name = e["object"]["metadata"]["name"].as_str().unwrap_or_default();
                match e["type"].as_str().unwrap_or_default() {
                    "ADDED" | "MODIFIED" => {
                        state.insert(name.to_string());
                    }
                    "DELETED" => {
                        state.remove(name);
                    }
                    _ => {}
                }
                if state.iter().eq(["before"].iter()) {
                    break;
                }
            }
            Next::End | Next::Error(_) => break,
            Next::Timeout => panic!("the watch from before the restore waits in the old world"),
        }
    }
    // The proxy serves the restored world too, from its cache.
    eventually(Duration::from_secs(60), "the proxy's list restored", || {
        let (proxy, cached) = (&proxy, &cached);
        async move { (names(&proxy.get(cached).await.json()) == ["before"]).then_some(()) }
    })
    .await;
    println!(
        "the proxy served the restored world {:?} after the restore began",
        started.elapsed()
    );
    // And never the old one again: consistent and cached reads agree with
    // the apiserver, a get of an object the restore removed is a 404.
    for _ in 0..10 {
        assert_eq!(names(&proxy.get(&cached).await.json()), ["before"]);
        assert_eq!(names(&proxy.get(&cms).await.json()), ["before"]);
        let gone = proxy
            .get(&format!("{cms}/after-00?resourceVersion=0"))
            .await;
        assert_eq!(gone.status, 404, "{}", gone.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A watch from the informer's last resourceVersion: 410 Gone (with the
    // bump, as from the apiserver; without, where the apiserver would
    // accept it and wait), and the informer relists.
    let mut resumed = proxy
        .watch(&format!("{cms}?watch=1&resourceVersion={last_rv}"), &[])
        .await;
    let expired = if resumed.status == 410 {
        true
    } else {
        match resumed.next(Duration::from_secs(10)).await {
            Next::Event(e) => e["type"] == "ERROR" && e["object"]["code"] == 410,
            _ => false,
        }
    };
    assert!(expired, "a watch from before the restore gets 410 Gone");
    if bump {
        let direct = apiserver
            .watch(&format!("{cms}?watch=1&resourceVersion={last_rv}"), &[])
            .await;
        let mut direct = direct;
        let e = direct.event(Duration::from_secs(10)).await;
        assert_eq!(e["object"]["code"], 410, "the apiserver's own answer: {e}");
    }
    // Writes after the restore reach the proxy.
    env.create(&cms, cm("post-restore")).await;
    eventually(Duration::from_secs(10), "a write after the restore", || {
        let (proxy, cached) = (&proxy, &cached);
        async move {
            (names(&proxy.get(cached).await.json()) == ["before", "post-restore"]).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restored_with_the_revision_bumped() {
    restore(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restored_without_the_revision_bumped() {
    restore(false).await;
}
