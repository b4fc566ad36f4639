//! The configuration of a [`Breaker`](crate::Breaker).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_resilience_base::clock::CoarseClock;

use crate::random::{ProcessRandom, RandomSource};
use crate::snapshot::{DebugListener, Listener};
use crate::store::{Store, StoreFailureMode};

/// The default count window: the last 20 calls.
pub const DEFAULT_WINDOW_SIZE: usize = 20;
/// The default least number of calls in the window before the rates are
/// judged: 10.
pub const DEFAULT_MINIMUM_CALLS: u32 = 10;
/// The default failure-rate threshold: 50%.
pub const DEFAULT_FAILURE_RATE: f64 = 0.5;
/// The default slow-call-rate threshold, once slow-call detection is on:
/// 50%.
pub const DEFAULT_SLOW_CALL_RATE: f64 = 0.5;
/// The default first open period: 5 s.
pub const DEFAULT_OPEN_PERIOD: Duration = Duration::from_secs(5);
/// The default cap of the growing open period: 60 s.
pub const DEFAULT_MAX_OPEN_PERIOD: Duration = Duration::from_secs(60);
/// The default growth of the open period on each re-open in a row: x2.
pub const DEFAULT_OPEN_GROWTH: f64 = 2.0;
/// The default jitter of the open period: ±10%.
pub const DEFAULT_JITTER: f64 = 0.1;
/// The default number of concurrent probes in half-open: 1.
pub const DEFAULT_PERMITTED_PROBES: u32 = 1;
/// The default number of probe successes in a row that close: 1.
pub const DEFAULT_SUCCESSES_TO_CLOSE: u32 = 1;
/// The default longest wait for probes to complete in half-open: 30 s.
pub const DEFAULT_MAX_HALF_OPEN_WAIT: Duration = Duration::from_secs(30);
/// The default least interval between two `circuit_rejected` events of one
/// breaker: 1 s.
pub const DEFAULT_REJECTION_EVENT_INTERVAL: Duration = Duration::from_secs(1);
/// The default interval between two reads of a shared store: 1 s.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// The default least interval between two reports of outcomes to a shared
/// store while failures arrive: 100 ms.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// The default bound on a probe election: 500 ms (see
/// [`FleetConfig::election_timeout`]).
pub const DEFAULT_ELECTION_TIMEOUT: Duration = Duration::from_millis(500);

/// The default bound of a [flush](FleetConfig::flush): 500 ms.
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_millis(500);
/// The default probe lease on a store that renews leases: 2 s (see
/// [`FleetConfig::probe_lease`]).
pub const DEFAULT_PROBE_LEASE: Duration = Duration::from_secs(2);
/// The default fleet-wide window of a breaker whose own window counts calls:
/// the last 10 s, in 10 buckets of 1 s.
pub const DEFAULT_FLEET_WINDOW: Duration = Duration::from_secs(10);

/// Which outcomes the breaker judges: the last N calls, or the calls of the
/// last N time buckets.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::BreakerConfig;
/// use tower_breaker::config::WindowKind;
///
/// let config = BreakerConfig::new().time_window(10, Duration::from_secs(1));
/// assert_eq!(
///     config.window_kind(),
///     WindowKind::Time { buckets: 10, bucket: Duration::from_secs(1) }
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// The last `size` outcomes (1 to 16,383).
    Count {
        /// How many outcomes.
        size: usize,
    },
    /// The outcomes of the last `buckets` buckets of `bucket` each (1 to
    /// 3,600 buckets); the window slides one bucket at a time.
    Time {
        /// How many buckets.
        buckets: usize,
        /// The length of one bucket.
        bucket: Duration,
    },
}

/// Where a call ends for the breaker's slow-call timing; see
/// [`BreakerConfig::slow_call_end`].
///
/// The outcome of an HTTP call always waits for its body (a body that fails
/// after a good head is a failure); this says only when its duration stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallEnd {
    /// When the response head arrives.
    Head,
    /// When the response body has been read to its end, has failed, or has
    /// been dropped (the default).
    #[default]
    Body,
}

