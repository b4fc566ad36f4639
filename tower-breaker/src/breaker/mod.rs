//! The shared breaker: its public handle ([`Breaker`], [`Permit`]), the
//! local state machine ([`machine`]) and the synchronisation with a fleet
//! through a shared store ([`fleet`]).

mod fleet;
mod in_flight;
mod live;
mod machine;
mod retries;

pub(crate) use machine::Core;
use machine::{probe_gen, probe_in_flight, window_counts};
pub use retries::FleetRetries;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::classify::Outcome;
use crate::config::BreakerConfig;
use crate::error::CircuitOpen;
use crate::snapshot::{Cause, Snapshot, WindowCounts};
use crate::state::{Word, CLOSED, HALF_OPEN, OPEN};
use crate::store::StoreError;
use crate::window::Counts;
use crate::Mode;
use tower_resilience_base::Name;

pub(super) const NANOS_PER_MS: u64 = 1_000_000;
pub(super) const NANOS_PER_SEC: u64 = 1_000_000_000;
pub(super) const PPM: u64 = 1_000_000;
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
    /// This stripe's own copy of the name, for its refusals: the same
    /// `&'static str` (no reference count at all), or a shared string of
    /// its own (its own reference count).
    name: Name,
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
    /// When the call started (ns on the breaker's clock; 0 when slow calls
    /// are not timed) or, once `at_head`, how long it took up to its head.
    started_ns: u64,
    // The admission (`Raw`), its fields side by side so that the permit
    // is three words: it travels in every response body of a client stack.
    gen: u32,
    kind: Kind,
    stripe: u8,
    armed: bool,
    /// Whether `started_ns` holds the head's duration: the slow-call
    /// timing ended at the head ([`Permit::stop_at_head`]).
    at_head: bool,
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

// === impl Breaker ===

impl Breaker {
    /// A breaker with every default of [`BreakerConfig::new`].
    ///
    /// `name` appears in errors, events, snapshots and, with a store, in
    /// the store's key. A name written in the source (a `&'static str`)
    /// goes into every refusal without a reference count; one built at run
    /// time (a `String`) is shared (see [`Name`]). Times are measured from
    /// now, with [`tokio::time::Instant`] (so paused test time applies).
    pub fn new(name: impl Into<Name>) -> Self {
        Self::with_config(name, BreakerConfig::new())
    }

    /// A breaker with the given configuration, refusing a name its store
    /// cannot hold ([`Store::check_name`](crate::store::Store::check_name); without a store every name is
    /// fine), and refusing to share a store outside a tokio runtime (store
    /// calls run in spawned tasks).
    ///
    /// [`with_config`](Breaker::with_config) accepts such a name, logs a
    /// `circuit_store_invalid_name` error, and then every store call fails
    /// (see [`StoreFailureMode`](crate::store::StoreFailureMode)); outside a runtime it logs a
    /// `circuit_store_no_runtime` error, and each store call made on a
    /// thread without a runtime counts as a store failure.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`] when it refuses the name, or a
    /// [`StoreError`] when no tokio runtime is running.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_breaker::store::MemoryStore;
    /// use tower_breaker::{Breaker, BreakerConfig};
    ///
    /// let config = || BreakerConfig::new().store(Arc::new(MemoryStore::new()));
    /// // Outside a tokio runtime, the store could never be reached.
    /// assert!(Breaker::try_with_config("payments", config()).is_err());
    ///
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let _guard = runtime.enter();
    /// let breaker = Breaker::try_with_config("payments", config()).unwrap();
    /// # let _ = breaker;
    /// ```
    pub fn try_with_config(
        name: impl Into<Name>,
        config: BreakerConfig,
    ) -> Result<Self, StoreError> {
        let name = name.into();
        if let Some(store) = config.fleet.as_ref().map(|f| &f.store) {
            store.check_name(&name)?;
            if tokio::runtime::Handle::try_current().is_err() {
                return Err(StoreError::new(
                    "a breaker with a store must be built inside a tokio runtime \
                     (its store calls run in spawned tasks)",
                ));
            }
        }
        Ok(Self::with_config(name, config))
    }

