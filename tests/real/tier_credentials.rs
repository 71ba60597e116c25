//! A tier proxy (`manifests/tier/config.yaml`, `upstream.identity: Tier`)
//! forwards the certificate requests of the nodes behind it as those
//! nodes, by impersonation, whatever upstream credential it is given, on a
//! real kube-apiserver v1.36:
//!
//! - the shipped ServiceAccount (`manifests/tier/rbac.yaml`: constrained
//!   impersonation, `impersonate:arbitrary-node`);
//! - an administrator's credential (`system:masters`), after that
//!   credential has impersonated by legacy impersonation (as any `kubectl
//!   --as` with kubeadm's `super-admin.conf` does): kube-apiserver 1.36
//!   then decides its node impersonations without a group by legacy
//!   impersonation too (it tries first the mode that last succeeded for
//!   the requestor), which gives the node `system:authenticated` alone;
//! - a ServiceAccount granted only the legacy `impersonate` verb on users
//!   and groups, with which the apiserver gives the impersonated user only
//!   the groups asked for: the tier must ask for `system:nodes`, or the
//!   Node authorizer refuses the node everything;
//!
//! and a credential with neither right makes the tier refuse to start,
//! naming the missing right.
//!
//! The node is seen as itself when a SelfSubjectReview through the tier
//! shows it in `system:nodes`, it may get its own Node (`200` or `404`),
//! and it is refused a Secret no pod of it mounts by the Node authorizer
//! ("no relationship found between node").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::path::Path;
use std::time::Duration;

use apimachinery::kubeconfig::with_token;
use apimachinery::pki::Ca;
use kube_cache_proxy::Listeners;
use kube_cache_proxy::component::config::Config;
use kube_testenv::ControlPlane;
use support::env::{Running, tempdir};
use support::real::{apply, eventually, namespace, service_account_token, shipped, write};
use support::{Auth, Client};

const NODE: &str = "cred-node-0";

/// Two ServiceAccounts with what the tier reads for itself (its caches,
/// token and access reviews), one also with legacy impersonation.
const TEST_RBAC: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata:
  name: kcp-test-legacy-tier
  namespace: kube-system
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: kcp-test-plain-tier
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: kcp-test-legacy-impersonator
rules:
  - apiGroups: [""]
    resources: [users, groups]
    verbs: [impersonate]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kcp-test-legacy-tier:impersonator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kcp-test-legacy-impersonator
subjects:
  - kind: ServiceAccount
    name: kcp-test-legacy-tier
    namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kcp-test-tiers:cache
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kube-cache-proxy-tier:cache
subjects:
  - kind: ServiceAccount
    name: kcp-test-legacy-tier
    namespace: kube-system
  - kind: ServiceAccount
    name: kcp-test-plain-tier
    namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kcp-test-tiers:auth-delegator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
  - kind: ServiceAccount
    name: kcp-test-legacy-tier
    namespace: kube-system
  - kind: ServiceAccount
    name: kcp-test-plain-tier
    namespace: kube-system
"#;

/// The shipped tier configuration with `upstream` (a kubeconfig's text)
/// as its credential.
fn tier_config(cp: &ControlPlane, dir: &Path, ca: &Ca, upstream: &str) -> Config {
    let mut c = shipped("manifests/tier/config.yaml", dir, ca, &cp.ca_pem());
    c.upstream.kubeconfig = Some(write(dir, "upstream.kubeconfig", upstream));
    c
}

/// A kubeconfig reaching the apiserver with a token of ServiceAccount
/// `kube-system/<name>`.
async fn service_account(cp: &ControlPlane, admin: &Client, name: &str) -> String {
    let token = service_account_token(admin, "kube-system", name).await;
    with_token(&cp.url(), &cp.ca_pem(), &token)
}

