//! The shared breaker: the state machine, its window and its figures.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::classify::Outcome;
use crate::config::{BreakerConfig, WindowKind};
use crate::error::CircuitOpen;
use crate::snapshot::{Cause, Snapshot, Totals, Transition, WindowCounts};
use crate::state::{is_newer, Padded, Word, CLOSED, ELECTING, GEN_MASK, HALF_OPEN, OPEN};
use crate::store::{Decision, Election, ProbeToken, Store, StoreError, StoreFailureMode};
use crate::window::{CountWindow, Counts, TimeWindow, Window, FAIL, OK, SLOW};
use crate::Mode;
use tower_resilience_base::random::unit;

const NANOS_PER_MS: u64 = 1_000_000;
const NANOS_PER_SEC: u64 = 1_000_000_000;
const PPM: u64 = 1_000_000;
pub(crate) const STRIPES: usize = 8;

/// A circuit breaker: the shared state that [`BreakerLayer`] wraps
/// services with.
///
/// A `Breaker` is a handle: it holds one `Arc` to the state machine, its
/// window, its figures and its configuration. Create one per dependency
/// (or use [`KeyedBreakerLayer`](crate::KeyedBreakerLayer) for one per
/// host or route), give a clone to the layer, keep a clone to switch modes
/// and read [snapshots](Breaker::snapshot).
///
/// Besides the tower layer, the breaker can guard any code by hand with
/// [`try_acquire`](Breaker::try_acquire) and [`Permit::record`].
///
/// # Clone
///
/// Clones share everything (one `Arc`): state, window, figures, mode.
/// Cloning costs one atomic increment.
///
/// # Example
///
/// ```
/// use tower_breaker::{Breaker, BreakerConfig, Outcome, State};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let breaker = Breaker::with_config(
///     "billing",
///     BreakerConfig::new().count_window(4).minimum_calls(4),
/// );
/// for _ in 0..4 {
///     let permit = breaker.try_acquire().expect("closed");
///     permit.record(Outcome::Failure);
/// }
/// assert_eq!(breaker.snapshot().state, State::Open);
///
/// let rejected = breaker.try_acquire().unwrap_err();
/// assert_eq!(rejected.breaker(), "billing");
/// assert!(rejected.retry_after() > std::time::Duration::from_secs(4));
/// # }
/// ```
///
/// [`BreakerLayer`]: crate::BreakerLayer
#[derive(Clone)]
pub struct Breaker {
    pub(crate) core: Arc<Core>,
    /// Handles on the core, one per thread stripe, each alone on its cache
    /// lines: a call's future holds one of these, so the reference counts
    /// that every call touches are not shared between threads.
    shards: Arc<[Arc<Shard>]>,
}

#[repr(align(128))]
struct Shard {
    core: Arc<Core>,
    /// This stripe's own copy of the name (its own reference count).
    name: Arc<str>,
}

/// Permission to make one call, from [`Breaker::try_acquire`]: record the
/// call's outcome on it.
///
/// Dropping a permit without recording counts as a cancellation: nothing is
/// counted, and if the call was a half-open probe its slot is freed.
///
/// # Example
///
/// ```
/// use tower_breaker::{Breaker, Outcome};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let breaker = Breaker::new("ledger");
/// match breaker.try_acquire() {
///     Ok(permit) => {
///         let worked = true; // call the dependency here
///         permit.record(if worked { Outcome::Success } else { Outcome::Failure });
///     }
///     Err(open) => eprintln!("{open}; falling back"),
/// }
/// # }
/// ```
#[must_use = "dropping a permit counts the call as cancelled"]
pub struct Permit {
    shard: Arc<Shard>,
    raw: Raw,
    started_ns: u64,
    stripe: u8,
    armed: bool,
}

/// What an admitted call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Counted in the closed window.
    Tracked,
    /// A half-open probe, holding one probe slot.
    Probe,
    /// Not counted (disabled, or let through by metrics-only mode).
    Untracked,
}

/// An admission: the generation it belongs to and its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Raw {
    pub(crate) gen: u32,
    pub(crate) kind: Kind,
}

/// Why and for how long a call is refused.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rejection {
    pub(crate) retry_after: Duration,
    pub(crate) forced: bool,
}

pub(crate) struct Core {
    word: Padded<AtomicU64>,
    /// Half-open probes: generation (20 bits) << 40 | in flight << 20 |
    /// successes.
    probes: Padded<AtomicU64>,
    window: Window,
    /// Generation << 32 | failures in a row.
    consecutive: AtomicU64,
    /// Re-opens in a row (0 for an opening from closed).
    streak: AtomicU32,
    /// The generation of the last closed state, whose window the snapshot
    /// shows.
    window_epoch: AtomicU32,
    opened: AtomicU64,
    /// How long the last probe that completed took, in nanoseconds (0 =
    /// none yet): what callers rejected while half-open are told to wait.
    last_probe_ns: AtomicU64,
    /// Nanoseconds since `base` plus one of the last transition; 0 = never.
    last_transition: AtomicU64,
    next_rejection_event_ms: AtomicU64,
    store_errors: AtomicU64,
    stripes: Box<[Stripe]>,
    pub(crate) name: Arc<str>,
    base: Instant,
    s: Settings,
    config: BreakerConfig,
    store: Option<StoreLink>,
}

/// The configuration in the units the hot path uses.
#[derive(Debug)]
struct Settings {
    minimum_calls: u64,
    failure_ppm: u64,
    slow_ppm: u64,
    /// 0 when slow-call detection is off.
    slow_ns: u64,
    /// 0 when off.
    consecutive: u64,
    open_ns: u64,
    max_open_ns: u64,
    growth: f64,
    jitter: f64,
    probes: u64,
    successes: u64,
    half_open_ns: u64,
    /// 0 when off.
    ramp_ns: u64,
    rejection_event_ms: u64,
}

/// Figures written by every call, one set per thread stripe so that
/// threads do not contend on them.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe {
    successful: AtomicU64,
    failed: AtomicU64,
    slow: AtomicU64,
    ignored: AtomicU64,
    rejected: AtomicU64,
    stale: AtomicU64,
    passed: AtomicU64,
}

