//! Authorization by SubjectAccessReview upstream, cached.
//!
//! The review carries what kube-apiserver's webhook authorizer sends
//! (`staging/src/k8s.io/apiserver/plugin/pkg/authorizer/webhook`): the full
//! user (name, uid, groups, extra), the verb, API group and version,
//! resource, subresource, namespace, name, and for list, watch and
//! deletecollection the request's field and label selectors as
//! requirements (`AuthorizeWithSelectors`, GA in 1.34) — which is how the
//! Node authorizer lets kubelet watch only its own node's pods.
//!
//! Decisions are cached by the digest of the whole review spec, like the
//! apiserver's webhook authorizer, but allowed ones for 5 seconds by
//! default (not its 5 minutes: a revocation must reach cached reads within
//! seconds) and denied ones not at all (not its 30 s: the apiserver's own
//! authorizers decide every request, and the Node authorizer allows a
//! kubelet a new pod's Secrets and ConfigMaps a moment after the pod is
//! bound); errors are not cached; concurrent misses for the same spec make
//! one call.

use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    FieldSelectorAttributes, LabelSelectorAttributes, NonResourceAttributes, ResourceAttributes,
    SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldSelectorRequirement, LabelSelectorRequirement,
};
use sha2::{Digest, Sha256};

use crate::upstream::Upstream;
use apimachinery::request::RequestInfo;
use apimachinery::selector::{FieldSelector, LabelSelector, Operator};
use apimachinery::status::{Details, Status};

use super::UserInfo;
use super::metrics::AuthMetrics;
use super::review::{self, ReviewError};
use super::ttl_cache::{Fetched, TtlCache};

/// `authorizer.Attributes`: who wants to do what.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attributes {
    pub user: UserInfo,
    pub verb: String,
    pub resource_request: bool,
    /// The request path (non-resource requests).
    pub path: String,
    pub namespace: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub field_selector: Option<FieldSelector>,
    pub label_selector: Option<LabelSelector>,
}

/// A decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied, with the authorizer's reason (may be empty).
    Deny(String),
}

/// Decision cache settings.
#[derive(Debug, Clone, Copy)]
pub struct AccessSettings {
    pub allowed_ttl: Duration,
    pub denied_ttl: Duration,
    /// How long past its TTL a decision stands in while upstream cannot be
    /// asked.
    pub last_known: Duration,
    pub capacity: u64,
}

/// Authorizes requests.
pub struct AccessReviewer {
    upstream: Upstream,
    cache: TtlCache<Decision>,
    settings: AccessSettings,
    metrics: AuthMetrics,
}

impl std::fmt::Debug for AccessReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessReviewer")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

// === impl Attributes ===

impl Attributes {
    /// Whether [`forbidden`]'s message is exactly the apiserver's: it
    /// quotes these attributes as Go's `%q`, which [`apimachinery::go::quote`]
    /// reproduces exactly for ASCII.
    pub fn quotes_exactly(&self) -> bool {
        [
            &self.user.name,
            &self.path,
            &self.namespace,
            &self.resource,
            &self.subresource,
            &self.api_group,
            &self.name,
        ]
        .iter()
        .all(|s| s.is_ascii())
    }

    /// The attributes of a request by `user`. Selectors are taken, like
    /// the apiserver does, only for list, watch and deletecollection, and
    /// not for the deprecated `/watch/` path form; ones that do not parse
    /// are left out.
    pub fn for_request(user: &UserInfo, info: &RequestInfo, query: Option<&str>) -> Attributes {
        let mut attrs = Attributes {
            user: user.clone(),
            verb: info.verb.clone(),
            resource_request: info.is_resource_request,
            path: info.path.clone(),
            namespace: info.namespace.clone(),
            api_group: info.api_group.clone(),
            api_version: info.api_version.clone(),
            resource: info.resource.clone(),
            subresource: info.subresource.clone(),
            name: info.name.clone(),
            field_selector: None,
            label_selector: None,
        };
        let with_selectors = matches!(info.verb.as_str(), "list" | "watch" | "deletecollection")
            && !info.legacy_watch_path;
        if with_selectors {
            let mut field = None;
            let mut label = None;
            for (k, v) in apimachinery::url::query_pairs(query.unwrap_or("")) {
                match k.as_str() {
                    "fieldSelector" if field.is_none() => field = Some(v),
                    "labelSelector" if label.is_none() => label = Some(v),
                    _ => {}
                }
            }
            attrs.field_selector = field.and_then(|f| FieldSelector::parse(&f).ok());
            attrs.label_selector = label.and_then(|l| LabelSelector::parse(&l).ok());
        }
        attrs
    }

