use std::fmt;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use tower_resilience_base::grpc::is_grpc;
use tower_resilience_base::hook::{AttemptHook, Attempts};
use tower_resilience_base::{Answer, CallContext};
use tower_service::Service;

use crate::body::ResponseBody;
use crate::breaker::{Breaker, ElectionWait, Kind, Raw};
use crate::classify::{Classify, DefaultClassifier, ErrorsOnly};
use crate::error::{BreakerError, CircuitOpen};
use crate::future::{
    AnswerFuture, PlainResponseFuture, ResponseFuture, Tracker, TypedResponseFuture,
};
use crate::hook::{self, token, unpack, HookStripes};
use crate::layer::{BreakerLayer, HttpBreakerLayer, PlainBreakerLayer, TypedBreakerLayer};
use crate::BoxError;

/// Middleware for HTTP clients that fails fast while its [`Breaker`] is
/// open, and counts the outcome of every call (every attempt, with a retry
/// layer below) it lets through.
///
/// The client flavour (see [Flavours](crate#flavours)), built by
/// [`BreakerLayer`]. The type parameter is the
/// [classifier](crate::Classify) (default [`DefaultClassifier`]). The
/// server flavour is [`HttpCircuitBreaker`], the one for any request type
/// [`PlainCircuitBreaker`].
///
/// For each request it asks the breaker (one atomic load while closed).
/// Refused: it fails at once with [`CircuitOpen`] in a [`BoxError`],
/// without calling the inner service. Allowed: it offers its attempt hook
/// to a retry layer below (see the
/// [crate docs](crate#why-count-every-attempt)), calls the inner service,
/// and, unless a retry layer below took the hook and counted every
/// attempt, counts the outcome with the classifier when the response
/// future completes. The inner service's errors are boxed, unchanged.
///
/// # Clone
///
/// Clones share the breaker and the attempt hook (one `Arc` each), and
/// clone the inner service and the classifier.
///
/// # Example
///
/// ```
/// use http_body_util::BodyExt;
/// use tower::{service_fn, BoxError, ServiceExt};
/// use tower_breaker::{Breaker, CircuitBreaker};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let inner = service_fn(|_req: http::Request<()>| async {
///     Ok::<_, BoxError>(http::Response::new(String::from("hello")))
/// });
/// let breaker = Breaker::new("greeter");
/// let response = CircuitBreaker::new(inner, breaker.clone())
///     .oneshot(http::Request::new(()))
///     .await?;
/// // The call's outcome is counted when its body ends.
/// assert_eq!(breaker.snapshot().totals.successful, 0);
/// let body = response.into_body().collect().await?.to_bytes();
/// assert_eq!(body, "hello");
/// assert_eq!(breaker.snapshot().totals.successful, 1);
/// # Ok(())
/// # }
/// ```
pub struct CircuitBreaker<S, C = DefaultClassifier> {
    inner: S,
    breaker: Breaker,
    classifier: C,
    count_attempts: bool,
    /// The attempt hook, made on the first call (when the response type is
    /// known) and shared by every clone.
    hook: Arc<OnceLock<HookStripes>>,
    /// The hook's attempts as the last call left them untaken (no retry
    /// layer below took them), kept for the next call: no `Arc` clone and
    /// drop of the hook per call. Not shared with clones.
    spare: Option<Attempts>,
    /// The wait of this service's call that ended an open period, for the
    /// fleet's election (see [`Breaker::acquire`]).
    election: ElectionWait,
}

