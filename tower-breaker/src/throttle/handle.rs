//! The shared state of a throttle: its window, its rule and its figures.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::error::Throttled;
use tower_resilience_base::outcome::Outcome;
use tower_resilience_base::random::{unit, ProcessRandom, RandomSource};

use super::config::{ThrottleConfig, ThrottleConfigError, BUCKETS};
use super::metrics::ThrottleMetrics;
use super::window::{Sums, Window};

/// The least time between two `throttling_started` / `throttling_stopped`
/// events of one throttle.
const EVENT_INTERVAL: Duration = Duration::from_secs(1);

/// A throttle: the window of requests and accepts, the rule that turns
/// them into a rejection probability, and the figures; shared by every
/// service built from it.
///
/// Build one per dependency and hand it to a
/// [`ThrottleLayer`](super::ThrottleLayer) (or let the layer build it, and
/// read it back with [`ThrottleLayer::handle`](super::ThrottleLayer::handle)).
/// It also works without a service: [`try_acquire`](Self::try_acquire)
/// before a call, [`ThrottlePermit::record`] after it.
///
/// # Clone
///
/// Clones share everything (one `Arc`).
///
/// # Example
///
/// ```
/// use tower_breaker::throttle::ThrottleHandle;
/// use tower_breaker::Outcome;
/// use tower_resilience_base::criticality::Criticality;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let throttle = ThrottleHandle::new("search");
/// for _ in 0..20 {
///     let permit = throttle.try_acquire(Criticality::Critical).expect("healthy: never throttled");
///     permit.record(Outcome::Success);
/// }
/// let snapshot = throttle.snapshot();
/// assert_eq!((snapshot.requests, snapshot.accepts), (20, 20));
/// assert_eq!(snapshot.rejection_probability, 0.0);
/// # }
/// ```
#[derive(Clone)]
pub struct ThrottleHandle {
    pub(crate) core: Arc<Core>,
}

/// The right to make one call, given by
/// [`ThrottleHandle::try_acquire`]: say how it went with
/// [`record`](Self::record). A permit dropped without a record counts as a
/// request the dependency did not accept (a call the caller gave up on is
/// congestion, not nothing).
#[must_use = "a permit counts as not accepted unless recorded"]
pub struct ThrottlePermit {
    core: Arc<Core>,
    epoch: u64,
    criticality: usize,
}

/// The figures of a throttle at one moment; see
/// [`ThrottleHandle::snapshot`].
///
/// The window's figures are exact: every request and accept counted in the
/// buckets the window covers now.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ThrottleSnapshot {
    /// Requests in the window: every call that reached the throttle,
    /// rejected ones included (as the SRE book counts them), less those a
    /// layer below refused locally.
    pub requests: u64,
    /// Requests in the window that the dependency accepted.
    pub accepts: u64,
    /// [`requests`](Self::requests) by criticality
    /// ([`Criticality::index`]).
    pub requests_by_criticality: [u64; 4],
    /// [`accepts`](Self::accepts) by criticality
    /// ([`Criticality::index`]).
    pub accepts_by_criticality: [u64; 4],
    /// The probability with which the next `Critical` request is rejected.
    pub rejection_probability: f64,
    /// The probability with which the next request of each criticality is
    /// rejected, indexed by [`Criticality::index`].
    pub probabilities: [f64; 4],
    /// Requests rejected since the throttle was built.
    pub rejected: u64,
    /// Requests rejected since the throttle was built, by criticality
    /// ([`Criticality::index`]).
    pub rejected_by_criticality: [u64; 4],
    /// Whether the throttle would reject a share of some criticality now
    /// (the least critical one's probability is above zero).
    pub throttling: bool,
}

pub(crate) struct Core {
    name: Arc<str>,
    config: ThrottleConfig,
    /// Each criticality's K, ordered (`ks[0]` is the smallest).
    ks: [f64; 4],
    max_rejection: f64,
    min_requests: u64,
    width_ns: u64,
    base: Instant,
    window: Window,
    random: Arc<dyn RandomSource>,
    rejected: [AtomicU64; 4],
    /// Whether the last event said throttling started (true) or stopped.
    announced: AtomicBool,
    /// The earliest time (nanoseconds since `base`) of the next event.
    next_event_ns: AtomicU64,
    metrics: ThrottleMetrics,
}

// === impl ThrottleHandle ===

