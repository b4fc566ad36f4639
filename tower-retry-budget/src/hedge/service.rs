use std::fmt;
use std::marker::PhantomData;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_resilience_base::{CallContext, Deadline};
use tower_service::Service;

use super::future::{self, Race, ResponseFuture, Timing};
use super::layer::HedgeLayer;
use super::shared::{HedgeCounters, Shared};
use crate::body::{Buffered, ReplayMode};
use crate::policy::{DefaultPolicy, Policy};
use crate::BoxError;

/// Middleware that hedges slow idempotent requests: when the first attempt
/// has not answered after a learned percentile of recent latencies (or a
/// fixed delay), it sends one more through a clone of the inner service,
/// and the first answer that is not a retryable failure wins.
///
/// Built by [`HedgeLayer`]; see the [module docs](super) for the rules. For
/// each request it:
///
/// 1. counts the request (and, unless a retry layer below does, deposits it
///    in the budget);
/// 2. if the request may be hedged (the [`Policy`] says it is idempotent,
///    hedging is on, and its body can be replayed), keeps a copy of its
///    head, a way to replay its body and a clone of the inner service, and
///    takes the attempt hook of a breaker above from the call context;
/// 3. sends it, handing the hook on to the layers below for this attempt;
/// 4. if no answer has come when the delay has passed, and the call is not
///    out of hedges, pushed back, paused or short of deadline, and the
///    hook and the budget agree, sends a hedge;
/// 5. returns the first answer that is not a retryable failure, and drops
///    (cancels) the other attempts; when every attempt fails, the first
///    attempt's failure (or the earliest hedge's).
///
/// # Clone
///
/// Clones share the estimate, the counters, the budget and the
/// configuration (one `Arc`), and clone the inner service.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceExt};
/// use tower_retry_budget::body::ReplayBody;
/// use tower_retry_budget::hedge::Hedge;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let inner = tower::service_fn(|_req: http::Request<ReplayBody<String>>| async {
///     Ok::<_, BoxError>(http::Response::new("hello"))
/// });
/// let response = Hedge::new(inner).oneshot(http::Request::new(String::new())).await?;
/// assert_eq!(*response.body(), "hello");
/// # Ok(())
/// # }
/// ```
pub struct Hedge<S, P = DefaultPolicy, M = Buffered> {
    inner: S,
    shared: Arc<Shared<P>>,
    _mode: PhantomData<fn() -> M>,
}

// === impl Hedge ===

impl<S> Hedge<S> {
    /// Wraps `inner` with the defaults of [`HedgeLayer::new`], and a budget
    /// and an estimate of its own.
    pub fn new(inner: S) -> Self {
        HedgeLayer::new().layer(inner)
    }

    /// A layer that wraps services in [`Hedge`]; the same as
    /// [`HedgeLayer::new`].
    pub fn layer() -> HedgeLayer {
        HedgeLayer::new()
    }
}

impl<S, P, M> Hedge<S, P, M> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<P>>) -> Self {
        Self {
            inner,
            shared,
            _mode: PhantomData,
        }
    }

    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The counters of the layer this service belongs to.
    #[must_use]
    pub fn counters(&self) -> HedgeCounters {
        self.shared.state.counters()
    }
}

impl<S: Clone, P, M> Clone for Hedge<S, P, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, P, M> fmt::Debug for Hedge<S, P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hedge")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .field("state", &self.shared.state)
            .field("policy", &std::any::type_name::<P>())
            .finish()
    }
}

impl<S, P, M, B, ResB> Service<Request<B>> for Hedge<S, P, M>
where
    M: ReplayMode<B>,
    S: Service<Request<M::Body>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
    P: Policy,
    ResB: 'static,
{
    type Response = Response<ResB>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B, M>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let shared = &self.shared;
        let config = &shared.config;
        shared.state.count_request();
        let (parts, body) = request.into_parts();
        let hedgeable = config.max_hedges > 0
            && shared
                .policy
                .is_retryable_request(&parts.method, &parts.headers);
        let (from_context, enforced, now) = if hedgeable || config.charging.counts_requests {
            CallContext::current(|cx| (cx.effective_deadline(), cx.is_enforced(), cx.now()))
        } else {
            (None, false, None)
        };
        let now = match now {
            Some(now) => now,
            None if hedgeable || config.charging.counts_requests => Instant::now(),
            // Not counted, not hedged: no clock needed.
            None => return self.pass(parts, body),
        };
        if config.charging.counts_requests {
            shared.budget.deposit_at(now);
        }
        let (body, saved) = M::prepare(body, config.body_limit, hedgeable);
        let saved = match saved {
            Some(saved) if hedgeable => saved,
            _ => {
                let inner = &mut self.inner;
                let request = Request::from_parts(parts, body);
                return ResponseFuture::passthrough(inner.call(request));
            }
        };
        let deadline = if enforced {
            // Set by a `ClientDeadline` above: already the earliest it knew.
            from_context
        } else {
            match (from_context, Deadline::from_extensions(&parts.extensions)) {
                (Some(a), Some(b)) => Some(a.earliest(b)),
                (a, b) => a.or(b),
            }
        }
        .map(Deadline::instant);

        // A breaker above hands its attempt hook to this layer, which
        // hands each attempt's share of it to the layers below.
        let attempts = CallContext::take_attempts();
        let hook = attempts.as_ref().map(|a| Arc::clone(a.hook()));
        let template = crate::future::clone_head(&parts);
        // Call the service that was polled ready; keep the other for the
        // hedges, which poll it again first.
        let clone = self.inner.clone();
        let mut ready = mem::replace(&mut self.inner, clone);
        let request = Request::from_parts(parts, body);
        let (future, left) = future::send(&mut ready, request, attempts, |cx| {
            cx.set_attempt(1);
            cx.set_now(now);
        });
        let shared: Arc<Shared<dyn Policy>> = self.shared.clone();
        ResponseFuture::race(
            future,
            Race::new(
                shared,
                ready,
                template,
                saved,
                (hook, left),
                Timing {
                    start: now,
                    deadline,
                    enforced,
                },
            ),
        )
    }
}

impl<S, P, M> Hedge<S, P, M> {
    /// Sends a request that is neither counted nor hedged.
    fn pass<B, ResB>(&mut self, parts: http::request::Parts, body: B) -> ResponseFuture<S, B, M>
    where
        M: ReplayMode<B>,
        S: Service<Request<M::Body>, Response = Response<ResB>>,
    {
        let config = &self.shared.config;
        let (body, _) = M::prepare(body, config.body_limit, false);
        ResponseFuture::passthrough(self.inner.call(Request::from_parts(parts, body)))
    }
}