/// Middleware for HTTP servers that answers `503 Service Unavailable`
/// while its [`Breaker`] is open, and counts the outcome of every request
/// it lets through.
///
/// The server flavour (see [Flavours](crate#flavours)), built by
/// [`HttpBreakerLayer`] (or [`BreakerLayer::http_answers`]). The type
/// parameter is the [classifier](crate::Classify) (default
/// [`DefaultClassifier`]).
///
/// Refused requests are answered without calling the inner service: `503`
/// with `Retry-After` (whole seconds until the probe, rounded up) and
/// `x-tower-no-retry: 1`, or for gRPC requests (`content-type:
/// application/grpc...`) an HTTP 200 trailers-only answer with
/// `grpc-status: 14` (UNAVAILABLE). The answers have an empty body, so the
/// response body type must implement [`Default`], as axum's and tonic's
/// do. The error type stays the inner service's, so the layer fits
/// `axum::Router::layer` (whose services never fail: `Infallible`); an
/// inner error must implement [`std::error::Error`] and is judged by the
/// classifier, like the client flavour's. Each request is counted once (no
/// attempt hook). Answers that a layer inside built when it refused the
/// request (a full HTTP bulkhead's 503, another breaker's) carry the
/// [`LocalAnswer`](tower_resilience_base::answer::LocalAnswer) extension,
/// and the [`DefaultClassifier`] ignores them: they say nothing about the
/// handler.
///
/// # Clone
///
/// Clones share the breaker (one `Arc`) and clone the inner service and
/// the classifier.
///
/// # Example
///
/// ```
/// use std::convert::Infallible;
/// use tower::{service_fn, ServiceExt};
/// use tower_breaker::{Breaker, HttpCircuitBreaker, Mode};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let handler = service_fn(|_req: http::Request<()>| async {
///     Ok::<_, Infallible>(http::Response::new(String::from("hello")))
/// });
/// let breaker = Breaker::new("app");
/// let server = HttpCircuitBreaker::new(handler, breaker.clone());
///
/// let response = server.clone().oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(response.status(), 200);
///
/// breaker.set_mode(Mode::ForcedOpen);
/// let grpc = http::Request::builder()
///     .header("content-type", "application/grpc")
///     .body(())
///     .unwrap();
/// let response = server.oneshot(grpc).await.unwrap();
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.headers()["grpc-status"], "14");
/// # }
/// ```
#[derive(Clone)]
pub struct HttpCircuitBreaker<S, C = DefaultClassifier> {
    inner: S,
    breaker: Breaker,
    classifier: C,
    election: ElectionWait,
}

/// Middleware for services of any request type that fails fast while its
/// [`Breaker`] is open, and counts the outcome of every call it lets
/// through.
///
/// The plain flavour (see [Flavours](crate#flavours)), built by
/// [`PlainBreakerLayer`] (or [`BreakerLayer::plain`]). The type parameter
/// is the [classifier](crate::Classify), by default [`ErrorsOnly`] (every
/// response succeeds, errors fail). Refused calls fail at once with
/// [`CircuitOpen`] in a [`BoxError`]; the inner service's errors are boxed,
/// unchanged. Each call is counted once (no attempt hook).
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
/// use tower_breaker::error::CircuitOpen;
/// use tower_breaker::{Breaker, Mode, PlainCircuitBreaker};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let lookup = service_fn(|id: u32| async move { Ok::<_, BoxError>(format!("user {id}")) });
/// let breaker = Breaker::new("users-db");
/// let lookup = PlainCircuitBreaker::new(lookup, breaker.clone());
/// assert_eq!(lookup.clone().oneshot(7).await?, "user 7");
///
/// breaker.set_mode(Mode::ForcedOpen);
/// let err = lookup.oneshot(7).await.unwrap_err();
/// assert!(err.is::<CircuitOpen>());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PlainCircuitBreaker<S, C = ErrorsOnly> {
    inner: S,
    breaker: Breaker,
    classifier: C,
    election: ElectionWait,
}