impl ThrottleHandle {
    /// A throttle named `name` with the default settings
    /// ([`ThrottleConfig::new`]: the SRE book's rule, K = 2 over two
    /// minutes, at most 90% rejected).
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self::build(name.into(), ThrottleConfig::new())
    }

    /// A throttle named `name` with `config`.
    ///
    /// # Errors
    ///
    /// A [`ThrottleConfigError`] when a setting is out of range
    /// ([`ThrottleConfig::validate`]).
    pub fn try_with_config(
        name: impl Into<Arc<str>>,
        config: ThrottleConfig,
    ) -> Result<Self, ThrottleConfigError> {
        config.validate()?;
        Ok(Self::build(name.into(), config))
    }

    /// A throttle with `config` brought into range.
    pub(crate) fn clamped(name: Arc<str>, config: ThrottleConfig) -> Self {
        Self::build(name, config.clamped())
    }

    fn build(name: Arc<str>, config: ThrottleConfig) -> Self {
        let width_ns = (config.window.as_nanos() / BUCKETS as u128).max(1) as u64;
        let random = config
            .random
            .clone()
            .unwrap_or_else(|| Arc::new(ProcessRandom::new()));
        let core = Core {
            metrics: ThrottleMetrics::new(&name),
            name,
            ks: config.ks(),
            max_rejection: config.max_rejection,
            min_requests: config.min_requests,
            width_ns,
            base: Instant::now(),
            window: Window::new(),
            random,
            rejected: Default::default(),
            announced: AtomicBool::new(false),
            next_event_ns: AtomicU64::new(0),
            config,
        };
        Self {
            core: Arc::new(core),
        }
    }

    /// The throttle's name (in its errors, events and metrics).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// Its settings.
    #[must_use]
    pub fn config(&self) -> &ThrottleConfig {
        &self.core.config
    }

    /// Asks to make one call of `criticality`: counts a request, and
    /// rejects it with the rule's probability for that criticality.
    ///
    /// # Errors
    ///
    /// [`Throttled`] when the draw rejects the call (a local rejection:
    /// the call must not be made).
    pub fn try_acquire(&self, criticality: Criticality) -> Result<ThrottlePermit, Throttled> {
        let epoch = self.core.admit(criticality)?;
        Ok(ThrottlePermit {
            core: Arc::clone(&self.core),
            epoch,
            criticality: criticality.index(),
        })
    }

    /// The probability with which the next request of `criticality` would
    /// be rejected.
    #[must_use]
    pub fn rejection_probability(&self, criticality: Criticality) -> f64 {
        let sums = self.core.window.sums(self.core.epoch_now());
        self.core.probabilities(&sums)[criticality.index()]
    }

    /// The figures now: the window's requests and accepts, the rejection
    /// probability of each criticality, and the rejections so far.
    #[must_use]
    pub fn snapshot(&self) -> ThrottleSnapshot {
        let core = &self.core;
        let sums = core.window.sums(core.epoch_now());
        let probabilities = core.probabilities(&sums);
        let rejected_by_criticality = core.rejected.each_ref().map(|n| n.load(Relaxed));
        ThrottleSnapshot {
            requests: sums.requests.iter().sum(),
            accepts: sums.accepts.iter().sum(),
            requests_by_criticality: sums.requests,
            accepts_by_criticality: sums.accepts,
            rejection_probability: probabilities[Criticality::Critical.index()],
            probabilities,
            rejected: rejected_by_criticality.iter().sum(),
            rejected_by_criticality,
            throttling: probabilities[0] > 0.0,
        }
    }
}

impl fmt::Debug for ThrottleHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleHandle")
            .field("name", &&*self.core.name)
            .field("config", &self.core.config)
            .finish_non_exhaustive()
    }
}

// === impl ThrottlePermit ===

impl ThrottlePermit {
    /// Counts how the call went: a [`Success`](Outcome::Success) is an
    /// accept; a [`Failure`](Outcome::Failure) leaves a request that was
    /// not accepted; [`Ignored`](Outcome::Ignored) (a layer below refused
    /// the call locally: the dependency never saw it) takes the request
    /// back.
    pub fn record(self, outcome: Outcome) {
        match outcome {
            Outcome::Success => {
                self.core.window.accept(self.epoch, self.criticality);
                self.core.metrics.accept();
            }
            Outcome::Failure => {}
            Outcome::Ignored => self.core.window.forget(self.epoch, self.criticality),
        }
    }
}

impl fmt::Debug for ThrottlePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottlePermit")
            .field("throttle", &&*self.core.name)
            .finish_non_exhaustive()
    }
}

