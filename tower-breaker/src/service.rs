use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_resilience_base::grpc::is_grpc;
use tower_resilience_base::hook::{AttemptHook, Attempts};
use tower_resilience_base::{Answer, CallContext};
use tower_service::Service;

use crate::breaker::{Breaker, Kind};
use crate::classify::{Classify, DefaultClassifier};
use crate::future::{AnswerFuture, ResponseFuture, Tracker};
use crate::hook::{token, unpack, BreakerHook};
use crate::layer::BreakerLayer;
use crate::mode::{Client, Plain, Server};
use crate::BoxError;

/// Middleware that fails fast while its [`Breaker`] is open, and counts the
/// outcome of every call (every attempt, with a retry layer below) it lets
/// through.
///
/// Built by [`BreakerLayer`]. The type parameters are the classifier
/// (default [`DefaultClassifier`]) and the mode (default
/// [`Client`]; see [`crate::mode`]).
///
/// For each request it asks the breaker (one atomic load while closed).
/// Refused: it fails at once with
/// [`CircuitOpen`](crate::error::CircuitOpen) (server mode: answers 503),
/// without calling the inner service. Allowed: in client mode it puts an
/// attempt handle into the request's extensions (see the
/// [crate docs](crate#why-count-every-attempt)), calls the inner service,
/// and counts the outcome with the classifier when the response future
/// completes.
///
/// # Clone
///
/// Clones share the breaker (one `Arc`) and clone the inner service and
/// the classifier.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceExt};
/// use tower_breaker::{Breaker, CircuitBreaker};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let inner = service_fn(|_req: http::Request<()>| async {
///     Ok::<_, BoxError>(http::Response::new("hello"))
/// });
/// let breaker = Breaker::new("greeter");
/// let response = CircuitBreaker::new(inner, breaker.clone())
///     .oneshot(http::Request::new(()))
///     .await?;
/// assert_eq!(*response.body(), "hello");
/// assert_eq!(breaker.snapshot().totals.successful, 1);
/// # Ok(())
/// # }
/// ```
pub struct CircuitBreaker<S, C = DefaultClassifier, M = Client> {
    inner: S,
    breaker: Breaker,
    classifier: C,
    count_attempts: bool,
    /// The attempt hook, made on the first call (when the response type is
    /// known) and shared by every clone.
    hook: Arc<OnceLock<Arc<dyn AttemptHook>>>,
    _mode: PhantomData<fn() -> M>,
}

// === impl CircuitBreaker ===

impl<S> CircuitBreaker<S> {
    /// Wraps `inner` with `breaker`, in client mode with the default
    /// classifier.
    pub fn new(inner: S, breaker: Breaker) -> Self {
        Self::from_parts(inner, breaker, DefaultClassifier, true)
    }

    /// A layer that wraps services with `breaker`; the same as
    /// [`BreakerLayer::new`].
    pub fn layer(breaker: Breaker) -> BreakerLayer {
        BreakerLayer::new(breaker)
    }
}

impl<S, C, M> CircuitBreaker<S, C, M> {
    pub(crate) fn from_parts(
        inner: S,
        breaker: Breaker,
        classifier: C,
        count_attempts: bool,
    ) -> Self {
        Self {
            inner,
            breaker,
            classifier,
            count_attempts,
            hook: Arc::new(OnceLock::new()),
            _mode: PhantomData,
        }
    }

    /// The breaker.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
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
}

impl<S: Clone, C: Clone, M> Clone for CircuitBreaker<S, C, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            breaker: self.breaker.clone(),
            classifier: self.classifier.clone(),
            count_attempts: self.count_attempts,
            hook: Arc::clone(&self.hook),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, C: fmt::Debug, M> fmt::Debug for CircuitBreaker<S, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("breaker", &self.breaker.name())
            .field("classifier", &self.classifier)
            .field("count_attempts", &self.count_attempts)
            .field("mode", &std::any::type_name::<M>())
            .finish()
    }
}

