//! Impersonation requested by clients (`Impersonate-User`, `-Group`,
//! `-Uid`, `Impersonate-Extra-<key>`, as `kubectl --as` sends them),
//! authorized as kube-apiserver v1.36 does with constrained impersonation
//! on (KEP-5284, beta and on by default;
//! `staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation/`):
//!
//! The modes are tried in order, each only when its filter matches what
//! is asked:
//!
//! | mode | asked for | checks, for the requester |
//! |---|---|---|
//! | `associated-node` | only the user `system:node:<n>`, by a service account whose token is bound to node `<n>` | `impersonate-on:associated-node:<verb>` on the request; `impersonate:associated-node` on `nodes` `*` (group `authentication.k8s.io`) |
//! | `arbitrary-node` | only a user `system:node:<n>` | `impersonate-on:arbitrary-node:<verb>`; `impersonate:arbitrary-node` on `nodes` `<n>` |
//! | `serviceaccount` | only a user `system:serviceaccount:<ns>:<n>` | `impersonate-on:serviceaccount:<verb>`; `impersonate:serviceaccount` on `serviceaccounts` |
//! | `user-info` | any other user, with groups, extra, uid | `impersonate-on:user-info:<verb>`; `impersonate:user-info` on `users`, `groups`, `uids`, `userextras` |
//! | legacy | anything | `impersonate` on `users`/`serviceaccounts`/`groups` (core group), `uids`/`userextras` |
//!
//! The first mode whose checks all pass decides who the request acts as; if
//! none does, the first denial is the `403`. In the constrained modes a
//! node is always in exactly `system:nodes`, groups may not be asked for a
//! node or service account, and `system:masters`, empty groups and
//! malformed extras are refused outright.
//!
//! Like the apiserver, the mode that last succeeded for a requester (by
//! name, the last 10000 requesters) is tried first: that decides which
//! denial a request reports when every mode fails.

use std::collections::BTreeMap;

use std::future::Future;

use http::HeaderMap;

use crate::go::quote;
use crate::status::Status;
use crate::user::{ANONYMOUS_USER, AUTHENTICATED_GROUP, UNAUTHENTICATED_GROUP, UserInfo};

/// `system:nodes`, the group of every node.
pub const NODES_GROUP: &str = "system:nodes";
/// `system:masters`, which constrained impersonation never grants.
const MASTERS_GROUP: &str = "system:masters";
/// The extra of a node-bound service-account token naming its node.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// The requester's extra as the associated-node checks present it.
const ASSOCIATED_NODE_KEYS_EXTRA: &str = "authentication.kubernetes.io/associated-node-keys";
/// From this many groups or extra values, a constrained mode first asks
/// for all of them at once (`*`).
const MANY_CHECKS: usize = 4;

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
pub enum Refusal<E> {
    /// The apiserver's answer (`400` or `403`).
    Status(Box<Status>),
    /// A check could not be made.
    Error(E),
}

/// One authorization check impersonation makes, for the requester.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// The request itself, with its verb replaced by
    /// `impersonate-on:<mode>:<verb>` and its user by `user`.
    On { user: UserInfo, verb: String },
    /// A check on what is impersonated (a user, node, service account,
    /// group, uid or extra value), with verb `impersonate` or
    /// `impersonate:<mode>`, API version v1.
    Target {
        user: UserInfo,
        verb: String,
        group: String,
        resource: String,
        subresource: String,
        namespace: String,
        name: String,
    },
}

/// The authorizer impersonation asks.
pub trait Checker {
    /// Why a check could not be made.
    type Error;
    /// Whether `check` is allowed: `Ok(Err(status))` is the apiserver's
    /// `403` for it (`responsewriters.ForbiddenStatusError` with the
    /// authorizer's reason).
    fn allowed(
        &self,
        check: &Check,
    ) -> impl Future<Output = Result<Result<(), Status>, Self::Error>> + Send;
    /// The apiserver's `403` for `check` with `reason`.
    fn forbidden(&self, check: &Check, reason: &str) -> Status;
}

const EXTRA_PREFIX: &str = "impersonate-extra-";

/// The impersonation a request asks for, if any, read as `filter` reads
/// it.
///
/// # Errors
/// The apiserver's `400` when groups, extras or a uid are asked for without
/// a user. (kube-apiserver 1.34's legacy filter answers that `500`, in
/// plain text, a bug 1.35 fixed to this `400`: the proxy answers 1.35's.)
pub fn requested(headers: &HeaderMap, filter: Filter) -> Result<Option<Requested>, Box<Status>> {
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
        let message = match filter {
            Filter::Constrained => format!(
                "requested {} without impersonating a user name",
                go_default_info(&user, uid.as_deref().unwrap_or(""), &groups, &extra)
            ),
            Filter::Legacy => format!(
                "requested {} without impersonating a user",
                go_object_references(&groups, &extra, uid.as_deref())
            ),
        };
        return Err(Box::new(Status::bad_request(message)));
    }
    Ok(Some(Requested {
        user,
        uid,
        groups,
        extra,
    }))
}