/// The plain flavour with an error that is not boxed: middleware for
/// services of any request type that fails fast with
/// [`BreakerError::Open`] while its [`Breaker`] is open, and counts the
/// outcome of every call it lets through.
///
/// Built by [`TypedBreakerLayer`] (or [`PlainBreakerLayer::typed`]). It
/// behaves as [`PlainCircuitBreaker`] in every way but its error type,
/// [`BreakerError<S::Error>`](BreakerError): the inner error is kept as it
/// is, and a refusal allocates nothing (the plain flavour boxes its
/// [`CircuitOpen`] into a [`BoxError`], one allocation per refusal). Use it
/// where refusals are frequent and cheap matters, or where the caller
/// matches on the error rather than downcasting it. `BreakerError` keeps
/// its cause as its `source`, so a layer above that boxes it still turns a
/// refusal into a 503 or UNAVAILABLE, and never retries it.
///
/// The inner error must implement `std::error::Error` (the classifier
/// judges it as one). A service whose error is already a [`BoxError`]
/// (which does not) keeps [`PlainCircuitBreaker`]: its errors are boxed
/// anyway, and the refusal's box is one more of them.
///
/// # Clone
///
/// Clones share the breaker (one `Arc`) and clone the inner service and
/// the classifier.
///
/// # Example
///
/// ```
/// use std::convert::Infallible;
/// use tower::{service_fn, ServiceExt};
/// use tower_breaker::error::BreakerError;
/// use tower_breaker::{Breaker, Mode, TypedCircuitBreaker};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let lookup = service_fn(|id: u32| async move { Ok::<_, Infallible>(format!("user {id}")) });
/// let breaker = Breaker::new("users-db");
/// let lookup = TypedCircuitBreaker::new(lookup, breaker.clone());
/// assert_eq!(lookup.clone().oneshot(7).await.unwrap(), "user 7");
///
/// breaker.set_mode(Mode::ForcedOpen);
/// match lookup.oneshot(7).await {
///     Err(BreakerError::Open(open)) => assert_eq!(open.breaker(), "users-db"),
///     other => panic!("expected a refusal, got {other:?}"),
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct TypedCircuitBreaker<S, C = ErrorsOnly> {
    inner: S,
    breaker: Breaker,
    classifier: C,
    election: ElectionWait,
}

/// The accessors and the `Debug` every flavour shares: one definition for
/// the three types (extra fields to show in `Debug` after the name).
macro_rules! accessors {
    ($service:ident $(, $field:ident)*) => {
        impl<S, C> $service<S, C> {
            /// The breaker, for snapshots, listeners and manual modes.
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

        impl<S: fmt::Debug, C: fmt::Debug> fmt::Debug for $service<S, C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($service))
                    .field("inner", &self.inner)
                    .field("breaker", &self.breaker.name())
                    .field("classifier", &self.classifier)
                    $(.field(stringify!($field), &self.$field))*
                    .finish_non_exhaustive()
            }
        }
    };
}

accessors!(CircuitBreaker, count_attempts);
accessors!(HttpCircuitBreaker);
accessors!(PlainCircuitBreaker);
accessors!(TypedCircuitBreaker);

// === impl CircuitBreaker ===

impl<S> CircuitBreaker<S> {
    /// Wraps `inner` with `breaker` and the [`DefaultClassifier`],
    /// offering the attempt hook: the same as
    /// `BreakerLayer::new(breaker).layer(inner)`.
    pub fn new(inner: S, breaker: Breaker) -> Self {
        Self::from_parts(inner, breaker, DefaultClassifier, true)
    }

    /// A layer that wraps services in a [`CircuitBreaker`] with `breaker`;
    /// the same as [`BreakerLayer::new`].
    pub fn layer(breaker: Breaker) -> BreakerLayer {
        BreakerLayer::new(breaker)
    }
}

impl<S, C> CircuitBreaker<S, C> {
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
            spare: None,
            election: ElectionWait::default(),
        }
    }
}

impl<S: Clone, C: Clone> Clone for CircuitBreaker<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            breaker: self.breaker.clone(),
            classifier: self.classifier.clone(),
            count_attempts: self.count_attempts,
            // Shared, not reset: the hook holds no per-handle state.
            hook: Arc::clone(&self.hook),
            spare: None,
            election: ElectionWait::default(),
        }
    }
}

impl<S, C, B, RB> Service<Request<B>> for CircuitBreaker<S, C>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: 'static,
    C: Classify<Response<RB>> + Clone,
{
    type Response = Response<ResponseBody<RB, C>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        ready!(self.breaker.poll_election(&mut self.election, cx));
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (stripes, breaker, classifier) = (&self.hook, &self.breaker, &self.classifier);
        // Looked up only when no attempts were kept from the last call.
        let hook = self.count_attempts.then_some(move || {
            hook::stripe(
                stripes.get_or_init(|| hook::stripes::<C, S::Response>(breaker, classifier)),
            )
        });
        call_client(
            &self.breaker,
            &self.classifier,
            hook,
            &mut self.spare,
            &mut self.inner,
            request,
        )
    }
}

// === impl HttpCircuitBreaker ===

