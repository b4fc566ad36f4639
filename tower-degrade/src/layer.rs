//! The fallback layer, its service, and the decisions they take.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Response;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_resilience_base::random::{ProcessRandom, RandomSource};
use tower_service::Service;

use crate::cache::{Recall, Remember};
use crate::cause::{judge_http, judge_plain, Cause, Causes, Judged};
use crate::future::{Exercised, Finish, Original, ResponseFuture, Run, Trail, Walk};
use crate::mark::{mark_http, FallbackServed};
use crate::snapshot::{FallbackSnapshot, Stats};
use crate::source::{Fallback, KeyFn, Reason, Step, Steps};
use tower_resilience_base::outcome::{Classify, DefaultClassifier, ErrorsOnly, Outcome};
use tower_resilience_base::stripe::thread_index;
use tower_resilience_base::{BoxError, Deadline};

/// The shards of the counters and the last-good cache: one per thread of
/// a small runtime, fewer contended cache lines on a larger one.
const STRIPES: usize = 8;

/// The default least interval between two `tracing` events of one kind
/// (`fallback_served`, `fallback_failed`, `fallback_shadow_differs`) from
/// one layer: 1 s.
pub const DEFAULT_EVENT_INTERVAL: Duration = Duration::from_secs(1);

/// The default bound on one asynchronous source's wait, when the call's
/// deadline is not sooner: 1 s.
pub const DEFAULT_ASYNC_TIMEOUT: Duration = Duration::from_secs(1);

/// The default number of asynchronous sources awaited at once by one
/// layer (its clones included): 32.
pub const DEFAULT_ASYNC_LIMIT: usize = 32;

/// A layer that answers selected failures of the services below with a
/// [`Fallback`], marks and counts what it serves, and can exercise the
/// fallback on healthy traffic.
///
/// Put it **outermost** in a client stack, where it sees the errors of
/// every layer below (see the [module docs](super) for the stack, the
/// semantics and when not to use one). The type parameters are the
/// request, the response and the fallback's key (`()` for fallbacks that
/// need none).
///
/// Two flavours, one type:
///
/// | constructor | responses | failures | marking | shadow comparison |
/// |---|---|---|---|---|
/// | [`FallbackLayer::new`] | `http::Response<B>` | errors; `5xx` and gRPC failures ([`DefaultClassifier`]); answers of layers that refused the request | [`FallbackServed`] extension + [`FALLBACK_HEADER`](super::FALLBACK_HEADER) | same status |
/// | [`FallbackLayer::plain`] | anything | errors ([`ErrorsOnly`]) | your [`mark_with`](Self::mark_with), if any | none: an answer agrees (set [`compare`](Self::compare)) |
///
/// Every knob and its default:
///
/// | knob | default | meaning |
/// |---|---|---|
/// | [`causes`](Self::causes) | [`Causes::ALL`] | the failures answered; the others pass through |
/// | [`classifier`](Self::classifier) | see above | which responses (and unknown errors) are failures, and which responses a last-good cache keeps |
/// | [`shadow`](Self::shadow) | 0 | share of calls that also compute the fallback when healthy, to compare |
/// | [`exercise`](Self::exercise) | 0 | share of calls answered by the fallback on purpose |
/// | [`compare`](Self::compare) | see above | does the fallback's answer agree with the dependency's? |
/// | [`header`](Self::header) | on (HTTP) | write [`FALLBACK_HEADER`](super::FALLBACK_HEADER) and [`FALLBACK_AGE_HEADER`](super::FALLBACK_AGE_HEADER) |
/// | [`mark_with`](Self::mark_with) | none | your own mark on fallback answers |
/// | [`name`](Self::name) | `"fallback"` | named in events and snapshots |
/// | [`event_interval`](Self::event_interval) | [`DEFAULT_EVENT_INTERVAL`] (1 s) | least interval between two events of one kind |
/// | [`random`](Self::random) | [`ProcessRandom`] | the sampling of the shadow and exercise shares |
/// | [`async_timeout`](Self::async_timeout) | [`DEFAULT_ASYNC_TIMEOUT`] (1 s) | longest wait for one asynchronous source, when the call's deadline is not sooner |
/// | [`async_limit`](Self::async_limit) | [`DEFAULT_ASYNC_LIMIT`] (32) | asynchronous sources awaited at once; past it they give nothing |
///
/// # Clone
///
/// Clones share the fallback (its functions and last-good cache), the
/// counters and the event rate limits. A setter called on a clone changes
/// that clone's settings only.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_breaker::error::CircuitOpen;
/// use tower_degrade::{Cause, Causes, Fallback, FallbackLayer, FallbackServed};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let open = service_fn(|_req: http::Request<()>| async {
///     Err::<http::Response<&str>, BoxError>(Box::new(CircuitOpen::new(
///         "recommendations",
///         std::time::Duration::from_secs(5),
///         false,
///     )))
/// });
/// let fallback = FallbackLayer::new(Fallback::value(http::Response::new("popular items")))
///     .name("recommendations")
///     .causes(Causes::LOCAL);
/// let client = ServiceBuilder::new().layer(fallback.clone()).service(open);
///
/// let response = client.oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(*response.body(), "popular items");
/// assert_eq!(response.extensions().get::<FallbackServed>().unwrap().cause(), Cause::CircuitOpen);
/// assert_eq!(fallback.snapshot().served.get(Cause::CircuitOpen), 1);
/// # }
/// ```
#[must_use]
pub struct FallbackLayer<Req, Res, K = ()> {
    key: KeyFn<Req, K>,
    core: Arc<Core<Res, K>>,
    /// Handles on `core`, one per thread stripe: a call's future holds the
    /// one of its thread, so the reference counts that every call touches
    /// are not shared between threads.
    shards: Shards<Res, K>,
}