/// Client mode: HTTP requests, the attempt hook, typed errors.
impl<S, C, B> Service<Request<B>> for CircuitBreaker<S, C, Client>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Response: 'static,
    C: Classify<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Request<B>) -> Self::Future {
        let hook = self.count_attempts.then(|| {
            self.hook.get_or_init(|| {
                Arc::new(BreakerHook::<C, S::Response>::new(
                    self.breaker.clone(),
                    self.classifier.clone(),
                ))
            })
        });
        call_client(
            &self.breaker,
            &self.classifier,
            hook,
            &mut self.inner,
            request,
        )
    }
}

/// The client-mode call, shared with the keyed service: admits the call,
/// offers the hook to a retry layer below, and counts the call itself when
/// no layer took the hook.
#[inline]
pub(crate) fn call_client<S, C, B>(
    breaker: &Breaker,
    classifier: &C,
    hook: Option<&Arc<dyn AttemptHook>>,
    inner: &mut S,
    request: Request<B>,
) -> ResponseFuture<S::Future, C>
where
    S: Service<Request<B>>,
    C: Classify<S::Response> + Clone,
{
    let raw = match breaker.admit() {
        Ok(raw) => raw,
        Err(rejection) => return ResponseFuture::rejected(breaker.open_error(rejection)),
    };
    match hook {
        Some(hook) if raw.kind != Kind::Untracked => {
            let attempts = Attempts::new(Arc::clone(hook), token(breaker, raw));
            let (future, left) = CallContext::offer_attempts(attempts, || inner.call(request));
            // Taken: a retry layer below reports every attempt, this layer
            // counts nothing. Left: this layer counts the call once.
            let tracker = match left.and_then(Attempts::into_in_flight) {
                None => Tracker::Done,
                Some(token) => {
                    let (packed, started_ns) = token.parts();
                    match unpack(packed) {
                        Some(raw) => Tracker::Permit {
                            permit: breaker.permit_started(raw, started_ns),
                            classifier: classifier.clone(),
                        },
                        None => Tracker::Done,
                    }
                }
            };
            ResponseFuture::called(future, tracker)
        }
        _ => {
            let tracker = tracker(breaker, classifier, raw);
            ResponseFuture::called(inner.call(request), tracker)
        }
    }
}

#[inline]
fn tracker<C: Clone>(breaker: &Breaker, classifier: &C, raw: crate::breaker::Raw) -> Tracker<C> {
    if raw.kind == Kind::Untracked {
        Tracker::Done
    } else {
        Tracker::Permit {
            permit: breaker.permit(raw),
            classifier: classifier.clone(),
        }
    }
}

/// Plain mode: any request, no attempt hook, typed errors.
impl<S, C, Req> Service<Req> for CircuitBreaker<S, C, Plain>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        match self.breaker.admit() {
            Ok(raw) => {
                let tracker = tracker(&self.breaker, &self.classifier, raw);
                ResponseFuture::called(self.inner.call(request), tracker)
            }
            Err(rejection) => ResponseFuture::rejected(self.breaker.open_error(rejection)),
        }
    }
}

/// Server mode: rejections become HTTP or gRPC answers; the inner error
/// type passes through.
impl<S, C, B, ResB> Service<Request<B>> for CircuitBreaker<S, C, Server>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    ResB: Default,
    C: Classify<Response<ResB>> + Clone,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = AnswerFuture<S::Future, C, ResB>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.breaker.admit() {
            Ok(raw) => {
                let tracker = tracker(&self.breaker, &self.classifier, raw);
                AnswerFuture::called(self.inner.call(request), tracker)
            }
            Err(rejection) => {
                let open = self.breaker.open_error(rejection);
                let grpc = is_grpc(request.headers());
                AnswerFuture::answered(Answer::circuit_open(&open).into_response(grpc))
            }
        }
    }
}
