//! What a request is, in the apiserver's terms: verb, API group and
//! version, namespace, resource, subresource and name.
//!
//! Mirrors `RequestInfoFactory.NewRequestInfo` in
//! `staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`,
//! including its quirks: a list whose field selector pins `metadata.name`
//! carries that name (that is how the Node authorizer lets kubelet watch one
//! secret), the legacy `/watch/` prefix, and `namespaces/{ns}/status`.
//!
//! The resolver reads Go's `URL.Path`: the request path percent-decoded
//! ([`crate::url::decode_path`]), so `/api/v1/nodes/node%2d1` names node
//! `node-1` and `%2F` splits segments (`pods/a%2Fstatus` is the `status`
//! subresource of pod `a`). The router (go-restful, behind the
//! apiserver's `director`) reads the same decoded path, so every field here
//! is what the handlers see, except where the router refuses a path the
//! resolver accepts; [`RequestInfo::routable`] tells them apart. Query
//! parameters are read as Go's `URL.Query()` ([`crate::url::query_pairs`]).

use http::Method;

use crate::url;

/// The parsed request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestInfo {
    /// `true` for `/api/...` and `/apis/...` resource paths.
    pub is_resource_request: bool,
    /// The request path, percent-decoded as Go's `URL.Path` (bytes that are
    /// not UTF-8 replaced by U+FFFD); the raw path when an escape is
    /// malformed.
    pub path: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`, `proxy`; for non-resource requests the lowercase
    /// HTTP method.
    pub verb: String,
    /// `api` or `apis`.
    pub api_prefix: String,
    /// API group, empty for the core group.
    pub api_group: String,
    /// API version.
    pub api_version: String,
    /// Namespace, empty when the request is cluster-scoped or cross-namespace.
    pub namespace: String,
    /// Resource (plural, lowercase).
    pub resource: String,
    /// Subresource (`status`, `log`, `exec`...), empty if none.
    pub subresource: String,
    /// Object name, empty if none.
    pub name: String,
    /// Whether the verb came from the legacy `/watch/` path prefix.
    pub legacy_watch_path: bool,
    /// The path has a malformed percent-escape (`%zz`, `%2`): Go's HTTP
    /// server refuses the request line (`400 Bad Request`, plain text)
    /// before any handler runs.
    pub malformed_path: bool,
    /// A resource request that kube-apiserver routes to the handler of
    /// exactly these fields: the decoded path is UTF-8, starts with
    /// `/api/` or `/apis/` (the `director` matches web services by that
    /// prefix; `//api/v1/pods` is `404 page not found` although the
    /// resolver trims the slashes) and has no empty segment but trailing
    /// ones (go-restful matches `namespaces//pods` to no route, or to one
    /// with an empty parameter; trailing slashes it trims, as the
    /// resolver does). Only such requests may be answered from a cache.
    pub routable: bool,
}

const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

// === impl RequestInfo ===

impl RequestInfo {
    /// Parses a request line: `path` as received (percent-encoded), `query`
    /// the raw query string (no `?`).
    pub fn parse(method: &Method, path: &str, query: Option<&str>) -> RequestInfo {
        let Some(decoded) = url::decode_path(path) else {
            return RequestInfo {
                path: path.to_string(),
                verb: method.as_str().to_ascii_lowercase(),
                malformed_path: true,
                ..RequestInfo::default()
            };
        };
        let (path, utf8) = match std::str::from_utf8(&decoded) {
            Ok(p) => (p.to_string(), true),
            Err(_) => (String::from_utf8_lossy(&decoded).into_owned(), false),
        };
        let mut info = RequestInfo::parse_decoded(method, &path, query);
        info.routable = utf8 && info.is_resource_request && routes_as_parsed(&path, &info);
        info
    }

