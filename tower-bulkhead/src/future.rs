//! Response futures of [`Bulkhead`](crate::Bulkhead) and
//! [`HttpBulkhead`](crate::HttpBulkhead).
//!
//! Both carry the call's slot (its permit) from `call` until the inner
//! future completes, so completing, failing or dropping the future gives the
//! slot back. With `max_wait`, a call that found its compartment full waits
//! for a slot here, in the future, never in `poll_ready`.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::compartment::{Acquire, Permit};
use crate::error::BulkheadFull;
use crate::release::{BodyEnd, Head, Release};
use crate::BoxError;
use tower_resilience_base::context::Captured;
use tower_resilience_base::error::DeadlineExceeded;
use tower_resilience_base::{Answer, CallContext};

pin_project! {
    /// Response future of [`Bulkhead`](crate::Bulkhead).
    ///
    /// Resolves to the inner service's response, its error boxed, or a
    /// [`BulkheadFull`] error. In [`Head`](crate::release::Head) mode the
    /// slot is released as soon as the inner future completes, or when this
    /// future is dropped; in [`BodyEnd`](crate::release::BodyEnd) mode it
    /// moves into the response body.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, Req, M = Head>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        _release: PhantomData<fn() -> M>,
    }
}

pin_project! {
    /// Response future of [`HttpBulkhead`](crate::HttpBulkhead).
    ///
    /// Resolves to the inner service's response or error, or to the
    /// bulkhead's own answer (503 with `Retry-After`, or gRPC
    /// RESOURCE_EXHAUSTED) when the compartment was full. In
    /// [`Head`](crate::release::Head) mode the slot is released when the
    /// inner future completes; in [`BodyEnd`](crate::release::BodyEnd) mode
    /// it moves into the response body.
    #[must_use = "futures do nothing unless polled"]
    pub struct HttpResponseFuture<S, Req, M>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        grpc: bool,
        retry_after_secs: u64,
        _release: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Called {
            #[pin]
            future: S::Future,
            permit: Option<Permit>,
        },
        // Boxed: only the slow path pays for it, and the future of the happy
        // path stays small (no request or service inline).
        Waiting {
            waiting: Box<Waiting<S, Req>>,
        },
        Rejected {
            error: Option<BulkheadFull>,
        },
        Done,
    }
}

/// A call waiting for a slot. The service is the clone that was made ready
/// for this call; it is called once a slot is free.
struct Waiting<S, Req> {
    acquire: Acquire,
    /// The call's context, for the layers below when the call is made.
    context: Captured,
    service: Option<S>,
    request: Option<Req>,
}

/// How the shared state machine ended.
enum Outcome<T, E> {
    Response(T, Option<Permit>),
    Inner(E, Option<Permit>),
    Full(BulkheadFull),
}

// === impl State ===

impl<S, Req> State<S, Req>
where
    S: Service<Req>,
{
    fn called(future: S::Future, permit: Permit) -> Self {
        Self::Called {
            future,
            permit: Some(permit),
        }
    }

    fn waiting(acquire: Acquire, service: S, request: Req) -> Self {
        Self::Waiting {
            waiting: Box::new(Waiting {
                acquire,
                context: CallContext::capture(),
                service: Some(service),
                request: Some(request),
            }),
        }
    }

    fn rejected(error: BulkheadFull) -> Self {
        Self::Rejected { error: Some(error) }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Called { .. } => "called",
            Self::Waiting { .. } => "waiting",
            Self::Rejected { .. } => "rejected",
            Self::Done => "done",
        }
    }

    #[inline]
    fn poll_outcome(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Outcome<S::Response, S::Error>> {
        loop {
            match self.as_mut().project() {
                StateProj::Called { future, permit } => {
                    let output = ready!(future.poll(cx));
                    // The finished inner future stays until this one is
                    // dropped (polling it again is the caller's error, as
                    // for any future); the slot is handed on now.
                    let permit = permit.take();
                    return Poll::Ready(match output {
                        Ok(response) => Outcome::Response(response, permit),
                        Err(error) => Outcome::Inner(error, permit),
                    });
                }
                StateProj::Waiting { waiting } => match ready!(waiting.acquire.as_mut().poll(cx)) {
                    Ok(permit) => {
                        let (Some(mut service), Some(request)) =
                            (waiting.service.take(), waiting.request.take())
                        else {
                            unreachable!("a waiting call holds its service and request");
                        };
                        let future = waiting.context.scoped(|| service.call(request));
                        self.set(Self::called(future, permit));
                    }
                    Err(full) => {
                        self.set(Self::Done);
                        return Poll::Ready(Outcome::Full(full));
                    }
                },
                StateProj::Rejected { error } => {
                    let error = error.take();
                    self.set(Self::Done);
                    if let Some(error) = error {
                        return Poll::Ready(Outcome::Full(error));
                    }
                }
                StateProj::Done => panic!("bulkhead response future polled after completion"),
            }
        }
    }
}

// === impl ResponseFuture ===

impl<S, Req, M> ResponseFuture<S, Req, M>
where
    S: Service<Req>,
{
    pub(crate) fn called(future: S::Future, permit: Permit) -> Self {
        Self::with_state(State::called(future, permit))
    }

    pub(crate) fn waiting(acquire: Acquire, service: S, request: Req) -> Self {
        Self::with_state(State::waiting(acquire, service, request))
    }

    pub(crate) fn rejected(error: BulkheadFull) -> Self {
        Self::with_state(State::rejected(error))
    }

    fn with_state(state: State<S, Req>) -> Self {
        Self {
            state,
            _release: PhantomData,
        }
    }
}

