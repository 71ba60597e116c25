#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! kubectl through the proxy: `get` (tables pass through), `get -o json`
//! and `get --raw` (served from the cache), and `get -w`. Skipped when
//! kubectl is not installed.

use crate::support;

use std::process::Stdio;
use std::time::Duration;

use kube_apiserver_sim::SimConfig;
use serde_json::{Value, json};
use support::kubectl::{Kubectl, kubectl_available};
use support::{Env, Identity};
use tokio::io::{AsyncBufReadExt, BufReader};

async fn reads_from_cache(env: &Env) -> f64 {
    let (_, text) = env.admin_get("/metrics").await;
    text.lines()
        .filter(|l| {
            l.starts_with("kube_cache_proxy_cache_reads_total{") && l.contains("source=\"cache\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_through_the_proxy() {
    if !kubectl_available() {
        kube_testenv::skip::skip("kubectl is not installed");
        return;
    }
    let env = Env::start_with(SimConfig::default(), |c| {
        support::cache_configmaps(c);
    })
    .await;
    env.ready().await;
    let admin = env.sim.issue_client("admin", Some("system:masters"));
    let kubectl = Kubectl::new(&apimachinery::kubeconfig::with_certificate(
        &env.proxy_url,
        &env.proxy_ca_pem,
        "admin",
        &admin.cert_pem,
        &admin.key_pem,
    ));
    let c = env.proxy(Identity::admin().auth(&env.sim));
    for n in ["one", "two"] {
        let r = c
            .post_json("/api/v1/namespaces/k/configmaps", &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n}, "data": {"k": n}}))
            .await;
        assert_eq!(r.status, 201);
    }

    // Tables pass through; the answer is kubectl's usual one.
    let table = kubectl.ok(&["get", "configmaps", "-n", "k"]).await;
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("one") && table.contains("two"), "{table}");

    // -o json and --raw ask for plain JSON: served from the cache.
    let before = reads_from_cache(&env).await;
    let out: Value = serde_json::from_str(
        &kubectl
            .ok(&["get", "configmaps", "-n", "k", "-o", "json"])
            .await,
    )
    .unwrap();
    assert_eq!(out["items"].as_array().unwrap().len(), 2);
    let raw = kubectl
        .ok(&[
            "get",
            "--raw",
            "/api/v1/namespaces/k/configmaps?resourceVersion=0",
        ])
        .await;
    let direct = env
        .direct(Identity::admin().auth(&env.sim))
        .get("/api/v1/namespaces/k/configmaps?resourceVersion=0")
        .await;
    assert_eq!(
        raw.as_bytes(),
        &direct.body[..],
        "byte-identical to the apiserver's"
    );
    assert!(reads_from_cache(&env).await >= before + 2.0);

    // get -w: the new object shows up.
    let mut watch = kubectl.command(&["get", "configmaps", "-n", "k", "-w"]);
    let mut child = watch
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(
            tokio::time::timeout(Duration::from_secs(10), lines.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap(),
        );
    }
    c.post_json(
        "/api/v1/namespaces/k/configmaps",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "three"}}),
    )
    .await;
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(line.starts_with("three"), "{line}");
    child.kill().await.unwrap();

    // A raw watch served from the cache.
    let mut raw = kubectl.command(&[
        "get",
        "--raw",
        "/api/v1/namespaces/k/configmaps?watch=1&resourceVersion=0",
    ]);
    let mut child = raw
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut names = Vec::new();
    while names.len() < 3 {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let e: Value = serde_json::from_str(&line).unwrap();
        if e["type"] == "ADDED" {
            names.push(
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    assert_eq!(names, vec!["one", "three", "two"]);
    child.kill().await.unwrap();
}