/// Go's `%v` of the legacy filter's `[]v1.ObjectReference` for what is
/// asked besides a user (`filters/impersonation.go`
/// `buildImpersonationRequests`): groups, extra values, the uid, each
/// `{Kind Namespace Name UID APIVersion ResourceVersion FieldPath}`.
fn go_object_references(
    groups: &[String],
    extra: &BTreeMap<String, Vec<String>>,
    uid: Option<&str>,
) -> String {
    let reference = |kind: &str, name: &str, api_version: &str, field_path: &str| {
        format!("{{{kind}  {name}  {api_version}  {field_path}}}")
    };
    let mut refs: Vec<String> = groups
        .iter()
        .map(|g| reference("Group", g, "", ""))
        .collect();
    for (key, values) in extra {
        for v in values {
            refs.push(reference("UserExtra", v, "authentication.k8s.io/v1", key));
        }
    }
    if let Some(uid) = uid {
        refs.push(reference("UID", uid, "authentication.k8s.io/v1", ""));
    }
    format!("[{}]", refs.join(" "))
}

/// Go's `%#v` of a `*user.DefaultInfo`.
fn go_default_info(
    name: &str,
    uid: &str,
    groups: &[String],
    extra: &BTreeMap<String, Vec<String>>,
) -> String {
    let strings = |v: &[String]| {
        let items: Vec<String> = v.iter().map(|s| quote(s)).collect();
        format!("[]string{{{}}}", items.join(", "))
    };
    let groups = if groups.is_empty() {
        "[]string(nil)".to_string()
    } else {
        strings(groups)
    };
    let extra = if extra.is_empty() {
        "map[string][]string(nil)".to_string()
    } else {
        let items: Vec<String> = extra
            .iter()
            .map(|(k, v)| format!("{}:{}", quote(k), strings(v)))
            .collect();
        format!("map[string][]string{{{}}}", items.join(", "))
    };
    format!(
        "&user.DefaultInfo{{Name:{}, UID:{}, Groups:{groups}, Extra:{extra}}}",
        quote(name),
        quote(uid)
    )
}

/// Which impersonation filter the apiserver runs
/// (`staging/src/k8s.io/apiserver/pkg/server/config.go`): the constrained
/// one with the `ConstrainedImpersonation` feature (beta and on from
/// 1.36, alpha and off in 1.35), else the legacy one (1.34 and older).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `WithConstrainedImpersonation`: every mode, legacy last.
    Constrained,
    /// `WithImpersonation`: legacy impersonation only.
    Legacy,
}

/// The mode that last succeeded, by requester name (the apiserver's
/// `modeIndexCache`).
#[derive(Debug, Clone)]
pub struct LastModes(moka::sync::Cache<String, usize>);

impl Default for LastModes {
    fn default() -> Self {
        LastModes(moka::sync::Cache::new(10_000))
    }
}

/// A mode of impersonation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    AssociatedNode,
    ArbitraryNode,
    ServiceAccount,
    UserInfo,
    Legacy,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::AssociatedNode,
        Mode::ArbitraryNode,
        Mode::ServiceAccount,
        Mode::UserInfo,
        Mode::Legacy,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::AssociatedNode => "associated-node",
            Mode::ArbitraryNode => "arbitrary-node",
            Mode::ServiceAccount => "serviceaccount",
            Mode::UserInfo => "user-info",
            Mode::Legacy => "legacy",
        }
    }

    fn constrained(self) -> bool {
        self != Mode::Legacy
    }

    /// The verb of the checks on what is impersonated.
    fn verb(self) -> String {
        match self {
            Mode::Legacy => "impersonate".to_string(),
            m => format!("impersonate:{}", m.name()),
        }
    }

    /// Whether this mode applies to what `requester` asks for.
    fn applies(self, requester: &UserInfo, req: &Requested) -> bool {
        let only_name = req.uid.is_none() && req.groups.is_empty() && req.extra.is_empty();
        match self {
            Mode::AssociatedNode => {
                only_name
                    && node_name(&req.user).is_some_and(|n| {
                        service_account(&requester.name).is_some()
                            && requester
                                .extra
                                .get(NODE_NAME_EXTRA)
                                .is_some_and(|v| v.len() == 1 && v[0] == n)
                    })
            }
            Mode::ArbitraryNode => only_name && node_name(&req.user).is_some(),
            Mode::ServiceAccount => only_name && service_account(&req.user).is_some(),
            Mode::UserInfo => {
                node_name(&req.user).is_none() && service_account(&req.user).is_none()
            }
            Mode::Legacy => true,
        }
    }
}