    /// The SubjectAccessReview spec for these attributes.
    pub fn spec(&self) -> SubjectAccessReviewSpec {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let (resource_attributes, non_resource_attributes) = if self.resource_request {
            (
                Some(ResourceAttributes {
                    namespace: some(&self.namespace),
                    verb: some(&self.verb),
                    group: some(&self.api_group),
                    version: some(&self.api_version),
                    resource: some(&self.resource),
                    subresource: some(&self.subresource),
                    name: some(&self.name),
                    field_selector: self.field_selector.as_ref().and_then(field_requirements),
                    label_selector: self.label_selector.as_ref().and_then(label_requirements),
                }),
                None,
            )
        } else {
            (
                None,
                Some(NonResourceAttributes {
                    path: some(&self.path),
                    verb: some(&self.verb),
                }),
            )
        };
        SubjectAccessReviewSpec {
            resource_attributes,
            non_resource_attributes,
            user: some(&self.user.name),
            uid: some(&self.user.uid),
            groups: (!self.user.groups.is_empty()).then(|| self.user.groups.clone()),
            extra: (!self.user.extra.is_empty()).then(|| self.user.extra.clone()),
        }
    }
}

/// `=`/`==` become `In`, `!=` becomes `NotIn` (the webhook authorizer's
/// `fieldSelectorToAuthorizationAPI`); none left: omitted.
fn field_requirements(s: &FieldSelector) -> Option<FieldSelectorAttributes> {
    let reqs: Vec<FieldSelectorRequirement> = s
        .terms()
        .iter()
        .map(|t| FieldSelectorRequirement {
            key: t.field.clone(),
            operator: if t.not_equals { "NotIn" } else { "In" }.to_string(),
            values: Some(vec![t.value.clone()]),
        })
        .collect();
    (!reqs.is_empty()).then_some(FieldSelectorAttributes {
        raw_selector: None,
        requirements: Some(reqs),
    })
}

/// Equality and set operators map to `In`/`NotIn`, existence to
/// `Exists`/`DoesNotExist`; `gt`/`lt` are dropped.
fn label_requirements(s: &LabelSelector) -> Option<LabelSelectorAttributes> {
    let reqs: Vec<LabelSelectorRequirement> = s
        .requirements()
        .iter()
        .filter_map(|r| {
            let operator = match r.operator {
                Operator::Equals | Operator::DoubleEquals | Operator::In => "In",
                Operator::NotEquals | Operator::NotIn => "NotIn",
                Operator::Exists => "Exists",
                Operator::DoesNotExist => "DoesNotExist",
                Operator::GreaterThan | Operator::LessThan => return None,
            };
            Some(LabelSelectorRequirement {
                key: r.key.clone(),
                operator: operator.to_string(),
                values: (!r.values.is_empty()).then(|| r.values.clone()),
            })
        })
        .collect();
    (!reqs.is_empty()).then_some(LabelSelectorAttributes {
        raw_selector: None,
        requirements: Some(reqs),
    })
}

/// The apiserver's `403 Forbidden` for `attrs`, as
/// `responsewriters.ForbiddenStatusError` writes it: `pods is forbidden:
/// User "u" cannot list resource "pods" in API group "" at the cluster
/// scope`, then `: reason` when the authorizer gave one.
pub fn forbidden(attrs: &Attributes, reason: &str) -> Status {
    use apimachinery::go::quote;
    let user = quote(&attrs.user.name);
    let msg = if !attrs.resource_request {
        format!(
            "User {user} cannot {} path {}",
            attrs.verb,
            quote(&attrs.path)
        )
    } else {
        let mut resource = attrs.resource.clone();
        if !attrs.subresource.is_empty() {
            resource = format!("{resource}/{}", attrs.subresource);
        }
        let scope = if attrs.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {}", quote(&attrs.namespace))
        };
        format!(
            "User {user} cannot {} resource {} in API group {} {scope}",
            attrs.verb,
            quote(&resource),
            quote(&attrs.api_group)
        )
    };
    // Only the generated part is sanitized; the reason is appended raw.
    let msg = msg
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let msg = if reason.is_empty() {
        msg
    } else {
        format!("{msg}: {reason}")
    };
    let (message, details) = if !attrs.resource_request || attrs.resource.is_empty() {
        (format!("forbidden: {msg}"), Details::default())
    } else {
        let qualified = apimachinery::status::qualified_resource(&attrs.api_group, &attrs.resource);
        let message = if attrs.name.is_empty() {
            format!("{qualified} is forbidden: {msg}")
        } else {
            format!("{qualified} {} is forbidden: {msg}", quote(&attrs.name))
        };
        (
            message,
            Details {
                name: attrs.name.clone(),
                group: attrs.api_group.clone(),
                kind: attrs.resource.clone(),
                ..Details::default()
            },
        )
    };
    Status::new(http::StatusCode::FORBIDDEN, "Forbidden", message).with_details(details)
}

// === impl AccessReviewer ===

impl AccessReviewer {
    /// A reviewer asking `upstream`.
    pub fn new(
        upstream: Upstream,
        settings: AccessSettings,
        metrics: AuthMetrics,
    ) -> AccessReviewer {
        AccessReviewer {
            upstream,
            cache: TtlCache::new(settings.capacity),
            settings,
            metrics,
        }
    }

