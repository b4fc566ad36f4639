//! The recommended stacks in one line.
//!
//! A client stack, outermost first:
//!
//! ```text
//! PropagateCriticality          the caller's criticality (request extension,
//!                               or the scope a server stack set) goes out in
//!                               `x-criticality`, as the deadline does
//! CircuitBreaker                fails fast while open; counts every attempt
//! ClientDeadline (whole call)   one budget for the logical call; enforces it,
//!                               writes nothing (the per-attempt layer does)
//! Retry                         jittered backoff, 10% budget, asks the breaker
//! Throttle (opt-in)             client-side adaptive throttling (the SRE
//!                               book's rule), per attempt; off by default
//! Bulkhead                      caps attempts in flight; rejects when full
//! ClientDeadline (per attempt)  writes the budget left on the wire
//! ```
//!
//! ```
//! use std::time::Duration;
//! use http_body_util::BodyExt;
//! use tower::{service_fn, BoxError, Layer, ServiceExt};
//! use tower_shield::stack::client_stack;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // The transport: hyper, reqwest (through an adapter), a tonic Channel...
//! let transport = service_fn(|req: http::Request<_>| async move {
//!     let budget = req.headers()["x-request-timeout-ms"].to_str()?.to_owned();
//!     let _body: tower_retry_budget::body::ReplayBody<String> = req.into_body();
//!     Ok::<_, BoxError>(http::Response::new(budget))
//! });
//!
//! let stack = client_stack("inventory")
//!     .timeout(Duration::from_secs(2))
//!     .concurrency(32);
//! let breaker = stack.breaker_handle().clone();
//! let bulkhead = stack.bulkhead_handle();
//! let client = stack.layer(transport);
//!
//! let response = client.oneshot(http::Request::new(String::new())).await?;
//! // The call lasts until its body ends: the bulkhead still counts it.
//! assert_eq!(bulkhead.in_flight(), 1);
//! let body = response.into_body().collect().await?.to_bytes();
//! assert_eq!(body, "2000");
//! assert_eq!(bulkhead.in_flight(), 0);
//! assert_eq!(breaker.snapshot().totals.successful, 1);
//! # Ok(())
//! # }
//! ```
//!
//! A server stack for `axum::Router::layer`, outermost first: the caller's
//! criticality (read from `x-criticality`, clamped, in scope for the
//! handler and its response body), the caller's deadline (504 when it
//! passes; it bounds the body too), a bulkhead (503 +
//! `Retry-After` when full), a breaker (503 + `Retry-After` while open);
//! every rejection is a response, so the error type stays the router's:
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_shield::stack::server_stack;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let handler = service_fn(|_req: http::Request<()>| async {
//!     Ok::<_, Infallible>(http::Response::new(String::from("ok")))
//! });
//! // With axum: `Router::new().route(..).layer(server_stack("shop").timeout(..))`.
//! let server = server_stack("shop")
//!     .timeout(Duration::from_secs(2))
//!     .max_timeout(Duration::from_secs(5))
//!     .concurrency(64)
//!     .layer(handler);
//! let response = server.oneshot(http::Request::new(())).await.unwrap();
//! assert_eq!(response.status(), 200);
//! # }
//! ```
//!
//! The breaker sits above the call's deadline, so a call refused while the
//! circuit is open costs no deadline work at all (the deadline's
//! arithmetic, its scope, its future); a breaker that needs the time for
//! every call (one with a fleet's store, or detecting slow calls) hands its
//! clock reading to the deadline below, so a call still reads the clock
//! once. The hook reaches the retry layer through the deadline, and the
//! deadline's own refusals (too little budget left) are local rejections
//! that the breaker does not count. A hand-built stack with the deadline
//! above the breaker (the order of earlier versions) works too: it pays
//! for the deadline on refused calls as well, and refuses a call whose
//! budget is spent with the deadline's error even while the circuit is
//! open.
//!
//! Composing the layers by hand stays possible; a [`ClientStack`] is
//! exactly this `ServiceBuilder` (with the outer deadline in
//! [`enforce_only`](tower_deadline::ClientDeadlineLayer::enforce_only)
//! mode, so that only the innermost layer writes headers, and
//! [`head_only`](tower_deadline::ClientDeadlineLayer::head_only), since the
//! per-attempt layer bounds the body; the bulkhead holds each slot until
//! the body ends):
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_breaker::{Breaker, BreakerLayer};
//! use tower_bulkhead::BulkheadLayer;
//! use tower_deadline::ClientDeadlineLayer;
//! use tower_retry_budget::RetryLayer;
//! use tower_shield::criticality::PropagateCriticalityLayer;
//!
//! let by_hand = ServiceBuilder::new()
//!     .layer(PropagateCriticalityLayer::new())
//!     .layer(BreakerLayer::new(Breaker::new("inventory")))
//!     .layer(
//!         ClientDeadlineLayer::new()
//!             .default_timeout(Duration::from_secs(2))
//!             .enforce_only()
//!             .head_only(), // the per-attempt layer bounds the body
//!     )
//!     .layer(RetryLayer::new())
//!     // `.throttle(..)` puts a `ThrottleLayer` here.
//!     .layer(BulkheadLayer::new("inventory", 32).hold_until_body_end())
//!     .layer(ClientDeadlineLayer::new());
//! # let _ = by_hand.service(()); // any transport
//! ```
//!
//! Handlers that call a dependency through a client stack turn its errors
//! into answers with [`Answer::for_error`](crate::Answer::for_error): 503
//! with `Retry-After` and the do-not-retry mark for an open circuit or a
//! full bulkhead, 504 for a passed deadline, and so on.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::criticality::{
    AcceptCriticality, AcceptCriticalityLayer, PropagateCriticality, PropagateCriticalityLayer,
};
use tower_breaker::store::BudgetRule;
use tower_bulkhead::partition::Single;
use tower_bulkhead::release::{BodyEnd, Release};
use tower_bulkhead::{Bulkhead, BulkheadLayer, CompartmentHandle, HttpBulkhead, HttpBulkheadLayer};
use tower_deadline::body::Head;
use tower_deadline::{
    ClientDeadline, ClientDeadlineLayer, ServerDeadline, ServerDeadlineLayer, TimeoutHandle,
};
use tower_layer::Layer;
use tower_resilience_base::random::RandomSource;
use tower_resilience_base::Name;
use tower_retry_budget::{Buffered, Counters, DefaultPolicy, Retry, RetryBudget, RetryLayer};

use tower_breaker::throttle::{Throttle, ThrottleHandle, ThrottleLayer};
use tower_breaker::{
    Breaker, BreakerConfig, BreakerLayer, CircuitBreaker, HttpBreakerLayer, HttpCircuitBreaker,
};

/// The bulkhead size of a [`client_stack`]: calls in flight to the
/// dependency at once. Size it with Little's law (rate times normal
/// latency, times a few for bursts).
pub const DEFAULT_CLIENT_CONCURRENCY: usize = 64;

/// The bulkhead size of a [`server_stack`]: requests served at once.
pub const DEFAULT_SERVER_CONCURRENCY: usize = 512;

/// The service a [`ClientStack`] builds around a transport `S`. `T` is the
/// stack's [`ThrottleSlot`]: with the default [`NoThrottle`] there is no
/// throttle layer between the retry layer and the bulkhead; with a
/// [`ThrottleLayer`] or an [`OptionalThrottle`] there is a
/// [`Throttle`].
pub type ClientStackService<S, P = DefaultPolicy, M = Buffered, R = BodyEnd, T = NoThrottle> =
    PropagateCriticality<
        CircuitBreaker<
            ClientDeadline<
                Retry<<T as Layer<Bulkhead<ClientDeadline<S>, Single, R>>>::Service, P, M>,
                Head,
            >,
        >,
    >;

/// The throttle of a [`ClientStack`], the type parameter `T` of the stack
/// and of its [`ClientStackService`]:
///
/// - [`NoThrottle`], the default: no throttle layer at all, so a stack
///   that does not throttle pays nothing for the possibility;
/// - a [`ThrottleLayer`], from [`ClientStack::throttle`];
/// - an [`OptionalThrottle`], from [`ClientStack::optional_throttle`]: a
///   throttle chosen at run time (a settings file's, say), whose absence
///   is a pass-through [`Throttle`] that costs a layer, so that the
///   stack's type is the same either way.
///
/// Sealed: these three are the only ones.
pub trait ThrottleSlot: Clone + fmt::Debug + sealed::Sealed {
    /// The throttle's handle, if there is a throttle.
    fn handle(&self) -> Option<&ThrottleHandle>;

    /// The same throttle, as an [`OptionalThrottle`] (for the layers
    /// that hold a stack of one type whatever its throttle: a service
    /// config's routes, the reqwest middleware).
    fn into_optional(self) -> OptionalThrottle;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::NoThrottle {}
    impl Sealed for super::ThrottleLayer {}
    impl Sealed for super::OptionalThrottle {}
}

/// No throttle: the default [`ThrottleSlot`] of a [`ClientStack`]. As a
/// layer it returns the service it is given.
///
/// # Example
///
/// ```
/// use tower_layer::Layer;
/// use tower_shield::stack::NoThrottle;
///
/// assert_eq!(NoThrottle.layer(7), 7);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoThrottle;

impl<S> Layer<S> for NoThrottle {
    type Service = S;

    #[inline]
    fn layer(&self, inner: S) -> S {
        inner
    }
}

impl ThrottleSlot for NoThrottle {
    fn handle(&self) -> Option<&ThrottleHandle> {
        None
    }

    fn into_optional(self) -> OptionalThrottle {
        OptionalThrottle(None)
    }
}

impl ThrottleSlot for ThrottleLayer {
    fn handle(&self) -> Option<&ThrottleHandle> {
        Some(ThrottleLayer::handle(self))
    }

    fn into_optional(self) -> OptionalThrottle {
        OptionalThrottle(Some(self))
    }
}

/// A throttle chosen at run time, the [`ThrottleSlot`] that
/// [`ClientStack::optional_throttle`] sets: a [`ThrottleLayer`], or none.
/// Either way its services are [`Throttle`]s (a
/// [pass-through](Throttle::pass_through) without one), so the stack has
/// one type whatever the choice.
///
/// # Example
///
/// ```
/// use tower_breaker::throttle::ThrottleLayer;
/// use tower_shield::stack::OptionalThrottle;
///
/// let off = OptionalThrottle::new(None);
/// assert!(off.layer().is_none());
/// let on = OptionalThrottle::new(Some(ThrottleLayer::new("catalog")));
/// assert!(on.layer().is_some());
/// ```
#[derive(Debug, Clone, Default)]
pub struct OptionalThrottle(Option<ThrottleLayer>);

impl OptionalThrottle {
    /// `layer`, or no throttle.
    #[must_use]
    pub fn new(layer: Option<ThrottleLayer>) -> Self {
        Self(layer)
    }

    /// The throttle layer, if there is one.
    #[must_use]
    pub fn layer(&self) -> Option<&ThrottleLayer> {
        self.0.as_ref()
    }
}

impl<S> Layer<S> for OptionalThrottle {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        match &self.0 {
            Some(layer) => layer.layer(inner),
            None => Throttle::pass_through(inner),
        }
    }
}