/// An impersonation check by `requester`.
fn check(requester: &UserInfo, verb: &str, group: &str, resource: &str, name: &str) -> Check {
    Check::Target {
        user: requester.clone(),
        verb: verb.to_string(),
        group: group.into(),
        resource: resource.into(),
        subresource: String::new(),
        namespace: String::new(),
        name: name.into(),
    }
}

/// Allowed, or the apiserver's `403` for `check`.
async fn allow<C: Checker>(checker: &C, check: &Check) -> Result<(), Refusal<C::Error>> {
    match checker.allowed(check).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(status)) => Err(Refusal::Status(Box::new(status))),
        Err(e) => Err(Refusal::Error(e)),
    }
}

/// The apiserver's `403` for `check` with `reason`.
fn deny<C: Checker>(checker: &C, check: &Check, reason: &str) -> Refusal<C::Error> {
    Refusal::Status(Box::new(checker.forbidden(check, reason)))
}

/// Sets a field of a [`Check::Target`].
fn target(check: &mut Check) -> Option<(&mut String, &mut String, &mut String, &mut String)> {
    match check {
        Check::Target {
            resource,
            subresource,
            namespace,
            name,
            ..
        } => Some((resource, subresource, namespace, name)),
        Check::On { .. } => None,
    }
}

/// Authorizes `requester`, whose request has verb `verb`, to act as
/// `req`, and returns the user the request proceeds as.
///
/// # Errors
/// [`Refusal::Status`] with the apiserver's `403` (the first mode's
/// denial), or [`Refusal::Error`] when a check could not be made.
pub async fn impersonate<C: Checker>(
    checker: &C,
    filter: Filter,
    last_modes: &LastModes,
    requester: &UserInfo,
    req: &Requested,
    verb: &str,
) -> Result<UserInfo, Refusal<C::Error>> {
    if filter == Filter::Legacy {
        return try_mode(checker, Mode::Legacy, requester, req, verb).await;
    }
    let mut first: Option<Refusal<C::Error>> = None;
    let last = last_modes.0.get(&requester.name);
    let order = last
        .into_iter()
        .chain((0..Mode::ALL.len()).filter(|i| Some(*i) != last));
    for i in order {
        let mode = Mode::ALL[i];
        if !mode.applies(requester, req) {
            continue;
        }
        match try_mode(checker, mode, requester, req, verb).await {
            Ok(user) => {
                last_modes.0.insert(requester.name.clone(), i);
                return Ok(user);
            }
            Err(f) => {
                first.get_or_insert(f);
            }
        }
    }
    // Legacy always applies, so there is a failure here.
    Err(first.unwrap_or_else(|| {
        Refusal::Status(Box::new(Status::new(
            http::StatusCode::FORBIDDEN,
            "Forbidden",
            "all impersonation modes failed",
        )))
    }))
}

