//! The resources the sim serves: every `apimachinery::resource::BUILT_INS` entry
//! plus those registered at run time (custom resources).

use std::sync::Arc;

use parking_lot::RwLock;

use apimachinery::resource::{BUILT_INS, FieldSet, Gvr, is_built_in_group};

/// A served resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceSpec {
    /// API group, empty for the core group.
    pub group: String,
    /// API version, e.g. `v1`.
    pub version: String,
    /// Plural lowercase resource name, e.g. `widgets`.
    pub resource: String,
    /// Kind, e.g. `Widget`; lists are `<Kind>List`.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Singular name for discovery; defaults to the lowercase kind.
    pub singular: String,
    /// Short names for discovery (`cm` for configmaps), which kubectl needs.
    pub short_names: Vec<String>,
    /// Whether the resource has a `status` subresource: writes to the main
    /// resource then keep the stored status.
    pub status_subresource: bool,
    /// Which field selectors the resource accepts.
    pub fields: FieldSet,
}

/// Resources that have a `status` subresource in kube-apiserver.
const WITH_STATUS: &[&str] = &[
    "pods",
    "nodes",
    "services",
    "namespaces",
    "persistentvolumes",
    "persistentvolumeclaims",
    "replicationcontrollers",
    "resourcequotas",
    "deployments",
    "replicasets",
    "daemonsets",
    "statefulsets",
    "jobs",
    "cronjobs",
    "poddisruptionbudgets",
    "ingresses",
    "certificatesigningrequests",
    "customresourcedefinitions",
    "volumeattachments",
    "resourceclaims",
];

/// Resources whose registry strategy sets `metadata.generation`.
const WITH_GENERATION: &[&str] = &[
    "pods",
    "deployments",
    "replicasets",
    "daemonsets",
    "statefulsets",
    "jobs",
    "cronjobs",
    "replicationcontrollers",
    "poddisruptionbudgets",
    "networkpolicies",
    "ingresses",
    "customresourcedefinitions",
    "validatingwebhookconfigurations",
    "mutatingwebhookconfigurations",
    "resourceclaims",
    "resourceslices",
];

fn short_names(resource: &str) -> &'static [&'static str] {
    match resource {
        "pods" => &["po"],
        "nodes" => &["no"],
        "services" => &["svc"],
        "endpoints" => &["ep"],
        "namespaces" => &["ns"],
        "configmaps" => &["cm"],
        "serviceaccounts" => &["sa"],
        "events" => &["ev"],
        "persistentvolumes" => &["pv"],
        "persistentvolumeclaims" => &["pvc"],
        "replicationcontrollers" => &["rc"],
        "limitranges" => &["limits"],
        "resourcequotas" => &["quota"],
        "deployments" => &["deploy"],
        "replicasets" => &["rs"],
        "daemonsets" => &["ds"],
        "statefulsets" => &["sts"],
        "cronjobs" => &["cj"],
        "storageclasses" => &["sc"],
        "ingresses" => &["ing"],
        "networkpolicies" => &["netpol"],
        "poddisruptionbudgets" => &["pdb"],
        "priorityclasses" => &["pc"],
        "certificatesigningrequests" => &["csr"],
        "customresourcedefinitions" => &["crd", "crds"],
        _ => &[],
    }
}

// === impl ResourceSpec ===

impl ResourceSpec {
    /// A resource with default singular name, no short names, no status
    /// subresource and the default field selectors (`metadata.name`,
    /// `metadata.namespace`).
    pub fn new(group: &str, version: &str, resource: &str, kind: &str, namespaced: bool) -> Self {
        ResourceSpec {
            group: group.to_string(),
            version: version.to_string(),
            resource: resource.to_string(),
            kind: kind.to_string(),
            namespaced,
            singular: kind.to_ascii_lowercase(),
            short_names: Vec::new(),
            status_subresource: false,
            fields: FieldSet::Default,
        }
    }

    /// Adds a `status` subresource.
    pub fn with_status(mut self) -> Self {
        self.status_subresource = true;
        self
    }

    /// The group, version and resource.
    pub fn gvr(&self) -> Gvr {
        Gvr {
            group: self.group.clone(),
            version: self.version.clone(),
            resource: self.resource.clone(),
        }
    }

    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether the objects are typed Go structs in the apiserver (built-in
    /// groups) rather than unstructured maps (custom resources). Decides the
    /// JSON layout and whether list items carry `kind`/`apiVersion`.
    pub fn is_built_in(&self) -> bool {
        is_built_in_group(&self.group)
    }

    /// Whether writes set and bump `metadata.generation`.
    pub fn has_generation(&self) -> bool {
        !self.is_built_in() || WITH_GENERATION.contains(&self.resource.as_str())
    }
}

/// The set of served resources.
#[derive(Debug)]
pub struct Registry {
    specs: RwLock<Vec<Arc<ResourceSpec>>>,
}

// === impl Registry ===

impl Registry {
    /// The built-in resources.
    pub fn new() -> Self {
        let specs = BUILT_INS
            .iter()
            .map(|b| {
                let mut s = ResourceSpec::new(b.group, b.version, b.resource, b.kind, b.namespaced);
                s.fields = b.fields;
                s.status_subresource = WITH_STATUS.contains(&b.resource);
                s.short_names = short_names(b.resource)
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                Arc::new(s)
            })
            .collect();
        Registry {
            specs: RwLock::new(specs),
        }
    }

    /// Adds `spec`, replacing a resource with the same group, version and
    /// resource name. Returns the stored spec.
    pub fn register(&self, spec: ResourceSpec) -> Arc<ResourceSpec> {
        let spec = Arc::new(spec);
        let mut specs = self.specs.write();
        specs.retain(|s| {
            !(s.group == spec.group && s.version == spec.version && s.resource == spec.resource)
        });
        specs.push(spec.clone());
        spec
    }

    /// The resource for `group`/`version`/`resource`.
    pub fn get(&self, group: &str, version: &str, resource: &str) -> Option<Arc<ResourceSpec>> {
        self.specs
            .read()
            .iter()
            .find(|s| s.group == group && s.version == version && s.resource == resource)
            .cloned()
    }

    /// The resource for `gvr`.
    pub fn get_gvr(&self, gvr: &Gvr) -> Option<Arc<ResourceSpec>> {
        self.get(&gvr.group, &gvr.version, &gvr.resource)
    }

    /// Every resource, in registration order.
    pub fn all(&self) -> Vec<Arc<ResourceSpec>> {
        self.specs.read().clone()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}