/// The service of a [`FallbackLayer`]: calls the inner service, and
/// answers its selected failures with the layer's [`Fallback`].
///
/// The second type parameter is the layer that made it, which carries the
/// request, response and key types: `FallbackService<S,
/// FallbackLayer<Req, Res, K>>`.
///
/// In `call` it runs the key function on the request, draws the sample of
/// the shadow and exercise modes (only when one is on), and either answers
/// at once with the fallback (exercise) or calls the inner service. Its
/// error is the inner service's, boxed and unchanged when no fallback
/// answers it.
///
/// # Panics
///
/// A panic in the fallback's key function is not caught: it unwinds out
/// of `call`. (Panics in fallback functions and in the comparison are
/// caught.)
///
/// # Readiness
///
/// `poll_ready` is the inner service's. A call the exercise mode answers
/// does not reach the inner service after it said it was ready: a service
/// that reserves capacity in `poll_ready` (tower's `ConcurrencyLimit`)
/// keeps it until the next call or until it is dropped.
///
/// An exercise whose chain reaches an asynchronous source moves the ready
/// inner service (a clone takes its place, as tower's own `Retry` does)
/// and the request into the response future, and calls it only if the
/// fallback gives nothing: the dependency never sees an exercised request
/// the fallback answered. Hence `S: Clone`.
///
/// # Clone
///
/// Clones clone the inner service and share everything of the layer (see
/// [`FallbackLayer`]).
pub struct FallbackService<S, L> {
    inner: S,
    layer: L,
}

/// The settings and shared state of a layer, without the request type:
/// what a response future needs when the call completes.
pub(crate) struct Core<Res, K> {
    steps: Steps<Res, K>,
    cache: Option<Arc<dyn Remember<K, Res>>>,
    causes: Causes,
    classifier: Arc<dyn Classify<Res>>,
    judge: fn(&dyn Classify<Res>, &Res) -> Judged,
    http_mark: Option<fn(&mut Res, &FallbackServed, bool)>,
    mark: Option<MarkFn<Res>>,
    compare: Option<CompareFn<Res>>,
    header: bool,
    /// Draws below `exercise` are exercised; draws in
    /// `[exercise, exercise + shadow)` are shadowed (out of 2^64).
    exercise: u128,
    shadow: u128,
    random: Arc<dyn RandomSource>,
    name: Arc<str>,
    event_interval: Duration,
    async_timeout: Duration,
    async_limit: usize,
    stats: Arc<Stats>,
}

/// A handle on a [`Core`], alone on its cache lines.
#[repr(align(128))]
pub(crate) struct Shard<Res, K> {
    pub(crate) core: Arc<Core<Res, K>>,
}

/// One [`Shard`] per thread stripe.
type Shards<Res, K> = Arc<[Arc<Shard<Res, K>>]>;

/// A marking function, shared.
type MarkFn<Res> = Arc<dyn Fn(&mut Res, &FallbackServed) + Send + Sync>;