/// The groups a SelfSubjectReview by `client` with `headers` shows.
async fn self_review(client: &Client, headers: &[(&str, &str)]) -> Vec<String> {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    let body =
        serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let r = client
        .send(
            http::Method::POST,
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            &h,
            Some(serde_json::to_vec(&body).unwrap()),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["status"]["userInfo"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_acts_as_its_nodes_with_any_credential_that_may_impersonate_them() {
    let Some(cp) = ControlPlane::shared().await else {
        return;
    };
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    apply(
        &admin,
        include_str!("../../manifests/tier/serviceaccount.yaml"),
    )
    .await;
    apply(&admin, include_str!("../../manifests/tier/rbac.yaml")).await;
    if !cp.has_constrained_impersonation() {
        // Before 1.36 the shipped account needs legacy impersonation.
        apply(
            &admin,
            include_str!("../../manifests/tier/rbac-legacy-impersonation.yaml"),
        )
        .await;
    }
    apply(&admin, TEST_RBAC).await;
    let node_cert = cp
        .issue_client(&format!("system:node:{NODE}"), Some("system:nodes"))
        .unwrap();

    for (what, upstream, legacy_first) in [
        (
            "the shipped ServiceAccount",
            service_account(cp, &admin, "kube-cache-proxy-tier").await,
            false,
        ),
        (
            "an administrator (system:masters) that impersonated by legacy impersonation before",
            cp.kubeconfig_text(&cp.url(), "admin", cp.admin()),
            true,
        ),
        (
            "a ServiceAccount with legacy impersonation only",
            service_account(cp, &admin, "kcp-test-legacy-tier").await,
            false,
        ),
    ] {
        if legacy_first {
            // One legacy impersonation by the credential (a node user with
            // a group: only legacy impersonation accepts it)...
            let legacy = self_review(
                &admin,
                &[
                    ("impersonate-user", "system:node:kcp-test-primer"),
                    ("impersonate-group", "system:nodes"),
                ],
            )
            .await;
            assert_eq!(legacy, ["system:nodes", "system:authenticated"]);
            // ...and the apiserver decides its next node impersonation
            // without a group by legacy impersonation too: the node is not
            // in system:nodes.
            let alone = self_review(
                &admin,
                &[("impersonate-user", "system:node:kcp-test-primer")],
            )
            .await;
            assert_eq!(alone, ["system:authenticated"], "{what}");
        }
        let dir = tempdir();
        let ca = Ca::new("tier-ca").unwrap();
        let mut tier = Running::start(&tier_config(cp, &dir, &ca, &upstream)).await;
        tier.ready().await;
        let node = Client::new(
            &tier.url,
            &ca.cert_pem(),
            Auth::Cert(node_cert.clone()),
            false,
        );
        // The tier learns its way of impersonating within milliseconds of
        // its start (requests before that go by constrained impersonation).
        let path = format!("/api/v1/nodes/{NODE}");
        let own = eventually(Duration::from_secs(5), what, || {
            let (node, path) = (&node, &path);
            async move {
                let r = node.get(path).await;
                (r.status == 200 || r.status == 404).then_some(r.status)
            }
        })
        .await;
        assert!(own == 200 || own == 404, "{what}: the node's own Node");
        let groups = self_review(&node, &[]).await;
        assert_eq!(
            groups,
            ["system:nodes", "system:authenticated"],
            "{what}: the node as the apiserver sees it through the tier"
        );
        let secret = node
            .get("/api/v1/namespaces/default/secrets/kcp-test-unmounted")
            .await;
        assert_eq!(secret.status, 403, "{what}: {}", secret.text());
        assert!(
            secret.text().contains(&format!(
                "User \\\"system:node:{NODE}\\\" cannot get resource \\\"secrets\\\""
            )) && secret.text().contains("no relationship found between node"),
            "{what}: refused by the Node authorizer as the node: {}",
            secret.text()
        );
        tier.stop().await.unwrap();
    }

    // Neither constrained nor legacy impersonation: it would be refused
    // every node request, forever; it stops at once, and says why.
    let dir = tempdir();
    let ca = Ca::new("tier-ca").unwrap();
    let upstream = service_account(cp, &admin, "kcp-test-plain-tier").await;
    let config = tier_config(cp, &dir, &ca, &upstream);
    config.validate().unwrap();
    let listeners = Listeners::bind(&config).await.unwrap();
    let ended = tokio::time::timeout(
        Duration::from_secs(60),
        kube_cache_proxy::run(listeners, config, std::future::pending()),
    )
    .await
    .expect("the tier stops by itself");
    let message = ended.expect_err("the tier refuses to run").to_string();
    for needle in [
        "impersonate:arbitrary-node",
        "impersonate",
        "system:nodes",
        "manifests/tier/rbac.yaml",
    ] {
        assert!(message.contains(needle), "{needle:?} in: {message}");
    }
}

/// The Node authorizer allows a node the Secret of a pod once the pod is
/// bound to it, a moment after the binding (its graph follows pods by
/// informer); a kubelet's first read of a new pod's Secret may be denied
/// ("no relationship found") and is asked again a second later. Through
/// the tier, that next read is allowed as soon as the apiserver allows it
/// directly: the denial is not reused (with the 10 s it was reused for
/// before, a tier's pods waited 10 to 20 s: docs/performance.md, (k)).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_allowed_a_new_pods_secret_through_the_tier_as_soon_as_directly() {
    let Some(cp) = ControlPlane::shared().await else {
        return;
    };
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    apply(
        &admin,
        include_str!("../../manifests/tier/serviceaccount.yaml"),
    )
    .await;
    apply(&admin, include_str!("../../manifests/tier/rbac.yaml")).await;
    if !cp.has_constrained_impersonation() {
        apply(
            &admin,
            include_str!("../../manifests/tier/rbac-legacy-impersonation.yaml"),
        )
        .await;
    }
    let ns = "kcp-graph";
    namespace(&admin, ns).await;
    let r = admin
        .post_json(
            &format!("/api/v1/namespaces/{ns}/secrets"),
            &serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                                "metadata": {"name": "graph-secret"}, "stringData": {"k": "v"}}),
        )
        .await;
    assert!(r.status == 201 || r.status == 409, "{}", r.text());

    let dir = tempdir();
    let ca = Ca::new("tier-ca").unwrap();
    let upstream = service_account(cp, &admin, "kube-cache-proxy-tier").await;
    let mut tier = Running::start(&tier_config(cp, &dir, &ca, &upstream)).await;
    tier.ready().await;
    let node_name = "graph-node-0";
    let cert = cp
        .issue_client(&format!("system:node:{node_name}"), Some("system:nodes"))
        .unwrap();
    let via_tier = Client::new(&tier.url, &ca.cert_pem(), Auth::Cert(cert.clone()), false);
    let direct = Client::new(&cp.url(), &cp.ca_pem(), Auth::Cert(cert), false);
    // The kubelet's per-object list, from the tier's cache once allowed.
    let path = format!(
        "/api/v1/namespaces/{ns}/secrets?fieldSelector=metadata.name%3Dgraph-secret&resourceVersion=0"
    );
    for client in [&direct, &via_tier, &via_tier] {
        let r = client.get(&path).await;
        assert_eq!(
            r.status,
            403,
            "no pod of the node mounts it yet: {}",
            r.text()
        );
        assert!(
            r.text().contains("no relationship found between node"),
            "{}",
            r.text()
        );
    }

    let r = admin
        .post_json(
            &format!("/api/v1/namespaces/{ns}/pods"),
            &serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "graph-pod"},
                "spec": {"nodeName": node_name, "automountServiceAccountToken": false,
                         "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                         "volumes": [{"name": "s", "secret": {"secretName": "graph-secret"}}]}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let direct_allowed = eventually(Duration::from_secs(10), "the apiserver allowing it", || {
        let (direct, path) = (&direct, &path);
        async move { (direct.get(path).await.status == 200).then(std::time::Instant::now) }
    })
    .await;
    let r = via_tier.get(&path).await;
    assert_eq!(
        r.status,
        200,
        "the next read through the tier, {:?} after the apiserver allowed it: {}",
        direct_allowed.elapsed(),
        r.text()
    );
    assert_eq!(r.json()["items"][0]["metadata"]["name"], "graph-secret");
    let (_, metrics) = tier.admin_get("/metrics").await;
    assert!(
        support::real::metric_sum(
            &metrics,
            "kube_cache_proxy_authorization_total",
            &[("result", "denied"), ("source", "upstream")],
        ) >= 2.0,
        "both denials were the apiserver's own answers: {metrics}"
    );
    let _ = admin
        .delete(&format!("/api/v1/namespaces/{ns}/pods/graph-pod"))
        .await;
    tier.stop().await.unwrap();
}

