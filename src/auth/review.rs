//! Creating TokenReviews and SubjectAccessReviews upstream, with the
//! proxy's own credentials (it needs `create` on both, as in the built-in
//! `system:auth-delegator` role).

use http::{Method, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::upstream::{Credentials, Upstream};

/// A review could not be made.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReviewError {
    /// The apiserver could not be reached or answered an error.
    #[error("{0}")]
    Upstream(String),
}

/// The largest review response read.
const MAX_REVIEW_BYTES: usize = 1 << 20;

/// POSTs `review` to `path` and decodes the answer.
///
/// # Errors
/// [`ReviewError::Upstream`] for transport failures, non-2xx answers and
/// undecodable bodies.
pub async fn create<T: Serialize, R: DeserializeOwned>(
    upstream: &Upstream,
    path: &str,
    review: &T,
) -> Result<R, ReviewError> {
    let err = |e: &dyn std::fmt::Display| ReviewError::Upstream(e.to_string());
    let body = serde_json::to_vec(review).map_err(|e| err(&e))?;
    let req = upstream
        .own_request(Method::POST, path, Some(body))
        .map_err(|e| err(&e))?;
    let resp = upstream
        .send(req, Credentials::Proxy)
        .await
        .map_err(|e| err(&e))?;
    let status = resp.status();
    let bytes = Limited::new(resp.into_body(), MAX_REVIEW_BYTES)
        .collect()
        .await
        .map_err(|e| err(&e))?
        .to_bytes();
    if status != StatusCode::CREATED && status != StatusCode::OK {
        return Err(ReviewError::Upstream(format!(
            "{path}: {status}: {}",
            String::from_utf8_lossy(&bytes)
        )));
    }
    serde_json::from_slice(&bytes).map_err(|e| err(&e))
}
