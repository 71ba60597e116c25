//! [`UpstreamError`]: why the apiserver could not be reached, as a metric
//! label and as the `503` a client sees; and [`error_chain`] for messages.

use apimachinery::status::Status;

/// An error reaching the apiserver. Every variant is upstream-side.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The kubeconfig or in-cluster configuration could not be loaded.
    #[error("loading the upstream configuration: {0}")]
    Config(String),
    /// Opening the TCP or TLS connection failed or timed out.
    #[error("connecting to the apiserver: {0}")]
    Connect(String),
    /// The request failed after the connection was opened.
    #[error("apiserver request failed: {0}")]
    Request(String),
    /// The proxy's credentials could not be produced (exec plugin or token
    /// file failure).
    #[error("obtaining upstream credentials: {0}")]
    Credentials(String),
}

// === impl UpstreamError ===

impl UpstreamError {
    /// The metric label for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            UpstreamError::Config(_) => "config",
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Request(_) => "protocol",
            UpstreamError::Credentials(_) => "credentials",
        }
    }

    /// The `503 ServiceUnavailable` a client sees; with `Retry-After: 1`
    /// when the apiserver could not be reached, so client-go retries.
    pub fn to_status(&self) -> Status {
        let status = Status::service_unavailable(self.to_string());
        match self {
            UpstreamError::Config(_) => status,
            _ => status.with_details(apimachinery::status::Details {
                retry_after_seconds: Some(1),
                ..Default::default()
            }),
        }
    }
}

/// The error and its sources, joined, for messages and logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
