//! Differential comparison: the same request to kube-apiserver directly
//! and through the proxy, answers compared after removing only what
//! legitimately differs between two servers reading the same etcd:
//!
//! - a list's `metadata.resourceVersion` (and the `rv` inside its continue
//!   token): the state a cache lists is as of its own resourceVersion,
//!   which may trail or lead the apiserver's watch cache for the same
//!   resource by events of *other* resources. Both are checked to be valid
//!   RVs of the items returned (at least the newest item's RV);
//! - digits in `Status` messages, which name resourceVersions (`too old
//!   resource version: 5 (300)`: the second is the oldest RV each cache
//!   still holds);
//! - the resourceVersion of bookmarks (when each server learned of progress
//!   differs), checked to be ordered with the events around them;
//! - where bookmarks fall in a stream, other than the
//!   `k8s.io/initial-events-end` one, which must be where the apiserver
//!   puts it.
//!
//! Everything else must be identical: status code, `Content-Type`,
//! `Cache-Control`, presence of `Retry-After`, and the body byte for byte
//! as JSON (keys in the same order).

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use crate::client::{Client, Next, Resp, WatchStream};

/// Replaces runs of digits with `<n>`.
pub fn norm_digits(s: &str) -> String {
    let mut out = String::new();
    let mut in_digits = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push_str("<n>");
            }
            in_digits = true;
        } else {
            in_digits = false;
            out.push(c);
        }
    }
    out
}

fn rv_of(v: &Value) -> Option<u64> {
    v["metadata"]["resourceVersion"].as_str()?.parse().ok()
}

/// A JSON body with the varying parts replaced, checking them on the way.
pub fn normalize(body: &Value, what: &str) -> Value {
    let mut v = body.clone();
    let kind = v["kind"].as_str().unwrap_or_default().to_string();
    if kind == "Status" {
        if let Some(m) = v.get("message").and_then(Value::as_str) {
            v["message"] = json!(norm_digits(m));
        }
        if let Some(causes) = v
            .get_mut("details")
            .and_then(|d| d.get_mut("causes"))
            .and_then(Value::as_array_mut)
        {
            for c in causes {
                if let Some(m) = c.get("message").and_then(Value::as_str) {
                    c["message"] = json!(norm_digits(m));
                }
            }
        }
    } else if kind.ends_with("List") || kind == "Table" {
        let list_rv = rv_of(&v);
        let newest_item = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(rv_of)
            .max();
        if let (Some(list), Some(item)) = (list_rv, newest_item) {
            assert!(
                list >= item,
                "{what}: list RV {list} below an item's {item}"
            );
        }
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            if m.contains_key("resourceVersion") {
                m.insert("resourceVersion".into(), json!("<rv>"));
            }
            if let Some(token) = m.get("continue").and_then(Value::as_str) {
                let raw = base64::engine::general_purpose::URL_SAFE
                    .decode(token)
                    .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token))
                    .unwrap_or_else(|e| panic!("{what}: continue token not base64: {e}"));
                let mut decoded: Value = serde_json::from_slice(&raw).unwrap();
                assert_eq!(
                    decoded["rv"].as_u64(),
                    list_rv,
                    "{what}: the token's rv is the list's"
                );
                decoded["rv"] = json!("<rv>");
                m.insert("continue".into(), decoded);
            }
        }
    }
    v
}

/// Asserts two buffered answers are the same, as described above.
pub fn assert_same(direct: &Resp, proxied: &Resp, what: &str) {
    assert_eq!(
        direct.status,
        proxied.status,
        "{what}: status\n direct: {}\n  proxy: {}",
        direct.text(),
        proxied.text()
    );
    for h in ["content-type", "cache-control"] {
        assert_eq!(direct.header(h), proxied.header(h), "{what}: header {h}");
    }
    assert_eq!(
        direct.header("retry-after").is_some(),
        proxied.header("retry-after").is_some(),
        "{what}: Retry-After"
    );
    let is_json = direct
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/json"));
    if !is_json {
        assert_eq!(direct.body, proxied.body, "{what}: body");
        return;
    }
    let (d, p) = (json_values(direct, what), json_values(proxied, what));
    assert_eq!(
        d.len(),
        p.len(),
        "{what}: JSON values\n direct: {}\n  proxy: {}",
        direct.text(),
        proxied.text()
    );
    for (d, p) in d.iter().zip(&p) {
        let (d, p) = (normalize(d, what), normalize(p, what));
        assert_eq!(
            serde_json::to_string_pretty(&d).unwrap(),
            serde_json::to_string_pretty(&p).unwrap(),
            "{what}: body"
        );
    }
}

