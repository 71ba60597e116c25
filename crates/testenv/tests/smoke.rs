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
