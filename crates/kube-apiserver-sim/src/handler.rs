//! The request pipeline, in the apiserver's filter order: authentication
//! (401) → impersonation (403/400) → authorization (403) → the handler,
//! then the headers every response carries (`Audit-Id`,
//! `Cache-Control: no-cache, private`) and the request log.

use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response, header};
use hyper::body::Incoming;
use tokio::sync::watch;

use super::accept;
use super::authn::{self, AuthMethod, UserInfo};
use super::authorizer::{Attributes, Decision};
use super::authz::forbidden;
use super::discovery;
use super::errors;
use super::get;
use super::impersonate;
use super::list;
use super::respond;
use super::review;
use super::state::{Ctx, State};
use super::stats::RequestRecord;
use super::stream;
use super::watch as watch_handler;
use super::write_http;
use apimachinery::body::Body;
use apimachinery::request::RequestInfo;
use apimachinery::status::Status;

/// Per-connection facts the handler needs.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The user of the verified client certificate, if one was presented.
    pub cert_user: Option<UserInfo>,
    /// A certificate was presented that authenticates no one.
    pub cert_rejected: bool,
    /// Fires when the server stops.
    pub shutdown: watch::Receiver<bool>,
}

/// Serves one request.
pub async fn handle(
    state: Arc<State>,
    conn: Arc<ConnInfo>,
    req: Request<Incoming>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let headers = req.headers().clone();
    let info = RequestInfo::parse(&method, &path, Some(&query));
    let label = if info.is_resource_request {
        if info.subresource.is_empty() {
            info.resource.clone()
        } else {
            format!("{}/{}", info.resource, info.subresource)
        }
    } else {
        path.clone()
    };
    state.stats.request(&info.verb, &label);
    let mut record = RequestRecord {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        verb: info.verb.clone(),
        resource: label,
        namespace: info.namespace.clone(),
        name: info.name.clone(),
        user: String::new(),
        groups: Vec::new(),
        authenticated_user: String::new(),
        auth_method: AuthMethod::Failed,
        impersonated: false,
        has_authorization: headers.contains_key(header::AUTHORIZATION),
        accept: headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        status: 0,
    };

    let authenticated = if conn.cert_rejected {
        Err(())
    } else {
        authn::authenticate(
            conn.cert_user.as_ref(),
            &headers,
            &state.tokens,
            state.config.anonymous_auth,
        )
    };
    let mut response = match authenticated {
        Err(()) => respond::status(Status::unauthorized()),
        Ok((user, method_used)) => {
            record.authenticated_user = user.name.clone();
            record.auth_method = method_used;
            let request = Attributes::from_request(&info, &user, &query);
            match impersonate::impersonate(
                &headers,
                &request,
                &state.policy,
                &state.store,
                &state.impersonation_modes,
            )
            .await
            {
                Err(status) => {
                    record.user = user.name.clone();
                    record.groups = user.groups.clone();
                    respond::status(status)
                }
                Ok(impersonated) => {
                    record.impersonated = impersonated.is_some();
                    let user = impersonated.unwrap_or(user);
                    record.user = user.name.clone();
                    record.groups = user.groups.clone();
                    let ctx = Ctx {
                        state: state.clone(),
                        info,
                        query,
                        user,
                        shutdown: conn.shutdown.clone(),
                    };
                    authorized(&ctx, req).await
                }
            }
        }
    };
    let headers = response.headers_mut();
    if let Ok(id) = HeaderValue::from_str(&uuid::Uuid::new_v4().to_string()) {
        headers.insert("audit-id", id);
    }
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-cache, private"));
    record.status = response.status().as_u16();
    state.stats.record(record);
    response
}

async fn authorized(ctx: &Ctx, req: Request<Incoming>) -> Response<Body> {
    let attrs = Attributes::from_request(&ctx.info, &ctx.user, &ctx.query);
    match ctx.state.policy.authorize(&attrs, &ctx.state.store) {
        Decision::Allow => {}
        Decision::Deny(reason) | Decision::NoOpinion(reason) => {
            return respond::status(forbidden(&attrs, &reason));
        }
    }
    if !ctx.info.is_resource_request {
        if *req.method() != Method::GET && *req.method() != Method::HEAD {
            return respond::status(Status::path_not_found());
        }
        return discovery::handle(ctx);
    }
    resource(ctx, req).await
}