impl<S, Req> Future for ResponseFuture<S, Req, Head>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.project().state.poll_outcome(cx)) {
            Outcome::Response(response, mut permit) => {
                if let Some(permit) = &mut permit {
                    permit.completed();
                }
                Ok(response)
            }
            Outcome::Inner(error, permit) => Err(judge_error(error.into(), permit)),
            Outcome::Full(full) => Err(full.into()),
        })
    }
}

impl<S, ReqBody, B> Future for ResponseFuture<S, Request<ReqBody>, BodyEnd>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<ResponseBody<B>>, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.project().state.poll_outcome(cx)) {
            Outcome::Response(response, permit) => {
                let permit = judge_response(&response, permit);
                Ok(BodyEnd::finish(response, permit))
            }
            Outcome::Inner(error, permit) => Err(judge_error(error.into(), permit)),
            Outcome::Full(full) => Err(full.into()),
        })
    }
}

impl<S, Req, M> fmt::Debug for ResponseFuture<S, Req, M>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("state", &self.state.name())
            .finish()
    }
}

/// Tells an adaptive compartment how a call that failed ended: congestion
/// if a deadline or a timeout is in the error's chain, nothing otherwise.
/// The permit is given back here.
fn judge_error(error: BoxError, permit: Option<Permit>) -> BoxError {
    if let Some(mut permit) = permit {
        if permit.is_adaptive() {
            if is_congestion(&*error) {
                permit.congested();
            } else {
                permit.ignored();
            }
        }
    }
    error
}

/// Whether an error says the call was cut for time: the base crate's
/// `DeadlineExceeded`, tokio's `Elapsed`, or an `io::Error` of kind
/// `TimedOut`, anywhere in its chain.
pub(crate) fn is_congestion(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut chain = std::iter::successors(Some(error), |e| e.source());
    chain.any(|e| {
        e.is::<DeadlineExceeded>()
            || e.is::<tokio::time::error::Elapsed>()
            || e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    })
}

/// Tells an adaptive compartment how a call that answered ended: an
/// "overloaded" answer (503, 504, gRPC RESOURCE_EXHAUSTED or
/// DEADLINE_EXCEEDED in a trailers-only head) is congestion, any other a
/// completion.
#[inline]
fn judge_response<B>(response: &Response<B>, mut permit: Option<Permit>) -> Option<Permit> {
    if let Some(permit) = &mut permit {
        if permit.is_adaptive() && is_overloaded(response) {
            permit.congested();
        } else {
            permit.completed();
        }
    }
    permit
}

fn is_overloaded<B>(response: &Response<B>) -> bool {
    let status = response.status();
    if status == http::StatusCode::SERVICE_UNAVAILABLE
        || status == http::StatusCode::GATEWAY_TIMEOUT
    {
        return true;
    }
    matches!(
        response
            .headers()
            .get("grpc-status")
            .map(http::HeaderValue::as_bytes),
        Some(b"4" | b"8")
    )
}

// === impl HttpResponseFuture ===

impl<S, Req, M> HttpResponseFuture<S, Req, M>
where
    S: Service<Req>,
{
    pub(crate) fn called(future: S::Future, permit: Permit) -> Self {
        Self::with_state(State::called(future, permit), false, 0)
    }

    pub(crate) fn waiting(
        acquire: Acquire,
        service: S,
        request: Req,
        grpc: bool,
        retry_after_secs: u64,
    ) -> Self {
        Self::with_state(
            State::waiting(acquire, service, request),
            grpc,
            retry_after_secs,
        )
    }

    pub(crate) fn rejected(error: BulkheadFull, grpc: bool, retry_after_secs: u64) -> Self {
        Self::with_state(State::rejected(error), grpc, retry_after_secs)
    }

    fn with_state(state: State<S, Req>, grpc: bool, retry_after_secs: u64) -> Self {
        Self {
            state,
            grpc,
            retry_after_secs,
            _release: PhantomData,
        }
    }
}

impl<S, ReqBody, B, M> Future for HttpResponseFuture<S, Request<ReqBody>, M>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    B: Default,
    M: Release,
{
    type Output = Result<Response<M::Body<B>>, S::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        Poll::Ready(match ready!(this.state.poll_outcome(cx)) {
            Outcome::Response(response, permit) => {
                let permit = judge_response(&response, permit);
                Ok(M::finish(response, permit))
            }
            Outcome::Inner(error, mut permit) => {
                // The inner error type is not ours to look into: no signal.
                if let Some(permit) = &mut permit {
                    permit.ignored();
                }
                Err(error)
            }
            Outcome::Full(_) => Ok(M::answer(
                Answer::bulkhead_full(std::time::Duration::from_secs(*this.retry_after_secs))
                    .into_response(*this.grpc),
            )),
        })
    }
}

impl<S, Req, M> fmt::Debug for HttpResponseFuture<S, Req, M>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpResponseFuture")
            .field("state", &self.state.name())
            .field("grpc", &self.grpc)
            .finish()
    }
}