impl ThrottleSlot for OptionalThrottle {
    fn handle(&self) -> Option<&ThrottleHandle> {
        self.0.as_ref().map(ThrottleLayer::handle)
    }

    fn into_optional(self) -> OptionalThrottle {
        self
    }
}

/// The service a [`ServerStack`] builds around a handler or router `S`.
pub type ServerStackService<S, R = BodyEnd> =
    AcceptCriticality<ServerDeadline<HttpBulkhead<HttpCircuitBreaker<S>, Single, R>>>;

/// The recommended client stack for one dependency, as one [`Layer`]; see
/// the [module docs](self) for the order and the hand-built equivalent.
///
/// Every setting has a default: no timeout of its own (the caller's
/// deadline, if any, still applies), a [`Breaker`] with the default
/// [`BreakerConfig`], a [`RetryLayer`] with its defaults (3 attempts, 10%
/// budget), a bulkhead of [`DEFAULT_CLIENT_CONCURRENCY`].
///
/// # The call ends when the body ends
///
/// The deadline, the bulkhead's slot and the breaker's outcome all last
/// until the response body has been read to its end, has failed or has
/// been dropped, not only until the head:
///
/// - a body still being read when the deadline passes fails on its next
///   poll with [`DeadlineExceeded`](tower_deadline::error::DeadlineExceeded)
///   (reqwest's `text()` and hyper's body errors carry it as their source);
/// - the breaker counts a body that fails or is cut as a failure, a gRPC
///   status in the trailers as the trailers say, and a body dropped half
///   read as the head said (see [`tower_breaker::body`]); such a body failure is not
///   retried (the head was already handed out) and is counted once;
/// - the bulkhead counts the call in flight until then
///   ([`BodyEnd`]): a dependency whose bodies hang fills the bulkhead, as
///   it holds the connections.
///
/// A body that is complete in its first poll (a unary answer) arms no
/// timer and costs a few nanoseconds more than the head alone. To give the
/// bulkhead's slot back at the head instead, pass a bulkhead in
/// [`Head`](tower_bulkhead::release::Head) mode:
/// `.bulkhead(BulkheadLayer::new(name, limit))`; its count then
/// undercounts streaming bodies (they still occupy the dependency), and a
/// stalled body no longer shows in it.
///
/// # Clone
///
/// Clones share the breaker, the retry budget and the bulkhead's
/// compartment: one dependency, one stack, however many clones.
#[derive(Debug, Clone)]
#[must_use]
pub struct ClientStack<P = DefaultPolicy, M = Buffered, R = BodyEnd, T = NoThrottle> {
    name: Name,
    call: ClientDeadlineLayer<Head>,
    /// The call's timeout, changeable while the stack runs.
    timeout: TimeoutHandle,
    breaker: BreakerLayer,
    retry: RetryLayer<P, M>,
    throttle: T,
    bulkhead: BulkheadLayer<Single, R>,
    attempt: ClientDeadlineLayer,
    /// The source set by [`ClientStack::random`], for the layers the stack
    /// builds later.
    random: Option<Arc<dyn RandomSource>>,
    /// The breaker is the stack's own (not one passed to
    /// [`ClientStack::breaker`]), so [`ClientStack::random`] may rebuild
    /// it and [`ClientStack::coarse_clock`] switch its clock.
    own_breaker: bool,
    /// [`ClientStack::coarse_clock`]: the stack's own breaker, when
    /// [`ClientStack::breaker_config`] rebuilds it, tells time by the
    /// coarse clock too.
    coarse: bool,
}

