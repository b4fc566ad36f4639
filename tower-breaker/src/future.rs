//! The response futures of [`CircuitBreaker`](crate::CircuitBreaker),
//! [`HttpCircuitBreaker`](crate::HttpCircuitBreaker),
//! [`PlainCircuitBreaker`](crate::PlainCircuitBreaker) and
//! [`TypedCircuitBreaker`](crate::TypedCircuitBreaker). The response body
//! of the first two is [`crate::body::ResponseBody`].

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use crate::body::{self, Deferred, Late, ResponseBody};
use crate::breaker::Permit;
use crate::classify::{outcome, Classify, Outcome};
use crate::error::{BreakerError, CircuitOpen};
use crate::BoxError;

pin_project! {
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker) (and
    /// its keyed form).
    ///
    /// Either fails at once with [`CircuitOpen`] (the inner service was
    /// not called), or waits for the inner future and counts its outcome
    /// (unless a retry layer below counted every attempt through the
    /// attempt hook). A good response's outcome is settled by its
    /// [`ResponseBody`] when the body ends (see [`crate::body`]). Dropping
    /// the future counts nothing and frees a half-open probe slot.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F>,
        pub(crate) tracker: Tracker<C>,
    }
}

pin_project! {
    /// Response future of [`PlainCircuitBreaker`](crate::PlainCircuitBreaker)
    /// (and its keyed form).
    ///
    /// Either fails at once with [`CircuitOpen`] (the inner service was
    /// not called), or waits for the inner future and counts its outcome.
    /// Dropping it counts nothing and frees a half-open probe slot.
    #[must_use = "futures do nothing unless polled"]
    pub struct PlainResponseFuture<F, C> {
        #[pin]
        kind: Kind<F>,
        tracker: Tracker<C>,
    }
}

pin_project! {
    /// Response future of [`TypedCircuitBreaker`](crate::TypedCircuitBreaker).
    ///
    /// Either fails at once with [`BreakerError::Open`] (the inner service
    /// was not called; nothing is allocated), or waits for the inner future
    /// and counts its outcome. Dropping it counts nothing and frees a
    /// half-open probe slot.
    #[must_use = "futures do nothing unless polled"]
    pub struct TypedResponseFuture<F, C> {
        #[pin]
        kind: Kind<F>,
        tracker: Tracker<C>,
    }
}

pin_project! {
    /// Response future of [`HttpCircuitBreaker`](crate::HttpCircuitBreaker).
    ///
    /// Either answers at once (503 with `Retry-After`, or a trailers-only
    /// gRPC UNAVAILABLE), or waits for the inner future and returns its
    /// response with a [`ResponseBody`] that settles the outcome when the
    /// body has been sent (a failed head is counted at once).
    #[must_use = "futures do nothing unless polled"]
    pub struct AnswerFuture<F, C, B> {
        #[pin]
        kind: AnswerKind<F, B>,
        tracker: Tracker<C>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Called {
            #[pin]
            future: F,
        },
        Rejected {
            error: Option<CircuitOpen>,
        },
    }
}

pin_project! {
    #[project = AnswerKindProj]
    enum AnswerKind<F, B> {
        Called {
            #[pin]
            future: F,
        },
        Answered {
            response: Option<Response<B>>,
        },
    }
}

/// What counts the outcome of a call that was let through.
pub(crate) enum Tracker<C> {
    /// Counts the call itself when it completes (a good response: when its
    /// body ends).
    Permit { permit: Permit, classifier: C },
    /// A retry layer below took the attempt hook and reports every attempt;
    /// the hook keeps a good attempt's outcome open while this future
    /// (breaker `breaker`) polls, and this future hands it to the body.
    Hooked { breaker: usize, classifier: C },
    /// Nothing to count.
    Done,
}

// === impl Kind ===

impl<F> Kind<F> {
    fn name(&self) -> &'static str {
        match self {
            Kind::Called { .. } => "called",
            Kind::Rejected { .. } => "rejected",
        }
    }
}

/// The error of a refused call's future, once.
fn rejection(error: &mut Option<CircuitOpen>) -> BoxError {
    Box::new(
        error
            .take()
            .expect("breaker response future polled after completion"),
    )
}

// === impl ResponseFuture ===

impl<F, C> ResponseFuture<F, C> {
    #[inline]
    pub(crate) fn called(future: F, tracker: Tracker<C>) -> Self {
        Self {
            kind: Kind::Called { future },
            tracker,
        }
    }

    pub(crate) fn rejected(error: CircuitOpen) -> Self {
        Self {
            kind: Kind::Rejected { error: Some(error) },
            tracker: Tracker::Done,
        }
    }
}

impl<F, C, B, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    C: Classify<Response<B>>,
{
    type Output = Result<Response<ResponseBody<B, C>>, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Called { future } => {
                let outer = match this.tracker {
                    Tracker::Hooked { breaker, .. } => Some(body::begin(*breaker)),
                    _ => None,
                };
                let polled = future.poll(cx);
                let deferred = outer.and_then(body::end);
                let Poll::Ready(result) = polled else {
                    if let Some(deferred) = deferred {
                        deferred.settle_now();
                    }
                    return Poll::Pending;
                };
                Poll::Ready(match result {
                    Ok(response) => Ok(this.tracker.finish_response(response, deferred)),
                    Err(e) => {
                        let e = e.into();
                        if let Some(deferred) = deferred {
                            deferred.settle_now();
                        }
                        this.tracker.finish::<Response<B>>(Err(&*e));
                        Err(e)
                    }
                })
            }
            KindProj::Rejected { error } => Poll::Ready(Err(rejection(error))),
        }
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("state", &self.kind.name())
            .finish()
    }
}

