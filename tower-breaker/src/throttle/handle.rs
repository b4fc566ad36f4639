//! The shared state of a throttle: its window, its rule and its figures.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower_resilience_base::clock::CoarseClock;
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::error::Throttled;
use tower_resilience_base::outcome::Outcome;
use tower_resilience_base::random::{unit, ProcessRandom, RandomSource};
use tower_resilience_base::stripe::thread_index;

use super::config::{ThrottleConfig, ThrottleConfigError, BUCKETS, STRIPES};
use super::metrics::ThrottleMetrics;
use super::window::{Sums, Window};
use tower_resilience_base::Name;

/// The bit of a permit's tag that says it was recorded.
const RECORDED: u64 = 1 << 5;

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
/// Clones share everything (two `Arc`s).
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
    core: Arc<Core>,
    /// Handles on the core, one per thread stripe, each alone on its cache
    /// lines: a call's permit holds one, so the reference counts that
    /// every call touches are not shared between threads.
    shards: Arc<[Arc<Shard>]>,
}

#[repr(align(128))]
struct Shard {
    core: Arc<Core>,
    /// This stripe's own copy of the name, for the errors of the calls it
    /// rejects: the same `&'static str` (no reference count), or a shared
    /// string of its own (its own reference count).
    name: Name,
    /// The rejections made on this stripe, by criticality (summed by
    /// [`ThrottleHandle::snapshot`]): under overload every thread rejects,
    /// and one shared counter would make each wait for the others.
    rejected: [AtomicU64; 4],
}