/// The recommended server stack, as one [`Layer`] for
/// `axum::Router::layer` or `tonic::transport::Server::layer`; see the
/// [module docs](self).
///
/// Defaults: [`ServerDeadlineLayer::new`]'s (the caller's `grpc-timeout` or
/// `x-request-timeout-ms`, clamped to
/// [`DEFAULT_MAX_TIMEOUT`](tower_deadline::DEFAULT_MAX_TIMEOUT), no default
/// for requests without one), a bulkhead of
/// [`DEFAULT_SERVER_CONCURRENCY`], a [`Breaker`] with the default
/// [`BreakerConfig`] in an [`HttpBreakerLayer`] (rejections answered 503).
///
/// As in the [`ClientStack`], a request ends when its response body has
/// been sent (or dropped): the caller's deadline bounds a streaming body
/// too (an HTTP body is cut with an error, a gRPC stream ends with
/// DEADLINE_EXCEEDED trailers), the bulkhead holds the request's slot until
/// then ([`BodyEnd`]; pass an [`HttpBulkheadLayer`] in `Head` mode to
/// [`bulkhead`](Self::bulkhead) to release it at the head), and the
/// breaker counts a body that fails as a failure.
///
/// # Clone
///
/// Clones share the breaker and the bulkhead's compartment.
#[derive(Debug, Clone)]
#[must_use]
pub struct ServerStack<R = BodyEnd> {
    name: Name,
    criticality: AcceptCriticalityLayer,
    deadline: ServerDeadlineLayer,
    bulkhead: HttpBulkheadLayer<Single, R>,
    breaker: HttpBreakerLayer,
    /// The breaker is the stack's own, so [`ServerStack::random`] may
    /// rebuild it.
    own_breaker: bool,
}

