//! What the run records and the validators read: the resources it writes
//! and watches, object keys, watch filters, the events a recording watcher
//! observed (grouped in segments, one per watch request), and the reads it
//! made.

use std::fmt;

/// A resource the run writes and watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Pods,
    Services,
    EndpointSlices,
    ConfigMaps,
    Nodes,
}

impl Resource {
    /// Every resource, in a fixed order.
    pub const ALL: [Resource; 5] = [
        Resource::Pods,
        Resource::Services,
        Resource::EndpointSlices,
        Resource::ConfigMaps,
        Resource::Nodes,
    ];

    /// The plural name (`pods`).
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Pods => "pods",
            Resource::Services => "services",
            Resource::EndpointSlices => "endpointslices",
            Resource::ConfigMaps => "configmaps",
            Resource::Nodes => "nodes",
        }
    }

    /// Whether objects live in namespaces.
    pub fn namespaced(self) -> bool {
        self != Resource::Nodes
    }

    /// The collection path, cluster-wide (`/api/v1/pods`), or in
    /// `namespace`.
    pub fn path(self, namespace: Option<&str>) -> String {
        let (prefix, plural) = match self {
            Resource::EndpointSlices => ("/apis/discovery.k8s.io/v1", "endpointslices"),
            r => ("/api/v1", r.plural()),
        };
        match namespace {
            Some(ns) if self.namespaced() => format!("{prefix}/namespaces/{ns}/{plural}"),
            _ => format!("{prefix}/{plural}"),
        }
    }

    /// The etcd key prefix kube-apiserver stores the resource under
    /// (`/registry/pods/`; services under `/registry/services/specs/`,
    /// nodes under `/registry/minions/`).
    pub fn etcd_prefix(self) -> &'static str {
        match self {
            Resource::Pods => "/registry/pods/",
            Resource::Services => "/registry/services/specs/",
            Resource::EndpointSlices => "/registry/endpointslices/",
            Resource::ConfigMaps => "/registry/configmaps/",
            Resource::Nodes => "/registry/minions/",
        }
    }

    /// The resource and object key of an etcd key, if it is one the run
    /// follows.
    pub fn of_etcd_key(key: &str) -> Option<(Resource, ObjectKey)> {
        for r in Resource::ALL {
            if let Some(rest) = key.strip_prefix(r.etcd_prefix()) {
                let key = if r.namespaced() {
                    let (ns, name) = rest.split_once('/')?;
                    ObjectKey::new(ns, name)
                } else {
                    ObjectKey::new("", rest)
                };
                return Some((r, key));
            }
        }
        None
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.plural())
    }
}

/// An object's namespace (empty for cluster-scoped) and name. Orders as
/// kube-apiserver lists: by namespace, then name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// One requirement of a selector the run uses: `key=value`, `key!=value`,
/// `key in (a,b)`. Label keys, or the field paths `metadata.name`,
/// `metadata.namespace`, `spec.nodeName`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
}

impl Requirement {
    /// The query form (`app=web`, `tier in (a,b)`).
    pub fn query(&self) -> String {
        match self {
            Requirement::Equals(k, v) => format!("{k}={v}"),
            Requirement::NotEquals(k, v) => format!("{k}!={v}"),
            Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
        }
    }

    /// Whether `value` (the key's value, `None` when absent) satisfies it,
    /// as kube-apiserver's selectors decide (`!=` holds for an absent key).
    pub fn holds(&self, value: Option<&str>) -> bool {
        match self {
            Requirement::Equals(_, v) => value == Some(v.as_str()),
            Requirement::NotEquals(_, v) => value != Some(v.as_str()),
            Requirement::In(_, vs) => value.is_some_and(|x| vs.iter().any(|v| v == x)),
        }
    }

    /// The key or field path.
    pub fn key(&self) -> &str {
        match self {
            Requirement::Equals(k, _) | Requirement::NotEquals(k, _) | Requirement::In(k, _) => k,
        }
    }
}

/// What a recording watcher asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub resource: Resource,
    /// Only this namespace (`/namespaces/<ns>/` in the path).
    pub namespace: Option<String>,
    /// Label selector, all must hold.
    pub labels: Vec<Requirement>,
    /// Field selector (`metadata.name`, `metadata.namespace`,
    /// `spec.nodeName`), all must hold.
    pub fields: Vec<Requirement>,
}

impl Filter {
    /// Everything of `resource`.
    pub fn all(resource: Resource) -> Filter {
        Filter {
            resource,
            namespace: None,
            labels: Vec::new(),
            fields: Vec::new(),
        }
    }