    /// A breaker with the given configuration.
    pub fn with_config(name: impl Into<Name>, config: BreakerConfig) -> Self {
        let name: Name = name.into();
        let core = Arc::new(Core::new(Arc::from(&name), config));
        core.watch();
        if let Some(fleet) = &core.config.fleet {
            fleet.members.register(&core);
        }
        let shards = (0..STRIPES)
            .map(|_| {
                Arc::new(Shard {
                    core: Arc::clone(&core),
                    name: name.unshared(),
                })
            })
            .collect();
        Self { core, shards }
    }

    /// Reports the outcomes this breaker counted and has not reported to
    /// its store, and waits until its store calls (the report, queued
    /// writes of openings and closes) have ended, at most the fleet's
    /// [`flush_timeout`](crate::FleetConfig::flush_timeout). Returns at
    /// once, with no store call, when nothing is pending or the breaker
    /// has no store. Call it before a process is frozen or exits (see
    /// [`crate::flush`]; [`FleetConfig::flush`](crate::FleetConfig::flush)
    /// flushes every breaker of a fleet configuration).
    ///
    /// # Errors
    ///
    /// [`Unflushed`](crate::flush::Unflushed) when the bound ran out or
    /// the report failed.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_breaker::store::{MemoryStore, Store};
    /// use tower_breaker::{Breaker, BreakerConfig, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store = Arc::new(MemoryStore::new());
    /// let breaker = Breaker::with_config("ledger", BreakerConfig::new().store(store.clone()));
    /// for _ in 0..3 {
    ///     breaker.try_acquire().unwrap().record(Outcome::Success);
    /// }
    /// breaker.flush().await.unwrap();
    /// # }
    /// ```
    pub async fn flush(&self) -> Result<(), crate::flush::Unflushed> {
        let Some(fleet) = &self.core.config.fleet else {
            return Ok(());
        };
        let deadline = tokio::time::Instant::now() + fleet.flush_timeout;
        self.core.flush(deadline).await
    }

