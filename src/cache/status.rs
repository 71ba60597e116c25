//! The operator's view of the caches: `/debug/caches` on the admin port
//! (JSON) and `kube-cache-proxy status` (a table like kubectl's, or `-o
//! json`). Counts, resourceVersions and ages only: never object data,
//! names or credentials, since the admin port is unauthenticated (on
//! loopback).
//!
//! Each figure is also a metric (`docs/metrics.md`); this view puts them
//! side by side for one proxy, with the times the metrics do not carry.

use std::fmt::Write as _;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::resource::ResourceCache;

/// What `/debug/caches` answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub caches: Vec<CacheStatus>,
    /// The upstream servers: the primary, then the fallback if any.
    #[serde(default)]
    pub upstream: Vec<Server>,
    /// The primary's consecutive connect failures (the fallback is used
    /// after 3).
    #[serde(default)]
    pub primary_connect_failures: u32,
    /// What this node's kubelet reads as the `default/kubernetes` Service
    /// (`podNetwork.kubernetesService`), when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_service: Option<KubernetesServiceStatus>,
}

/// The `default/kubernetes` Service as this node's kubelet reads it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesServiceStatus {
    /// `podNetwork.kubernetesService`: `NodeLabel` or `Always`.
    pub mode: String,
    /// Whether kubelet reads it rewritten now.
    pub rewritten: bool,
    /// What it is rewritten to: `podNetwork.listen`.
    pub target: String,
    /// Whether that address is the node's (it is rewritten only then).
    #[serde(default)]
    pub address_on_node: bool,
}

/// One upstream server.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Server {
    pub url: String,
    /// `primary` (`upstream.kubeconfig`) or `fallback`
    /// (`upstream.fallback`).
    pub role: String,
    /// Whether requests and watches go there now.
    pub active: bool,
}

/// The upstream part of [`Status`] from `Upstream::servers`.
pub fn servers(servers: Vec<(String, bool)>) -> Vec<Server> {
    servers
        .into_iter()
        .enumerate()
        .map(|(i, (url, active))| Server {
            url,
            role: if i == 0 { "primary" } else { "fallback" }.into(),
            active,
        })
        .collect()
}

/// One cache.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CacheStatus {
    pub group: String,
    pub version: String,
    pub resource: String,
    /// The upstream field selector the cache is limited to (`""`: the
    /// whole resource), e.g. `spec.nodeName=node-1` on a node.
    pub scope: String,
    /// How the cache reads upstream now: `JSON` or `Protobuf`
    /// (`cache.upstreamEncoding`; back to `JSON` after an object it could
    /// not transcode exactly).
    #[serde(default)]
    pub upstream_encoding: String,
    /// Whether the first list has landed (reads wait or pass through until
    /// then).
    pub synced: bool,
    pub objects: usize,
    /// The newest event or bookmark applied.
    pub resource_version: String,
    /// Bytes of the current objects' JSON, labels and fields
    /// (`kube_cache_proxy_cache_bytes`).
    pub bytes: usize,
    /// Events kept for watches that resume from an older resourceVersion.
    pub history_events: usize,
    /// Watches from resourceVersions at or above this one are served from
    /// the history; older ones pass through (the apiserver replays or
    /// answers `410`).
    pub history_from_resource_version: String,
    /// Watches served from the cache now.
    pub watchers: usize,
    /// Seconds since the cache last changed (an event, a bookmark, a
    /// list): how long a quiet resource has gone without news.
    pub changed_seconds_ago: Option<f64>,
    /// Seconds since the last list (the first, or a relist after `410`, a
    /// restart of the upstream watch that could not resume, or a healing
    /// relist).
    pub listed_seconds_ago: Option<f64>,
    /// The last consistency check's result (`success`, `failure`,
    /// `error`) and its age.
    pub last_check: Option<String>,
    pub checked_seconds_ago: Option<f64>,
    /// Seconds the upstream watch has been down, if it is.
    pub upstream_down_seconds: Option<f64>,
    /// A consistent read's probe found upstream ahead of the cache within
    /// the last second (consistent lists of small scopes pass through).
    pub behind_upstream: bool,
    /// The users with the most watches served from this cache now (at
    /// most [`TOP_WATCHERS`]), most first.
    #[serde(default)]
    pub top_watchers: Vec<Watchers>,
}

/// How many users [`CacheStatus::top_watchers`] lists.
pub const TOP_WATCHERS: usize = 5;

/// One user's watches of a cache.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Watchers {
    pub user: String,
    pub watches: usize,
}

