//! The local state machine: admission, counting, transitions and probes,
//! all on atomics of one [`Core`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower_resilience_base::clock::CoarseClock;

use super::fleet::StoreLink;
use super::in_flight::InFlight;
use super::live::{LiveSettings, Settings};
use super::{nanos, thread_index, Kind, Raw, Rejection, NANOS_PER_MS, NANOS_PER_SEC, PPM, STRIPES};
use crate::classify::Outcome;
use crate::config::{BreakerConfig, WindowKind, DEFAULT_REFRESH_INTERVAL};
use crate::metrics::{BreakerMetrics, ProbeResult};
use crate::snapshot::{Cause, Totals, Transition, WindowCounts};
use crate::state::{is_newer, Padded, Phase, Word, CLOSED, ELECTING, GEN_MASK, HALF_OPEN, OPEN};
use crate::store::StoreError;
use crate::sync::{AtomicU32, AtomicU64, Ordering::*};
use crate::window::{CountWindow, Counts, TimeWindow, Window, FAIL, OK, SLOW};
use crate::Mode;
use tower_resilience_base::random::unit;

/// [`Core::coarse_offset`] while the breaker reads tokio's clock.
pub(super) const COARSE_OFF: i64 = i64::MIN;

/// How many transitions a breaker remembers for
/// `Breaker::recent_transitions`.
pub(crate) const RECENT_TRANSITIONS: usize = 10;

pub(crate) struct Core {
    pub(super) word: Padded<AtomicU64>,
    /// Half-open probes: generation (20 bits) << 40 | in flight << 20 |
    /// successes.
    pub(super) probes: Padded<AtomicU64>,
    pub(super) window: Window,
    /// Generation << 32 | failures in a row.
    pub(super) consecutive: AtomicU64,
    /// Re-opens in a row (0 for an opening from closed).
    pub(super) streak: AtomicU32,
    /// The generation of the last closed state, whose window the snapshot
    /// shows.
    pub(super) window_epoch: AtomicU32,
    pub(super) opened: AtomicU64,
    /// How long the last probe that completed took, in nanoseconds (0 =
    /// none yet): what callers rejected while half-open are told to wait.
    pub(super) last_probe_ns: AtomicU64,
    /// Nanoseconds since `base` plus one of the last transition; 0 = never.
    pub(super) last_transition: AtomicU64,
    /// How many transitions there have been: a store's answer asked before
    /// the latest one is not adopted (a count, not a time, so that a
    /// coarse or paused clock cannot make them tie).
    pub(super) transitions: AtomicU64,
    pub(super) next_rejection_event_ms: AtomicU64,
    pub(super) store_errors: AtomicU64,
    pub(super) stripes: Box<[Stripe]>,
    /// Closed-state calls in flight by start time, when slow-call
    /// detection is on: hung calls are slow evidence before they end.
    pub(super) in_flight: Option<InFlight>,
    pub(crate) name: Arc<str>,
    pub(super) base: Instant,
    /// The coarse clock, from the configuration the breaker was built
    /// with or the first that switched it on (`BreakerConfig::coarse_clock`,
    /// live): it stays; [`coarse_offset`](Self::coarse_offset) says whether
    /// it is read.
    pub(super) coarse_clock: std::sync::OnceLock<&'static CoarseClock>,
    /// While the breaker tells time by the coarse clock, where the coarse
    /// clock's origin lies from `base`, in signed nanoseconds (a reading is
    /// then one atomic load and an addition); [`COARSE_OFF`] while it reads
    /// tokio's clock. Both clocks count from `base`, so a switch moves the
    /// readings by the coarse clock's lag at most. Not a modelled atomic:
    /// it changes only by reconfiguration.
    pub(super) coarse_offset: std::sync::atomic::AtomicI64,
    pub(super) s: LiveSettings,
    /// The last [`RECENT_TRANSITIONS`] transitions, oldest first
    /// (`Breaker::recent_transitions`; transitions are rare, so a lock).
    pub(super) recent: std::sync::Mutex<std::collections::VecDeque<Transition>>,
    /// The configuration as last set (`Breaker::reconfigure`), for
    /// `Breaker::config`.
    pub(super) current: std::sync::Mutex<BreakerConfig>,
    pub(super) config: BreakerConfig,
    pub(super) store: Option<StoreLink>,
    /// Woken when a probe election ends (the call that started it waits).
    pub(super) elected: tokio::sync::Notify,
    /// The `metrics` handles (nothing without the feature).
    pub(super) metrics: BreakerMetrics,
}