/// The recommended client stack for the dependency `name` (the name of its
/// breaker and bulkhead compartment).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_shield::stack::client_stack;
///
/// let stack = client_stack("catalog")
///     .timeout(Duration::from_millis(800))
///     .max_attempts(2)
///     .concurrency(16);
/// assert_eq!(stack.breaker_handle().name(), "catalog");
/// ```
pub fn client_stack(name: impl Into<Name>) -> ClientStack {
    let name = name.into();
    let timeout = TimeoutHandle::new(None);
    ClientStack {
        // The per-attempt layer bounds the body by the same deadline (or an
        // earlier one): one timer for a slow body, not two.
        call: ClientDeadlineLayer::new()
            .enforce_only()
            .head_only()
            .name(Arc::from(&name))
            .timeout_handle(timeout.clone()),
        timeout,
        breaker: BreakerLayer::new(Breaker::new(name.clone())),
        retry: RetryLayer::new().name(Arc::from(&name)),
        throttle: NoThrottle,
        bulkhead: BulkheadLayer::new(name.clone(), DEFAULT_CLIENT_CONCURRENCY)
            .hold_until_body_end(),
        attempt: ClientDeadlineLayer::new().name(Arc::from(&name)),
        random: None,
        own_breaker: true,
        coarse: false,
        name,
    }
}

/// The recommended server stack; `name` names its breaker and bulkhead.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_shield::stack::server_stack;
///
/// let stack = server_stack("shop").timeout(Duration::from_secs(2)).concurrency(128);
/// assert_eq!(stack.breaker_handle().name(), "shop");
/// ```
pub fn server_stack(name: impl Into<Name>) -> ServerStack {
    let name = name.into();
    ServerStack {
        criticality: AcceptCriticalityLayer::new(),
        deadline: ServerDeadlineLayer::new().name(Arc::from(&name)),
        bulkhead: HttpBulkheadLayer::new(name.clone(), DEFAULT_SERVER_CONCURRENCY)
            .hold_until_body_end(),
        breaker: HttpBreakerLayer::new(Breaker::new(name.clone())),
        own_breaker: true,
        name,
    }
}

// === impl ClientStack ===