/// The JSON values of a body: one for an object, one per line for a watch
/// stream read to its end; a watch event's object is normalized like an
/// object.
fn json_values(r: &Resp, what: &str) -> Vec<Value> {
    r.body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: Value = serde_json::from_slice(l)
                .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", r.text()));
            match (v.get("type"), v.get("object")) {
                (Some(t), Some(o)) => json!({"type": t, "object": normalize(o, what)}),
                _ => v,
            }
        })
        .collect()
}

/// Sends `path` with `headers` to both, at once, and compares.
pub async fn same(direct: &Client, proxy: &Client, path: &str, headers: &[(&str, &str)]) -> Resp {
    let (d, p) = tokio::join!(
        direct.send(http::Method::GET, path, headers, None),
        proxy.send(http::Method::GET, path, headers, None)
    );
    assert_same(&d, &p, path);
    p
}

/// What a watch produced: its events (bookmarks included) and whether the
/// server ended it.
#[derive(Debug)]
pub struct Watched {
    pub events: Vec<Value>,
    pub ended: bool,
}

/// Reads `stream` until it has `n` events that are not ordinary bookmarks
/// (the initial-events-end bookmark counts), then for `linger` more to see
/// whether more arrive or the server ends it.
pub async fn collect(stream: &mut WatchStream, n: usize, linger: Duration, what: &str) -> Watched {
    let mut events = Vec::new();
    let mut counted = 0;
    let mut ended = false;
    while counted < n {
        match stream.next(Duration::from_secs(15)).await {
            Next::Event(e) => {
                if !is_plain_bookmark(&e) {
                    counted += 1;
                }
                events.push(e);
            }
            Next::End => {
                ended = true;
                break;
            }
            other => panic!("{what}: after {counted} of {n} events: {other:?}; got {events:?}"),
        }
    }
    if !ended {
        let deadline = tokio::time::Instant::now() + linger;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            match stream.next(left).await {
                Next::Event(e) => events.push(e),
                Next::End => {
                    ended = true;
                    break;
                }
                Next::Timeout => break,
                Next::Error(e) => panic!("{what}: stream broke: {e}"),
            }
        }
    }
    Watched { events, ended }
}

fn is_initial_events_end(e: &Value) -> bool {
    e["type"] == "BOOKMARK"
        && e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
}

fn is_plain_bookmark(e: &Value) -> bool {
    e["type"] == "BOOKMARK" && !is_initial_events_end(e)
}

/// Compares two watch results as described in the module doc.
pub fn assert_same_events(direct: &Watched, proxied: &Watched, what: &str) {
    assert_eq!(
        direct.ended, proxied.ended,
        "{what}: whether the server ended the stream; direct {:?}, proxy {:?}",
        direct.events, proxied.events
    );
    let shape = |w: &Watched| -> Vec<Value> {
        let mut last_rv = 0u64;
        w.events
            .iter()
            .filter(|e| !is_plain_bookmark(e))
            .map(|e| {
                let rv = rv_of(&e["object"]);
                if e["type"] == "BOOKMARK" {
                    // Not below the events before it.
                    if let Some(rv) = rv {
                        assert!(rv >= last_rv, "{what}: bookmark RV {rv} below {last_rv}");
                    }
                    let mut b = e.clone();
                    b["object"]["metadata"]["resourceVersion"] = json!("<rv>");
                    return b;
                }
                if let Some(rv) = rv {
                    last_rv = last_rv.max(rv);
                }
                if e["type"] == "ERROR" {
                    return json!({"type": "ERROR", "object": normalize(&e["object"], what)});
                }
                e.clone()
            })
            .collect()
    };
    let (d, p) = (shape(direct), shape(proxied));
    assert_eq!(
        serde_json::to_string_pretty(&d).unwrap(),
        serde_json::to_string_pretty(&p).unwrap(),
        "{what}: events"
    );
    for w in [direct, proxied] {
        for e in w.events.iter().filter(|e| is_plain_bookmark(e)) {
            let o = &e["object"];
            assert!(
                o["kind"].is_string() && o["apiVersion"].is_string() && rv_of(o).is_some(),
                "{what}: bookmark shape {e}"
            );
        }
    }
}
