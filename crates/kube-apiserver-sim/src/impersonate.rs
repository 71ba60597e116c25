//! Impersonation, as kube-apiserver v1.36 decides it with constrained
//! impersonation on (legacy and constrained modes, the shared algorithm in
//! [`apimachinery::impersonation`]), each check asked of the simulated
//! authorizer (RBAC-like rules and the Node authorizer).

use std::convert::Infallible;

use apimachinery::impersonation::{Check, Checker, LastModes, Refusal};
use apimachinery::status::Status;
use http::HeaderMap;

use super::authn::UserInfo;
use super::authorizer::{Attributes, Decision};
use super::authz::{Policy, forbidden};
use super::node_authz::NodeGraph;

struct Checks<'a> {
    request: &'a Attributes,
    policy: &'a Policy,
    graph: &'a (dyn NodeGraph + Sync),
}

impl Checks<'_> {
    fn attributes(&self, check: &Check) -> Attributes {
        match check {
            Check::On { user, verb } => Attributes {
                user: user.clone(),
                verb: verb.clone(),
                ..self.request.clone()
            },
            Check::Target {
                user,
                verb,
                group,
                resource,
                subresource,
                namespace,
                name,
            } => Attributes {
                user: user.clone(),
                verb: verb.clone(),
                resource_request: true,
                api_group: group.clone(),
                api_version: "v1".into(),
                resource: resource.clone(),
                subresource: subresource.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                ..Attributes::default()
            },
        }
    }
}

impl Checker for Checks<'_> {
    type Error = Infallible;

    async fn allowed(&self, check: &Check) -> Result<Result<(), Status>, Infallible> {
        let attrs = self.attributes(check);
        Ok(match self.policy.authorize(&attrs, self.graph) {
            Decision::Allow => Ok(()),
            Decision::Deny(reason) | Decision::NoOpinion(reason) => Err(forbidden(&attrs, &reason)),
        })
    }

    fn forbidden(&self, check: &Check, reason: &str) -> Status {
        forbidden(&self.attributes(check), reason)
    }
}

/// The user the requester of `request` acts as, or `None` without
/// impersonation headers.
///
/// # Errors
/// The apiserver's 403 for a refused impersonation, 400 for groups,
/// extras or a uid without a user.
pub async fn impersonate(
    headers: &HeaderMap,
    request: &Attributes,
    policy: &Policy,
    graph: &(dyn NodeGraph + Sync),
    last_modes: &LastModes,
) -> Result<Option<UserInfo>, Status> {
    let filter = apimachinery::impersonation::Filter::Constrained;
    let Some(wanted) = apimachinery::impersonation::requested(headers, filter).map_err(|s| *s)?
    else {
        return Ok(None);
    };
    let checks = Checks {
        request,
        policy,
        graph,
    };
    match apimachinery::impersonation::impersonate(
        &checks,
        // The simulator is kube-apiserver v1.36.
        filter,
        last_modes,
        &request.user,
        &wanted,
        &request.verb,
    )
    .await
    {
        Ok(user) => Ok(Some(user)),
        Err(Refusal::Status(s)) => Err(*s),
        Err(Refusal::Error(never)) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authn::AUTHENTICATED;
    use crate::node_authz::RefKind;
    use crate::rbac::{Rule, Subject};

    struct NoGraph;
    impl NodeGraph for NoGraph {
        fn pod_node(&self, _: &str, _: &str) -> Option<String> {
            None
        }
        fn node_references(&self, _: &str, _: RefKind, _: &str, _: &str) -> bool {
            false
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn list_configmaps(user: &UserInfo) -> Attributes {
        Attributes {
            user: user.clone(),
            verb: "list".into(),
            resource_request: true,
            api_version: "v1".into(),
            namespace: "ns".into(),
            resource: "configmaps".into(),
            ..Attributes::default()
        }
    }

    #[tokio::test]
    async fn legacy_and_constrained_modes() {
        let policy = Policy::new("proxy");
        let modes = LastModes::default();
        let alice = UserInfo::new("alice", &[]).with_authenticated_group();
        let req = list_configmaps(&alice);
        let h = headers(&[("Impersonate-User", "bob"), ("Impersonate-Group", "dev")]);
        // user-info applies first; its denial is the answer.
        let err = impersonate(&h, &req, &policy, &NoGraph, &modes)
            .await
            .unwrap_err();
        assert_eq!(
            err.message,
            "configmaps is forbidden: User \"alice\" cannot impersonate-on:user-info:list resource \"configmaps\" in API group \"\" in the namespace \"ns\""
        );
        // Legacy grants.
        policy.grant(
            Subject::User("alice".into()),
            Rule::new(&["impersonate"], &["", "authentication.k8s.io"], &["*"]),
        );
        let h = headers(&[
            ("Impersonate-User", "bob"),
            ("Impersonate-Group", "dev"),
            ("Impersonate-Extra-Scopes%2Fx", "v"),
            ("Impersonate-Uid", "u1"),
        ]);
        let u = impersonate(&h, &req, &policy, &NoGraph, &modes)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(u.groups, ["dev", AUTHENTICATED]);
        assert_eq!(u.extra["scopes/x"], ["v"]);
        assert_eq!(u.uid, "u1");
        let sa = headers(&[("Impersonate-User", "system:serviceaccount:ns:sa")]);
        let u = impersonate(&sa, &req, &policy, &NoGraph, &modes)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            u.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ns",
                AUTHENTICATED
            ]
        );
        // Constrained: a node, always in exactly system:nodes.
        let carol = UserInfo::new("carol", &[]).with_authenticated_group();
        policy.grant(
            Subject::User("carol".into()),
            Rule::new(
                &["impersonate:arbitrary-node"],
                &["authentication.k8s.io"],
                &["nodes"],
            ),
        );
        policy.grant(
            Subject::User("carol".into()),
            Rule::new(
                &["impersonate-on:arbitrary-node:list"],
                &[""],
                &["configmaps"],
            ),
        );
        let node = headers(&[("Impersonate-User", "system:node:n1")]);
        let u = impersonate(&node, &list_configmaps(&carol), &policy, &NoGraph, &modes)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(u.groups, ["system:nodes", AUTHENTICATED]);
    }

    #[tokio::test]
    async fn groups_without_user_is_bad_request() {
        let policy = Policy::new("proxy");
        let admin = UserInfo::new("admin", &["system:masters"]);
        let req = list_configmaps(&admin);
        let modes = LastModes::default();
        let err = impersonate(
            &headers(&[("Impersonate-Group", "g")]),
            &req,
            &policy,
            &NoGraph,
            &modes,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(
            err.message,
            r#"requested &user.DefaultInfo{Name:"", UID:"", Groups:[]string{"g"}, Extra:map[string][]string(nil)} without impersonating a user name"#
        );
        assert_eq!(
            impersonate(&HeaderMap::new(), &req, &policy, &NoGraph, &modes)
                .await
                .unwrap(),
            None
        );
    }
}