/// Routes a resource request to its handler.
async fn resource(ctx: &Ctx, req: Request<Incoming>) -> Response<Body> {
    let info = &ctx.info;
    if review::is_review(&info.api_group, &info.resource) && info.api_version == "v1" {
        return review::handle(ctx, req).await;
    }
    let prefix_ok = (info.api_prefix == "api") == info.api_group.is_empty();
    let Some(spec) = ctx
        .state
        .registry
        .get(&info.api_group, &info.api_version, &info.resource)
        .filter(|_| prefix_ok)
    else {
        return respond::status(Status::path_not_found());
    };
    // Namespaces are cluster-scoped: RequestInfo reports their name as
    // the namespace.
    let namespace = if spec.namespaced {
        info.namespace.clone()
    } else if info.namespace.is_empty() || (spec.group.is_empty() && spec.resource == "namespaces")
    {
        String::new()
    } else {
        return respond::status(Status::path_not_found());
    };
    // A namespaced object's name in the path needs its namespace there
    // too (no route matches otherwise); a list's or a watch's name, which
    // a `metadata.name` field selector pins, selects across namespaces.
    let name_in_path = match info.verb.as_str() {
        "list" => false,
        "watch" => info.legacy_watch_path,
        _ => true,
    };
    if spec.namespaced && namespace.is_empty() && name_in_path && !info.name.is_empty() {
        return respond::status(Status::path_not_found());
    }
    let writes = matches!(
        info.verb.as_str(),
        "create" | "update" | "patch" | "delete" | "deletecollection"
    );
    if writes && ctx.param("dryRun").is_some() {
        // Refused loudly rather than applied for real.
        return respond::status(Status::bad_request(
            "dryRun is not supported by the simulated apiserver",
        ));
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let output = || accept::negotiate(accept.as_deref());
    let name = info.name.as_str();
    let sub = info.subresource.as_str();
    let is_pods = spec.group.is_empty() && spec.resource == "pods";
    match (info.verb.as_str(), sub) {
        ("list", "") | ("watch", "") | ("get", "" | "status") => {
            let Some(out) = output() else {
                return respond::status(errors::not_acceptable());
            };
            if sub == "status" && !spec.status_subresource {
                return respond::status(Status::path_not_found());
            }
            match info.verb.as_str() {
                "list" => list::list(ctx, spec, &namespace, out).await,
                "watch" => {
                    let url_name = if info.legacy_watch_path { name } else { "" };
                    watch_handler::watch(ctx, spec, &namespace, url_name, out).await
                }
                _ => get::get(ctx, spec, &namespace, name, out).await,
            }
        }
        ("create", "") if name.is_empty() => write_http::create(ctx, spec, &namespace, req).await,
        ("update", "" | "status") if sub.is_empty() || spec.status_subresource => {
            write_http::update(ctx, spec, &namespace, name, sub == "status", req).await
        }
        ("patch", "" | "status") if sub.is_empty() || spec.status_subresource => {
            write_http::patch(ctx, spec, &namespace, name, sub == "status", req).await
        }
        ("delete", "") => write_http::delete(ctx, spec, &namespace, name, req).await,
        ("deletecollection", "") => write_http::delete_collection(ctx, spec, &namespace, req).await,
        ("get" | "create", "exec" | "attach" | "portforward") if is_pods => {
            stream::upgrade(ctx, &spec, &namespace, name, req)
        }
        ("get", "log") if is_pods => stream::log(ctx, &spec, &namespace, name),
        (_, "") => respond::status(errors::method_not_supported(
            &spec.group,
            &spec.resource,
            &info.verb,
        )),
        _ => respond::status(Status::path_not_found()),
    }
}
