//! Learning the apiservers of a highly available control plane and
//! probing each, for client-side balancing ([`super::balance`]): a round
//! lists the `default/kubernetes` EndpointSlices through the configured
//! address, asks every apiserver known for `/readyz` and for the same list
//! by a consistent read, and hands the [`Balancer`] who is ready and how
//! far each has got. Requests go through the upstream [`Site`] with the
//! proxy's own credentials, pinned to one apiserver each.

use std::net::SocketAddr;
use std::time::Duration;

use http::Uri;

use super::balance::Balancer;
use super::error::UpstreamError;
use super::site::{Credentials, Site};

/// The `default/kubernetes` EndpointSlices, by a consistent read: the
/// apiservers, and the resourceVersion the probed apiserver was current
/// at. A consistent read's resourceVersion is at least etcd's revision
/// when it was asked (the apiserver checks its etcd member by a quorum
/// read, then serves it from its watch cache once that has caught up, or
/// from etcd), so it can be compared across apiservers, where a
/// `resourceVersion=0` list's (one watch cache's, moved by that cache's
/// own progress notifications) cannot. An apiserver whose etcd member is
/// stopped or cut off cannot answer it.
pub(super) const ENDPOINT_SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dkubernetes";

/// One probe round over every apiserver known (learnt first through the
/// configured address): `/readyz`, and a consistent list of the
/// EndpointSlices, each within `timeout`; then the set of apiservers from
/// the ready one with the newest list.
pub(super) async fn probe_round(site: &Site, balancer: &Balancer, timeout: Duration) {
    if balancer.snapshot().is_empty() {
        match endpoint_slices(site, None, timeout).await {
            Ok((_, addrs)) => balancer.set_addrs(addrs),
            Err(error) => {
                tracing::debug!(%error, "could not list the apiservers through the configured address");
            }
        }
    }
    let endpoints = balancer.snapshot();
    let rounds = endpoints.iter().map(|e| async move {
        let ready = matches!(
            get(site, Some(e.addr), "/readyz", timeout).await,
            Ok((http::StatusCode::OK, _))
        );
        let listed = endpoint_slices(site, Some(e.addr), timeout).await.ok();
        (e.clone(), ready, listed)
    });
    let results = futures_util::future::join_all(rounds).await;
    let newest = results
        .iter()
        .filter(|r| r.1)
        .filter_map(|r| r.2.as_ref())
        .max_by_key(|(rv, _)| *rv)
        .map(|(_, addrs)| addrs.clone());
    let probed: Vec<_> = results
        .iter()
        .map(|(e, ready, listed)| (e.clone(), *ready, listed.as_ref().map(|l| l.0)))
        .collect();
    balancer.record_round(&probed);
    if let Some(addrs) = newest {
        balancer.set_addrs(addrs);
    }
}

/// A GET with the proxy's credentials, to one apiserver (or, with `None`,
/// through the configured address), body read within `timeout`.
async fn get(
    site: &Site,
    addr: Option<SocketAddr>,
    path: &str,
    timeout: Duration,
) -> Result<(http::StatusCode, bytes::Bytes), UpstreamError> {
    let mut req = site.own_request(http::Method::GET, path, None)?;
    if let Some(addr) = addr {
        let mut parts = req.uri().clone().into_parts();
        parts.authority = addr.to_string().parse().ok();
        *req.uri_mut() = Uri::from_parts(parts)
            .map_err(|e| UpstreamError::Request(format!("invalid URI: {e}")))?;
    }
    let call = async {
        let resp = site.send(req, Credentials::Proxy).await?;
        let status = resp.status();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map_err(|e| UpstreamError::Request(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| UpstreamError::Request(format!("no answer in {timeout:?}")))?
}

/// The `default/kubernetes` EndpointSlices from one apiserver, by a
/// consistent read: its resourceVersion and the apiservers they name.
async fn endpoint_slices(
    site: &Site,
    addr: Option<SocketAddr>,
    timeout: Duration,
) -> Result<(u64, Vec<SocketAddr>), UpstreamError> {
    let (status, body) = get(site, addr, ENDPOINT_SLICES, timeout).await?;
    if status != http::StatusCode::OK {
        return Err(UpstreamError::Request(format!(
            "listing the apiservers' EndpointSlices: {status}"
        )));
    }
    let list: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| UpstreamError::Request(format!("EndpointSlices list: {e}")))?;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((rv, addrs_of(&list)))
}

/// The apiservers' addresses in EndpointSlices (a `List` of them): each
/// ready endpoint's addresses, on the port named `https` (the `kubernetes`
/// Service's), or the slice's only port.
pub(super) fn addrs_of(list: &serde_json::Value) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for slice in list["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let ports = slice["ports"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let port = ports
            .iter()
            .find(|p| p["name"].as_str() == Some("https"))
            .or(if ports.len() == 1 {
                ports.first()
            } else {
                None
            })
            .and_then(|p| p["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok());
        let Some(port) = port else { continue };
        for ep in slice["endpoints"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            // `ready` unset means ready (discovery.k8s.io/v1).
            if ep["conditions"]["ready"].as_bool() == Some(false) {
                continue;
            }
            for a in ep["addresses"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                if let Some(ip) = a.as_str().and_then(|s| s.parse::<std::net::IpAddr>().ok()) {
                    out.push(SocketAddr::new(ip, port));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn addresses_come_from_ready_endpoints_on_the_https_port() {
        let list = json!({"items": [
            {"ports": [{"name": "https", "port": 6443}], "endpoints": [
                {"addresses": ["10.0.0.1"]},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false}}
            ]},
            {"ports": [{"port": 7443}], "endpoints": [{"addresses": ["fd00::1"]}]},
            {"ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}], "endpoints": [{"addresses": ["10.0.0.9"]}]}
        ]});
        let got: Vec<String> = addrs_of(&list).iter().map(ToString::to_string).collect();
        assert_eq!(got, ["10.0.0.1:6443", "10.0.0.2:6443", "[fd00::1]:7443"]);
        assert!(addrs_of(&json!({"items": null})).is_empty());
    }
}
