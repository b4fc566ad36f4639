use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use tower_resilience_base::{CallContext, Deadline};

use crate::body::{Buffered, ReplayMode};
use crate::budget::{Counters, RetryBudget};
use crate::future::ResponseFuture;
use crate::layer::Config;
use crate::metrics::RetryMetrics;
use crate::policy::{DefaultPolicy, Policy};
use crate::RandomSource;
use crate::{BoxError, RetryLayer};

/// Middleware that retries transient failures of idempotent requests, with
/// jittered backoff, within a budget and before the caller's deadline.
///
/// Built by [`RetryLayer`]; see the [crate docs](crate) for the rules. For
/// each request it:
///
/// 1. counts the request in the [`RetryBudget`];
/// 2. if the request may be retried (the [`Policy`] says it is idempotent,
///    more than one attempt is allowed and its body can be replayed), keeps
///    a copy of its head and a way to replay its body;
/// 3. sends it, and classifies the outcome with the [`Policy`]; a response
///    carrying [`NO_RETRY_HEADER`](crate::NO_RETRY_HEADER) is never retried
///    and the header is removed;
/// 4. for a retryable failure, retries after the backoff unless the
///    attempts, the deadline or the budget forbid it, in that order of
///    checking; the retry carries the attempt number on the wire and asks
///    breaker's [`AttemptHook`](crate::AttemptHook), if one was offered in
///    the call context, first;
/// 5. otherwise returns the outcome, saying why it stopped (see
///    [`GaveUp`](crate::GaveUp) and [`crate::error`]).
///
/// # Clone
///
/// Clones share the budget, the counters, the random source and the
/// configuration (one `Arc`), and clone the inner service.
///
/// # The service the retries go through
///
/// The first attempt goes through the service that was polled ready. The
/// retries go through clones of a spare: a clone of the inner service made
/// on the first retryable call and shared by this service's clones, cloned
/// once more for each call that retries (and polled ready before each
/// retry). A call that needs no retry clones no service, where a clone per
/// call of a stack below (a bulkhead, a per-attempt deadline) would cost
/// several reference-count updates. Clones of a tower service are expected
/// to be equivalent (they share a connection pool, a buffer's worker, a
/// bulkhead's slots); a service changed through
/// [`get_mut`](Retry::get_mut) after the first retryable call is not
/// what the retries use.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceExt};
/// use tower_retry_budget::body::ReplayBody;
/// use tower_retry_budget::Retry;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let inner = service_fn(|_req: http::Request<ReplayBody<String>>| async {
///     Ok::<_, BoxError>(http::Response::new("hello"))
/// });
/// let response = Retry::new(inner).oneshot(http::Request::new(String::new())).await?;
/// assert_eq!(*response.body(), "hello");
/// # Ok(())
/// # }
/// ```
pub struct Retry<S, P = DefaultPolicy, M = Buffered> {
    inner: S,
    shared: Arc<Shared<S, P>>,
    _mode: PhantomData<fn() -> M>,
}

/// Everything a service and its clones share (the budget and random
/// source with the other services of the layer). The policy comes last so
/// that `Arc<Shared<S, P>>` coerces to `Arc<Shared<S, dyn Policy>>`.
pub(crate) struct Shared<S, P: ?Sized> {
    pub(crate) config: Config,
    pub(crate) budget: Arc<RetryBudget>,
    pub(crate) random: Arc<dyn RandomSource>,
    /// The `metrics` handles (nothing without the feature).
    pub(crate) metrics: RetryMetrics,
    /// A clone of the inner service, made on the first retryable call,
    /// that retries are sent through (each retry clones it): a call that
    /// needs no retry then clones no service, where cloning one per call
    /// (a stack below: a bulkhead, a per-attempt deadline) costs several
    /// reference-count updates.
    pub(crate) spare: OnceLock<Mutex<S>>,
    pub(crate) policy: P,
}

impl<S: Clone, P: ?Sized> Shared<S, P> {
    /// A service for a retry: a clone of the spare.
    pub(crate) fn retry_service(&self) -> Option<S> {
        let spare = self.spare.get()?;
        // A panic in another retry's `clone` leaves the spare as it was.
        let spare = spare.lock().unwrap_or_else(PoisonError::into_inner);
        Some(spare.clone())
    }
}

// === impl Retry ===

impl<S> Retry<S> {
    /// Wraps `inner` with the defaults of [`RetryLayer::new`], and a budget
    /// of its own.
    pub fn new(inner: S) -> Self {
        RetryLayer::new().layer(inner)
    }

    /// A layer that wraps services in [`Retry`]; the same as
    /// [`RetryLayer::new`].
    pub fn layer() -> RetryLayer {
        RetryLayer::new()
    }
}

impl<S, P, M> Retry<S, P, M> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<S, P>>) -> Self {
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

    /// The counters of the shared budget: requests, retries, retries
    /// refused.
    #[must_use]
    pub fn counters(&self) -> Counters {
        self.shared.budget.counters()
    }
}

impl<S: Clone, P, M> Clone for Retry<S, P, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, P, M> fmt::Debug for Retry<S, P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .field("budget", &self.shared.budget)
            .field("policy", &std::any::type_name::<P>())
            .finish()
    }
}

impl<S, P, M, B, ResB> Service<Request<B>> for Retry<S, P, M>
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

    #[inline]
    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The deadline and the clock reading of the call, from the layers
        // above (one clock read per call for the whole stack).
        let (from_context, enforced, now) =
            CallContext::current(|cx| (cx.effective_deadline(), cx.is_enforced(), cx.now()));
        let now = now.unwrap_or_else(Instant::now);
        let shared = &self.shared;
        shared.budget.deposit_at(now);
        // A breaker above hands its attempt hook to this layer: from here on
        // this layer reports every attempt, and the breaker counts nothing.
        let attempts = CallContext::take_attempts();

        let (parts, body) = request.into_parts();
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
        let retryable = shared.config.max_attempts.get() > 1
            && shared
                .policy
                .is_retryable_request(&parts.method, &parts.headers);
        let (body, saved) = M::prepare(body, shared.config.body_limit, retryable);

        let shared: Arc<Shared<S, dyn Policy>> = self.shared.clone();
        let mut future = ResponseFuture::new(shared, attempts, deadline);
        let inner = &mut self.inner;
        if let Some(saved) = saved.filter(|_| retryable) {
            // The spare service the retries will clone, once per service
            // rather than a clone per call.
            self.shared.spare.get_or_init(|| Mutex::new(inner.clone()));
            future.keep_for_retries(&parts, saved, enforced);
        }
        let request = Request::from_parts(parts, body);
        // The inner future is written into the response future in place
        // rather than moved into it (a deep stack's futures are hundreds of
        // bytes).
        future.start(CallContext::scoped(
            |cx| {
                cx.set_attempt(1);
                cx.set_now(now);
            },
            || inner.call(request),
        ));
        future
    }
}