/// The right to make one call, given by
/// [`ThrottleHandle::try_acquire`]: say how it went with
/// [`record`](Self::record). The request counts as accepted from the
/// moment the permit is given until it is recorded otherwise: a call in
/// flight has not been refused. A permit dropped without a record counts
/// as a request the dependency did not accept (a call the caller gave up
/// on is congestion, not nothing).
#[must_use = "a permit counts as not accepted unless recorded"]
pub struct ThrottlePermit {
    shard: Arc<Shard>,
    /// `epoch << 8 | recorded << 5 | stripe << 2 | criticality`: the
    /// bucket the request was counted in, whether its outcome was
    /// recorded, the stripe it was counted on and its criticality (one
    /// word, so that a response future carrying a permit stays small).
    tag: u64,
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
    /// Requests in the window that the dependency accepted, or that are
    /// still in flight (a request counts as accepted until it fails, is
    /// cut or is dropped).
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

struct Core {
    name: Name,
    /// The settings as last set ([`ThrottleHandle::reconfigure`]).
    config: std::sync::Mutex<ThrottleConfig>,
    /// The rule's settings, changeable while the throttle runs.
    rules: LiveRules,
    /// `2^64 / bucket width in ns`, rounded down: a bucket's epoch is a
    /// multiplication and a shift, not a division (tens of cycles).
    per_bucket: u64,
    base: Instant,
    /// The coarse clock and where its origin lies from `base`, when
    /// configured ([`ThrottleConfig::coarse_clock`]): a reading is then one
    /// atomic load.
    coarse: Option<(&'static CoarseClock, i64)>,
    window: Window,
    random: Arc<dyn RandomSource>,
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
    ///
    /// A name written in the source (a `&'static str`) goes into every
    /// rejection without a reference count (see [`Name`]).
    pub fn new(name: impl Into<Name>) -> Self {
        Self::build(name.into(), ThrottleConfig::new())
    }

    /// A throttle named `name` with `config`.
    ///
    /// # Errors
    ///
    /// A [`ThrottleConfigError`] when a setting is out of range
    /// ([`ThrottleConfig::validate`]).
    pub fn try_with_config(
        name: impl Into<Name>,
        config: ThrottleConfig,
    ) -> Result<Self, ThrottleConfigError> {
        config.validate()?;
        Ok(Self::build(name.into(), config))
    }

    /// A throttle with `config` brought into range.
    pub(crate) fn clamped(name: Name, config: ThrottleConfig) -> Self {
        Self::build(name, config.clamped())
    }

    fn build(name: Name, config: ThrottleConfig) -> Self {
        let width_ns = (config.window.as_nanos() / BUCKETS as u128).max(1) as u64;
        let random = config
            .random
            .clone()
            .unwrap_or_else(|| Arc::new(ProcessRandom::new()));
        let base = Instant::now();
        let coarse = config
            .coarse_clock
            .map(|clock| (clock, clock.offset_from(base)));
        let core = Core {
            metrics: ThrottleMetrics::new(&name),
            name: name.clone(),
            rules: LiveRules::new(&Rules::of(&config)),
            per_bucket: u64::MAX / width_ns,
            base,
            coarse,
            window: Window::new(config.ks()[0]),
            random,
            announced: AtomicBool::new(false),
            next_event_ns: AtomicU64::new(0),
            config: std::sync::Mutex::new(config),
        };
        let core = Arc::new(core);
        let shards = (0..STRIPES)
            .map(|_| {
                Arc::new(Shard {
                    core: Arc::clone(&core),
                    name: name.unshared(),
                    rejected: Default::default(),
                })
            })
            .collect();
        Self { core, shards }
    }

    /// The throttle's name (in its errors, events and metrics).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The name as given (static or shared), for a rebuilt throttle.
    pub(crate) fn name_handle(&self) -> &Name {
        &self.core.name
    }

    /// Its settings: those it was built with, as changed since by
    /// [`reconfigure`](Self::reconfigure).
    pub fn config(&self) -> ThrottleConfig {
        self.core
            .config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Applies `config` to the running throttle, keeping its window (the
    /// requests and refusals counted): the Ks, `max_rejection` and
    /// `min_requests` apply at once, all together (a judgement never mixes
    /// the old and the new). The window's length, the random source and
    /// the clock ([`ThrottleConfig::coarse_clock`]) cannot change on a
    /// running throttle; they keep their old values and are named in the
    /// returned list (the clock only when it differs).
    ///
    /// # Errors
    ///
    /// A [`ThrottleConfigError`] for an invalid `config`; nothing changes
    /// then.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_breaker::throttle::{ThrottleConfig, ThrottleHandle};
    ///
    /// let throttle = ThrottleHandle::new("search");
    /// let not_live = throttle.reconfigure(
    ///     ThrottleConfig::new().k(3.0).window(Duration::from_secs(30)),
    /// )?;
    /// assert_eq!(not_live, ["window"]);
    /// assert_eq!(throttle.config().get_k(Default::default()), 3.0);
    /// # Ok::<(), tower_breaker::throttle::ThrottleConfigError>(())
    /// ```
    pub fn reconfigure(
        &self,
        config: ThrottleConfig,
    ) -> Result<Vec<&'static str>, ThrottleConfigError> {
        config.validate()?;
        let core = &*self.core;
        let mut current = core
            .config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut not_live = Vec::new();
        let mut effective = config;
        if effective.window != current.window {
            effective.window = current.window;
            not_live.push("window");
        }
        if effective.random.is_some() {
            not_live.push("random");
        }
        effective.random.clone_from(&current.random);
        if effective.coarse_clock.is_some() != current.coarse_clock.is_some() {
            effective.coarse_clock = current.coarse_clock;
            not_live.push("coarse_clock");
        }
        let rules = Rules::of(&effective);
        core.rules.set(&rules);
        core.window.set_k0(rules.ks[0]);
        *current = effective;
        Ok(not_live)
    }

    /// Asks to make one call of `criticality`: counts a request, and
    /// rejects it with the rule's probability for that criticality.
    ///
    /// # Errors
    ///
    /// [`Throttled`] when the draw rejects the call (a local rejection:
    /// the call must not be made).
    pub fn try_acquire(&self, criticality: Criticality) -> Result<ThrottlePermit, Throttled> {
        let stripe = thread_index() % STRIPES;
        let shard = &self.shards[stripe];
        let epoch = self.core.admit(criticality, stripe, shard)?;
        Ok(ThrottlePermit {
            shard: Arc::clone(shard),
            tag: epoch << 8 | (stripe as u64) << 2 | criticality.index() as u64,
        })
    }

    /// The probability with which the next request of `criticality` would
    /// be rejected.
    #[must_use]
    pub fn rejection_probability(&self, criticality: Criticality) -> f64 {
        let sums = self.core.window.sums(self.core.epoch_now());
        self.core.probabilities(&self.core.rules.get(), &sums)[criticality.index()]
    }

    /// The figures now: the window's requests and accepts, the rejection
    /// probability of each criticality, and the rejections so far.
    #[must_use]
    pub fn snapshot(&self) -> ThrottleSnapshot {
        let core = &self.core;
        let sums = core.window.sums(core.epoch_now());
        let probabilities = core.probabilities(&core.rules.get(), &sums);
        let rejected_by_criticality: [u64; 4] = std::array::from_fn(|c| {
            self.shards
                .iter()
                .map(|shard| shard.rejected[c].load(Relaxed))
                .sum()
        });
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
            .field("config", &self.config())
            .finish_non_exhaustive()
    }
}

// === impl ThrottlePermit ===

impl ThrottlePermit {
    /// Counts how the call went: a [`Success`](Outcome::Success) leaves
    /// the request accepted (as it counted from the start); a
    /// [`Failure`](Outcome::Failure) refuses it;
    /// [`Ignored`](Outcome::Ignored) (a layer below refused the call
    /// locally: the dependency never saw it) takes the request back.
    pub fn record(mut self, outcome: Outcome) {
        let core = &self.shard.core;
        let epoch = self.tag >> 8;
        let c = (self.tag & 3) as usize;
        let stripe = (self.tag >> 2 & 7) as usize;
        match outcome {
            // Counted as accepted from the start: nothing to write.
            Outcome::Success => core.metrics.accept(),
            Outcome::Failure => core.window.refuse(epoch, c, stripe),
            Outcome::Ignored => core.window.forget(epoch, c, stripe),
        }
        self.tag |= RECORDED;
    }
}

impl Drop for ThrottlePermit {
    /// A permit dropped without a record: the caller gave up on the call
    /// (its deadline, or it was cancelled), which counts as a refusal.
    fn drop(&mut self) {
        if self.tag & RECORDED == 0 {
            let epoch = self.tag >> 8;
            let c = (self.tag & 3) as usize;
            let stripe = (self.tag >> 2 & 7) as usize;
            self.shard.core.window.refuse(epoch, c, stripe);
        }
    }
}

impl fmt::Debug for ThrottlePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottlePermit")
            .field("throttle", &&*self.shard.name)
            .finish_non_exhaustive()
    }
}

// === impl Core ===

impl Core {
    /// Nanoseconds since `base` for a request being made: the coarse
    /// clock's reading when configured (cheaper than looking for one in
    /// the call's context), else the reading a layer above made for the
    /// call, else tokio's clock.
    #[inline]
    fn now_ns(&self) -> u64 {
        self.coarse_ns()
            .unwrap_or_else(|| crate::sync::call_since(self.base).as_nanos() as u64)
    }

