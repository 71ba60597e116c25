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
    /// The apiserver answered an error, or an answer that could not be
    /// used.
    #[error("{0}")]
    Upstream(String),
    /// The apiserver could not be asked: unreachable, hung past
    /// [`REVIEW_TIMEOUT`], or answering `429` or `5xx`.
    #[error("{0}")]
    Unavailable(String),
}

impl ReviewError {
    /// Whether upstream could not be asked (rather than answered an error).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, ReviewError::Unavailable(_))
    }
}

/// How long a review may take before upstream counts as unavailable (and
/// a last known answer may stand in): reviews take milliseconds, so this
/// is long enough for a loaded apiserver and short enough that a hung one
/// costs a read little.
pub const REVIEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

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
    let unavailable = |e: &dyn std::fmt::Display| ReviewError::Unavailable(e.to_string());
    let body = serde_json::to_vec(review).map_err(|e| err(&e))?;
    let req = upstream
        .own_request(Method::POST, path, Some(body))
        .map_err(|e| err(&e))?;
    let exchange = async {
        let resp = upstream
            .send(req, Credentials::Proxy)
            .await
            .map_err(|e| unavailable(&e))?;
        let status = resp.status();
        let bytes = Limited::new(resp.into_body(), MAX_REVIEW_BYTES)
            .collect()
            .await
            .map_err(|e| unavailable(&e))?
            .to_bytes();
        Ok::<_, ReviewError>((status, bytes))
    };
    let (status, bytes) = tokio::time::timeout(REVIEW_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            ReviewError::Unavailable(format!("{path}: no answer in {REVIEW_TIMEOUT:?}"))
        })??;
    if status != StatusCode::CREATED && status != StatusCode::OK {
        let message = format!("{path}: {status}: {}", String::from_utf8_lossy(&bytes));
        return Err(
            if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                ReviewError::Unavailable(message)
            } else {
                ReviewError::Upstream(message)
            },
        );
    }
    serde_json::from_slice(&bytes).map_err(|e| err(&e))
}
