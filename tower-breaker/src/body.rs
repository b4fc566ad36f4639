//! The response body of the HTTP breakers: the outcome of a call is known
//! when its body ends.
//!
//! A `200` whose body then fails, or is cut by the deadline, is not a
//! success: the dependency did not deliver. [`CircuitBreaker`] and
//! [`HttpCircuitBreaker`] (and their keyed forms) therefore keep the
//! outcome of a call whose head looks good open until the body ends, in
//! [`ResponseBody`]:
//!
//! - the body read to its end: the head's outcome (a success), or, when the
//!   body ends with trailers, what the trailers say (`grpc-status` in a
//!   gRPC stream's trailers is judged by the classifier like a
//!   trailers-only answer's);
//! - the body fails (an error of the transport, or the deadline's
//!   `DeadlineExceeded` when a `ClientDeadline` below cut it): the
//!   classifier's verdict on that error, a failure by default;
//! - the body dropped before its end: the head's outcome. The caller chose
//!   to stop reading (it had what it needed, or checked only the status);
//!   that says nothing against the dependency.
//!
//! A head that already fails (a 503, a connection error) is counted at
//! once, as before; only good heads wait. Slow-call timing ends at the
//! body's end too, unless [`BreakerConfig::slow_call_end`] says
//! [`CallEnd::Head`](crate::config::CallEnd::Head).
//!
//! With a retry layer below the breaker, the retry layer reports each
//! attempt through the attempt hook; the hook keeps the report of an
//! attempt that answers well open in the same way, and the breaker's
//! response future hands it to the body. A body failure is never retried
//! (the head was already handed out) and is counted once, as that
//! attempt's outcome.
//!
//! [`CircuitBreaker`]: crate::CircuitBreaker
//! [`HttpCircuitBreaker`]: crate::HttpCircuitBreaker
//! [`BreakerConfig::slow_call_end`]: crate::BreakerConfig::slow_call_end

use std::cell::Cell;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::breaker::Permit;
use crate::classify::{default_outcome, Classify, DefaultClassifier, Outcome};
use crate::BoxError;

pin_project! {
    /// A response body that settles its call's outcome with the breaker
    /// when it ends, fails or is dropped; see the [module docs](self).
    ///
    /// Frames pass through unchanged; the error type is [`BoxError`] (the
    /// inner body's errors, boxed). The breaker's own answers, and bodies
    /// whose call was already counted, carry nothing to settle.
    pub struct ResponseBody<B, C = DefaultClassifier> {
        #[pin]
        inner: B,
        late: Option<Late<C>>,
    }
}

/// An outcome still open: the admission of a call whose head was good (a
/// success; only those wait for the body) and the classifier that judges
/// the body's end. Three words with a stateless classifier: every layer
/// above moves it with the response.
pub(crate) struct Late<C> {
    /// The admission, its slow-call timing already stopped at the head
    /// when the breaker's `CallEnd` says so.
    permit: Option<Permit>,
    classifier: C,
}

/// An outcome the attempt hook kept open for the breaker's response future
/// polling above it on the same thread (see [`begin`]).
pub(crate) struct Deferred {
    permit: Permit,
}

thread_local! {
    /// The breaker (its `Breaker::id`) whose response future is polling the
    /// layers below on this thread, if any: its hook may then keep a good
    /// attempt's outcome open for the response body.
    static COLLECTING: Cell<usize> = const { Cell::new(0) };
    /// The outcome the hook kept open during that poll.
    static DEFERRED: Cell<Option<Deferred>> = const { Cell::new(None) };
}

/// Makes breaker `id` the collector on this thread, for the poll of the
/// layers below it; returns the collector it replaces, for [`end`].
#[inline]
pub(crate) fn begin(id: usize) -> usize {
    COLLECTING.replace(id)
}

/// Ends a poll [`begin`] started, putting the `outer` collector back, and
/// returns the outcome the breaker's hook kept open meanwhile, if any.
/// (Two calls rather than one taking the poll as a closure: the poll's
/// output, a response, is then not moved through a tuple.)
#[inline]
pub(crate) fn end(outer: usize) -> Option<Deferred> {
    COLLECTING.set(outer);
    DEFERRED.take()
}