/// Every knob of a [`Breaker`](crate::Breaker), with the defaults of the
/// [crate docs](crate#semantics).
///
/// The defaults suit a breaker per HTTP dependency: judge the last 20
/// calls once there are 10, open at 50% failures, stay open 5 s (then 10,
/// 20, 40 and 60 s on each re-open in a row, ±10%), probe with one call,
/// close on its success.
///
/// Setters take and return `self`; out-of-range values are clamped to the
/// nearest valid one (documented on each setter) rather than refused.
///
/// # Clone
///
/// Cloning is cheap; the random source, the listener and the store are
/// shared (`Arc`) by the clones and by every breaker built from them.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::{Breaker, BreakerConfig};
///
/// let config = BreakerConfig::new()
///     .count_window(50)
///     .minimum_calls(20)
///     .failure_rate(0.25)
///     .slow_calls(Duration::from_millis(800), 0.5)
///     .open_period(Duration::from_secs(2))
///     .max_open_period(Duration::from_secs(30))
///     .permitted_probes(2)
///     .successes_to_close(3);
/// let breaker = Breaker::with_config("catalog", config);
/// # let _ = breaker;
/// ```
#[derive(Clone)]
#[must_use]
pub struct BreakerConfig {
    pub(crate) window: WindowKind,
    pub(crate) minimum_calls: u32,
    pub(crate) failure_rate: f64,
    pub(crate) slow_call_duration: Option<Duration>,
    pub(crate) slow_call_rate: f64,
    pub(crate) slow_call_end: CallEnd,
    pub(crate) consecutive_failures: Option<u32>,
    pub(crate) open_period: Duration,
    pub(crate) max_open_period: Duration,
    pub(crate) open_growth: f64,
    pub(crate) jitter: f64,
    pub(crate) permitted_probes: u32,
    pub(crate) successes_to_close: u32,
    pub(crate) max_half_open_wait: Duration,
    pub(crate) ramp_up: Option<Duration>,
    pub(crate) rejection_event_interval: Duration,
    pub(crate) random: Arc<dyn RandomSource>,
    pub(crate) listener: Option<Arc<dyn Listener>>,
    /// How the breaker shares with a fleet, if it does.
    pub(crate) fleet: Option<FleetConfig>,
    /// The coarse clock to tell time by, if any (`coarse_clock`).
    pub(crate) coarse_clock: Option<&'static CoarseClock>,
}

/// How a breaker shares its circuit with a fleet of processes: the
/// [`Store`] that holds the shared decision and the fleet's window, and
/// how often and how the breaker talks to it. The state machine's settings
/// stay in [`BreakerConfig`]; [`BreakerConfig::fleet`] takes this.
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_breaker::store::{MemoryStore, StoreFailureMode};
/// use tower_breaker::{BreakerConfig, FleetConfig};
///
/// let fleet = FleetConfig::new(Arc::new(MemoryStore::new()))
///     .refresh_interval(Duration::from_millis(250))
///     .on_store_failure(StoreFailureMode::FailClosed);
/// let config = BreakerConfig::new().open_period(Duration::from_secs(5)).fleet(fleet);
/// # let _ = config;
/// ```
#[derive(Clone)]
pub struct FleetConfig {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) refresh_interval: Duration,
    pub(crate) store_failure: StoreFailureMode,
    pub(crate) fleet_window: bool,
    pub(crate) flush_interval: Duration,
    pub(crate) election_timeout: Duration,
    pub(crate) probe_lease: Duration,
    pub(crate) max_staleness: Option<Duration>,
    /// The store alarm's rate limit, shared by every breaker built from
    /// this configuration or its clones (a keyed registry's breakers).
    pub(crate) alarm: Arc<StoreAlarm>,
    pub(crate) flush_timeout: Duration,
    /// The breakers built from this configuration or its clones, for
    /// [`flush`](Self::flush).
    pub(crate) members: Arc<crate::flush::Members>,
}

/// The `circuit_store_failed` warnings of the breakers that share one
/// [`FleetConfig`]: at most one per second for all of them, and one
/// `circuit_store_recovered` per outage, so that a store outage under a
/// keyed registry of a thousand breakers is one line a second, not a
/// thousand.
#[derive(Debug)]
pub(crate) struct StoreAlarm {
    base: tokio::time::Instant,
    /// When the next warning may be emitted (ms since `base`).
    next_warning_ms: std::sync::atomic::AtomicU64,
    /// Failures not warned about since the last warning.
    unwarned: std::sync::atomic::AtomicU64,
    /// The last store call of any of these breakers failed.
    down: std::sync::atomic::AtomicBool,
}