/// A breaker's link to its shared store.
struct StoreLink {
    store: Arc<dyn Store>,
    refresh_ns: u64,
    next_refresh_ns: AtomicU64,
    token: Mutex<Option<ProbeToken>>,
    /// The store is known to hold the current opening.
    shared_open: AtomicBool,
    /// The last store call failed (cleared by the next one that works).
    down: AtomicBool,
    fail_closed: bool,
}

// === impl StoreLink ===

impl StoreLink {
    fn take_token(&self) -> Option<ProbeToken> {
        self.token.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

// === impl Breaker ===

impl Breaker {
    /// A breaker with every default of [`BreakerConfig::new`].
    ///
    /// `name` appears in errors, events, snapshots and, with a store, in
    /// the store's key. Times are measured from now, with
    /// [`tokio::time::Instant`] (so paused test time applies).
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self::with_config(name, BreakerConfig::new())
    }

    /// A breaker with the given configuration, refusing a name its store
    /// cannot hold ([`Store::check_name`]; without a store every name is
    /// fine).
    ///
    /// [`with_config`](Breaker::with_config) accepts such a name, logs a
    /// `circuit_store_invalid_name` error, and then every store call fails
    /// (see [`StoreFailureMode`]).
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`] when it refuses the name.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_breaker::store::MemoryStore;
    /// use tower_breaker::{Breaker, BreakerConfig};
    ///
    /// let config = BreakerConfig::new().store(Arc::new(MemoryStore::new()));
    /// let breaker = Breaker::try_with_config("payments", config).unwrap();
    /// # let _ = breaker;
    /// ```
    pub fn try_with_config(
        name: impl Into<Arc<str>>,
        config: BreakerConfig,
    ) -> Result<Self, StoreError> {
        let name = name.into();
        if let Some(store) = &config.store {
            store.check_name(&name)?;
        }
        Ok(Self::with_config(name, config))
    }

    /// A breaker with the given configuration.
    pub fn with_config(name: impl Into<Arc<str>>, config: BreakerConfig) -> Self {
        let name = name.into();
        let window = match config.window {
            WindowKind::Count { size } => Window::Count(CountWindow::new(size)),
            WindowKind::Time { buckets, bucket } => {
                Window::Time(TimeWindow::new(buckets, nanos(bucket).max(1)))
            }
        };
        let minimum_calls = match config.window {
            WindowKind::Count { size } => u64::from(config.minimum_calls).min(size as u64),
            WindowKind::Time { .. } => u64::from(config.minimum_calls),
        };
        let s = Settings {
            minimum_calls,
            failure_ppm: (config.failure_rate * PPM as f64).round() as u64,
            slow_ppm: (config.slow_call_rate * PPM as f64).round() as u64,
            slow_ns: config.slow_call_duration.map_or(0, |d| nanos(d).max(1)),
            consecutive: config.consecutive_failures.map_or(0, u64::from),
            open_ns: nanos(config.open_period),
            max_open_ns: nanos(config.max_open_period),
            growth: config.open_growth,
            jitter: config.jitter,
            probes: u64::from(config.permitted_probes),
            successes: u64::from(config.successes_to_close),
            half_open_ns: nanos(config.max_half_open_wait),
            ramp_ns: config.ramp_up.map_or(0, nanos),
            rejection_event_ms: config.rejection_event_interval.as_millis() as u64,
        };
        let store = config.store.clone().map(|store| StoreLink {
            store,
            refresh_ns: nanos(config.refresh_interval),
            next_refresh_ns: AtomicU64::new(0),
            token: Mutex::new(None),
            shared_open: AtomicBool::new(false),
            down: AtomicBool::new(false),
            fail_closed: config.store_failure == StoreFailureMode::FailClosed,
        });
        if let Some(link) = &store {
            if let Err(error) = link.store.check_name(&name) {
                // Every store call would fail; say so once, loudly.
                tracing::error!(breaker = %name, error = %error, "circuit_store_invalid_name");
            }
        }
        // Generation 1: epoch 0 would read as "empty" in the time window.
        let first = Word::new(CLOSED, Mode::Automatic, 1, 0);
        let core = Arc::new(Core {
            word: Padded(AtomicU64::new(first.0)),
            probes: Padded(AtomicU64::new(0)),
            window,
            consecutive: AtomicU64::new(0),
            streak: AtomicU32::new(0),
            window_epoch: AtomicU32::new(1),
            opened: AtomicU64::new(0),
            last_probe_ns: AtomicU64::new(0),
            last_transition: AtomicU64::new(0),
            next_rejection_event_ms: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
            name,
            base: Instant::now(),
            s,
            config,
            store,
        });
        let shards = (0..STRIPES)
            .map(|_| {
                Arc::new(Shard {
                    core: Arc::clone(&core),
                    name: Arc::from(&*core.name),
                })
            })
            .collect();
        Self { core, shards }
    }

    /// The breaker's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The configuration the breaker was built with.
    pub fn config(&self) -> &BreakerConfig {
        &self.core.config
    }

    /// Asks to make one call.
    ///
    /// Closed: always granted (one atomic load). Open: refused until the
    /// open period is over; the first call after it moves the circuit to
    /// half-open and becomes a probe. Half-open: granted to at most
    /// `permitted_probes` calls at once. See the
    /// [crate docs](crate#semantics).
    ///
    /// # Errors
    ///
    /// [`CircuitOpen`] when the call must not be made.
    pub fn try_acquire(&self) -> Result<Permit, CircuitOpen> {
        match self.admit() {
            Ok(raw) => Ok(self.permit(raw)),
            Err(rejection) => Err(self.open_error(rejection)),
        }
    }

    #[inline]
    pub(crate) fn admit(&self) -> Result<Raw, Rejection> {
        self.core.admit()
    }

    #[inline]
    pub(crate) fn permit(&self, raw: Raw) -> Permit {
        self.permit_started(raw, self.core.started_ns(raw))
    }

    /// A permit for an admission whose start time was already taken.
    #[inline]
    pub(crate) fn permit_started(&self, raw: Raw, started_ns: u64) -> Permit {
        let stripe = thread_index() % STRIPES;
        Permit {
            shard: Arc::clone(&self.shards[stripe]),
            raw,
            started_ns,
            stripe: stripe as u8,
            armed: true,
        }
    }

    pub(crate) fn open_error(&self, rejection: Rejection) -> CircuitOpen {
        // Each stripe has its own copy of the name, so that rejections on
        // different threads do not contend on one reference count.
        let name = &self.shards[thread_index() % STRIPES].name;
        CircuitOpen::new(Arc::clone(name), rejection.retry_after, rejection.forced)
    }

    pub(crate) fn complete(&self, raw: Raw, outcome: Outcome, elapsed: Option<Duration>) {
        self.core.complete(raw, outcome, elapsed);
    }

    pub(crate) fn cancel(&self, raw: Raw) {
        self.core.cancel(raw);
    }

    /// Whether a call would be refused now for certain (open before the end
    /// of its period, or forced open), without admitting one: what a retry
    /// layer asks before sleeping a backoff. A refusal counts as a rejected
    /// call, like one refused by [`admit`](Self::admit).
    #[inline]
    pub(crate) fn peek(&self) -> Result<(), Rejection> {
        let core = &self.core;
        let w = Word(core.word.load(Acquire));
        if w.is_fast() {
            return Ok(());
        }
        let now = core.now_ns();
        let refusal = match w.mode() {
            Mode::ForcedOpen => Rejection {
                retry_after: core.config.open_period,
                forced: true,
            },
            Mode::Automatic if w.state() == OPEN => {
                let deadline_ns = w.deadline_ms().saturating_mul(NANOS_PER_MS);
                if now >= deadline_ns {
                    return Ok(());
                }
                Rejection {
                    retry_after: Duration::from_nanos(deadline_ns - now),
                    forced: false,
                }
            }
            _ => return Ok(()),
        };
        core.stripe().rejected.fetch_add(1, Relaxed);
        core.rejection_event(now);
        Err(refusal)
    }

    /// The manual mode.
    #[must_use]
    pub fn mode(&self) -> Mode {
        Word(self.core.word.load(Acquire)).mode()
    }

    /// Switches the manual mode. Every switch, even to the current mode,
    /// starts over: the circuit is closed with a fresh window, the open
    /// period's growth is reset, and outcomes of calls in flight are
    /// discarded. So `set_mode(Mode::Automatic)` is also a reset.
    pub fn set_mode(&self, mode: Mode) {
        let core = &*self.core;
        let mut from = Word(core.word.load(Acquire));
        let to = loop {
            let to = Word::new(CLOSED, mode, from.gen().wrapping_add(1), 0);
            match core.word.compare_exchange(from.0, to.0, AcqRel, Acquire) {
                Ok(_) => break to,
                Err(actual) => from = Word(actual),
            }
        };
        core.streak.store(0, Relaxed);
        core.window_epoch.store(to.gen(), Release);
        if let Some(link) = &core.store {
            link.take_token();
        }
        self.core
            .after_transition(from, to, Cause::ModeChanged, Counts::default(), None);
    }

    /// Reads the shared decision now and adopts it, without waiting for the
    /// next refresh interval; without a store it does nothing.
    ///
    /// A process that has just started knows nothing of the fleet's
    /// circuit until its first read, and until then lets calls through;
    /// awaiting this once before serving closes that gap (a short-lived
    /// process, say a function invocation, should). It also restarts the
    /// refresh interval.
    ///
    /// # Errors
    ///
    /// The store's error (or timeout). It is counted and logged as every
    /// store failure is, and the local decision stands.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tower_breaker::store::{MemoryStore, Store};
    /// use tower_breaker::{Breaker, BreakerConfig, State};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let store = Arc::new(MemoryStore::new());
    /// store.try_open("search", Duration::from_secs(5)).await.unwrap(); // another process
    ///
    /// let breaker = Breaker::with_config("search", BreakerConfig::new().store(store));
    /// breaker.refresh().await.unwrap();
    /// assert_eq!(breaker.snapshot().state, State::Open);
    /// assert!(breaker.try_acquire().is_err());
    /// # }
    /// ```
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let core = &self.core;
        let Some(link) = &core.store else {
            return Ok(());
        };
        let asked = core.now_ns();
        link.next_refresh_ns
            .store(asked + link.refresh_ns.max(1), Relaxed);
        let result = link.store.read(&core.name).await;
        core.apply_read(&result, asked);
        result.map(drop)
    }

