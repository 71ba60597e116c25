//! An HTTP/2 connection's writes, coalesced into fewer TLS records and
//! syscalls.
//!
//! h2 writes every DATA frame larger than 256 bytes as its own vectored
//! write (`h2::codec::FramedWrite` chains the payload instead of copying
//! it, one frame at a time), and each reaches the socket at once: TLS
//! seals it into its own record and `writev` sends it. When one event goes
//! to the hundred watch streams of a connection, that is a hundred records
//! and a hundred syscalls, about one per delivered event: measured, the
//! kernel's half of the proxy's CPU per delivered event.
//!
//! [`Coalesced`] copies what h2 writes into a buffer and defers the first
//! flush of a burst by one turn of the scheduler: it wakes the connection
//! and lets the streams whose bodies are ready meanwhile (the other
//! watchers of the same event) queue their frames, then writes them all
//! at once, in 16 KiB records. h2 flushes at the end of every poll of the
//! connection (`Prioritize::poll_complete`), so the next poll writes what
//! was held back; shutdown writes it too. At most [`MAX_BUFFERED`] bytes
//! are held: beyond that, writes go through (and wait for the socket, so
//! a slow client still pushes back).
//!
//! The buffer outlives its bursts up to [`KEEP_CAPACITY`]: a tier
//! replica's connections each carry one node's few watches, whose bursts
//! are an event or two (about 1 KB each), and a buffer allocated and freed
//! per burst was 8 % of a replica's CPU (a 64 KiB allocation each time,
//! past the allocator's thread cache: `madvise` and page faults).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes held back before writes go through to the socket.
pub const MAX_BUFFERED: usize = 256 * 1024;

/// The buffer's capacity kept once drained; a bigger one is freed, so an
/// idle connection holds no more than this (one that never wrote holds
/// none: the buffer is allocated by the first write). A burst that fits
/// allocates nothing once one has.
const KEEP_CAPACITY: usize = 4 * 1024;

/// The least a buffer grows by past [`KEEP_CAPACITY`] (see
/// [`Coalesced::make_room`]).
const GROW: usize = 64 * 1024;

/// Counts the polls of a connection's task, so that [`Coalesced`] knows
/// when the task has yielded since it deferred a flush.
#[derive(Debug, Clone, Default)]
pub struct Polls(Arc<AtomicU64>);

