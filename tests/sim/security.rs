#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The cache never shows anyone what the apiserver would not: every
//! identity gets, from the cache, exactly the answer upstream gives it.
//! The simulated apiserver enforces a policy mirroring the Node authorizer
//! and RBAC.

use crate::support;

use std::time::{Duration, Instant};

use apimachinery::resource::Gvr;
use http::{Method, StatusCode};
use kube_apiserver_sim::{AuthMethod, Rule, Subject, UserInfo};
use serde_json::{Value, json};
use support::{Auth, Client, Env, Identity, Next, QUIET, SOON};

fn gvr(resource: &str) -> Gvr {
    Gvr {
        group: String::new(),
        version: "v1".into(),
        resource: resource.into(),
    }
}

/// A proxy caching configmaps too, with short decision caches, and some
/// objects: pods on node-1 and node-2, a configmap.
async fn env() -> Env {
    let env = Env::start_with(Default::default(), |c| {
        support::cache_configmaps(c);
        c.authentication.token_review.cache_ttl_seconds = 1;
        c.authentication.token_review.failure_cache_ttl_seconds = 1;
        c.authorization
            .subject_access_review
            .allowed_cache_ttl_seconds = 1;
        c.authorization
            .subject_access_review
            .denied_cache_ttl_seconds = 1;
        c.cache.consistent_list_wait_milliseconds = 3000;
    })
    .await;
    for (name, node) in [("p1", "node-1"), ("p2", "node-2")] {
        env.sim
            .create(&gvr("pods"), json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}))
            .unwrap();
    }
    env.sim
        .create(&gvr("configmaps"), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "ns"}, "data": {"k": "v"}}))
        .unwrap();
    env.sim
        .create(
            &gvr("nodes"),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}}),
        )
        .unwrap();
    env.ready().await;
    env
}

/// The same request through the proxy and directly: same status, reason
/// and message.
async fn same_answer(env: &Env, identity: &Identity, path: &str) -> Value {
    let via = env.proxy(identity.auth(&env.sim)).get(path).await;
    let direct = Client::sim(&env.sim, identity.clone()).get(path).await;
    assert_eq!(via.status, direct.status, "{path}: {}", via.text());
    if via.status != StatusCode::OK {
        let (v, d) = (via.json(), direct.json());
        assert_eq!(v["reason"], d["reason"], "{path}");
        assert_eq!(v["message"], d["message"], "{path}");
        assert_eq!(v["details"], d["details"], "{path}");
    }
    via.json()
}

#[tokio::test]
async fn every_identity_gets_what_upstream_gives_it() {
    let env = env().await;
    let node1 = Identity::node("node-1");
    let bob = Identity::user("bob");
    let cases: &[(&Identity, &str, u16)] = &[
        (&Identity::Anonymous, "/api/v1/pods", 403),
        (
            &Identity::Anonymous,
            "/api/v1/namespaces/ns/configmaps/cm",
            403,
        ),
        (&bob, "/api/v1/namespaces/ns/configmaps", 403),
        (&bob, "/api/v1/namespaces/ns/configmaps/cm", 403),
        (&bob, "/api/v1/nodes/node-1", 403),
        (
            &node1,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
            200,
        ),
        (
            &node1,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-2",
            403,
        ),
        (&node1, "/api/v1/pods", 403),
        (&node1, "/api/v1/namespaces/ns/pods/p1", 200),
        (&node1, "/api/v1/namespaces/ns/pods/p2", 403),
        (&node1, "/api/v1/namespaces/ns/configmaps/cm", 403),
        (&node1, "/api/v1/nodes/node-1", 200),
        (&node1, "/api/v1/nodes/node-2", 403),
        (&node1, "/api/v1/secrets", 403),
    ];
    for (identity, path, status) in cases {
        let v = same_answer(&env, identity, path).await;
        if *status == 200 {
            assert!(v["kind"] != "Status", "{path}: {v}");
        } else {
            assert_eq!(v["code"], *status, "{path}: {v}");
        }
    }
    // The node sees its own pods only.
    let v = same_answer(
        &env,
        &node1,
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
    )
    .await;
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    assert_eq!(v["items"][0]["metadata"]["name"], "p1");
}