impl StoreAlarm {
    fn new() -> Self {
        Self {
            base: tokio::time::Instant::now(),
            next_warning_ms: std::sync::atomic::AtomicU64::new(0),
            unwarned: std::sync::atomic::AtomicU64::new(0),
            down: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A store call failed: `Some(failures)` when a warning is due, with
    /// the failures it stands for (this one included). The first failure
    /// after the store worked is always told; more at most once per
    /// `interval_ms`.
    pub(crate) fn failed(&self, interval_ms: u64) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let was_up = !self.down.swap(true, Relaxed);
        let now_ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_warning_ms.load(Relaxed);
        let due = now_ms >= next
            && self
                .next_warning_ms
                .compare_exchange(next, now_ms.saturating_add(interval_ms), Relaxed, Relaxed)
                .is_ok();
        if !(was_up || due) {
            self.unwarned.fetch_add(1, Relaxed);
            return None;
        }
        Some(self.unwarned.swap(0, Relaxed) + 1)
    }

    /// A store call worked: true once per outage (the recovery to tell).
    pub(crate) fn recovered(&self) -> bool {
        self.down.swap(false, std::sync::atomic::Ordering::Relaxed)
    }
}

// === impl FleetConfig ===

impl FleetConfig {
    /// Share the decision (open until when, who probes) and the evidence
    /// through `store`, with every default. See [`crate::store`].
    #[must_use]
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            refresh_interval: DEFAULT_REFRESH_INTERVAL,
            store_failure: StoreFailureMode::FailOpen,
            fleet_window: true,
            flush_interval: DEFAULT_FLUSH_INTERVAL,
            election_timeout: DEFAULT_ELECTION_TIMEOUT,
            probe_lease: DEFAULT_PROBE_LEASE,
            max_staleness: None,
            alarm: Arc::new(StoreAlarm::new()),
            flush_timeout: DEFAULT_FLUSH_TIMEOUT,
            members: Arc::default(),
        }
    }

    /// How often, at most, the breaker reads the shared decision (default
    /// 1 s). It bounds both the store traffic of the closed path (one read
    /// per interval per breaker, started by the first call after the
    /// interval, which does not wait for it) and how late a breaker learns
    /// that another process opened or closed the circuit.
    #[must_use]
    pub fn refresh_interval(mut self, interval: Duration) -> Self {
        self.refresh_interval = interval;
        self
    }

    /// Whether the fleet shares its evidence as well as its decision (on by
    /// default): each breaker reports the outcomes it counted to the store,
    /// which keeps a time-bucketed window of the whole fleet's calls,
    /// failures and slow calls and opens the circuit for everyone when the
    /// fleet's rates cross this breaker's thresholds after the fleet-wide
    /// `minimum_calls` (see [`Store::report`]). A process's own window
    /// keeps working beside it, as a local safety net.
    ///
    /// The fleet's window is the breaker's
    /// [time window](BreakerConfig::time_window) when it has one, else the
    /// last [`DEFAULT_FLEET_WINDOW`] in buckets of one second. Reports
    /// replace the periodic read while there is traffic (one store command
    /// per refresh interval), and come at most every
    /// [`flush_interval`](Self::flush_interval) while failures arrive;
    /// nothing is ever sent on the path of a call.
    #[must_use]
    pub fn fleet_window(mut self, on: bool) -> Self {
        self.fleet_window = on;
        self
    }

    /// The least interval between two reports of outcomes while failures
    /// arrive (default 100 ms; at least 1 ms): the fleet learns of a
    /// failing dependency within about this long, at a cost of at most one
    /// store command per interval per breaker.
    #[must_use]
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// How long the election of the fleet's prober may take (default
    /// [`DEFAULT_ELECTION_TIMEOUT`], 500 ms; at least 1 ms, at most the
    /// breaker's [`max_half_open_wait`](BreakerConfig::max_half_open_wait)).
    ///
    /// The call that finds the open period over starts the election and,
    /// through a service's `poll_ready` or [`Breaker::acquire`](crate::Breaker::acquire),
    /// waits for it: won, that call is the probe. Calls refused meanwhile
    /// are told to retry when the election ends, at the latest after this
    /// long. An election that has not answered by then counts as a store
    /// failure: the breaker stays open one more
    /// [`refresh_interval`](Self::refresh_interval) and asks again. Keep
    /// it above the store's own timeout (a Redis store's is 50 ms, a
    /// DynamoDB store's 200 ms), so that the store's answer, not this
    /// bound, ends an election.
    #[must_use]
    pub fn election_timeout(mut self, timeout: Duration) -> Self {
        self.election_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The elected prober's lease on a store that
    /// [renews leases](Store::renews_leases) (default
    /// [`DEFAULT_PROBE_LEASE`], 2 s; at least 3 ms, at most the breaker's
    /// [`max_half_open_wait`](BreakerConfig::max_half_open_wait)).
    ///
    /// While its probe runs the prober renews the lease every third of it,
    /// so a slow probe keeps it (up to `max_half_open_wait`, when the
    /// probe times out and re-opens) and no second prober is elected;
    /// a prober that dies, freezes or loses the store stops renewing, and
    /// another process can be elected one lease later (once the fleet's
    /// T has passed too). On a store that cannot renew, the lease is the
    /// whole `max_half_open_wait`.
    #[must_use]
    pub fn probe_lease(mut self, lease: Duration) -> Self {
        self.probe_lease = lease.max(Duration::from_millis(3));
        self
    }

    /// How old the shared decision may be when a call is admitted on it
    /// (default twice the [`refresh_interval`](Self::refresh_interval); at
    /// least the refresh interval; [`Duration::MAX`] turns the wait off).
    ///
    /// A call that finds the circuit closed on a decision older than this
    /// (no read or report has answered for that long: a process quiet for
    /// a while, a Lambda instance thawed after minutes, a new process)
    /// waits, in a service's `poll_ready` (a keyed service's future, since
    /// its `poll_ready` does not know the key) or in
    /// [`Breaker::acquire`](crate::Breaker::acquire), for one read of the
    /// store (at most the [`election_timeout`](Self::election_timeout)),
    /// and is refused if the fleet opened the circuit meanwhile. A process
    /// that calls at least once per refresh interval keeps its decision
    /// fresh by the read or report that the first call after each
    /// interval starts, and never waits; one that calls less often waits
    /// one store round trip per call (a Redis store's is well under a
    /// millisecond on a local network; a DynamoDB store's a few). The
    /// wait is skipped while the store is failing (the breaker then
    /// decides alone, see [`on_store_failure`](Self::on_store_failure)),
    /// and [`Breaker::try_acquire`](crate::Breaker::try_acquire), which
    /// cannot wait, admits on the decision it has.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tower_breaker::store::MemoryStore;
    /// use tower_breaker::{BreakerConfig, FleetConfig};
    ///
    /// // Processes that call about once a second read before each call.
    /// let fleet = FleetConfig::new(Arc::new(MemoryStore::new()))
    ///     .refresh_interval(Duration::from_millis(400))
    ///     .max_staleness(Duration::from_millis(800));
    /// let config = BreakerConfig::new().fleet(fleet);
    /// # let _ = config;
    /// ```
    #[must_use]
    pub fn max_staleness(mut self, staleness: Duration) -> Self {
        self.max_staleness = Some(staleness);
        self
    }

    /// The effective [`max_staleness`](Self::max_staleness).
    pub(crate) fn staleness(&self) -> Duration {
        self.max_staleness
            .unwrap_or_else(|| self.refresh_interval.saturating_mul(2))
            .max(self.refresh_interval)
    }

    /// The most a [flush](Self::flush) waits for the store (default
    /// [`DEFAULT_FLUSH_TIMEOUT`], 500 ms; at least 1 ms). Keep it above
    /// the store's own timeout (a Redis store's is 50 ms, a DynamoDB
    /// store's 200 ms), so that the store's answer, not this bound, ends a
    /// flush.
    #[must_use]
    pub fn flush_timeout(mut self, timeout: Duration) -> Self {
        self.flush_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Reports every outcome that the breakers built from this
    /// configuration (or its clones: a keyed registry's breakers too) have
    /// counted and not reported, and waits until their store calls have
    /// ended, at most the [`flush_timeout`](Self::flush_timeout). Makes no
    /// store call when nothing is pending. See [`crate::flush`], and
    /// [`FlushLayer`](crate::FlushLayer) to flush after every call of a
    /// handler.
    ///
    /// # Errors
    ///
    /// [`Unflushed`](crate::flush::Unflushed) when the bound ran out or a
    /// report failed: what is left goes with the breakers' next reports.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_breaker::store::MemoryStore;
    /// use tower_breaker::{Breaker, BreakerConfig, FleetConfig, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store = Arc::new(MemoryStore::new());
    /// let fleet = FleetConfig::new(store.clone());
    /// let breaker = Breaker::with_config("search", BreakerConfig::new().fleet(fleet.clone()));
    /// breaker.try_acquire().unwrap().record(Outcome::Failure);
    ///
    /// // About to exit, or to be frozen: the failure reaches the store.
    /// fleet.flush().await.unwrap();
    /// assert!(!fleet.has_pending());
    /// # }
    /// ```
    pub async fn flush(&self) -> Result<(), crate::flush::Unflushed> {
        let deadline = tokio::time::Instant::now() + self.flush_timeout;
        crate::flush::flush_all(&self.members, deadline).await
    }

    /// Whether a [flush](Self::flush) would have anything to do: a breaker
    /// built from this configuration has counted outcomes it has not
    /// reported, or has store calls running.
    #[must_use]
    pub fn has_pending(&self) -> bool {
        self.members.pending()
    }

    /// What to do while the store fails (default
    /// [`StoreFailureMode::FailOpen`]: keep the local decision and call
    /// the dependency). See [`StoreFailureMode`].
    #[must_use]
    pub fn on_store_failure(mut self, mode: StoreFailureMode) -> Self {
        self.store_failure = mode;
        self
    }
}

impl fmt::Debug for FleetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetConfig")
            .field("store", &self.store)
            .field("refresh_interval", &self.refresh_interval)
            .field("fleet_window", &self.fleet_window)
            .field("flush_interval", &self.flush_interval)
            .field("election_timeout", &self.election_timeout)
            .field("probe_lease", &self.probe_lease)
            .field("max_staleness", &self.staleness())
            .field("store_failure", &self.store_failure)
            .field("flush_timeout", &self.flush_timeout)
            .field("members", &self.members)
            .finish()
    }
}