/// A comparison of the shadow mode, shared.
type CompareFn<Res> = Arc<dyn Fn(&Res, &Res) -> bool + Send + Sync>;

/// What the sampling decided for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sample {
    Normal,
    Shadow,
    Exercise,
}

// === impl FallbackLayer ===

impl<Req, B, K> FallbackLayer<Req, Response<B>, K> {
    /// The HTTP flavour: a layer for services answering
    /// `http::Response<B>`, with `fallback`.
    ///
    /// Failures: errors (by their [`Cause`]), responses the
    /// [`DefaultClassifier`] calls failures (`5xx`, gRPC UNKNOWN,
    /// DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE, DATA_LOSS in the headers),
    /// and answers a layer of this process built when it refused the
    /// request (they carry the
    /// [`LocalAnswer`](tower_resilience_base::answer::LocalAnswer)
    /// extension). Answers served are marked with the [`FallbackServed`]
    /// extension and the [`FALLBACK_HEADER`](super::FALLBACK_HEADER); in
    /// shadow mode, answers agree when their status is the same.
    pub fn new(fallback: Fallback<Req, Response<B>, K>) -> Self
    where
        B: 'static,
        K: 'static,
    {
        let same_status = |a: &Response<B>, b: &Response<B>| a.status() == b.status();
        Self::build(
            fallback,
            Arc::new(DefaultClassifier),
            judge_http::<B>,
            Some(mark_http::<B>),
            Some(Arc::new(same_status)),
        )
    }
}