#[tokio::test]
async fn watches_are_authorized_when_they_start() {
    let env = env().await;
    let node1 = env.proxy(Identity::node("node-1").auth(&env.sim));
    let mut own = node1
        .watch(
            "/api/v1/pods?watch=1&resourceVersion=0&fieldSelector=spec.nodeName%3Dnode-1",
            &[],
        )
        .await;
    assert_eq!(own.status, 200);
    assert_eq!(own.event(SOON).await["object"]["metadata"]["name"], "p1");
    for path in [
        "/api/v1/pods?watch=1&resourceVersion=0&fieldSelector=spec.nodeName%3Dnode-2",
        "/api/v1/pods?watch=1&resourceVersion=0",
    ] {
        let mut w = node1.watch(path, &[]).await;
        assert_eq!(w.status, 403, "{path}");
        let body = w.event(SOON).await;
        assert_eq!(
            body["message"],
            "pods is forbidden: User \"system:node:node-1\" cannot watch resource \"pods\" in API group \"\" at the cluster scope: can only list/watch pods with spec.nodeName field selector"
        );
    }
    let anon = env.proxy(Auth::Anonymous);
    let w = anon
        .watch("/api/v1/namespaces/ns/configmaps?watch=1", &[])
        .await;
    assert_eq!(w.status, 403);
}

#[tokio::test]
async fn bad_credentials_are_unauthorized_everywhere() {
    let env = env().await;
    let bad = env.proxy(Auth::Token("not-a-token".into()));
    for path in [
        "/api/v1/namespaces/ns/configmaps",
        "/api/v1/namespaces/ns/configmaps/cm",
        "/api/v1/namespaces/ns/configmaps?watch=1",
        "/api/v1/namespaces/ns/secrets",
        "/apis",
    ] {
        let r = bad.get(path).await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(
            r.text(),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"Unauthorized\",\"reason\":\"Unauthorized\",\"code\":401}\n"
        );
    }
    // A certificate from another CA fails authentication: 401, like the
    // apiserver, on cached and pass-through requests alike.
    let stranger_ca = apimachinery::pki::Ca::new("stranger").unwrap();
    let stranger = env.proxy(Auth::Cert(
        stranger_ca
            .issue_client("admin", Some("system:masters"))
            .unwrap(),
    ));
    for path in [
        "/api/v1/namespaces/ns/configmaps",
        "/api/v1/namespaces/ns/secrets",
    ] {
        assert_eq!(stranger.get(path).await.status, 401, "{path}");
    }
    let direct = Client::new(
        &env.sim.url(),
        &env.sim.ca_pem(),
        Auth::Cert(
            stranger_ca
                .issue_client("admin", Some("system:masters"))
                .unwrap(),
        ),
        false,
    );
    assert_eq!(
        direct.get("/api/v1/namespaces/ns/configmaps").await.status,
        401,
        "the sim agrees"
    );
}

#[tokio::test]
async fn anonymous_can_be_turned_off() {
    let env = Env::start_with(Default::default(), |c| {
        c.authentication.anonymous.enabled = false
    })
    .await;
    let anon = env.proxy(Auth::Anonymous);
    for path in ["/api/v1/pods", "/api/v1/namespaces/ns/secrets", "/version"] {
        assert_eq!(anon.get(path).await.status, 401, "{path}");
    }
}

