//! What every service of one hedging layer shares: the configuration, the
//! latency estimate and its cached delay, the pushback pause, the budget's
//! charging rule and the counters.

use std::cell::Cell;
use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Relaxed},
};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use tokio::time::Instant;

use super::estimate::{Estimator, Quantile};
use crate::budget::RetryBudget;
use crate::metrics::HedgeMetrics;

/// Millionths, as the budget keeps its ratio.
const PPM: u64 = 1_000_000;
/// Stripes of the request counter, so that tasks on different threads do
/// not contend on one cache line.
const STRIPES: usize = 8;
/// The longest a server's pushback (`Retry-After`,
/// `grpc-retry-pushback-ms`) pauses hedging: 10 s, as the retry layer's
/// longest obeyed server delay.
pub(crate) const MAX_PAUSE: Duration = crate::layer::DEFAULT_MAX_SERVER_DELAY;

/// The configuration of one layer (the services of the layer share it).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// A fixed delay, or `None` for the learned one.
    pub(crate) fixed: Option<Duration>,
    pub(crate) learned: Learned,
    pub(crate) max_hedges: u32,
    pub(crate) min_remaining: Duration,
    pub(crate) body_limit: usize,
    pub(crate) attempt_header: Option<HeaderName>,
    pub(crate) charging: Charging,
    /// The `dependency` label of the layer's metrics.
    pub(crate) name: Arc<str>,
}

/// How the learned delay is chosen: a percentile of recent latencies,
/// clamped to `[min, max]`; `fallback` while there are fewer than
/// `min_samples` (no hedge when `None`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Learned {
    pub(crate) quantile: f64,
    pub(crate) min: Duration,
    pub(crate) max: Duration,
    pub(crate) min_samples: u64,
    pub(crate) fallback: Option<Duration>,
    /// The length of each of the two rotating windows.
    pub(crate) window: Duration,
}

/// How hedges are charged to the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charging {
    /// Whether this layer counts every request it receives in the budget
    /// (it does unless a retry layer below, sharing the budget, counts
    /// them).
    pub(crate) counts_requests: bool,
    /// With a retry layer below that counts each hedge as a request too:
    /// the budget's ratio in millionths. Every hedge then withdraws one
    /// token, plus one more each time the hedges already sent reach
    /// another multiple of `1 / ratio`, which takes back the allowance the
    /// hedges' own counts added; `None` otherwise.
    pub(crate) surcharge_ppm: Option<u64>,
}

/// Everything the services of one layer share.
pub(crate) struct Shared<P: ?Sized> {
    pub(crate) config: Config,
    pub(crate) state: Arc<State>,
    pub(crate) budget: Arc<RetryBudget>,
    /// The `metrics` handles (nothing without the feature).
    pub(crate) metrics: HedgeMetrics,
    /// Last, so that `Arc<Shared<P>>` coerces to `Arc<Shared<dyn Policy>>`.
    pub(crate) policy: P,
}

/// The mutable state of one layer: the estimate, the pause, the counters.
pub(crate) struct State {
    origin: Instant,
    /// `None` with a fixed delay: nothing to learn.
    estimator: Option<Estimator>,
    /// The learned delay in nanoseconds plus one; 0 when there is none.
    cached: AtomicU64,
    /// When the cached delay is next recomputed, in nanoseconds since
    /// `origin`.
    refresh_at: AtomicU64,
    refresh_ns: u64,
    /// Until when hedging is paused by a server's pushback, in nanoseconds
    /// since `origin`.
    paused_until: AtomicU64,
    /// Hedges charged with a surcharge rule, for its count.
    charged: AtomicU64,
    requests: Box<[Stripe]>,
    hedges: AtomicU64,
    won: AtomicU64,
    refused_by_budget: AtomicU64,
    refused_by_breaker: AtomicU64,
    refused_by_deadline: AtomicU64,
    refused_by_pushback: AtomicU64,
    cancelled: AtomicU64,
}

/// One stripe of the request counter, alone on its cache line.
#[repr(align(128))]
struct Stripe(AtomicU64);

