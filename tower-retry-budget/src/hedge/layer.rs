use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use tokio::time::Instant;
use tower_layer::Layer;

use super::service::Hedge;
use super::shared::{Charging, Config, HedgeCounters, Learned, Shared, State};
use crate::body::{Buffered, CloneBody, DEFAULT_BODY_LIMIT};
use crate::budget::RetryBudget;
use crate::layer::DEFAULT_MIN_REMAINING;
use crate::metrics::HedgeMetrics;
use crate::policy::{DefaultPolicy, Policy};
use crate::RetryLayer;

/// The default percentile of recent latencies after which a hedge is sent:
/// the 95th.
pub const DEFAULT_PERCENTILE: f64 = 0.95;
/// The default most hedges per request: one.
pub const DEFAULT_MAX_HEDGES: u32 = 1;
/// The default least number of latencies in the estimate before it is
/// used: 100.
pub const DEFAULT_MIN_SAMPLES: u64 = 100;
/// The default length of each of the estimate's two rotating windows:
/// 10 s (so the estimate covers the last 10 to 20 s).
pub const DEFAULT_HEDGE_WINDOW: Duration = Duration::from_secs(10);
/// The default shortest learned delay: 1 ms.
pub const DEFAULT_MIN_DELAY: Duration = Duration::from_millis(1);
/// The default longest learned delay: 1 s.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(1);

/// The attempt number on hedges of plain HTTP requests: `x-hedge-attempt`
/// (`2` on the first hedge, absent on first attempts). gRPC hedges carry
/// `grpc-previous-rpc-attempts` instead, as in gRPC's hedging design.
pub const HEDGE_ATTEMPT_HEADER: HeaderName = HeaderName::from_static("x-hedge-attempt");

/// A [`Layer`] that hedges slow idempotent requests: after a learned (or
/// fixed) delay it sends one more attempt through the same inner service,
/// and the first answer that is not a retryable failure wins.
///
/// The layer owns what every service it builds shares: the latency
/// estimate, the counters and the budget. Build it once per dependency,
/// and clone it; every knob is listed in the [module docs](super).
///
/// # Clone
///
/// Clones share the estimate, the counters, the pushback pause and the
/// budget. Every setter starts a new estimate and new counters (configure
/// before use); [`budget`](Self::budget) shares the given budget.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_retry_budget::hedge::HedgeLayer;
///
/// let layer = HedgeLayer::new()
///     .percentile(0.99)
///     .max_delay(Duration::from_millis(250))
///     .max_hedges(2);
/// assert_eq!(layer.counters().hedges, 0);
/// ```
#[must_use]
pub struct HedgeLayer<P = DefaultPolicy, M = Buffered> {
    config: Config,
    state: Arc<State>,
    budget: Arc<RetryBudget>,
    policy: P,
    _mode: PhantomData<fn() -> M>,
}

// === impl HedgeLayer ===

impl HedgeLayer {
    /// A layer with every default: a hedge after the 95th percentile of
    /// recent latencies (once 100 are known; none before), clamped to
    /// 1 ms..1 s; at most one hedge per request; a new 10%
    /// [`RetryBudget`] of its own, in which it counts every request; the
    /// [`DefaultPolicy`]; buffered bodies up to 64 KiB.
    ///
    /// Placed directly above a [`RetryLayer`], build it with
    /// [`above`](HedgeLayer::above) instead, so both draw on one budget.
    pub fn new() -> Self {
        let config = Config {
            fixed: None,
            learned: Learned {
                quantile: DEFAULT_PERCENTILE,
                min: DEFAULT_MIN_DELAY,
                max: DEFAULT_MAX_DELAY,
                min_samples: DEFAULT_MIN_SAMPLES,
                fallback: None,
                window: DEFAULT_HEDGE_WINDOW,
            },
            max_hedges: DEFAULT_MAX_HEDGES,
            min_remaining: DEFAULT_MIN_REMAINING,
            body_limit: DEFAULT_BODY_LIMIT,
            attempt_header: Some(HEDGE_ATTEMPT_HEADER),
            charging: Charging {
                counts_requests: true,
                surcharge_ppm: None,
            },
            name: Arc::from(crate::layer::DEFAULT_NAME),
        };
        Self {
            state: Arc::new(State::new(&config)),
            config,
            budget: Arc::new(RetryBudget::new()),
            policy: DefaultPolicy::new(),
            _mode: PhantomData,
        }
    }

