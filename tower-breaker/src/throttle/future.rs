//! The response future of [`Throttle`](super::Throttle) and
//! [`PlainThrottle`](super::PlainThrottle).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower_resilience_base::error::Throttled;
use tower_resilience_base::outcome::Classify;

use super::handle::ThrottlePermit;
use crate::BoxError;

pin_project! {
    /// The response future of a throttle: the inner service's future, whose
    /// outcome it counts when it completes (an accept, a request not
    /// accepted, or, for a local rejection from below, no request at all),
    /// or a rejection that fails at once with [`Throttled`].
    ///
    /// Dropped before it completes, the call counts as a request that was
    /// not accepted.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F, C> {
        #[pin]
        state: State<F, C>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, C> {
        Called {
            #[pin]
            future: F,
            permit: Option<ThrottlePermit>,
            classifier: C,
        },
        Rejected {
            error: Throttled,
        },
    }
}

// === impl ResponseFuture ===

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn called(future: F, permit: ThrottlePermit, classifier: C) -> Self {
        Self {
            state: State::Called {
                future,
                permit: Some(permit),
                classifier,
            },
        }
    }

    pub(crate) fn rejected(error: Throttled) -> Self {
        Self {
            state: State::Rejected { error },
        }
    }
}

impl<F, C, R, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<R, E>>,
    E: Into<BoxError>,
    C: Classify<R>,
{
    type Output = Result<R, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called {
                future,
                permit,
                classifier,
            } => {
                let result = ready!(future.poll(cx));
                Poll::Ready(match result {
                    Ok(response) => {
                        if let Some(permit) = permit.take() {
                            permit.record(classifier.classify_response(&response));
                        }
                        Ok(response)
                    }
                    Err(error) => {
                        let error: BoxError = error.into();
                        if let Some(permit) = permit.take() {
                            permit.record(classifier.classify_error(&*error));
                        }
                        Err(error)
                    }
                })
            }
            StateProj::Rejected { error } => Poll::Ready(Err(Box::new(error.clone()))),
        }
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Called { .. } => "called",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
