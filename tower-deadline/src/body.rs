//! The response body of [`ClientDeadline`](crate::ClientDeadline) and
//! [`ServerDeadline`](crate::ServerDeadline): the deadline lasts until the
//! body ends.
//!
//! A response head is not the end of a call. A dependency that sends `200`
//! and its headers at once and then stalls the body (a GC pause, a
//! buffering proxy, a half-dead upstream) would otherwise hold the caller
//! for ever after the head came back in time. Both layers therefore wrap
//! the response body in [`ResponseBody`], which keeps enforcing the same
//! deadline while the body is read:
//!
//! - frames pass through unchanged while time is left;
//! - once the deadline has passed, the next poll yields a
//!   [`DeadlineExceeded`] error (boxed; downcast it from the transport's
//!   body error, as `reqwest::Error::source` or hyper's errors carry it),
//!   and the inner body is never polled again; a server answering a gRPC
//!   request ends the stream with trailers `grpc-status: 4`
//!   (DEADLINE_EXCEEDED) instead, as gRPC clients expect;
//! - the timer is armed only when the inner body first returns `Pending`,
//!   so a body that is complete in its first poll (a unary answer) never
//!   touches the timer wheel, and it is released when the body ends, fails
//!   or is dropped;
//! - a slow but steady body that ends before the deadline succeeds, however
//!   long it is.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use http_body_util::BodyExt;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_deadline::error::DeadlineExceeded;
//! use tower_deadline::ClientDeadlineLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // The head comes at once; the body never ends.
//! let stalled = service_fn(|_req: http::Request<()>| async {
//!     let body = http_body_util::StreamBody::new(futures_util::stream::pending::<
//!         Result<http_body::Frame<bytes::Bytes>, BoxError>,
//!     >());
//!     Ok::<_, BoxError>(http::Response::new(body))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_millis(100)))
//!     .service(stalled);
//!
//! let response = client.oneshot(http::Request::new(())).await?;
//! assert_eq!(response.status(), 200);
//! let err = response.into_body().collect().await.unwrap_err();
//! assert!(err.is::<DeadlineExceeded>());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Sleep};

use crate::error::DeadlineExceeded;
use crate::metrics::Expiry;
use crate::{BoxError, Deadline};

pin_project! {
    /// A response body bounded by the call's deadline; see the
    /// [module docs](self).
    ///
    /// Frames pass through unchanged; the error type is [`BoxError`] (the
    /// inner body's errors, boxed, or [`DeadlineExceeded`]). A body built
    /// for a call without a deadline, and the layers' own answers, are not
    /// bounded and cost nothing but the wrapper; a bounded one allocates
    /// nothing unless its timer has to be armed.
    pub struct ResponseBody<B> {
        #[pin]
        inner: B,
        state: State,
        mode: Mode,
        expired: Option<Expiry>,
    }
}

/// How far a [`ClientDeadline`](crate::ClientDeadline) bounds a call: to
/// the end of the response body ([`BodyEnd`], the default) or to its head
/// ([`Head`], [`ClientDeadlineLayer::head_only`](crate::ClientDeadlineLayer::head_only)).
/// Sealed: implemented by these two only.
pub trait Extent: sealed::Sealed + Send + Sync + 'static {
    /// The response body the layer answers with: [`ResponseBody<B>`] for
    /// [`BodyEnd`], the inner body `B` itself for [`Head`] (nothing wraps
    /// it, so nothing is paid for it).
    type Body<B>;

    /// Whether the deadline goes on over the body.
    #[doc(hidden)]
    const BODY: bool;

    /// A response whose body this layer does not bound.
    #[doc(hidden)]
    fn free<B>(response: Response<B>) -> Response<Self::Body<B>>;

    /// A response whose body `bound` bounds (never called for [`Head`]).
    #[doc(hidden)]
    fn bounded<B>(
        response: Response<B>,
        bound: impl FnOnce(B) -> ResponseBody<B>,
    ) -> Response<Self::Body<B>>;
}

/// The deadline lasts until the response body has been read to its end,
/// has failed or has been dropped; the body is a [`ResponseBody`]. The
/// default.
#[derive(Debug, Clone, Copy, Default)]
pub struct BodyEnd {
    _p: (),
}

/// The deadline stops at the response head; the body is the inner
/// service's own. Only for an outer layer whose per-attempt layer below
/// bounds the body (see
/// [`ClientDeadlineLayer::head_only`](crate::ClientDeadlineLayer::head_only)).
#[derive(Debug, Clone, Copy, Default)]
pub struct Head {
    _p: (),
}

impl sealed::Sealed for BodyEnd {}

impl Extent for BodyEnd {
    type Body<B> = ResponseBody<B>;

    const BODY: bool = true;

    #[inline]
    fn free<B>(response: Response<B>) -> Response<ResponseBody<B>> {
        response.map(ResponseBody::free)
    }

    #[inline]
    fn bounded<B>(
        response: Response<B>,
        bound: impl FnOnce(B) -> ResponseBody<B>,
    ) -> Response<ResponseBody<B>> {
        response.map(bound)
    }
}

impl sealed::Sealed for Head {}

impl Extent for Head {
    type Body<B> = B;

    const BODY: bool = false;

    #[inline]
    fn free<B>(response: Response<B>) -> Response<B> {
        response
    }

    #[inline]
    fn bounded<B>(response: Response<B>, _bound: impl FnOnce(B) -> ResponseBody<B>) -> Response<B> {
        response
    }
}

pub(crate) mod sealed {
    /// Keeps [`Extent`](super::Extent) closed to other implementations.
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}