/// A ServiceAccount with the shipped tier's rights (constrained
/// impersonation of nodes only), legacy impersonation granted later.
const SWITCHING_RBAC: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata:
  name: kcp-test-switching-tier
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kcp-test-switching-tier:tier
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kube-cache-proxy-tier:node-impersonator
subjects:
  - kind: ServiceAccount
    name: kcp-test-switching-tier
    namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kcp-test-switching-tier:cache
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kube-cache-proxy-tier:cache
subjects:
  - kind: ServiceAccount
    name: kcp-test-switching-tier
    namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kcp-test-switching-tier:auth-delegator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
  - kind: ServiceAccount
    name: kcp-test-switching-tier
    namespace: kube-system
"#;

const SWITCHING_LEGACY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kcp-test-switching-tier:legacy
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kcp-test-legacy-impersonator
subjects:
  - kind: ServiceAccount
    name: kcp-test-switching-tier
    namespace: kube-system
"#;

/// A tier whose node requests start being refused learns again how the
/// apiserver treats its impersonation: here its credential is granted
/// legacy impersonation after the tier started (by constrained
/// impersonation) and uses it once; kube-apiserver then decides its node
/// impersonations without a group by legacy impersonation, the node loses
/// `system:nodes` and is refused its own Node, and the tier, on that
/// refusal, switches to legacy impersonation with the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_learns_again_when_its_node_requests_are_refused() {
    let Some(cp) = ControlPlane::shared().await else {
        return;
    };
    if !cp.has_constrained_impersonation() {
        kube_testenv::skip::not_applicable(format!(
            "kube-apiserver {} has no constrained impersonation",
            cp.version()
        ));
        return;
    }
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    apply(&admin, include_str!("../../manifests/tier/rbac.yaml")).await;
    apply(&admin, TEST_RBAC).await;
    apply(&admin, SWITCHING_RBAC).await;
    let token = service_account_token(&admin, "kube-system", "kcp-test-switching-tier").await;
    let dir = tempdir();
    let ca = Ca::new("tier-ca").unwrap();
    let upstream = with_token(&cp.url(), &cp.ca_pem(), &token);
    let mut tier = Running::start(&tier_config(cp, &dir, &ca, &upstream)).await;
    tier.ready().await;
    let node_name = "switch-node-0";
    let node = Client::new(
        &tier.url,
        &ca.cert_pem(),
        Auth::Cert(
            cp.issue_client(&format!("system:node:{node_name}"), Some("system:nodes"))
                .unwrap(),
        ),
        false,
    );
    let path = format!("/api/v1/nodes/{node_name}");
    let own = |what: &'static str| {
        let (node, path) = (&node, &path);
        eventually(Duration::from_secs(10), what, move || async move {
            let r = node.get(path).await;
            (r.status == 200 || r.status == 404).then_some(())
        })
    };
    own("the node as itself, by constrained impersonation").await;

    apply(&admin, SWITCHING_LEGACY).await;
    let as_tier = Client::new(&cp.url(), &cp.ca_pem(), Auth::Token(token.clone()), false);
    eventually(
        Duration::from_secs(10),
        "a legacy impersonation",
        || async {
            let r = as_tier
                .send(
                    http::Method::POST,
                    "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                    &[
                        ("content-type", "application/json"),
                        ("impersonate-user", "system:node:kcp-test-primer"),
                        ("impersonate-group", "system:nodes"),
                    ],
                    Some(
                        br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#
                            .to_vec(),
                    ),
                )
                .await;
            (r.status == 201).then_some(())
        },
    )
    .await;
    let refused = node.get(&path).await;
    assert_eq!(
        refused.status,
        403,
        "the apiserver now decides the tier's node impersonation by legacy impersonation: {}",
        refused.text()
    );
    own("the node as itself again, by legacy impersonation").await;
    assert_eq!(
        self_review(&node, &[]).await,
        ["system:nodes", "system:authenticated"]
    );
    tier.stop().await.unwrap();
}