/// Whether breaker `id`'s response future is collecting on this thread.
#[inline]
pub(crate) fn collecting(id: usize) -> bool {
    COLLECTING.get() == id
}

/// Keeps an attempt's good outcome open for the collecting response future
/// (see [`collecting`]).
pub(crate) fn defer(mut permit: Permit) {
    permit.stop_at_head();
    let stale = DEFERRED.replace(Some(Deferred { permit }));
    // Two good attempts reported in one poll (hedges answering together):
    // only the one returned can have a body; the other is over.
    if let Some(stale) = stale {
        stale.settle_now();
    }
}

// === impl Deferred ===

impl Deferred {
    /// Counts the head's outcome now: the response it belonged to is not
    /// the one the breaker hands out (its future failed after it, or is
    /// still pending).
    pub(crate) fn settle_now(self) {
        self.permit.record(Outcome::Success);
    }

    /// The open outcome, judged at the body's end with `classifier`.
    #[inline]
    pub(crate) fn into_late<C>(self, classifier: C) -> Late<C> {
        Late {
            permit: Some(self.permit),
            classifier,
        }
    }
}

// === impl Late ===

impl<C> Late<C> {
    /// The outcome of a call whose head was a success, with `permit`
    /// still to settle.
    #[inline]
    pub(crate) fn new(mut permit: Permit, classifier: C) -> Self {
        permit.stop_at_head();
        Self {
            permit: Some(permit),
            classifier,
        }
    }

    #[inline]
    fn settle(&mut self, outcome: Outcome) {
        if let Some(permit) = self.permit.take() {
            permit.record(outcome);
        }
    }
}

impl<C> Drop for Late<C> {
    #[inline]
    fn drop(&mut self) {
        // Dropped before its end: the caller stopped reading; the head's
        // outcome stands.
        self.settle(Outcome::Success);
    }
}

// === impl ResponseBody ===

impl<B, C> ResponseBody<B, C> {
    /// A body with nothing to settle.
    #[inline]
    pub(crate) fn settled(inner: B) -> Self {
        Self { inner, late: None }
    }

    /// Whether the call's outcome is still open (it is settled when the
    /// body ends, fails or is dropped).
    #[must_use]
    pub fn is_pending(&self) -> bool {
        self.late.is_some()
    }

    /// A reference to the wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// A mutable reference to the wrapped body.
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Consumes the wrapper, returning the wrapped body; an open outcome is
    /// settled now, with the head's verdict.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

/// Wraps the body of `response`, settling `late` at its end.
#[inline]
pub(crate) fn wrap<B, C>(
    response: Response<B>,
    late: Option<Late<C>>,
) -> Response<ResponseBody<B, C>> {
    response.map(|inner| ResponseBody { inner, late })
}

impl<B: Default, C> Default for ResponseBody<B, C> {
    fn default() -> Self {
        Self::settled(B::default())
    }
}

impl<B, C> Body for ResponseBody<B, C>
where
    B: Body,
    B::Error: Into<BoxError>,
    C: Classify<Response<B>>,
{
    type Data = B::Data;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        let Some(late) = this.late else {
            return polled.map_err(Into::into);
        };
        let Poll::Ready(frame) = polled else {
            return Poll::Pending;
        };
        let frame = frame.map(|r| r.map_err(Into::<BoxError>::into));
        let outcome = match &frame {
            None => Some(Outcome::Success),
            Some(Err(e)) => Some(late.classifier.classify_error(&**e)),
            Some(Ok(frame)) => match frame.trailers_ref() {
                // The trailers end the body: a gRPC stream's status is
                // there.
                Some(trailers) => Some(
                    late.classifier
                        .classify_head(StatusCode::OK, trailers)
                        .unwrap_or_else(|| default_outcome(StatusCode::OK, trailers)),
                ),
                None => this.inner.is_end_stream().then_some(Outcome::Success),
            },
        };
        if let Some(outcome) = outcome {
            late.settle(outcome);
            *this.late = None;
        }
        Poll::Ready(frame)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B, C> fmt::Debug for ResponseBody<B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("pending", &self.is_pending())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};

    use super::*;
    use crate::Breaker;