    /// Whether `object` (its JSON) is selected.
    pub fn matches(&self, object: &serde_json::Value) -> bool {
        let meta = &object["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or("");
        if let Some(ns) = &self.namespace
            && ns != namespace
        {
            return false;
        }
        let labels = &meta["labels"];
        if !self
            .labels
            .iter()
            .all(|r| r.holds(labels[r.key()].as_str()))
        {
            return false;
        }
        self.fields.iter().all(|r| {
            let value = match r.key() {
                "metadata.name" => meta["name"].as_str(),
                "metadata.namespace" => Some(namespace),
                "spec.nodeName" => Some(object["spec"]["nodeName"].as_str().unwrap_or("")),
                _ => None,
            };
            r.holds(value)
        })
    }

    /// The query parameters (`labelSelector=...&fieldSelector=...`),
    /// escaped, each with a leading `&`.
    pub fn query(&self) -> String {
        let escape = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let mut q = String::new();
        if !self.labels.is_empty() {
            let s: Vec<String> = self.labels.iter().map(Requirement::query).collect();
            q.push_str("&labelSelector=");
            q.push_str(&escape(&s.join(",")));
        }
        if !self.fields.is_empty() {
            let s: Vec<String> = self.fields.iter().map(Requirement::query).collect();
            q.push_str("&fieldSelector=");
            q.push_str(&escape(&s.join(",")));
        }
        q
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.resource)?;
        if let Some(ns) = &self.namespace {
            write!(f, " in {ns}")?;
        }
        let q: Vec<String> = self
            .labels
            .iter()
            .chain(&self.fields)
            .map(Requirement::query)
            .collect();
        if !q.is_empty() {
            write!(f, " [{}]", q.join(","))?;
        }
        Ok(())
    }
}

/// The type of an observed watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Added,
    Modified,
    Deleted,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Added => "ADDED",
            Kind::Modified => "MODIFIED",
            Kind::Deleted => "DELETED",
        }
    }
}

/// One thing a watch stream delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// An object event: its type, the object's key and resourceVersion.
    Event { kind: Kind, key: ObjectKey, rv: u64 },
    /// A `BOOKMARK` at `rv`; `initial_events_end` when it carries the
    /// `k8s.io/initial-events-end` annotation.
    Bookmark { rv: u64, initial_events_end: bool },
}

impl Observed {
    /// Its resourceVersion.
    pub fn rv(&self) -> u64 {
        match self {
            Observed::Event { rv, .. } | Observed::Bookmark { rv, .. } => *rv,
        }
    }
}

/// Where a watch request started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// `resourceVersion=N`: every matching change after `N`.
    From(u64),
    /// A list (at its resourceVersion), then a watch from it: the listed
    /// objects (key and resourceVersion) are the watcher's state.
    Listed {
        rv: u64,
        items: Vec<(ObjectKey, u64)>,
    },
    /// A streaming list (`sendInitialEvents=true`): synthetic `ADDED`
    /// events of the state, then a bookmark with
    /// `k8s.io/initial-events-end`, then changes.
    InitialEvents,
}

/// How a watch request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The server ended the stream cleanly.
    Closed,
    /// The stream broke (connection reset, a proxy killed).
    Broken(String),
    /// An `ERROR` event or an error status: its code and message.
    Error(u16, String),
    /// The run stopped it (the end of the run, or a watcher that stopped
    /// reading was cut by the run).
    Stopped,
}

/// One watch request's stream, as a recording watcher saw it.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The watcher (unique in a run), e.g. `node-1/pods-json`.
    pub watcher: String,
    /// The proxy (or `apiserver`) it was sent to.
    pub target: String,
    pub filter: Filter,
    pub start: Start,
    /// What it delivered, in order.
    pub events: Vec<Observed>,
    /// When each of `events` arrived (Unix seconds), for staleness
    /// (`validate::freshness`); empty where not recorded.
    pub arrived: Vec<f64>,
    pub end: End,
    /// When the request was sent and when the stream ended (Unix seconds).
    pub started: f64,
    pub ended: f64,
}

impl Segment {
    /// Its start, briefly (a list's items left out).
    pub fn start_summary(&self) -> String {
        match &self.start {
            Start::From(rv) => format!("from {rv}"),
            Start::Listed { rv, items } => format!("listed {} at {rv}", items.len()),
            Start::InitialEvents => "initial events".into(),
        }
    }
}

/// Now, in Unix seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// A list a client made with `resourceVersion=0` or a
/// `NotOlderThan` resourceVersion, and what it got.
#[derive(Debug, Clone)]
pub struct ReadObservation {
    /// The client (unique in a run); its reads are in order.
    pub client: String,
    pub target: String,
    pub resource: Resource,
    /// `None`: `resourceVersion=0`; `Some(n)`: not older than `n`.
    pub not_older_than: Option<u64>,
    /// The list's resourceVersion.
    pub rv: u64,
    /// When it was answered (Unix seconds).
    pub at: f64,
}
