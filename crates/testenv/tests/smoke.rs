//! The harness itself: a control plane starts, answers as admin, and a
//! hollow kubelet registers its node.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use kube_testenv::{ControlPlane, Morph};

#[tokio::test]
async fn control_plane_and_hollow_kubelet() {
    let Some(cp) = ControlPlane::shared().await else {
        return;
    };
    let client = cp.admin_client().await.unwrap();
    let req = http::Request::get("/version").body(Vec::new()).unwrap();
    let version = client.request_text(req).await.unwrap();
    assert!(version.contains("v1.36"), "{version}");

    let node = cp
        .issue_client("system:node:smoke-1", Some("system:nodes"))
        .unwrap();
    let kc = cp
        .write_file(
            "smoke-1.kubeconfig",
            &cp.kubeconfig_text(&cp.url(), "node", &node),
        )
        .unwrap();
    let kubelet = cp.hollow(Morph::Kubelet, "smoke-1", &kc, &[]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let req = http::Request::get("/api/v1/nodes/smoke-1")
            .body(Vec::new())
            .unwrap();
        if let Ok(text) = client.request_text(req).await {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let ready = v["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if ready {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "node not ready; kubelet log:\n{}",
            kubelet.log_tail(4000)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The highly available shape: three apiservers, each on its own member of
/// a three-member etcd cluster (kubeadm's stacked topology). A write
/// through one is read through another; with the etcd leader killed the
/// others elect one and serve; an apiserver whose member is stopped lags
/// behind the others; an apiserver restarted as another minor version
/// serves beside the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_highly_available_control_plane() {
    use kube_testenv::Options;
    let cp = match ControlPlane::start(Options {
        apiservers: 3,
        etcd_members: 3,
        ..Options::default()
    })
    .await
    {
        Ok(cp) => cp,
        Err(kube_testenv::Error::Assets(e @ kube_testenv::AssetsError::Absent { .. })) => {
            kube_testenv::skip::skip(format!("no real control plane: {e}"));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!((cp.apiserver_count(), cp.etcd_member_count()), (3, 3));
    let client = |i: usize| {
        let cp = &cp;
        async move { cp.admin_client_of(i).await.unwrap() }
    };
    let create = |i: usize, name: &'static str| {
        let client = client(i);
        async move {
            let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
            let req = http::Request::post("/api/v1/namespaces/default/configmaps")
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body).unwrap())
                .unwrap();
            let text = client.await.request_text(req).await.unwrap();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            v["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        }
    };
    let get = |i: usize, path: String| {
        let client = client(i);
        async move {
            let req = http::Request::get(path).body(Vec::new()).unwrap();
            client.await.request_text(req).await
        }
    };
    create(0, "ha-a").await;
    assert!(
        get(2, "/api/v1/namespaces/default/configmaps/ha-a".into())
            .await
            .is_ok()
    );

    // The leader killed: the others elect another and serve.
    let leader = cp.etcd_leader().expect("a leader");
    cp.kill_etcd_member(leader);
    let other = (leader + 1) % 3;
    let deadline = Instant::now() + Duration::from_secs(30);
    while cp.etcd_leader().is_none() {
        assert!(Instant::now() < deadline, "no new leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ha-b"}});
        let req = http::Request::post("/api/v1/namespaces/default/configmaps")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap();
        if client(other).await.request_text(req).await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no write after the leader's death"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cp.start_etcd_member(leader).unwrap();
    // Rejoined before another member stops: with two of three down the
    // cluster has no quorum.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cp.etcd_member_joined(leader) || cp.etcd_leader().is_none() {
        assert!(Instant::now() < deadline, "the old leader does not rejoin");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A stopped member: its apiserver's watch cache falls behind the
    // others' (kube-apiserver v1.36.2 still answers `resourceVersion=0`
    // from it, and `/readyz` ok; a read at a newer resourceVersion waits
    // past 20 s), and catches up once the member is back. The member
    // stopped is one that does not lead, so that the write is not also
    // waiting out an election (etcd answers "request timed out, possibly
    // due to previous leader failure" meanwhile).
    let list_rv = |i: usize| {
        let get = &get;
        async move {
            let text = get(
                i,
                "/api/v1/namespaces/default/configmaps?resourceVersion=0".into(),
            )
            .await
            .unwrap();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            v["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        }
    };
    let now_leading = cp.etcd_leader().expect("a leader once all three serve");
    let lagging = (0..3).find(|&i| i != now_leading).unwrap();
    let writer = (lagging + 1) % 3;
    cp.kill_etcd_member(lagging);
    let rv = create(writer, "ha-c").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while list_rv(writer).await < rv {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        list_rv(lagging).await < rv,
        "apiserver {lagging} lags behind"
    );
    assert_eq!(get(lagging, "/readyz".into()).await.unwrap(), "ok");
    cp.start_etcd_member(lagging).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while list_rv(lagging).await < rv {
        assert!(
            Instant::now() < deadline,
            "apiserver {lagging} does not catch up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Another minor version beside the others.
    if kube_testenv::Assets::version("1.35").is_ok() {
        cp.restart_apiserver_of(2, Duration::from_secs(5), Duration::ZERO, Some("1.35"))
            .await
            .unwrap();
        let v = get(2, "/version".into()).await.unwrap();
        assert!(v.contains("v1.35"), "{v}");
        assert_eq!(cp.apiserver_minor_of(2).as_deref(), Some("1.35"));
        assert!(get(0, "/version".into()).await.unwrap().contains("v1.36"));
        assert!(
            get(2, "/api/v1/namespaces/default/configmaps/ha-c".into())
                .await
                .is_ok()
        );
    }
}
