//! The one response/request body type the proxy (and the simulated apiserver)
//! uses everywhere.
//!
//! Bodies are boxed streams of `Bytes` so a pass-through body (hyper's
//! `Incoming`), a list assembled from cached object bytes, and a watch
//! stream all fit the same `Response<Body>`.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, combinators::UnsyncBoxBody};

/// Error type carried by bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed body of `Bytes` frames.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A body holding `bytes` in one frame.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// Boxes any body whose error converts into [`BoxError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

pin_project_lite::pin_project! {
    /// A body that keeps `guard` alive until the body is finished or
    /// dropped: in-flight gauges and watcher registrations end exactly
    /// when the client's response ends.
    pub struct Guarded<G> {
        #[pin]
        inner: Body,
        guard: G,
    }
}

impl<G> http_body::Body for Guarded<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Wraps `body` so `guard` is dropped with it.
pub fn guarded<G: Send + 'static>(body: Body, guard: G) -> Body {
    Guarded { inner: body, guard }.boxed_unsync()
}
