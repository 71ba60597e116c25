//! `get` of one object: resourceVersion unset/`0` read the current state,
//! `N` waits (bounded) until the store reaches N.

use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::{Map, Value};

use super::accept::Output;
use super::errors;
use super::object;
use super::options::parse_rv;
use super::resources::ResourceSpec;
use super::respond;
use super::state::Ctx;
use super::table;
use apimachinery::body::Body;
use apimachinery::status::Status;

/// Serves `GET .../<resource>/<name>` (and `.../<name>/status`).
pub async fn get(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    name: &str,
    output: Output,
) -> Response<Body> {
    respond::either(run(ctx, spec, namespace, name, output).await)
}

async fn run(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    name: &str,
    output: Output,
) -> Result<Response<Body>, Status> {
    let store = &ctx.state.store;
    let rv_param = ctx.param("resourceVersion").unwrap_or_default();
    // The cacher returns the versioner's error unwrapped: a 500 without reason.
    let rv = parse_rv(&rv_param).map_err(errors::unknown_500)?;
    if rv > 0
        && !store
            .wait_for_rv(rv, ctx.state.config.too_large_rv_wait)
            .await
    {
        return Err(Status::too_large_resource_version(rv, store.current_rv()));
    }
    let key = object::storage_key(&spec, namespace, name);
    let obj = store
        .get(&spec, &key)
        .ok_or_else(|| Status::not_found(&spec.group, &spec.resource, name))?;
    Ok(render(
        &spec,
        output,
        &obj,
        &ctx.param("includeObject").unwrap_or_default(),
    ))
}

/// One object in the negotiated form.
pub fn render(
    spec: &ResourceSpec,
    output: Output,
    obj: &Value,
    include_object: &str,
) -> Response<Body> {
    match output {
        Output::Json => respond::json(StatusCode::OK, obj),
        Output::Table(version) => {
            let mut meta = Map::new();
            meta.insert(
                "resourceVersion".into(),
                Value::String(object::meta_str(obj, "resourceVersion").to_string()),
            );
            let row = table::row(spec, obj, include_object, &version);
            respond::json(
                StatusCode::OK,
                &table::table(spec, &version, meta, vec![row]),
            )
        }
        Output::PartialMetadata(version) => {
            respond::json(StatusCode::OK, &table::partial_metadata(obj, &version))
        }
    }
}
