//! A tier proxy (`manifests/tier/config.yaml`, `upstream.identity: Tier`)
//! forwards the certificate requests of the nodes behind it as those
//! nodes, by impersonation, whatever upstream credential it is given, on a
//! real kube-apiserver v1.36:
//!
//! - the shipped ServiceAccount (`manifests/tier/rbac.yaml`: constrained
//!   impersonation, `impersonate:arbitrary-node`);
//! - an administrator's credential (`system:masters`);
//! - a ServiceAccount granted only the legacy `impersonate` verb on users
//!   and groups, with which the apiserver gives the impersonated user only
//!   the groups asked for: the tier must ask for `system:nodes`, or the
//!   Node authorizer refuses the node everything;
//!
//! and a credential with neither right makes the tier refuse to start,
//! naming the missing right.
//!
//! The node is seen as itself when it may get its own Node (`200` or
//! `404`) and is refused a Secret no pod of it mounts by the Node
//! authorizer ("no relationship found between node").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::time::Duration;

use apimachinery::kubeconfig::with_token;
use apimachinery::pki::Ca;
use kube_cache_proxy::Listeners;
use kube_cache_proxy::component::config::Config;
use kube_testenv::ControlPlane;
use support::env::{Running, tempdir};
use support::real::{apply, eventually, service_account_token, shipped, write};
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
        include_str!("../manifests/tier/serviceaccount.yaml"),
    )
    .await;
    apply(&admin, include_str!("../manifests/tier/rbac.yaml")).await;
    apply(&admin, TEST_RBAC).await;
    let node_cert = cp
        .issue_client(&format!("system:node:{NODE}"), Some("system:nodes"))
        .unwrap();

    for (what, upstream) in [
        (
            "the shipped ServiceAccount",
            service_account(cp, &admin, "kube-cache-proxy-tier").await,
        ),
        (
            "an administrator (system:masters)",
            cp.kubeconfig_text(&cp.url(), "admin", cp.admin()),
        ),
        (
            "a ServiceAccount with legacy impersonation only",
            service_account(cp, &admin, "kcp-test-legacy-tier").await,
        ),
    ] {
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