    /// `NewRequestInfo` on an already decoded path.
    fn parse_decoded(method: &Method, path: &str, query: Option<&str>) -> RequestInfo {
        let mut info = RequestInfo {
            path: path.to_string(),
            verb: method.as_str().to_ascii_lowercase(),
            ..RequestInfo::default()
        };
        let trimmed = path.trim_matches('/');
        let all: Vec<&str> = if trimmed.is_empty() {
            Vec::new()
        } else {
            trimmed.split('/').collect()
        };
        // A resource request is at least /api/{version}/{resource} or
        // /apis/{group}/{version}/{resource}; anything shorter is
        // discovery.
        let [prefix, rest @ ..] = all.as_slice() else {
            return info;
        };
        if all.len() < 3 || (*prefix != "api" && *prefix != "apis") {
            return info;
        }
        info.api_prefix = prefix.to_string();
        let mut parts = rest;
        if *prefix == "apis" {
            let [group, rest @ ..] = parts else {
                return info;
            };
            if parts.len() < 3 {
                return info;
            }
            info.api_group = group.to_string();
            parts = rest;
        }
        let [version, rest @ ..] = parts else {
            return info;
        };
        info.api_version = version.to_string();
        parts = rest;
        let Some(first) = parts.first() else {
            return info;
        };
        info.is_resource_request = true;
        info.verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_string();
        if *first == "watch" || *first == "proxy" {
            if parts.len() < 2 {
                // The apiserver fails the request (500, "unable to
                // determine kind and namespace"); treat it as
                // non-resource so it passes through and upstream answers.
                info.is_resource_request = false;
                info.verb = method.as_str().to_ascii_lowercase();
                return info;
            }
            info.verb = first.to_string();
            info.legacy_watch_path = *first == "watch";
            parts = &parts[1..];
        }
        if parts.first() == Some(&"namespaces") && parts.len() > 1 {
            info.namespace = parts[1].to_string();
            if parts.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&parts[2]) {
                parts = &parts[2..];
            }
        }
        if parts.len() >= 3 && info.verb != "proxy" {
            info.subresource = parts[2].to_string();
        }
        if parts.len() >= 2 {
            info.name = parts[1].to_string();
        }
        if let Some(resource) = parts.first() {
            info.resource = resource.to_string();
        }
        if info.name.is_empty() && info.verb == "get" {
            let (watch, name) = list_verb_hints(query);
            info.verb = if watch { "watch" } else { "list" }.to_string();
            if let Some(name) = name {
                info.name = name;
            }
        }
        if info.name.is_empty() && info.verb == "delete" {
            info.verb = "deletecollection".to_string();
        }
        info
    }

    /// Whether the verb reads (`get`, `list` or `watch`).
    pub fn is_read(&self) -> bool {
        matches!(self.verb.as_str(), "get" | "list" | "watch")
    }
}

/// See [`RequestInfo::routable`].
fn routes_as_parsed(path: &str, info: &RequestInfo) -> bool {
    let prefix_ok = path
        .strip_prefix('/')
        .and_then(|p| p.strip_prefix(info.api_prefix.as_str()))
        .is_some_and(|p| p.starts_with('/'));
    prefix_ok && !path.trim_end_matches('/').contains("//")
}

/// For a collection GET: whether `watch` is set, and the name a
/// `metadata.name=` field selector pins (only if it is a valid path
/// segment). As `NewRequestInfo`: the list options are decoded from the
/// query; when that fails (a malformed label or field selector) only
/// `watch` is read, and no name.
fn list_verb_hints(query: Option<&str>) -> (bool, Option<String>) {
    let pairs = url::query_pairs(query.unwrap_or(""));
    let first = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    // Like the apiserver: only the first value counts.
    let watch =
        first("watch").is_some_and(|v| !matches!(v.to_ascii_lowercase().as_str(), "false" | "0"));
    if first("labelSelector").is_some_and(|l| crate::selector::LabelSelector::parse(l).is_err()) {
        return (watch, None);
    }
    let name = match first("fieldSelector").map(crate::selector::FieldSelector::parse) {
        None => None,
        Some(Err(_)) => return (watch, None),
        Some(Ok(s)) => s
            .requires_exact_match("metadata.name")
            .map(str::to_string)
            .filter(|n| valid_path_segment_name(n)),
    };
    (watch, name)
}

