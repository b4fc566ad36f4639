use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderName;
use tower_layer::Layer;

use crate::backoff::Backoff;
use crate::body::{Buffered, CloneBody, DEFAULT_BODY_LIMIT};
use crate::budget::{Counters, RetryBudget};
use crate::metrics::RetryMetrics;
use crate::policy::{DefaultPolicy, Policy};
use crate::service::{Retry, Shared};
use crate::RETRY_ATTEMPT_HEADER;
use crate::{ProcessRandom, RandomSource};

/// The default maximum number of attempts, the first included: 3.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// The default least part of the deadline an attempt must be able to get:
/// 10 ms.
pub const DEFAULT_MIN_REMAINING: Duration = Duration::from_millis(10);
/// The default longest delay a server may ask for (`Retry-After`,
/// `grpc-retry-pushback-ms`) and still be retried: 10 s.
pub const DEFAULT_MAX_SERVER_DELAY: Duration = Duration::from_secs(10);
/// The name of a layer not given one with `name`: `default`.
pub(crate) const DEFAULT_NAME: &str = "default";

/// Retries transient failures of idempotent requests within a budget; a
/// [`Layer`] that produces [`Retry`].
///
/// The layer owns the shared state: [`RetryLayer::new`] creates the
/// [`RetryBudget`] and the random source, and every service built by
/// [`Layer::layer`] (axum and hyper call it once per connection), and every
/// clone of those, shares them. Its counters are therefore those of all
/// its services.
///
/// The type parameters are the [`Policy`] (default [`DefaultPolicy`]) and
/// the body replay mode (default [`Buffered`]; see [`crate::body`]).
///
/// Every knob and its default is listed in the crate's
/// [Semantics](crate#semantics).
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_retry_budget::{Backoff, RetryBudget, RetryLayer};
///
/// let layer = RetryLayer::new()
///     .max_attempts(2)
///     .backoff(Backoff::full_jitter(Duration::from_millis(20), Duration::from_millis(200)))
///     .budget(Arc::new(RetryBudget::new().ratio(0.05)))
///     .min_remaining(Duration::from_millis(50));
/// assert_eq!(layer.counters().requests, 0);
/// ```
#[must_use]
pub struct RetryLayer<P = DefaultPolicy, M = Buffered> {
    pub(crate) config: Config,
    budget: Arc<RetryBudget>,
    random: Arc<dyn RandomSource>,
    pub(crate) policy: P,
    _mode: PhantomData<fn() -> M>,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) max_attempts: MaxAttempts,
    pub(crate) backoff: Backoff,
    pub(crate) min_remaining: Duration,
    pub(crate) max_server_delay: Duration,
    pub(crate) body_limit: usize,
    pub(crate) attempt_header: Option<HeaderName>,
    /// The `dependency` label of the layer's metrics.
    pub(crate) name: Arc<str>,
}

// === impl RetryLayer ===

impl RetryLayer {
    /// A layer with every default: 3 attempts, full jitter (50 ms base, 1 s
    /// cap), a new 10% [`RetryBudget`], the [`DefaultPolicy`], buffered
    /// bodies up to 64 KiB.
    pub fn new() -> Self {
        Self {
            config: Config {
                max_attempts: MaxAttempts::new(DEFAULT_MAX_ATTEMPTS),
                backoff: Backoff::DEFAULT,
                min_remaining: DEFAULT_MIN_REMAINING,
                max_server_delay: DEFAULT_MAX_SERVER_DELAY,
                body_limit: DEFAULT_BODY_LIMIT,
                attempt_header: Some(RETRY_ATTEMPT_HEADER),
                name: Arc::from(DEFAULT_NAME),
            },
            budget: Arc::new(RetryBudget::new()),
            random: Arc::new(ProcessRandom::new()),
            policy: DefaultPolicy::new(),
            _mode: PhantomData,
        }
    }
}