    /// A layer to put directly above `retry` (the order of the toolkit's
    /// stack): it shares the retry layer's budget and copies its policy,
    /// minimum deadline slice, body limit and [`name`](RetryLayer::name).
    ///
    /// The retry layer below counts every attempt this layer sends it as a
    /// request, hedges included, so this layer counts none itself, and
    /// charges each hedge so that hedges and retries *together* stay
    /// within the budget's share of the callers' requests: every hedge
    /// withdraws one token, and every `1 / ratio`-th hedge (every tenth at
    /// 10%) one more, which takes back the allowance the hedges' own
    /// counts added. The budget's [`Counters::retries`](crate::Counters::retries)
    /// then include the hedges and those extra tokens.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower::ServiceBuilder;
    /// use tower_retry_budget::hedge::HedgeLayer;
    /// use tower_retry_budget::RetryLayer;
    ///
    /// let retry = RetryLayer::new();
    /// let hedge = HedgeLayer::above(&retry);
    /// assert!(Arc::ptr_eq(hedge.shared_budget(), retry.shared_budget()));
    ///
    /// let stack = ServiceBuilder::new().layer(hedge).layer(retry);
    /// # let _ = stack;
    /// ```
    pub fn above<P: Policy + Clone, N>(retry: &RetryLayer<P, N>) -> HedgeLayer<P> {
        let budget = Arc::clone(retry.shared_budget());
        let surcharge_ppm = budget
            .ratio_value()
            .map(|ratio| (ratio * 1_000_000.0).round() as u64);
        let mut layer = HedgeLayer::new().policy(retry.policy.clone());
        layer.budget = budget;
        layer.config.min_remaining = retry.config.min_remaining;
        layer.config.body_limit = retry.config.body_limit;
        layer.config.name = Arc::clone(&retry.config.name);
        layer.config.charging = Charging {
            counts_requests: false,
            surcharge_ppm,
        };
        layer.fresh()
    }
}

impl<P, M> HedgeLayer<P, M> {
    /// A new estimate and counters for the configuration as it now is.
    fn fresh(mut self) -> Self {
        self.state = Arc::new(State::new(&self.config));
        self
    }

    /// Hedge after this percentile of recent latencies (default 0.95, the
    /// 95th), learned from the attempts of this layer; this undoes a
    /// [`fixed_delay`](Self::fixed_delay).
    ///
    /// About `1 - percentile` of the requests then get a hedge (5% at the
    /// default), which is the extra load, within the budget.
    ///
    /// # Panics
    ///
    /// If `percentile` is not above 0 and at most 1.
    pub fn percentile(mut self, percentile: f64) -> Self {
        assert!(
            percentile > 0.0 && percentile <= 1.0,
            "hedge percentile must be in (0, 1], got {percentile}"
        );
        self.config.fixed = None;
        self.config.learned.quantile = percentile;
        self.fresh()
    }

    /// Hedge after this fixed delay instead of a learned one. Latencies are
    /// then not recorded at all.
    pub fn fixed_delay(mut self, delay: Duration) -> Self {
        self.config.fixed = Some(delay);
        self.fresh()
    }

    /// The shortest learned delay (default 1 ms): a dependency that
    /// answers in microseconds is not hedged after microseconds.
    pub fn min_delay(mut self, min: Duration) -> Self {
        self.config.learned.min = min;
        self.fresh()
    }

    /// The longest learned delay (default 1 s): when the percentile is
    /// higher, the hedge goes out after this.
    pub fn max_delay(mut self, max: Duration) -> Self {
        self.config.learned.max = max;
        self.fresh()
    }

    /// The least number of latencies in the estimate before it is trusted
    /// (default 100); until then the
    /// [`fallback_delay`](Self::fallback_delay) applies, or no hedge.
    pub fn min_samples(mut self, samples: u64) -> Self {
        self.config.learned.min_samples = samples.max(1);
        self.fresh()
    }

    /// The delay while the estimate has too few latencies (default: none,
    /// so no hedge until the estimate is trusted).
    pub fn fallback_delay(mut self, delay: Duration) -> Self {
        self.config.learned.fallback = Some(delay);
        self.fresh()
    }

    /// The length of each of the estimate's two rotating windows (default
    /// 10 s, at least 1 ms): the estimate covers the last one to two
    /// windows.
    pub fn window(mut self, window: Duration) -> Self {
        self.config.learned.window = window.max(Duration::from_millis(1));
        self.fresh()
    }

    /// The most hedges per request (default 1; 0 turns hedging off). Each
    /// further hedge goes out one delay after the previous one.
    pub fn max_hedges(mut self, hedges: u32) -> Self {
        self.config.max_hedges = hedges;
        self.fresh()
    }

    /// The least part of the call's deadline a hedge must be able to get
    /// (default 10 ms): with less left, no hedge is sent.
    pub fn min_remaining(mut self, min: Duration) -> Self {
        self.config.min_remaining = min;
        self.fresh()
    }