    /// A picture of the breaker now: state, mode, window, rates, totals.
    /// Takes no lock.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        let core = &*self.core;
        let w = Word(core.word.load(Acquire));
        let now = core.now_ns();
        let counts = core.window.counts(core.window_epoch.load(Acquire), now);
        let rate = |n: u64| {
            if counts.calls == 0 {
                0.0
            } else {
                n as f64 / counts.calls as f64
            }
        };
        let deadline_ns = w.deadline_ms().saturating_mul(NANOS_PER_MS);
        let retry_after = match w.state() {
            _ if !w.is_automatic() => None,
            CLOSED => None,
            HALF_OPEN if core.probes_held(w.gen()) < core.s.probes => Some(Duration::ZERO),
            HALF_OPEN => Some(core.probe_retry_after(deadline_ns, now)),
            _ => Some(Duration::from_nanos(deadline_ns.saturating_sub(now))),
        };
        let probes = core.probes.load(Acquire);
        let probes_in_flight = if w.state() == HALF_OPEN && probe_gen(probes) == w.gen() {
            probe_in_flight(probes) as u32
        } else {
            0
        };
        let consecutive = core.consecutive.load(Acquire);
        let consecutive_failures = if (consecutive >> 32) as u32 == w.gen() {
            consecutive & 0xFFFF_FFFF
        } else {
            0
        };
        let last = core.last_transition.load(Acquire);
        Snapshot {
            name: core.name.clone(),
            state: w.public_state(),
            mode: w.mode(),
            window: window_counts(counts),
            failure_rate: rate(counts.failures),
            slow_rate: rate(counts.slow),
            consecutive_failures,
            retry_after,
            probes_in_flight,
            last_transition: (last != 0).then(|| core.base + Duration::from_nanos(last - 1)),
            totals: core.totals(),
        }
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = Word(self.core.word.load(Relaxed));
        f.debug_struct("Breaker")
            .field("name", &self.core.name)
            .field("state", &w.public_state())
            .field("mode", &w.mode())
            .field("config", &self.core.config)
            .finish()
    }
}

// === impl Permit ===