impl<S> HttpCircuitBreaker<S> {
    /// Wraps `inner` with `breaker` and the [`DefaultClassifier`]: the
    /// same as `HttpBreakerLayer::new(breaker).layer(inner)`.
    pub fn new(inner: S, breaker: Breaker) -> Self {
        Self::from_parts(inner, breaker, DefaultClassifier)
    }

    /// A layer that wraps services in an [`HttpCircuitBreaker`] with
    /// `breaker`; the same as [`HttpBreakerLayer::new`].
    pub fn layer(breaker: Breaker) -> HttpBreakerLayer {
        HttpBreakerLayer::new(breaker)
    }
}

impl<S, C> HttpCircuitBreaker<S, C> {
    pub(crate) fn from_parts(inner: S, breaker: Breaker, classifier: C) -> Self {
        Self {
            inner,
            breaker,
            classifier,
            election: ElectionWait::default(),
        }
    }
}

impl<S, C, B, ResB> Service<Request<B>> for HttpCircuitBreaker<S, C>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: std::error::Error + 'static,
    ResB: Default,
    C: Classify<Response<ResB>> + Clone,
{
    type Response = Response<ResponseBody<ResB, C>>;
    type Error = S::Error;
    type Future = AnswerFuture<S::Future, C, ResB>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        ready!(self.breaker.poll_election(&mut self.election, cx));
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        call_http(&self.breaker, &self.classifier, &mut self.inner, request)
    }
}

// === impl PlainCircuitBreaker ===

impl<S> PlainCircuitBreaker<S> {
    /// Wraps `inner` with `breaker` and the [`ErrorsOnly`] classifier: the
    /// same as `PlainBreakerLayer::new(breaker).layer(inner)`.
    pub fn new(inner: S, breaker: Breaker) -> Self {
        Self::from_parts(inner, breaker, ErrorsOnly)
    }

    /// A layer that wraps services in a [`PlainCircuitBreaker`] with
    /// `breaker`; the same as [`PlainBreakerLayer::new`].
    pub fn layer(breaker: Breaker) -> PlainBreakerLayer {
        PlainBreakerLayer::new(breaker)
    }
}

impl<S, C> PlainCircuitBreaker<S, C> {
    pub(crate) fn from_parts(inner: S, breaker: Breaker, classifier: C) -> Self {
        Self {
            inner,
            breaker,
            classifier,
            election: ElectionWait::default(),
        }
    }
}

impl<S, C, Req> Service<Req> for PlainCircuitBreaker<S, C>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = PlainResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        ready!(self.breaker.poll_election(&mut self.election, cx));
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        call_plain(&self.breaker, &self.classifier, &mut self.inner, request)
    }
}

// === impl TypedCircuitBreaker ===

impl<S> TypedCircuitBreaker<S> {
    /// Wraps `inner` with `breaker` and the [`ErrorsOnly`] classifier: the
    /// same as `TypedBreakerLayer::new(breaker).layer(inner)`.
    pub fn new(inner: S, breaker: Breaker) -> Self {
        Self::from_parts(inner, breaker, ErrorsOnly)
    }

    /// A layer that wraps services in a [`TypedCircuitBreaker`] with
    /// `breaker`; the same as [`TypedBreakerLayer::new`].
    pub fn layer(breaker: Breaker) -> TypedBreakerLayer {
        TypedBreakerLayer::new(breaker)
    }
}

impl<S, C> TypedCircuitBreaker<S, C> {
    pub(crate) fn from_parts(inner: S, breaker: Breaker, classifier: C) -> Self {
        Self {
            inner,
            breaker,
            classifier,
            election: ElectionWait::default(),
        }
    }
}

impl<S, C, Req> Service<Req> for TypedCircuitBreaker<S, C>
where
    S: Service<Req>,
    S::Error: std::error::Error + 'static,
    C: Classify<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = BreakerError<S::Error>;
    type Future = TypedResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        ready!(self.breaker.poll_election(&mut self.election, cx));
        self.inner.poll_ready(cx).map_err(BreakerError::Inner)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        match admit(&self.breaker, &self.classifier) {
            Ok(tracker) => TypedResponseFuture::called(self.inner.call(request), tracker),
            Err(open) => TypedResponseFuture::rejected(open),
        }
    }
}

