//! Watchers: watches opened `per_conn` to an HTTP/2 connection, each
//! measuring the delivery latency of the events that carry a write time
//! (JSON lines, or protobuf frames).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use tokio_util::sync::CancellationToken;

use crate::client::{Conn, Proto, Target};
use crate::stats::{micros, unix_nanos};

#[derive(Debug, Default)]
pub struct WatchOut {
    /// Delivery latencies (µs) of events carrying the annotation.
    pub latencies: Vec<u32>,
    /// Their write times (Unix ns), which identify the events.
    pub sent: Vec<u64>,
    /// Other events (bookmarks...).
    pub other: u64,
    pub bytes: u64,
    pub error: Option<String>,
}

pub struct Counters {
    pub started: AtomicUsize,
    pub delivered: AtomicU64,
}

/// The write time embedded in a watch event (a JSON line, or a protobuf
/// frame: the annotation's map entry is the key, then field 2, its
/// length and the digits), if any.
pub fn sent_at(line: &[u8]) -> Option<u64> {
    const NEEDLE: &[u8] = b"\"kcp-load/sent-unix-nanos\":\"";
    const KEY: &[u8] = b"kcp-load/sent-unix-nanos\x12";
    let at = match line.windows(NEEDLE.len()).position(|w| w == NEEDLE) {
        Some(at) => at + NEEDLE.len(),
        None => line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len() + 1,
    };
    let digits = line.get(at..)?;
    let end = digits.iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// The next whole event in `buf`: its length and where the one after it
/// starts (JSON lines, or protobuf frames: a 4-byte big-endian length and
/// the `WatchEvent`).
fn next_event(buf: &[u8], protobuf: bool) -> Option<(usize, usize)> {
    if protobuf {
        let len = u32::from_be_bytes(buf.get(..4)?.try_into().ok()?) as usize;
        (buf.len() >= 4 + len).then_some((4 + len, 4 + len))
    } else {
        let pos = buf.iter().position(|b| *b == b'\n')?;
        Some((pos, pos + 1))
    }
}

async fn watch_one(
    target: Target,
    mut conn: Conn,
    path: String,
    stop: CancellationToken,
    counters: Arc<Counters>,
) -> WatchOut {
    let mut out = WatchOut::default();
    let req = match target.request(&conn, Method::GET, &path, None) {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(e.to_string());
            counters.started.fetch_add(1, Ordering::Relaxed);
            return out;
        }
    };
    let resp = tokio::select! {
        _ = stop.cancelled() => return out,
        r = conn.send(req) => r,
    };
    counters.started.fetch_add(1, Ordering::Relaxed);
    let resp = match resp {
        Ok(r) if r.status() == StatusCode::OK => r,
        Ok(r) => {
            out.error = Some(format!("watch answered {}", r.status()));
            return out;
        }
        Err(e) => {
            out.error = Some(format!("{e:#}"));
            return out;
        }
    };
    let protobuf = target.protobuf();
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            f = body.frame() => f,
        };
        let data = match frame {
            None => {
                out.error = Some("watch ended".into());
                break;
            }
            Some(Err(e)) => {
                out.error = Some(format!("watch broke: {e}"));
                break;
            }
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
        };
        let now = unix_nanos();
        out.bytes += data.len() as u64;
        buf.extend_from_slice(&data);
        let mut start = 0;
        let mut events = 0;
        while let Some((line, next)) = next_event(&buf[start..], protobuf) {
            let line = &buf[start..start + line];
            start += next;
            match sent_at(line) {
                Some(sent) => {
                    let lat = Duration::from_nanos(now.saturating_sub(sent));
                    out.latencies.push(micros(lat));
                    out.sent.push(sent);
                    events += 1;
                }
                None => {
                    if line.starts_with(br#"{"type":"ERROR""#)
                        || (protobuf && line.get(4..11) == Some(b"\x0a\x05ERROR"))
                    {
                        out.error = Some(String::from_utf8_lossy(line).into_owned());
                    }
                    out.other += 1;
                }
            }
        }
        buf.drain(..start);
        counters.delivered.fetch_add(events, Ordering::Relaxed);
    }
    out
}

/// Opens `n` watches of `path(i)`, `per_conn` per HTTP/2 connection.
#[allow(clippy::too_many_arguments)]
pub async fn open_watchers(
    target: &Target,
    proto: Proto,
    n: usize,
    per_conn: usize,
    first: usize,
    path: impl Fn(usize) -> String,
    stop: &CancellationToken,
    counters: &Arc<Counters>,
) -> Result<Vec<tokio::task::JoinHandle<WatchOut>>> {
    let mut tasks = Vec::with_capacity(n);
    let mut conn: Option<Conn> = None;
    for i in 0..n {
        let c = match proto {
            Proto::H1 => target.connect(proto).await?,
            Proto::H2 => {
                if i % per_conn.max(1) == 0 || conn.is_none() {
                    conn = Some(target.connect(proto).await?);
                }
                conn.as_ref()
                    .and_then(Conn::share)
                    .ok_or_else(|| anyhow!("not an HTTP/2 connection"))?
            }
        };
        tasks.push(tokio::spawn(watch_one(
            target.clone(),
            c,
            path(first + i),
            stop.clone(),
            counters.clone(),
        )));
    }
    Ok(tasks)
}

pub async fn wait_started(counters: &Counters, n: usize, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while counters.started.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            bail!(
                "only {} of {n} watches started within {timeout:?}",
                counters.started.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::common::writers::object_body;

    #[test]
    fn finds_the_write_time() {
        let line = br#"{"type":"MODIFIED","object":{"metadata":{"annotations":{"kcp-load/sent-unix-nanos":"1732190000123456789"}}}}"#;
        assert_eq!(sent_at(line), Some(1_732_190_000_123_456_789));
        assert_eq!(sent_at(br#"{"type":"BOOKMARK"}"#), None);
        let body = object_body("ConfigMap", "v1", "ns", "n", "AAAA");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["data"]["payload"], "AAAA");
        assert!(sent_at(&body).is_some());
    }
}