async fn try_mode<C: Checker>(
    checker: &C,
    mode: Mode,
    requester: &UserInfo,
    req: &Requested,
    verb: &str,
) -> Result<UserInfo, Refusal<C::Error>> {
    // The associated-node checks see only the keys of the requester's
    // extra, so one decision holds for every node.
    let requester = if mode == Mode::AssociatedNode {
        let mut r = requester.clone();
        let keys: Vec<String> = r.extra.keys().cloned().collect();
        r.extra = BTreeMap::from([(ASSOCIATED_NODE_KEYS_EXTRA.to_string(), keys)]);
        r
    } else {
        requester.clone()
    };
    if mode.constrained() {
        let on = Check::On {
            user: requester.clone(),
            verb: format!("impersonate-on:{}:{verb}", mode.name()),
        };
        allow(checker, &on).await?;
    }
    let verb = mode.verb();
    let names_group = if mode.constrained() {
        "authentication.k8s.io"
    } else {
        ""
    };
    let mut groups = req.groups.clone();

    // The user name.
    let mut name_check = check(&requester, &verb, names_group, "users", &req.user);
    if mode.constrained()
        && let Some(node) = node_name(&req.user)
    {
        if let Some((resource, _, _, name)) = target(&mut name_check) {
            *resource = "nodes".into();
            *name = if mode == Mode::AssociatedNode {
                "*".into()
            } else {
                node.into()
            };
        }
        if !req.groups.is_empty() {
            let reason = format!(
                "when impersonating a node, cannot impersonate groups {}",
                go_quoted_list(&req.groups)
            );
            return Err(deny(checker, &name_check, &reason));
        }
        groups = vec![NODES_GROUP.to_string()];
    }
    if let Some((ns, sa)) = service_account(&req.user) {
        if let Some((resource, _, namespace, name)) = target(&mut name_check) {
            *resource = "serviceaccounts".into();
            *namespace = ns.into();
            *name = sa.into();
        }
        if mode.constrained() && !req.groups.is_empty() {
            let reason = format!(
                "when impersonating a service account, cannot impersonate groups {}",
                go_quoted_list(&req.groups)
            );
            return Err(deny(checker, &name_check, &reason));
        }
        if req.groups.is_empty() {
            groups = vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{ns}"),
            ];
        }
    }
    allow(checker, &name_check).await?;

    // The uid.
    if let Some(uid) = &req.uid {
        allow(
            checker,
            &check(&requester, &verb, "authentication.k8s.io", "uids", uid),
        )
        .await?;
    }

    // The groups.
    if !req.groups.is_empty() {
        let mut g = check(&requester, &verb, names_group, "groups", "");
        let set_name = |c: &mut Check, v: &str| {
            if let Some((_, _, _, name)) = target(c) {
                *name = v.to_string();
            }
        };
        let mut all = false;
        if mode.constrained() {
            if req.groups.iter().any(String::is_empty) {
                let reason = "impersonating the empty string group is not allowed";
                return Err(deny(checker, &g, reason));
            }
            if req.groups.iter().any(|x| x == MASTERS_GROUP) {
                set_name(&mut g, MASTERS_GROUP);
                let reason = "impersonating the system:masters group is not allowed";
                return Err(deny(checker, &g, reason));
            }
            if req.groups.len() >= MANY_CHECKS {
                set_name(&mut g, "*");
                all = allow(checker, &g).await.is_ok();
            }
        }
        if !all {
            for group in &req.groups {
                set_name(&mut g, group);
                allow(checker, &g).await?;
            }
        }
    }

    // The extra.
    if !req.extra.is_empty() {
        let mut e = check(&requester, &verb, "authentication.k8s.io", "userextras", "");
        let set = |c: &mut Check, sub: &str, v: &str| {
            if let Some((_, subresource, _, name)) = target(c) {
                *subresource = sub.to_string();
                *name = v.to_string();
            }
        };
        let mut all = false;
        if mode.constrained() {
            if let Err(problem) = validate_extra(&req.extra) {
                return Err(deny(checker, &e, &problem));
            }
            let values: usize = req.extra.values().map(Vec::len).sum();
            if req.extra.len() >= MANY_CHECKS || values >= MANY_CHECKS {
                set(&mut e, "*", "*");
                all = allow(checker, &e).await.is_ok();
            }
        }
        if !all {
            for (key, values) in &req.extra {
                for v in values {
                    set(&mut e, key, v);
                    allow(checker, &e).await?;
                }
            }
        }
    }

    if req.user == ANONYMOUS_USER {
        if !groups.iter().any(|g| g == UNAUTHENTICATED_GROUP) {
            groups.push(UNAUTHENTICATED_GROUP.to_string());
        }
    } else if !groups.iter().any(|g| g == UNAUTHENTICATED_GROUP)
        && !groups.iter().any(|g| g == AUTHENTICATED_GROUP)
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

/// Go's `%q` of a `[]string`: `["a" "b"]`.
fn go_quoted_list(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| quote(s)).collect();
    format!("[{}]", items.join(" "))
}

/// `validateExtra`: keys non-empty, domain-prefixed paths, lowercase;
/// values present and non-empty.
fn validate_extra(extra: &BTreeMap<String, Vec<String>>) -> Result<(), String> {
    for (key, values) in extra {
        if key.is_empty() {
            return Err("impersonating the empty string key in extra is not allowed".into());
        }
        if let Err(problem) = domain_prefixed_path(key) {
            return Err(format!(
                "impersonating an invalid key in extra is not allowed: extra.key: Invalid value: {}: {problem}",
                quote(key)
            ));
        }
        if *key != key.to_lowercase() {
            return Err(format!(
                "impersonating a non-lowercase key in extra is not allowed: {}",
                quote(key)
            ));
        }
        if values.is_empty() {
            return Err("impersonating empty values in extra is not allowed".into());
        }
        if values.iter().any(String::is_empty) {
            return Err("impersonating the empty string value in extra is not allowed".into());
        }
    }
    Ok(())
}