    /// The breaker's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The breaker's configuration: the one it was built with, as changed
    /// since by [`reconfigure`](Self::reconfigure).
    pub fn config(&self) -> BreakerConfig {
        self.core
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The last transitions (at most 10), oldest first: what a live view
    /// shows as the circuit's recent history. Recorded whether or not a
    /// [`Listener`](crate::snapshot::Listener) is configured.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker::{Breaker, Outcome, State};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let breaker = Breaker::new("catalog");
    /// for _ in 0..10 {
    ///     breaker.try_acquire().unwrap().record(Outcome::Failure);
    /// }
    /// let recent = breaker.recent_transitions();
    /// assert_eq!((recent[0].from, recent[0].to), (State::Closed, State::Open));
    /// # }
    /// ```
    #[must_use]
    pub fn recent_transitions(&self) -> Vec<crate::Transition> {
        self.core
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// Applies `config` to the running breaker, keeping its window, its
    /// state (an open circuit stays open, a probe in flight stays one) and
    /// its counters, and says what it changed.
    ///
    /// Thresholds (`failure_rate`, `minimum_calls`, the slow-call
    /// threshold and rate, `consecutive_failures`), the open period and its
    /// growth, cap and jitter, the probes, `successes_to_close`, the
    /// half-open wait, the ramp-up and the rejection-event interval apply
    /// at once: the next judgement uses them all, never a mix of the old
    /// and the new (a sequence lock; the closed path's one load is
    /// unchanged). An open period already running keeps the end it was
    /// given; the next opening uses the new period.
    ///
    /// What cannot change on a running breaker keeps its old value and is
    /// listed in [`Reconfigured::not_live`](crate::config::Reconfigured):
    /// the window's shape, turning slow-call detection on or off, the
    /// fleet's store and timings. The clock
    /// ([`BreakerConfig::coarse_clock`]) is live: a switch moves the
    /// breaker's readings by the coarse clock's lag at most. The random source and
    /// the listener stay the breaker's own. A fleet's breakers report the
    /// new thresholds with their next report.
    ///
    /// Emits `circuit_reconfigured` (info) with the settings applied.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_breaker::{Breaker, BreakerConfig, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let breaker = Breaker::new("catalog");
    /// for _ in 0..10 {
    ///     breaker.try_acquire().unwrap().record(Outcome::Failure);
    /// }
    /// assert!(breaker.try_acquire().is_err(), "open");
    /// let done = breaker.reconfigure(
    ///     breaker.config().failure_rate(0.2).open_period(Duration::from_secs(10)),
    /// );
    /// assert_eq!(done.applied, ["failure_rate", "open_period"]);
    /// assert!(done.is_complete());
    /// assert!(breaker.try_acquire().is_err(), "still open");
    /// # }
    /// ```
    pub fn reconfigure(&self, config: BreakerConfig) -> crate::config::Reconfigured {
        let core = &*self.core;
        let mut current = core
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (effective, done) = current.live_merge(&config);
        let s = live::Settings::of(&effective);
        core.s.set(&s);
        core.set_coarse_clock(effective.coarse_clock);
        if let Some(in_flight) = &core.in_flight {
            in_flight.set_threshold(s.slow_ns);
        }
        *current = effective;
        drop(current);
        if !done.applied.is_empty() || !done.not_live.is_empty() {
            tracing::info!(
                target: "tower_breaker",
                breaker = %core.name,
                applied = ?done.applied,
                not_live = ?done.not_live.iter().map(|n| n.setting).collect::<Vec<_>>(),
                "circuit_reconfigured"
            );
        }
        done
    }

    /// Asks to make one call.
    ///
    /// Closed: always granted (one atomic load). Open: refused until the
    /// open period is over; the first call after it moves the circuit to
    /// half-open and becomes a probe. Half-open: granted to at most
    /// `permitted_probes` calls at once. See the
    /// [crate docs](crate#semantics).
    ///
    /// With a [store](crate::store), the call that ends the open period
    /// cannot be the probe here: it starts the fleet's probe election and
    /// is refused, since this method cannot wait for the store. If this
    /// process wins, its next call probes; a winner with no call within
    /// about 1.3 s (the default lease) gives the probe back to the fleet.
    /// A caller that calls less often than that would start an election
    /// at every call and never probe: it should use
    /// [`acquire`](Self::acquire), which waits for the election (as the
    /// services do, in `poll_ready` or, keyed, in their future).
    ///
    /// # Errors
    ///
    /// [`CircuitOpen`] when the call must not be made.
    pub fn try_acquire(&self) -> Result<Permit, CircuitOpen> {
        self.admit()
            .and_then(|raw| self.permit(raw))
            .map_err(|rejection| self.open_error(rejection))
    }

    /// Asks to make one call, as [`try_acquire`](Self::try_acquire) does,
    /// and, with a [store](crate::store), waits for the fleet's probe
    /// election when this call is the one that ends the open period: won,
    /// this call is the probe (rather than the next one, which may never
    /// come); lost, it is refused with the time left. The wait is one
    /// store round trip, at most the
    /// [election timeout](crate::FleetConfig::election_timeout); every
    /// other call answers at once, as `try_acquire` does.
    ///
    /// # Errors
    ///
    /// [`CircuitOpen`] when the call must not be made.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tower_breaker::store::MemoryStore;
    /// use tower_breaker::{Breaker, BreakerConfig, Outcome, State};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let breaker = Breaker::with_config(
    ///     "billing",
    ///     BreakerConfig::new()
    ///         .count_window(1)
    ///         .minimum_calls(1)
    ///         .open_period(Duration::from_secs(5))
    ///         .jitter(0.0)
    ///         .store(Arc::new(MemoryStore::new())),
    /// );
    /// breaker.acquire().await.unwrap().record(Outcome::Failure);
    /// assert_eq!(breaker.snapshot().state, State::Open);
    /// tokio::task::yield_now().await; // the opening is written through
    /// tokio::time::advance(Duration::from_secs(5)).await;
    /// // The call that ends the open period wins the election and probes.
    /// let probe = breaker.acquire().await.expect("the probe");
    /// assert_eq!(breaker.snapshot().state, State::HalfOpen);
    /// probe.record(Outcome::Success);
    /// assert_eq!(breaker.snapshot().state, State::Closed);
    /// # }
    /// ```
    pub async fn acquire(&self) -> Result<Permit, CircuitOpen> {
        let mut wait = ElectionWait::default();
        std::future::poll_fn(|cx| self.poll_election(&mut wait, cx)).await;
        self.try_acquire()
    }

    /// The part of a service's `poll_ready` that makes the call ending the
    /// open period wait for the fleet's election it starts (with a store
    /// only; ready at once otherwise, and for every other call).
    ///
    /// Its fast path (no wait in flight, no store) is two loads and is
    /// inlined into the service's `poll_ready`; the rest is out of line.
    #[inline(always)]
    pub(crate) fn poll_election(&self, wait: &mut ElectionWait, cx: &mut Context<'_>) -> Poll<()> {
        if wait.0.is_none() && self.core.store.is_none() {
            return Poll::Ready(());
        }
        self.poll_election_slow(wait, cx)
    }

    #[inline(never)]
    fn poll_election_slow(&self, wait: &mut ElectionWait, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(future) = &mut wait.0 {
            if future.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            wait.0 = None;
            // What the wait found may call for another: a read first that
            // found the fleet's period over (a thawed instance, a quiet
            // process) leaves the circuit open with its period over, and
            // this call then waits for the election it starts, as the
            // call that ends an open period does. (Without this, the call
            // started the election without waiting, was refused, and the
            // winner had no call to probe with.) Never a second read
            // first: one that timed out is not waited for again.
            return self.core.poll_start_election(wait, cx, false);
        }
        self.core.poll_start_election(wait, cx, true)
    }

    #[inline]
    pub(crate) fn admit(&self) -> Result<Raw, Rejection> {
        self.core.admit()
    }

    /// Whether admitting a call that goes through reads the real clock: a
    /// breaker with a store or with slow-call detection (a breaker on the
    /// coarse clock reads that one, an atomic load). A refusal while open
    /// also reads it, but then nothing below needs the reading.
    #[inline]
    pub(crate) fn reads_clock(&self) -> bool {
        let core = &*self.core;
        !core.is_coarse() && (core.store.is_some() || core.s.slow_ns() != 0)
    }

    /// The permit of admission `raw`, its start time taken; refused if
    /// the calls in flight that this start judged opened the circuit.
    #[inline]
    pub(crate) fn permit(&self, raw: Raw) -> Result<Permit, Rejection> {
        Ok(self.permit_started(raw, self.core.started_ns(raw)?))
    }

    /// A permit for an admission whose start time was already taken.
    #[inline]
    pub(crate) fn permit_started(&self, raw: Raw, started_ns: u64) -> Permit {
        let stripe = thread_index() % STRIPES;
        Permit {
            shard: Arc::clone(&self.shards[stripe]),
            started_ns,
            gen: raw.gen,
            kind: raw.kind,
            stripe: stripe as u8,
            armed: true,
            at_head: false,
        }
    }

    /// The breaker's identity (its state machine's address), for the hook
    /// to tell its own response futures from another breaker's.
    #[inline]
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.core) as usize
    }