    /// Names the dependency this layer calls (default `default`): the
    /// `dependency` label of what the layer records with the `metrics`
    /// feature (see the crate's `metrics` module); without the feature the
    /// name is kept but unused. Unlike the other setters, it keeps the
    /// layer's estimate and counters.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_retry_budget::hedge::HedgeLayer;
    ///
    /// let layer = HedgeLayer::new().name("search");
    /// # let _ = layer;
    /// ```
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Charge hedges to `budget`, counting every request of this layer in
    /// it. For a hedge layer *without* a retry layer below that shares
    /// the budget; directly above a [`RetryLayer`], use
    /// [`HedgeLayer::above`].
    pub fn budget(mut self, budget: Arc<RetryBudget>) -> Self {
        let counts_requests = true;
        self.budget = budget;
        self.config.charging = Charging {
            counts_requests,
            surcharge_ppm: None,
        };
        self.fresh()
    }

    /// No budget: every hedge the other rules allow is sent
    /// ([`RetryBudget::unlimited`]). Only to measure what the budget
    /// saves.
    pub fn no_budget(self) -> Self {
        self.budget(Arc::new(RetryBudget::unlimited()))
    }

    /// Replaces the [`Policy`] that decides which requests may be hedged
    /// ([`Policy::is_retryable_request`]) and which answers are retryable
    /// failures, which never win a race.
    pub fn policy<Q: Policy>(self, policy: Q) -> HedgeLayer<Q, M> {
        HedgeLayer {
            config: self.config,
            state: self.state,
            budget: self.budget,
            policy,
            _mode: PhantomData,
        }
    }

    /// Replays `Clone` bodies by cloning them; the inner service then
    /// receives the caller's body type unchanged (as with
    /// [`RetryLayer::clone_bodies`]).
    pub fn clone_bodies(self) -> HedgeLayer<P, CloneBody> {
        HedgeLayer {
            config: self.config,
            state: self.state,
            budget: self.budget,
            policy: self.policy,
            _mode: PhantomData,
        }
    }

    /// The most bytes of a [`Buffered`] request body kept for replay
    /// (default 64 KiB); a request with a larger body is not hedged.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.config.body_limit = limit;
        self.fresh()
    }

    /// The header that carries the attempt number (2 for the first hedge)
    /// on hedges of plain HTTP requests (default
    /// [`HEDGE_ATTEMPT_HEADER`]).
    pub fn attempt_header(mut self, name: HeaderName) -> Self {
        self.config.attempt_header = Some(name);
        self.fresh()
    }

    /// Do not mark hedges of plain HTTP requests with an attempt header.
    pub fn no_attempt_header(mut self) -> Self {
        self.config.attempt_header = None;
        self.fresh()
    }

    /// The budget hedges are charged to.
    #[must_use]
    pub fn shared_budget(&self) -> &Arc<RetryBudget> {
        &self.budget
    }

    /// The counters of this layer (every service and clone of it).
    #[must_use]
    pub fn counters(&self) -> HedgeCounters {
        self.state.counters()
    }

    /// The delay a hedge would wait now: the fixed delay, or the learned
    /// percentile computed afresh (clamped), or the fallback; `None` when
    /// the estimate has too few latencies and there is no fallback.
    #[must_use]
    pub fn current_delay(&self) -> Option<Duration> {
        self.state
            .refresh(&self.config, Instant::now())
            .or(self.config.fallback())
    }

    /// How many latencies the estimate holds now (0 with a fixed delay).
    #[must_use]
    pub fn samples(&self) -> u64 {
        self.state.samples(Instant::now())
    }

    #[cfg(test)]
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }
}

impl Default for HedgeLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Clone, M> Clone for HedgeLayer<P, M> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
            state: Arc::clone(&self.state),
            budget: Arc::clone(&self.budget),
            policy: self.policy.clone(),
            _mode: PhantomData,
        }
    }
}

impl<P, M> fmt::Debug for HedgeLayer<P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeLayer")
            .field("config", &self.config)
            .field("state", &self.state)
            .field("budget", &self.budget)
            .field("policy", &std::any::type_name::<P>())
            .field("mode", &std::any::type_name::<M>())
            .finish()
    }
}

impl<S, P: Clone, M> Layer<S> for HedgeLayer<P, M> {
    type Service = Hedge<S, P, M>;

    fn layer(&self, inner: S) -> Self::Service {
        Hedge::from_shared(
            inner,
            Arc::new(Shared {
                metrics: HedgeMetrics::new(&self.config.name),
                config: self.config.clone(),
                state: Arc::clone(&self.state),
                budget: Arc::clone(&self.budget),
                policy: self.policy.clone(),
            }),
        )
    }
}
