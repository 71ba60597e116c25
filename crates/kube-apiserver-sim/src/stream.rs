//! Pod streaming subresources. `exec`, `attach` and `portforward` answer
//! an HTTP upgrade with `101 Switching Protocols`, after the checks
//! kube-apiserver makes first (`pkg/registry/core/pod/strategy.go`: the
//! pod exists, has a node, and the container is its only one or one it
//! has):
//! - WebSocket `exec`/`attach` speak kubectl's remotecommand channel
//!   protocol ([`remotecommand`](super::remotecommand)), running
//!   [`shell`](super::shell);
//! - WebSocket `portforward` echoes every message back;
//! - SPDY/3.1 (and any other upgrade) echoes every byte back until EOF,
//!   which is enough to test that a proxy carries upgraded connections
//!   both ways.
//!
//! `log` returns a few lines of text.

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use super::object;
use super::remotecommand::{self, Options, Program};
use super::resources::ResourceSpec;
use super::respond;
use super::shutdown::until_stopped;
use super::state::Ctx;
use apimachinery::body::{self, Body};
use apimachinery::status::Status;

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

fn get_pod(ctx: &Ctx, spec: &ResourceSpec, namespace: &str, name: &str) -> Result<Value, Status> {
    let key = object::storage_key(spec, namespace, name);
    match ctx.state.store.get(spec, &key) {
        Some(pod) => Ok(pod.as_ref().clone()),
        None => Err(Status::not_found(&spec.group, &spec.resource, name)),
    }
}

/// `validateContainer`: the container asked for, or the pod's only one.
fn container(pod: &Value, name: &str, asked: Option<String>) -> Result<String, Status> {
    let names = |kind: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{kind}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
            .collect()
    };
    let containers = names("containers");
    match asked.filter(|a| !a.is_empty()) {
        Some(asked) => {
            let all = [
                containers,
                names("initContainers"),
                names("ephemeralContainers"),
            ]
            .concat();
            if all.contains(&asked) {
                Ok(asked)
            } else {
                Err(Status::bad_request(format!(
                    "container {asked} is not valid for pod {name}"
                )))
            }
        }
        None => match containers.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(Status::bad_request(format!(
                "a container name must be specified for pod {name}"
            ))),
            _ => {
                let all = [
                    names("initContainers"),
                    containers.clone(),
                    names("ephemeralContainers"),
                ]
                .concat();
                Err(Status::bad_request(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    all.join(" ")
                )))
            }
        },
    }
}

/// A query flag as Go's `strconv.ParseBool` reads it.
fn flag(ctx: &Ctx, name: &str) -> bool {
    ctx.param(name)
        .is_some_and(|v| matches!(v.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True"))
}

/// Serves `exec`, `attach` or `portforward` on pod `namespace/name`.
pub fn upgrade(
    ctx: &Ctx,
    spec: &ResourceSpec,
    namespace: &str,
    name: &str,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let pod = match get_pod(ctx, spec, namespace, name) {
        Ok(pod) => pod,
        Err(status) => return respond::status(status),
    };
    let subresource = ctx.info.subresource.clone();
    let streams = subresource != "portforward";
    if streams {
        if let Err(status) = container(&pod, name, ctx.param("container")) {
            return respond::status(status);
        }
    }
    if pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return respond::status(Status::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
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
    let on_upgrade = hyper::upgrade::on(&mut req);
    let shutdown = ctx.shutdown.clone();
    if !is_websocket {
        if let Some(first) = header_tokens(
            req.headers(),
            header::HeaderName::from_static("x-stream-protocol-version"),
        )
        .first()
        {
            if let Ok(v) = HeaderValue::from_str(first) {
                response
                    .headers_mut()
                    .insert("x-stream-protocol-version", v);
            }
        }
        tokio::spawn(async move {
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded));
            tokio::select! {
                _ = tokio::io::copy(&mut reader, &mut writer) => {}
                () = until_stopped(shutdown) => {}
            }
        });
        return response;
    }

    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY) else {
        return respond::status(Status::bad_request(
            "websocket: not a websocket handshake: 'Sec-WebSocket-Key' header is missing or blank",
        ));
    };
    let accept = derive_accept_key(key.as_bytes());
    if let Ok(v) = HeaderValue::from_str(&accept) {
        response
            .headers_mut()
            .insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    let offered = header_tokens(req.headers(), header::SEC_WEBSOCKET_PROTOCOL);
    if !streams {
        if let Some(v) = offered.first().and_then(|p| HeaderValue::from_str(p).ok()) {
            response
                .headers_mut()
                .insert(header::SEC_WEBSOCKET_PROTOCOL, v);
        }
        tokio::spawn(async move {
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            remotecommand::echo(upgraded, shutdown).await;
        });
        return response;
    }
    let Some(chosen) = remotecommand::negotiate(&offered) else {
        return respond::status(Status::bad_request(format!(
            "unable to upgrade: requested protocol(s) are not supported: {offered:?}; supports [\"{}\" \"{}\"]",
            remotecommand::V5,
            remotecommand::V4
        )));
    };
    response.headers_mut().insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(chosen),
    );
    let options = Options {
        stdin: flag(ctx, "stdin"),
        stdout: flag(ctx, "stdout"),
        stderr: flag(ctx, "stderr"),
        tty: flag(ctx, "tty"),
    };
    let program = if subresource == "exec" {
        Program::Exec(
            form_urlencoded::parse(ctx.query.as_bytes())
                .filter(|(k, _)| k == "command")
                .map(|(_, v)| v.into_owned())
                .collect(),
        )
    } else {
        Program::Attach
    };
    let pod_name = name.to_string();
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        remotecommand::serve(upgraded, chosen, options, program, pod_name, shutdown).await;
    });
    response
}

/// Serves `log` of pod `namespace/name`: three lines of text.
pub fn log(ctx: &Ctx, spec: &ResourceSpec, namespace: &str, name: &str) -> Response<Body> {
    if let Err(status) = get_pod(ctx, spec, namespace, name) {
        return respond::status(status);
    }
    let container = ctx.param("container").unwrap_or_else(|| "main".into());
    let text: String = (1..=3)
        .map(|i| format!("log line {i} of {namespace}/{name}/{container}\n"))
        .collect();
    respond::text(StatusCode::OK, text)
}