// === impl Core ===

impl Core {
    #[inline]
    fn now_ns(&self) -> u64 {
        crate::sync::call_since(self.base).as_nanos() as u64
    }

    fn epoch_now(&self) -> u64 {
        crate::sync::since(self.base).as_nanos() as u64 / self.width_ns
    }

    /// The rule: `max(0, (requests - K * accepts) / (requests + 1))`, at
    /// most the cap, and zero below the least number of requests.
    #[inline]
    fn rule(&self, k: f64, requests: u64, accepts: u64) -> f64 {
        if requests < self.min_requests {
            return 0.0;
        }
        let r = requests as f64;
        let excess = r - k * accepts as f64;
        if excess <= 0.0 {
            0.0
        } else {
            (excess / (r + 1.0)).min(self.max_rejection)
        }
    }

    /// Each criticality's rejection probability: its own K's rule on the
    /// requests and accepts of that criticality and the ones above it,
    /// never above the probability of a less critical one.
    fn probabilities(&self, sums: &Sums) -> [f64; 4] {
        let mut requests: u64 = sums.requests.iter().sum();
        let mut accepts: u64 = sums.accepts.iter().sum();
        let mut ceiling = f64::INFINITY;
        let mut p = [0.0; 4];
        for c in 0..4 {
            ceiling = ceiling.min(self.rule(self.ks[c], requests, accepts));
            p[c] = ceiling;
            requests -= sums.requests[c];
            accepts -= sums.accepts[c];
        }
        p
    }

    /// Counts a request of `criticality` and draws its fate; the epoch it
    /// was counted at.
    #[inline]
    pub(crate) fn admit(&self, criticality: Criticality) -> Result<u64, Throttled> {
        let c = criticality.index();
        let now = self.now_ns();
        let (epoch, sums, moved) = self.window.request(now / self.width_ns, c);
        self.metrics.request();
        // The least critical requests' rule, on every request, rejects
        // first: nothing to draw while it does not.
        let requests = sums.requests.iter().sum();
        let accepts = sums.accepts.iter().sum();
        if self.rule(self.ks[0], requests, accepts) <= 0.0 {
            if moved || self.announced.load(Relaxed) {
                self.quiet(now, moved);
            }
            return Ok(epoch);
        }
        let p = self.probabilities(&sums);
        if moved {
            self.metrics.probability(p[Criticality::Critical.index()]);
        }
        let p = p[c];
        if p > 0.0 && unit(&*self.random) < p {
            self.rejected[c].fetch_add(1, Relaxed);
            self.metrics.rejected(criticality);
            if !self.announced.load(Relaxed) {
                self.announce(true, now, &sums);
            }
            return Err(Throttled::new(Arc::clone(&self.name), p));
        }
        Ok(epoch)
    }

    /// Nothing is throttled: the gauge says so when the window moves, and
    /// an event when throttling had been announced.
    #[cold]
    fn quiet(&self, now: u64, moved: bool) {
        if moved {
            self.metrics.probability(0.0);
        }
        if self.announced.load(Relaxed) {
            self.announce(false, now, &Sums::default());
        }
    }

    /// The events: throttling started (the first rejection after a quiet
    /// spell) or stopped (no criticality would be rejected any more); at
    /// most one per [`EVENT_INTERVAL`]; a change within it is told by the
    /// first call after it that sees it still.
    #[cold]
    fn announce(&self, throttling: bool, now: u64, sums: &Sums) {
        let next = self.next_event_ns.load(Relaxed);
        if now < next
            || self
                .next_event_ns
                .compare_exchange(next, now + EVENT_INTERVAL.as_nanos() as u64, Relaxed, Relaxed)
                .is_err()
            || self
                .announced
                .compare_exchange(!throttling, throttling, Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        if throttling {
            let p = self.probabilities(sums);
            self.metrics.probability(p[Criticality::Critical.index()]);
            tracing::warn!(
                throttle = %self.name,
                requests = sums.requests.iter().sum::<u64>(),
                accepts = sums.accepts.iter().sum::<u64>(),
                sheddable_probability = p[0],
                critical_probability = p[Criticality::Critical.index()],
                "throttling_started: the dependency accepts too few of the requests sent to it; \
                 rejecting a share of them locally"
            );
        } else {
            self.metrics.probability(0.0);
            tracing::info!(
                throttle = %self.name,
                "throttling_stopped: the dependency accepts enough requests again"
            );
        }
    }
}