impl Permit {
    /// Whether this call is a half-open probe.
    #[must_use]
    pub fn is_probe(&self) -> bool {
        self.raw.kind == Kind::Probe
    }

    /// Counts the call's outcome. With slow-call detection on, a success is
    /// slow if the time since [`Breaker::try_acquire`] reached the
    /// threshold.
    pub fn record(mut self, outcome: Outcome) {
        self.armed = false;
        let elapsed = self.shard.core.elapsed(self.started_ns);
        self.shard
            .core
            .complete_at(usize::from(self.stripe), self.raw, outcome, elapsed);
    }

    /// Counts the call's outcome, with the call's duration measured by the
    /// caller.
    pub fn record_with_elapsed(mut self, outcome: Outcome, elapsed: Duration) {
        self.armed = false;
        self.shard
            .core
            .complete_at(usize::from(self.stripe), self.raw, outcome, Some(elapsed));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.armed {
            self.shard.core.cancel(self.raw);
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("breaker", &self.shard.core.name)
            .field("probe", &self.is_probe())
            .finish()
    }
}

// === impl Core ===

impl Core {
    // --- admission ---

    /// Decides whether a call may be made. The closed path is one load.
    #[inline]
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Raw, Rejection> {
        let core = &**self;
        let w = Word(core.word.load(Acquire));
        if w.is_fast() && core.store.is_none() {
            return Ok(Raw {
                gen: w.gen(),
                kind: Kind::Tracked,
            });
        }
        self.admit_slow(w)
    }

    #[cold]
    fn admit_slow(self: &Arc<Self>, mut w: Word) -> Result<Raw, Rejection> {
        let core = &**self;
        let now = core.now_ns();
        if let Some(link) = &core.store {
            self.maybe_refresh(link, now);
        }
        let decision = loop {
            let tracked = Raw {
                gen: w.gen(),
                kind: Kind::Tracked,
            };
            let deadline_ns = w.deadline_ms().saturating_mul(NANOS_PER_MS);
            match w.mode() {
                Mode::Disabled => {
                    return Ok(Raw {
                        gen: w.gen(),
                        kind: Kind::Untracked,
                    })
                }
                Mode::ForcedClosed => return Ok(tracked),
                Mode::ForcedOpen => {
                    break Err(Rejection {
                        retry_after: core.config.open_period,
                        forced: true,
                    })
                }
                Mode::Automatic | Mode::MetricsOnly => {}
            }
            match w.state() {
                CLOSED if core.store_blocks() => {
                    // Fail closed: the shared decision is unknown.
                    break Err(Rejection {
                        retry_after: core.config.refresh_interval,
                        forced: false,
                    });
                }
                CLOSED if deadline_ns == 0 => return Ok(tracked),
                CLOSED => {
                    // Ramping up after closing.
                    if now >= deadline_ns {
                        let _ = core.cas(w, w.with_deadline(0));
                        return Ok(tracked);
                    }
                    let start = deadline_ns.saturating_sub(core.s.ramp_ns);
                    let share = (now.saturating_sub(start)) as f64 / core.s.ramp_ns.max(1) as f64;
                    if unit(&*core.config.random) < share {
                        return Ok(tracked);
                    }
                    break Err(Rejection {
                        retry_after: Duration::ZERO,
                        forced: false,
                    });
                }
                OPEN if now < deadline_ns => {
                    break Err(Rejection {
                        retry_after: Duration::from_nanos(deadline_ns - now),
                        forced: false,
                    })
                }
                OPEN => {
                    // The open period is over: the first caller moves the
                    // circuit on, everyone then competes for a probe slot.
                    self.leave_open(w, now);
                }
                HALF_OPEN => {
                    // The deadline is the latest probe's: its admission
                    // time plus the half-open wait.
                    if core.probes_held(w.gen()) >= core.s.probes {
                        if now < deadline_ns {
                            break Err(Rejection {
                                retry_after: core.probe_retry_after(deadline_ns, now),
                                forced: false,
                            });
                        }
                        // Every slot is held and the latest probe has been
                        // out for the whole wait: it hangs.
                        let counts = core.probe_counts(w.gen(), 0);
                        self.open(w, Cause::ProbeTimedOut, counts);
                    } else {
                        // A slot looks free. This call's probe gets the
                        // whole wait, written before the slot is taken: a
                        // caller that sees the slot taken and the old
                        // deadline passed then fails its compare-and-swap
                        // from the old word, and never times this probe
                        // out early.
                        let deadline = (now + core.s.half_open_ns).div_ceil(NANOS_PER_MS);
                        let probing = if deadline > w.deadline_ms() {
                            w.with_deadline(deadline)
                        } else {
                            w
                        };
                        if (probing == w || core.cas(w, probing).is_ok()) && core.try_probe(w.gen())
                        {
                            return Ok(Raw {
                                gen: w.gen(),
                                kind: Kind::Probe,
                            });
                        }
                    }
                }
                _ if now >= deadline_ns => {
                    // The election never answered.
                    self.store_failed("try_acquire_probe", &StoreError::new("election timed out"));
                    self.election_failed(w, now);
                }
                _ => {
                    break Err(Rejection {
                        retry_after: Duration::from_nanos(deadline_ns - now),
                        forced: false,
                    })
                }
            }
            w = Word(core.word.load(Acquire));
        };
        let stripe = core.stripe();
        if w.mode() == Mode::MetricsOnly {
            stripe.passed.fetch_add(1, Relaxed);
            return Ok(Raw {
                gen: w.gen(),
                kind: Kind::Untracked,
            });
        }
        stripe.rejected.fetch_add(1, Relaxed);
        self.rejection_event(now);
        decision
    }

    fn rejection_event(self: &Arc<Self>, now: u64) {
        let core = &**self;
        let now_ms = now / NANOS_PER_MS;
        let next = core.next_rejection_event_ms.load(Relaxed);
        if now_ms >= next
            && core
                .next_rejection_event_ms
                .compare_exchange(next, now_ms + core.s.rejection_event_ms, Relaxed, Relaxed)
                .is_ok()
        {
            tracing::warn!(
                breaker = %core.name,
                rejected_total = core.totals().rejected,
                "circuit_rejected"
            );
        }
    }

    // --- outcomes ---