/// `path.IsValidPathSegmentName`: not `.` or `..`, no `/` or `%`.
pub fn valid_path_segment_name(name: &str) -> bool {
    path_segment_name_errors(name).is_empty()
}

/// `path.IsValidPathSegmentName`'s messages (joined with `;` by callers):
/// `may not be '.'`, `may not be '..'`, `may not contain '/'`,
/// `may not contain '%'`
/// (`staging/src/k8s.io/apimachinery/pkg/api/validation/path/name.go`).
pub fn path_segment_name_errors(name: &str) -> Vec<String> {
    for illegal in [".", ".."] {
        if name == illegal {
            return vec![format!("may not be '{illegal}'")];
        }
    }
    ["/", "%"]
        .iter()
        .filter(|c| name.contains(*c))
        .map(|c| format!("may not contain '{c}'"))
        .collect()
}

/// `wsstream.IsWebSocketRequest`: the first `Upgrade` header is
/// `websocket` (any case) and some `Connection` header contains `upgrade`
/// (any case, as a substring).
pub fn is_websocket_request(headers: &http::HeaderMap) -> bool {
    let upgrade = headers
        .get(http::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    upgrade
        && headers
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|v| contains_upgrade(v.as_bytes()))
}

/// Whether a `Connection` header value contains `upgrade` (any case).
pub fn contains_upgrade(v: &[u8]) -> bool {
    v.to_ascii_lowercase()
        .windows(b"upgrade".len())
        .any(|w| w == b"upgrade")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str, query: Option<&str>) -> RequestInfo {
        RequestInfo::parse(&Method::GET, path, query)
    }

    #[test]
    fn namespaced_list_and_get() {
        let i = get("/api/v1/namespaces/ns/configmaps", None);
        assert!(i.is_resource_request);
        assert_eq!(
            (
                i.verb.as_str(),
                i.api_group.as_str(),
                i.api_version.as_str()
            ),
            ("list", "", "v1")
        );
        assert_eq!(
            (i.namespace.as_str(), i.resource.as_str()),
            ("ns", "configmaps")
        );
        let i = get("/api/v1/namespaces/ns/configmaps/cm-0", None);
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("get", "cm-0"));
        let i = get("/apis/apps/v1/namespaces/ns/deployments/d/status", None);
        assert_eq!(
            (
                i.api_group.as_str(),
                i.resource.as_str(),
                i.name.as_str(),
                i.subresource.as_str()
            ),
            ("apps", "deployments", "d", "status")
        );
    }

    #[test]
    fn watch_forms() {
        let i = get("/api/v1/pods", Some("watch=1"));
        assert_eq!(i.verb, "watch");
        let i = get("/api/v1/pods", Some("watch=false"));
        assert_eq!(i.verb, "list");
        let i = get("/api/v1/watch/namespaces/ns/configmaps", None);
        assert_eq!(
            (i.verb.as_str(), i.namespace.as_str(), i.resource.as_str()),
            ("watch", "ns", "configmaps")
        );
        assert!(i.legacy_watch_path);
        let i = get("/api/v1/watch/namespaces/ns/configmaps/x", None);
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("watch", "x"));
    }

    #[test]
    fn name_from_field_selector() {
        let i = get(
            "/api/v1/namespaces/ns/secrets",
            Some("watch=1&fieldSelector=metadata.name%3Ds1"),
        );
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("watch", "s1"));
        let i = get(
            "/api/v1/namespaces/ns/secrets",
            Some("fieldSelector=metadata.name!%3Ds1"),
        );
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("list", ""));
    }

    #[test]
    fn namespaces_themselves() {
        let i = get("/api/v1/namespaces/ns", None);
        assert_eq!(
            (
                i.verb.as_str(),
                i.resource.as_str(),
                i.name.as_str(),
                i.namespace.as_str()
            ),
            ("get", "namespaces", "ns", "ns")
        );
        let i = get("/api/v1/namespaces", None);
        assert_eq!(
            (i.verb.as_str(), i.resource.as_str()),
            ("list", "namespaces")
        );
        let i = RequestInfo::parse(&Method::PUT, "/api/v1/namespaces/ns/finalize", None);
        assert_eq!(
            (i.verb.as_str(), i.resource.as_str(), i.subresource.as_str()),
            ("update", "namespaces", "finalize")
        );
    }

    #[test]
    fn non_resource() {
        for p in [
            "/",
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps/v1",
            "/version",
            "/healthz",
            "/openapi/v2",
        ] {
            assert!(!get(p, None).is_resource_request, "{p}");
        }
        let i = RequestInfo::parse(&Method::DELETE, "/api/v1/namespaces/ns/pods", None);
        assert_eq!(i.verb, "deletecollection");
    }

    #[test]
    fn paths_are_decoded_before_parsing() {
        let i = get(
            "/api/v1/namespaces/anchor-load/pods/load%2D0001",
            Some("resourceVersion=0"),
        );
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("get", "load-0001"));
        assert!(i.routable);
        let i = get("/api/v1/namespaces/%61nchor-load/pods", Some("watch=1"));
        assert_eq!(
            (i.verb.as_str(), i.namespace.as_str()),
            ("watch", "anchor-load")
        );
        let i = get("/api/v1/nodes/node%2d1", None);
        assert_eq!((i.resource.as_str(), i.name.as_str()), ("nodes", "node-1"));
        let i = get("/%61pi/v1/namespaces%2Fns%2Fpods", None);
        assert_eq!(
            (i.verb.as_str(), i.namespace.as_str(), i.resource.as_str()),
            ("list", "ns", "pods")
        );
        assert!(i.routable);
        // %2F splits segments: a subresource.
        let i = get("/api/v1/namespaces/ns/pods/p%2Fstatus", None);
        assert_eq!((i.name.as_str(), i.subresource.as_str()), ("p", "status"));
        // Decoded into what a name may not hold.
        let i = get("/api/v1/namespaces/ns/pods/a%25b", None);
        assert_eq!(i.name, "a%b");
        assert_eq!(
            path_segment_name_errors(&i.name),
            vec!["may not contain '%'".to_string()]
        );
        assert_eq!(
            path_segment_name_errors(".."),
            vec!["may not be '..'".to_string()]
        );
        // `+` is not a space in a path.
        assert_eq!(get("/api/v1/nodes/a+b", None).name, "a+b");
        // The field selector is read from the decoded query.
        let i = get("/api/v1/nodes", Some("fieldSelector=metadata.name%3Dn%2D1"));
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("list", "n-1"));
        let i = get(
            "/api/v1/nodes",
            Some("watch=1&labelSelector=a%20in&fieldSelector=metadata.name%3Dn"),
        );
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("watch", ""));
        let i = get("/api/v1/nodes", Some("watch=1;x"));
        assert_eq!(i.verb, "list");
    }

    #[test]
    fn malformed_and_unroutable_paths() {
        for p in ["/api/v1/nodes/n%zz", "/api/v1/nodes/n%2", "/api/v1/%"] {
            let i = get(p, None);
            assert!(
                i.malformed_path && !i.is_resource_request && !i.routable,
                "{p}"
            );
            assert_eq!(i.path, p);
        }
        for p in [
            "//api/v1/pods",
            "/api/v1//pods",
            "/api/v1/namespaces//pods",
            "/api/v1/namespaces/ns/pods//p",
            "/api%2F%2Fv1/pods",
            "/api/v1/nodes/%FF",
        ] {
            let i = get(p, None);
            assert!(i.is_resource_request && !i.routable, "{p}");
        }
        for p in [
            "/api/v1/pods/",
            "/api/v1/namespaces/ns/pods/p//",
            "/apis/apps/v1/deployments",
        ] {
            assert!(get(p, None).routable, "{p}");
        }
        assert!(!get("/healthz", None).routable);
    }
}