impl<P, M, R: Release, T> ClientStack<P, M, R, T> {
    /// The budget of the whole logical call, retries and backoffs included
    /// (an upper bound: a shorter deadline of the caller still wins).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        // A handle of its own: a clone of the stack made before keeps its
        // timeout.
        self.timeout = TimeoutHandle::new(Some(timeout));
        self.call = self.call.timeout_handle(self.timeout.clone());
        self
    }

    /// The handle that changes the call's [`timeout`](Self::timeout) while
    /// the services built from this stack run (a settings reload does it
    /// through `settings::ClientStackHandle` with feature `serde`).
    #[must_use]
    pub fn timeout_handle(&self) -> &TimeoutHandle {
        &self.timeout
    }

    /// The retry layer's handle on its `max_attempts`, for changes at run
    /// time.
    #[must_use]
    pub fn max_attempts_handle(&self) -> tower_retry_budget::MaxAttempts {
        self.retry.max_attempts_handle()
    }

    /// The retry layer's budget (shared by every service of this stack).
    #[must_use]
    pub fn retry_budget(&self) -> &Arc<RetryBudget> {
        self.retry.shared_budget()
    }

    /// Tell time by the coarse clock: the outer deadline
    /// ([`ClientDeadlineLayer::coarse_clock`]), whose reading every layer
    /// below takes, and the stack's own breaker
    /// ([`BreakerConfig::coarse_clock`], switched in place, and kept when
    /// [`breaker_config`](Self::breaker_config) or [`random`](Self::random)
    /// rebuild it later; a settings file's `breaker.coarse_clock` sets it
    /// again at each reload). A call then reads no real clock: neither one
    /// through a closed breaker, nor a refusal while open, nor one through
    /// a breaker that needs the time of every call (a fleet's store,
    /// slow-call detection). A breaker passed to [`breaker`](Self::breaker)
    /// keeps its own clock (set [`BreakerConfig::coarse_clock`] in its
    /// configuration to have it coarse too); it reads the real clock only
    /// when it needs the time, and hands that reading down.
    ///
    /// The coarse clock's reading lags the real clock by up to a
    /// millisecond plus the clock thread's wake-up delay, so deadlines set
    /// from [`timeout`](Self::timeout) may be up to that lag early, an open
    /// period may end up to that lag late, and slow calls and time-window
    /// buckets are measured to within it ([`BreakerConfig::coarse_clock`]
    /// says what that means for thresholds). It follows the real clock, not
    /// tokio's paused test clock. Off by default.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_shield::stack::client_stack;
    ///
    /// let stack = client_stack("catalog")
    ///     .timeout(Duration::from_millis(800))
    ///     .coarse_clock(true);
    /// assert!(stack.breaker_handle().config().get_coarse_clock());
    /// ```
    pub fn coarse_clock(mut self, on: bool) -> Self {
        self.call = self.call.coarse_clock(on);
        self.coarse = on;
        if self.own_breaker {
            // Switched in place (the clock is live), so a handle on the
            // breaker taken before, a settings handle's among them, is
            // still this stack's.
            let breaker = self.breaker.breaker();
            let _ = breaker.reconfigure(breaker.config().coarse_clock(on));
        }
        self
    }

    /// The per-attempt deadline layer, for its margin, header names or a
    /// per-attempt timeout shorter than the call's.
    pub fn attempt_deadline(mut self, layer: ClientDeadlineLayer) -> Self {
        self.attempt = layer;
        self
    }

    /// Use `breaker` (one with a shared store, say, or one already watched
    /// by a dashboard). It keeps its own random source, whatever
    /// [`random`](Self::random) says.
    pub fn breaker(mut self, breaker: Breaker) -> Self {
        self.breaker = BreakerLayer::new(breaker);
        self.own_breaker = false;
        self
    }

    /// A breaker of this stack's name with `config` (and the stack's
    /// [`random`](Self::random) source, if one was set, and the coarse
    /// clock if the stack [tells time by it](Self::coarse_clock)).
    pub fn breaker_config(mut self, config: BreakerConfig) -> Self {
        let config = match &self.random {
            Some(random) => config.random(Arc::clone(random)),
            None => config,
        };
        let config = if self.coarse {
            config.coarse_clock(true)
        } else {
            config
        };
        self.breaker = BreakerLayer::new(Breaker::with_config(self.name.clone(), config));
        self.own_breaker = true;
        self
    }

    /// The source set by [`random`](Self::random), for the retry layers a
    /// service config builds.
    #[cfg(feature = "service-config")]
    pub(crate) fn random_source(&self) -> Option<&Arc<dyn RandomSource>> {
        self.random.as_ref()
    }

    /// The random source of the stack's jitter: the retry layer's backoff
    /// delays and the open periods and ramp-up of the breaker the stack
    /// builds (by default each draws from a
    /// [`ProcessRandom`](tower_resilience_base::random::ProcessRandom) of
    /// its own). Both draw from this one source, so a
    /// [`SeededRandom`](tower_resilience_base::random::SeededRandom) makes
    /// a run's delays reproducible: tests and simulations set it in one
    /// line.
    ///
    /// It applies to the retry layer the stack holds when it is called,
    /// to the retry layers of each method that a gRPC service config
    /// builds from the stack (`service_config`, feature `service-config`),
    /// and to the stack's own breaker, now or when
    /// [`breaker_config`](Self::breaker_config) builds it later. The
    /// stack's breaker is rebuilt, with its configuration, so take
    /// [`breaker_handle`](Self::breaker_handle) after this call. What you
    /// pass in keeps its own source: a breaker given to
    /// [`breaker`](Self::breaker), a retry layer given to
    /// [`retry`](Self::retry) after this call, and a
    /// [`throttle`](Self::throttle) (set its
    /// [`random`](ThrottleLayer::random) yourself).
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_resilience_base::random::SeededRandom;
    /// use tower_shield::stack::client_stack;
    ///
    /// let stack = client_stack("catalog")
    ///     .timeout(Duration::from_millis(800))
    ///     .random(SeededRandom::new(42));
    /// # let _ = stack;
    /// ```
    pub fn random(mut self, random: impl RandomSource) -> Self {
        let random: Arc<dyn RandomSource> = Arc::new(random);
        self.retry = self.retry.random(Arc::clone(&random));
        if self.own_breaker {
            let config = self.breaker.breaker().config().random(Arc::clone(&random));
            self.breaker = BreakerLayer::new(Breaker::with_config(self.name.clone(), config));
        }
        self.random = Some(random);
        self
    }

    /// The most attempts per call, the first included (default 3).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.retry = self.retry.max_attempts(attempts);
        self
    }

    /// Replace the retry layer (its policy, budget, backoff, body mode).
    pub fn retry<Q, N>(self, retry: RetryLayer<Q, N>) -> ClientStack<Q, N, R, T> {
        self.rebuild(|_| retry, |bulkhead| bulkhead, |throttle| throttle)
    }

    /// Throttle the stack's attempts with `layer`: client-side adaptive
    /// throttling, the SRE book's rule (see [`tower_breaker::throttle`]).
    /// Off by default. It sits below the retry layer and above the
    /// bulkhead, so it counts every attempt as the dependency sees it; an
    /// attempt it rejects fails at once with
    /// [`Throttled`](tower_resilience_base::error::Throttled), a local
    /// rejection: the breaker does not count it, the retry layer does not
    /// retry it, and it takes no bulkhead slot. Requests are ranked by the
    /// caller's [`Criticality`](tower_resilience_base::criticality::Criticality)
    /// (the request's extension, else the one in scope).
    ///
    /// Where the breaker sheds everything or nothing, the throttle sheds in
    /// proportion: with the defaults (K = 2 over two minutes) it starts
    /// rejecting when fewer than half of the attempts are accepted, and
    /// rejects more the fewer are.
    ///
    /// The stack's type says whether it throttles (its [`ThrottleSlot`]),
    /// so a stack without one has no throttle layer to pass through. To
    /// choose at run time with one type either way, use
    /// [`optional_throttle`](Self::optional_throttle).
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_breaker::throttle::ThrottleLayer;
    /// use tower_shield::stack::client_stack;
    ///
    /// let stack = client_stack("catalog")
    ///     .throttle(ThrottleLayer::new("catalog").window(Duration::from_secs(60)));
    /// assert_eq!(stack.throttle_handle().unwrap().snapshot().requests, 0);
    /// ```
    pub fn throttle(self, layer: ThrottleLayer) -> ClientStack<P, M, R, ThrottleLayer> {
        self.with_throttle(layer)
    }

    /// Throttle the stack's attempts with `layer` if there is one, as
    /// [`throttle`](Self::throttle) does; with `None`, calls pass through
    /// a [`Throttle`] that counts nothing. The stack has the same type
    /// either way (its [`ThrottleSlot`] is an [`OptionalThrottle`]), for a
    /// throttle that a settings file turns on or off; a pass-through costs
    /// one more layer on every call, which a stack built without a
    /// throttle does not pay.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker::throttle::ThrottleLayer;
    /// use tower_shield::stack::client_stack;
    ///
    /// let wanted = std::env::var_os("THROTTLE_CATALOG").is_some();
    /// let stack = client_stack("catalog")
    ///     .optional_throttle(wanted.then(|| ThrottleLayer::new("catalog")));
    /// assert_eq!(stack.throttle_handle().is_some(), wanted);
    /// ```
    pub fn optional_throttle(
        self,
        layer: Option<ThrottleLayer>,
    ) -> ClientStack<P, M, R, OptionalThrottle> {
        self.with_throttle(OptionalThrottle(layer))
    }

    fn with_throttle<U>(self, throttle: U) -> ClientStack<P, M, R, U> {
        self.map_throttle(|_| throttle)
    }

    fn map_throttle<U>(self, f: impl FnOnce(T) -> U) -> ClientStack<P, M, R, U> {
        self.rebuild(|retry| retry, |bulkhead| bulkhead, f)
    }

    /// The stack with its retry layer, bulkhead and throttle mapped (the
    /// setters that change the stack's type).
    fn rebuild<Q, N, S, U>(
        self,
        retry: impl FnOnce(RetryLayer<P, M>) -> RetryLayer<Q, N>,
        bulkhead: impl FnOnce(BulkheadLayer<Single, R>) -> BulkheadLayer<Single, S>,
        throttle: impl FnOnce(T) -> U,
    ) -> ClientStack<Q, N, S, U> {
        ClientStack {
            name: self.name,
            call: self.call,
            timeout: self.timeout,
            breaker: self.breaker,
            retry: retry(self.retry),
            throttle: throttle(self.throttle),
            bulkhead: bulkhead(self.bulkhead),
            attempt: self.attempt,
            random: self.random,
            own_breaker: self.own_breaker,
            coarse: self.coarse,
        }
    }

    /// The stack's throttle, if it has one ([`throttle`](Self::throttle)).
    #[must_use]
    pub fn throttle_handle(&self) -> Option<&ThrottleHandle>
    where
        T: ThrottleSlot,
    {
        self.throttle.handle()
    }

    /// This stack with its throttle, if any, as an [`OptionalThrottle`]:
    /// the stack type of the layers that hold a stack of one type whatever
    /// its throttle.
    #[cfg(any(feature = "service-config", feature = "reqwest-middleware"))]
    pub(crate) fn into_optional_throttle(self) -> ClientStack<P, M, R, OptionalThrottle>
    where
        T: ThrottleSlot,
    {
        self.map_throttle(ThrottleSlot::into_optional)
    }

    /// The bulkhead size: attempts in flight to the dependency at once
    /// (default [`DEFAULT_CLIENT_CONCURRENCY`]).
    pub fn concurrency(mut self, limit: usize) -> Self {
        self.bulkhead = BulkheadLayer::new(self.name.clone(), limit).with_release::<R>();
        self
    }

    /// Replace the bulkhead (a bounded wait, metrics labels, one you
    /// already hold a [`handle`](BulkheadLayer::handle) of, or its release
    /// mode). Pass it in [`BodyEnd`] mode
    /// ([`hold_until_body_end`](BulkheadLayer::hold_until_body_end)) to
    /// keep the stack's default, where a call holds its slot until its
    /// response body ends; a layer in `Head` mode gives the slot back at
    /// the response head (see [`ClientStack`]).
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_shield::stack::client_stack;
    /// use tower_bulkhead::BulkheadLayer;
    ///
    /// let stack = client_stack("catalog").bulkhead(
    ///     BulkheadLayer::new("catalog", 16)
    ///         .max_wait(Duration::from_millis(5))
    ///         .hold_until_body_end(),
    /// );
    /// # let _ = stack;
    /// ```
    pub fn bulkhead<N>(self, layer: BulkheadLayer<Single, N>) -> ClientStack<P, M, N, T> {
        self.rebuild(|retry| retry, |_| layer, |throttle| throttle)
    }

    /// The stack's bulkhead compartment: attempts in flight, rejections.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_shield::stack::client_stack;
    ///
    /// let stack = client_stack("catalog").concurrency(8);
    /// assert_eq!(stack.bulkhead_handle().in_flight(), 0);
    /// ```
    #[must_use]
    pub fn bulkhead_handle(&self) -> CompartmentHandle {
        self.bulkhead.handle()
    }

    /// The stack's breaker, for snapshots, listeners and manual modes.
    #[must_use]
    pub fn breaker_handle(&self) -> &Breaker {
        self.breaker.breaker()
    }

    /// The counters of the stack's retry budget.
    #[must_use]
    pub fn retry_counters(&self) -> Counters {
        self.retry.counters()
    }

    /// A reqwest-style client over this whole stack with `client` at the
    /// bottom: `client.get(url).send().await` goes through the deadline,
    /// the breaker, the retries and the bulkhead, and returns a
    /// `reqwest::Response`; the request builder is reqwest's own. See
    /// [`crate::reqwest`]. The response's body is the stack's: reading it
    /// (`text()`, `bytes()`, `chunk()`) is bounded by the call's deadline
    /// (a body still being read when it passes fails with a `reqwest::Error`
    /// whose source is [`DeadlineExceeded`](tower_deadline::error::DeadlineExceeded);
    /// [`find_error`](crate::reqwest::find_error) finds it), the breaker
    /// counts the call when the body ends, and the bulkhead holds its slot
    /// until then.
    ///
    /// Takes `&self`, so the stack stays at hand for
    /// [`breaker_handle`](Self::breaker_handle) and
    /// [`retry_counters`](Self::retry_counters); every client built from
    /// it (and its clones) shares the same breaker, budget and bulkhead.
    ///
    /// reqwest 0.13 retries some failures by itself, below the stack and
    /// unseen by it: with its default policy, an HTTP/2 stream the server
    /// refused (`REFUSED_STREAM`) or left out of a graceful `GOAWAY`, up to
    /// twice and with no budget (and HTTP/3 connection timeouts, with its
    /// `http3` feature); hyper-util's pool also resends a request it never
    /// wrote. The breaker counts such a call as one attempt, and the retry
    /// budget pays for none of the resends. Build `client` with
    /// [`ReqwestService::client_builder`](crate::reqwest::ReqwestService::client_builder)
    /// (`reqwest::Client::builder().retry(reqwest::retry::never())`) so that
    /// the stack makes every retry, and turn on the `reqwest-http2` feature
    /// for the stack to retry HTTP/2 refusals; see
    /// [reqwest's own retries](crate::reqwest#reqwests-own-retries).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_shield::reqwest::ReqwestService;
    /// use tower_shield::stack::client_stack;
    ///
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// let client = client_stack("catalog")
    ///     .timeout(Duration::from_secs(2))
    ///     .reqwest(ReqwestService::client_builder().build()?);
    /// let text = client.get("http://127.0.0.1:3000/items").send().await?.text().await?;
    /// # let _ = text;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "reqwest")]
    #[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
    pub fn reqwest(
        &self,
        client: ::reqwest::Client,
    ) -> crate::reqwest::Client<ClientStackService<crate::reqwest::ReqwestService, P, M, R, T>>
    where
        P: Clone,
        T: Layer<Bulkhead<ClientDeadline<crate::reqwest::ReqwestService>, Single, R>>,
    {
        let transport = crate::reqwest::ReqwestService::new(client.clone());
        crate::reqwest::Client::from_parts(client, self.layer(transport))
    }
}

