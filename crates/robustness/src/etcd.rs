//! etcd's v3 JSON gateway (`/v3/kv/range`, `/v3/kv/put`,
//! `/v3/kv/compaction`, `/v3/watch`): the run's reference history comes
//! from etcd itself, not from the apiserver or the proxies it tests, and
//! the compaction fault is made here.

use anyhow::{Context as _, Result, anyhow, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// A key-value of etcd.
#[derive(Debug, Clone)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: u64,
}

/// One message of a watch stream.
#[derive(Debug, Clone)]
pub enum WatchMsg {
    /// Changes at `revision` (the header's) and before: `(key, value, prev)`,
    /// where `value` is `None` for a delete.
    Events(Vec<Change>),
    /// The stream is at `revision`, with nothing to report.
    Progress(u64),
}

/// One change an etcd watch reported.
#[derive(Debug, Clone)]
pub struct Change {
    pub revision: u64,
    pub key: String,
    pub value: Option<Vec<u8>>,
    pub prev: Option<Vec<u8>>,
}

#[derive(Deserialize, Default)]
struct Header {
    #[serde(default)]
    revision: Option<String>,
}

#[derive(Deserialize)]
struct RawKv {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    mod_revision: Option<String>,
}

#[derive(Deserialize)]
struct RangeResponse {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    kvs: Vec<RawKv>,
    #[serde(default)]
    more: bool,
}

#[derive(Deserialize)]
struct WatchEnvelope {
    #[serde(default)]
    result: Option<WatchResult>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WatchResult {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    events: Vec<RawEvent>,
    #[serde(default)]
    canceled: bool,
    #[serde(default)]
    compact_revision: Option<String>,
    #[serde(default)]
    cancel_reason: Option<String>,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    kv: RawKv,
    #[serde(default)]
    prev_kv: Option<RawKv>,
}

fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

fn unb64(s: &str) -> Result<Vec<u8>> {
    B64.decode(s).context("etcd sent invalid base64")
}

fn num(s: Option<&String>) -> u64 {
    s.and_then(|s| s.parse().ok()).unwrap_or_default()
}

/// The smallest key after every key with `prefix` (etcd's `range_end` for
/// a prefix).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A client of an etcd cluster's gateways: each call goes to the member
/// that answered last, else the next one that accepts a connection, so a
/// member killed or restarted does not stop the run's reference.
#[derive(Debug, Clone)]
pub struct Etcd {
    /// `127.0.0.1:<port>` of each member.
    authorities: Vec<String>,
    /// The member to try first.
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Etcd {
    /// `url`: `http://127.0.0.1:<port>`.
    pub fn new(url: &str) -> Etcd {
        Etcd::cluster(&[url.to_string()])
    }

    /// Every member's `http://127.0.0.1:<port>`.
    pub fn cluster(urls: &[String]) -> Etcd {
        Etcd {
            authorities: urls
                .iter()
                .map(|u| {
                    u.trim_start_matches("http://")
                        .trim_end_matches('/')
                        .to_string()
                })
                .collect(),
            next: std::sync::Arc::default(),
        }
    }

    /// A connection to the first member that accepts one, and its
    /// authority.
    async fn connect(&self) -> Result<(tokio::net::TcpStream, &str)> {
        use std::sync::atomic::Ordering;
        let first = self.next.load(Ordering::Relaxed);
        let mut last = None;
        for i in 0..self.authorities.len() {
            let n = (first + i) % self.authorities.len();
            let authority = &self.authorities[n];
            let connect = tokio::net::TcpStream::connect(authority.as_str());
            match tokio::time::timeout(std::time::Duration::from_secs(2), connect).await {
                Ok(Ok(s)) => {
                    self.next.store(n, Ordering::Relaxed);
                    return Ok((s, authority));
                }
                Ok(Err(e)) => last = Some(anyhow!("connecting to etcd at {authority}: {e}")),
                Err(_) => last = Some(anyhow!("connecting to etcd at {authority}: timed out")),
            }
        }
        self.next.store(first + 1, Ordering::Relaxed);
        Err(last.unwrap_or_else(|| anyhow!("no etcd member")))
    }

    /// Sends to a member; a refusal (no leader yet, a member catching up)
    /// or a broken connection is tried again on the next member, for up
    /// to 10 s: the run's reference survives a member's death.
    async fn send(
        &self,
        path: &str,
        body: Value,
    ) -> Result<hyper::Response<hyper::body::Incoming>> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match self.send_once(path, body.clone()).await {
                Ok(resp) => return Ok(resp),
                Err(e) if std::time::Instant::now() > deadline => return Err(e),
                Err(_) => {
                    self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
        }
    }

    async fn send_once(
        &self,
        path: &str,
        body: Value,
    ) -> Result<hyper::Response<hyper::body::Incoming>> {
        let (stream, authority) = self.connect().await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::post(path)
            .header(http::header::HOST, authority)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(&body)?)))?;
        let resp = sender.send_request(req).await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            bail!("etcd {path}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(resp)
    }

    async fn call(&self, path: &str, body: Value) -> Result<Bytes> {
        let resp = self.send(path, body).await?;
        Ok(resp.into_body().collect().await?.to_bytes())
    }