// === impl BreakerConfig ===

impl BreakerConfig {
    /// Every default (see the [crate docs](crate#semantics)).
    pub fn new() -> Self {
        Self {
            window: WindowKind::Count {
                size: DEFAULT_WINDOW_SIZE,
            },
            minimum_calls: DEFAULT_MINIMUM_CALLS,
            failure_rate: DEFAULT_FAILURE_RATE,
            slow_call_duration: None,
            slow_call_rate: DEFAULT_SLOW_CALL_RATE,
            slow_call_end: CallEnd::Body,
            consecutive_failures: None,
            open_period: DEFAULT_OPEN_PERIOD,
            max_open_period: DEFAULT_MAX_OPEN_PERIOD,
            open_growth: DEFAULT_OPEN_GROWTH,
            jitter: DEFAULT_JITTER,
            permitted_probes: DEFAULT_PERMITTED_PROBES,
            successes_to_close: DEFAULT_SUCCESSES_TO_CLOSE,
            max_half_open_wait: DEFAULT_MAX_HALF_OPEN_WAIT,
            ramp_up: None,
            rejection_event_interval: DEFAULT_REJECTION_EVENT_INTERVAL,
            random: Arc::new(ProcessRandom::new()),
            listener: None,
            fleet: None,
            coarse_clock: None,
        }
    }

    /// Judge the last `size` outcomes (default 20; clamped to 1..=16,383).
    /// Recording an outcome costs no clock read.
    pub fn count_window(mut self, size: usize) -> Self {
        self.window = WindowKind::Count {
            size: size.clamp(1, crate::window::MAX_COUNT_WINDOW),
        };
        self
    }