// === the calls, shared by the flavours and the keyed services ===

/// The call of the server flavour: answers at once while open, else calls
/// and counts the outcome.
#[inline]
pub(crate) fn call_http<S, C, B, ResB>(
    breaker: &Breaker,
    classifier: &C,
    inner: &mut S,
    request: Request<B>,
) -> AnswerFuture<S::Future, C, ResB>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    ResB: Default,
    C: Clone,
{
    match admit(breaker, classifier) {
        Ok(tracker) => AnswerFuture::called(inner.call(request), tracker),
        Err(open) => {
            let grpc = is_grpc(request.headers());
            AnswerFuture::answered(Answer::circuit_open(&open).into_response(grpc))
        }
    }
}

/// The call of the plain flavour: fails at once while open, else calls
/// and counts the outcome.
#[inline]
pub(crate) fn call_plain<S, C, Req>(
    breaker: &Breaker,
    classifier: &C,
    inner: &mut S,
    request: Req,
) -> PlainResponseFuture<S::Future, C>
where
    S: Service<Req>,
    C: Clone,
{
    match admit(breaker, classifier) {
        Ok(tracker) => PlainResponseFuture::called(inner.call(request), tracker),
        Err(open) => PlainResponseFuture::rejected(open),
    }
}

/// The admission of the flavours without the hook (server and plain): what
/// counts the call if it may go, or why it may not.
#[inline]
fn admit<C: Clone>(breaker: &Breaker, classifier: &C) -> Result<Tracker<C>, CircuitOpen> {
    match breaker.admit() {
        Ok(raw) => tracker(breaker, classifier, raw),
        Err(rejection) => Err(breaker.open_error(rejection)),
    }
}

