//! Response futures of [`ServerDeadline`](crate::ServerDeadline) and
//! [`ClientDeadline`](crate::ClientDeadline).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tokio::time::{sleep_until, Instant, Sleep};
use tower_resilience_base::error::is_local_rejection;
use tower_resilience_base::{wake, Answer};

use crate::body::{BodyEnd, Extent, ResponseBody};
use crate::error::{DeadlineExceeded, InsufficientBudget};
use crate::metrics::Expiry;
use crate::{BoxError, Deadline};

pin_project! {
    /// Response future of [`ServerDeadline`](crate::ServerDeadline).
    ///
    /// Runs the inner future inside the deadline's task-local scope and
    /// races it against the deadline; when the deadline wins, the inner
    /// future is dropped at once and the timeout answer is returned. A
    /// response that comes in time gets a [`ResponseBody`] that goes on
    /// enforcing the deadline (and its scope) while a streaming body is
    /// sent.
    #[must_use = "futures do nothing unless polled"]
    pub struct ServerResponseFuture<F, B> {
        #[pin]
        state: ServerState<F, B>,
    }
}

pin_project! {
    #[project = ServerStateProj]
    enum ServerState<F, B> {
        Unbounded {
            #[pin]
            inner: F,
        },
        Bounded {
            #[pin]
            inner: TaskLocalFuture<Deadline, F>,
            #[pin]
            sleep: Sleep,
            grpc: bool,
            expired: Expiry,
        },
        Answer {
            response: Option<Response<B>>,
        },
    }
}

// === impl ServerResponseFuture ===

impl<F, B> ServerResponseFuture<F, B> {
    pub(crate) fn answer(response: Response<B>) -> Self {
        Self {
            state: ServerState::Answer {
                response: Some(response),
            },
        }
    }

    pub(crate) fn unbounded(inner: F) -> Self {
        Self {
            state: ServerState::Unbounded { inner },
        }
    }

    pub(crate) fn bounded(deadline: Deadline, inner: F, grpc: bool, expired: Expiry) -> Self
    where
        F: Future,
    {
        Self {
            state: ServerState::Bounded {
                inner: deadline.scope(inner),
                sleep: sleep_until(deadline.instant()),
                grpc,
                expired,
            },
        }
    }
}

impl<F, B, E> Future for ServerResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Default,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        match state.as_mut().project() {
            ServerStateProj::Unbounded { inner } => inner
                .poll(cx)
                .map(|r| r.map(|res| res.map(ResponseBody::free))),
            ServerStateProj::Bounded {
                inner,
                sleep,
                grpc,
                expired,
            } => {
                if let Poll::Ready(out) = inner.poll(cx) {
                    // A handler that finishes in the same timer tick as the
                    // deadline usually finished *because* of it (its own
                    // client calls were cut by the same deadline): the caller
                    // has given up, so the answer is the deadline's.
                    if !sleep.is_elapsed() {
                        // The caller's budget covers the whole response: a
                        // streaming body goes on under the same deadline.
                        let deadline = Deadline::at(sleep.deadline());
                        let (grpc, expired) = (*grpc, expired.clone());
                        return Poll::Ready(out.map(|res| {
                            res.map(|b| ResponseBody::serving(b, deadline, grpc, expired))
                        }));
                    }
                } else {
                    ready!(sleep.poll(cx));
                }
                let grpc = *grpc;
                expired.fire();
                tracing::debug!(grpc, "deadline passed; dropping the handler");
                // Dropping the inner future here cancels the handler now,
                // not when this future is dropped.
                state.set(ServerState::Answer { response: None });
                // The handler was called and ran out of time: its answer,
                // not a local refusal.
                Poll::Ready(Ok(Answer::deadline_exceeded()
                    .service_called()
                    .into_response(grpc)
                    .map(ResponseBody::free)))
            }
            ServerStateProj::Answer { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response.map(ResponseBody::free))),
                None => panic!("ServerResponseFuture polled after completion"),
            },
        }
    }
}

impl<F, B> fmt::Debug for ServerResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            ServerState::Unbounded { .. } => "unbounded",
            ServerState::Bounded { .. } => "bounded",
            ServerState::Answer { .. } => "answer",
        };
        f.debug_struct("ServerResponseFuture")
            .field("state", &state)
            .finish()
    }
}

pin_project! {
    /// Response future of [`ClientDeadline`](crate::ClientDeadline).
    ///
    /// Races the inner future against the deadline; when the deadline wins,
    /// the inner future is dropped at once and the call fails with
    /// [`DeadlineExceeded`]. The timer is armed only when the inner future
    /// first returns `Pending`, so a call that answers at once never
    /// touches the timer wheel. The response's body is a
    /// [`ResponseBody`], which goes on enforcing the deadline until the
    /// body ends (taking over the timer, if the head armed it), unless
    /// the layer is [`head_only`](crate::ClientDeadlineLayer::head_only)
    /// (`E` is [`Head`](crate::body::Head)).
    #[must_use = "futures do nothing unless polled"]
    pub struct ClientResponseFuture<F, E = BodyEnd> {
        #[pin]
        state: ClientState<F>,
        _extent: PhantomData<fn() -> E>,
    }
}

