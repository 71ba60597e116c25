#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Request paths through the real proxy over TLS, in front of the
//! simulated apiserver: percent-encoded paths are decoded as the
//! apiserver's request-info resolver decodes them before the cache looks
//! anything up or anyone is authorized, what passes through keeps the
//! client's raw path, and a malformed escape gets Go's `400` without
//! reaching the apiserver. (`tests/real/paths.rs` compares each case with
//! a real kube-apiserver.)

use crate::support;

use apimachinery::resource::Gvr;
use kube_apiserver_sim::SimConfig;
use serde_json::json;
use support::raw::Raw;
use support::{Env, Identity};

async fn env() -> Env {
    let env = Env::start_with(SimConfig::default(), support::cache_configmaps).await;
    env.ready().await;
    env
}

fn nodes() -> Gvr {
    Gvr {
        group: String::new(),
        version: "v1".into(),
        resource: "nodes".into(),
    }
}

#[tokio::test]
async fn encoded_paths_are_read_from_the_cache_and_authorized_as_decoded() {
    let env = env().await;
    let cms = support::configmaps();
    env.sim
        .create(
            &cms,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-1", "namespace": "ns"}}),
        )
        .unwrap();
    for name in ["node-1", "node-2"] {
        env.sim
            .create(
                &nodes(),
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
            )
            .unwrap();
    }
    let admin = Raw::new(&env.proxy_url, &env.proxy_ca_pem, env.admin());
    let before = env.sim.stats();
    let r = admin
        .get(
            "/api/v1/namespaces/ns/configmaps/cm%2D1?resourceVersion=0",
            &[],
        )
        .await;
    assert_eq!(
        (r.status, r.json()["metadata"]["name"].as_str()),
        (200, Some("cm-1"))
    );
    let r = admin
        .get("/api/v1/namespaces/%6Es/configmaps?resourceVersion=0", &[])
        .await;
    assert_eq!(r.json()["items"][0]["metadata"]["name"], "cm-1");
    let r = admin
        .get(
            "/%61pi/v1/namespaces%2Fns%2Fconfigmaps?watch=1&resourceVersion=0&timeoutSeconds=1",
            &[],
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains(r#""name":"cm-1""#), "{}", r.text());
    // A name no object can have.
    let r = admin
        .get(
            "/api/v1/namespaces/ns/configmaps/a%25b?resourceVersion=0",
            &[],
        )
        .await;
    assert_eq!(
        (r.status, r.json()["message"].as_str()),
        (
            400,
            Some(r#"Name parameter invalid: "a%b": may not contain '%'"#)
        )
    );
    // The Node authorizer is asked about the decoded name.
    let node = Raw::new(
        &env.proxy_url,
        &env.proxy_ca_pem,
        Identity::node("node-1").auth(&env.sim),
    );
    let r = node
        .get("/api/v1/nodes/node%2d1?resourceVersion=0", &[])
        .await;
    assert_eq!(
        (r.status, r.json()["metadata"]["name"].as_str()),
        (200, Some("node-1"))
    );
    let r = node
        .get("/api/v1/nodes/node%2D2?resourceVersion=0", &[])
        .await;
    assert_eq!(r.status, 403);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .starts_with(r#"nodes "node-2" is forbidden"#),
        "{}",
        r.text()
    );
    let after = env.sim.stats();
    for resource in ["configmaps", "nodes"] {
        assert_eq!(
            (
                after.count("get", resource),
                after.lists(resource),
                after.watches(resource)
            ),
            (
                before.count("get", resource),
                before.lists(resource),
                before.watches(resource)
            ),
            "{resource}: all answered from the cache"
        );
    }
}

#[tokio::test]
async fn what_passes_through_keeps_its_raw_path() {
    let env = env().await;
    let admin = Raw::new(&env.proxy_url, &env.proxy_ca_pem, env.admin());
    // A consistent get passes through.
    let raw_path = "/api/v1/namespaces/ns/configmaps/cm%2D9";
    let r = admin.get(raw_path, &[]).await;
    assert_eq!(r.status, 404, "{}", r.text());
    let sent: Vec<String> = env
        .sim
        .requests()
        .into_iter()
        .filter(|r| r.verb == "get" && r.resource == "configmaps")
        .map(|r| r.path)
        .collect();
    assert_eq!(sent, [raw_path]);
}

#[tokio::test]
async fn a_malformed_escape_is_refused_as_gos_http_server_does() {
    let env = env().await;
    let before = env.sim.requests().len();
    let admin = Raw::new(&env.proxy_url, &env.proxy_ca_pem, env.admin());
    for path in [
        "/api/v1/namespaces/ns/configmaps/cm%zz?resourceVersion=0",
        "/api/v1/namespaces/ns/configmaps/cm%2",
        "/api/v1/namespaces/ns/configmaps%",
    ] {
        let r = admin.get(path, &[]).await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (400, "400 Bad Request"),
            "{path}"
        );
        assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
        assert_eq!(r.header("connection"), Some("close"));
    }
    // Over HTTP/2 too (where the connection stays).
    let h2 = env.proxy_h2(env.admin());
    let r = h2.get("/api/v1/namespaces/ns/configmaps/cm%zz").await;
    assert_eq!(
        (r.status.as_u16(), r.text().as_str()),
        (400, "400 Bad Request")
    );
    assert_eq!(h2.get("/version").await.status, 200);
    let sent: Vec<String> = env.sim.requests()[before..]
        .iter()
        .map(|r| r.path.clone())
        .filter(|p| p.contains('%'))
        .collect();
    assert!(sent.is_empty(), "reached the apiserver: {sent:?}");
}
