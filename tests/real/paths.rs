//! Against a real kube-apiserver v1.36 (`kube-testenv`): request paths
//! and queries with percent-encodings, empty segments, dot segments and
//! names no object can have, sent byte for byte to the apiserver directly
//! and through the proxy, get the same answer (status, `Content-Type`,
//! `Cache-Control`, body), and the proxy answers from its cache exactly
//! the ones the apiserver's router sends to the resource handlers it
//! decodes them to (`RequestInfo::routable`).
//!
//! Each case records what the apiserver answered when it was written
//! (status), and where the proxy's answer comes from: its cache, the proxy
//! itself (its authorizer's `403`, Go's `400` for a malformed escape), or
//! the apiserver (passed through with the client's raw path).
//!
//! Skipped, with one line, where no control plane is available.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{Value, json};
use support::client::Resp;
use support::differential::assert_same;
use support::raw::{Raw, RawResp};
use support::real::{RealEnv, metric_sum};

fn pod(name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"app": name}},
           "spec": {"nodeName": node, "automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
}

fn resp(r: &RawResp) -> Resp {
    let mut headers = HeaderMap::new();
    for (k, v) in &r.headers {
        headers.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    Resp {
        status: StatusCode::from_u16(r.status).unwrap(),
        headers,
        body: Bytes::from(r.body.clone()),
    }
}

/// Where the proxy's answer comes from (`source` of
/// `kube_cache_proxy_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum From {
    Cache,
    Proxy,
    Upstream,
    /// A consistent list: the cache if it is fresh, else the apiserver.
    Either,
}