impl Polls {
    /// Marks the start of a poll of the connection.
    pub fn tick(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// `inner` with coalesced writes (see the module).
#[derive(Debug)]
pub struct Coalesced<T> {
    inner: T,
    /// What is held back: `buf[sent..]`.
    buf: Vec<u8>,
    sent: usize,
    polls: Polls,
    /// The poll during which a flush was deferred, while one is.
    deferred: Option<u64>,
}

impl<T> Coalesced<T> {
    /// Wraps `inner`, whose connection's task ticks `polls`.
    pub fn new(inner: T, polls: Polls) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            sent: 0,
            polls,
            deferred: None,
        }
    }
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    /// Writes what is held back.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.sent = 0;
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        Poll::Ready(Ok(()))
    }

    /// Bytes held back.
    fn held(&self) -> usize {
        self.buf.len() - self.sent
    }

    /// Grows the buffer for `len` more bytes: to [`KEEP_CAPACITY`] while
    /// the burst fits in it (the capacity a drained buffer keeps), else by
    /// at least [`GROW`]: a burst of one event to a hundred streams (~250
    /// KB) then takes a couple of allocations instead of a doubling copy
    /// per power of two.
    fn make_room(&mut self, len: usize) {
        if self.buf.capacity() - self.buf.len() >= len {
            return;
        }
        // What a partial write sent goes first, so that the buffer holds
        // at most what is held back and the new bytes.
        if self.sent > 0 {
            self.buf.drain(..self.sent);
            self.sent = 0;
        }
        let filled = self.buf.len();
        let additional = if filled + len <= KEEP_CAPACITY {
            KEEP_CAPACITY - filled
        } else {
            len.max(GROW)
        };
        self.buf.reserve(additional);
    }

    /// Makes room for `len` more bytes: writes what is held back if they
    /// would not fit.
    fn poll_room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<()>> {
        if self.held() + len > MAX_BUFFERED {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_room(cx, data.len()))?;
        if data.len() > MAX_BUFFERED {
            return Pin::new(&mut this.inner).poll_write(cx, data);
        }
        this.make_room(data.len());
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let len = bufs.iter().map(|b| b.len()).sum::<usize>();
        ready!(this.poll_room(cx, len))?;
        if len > MAX_BUFFERED {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        this.make_room(len);
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.held() == 0 {
            this.deferred = None;
            return Pin::new(&mut this.inner).poll_flush(cx);
        }
        let now = this.polls.now();
        match this.deferred {
            // Deferred during this poll: the wake is on its way.
            Some(at) if at == now => return Poll::Ready(Ok(())),
            // The task has yielded since: write the burst.
            Some(_) => {}
            None => {
                this.deferred = Some(now);
                cx.waker().wake_by_ref();
                return Poll::Ready(Ok(()));
            }
        }
        ready!(this.poll_drain(cx))?;
        this.deferred = None;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        self.deferred = None;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Polls `f` once, as one poll of the connection's task.
    fn once<R>(polls: &Polls, f: impl FnOnce(&mut Context<'_>) -> R) -> R {
        polls.tick();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        f(&mut cx)
    }

    #[tokio::test]
    async fn a_burst_is_written_once_the_task_has_yielded() {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let polls = Polls::default();
        let mut w = Coalesced::new(client, polls.clone());
        // One poll: three frames and a flush, all held back.
        once(&polls, |cx| {
            for frame in [&b"one "[..], b"two ", b"three"] {
                assert!(Pin::new(&mut w).poll_write(cx, frame).is_ready());
            }
            assert!(matches!(
                Pin::new(&mut w).poll_flush(cx),
                Poll::Ready(Ok(()))
            ));
            // A second flush in the same poll still waits for the yield.
            assert!(matches!(
                Pin::new(&mut w).poll_flush(cx),
                Poll::Ready(Ok(()))
            ));
        });
        let mut got = [0u8; 13];
        assert!(
            tokio::time::timeout(
                std::time::Duration::from_millis(50),
                server.read_exact(&mut got[..1])
            )
            .await
            .is_err(),
            "held back until the next poll"
        );
        // The next poll writes the burst.
        once(&polls, |cx| {
            let vectored = [IoSlice::new(b" four")];
            assert!(
                Pin::new(&mut w)
                    .poll_write_vectored(cx, &vectored)
                    .is_ready()
            );
            assert!(matches!(
                Pin::new(&mut w).poll_flush(cx),
                Poll::Ready(Ok(()))
            ));
        });
        let mut all = vec![0u8; 18];
        server.read_exact(&mut all).await.unwrap();
        assert_eq!(all, b"one two three four");
    }

    /// A small burst's buffer is kept for the next (no allocation per
    /// burst); a large one's is freed once written.
    #[tokio::test]
    async fn a_small_bursts_buffer_is_kept_and_a_large_ones_freed() {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let polls = Polls::default();
        let mut w = Coalesced::new(client, polls.clone());
        let burst = |w: &mut Coalesced<_>, frames: &[&[u8]]| {
            once(&polls, |cx| {
                for f in frames {
                    assert!(Pin::new(&mut *w).poll_write(cx, f).is_ready());
                }
                assert!(Pin::new(&mut *w).poll_flush(cx).is_ready());
            });
            once(&polls, |cx| {
                assert!(matches!(
                    Pin::new(&mut *w).poll_flush(cx),
                    Poll::Ready(Ok(()))
                ));
            });
        };
        let event = [1u8; 1500];
        burst(&mut w, &[&event, &event]);
        assert_eq!(w.buf.capacity(), KEEP_CAPACITY);
        let kept = w.buf.as_ptr();
        burst(&mut w, &[&event]);
        assert_eq!(w.buf.as_ptr(), kept, "the same allocation");
        assert_eq!(w.buf.capacity(), KEEP_CAPACITY);
        let big = vec![2u8; 3 * KEEP_CAPACITY];
        burst(&mut w, &[&event, &big]);
        assert_eq!(w.buf.capacity(), 0, "a large burst's buffer is freed");
        let mut got = vec![0u8; 4 * event.len() + big.len()];
        server.read_exact(&mut got).await.unwrap();
        assert!(got[..4 * event.len()].iter().all(|&b| b == 1));
        assert!(got[4 * event.len()..].iter().all(|&b| b == 2));
    }

    #[tokio::test]
    async fn shutdown_and_large_writes_go_through() {
        let (client, mut server) = tokio::io::duplex(4 * MAX_BUFFERED);
        let polls = Polls::default();
        let mut w = Coalesced::new(client, polls.clone());
        w.write_all(b"held").await.unwrap();
        let big = vec![7u8; MAX_BUFFERED + 1];
        // Past the limit: what was held, then the write itself.
        w.write_all(&big).await.unwrap();
        let mut got = vec![0u8; 4 + big.len()];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..4], b"held");
        w.write_all(b"last").await.unwrap();
        poll_fn(|cx| Pin::new(&mut w).poll_shutdown(cx))
            .await
            .unwrap();
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"last");
    }
}
