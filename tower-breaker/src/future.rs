//! The response futures of [`CircuitBreaker`](crate::CircuitBreaker),
//! [`HttpCircuitBreaker`](crate::HttpCircuitBreaker) and
//! [`PlainCircuitBreaker`](crate::PlainCircuitBreaker).

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use crate::breaker::Permit;
use crate::classify::{outcome, Classify};
use crate::error::CircuitOpen;
use crate::BoxError;

pin_project! {
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker) and
    /// [`PlainCircuitBreaker`](crate::PlainCircuitBreaker).
    ///
    /// Either fails at once with [`CircuitOpen`] (the inner service was
    /// not called), or waits for the inner future and counts its outcome
    /// (unless a retry layer below counted every attempt through the
    /// attempt hook). Dropping it counts nothing and frees a half-open
    /// probe slot.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F>,
        pub(crate) tracker: Tracker<C>,
    }
}

pin_project! {
    /// Response future of [`HttpCircuitBreaker`](crate::HttpCircuitBreaker).
    ///
    /// Either answers at once (503 with `Retry-After`, or a trailers-only
    /// gRPC UNAVAILABLE), or waits for the inner future, counts its
    /// outcome, and returns it unchanged.
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
    /// Counts the call itself when it completes.
    Permit { permit: Permit, classifier: C },
    /// The attempt hook counts (through a retry layer below), or, if it was
    /// never used, counts the call itself.
    /// Nothing to count.
    Done,
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

impl<F, C, Res, E> Future for ResponseFuture<F, C>
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
            KindProj::Rejected { error } => {
                let error = error
                    .take()
                    .expect("ResponseFuture polled after completion");
                Poll::Ready(Err(Box::new(error)))
            }
        }
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Called { .. } => "called",
            Kind::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
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
    type Output = Result<Response<B>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            AnswerKindProj::Called { future } => {
                let result = ready!(future.poll(cx));
                match &result {
                    Ok(response) => this.tracker.finish(Ok(response)),
                    // The inner error passes through unchanged; the
                    // classifier judges it like the client flavour's.
                    Err(e) => this.tracker.finish::<Response<B>>(Err(e)),
                }
                Poll::Ready(result)
            }
            AnswerKindProj::Answered { response } => Poll::Ready(Ok(response
                .take()
                .expect("AnswerFuture polled after completion"))),
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
            Tracker::Done => {}
        }
    }
}