    /// Judge the outcomes of the last `buckets` buckets of `bucket` each
    /// (for example 10 buckets of 1 s: the last 10 seconds); `buckets` is
    /// clamped to 1..=3,600 and `bucket` to at least 1 ms. Recording an
    /// outcome reads the clock once.
    pub fn time_window(mut self, buckets: usize, bucket: Duration) -> Self {
        self.window = WindowKind::Time {
            buckets: buckets.clamp(1, 3600),
            bucket: bucket.max(Duration::from_millis(1)),
        };
        self
    }

    /// Tell time by a coarse clock (off by default): a reading of the real
    /// clock that one background thread per process advances every
    /// millisecond ([`CoarseClock`]). Reading it is one atomic load instead of
    /// a clock read (about 20 ns on a virtual machine): it makes the time
    /// window, slow-call timing and the rejections while open cheaper.
    ///
    /// Its error: a reading is never ahead of the real clock and never goes
    /// backwards, and lags it by at most one millisecond plus the delay the
    /// operating system adds to the thread's wake-ups (more on a loaded
    /// machine). So a call's duration is measured to within that lag (a
    /// call of 99 ms against a 100 ms slow-call threshold may count as
    /// slow, or one of 101 ms as not), an open period may end up to the lag
    /// late, and an outcome may land in the time-window bucket before its
    /// own. Use it with thresholds and buckets of tens of milliseconds or
    /// more.
    ///
    /// The coarse clock follows the real clock, not tokio's paused test
    /// clock: a breaker that uses it does not see `tokio::time::advance`.
    /// If the thread cannot be started, the breaker reads the real clock
    /// (with a `coarse_clock_unavailable` warning).
    ///
    /// Live: [`Breaker::reconfigure`](crate::Breaker::reconfigure) switches
    /// a running breaker to either clock (both count from the breaker's
    /// creation, so its readings move by the coarse clock's lag at most).
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_breaker::{Breaker, BreakerConfig};
    ///
    /// let breaker = Breaker::with_config(
    ///     "catalog",
    ///     BreakerConfig::new()
    ///         .time_window(10, Duration::from_secs(1))
    ///         .slow_calls(Duration::from_millis(500), 0.5)
    ///         .coarse_clock(true),
    /// );
    /// assert!(breaker.try_acquire().is_ok());
    /// ```
    pub fn coarse_clock(mut self, on: bool) -> Self {
        self.coarse_clock = if on { CoarseClock::shared() } else { None };
        self
    }

    /// The least number of calls in the window before its rates are judged
    /// (default 10; at least 1). With a count window it is capped at the
    /// window's size, or the circuit could never open.
    pub fn minimum_calls(mut self, calls: u32) -> Self {
        self.minimum_calls = calls.max(1);
        self
    }

    /// Open when the share of failures in the window reaches `rate`
    /// (default 0.5; clamped to 0.0..=1.0; reaching means `>=`).
    pub fn failure_rate(mut self, rate: f64) -> Self {
        self.failure_rate = clamp_rate(rate);
        self
    }

