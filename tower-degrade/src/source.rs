//! Where a fallback answer comes from: a fixed value, a function, the last
//! good response per key; chained from best to worst.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower_resilience_base::BoxError;

use crate::cache::{LastGood, Remember};
use crate::cause::Cause;

/// Where a [`FallbackLayer`](super::FallbackLayer) finds its answer: a
/// chain of one or more sources, tried in order until one answers, best
/// first.
///
/// | constructor | answers with | key |
/// |---|---|---|
/// | [`Fallback::value`] | a clone of a fixed value | none |
/// | [`Fallback::from_fn`] | what a function of the [`Reason`] returns | none |
/// | [`Fallback::keyed`] | what a function of the key and the [`Reason`] returns | `key_fn(&request)` |
/// | [`Fallback::last_good`] | the last good response for the request's key, if not older than `max_staleness` | `key_fn(&request)` |
/// | [`Fallback::from_async`] / [`Fallback::keyed_async`] | what a future returns (a secondary region, a remote cache), within a time bound | `key_fn(&request)` for `keyed_async` |
///
/// and [`or_value`](Fallback::or_value) / [`or_else`](Fallback::or_else) /
/// [`or_async`](Fallback::or_async) add a worse source after the others:
/// `Fallback::last_good(key, 10_000, ten_minutes).or_value(default)`
/// serves the stale answer when there is one, the default otherwise.
///
/// The type parameters are the request, the response and the key. The
/// request is moved into the inner service before anyone knows whether it
/// will fail, so the layer keeps what the fallback needs *before* calling:
/// the key, from the key function, on every call. Keep it cheap (a route,
/// a user id); with [`value`](Fallback::value) and
/// [`from_fn`](Fallback::from_fn) the key is `()` and nothing is kept.
///
/// A source that fails (a function returning `Err` or panicking, a cache
/// with nothing fresh enough) passes to the next; when none answers, the
/// caller gets the original error or response, unchanged.
///
/// Synchronous sources run inside the response future's `poll` and never
/// wait. An asynchronous source is awaited, bounded by the earliest of
/// the layer's [`async_timeout`](crate::FallbackLayer::async_timeout)
/// (1 s by default) and the deadline of the call the layer is serving
/// (the request's deadline, from `tower-deadline` or
/// [`Deadline::scope`](tower_resilience_base::Deadline::scope)), and at
/// most [`async_limit`](crate::FallbackLayer::async_limit) of them wait
/// at once: past either bound it counts as giving nothing and the next
/// source is tried.
///
/// # Clone
///
/// Clones share the sources (functions, values and the last-good cache).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_degrade::{Cause, Fallback};
///
/// type Request = http::Request<()>;
/// type Response = http::Response<String>;
///
/// // The last good answer per path, up to 10 minutes old; else an empty list.
/// let stale_or_empty: Fallback<Request, Response, String> = Fallback::last_good(
///     |req: &Request| req.uri().path().to_owned(),
///     10_000,
///     Duration::from_secs(600),
/// )
/// .or_value(http::Response::new(String::from("[]")));
///
/// // A reduced feature, by cause.
/// let reduced: Fallback<Request, Response> = Fallback::from_fn(|_, why| match why.cause() {
///     Cause::CircuitOpen | Cause::BulkheadFull => Ok(http::Response::new("popular items".into())),
///     _ => Err("no fallback for this cause".into()),
/// });
/// # let _ = (stale_or_empty, reduced);
/// ```
pub struct Fallback<Req, Res, K = ()> {
    key: KeyFn<Req, K>,
    steps: Vec<Step<Res, K>>,
    cache: Option<Cache<K, Res>>,
}

/// What a fallback function is told: why it is asked, and the error or
/// response it replaces.
///
/// # Example
///
/// ```
/// use tower_degrade::{Cause, Fallback};
///
/// let fallback: Fallback<u32, String> = Fallback::from_fn(|_, why| match why.error() {
///     Some(error) => Ok(format!("unavailable ({}): {error}", why.cause())),
///     None => Ok(String::from("unavailable")),
/// });
/// # let _ = fallback;
/// ```
#[derive(Clone, Copy)]
pub struct Reason<'a, Res> {
    cause: Cause,
    error: Option<&'a (dyn Error + Send + Sync + 'static)>,
    response: Option<&'a Res>,
}