/// The call of the client flavour, shared with the keyed service: admits the call,
/// offers the hook to a retry layer below, and counts the call itself when
/// no layer took the hook. `spare` holds the attempts a previous call left
/// untaken, reused instead of a new clone of `hook`, and receives this
/// call's if nobody takes them.
///
/// When admitting the call reads the clock (a breaker with a store or
/// slow-call detection) and no layer above has read it for this call, the
/// reading is made here and handed to the layers below in the call's
/// context: the call deadline under the breaker in a `client_stack` then
/// takes it rather than reading the clock again.
#[inline(always)]
pub(crate) fn call_client<'h, S, C, B>(
    breaker: &Breaker,
    classifier: &C,
    hook: Option<impl FnOnce() -> &'h Arc<dyn AttemptHook>>,
    spare: &mut Option<Attempts>,
    inner: &mut S,
    request: Request<B>,
) -> ResponseFuture<S::Future, C>
where
    S: Service<Request<B>>,
    C: Clone,
{
    // Dropped when this function returns, once the layers below have
    // been called.
    let _clock = (breaker.reads_clock() && CallContext::current(|cx| cx.now().is_none()))
        .then(|| CallContext::enter(|cx| cx.set_now(tokio::time::Instant::now())));
    let raw = match breaker.admit() {
        Ok(raw) => raw,
        Err(rejection) => return ResponseFuture::rejected(breaker.open_error(rejection)),
    };
    match hook {
        Some(hook) if raw.kind != Kind::Untracked => {
            let first = match token(breaker, raw) {
                Ok(first) => first,
                Err(open) => return ResponseFuture::rejected(open),
            };
            let attempts = match spare.take() {
                Some(mut attempts) => {
                    attempts.restart(first);
                    attempts
                }
                None => Attempts::new(Arc::clone(hook()), first),
            };
            let mut left = None;
            // The response future is built around the inner one in place.
            let mut future = CallContext::offer_attempts_into(attempts, &mut left, || {
                ResponseFuture::called(inner.call(request), Tracker::Done)
            });
            // Taken: a retry layer below reports every attempt, this layer
            // counts nothing. Left: this layer counts the call once.
            let untaken = left.and_then(|mut attempts| {
                let token = attempts.take_in_flight();
                *spare = Some(attempts);
                token
            });
            future.tracker = match untaken {
                None => Tracker::Hooked {
                    breaker: breaker.id(),
                    classifier: classifier.clone(),
                },
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
            future
        }
        _ => match tracker(breaker, classifier, raw) {
            Ok(tracker) => ResponseFuture::called(inner.call(request), tracker),
            Err(open) => ResponseFuture::rejected(open),
        },
    }
}

/// What counts an admitted call: nothing when the breaker does not track
/// it (a manual mode), else a permit and the classifier.
#[inline]
fn tracker<C: Clone>(
    breaker: &Breaker,
    classifier: &C,
    raw: Raw,
) -> Result<Tracker<C>, CircuitOpen> {
    if raw.kind == Kind::Untracked {
        Ok(Tracker::Done)
    } else {
        match breaker.permit(raw) {
            Ok(permit) => Ok(Tracker::Permit {
                permit,
                classifier: classifier.clone(),
            }),
            Err(rejection) => Err(breaker.open_error(rejection)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::{ready, Ready};
    use std::time::Duration;

    use http::{Request, Response};
    use tower::{service_fn, ServiceExt};

    use super::*;
    use crate::{BreakerConfig, State};

    type Answering =
        tower::util::ServiceFn<fn(Request<()>) -> Ready<Result<Response<()>, BoxError>>>;

    /// Answers 503 to `/fail`, 200 to anything else.
    fn answering() -> Answering {
        service_fn(|request: Request<()>| {
            let status = if request.uri().path() == "/fail" {
                503
            } else {
                200
            };
            let mut response = Response::new(());
            *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or_default();
            ready(Ok(response))
        })
    }

    fn request(path: &str) -> Request<()> {
        Request::get(path).body(()).unwrap_or_default()
    }

    /// The reference count of this thread's stripe of the service's hook.
    fn hook_refs<S, C>(svc: &CircuitBreaker<S, C>) -> usize {
        svc.hook
            .get()
            .map_or(0, |stripes| Arc::strong_count(hook::stripe(stripes)))
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn one_service_keeps_its_untaken_hook_and_still_counts_every_call_once() {
        let breaker = Breaker::with_config(
            "dependency",
            BreakerConfig::new()
                .count_window(4)
                .minimum_calls(4)
                .failure_rate(0.5)
                .jitter(0.0)
                .open_period(Duration::from_secs(5)),
        );
        let mut svc = CircuitBreaker::new(answering(), breaker.clone());

        for (i, path) in ["/ok", "/fail", "/ok", "/fail"].into_iter().enumerate() {
            let response = svc.ready().await.unwrap().call(request(path)).await;
            assert!(response.is_ok());
            // The stripes hold one reference, the kept attempts the other:
            // no clone per call, none leaked.
            assert_eq!(hook_refs(&svc), 2, "after call {}", i + 1);
            assert!(svc.spare.is_some());
        }
        let s = breaker.snapshot();
        assert_eq!(
            (s.window.calls, s.window.failures),
            (4, 2),
            "each call once"
        );
        assert_eq!(s.state, State::Open);

        let refused = svc.ready().await.unwrap().call(request("/ok")).await;
        assert!(refused.is_err_and(|e| e.is::<CircuitOpen>()));
        assert_eq!(hook_refs(&svc), 2);

        // The probe's admission rides on the kept attempts; dropping its
        // call unsent gives the probe slot back.
        tokio::time::advance(Duration::from_secs(5)).await;
        let probe = svc.ready().await.unwrap().call(request("/ok"));
        assert_eq!(breaker.snapshot().probes_in_flight, 1);
        drop(probe);
        assert_eq!(breaker.snapshot().probes_in_flight, 0, "no probe leaked");
        let probe = svc.ready().await.unwrap().call(request("/ok")).await;
        assert!(probe.is_ok(), "the slot was free for the next probe");
        // The probe's outcome is settled when its body goes.
        drop(probe);
        assert_eq!(breaker.snapshot().state, State::Closed);
        assert_eq!(hook_refs(&svc), 2);

        // A clone starts without kept attempts and makes its own.
        let mut clone = svc.clone();
        assert!(clone.spare.is_none());
        let _ = clone.ready().await.unwrap().call(request("/ok")).await;
        assert_eq!(hook_refs(&svc), 3);
        drop(clone);
        assert_eq!(hook_refs(&svc), 2);
    }
}
