//! etcd's v3 JSON gateway, the little a control plane needs of it: the
//! current revision, and the puts and compaction that emulate
//! `etcdutl snapshot restore --bump-revision --mark-compacted`. Plain
//! HTTP/1.1 on loopback, one kept connection per call sequence.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

use serde_json::{Value, json};

/// A kept connection to the gateway.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn open(port: u16) -> io::Result<Conn> {
        let s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    /// POSTs `body` (JSON) to `path`; the answer's JSON.
    fn call(&mut self, path: &str, body: &Value) -> io::Result<Value> {
        let body = body.to_string();
        write!(
            self.writer,
            "POST {path} HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        self.writer.flush()?;
        let mut status = String::new();
        self.reader.read_line(&mut status)?;
        let (mut length, mut chunked) = (None, false);
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line)? == 0 {
                return Err(io::Error::other("etcd closed the connection"));
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse::<usize>().ok();
            } else if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
        }
        let mut out = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                self.reader.read_line(&mut size)?;
                let n = usize::from_str_radix(size.trim(), 16).map_err(io::Error::other)?;
                let mut chunk = vec![0; n + 2];
                self.reader.read_exact(&mut chunk)?;
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&chunk[..n]);
            }
        } else {
            let n = length.ok_or_else(|| io::Error::other("no Content-Length"))?;
            out.resize(n, 0);
            self.reader.read_exact(&mut out)?;
        }
        if !status.contains(" 200 ") {
            return Err(io::Error::other(format!(
                "{path}: {} {}",
                status.trim(),
                String::from_utf8_lossy(&out)
            )));
        }
        serde_json::from_slice(&out).map_err(io::Error::other)
    }
}

fn header_revision(v: &Value) -> io::Result<u64> {
    v["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no revision in {v}")))
}

/// etcd's current revision.
pub fn revision(port: u16) -> io::Result<u64> {
    // A range of one key that need not exist ("kube-testenv", base64).
    let v = Conn::open(port)?.call("/v3/kv/range", &json!({"key": "a3ViZS10ZXN0ZW52"}))?;
    header_revision(&v)
}

/// Puts a key outside the apiserver's prefix until the revision reaches
/// `target`, then compacts at the head: the bump and the compaction mark
/// of `etcdutl snapshot restore --bump-revision --mark-compacted`, for
/// the apiserver's watches. Returns the head.
pub fn bump_and_compact(port: u16, target: u64) -> io::Result<u64> {
    let mut conn = Conn::open(port)?;
    // "/kube-testenv/bump" and "x", base64.
    let put = json!({"key": "L2t1YmUtdGVzdGVudi9idW1w", "value": "eA=="});
    let head = header_revision(&conn.call("/v3/kv/range", &json!({"key": "YQ=="}))?)?;
    // Puts from several connections at once, which etcd commits in shared
    // raft batches: one at a time, a three-member cluster's fsyncs make a
    // bump of a thousand revisions take most of a minute.
    let heads = std::thread::scope(|s| {
        let workers: Vec<_> = (0..16)
            .map(|_| {
                s.spawn(|| -> io::Result<u64> {
                    let mut conn = Conn::open(port)?;
                    let mut head = head;
                    while head < target {
                        head = header_revision(&conn.call("/v3/kv/put", &put)?)?;
                    }
                    Ok(head)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(io::Error::other("a bump worker panicked")))
            })
            .collect::<io::Result<Vec<u64>>>()
    })?;
    let head = heads.into_iter().max().unwrap_or(head).max(head);
    conn.call(
        "/v3/kv/compaction",
        &json!({"revision": head.to_string(), "physical": true}),
    )?;
    Ok(head)
}

/// The member at `port`'s `/v3/maintenance/status`: its own ID
/// (`header.member_id`) and its leader's (`leader`, `"0"` or absent while
/// it knows none), as etcd's JSON gateway prints uint64s, strings.
fn status(port: u16) -> io::Result<(String, String)> {
    let v = Conn::open(port)?.call("/v3/maintenance/status", &json!({}))?;
    let id = |x: &Value| x.as_str().unwrap_or_default().to_string();
    Ok((id(&v["header"]["member_id"]), id(&v["leader"])))
}

/// Whether the member at `port` answers and knows a leader: after a
/// restart, that it has rejoined its cluster.
pub fn knows_leader(port: u16) -> io::Result<bool> {
    let (_, leader) = status(port)?;
    Ok(!leader.is_empty() && leader != "0")
}

/// Whether the member at `port` leads its cluster now.
pub fn is_leader(port: u16) -> io::Result<bool> {
    let (member, leader) = status(port)?;
    Ok(!member.is_empty() && leader == member)
}