    pub(crate) fn open_error(&self, rejection: Rejection) -> CircuitOpen {
        // Each stripe has its own copy of the name, so that rejections on
        // different threads do not contend on one reference count.
        let name = &self.shards[thread_index() % STRIPES].name;
        CircuitOpen::new(name.clone(), rejection.retry_after, rejection.forced)
    }

    pub(crate) fn complete(
        &self,
        raw: Raw,
        outcome: Outcome,
        (elapsed, now_ns): (Option<Duration>, Option<u64>),
    ) {
        self.core.complete(raw, outcome, elapsed, now_ns);
    }

    pub(crate) fn cancel(&self, raw: Raw) {
        self.core.cancel(raw);
    }

    /// See [`Core::stop_timing`].
    #[inline]
    pub(crate) fn stop_timing(&self, raw: Raw, started_ns: u64) {
        self.core.stop_timing(raw, started_ns);
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
                retry_after: Duration::from_nanos(core.s.open_ns()),
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
        core.metrics.rejected();
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
        let asked = core.asked();
        link.next_refresh_ns
            .store(asked.ns + link.refresh_ns.max(1), Relaxed);
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
            HALF_OPEN if core.probes_held(w.gen()) < core.s.probes() => Some(Duration::ZERO),
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
            window: WindowCounts {
                slow_in_flight: if w.state() == CLOSED {
                    core.slow_in_flight(w.gen(), now)
                } else {
                    0
                },
                ..window_counts(counts)
            },
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
        self.kind == Kind::Probe
    }