/// The key function, shared.
pub(crate) type KeyFn<Req, K> = Arc<dyn Fn(&Req) -> K + Send + Sync>;

/// A chain of sources, shared.
pub(crate) type Steps<Res, K> = Arc<[Step<Res, K>]>;

/// A last-good cache, shared.
pub(crate) type Cache<K, Res> = Arc<dyn Remember<K, Res>>;

/// A fallback function, shared.
type StepFn<Res, K> = Arc<dyn Fn(&K, &Reason<'_, Res>) -> Result<Res, BoxError> + Send + Sync>;

/// The future of an asynchronous source, bounded by its deadline.
pub(crate) type SourceFuture<Res> = Pin<Box<dyn Future<Output = Result<Res, BoxError>> + Send>>;

/// An asynchronous fallback function, shared: called with the key, the
/// reason and the instant its future must answer by.
type AsyncFn<Res, K> =
    Arc<dyn Fn(&K, &Reason<'_, Res>, Instant) -> SourceFuture<Res> + Send + Sync>;

/// One source of a chain.
pub(crate) enum Step<Res, K> {
    Function(StepFn<Res, K>),
    LastGood(Arc<dyn Remember<K, Res>>),
    Async(AsyncFn<Res, K>),
}

// === impl Fallback ===

impl<Req, Res> Fallback<Req, Res, ()> {
    /// Answers with a clone of `value`: a sensible default (an empty list,
    /// "delivery in 30 to 45 minutes"), or a clear and fast error response
    /// of your own.
    ///
    /// For an `http::Response<B>`, cloning clones the headers and the body:
    /// use a body that clones cheaply (`Bytes`, `Full<Bytes>`, `String`).
    pub fn value(value: Res) -> Self
    where
        Res: Clone + Send + Sync + 'static,
    {
        Self::from_fn(move |_, _| Ok(value.clone()))
    }

    /// Answers with what `f` returns for the [`Reason`] (the cause, and
    /// the error or response it replaces); `Err` means "no answer": the
    /// next source is tried, and in the end the original result is
    /// returned.
    ///
    /// The function runs on the task that polls the response future, when
    /// the call fails: keep it short, never block in it, and never make it
    /// call the dependency that just failed. A panic in it is caught and
    /// counts as `Err`.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&(), &Reason<'_, Res>) -> Result<Res, BoxError> + Send + Sync + 'static,
    {
        Self {
            key: Arc::new(|_: &Req| ()),
            steps: vec![Step::Function(Arc::new(f))],
            cache: None,
        }
    }

    /// Answers with what the future `f` returns for the [`Reason`]; see
    /// [`keyed_async`](Fallback::keyed_async), of which this is the form
    /// without a key.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{service_fn, BoxError, Layer, ServiceExt};
    /// use tower_degrade::{Fallback, FallbackLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// // The secondary region answers in 30 ms; the layer waits up to 200.
    /// let secondary = Fallback::from_async(|_, why| {
    ///     let cause = why.cause();
    ///     async move {
    ///         tokio::time::sleep(Duration::from_millis(30)).await;
    ///         Ok::<_, BoxError>(format!("from the secondary region ({cause})"))
    ///     }
    /// });
    /// let layer = FallbackLayer::plain(secondary).async_timeout(Duration::from_millis(200));
    /// let primary = service_fn(|_req: ()| async { Err::<String, BoxError>("refused".into()) });
    /// let answer = layer.layer(primary).oneshot(()).await.unwrap();
    /// assert_eq!(answer, "from the secondary region (failure)");
    /// # }
    /// ```
    pub fn from_async<F, Fut>(f: F) -> Self
    where
        F: Fn(&(), &Reason<'_, Res>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Res, BoxError>> + Send + 'static,
        Res: Send + 'static,
    {
        Self {
            key: Arc::new(|_: &Req| ()),
            steps: vec![Step::Async(bounded(f))],
            cache: None,
        }
    }
}

/// `f` as a source whose future gives up at the instant it is handed.
fn bounded<K, Res, F, Fut>(f: F) -> AsyncFn<Res, K>
where
    F: Fn(&K, &Reason<'_, Res>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Res, BoxError>> + Send + 'static,
    Res: Send + 'static,
{
    Arc::new(move |key, reason, until| {
        let future = f(key, reason);
        Box::pin(async move {
            match tokio::time::timeout_at(until, future).await {
                Ok(result) => result,
                Err(_) => Err(BoxError::from(
                    "the asynchronous fallback did not answer in time",
                )),
            }
        })
    })
}

impl<Req, Res, K> Fallback<Req, Res, K> {
    /// Answers with what `f` returns for the request's key (from `key_fn`,
    /// taken before the call) and the [`Reason`]; `Err` means "no answer",
    /// as for [`from_fn`](Fallback::from_fn).
    ///
    /// `key_fn` runs on every call, before the inner service: keep what
    /// the fallback needs and nothing more (a route, a user id, the parts
    /// of the request a default depends on).
    pub fn keyed<KF, F>(key_fn: KF, f: F) -> Self
    where
        KF: Fn(&Req) -> K + Send + Sync + 'static,
        F: Fn(&K, &Reason<'_, Res>) -> Result<Res, BoxError> + Send + Sync + 'static,
    {
        Self {
            key: Arc::new(key_fn),
            steps: vec![Step::Function(Arc::new(f))],
            cache: None,
        }
    }

    /// Answers with the last good response the dependency gave for the
    /// request's key (from `key_fn`), if it is at most `max_staleness` old;
    /// beyond that the entry is refused (the next source is tried).
    ///
    /// Every response the layer's classifier calls a success is stored
    /// (a clone of it, so `Res: Clone`), replacing the last one for its
    /// key. **Memory bound**: at most `capacity` entries, each one key and
    /// one response, whatever the traffic: the cache holds at most
    /// `capacity` times your largest response. A full cache evicts an
    /// entry too stale to serve, or else one not used recently (a CLOCK
    /// ring, close to least-recently-used). A capacity of zero stores
    /// nothing.
    ///
    /// The cost is on the happy path: a clone of every good response and a
    /// short lock per call. An `http::Response<Bytes>` clones its headers
    /// and shares its body.
    ///
    /// Ages are measured with [`tokio::time::Instant`], so tests with
    /// paused time control them. The key must identify everything the
    /// answer depends on: a key that forgets the user serves one user's
    /// answer to another.
    pub fn last_good<KF>(key_fn: KF, capacity: usize, max_staleness: Duration) -> Self
    where
        KF: Fn(&Req) -> K + Send + Sync + 'static,
        K: Hash + Eq + Clone + Send + Sync + 'static,
        Res: Clone + Send + 'static,
    {
        let cache: Arc<dyn Remember<K, Res>> = Arc::new(LastGood::new(capacity, max_staleness));
        Self {
            key: Arc::new(key_fn),
            steps: vec![Step::LastGood(cache.clone())],
            cache: Some(cache),
        }
    }

    /// Answers with what the future `f` returns for the request's key (from
    /// `key_fn`, taken before the call) and the [`Reason`]: a secondary
    /// region, a remote cache, a degraded service. `f` itself runs inside
    /// `poll` with the borrowed reason: take from it what the future needs
    /// and return the future, which is awaited within the layer's bounds
    /// (see [`Fallback`]); `Err`, a panic or a passed bound mean "no
    /// answer", as for [`keyed`](Fallback::keyed).
    ///
    /// Never make it call the dependency that just failed, nor a service
    /// that shares its fate; give it its own timeouts if it calls out
    /// (the layer's bound cuts the wait, not the work a spawned task
    /// does).
    pub fn keyed_async<KF, F, Fut>(key_fn: KF, f: F) -> Self
    where
        KF: Fn(&Req) -> K + Send + Sync + 'static,
        F: Fn(&K, &Reason<'_, Res>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Res, BoxError>> + Send + 'static,
        Res: Send + 'static,
    {
        Self {
            key: Arc::new(key_fn),
            steps: vec![Step::Async(bounded(f))],
            cache: None,
        }
    }

    /// This chain, then what the future `f` returns for the key and the
    /// [`Reason`] when it gave nothing (see
    /// [`keyed_async`](Fallback::keyed_async)).
    #[must_use]
    pub fn or_async<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(&K, &Reason<'_, Res>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Res, BoxError>> + Send + 'static,
        Res: Send + 'static,
    {
        self.steps.push(Step::Async(bounded(f)));
        self
    }

    /// This chain, then a clone of `value` when it gave nothing.
    #[must_use]
    pub fn or_value(self, value: Res) -> Self
    where
        Res: Clone + Send + Sync + 'static,
    {
        self.or_else(move |_, _| Ok(value.clone()))
    }

    /// This chain, then what `f` returns for the key and the [`Reason`]
    /// when it gave nothing (see [`keyed`](Fallback::keyed)).
    #[must_use]
    pub fn or_else<F>(mut self, f: F) -> Self
    where
        F: Fn(&K, &Reason<'_, Res>) -> Result<Res, BoxError> + Send + Sync + 'static,
    {
        self.steps.push(Step::Function(Arc::new(f)));
        self
    }

    /// The key function.
    pub(crate) fn key_fn(&self) -> &KeyFn<Req, K> {
        &self.key
    }

    /// The sources and the cache, for the layer.
    pub(crate) fn into_parts(self) -> (Steps<Res, K>, Option<Cache<K, Res>>) {
        (self.steps.into(), self.cache)
    }
}

impl<Req, Res, K> Clone for Fallback<Req, Res, K> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            steps: self.steps.clone(),
            cache: self.cache.clone(),
        }
    }
}

impl<Req, Res, K> fmt::Debug for Fallback<Req, Res, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

// === impl Reason ===

impl<'a, Res> Reason<'a, Res> {
    pub(crate) const fn new(
        cause: Cause,
        error: Option<&'a (dyn Error + Send + Sync + 'static)>,
        response: Option<&'a Res>,
    ) -> Self {
        Self {
            cause,
            error,
            response,
        }
    }

    /// Why the fallback is asked: the failure's cause, or
    /// [`Cause::Exercise`] in the exercise and shadow modes. A function
    /// that answers by cause should answer [`Cause::Exercise`] the way it
    /// answers the failures that matter most, or those modes exercise
    /// nothing (they count an `Err` as "no answer").
    #[must_use]
    pub const fn cause(&self) -> Cause {
        self.cause
    }

    /// The error the fallback replaces, if the call failed with one.
    #[must_use]
    pub const fn error(&self) -> Option<&'a (dyn Error + Send + Sync + 'static)> {
        self.error
    }

    /// The response the fallback replaces, if the call failed with a
    /// response (a `5xx`, a local refusal).
    #[must_use]
    pub const fn response(&self) -> Option<&'a Res> {
        self.response
    }
}

impl<Res> fmt::Debug for Reason<'_, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reason")
            .field("cause", &self.cause)
            .field("error", &self.error)
            .field(
                "response",
                &self.response.map(|_| std::any::type_name::<Res>()),
            )
            .finish()
    }
}

// === impl Step ===

impl<Res, K> Clone for Step<Res, K> {
    fn clone(&self) -> Self {
        match self {
            Step::Function(f) => Step::Function(f.clone()),
            Step::LastGood(c) => Step::LastGood(c.clone()),
            Step::Async(f) => Step::Async(f.clone()),
        }
    }
}

impl<Res, K> fmt::Debug for Step<Res, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Function(_) => "function",
            Step::LastGood(_) => "last_good",
            Step::Async(_) => "async",
        })
    }
}
