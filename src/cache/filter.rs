//! What a list or watch selects: namespace, label selector and field
//! selector, evaluated against the labels and fields extracted at ingest.

use apimachinery::selector::{FieldSelector, LabelSelector};

use super::object::CachedObject;

/// A request's selection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Filter {
    /// The namespace of a namespaced request path.
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    /// Already converted for the resource (`FieldSet::convert`).
    pub fields: FieldSelector,
}

/// The one dispatch index a watcher is filed under, most selective first.
/// An event is offered only to watchers under its object's (and previous
/// object's) keys and to unindexed watchers, so 5,000 kubelets each watching
/// their node's pods cost one lookup per event, not 5,000 filter calls.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IndexKey {
    /// Pinned to one object: its storage key.
    Name(Box<str>),
    /// Pinned to `spec.nodeName` (pods).
    Node(Box<str>),
    /// Pinned to a namespace.
    Namespace(Box<str>),
    /// Anything.
    None,
}

// === impl Filter ===

impl Filter {
    /// Whether the object is selected.
    pub fn matches(&self, o: &CachedObject) -> bool {
        if let Some(ns) = &self.namespace
            && o.namespace() != ns
        {
            return false;
        }
        self.labels.matches(&o.labels()) && self.fields.matches(&o.fields())
    }

    /// Whether the selection is everything in its scope (no selectors), so
    /// `remainingItemCount` may be reported.
    pub fn is_unfiltered(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// The namespace the selection is limited to, by path or by an exact
    /// `metadata.namespace` field selector.
    pub fn single_namespace(&self) -> Option<&str> {
        self.namespace
            .as_deref()
            .or_else(|| self.fields.requires_exact_match("metadata.namespace"))
    }

    /// The one object the selection can hold, `(namespace, name)`, when an
    /// exact `metadata.name` term pins it (with its namespace, for a
    /// namespaced resource): kubelet's watches of a pod's Secrets and
    /// ConfigMaps, and of its own Node. The namespace is a DNS label, as
    /// every namespace's name is (it goes into an upstream request's
    /// path); any other selects no one object here.
    pub fn single_object(&self, namespaced: bool) -> Option<(Option<&str>, &str)> {
        let name = self.fields.requires_exact_match("metadata.name")?;
        match (namespaced, self.single_namespace()) {
            (true, Some(ns)) if apimachinery::selector::is_dns1123_label(ns) => {
                Some((Some(ns), name))
            }
            (false, _) => Some((None, name)),
            (true, _) => None,
        }
    }

    /// The storage key of the one object a list reads, as kube-apiserver's
    /// registry does (`Store.ListPredicate`: a `metadata.name` term makes
    /// a single-key read, `MatchesSingle`, when a key can be made of it: a
    /// name valid as a path segment, `NamespaceKeyFunc`, and, for a
    /// namespaced resource, a namespace from the path or a
    /// `metadata.namespace` term, `MatchesSingleNamespace`). Such a list
    /// holds at most that object and never a continue token, however many
    /// objects follow it.
    pub fn single_key(&self, namespaced: bool) -> Option<String> {
        let (namespace, name) = self.single_object(namespaced)?;
        if !apimachinery::request::valid_path_segment_name(name) {
            return None;
        }
        Some(match namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name.to_string(),
        })
    }

    /// The index to file a watcher under. `node_indexed`: the resource is
    /// indexed by `spec.nodeName` (pods).
    pub fn index_key(&self, node_indexed: bool, namespaced: bool) -> IndexKey {
        if let Some(name) = self.fields.requires_exact_match("metadata.name") {
            let key = match (namespaced, self.single_namespace()) {
                (true, Some(ns)) => Some(format!("{ns}/{name}")),
                (false, _) => Some(name.to_string()),
                (true, None) => None,
            };
            if let Some(key) = key {
                return IndexKey::Name(key.into_boxed_str());
            }
        }
        if node_indexed && let Some(node) = self.fields.requires_exact_match("spec.nodeName") {
            return IndexKey::Node(node.into());
        }
        match self.single_namespace() {
            Some(ns) if namespaced => IndexKey::Namespace(ns.into()),
            _ => IndexKey::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_objects_need_a_name_and_a_namespace_that_is_a_label() {
        assert_eq!(
            filter(Some("ns"), "metadata.name=cm").single_object(true),
            Some((Some("ns"), "cm"))
        );
        assert_eq!(
            filter(None, "metadata.namespace=ns,metadata.name=cm").single_object(true),
            Some((Some("ns"), "cm"))
        );
        assert_eq!(
            filter(None, "metadata.name=n1").single_object(false),
            Some((None, "n1"))
        );
        assert_eq!(filter(None, "metadata.name=cm").single_object(true), None);
        assert_eq!(filter(Some("ns"), "").single_object(true), None);
        for ns in ["..", "a/b", "A", "-a", "a?b", &"a".repeat(64)] {
            let f = filter(None, &format!("metadata.namespace={ns},metadata.name=cm"));
            assert_eq!(f.single_object(true), None, "{ns}");
        }
    }

    #[test]
    fn single_keys_are_what_the_apiserver_reads_alone() {
        assert_eq!(
            filter(Some("ns"), "metadata.name=cm").single_key(true),
            Some("ns/cm".into())
        );
        assert_eq!(
            filter(
                None,
                "metadata.namespace=ns,metadata.name=cm,metadata.name!=cm"
            )
            .single_key(true),
            Some("ns/cm".into())
        );
        assert_eq!(
            filter(None, "metadata.name=n1").single_key(false),
            Some("n1".into())
        );
        assert_eq!(filter(None, "metadata.name=cm").single_key(true), None);
        assert_eq!(filter(None, "metadata.name=a%b").single_key(false), None);
        assert_eq!(filter(None, "metadata.name=..").single_key(false), None);
    }

    fn filter(ns: Option<&str>, fields: &str) -> Filter {
        Filter {
            namespace: ns.map(str::to_string),
            labels: LabelSelector::default(),
            fields: FieldSelector::parse(fields).unwrap(),
        }
    }

    #[test]
    fn index_keys() {
        assert_eq!(
            filter(Some("ns"), "metadata.name=cm").index_key(false, true),
            IndexKey::Name("ns/cm".into())
        );
        assert_eq!(
            filter(None, "metadata.name=n1").index_key(false, false),
            IndexKey::Name("n1".into())
        );
        assert_eq!(
            filter(None, "spec.nodeName=n1").index_key(true, true),
            IndexKey::Node("n1".into())
        );
        assert_eq!(
            filter(None, "spec.nodeName=n1").index_key(false, true),
            IndexKey::None
        );
        assert_eq!(
            filter(None, "metadata.namespace=ns").index_key(true, true),
            IndexKey::Namespace("ns".into())
        );
        assert_eq!(
            filter(None, "metadata.name=x").index_key(true, true),
            IndexKey::None,
            "a name without a namespace pins nothing in a namespaced resource"
        );
    }
}
