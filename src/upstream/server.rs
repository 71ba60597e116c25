//! What the kube-apiserver behind the upstream is, as far as the proxy
//! must mirror it: its version (`GET /version`, readable by anyone) and
//! which impersonation filter it runs, learnt from its own answers at
//! start, every 5 minutes, and when the upstream switches servers (a
//! fallback, or another apiserver behind a balancer after an upgrade).
//!
//! The impersonation filter decides how the proxy authorizes impersonation
//! requested by certificate clients (it forwards them on its own
//! credentials, so it must decide as the apiserver would):
//! kube-apiserver 1.36 runs the constrained filter (KEP-5284,
//! `ConstrainedImpersonation` beta and on), 1.35 the legacy one unless
//! the feature is turned on, 1.34 only the legacy one
//! (`staging/src/k8s.io/apiserver/pkg/server/config.go`). A feature gate
//! can move either way, so the filter is read from the apiserver's answer
//! to an impersonation it refuses: the constrained filter names the
//! `impersonate-on:<mode>:<verb>` check that failed, the legacy one the
//! `impersonate` verb on `users`. Where the proxy's credential may
//! impersonate anyone (an administrator's), nothing is refused and the
//! version decides.

use std::time::Duration;

use http::{HeaderValue, Method, StatusCode};
use parking_lot::RwLock;
use prometheus::IntGaugeVec;
use tokio_util::sync::CancellationToken;

use apimachinery::impersonation::Filter;

use super::failover::Upstream;

/// How often the apiserver is asked again.
const RELEARN: Duration = Duration::from_secs(300);

/// The user the impersonation probe names (refused unless the proxy's
/// credential may impersonate anyone; nothing is read as it).
const PROBE_USER: &str = "kube-cache-proxy:impersonation-check";

/// What was learnt of the apiserver.
#[derive(Debug, Default)]
pub struct ServerInfo {
    learnt: RwLock<Learnt>,
}

#[derive(Debug, Default, Clone)]
struct Learnt {
    /// `/version`'s `gitVersion` (`v1.36.2`).
    git_version: Option<String>,
    filter: Option<Filter>,
}

impl ServerInfo {
    /// The apiserver's `gitVersion`, once learnt.
    pub fn git_version(&self) -> Option<String> {
        self.learnt.read().git_version.clone()
    }

    /// The impersonation filter the apiserver runs; until learnt, the
    /// constrained one (kube-apiserver 1.36's, which this proxy mirrors).
    pub fn impersonation_filter(&self) -> Filter {
        self.learnt.read().filter.unwrap_or(Filter::Constrained)
    }

    /// Asks the apiserver once.
    ///
    /// # Errors
    /// When it cannot be reached or its `/version` cannot be read.
    pub async fn learn(&self, upstream: &Upstream) -> Result<(), String> {
        let git_version = version(upstream).await?;
        let filter = match probe_filter(upstream).await? {
            Some(filter) => filter,
            None => default_filter(&git_version),
        };
        let before = std::mem::replace(
            &mut *self.learnt.write(),
            Learnt {
                git_version: Some(git_version.clone()),
                filter: Some(filter),
            },
        );
        if before.git_version.as_deref() != Some(&git_version) || before.filter != Some(filter) {
            tracing::info!(version = %git_version, impersonation = ?filter, "upstream kube-apiserver");
        }
        Ok(())
    }

    /// Learns now, then every 5 minutes and whenever the upstream
    /// switches servers, until `shutdown`; `info` is the
    /// `upstream_info{git_version, impersonation}` gauge.
    pub async fn run(&self, upstream: Upstream, info: IntGaugeVec, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(500);
        loop {
            let switched = upstream.site_changed();
            let wait = match self.learn(&upstream).await {
                Ok(()) => {
                    backoff = Duration::from_millis(500);
                    info.reset();
                    let learnt = self.learnt.read().clone();
                    if let (Some(v), Some(f)) = (learnt.git_version, learnt.filter) {
                        info.with_label_values(&[v.as_str(), filter_name(f)]).set(1);
                    }
                    RELEARN
                }
                Err(reason) => {
                    tracing::debug!(%reason, "cannot yet read the upstream apiserver's version");
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    backoff
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = switched => {}
            }
        }
    }
}

/// The label of a filter.
pub fn filter_name(filter: Filter) -> &'static str {
    match filter {
        Filter::Constrained => "constrained",
        Filter::Legacy => "legacy",
    }
}

/// The filter a version runs by default: constrained from 1.36.
fn default_filter(git_version: &str) -> Filter {
    let minor = git_version
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .map(|m| {
            m.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(u32::MAX);
    if minor >= 36 {
        Filter::Constrained
    } else {
        Filter::Legacy
    }
}

/// `GET /version`'s `gitVersion`.
async fn version(upstream: &Upstream) -> Result<String, String> {
    let req = upstream
        .own_request(Method::GET, "/version", None)
        .map_err(|e| e.to_string())?;
    let (status, body) = upstream.own_exchange(req).await?;
    if status != StatusCode::OK {
        return Err(format!("/version: {status}"));
    }
    let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    v["gitVersion"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "/version has no gitVersion".to_string())
}

/// The filter that refused an impersonation of [`PROBE_USER`]; `None`
/// when nothing refused it.
async fn probe_filter(upstream: &Upstream) -> Result<Option<Filter>, String> {
    // A non-resource path: the impersonation filter runs before the
    // request is served (and `/version` is readable by anyone).
    let mut req = upstream
        .own_request(Method::GET, "/version", None)
        .map_err(|e| e.to_string())?;
    req.headers_mut()
        .insert("impersonate-user", HeaderValue::from_static(PROBE_USER));
    let (status, body) = upstream.own_exchange(req).await?;
    if status != StatusCode::FORBIDDEN {
        return Ok(None);
    }
    Ok(filter_of_refusal(&body))
}

/// Which filter wrote a refusal's message.
fn filter_of_refusal(body: &[u8]) -> Option<Filter> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let message = v["message"].as_str()?;
    if message.contains(" cannot impersonate-on:") {
        Some(Filter::Constrained)
    } else if message.contains(" cannot impersonate resource \"users\"") {
        Some(Filter::Legacy)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_is_read_from_the_refusal_else_the_version() {
        // kube-apiserver v1.36.2 and v1.34.9's answers to a node's
        // credential impersonating a user.
        let constrained = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden: User \"system:node:n\" cannot impersonate-on:user-info:get path \"/version\"","reason":"Forbidden","details":{},"code":403}"#;
        let legacy = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"users \"kube-cache-proxy:impersonation-check\" is forbidden: User \"system:node:n\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope","reason":"Forbidden","details":{"name":"kube-cache-proxy:impersonation-check","kind":"users"},"code":403}"#;
        assert_eq!(filter_of_refusal(constrained), Some(Filter::Constrained));
        assert_eq!(filter_of_refusal(legacy), Some(Filter::Legacy));
        // Refused as the impersonated user: the filter let it through.
        let as_user = br#"{"kind":"Status","message":"configmaps \"x\" is forbidden: User \"kube-cache-proxy:impersonation-check\" cannot get resource \"configmaps\""}"#;
        assert_eq!(filter_of_refusal(as_user), None);
        assert_eq!(filter_of_refusal(b"not json"), None);
        assert_eq!(default_filter("v1.36.2"), Filter::Constrained);
        assert_eq!(default_filter("v1.37.0-alpha.1"), Filter::Constrained);
        assert_eq!(default_filter("v1.35.6"), Filter::Legacy);
        assert_eq!(default_filter("v1.34.9+k3s1"), Filter::Legacy);
    }
}
