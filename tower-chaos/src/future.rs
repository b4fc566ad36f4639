//! The response futures of the fault layers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_resilience_base::BoxError;

use crate::body::FaultBody;
use crate::error::{Injected, INJECTED_FAULT_HEADER};
use crate::plan::FaultKind;

/// What a call that reached the service still has to get: a delay, an
/// aborted body. Boxed, so that the futures of calls without a fault stay
/// the size of the service's future and a word.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) delay: Option<Duration>,
    pub(crate) abort: Option<u32>,
    pub(crate) layer: Arc<str>,
}

/// An outcome held until its delay ends.
struct Held<T> {
    sleep: Option<Pin<Box<Sleep>>>,
    outcome: Option<Result<T, BoxError>>,
}

impl<T> Held<T> {
    fn new(delay: Option<Duration>, outcome: Result<T, BoxError>) -> Box<Self> {
        Box::new(Self {
            sleep: delay.map(|d| Box::pin(tokio::time::sleep(d))),
            outcome: Some(outcome),
        })
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<T, BoxError>> {
        if let Some(sleep) = &mut self.sleep {
            ready!(sleep.as_mut().poll(cx));
            self.sleep = None;
        }
        Poll::Ready(
            self.outcome
                .take()
                .unwrap_or_else(|| Err("tower-chaos: future polled after completion".into())),
        )
    }
}

pin_project! {
    /// The response future of [`FaultInjection`](crate::FaultInjection):
    /// the service's future, with the faults of the call applied to its
    /// response; or an injected answer, error or hang.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Called {
            #[pin]
            future: F,
            pending: Option<Box<Pending>>,
        },
        Held {
            held: Box<Held<Response<FaultBody<B>>>>,
        },
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn called(future: F, pending: Option<Box<Pending>>) -> Self {
        Self {
            state: State::Called { future, pending },
        }
    }

    pub(crate) fn held(
        delay: Option<Duration>,
        outcome: Result<Response<FaultBody<B>>, BoxError>,
    ) -> Self {
        Self {
            state: State::Held {
                held: Held::new(delay, outcome),
            },
        }
    }
}

/// Adds `mark` to a response's extension and header.
pub(crate) fn mark<B>(response: &mut Response<B>, kind: FaultKind) {
    let mark = response
        .extensions()
        .get::<Injected>()
        .copied()
        .unwrap_or_default()
        .with(kind);
    response.extensions_mut().insert(mark);
    let value: HeaderValue = mark.header_value();
    response.headers_mut().insert(INJECTED_FAULT_HEADER, value);
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<FaultBody<B>>, BoxError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (delay, outcome) = match self.as_mut().project().state.project() {
            StateProj::Called { future, pending } => {
                let result = ready!(future.poll(cx));
                let Some(Pending {
                    delay,
                    abort,
                    layer,
                }) = pending.take().map(|p| *p)
                else {
                    return Poll::Ready(
                        result
                            .map(|response| response.map(FaultBody::pass))
                            .map_err(Into::into),
                    );
                };
                let outcome = match result {
                    Ok(response) => {
                        let mut response = match abort {
                            Some(after) => {
                                let mut response =
                                    response.map(|body| FaultBody::aborted(body, after, layer));
                                mark(&mut response, FaultKind::AbortBody);
                                response
                            }
                            None => response.map(FaultBody::pass),
                        };
                        if delay.is_some() {
                            mark(&mut response, FaultKind::Latency);
                        }
                        Ok(response)
                    }
                    Err(error) => Err(error.into()),
                };
                let Some(delay) = delay else {
                    return Poll::Ready(outcome);
                };
                (delay, outcome)
            }
            StateProj::Held { held } => return held.poll(cx),
        };
        self.as_mut().project().state.set(State::Held {
            held: Held::new(Some(delay), outcome),
        });
        self.poll(cx)
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Called { pending: None, .. } => "called",
            State::Called { .. } => "called, with faults",
            State::Held { .. } => "injected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The response future of
    /// [`PlainFaultInjection`](crate::PlainFaultInjection): the service's
    /// future, its answer delayed if the call got latency; or an injected
    /// error or hang.
    #[must_use = "futures do nothing unless polled"]
    pub struct PlainResponseFuture<F, T> {
        #[pin]
        state: PlainState<F, T>,
    }
}

pin_project! {
    #[project = PlainStateProj]
    enum PlainState<F, T> {
        Called {
            #[pin]
            future: F,
            delay: Option<Duration>,
        },
        Held {
            held: Box<Held<T>>,
        },
    }
}

impl<F, T> PlainResponseFuture<F, T> {
    pub(crate) fn called(future: F, delay: Option<Duration>) -> Self {
        Self {
            state: PlainState::Called { future, delay },
        }
    }

    pub(crate) fn held(delay: Option<Duration>, outcome: Result<T, BoxError>) -> Self {
        Self {
            state: PlainState::Held {
                held: Held::new(delay, outcome),
            },
        }
    }
}

impl<F, T, E> Future for PlainResponseFuture<F, T>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (delay, outcome) = match self.as_mut().project().state.project() {
            PlainStateProj::Called { future, delay } => {
                let outcome = ready!(future.poll(cx)).map_err(Into::into);
                match delay.take() {
                    None => return Poll::Ready(outcome),
                    Some(delay) => (delay, outcome),
                }
            }
            PlainStateProj::Held { held } => return held.poll(cx),
        };
        self.as_mut().project().state.set(PlainState::Held {
            held: Held::new(Some(delay), outcome),
        });
        self.poll(cx)
    }
}

impl<F, T> fmt::Debug for PlainResponseFuture<F, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            PlainState::Called { .. } => "called",
            PlainState::Held { .. } => "injected",
        };
        f.debug_struct("PlainResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
