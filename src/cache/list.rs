//! Lists from the cache: selecting a page from a snapshot and writing it as
//! the apiserver does, byte for byte: `{"kind":"PodList","apiVersion":"v1",
//! "metadata":{"resourceVersion":...,"continue":...,"remainingItemCount":...},
//! "items":[...]}` with items in storage-key order and, for built-in types,
//! without `kind`/`apiVersion`.
//!
//! Paging follows `Cacher.GetList`: with no selector, `remainingItemCount`
//! is reported; with one, a page is full after `limit` matches and a
//! continue token is issued as soon as any further object exists.

use std::ops::Bound;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::stream;
use http::{HeaderValue, Response, header};
use http_body::Frame;
use http_body_util::StreamBody;

use crate::body::{Body, BoxError};

use super::continue_token;
use super::filter::Filter;
use super::object::CachedObject;
use super::resource::ResourceInfo;
use super::store::Objects;

/// Bytes per body frame: large enough to amortize framing, small enough to
/// keep a large list from sitting whole in memory.
const CHUNK: usize = 64 * 1024;

/// One page of a list.
#[derive(Debug, Default)]
pub struct Page {
    pub items: Vec<Arc<CachedObject>>,
    pub continue_token: Option<String>,
    pub remaining: Option<i64>,
}

/// The key prefix of a list's scope: `ns/` in a namespace, empty across
/// namespaces or for cluster-scoped resources.
pub fn scope_prefix(namespace: Option<&str>) -> String {
    namespace.map(|ns| format!("{ns}/")).unwrap_or_default()
}

/// Selects a page from `objects`. `start` is a continue token's key
/// relative to the scope; `limit <= 0` means everything; `rv` is the
/// snapshot's RV, written into the continue token.
pub fn select(
    objects: &Objects,
    filter: &Filter,
    prefix: &str,
    start: Option<&str>,
    limit: i64,
    rv: u64,
) -> Page {
    let lower = format!("{prefix}{}", start.unwrap_or(""));
    let upper = upper_bound(prefix);
    let range = || {
        let upper = match &upper {
            Some(u) => Bound::Excluded(u.as_str()),
            None => Bound::Unbounded,
        };
        objects.range::<_, str>((Bound::Included(lower.as_str()), upper))
    };
    let limit = usize::try_from(limit).unwrap_or(0);
    let mut page = Page::default();
    let mut has_more = false;
    if filter.is_unfiltered() {
        let mut total = 0usize;
        for (_, o) in range() {
            total += 1;
            if limit == 0 || page.items.len() < limit {
                page.items.push(o.clone());
            }
        }
        if limit > 0 && total > limit {
            has_more = true;
            page.remaining = Some((total - limit) as i64);
        }
    } else {
        for (_, o) in range() {
            if limit > 0 && page.items.len() >= limit {
                has_more = true;
                break;
            }
            if filter.matches(o) {
                page.items.push(o.clone());
            }
        }
    }
    if has_more && let Some(last) = page.items.last() {
        let relative = last.key().get(prefix.len()..).unwrap_or(last.key());
        page.continue_token = Some(continue_token::encode(rv, relative));
    }
    page
}

/// The smallest key greater than every key with `prefix`, or `None` when
/// the prefix is empty.
pub(crate) fn upper_bound(prefix: &str) -> Option<String> {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0x7f {
            bytes.push(last + 1);
            return String::from_utf8(bytes).ok();
        }
    }
    None
}

/// The list response, streamed in chunks.
pub fn response(page: Page, info: &ResourceInfo, rv: u64) -> Response<Body> {
    let mut head = BytesMut::with_capacity(256);
    head.extend_from_slice(b"{\"kind\":\"");
    head.extend_from_slice(info.list_kind().as_bytes());
    head.extend_from_slice(b"\",\"apiVersion\":\"");
    head.extend_from_slice(info.api_version.as_bytes());
    head.extend_from_slice(b"\",\"metadata\":{\"resourceVersion\":\"");
    head.extend_from_slice(rv.to_string().as_bytes());
    head.extend_from_slice(b"\"");
    if let Some(token) = &page.continue_token {
        head.extend_from_slice(b",\"continue\":\"");
        head.extend_from_slice(token.as_bytes());
        head.extend_from_slice(b"\"");
    }
    if let Some(n) = page.remaining {
        head.extend_from_slice(b",\"remainingItemCount\":");
        head.extend_from_slice(n.to_string().as_bytes());
    }
    head.extend_from_slice(b"},\"items\":[");
    let strip = info.strip_item_type_meta;
    let items = page.items;
    let mut next = 0usize;
    let mut buf = head;
    let mut done = false;
    let chunks = std::iter::from_fn(move || {
        if done {
            return None;
        }
        while next < items.len() && buf.len() < CHUNK {
            if next > 0 {
                buf.extend_from_slice(b",");
            }
            items[next].write_item(&mut buf, strip);
            next += 1;
        }
        if next == items.len() {
            buf.extend_from_slice(b"]}\n");
            done = true;
        }
        let out: Bytes = buf.split().freeze();
        Some(Ok::<_, BoxError>(Frame::data(out)))
    });
    json_response(Body::new(StreamBody::new(stream::iter(chunks))))
}