/// The bound of one body: two words (every layer above moves the response,
/// so the wrapper stays small).
enum State {
    /// No deadline, or its work is over (the body ended).
    Free,
    /// A deadline, its timer not armed yet.
    Idle(Deadline),
    /// The timer, armed on the first `Pending` of the inner body (or handed
    /// over by the response future, which armed it while the head was
    /// awaited); it knows the deadline.
    Armed(Pin<Box<Sleep>>),
    /// The deadline passed and the body was cut: it yields nothing more.
    Cut,
}

/// How a bounded body behaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A client's body: a cut body fails with [`DeadlineExceeded`].
    Client,
    /// A server's body, polled in the deadline's task-local scope (a
    /// streaming handler's own client calls inherit the caller's budget);
    /// a cut body fails.
    Server,
    /// A server's body answering a gRPC request: also polled in the scope,
    /// and a cut stream ends with `grpc-status: 4` trailers.
    ServerGrpc,
}

// === impl State ===

impl State {
    fn deadline(&self) -> Option<Deadline> {
        match self {
            State::Idle(deadline) => Some(*deadline),
            State::Armed(sleep) => Some(Deadline::at(sleep.deadline())),
            State::Free | State::Cut => None,
        }
    }
}

// === impl ResponseBody ===

impl<B> ResponseBody<B> {
    /// A body with no deadline to enforce.
    pub(crate) fn free(inner: B) -> Self {
        Self {
            inner,
            state: State::Free,
            mode: Mode::Client,
            expired: None,
        }
    }

    /// A client's body bounded by `deadline`; `sleep` is the timer the
    /// response future already armed, if any.
    pub(crate) fn bounded(
        inner: B,
        deadline: Deadline,
        sleep: Option<Pin<Box<Sleep>>>,
        expired: Expiry,
    ) -> Self {
        Self {
            inner,
            state: match sleep {
                Some(sleep) => State::Armed(sleep),
                None => State::Idle(deadline),
            },
            mode: Mode::Client,
            expired: Some(expired),
        }
    }

    /// A server's body: bounded by `deadline`, polled in its task-local
    /// scope, and ended with DEADLINE_EXCEEDED trailers when `grpc`.
    pub(crate) fn serving(inner: B, deadline: Deadline, grpc: bool, expired: Expiry) -> Self {
        Self {
            inner,
            state: State::Idle(deadline),
            mode: if grpc { Mode::ServerGrpc } else { Mode::Server },
            expired: Some(expired),
        }
    }

    /// The deadline this body still enforces: `None` once it has ended,
    /// been cut, or when it never had one.
    #[must_use]
    pub fn deadline(&self) -> Option<Deadline> {
        self.state.deadline()
    }

    /// Whether the deadline passed while the body was read (it was cut).
    #[must_use]
    pub fn is_cut(&self) -> bool {
        matches!(self.state, State::Cut)
    }

    /// Whether the body's timer is armed (it holds a place in the timer
    /// wheel): only while a bounded body waits for its inner body.
    #[must_use]
    pub fn is_timer_armed(&self) -> bool {
        matches!(self.state, State::Armed(_))
    }

    /// A reference to the wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// A mutable reference to the wrapped body.
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Consumes the wrapper, returning the wrapped body, which the deadline
    /// then no longer bounds.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Default> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::free(B::default())
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let deadline = match &*this.state {
            State::Free => return this.inner.poll_frame(cx).map_err(Into::into),
            State::Cut => return Poll::Ready(None),
            // A deadline that passed while the caller was not reading is
            // enforced before the next frame is handed out.
            State::Armed(sleep) if sleep.is_elapsed() => None,
            State::Armed(sleep) => Some(Deadline::at(sleep.deadline())),
            State::Idle(deadline) => Some(*deadline),
        };
        if let Some(deadline) = deadline {
            let polled = match this.mode {
                Mode::Client => this.inner.poll_frame(cx),
                Mode::Server | Mode::ServerGrpc => {
                    let inner = this.inner;
                    deadline.sync_scope(|| inner.poll_frame(cx))
                }
            };
            match polled {
                Poll::Ready(Some(Ok(frame))) => return Poll::Ready(Some(Ok(frame))),
                Poll::Ready(end) => {
                    // The body ended or failed: the timer's work is done.
                    *this.state = State::Free;
                    return Poll::Ready(end.map(|r| r.map_err(Into::into)));
                }
                Poll::Pending => {
                    if let State::Idle(deadline) = *this.state {
                        *this.state = State::Armed(Box::pin(sleep_until(deadline.instant())));
                    }
                    if let State::Armed(sleep) = this.state {
                        if sleep.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                    }
                }
            }
        }
        if let Some(expired) = this.expired.take() {
            expired.fire();
        }
        let grpc = *this.mode == Mode::ServerGrpc;
        tracing::debug!(grpc, "deadline passed while the body was read; cutting it");
        *this.state = State::Cut;
        Poll::Ready(Some(if grpc {
            Ok(Frame::trailers(deadline_trailers()))
        } else {
            Err(DeadlineExceeded::new().into())
        }))
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.is_cut() || self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        if self.is_cut() {
            SizeHint::with_exact(0)
        } else {
            self.inner.size_hint()
        }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("deadline", &self.deadline())
            .field("cut", &self.is_cut())
            .finish_non_exhaustive()
    }
}

/// The trailers that end a gRPC stream cut by the deadline.
fn deadline_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(2);
    trailers.insert("grpc-status", HeaderValue::from_static("4"));
    trailers.insert(
        "grpc-message",
        HeaderValue::from_static("deadline exceeded"),
    );
    trailers
}
