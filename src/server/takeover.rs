//! Zero-downtime takeover: a second proxy process, started with the same
//! configuration while the first still runs (a DaemonSet rolling update
//! with `maxSurge: 1`, a second static pod, a manual upgrade), takes over
//! the listening sockets themselves, so no connection is ever refused and
//! none waiting in the accept queue is lost.
//!
//! The protocol, over the Unix socket `takeover.socketPath` (created 0600
//! in a 0700 directory; the running proxy accepts only a peer with its own
//! uid, since whoever gets the sockets serves the node's clients):
//!
//! 1. the successor connects and sends `{"hello":1}`;
//! 2. the running proxy writes fresh cache snapshots (the successor
//!    resumes from them instead of listing), stops writing more, and sends
//!    its listening sockets (`SCM_RIGHTS`) with their names,
//!    `{"listeners":["api","admin","metrics"]}` (`metrics` when
//!    `metricsListen` is set); the successor uses each one its own
//!    configuration names at the same address, and binds the others;
//! 3. the successor fills its caches and resumes its upstream watches;
//!    once ready it sends `{"ready":true}` and starts accepting;
//! 4. the running proxy stops accepting, ends every watch with a clean end
//!    of stream (clients re-watch from their last resourceVersion, now to
//!    the successor), finishes in-flight requests, answers
//!    `{"draining":true}`, and then idles until it is told to stop (a
//!    process that exited would be restarted by kubelet, and would take
//!    the sockets back).
//!
//! If the successor goes away or is not ready within
//! `takeover.readyTimeoutSeconds`, the running proxy carries on as before
//! and the successor exits with an error.

use std::io;
use std::net::TcpListener as StdTcpListener;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// How long each step of the handshake may take, besides the successor
/// getting ready.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// One line of the protocol.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
struct Message {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hello: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    listeners: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    draining: Option<bool>,
}