impl<S, P: Clone, M, R, T> Layer<S> for ClientStack<P, M, R, T>
where
    T: Layer<Bulkhead<ClientDeadline<S>, Single, R>>,
{
    type Service = ClientStackService<S, P, M, R, T>;

    fn layer(&self, inner: S) -> Self::Service {
        share_budget(self.breaker.breaker(), self.retry.shared_budget());
        let attempt = self.attempt.layer(inner);
        let bulkhead = self.bulkhead.layer(attempt);
        let throttle = self.throttle.layer(bulkhead);
        let retry = self.retry.layer(throttle);
        let call = self.call.layer(retry);
        PropagateCriticalityLayer::new().layer(self.breaker.layer(call))
    }
}

/// Shares the retry budget with the fleet when the breaker has a store
/// that shares its evidence: the budget's requests earn credit in the
/// store through the breaker's reports, and its retries are claimed from
/// the fleet's (10% of the fleet's requests, or the budget's
/// [fleet floor](RetryBudget::fleet_floor)). Alone, a process keeps its own
/// budget. Once per budget and breaker (both keep the first share).
fn share_budget(breaker: &Breaker, budget: &Arc<RetryBudget>) {
    if budget.shared().is_some() {
        return;
    }
    let Some(ratio) = budget.ratio_value() else {
        return; // unlimited: nothing to share
    };
    let rule = BudgetRule::new(budget.window_value(), budget.fleet_floor_value());
    let counted = Arc::downgrade(budget);
    let requests = move || counted.upgrade().map_or(0, |b| b.counters().requests);
    if let Some(fleet) = breaker.share_retries(ratio, rule, requests) {
        budget.share(Arc::new(fleet));
    }
}