    /// Nanoseconds since `base` by the coarse clock, when configured.
    #[inline]
    fn coarse_ns(&self) -> Option<u64> {
        self.coarse.map(|(clock, offset)| clock.nanos_since(offset))
    }

    /// The bucket of the time `ns` (since `base`): about `ns / width`, by a
    /// multiplication. Each bucket's start is read a little late (by
    /// `ns * width / 2^64`: under 4 ms after a year with 2 s buckets),
    /// which is harmless, since every reading goes through this one
    /// function and it never goes backwards.
    #[inline]
    fn epoch(&self, ns: u64) -> u64 {
        ((u128::from(ns) * u128::from(self.per_bucket)) >> 64) as u64
    }

    fn epoch_now(&self) -> u64 {
        let ns = self
            .coarse_ns()
            .unwrap_or_else(|| crate::sync::since(self.base).as_nanos() as u64);
        self.epoch(ns)
    }

    /// Each criticality's rejection probability: its own K's rule on the
    /// requests and accepts of that criticality and the ones above it,
    /// never above the probability of a less critical one.
    fn probabilities(&self, rules: &Rules, sums: &Sums) -> [f64; 4] {
        let mut requests: u64 = sums.requests.iter().sum();
        let mut accepts: u64 = sums.accepts.iter().sum();
        let mut ceiling = f64::INFINITY;
        let mut p = [0.0; 4];
        for (c, p) in p.iter_mut().enumerate() {
            ceiling = ceiling.min(rules.rule(rules.ks[c], requests, accepts));
            *p = ceiling;
            requests -= sums.requests[c];
            accepts -= sums.accepts[c];
        }
        p
    }