/// Figures written by every call, one set per thread stripe so that
/// threads do not contend on them.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct Stripe {
    pub(super) successful: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) slow: AtomicU64,
    pub(super) ignored: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) stale: AtomicU64,
    pub(super) passed: AtomicU64,
}

// === impl Core ===

impl Core {
    /// The state machine of a breaker named `name`, closed, with an empty
    /// window.
    pub(super) fn new(name: Arc<str>, config: BreakerConfig) -> Self {
        let window = match config.window {
            WindowKind::Count { size } => Window::Count(CountWindow::new(size)),
            WindowKind::Time { buckets, bucket } => {
                Window::Time(TimeWindow::new(buckets, nanos(bucket).max(1)))
            }
        };
        let s = Settings::of(&config);
        let coarse = config.coarse_clock;
        let store = StoreLink::for_config(&config, &name);
        let metrics = BreakerMetrics::new(&name);
        // Generation 1: epoch 0 would read as "empty" in the time window.
        let first = Word::new(CLOSED, Mode::Automatic, 1, 0);
        let base = Instant::now();
        let coarse_clock = std::sync::OnceLock::new();
        let coarse_offset = std::sync::atomic::AtomicI64::new(COARSE_OFF);
        let core = Core {
            word: Padded(AtomicU64::new(first.0)),
            probes: Padded(AtomicU64::new(0)),
            window,
            consecutive: AtomicU64::new(0),
            streak: AtomicU32::new(0),
            window_epoch: AtomicU32::new(1),
            opened: AtomicU64::new(0),
            last_probe_ns: AtomicU64::new(0),
            last_transition: AtomicU64::new(0),
            transitions: AtomicU64::new(0),
            next_rejection_event_ms: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
            in_flight: (s.slow_ns != 0).then(|| InFlight::new(s.slow_ns)),
            s: LiveSettings::new(&s),
            current: std::sync::Mutex::new(config.clone()),
            recent: std::sync::Mutex::new(std::collections::VecDeque::with_capacity(
                RECENT_TRANSITIONS,
            )),
            name,
            base,
            coarse_clock,
            coarse_offset,
            config,
            store,
            elected: tokio::sync::Notify::new(),
            metrics,
        };
        core.set_coarse_clock(coarse);
        core
    }

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
    pub(super) fn admit_slow(self: &Arc<Self>, mut w: Word) -> Result<Raw, Rejection> {
        let core = &**self;
        let now = core.call_now_ns();
        if let Some(link) = &core.store {
            self.maybe_refresh(link, now);
            link.note_call(now);
        }
        let decision = loop {
            let tracked = Raw {
                gen: w.gen(),
                kind: Kind::Tracked,
            };
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
                        retry_after: Duration::from_nanos(core.s.open_ns()),
                        forced: true,
                    })
                }
                Mode::Automatic | Mode::MetricsOnly => {}
            }
            let ns = |ms: u64| ms.saturating_mul(NANOS_PER_MS);
            match w.phase() {
                // closed -> (no change): fail closed, the fleet's decision
                // is unknown.
                Phase::Closed { .. } if core.store_blocks() => {
                    break Err(Rejection {
                        retry_after: core
                            .config
                            .fleet
                            .as_ref()
                            .map_or(DEFAULT_REFRESH_INTERVAL, |f| f.refresh_interval),
                        forced: false,
                    });
                }
                Phase::Closed { ramp_until_ms: 0 } => return Ok(tracked),
                // closed (ramping up) -> closed: the ramp is over.
                Phase::Closed { ramp_until_ms } if now >= ns(ramp_until_ms) => {
                    let _ = core.cas(w, w.with_deadline(0));
                    return Ok(tracked);
                }
                Phase::Closed { ramp_until_ms } => {
                    // Ramping up after closing: admit a growing share.
                    let start = ns(ramp_until_ms).saturating_sub(core.s.ramp_ns());
                    let share = (now.saturating_sub(start)) as f64 / core.s.ramp_ns().max(1) as f64;
                    if unit(&*core.config.random) < share {
                        return Ok(tracked);
                    }
                    break Err(Rejection {
                        retry_after: Duration::ZERO,
                        forced: false,
                    });
                }
                Phase::Open { until_ms } if now < ns(until_ms) => {
                    break Err(Rejection {
                        retry_after: match &core.store {
                            Some(link) => link.open_retry_after(ns(until_ms), now),
                            None => Duration::from_nanos(ns(until_ms) - now),
                        },
                        forced: false,
                    })
                }
                // open -> half-open (or -> electing, with a store): the
                // period is over; the first caller moves the circuit on,
                // everyone then competes for a probe slot.
                Phase::Open { .. } => {
                    let _ = self.leave_open(w, now);
                }
                Phase::HalfOpen { probe_deadline_ms } => {
                    let deadline_ns = ns(probe_deadline_ms);
                    if core.probes_held(w.gen()) >= core.s.probes() {
                        if now < deadline_ns {
                            break Err(Rejection {
                                retry_after: core.probe_retry_after(deadline_ns, now),
                                forced: false,
                            });
                        }
                        // half-open -> open: every slot is held and the
                        // latest probe has been out for the whole wait: it
                        // hangs.
                        let counts = core.probe_counts(w.gen(), 0);
                        if self.open(w, Cause::ProbeTimedOut, counts) {
                            core.metrics.probe(ProbeResult::TimedOut);
                        }
                    } else {
                        // half-open -> half-open (new probe deadline): a slot
                        // looks free. This call's probe gets the whole
                        // wait, written before the slot is taken: a caller
                        // that sees the slot taken and the old deadline
                        // passed then fails its compare-and-swap from the
                        // old word, and never times this probe out early.
                        let deadline = (now + core.s.half_open_ns()).div_ceil(NANOS_PER_MS);
                        let probing = if deadline > probe_deadline_ms {
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
                // electing -> half-open (fail open) or -> open (fail
                // closed): the election never answered.
                Phase::Electing { until_ms } if now >= ns(until_ms) => {
                    self.store_failed("try_acquire_probe", &StoreError::new("election timed out"));
                    self.election_failed(w, now);
                }
                Phase::Electing { until_ms } => {
                    break Err(Rejection {
                        retry_after: Duration::from_nanos(ns(until_ms) - now),
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
        core.metrics.rejected();
        self.rejection_event(now);
        decision
    }

    pub(super) fn rejection_event(self: &Arc<Self>, now: u64) {
        let core = &**self;
        let now_ms = now / NANOS_PER_MS;
        let next = core.next_rejection_event_ms.load(Relaxed);
        if now_ms >= next
            && core
                .next_rejection_event_ms
                .compare_exchange(next, now_ms + core.s.rejection_event_ms(), Relaxed, Relaxed)
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
        now_ns: Option<u64>,
    ) {
        self.complete_at(thread_index(), raw, outcome, elapsed, now_ns);
    }

    /// [`complete`](Self::complete), counting in the figures of stripe
    /// `stripe`.
    #[inline]
    pub(super) fn complete_at(
        self: &Arc<Self>,
        stripe: usize,
        raw: Raw,
        outcome: Outcome,
        elapsed: Option<Duration>,
        now_ns: Option<u64>,
    ) {
        let core = &**self;
        if raw.kind == Kind::Untracked {
            return;
        }
        let stripe = &core.stripes[stripe % STRIPES];
        let code = match outcome {
            Outcome::Ignored => {
                stripe.ignored.fetch_add(1, Relaxed);
                core.metrics.ignored();
                if raw.kind == Kind::Probe {
                    core.metrics.probe(ProbeResult::Ignored);
                    core.release_probe(raw.gen);
                }
                return;
            }
            Outcome::Failure => FAIL,
            Outcome::Success
                if core.s.slow_ns() != 0
                    && elapsed.is_some_and(|e| nanos(e) >= core.s.slow_ns()) =>
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
            core.metrics.stale();
            if raw.kind == Kind::Probe {
                core.metrics.probe(ProbeResult::Ignored);
                core.release_probe(raw.gen);
            }
            return;
        }
        match code {
            FAIL => {
                core.metrics.failure();
                stripe.failed.fetch_add(1, Relaxed)
            }
            SLOW => {
                core.metrics.slow();
                stripe.slow.fetch_add(1, Relaxed);
                stripe.successful.fetch_add(1, Relaxed)
            }
            _ => {
                core.metrics.success();
                stripe.successful.fetch_add(1, Relaxed)
            }
        };
        match raw.kind {
            Kind::Tracked => self.complete_tracked(w, code, now_ns),
            _ => self.complete_probe(w, code),
        }
    }

    /// Counts a closed-state outcome; closed -> open when the window (or
    /// the run of failures) says so.
    ///
    /// `now_ns` is the clock reading made as the call ended (the one its
    /// duration was measured with), if one was made.
    pub(super) fn complete_tracked(self: &Arc<Self>, w: Word, code: u32, now_ns: Option<u64>) {
        let core = &**self;
        let gen = w.gen();
        let now = if core.window.needs_clock() {
            // The reading the call's duration was measured with, if any:
            // one clock read per call end, not two.
            now_ns.unwrap_or_else(|| core.now_ns())
        } else {
            0
        };
        core.window.record(gen, code, now);
        let mut in_a_row = 0;
        if core.s.consecutive() != 0 {
            if code == FAIL {
                in_a_row = core.bump_consecutive(gen);
            } else {
                core.clear_consecutive(gen);
            }
        }
        if code == OK || !w.is_automatic() || w.state() != CLOSED {
            return;
        }
        if core.store.is_some() {
            // Failures are news for the fleet: report them soon.
            let now = if now == 0 { core.now_ns() } else { now };
            self.flush_failures(now);
        }
        let counts = if core.in_flight.is_some() {
            core.evidence(gen, now, if now == 0 { core.now_ns() } else { now })
        } else {
            core.window.counts(gen, now)
        };
        if let Some(cause) = core.trip_cause(counts, in_a_row) {
            self.while_unmoved(w, |w| self.open(w, cause, counts));
        }
    }

    /// Counts a probe's outcome: half-open -> closed after enough
    /// successes, half-open -> open on a failed or slow probe.
    pub(super) fn complete_probe(self: &Arc<Self>, w: Word, code: u32) {
        let core = &**self;
        if w.state() != HALF_OPEN {
            core.metrics.probe(ProbeResult::Ignored);
            core.release_probe(w.gen());
            return;
        }
        // The latest probe's duration, from its deadline: what callers
        // rejected while the next probe runs are told to wait.
        let now = core.now_ns();
        let started =
            (w.deadline_ms().saturating_mul(NANOS_PER_MS)).saturating_sub(core.s.half_open_ns());
        core.last_probe_ns
            .store(now.saturating_sub(started).max(1), Relaxed);
        let gen = w.gen();
        if code == OK {
            core.metrics.probe(ProbeResult::Success);
            let successes = core.probe_succeeded(gen);
            if successes >= core.s.successes() {
                let counts = core.probe_counts(gen, 0);
                self.while_unmoved(w, |w| {
                    self.close_with_counts(w, Cause::ProbesSucceeded, counts)
                });
            }
        } else {
            core.metrics.probe(ProbeResult::Failure);
            let counts = core.probe_counts(gen, code);
            core.release_probe(gen);
            self.while_unmoved(w, |w| self.open(w, Cause::ProbeFailed, counts));
        }
    }

    /// Makes `transition` from the word `w`, retried from the current word
    /// while the circuit is still in `w`'s state and generation: a word can
    /// change within them (a ramp-up ending, a caller taking another probe
    /// slot renews the probe deadline), and an outcome that decides a
    /// transition must not be lost to that (a half-open circuit would wait
    /// for a later probe).
    fn while_unmoved(&self, mut w: Word, mut transition: impl FnMut(Word) -> bool) {
        let (gen, state) = (w.gen(), w.state());
        while !transition(w) {
            w = Word(self.word.load(Acquire));
            if w.gen() != gen || w.state() != state {
                return;
            }
        }
    }

    /// A call admitted but never completed: nothing is counted.
    pub(crate) fn cancel(self: &Arc<Self>, raw: Raw) {
        if raw.kind == Kind::Untracked {
            return;
        }
        self.stripe().ignored.fetch_add(1, Relaxed);
        self.metrics.ignored();
        if raw.kind == Kind::Probe {
            self.metrics.probe(ProbeResult::Ignored);
            self.release_probe(raw.gen);
        }
    }

    // --- transitions ---

    /// closed | half-open | electing -> open: opens from `from`, for the
    /// period of the streak of re-opens. Returns whether this call made the
    /// transition.
    pub(super) fn open(self: &Arc<Self>, from: Word, cause: Cause, counts: Counts) -> bool {
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

    /// open -> half-open, or open -> electing with a store: leaves an open
    /// state whose period is over. Returns the electing word when this call
    /// started an election.
    pub(super) fn leave_open(self: &Arc<Self>, from: Word, now: u64) -> Option<Word> {
        if self.store.is_some() {
            // Electing until the election answers, at the latest after the
            // election timeout: what refused callers are told to wait.
            let deadline = (now + self.s.election_ns()).div_ceil(NANOS_PER_MS);
            let to = from.next(ELECTING, deadline);
            if self.cas(from, to).is_ok() {
                self.elect(to);
                return Some(to);
            }
        } else {
            self.half_open(from, now, Cause::OpenPeriodOver);
        }
        None
    }

    /// open | electing -> half-open: probing starts (locally, or as the
    /// fleet's elected prober).
    pub(super) fn half_open(self: &Arc<Self>, from: Word, now: u64, cause: Cause) -> bool {
        let core = &**self;
        let deadline = (now + core.s.half_open_ns()).div_ceil(NANOS_PER_MS);
        let to = from.next(HALF_OPEN, deadline);
        if core.cas(from, to).is_err() {
            return false;
        }
        self.after_transition(from, to, cause, Counts::default(), None);
        true
    }

    /// half-open | open | electing -> closed, with nothing to report (the
    /// store said so).
    pub(super) fn close_with(self: &Arc<Self>, from: Word, cause: Cause) -> bool {
        self.close_with_counts(from, cause, Counts::default())
    }

    /// half-open | open | electing -> closed: a fresh window, the growth
    /// reset, the ramp-up started; `counts` are the probes' outcomes.
    pub(super) fn close_with_counts(
        self: &Arc<Self>,
        from: Word,
        cause: Cause,
        counts: Counts,
    ) -> bool {
        let core = &**self;
        let now = core.now_ns();
        let ramp = if core.s.ramp_ns() == 0 {
            0
        } else {
            (now + core.s.ramp_ns()).div_ceil(NANOS_PER_MS).max(1)
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

    pub(super) fn after_transition(
        self: &Arc<Self>,
        from: Word,
        to: Word,
        cause: Cause,
        counts: Counts,
        open_for: Option<Duration>,
    ) {
        let core = &**self;
        let now = core.now_ns();
        core.transitions.fetch_add(1, AcqRel);
        if let Some(link) = core
            .store
            .as_ref()
            .filter(|_| !matches!(cause, Cause::Store))
        {
            // This process moved on its own: what it heard of another
            // process's probe no longer describes its state.
            link.forget_probe();
        }
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
        core.metrics.transition(
            (from.public_state(), from.mode()),
            (to.public_state(), to.mode()),
        );
        let name = &*core.name;
        match (to.state(), cause) {
            (_, Cause::ModeChanged) => tracing::warn!(
                breaker = name,
                mode = ?to.mode(),
                "circuit_mode_changed"
            ),
            // Not a failure: this process won the fleet's probe and had no
            // call to probe with; an alert on openings must not fire.
            (OPEN, Cause::ProbeGivenBack) => tracing::info!(
                breaker = name,
                held_ms = after_ms,
                open_for_ms = open_for.map_or(0, |d| d.as_millis() as u64),
                "circuit_probe_given_back"
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
        let transition = Transition {
            name: core.name.clone(),
            from: from.public_state(),
            to: to.public_state(),
            mode: to.mode(),
            cause,
            window: window_counts(counts),
            open_for,
            at: core.base + Duration::from_nanos(now),
        };
        if let Some(listener) = &core.config.listener {
            listener.on_transition(&transition);
        }
        let mut recent = core
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if recent.len() == RECENT_TRANSITIONS {
            recent.pop_front();
        }
        recent.push_back(transition);
    }
    /// Nanoseconds since `base`, now.
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.coarse_ns()
            .unwrap_or_else(|| nanos(crate::sync::since(self.base)))
    }

    /// Nanoseconds since `base` by the coarse clock, while the breaker
    /// tells time by it.
    #[inline]
    fn coarse_ns(&self) -> Option<u64> {
        let offset = self.coarse_offset.load(Relaxed);
        if offset == COARSE_OFF {
            return None;
        }
        Some(self.coarse_reading(offset))
    }

    /// The coarse clock's reading, in nanoseconds since `base`, its origin
    /// being `offset` from `base`. Out of line: inlined, it grew every
    /// caller, the paths that never read it too.
    #[inline(never)]
    fn coarse_reading(&self, offset: i64) -> u64 {
        self.coarse_clock
            .get()
            .map_or(0, |clock| clock.nanos_since(offset))
    }

    /// Whether the breaker tells time by the coarse clock now.
    #[inline]
    pub(super) fn is_coarse(&self) -> bool {
        self.coarse_offset.load(Relaxed) != COARSE_OFF
    }

    /// Tells time by `clock` from now on, or by tokio's clock (`None`). A
    /// breaker keeps the first coarse clock it was given (there is one per
    /// process, but for tests).
    pub(super) fn set_coarse_clock(&self, clock: Option<&'static CoarseClock>) {
        let offset = clock.map_or(COARSE_OFF, |clock| {
            // Before `base` for a clock started before the breaker was
            // built; after it for one first started by a switch later on.
            self.coarse_clock
                .get_or_init(|| clock)
                .offset_from(self.base)
        });
        self.coarse_offset.store(offset, Relaxed);
    }

    /// Nanoseconds since `base` at the moment of the call being made: the
    /// reading a layer above made for the call, if any, else
    /// [`now_ns`](Self::now_ns) (the coarse clock, when configured, is
    /// cheaper than looking).
    #[inline]
    pub(crate) fn call_now_ns(&self) -> u64 {
        self.coarse_ns()
            .unwrap_or_else(|| nanos(crate::sync::call_since(self.base)))
    }

    /// The start time of a call, if slow-call detection needs it. A
    /// closed-state call is then counted in flight (see [`InFlight`]) until
    /// [`stop_timing`](Self::stop_timing); the first call of a new bucket
    /// judges the calls in flight for longer than the threshold.
    ///
    /// When that judgement opens the circuit, this call, admitted a moment
    /// before, is refused as the calls after it are (the rejection an
    /// admission now gives).
    #[inline]
    pub(crate) fn started_ns(self: &Arc<Self>, raw: Raw) -> Result<u64, Rejection> {
        if self.s.slow_ns() == 0 || raw.kind == Kind::Untracked {
            return Ok(0);
        }
        let now = self.call_now_ns();
        if raw.kind == Kind::Tracked {
            if let Some(in_flight) = &self.in_flight {
                if in_flight.enter(raw.gen, now) && self.judge_in_flight(raw.gen, now) {
                    in_flight.leave(raw.gen, now);
                    // Open now: the admission is refused and counted as a
                    // rejection. (Closed again already, which takes a
                    // probe's round trip, it goes on, its outcome stale.)
                    self.admit()?;
                }
            }
        }
        Ok(now)
    }

    /// The call admitted as `raw` at `started_ns` is no longer timed (it
    /// ended, was cancelled, or its timing ended at its head): it leaves
    /// the calls in flight. Call it once per [`started_ns`](Self::started_ns).
    #[inline]
    pub(crate) fn stop_timing(&self, raw: Raw, started_ns: u64) {
        if raw.kind == Kind::Tracked {
            if let Some(in_flight) = &self.in_flight {
                in_flight.leave(raw.gen, started_ns);
            }
        }
    }

    /// The calls of closed generation `gen` in flight for longer than the
    /// slow-call threshold at `now` (0 without slow-call detection).
    pub(super) fn slow_in_flight(&self, gen: u32, now: u64) -> u64 {
        self.in_flight
            .as_ref()
            .map_or(0, |in_flight| in_flight.stuck(gen, now))
    }

    /// The window's counts with the calls in flight for longer than the
    /// threshold added as slow calls: the evidence a judgement weighs.
    ///
    /// A count window holds the last `N` calls, and calls in flight are
    /// among the latest: they displace the window's oldest outcomes, whose
    /// mix is taken to be the window's (the order of outcomes is not kept
    /// by their kind). A time window holds every call of its span, and
    /// calls in flight started in it: they are added.
    pub(super) fn evidence(&self, gen: u32, window_now: u64, now: u64) -> Counts {
        let mut counts = self.window.counts(gen, window_now);
        let stuck = self.slow_in_flight(gen, now);
        if stuck == 0 {
            return counts;
        }
        if let Some(size) = self.window.size() {
            let stuck = stuck.min(size);
            let keep = counts.calls.min(size - stuck);
            if keep < counts.calls {
                counts.failures = counts.failures * keep / counts.calls;
                counts.slow = counts.slow * keep / counts.calls;
                counts.calls = keep;
            }
            counts.calls += stuck;
            counts.slow += stuck;
            return counts;
        }
        counts.calls += stuck;
        counts.slow += stuck;
        counts
    }

    /// A sweep: with the calls of `gen` in flight for longer than the
    /// threshold counted as slow, does the closed window say open?
    /// (closed -> open, before any of those calls ends.)
    /// Returns whether the circuit of `gen` is no longer closed.
    #[cold]
    fn judge_in_flight(self: &Arc<Self>, gen: u32, now: u64) -> bool {
        let core = &**self;
        let mut w = Word(core.word.load(Acquire));
        if w.gen() != gen || w.state() != CLOSED || !w.is_automatic() {
            return false;
        }
        if core.slow_in_flight(gen, now) == 0 {
            return false;
        }
        let window_now = if core.window.needs_clock() { now } else { 0 };
        let counts = core.evidence(gen, window_now, now);
        // Usually the slow-call rate; the failure rate when outcomes that
        // left a time window made it reach its threshold meanwhile.
        let Some(cause) = core.trip_cause(counts, 0) else {
            return false;
        };
        while w.gen() == gen && w.state() == CLOSED {
            if self.open(w, cause, counts) {
                return true;
            }
            w = Word(core.word.load(Acquire));
        }
        true
    }

    /// The duration of a call that started at `started_ns` and whose head
    /// has just arrived, when slow-call timing ends at the head; `None`
    /// when it ends at the body's end (or is off).
    #[inline]
    pub(crate) fn head_elapsed(&self, started_ns: u64) -> Option<Duration> {
        if self.s.slow_ns() == 0 || !self.s.slow_at_head() {
            return None;
        }
        Some(Duration::from_nanos(
            self.now_ns().saturating_sub(started_ns),
        ))
    }

    /// The duration of a call that started at `started_ns`, if slow-call
    /// detection needs it, with the clock reading it was measured with, for
    /// the window to count the call at.
    #[inline]
    pub(crate) fn elapsed(&self, started_ns: u64) -> (Option<Duration>, Option<u64>) {
        if self.s.slow_ns() == 0 {
            return (None, None);
        }
        let now = self.now_ns();
        (
            Some(Duration::from_nanos(now.saturating_sub(started_ns))),
            Some(now),
        )
    }

    pub(super) fn cas(&self, from: Word, to: Word) -> Result<(), Word> {
        self.word
            .compare_exchange(from.0, to.0, AcqRel, Acquire)
            .map(drop)
            .map_err(Word)
    }

    #[inline]
    pub(super) fn stripe(&self) -> &Stripe {
        &self.stripes[thread_index() % STRIPES]
    }

    pub(super) fn totals(&self) -> Totals {
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
    pub(super) fn trip_cause(&self, c: Counts, in_a_row: u64) -> Option<Cause> {
        // One consistent set of thresholds, even during a reconfiguration.
        let s = self.s.get();
        if s.consecutive != 0 && in_a_row >= s.consecutive {
            return Some(Cause::ConsecutiveFailures);
        }
        if c.calls < s.minimum_calls || c.calls == 0 {
            return None;
        }
        if c.failures * PPM >= s.failure_ppm * c.calls {
            return Some(Cause::FailureRate);
        }
        if s.slow_ns != 0 && c.slow * PPM >= s.slow_ppm * c.calls {
            return Some(Cause::SlowCallRate);
        }
        None
    }

    /// The open period after `streak` re-opens in a row, in nanoseconds:
    /// grown, capped, then jittered, so that periods at the cap still
    /// differ between breakers (and a fleet does not probe in lockstep).
    pub(super) fn open_period(&self, streak: u32) -> u64 {
        let s = self.s.get();
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
    pub(super) fn probes_held(&self, gen: u32) -> u64 {
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
    pub(super) fn probe_counts(&self, gen: u32, last: u32) -> Counts {
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
    pub(super) fn probe_retry_after(&self, deadline_ns: u64, now: u64) -> Duration {
        let remaining = deadline_ns.saturating_sub(now);
        let typical = match self.last_probe_ns.load(Relaxed) {
            0 => NANOS_PER_SEC,
            d => d,
        };
        let started = deadline_ns.saturating_sub(self.s.half_open_ns());
        let expected = match (started + typical).saturating_sub(now) {
            0 => typical,
            left => left,
        };
        Duration::from_nanos(expected.max(NANOS_PER_MS).min(remaining))
    }

    pub(super) fn bump_consecutive(&self, gen: u32) -> u64 {
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

    pub(super) fn clear_consecutive(&self, gen: u32) {
        let current = self.consecutive.load(Relaxed);
        if current & 0xFFFF_FFFF != 0 || (current >> 32) as u32 != gen {
            self.consecutive.store(u64::from(gen) << 32, Relaxed);
        }
    }

    /// Takes a probe slot of generation `gen`, if one is free.
    pub(super) fn try_probe(&self, gen: u32) -> bool {
        let mut current = self.probes.load(Acquire);
        loop {
            let held = probe_gen(current);
            let next = if held != gen {
                if is_newer(held, gen) {
                    return false;
                }
                probe_word(gen, 1, 0)
            } else if probe_in_flight(current) >= self.s.probes() {
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
    pub(super) fn probe_succeeded(&self, gen: u32) -> u64 {
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

    pub(super) fn release_probe(&self, gen: u32) {
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

pub(super) fn probe_word(gen: u32, in_flight: u64, successes: u64) -> u64 {
    (u64::from(gen & GEN_MASK) << 40) | (in_flight.min(0xF_FFFF) << 20) | successes.min(0xF_FFFF)
}

pub(super) fn probe_gen(word: u64) -> u32 {
    (word >> 40) as u32 & GEN_MASK
}

pub(super) fn probe_in_flight(word: u64) -> u64 {
    (word >> 20) & 0xF_FFFF
}

pub(super) fn window_counts(c: Counts) -> WindowCounts {
    WindowCounts {
        calls: c.calls,
        failures: c.failures,
        slow: c.slow,
        slow_in_flight: 0,
    }
}

#[cfg(all(test, tower_resilience_loom))]
mod loom_models;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::time::Duration;

    use tower_resilience_base::clock::CoarseClock;

    use crate::{Breaker, BreakerConfig, Outcome, State};

    /// A breaker telling time by a clock which only the test advances; and
    /// a function that sets the breaker's time to `ms` milliseconds (never
    /// backwards).
    fn on_coarse_clock(config: BreakerConfig) -> (Breaker, impl Fn(u64)) {
        let clock = CoarseClock::manual();
        let mut config = config;
        config.coarse_clock = Some(clock);
        let breaker = Breaker::with_config("coarse", config);
        let offset = breaker.core.coarse_offset.load(Relaxed);
        assert!(offset <= 0, "configured, with a clock started before");
        let offset = offset.unsigned_abs();
        // The breaker's time 0 is its creation, `offset` after the clock's
        // origin.
        clock.advance(Duration::from_nanos(offset));
        let at = AtomicU64::new(0);
        let set = move |ms: u64| {
            let from = at.swap(ms, Relaxed);
            clock.advance(Duration::from_millis(ms.saturating_sub(from)));
        };
        (breaker, set)
    }

    #[test]
    fn slow_calls_are_timed_by_the_coarse_clock() {
        let (breaker, set) = on_coarse_clock(
            BreakerConfig::new()
                .count_window(2)
                .minimum_calls(2)
                .slow_calls(Duration::from_millis(100), 0.5)
                .jitter(0.0),
        );
        let fast = breaker.try_acquire().expect("closed");
        set(99);
        fast.record(Outcome::Success);
        assert_eq!(breaker.snapshot().window.slow, 0, "99 ms is not slow");
        let slow = breaker.try_acquire().expect("closed");
        set(199);
        slow.record(Outcome::Success);
        let s = breaker.snapshot();
        assert_eq!(s.window.slow, 1, "100 ms on the coarse clock is slow");
        assert_eq!(s.state, State::Open, "half the window slow");
    }

    /// A breaker switched to a coarse clock that was started after it
    /// (the first switch of a process starts the shared one) keeps
    /// counting from its own creation: the clock's readings are moved
    /// forward by the time between the two, not clamped to it.
    #[test]
    fn a_clock_started_after_the_breaker_counts_from_the_breakers_creation() {
        let breaker = Breaker::with_config("late", BreakerConfig::new());
        let core = &breaker.core;
        let clock = CoarseClock::manual();
        let gap = super::nanos(
            clock
                .origin()
                .checked_duration_since(core.base)
                .expect("started after the breaker"),
        );
        core.set_coarse_clock(Some(clock));
        assert_eq!(
            core.now_ns(),
            gap,
            "the clock's origin, on the breaker's time"
        );
        clock.advance(Duration::from_millis(5));
        assert_eq!(core.now_ns(), gap + 5_000_000);
        core.set_coarse_clock(None);
        assert!(
            core.now_ns() >= gap,
            "tokio's clock again, from the same base"
        );
    }

    #[test]
    fn the_open_period_ends_by_the_coarse_clock() {
        let (breaker, set) = on_coarse_clock(
            BreakerConfig::new()
                .count_window(1)
                .minimum_calls(1)
                .open_period(Duration::from_secs(5))
                .jitter(0.0),
        );
        breaker
            .try_acquire()
            .expect("closed")
            .record(Outcome::Failure);
        set(4_999);
        assert!(breaker.try_acquire().is_err(), "still open at 4.999 s");
        set(5_000);
        let probe = breaker.try_acquire().expect("the open period is over");
        assert!(probe.is_probe());
    }

    #[test]
    fn a_time_window_counts_by_the_coarse_clock() {
        let (breaker, set) = on_coarse_clock(
            BreakerConfig::new()
                .time_window(2, Duration::from_secs(1))
                .minimum_calls(100),
        );
        breaker
            .try_acquire()
            .expect("closed")
            .record(Outcome::Failure);
        assert_eq!(breaker.snapshot().window.calls, 1);
        // Two buckets of 1 s later, the failure has left the window.
        set(2_500);
        assert_eq!(breaker.snapshot().window.calls, 0);
    }
}