    /// The admission this permit holds.
    #[inline]
    fn raw(&self) -> Raw {
        Raw {
            gen: self.gen,
            kind: self.kind,
        }
    }

    /// Counts the call's outcome. With slow-call detection on, a success is
    /// slow if the time since [`Breaker::try_acquire`] reached the
    /// threshold.
    pub fn record(mut self, outcome: Outcome) {
        if self.at_head {
            let elapsed = Duration::from_nanos(self.started_ns);
            return self.record_with_elapsed(outcome, elapsed);
        }
        self.armed = false;
        self.shard.core.stop_timing(self.raw(), self.started_ns);
        let (elapsed, now_ns) = self.shard.core.elapsed(self.started_ns);
        self.shard.core.complete_at(
            usize::from(self.stripe),
            self.raw(),
            outcome,
            elapsed,
            now_ns,
        );
    }

    /// The head has arrived: when the breaker's slow-call timing ends at
    /// the head (`CallEnd::Head`), the call's duration is taken now and is
    /// the one [`record`](Self::record) counts later, at the body's end.
    #[inline]
    pub(crate) fn stop_at_head(&mut self) {
        if let Some(elapsed) = self.shard.core.head_elapsed(self.started_ns) {
            self.shard.core.stop_timing(self.raw(), self.started_ns);
            self.started_ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
            self.at_head = true;
        }
    }

    /// Counts the call's outcome, with the call's duration measured by the
    /// caller.
    pub fn record_with_elapsed(mut self, outcome: Outcome, elapsed: Duration) {
        self.armed = false;
        if !self.at_head {
            self.shard.core.stop_timing(self.raw(), self.started_ns);
        }
        self.shard.core.complete_at(
            usize::from(self.stripe),
            self.raw(),
            outcome,
            Some(elapsed),
            None,
        );
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.armed {
            if !self.at_head {
                self.shard.core.stop_timing(self.raw(), self.started_ns);
            }
            self.shard.core.cancel(self.raw());
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

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 4)
}

pub(crate) use tower_resilience_base::stripe::thread_index;

/// The wait of the call that started a probe election, kept by a service
/// between its `poll_ready` calls. Empty (no allocation) unless this
/// service's call ended an open period; a clone starts empty.
#[derive(Default)]
pub(crate) struct ElectionWait(Option<Pin<Box<dyn Future<Output = ()> + Send + Sync>>>);

impl Clone for ElectionWait {
    fn clone(&self) -> Self {
        Self(None)
    }
}

impl fmt::Debug for ElectionWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "ElectionWait(waiting)"
        } else {
            "ElectionWait(idle)"
        })
    }
}