    /// Counts a request of `criticality` on `stripe` and draws its fate;
    /// the epoch it was counted at. `shard` is the stripe's: its copy of
    /// the name for the error, and its count of rejections.
    #[inline]
    fn admit(
        &self,
        criticality: Criticality,
        stripe: usize,
        shard: &Shard,
    ) -> Result<u64, Throttled> {
        let c = criticality.index();
        let now = self.now_ns();
        let counted = self.window.request(self.epoch(now), c, stripe);
        let (epoch, moved) = (counted.epoch, counted.moved);
        self.metrics.request();
        if counted.quiet {
            // Within the margin: the rule is zero for every criticality.
            if moved || self.announced.load(Relaxed) {
                self.quiet(now, moved);
            }
            return Ok(epoch);
        }
        self.judge(criticality, counted, stripe, now, shard)
    }

    /// The rule, for a request that the margin does not admit.
    fn judge(
        &self,
        criticality: Criticality,
        counted: super::window::Counted,
        stripe: usize,
        now: u64,
        shard: &Shard,
    ) -> Result<u64, Throttled> {
        let c = criticality.index();
        let (epoch, moved) = (counted.epoch, counted.moved);
        let sums = self.window.seen(counted, c, stripe);
        // The least critical requests' rule, on every request, rejects
        // first: nothing to draw while it does not.
        let requests = sums.requests.iter().sum();
        let accepts = sums.accepts.iter().sum();
        let rules = self.rules.get();
        if rules.rule(rules.ks[0], requests, accepts) <= 0.0 {
            if moved || self.announced.load(Relaxed) {
                self.quiet(now, moved);
            }
            return Ok(epoch);
        }
        let p = self.probabilities(&rules, &sums);
        if moved {
            self.metrics.probability(p[Criticality::Critical.index()]);
        }
        let p = p[c];
        if p > 0.0 && unit(&*self.random) < p {
            // A request the dependency did not accept: it never got it.
            self.window.refuse(epoch, c, stripe);
            shard.rejected[c].fetch_add(1, Relaxed);
            self.metrics.rejected(criticality);
            if !self.announced.load(Relaxed) {
                self.announce(true, now, &sums);
            }
            return Err(Throttled::new(shard.name.clone(), p));
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
                .compare_exchange(
                    next,
                    now + EVENT_INTERVAL.as_nanos() as u64,
                    Relaxed,
                    Relaxed,
                )
                .is_err()
            || self
                .announced
                .compare_exchange(!throttling, throttling, Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        if throttling {
            let p = self.probabilities(&self.rules.get(), sums);
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

/// The rule's settings, in the units `judge` uses.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rules {
    /// Each criticality's K, ordered (`ks[0]` is the smallest).
    ks: [f64; 4],
    max_rejection: f64,
    min_requests: u64,
}

impl Rules {
    fn of(config: &ThrottleConfig) -> Self {
        Self {
            ks: config.ks(),
            max_rejection: config.max_rejection,
            min_requests: config.min_requests,
        }
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
}

/// [`Rules`] as words behind a sequence lock
/// ([`SeqWords`](tower_resilience_base::seq::SeqWords)): a judgement
/// reads one configuration, never half of two.
#[derive(Debug)]
struct LiveRules(tower_resilience_base::seq::SeqWords<6>);

impl LiveRules {
    fn encode(r: &Rules) -> [u64; 6] {
        [
            r.ks[0].to_bits(),
            r.ks[1].to_bits(),
            r.ks[2].to_bits(),
            r.ks[3].to_bits(),
            r.max_rejection.to_bits(),
            r.min_requests,
        ]
    }

    fn new(r: &Rules) -> Self {
        Self(tower_resilience_base::seq::SeqWords::new(Self::encode(r)))
    }

    fn get(&self) -> Rules {
        let w = self.0.get();
        Rules {
            ks: [
                f64::from_bits(w[0]),
                f64::from_bits(w[1]),
                f64::from_bits(w[2]),
                f64::from_bits(w[3]),
            ],
            max_rejection: f64::from_bits(w[4]),
            min_requests: w[5],
        }
    }

    fn set(&self, r: &Rules) {
        self.0.set(Self::encode(r));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_resilience_base::random::SeededRandom;

    /// A throttle named "search" with seeded draws and `config`'s other
    /// settings.
    fn seeded(config: ThrottleConfig) -> ThrottleHandle {
        ThrottleHandle::try_with_config("search", config.random(Arc::new(SeededRandom::new(7))))
            .expect("valid settings")
    }

    /// Calls until the dependency's refusals get one rejected (within
    /// 10,000 calls: a throttle that never rejects fails the test, it does
    /// not hang it).
    fn refuse_until_rejected(throttle: &ThrottleHandle) {
        for _ in 0..10_000 {
            match throttle.try_acquire(Criticality::Critical) {
                Ok(permit) => permit.record(Outcome::Failure),
                Err(_) => return,
            }
        }
        panic!(
            "10,000 refusals and no rejection: {:?}",
            throttle.snapshot()
        );
    }

    /// Calls that succeed until no criticality would be rejected (within
    /// 10,000 calls).
    fn succeed_until_quiet(throttle: &ThrottleHandle) {
        for _ in 0..10_000 {
            if !throttle.snapshot().throttling {
                return;
            }
            if let Ok(permit) = throttle.try_acquire(Criticality::Critical) {
                permit.record(Outcome::Success);
            }
        }
        panic!(
            "10,000 successes and still throttling: {:?}",
            throttle.snapshot()
        );
    }

    #[test]
    fn the_handle_and_its_permits_name_the_throttle() {
        let throttle = seeded(ThrottleConfig::new().k(3.0));
        assert_eq!(throttle.name(), "search");
        assert_eq!(throttle.config().get_k(Criticality::Critical), 3.0);
        let shown = format!("{throttle:?}");
        assert!(
            shown.starts_with("ThrottleHandle")
                && shown.contains("\"search\"")
                && shown.contains("k: [2.25, 2.625, 3.0, 3.0]"),
            "{shown}"
        );
        let permit = throttle
            .try_acquire(Criticality::Critical)
            .expect("healthy");
        let shown = format!("{permit:?}");
        assert!(
            shown.starts_with("ThrottlePermit") && shown.contains("\"search\""),
            "{shown}"
        );
        permit.record(Outcome::Success);
    }

    /// Each thread counts its rejections on its own stripe; the snapshot
    /// adds them up, each once and under its criticality, from more
    /// threads than stripes.
    #[test]
    fn rejections_from_many_threads_are_each_counted_once() {
        let throttle = seeded(ThrottleConfig::new());
        refuse_until_rejected(&throttle);
        let before = throttle.snapshot().rejected_by_criticality;
        let counted: Vec<[u64; 4]> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..12)
                .map(|i| {
                    let throttle = &throttle;
                    scope.spawn(move || {
                        let criticality = Criticality::ALL[i % 4];
                        let mut rejected = [0; 4];
                        for _ in 0..500 {
                            match throttle.try_acquire(criticality) {
                                Ok(permit) => permit.record(Outcome::Failure),
                                Err(_) => rejected[criticality.index()] += 1,
                            }
                        }
                        rejected
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut expected = before;
        for rejected in &counted {
            for (total, n) in expected.iter_mut().zip(rejected) {
                *total += n;
            }
        }
        let snapshot = throttle.snapshot();
        assert!(expected.iter().all(|&n| n > 0), "{expected:?}");
        assert_eq!(snapshot.rejected_by_criticality, expected);
        assert_eq!(snapshot.rejected, expected.iter().sum::<u64>());
    }

    /// Every thread gets one of the handle's stripes, however many threads
    /// the process has run (more than 64 here), and a permit dropped
    /// without a record takes its accept back on whichever stripe it was
    /// counted.
    #[test]
    fn permits_dropped_on_many_threads_are_all_refused() {
        // Nothing rejected below 1,000 requests: every call gets a permit.
        let throttle = seeded(ThrottleConfig::new().min_requests(1_000));
        let threads: Vec<_> = (0..80)
            .map(|i| {
                let throttle = throttle.clone();
                std::thread::spawn(move || {
                    let permit = throttle
                        .try_acquire(Criticality::ALL[i % 4])
                        .expect("below min_requests");
                    drop(permit);
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("a stripe of the handle's");
        }
        let s = throttle.snapshot();
        assert_eq!(s.requests_by_criticality, [20; 4], "{s:?}");
        assert_eq!(s.accepts_by_criticality, [0; 4], "{s:?}");
    }

    /// Each criticality's probability is its own K's rule on its own
    /// requests and accepts and those of the criticalities above it, never
    /// above a less critical one's.
    #[test]
    fn each_criticality_is_judged_on_itself_and_those_above() {
        let throttle = seeded(ThrottleConfig::new());
        let rules = Rules {
            ks: [1.1, 1.5, 2.0, 3.0],
            max_rejection: 0.9,
            min_requests: 0,
        };
        let sums = Sums {
            requests: [100, 50, 30, 20],
            accepts: [0, 10, 30, 20],
        };
        // Sheddable: (200 - 1.1 × 60) / 201; SheddablePlus: (100 - 1.5 ×
        // 60) / 101; Critical: 50 requests, 50 accepts; CriticalPlus: 20
        // and 20.
        let expected = [134.0 / 201.0, 10.0 / 101.0, 0.0, 0.0];
        let got = throttle.core.probabilities(&rules, &sums);
        for (p, e) in got.iter().zip(expected) {
            assert!((p - e).abs() < 1e-12, "{got:?} against {expected:?}");
        }
        // Accepts at every criticality: each one's sums leave out exactly
        // those of the less critical ones. Sheddable: (200 − 1.1 × 30) /
        // 201; SheddablePlus: (100 − 1.5 × 20) / 101; Critical: (50 − 2 ×
        // 10) / 51; CriticalPlus: (20 − 3 × 5) / 21.
        let sums = Sums {
            requests: [100, 50, 30, 20],
            accepts: [10, 10, 5, 5],
        };
        let expected = [167.0 / 201.0, 70.0 / 101.0, 30.0 / 51.0, 5.0 / 21.0];
        let got = throttle.core.probabilities(&rules, &sums);
        for (p, e) in got.iter().zip(expected) {
            assert!((p - e).abs() < 1e-12, "{got:?} against {expected:?}");
        }
    }

    /// Every draw the same number.
    #[derive(Debug)]
    struct Fixed(u64);

    impl RandomSource for Fixed {
        fn next_u64(&self) -> u64 {
            self.0
        }
    }

    /// A request is rejected when its draw, uniform in `[0, 1)`, falls
    /// below the probability: a draw equal to it is admitted, one just
    /// below it is not.
    #[test]
    fn a_draw_rejects_only_below_the_probability() {
        let with_draw = |x: u64| {
            let config = ThrottleConfig::new()
                .min_requests(1)
                .max_rejection(0.5)
                .random(Arc::new(Fixed(x)));
            ThrottleHandle::try_with_config("search", config).expect("valid settings")
        };
        // A draw of exactly 0.5, against a probability capped at 0.5.
        let at_the_cap = with_draw(1 << 63);
        for _ in 0..100 {
            at_the_cap
                .try_acquire(Criticality::Critical)
                .expect("a draw equal to the probability is admitted")
                .record(Outcome::Failure);
        }
        assert_eq!(at_the_cap.rejection_probability(Criticality::Critical), 0.5);
        // One step of 2^-53 below it.
        let below = with_draw((1 << 63) - (1 << 11));
        refuse_until_rejected(&below);
        assert_eq!(below.snapshot().rejected, 1);
    }

    #[test]
    fn a_snapshot_says_throttling_only_while_something_would_be_rejected() {
        let throttle = seeded(ThrottleConfig::new().min_requests(1));
        throttle
            .try_acquire(Criticality::Critical)
            .expect("healthy")
            .record(Outcome::Success);
        let healthy = throttle.snapshot();
        assert_eq!(healthy.probabilities, [0.0; 4]);
        assert!(!healthy.throttling, "{healthy:?}");
        refuse_until_rejected(&throttle);
        let failing = throttle.snapshot();
        assert!(failing.throttling, "{failing:?}");
    }

    /// Throttling that stops within a bucket is told by the first call
    /// after the event interval, to the nanosecond, not when the window
    /// next moves.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_stop_is_told_when_the_interval_ends() {
        // One-second buckets.
        let throttle = seeded(
            ThrottleConfig::new()
                .window(Duration::from_secs(60))
                .min_requests(1),
        );
        let announced = || throttle.core.announced.load(Relaxed);
        // At 0 the dependency refuses: throttling starts, told at 0.
        refuse_until_rejected(&throttle);
        assert!(announced());
        // Still at 0, it accepts again; the news waits for the interval.
        succeed_until_quiet(&throttle);
        assert!(announced());
        let success = || {
            throttle
                .try_acquire(Criticality::Critical)
                .expect("quiet")
                .record(Outcome::Success);
        };
        tokio::time::advance(EVENT_INTERVAL - Duration::from_nanos(1)).await;
        success();
        assert!(announced(), "a nanosecond early");
        tokio::time::advance(Duration::from_nanos(1)).await;
        success();
        assert!(!announced(), "told once the interval is over");
    }

    /// The same when the window moved in between: the call that moved it
    /// came too early to tell, and the next call, in the new bucket, tells.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_stop_is_told_by_a_call_after_the_window_moved() {
        let throttle = seeded(
            ThrottleConfig::new()
                .window(Duration::from_secs(60))
                .min_requests(1),
        );
        let announced = || throttle.core.announced.load(Relaxed);
        let success = || {
            throttle
                .try_acquire(Criticality::Critical)
                .expect("quiet")
                .record(Outcome::Success);
        };
        // Throttling starts half-way through the first bucket (told at
        // 0.5 s), and stops at once.
        tokio::time::advance(Duration::from_millis(500)).await;
        refuse_until_rejected(&throttle);
        succeed_until_quiet(&throttle);
        // 1.1 s: this call moves the window, within the interval.
        tokio::time::advance(Duration::from_millis(600)).await;
        success();
        assert!(announced(), "within the interval");
        // 1.6 s: same bucket, interval over.
        tokio::time::advance(Duration::from_millis(500)).await;
        success();
        assert!(!announced(), "told by the first call after the interval");
    }

    /// On the coarse clock, the window slides as that clock moves and not
    /// as tokio's (paused) clock does: refusals keep the throttle
    /// rejecting through a paused minute, and leave the window when the
    /// coarse clock has moved a window on.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn on_the_coarse_clock_the_window_slides_with_that_clock() {
        let clock = CoarseClock::manual();
        let mut config = ThrottleConfig::new()
            .window(Duration::from_secs(60))
            .min_requests(1);
        config.coarse_clock = Some(clock);
        let throttle = seeded(config);
        assert!(throttle.config().get_coarse_clock());
        let (_, offset) = throttle.core.coarse.expect("configured");
        // The throttle's time 0 is its creation: `-offset` after the
        // clock's origin when that is later (the paused clock stopped
        // before the clock was made, so it may be earlier).
        clock.advance(Duration::from_nanos(u64::try_from(-offset).unwrap_or(0)));
        refuse_until_rejected(&throttle);
        assert!(throttle.snapshot().throttling);
        tokio::time::advance(Duration::from_secs(600)).await;
        let paused = throttle.snapshot();
        assert!(
            paused.throttling && paused.requests > 0,
            "tokio's clock does not move the window: {paused:?}"
        );
        // A request now is counted in the same window, by the coarse clock.
        if let Ok(permit) = throttle.try_acquire(Criticality::Critical) {
            permit.record(Outcome::Failure);
        }
        assert_eq!(throttle.snapshot().requests, paused.requests + 1);
        clock.advance(Duration::from_secs(61));
        let moved = throttle.snapshot();
        assert_eq!(
            (moved.requests, moved.throttling),
            (0, false),
            "a window later on the coarse clock: {moved:?}"
        );
        let permit = throttle
            .try_acquire(Criticality::Sheddable)
            .expect("nothing left to judge by");
        permit.record(Outcome::Success);
        assert_eq!(throttle.snapshot().requests, 1);
    }

    /// The clock is not live: a reconfiguration keeps it and says so.
    #[test]
    fn the_clock_is_kept_by_a_reconfiguration_and_named() {
        let throttle = seeded(ThrottleConfig::new());
        let not_live = throttle
            .reconfigure(ThrottleConfig::new().coarse_clock(true))
            .expect("valid");
        if CoarseClock::shared().is_some() {
            assert_eq!(not_live, ["coarse_clock"]);
        }
        assert!(!throttle.config().get_coarse_clock());
        assert!(throttle.core.coarse.is_none());
        let not_live = throttle.reconfigure(ThrottleConfig::new()).expect("valid");
        assert!(not_live.is_empty(), "{not_live:?}");
    }
}