fn protocol(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

async fn write_line(stream: &mut UnixStream, m: &Message) -> io::Result<()> {
    let mut line = serde_json::to_vec(m).map_err(io::Error::other)?;
    line.push(b'\n');
    tokio::time::timeout(STEP_TIMEOUT, stream.write_all(&line))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

async fn read_line(
    reader: &mut BufReader<&mut UnixStream>,
    timeout: Duration,
) -> io::Result<Message> {
    let mut line = String::new();
    let n = tokio::time::timeout(timeout, reader.read_line(&mut line))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    if n == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    serde_json::from_str(&line).map_err(|e| protocol(format!("takeover message: {e}")))
}

/// A running proxy that is handing its sockets over to this process.
#[derive(Debug)]
pub struct Predecessor {
    stream: UnixStream,
}

/// The most listening sockets handed over.
const MAX_LISTENERS: usize = 3;

/// The listening sockets received from a predecessor, by name.
#[derive(Debug)]
pub struct Received {
    pub predecessor: Predecessor,
    pub listeners: Vec<(String, StdTcpListener)>,
}

impl Received {
    /// Takes the listener named `name`.
    pub fn take(&mut self, name: &str) -> Option<StdTcpListener> {
        let i = self.listeners.iter().position(|(n, _)| n == name)?;
        Some(self.listeners.remove(i).1)
    }
}

impl Predecessor {
    /// Asks the proxy listening on `path` for its sockets, by name. `None`
    /// when nothing listens there (no proxy runs, or it predates
    /// takeover). Which of them to use is the caller's choice: a new
    /// configuration may listen elsewhere, or on fewer or more sockets.
    ///
    /// # Errors
    /// When a proxy answered but the handshake failed.
    pub async fn connect(path: &Path) -> io::Result<Option<Received>> {
        let mut stream = match UnixStream::connect(path).await {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        write_line(
            &mut stream,
            &Message {
                hello: Some(1),
                ..Message::default()
            },
        )
        .await?;
        // The predecessor writes its snapshots first; allow for a large
        // cache.
        let (fds, payload) = tokio::time::timeout(STEP_TIMEOUT * 6, receive_fds(&stream))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        let m: Message = serde_json::from_slice(payload.trim_ascii_end())
            .map_err(|e| protocol(format!("takeover message: {e}")))?;
        let names = m.listeners.unwrap_or_default();
        if fds.len() != names.len() || names.len() > MAX_LISTENERS {
            return Err(protocol(format!(
                "the running proxy named {names:?} and sent {} descriptors",
                fds.len()
            )));
        }
        let mut listeners = Vec::with_capacity(names.len());
        for (name, fd) in names.into_iter().zip(fds) {
            let l = StdTcpListener::from(fd);
            l.set_nonblocking(true)?;
            listeners.push((name, l));
        }
        Ok(Some(Received {
            predecessor: Predecessor { stream },
            listeners,
        }))
    }

    /// Tells the predecessor this process is ready and waits until it has
    /// stopped accepting and is draining.
    ///
    /// # Errors
    /// When the predecessor does not confirm.
    pub async fn take_over(mut self) -> io::Result<()> {
        write_line(
            &mut self.stream,
            &Message {
                ready: Some(true),
                ..Message::default()
            },
        )
        .await?;
        let mut reader = BufReader::new(&mut self.stream);
        let m = read_line(&mut reader, STEP_TIMEOUT).await?;
        if m.draining == Some(true) {
            Ok(())
        } else {
            Err(protocol(format!("expected draining, got {m:?}")))
        }
    }
}

/// Receives one message with file descriptors.
async fn receive_fds(stream: &UnixStream) -> io::Result<(Vec<OwnedFd>, Vec<u8>)> {
    loop {
        stream.readable().await?;
        let result = stream.try_io(tokio::io::Interest::READABLE, || {
            let mut space =
                [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_LISTENERS))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut buf = [0u8; 1024];
            let msg = rustix::net::recvmsg(
                stream.as_fd(),
                &mut [io::IoSliceMut::new(&mut buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(io::Error::from)?;
            let mut fds = Vec::new();
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = m {
                    fds.extend(received);
                }
            }
            Ok((fds, buf[..msg.bytes].to_vec()))
        });
        match result {
            Ok((fds, payload)) if payload.is_empty() && fds.is_empty() => {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            Ok(r) => return Ok(r),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Sends one message with file descriptors.
async fn send_fds(stream: &UnixStream, fds: &[&OwnedFd], payload: &[u8]) -> io::Result<()> {
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    loop {
        stream.writable().await?;
        let result = stream.try_io(tokio::io::Interest::WRITABLE, || {
            let mut space =
                [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_LISTENERS))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
                return Err(io::Error::other("control buffer too small"));
            }
            rustix::net::sendmsg(
                stream.as_fd(),
                &[io::IoSlice::new(payload)],
                &mut control,
                SendFlags::empty(),
            )
            .map_err(io::Error::from)
        });
        match result {
            Ok(n) if n == payload.len() => return Ok(()),
            Ok(_) => return Err(io::Error::other("short write")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Copies of this process's listening sockets, to hand over, by name.
#[derive(Debug, Default)]
pub struct Offer {
    pub listeners: Vec<(String, OwnedFd)>,
}

impl Offer {
    /// Adds a copy of `listener`'s socket as `name`.
    ///
    /// # Errors
    /// When the descriptor cannot be duplicated.
    pub fn add(&mut self, name: &str, listener: &impl AsFd) -> io::Result<()> {
        self.listeners
            .push((name.to_string(), listener.as_fd().try_clone_to_owned()?));
        Ok(())
    }
}

/// What the running proxy does around a handover.
pub trait Handover: Send + Sync {
    /// Before the sockets are sent: write fresh snapshots, then write no
    /// more.
    fn prepare(&self) -> impl std::future::Future<Output = ()> + Send;
    /// The handover did not happen: carry on.
    fn abort(&self);
}

/// The Unix socket on which this process hands over to a successor.
#[derive(Debug)]
pub struct Server {
    listener: UnixListener,
}

impl Server {
    /// Listens on `path` (a stale socket file is replaced; the directory
    /// is created 0700), mode 0600.
    ///
    /// # Errors
    /// When the socket cannot be created.
    pub fn bind(path: &Path) -> io::Result<Server> {
        if let Some(dir) = path.parent() {
            create_private_dir(dir)?;
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        set_mode(path, 0o600)?;
        Ok(Server { listener })
    }

    /// Serves successors until one is ready, then returns: the caller
    /// drains. A successor that fails or is not ready within
    /// `ready_timeout` is dropped (after [`Handover::abort`]) and the next
    /// one awaited. Returns the connection, to confirm the drain on.
    pub async fn serve(
        &self,
        offer: &Offer,
        handover: &impl Handover,
        ready_timeout: Duration,
    ) -> Successor {
        loop {
            let mut stream = match self.listener.accept().await {
                Ok((s, _)) => s,
                Err(error) => {
                    tracing::warn!(%error, "takeover socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            match self
                .offer(&mut stream, offer, handover, ready_timeout)
                .await
            {
                Ok(()) => return Successor { stream },
                Err(error) => {
                    handover.abort();
                    tracing::warn!(%error, "takeover by a successor failed; carrying on");
                }
            }
        }
    }

    async fn offer(
        &self,
        stream: &mut UnixStream,
        offer: &Offer,
        handover: &impl Handover,
        ready_timeout: Duration,
    ) -> io::Result<()> {
        let peer = rustix::net::sockopt::socket_peercred(stream.as_fd())?;
        let me = rustix::process::geteuid();
        if peer.uid != me {
            return Err(protocol(format!(
                "peer uid {} is not this process's {}",
                peer.uid.as_raw(),
                me.as_raw()
            )));
        }
        let hello = {
            let mut reader = BufReader::new(&mut *stream);
            read_line(&mut reader, STEP_TIMEOUT).await?
        };
        if hello.hello != Some(1) {
            return Err(protocol(format!("expected hello 1, got {hello:?}")));
        }
        tracing::info!(
            pid = peer.pid.as_raw_nonzero().get(),
            "a successor asks to take over; writing snapshots and handing over the listeners"
        );
        handover.prepare().await;
        let mut payload = serde_json::to_vec(&Message {
            listeners: Some(offer.listeners.iter().map(|(n, _)| n.clone()).collect()),
            ..Message::default()
        })
        .map_err(io::Error::other)?;
        payload.push(b'\n');
        let fds: Vec<&OwnedFd> = offer.listeners.iter().map(|(_, fd)| fd).collect();
        send_fds(stream, &fds, &payload).await?;
        let ready = {
            let mut reader = BufReader::new(&mut *stream);
            read_line(&mut reader, ready_timeout).await?
        };
        if ready.ready != Some(true) {
            return Err(protocol(format!("expected ready, got {ready:?}")));
        }
        Ok(())
    }
}

/// A successor that is ready: the running proxy drains, then confirms.
#[derive(Debug)]
pub struct Successor {
    stream: UnixStream,
}

impl Successor {
    /// Tells the successor this process has stopped accepting and drains.
    pub async fn confirm(mut self) {
        let _ = write_line(
            &mut self.stream,
            &Message {
                draining: Some(true),
                ..Message::default()
            },
        )
        .await;
    }
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Counts {
        prepared: AtomicUsize,
        aborted: AtomicUsize,
    }

    impl Handover for Counts {
        async fn prepare(&self) {
            self.prepared.fetch_add(1, Ordering::SeqCst);
        }
        fn abort(&self) {
            self.aborted.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_successor_gets_the_very_sockets_and_a_failed_one_changes_nothing() {
        let dir = std::env::temp_dir().join(format!("kcp-takeover-{}", uuid::Uuid::new_v4()));
        let path = dir.join("takeover.sock");
        // Nobody there yet.
        assert!(Predecessor::connect(&path).await.unwrap().is_none());
        let api = StdTcpListener::bind("127.0.0.1:0").unwrap();
        let admin = StdTcpListener::bind("127.0.0.1:0").unwrap();
        let (api_addr, admin_addr) = (api.local_addr().unwrap(), admin.local_addr().unwrap());
        let mut offer = Offer::default();
        offer.add("api", &api).unwrap();
        offer.add("admin", &admin).unwrap();
        drop((api, admin));
        let server = Server::bind(&path).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        let counts = std::sync::Arc::new(Counts::default());
        let serving = {
            let counts = counts.clone();
            tokio::spawn(async move {
                let successor = server.serve(&offer, &*counts, Duration::from_secs(5)).await;
                successor.confirm().await;
            })
        };
        // A successor that takes the sockets and then dies: aborted.
        let mut first = Predecessor::connect(&path).await.unwrap().unwrap();
        assert_eq!(first.take("api").unwrap().local_addr().unwrap(), api_addr);
        drop(first);
        // One that finishes: the same sockets, and the drain confirmed.
        let mut second = Predecessor::connect(&path).await.unwrap().unwrap();
        let api = second.take("api").unwrap();
        assert_eq!(api.local_addr().unwrap(), api_addr);
        assert_eq!(
            second.take("admin").unwrap().local_addr().unwrap(),
            admin_addr
        );
        second.predecessor.take_over().await.unwrap();
        serving.await.unwrap();
        assert_eq!(counts.prepared.load(Ordering::SeqCst), 2);
        assert_eq!(counts.aborted.load(Ordering::SeqCst), 1);
        // The received socket accepts connections made to the address.
        let listener = tokio::net::TcpListener::from_std(api).unwrap();
        let connect = tokio::net::TcpStream::connect(api_addr);
        let (accepted, connected) = tokio::join!(listener.accept(), connect);
        accepted.unwrap();
        connected.unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