    /// Counts the outcome of an admitted call. `elapsed` is needed only for
    /// slow-call detection.
    pub(crate) fn complete(
        self: &Arc<Self>,
        raw: Raw,
        outcome: Outcome,
        elapsed: Option<Duration>,
    ) {
        self.complete_at(thread_index(), raw, outcome, elapsed);
    }

    /// [`complete`](Self::complete), counting in the figures of stripe
    /// `stripe`.
    #[inline]
    fn complete_at(
        self: &Arc<Self>,
        stripe: usize,
        raw: Raw,
        outcome: Outcome,
        elapsed: Option<Duration>,
    ) {
        let core = &**self;
        if raw.kind == Kind::Untracked {
            return;
        }
        let stripe = &core.stripes[stripe % STRIPES];
        let code = match outcome {
            Outcome::Ignored => {
                stripe.ignored.fetch_add(1, Relaxed);
                if raw.kind == Kind::Probe {
                    core.release_probe(raw.gen);
                }
                return;
            }
            Outcome::Failure => FAIL,
            Outcome::Success
                if core.s.slow_ns != 0 && elapsed.is_some_and(|e| nanos(e) >= core.s.slow_ns) =>
            {
                SLOW
            }
            Outcome::Success => OK,
        };
        let w = Word(core.word.load(Acquire));
        if w.gen() != raw.gen {
            // The circuit moved on while the call was in flight: the
            // outcome is discarded, and counted only as stale.
            stripe.stale.fetch_add(1, Relaxed);
            if raw.kind == Kind::Probe {
                core.release_probe(raw.gen);
            }
            return;
        }
        match code {
            FAIL => stripe.failed.fetch_add(1, Relaxed),
            SLOW => {
                stripe.slow.fetch_add(1, Relaxed);
                stripe.successful.fetch_add(1, Relaxed)
            }
            _ => stripe.successful.fetch_add(1, Relaxed),
        };
        match raw.kind {
            Kind::Tracked => self.complete_tracked(w, code),
            _ => self.complete_probe(w, code),
        }
    }

    fn complete_tracked(self: &Arc<Self>, w: Word, code: u32) {
        let core = &**self;
        let gen = w.gen();
        let now = if core.window.needs_clock() {
            core.now_ns()
        } else {
            0
        };
        core.window.record(gen, code, now);
        let mut in_a_row = 0;
        if core.s.consecutive != 0 {
            if code == FAIL {
                in_a_row = core.bump_consecutive(gen);
            } else {
                core.clear_consecutive(gen);
            }
        }
        if code == OK || !w.is_automatic() || w.state() != CLOSED {
            return;
        }
        let counts = core.window.counts(gen, now);
        if let Some(cause) = core.trip_cause(counts, in_a_row) {
            let mut w = w;
            while w.gen() == gen && w.state() == CLOSED {
                if self.open(w, cause, counts) {
                    return;
                }
                w = Word(core.word.load(Acquire));
            }
        }
    }

    fn complete_probe(self: &Arc<Self>, w: Word, code: u32) {
        let core = &**self;
        if w.state() != HALF_OPEN {
            core.release_probe(w.gen());
            return;
        }
        // The latest probe's duration, from its deadline: what callers
        // rejected while the next probe runs are told to wait.
        let now = core.now_ns();
        let started =
            (w.deadline_ms().saturating_mul(NANOS_PER_MS)).saturating_sub(core.s.half_open_ns);
        core.last_probe_ns
            .store(now.saturating_sub(started).max(1), Relaxed);
        if code == OK {
            let successes = core.probe_succeeded(w.gen());
            if successes >= core.s.successes {
                self.close_with_counts(w, Cause::ProbesSucceeded, core.probe_counts(w.gen(), 0));
            }
        } else {
            let counts = core.probe_counts(w.gen(), code);
            core.release_probe(w.gen());
            self.open(w, Cause::ProbeFailed, counts);
        }
    }

    /// A call admitted but never completed: nothing is counted.
    pub(crate) fn cancel(self: &Arc<Self>, raw: Raw) {
        if raw.kind == Kind::Untracked {
            return;
        }
        self.stripe().ignored.fetch_add(1, Relaxed);
        if raw.kind == Kind::Probe {
            self.release_probe(raw.gen);
        }
    }

    // --- transitions ---

    /// Opens from `from` (closed, half-open or electing). Returns whether
    /// this call made the transition.
    fn open(self: &Arc<Self>, from: Word, cause: Cause, counts: Counts) -> bool {
        let core = &**self;
        let streak = if from.state() == CLOSED {
            0
        } else {
            core.streak.load(Relaxed).saturating_add(1)
        };
        let period = core.open_period(streak);
        let now = core.now_ns();
        // Open deadlines are kept in whole milliseconds, rounded down, so the
        // advertised wait never exceeds the period.
        let to = from.next(OPEN, (now + period) / NANOS_PER_MS);
        if core.cas(from, to).is_err() {
            return false;
        }
        core.streak.store(streak, Relaxed);
        core.opened.fetch_add(1, Relaxed);
        let period = Duration::from_nanos(period);
        self.after_transition(from, to, cause, counts, Some(period));
        if let Some(link) = &core.store {
            link.shared_open.store(false, Relaxed);
            // The fleet's prober failed: re-open with its token, so the
            // longer period and the count of re-opens are shared.
            let token = if from.state() == HALF_OPEN {
                link.take_token()
            } else {
                None
            };
            self.store_open(to, period, token);
        }
        true
    }

    /// Leaves an open state whose period is over: to half-open, or, with a
    /// store, to the election of the fleet's prober.
    fn leave_open(self: &Arc<Self>, from: Word, now: u64) {
        if self.store.is_some() {
            let deadline = (now + self.s.half_open_ns).div_ceil(NANOS_PER_MS);
            let to = from.next(ELECTING, deadline);
            if self.cas(from, to).is_ok() {
                self.elect(to);
            }
        } else {
            self.half_open(from, now, Cause::OpenPeriodOver);
        }
    }

    fn half_open(self: &Arc<Self>, from: Word, now: u64, cause: Cause) -> bool {
        let core = &**self;
        let deadline = (now + core.s.half_open_ns).div_ceil(NANOS_PER_MS);
        let to = from.next(HALF_OPEN, deadline);
        if core.cas(from, to).is_err() {
            return false;
        }
        self.after_transition(from, to, cause, Counts::default(), None);
        true
    }

