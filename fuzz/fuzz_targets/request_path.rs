//! Request paths decoded as kube-apiserver decodes them (Go's `URL.Path`,
//! then `RequestInfoFactory.NewRequestInfo`), and queries as Go's
//! `URL.Query()` splits them, checked against:
//!
//! - the answers recorded from a real kube-apiserver v1.36.2
//!   (`tests/real/paths.rs`): which request each path is, whether Go's
//!   server refuses it (a malformed escape), whether the apiserver routes
//!   it to the handler of those fields;
//! - a reference decoder (`percent-encoding`): same bytes, and a path is
//!   malformed exactly when some `%` is not followed by two hex digits;
//! - invariants: escaping any byte of a path (`/` included) changes
//!   nothing; a routable path starts with `/api/` or `/apis/` and has no
//!   empty segment but trailing ones; a query without `;` and malformed
//!   escapes splits as `form_urlencoded` splits it.
#![no_main]

use apimachinery::request::RequestInfo;
use apimachinery::url::{decode_path, query_pairs};
use http::Method;
use libfuzzer_sys::fuzz_target;

/// (path as sent, verb, namespace, resource, name, subresource, routable),
/// for a GET with `resourceVersion=0`; `None` where Go's HTTP server
/// answers `400 Bad Request` itself.
type Recorded = (
    &'static str,
    Option<(
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        bool,
    )>,
);

const RECORDED: &[Recorded] = &[
    (
        "/api/v1/namespaces/anchor-load/pods/load%2D0001",
        Some(("get", "anchor-load", "pods", "load-0001", "", true)),
    ),
    (
        "/api/v1/namespaces/%61nchor-load/pods",
        Some(("list", "anchor-load", "pods", "", "", true)),
    ),
    (
        "/api/v1/nodes/node%2d1",
        Some(("get", "", "nodes", "node-1", "", true)),
    ),
    (
        "/%61pi/v1/namespaces%2Fanchor-load%2Fpods",
        Some(("list", "anchor-load", "pods", "", "", true)),
    ),
    (
        "/api/v1/namespaces/ns/pods/load-0001%2Fstatus",
        Some(("get", "ns", "pods", "load-0001", "status", true)),
    ),
    (
        "/api/v1/namespaces/ns/pods/a%2Fb",
        Some(("get", "ns", "pods", "a", "b", true)),
    ),
    (
        "/api/v1/namespaces/ns/pods/a%25b",
        Some(("get", "ns", "pods", "a%b", "", true)),
    ),
    (
        "/api/v1/namespaces/ns/pods/%2E",
        Some(("get", "ns", "pods", ".", "", true)),
    ),
    (
        "/api/v1/namespaces/%2E%2E",
        Some(("get", "..", "namespaces", "..", "", true)),
    ),
    (
        "/api/v1/namespaces/ns/pods/",
        Some(("list", "ns", "pods", "", "", true)),
    ),
    (
        "/api/v1/namespaces/ns/pods/load-0001/",
        Some(("get", "ns", "pods", "load-0001", "", true)),
    ),
    (
        "/api/v1/namespaces/ns/pods/load+0001",
        Some(("get", "ns", "pods", "load+0001", "", true)),
    ),
    (
        "//api/v1/namespaces/ns/pods",
        Some(("list", "ns", "pods", "", "", false)),
    ),
    (
        "/api/v1/namespaces/ns//pods",
        Some(("get", "ns", "", "pods", "", false)),
    ),
    (
        "/api/v1//namespaces/ns/pods",
        Some(("get", "", "", "namespaces", "ns", false)),
    ),
    (
        "/api/v1/namespaces//pods",
        Some(("list", "", "pods", "", "", false)),
    ),
    (
        "/api/v1/namespaces/ns/pods/%FF",
        Some(("get", "ns", "pods", "\u{fffd}", "", false)),
    ),
    ("/api/v1/namespaces/ns/pods/load%zz", None),
    ("/api/v1/namespaces/ns/pods/load%2", None),
];

fn check_recorded() {
    for (path, want) in RECORDED {
        let i = RequestInfo::parse(&Method::GET, path, Some("resourceVersion=0"));
        match want {
            None => assert!(i.malformed_path && !i.routable, "{path}"),
            Some((verb, ns, resource, name, sub, routable)) => {
                let got = (
                    i.verb.as_str(),
                    i.namespace.as_str(),
                    i.resource.as_str(),
                    i.name.as_str(),
                    i.subresource.as_str(),
                    i.routable,
                );
                assert_eq!(
                    got,
                    (*verb, *ns, *resource, *name, *sub, *routable),
                    "{path}"
                );
            }
        }
    }
}

/// Every byte escaped, `/` included.
fn escape_all(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02X}")).collect()
}

fn well_formed(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if i + 2 >= b.len() || !b[i + 1].is_ascii_hexdigit() || !b[i + 2].is_ascii_hexdigit() {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

static RECORDED_CHECKED: std::sync::Once = std::sync::Once::new();

fuzz_target!(|data: &[u8]| {
    RECORDED_CHECKED.call_once(check_recorded);
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let (path, query) = s.split_once('?').unwrap_or((s, ""));

    // Decoding: as the reference decoder, malformed exactly when Go says.
    let decoded = decode_path(path);
    assert_eq!(decoded.is_some(), well_formed(path), "{path:?}");
    if let Some(d) = &decoded {
        let reference: Vec<u8> = percent_encoding::percent_decode_str(path).collect();
        assert_eq!(&d[..], &reference[..], "{path:?}");
    }

    for m in [Method::GET, Method::DELETE, Method::POST] {
        let info = RequestInfo::parse(&m, path, Some(query));
        assert_eq!(info.malformed_path, decoded.is_none());
        let Some(d) = &decoded else {
            assert!(!info.is_resource_request && !info.routable);
            continue;
        };
        // Escaping changes nothing.
        let again = RequestInfo::parse(&m, &escape_all(d), Some(query));
        assert_eq!(info, again, "{path:?}");
        if info.routable {
            let p = &info.path;
            assert!(p.starts_with("/api/") || p.starts_with("/apis/"), "{p:?}");
            assert!(!p.trim_end_matches('/').contains("//"), "{p:?}");
            assert!(info.is_resource_request && std::str::from_utf8(d).is_ok());
        }
    }

    // Queries: as `form_urlencoded` where Go drops nothing.
    let pairs = query_pairs(query);
    let droppable = query.split('&').any(|p| p.contains(';') || !well_formed(p));
    if !droppable {
        let reference: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        assert_eq!(pairs, reference, "{query:?}");
    } else {
        assert!(pairs.len() <= query.split('&').count());
    }
});