/// A budget payment for one hedge, given back if the hedge is not sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Charge {
    at: Instant,
    tokens: u8,
    /// Whether the hedge was counted for the surcharge rule.
    counted: bool,
}

/// Why a hedge was not sent, for the counters and the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The budget had no room.
    Budget,
    /// The attempt hook (the breaker) refused it.
    Breaker,
    /// Less than the minimum slice of the deadline was left.
    Deadline,
    /// A server pushed back, or a layer below rejected an attempt for
    /// overload.
    Pushback,
    /// Every allowed hedge was sent, or the body cannot be replayed, or
    /// the inner service failed to become ready.
    Other,
}

/// A snapshot of the counters of a hedging layer (shared by every service
/// of the layer and every clone), totals since it was created.
///
/// The extra load the layer put on the dependency is
/// [`hedges`](HedgeCounters::hedges) over
/// [`requests`](HedgeCounters::requests).
///
/// # Example
///
/// ```
/// use tower_retry_budget::hedge::HedgeLayer;
///
/// let layer = HedgeLayer::new();
/// let counters = layer.counters();
/// assert_eq!((counters.requests, counters.hedges, counters.hedges_won), (0, 0, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HedgeCounters {
    /// Requests received (hedgeable or not).
    pub requests: u64,
    /// Hedges sent: attempts beyond the first.
    pub hedges: u64,
    /// Requests answered by a hedge rather than by their first attempt.
    pub hedges_won: u64,
    /// Hedges the retry budget refused.
    pub refused_by_budget: u64,
    /// Hedges the attempt hook refused (a breaker that is not closed).
    pub refused_by_breaker: u64,
    /// Hedges not sent because less than the minimum slice of the
    /// deadline was left.
    pub refused_by_deadline: u64,
    /// Hedges not sent because a server pushed back (`Retry-After`,
    /// `grpc-retry-pushback-ms`, the do-not-retry mark) or a layer below
    /// rejected an attempt (a full bulkhead, an open circuit).
    pub refused_by_pushback: u64,
    /// Attempts cancelled in flight: the losers of a race, and the
    /// attempts of calls the caller dropped.
    pub cancelled: u64,
}

