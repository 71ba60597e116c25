//! What a request is, in the apiserver's terms: verb, API group and
//! version, namespace, resource, subresource and name.
//!
//! Mirrors `RequestInfoFactory.NewRequestInfo` in
//! `staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`,
//! including its quirks: a list whose field selector pins `metadata.name`
//! carries that name (that is how the Node authorizer lets kubelet watch one
//! secret), the legacy `/watch/` prefix, and `namespaces/{ns}/status`.

use http::Method;

/// The parsed request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestInfo {
    /// `true` for `/api/...` and `/apis/...` resource paths.
    pub is_resource_request: bool,
    /// The request path.
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
}

const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

// === impl RequestInfo ===

impl RequestInfo {
    /// Parses a request line. `query` is the raw query string (no `?`).
    pub fn parse(method: &Method, path: &str, query: Option<&str>) -> RequestInfo {
        let mut info = RequestInfo {
            path: path.to_string(),
            verb: method.as_str().to_ascii_lowercase(),
            ..RequestInfo::default()
        };
        let trimmed = path.trim_matches('/');
        let mut parts: Vec<&str> = if trimmed.is_empty() {
            Vec::new()
        } else {
            trimmed.split('/').collect()
        };
        if parts.len() < 3 {
            // A resource request is at least /api/v1/{resource} or
            // /apis/{group}/{version}; anything shorter is discovery.
            return info;
        }
        let prefix = parts[0];
        if prefix != "api" && prefix != "apis" {
            return info;
        }
        info.api_prefix = prefix.to_string();
        parts.remove(0);
        if prefix == "apis" {
            info.api_group = parts[0].to_string();
            parts.remove(0);
        }
        info.api_version = parts[0].to_string();
        parts.remove(0);
        if parts.is_empty() {
            // /apis/{group}/{version}: discovery.
            return info;
        }
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
        if parts[0] == "watch" || parts[0] == "proxy" {
            if parts.len() < 2 {
                // The apiserver rejects this path; treat it as non-resource so
                // it passes through and upstream answers.
                info.is_resource_request = false;
                info.verb = method.as_str().to_ascii_lowercase();
                return info;
            }
            info.verb = parts[0].to_string();
            info.legacy_watch_path = parts[0] == "watch";
            parts.remove(0);
        }
        if parts[0] == "namespaces" && parts.len() > 1 {
            info.namespace = parts[1].to_string();
            if parts.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&parts[2]) {
                parts.drain(0..2);
            }
        }
        if parts.len() >= 3 && info.verb != "proxy" {
            info.subresource = parts[2].to_string();
        }
        if parts.len() >= 2 {
            info.name = parts[1].to_string();
        }
        if !parts.is_empty() {
            info.resource = parts[0].to_string();
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

    /// Whether the request reads (`get`, `list` or `watch`).
    pub fn is_read(&self) -> bool {
        matches!(self.verb.as_str(), "get" | "list" | "watch")
    }
}

/// For a collection GET: whether `watch` is set, and the name a
/// `metadata.name=` field selector pins (only if it is a valid path segment).
fn list_verb_hints(query: Option<&str>) -> (bool, Option<String>) {
    let mut watch = false;
    let mut name = None;
    let mut saw_watch = false;
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            // Like the apiserver: only the first value counts.
            "watch" if !saw_watch => {
                saw_watch = true;
                watch = !matches!(v.to_ascii_lowercase().as_str(), "false" | "0");
            }
            "fieldSelector" if name.is_none() => {
                name = crate::selector::FieldSelector::parse(&v)
                    .ok()
                    .and_then(|s| s.requires_exact_match("metadata.name").map(str::to_string))
                    .filter(|n| valid_path_segment_name(n));
            }
            _ => {}
        }
    }
    (watch, name)
}

/// `path.IsValidPathSegmentName`: not `.` or `..`, no `/` or `%`.
pub fn valid_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains('/') && !name.contains('%')
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
}