/// The status of `cache` now.
pub fn of(cache: &ResourceCache) -> CacheStatus {
    let info = cache.info();
    let (objects, bytes, history_events, floor, watchers, synced) = {
        let s = cache.lock();
        (
            s.objects().len(),
            s.bytes(),
            s.history_len(),
            s.floor(),
            s.watcher_count(),
            s.is_synced(),
        )
    };
    let now = Instant::now();
    let ago = |t: Option<Instant>| t.map(|t| now.saturating_duration_since(t).as_secs_f64());
    let times = cache.times();
    CacheStatus {
        group: info.gvr.group.clone(),
        version: info.gvr.version.clone(),
        resource: info.gvr.resource.clone(),
        scope: info.scope.to_string(),
        upstream_encoding: if cache.upstream_protobuf() {
            "Protobuf"
        } else {
            "JSON"
        }
        .into(),
        synced,
        objects,
        resource_version: cache.rv().to_string(),
        bytes,
        history_events,
        history_from_resource_version: floor.to_string(),
        watchers,
        changed_seconds_ago: ago(times.changed),
        listed_seconds_ago: ago(times.listed),
        last_check: times.checked.map(|(_, r)| r.to_string()),
        checked_seconds_ago: ago(times.checked.map(|(t, _)| t)),
        upstream_down_seconds: ago(cache.upstream_down_since()),
        behind_upstream: cache.known_behind(),
        top_watchers: cache
            .top_watchers(TOP_WATCHERS)
            .into_iter()
            .map(|(user, watches)| Watchers { user, watches })
            .collect(),
    }
}

/// A duration as kubectl prints ages: `45s`, `12m`, `3h`, `2d`; `-` for
/// none.
pub fn age(seconds: Option<f64>) -> String {
    let Some(s) = seconds else {
        return "-".into();
    };
    let s = s.max(0.0) as u64;
    match s {
        0..120 => format!("{s}s"),
        120..7_200 => format!("{}m", s / 60),
        7_200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// Bytes in binary units, as `1.5Mi`.
fn size(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1}Gi", b / (1024.0 * 1024.0 * 1024.0))
    } else if b >= 1024.0 * 1024.0 {
        format!("{:.1}Mi", b / (1024.0 * 1024.0))
    } else if b >= 1024.0 {
        format!("{:.1}Ki", b / 1024.0)
    } else {
        format!("{bytes}")
    }
}

/// `status` as a table like kubectl's: one row per cache, columns padded
/// to their widest cell.
pub fn table(status: &Status) -> String {
    let header = [
        "RESOURCE", "SCOPE", "SYNCED", "OBJECTS", "RV", "BYTES", "HISTORY", "WATCHERS", "CHANGED",
        "LISTED", "CHECK", "UPSTREAM",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for c in &status.caches {
        let resource = if c.group.is_empty() {
            c.resource.clone()
        } else {
            format!("{}.{}", c.resource, c.group)
        };
        let check = match (&c.last_check, c.checked_seconds_ago) {
            (Some(r), ago) => format!("{r} {}", age(ago)),
            (None, _) => "-".into(),
        };
        let upstream = match (c.upstream_down_seconds, c.behind_upstream) {
            (Some(down), _) => format!("down {}", age(Some(down))),
            (None, true) => "behind".into(),
            (None, false) => "up".into(),
        };
        rows.push(vec![
            resource,
            if c.scope.is_empty() {
                "-".into()
            } else {
                c.scope.clone()
            },
            c.synced.to_string(),
            c.objects.to_string(),
            c.resource_version.clone(),
            size(c.bytes),
            format!(
                "{} from {}",
                c.history_events, c.history_from_resource_version
            ),
            c.watchers.to_string(),
            age(c.changed_seconds_ago),
            age(c.listed_seconds_ago),
            check,
            upstream,
        ]);
    }
    let mut out = aligned(&rows);
    if !status.upstream.is_empty() {
        let mut rows = vec![vec!["UPSTREAM".to_string(), "ROLE".into(), "ACTIVE".into()]];
        rows.extend(status.upstream.iter().map(|s| {
            vec![
                s.url.clone(),
                if s.role == "primary" && status.primary_connect_failures > 0 {
                    format!(
                        "primary ({} connect failures)",
                        status.primary_connect_failures
                    )
                } else {
                    s.role.clone()
                },
                s.active.to_string(),
            ]
        }));
        out.push('\n');
        out.push_str(&aligned(&rows));
    }
    if let Some(k) = &status.kubernetes_service {
        let rows = vec![
            vec![
                "KUBELET'S default/kubernetes".to_string(),
                "MODE".into(),
                "TARGET".into(),
                "ADDRESS".into(),
            ],
            vec![
                if k.rewritten { "rewritten" } else { "real" }.to_string(),
                k.mode.clone(),
                k.target.clone(),
                if k.address_on_node {
                    "on node"
                } else {
                    "missing"
                }
                .to_string(),
            ],
        ];
        out.push('\n');
        out.push_str(&aligned(&rows));
    }
    // The top watchers over every cache.
    let mut watchers: Vec<(usize, &str, String)> = status
        .caches
        .iter()
        .flat_map(|c| {
            c.top_watchers.iter().map(move |w| {
                let resource = if c.group.is_empty() {
                    c.resource.clone()
                } else {
                    format!("{}.{}", c.resource, c.group)
                };
                (w.watches, w.user.as_str(), resource)
            })
        })
        .collect();
    if !watchers.is_empty() {
        watchers.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| (a.1, &a.2).cmp(&(b.1, &b.2))));
        watchers.truncate(2 * TOP_WATCHERS);
        let mut rows = vec![vec![
            "USER".to_string(),
            "RESOURCE".into(),
            "WATCHES".into(),
        ]];
        rows.extend(
            watchers
                .into_iter()
                .map(|(n, user, resource)| vec![user.to_string(), resource, n.to_string()]),
        );
        out.push('\n');
        out.push_str(&aligned(&rows));
    }
    out
}