    /// Turn on slow-call detection (off by default): a success that took
    /// `duration` or longer counts as slow, and the circuit opens when the
    /// share of slow calls in the window reaches `rate` (clamped to
    /// 0.0..=1.0). It costs two clock reads per call (two atomic loads
    /// with [`coarse_clock`](Self::coarse_clock)).
    ///
    /// **Hung calls count while they hang.** A call still in flight after
    /// `duration` is already evidence, so a dependency that starts hanging
    /// opens the circuit in about `duration` plus the time to gather
    /// [`minimum_calls`](Self::minimum_calls) of evidence, not at the
    /// deadline. Precisely:
    ///
    /// - Closed-state calls are counted by the *bucket* of their start
    ///   time, buckets of `w` nanoseconds since the breaker was built, `w`
    ///   the largest power of two at most `duration / 8`. A call is *stuck*
    ///   while it is in flight and its bucket ended at least `duration`
    ///   ago (so it has been in flight for at least `duration`, and is
    ///   seen at most `w` late). Only calls of the current closed state
    ///   count.
    /// - Every judgement of the closed window (after a failure or slow
    ///   call, and the one below) weighs the stuck calls `k` as slow calls:
    ///   a time window adds them to its calls; a count window of size `n`
    ///   holds the last `n` calls, and stuck calls are among the latest, so
    ///   they displace its oldest outcomes: it keeps `c' = min(c, n - k)`
    ///   of its `c` outcomes with its failures and slow calls scaled by
    ///   `c' / c` (rounded down), then adds the `k` calls (at most `n`).
    /// - The first call to start in a bucket later than any before makes
    ///   that judgement; if it opens the circuit (cause `SlowCallRate`),
    ///   that call is refused too.
    /// - A call is counted once: stuck while in flight, then, once it
    ///   ends, in the window as what it turned out to be. A call cancelled
    ///   (or whose timing ended at its head) stops being counted.
    ///
    /// The cost is one compare-and-swap when a call starts and one when it
    /// ends (no timer per call, no allocation). The snapshot shows the
    /// stuck calls as [`WindowCounts::slow_in_flight`](crate::snapshot::WindowCounts::slow_in_flight).
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_breaker::{Breaker, BreakerConfig, State};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let breaker = Breaker::with_config(
    ///     "search",
    ///     BreakerConfig::new()
    ///         .minimum_calls(4)
    ///         .slow_calls(Duration::from_millis(200), 0.5),
    /// );
    /// // Four calls hang...
    /// let hung: Vec<_> = (0..4).map(|_| breaker.try_acquire().unwrap()).collect();
    /// tokio::time::advance(Duration::from_millis(230)).await;
    /// assert_eq!(breaker.snapshot().window.slow_in_flight, 4);
    /// // ...and the next call, before any of them ends, finds the circuit open.
    /// assert!(breaker.try_acquire().is_err());
    /// assert_eq!(breaker.snapshot().state, State::Open);
    /// # drop(hung);
    /// # }
    /// ```
    pub fn slow_calls(mut self, duration: Duration, rate: f64) -> Self {
        self.slow_call_duration = Some(duration);
        self.slow_call_rate = clamp_rate(rate);
        self
    }

    /// Where a call's duration ends for slow-call detection (default
    /// [`CallEnd::Body`]: when its HTTP response body has been read to its
    /// end, failed or been dropped).
    ///
    /// Why the body by default: a resilience4j user decorates the whole
    /// exchange (a Feign or `RestTemplate` call returns the decoded body),
    /// so a dependency that sends its head at once and then trickles the
    /// body is slow to them, and it is to their callers. [`CallEnd::Head`]
    /// measures only the time to the response head (what the dependency
    /// took to start answering); choose it when bodies are long streams
    /// whose length says nothing about the dependency's health (downloads,
    /// server-sent events), so that they are not all counted slow. Either
    /// way the *outcome* waits for the body: a body that fails or is cut
    /// by the deadline after a good head counts as a failure.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_breaker::BreakerConfig;
    /// use tower_breaker::config::CallEnd;
    ///
    /// // A download service: judge the time to first byte, not the file size.
    /// let config = BreakerConfig::new()
    ///     .slow_calls(Duration::from_millis(300), 0.5)
    ///     .slow_call_end(CallEnd::Head);
    /// # let _ = config;
    /// ```
    pub fn slow_call_end(mut self, end: CallEnd) -> Self {
        self.slow_call_end = end;
        self
    }

    /// Also open after `failures` failures in a row in the closed state,
    /// whatever the window says (off by default; at least 1).
    pub fn consecutive_failures(mut self, failures: u32) -> Self {
        self.consecutive_failures = Some(failures.max(1));
        self
    }

    /// The first open period (default 5 s).
    pub fn open_period(mut self, period: Duration) -> Self {
        self.open_period = period;
        self
    }

    /// The longest open period, however many re-opens in a row (default
    /// 60 s). It caps the grown period *before* jitter, so periods at the
    /// cap still vary by ±[`jitter`](Self::jitter) (between 54 s and 66 s
    /// with the defaults) and a fleet that keeps failing does not probe in
    /// lockstep.
    pub fn max_open_period(mut self, period: Duration) -> Self {
        self.max_open_period = period;
        self
    }

    /// The factor by which the open period grows on each re-open in a row
    /// (a failed probe, or no probe within the half-open wait); default 2,
    /// at least 1 (no growth).
    pub fn open_growth(mut self, factor: f64) -> Self {
        self.open_growth = if factor.is_finite() {
            factor.max(1.0)
        } else {
            1.0
        };
        self
    }

    /// The jitter of each open period, as a share of it: the period is
    /// multiplied by a random factor in `[1 - jitter, 1 + jitter]`
    /// (default 0.1; clamped to 0.0..=1.0; 0 disables it).
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = clamp_rate(jitter);
        self
    }

    /// How many probes may be in flight at once in half-open (default 1; at
    /// least 1).
    pub fn permitted_probes(mut self, probes: u32) -> Self {
        self.permitted_probes = probes.clamp(1, 1 << 19);
        self
    }

    /// How many probe successes in a row close the circuit (default 1; at
    /// least 1).
    pub fn successes_to_close(mut self, successes: u32) -> Self {
        self.successes_to_close = successes.clamp(1, 1 << 19);
        self
    }

    /// The longest time a probe may take (default 30 s), measured from its
    /// admission: each probe gets the whole wait. When every probe slot is
    /// held and the latest probe has been out this long, the circuit
    /// re-opens with the longer period (cause
    /// [`ProbeTimedOut`](crate::snapshot::Cause::ProbeTimedOut)), so a probe that
    /// never completes cannot wedge it. A half-open circuit with no probe in
    /// flight waits for traffic as long as it takes: with
    /// `successes_to_close > 1` and sparse calls, every probe that succeeds
    /// counts, however far apart.
    ///
    /// Callers refused while a probe is out are told to come back when it
    /// should finish: its start plus the duration of the last probe that
    /// finished (1 s before any did), never later than its timeout.
    pub fn max_half_open_wait(mut self, wait: Duration) -> Self {
        self.max_half_open_wait = wait;
        self
    }

