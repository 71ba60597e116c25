//! A future that is polled only when its own waker has fired.
//!
//! A connection's task, or a watch stream's, is woken once per event it
//! writes, and each poll polls every branch of its `select!`: the drain
//! and shutdown signals (`CancellationToken`'s future locks the token's
//! mutex on every poll: tokio-util 0.7 `WaitForCancellationFuture::poll`)
//! and the idle and deadline timers. Those branches wait for something
//! that happens once in the connection's life, so [`WokenOnly`] polls its
//! future once, then again only after the waker the future registered was
//! woken (the way `FuturesUnordered` polls only the futures that woke
//! it): between those, a poll is one atomic load. Measured on a tier
//! replica with 500 HTTP/2 clients of 11 watches each: the token's mutex
//! was 4.8 % of its CPU (docs/performance.md, section (k)).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Whether the inner future's waker fired, and the task to wake.
#[derive(Debug, Default)]
struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// `F`, polled only on its first poll and after its waker fired.
#[derive(Debug)]
pub struct WokenOnly<F> {
    inner: Pin<Box<F>>,
    flag: Arc<Flag>,
    waker: Waker,
}

impl<F: Future> WokenOnly<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        WokenOnly {
            inner: Box::pin(inner),
            waker: Waker::from(flag.clone()),
            flag,
        }
    }
}

impl<F: Future> Future for WokenOnly<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Registered before the flag is read: a wake between the two is
        // then seen now or wakes this task again.
        self.flag.task.register(cx.waker());
        if !self.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let this = &mut *self;
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its polls; ready once `ready` is set, waking through the
    /// waker of its last poll.
    struct Probe {
        polls: Arc<AtomicUsize>,
        ready: Arc<AtomicBool>,
        waker: Arc<parking_lot::Mutex<Option<Waker>>>,
    }

    impl Future for Probe {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.ready.load(Ordering::Relaxed) {
                return Poll::Ready(());
            }
            *self.waker.lock() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn polls_the_future_only_after_its_waker_fired() {
        let polls = Arc::new(AtomicUsize::new(0));
        let ready = Arc::new(AtomicBool::new(false));
        let waker = Arc::new(parking_lot::Mutex::new(None));
        let mut w = WokenOnly::new(Probe {
            polls: polls.clone(),
            ready: ready.clone(),
            waker: waker.clone(),
        });
        let task = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&task);
        for _ in 0..100 {
            assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::Relaxed), 1, "polled once, then not");
        // It becomes ready and wakes: the next poll polls it.
        ready.store(true, Ordering::Relaxed);
        waker.lock().take().unwrap().wake();
        assert!(Pin::new(&mut w).poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }

    /// A wake reaches the task that polled last, so a `select!` waiting on
    /// a cancellation finishes.
    #[tokio::test]
    async fn a_cancellation_wakes_the_waiting_task() {
        let token = tokio_util::sync::CancellationToken::new();
        let w = WokenOnly::new(token.clone().cancelled_owned());
        let waiter = tokio::spawn(w);
        tokio::task::yield_now().await;
        token.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
    }
}