pin_project! {
    #[project = ClientStateProj]
    enum ClientState<F> {
        Unbounded {
            #[pin]
            inner: F,
        },
        Bounded {
            #[pin]
            inner: F,
            timer: Timer,
            // Taken by the response body, or fired at the deadline.
            expired: Option<Expiry>,
        },
        Refused {
            error: Option<InsufficientBudget>,
        },
        Done,
    }
}

/// A timer armed on first use, on the heap: a call that answers at once
/// never allocates it, and the response future stays small (a `Sleep` is
/// over 100 bytes, moved with the future at every layer above).
enum Timer {
    Idle { at: Instant },
    Armed { sleep: Pin<Box<Sleep>> },
}

// === impl Timer ===

impl Timer {
    /// Polls the timer after the inner future returned `Pending`, having
    /// noted (see [`wake`]) that a timer below wakes the task by
    /// `woken_by`. If that is no later than this deadline, an idle timer
    /// stays idle: the per-attempt deadline below already guarantees the
    /// poll at which this one sees the clock past it, so the call costs one
    /// timer, not two.
    fn poll(&mut self, cx: &mut Context<'_>, woken_by: Option<Instant>) -> Poll<()> {
        if let Timer::Idle { at } = *self {
            if woken_by.is_some_and(|by| by <= at) {
                return Poll::Pending;
            }
            *self = Timer::Armed {
                sleep: Box::pin(sleep_until(at)),
            };
        }
        let Timer::Armed { sleep } = self else {
            unreachable!("the timer was armed just above");
        };
        let polled = sleep.as_mut().poll(cx);
        if polled.is_pending() {
            wake::note(sleep.deadline());
        }
        polled
    }

    fn is_elapsed(&self) -> bool {
        match self {
            Timer::Idle { at } => Instant::now() >= *at,
            Timer::Armed { sleep } => sleep.is_elapsed(),
        }
    }

    /// The armed timer, for the response body to take over (no second
    /// allocation); `None` if it was never armed.
    /// The timer for the response body: the instant, and the armed timer
    /// if there is one (no second allocation, and no clock read).
    fn take(&mut self) -> (Instant, Option<Pin<Box<Sleep>>>) {
        match self {
            Timer::Idle { at } => (*at, None),
            Timer::Armed { sleep } => {
                let at = sleep.deadline();
                match std::mem::replace(self, Timer::Idle { at }) {
                    Timer::Armed { sleep } => (at, Some(sleep)),
                    Timer::Idle { .. } => (at, None),
                }
            }
        }
    }
}

// === impl ClientResponseFuture ===

impl<F, E> ClientResponseFuture<F, E> {
    pub(crate) fn unbounded(inner: F) -> Self {
        Self {
            state: ClientState::Unbounded { inner },
            _extent: PhantomData,
        }
    }

    pub(crate) fn bounded(deadline: Deadline, inner: F, expired: Expiry) -> Self {
        Self {
            state: ClientState::Bounded {
                inner,
                timer: Timer::Idle {
                    at: deadline.instant(),
                },
                expired: Some(expired),
            },
            _extent: PhantomData,
        }
    }

    pub(crate) fn refused(error: InsufficientBudget) -> Self {
        Self {
            state: ClientState::Refused { error: Some(error) },
            _extent: PhantomData,
        }
    }
}

impl<F, B, Er, E> Future for ClientResponseFuture<F, E>
where
    F: Future<Output = Result<Response<B>, Er>>,
    Er: Into<BoxError>,
    E: Extent,
{
    type Output = Result<Response<E::Body<B>>, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        match state.as_mut().project() {
            ClientStateProj::Unbounded { inner } => {
                inner.poll(cx).map(|r| r.map(E::free).map_err(Into::into))
            }
            ClientStateProj::Bounded {
                inner,
                timer,
                expired,
            } => {
                // What a timer below says while the inner future waits
                // (an answer ends the watch unfinished: nothing to learn).
                let watch = wake::Watch::start();
                match inner.poll(cx) {
                    Poll::Ready(Ok(response)) => {
                        if !E::BODY {
                            return Poll::Ready(Ok(E::free(response)));
                        }
                        // The deadline goes on over the body, with the
                        // timer the head armed, if it did.
                        let (at, sleep) = timer.take();
                        let Some(expired) = expired.take() else {
                            panic!("ClientResponseFuture polled after completion");
                        };
                        return Poll::Ready(Ok(E::bounded(response, |b| {
                            ResponseBody::bounded(b, Deadline::at(at), sleep, expired)
                        })));
                    }
                    Poll::Ready(Err(e)) => {
                        let e = e.into();
                        // An error in the tick of the deadline is usually a
                        // timer below (tonic's `Channel` runs one from the
                        // header we wrote) hitting the same deadline: report
                        // ours. A response that made it in time is kept, and
                        // so is a local rejection (the circuit open, the
                        // bulkhead full): the call was never sent, so no
                        // timer below ran, and the clock is not read for it.
                        if is_local_rejection(&*e) || !timer.is_elapsed() {
                            return Poll::Ready(Err(e));
                        }
                    }
                    Poll::Pending => ready!(timer.poll(cx, watch.finish())),
                }
                if let Some(expired) = expired.take() {
                    expired.fire();
                }
                tracing::debug!("deadline passed; cancelling the outgoing call");
                state.set(ClientState::Done);
                Poll::Ready(Err(DeadlineExceeded::new().into()))
            }
            ClientStateProj::Refused { error } => match error.take() {
                Some(error) => Poll::Ready(Err(error.into())),
                None => panic!("ClientResponseFuture polled after completion"),
            },
            ClientStateProj::Done => panic!("ClientResponseFuture polled after completion"),
        }
    }
}

