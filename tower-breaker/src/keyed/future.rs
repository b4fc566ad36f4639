//! The response future of the keyed services: a key's call that must first
//! wait for its breaker's fleet (the election it starts, or a read of a
//! stale decision) waits here, since a keyed service's `poll_ready` does
//! not know the key.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};

use pin_project_lite::pin_project;
use tower_resilience_base::context::Captured;
use tower_resilience_base::CallContext;

use super::registry::Handle;
use crate::breaker::ElectionWait;

pin_project! {
    /// Response future of the keyed services
    /// ([`KeyedCircuitBreaker`](super::KeyedCircuitBreaker),
    /// [`KeyedHttpCircuitBreaker`](super::KeyedHttpCircuitBreaker),
    /// [`KeyedPlainCircuitBreaker`](super::KeyedPlainCircuitBreaker)):
    /// `F` is the future of the unkeyed flavour (`ResponseFuture`,
    /// `AnswerFuture`, `PlainResponseFuture` of [`crate::future`]), `S` the
    /// inner service, `Req` the request, `C` the classifier.
    ///
    /// Almost always it is `F` at once. A key whose breaker shares its
    /// state with a fleet may have to wait first, as the unkeyed services
    /// do in `poll_ready`: the call that ends the key's open period waits
    /// for the probe election it starts (and is the probe if this process
    /// wins), and a call on a decision older than the allowed staleness
    /// waits for a read of the fleet's (at most the election timeout). The
    /// waiting call holds the inner service that was ready for it (the
    /// keyed service keeps a clone) and calls it when the wait ends, with
    /// the call context of the layers above (their deadline and attempt
    /// number). Dropping it while it waits leaves nothing held: a probe
    /// won for it is given back.
    #[must_use = "futures do nothing unless polled"]
    pub struct KeyedFuture<F, S, Req, C> {
        #[pin]
        state: State<F, S, Req, C>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, Req, C> {
        Called { #[pin] future: F },
        // Boxed: the happy path's future stays the size of `F`.
        Waiting { deferred: Option<Box<Deferred<F, S, Req, C>>> },
    }
}

/// What a waiting call needs to make its call when the wait ends.
struct Deferred<F, S, Req, C> {
    wait: ElectionWait,
    handle: Arc<Handle>,
    classifier: C,
    service: S,
    request: Req,
    context: Captured,
    /// The layer's id when its attempt hook is offered below (the client
    /// flavour), else `None`.
    layer: Option<u64>,
    call: CallFn<F, S, Req, C>,
}

/// How a flavour calls: the key's handle, the classifier, the layer id
/// (see [`Deferred::layer`]), the inner service, the request.
pub(super) type CallFn<F, S, Req, C> = fn(&Handle, &C, Option<u64>, &mut S, Req) -> F;

impl<F, S, Req, C> KeyedFuture<F, S, Req, C> {
    /// The call was made (or refused) at once.
    #[inline]
    pub(super) fn called(future: F) -> Self {
        Self {
            state: State::Called { future },
        }
    }

    /// A call that waits for `wait`, then calls `service` (the one that was
    /// ready for it) with `call`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn waiting(
        wait: ElectionWait,
        handle: Arc<Handle>,
        classifier: C,
        layer: Option<u64>,
        service: S,
        request: Req,
        call: CallFn<F, S, Req, C>,
    ) -> Self {
        Self {
            state: State::Waiting {
                deferred: Some(Box::new(Deferred {
                    wait,
                    handle,
                    classifier,
                    service,
                    request,
                    context: CallContext::capture(),
                    layer,
                    call,
                })),
            },
        }
    }
}

/// Whether a call on `handle`'s breaker must wait for the fleet first:
/// the wait, started, if it must. Two loads when the breaker has no
/// store.
#[inline]
pub(super) fn must_wait(handle: &Handle) -> Option<ElectionWait> {
    let mut wait = ElectionWait::default();
    // Polled once here to start what is waited for; the future polls
    // it again with its own waker, which the election's and the
    // read's futures then keep.
    let mut cx = Context::from_waker(Waker::noop());
    match handle.breaker.poll_election(&mut wait, &mut cx) {
        Poll::Ready(()) => None,
        Poll::Pending => Some(wait),
    }
}

impl<F: Future, S, Req, C> Future for KeyedFuture<F, S, Req, C> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Called { future } => return future.poll(cx),
                StateProj::Waiting { deferred } => {
                    if let Some(waiting) = deferred {
                        ready!(waiting.handle.breaker.poll_election(&mut waiting.wait, cx));
                    }
                    // Taken only here, and replaced by `Called` below: gone
                    // only if the inner service's `call` panicked.
                    let Some(waiting) = deferred.take() else {
                        panic!("a keyed breaker's future polled after its call panicked")
                    };
                    let Deferred {
                        handle,
                        classifier,
                        mut service,
                        request,
                        context,
                        layer,
                        call,
                        ..
                    } = *waiting;
                    let future =
                        context.scoped(|| call(&handle, &classifier, layer, &mut service, request));
                    state.set(State::Called { future });
                }
            }
        }
    }
}

impl<F, S, Req, C> fmt::Debug for KeyedFuture<F, S, Req, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Called { .. } => "called",
            State::Waiting { .. } => "waiting for the fleet",
        };
        f.debug_struct("KeyedFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