impl<Req, Res: 'static, K> FallbackLayer<Req, Res, K> {
    /// The plain flavour: a layer for services of any response type, with
    /// `fallback`.
    ///
    /// Failures: errors (by their [`Cause`]); every response succeeds
    /// (classifier [`ErrorsOnly`]; set a [`classifier`](Self::classifier)
    /// that judges your responses). Answers are not marked unless you
    /// [`mark_with`](Self::mark_with); in shadow mode every answer agrees
    /// unless you set [`compare`](Self::compare).
    pub fn plain(fallback: Fallback<Req, Res, K>) -> Self
    where
        K: 'static,
    {
        Self::build(
            fallback,
            Arc::new(ErrorsOnly),
            judge_plain::<Res>,
            None,
            None,
        )
    }

    fn build(
        fallback: Fallback<Req, Res, K>,
        classifier: Arc<dyn Classify<Res>>,
        judge: fn(&dyn Classify<Res>, &Res) -> Judged,
        http_mark: Option<fn(&mut Res, &FallbackServed, bool)>,
        compare: Option<CompareFn<Res>>,
    ) -> Self {
        let key = fallback.key_fn().clone();
        let (steps, cache) = fallback.into_parts();
        let core = Arc::new(Core {
            steps,
            cache,
            causes: Causes::ALL,
            classifier,
            judge,
            http_mark,
            mark: None,
            compare,
            header: true,
            exercise: 0,
            shadow: 0,
            random: Arc::new(ProcessRandom::new()),
            name: Arc::from("fallback"),
            event_interval: DEFAULT_EVENT_INTERVAL,
            async_timeout: DEFAULT_ASYNC_TIMEOUT,
            async_limit: DEFAULT_ASYNC_LIMIT,
            stats: Arc::new(Stats::new()),
        });
        Self {
            key,
            shards: shards(&core),
            core,
        }
    }

    /// This layer with `change` made to its settings.
    fn with(mut self, change: impl FnOnce(&mut Core<Res, K>)) -> Self {
        change(Arc::make_mut(&mut self.core));
        self.shards = shards(&self.core);
        self
    }

    /// The failures the fallback answers (default [`Causes::ALL`]); the
    /// others pass through unchanged. [`Causes::LOCAL`] answers only when
    /// the dependency was not called (circuit open, bulkhead full, shed).
    pub fn causes(self, causes: Causes) -> Self {
        self.with(|core| core.causes = causes)
    }

    /// How responses and unknown errors are judged (see
    /// [`Classify`]): a response classified
    /// [`Failure`](Outcome::Failure) is a [`Cause::Failure`]; one
    /// classified [`Success`](Outcome::Success) is good (a last-good cache
    /// keeps it); [`Ignored`](Outcome::Ignored) passes untouched. An error
    /// of the toolkit has its own cause whatever the classifier says;
    /// another error is a [`Cause::Failure`] when the classifier calls it
    /// a failure.
    ///
    /// In the HTTP flavour, answers of layers that refused the request and
    /// answers already marked [`FallbackServed`] are judged before the
    /// classifier is asked.
    pub fn classifier(self, classifier: impl Classify<Res>) -> Self {
        self.with(|core| core.classifier = Arc::new(classifier))
    }

    /// Shadow mode: for this share of calls (0 to 1; default 0) that
    /// succeed, also compute the fallback's answer (with
    /// [`Cause::Exercise`]), compare it with the dependency's, count
    /// [agreed, differed or unanswered](super::ShadowCounts), and emit a
    /// rate-limited `fallback_shadow_differs` event when they differ or
    /// the fallback gave nothing. **The caller always gets the
    /// dependency's answer.**
    ///
    /// It costs one random draw per call while on, and a fallback
    /// computation per sampled success. An asynchronous source is awaited
    /// before the sampled call returns (within the layer's bounds): with
    /// one in the chain, the sampled calls take that much longer. With a last-good cache the
    /// comparison is against the previous good answer for the key, before
    /// the new one replaces it: how different a stale answer would have
    /// been.
    pub fn shadow(self, share: f64) -> Self {
        self.with(|core| core.shadow = bound(share))
    }

    /// Exercise mode: for this share of calls (0 to 1; default 0), do not
    /// call the inner service; answer with the fallback (cause
    /// [`Cause::Exercise`], marked and counted as such). If the fallback
    /// gives nothing, the call goes to the inner service as usual and
    /// [`unanswered`](super::FallbackSnapshot::unanswered) counts it (or
    /// [`cold`](super::FallbackSnapshot::cold), when only a last-good cache
    /// had nothing for the key yet). An asynchronous source is awaited
    /// first; the dependency is called only once it gave nothing.
    ///
    /// Callers really receive fallback answers: use it where they are
    /// acceptable, with a small share, as a permanent game day. Exercised
    /// and shadowed calls never overlap: with both on, the shares add up
    /// (capped at all calls, exercise first).
    pub fn exercise(self, share: f64) -> Self {
        self.with(|core| core.exercise = bound(share))
    }

    /// How the shadow mode compares the dependency's answer (first) with
    /// the fallback's (second): `true` when they agree. A comparison that
    /// panics counts as "differ".
    ///
    /// # Example
    ///
    /// ```
    /// use tower_degrade::{Fallback, FallbackLayer};
    ///
    /// type Response = http::Response<String>;
    /// let layer = FallbackLayer::new(Fallback::<http::Request<()>, _>::value(Response::new("[]".into())))
    ///     .shadow(0.01)
    ///     .compare(|primary: &Response, fallback: &Response| {
    ///         primary.status() == fallback.status() && primary.body() == fallback.body()
    ///     });
    /// # let _ = layer;
    /// ```
    pub fn compare<F>(self, compare: F) -> Self
    where
        F: Fn(&Res, &Res) -> bool + Send + Sync + 'static,
    {
        self.with(|core| core.compare = Some(Arc::new(compare)))
    }

    /// Whether the HTTP flavour writes the
    /// [`FALLBACK_HEADER`](super::FALLBACK_HEADER) (and, for cached
    /// answers, the [`FALLBACK_AGE_HEADER`](super::FALLBACK_AGE_HEADER)) on
    /// the answers it serves (default on). The [`FallbackServed`]
    /// extension is always there. No effect on the plain flavour.
    pub fn header(self, on: bool) -> Self {
        self.with(|core| core.header = on)
    }

    /// Also runs `mark` on every answer served, with its
    /// [`FallbackServed`]: how the plain flavour marks a response type of
    /// your own (a `stale: bool` field, say). Keep it short; it must not
    /// panic.
    pub fn mark_with<F>(self, mark: F) -> Self
    where
        F: Fn(&mut Res, &FallbackServed) + Send + Sync + 'static,
    {
        self.with(|core| core.mark = Some(Arc::new(mark)))
    }

    /// The name in events and snapshots (default `"fallback"`): name it
    /// after the dependency it stands in for.
    pub fn name(self, name: impl Into<Arc<str>>) -> Self {
        self.with(|core| core.name = name.into())
    }

    /// The least interval between two events of one kind
    /// (`fallback_served`, `fallback_failed`, `fallback_shadow_differs`)
    /// from this layer (default [`DEFAULT_EVENT_INTERVAL`], 1 s). The
    /// counters count every one.
    pub fn event_interval(self, interval: Duration) -> Self {
        self.with(|core| core.event_interval = interval)
    }

    /// The random source of the shadow and exercise sampling (default
    /// [`ProcessRandom`]); tests inject a
    /// [`SeededRandom`](tower_resilience_base::random::SeededRandom).
    pub fn random(self, random: impl RandomSource) -> Self {
        self.with(|core| core.random = Arc::new(random))
    }

    /// The longest wait for one asynchronous source (default
    /// [`DEFAULT_ASYNC_TIMEOUT`], 1 s). The wait also ends at the deadline
    /// of the request being served when that is sooner
    /// ([`Deadline::current`], read when the source starts: set by
    /// `tower-deadline`'s server layer or [`Deadline::scope`]). A source
    /// still waiting then gives nothing, and the next one is tried. A zero
    /// timeout skips asynchronous sources.
    pub fn async_timeout(self, timeout: Duration) -> Self {
        self.with(|core| core.async_timeout = timeout)
    }

    /// How many asynchronous sources this layer (its clones included)
    /// awaits at once (default [`DEFAULT_ASYNC_LIMIT`], 32): past it, a
    /// source gives nothing and the next one is tried, so an outage of the
    /// primary never turns into unbounded load on the secondary. Zero
    /// skips asynchronous sources.
    pub fn async_limit(self, limit: usize) -> Self {
        self.with(|core| core.async_limit = limit)
    }

    /// The counters since the layer was built (shared by its clones and
    /// every service it made).
    #[must_use]
    pub fn snapshot(&self) -> FallbackSnapshot {
        self.core.snapshot()
    }
}

