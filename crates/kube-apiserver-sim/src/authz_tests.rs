//! Unit tests of `authz`.

use super::*;
use crate::authn::UserInfo;
use crate::node_authz::RefKind;
use apimachinery::request::RequestInfo;
use http::Method;

struct Graph;
impl NodeGraph for Graph {
    fn pod_node(&self, _ns: &str, name: &str) -> Option<String> {
        (name == "p-node1").then(|| "node-1".to_string())
    }
    fn node_references(&self, node: &str, kind: RefKind, _ns: &str, name: &str) -> bool {
        node == "node-1" && kind == RefKind::ConfigMap && name == "kube-root-ca.crt"
    }
}

fn node1() -> UserInfo {
    UserInfo::new("system:node:node-1", &["system:nodes"]).with_authenticated_group()
}

fn check(user: &UserInfo, method: Method, path: &str, query: &str) -> Result<(), String> {
    let info = RequestInfo::parse(&method, path, Some(query));
    let attrs = Attributes::from_request(&info, user, query);
    match Policy::new("proxy").authorize(&attrs, &Graph) {
        Decision::Allow => Ok(()),
        Decision::Deny(r) | Decision::NoOpinion(r) => Err(forbidden(&attrs, &r).message),
    }
}

#[test]
fn node_authorizer_messages_match_recording() {
    let n = node1();
    assert_eq!(
        check(&n, Method::GET, "/api/v1/pods", "fieldSelector=spec.nodeName%3Dnode-2"),
        Err("pods is forbidden: User \"system:node:node-1\" cannot list resource \"pods\" in API group \"\" at the cluster scope: can only list/watch pods with spec.nodeName field selector".into())
    );
    assert!(
        check(
            &n,
            Method::GET,
            "/api/v1/pods",
            "fieldSelector=spec.nodeName%3Dnode-1"
        )
        .is_ok()
    );
    assert!(
        check(
            &n,
            Method::GET,
            "/api/v1/pods",
            "watch=1&fieldSelector=spec.nodeName%3D%3Dnode-1"
        )
        .is_ok()
    );
    assert_eq!(
        check(&n, Method::GET, "/api/v1/secrets", ""),
        Err("secrets is forbidden: User \"system:node:node-1\" cannot list resource \"secrets\" in API group \"\" at the cluster scope: can only read namespaced object of this type".into())
    );
    assert_eq!(
        check(&n, Method::GET, "/api/v1/namespaces/ns/configmaps/cm-0", ""),
        Err("configmaps \"cm-0\" is forbidden: User \"system:node:node-1\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"ns\": no relationship found between node 'node-1' and this object".into())
    );
    assert!(
        check(
            &n,
            Method::GET,
            "/api/v1/namespaces/ns/configmaps/kube-root-ca.crt",
            ""
        )
        .is_ok()
    );
    assert!(
        check(
            &n,
            Method::GET,
            "/api/v1/namespaces/ns/configmaps",
            "watch=1&fieldSelector=metadata.name%3Dkube-root-ca.crt"
        )
        .is_ok()
    );
    assert!(check(&n, Method::GET, "/api/v1/namespaces/ns/pods/p-node1", "").is_ok());
    assert!(check(&n, Method::GET, "/api/v1/namespaces/ns/pods/other", "").is_err());
    assert_eq!(
        check(&n, Method::GET, "/api/v1/nodes", ""),
        Err("nodes is forbidden: User \"system:node:node-1\" cannot list resource \"nodes\" in API group \"\" at the cluster scope: node 'node-1' cannot read all nodes, only its own Node object".into())
    );
    assert!(
        check(
            &n,
            Method::GET,
            "/api/v1/nodes",
            "fieldSelector=metadata.name%3Dnode-1"
        )
        .is_ok()
    );
    assert!(check(&n, Method::PATCH, "/api/v1/nodes/node-1/status", "").is_ok());
    assert!(
        check(
            &n,
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1",
            ""
        )
        .is_ok()
    );
    assert!(check(&n, Method::GET, "/api/v1/services", "watch=1").is_ok());
    assert!(check(&n, Method::GET, "/apis/node.k8s.io/v1/runtimeclasses", "").is_ok());
    assert!(check(&n, Method::GET, "/api/v1/namespaces", "").is_err());
}

#[test]
fn anonymous_masters_and_non_resource() {
    let anon = UserInfo::anonymous();
    assert_eq!(
        check(&anon, Method::GET, "/api/v1/pods", ""),
        Err("pods is forbidden: User \"system:anonymous\" cannot list resource \"pods\" in API group \"\" at the cluster scope".into())
    );
    assert!(check(&anon, Method::GET, "/version", "").is_ok());
    assert_eq!(
        check(&anon, Method::GET, "/apis", ""),
        Err("forbidden: User \"system:anonymous\" cannot get path \"/apis\"".into())
    );
    let admin = UserInfo::new("admin", &[MASTERS]).with_authenticated_group();
    assert!(check(&admin, Method::DELETE, "/api/v1/namespaces/x", "").is_ok());
    let alice = UserInfo::new("alice", &[]).with_authenticated_group();
    assert!(check(&alice, Method::GET, "/apis/apps/v1", "").is_ok());
    assert_eq!(
        check(&alice, Method::GET, "/metrics", ""),
        Err("forbidden: User \"alice\" cannot get path \"/metrics\"".into())
    );
    let proxy = UserInfo::new("proxy", &[]).with_authenticated_group();
    assert!(check(&proxy, Method::GET, "/api/v1/secrets", "watch=1").is_ok());
    assert!(
        check(
            &proxy,
            Method::POST,
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            ""
        )
        .is_ok()
    );
    assert!(check(&proxy, Method::DELETE, "/api/v1/namespaces/ns/pods/p", "").is_err());
}

#[test]
fn grants_and_revokes() {
    let policy = Policy::new("proxy");
    let alice = UserInfo::new("alice", &["dev"]).with_authenticated_group();
    let info = RequestInfo::parse(&Method::GET, "/api/v1/namespaces/ns/pods", None);
    let attrs = Attributes::from_request(&info, &alice, "");
    assert_eq!(
        policy.authorize(&attrs, &Graph),
        Decision::NoOpinion(String::new())
    );
    let id = policy.grant(
        Subject::Group("dev".into()),
        Rule::new(&["list"], &[""], &["pods"]).in_namespaces(&["ns"]),
    );
    assert_eq!(policy.authorize(&attrs, &Graph), Decision::Allow);
    assert!(policy.revoke(id));
    assert_eq!(
        policy.authorize(&attrs, &Graph),
        Decision::NoOpinion(String::new())
    );
    policy.grant(
        Subject::User("alice".into()),
        Rule::new(&["*"], &["*"], &["*"]),
    );
    policy.clear();
    assert_ne!(policy.authorize(&attrs, &Graph), Decision::Allow);
}