impl<P, M> RetryLayer<P, M> {
    /// The most attempts per request, the first included (default 3; at
    /// least 1, which disables retries).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        // A cell of its own: a clone of the layer made before keeps its
        // own setting.
        self.config.max_attempts = MaxAttempts::new(attempts);
        self
    }

    /// The handle that changes [`max_attempts`](Self::max_attempts) of this
    /// layer and of every service it built, while they run.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_retry_budget::RetryLayer;
    ///
    /// let layer = RetryLayer::new().max_attempts(3);
    /// let attempts = layer.max_attempts_handle();
    /// attempts.set(5);
    /// assert_eq!(layer.max_attempts_handle().get(), 5);
    /// ```
    #[must_use]
    pub fn max_attempts_handle(&self) -> MaxAttempts {
        self.config.max_attempts.clone()
    }

    /// The backoff between attempts (default [`Backoff::DEFAULT`]: full
    /// jitter, 50 ms base, 1 s cap).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.config.backoff = backoff;
        self
    }

    /// The retry budget (default: a new [`RetryBudget::new`]). Pass the same
    /// `Arc` to several layers to give them one budget.
    pub fn budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = budget;
        self
    }

    /// No budget: every retry the other rules allow is sent
    /// ([`RetryBudget::unlimited`]). This is how retries become storms; it
    /// exists to measure the difference.
    pub fn no_budget(self) -> Self {
        self.budget(Arc::new(RetryBudget::unlimited()))
    }

    /// The source of the per-request jitter seeds (default
    /// [`ProcessRandom`]); tests inject a
    /// [`SeededRandom`](crate::SeededRandom).
    pub fn random(mut self, random: impl RandomSource) -> Self {
        self.random = Arc::new(random);
        self
    }

    /// The least part of the deadline an attempt must be able to get
    /// (default 10 ms): a retry whose backoff would leave less than this
    /// before the deadline is not made. Only applies to requests that have
    /// a deadline (see [`crate`] docs, feature `deadline`).
    pub const fn min_remaining(mut self, min: Duration) -> Self {
        self.config.min_remaining = min;
        self
    }

    /// The longest delay a server may ask for with `Retry-After` or
    /// `grpc-retry-pushback-ms` and still be retried (default 10 s).
    pub const fn max_server_delay(mut self, max: Duration) -> Self {
        self.config.max_server_delay = max;
        self
    }

    /// The most bytes of a [`Buffered`] request body kept for replay
    /// (default 64 KiB); a larger body is sent once. Ignored by
    /// [`CloneBody`].
    pub const fn body_limit(mut self, limit: usize) -> Self {
        self.config.body_limit = limit;
        self
    }

    /// The header that carries the attempt number (2 for the first retry)
    /// on retries of plain HTTP requests (default
    /// [`RETRY_ATTEMPT_HEADER`]). gRPC requests always carry
    /// `grpc-previous-rpc-attempts` instead.
    pub fn attempt_header(mut self, name: HeaderName) -> Self {
        self.config.attempt_header = Some(name);
        self
    }

    /// Do not mark retries of plain HTTP requests with an attempt header.
    pub fn no_attempt_header(mut self) -> Self {
        self.config.attempt_header = None;
        self
    }

    /// Names the dependency this layer calls (default `default`): the
    /// `dependency` label of what the layer records with the `metrics`
    /// feature (see the crate's `metrics` module); without the feature the
    /// name is kept but unused. Name the layer after the dependency, as
    /// you name its breaker and bulkhead.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_retry_budget::RetryLayer;
    ///
    /// let layer = RetryLayer::new().name("inventory");
    /// # let _ = layer;
    /// ```
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Replaces the [`Policy`] that decides what is retried.
    pub fn policy<Q: Policy>(self, policy: Q) -> RetryLayer<Q, M> {
        RetryLayer {
            config: self.config,
            budget: self.budget,
            random: self.random,
            policy,
            _mode: PhantomData,
        }
    }

    /// Replays `Clone` bodies by cloning them, with no size limit; the inner
    /// service then receives the caller's body type unchanged. See
    /// [`crate::body`].
    pub fn clone_bodies(self) -> RetryLayer<P, CloneBody> {
        RetryLayer {
            config: self.config,
            budget: self.budget,
            random: self.random,
            policy: self.policy,
            _mode: PhantomData,
        }
    }

    #[cfg(test)]
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The budget shared by every service of this layer.
    #[must_use]
    pub fn shared_budget(&self) -> &Arc<RetryBudget> {
        &self.budget
    }

    /// The counters of the budget: requests, retries, retries refused.
    #[must_use]
    pub fn counters(&self) -> Counters {
        self.budget.counters()
    }
}

impl Default for RetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Clone, M> Clone for RetryLayer<P, M> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
            budget: Arc::clone(&self.budget),
            random: Arc::clone(&self.random),
            policy: self.policy.clone(),
            _mode: PhantomData,
        }
    }
}

impl<P, M> fmt::Debug for RetryLayer<P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryLayer")
            .field("config", &self.config)
            .field("budget", &self.budget)
            .field("random", &self.random)
            .field("policy", &std::any::type_name::<P>())
            .field("mode", &std::any::type_name::<M>())
            .finish()
    }
}

impl<S, P: Clone, M> Layer<S> for RetryLayer<P, M> {
    type Service = Retry<S, P, M>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::from_shared(
            inner,
            Arc::new(Shared {
                metrics: RetryMetrics::new(&self.config.name),
                config: self.config.clone(),
                budget: Arc::clone(&self.budget),
                random: Arc::clone(&self.random),
                spare: OnceLock::new(),
                policy: self.policy.clone(),
            }),
        )
    }
}

/// The most attempts per request of a [`RetryLayer`] and its services,
/// changeable while they run ([`RetryLayer::max_attempts_handle`]).
/// Clones share the setting. A call reads it when it decides to retry, so
/// a change applies to the next retry decision of calls in flight too.
#[derive(Clone)]
pub struct MaxAttempts(Arc<std::sync::atomic::AtomicU32>);

impl MaxAttempts {
    fn new(attempts: u32) -> Self {
        Self(Arc::new(std::sync::atomic::AtomicU32::new(attempts.max(1))))
    }

    /// The setting now.
    #[must_use]
    #[inline]
    pub fn get(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets it (at least 1, which disables retries).
    pub fn set(&self, attempts: u32) {
        self.0
            .store(attempts.max(1), std::sync::atomic::Ordering::Relaxed);
    }
}

impl fmt::Debug for MaxAttempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
}