impl<Req, Res, K> Clone for FallbackLayer<Req, Res, K> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            core: self.core.clone(),
            shards: self.shards.clone(),
        }
    }
}

impl<Req, Res, K> fmt::Debug for FallbackLayer<Req, Res, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt("FallbackLayer", f)
    }
}

impl<S, Req, Res, K> Layer<S> for FallbackLayer<Req, Res, K> {
    type Service = FallbackService<S, Self>;

    fn layer(&self, inner: S) -> Self::Service {
        FallbackService {
            inner,
            layer: self.clone(),
        }
    }
}

/// One handle on `core` per thread stripe.
fn shards<Res, K>(core: &Arc<Core<Res, K>>) -> Shards<Res, K> {
    (0..STRIPES)
        .map(|_| Arc::new(Shard { core: core.clone() }))
        .collect()
}

/// A share in `[0, 1]` as a bound out of 2^64 (NaN counts as zero).
fn bound(share: f64) -> u128 {
    const SPACE: f64 = 18_446_744_073_709_551_616.0; // 2^64
    if share.is_nan() || share <= 0.0 {
        0
    } else if share >= 1.0 {
        1 << 64
    } else {
        (share * SPACE) as u128
    }
}

// === impl FallbackService ===

impl<S, Req, Res: 'static, K> FallbackService<S, FallbackLayer<Req, Res, K>> {
    /// `inner` with the fallback of `layer`.
    pub fn new(inner: S, layer: FallbackLayer<Req, Res, K>) -> Self {
        Self { inner, layer }
    }

    /// The layer's counters (see [`FallbackLayer::snapshot`]).
    #[must_use]
    pub fn snapshot(&self) -> FallbackSnapshot {
        self.layer.snapshot()
    }
}

impl<S, L> FallbackService<S, L> {
    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req, Res, K> Service<Req> for FallbackService<S, FallbackLayer<Req, Res, K>>
where
    S: Service<Req, Response = Res> + Clone,
    S::Error: Into<BoxError>,
    Res: 'static,
{
    type Response = Res;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, Res, K>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let shard = &self.layer.shards[thread_index() % STRIPES];
        let core = &shard.core;
        let sample = core.sample();
        let key = (self.layer.key)(&request);
        if sample == Sample::Exercise {
            match core.exercise_walk(&key) {
                Exercised::Served(response) => return ResponseFuture::served(response),
                Exercised::Call => {}
                Exercised::Await(run) => {
                    // The ready service waits in the future with the
                    // request, called only if the fallback gives nothing.
                    let clone = self.inner.clone();
                    let ready = std::mem::replace(&mut self.inner, clone);
                    let shard = shard.clone();
                    return ResponseFuture::exercising(ready, request, shard, key, run);
                }
            }
        }
        let future = self.inner.call(request);
        let shadow = sample == Sample::Shadow;
        ResponseFuture::called(future, shard.clone(), key, shadow)
    }
}