/// `IsDomainPrefixedPath`: `<DNS-1123 subdomain>/<path>`.
fn domain_prefixed_path(key: &str) -> Result<(), String> {
    let Some((host, path)) = key.split_once('/') else {
        return Err("must be a domain-prefixed path (such as \"acme.io/foo\")".into());
    };
    if path.is_empty() {
        return Err("must be a domain-prefixed path (such as \"acme.io/foo\")".into());
    }
    match crate::selector::is_dns1123_subdomain(host).first() {
        Some(problem) => Err(problem.clone()),
        None => Ok(()),
    }
}

/// The node name of a `system:node:<name>` user.
pub fn node_name(user: &str) -> Option<&str> {
    let name = user.strip_prefix("system:node:")?;
    crate::selector::is_dns1123_subdomain(name)
        .is_empty()
        .then_some(name)
}

/// `system:serviceaccount:<ns>:<name>` split into namespace and name.
pub fn service_account(user: &str) -> Option<(&str, &str)> {
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
        assert_eq!(requested(&h, Filter::Constrained).unwrap(), None);
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
        let r = requested(&h, Filter::Constrained).unwrap().unwrap();
        assert_eq!(r.user, "alice");
        assert_eq!(r.groups, vec!["dev", "ops"]);
        assert_eq!(r.extra["example.com/scope"], vec!["a", "b"]);
        let mut g = HeaderMap::new();
        g.insert("impersonate-group", HeaderValue::from_static("dev"));
        g.insert("impersonate-extra-k", HeaderValue::from_static("v"));
        let s = requested(&g, Filter::Constrained).unwrap_err();
        assert_eq!(s.code, 400);
        assert_eq!(
            s.message,
            r#"requested &user.DefaultInfo{Name:"", UID:"", Groups:[]string{"dev"}, Extra:map[string][]string{"k":[]string{"v"}}} without impersonating a user name"#
        );
        // kube-apiserver v1.35.6's legacy filter.
        g.insert("impersonate-uid", HeaderValue::from_static("u-1"));
        let s = requested(&g, Filter::Legacy).unwrap_err();
        assert_eq!(s.code, 400);
        assert_eq!(
            s.message,
            "requested [{Group  dev    } {UserExtra  v  authentication.k8s.io/v1  k} {UID  u-1  authentication.k8s.io/v1  }] without impersonating a user"
        );
    }

    #[test]
    fn modes_apply_to_what_is_asked() {
        let sa = {
            let mut u = UserInfo::new("system:serviceaccount:kube-system:p", &[]);
            u.extra.insert(NODE_NAME_EXTRA.into(), vec!["n1".into()]);
            u
        };
        let ask = |user: &str| Requested {
            user: user.into(),
            ..Requested::default()
        };
        let modes = |r: &UserInfo, q: &Requested| -> Vec<&str> {
            Mode::ALL
                .iter()
                .filter(|m| m.applies(r, q))
                .map(|m| m.name())
                .collect()
        };
        assert_eq!(
            modes(&sa, &ask("system:node:n1")),
            ["associated-node", "arbitrary-node", "legacy"]
        );
        assert_eq!(
            modes(&sa, &ask("system:node:n2")),
            ["arbitrary-node", "legacy"]
        );
        assert_eq!(
            modes(&sa, &ask("system:serviceaccount:a:b")),
            ["serviceaccount", "legacy"]
        );
        assert_eq!(modes(&sa, &ask("alice")), ["user-info", "legacy"]);
        let mut with_group = ask("system:node:n1");
        with_group.groups.push("system:nodes".into());
        assert_eq!(modes(&sa, &with_group), ["legacy"]);
    }

    #[test]
    fn extra_validation() {
        let one = |k: &str, v: &[&str]| {
            BTreeMap::from([(k.to_string(), v.iter().map(|s| s.to_string()).collect())])
        };
        assert!(validate_extra(&one("example.com/scope", &["a"])).is_ok());
        assert!(validate_extra(&one("scope", &["a"])).is_err());
        assert!(validate_extra(&one("example.com/Scope", &["a"])).is_err());
        assert!(validate_extra(&one("example.com/scope", &[""])).is_err());
        assert!(validate_extra(&one("example.com/scope", &[])).is_err());
    }

    #[test]
    fn names() {
        assert_eq!(
            service_account("system:serviceaccount:ns:sa"),
            Some(("ns", "sa"))
        );
        assert_eq!(service_account("system:serviceaccount:ns"), None);
        assert_eq!(node_name("system:node:n-1"), Some("n-1"));
        assert_eq!(node_name("system:node:N_1"), None);
        assert_eq!(node_name("alice"), None);
    }
}