    /// After closing, admit a share of calls that grows linearly from 0 to
    /// 100% over `period`, so a dependency that just recovered is not
    /// flooded by the backlog (off by default). The others are rejected
    /// with a [`CircuitOpen`](crate::error::CircuitOpen) whose
    /// `retry_after` is zero.
    pub fn ramp_up(mut self, period: Duration) -> Self {
        self.ramp_up = (!period.is_zero()).then_some(period);
        self
    }

    /// The least interval between two `circuit_rejected` events of this
    /// breaker (default 1 s).
    pub fn rejection_event_interval(mut self, interval: Duration) -> Self {
        self.rejection_event_interval = interval;
        self
    }

    /// The random source of the jitter and of the ramp-up (default
    /// [`ProcessRandom`]).
    pub fn random(mut self, random: impl RandomSource) -> Self {
        self.random = Arc::new(random);
        self
    }

    /// A listener told about every transition (default none).
    pub fn listener(mut self, listener: impl Listener) -> Self {
        self.listener = Some(Arc::new(listener));
        self
    }

    /// Share the circuit with a fleet of processes, as `fleet` says (the
    /// store, how often to read it, the fleet's window); default none: the
    /// breaker's own atomics decide. See [`crate::store`].
    pub fn fleet(mut self, fleet: FleetConfig) -> Self {
        self.fleet = Some(fleet);
        self
    }

    /// Share the circuit through `store` with the fleet's defaults: short
    /// for [`fleet`](Self::fleet)`(`[`FleetConfig::new`]`(store))`.
    pub fn store(self, store: Arc<dyn Store>) -> Self {
        self.fleet(FleetConfig::new(store))
    }

    /// The window the breaker judges.
    #[must_use]
    pub fn window_kind(&self) -> WindowKind {
        self.window
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for BreakerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerConfig")
            .field("window", &self.window)
            .field("minimum_calls", &self.minimum_calls)
            .field("failure_rate", &self.failure_rate)
            .field("slow_call_duration", &self.slow_call_duration)
            .field("slow_call_rate", &self.slow_call_rate)
            .field("slow_call_end", &self.slow_call_end)
            .field("consecutive_failures", &self.consecutive_failures)
            .field("open_period", &self.open_period)
            .field("max_open_period", &self.max_open_period)
            .field("open_growth", &self.open_growth)
            .field("jitter", &self.jitter)
            .field("permitted_probes", &self.permitted_probes)
            .field("successes_to_close", &self.successes_to_close)
            .field("max_half_open_wait", &self.max_half_open_wait)
            .field("ramp_up", &self.ramp_up)
            .field("rejection_event_interval", &self.rejection_event_interval)
            .field("random", &self.random)
            .field("listener", &DebugListener(&self.listener))
            .field("fleet", &self.fleet)
            .field("coarse_clock", &self.coarse_clock.is_some())
            .finish()
    }
}

fn clamp_rate(rate: f64) -> f64 {
    if rate.is_nan() {
        1.0
    } else {
        rate.clamp(0.0, 1.0)
    }
}

/// What [`Breaker::reconfigure`](crate::Breaker::reconfigure) did with a
/// new configuration: the settings it changed on the running breaker, and
/// those it could not change there (they keep their old values).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::{Breaker, BreakerConfig};
///
/// let breaker = Breaker::new("catalog");
/// let done = breaker.reconfigure(BreakerConfig::new().failure_rate(0.25).count_window(50));
/// assert_eq!(done.applied, ["failure_rate"]);
/// assert_eq!(done.not_live[0].setting, "window");
/// assert!(!done.is_complete());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Reconfigured {
    /// The settings that changed and apply from now on, named as
    /// [`BreakerConfig`]'s setters are.
    pub applied: Vec<&'static str>,
    /// The settings that differ but cannot change on a running breaker.
    /// Build a new breaker to change them (its window and state start
    /// afresh).
    pub not_live: Vec<NotLive>,
}

/// A setting that [`Breaker::reconfigure`](crate::Breaker::reconfigure)
/// could not change on a running breaker, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotLive {
    /// The setting, named as [`BreakerConfig`]'s setter is.
    pub setting: &'static str,
    /// Why it cannot change live.
    pub reason: &'static str,
}

impl Reconfigured {
    /// Whether every setting that differed was applied.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        self.not_live.is_empty()
    }
}