    fn close_with(self: &Arc<Self>, from: Word, cause: Cause) -> bool {
        self.close_with_counts(from, cause, Counts::default())
    }

    fn close_with_counts(self: &Arc<Self>, from: Word, cause: Cause, counts: Counts) -> bool {
        let core = &**self;
        let now = core.now_ns();
        let ramp = if core.s.ramp_ns == 0 {
            0
        } else {
            (now + core.s.ramp_ns).div_ceil(NANOS_PER_MS).max(1)
        };
        let to = from.next(CLOSED, ramp);
        if core.cas(from, to).is_err() {
            return false;
        }
        core.streak.store(0, Relaxed);
        core.window_epoch.store(to.gen(), Release);
        self.after_transition(from, to, cause, counts, None);
        if let Some(link) = &core.store {
            link.shared_open.store(false, Relaxed);
            if cause != Cause::Store {
                self.store_close(link);
            }
        }
        true
    }

    fn after_transition(
        self: &Arc<Self>,
        from: Word,
        to: Word,
        cause: Cause,
        counts: Counts,
        open_for: Option<Duration>,
    ) {
        let core = &**self;
        let now = core.now_ns();
        let previous = core.last_transition.swap(now + 1, AcqRel);
        // How long the circuit was in the state it leaves (since the
        // breaker was built, for its first transition).
        let after_ms = now.saturating_sub(previous.saturating_sub(1)) / NANOS_PER_MS;
        let rate = |n: u64| {
            if counts.calls == 0 {
                0.0
            } else {
                n as f64 / counts.calls as f64
            }
        };
        let name = &*core.name;
        match (to.state(), cause) {
            (_, Cause::ModeChanged) => tracing::warn!(
                breaker = name,
                mode = ?to.mode(),
                "circuit_mode_changed"
            ),
            (OPEN, _) => tracing::warn!(
                breaker = name,
                cause = ?cause,
                failure_rate = rate(counts.failures),
                slow_rate = rate(counts.slow),
                calls = counts.calls,
                failures = counts.failures,
                slow = counts.slow,
                after_ms,
                open_for_ms = open_for.map_or(0, |d| d.as_millis() as u64),
                times_opened = core.opened.load(Relaxed),
                "circuit_opened"
            ),
            (HALF_OPEN, _) => tracing::info!(
                breaker = name,
                cause = ?cause,
                open_ms = after_ms,
                times_opened = core.opened.load(Relaxed),
                rejected_total = core.totals().rejected,
                "circuit_half_open"
            ),
            (CLOSED, _) => tracing::info!(
                breaker = name,
                cause = ?cause,
                probes_succeeded = counts.calls,
                after_ms,
                times_opened = core.opened.load(Relaxed),
                rejected_total = core.totals().rejected,
                "circuit_closed"
            ),
            _ => {}
        }
        if let Some(listener) = &core.config.listener {
            listener.on_transition(&Transition {
                name: core.name.clone(),
                from: from.public_state(),
                to: to.public_state(),
                mode: to.mode(),
                cause,
                window: window_counts(counts),
                open_for,
                at: core.base + Duration::from_nanos(now),
            });
        }
    }

    // --- the shared store ---