async fn sources(env: &RealEnv) -> [f64; 3] {
    let m = env.proxy_metrics().await;
    ["cache", "proxy", "upstream"]
        .map(|s| metric_sum(&m, "kube_cache_proxy_requests_total", &[("source", s)]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_paths_are_answered_as_by_the_apiserver() {
    let Some(env) = RealEnv::start().await else {
        return;
    };
    let ns = env.namespace("anchor-load").await;
    for name in ["load-0001", "load-0002"] {
        env.create(
            &format!("/api/v1/namespaces/{ns}/pods"),
            pod(name, "anchor-node-1"),
        )
        .await;
    }
    for name in ["anchor-node-1", "anchor-node-2"] {
        env.create(
            "/api/v1/nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
        )
        .await;
    }
    let n = "/api/v1/namespaces/anchor-load";
    let w = "watch=1&resourceVersion=0&timeoutSeconds=1";
    // (identity, path as sent, the apiserver's status, source).
    let cases: Vec<(&str, String, u16, From)> = vec![
        // The three: a get, a list and a watch, and a node's own
        // node, each named through an escape.
        (
            "admin",
            format!("{n}/pods/load%2D0001?resourceVersion=0"),
            200,
            From::Cache,
        ),
        (
            "admin",
            "/api/v1/namespaces/%61nchor-load/pods?resourceVersion=0".into(),
            200,
            From::Cache,
        ),
        (
            "admin",
            format!("/api/v1/namespaces/%61nchor-load/pods?{w}"),
            200,
            From::Cache,
        ),
        (
            "node",
            "/api/v1/nodes/anchor%2dnode-1?resourceVersion=0".into(),
            200,
            From::Cache,
        ),
        // Authorized for the decoded name: the Node authorizer refuses
        // another node's, and the proxy says so itself.
        (
            "node",
            "/api/v1/nodes/anchor%2Dnode-2?resourceVersion=0".into(),
            403,
            From::Proxy,
        ),
        (
            "node",
            "/api/v1/nodes/a%22b?resourceVersion=0".into(),
            403,
            From::Proxy,
        ),
        (
            "node",
            format!("/api/v1/nodes?fieldSelector=metadata.name%3Danchor%2Dnode-1&{w}"),
            200,
            From::Cache,
        ),
        // Any segment may be encoded, `/` included.
        (
            "admin",
            "/%61pi/v1/namespaces%2Fanchor-load%2Fpods?resourceVersion=0".into(),
            200,
            From::Cache,
        ),
        (
            "admin",
            format!("{n}/pods?fieldSelector=metadata.name%3Dload%2D0002&resourceVersion=0"),
            200,
            From::Cache,
        ),
        (
            "admin",
            "/api/v1/watch/namespaces/anchor-load/pods/load%2D0001?resourceVersion=0&timeoutSeconds=1"
                .into(),
            200,
            From::Cache,
        ),
        // `%2F` in a name makes a subresource (the pod's status), or a
        // path no route serves.
        (
            "admin",
            format!("{n}/pods/load-0001%2Fstatus?resourceVersion=0"),
            200,
            From::Upstream,
        ),
        (
            "admin",
            format!("{n}/pods/a%2Fb?resourceVersion=0"),
            404,
            From::Upstream,
        ),
        // Names no object can have: the registry's `400`.
        (
            "admin",
            format!("{n}/pods/a%25b?resourceVersion=0"),
            400,
            From::Cache,
        ),
        (
            "admin",
            format!("{n}/pods/%2E?resourceVersion=0"),
            400,
            From::Cache,
        ),
        (
            "admin",
            format!("{n}/pods/..?resourceVersion=0"),
            400,
            From::Cache,
        ),
        (
            "admin",
            "/api/v1/namespaces/%2E%2E?resourceVersion=0".into(),
            400,
            From::Cache,
        ),
        // Not found, with the name quoted as Go's %q quotes it; names
        // outside ASCII are left to the apiserver.
        (
            "admin",
            format!("{n}/pods/a%22b?resourceVersion=0"),
            404,
            From::Cache,
        ),
        (
            "admin",
            format!("{n}/pods/%00?resourceVersion=0"),
            404,
            From::Cache,
        ),
        (
            "admin",
            format!("{n}/pods/%C3%A9?resourceVersion=0"),
            404,
            From::Upstream,
        ),
        (
            "admin",
            format!("{n}/pods/%E2%80%8B?resourceVersion=0"),
            404,
            From::Upstream,
        ),
        (
            "admin",
            format!("{n}/pods/%FF?resourceVersion=0"),
            404,
            From::Upstream,
        ),
        (
            "admin",
            format!("{n}/pods/load+0001?resourceVersion=0"),
            404,
            From::Cache,
        ),
        // Trailing slashes are trimmed by the resolver and the router.
        (
            "admin",
            format!("{n}/pods/?resourceVersion=0"),
            200,
            From::Cache,
        ),
        (
            "admin",
            format!("{n}/pods/load-0001/?resourceVersion=0"),
            200,
            From::Cache,
        ),
        // Empty segments and a leading `//`: the router serves no such
        // path (or, `namespaces//pods`, lists every namespace).
        (
            "admin",
            "//api/v1/namespaces/anchor-load/pods?resourceVersion=0".into(),
            404,
            From::Upstream,
        ),
        (
            "admin",
            format!("{n}//pods?resourceVersion=0"),
            404,
            From::Upstream,
        ),
        (
            "admin",
            "/api/v1//namespaces/anchor-load/pods?resourceVersion=0".into(),
            404,
            From::Upstream,
        ),
        (
            "admin",
            "/api/v1/namespaces//pods?resourceVersion=0".into(),
            200,
            From::Upstream,
        ),
        // A namespace `.`: the storage refuses its key.
        (
            "admin",
            "/api/v1/namespaces/./pods?resourceVersion=0".into(),
            500,
            From::Upstream,
        ),
        (
            "admin",
            format!("/api/v1/namespaces/%2E%2E/pods?{w}"),
            500,
            From::Upstream,
        ),
        // A malformed escape: Go's HTTP server refuses the request line.
        (
            "admin",
            format!("{n}/pods/load%zz?resourceVersion=0"),
            400,
            From::Proxy,
        ),
        ("admin", format!("{n}/pods/load%2"), 400, From::Proxy),
        // Queries as Go's `URL.Query()` reads them: a pair with a `;` or a
        // malformed escape is dropped.
        (
            "admin",
            format!("{n}/pods?resourceVersion=0&labelSelector=%zz"),
            200,
            From::Cache,
        ),
        (
            "admin",
            format!("{n}/pods?resourceVersion=0;x"),
            200,
            From::Either,
        ),
        (
            "admin",
            format!("{n}/pods?resourceVersion=%30&limit=1"),
            200,
            From::Cache,
        ),
    ];
    let admin = env.admin();
    let node = env.node("anchor-node-1");
    for (who, path, status, from) in cases {
        let auth = if who == "node" {
            node.clone()
        } else {
            admin.clone()
        };
        let direct = Raw::new(&env.cp.url(), &env.cp.ca_pem(), auth.clone());
        let proxy = Raw::new(&env.proxy_url, &env.proxy_ca_pem, auth);
        let d = direct.get(&path, &[]).await;
        let before = sources(&env).await;
        let p = proxy.get(&path, &[]).await;
        let after = sources(&env).await;
        // Pinned for v1.36; others answer some paths otherwise (1.34: 200
        // for a namespace `.`), and the proxy answers as each does.
        if env.cp.minor() == 36 {
            assert_eq!(
                d.status,
                status,
                "{path}: the apiserver's answer changed: {}",
                d.text()
            );
        }
        assert_same(&resp(&d), &resp(&p), &path);
        let delta: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        let want = match from {
            From::Cache => Some([1.0, 0.0, 0.0]),
            From::Proxy => Some([0.0, 1.0, 0.0]),
            From::Upstream => Some([0.0, 0.0, 1.0]),
            From::Either => None,
        };
        if let Some(want) = want {
            assert_eq!(delta, want, "{path}: answered by (cache, proxy, upstream)");
        }
        // Go's refusal of a request line closes the connection.
        if d.version == "HTTP/1.1"
            && status == 400
            && d.header("content-type") == Some("text/plain; charset=utf-8")
        {
            assert_eq!(p.text(), "400 Bad Request");
            assert_eq!(p.header("connection"), Some("close"), "{path}");
        }
    }
}
