//! Pod streaming subresources: `exec`, `attach` and `portforward` answer an
//! HTTP upgrade (SPDY/3.1 or WebSocket) with `101 Switching Protocols` and
//! then echo every byte back until EOF, which is enough to test that a
//! proxy carries upgraded connections both ways; `log` returns a few
//! lines of text.

use base64::Engine;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::object;
use super::resources::ResourceSpec;
use super::respond;
use super::shutdown::until_stopped;
use super::state::Ctx;
use apimachinery::body::{self, Body};
use apimachinery::status::Status;

const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

fn header_tokens(headers: &HeaderMap, name: header::HeaderName) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

fn pod_exists(ctx: &Ctx, spec: &ResourceSpec, namespace: &str, name: &str) -> Result<(), Status> {
    let key = object::storage_key(spec, namespace, name);
    match ctx.state.store.get(spec, &key) {
        Some(_) => Ok(()),
        None => Err(Status::not_found(&spec.group, &spec.resource, name)),
    }
}

/// Serves `exec`, `attach` or `portforward` on pod `namespace/name`.
pub fn upgrade(
    ctx: &Ctx,
    spec: &ResourceSpec,
    namespace: &str,
    name: &str,
    mut req: Request<Incoming>,
) -> Response<Body> {
    if let Err(status) = pod_exists(ctx, spec, namespace, name) {
        return respond::status(status);
    }
    let headers = req.headers();
    let wants_upgrade = header_tokens(headers, header::CONNECTION)
        .iter()
        .any(|t| t.eq_ignore_ascii_case("upgrade"));
    let Some(protocol) = headers
        .get(header::UPGRADE)
        .cloned()
        .filter(|_| wants_upgrade)
    else {
        return respond::status(Status::bad_request("Upgrade request required"));
    };
    let mut response = Response::new(body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let out = response.headers_mut();
    out.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    out.insert(header::UPGRADE, protocol.clone());
    let is_websocket = protocol
        .to_str()
        .is_ok_and(|p| p.eq_ignore_ascii_case("websocket"));
    if is_websocket {
        if let Some(key) = headers
            .get(header::SEC_WEBSOCKET_KEY)
            .and_then(|k| k.to_str().ok())
        {
            let accept = base64::engine::general_purpose::STANDARD.encode(
                <sha1::Sha1 as sha1::Digest>::digest(format!("{key}{WEBSOCKET_GUID}").as_bytes()),
            );
            if let Ok(v) = HeaderValue::from_str(&accept) {
                out.insert(header::SEC_WEBSOCKET_ACCEPT, v);
            }
        }
        if let Some(first) = header_tokens(headers, header::SEC_WEBSOCKET_PROTOCOL).first() {
            if let Ok(v) = HeaderValue::from_str(first) {
                out.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
            }
        }
    } else if let Some(first) = header_tokens(
        headers,
        header::HeaderName::from_static("x-stream-protocol-version"),
    )
    .first()
    {
        if let Ok(v) = HeaderValue::from_str(first) {
            out.insert("x-stream-protocol-version", v);
        }
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    let shutdown = ctx.shutdown.clone();
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let io = TokioIo::new(upgraded);
        let (mut reader, mut writer) = tokio::io::split(io);
        tokio::select! {
            _ = tokio::io::copy(&mut reader, &mut writer) => {}
            () = until_stopped(shutdown) => {}
        }
    });
    response
}

/// Serves `log` of pod `namespace/name`: three lines of text.
pub fn log(ctx: &Ctx, spec: &ResourceSpec, namespace: &str, name: &str) -> Response<Body> {
    if let Err(status) = pod_exists(ctx, spec, namespace, name) {
        return respond::status(status);
    }
    let container = ctx.param("container").unwrap_or_else(|| "main".into());
    let text: String = (1..=3)
        .map(|i| format!("log line {i} of {namespace}/{name}/{container}\n"))
        .collect();
    respond::text(StatusCode::OK, text)
}
