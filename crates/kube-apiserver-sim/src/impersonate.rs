//! Impersonation, as the legacy `WithImpersonation` filter does it
//! (`/tmp/research/auth.md` §5): each requested user, service account,
//! group, extra value and uid is authorized with verb `impersonate`; the
//! first denial is a 403; groups, extras or a uid without a user are a 400.

use std::collections::BTreeMap;

use http::HeaderMap;
use percent_encoding::percent_decode_str;

use super::authn::{ANONYMOUS, AUTHENTICATED, UNAUTHENTICATED, UserInfo};
use super::authorizer::{Attributes, Decision};
use super::authz::{Policy, forbidden};
use super::node_authz::NodeGraph;
use apimachinery::status::Status;

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA: &str = "impersonate-extra-";

/// One thing to impersonate (a `v1.ObjectReference` in the apiserver).
struct Request {
    kind: &'static str,
    namespace: String,
    name: String,
    api_version: &'static str,
    field_path: String,
}

// === impl Request ===

impl Request {
    /// The authorization check: verb `impersonate` on the matching resource.
    fn attributes(&self, user: &UserInfo) -> Attributes {
        let (group, resource, subresource) = match self.kind {
            "ServiceAccount" => ("", "serviceaccounts", ""),
            "User" => ("", "users", ""),
            "Group" => ("", "groups", ""),
            "UserExtra" => (
                "authentication.k8s.io",
                "userextras",
                self.field_path.as_str(),
            ),
            _ => ("authentication.k8s.io", "uids", ""),
        };
        Attributes {
            user: user.clone(),
            verb: "impersonate".into(),
            resource_request: true,
            api_group: group.into(),
            api_version: "v1".into(),
            namespace: self.namespace.clone(),
            resource: resource.into(),
            subresource: subresource.into(),
            name: self.name.clone(),
            ..Attributes::default()
        }
    }

    /// Go's `%v` of the `ObjectReference`, for the 400 message.
    fn go_debug(&self) -> String {
        format!(
            "{{{} {} {}  {}  {}}}",
            self.kind, self.namespace, self.name, self.api_version, self.field_path
        )
    }
}

fn header_values<'a>(headers: &'a HeaderMap, name: &str) -> impl Iterator<Item = &'a str> {
    headers.get_all(name).iter().filter_map(|v| v.to_str().ok())
}

/// Whether the request carries any impersonation header.
pub fn requested(headers: &HeaderMap) -> bool {
    headers
        .keys()
        .any(|k| k.as_str().starts_with("impersonate-"))
}

/// The user `requestor` acts as, or `None` without impersonation headers.
///
/// # Errors
/// 403 for the first impersonation the policy refuses, 400 for groups,
/// extras or a uid without a user.
pub fn impersonate(
    headers: &HeaderMap,
    requestor: &UserInfo,
    policy: &Policy,
    graph: &dyn NodeGraph,
) -> Result<Option<UserInfo>, Status> {
    if !requested(headers) {
        return Ok(None);
    }
    let mut requests = Vec::new();
    let user = header_values(headers, USER)
        .next()
        .unwrap_or("")
        .to_string();
    if !user.is_empty() {
        let sa = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains(':'));
        requests.push(match sa {
            Some((ns, name)) => Request {
                kind: "ServiceAccount",
                namespace: ns.into(),
                name: name.into(),
                api_version: "",
                field_path: String::new(),
            },
            None => Request {
                kind: "User",
                namespace: String::new(),
                name: user.clone(),
                api_version: "",
                field_path: String::new(),
            },
        });
    }
    let groups: Vec<String> = header_values(headers, GROUP).map(str::to_string).collect();
    for g in &groups {
        requests.push(Request {
            kind: "Group",
            namespace: String::new(),
            name: g.clone(),
            api_version: "",
            field_path: String::new(),
        });
    }
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        let Some(raw) = name.as_str().strip_prefix(EXTRA) else {
            continue;
        };
        let key = percent_decode_str(raw)
            .decode_utf8()
            .map(|k| k.into_owned())
            .unwrap_or_else(|_| raw.to_string());
        let value = value.to_str().unwrap_or_default().to_string();
        extra.entry(key.clone()).or_default().push(value.clone());
        requests.push(Request {
            kind: "UserExtra",
            namespace: String::new(),
            name: value,
            api_version: "authentication.k8s.io/v1",
            field_path: key,
        });
    }
    let uid = header_values(headers, UID).next().unwrap_or("").to_string();
    if !uid.is_empty() {
        requests.push(Request {
            kind: "UID",
            namespace: String::new(),
            name: uid.clone(),
            api_version: "authentication.k8s.io/v1",
            field_path: String::new(),
        });
    }
    if user.is_empty() {
        let listed: Vec<String> = requests.iter().map(Request::go_debug).collect();
        return Err(Status::bad_request(format!(
            "requested [{}] without impersonating a user",
            listed.join(" ")
        )));
    }
    for request in &requests {
        let attrs = request.attributes(requestor);
        match policy.authorize(&attrs, graph) {
            Decision::Allow => {}
            Decision::Deny(reason) | Decision::NoOpinion(reason) => {
                return Err(forbidden(&attrs, &reason));
            }
        }
    }
    let mut groups = groups;
    if let Some(Request {
        kind: "ServiceAccount",
        namespace,
        ..
    }) = requests.first()
    {
        if groups.is_empty() {
            groups = vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
            ];
        }
    }
    if user == ANONYMOUS {
        if !groups.iter().any(|g| g == UNAUTHENTICATED) {
            groups.push(UNAUTHENTICATED.into());
        }
    } else if !groups
        .iter()
        .any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED)
    {
        groups.push(AUTHENTICATED.into());
    }
    Ok(Some(UserInfo {
        name: user,
        uid,
        groups,
        extra,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn checks_and_group_completion() {
        let policy = Policy::new("proxy");
        let alice = UserInfo::new("alice", &[]).with_authenticated_group();
        let h = headers(&[("Impersonate-User", "bob"), ("Impersonate-Group", "dev")]);
        let err = impersonate(&h, &alice, &policy, &NoGraph).unwrap_err();
        assert_eq!(
            err.message,
            "users \"bob\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
        );
        policy.grant(
            Subject::User("alice".into()),
            Rule::new(&["impersonate"], &[""], &["users"]),
        );
        let err = impersonate(&h, &alice, &policy, &NoGraph).unwrap_err();
        assert!(
            err.message.starts_with("groups \"dev\" is forbidden"),
            "{}",
            err.message
        );
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
        let u = impersonate(&h, &alice, &policy, &NoGraph).unwrap().unwrap();
        assert_eq!(u.groups, ["dev", AUTHENTICATED]);
        assert_eq!(u.extra["scopes/x"], ["v"]);
        assert_eq!(u.uid, "u1");
        let sa = headers(&[("Impersonate-User", "system:serviceaccount:ns:sa")]);
        let u = impersonate(&sa, &alice, &policy, &NoGraph)
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
    }

    #[test]
    fn groups_without_user_is_bad_request() {
        let policy = Policy::new("proxy");
        let admin = UserInfo::new("admin", &["system:masters"]);
        let err = impersonate(
            &headers(&[("Impersonate-Group", "g")]),
            &admin,
            &policy,
            &NoGraph,
        )
        .unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(
            err.message,
            "requested [{Group  g    }] without impersonating a user"
        );
        assert_eq!(
            impersonate(&HeaderMap::new(), &admin, &policy, &NoGraph).unwrap(),
            None
        );
    }
}
