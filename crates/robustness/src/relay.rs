//! A TCP relay between a proxy and its upstream, where the run injects
//! network faults: a blackhole (bytes stop flowing both ways, connections
//! stay open, new ones are accepted and hang, as when packets are dropped)
//! and added latency (each chunk delayed). TLS passes through untouched.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the relay does to the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Forward nothing until the mode changes.
    Blackhole,
    /// Forward each chunk after this delay.
    Latency(Duration),
}

/// A running relay.
#[derive(Debug, Clone)]
pub struct Relay {
    addr: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
}

impl Relay {
    /// Listens on a free 127.0.0.1 port and relays every connection to
    /// one of `upstreams` (round-robin, skipping one that refuses: a
    /// Service in front of replicas) until `stop`.
    pub async fn start(upstreams: Vec<SocketAddr>, stop: CancellationToken) -> Result<Relay> {
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = watch::channel(Mode::Pass);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stop.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((client, _)) = accepted else { continue };
                let rx = rx.clone();
                let stop = stop.clone();
                let upstreams = upstreams.clone();
                let next = next.clone();
                tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    let first = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let mut server = None;
                    for i in 0..upstreams.len() {
                        let addr = upstreams[(first + i) % upstreams.len()];
                        if let Ok(s) = TcpStream::connect(addr).await {
                            server = Some(s);
                            break;
                        }
                    }
                    let Some(server) = server else {
                        return;
                    };
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = pump(cr, sw, rx.clone()) => {}
                        () = pump(sr, cw, rx) => {}
                    }
                });
            }
        });
        Ok(Relay {
            addr,
            mode: Arc::new(tx),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes what happens to the bytes, for every connection at once.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

async fn pump<R, W>(mut from: R, mut to: W, mut mode: watch::Receiver<Mode>)
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // A blackhole reads nothing either, so the sender's buffers fill.
        while *mode.borrow_and_update() == Mode::Blackhole {
            if mode.changed().await.is_err() {
                return;
            }
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Pass => break,
                Mode::Latency(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Mode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_holds_and_delays() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let stop = CancellationToken::new();
        let relay = Relay::start(vec![echo_addr], stop.clone()).await.unwrap();
        let mut c = TcpStream::connect(relay.addr()).await.unwrap();
        let mut b = [0u8; 5];
        c.write_all(b"hello").await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"hello");
        relay.set(Mode::Blackhole);
        c.write_all(b"again").await.unwrap();
        let held = tokio::time::timeout(Duration::from_millis(300), c.read_exact(&mut b)).await;
        assert!(held.is_err(), "nothing crosses a blackhole");
        relay.set(Mode::Latency(Duration::from_millis(100)));
        let t = std::time::Instant::now();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"again");
        assert!(t.elapsed() >= Duration::from_millis(100));
        stop.cancel();
    }
}