    /// Decides `attrs`.
    ///
    /// # Errors
    /// [`ReviewError`] when the review could not be made or the authorizer
    /// reported an evaluation error.
    pub async fn authorize(&self, attrs: &Attributes) -> Result<Decision, ReviewError> {
        let start = Instant::now();
        let spec = attrs.spec();
        let key: [u8; 32] = Sha256::digest(serde_json::to_vec(&spec).unwrap_or_default()).into();
        let (result, source) = self
            .cache
            .get_or_fetch(key, self.review(spec), ReviewError::is_unavailable)
            .await;
        let label = match &result {
            Ok(Decision::Allow) => "allowed",
            Ok(Decision::Deny(_)) => "denied",
            Err(_) => "error",
        };
        self.metrics
            .authorized(label, source.as_str(), start.elapsed().as_secs_f64());
        result
    }

    async fn review(
        &self,
        spec: SubjectAccessReviewSpec,
    ) -> Result<Fetched<Decision>, ReviewError> {
        let request = SubjectAccessReview {
            spec,
            ..SubjectAccessReview::default()
        };
        let answer: SubjectAccessReview = review::create(
            &self.upstream,
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            &request,
        )
        .await?;
        let status = answer.status.unwrap_or_default();
        let fetched = |value, ttl: Duration| Fetched {
            value,
            ttl,
            last_known: ttl + self.settings.last_known,
        };
        if status.allowed {
            return Ok(fetched(Decision::Allow, self.settings.allowed_ttl));
        }
        if let Some(e) = status.evaluation_error.filter(|e| !e.is_empty()) {
            // The apiserver answers an authorizer error with a 500, not a
            // 403; let upstream answer the request instead.
            return Err(ReviewError::Upstream(format!(
                "authorization evaluation error: {e}"
            )));
        }
        Ok(fetched(
            Decision::Deny(status.reason.unwrap_or_default()),
            self.settings.denied_ttl,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn attrs(user: &str, method: Method, path: &str, query: Option<&str>) -> Attributes {
        let info = RequestInfo::parse(&method, path, query);
        Attributes::for_request(&UserInfo::new(user, &["system:nodes"]), &info, query)
    }

    #[test]
    fn forbidden_messages_match_the_recording() {
        let a = attrs("system:anonymous", Method::GET, "/api/v1/pods", None);
        let s = forbidden(&a, "");
        assert_eq!(
            std::str::from_utf8(&s.to_json()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods is forbidden: User \"system:anonymous\" cannot list resource \"pods\" in API group \"\" at the cluster scope","reason":"Forbidden","details":{"kind":"pods"},"code":403}"#
        );
        let a = attrs(
            "system:node:node-1",
            Method::GET,
            "/api/v1/namespaces/ns/configmaps/cm-0",
            None,
        );
        let s = forbidden(
            &a,
            "no relationship found between node 'node-1' and this object",
        );
        assert_eq!(
            s.message,
            "configmaps \"cm-0\" is forbidden: User \"system:node:node-1\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"ns\": no relationship found between node 'node-1' and this object"
        );
        assert_eq!(s.details.as_ref().unwrap().name, "cm-0");
        let a = attrs(
            "u",
            Method::GET,
            "/apis/apps/v1/namespaces/ns/deployments/d/scale",
            None,
        );
        assert!(forbidden(&a, "").message.starts_with("deployments.apps \"d\" is forbidden: User \"u\" cannot get resource \"deployments/scale\" in API group \"apps\""));
        let a = attrs("u", Method::GET, "/metrics<x>", None);
        assert_eq!(
            forbidden(&a, "").message,
            "forbidden: User \"u\" cannot get path \"/metrics&lt;x&gt;\""
        );
    }

    #[test]
    fn review_specs_carry_selectors_as_the_webhook_authorizer_does() {
        let a = attrs(
            "system:node:n1",
            Method::GET,
            "/api/v1/pods",
            Some("watch=1&fieldSelector=spec.nodeName%3Dn1&labelSelector=app%3Da,tier!%3Dx,!y,z>1"),
        );
        let spec = serde_json::to_value(a.spec()).unwrap();
        assert_eq!(
            spec,
            serde_json::json!({
                "resourceAttributes": {
                    "verb": "watch", "version": "v1", "resource": "pods",
                    "fieldSelector": {"requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["n1"]}]},
                    "labelSelector": {"requirements": [
                        {"key": "app", "operator": "In", "values": ["a"]},
                        {"key": "tier", "operator": "NotIn", "values": ["x"]},
                        {"key": "y", "operator": "DoesNotExist"}
                    ]}
                },
                "user": "system:node:n1",
                "groups": ["system:nodes"]
            })
        );
        // The deprecated /watch/ path form carries no selectors; a name in a
        // field selector becomes the review's name.
        let a = attrs(
            "u",
            Method::GET,
            "/api/v1/watch/namespaces/ns/secrets",
            Some("fieldSelector=metadata.name%3Ds"),
        );
        assert!(a.field_selector.is_none());
        let a = attrs(
            "u",
            Method::GET,
            "/api/v1/namespaces/ns/secrets",
            Some("watch=1&fieldSelector=metadata.name%3Ds"),
        );
        assert_eq!(a.name, "s");
        // Unparseable selectors are left out.
        let a = attrs(
            "u",
            Method::GET,
            "/api/v1/pods",
            Some("labelSelector=a+in+(b"),
        );
        assert!(a.label_selector.is_none());
    }
}