/// Rows as columns padded to their widest cell, three spaces apart.
fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}   ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_as_kubectl_prints_them() {
        assert_eq!(age(None), "-");
        assert_eq!(age(Some(0.4)), "0s");
        assert_eq!(age(Some(119.0)), "119s");
        assert_eq!(age(Some(120.0)), "2m");
        assert_eq!(age(Some(7_199.0)), "119m");
        assert_eq!(age(Some(7_200.0)), "2h");
        assert_eq!(age(Some(200_000.0)), "2d");
    }

    #[test]
    fn table_columns_line_up() {
        let status = Status {
            caches: vec![
                CacheStatus {
                    version: "v1".into(),
                    resource: "pods".into(),
                    scope: "spec.nodeName=node-1".into(),
                    synced: true,
                    objects: 12,
                    resource_version: "4711".into(),
                    bytes: 64 * 1024,
                    history_events: 3,
                    history_from_resource_version: "4000".into(),
                    watchers: 2,
                    changed_seconds_ago: Some(5.0),
                    listed_seconds_ago: Some(600.0),
                    last_check: Some("success".into()),
                    checked_seconds_ago: Some(30.0),
                    top_watchers: vec![Watchers {
                        user: "system:node:node-1".into(),
                        watches: 2,
                    }],
                    ..CacheStatus::default()
                },
                CacheStatus {
                    group: "discovery.k8s.io".into(),
                    version: "v1".into(),
                    resource: "endpointslices".into(),
                    upstream_down_seconds: Some(3.0),
                    ..CacheStatus::default()
                },
            ],
            ..Status::default()
        };
        let t = table(&status);
        let (caches, watchers) = t.split_once("\n\n").unwrap();
        assert!(!t.contains("UPSTREAM "), "no server, no section: {t}");
        let with_servers = Status {
            upstream: servers(vec![
                ("https://tier:6443".into(), false),
                ("https://10.0.0.1:6443".into(), true),
            ]),
            primary_connect_failures: 3,
            ..Status::default()
        };
        assert_eq!(
            table(&with_servers).split_once("\n\n").unwrap().1,
            "UPSTREAM                ROLE                           ACTIVE\n\
             https://tier:6443       primary (3 connect failures)   false\n\
             https://10.0.0.1:6443   fallback                       true\n"
        );
        assert_eq!(
            watchers,
            "USER                 RESOURCE   WATCHES\nsystem:node:node-1   pods       2\n"
        );
        let lines: Vec<&str> = caches.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("RESOURCE "), "{t}");
        assert!(lines[1].starts_with("pods "), "{t}");
        assert!(
            lines[2].starts_with("endpointslices.discovery.k8s.io   -   "),
            "{t}"
        );
        assert!(
            lines[1].contains("64.0Ki") && lines[1].contains("3 from 4000"),
            "{t}"
        );
        assert!(lines[1].ends_with("success 30s   up"), "{t}");
        assert!(lines[2].ends_with("down 3s"), "{t}");
        // Every column starts at the same offset on every line.
        let scope = lines[0].find("SCOPE");
        assert_eq!(scope, lines[1].find("spec.nodeName=node-1"), "{t}");
        assert_eq!(scope, lines[2].find("-   "), "{t}");
        let synced = lines[0].find("SYNCED");
        assert_eq!(synced, lines[1].find("true"), "{t}");
        assert_eq!(synced, lines[2].find("false"), "{t}");
    }
}