#[tokio::test]
async fn revoked_permissions_and_tokens_stop_working_within_their_ttl() {
    let env = env().await;
    env.sim
        .add_token("carol-token", UserInfo::new("carol", &[]));
    let grant = env.sim.policy().grant(
        Subject::User("carol".into()),
        Rule::new(&["get", "list", "watch"], &[""], &["configmaps"]).in_namespaces(&["ns"]),
    );
    let carol = env.proxy(Auth::Token("carol-token".into()));
    let path = "/api/v1/namespaces/ns/configmaps?resourceVersion=0";
    assert_eq!(carol.get(path).await.status, 200);
    env.sim.policy().revoke(grant);
    // Still allowed from the decision cache for at most its TTL (1 s here).
    let revoked = Instant::now();
    loop {
        let status = carol.get(path).await.status;
        if status == 403 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            revoked.elapsed() < Duration::from_secs(3),
            "permission outlived its TTL"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.sim.policy().grant(
        Subject::User("carol".into()),
        Rule::new(&["get", "list", "watch"], &[""], &["configmaps"]),
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(carol.get(path).await.status, 200);
    env.sim.revoke_token("carol-token");
    let revoked = Instant::now();
    loop {
        let status = carol.get(path).await.status;
        if status == 401 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            revoked.elapsed() < Duration::from_secs(3),
            "token outlived its TTL"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With the shipped settings a denial is not reused: a permission granted
/// after a denied read applies to the very next one, as at the apiserver
/// (the Node authorizer's graph allows a kubelet a new pod's Secrets a
/// moment after the pod is bound, and the kubelet asks again a second
/// later).
#[tokio::test]
async fn a_denial_is_decided_again_at_the_next_request() {
    let env = Env::start_with(Default::default(), support::cache_configmaps).await;
    env.sim
        .create(&gvr("configmaps"), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "ns"}}))
        .unwrap();
    env.ready().await;
    env.sim.add_token("erin-token", UserInfo::new("erin", &[]));
    let erin = env.proxy(Auth::Token("erin-token".into()));
    let path = "/api/v1/namespaces/ns/configmaps?resourceVersion=0";
    let before = env.sim.stats();
    assert_eq!(erin.get(path).await.status, 403);
    assert_eq!(erin.get(path).await.status, 403);
    env.sim.policy().grant(
        Subject::User("erin".into()),
        Rule::new(&["list"], &[""], &["configmaps"]).in_namespaces(&["ns"]),
    );
    let r = erin.get(path).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let after = env.sim.stats();
    assert_eq!(
        after.count("create", "subjectaccessreviews")
            - before.count("create", "subjectaccessreviews"),
        3,
        "each read reviewed"
    );
    assert_eq!(
        after.lists("configmaps"),
        before.lists("configmaps"),
        "served from the cache"
    );
}

#[tokio::test]
async fn decisions_are_cached_and_concurrent_misses_coalesce() {
    let env = env().await;
    env.sim
        .add_token("dave-token", UserInfo::new("dave", &["system:masters"]));
    let before = env.sim.stats();
    let dave = env.proxy(Auth::Token("dave-token".into()));
    let reads = (0..20).map(|_| dave.get("/api/v1/namespaces/ns/configmaps?resourceVersion=0"));
    for r in futures_util::future::join_all(reads).await {
        assert_eq!(r.status, 200);
    }
    let after = env.sim.stats();
    let reviews = |s: &kube_apiserver_sim::Stats, r: &str| s.count("create", r);
    assert_eq!(
        reviews(&after, "tokenreviews") - reviews(&before, "tokenreviews"),
        1
    );
    assert_eq!(
        reviews(&after, "subjectaccessreviews") - reviews(&before, "subjectaccessreviews"),
        1
    );
    assert_eq!(
        after.lists("configmaps"),
        before.lists("configmaps"),
        "served from the cache"
    );
}

#[tokio::test]
async fn kubelet_writes_arrive_impersonated_as_the_node() {
    let env = env().await;
    let node1 = env.proxy(Identity::node("node-1").auth(&env.sim));
    let r = node1
        .send(
            Method::PATCH,
            "/api/v1/nodes/node-1/status",
            &[("content-type", "application/merge-patch+json")],
            Some(br#"{"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#.to_vec()),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let rec = env
        .sim
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.method == "PATCH")
        .unwrap();
    assert_eq!(rec.user, "system:node:node-1");
    assert!(rec.groups.contains(&"system:nodes".to_string()), "{rec:?}");
    assert!(
        rec.groups.contains(&"system:authenticated".to_string()),
        "{rec:?}"
    );
    assert!(rec.impersonated);
    assert_eq!(rec.auth_method, AuthMethod::X509);
    assert_eq!(
        rec.authenticated_user,
        "system:serviceaccount:kube-system:kube-cache-proxy"
    );
    // Another node's status is refused by upstream's Node authorizer, as
    // the node itself.
    let r = node1
        .send(
            Method::PATCH,
            "/api/v1/nodes/node-2/status",
            &[("content-type", "application/merge-patch+json")],
            Some(b"{}".to_vec()),
        )
        .await;
    assert_eq!(r.status, 403);
}

#[tokio::test]
async fn client_impersonation_is_authorized_like_the_apiserver() {
    let env = env().await;
    let admin = env.proxy(Identity::admin().auth(&env.sim));
    let as_node = [
        ("impersonate-user", "system:node:node-1"),
        ("impersonate-group", "system:nodes"),
    ];
    // Cached read as the impersonated node: authorized as the node.
    let r = admin
        .send(
            Method::GET,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
            &as_node,
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = admin
        .send(Method::GET, "/api/v1/pods", &as_node, None)
        .await;
    assert_eq!(r.status, 403);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("pods is forbidden: User \"system:node:node-1\"")
    );
    // Pass-through as the impersonated node arrives as the node, on the
    // proxy's credentials.
    let r = admin
        .send(Method::GET, "/api/v1/namespaces/ns/secrets", &as_node, None)
        .await;
    assert_eq!(r.status, 403);
    let rec = env
        .sim
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path.ends_with("/secrets"))
        .unwrap();
    assert_eq!(rec.user, "system:node:node-1");
    // A user who may not impersonate gets the apiserver's 403, from the
    // cache path and the pass-through path alike.
    let bob = env.proxy(Identity::user("bob").auth(&env.sim));
    for path in [
        "/api/v1/namespaces/ns/configmaps",
        "/api/v1/namespaces/ns/secrets",
    ] {
        let via = bob
            .send(Method::GET, path, &[("impersonate-user", "admin")], None)
            .await;
        let direct = Client::sim(&env.sim, Identity::user("bob"))
            .send(Method::GET, path, &[("impersonate-user", "admin")], None)
            .await;
        assert_eq!(via.status, 403, "{path}");
        assert_eq!(via.json()["message"], direct.json()["message"], "{path}");
        let resource = path.rsplit('/').next().unwrap();
        assert_eq!(
            via.json()["message"],
            format!(
                "{resource} is forbidden: User \"bob\" cannot impersonate-on:user-info:list resource \"{resource}\" in API group \"\" in the namespace \"ns\""
            )
        );
    }
    // Groups without a user are a bad request.
    let r = bob
        .send(
            Method::GET,
            "/api/v1/namespaces/ns/configmaps",
            &[("impersonate-group", "g")],
            None,
        )
        .await;
    assert_eq!(r.status, 400);
    // A bearer client's impersonation passes through untouched and is
    // judged by upstream.
    env.sim.add_token("erin-token", UserInfo::new("erin", &[]));
    let erin = env.proxy(Auth::Token("erin-token".into()));
    let r = erin
        .send(
            Method::GET,
            "/api/v1/namespaces/ns/secrets",
            &[("impersonate-user", "admin")],
            None,
        )
        .await;
    assert_eq!(r.status, 403);
}

#[tokio::test]
async fn tls_below_1_2_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = env().await;
    let addr = env.proxy_url.trim_start_matches("https://").to_string();
    // A TLS 1.1 ClientHello: record version 3.2, client version 3.2, two
    // TLS 1.0/1.1 cipher suites, no extensions.
    let mut hello = vec![0x03, 0x02];
    hello.extend_from_slice(&[0u8; 32]);
    hello.push(0);
    hello.extend_from_slice(&[0x00, 0x04, 0x00, 0x2f, 0x00, 0x35]);
    hello.extend_from_slice(&[0x01, 0x00]);
    let mut handshake = vec![0x01, 0x00, 0x00, hello.len() as u8];
    handshake.extend_from_slice(&hello);
    let mut record = vec![0x16, 0x03, 0x02, 0x00, handshake.len() as u8];
    record.extend_from_slice(&handshake);
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(&record).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(SOON, tcp.read_to_end(&mut answer)).await;
    // No ServerHello (a handshake record, 0x16): an alert (0x15) or nothing.
    assert!(
        answer.first() != Some(&0x16),
        "TLS 1.1 was answered with a handshake: {answer:?}"
    );
    // And a TLS 1.3-only proxy refuses a TLS 1.2 client.
    let env13 = Env::start_with(Default::default(), |c| {
        c.tls.min_version = kube_cache_proxy::component::config::TlsVersion::VersionTLS13
    })
    .await;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::pem::PemObject::pem_slice_iter(env13.proxy_ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(env13.proxy_url.trim_start_matches("https://"))
        .await
        .unwrap();
    let result = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await;
    assert!(
        result.is_err(),
        "a TLS 1.2 client connected to a TLS 1.3-only proxy"
    );
}

#[tokio::test]
async fn watch_allowed_then_permission_revoked_keeps_running_like_the_apiserver() {
    // The apiserver authorizes a watch once, at its start; so does the cache.
    let env = env().await;
    env.sim
        .add_token("frank-token", UserInfo::new("frank", &[]));
    let grant = env.sim.policy().grant(
        Subject::User("frank".into()),
        Rule::new(&["list", "watch"], &[""], &["configmaps"]),
    );
    let frank = env.proxy(Auth::Token("frank-token".into()));
    let mut w = frank
        .watch(
            "/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=0",
            &[],
        )
        .await;
    assert_eq!(w.status, 200);
    assert_eq!(w.event(SOON).await["type"], "ADDED");
    env.sim.policy().revoke(grant);
    env.sim
        .create(&gvr("configmaps"), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "later", "namespace": "ns"}}))
        .unwrap();
    assert_eq!(w.event(SOON).await["object"]["metadata"]["name"], "later");
    assert!(matches!(w.next(QUIET).await, Next::Timeout));
}