    /// etcd's current revision.
    pub async fn revision(&self) -> Result<u64> {
        let r: RangeResponse = serde_json::from_slice(
            &self
                .call(
                    "/v3/kv/range",
                    json!({"key": b64("\0"), "limit": "1", "keys_only": true}),
                )
                .await?,
        )?;
        Ok(num(r.header.revision.as_ref()))
    }

    /// Every key with `prefix` at `revision`, in pages.
    pub async fn range_prefix(&self, prefix: &str, revision: u64) -> Result<Vec<Kv>> {
        let end = B64.encode(prefix_end(prefix));
        let mut from = prefix.as_bytes().to_vec();
        let mut out = Vec::new();
        loop {
            let r: RangeResponse = serde_json::from_slice(
                &self
                    .call(
                        "/v3/kv/range",
                        json!({"key": B64.encode(&from), "range_end": end, "revision": revision.to_string(), "limit": "1000"}),
                    )
                    .await?,
            )?;
            let more = r.more;
            for kv in r.kvs {
                let key = String::from_utf8(unb64(&kv.key)?)?;
                out.push(Kv {
                    value: kv
                        .value
                        .as_deref()
                        .map(unb64)
                        .transpose()?
                        .unwrap_or_default(),
                    mod_revision: num(kv.mod_revision.as_ref()),
                    key,
                });
            }
            if !more {
                return Ok(out);
            }
            let Some(last) = out.last() else {
                return Ok(out);
            };
            from = last.key.as_bytes().to_vec();
            from.push(0);
        }
    }

    /// Writes `value` at `key` (outside `/registry/`, which the apiserver
    /// owns); returns the new revision.
    pub async fn put(&self, key: &str, value: &str) -> Result<u64> {
        #[derive(Deserialize)]
        struct Put {
            #[serde(default)]
            header: Header,
        }
        let r: Put = serde_json::from_slice(
            &self
                .call("/v3/kv/put", json!({"key": b64(key), "value": b64(value)}))
                .await?,
        )?;
        Ok(num(r.header.revision.as_ref()))
    }

    /// Compacts etcd's history below `revision` (physically).
    pub async fn compact(&self, revision: u64) -> Result<()> {
        self.call(
            "/v3/kv/compaction",
            json!({"revision": revision.to_string(), "physical": true}),
        )
        .await?;
        Ok(())
    }

    /// Watches every key from `start` (inclusive), with previous values,
    /// sending what it reports to `tx` until the stream ends or `tx` is
    /// closed; returns the revision it got to.
    ///
    /// # Errors
    /// When the stream cannot start, breaks, or etcd cancels it (a
    /// compacted start revision).
    pub async fn watch(&self, start: u64, tx: &mpsc::Sender<WatchMsg>) -> Result<u64> {
        let resp = self
            .send(
                "/v3/watch",
                json!({"create_request": {"key": b64("\0"), "range_end": b64("\0"),
                        "start_revision": start.to_string(), "prev_kv": true, "progress_notify": true}}),
            )
            .await?;
        let mut body = resp.into_body();
        let mut buf = BytesMut::new();
        let mut at = start.saturating_sub(1);
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line = buf.split_to(pos + 1);
                let line = &line[..pos];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let env: WatchEnvelope = serde_json::from_slice(line)
                    .with_context(|| format!("etcd watch: {}", String::from_utf8_lossy(line)))?;
                if let Some(e) = env.error {
                    bail!("etcd watch error: {e}");
                }
                let Some(r) = env.result else { continue };
                if r.canceled {
                    return Err(anyhow!(
                        "etcd watch canceled (compact revision {}): {}",
                        num(r.compact_revision.as_ref()),
                        r.cancel_reason.unwrap_or_default()
                    ));
                }
                let header = num(r.header.revision.as_ref());
                if r.events.is_empty() {
                    if header > at {
                        at = header;
                        if tx.send(WatchMsg::Progress(header)).await.is_err() {
                            return Ok(at);
                        }
                    }
                    continue;
                }
                let mut changes = Vec::with_capacity(r.events.len());
                for e in r.events {
                    let revision = num(e.kv.mod_revision.as_ref());
                    let deleted = e.kind.as_deref() == Some("DELETE");
                    changes.push(Change {
                        revision,
                        key: String::from_utf8(unb64(&e.kv.key)?)?,
                        value: if deleted {
                            None
                        } else {
                            Some(
                                e.kv.value
                                    .as_deref()
                                    .map(unb64)
                                    .transpose()?
                                    .unwrap_or_default(),
                            )
                        },
                        prev: e
                            .prev_kv
                            .and_then(|p| p.value)
                            .as_deref()
                            .map(unb64)
                            .transpose()?,
                    });
                    at = at.max(revision);
                }
                if tx.send(WatchMsg::Events(changes)).await.is_err() {
                    return Ok(at);
                }
            }
        }
        Ok(at)
    }
}

/// An object as etcd holds it, as JSON: kube-apiserver stores built-in
/// objects in protobuf by default (`--storage-media-type`), an envelope
/// after the magic `k8s\0`, and custom resources in JSON. `None` for
/// anything else (a marker key, an undecodable value).
pub fn object_value(value: &[u8]) -> Option<Value> {
    if value.starts_with(apimachinery::protobuf::MAGIC) {
        let json = apimachinery::protobuf::object_json(value).ok()?;
        serde_json::from_slice(&json).ok()
    } else {
        serde_json::from_slice(value).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end("/registry/pods/"), b"/registry/pods0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}