impl BreakerConfig {
    /// `new` with the settings of `self` that a running breaker cannot
    /// change put back, and the report of what differs.
    pub(crate) fn live_merge(&self, new: &BreakerConfig) -> (BreakerConfig, Reconfigured) {
        let mut done = Reconfigured::default();
        let mut effective = new.clone();
        if effective.window != self.window {
            effective.window = self.window;
            done.not_live.push(NotLive {
                setting: "window",
                reason: "the window's shape (count or time, its size) is its memory; a new breaker starts an empty one",
            });
        }
        if effective.slow_call_duration.is_some() != self.slow_call_duration.is_some() {
            effective.slow_call_duration = self.slow_call_duration;
            effective.slow_call_rate = self.slow_call_rate;
            effective.slow_call_end = self.slow_call_end;
            done.not_live.push(NotLive {
                setting: "slow_calls",
                reason: "turning slow-call detection on or off changes what the window counts; its threshold and rate can change live",
            });
        }
        let fleet_differs = match (&self.fleet, &new.fleet) {
            (None, None) => false,
            (Some(a), Some(b)) => {
                !Arc::ptr_eq(&a.store, &b.store)
                    || a.refresh_interval != b.refresh_interval
                    || a.store_failure != b.store_failure
                    || a.fleet_window != b.fleet_window
                    || a.flush_interval != b.flush_interval
                    || a.election_timeout != b.election_timeout
                    || a.probe_lease != b.probe_lease
                    || a.max_staleness != b.max_staleness
                    || a.flush_timeout != b.flush_timeout
            }
            _ => true,
        };
        if fleet_differs {
            done.not_live.push(NotLive {
                setting: "fleet",
                reason: "the store and how the breaker talks to it are set when it is built",
            });
        }
        effective.fleet = self.fleet.clone();
        // The clock is live: both clocks count from the breaker's base.
        let coarse_differs = effective.coarse_clock.is_some() != self.coarse_clock.is_some();
        // The breaker's own: a new configuration's defaults would differ
        // by identity alone.
        effective.random = Arc::clone(&self.random);
        effective.listener = self.listener.clone();
        let mut applied = |name: &'static str, differs: bool| {
            if differs {
                done.applied.push(name);
            }
        };
        applied(
            "minimum_calls",
            effective.minimum_calls != self.minimum_calls,
        );
        applied("failure_rate", effective.failure_rate != self.failure_rate);
        applied(
            "slow_calls",
            effective.slow_call_duration != self.slow_call_duration
                || effective.slow_call_rate != self.slow_call_rate,
        );
        applied(
            "slow_call_end",
            effective.slow_call_end != self.slow_call_end,
        );
        applied(
            "consecutive_failures",
            effective.consecutive_failures != self.consecutive_failures,
        );
        applied("open_period", effective.open_period != self.open_period);
        applied(
            "max_open_period",
            effective.max_open_period != self.max_open_period,
        );
        applied("open_growth", effective.open_growth != self.open_growth);
        applied("jitter", effective.jitter != self.jitter);
        applied(
            "permitted_probes",
            effective.permitted_probes != self.permitted_probes,
        );
        applied(
            "successes_to_close",
            effective.successes_to_close != self.successes_to_close,
        );
        applied(
            "max_half_open_wait",
            effective.max_half_open_wait != self.max_half_open_wait,
        );
        applied("ramp_up", effective.ramp_up != self.ramp_up);
        applied("coarse_clock", coarse_differs);
        applied(
            "rejection_event_interval",
            effective.rejection_event_interval != self.rejection_event_interval,
        );
        (effective, done)
    }
}

/// The settings as set (after the setters' clamping), for code that shows
/// or compares configurations (a settings file's round trip, a live view).
impl BreakerConfig {
    /// The window: [`count_window`](Self::count_window) or
    /// [`time_window`](Self::time_window).
    #[must_use]
    pub fn get_window(&self) -> WindowKind {
        self.window
    }

    /// [`minimum_calls`](Self::minimum_calls).
    #[must_use]
    pub fn get_minimum_calls(&self) -> u32 {
        self.minimum_calls
    }

    /// [`failure_rate`](Self::failure_rate).
    #[must_use]
    pub fn get_failure_rate(&self) -> f64 {
        self.failure_rate
    }

    /// The slow-call threshold of [`slow_calls`](Self::slow_calls), if on.
    #[must_use]
    pub fn get_slow_call_duration(&self) -> Option<Duration> {
        self.slow_call_duration
    }

    /// The slow-call rate of [`slow_calls`](Self::slow_calls).
    #[must_use]
    pub fn get_slow_call_rate(&self) -> f64 {
        self.slow_call_rate
    }

    /// [`consecutive_failures`](Self::consecutive_failures), if on.
    #[must_use]
    pub fn get_consecutive_failures(&self) -> Option<u32> {
        self.consecutive_failures
    }

    /// [`open_period`](Self::open_period).
    #[must_use]
    pub fn get_open_period(&self) -> Duration {
        self.open_period
    }

    /// [`max_open_period`](Self::max_open_period).
    #[must_use]
    pub fn get_max_open_period(&self) -> Duration {
        self.max_open_period
    }

    /// [`permitted_probes`](Self::permitted_probes).
    #[must_use]
    pub fn get_permitted_probes(&self) -> u32 {
        self.permitted_probes
    }

    /// [`successes_to_close`](Self::successes_to_close).
    #[must_use]
    pub fn get_successes_to_close(&self) -> u32 {
        self.successes_to_close
    }

    /// [`max_half_open_wait`](Self::max_half_open_wait).
    #[must_use]
    pub fn get_max_half_open_wait(&self) -> Duration {
        self.max_half_open_wait
    }

    /// Whether the breaker tells time by the coarse clock
    /// ([`coarse_clock`](Self::coarse_clock); false also when it was asked
    /// for and its thread could not be started).
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker::BreakerConfig;
    ///
    /// assert!(!BreakerConfig::new().get_coarse_clock());
    /// ```
    #[must_use]
    pub fn get_coarse_clock(&self) -> bool {
        self.coarse_clock.is_some()
    }
}
