//! The server's stop signal as a connection's work sees it: `true` once
//! the sim is stopped (or restarted), which ends every connection and
//! every upgraded stream at once, like an apiserver going down.
//!
//! A leaf module: the transport (`server`, which raises the signal), the
//! request handler and the streaming subresources (`stream`, which end on
//! it) all use it, so none of them needs to point back at another.

use tokio::sync::watch;

/// Resolves once the server is told to stop (or its handle is gone).
pub async fn until_stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stopped| *stopped).await;
}