    /// The breaker's (successful, failed) totals.
    fn counts(breaker: &Breaker) -> (u64, u64) {
        let totals = breaker.snapshot().totals;
        (totals.successful, totals.failed)
    }

    fn open_body(breaker: &Breaker, text: &'static str) -> ResponseBody<Full<Bytes>> {
        let late = Late::new(breaker.try_acquire().unwrap(), DefaultClassifier);
        let response = wrap(Response::new(Full::new(Bytes::from(text))), Some(late));
        response.into_body()
    }

    #[test]
    fn the_collector_is_one_breaker_and_the_outer_one_comes_back() {
        let outer = begin(7);
        assert!(collecting(7));
        assert!(!collecting(8), "another breaker's hook keeps nothing");
        assert_eq!(begin(9), 7, "a breaker below replaces it for its poll");
        assert!(collecting(9) && !collecting(7));
        assert!(end(7).is_none(), "nothing was kept");
        assert!(collecting(7), "the outer breaker collects again");
        assert!(end(outer).is_none());
        assert!(!collecting(7));
    }

    #[test]
    fn a_kept_outcome_is_handed_over_once_at_the_end_of_the_poll() {
        let breaker = Breaker::new("dependency");
        let outer = begin(breaker.id());
        defer(breaker.try_acquire().unwrap());
        assert_eq!(counts(&breaker), (0, 0), "kept open");
        let deferred = end(outer).expect("the poll's kept outcome");
        assert!(end(outer).is_none(), "taken once");
        deferred.settle_now();
        assert_eq!(counts(&breaker), (1, 0), "settled as the head said");
    }

    #[test]
    fn of_two_outcomes_kept_in_one_poll_the_older_is_settled_at_once() {
        let breaker = Breaker::new("dependency");
        let outer = begin(breaker.id());
        defer(breaker.try_acquire().unwrap());
        defer(breaker.try_acquire().unwrap());
        assert_eq!(counts(&breaker), (1, 0), "the hedge that lost is over");
        let late = end(outer).unwrap().into_late(DefaultClassifier);
        assert_eq!(counts(&breaker), (1, 0));
        drop(late);
        assert_eq!(
            counts(&breaker),
            (2, 0),
            "a dropped body keeps its head's verdict"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_body_that_says_it_ended_settles_with_its_last_frame() {
        let breaker = Breaker::new("dependency");
        let mut body = open_body(&breaker, "ab");
        assert!(body.is_pending());
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(2), "the inner body's hint");
        assert_eq!(format!("{body:?}"), "ResponseBody { pending: true, .. }");
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "ab");
        assert!(body.is_end_stream());
        assert!(!body.is_pending(), "no poll for the end is needed");
        assert_eq!(counts(&breaker), (1, 0));
        assert_eq!(format!("{body:?}"), "ResponseBody { pending: false, .. }");
        assert!(body.frame().await.is_none());
        assert_eq!(counts(&breaker), (1, 0), "counted once");
    }

    #[test]
    fn the_inner_body_can_be_reached_and_taken_out() {
        let breaker = Breaker::new("dependency");
        let mut body = open_body(&breaker, "abc");
        assert_eq!(body.get_ref().size_hint().exact(), Some(3));
        *body.get_mut() = Full::new(Bytes::from_static(b"abcd"));
        assert_eq!(body.size_hint().exact(), Some(4), "replaced in place");
        assert_eq!(counts(&breaker), (0, 0));
        let inner = body.into_inner();
        assert_eq!(inner.size_hint().exact(), Some(4));
        assert_eq!(counts(&breaker), (1, 0), "taken out: the head's verdict");
        let default = ResponseBody::<Full<Bytes>>::default();
        assert!(!default.is_pending(), "nothing to settle");
        assert_eq!(default.size_hint().exact(), Some(0));
    }

    /// Every layer above the breaker moves the response with its body: the
    /// open outcome stays three words (the permit's shard, its start time
    /// or head duration, and the admission), `None` included.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn an_open_outcome_is_three_words() {
        assert_eq!(size_of::<Permit>(), 24);
        assert_eq!(size_of::<Option<Late<DefaultClassifier>>>(), 24);
        assert_eq!(size_of::<ResponseBody<(), DefaultClassifier>>(), 24);
    }
}
