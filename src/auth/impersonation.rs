//! Impersonation requested by clients (`Impersonate-User`, `-Group`,
//! `-Uid`, `Impersonate-Extra-<key>`, as `kubectl --as` sends them),
//! authorized as kube-apiserver's impersonation filter does
//! (`staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go`):
//! one `impersonate` check per requested user (or service account), group,
//! extra value and uid, the first denial answering `403`; then the request
//! proceeds as the impersonated user.

use std::collections::BTreeMap;

use http::HeaderMap;

use crate::status::Status;

use super::access::{AccessReviewer, Attributes, Decision, forbidden};
use super::review::ReviewError;
use super::{ANONYMOUS_USER, AUTHENTICATED_GROUP, UNAUTHENTICATED_GROUP, UserInfo};

/// What a client asked to act as.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Requested {
    pub user: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why impersonation failed.
#[derive(Debug, Clone)]
pub enum ImpersonationError {
    /// The apiserver's answer (`400` or `403`).
    Status(Box<Status>),
    /// The checks could not be made.
    Review(ReviewError),
}

const EXTRA_PREFIX: &str = "impersonate-extra-";

/// The impersonation a request asks for, if any.
///
/// # Errors
/// The apiserver's `400` when groups, extras or a uid are asked for without
/// a user.
pub fn requested(headers: &HeaderMap) -> Result<Option<Requested>, Box<Status>> {
    let text = |v: &http::HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
    let user = headers
        .get("impersonate-user")
        .map(text)
        .unwrap_or_default();
    let uid = headers
        .get("impersonate-uid")
        .map(text)
        .filter(|u| !u.is_empty());
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .map(text)
        .collect();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix(EXTRA_PREFIX) {
            // Header names are lowercase already; the key is percent-decoded.
            let key = percent_encoding::percent_decode_str(key)
                .decode_utf8()
                .map(|k| k.into_owned())
                .unwrap_or_else(|_| key.to_string());
            extra.entry(key).or_default().push(text(value));
        }
    }
    if user.is_empty() {
        if groups.is_empty() && extra.is_empty() && uid.is_none() {
            return Ok(None);
        }
        // Like the apiserver, list what was asked for in Go's `%v` form
        // of `[]ObjectReference`.
        let mut refs = Vec::new();
        for g in &groups {
            refs.push(format!("{{Group  {g}     }}"));
        }
        for (k, vs) in &extra {
            for v in vs {
                refs.push(format!("{{UserExtra  {v}  authentication.k8s.io/v1  {k}}}"));
            }
        }
        if let Some(u) = &uid {
            refs.push(format!("{{UID  {u}  authentication.k8s.io/v1  }}"));
        }
        return Err(Box::new(Status::bad_request(format!(
            "requested [{}] without impersonating a user",
            refs.join(" ")
        ))));
    }
    Ok(Some(Requested {
        user,
        uid,
        groups,
        extra,
    }))
}

/// A check on the `impersonate` verb by `requester`.
fn check(
    requester: &UserInfo,
    group: &str,
    resource: &str,
    subresource: &str,
    namespace: &str,
    name: &str,
) -> Attributes {
    Attributes {
        user: requester.clone(),
        verb: "impersonate".into(),
        resource_request: true,
        api_group: group.into(),
        api_version: "v1".into(),
        resource: resource.into(),
        subresource: subresource.into(),
        namespace: namespace.into(),
        name: name.into(),
        ..Attributes::default()
    }
}

/// Authorizes `requester` to act as `req` and returns the user the request
/// proceeds as.
///
/// # Errors
/// [`ImpersonationError::Status`] with the apiserver's `403` on the first
/// denied check, or [`ImpersonationError::Review`].
pub async fn impersonate(
    reviewer: &AccessReviewer,
    requester: &UserInfo,
    req: &Requested,
) -> Result<UserInfo, ImpersonationError> {
    let mut checks = Vec::new();
    let mut groups = req.groups.clone();
    match service_account(&req.user) {
        Some((ns, name)) => {
            checks.push(check(requester, "", "serviceaccounts", "", ns, name));
            if req.groups.is_empty() {
                groups = vec![
                    "system:serviceaccounts".to_string(),
                    format!("system:serviceaccounts:{ns}"),
                ];
            }
        }
        None => checks.push(check(requester, "", "users", "", "", &req.user)),
    }
    for g in &req.groups {
        checks.push(check(requester, "", "groups", "", "", g));
    }
    for (key, values) in &req.extra {
        for v in values {
            checks.push(check(
                requester,
                "authentication.k8s.io",
                "userextras",
                key,
                "",
                v,
            ));
        }
    }
    if let Some(uid) = &req.uid {
        checks.push(check(
            requester,
            "authentication.k8s.io",
            "uids",
            "",
            "",
            uid,
        ));
    }
    for attrs in &checks {
        match reviewer.authorize(attrs).await {
            Ok(Decision::Allow) => {}
            Ok(Decision::Deny(reason)) => {
                return Err(ImpersonationError::Status(Box::new(forbidden(
                    attrs, &reason,
                ))));
            }
            Err(e) => return Err(ImpersonationError::Review(e)),
        }
    }
    if req.user == ANONYMOUS_USER {
        if !groups.iter().any(|g| g == UNAUTHENTICATED_GROUP) {
            groups.push(UNAUTHENTICATED_GROUP.to_string());
        }
    } else if !groups
        .iter()
        .any(|g| g == AUTHENTICATED_GROUP || g == UNAUTHENTICATED_GROUP)
    {
        groups.push(AUTHENTICATED_GROUP.to_string());
    }
    Ok(UserInfo {
        name: req.user.clone(),
        uid: req.uid.clone().unwrap_or_default(),
        groups,
        extra: req.extra.clone(),
    })
}

/// `system:serviceaccount:<ns>:<name>` split into namespace and name.
fn service_account(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn parses_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(requested(&h).unwrap(), None);
        h.insert("impersonate-user", HeaderValue::from_static("alice"));
        h.append("impersonate-group", HeaderValue::from_static("dev"));
        h.append("impersonate-group", HeaderValue::from_static("ops"));
        h.append(
            "impersonate-extra-example.com%2fscope",
            HeaderValue::from_static("a"),
        );
        h.append(
            "impersonate-extra-example.com%2fscope",
            HeaderValue::from_static("b"),
        );
        let r = requested(&h).unwrap().unwrap();
        assert_eq!(r.user, "alice");
        assert_eq!(r.groups, vec!["dev", "ops"]);
        assert_eq!(r.extra["example.com/scope"], vec!["a", "b"]);
        let mut g = HeaderMap::new();
        g.insert("impersonate-group", HeaderValue::from_static("dev"));
        let s = requested(&g).unwrap_err();
        assert_eq!(s.code, 400);
        assert_eq!(
            s.message,
            "requested [{Group  dev     }] without impersonating a user"
        );
    }

    #[test]
    fn service_accounts() {
        assert_eq!(
            service_account("system:serviceaccount:ns:sa"),
            Some(("ns", "sa"))
        );
        assert_eq!(service_account("system:serviceaccount:ns"), None);
        assert_eq!(service_account("alice"), None);
    }
}