impl<S: Clone, L: Clone> Clone for FallbackService<S, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, L: fmt::Debug> fmt::Debug for FallbackService<S, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

// === impl Core ===

impl<Res: 'static, K> Core<Res, K> {
    /// Whether this call is exercised, shadowed or neither: one random
    /// draw, only when a mode is on.
    #[inline]
    fn sample(&self) -> Sample {
        if self.exercise == 0 && self.shadow == 0 {
            return Sample::Normal;
        }
        let draw = u128::from(self.random.next_u64());
        if draw < self.exercise {
            Sample::Exercise
        } else if draw < self.exercise + self.shadow {
            Sample::Shadow
        } else {
            Sample::Normal
        }
    }

    /// What the caller gets for the inner service's `result`, for a call
    /// with `key` (`shadow` if sampled for the shadow mode): at once, or
    /// after an asynchronous source of the chain answers.
    pub(crate) fn finish(
        &self,
        key: K,
        shadow: bool,
        result: Result<Res, BoxError>,
    ) -> Finish<Res, K> {
        match result {
            Ok(response) => match (self.judge)(&*self.classifier, &response) {
                Judged::Good if shadow => {
                    let mut trail = Trail::default();
                    let reason = Reason::new(Cause::Exercise, None, None);
                    match self.walk(0, &key, &reason, &mut trail) {
                        Walk::Await(future, next, permit) => {
                            let original = Original::Primary(response);
                            let run =
                                Run::new(future, next, permit, trail, Cause::Exercise, original);
                            Finish::Run(Box::new(run), key)
                        }
                        found => {
                            let found = match found {
                                Walk::Answer(fallback, _) => Some(fallback),
                                _ => None,
                            };
                            self.shadow_found(&response, found, &trail);
                            Finish::Done(Ok(self.good(key, response)))
                        }
                    }
                }
                Judged::Good => Finish::Done(Ok(self.good(key, response))),
                Judged::Neutral => Finish::Done(Ok(response)),
                Judged::Failed(cause) if self.causes.contains(cause) => {
                    let mut trail = Trail::default();
                    let reason = Reason::new(cause, None, Some(&response));
                    match self.walk(0, &key, &reason, &mut trail) {
                        Walk::Answer(answer, age) => {
                            Finish::Done(Ok(self.serve(cause, answer, age)))
                        }
                        Walk::Nothing => {
                            self.unanswered(cause, &trail);
                            Finish::Done(Ok(response))
                        }
                        Walk::Await(future, next, permit) => {
                            let original = Original::Response(response);
                            let run = Run::new(future, next, permit, trail, cause, original);
                            Finish::Run(Box::new(run), key)
                        }
                    }
                }
                Judged::Failed(_) => Finish::Done(Ok(response)),
            },
            Err(error) => {
                let is_failure = |e: &_| self.classifier.classify_error(e) == Outcome::Failure;
                let cause = match Cause::of_error(&*error, is_failure) {
                    Some(cause) if self.causes.contains(cause) => cause,
                    _ => return Finish::Done(Err(error)),
                };
                let mut trail = Trail::default();
                let reason = Reason::new(cause, Some(&*error), None);
                match self.walk(0, &key, &reason, &mut trail) {
                    Walk::Answer(answer, age) => Finish::Done(Ok(self.serve(cause, answer, age))),
                    Walk::Nothing => {
                        self.unanswered(cause, &trail);
                        Finish::Done(Err(error))
                    }
                    Walk::Await(future, next, permit) => {
                        let run =
                            Run::new(future, next, permit, trail, cause, Original::Error(error));
                        Finish::Run(Box::new(run), key)
                    }
                }
            }
        }
    }

    /// A good response: remembered by a last-good cache, then returned.
    fn good(&self, key: K, response: Res) -> Res {
        if let Some(cache) = &self.cache {
            cache.remember(key, &response, Instant::now());
        }
        response
    }

    /// What the exercise mode does for a call in `call`: an answer to
    /// serve at once, nothing (the call goes to the inner service), or an
    /// asynchronous source to await first.
    pub(crate) fn exercise_walk(&self, key: &K) -> Exercised<Res> {
        let mut trail = Trail::default();
        let reason = Reason::new(Cause::Exercise, None, None);
        match self.walk(0, key, &reason, &mut trail) {
            Walk::Answer(answer, age) => {
                Exercised::Served(self.serve(Cause::Exercise, answer, age))
            }
            Walk::Nothing => {
                self.unanswered(Cause::Exercise, &trail);
                Exercised::Call
            }
            Walk::Await(future, next, permit) => {
                let run = Run::new(
                    future,
                    next,
                    permit,
                    trail,
                    Cause::Exercise,
                    Original::Exercise,
                );
                Exercised::Await(Box::new(run))
            }
        }
    }

    /// Marks, counts and reports an answer served for `cause`.
    pub(crate) fn serve(
        &self,
        cause: Cause,
        mut response: Res,
        stale_for: Option<Duration>,
    ) -> Res {
        let served = FallbackServed::new(cause, stale_for);
        if let Some(mark) = self.http_mark {
            mark(&mut response, &served, self.header);
        }
        if let Some(mark) = &self.mark {
            mark(&mut response, &served);
        }
        let total = self.stats.served(cause, stale_for);
        let stale_ms = stale_for.map(|d| d.as_millis() as u64);
        if cause == Cause::Exercise {
            tracing::debug!(fallback = %self.name, stale_ms, "fallback_exercised");
        } else if self.stats.served_gate.pass(self.event_interval) {
            tracing::warn!(
                fallback = %self.name,
                cause = cause.as_str(),
                stale_ms,
                served_total = total,
                "fallback_served"
            );
        }
        response
    }

    /// Counts and reports a fallback that gave nothing for `cause`. In the
    /// exercise mode, a chain that gave nothing only because its last-good
    /// cache has no fresh entry for the key yet is a cold key, not a broken
    /// fallback: counted apart, at debug level.
    pub(crate) fn unanswered(&self, cause: Cause, trail: &Trail) {
        if cause == Cause::Exercise && trail.is_cold() {
            self.stats.cold();
            tracing::debug!(fallback = %self.name, "fallback_cold_key");
            return;
        }
        let total = self.stats.unanswered(cause);
        if self.stats.failed_gate.pass(self.event_interval) {
            tracing::warn!(
                fallback = %self.name,
                cause = cause.as_str(),
                reason = trail.why.as_deref().unwrap_or("no source"),
                unanswered_total = total,
                "fallback_failed"
            );
        }
    }

    /// Walks the chain from source `from` on: the first answer, nothing,
    /// or an asynchronous source to await (bounded by `deadline` and the
    /// layer's `async_timeout`). Never panics: a panicking function counts
    /// as a failed one.
    pub(crate) fn walk(
        &self,
        from: usize,
        key: &K,
        reason: &Reason<'_, Res>,
        trail: &mut Trail,
    ) -> Walk<Res> {
        for (i, step) in self.steps.iter().enumerate().skip(from) {
            match step {
                Step::Function(f) => match catch_unwind(AssertUnwindSafe(|| f(key, reason))) {
                    Ok(Ok(response)) => return Walk::Answer(response, None),
                    Ok(Err(error)) => trail.failed(error.to_string()),
                    Err(_) => trail.failed(String::from("the fallback function panicked")),
                },
                Step::LastGood(cache) => match cache.recall(key, Instant::now()) {
                    Recall::Fresh(response, age) => return Walk::Answer(response, Some(age)),
                    Recall::TooStale(age) => trail.missed(format!(
                        "the last good answer is {} ms old, beyond the maximum staleness",
                        age.as_millis()
                    )),
                    Recall::Missing => trail.missed(String::from("no good answer for this key")),
                },
                Step::Async(f) => {
                    let now = Instant::now();
                    let mut until = now + self.async_timeout;
                    if let Some(deadline) = Deadline::current() {
                        until = until.min(deadline.instant());
                    }
                    if until <= now {
                        trail.failed(String::from(
                            "no time left for the asynchronous fallback before the call's deadline",
                        ));
                        continue;
                    }
                    let Some(permit) = self.stats.async_permit(self.async_limit) else {
                        trail.failed(format!(
                            "{} asynchronous fallbacks are already waiting (the async_limit)",
                            self.async_limit
                        ));
                        continue;
                    };
                    match catch_unwind(AssertUnwindSafe(|| f(key, reason, until))) {
                        Ok(future) => return Walk::Await(future, i + 1, permit),
                        Err(_) => trail.failed(String::from("the fallback function panicked")),
                    }
                }
            }
        }
        Walk::Nothing
    }

    /// The shadow mode's finding for a healthy call that answered
    /// `primary`: the fallback's answer, or nothing.
    pub(crate) fn shadow_found(&self, primary: &Res, fallback: Option<Res>, trail: &Trail) {
        let agreed = match fallback {
            Some(fallback) => Some(match &self.compare {
                Some(compare) => {
                    catch_unwind(AssertUnwindSafe(|| compare(primary, &fallback))).unwrap_or(false)
                }
                None => true,
            }),
            None if trail.is_cold() => {
                self.stats.cold();
                tracing::debug!(fallback = %self.name, "fallback_cold_key");
                return;
            }
            None => None,
        };
        self.stats.shadow(agreed);
        if agreed != Some(true) && self.stats.shadow_gate.pass(self.event_interval) {
            let counts = self.snapshot().shadow;
            tracing::warn!(
                fallback = %self.name,
                answered = agreed.is_some(),
                reason = if agreed.is_some() { "the answers differ" } else { trail.why.as_deref().unwrap_or("no source") },
                differed_total = counts.differed,
                unanswered_total = counts.unanswered,
                "fallback_shadow_differs"
            );
        }
    }

    /// Settles an exercise's asynchronous run: the answer to serve, or
    /// `None` when the fallback gave nothing (the call then goes to the
    /// inner service).
    pub(crate) fn settle_exercise(
        &self,
        run: Run<Res>,
        found: Option<(Res, Option<Duration>)>,
    ) -> Option<Res> {
        match found {
            Some((answer, age)) => Some(self.serve(Cause::Exercise, answer, age)),
            None => {
                self.unanswered(Cause::Exercise, &run.trail);
                None
            }
        }
    }

    /// Settles a finished asynchronous run of the chain: what the caller
    /// gets, or `None` for an exercise whose fallback gave nothing (the
    /// call then goes to the inner service).
    pub(crate) fn settle(
        &self,
        key: K,
        run: Run<Res>,
        found: Option<(Res, Option<Duration>)>,
    ) -> Option<Result<Res, BoxError>> {
        let Run {
            trail,
            cause,
            original,
            ..
        } = run;
        match (original, found) {
            (Original::Primary(primary), found) => {
                self.shadow_found(&primary, found.map(|(fallback, _)| fallback), &trail);
                Some(Ok(self.good(key, primary)))
            }
            (_, Some((answer, age))) => Some(Ok(self.serve(cause, answer, age))),
            (original, None) => {
                self.unanswered(cause, &trail);
                match original {
                    Original::Error(error) => Some(Err(error)),
                    Original::Response(response) => Some(Ok(response)),
                    Original::Primary(_) | Original::Exercise => None,
                }
            }
        }
    }
}