impl<F, E> fmt::Debug for ClientResponseFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            ClientState::Unbounded { .. } => "unbounded",
            ClientState::Bounded { .. } => "bounded",
            ClientState::Refused { .. } => "refused",
            ClientState::Done => "done",
        };
        f.debug_struct("ClientResponseFuture")
            .field("state", &state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::time::Duration;

    use super::*;
    use crate::body::Head;
    use crate::metrics::ClientMetrics;

    type Inner = Pin<Box<dyn Future<Output = Result<Response<()>, BoxError>> + Send>>;

    fn outer(at: Instant, inner: Inner) -> Pin<Box<ClientResponseFuture<Inner, Head>>> {
        let expiry = ClientMetrics::new("test").expiry();
        Box::pin(ClientResponseFuture::bounded(
            Deadline::at(at),
            inner,
            expiry,
        ))
    }

    fn armed(future: &Pin<Box<ClientResponseFuture<Inner, Head>>>) -> bool {
        match &future.as_ref().get_ref().state {
            ClientState::Bounded { timer, .. } => matches!(timer, Timer::Armed { .. }),
            _ => panic!("not a bounded future"),
        }
    }

    /// An inner future that is always pending and notes `noted` (its
    /// claimed timer) on every poll, if any.
    fn pending_noting(noted: Option<Instant>) -> Inner {
        Box::pin(poll_fn(move |_| {
            if let Some(at) = noted {
                wake::note(at);
            }
            Poll::Pending
        }))
    }

    /// A timer that notes itself while pending, as the per-attempt
    /// deadline's and the retry's backoff do.
    async fn noted_sleep(at: Instant) {
        let mut sleep = Box::pin(sleep_until(at));
        poll_fn(|cx| {
            let polled = sleep.as_mut().poll(cx);
            if polled.is_pending() {
                wake::note(at);
            }
            polled
        })
        .await;
    }

    fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
        let waker = std::task::Waker::noop();
        future.poll(&mut Context::from_waker(waker))
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_below_by_the_deadline_leaves_the_outer_timer_unarmed() {
        let at = Instant::now() + Duration::from_secs(2);
        for noted in [at, at - Duration::from_millis(500)] {
            let mut future = outer(at, pending_noting(Some(noted)));
            let (polled, woken_by) = wake::watch(|| poll_once(future.as_mut()));
            assert!(polled.is_pending());
            assert!(!armed(&future), "a timer below wakes the task by {noted:?}");
            assert_eq!(woken_by, Some(noted), "the note reaches the layers above");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_timer_below_or_none_arms_the_outer_timer() {
        let at = Instant::now() + Duration::from_secs(2);
        for noted in [Some(at + Duration::from_millis(1)), None] {
            let mut future = outer(at, pending_noting(noted));
            let (polled, woken_by) = wake::watch(|| poll_once(future.as_mut()));
            assert!(polled.is_pending());
            assert!(
                armed(&future),
                "nothing below wakes the task by the deadline"
            );
            assert_eq!(woken_by, Some(noted.unwrap_or(at).min(at)));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_holds_when_the_timer_below_gives_up_at_it() {
        // A per-attempt deadline at the same instant: its timer ends the
        // attempt, and the outer layer reports its own deadline.
        let start = Instant::now();
        let at = start + Duration::from_secs(2);
        let inner: Inner = Box::pin(async move {
            noted_sleep(at).await;
            Err::<Response<()>, BoxError>("the attempt's deadline".into())
        });
        let mut future = outer(at, inner);
        assert!(poll_once(future.as_mut()).is_pending());
        assert!(!armed(&future));
        let error = future.await.expect_err("the deadline passed");
        assert!(error.is::<DeadlineExceeded>(), "{error}");
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_holds_when_the_future_below_waits_untimed_after_a_timer() {
        // A backoff that ends before the deadline, then a wait with no
        // timer: the outer timer must be armed on that later poll.
        let start = Instant::now();
        let at = start + Duration::from_secs(2);
        let inner: Inner = Box::pin(async move {
            noted_sleep(start + Duration::from_millis(300)).await;
            std::future::pending::<()>().await;
            unreachable!("never answers")
        });
        let mut future = outer(at, inner);
        assert!(poll_once(future.as_mut()).is_pending());
        assert!(!armed(&future), "the backoff's timer wakes the task first");
        let error = future.await.expect_err("the deadline passed");
        assert!(error.is::<DeadlineExceeded>(), "{error}");
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