thread_local! {
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

fn stripe_index() -> usize {
    STRIPE.with(|s| {
        let mut i = s.get();
        if i == usize::MAX {
            i = NEXT_STRIPE.fetch_add(1, Relaxed) % STRIPES;
            s.set(i);
        }
        i
    })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// === impl Config ===

impl Config {
    /// The fixed delay, or the learned rule's fallback.
    pub(crate) fn fallback(&self) -> Option<Duration> {
        self.fixed.or(self.learned.fallback)
    }
}

// === impl State ===

impl State {
    /// A fresh state for `config`.
    pub(crate) fn new(config: &Config) -> Self {
        let origin = Instant::now();
        let window = config.learned.window;
        let estimator = config
            .fixed
            .is_none()
            .then(|| Estimator::new(origin, window));
        let refresh = (window / 50).clamp(Duration::from_millis(1), Duration::from_millis(100));
        Self {
            origin,
            estimator,
            cached: AtomicU64::new(0),
            refresh_at: AtomicU64::new(0),
            refresh_ns: nanos(refresh),
            paused_until: AtomicU64::new(0),
            charged: AtomicU64::new(0),
            requests: (0..STRIPES).map(|_| Stripe(AtomicU64::new(0))).collect(),
            hedges: AtomicU64::new(0),
            won: AtomicU64::new(0),
            refused_by_budget: AtomicU64::new(0),
            refused_by_breaker: AtomicU64::new(0),
            refused_by_deadline: AtomicU64::new(0),
            refused_by_pushback: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
        }
    }

    #[inline]
    fn since_origin(&self, at: Instant) -> u64 {
        nanos(at.saturating_duration_since(self.origin))
    }

    /// Whether the delay is learned (latencies need recording).
    #[inline]
    pub(crate) fn learns(&self) -> bool {
        self.estimator.is_some()
    }

    /// Counts a latency measured at `at` in the estimate: exactly
    /// `latency` for an attempt that answered, at least `latency` for one
    /// `cancelled` in flight.
    #[inline]
    pub(crate) fn record(&self, at: Instant, latency: Duration, cancelled: bool) {
        if let Some(estimator) = &self.estimator {
            estimator.record(at, latency, cancelled);
        }
    }

    /// The delay before a hedge of a call that started at `now`: the fixed
    /// delay, or the cached learned one (recomputed at most once per
    /// refresh interval, by one caller), or the fallback; `None`: no
    /// hedge.
    #[inline]
    pub(crate) fn delay(&self, config: &Config, now: Instant) -> Option<Duration> {
        if config.fixed.is_some() {
            return config.fixed;
        }
        let t = self.since_origin(now);
        let due = self.refresh_at.load(Relaxed);
        if t >= due
            && self
                .refresh_at
                .compare_exchange(due, t.saturating_add(self.refresh_ns), Relaxed, Relaxed)
                .is_ok()
        {
            return self.refresh(config, now).or(config.fallback());
        }
        match self.cached.load(Relaxed) {
            0 => config.fallback(),
            n => Some(Duration::from_nanos(n - 1)),
        }
    }

    /// Recomputes the learned delay at `now` and caches it.
    pub(crate) fn refresh(&self, config: &Config, now: Instant) -> Option<Duration> {
        if config.fixed.is_some() {
            return config.fixed;
        }
        let rule = config.learned;
        let max = rule.max.max(rule.min);
        let learned = match self
            .estimator
            .as_ref()
            .map(|e| e.quantile(now, rule.quantile, rule.min_samples))
        {
            Some(Quantile::At(d)) => Some(d.clamp(rule.min, max)),
            Some(Quantile::Beyond) => Some(max),
            Some(Quantile::TooFew) | None => None,
        };
        self.cached
            .store(learned.map_or(0, |d| nanos(d).saturating_add(1)), Relaxed);
        learned
    }

    /// Samples in the estimate at `now`.
    pub(crate) fn samples(&self, now: Instant) -> u64 {
        self.estimator.as_ref().map_or(0, |e| e.samples(now))
    }

    /// Pauses hedging until `until` (a server pushed back); a pause only
    /// ever grows.
    pub(crate) fn pause_until(&self, until: Instant) {
        self.paused_until
            .fetch_max(self.since_origin(until), AcqRel);
    }

    /// Whether a server's pushback pauses hedging at `now`.
    #[inline]
    pub(crate) fn paused(&self, now: Instant) -> bool {
        self.since_origin(now) < self.paused_until.load(Relaxed)
    }

    /// Charges one hedge to `budget` at `now`: `None` (and nothing spent)
    /// when the budget has no room.
    pub(crate) fn charge(
        &self,
        charging: Charging,
        budget: &RetryBudget,
        now: Instant,
    ) -> Option<Charge> {
        if !budget.withdraw_at(now) {
            return None;
        }
        let Some(ppm) = charging.surcharge_ppm else {
            return Some(Charge {
                at: now,
                tokens: 1,
                counted: false,
            });
        };
        // One more token each time the hedges already sent reach another
        // multiple of 1 / ratio: with n sent, the next costs
        // 1 + floor(n * ratio) - floor((n - 1) * ratio), so the hedges'
        // tokens track n * ratio, the allowance their counts added, and
        // the share stays exact to within one token.
        let n = self.charged.load(Relaxed);
        let due = n > 0 && n.saturating_mul(ppm) / PPM > (n - 1).saturating_mul(ppm) / PPM;
        if due && !budget.withdraw_at(now) {
            budget.refund_at(now);
            return None;
        }
        self.charged.fetch_add(1, Relaxed);
        Some(Charge {
            at: now,
            tokens: 1 + u8::from(due),
            counted: true,
        })
    }

    /// Gives back a charge for a hedge that was not sent.
    pub(crate) fn refund(&self, budget: &RetryBudget, charge: Charge) {
        for _ in 0..charge.tokens {
            budget.refund_at(charge.at);
        }
        if charge.counted {
            let _ = self
                .charged
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
        }
    }

    #[inline]
    pub(crate) fn count_request(&self) {
        self.requests[stripe_index()].0.fetch_add(1, Relaxed);
    }

    pub(crate) fn count_hedge(&self) {
        self.hedges.fetch_add(1, Relaxed);
    }

    pub(crate) fn count_won(&self) {
        self.won.fetch_add(1, Relaxed);
    }

    pub(crate) fn count_cancelled(&self, n: u64) {
        if n > 0 {
            self.cancelled.fetch_add(n, Relaxed);
        }
    }

    pub(crate) fn count_refusal(&self, refusal: Refusal) {
        let counter = match refusal {
            Refusal::Budget => &self.refused_by_budget,
            Refusal::Breaker => &self.refused_by_breaker,
            Refusal::Deadline => &self.refused_by_deadline,
            Refusal::Pushback => &self.refused_by_pushback,
            Refusal::Other => return,
        };
        counter.fetch_add(1, Relaxed);
    }

    /// The counters so far.
    pub(crate) fn counters(&self) -> HedgeCounters {
        HedgeCounters {
            requests: self.requests.iter().map(|s| s.0.load(Relaxed)).sum(),
            hedges: self.hedges.load(Relaxed),
            hedges_won: self.won.load(Relaxed),
            refused_by_budget: self.refused_by_budget.load(Relaxed),
            refused_by_breaker: self.refused_by_breaker.load(Relaxed),
            refused_by_deadline: self.refused_by_deadline.load(Relaxed),
            refused_by_pushback: self.refused_by_pushback.load(Relaxed),
            cancelled: self.cancelled.load(Relaxed),
        }
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("learns", &self.learns())
            .field("counters", &self.counters())
            .finish_non_exhaustive()
    }
}

// === impl Refusal ===

impl Refusal {
    /// A label for events.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Refusal::Budget => "retry budget",
            Refusal::Breaker => "attempt hook",
            Refusal::Deadline => "deadline",
            Refusal::Pushback => "pushback",
            Refusal::Other => "limit",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charging(ratio: f64) -> Charging {
        Charging {
            counts_requests: false,
            surcharge_ppm: Some((ratio * PPM as f64).round() as u64),
        }
    }

    fn config() -> Config {
        crate::hedge::HedgeLayer::new().config().clone()
    }

    // With the retry layer below counting each hedge as a request, n
    // hedges cost n + floor(n * ratio) tokens: hedges plus retries stay
    // within the share of the callers' requests.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn surcharge_keeps_the_share_of_callers_requests() {
        let now = Instant::now();
        let budget = RetryBudget::new().ratio(0.1).min_per_sec(0);
        let state = State::new(&config());
        let callers = 1_000;
        (0..callers).for_each(|_| budget.deposit_at(now));
        let mut hedges = 0;
        while state.charge(charging(0.1), &budget, now).is_some() {
            // The retry layer below counts the hedge as a request.
            budget.deposit_at(now);
            hedges += 1;
        }
        assert_eq!(hedges, 100, "10% of the callers' requests, not of 1,100");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn refunds_give_back_every_token() {
        let now = Instant::now();
        let budget = RetryBudget::new().ratio(0.5).min_per_sec(0);
        (0..8).for_each(|_| budget.deposit_at(now));
        let state = State::new(&config());
        let charges: Vec<_> = (0..3)
            .map(|_| state.charge(charging(0.5), &budget, now).unwrap())
            .collect();
        let tokens: Vec<_> = charges.iter().map(|c| c.tokens).collect();
        assert_eq!(tokens, [1, 1, 2], "the third hedge carries the surcharge");
        assert!(state.charge(charging(0.5), &budget, now).is_none());
        charges.into_iter().for_each(|c| state.refund(&budget, c));
        assert_eq!(budget.counters().retries, 0);
        assert_eq!(state.charged.load(Relaxed), 0);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_pause_only_grows() {
        let state = State::new(&config());
        let now = Instant::now();
        assert!(!state.paused(now));
        state.pause_until(now + Duration::from_secs(2));
        state.pause_until(now + Duration::from_secs(1));
        assert!(state.paused(now + Duration::from_millis(1_999)));
        assert!(!state.paused(now + Duration::from_secs(2)));
    }
}