/// The proxy's own client certificate, named by file in its kubeconfig as
/// kubelet's is (`kubelet-client-current.pem`, certificate and key in one
/// file), is re-read when the file changes: later upstream requests present
/// the new one, as client-go's certificate rotation does.
#[tokio::test]
async fn a_rotated_upstream_client_certificate_is_picked_up() {
    use kube_apiserver_sim::{Sim, SimConfig};
    let dir = support::env::tempdir();
    let pem = dir.join("proxy-client-current.pem");
    let proxy_user = SimConfig::default().proxy_user;
    // The group in the proxy's certificate tells which one a request used.
    let write_identity = |sim: &Sim, group: &str| {
        let issued = sim.issue_client(&proxy_user, Some(group));
        // Written aside and renamed into place, as kubelet swaps its link.
        let next = dir.join("next.pem");
        std::fs::write(&next, format!("{}{}", issued.cert_pem, issued.key_pem)).unwrap();
        std::fs::rename(&next, &pem).unwrap();
    };
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    write_identity(&sim, "first");
    let kubeconfig = dir.join("upstream.kubeconfig");
    let file = pem.to_str().unwrap();
    let text = apimachinery::kubeconfig::with_certificate_files(
        &sim.url(),
        &sim.ca_pem(),
        &proxy_user,
        file,
        file,
    );
    std::fs::write(&kubeconfig, text).unwrap();
    let env = Env::start_on(sim, |c| c.upstream.kubeconfig = Some(kubeconfig.clone())).await;
    env.ready().await;
    // Each new user costs a SubjectAccessReview, made with the proxy's
    // credentials: the last one's certificate group.
    let last_review = || {
        env.sim
            .requests()
            .into_iter()
            .rev()
            .find(|r| r.resource == "subjectaccessreviews")
            .and_then(|r| {
                assert_eq!(r.user, proxy_user);
                r.groups.into_iter().find(|g| g == "first" || g == "second")
            })
    };
    let list = |identity: Identity| {
        let c = env.proxy(identity.auth(&env.sim));
        async move { c.get("/api/v1/namespaces/ns/pods").await.status }
    };
    list(Identity::user("user-0")).await;
    assert_eq!(last_review().as_deref(), Some("first"));

    write_identity(&env.sim, "second");
    // Picked up within the reload interval (10 s); requests meanwhile keep
    // working with the first certificate.
    let deadline = Instant::now() + Duration::from_secs(25);
    for n in 1.. {
        list(Identity::user(&format!("user-{n}"))).await;
        if last_review().as_deref() == Some("second") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was never used"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The cache served throughout, and still does.
    assert_eq!(list(Identity::admin()).await, StatusCode::OK);
}
