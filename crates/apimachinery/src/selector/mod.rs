//! Label and field selectors: parsing with the apiserver's grammar and error
//! messages, and matching against the labels and fields extracted from an
//! object once, at ingest.
//!
//! Sources mirrored:
//! `staging/src/k8s.io/apimachinery/pkg/labels/selector.go` and
//! `staging/src/k8s.io/apimachinery/pkg/fields/selector.go`.

mod field;
mod label;
mod validation;

pub use field::{FieldRequirement, FieldSelector, escape_value as escape_field_value};
pub use label::{LabelSelector, Operator, Requirement};
pub use validation::{
    is_dns1123_label, is_dns1123_subdomain, is_qualified_name, is_valid_label_value,
};

/// Read access to a set of `key=value` pairs (labels or selectable fields).
pub trait Pairs {
    /// The value for `key`, if present.
    fn get(&self, key: &str) -> Option<&str>;
}

impl Pairs for [(String, String)] {
    fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

impl Pairs for Vec<(String, String)> {
    fn get(&self, key: &str) -> Option<&str> {
        Pairs::get(self.as_slice(), key)
    }
}

impl Pairs for std::collections::BTreeMap<String, String> {
    fn get(&self, key: &str) -> Option<&str> {
        std::collections::BTreeMap::get(self, key).map(String::as_str)
    }
}

impl Pairs for [(&'static str, String)] {
    fn get(&self, key: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl Pairs for Vec<(&'static str, String)> {
    fn get(&self, key: &str) -> Option<&str> {
        Pairs::get(self.as_slice(), key)
    }
}

impl Pairs for [(&'static str, Box<str>)] {
    fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| &**v)
    }
}

impl Pairs for [(Box<str>, Box<str>)] {
    fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| &**k == key).map(|(_, v)| &**v)
    }
}