/// A `200` with the apiserver's JSON headers.
pub fn json_response(body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    if let Ok(id) = HeaderValue::from_str(&uuid::Uuid::new_v4().to_string()) {
        h.insert("audit-id", id);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::FieldSet;
    use crate::selector::LabelSelector;
    use http_body_util::BodyExt;

    fn cm(ns: &str, name: &str, app: &str) -> (Arc<str>, Arc<CachedObject>) {
        let json = format!(
            r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"{ns}","resourceVersion":"1","labels":{{"app":"{app}"}}}}}}"#
        );
        let o =
            Arc::new(CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).unwrap());
        (o.key_arc().clone(), o)
    }

    fn objects() -> Objects {
        [
            cm("a", "x", "1"),
            cm("a", "y", "2"),
            cm("a-b", "z", "1"),
            cm("b", "w", "1"),
        ]
        .into_iter()
        .collect()
    }

    fn names(p: &Page) -> Vec<String> {
        p.items.iter().map(|o| o.key().to_string()).collect()
    }

    #[test]
    fn storage_key_order_and_namespace_range() {
        let all = select(&objects(), &Filter::default(), "", None, 0, 5);
        // "a-b/z" sorts before "a/x": '-' < '/'.
        assert_eq!(names(&all), vec!["a-b/z", "a/x", "a/y", "b/w"]);
        let ns = select(&objects(), &Filter::default(), "a/", None, 0, 5);
        assert_eq!(names(&ns), vec!["a/x", "a/y"]);
    }

    #[test]
    fn paging_without_selector_counts_remaining() {
        let p = select(&objects(), &Filter::default(), "", None, 1, 5);
        assert_eq!(names(&p), vec!["a-b/z"]);
        assert_eq!(p.remaining, Some(3));
        let token = continue_token::decode(p.continue_token.as_deref().unwrap()).unwrap();
        assert_eq!(token.rv, 5);
        let p2 = select(&objects(), &Filter::default(), "", Some(&token.start), 2, 5);
        assert_eq!(names(&p2), vec!["a/x", "a/y"]);
        assert_eq!(p2.remaining, Some(1));
        let token = continue_token::decode(p2.continue_token.as_deref().unwrap()).unwrap();
        let p3 = select(&objects(), &Filter::default(), "", Some(&token.start), 2, 5);
        assert_eq!(names(&p3), vec!["b/w"]);
        assert!(p3.continue_token.is_none());
    }

    #[test]
    fn paging_with_selector_has_no_count() {
        let f = Filter {
            labels: LabelSelector::parse("app=1").unwrap(),
            ..Filter::default()
        };
        let p = select(&objects(), &f, "", None, 2, 5);
        assert_eq!(names(&p), vec!["a-b/z", "a/x"]);
        assert_eq!(p.remaining, None);
        assert!(
            p.continue_token.is_some(),
            "more objects follow a full page"
        );
        let p = select(&objects(), &f, "a/", None, 1, 5);
        assert_eq!(names(&p), vec!["a/x"]);
        assert!(
            p.continue_token.is_some(),
            "a/y follows even though it does not match"
        );
    }

    #[tokio::test]
    async fn response_bytes() {
        let p = select(&objects(), &Filter::default(), "a/", None, 1, 7);
        let info = crate::cache::resource::tests::test_cache().info().clone();
        let resp = response(p, &info, 7);
        assert_eq!(resp.headers()["content-type"], "application/json");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.starts_with(r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":""#), "{text}");
        assert!(text.ends_with(r#""remainingItemCount":1},"items":[{"metadata":{"name":"x","namespace":"a","resourceVersion":"1","labels":{"app":"1"}}}]}
"#), "{text}");
        let empty = response(Page::default(), &info, 7);
        let body = empty.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{\"kind\":\"ConfigMapList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"7\"},\"items\":[]}\n");
    }
}
