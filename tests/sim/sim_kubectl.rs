#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! kubectl against the simulated apiserver: discovery, `get` (tables),
//! `get -o json`, `get -w`, `auth whoami`/`can-i`, create and delete.
//! Skipped when `kubectl` is not installed.

use std::process::Stdio;

use crate::support;
use std::time::Duration;
use support::kubectl::{Kubectl, kubectl_available};

use apimachinery::resource::Gvr;
use kube_apiserver_sim::{Sim, SimConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_against_the_sim() {
    if !kubectl_available() {
        kube_testenv::skip::skip("kubectl is not installed");
        return;
    }
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let cms = Gvr {
        group: "".into(),
        version: "v1".into(),
        resource: "configmaps".into(),
    };
    let namespaces = Gvr {
        group: "".into(),
        version: "v1".into(),
        resource: "namespaces".into(),
    };
    sim.create(&namespaces, json!({"metadata": {"name": "ns"}}))
        .unwrap();
    sim.create(
        &cms,
        json!({"metadata": {"name": "cm-a", "namespace": "ns"}, "data": {"k": "v", "j": "w"}}),
    )
    .unwrap();
    let admin = Kubectl::new(&sim.kubeconfig("admin", Some("system:masters")));

    let table = admin.ok(&["get", "cm", "-n", "ns"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "DATA", "AGE"]);
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..2], ["cm-a", "2"]);

    let json_out: Value = serde_json::from_str(
        &admin
            .ok(&["get", "configmaps", "-n", "ns", "-o", "json"])
            .await,
    )
    .unwrap();
    assert_eq!(json_out["items"][0]["data"]["k"], "v");
    assert_eq!(
        admin
            .ok(&["get", "cm", "cm-a", "-n", "ns", "-o", "jsonpath={.data.j}"])
            .await,
        "w"
    );
    let (ok, _, err) = admin.run(&["get", "cm", "nope", "-n", "ns"]).await;
    assert!(
        !ok && err.contains("configmaps \"nope\" not found"),
        "{err}"
    );

    // get -w prints the current rows, then changes.
    let mut watch = admin.command(&["get", "cm", "-n", "ns", "-w", "--no-headers"]);
    let mut child = watch
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), out.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.starts_with("cm-a"), "{first}");
    sim.create(
        &cms,
        json!({"metadata": {"name": "cm-b", "namespace": "ns"}, "data": {}}),
    )
    .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(20), out.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(second.starts_with("cm-b"), "{second}");
    child.kill().await.unwrap();

    // `kubectl create configmap` sends protobuf, which the sim does not
    // decode (it answers 415); manifests go as JSON.
    let manifest = admin.kubeconfig.with_file_name("cm.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: made-by-kubectl\ndata:\n  a: b\n",
    )
    .unwrap();
    admin
        .ok(&["create", "-n", "ns", "-f", manifest.to_str().unwrap()])
        .await;
    assert_eq!(
        sim.get(&cms, "ns", "made-by-kubectl").unwrap()["data"]["a"],
        "b"
    );
    admin
        .ok(&["label", "configmap", "made-by-kubectl", "-n", "ns", "x=y"])
        .await;
    assert_eq!(
        sim.get(&cms, "ns", "made-by-kubectl").unwrap()["metadata"]["labels"]["x"],
        "y"
    );
    admin
        .ok(&["delete", "configmap", "made-by-kubectl", "-n", "ns"])
        .await;
    assert!(sim.get(&cms, "ns", "made-by-kubectl").is_none());

    let whoami = admin.ok(&["auth", "whoami", "-o", "json"]).await;
    let whoami: Value = serde_json::from_str(&whoami).unwrap();
    assert_eq!(whoami["status"]["userInfo"]["username"], "admin");

    let node = Kubectl::new(&sim.kubeconfig("system:node:n1", Some("system:nodes")));
    assert_eq!(
        node.ok(&["auth", "can-i", "get", "nodes/n1"]).await.trim(),
        "yes"
    );
    let (_, out, _) = node.run(&["auth", "can-i", "list", "secrets", "-A"]).await;
    assert_eq!(
        out.trim(),
        "no - can only read namespaced object of this type"
    );
    let (ok, _, err) = node.run(&["get", "pods", "-A"]).await;
    assert!(
        !ok && err.contains("can only list/watch pods with spec.nodeName field selector"),
        "{err}"
    );
}