// === impl ServerStack ===

impl<R: Release> ServerStack<R> {
    /// The budget of a request that arrives without one.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.deadline = self.deadline.default_timeout(timeout);
        self
    }

    /// The most budget a caller may ask for; larger ones are clamped.
    pub fn max_timeout(mut self, max: Duration) -> Self {
        self.deadline = self.deadline.max_timeout(max);
        self
    }

    /// Replace the deadline layer (header names, malformed-header policy,
    /// minimum budget).
    pub fn deadline(mut self, layer: ServerDeadlineLayer) -> Self {
        self.deadline = layer;
        self
    }

    /// The bulkhead size: requests served at once (default
    /// [`DEFAULT_SERVER_CONCURRENCY`]).
    pub fn concurrency(mut self, limit: usize) -> Self {
        self.bulkhead = HttpBulkheadLayer::new(self.name.clone(), limit).with_release::<R>();
        self
    }

    /// Replace the bulkhead (its `Retry-After`, a bounded wait, or one
    /// whose [`handle`](HttpBulkheadLayer::handle) you keep). In
    /// [`BodyEnd`] mode
    /// ([`hold_until_body_end`](HttpBulkheadLayer::hold_until_body_end))
    /// a request holds its slot until its response body has been sent, the
    /// stack's default; in `Head` mode it gives it back at the head.
    pub fn bulkhead<N>(self, layer: HttpBulkheadLayer<Single, N>) -> ServerStack<N> {
        ServerStack {
            name: self.name,
            criticality: self.criticality,
            deadline: self.deadline,
            bulkhead: layer,
            breaker: self.breaker,
            own_breaker: self.own_breaker,
        }
    }

    /// Use `breaker`. It keeps its own random source, whatever
    /// [`random`](Self::random) says.
    pub fn breaker(mut self, breaker: Breaker) -> Self {
        self.breaker = HttpBreakerLayer::new(breaker);
        self.own_breaker = false;
        self
    }

    /// The random source of the jitter of the stack's breaker (its open
    /// periods and ramp-up; by default a
    /// [`ProcessRandom`](tower_resilience_base::random::ProcessRandom)): a
    /// [`SeededRandom`](tower_resilience_base::random::SeededRandom) makes
    /// a run reproducible. The breaker is rebuilt with its configuration,
    /// so take [`breaker_handle`](Self::breaker_handle) after this call; a
    /// breaker given to [`breaker`](Self::breaker) keeps its own source.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_resilience_base::random::SeededRandom;
    /// use tower_shield::stack::server_stack;
    ///
    /// let stack = server_stack("shop").random(SeededRandom::new(42));
    /// # let _ = stack;
    /// ```
    pub fn random(mut self, random: impl RandomSource) -> Self {
        if self.own_breaker {
            let config = self.breaker.breaker().config().random(random);
            self.breaker = HttpBreakerLayer::new(Breaker::with_config(self.name.clone(), config));
        }
        self
    }

    /// How requests' criticality is read (default
    /// [`AcceptCriticalityLayer::new`]: callers may claim at most
    /// `Critical`, which is also the criticality of a request that says
    /// nothing). The stack's bulkhead sheds the lowest criticality first,
    /// and the handler's calls through a [`ClientStack`] carry it on.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_resilience_base::criticality::Criticality;
    /// use tower_shield::criticality::AcceptCriticalityLayer;
    /// use tower_shield::stack::server_stack;
    ///
    /// // An internal service: its callers may claim `critical-plus`.
    /// let stack = server_stack("ledger")
    ///     .criticality(AcceptCriticalityLayer::new().max(Criticality::CriticalPlus));
    /// # let _ = stack;
    /// ```
    pub fn criticality(mut self, layer: AcceptCriticalityLayer) -> Self {
        self.criticality = layer;
        self
    }

    /// The stack's breaker.
    #[must_use]
    pub fn breaker_handle(&self) -> &Breaker {
        self.breaker.breaker()
    }

    /// The stack's bulkhead compartment: requests in flight, rejections.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_shield::stack::server_stack;
    ///
    /// let stack = server_stack("api").concurrency(64);
    /// assert_eq!(stack.bulkhead_handle().in_flight(), 0);
    /// ```
    #[must_use]
    pub fn bulkhead_handle(&self) -> CompartmentHandle {
        self.bulkhead.handle()
    }
}

impl<S, R> Layer<S> for ServerStack<R> {
    type Service = ServerStackService<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        let breaker = self.breaker.layer(inner);
        let bulkhead = self.bulkhead.layer(breaker);
        self.criticality.layer(self.deadline.layer(bulkhead))
    }
}
