//! `list`: resourceVersion semantics (unset, `0`, not older than N, exact
//! N), pagination with the cacher's continue tokens and
//! `remainingItemCount`, and JSON, Table or metadata-only output
//! (`/tmp/research/listwatch.md` §1, §2, §6, §10).

use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::{Map, Value, json};

use super::accept::Output;
use super::continue_token;
use super::object;
use super::options::{EXACT, ListOptions, parse_rv};
use super::resources::ResourceSpec;
use super::respond;
use super::selection::Selection;
use super::state::Ctx;
use super::store::TooOld;
use super::table;
use apimachinery::body::Body;
use apimachinery::status::Status;

/// etcd's message for an exact list below the compacted revision.
const EXPIRED: &str = "The resourceVersion for the provided list is too old.";
/// etcd's `inconsistentContinue` message.
const INCONSISTENT_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// Serves a list of `spec` in `namespace` (empty: all).
pub async fn list(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    output: Output,
) -> Response<Body> {
    respond::either(run(ctx, spec, namespace, output).await)
}

async fn run(
    ctx: &Ctx,
    spec: Arc<ResourceSpec>,
    namespace: &str,
    output: Output,
) -> Result<Response<Body>, Status> {
    let opts = ListOptions::parse(&ctx.query, false, spec.fields)?;
    let sel = Selection {
        spec: spec.clone(),
        namespace: namespace.to_string(),
        labels: opts.label_selector.clone(),
        fields: opts.field_selector.clone(),
    };
    let store = &ctx.state.store;
    let wait = ctx.state.config.too_large_rv_wait;

    // storage.ValidateListOptions: the token is decoded before the RV check.
    let mut start = None;
    let mut at = None;
    if !opts.continue_token.is_empty() {
        let (key, token_rv) = continue_token::decode(&opts.continue_token)
            .map_err(|e| Status::bad_request(format!("invalid continue token: {e}")))?;
        if !opts.resource_version.is_empty() && opts.resource_version != "0" {
            return Err(Status::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        start = Some(format!("{}{key}", sel.prefix()));
        if let Ok(rv) = u64::try_from(token_rv) {
            at = Some(rv);
        }
    }
    let rv = parse_rv(&opts.resource_version)
        .map_err(|e| Status::bad_request(format!("invalid resource version: {e}")))?;
    let legacy_exact = opts.resource_version_match.is_empty() && opts.limit > 0 && rv > 0;
    if start.is_none() && (opts.resource_version_match == EXACT || legacy_exact) {
        at = Some(rv);
    }
    let wanted = at.unwrap_or(rv);
    if wanted > 0 && !store.wait_for_rv(wanted, wait).await {
        return Err(Status::too_large_resource_version(
            wanted,
            store.current_rv(),
        ));
    }

    let (list_rv, items) = match store.list(&spec, at, &sel.prefix(), start.as_deref()) {
        Ok(read) => read,
        Err(TooOld { .. }) => {
            let status = Status::expired(if start.is_some() {
                INCONSISTENT_CONTINUE
            } else {
                EXPIRED
            });
            return Ok(match &start {
                Some(key) => {
                    let token =
                        continue_token::encode(-1, sel.relative_key(key).trim_end_matches('\0'));
                    respond::status_with_continue(status, &token)
                }
                None => respond::status(status),
            });
        }
    };

    // A list pinning one name reads that one key: at most one item, no
    // continue token (without a continue token of its own; with one,
    // `MatchesSingle` is false and the list walks on).
    let single = start.as_ref().map_or_else(|| sel.single_key(), |_| None);
    let items = match &single {
        Some(key) => items.into_iter().filter(|(k, _)| k == key).collect(),
        None => items,
    };
    // computeListLimit: the limit is ignored for resourceVersion=0.
    let limit = if single.is_some() || opts.limit <= 0 || opts.resource_version == "0" {
        0
    } else {
        usize::try_from(opts.limit).unwrap_or(usize::MAX)
    };
    let page = paginate(&sel, items, limit);
    let mut meta = Map::new();
    meta.insert("resourceVersion".into(), Value::String(list_rv.to_string()));
    if let Some(last) = &page.continue_after {
        let rv = i64::try_from(list_rv).unwrap_or(i64::MAX);
        meta.insert(
            "continue".into(),
            Value::String(continue_token::encode(rv, sel.relative_key(last))),
        );
        if let Some(n) = page.remaining {
            meta.insert("remainingItemCount".into(), json!(n));
        }
    }
    Ok(render(
        &spec,
        output,
        meta,
        &page.items,
        &opts.include_object,
    ))
}

/// One page of a list.
struct Page {
    items: Vec<Arc<Value>>,
    /// Key of the last item returned, when more items follow.
    continue_after: Option<String>,
    remaining: Option<i64>,
}

/// `Cacher.GetList`'s paging: without selectors the first `limit` items,
/// with `remainingItemCount`; with selectors, matching items until the
/// page is full, `continue` set as soon as any item (matching or not)
/// follows.
fn paginate(sel: &Selection, items: Vec<(String, Arc<Value>)>, limit: usize) -> Page {
    if sel.selects_everything() {
        let total = items.len();
        if limit > 0 && total > limit {
            let last = items[limit - 1].0.clone();
            return Page {
                items: items.into_iter().take(limit).map(|(_, v)| v).collect(),
                continue_after: Some(last),
                remaining: i64::try_from(total - limit).ok(),
            };
        }
        return Page {
            items: items.into_iter().map(|(_, v)| v).collect(),
            continue_after: None,
            remaining: None,
        };
    }
    let mut selected = Vec::new();
    let mut last = None;
    let mut more = false;
    for (key, obj) in items {
        if limit > 0 && selected.len() >= limit {
            more = true;
            break;
        }
        if sel.matches(&obj) {
            selected.push(obj);
            last = Some(key);
        }
    }
    Page {
        items: selected,
        continue_after: if more { last } else { None },
        remaining: None,
    }
}

/// The list body in the negotiated form.
pub fn render(
    spec: &ResourceSpec,
    output: Output,
    meta: Map<String, Value>,
    items: &[Arc<Value>],
    include_object: &str,
) -> Response<Body> {
    let body = match output {
        Output::Json => json!({
            "kind": format!("{}List", spec.kind),
            "apiVersion": spec.api_version(),
            "metadata": meta,
            "items": items.iter().map(|o| object::list_item(spec, o)).collect::<Vec<_>>(),
        }),
        Output::Table(version) => {
            let rows = items
                .iter()
                .map(|o| table::row(spec, o, include_object, &version))
                .collect();
            table::table(spec, &version, meta, rows)
        }
        Output::PartialMetadata(version) => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": format!("meta.k8s.io/{version}"),
            "metadata": meta,
            // The apiserver appends to a nil slice: an empty list's items
            // are `null` (handlers/response.go asPartialObjectMetadataList).
            "items": if items.is_empty() { Value::Null } else {
                items.iter().map(|o| table::partial_metadata(o, &version)).collect()
            },
        }),
    };
    respond::json(StatusCode::OK, &body)
}
