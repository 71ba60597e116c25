//! Impersonation requested by clients, decided as the apiserver decides it
//! (its constrained or legacy filter, [`crate::upstream::ServerInfo`]; see
//! [`apimachinery::impersonation`]),
//! each check a SubjectAccessReview through the proxy's decision cache.

pub use apimachinery::impersonation::{
    Check, Filter, LastModes, NODE_NAME_EXTRA, NODES_GROUP, Requested, node_name, requested,
    service_account,
};

use apimachinery::impersonation::{Checker, Refusal};

use apimachinery::status::Status;

use super::UserInfo;
use super::access::{AccessReviewer, Attributes, Decision, forbidden};
use super::review::ReviewError;

/// Why impersonation failed.
pub type ImpersonationError = Refusal<ReviewError>;

/// The checks of one request: SubjectAccessReviews, `On` checks carrying
/// the request's own attributes.
struct Reviews<'a> {
    reviewer: &'a AccessReviewer,
    request: &'a Attributes,
}

impl Reviews<'_> {
    fn attributes(&self, check: &Check) -> Attributes {
        match check {
            Check::On { user, verb } => Attributes {
                user: user.clone(),
                verb: verb.clone(),
                ..self.request.clone()
            },
            Check::Target {
                user,
                verb,
                group,
                resource,
                subresource,
                namespace,
                name,
            } => Attributes {
                user: user.clone(),
                verb: verb.clone(),
                resource_request: true,
                api_group: group.clone(),
                api_version: "v1".into(),
                resource: resource.clone(),
                subresource: subresource.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                ..Attributes::default()
            },
        }
    }
}

impl Checker for Reviews<'_> {
    type Error = ReviewError;

    async fn allowed(&self, check: &Check) -> Result<Result<(), Status>, ReviewError> {
        let attrs = self.attributes(check);
        Ok(match self.reviewer.authorize(&attrs).await? {
            Decision::Allow => Ok(()),
            Decision::Deny(reason) => Err(forbidden(&attrs, &reason)),
        })
    }

    fn forbidden(&self, check: &Check, reason: &str) -> Status {
        forbidden(&self.attributes(check), reason)
    }
}

/// Authorizes `requester`, making `request`, to act as `req`, and returns
/// the user the request proceeds as.
///
/// # Errors
/// [`Refusal::Status`] with the apiserver's `400` or `403`, or
/// [`Refusal::Error`] when a review could not be made.
pub async fn impersonate(
    reviewer: &AccessReviewer,
    filter: Filter,
    last_modes: &LastModes,
    requester: &UserInfo,
    req: &Requested,
    request: &Attributes,
) -> Result<UserInfo, ImpersonationError> {
    let reviews = Reviews { reviewer, request };
    apimachinery::impersonation::impersonate(
        &reviews,
        filter,
        last_modes,
        requester,
        req,
        &request.verb,
    )
    .await
}