// === impl PlainResponseFuture ===

impl<F, C> PlainResponseFuture<F, C> {
    #[inline]
    pub(crate) fn called(future: F, tracker: Tracker<C>) -> Self {
        Self {
            kind: Kind::Called { future },
            tracker,
        }
    }

    pub(crate) fn rejected(error: CircuitOpen) -> Self {
        Self {
            kind: Kind::Rejected { error: Some(error) },
            tracker: Tracker::Done,
        }
    }
}

impl<F, C, Res, E> Future for PlainResponseFuture<F, C>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError>,
    C: Classify<Res>,
{
    type Output = Result<Res, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Called { future } => {
                let result = ready!(future.poll(cx)).map_err(Into::into);
                match &result {
                    Ok(response) => this.tracker.finish(Ok(response)),
                    Err(e) => this.tracker.finish::<Res>(Err(&**e)),
                }
                Poll::Ready(result)
            }
            KindProj::Rejected { error } => Poll::Ready(Err(rejection(error))),
        }
    }
}

impl<F, C> fmt::Debug for PlainResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlainResponseFuture")
            .field("state", &self.kind.name())
            .finish()
    }
}

// === impl TypedResponseFuture ===

impl<F, C> TypedResponseFuture<F, C> {
    #[inline]
    pub(crate) fn called(future: F, tracker: Tracker<C>) -> Self {
        Self {
            kind: Kind::Called { future },
            tracker,
        }
    }

    pub(crate) fn rejected(error: CircuitOpen) -> Self {
        Self {
            kind: Kind::Rejected { error: Some(error) },
            tracker: Tracker::Done,
        }
    }
}

impl<F, C, Res, E> Future for TypedResponseFuture<F, C>
where
    F: Future<Output = Result<Res, E>>,
    E: Error + 'static,
    C: Classify<Res>,
{
    type Output = Result<Res, BreakerError<E>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Called { future } => {
                let result = ready!(future.poll(cx));
                match &result {
                    Ok(response) => this.tracker.finish(Ok(response)),
                    Err(e) => this.tracker.finish::<Res>(Err(e)),
                }
                Poll::Ready(result.map_err(BreakerError::Inner))
            }
            KindProj::Rejected { error } => Poll::Ready(Err(BreakerError::Open(
                error
                    .take()
                    .expect("breaker response future polled after completion"),
            ))),
        }
    }
}

impl<F, C> fmt::Debug for TypedResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedResponseFuture")
            .field("state", &self.kind.name())
            .finish()
    }
}

// === impl AnswerFuture ===

impl<F, C, B> AnswerFuture<F, C, B> {
    #[inline]
    pub(crate) fn called(future: F, tracker: Tracker<C>) -> Self {
        Self {
            kind: AnswerKind::Called { future },
            tracker,
        }
    }

    pub(crate) fn answered(response: Response<B>) -> Self {
        Self {
            kind: AnswerKind::Answered {
                response: Some(response),
            },
            tracker: Tracker::Done,
        }
    }
}

impl<F, C, B, E> Future for AnswerFuture<F, C, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Error + 'static,
    C: Classify<Response<B>>,
{
    type Output = Result<Response<ResponseBody<B, C>>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            AnswerKindProj::Called { future } => Poll::Ready(match ready!(future.poll(cx)) {
                Ok(response) => Ok(this.tracker.finish_response(response, None)),
                Err(e) => {
                    // The inner error passes through unchanged; the
                    // classifier judges it like the client flavour's.
                    this.tracker.finish::<Response<B>>(Err(&e));
                    Err(e)
                }
            }),
            AnswerKindProj::Answered { response } => Poll::Ready(Ok(body::wrap(
                response
                    .take()
                    .expect("AnswerFuture polled after completion"),
                None,
            ))),
        }
    }
}

impl<F, C, B> fmt::Debug for AnswerFuture<F, C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            AnswerKind::Called { .. } => "called",
            AnswerKind::Answered { .. } => "answered",
        };
        f.debug_struct("AnswerFuture")
            .field("state", &state)
            .finish()
    }
}

// === impl Tracker ===

impl<C> Tracker<C> {
    #[inline]
    fn finish<Res>(&mut self, result: Result<&Res, &(dyn Error + 'static)>)
    where
        C: Classify<Res>,
    {
        match mem::replace(self, Tracker::Done) {
            Tracker::Permit { permit, classifier } => permit.record(outcome(&classifier, result)),
            Tracker::Hooked { .. } | Tracker::Done => {}
        }
    }

    /// Hands a response out: a good head's outcome (this layer's own, or
    /// one the hook kept open, `deferred`) goes into the body, to be
    /// settled at its end; any other is counted now.
    #[inline(always)]
    fn finish_response<B>(
        &mut self,
        response: Response<B>,
        deferred: Option<Deferred>,
    ) -> Response<ResponseBody<B, C>>
    where
        C: Classify<Response<B>>,
    {
        let late = match mem::replace(self, Tracker::Done) {
            Tracker::Permit { permit, classifier } => {
                match classifier.classify_response(&response) {
                    Outcome::Success => Some(Late::new(permit, classifier)),
                    other => {
                        permit.record(other);
                        None
                    }
                }
            }
            Tracker::Hooked { classifier, .. } => deferred.map(|d| d.into_late(classifier)),
            Tracker::Done => None,
        };
        body::wrap(response, late)
    }
}