impl<Res, K> Core<Res, K> {
    fn snapshot(&self) -> FallbackSnapshot {
        let cached = self.cache.as_ref().map_or(0, |c| c.len());
        self.stats.snapshot(self.name.clone(), cached)
    }

    fn fmt(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("name", &&*self.name)
            .field("steps", &self.steps)
            .field("causes", &self.causes)
            .field("exercise", &(self.exercise as f64 / 2f64.powi(64)))
            .field("shadow", &(self.shadow as f64 / 2f64.powi(64)))
            .field("header", &self.header)
            .field("random", &self.random)
            .field("event_interval", &self.event_interval)
            .field("async_timeout", &self.async_timeout)
            .field("async_limit", &self.async_limit)
            .finish_non_exhaustive()
    }
}

impl<Res, K> Clone for Core<Res, K> {
    fn clone(&self) -> Self {
        Self {
            steps: self.steps.clone(),
            cache: self.cache.clone(),
            causes: self.causes,
            classifier: self.classifier.clone(),
            judge: self.judge,
            http_mark: self.http_mark,
            mark: self.mark.clone(),
            compare: self.compare.clone(),
            header: self.header,
            exercise: self.exercise,
            shadow: self.shadow,
            random: self.random.clone(),
            name: self.name.clone(),
            event_interval: self.event_interval,
            async_timeout: self.async_timeout,
            async_limit: self.async_limit,
            stats: self.stats.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_become_bounds() {
        assert_eq!(bound(0.0), 0);
        assert_eq!(bound(-1.0), 0);
        assert_eq!(bound(f64::NAN), 0);
        assert_eq!(bound(1.0), 1 << 64);
        assert_eq!(bound(7.0), 1 << 64);
        assert_eq!(bound(0.5), 1 << 63);
    }
}