    fn maybe_refresh(self: &Arc<Self>, link: &StoreLink, now: u64) {
        let next = link.next_refresh_ns.load(Relaxed);
        if now < next
            || link
                .next_refresh_ns
                .compare_exchange(next, now + link.refresh_ns.max(1), Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        let this = Arc::clone(self);
        spawn(async move {
            let core = &*this;
            let Some(link) = &core.store else { return };
            let asked = core.now_ns();
            let result = link.store.read(&core.name).await;
            this.apply_read(&result, asked);
        });
    }

    /// Adopts what a read of the store said.
    fn apply_read(self: &Arc<Self>, result: &Result<Decision, StoreError>, asked: u64) {
        match result {
            Ok(Decision::Open { remaining }) => {
                self.store_ok();
                self.adopt_open(*remaining, asked);
            }
            Ok(Decision::Closed) => {
                self.store_ok();
                self.adopt_closed(asked);
                self.rewrite_open();
            }
            Ok(Decision::Expired) => {
                self.store_ok();
                // The fleet's circuit is open and its probe is due: take
                // part in the election rather than send everything.
                self.adopt_open(Duration::ZERO, asked);
                self.rewrite_open();
            }
            Err(e) => self.store_failed("read", e),
        }
    }

    /// The store does not hold this process's opening (the write-through
    /// failed while the store was down, or the store lost its data): write
    /// it again, so that sharing resumes by itself.
    fn rewrite_open(self: &Arc<Self>) {
        let core = &**self;
        let Some(link) = &core.store else { return };
        let w = Word(core.word.load(Acquire));
        let now = core.now_ns();
        let deadline_ns = w.deadline_ms().saturating_mul(NANOS_PER_MS);
        if w.state() != OPEN
            || !w.is_automatic()
            || link.shared_open.load(Relaxed)
            || deadline_ns <= now
        {
            return;
        }
        self.store_open(w, Duration::from_nanos(deadline_ns - now), None);
    }

    /// Another process opened the circuit: open here too, unless this
    /// process moved since it asked.
    fn adopt_open(self: &Arc<Self>, remaining: Duration, asked: u64) {
        let core = &**self;
        let Some(link) = &core.store else { return };
        let from = Word(core.word.load(Acquire));
        if from.state() != CLOSED
            || !from.is_automatic()
            || core.last_transition.load(Acquire) > asked
        {
            return;
        }
        let now = core.now_ns();
        // A zero `remaining` (an expired record) opens with the period
        // already over: the next call starts an election.
        let to = from.next(OPEN, (now + nanos(remaining)) / NANOS_PER_MS);
        // What this process had seen itself when the fleet's decision
        // arrived.
        let counts = core.window.counts(from.gen(), now);
        if core.cas(from, to).is_ok() {
            link.shared_open.store(true, Relaxed);
            core.streak.store(0, Relaxed);
            core.opened.fetch_add(1, Relaxed);
            self.after_transition(from, to, Cause::Store, counts, Some(remaining));
        }
    }

    /// The store holds no opening any more (a prober elsewhere closed it):
    /// close here too, unless this process opened since it asked.
    fn adopt_closed(self: &Arc<Self>, asked: u64) {
        let core = &**self;
        let Some(link) = &core.store else { return };
        let from = Word(core.word.load(Acquire));
        if !link.shared_open.load(Relaxed)
            || !matches!(from.state(), OPEN | ELECTING)
            || !from.is_automatic()
            || core.last_transition.load(Acquire) > asked
        {
            return;
        }
        self.close_with(from, Cause::Store);
    }

    /// Writes a local opening through to the store (as the re-open of the
    /// election `token` won, if any); the store's time wins if it already
    /// holds a later one.
    fn store_open(self: &Arc<Self>, opened: Word, period: Duration, token: Option<ProbeToken>) {
        let this = Arc::clone(self);
        spawn(async move {
            let core = &*this;
            let Some(link) = &core.store else { return };
            let result = match token {
                Some(token) => link.store.reopen(&core.name, token, period).await,
                None => link.store.try_open(&core.name, period).await,
            };
            match result {
                Ok(remaining) => {
                    this.store_ok();
                    if Word(core.word.load(Acquire)).gen() == opened.gen() {
                        link.shared_open.store(true, Relaxed);
                    }
                    let now = core.now_ns();
                    let until = (now + nanos(remaining)) / NANOS_PER_MS;
                    if until != opened.deadline_ms() {
                        let _ = core.cas(opened, opened.with_deadline(until));
                    }
                }
                Err(e) => this.store_failed(
                    if token.is_some() {
                        "reopen"
                    } else {
                        "try_open"
                    },
                    &e,
                ),
            }
        });
    }

    /// Asks the store who probes, fleet-wide.
    fn elect(self: &Arc<Self>, electing: Word) {
        let this = Arc::clone(self);
        let period =
            Duration::from_nanos(self.open_period(self.streak.load(Relaxed).saturating_add(1)));
        spawn(async move {
            let core = &*this;
            let Some(link) = &core.store else { return };
            let now = |core: &Core| core.now_ns();
            let result = link.store.try_acquire_probe(&core.name, period).await;
            if result.is_ok() {
                this.store_ok();
            }
            match result {
                Ok(Election::Won(token)) => {
                    *link.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(token);
                    // Grow from the fleet's re-opens, not only this
                    // process's.
                    core.streak.fetch_max(token.reopens(), Relaxed);
                    this.half_open(electing, now(core), Cause::OpenPeriodOver);
                }
                Ok(Election::Lost { remaining }) => {
                    let until = (now(core) + nanos(remaining)) / NANOS_PER_MS;
                    if core.cas(electing, electing.next(OPEN, until)).is_ok() {
                        link.shared_open.store(true, Relaxed);
                    }
                }
                Ok(Election::Closed) => {
                    this.close_with(electing, Cause::Store);
                }
                Err(e) => {
                    this.store_failed("try_acquire_probe", &e);
                    this.election_failed(electing, now(core));
                }
            }
        });
    }

    /// The election failed or never answered: probe locally (fail open),
    /// or stay open one more refresh interval and ask again (fail closed).
    fn election_failed(self: &Arc<Self>, electing: Word, now: u64) {
        let core = &**self;
        match &core.store {
            Some(link) if link.fail_closed => {
                let until = (now + link.refresh_ns.max(NANOS_PER_MS)) / NANOS_PER_MS;
                let _ = core.cas(electing, electing.next(OPEN, until));
            }
            _ => {
                self.half_open(electing, now, Cause::OpenPeriodOver);
            }
        }
    }

    fn store_close(self: &Arc<Self>, link: &StoreLink) {
        let Some(token) = link.take_token() else {
            return;
        };
        let this = Arc::clone(self);
        spawn(async move {
            let core = &*this;
            let Some(link) = &core.store else { return };
            match link.store.close(&core.name, token).await {
                Ok(_) => this.store_ok(),
                Err(e) => this.store_failed("close", &e),
            }
        });
    }

    /// Whether fail-closed mode rejects the closed path now.
    #[inline]
    fn store_blocks(&self) -> bool {
        self.store
            .as_ref()
            .is_some_and(|link| link.fail_closed && link.down.load(Relaxed))
    }

    /// A store call worked: the store is up.
    fn store_ok(&self) {
        if let Some(link) = &self.store {
            if link.down.load(Relaxed) {
                link.down.store(false, Relaxed);
                tracing::info!(breaker = %self.name, "circuit_store_recovered");
            }
        }
    }

    /// Keeps the local decision (or, failing closed, rejects until the
    /// store answers) and raises the alarm.
    fn store_failed(self: &Arc<Self>, operation: &'static str, error: &StoreError) {
        let core = &**self;
        if let Some(link) = &core.store {
            link.down.store(true, Relaxed);
        }
        core.store_errors.fetch_add(1, Relaxed);
        tracing::warn!(
            breaker = %core.name,
            operation,
            error = %error,
            "circuit_store_failed"
        );
    }

    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.base))
    }

    /// The start time of a call, if slow-call detection needs it.
    #[inline]
    pub(crate) fn started_ns(&self, raw: Raw) -> u64 {
        if self.s.slow_ns != 0 && raw.kind != Kind::Untracked {
            self.now_ns()
        } else {
            0
        }
    }

    #[inline]
    pub(crate) fn elapsed(&self, started_ns: u64) -> Option<Duration> {
        (self.s.slow_ns != 0)
            .then(|| Duration::from_nanos(self.now_ns().saturating_sub(started_ns)))
    }

    fn cas(&self, from: Word, to: Word) -> Result<(), Word> {
        self.word
            .compare_exchange(from.0, to.0, AcqRel, Acquire)
            .map(drop)
            .map_err(Word)
    }

    #[inline]
    fn stripe(&self) -> &Stripe {
        &self.stripes[thread_index() % STRIPES]
    }

    fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for s in self.stripes.iter() {
            t.successful += s.successful.load(Relaxed);
            t.failed += s.failed.load(Relaxed);
            t.slow += s.slow.load(Relaxed);
            t.ignored += s.ignored.load(Relaxed);
            t.rejected += s.rejected.load(Relaxed);
            t.stale += s.stale.load(Relaxed);
            t.passed_in_metrics_only += s.passed.load(Relaxed);
        }
        t.opened = self.opened.load(Relaxed);
        t.store_errors = self.store_errors.load(Relaxed);
        t
    }

    /// Whether the window (or the failures in a row) says open.
    fn trip_cause(&self, c: Counts, in_a_row: u64) -> Option<Cause> {
        if self.s.consecutive != 0 && in_a_row >= self.s.consecutive {
            return Some(Cause::ConsecutiveFailures);
        }
        if c.calls < self.s.minimum_calls || c.calls == 0 {
            return None;
        }
        if c.failures * PPM >= self.s.failure_ppm * c.calls {
            return Some(Cause::FailureRate);
        }
        if self.s.slow_ns != 0 && c.slow * PPM >= self.s.slow_ppm * c.calls {
            return Some(Cause::SlowCallRate);
        }
        None
    }

    /// The open period after `streak` re-opens in a row, in nanoseconds:
    /// grown, capped, then jittered, so that periods at the cap still
    /// differ between breakers (and a fleet does not probe in lockstep).
    fn open_period(&self, streak: u32) -> u64 {
        let s = &self.s;
        let grown =
            (s.open_ns as f64 * s.growth.powi(streak.min(64) as i32)).min(s.max_open_ns as f64);
        let jittered = if s.jitter > 0.0 {
            grown * (1.0 + s.jitter * (2.0 * unit(&*self.config.random) - 1.0))
        } else {
            grown
        };
        jittered.max(0.0) as u64
    }

    /// Probe slots of generation `gen` held now.
    fn probes_held(&self, gen: u32) -> u64 {
        let probes = self.probes.load(Acquire);
        if probe_gen(probes) == gen {
            probe_in_flight(probes)
        } else {
            0
        }
    }

    /// The probes' outcomes in the half-open state of `gen` so far, plus
    /// `last` (a failed or slow probe; 0 for none): the window a transition
    /// out of half-open reports.
    fn probe_counts(&self, gen: u32, last: u32) -> Counts {
        let probes = self.probes.load(Acquire);
        let successes = if probe_gen(probes) == gen {
            probes & 0xF_FFFF
        } else {
            0
        };
        Counts {
            calls: successes + u64::from(last != 0),
            failures: u64::from(last == FAIL),
            slow: u64::from(last == SLOW),
        }
    }

    /// What a caller refused while half-open is told: about when the
    /// probe in flight should finish (its start plus the duration of the
    /// last probe, or 1 s before any probe finished; once overdue, one
    /// such duration more), never beyond the probe's timeout.
    fn probe_retry_after(&self, deadline_ns: u64, now: u64) -> Duration {
        let remaining = deadline_ns.saturating_sub(now);
        let typical = match self.last_probe_ns.load(Relaxed) {
            0 => NANOS_PER_SEC,
            d => d,
        };
        let started = deadline_ns.saturating_sub(self.s.half_open_ns);
        let expected = match (started + typical).saturating_sub(now) {
            0 => typical,
            left => left,
        };
        Duration::from_nanos(expected.max(NANOS_PER_MS).min(remaining))
    }

    fn bump_consecutive(&self, gen: u32) -> u64 {
        let mut current = self.consecutive.load(Relaxed);
        loop {
            let next = if (current >> 32) as u32 == gen {
                current + 1
            } else {
                (u64::from(gen) << 32) | 1
            };
            match self
                .consecutive
                .compare_exchange_weak(current, next, Relaxed, Relaxed)
            {
                Ok(_) => return next & 0xFFFF_FFFF,
                Err(actual) => current = actual,
            }
        }
    }

    fn clear_consecutive(&self, gen: u32) {
        let current = self.consecutive.load(Relaxed);
        if current & 0xFFFF_FFFF != 0 || (current >> 32) as u32 != gen {
            self.consecutive.store(u64::from(gen) << 32, Relaxed);
        }
    }

    /// Takes a probe slot of generation `gen`, if one is free.
    fn try_probe(&self, gen: u32) -> bool {
        let mut current = self.probes.load(Acquire);
        loop {
            let held = probe_gen(current);
            let next = if held != gen {
                if is_newer(held, gen) {
                    return false;
                }
                probe_word(gen, 1, 0)
            } else if probe_in_flight(current) >= self.s.probes {
                return false;
            } else {
                current + (1 << 20)
            };
            match self
                .probes
                .compare_exchange_weak(current, next, AcqRel, Acquire)
            {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// A probe of `gen` succeeded: frees its slot and returns the successes
    /// in a row so far.
    fn probe_succeeded(&self, gen: u32) -> u64 {
        let mut current = self.probes.load(Acquire);
        loop {
            if probe_gen(current) != gen {
                return 0;
            }
            let next = probe_word(
                gen,
                probe_in_flight(current).saturating_sub(1),
                (current & 0xF_FFFF) + 1,
            );
            match self
                .probes
                .compare_exchange_weak(current, next, AcqRel, Acquire)
            {
                Ok(_) => return next & 0xF_FFFF,
                Err(actual) => current = actual,
            }
        }
    }

    fn release_probe(&self, gen: u32) {
        let mut current = self.probes.load(Acquire);
        loop {
            if probe_gen(current) != gen || probe_in_flight(current) == 0 {
                return;
            }
            match self
                .probes
                .compare_exchange_weak(current, current - (1 << 20), AcqRel, Acquire)
            {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }
}

fn probe_word(gen: u32, in_flight: u64, successes: u64) -> u64 {
    (u64::from(gen & GEN_MASK) << 40) | (in_flight.min(0xF_FFFF) << 20) | successes.min(0xF_FFFF)
}

fn probe_gen(word: u64) -> u32 {
    (word >> 40) as u32 & GEN_MASK
}

fn probe_in_flight(word: u64) -> u64 {
    (word >> 20) & 0xF_FFFF
}

fn window_counts(c: Counts) -> WindowCounts {
    WindowCounts {
        calls: c.calls,
        failures: c.failures,
        slow: c.slow,
    }
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 4)
}

fn spawn<F>(future: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    // Without a runtime there is no store traffic: the local decision
    // stands (fail open).
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(future);
    }
}

/// The index of the current thread's stripe.
pub(crate) fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|index| {
        let i = index.get();
        if i != usize::MAX {
            return i;
        }
        let i = NEXT.fetch_add(1, Relaxed);
        index.set(i);
        i
    })
}
