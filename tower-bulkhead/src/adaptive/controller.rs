//! The compartment's side of an adaptive limit: sampling calls, adding
//! their signals up per window in atomics, and running the algorithm once
//! per window under a try-lock.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use tokio::time::Instant;

use super::{LimitAlgorithm, Window};
use crate::metrics::CompartmentMetrics;

/// One call in this many (a power of two) is timed (per thread), once a window has
/// [`MIN_SAMPLES`] samples: 16.
pub const SAMPLE_EVERY: u32 = 16;
/// A window closes once it has this many timed calls and congestion
/// signals together (or has lasted [`MAX_WINDOW`]): 10. Until then every
/// call is timed.
pub const MIN_SAMPLES: u64 = 10;
/// The shortest window: 10 ms.
pub const MIN_WINDOW: Duration = Duration::from_millis(10);
/// The longest window: 2 s.
pub const MAX_WINDOW: Duration = Duration::from_secs(2);

/// `start_ns` of a call that is not timed; also "none" in latency atomics.
pub(crate) const NOT_TIMED: u64 = u64::MAX;
/// The least time between two limit-change events of one compartment.
const LOG_INTERVAL_NS: u64 = 1_000_000_000;

thread_local! {
    static TICK: Cell<u32> = const { Cell::new(0) };
}

/// Builds a fresh algorithm per compartment (each key gets its own).
pub(crate) type Factory = Arc<dyn Fn() -> Box<dyn LimitAlgorithm> + Send + Sync>;

/// How a compartment's limit is set: fixed, or by an algorithm.
#[derive(Clone)]
pub(crate) enum LimitSpec {
    Fixed(usize),
    Adaptive(Factory),
}

/// How a call ended, as its permit tells the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Not told: the caller dropped the call before it completed.
    Dropped,
    /// Completed: a sample, if timed.
    Completed,
    /// Cut by a deadline or a timeout, or answered "overloaded".
    Congested,
    /// Failed otherwise: no signal.
    Ignored,
}

/// The adaptive state of one compartment.
pub(crate) struct Controller {
    algorithm: Mutex<Box<dyn LimitAlgorithm>>,
    min: usize,
    max: usize,
    epoch: Instant,
    window_start_ns: AtomicU64,
    window_len_ns: AtomicU64,
    samples: AtomicU64,
    sum_ns: AtomicU64,
    min_ns: AtomicU64,
    max_ns: AtomicU64,
    max_in_flight: AtomicUsize,
    congestion: AtomicU64,
    congested_samples: AtomicU64,
    recent_ns: AtomicU64,
    no_load_ns: AtomicU64,
    last_log_ns: AtomicU64,
    suppressed: AtomicU64,
}

// === impl LimitSpec ===

impl LimitSpec {
    pub(crate) fn adaptive<A: LimitAlgorithm + Clone>(algorithm: A) -> Self {
        Self::Adaptive(Arc::new(move || Box::new(algorithm.clone())))
    }
}

impl fmt::Debug for LimitSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(limit) => f.debug_tuple("Fixed").field(limit).finish(),
            Self::Adaptive(_) => f.write_str("Adaptive"),
        }
    }
}

// === impl Controller ===

impl Controller {
    /// The controller of a new compartment, and its initial limit.
    pub(crate) fn new(algorithm: Box<dyn LimitAlgorithm>, epoch: Instant) -> (Self, usize) {
        let min = algorithm.min_limit().max(1);
        let max = algorithm.max_limit().max(min);
        let initial = algorithm.initial_limit().clamp(min, max);
        let controller = Self {
            algorithm: Mutex::new(algorithm),
            min,
            max,
            epoch,
            window_start_ns: AtomicU64::new(0),
            window_len_ns: AtomicU64::new(nanos(MIN_WINDOW)),
            samples: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            min_ns: AtomicU64::new(NOT_TIMED),
            max_ns: AtomicU64::new(0),
            max_in_flight: AtomicUsize::new(0),
            congestion: AtomicU64::new(0),
            congested_samples: AtomicU64::new(0),
            recent_ns: AtomicU64::new(NOT_TIMED),
            no_load_ns: AtomicU64::new(NOT_TIMED),
            last_log_ns: AtomicU64::new(NOT_TIMED),
            suppressed: AtomicU64::new(0),
        };
        controller
            .window_start_ns
            .store(controller.now_ns(), Relaxed);
        (controller, initial)
    }

    fn now_ns(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.epoch))
    }

    /// When a call takes a slot: the clock reading if this call is timed,
    /// [`NOT_TIMED`] otherwise (most calls: no clock read).
    #[inline]
    pub(crate) fn start(&self) -> u64 {
        let tick = TICK.with(|t| {
            let n = t.get().wrapping_add(1);
            t.set(n);
            n
        });
        if tick & (SAMPLE_EVERY - 1) == 0 || self.samples.load(Relaxed) < MIN_SAMPLES {
            self.now_ns()
        } else {
            NOT_TIMED
        }
    }

    /// When a call gives its slot back.
    #[inline]
    pub(crate) fn end(
        &self,
        limit: &crate::sync::AtomicUsize,
        name: &str,
        metrics: &CompartmentMetrics,
        start_ns: u64,
        in_flight: usize,
        ending: Ending,
    ) {
        match ending {
            Ending::Completed if start_ns != NOT_TIMED => {
                let now = self.now_ns();
                let latency = now.saturating_sub(start_ns);
                self.sum_ns.fetch_add(latency, Relaxed);
                self.min_ns.fetch_min(latency, Relaxed);
                self.max_ns.fetch_max(latency, Relaxed);
                self.max_in_flight.fetch_max(in_flight, Relaxed);
                // Counted last: a closer that sees the count sees the sum.
                self.samples.fetch_add(1, Relaxed);
                self.maybe_close(limit, name, metrics, now);
            }
            Ending::Dropped | Ending::Congested => self.congested(limit, name, metrics),
            Ending::Completed | Ending::Ignored => {}
        }
    }

    #[cold]
    fn congested(
        &self,
        limit: &crate::sync::AtomicUsize,
        name: &str,
        metrics: &CompartmentMetrics,
    ) {
        self.congestion.fetch_add(1, Relaxed);
        self.maybe_close(limit, name, metrics, self.now_ns());
    }

    /// Closes the window if it is due, from at most one call at a time.
    fn maybe_close(
        &self,
        limit: &crate::sync::AtomicUsize,
        name: &str,
        metrics: &CompartmentMetrics,
        now_ns: u64,
    ) {
        let start = self.window_start_ns.load(Relaxed);
        let elapsed = now_ns.saturating_sub(start);
        if elapsed < self.window_len_ns.load(Relaxed) {
            return;
        }
        // Calls that ended: timed ones, plus congestion signals of calls
        // that were not timed.
        let signals = self.samples.load(Relaxed).saturating_add(
            self.congestion
                .load(Relaxed)
                .saturating_sub(self.congested_samples.load(Relaxed)),
        );
        if elapsed < nanos(MAX_WINDOW) && signals < MIN_SAMPLES {
            return;
        }
        let mut algorithm = match self.algorithm.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        if self.window_start_ns.load(Relaxed) != start {
            return; // another call closed it meanwhile
        }
        let samples = self.samples.swap(0, Relaxed);
        let sum = self.sum_ns.swap(0, Relaxed);
        let min = self.min_ns.swap(NOT_TIMED, Relaxed);
        let max = self.max_ns.swap(0, Relaxed);
        let max_in_flight = self.max_in_flight.swap(0, Relaxed);
        let congestion = self.congestion.swap(0, Relaxed);
        let congested_samples = self.congested_samples.swap(0, Relaxed).min(samples);
        self.window_start_ns.store(now_ns, Relaxed);
        if samples == 0 && congestion == 0 {
            return; // nothing happened: nothing to learn
        }
        let (min, max) = if samples == 0 {
            (None, None)
        } else {
            (
                Some(Duration::from_nanos(min)),
                Some(Duration::from_nanos(max)),
            )
        };
        let window = Window::from_parts(
            self.epoch + Duration::from_nanos(now_ns),
            Duration::from_nanos(elapsed),
            samples,
            Duration::from_nanos(sum),
            min,
            max,
            max_in_flight,
            congestion,
            congested_samples,
        );
        let old = limit.load(Relaxed);
        let new = algorithm.update(old, &window).clamp(self.min, self.max);
        if let Some(mean) = window.mean_latency() {
            self.recent_ns.store(nanos(mean), Relaxed);
            let len = mean.saturating_mul(2).clamp(MIN_WINDOW, MAX_WINDOW);
            self.window_len_ns.store(nanos(len), Relaxed);
        }
        let no_load = algorithm.no_load_latency().map_or(NOT_TIMED, nanos);
        self.no_load_ns.store(no_load, Relaxed);
        if new != old {
            limit.store(new, Relaxed);
            metrics.limit(new);
            self.log_change(name, old, new, now_ns);
        }
    }

    /// At most one `DEBUG` event per compartment per second; the changes
    /// in between are reported with the next as `suppressed`.
    fn log_change(&self, name: &str, old: usize, new: usize, now_ns: u64) {
        if !tracing::enabled!(target: "tower_bulkhead::adaptive", tracing::Level::DEBUG) {
            return;
        }
        let last = self.last_log_ns.load(Relaxed);
        if last == NOT_TIMED || now_ns >= last.saturating_add(LOG_INTERVAL_NS) {
            self.last_log_ns.store(now_ns, Relaxed);
            let suppressed = self.suppressed.swap(0, Relaxed);
            tracing::debug!(
                target: "tower_bulkhead::adaptive",
                compartment = %name,
                from = old,
                limit = new,
                recent_latency_us = self.recent_latency().map_or(0, |d| d.as_micros() as u64),
                no_load_latency_us = self.no_load_latency().map_or(0, |d| d.as_micros() as u64),
                suppressed,
                "bulkhead limit changed"
            );
        } else {
            self.suppressed.fetch_add(1, Relaxed);
        }
    }

    /// The mean latency of the last window with timed calls.
    pub(crate) fn recent_latency(&self) -> Option<Duration> {
        duration(self.recent_ns.load(Relaxed))
    }

    /// The algorithm's no-load latency, as of the last window.
    pub(crate) fn no_load_latency(&self) -> Option<Duration> {
        duration(self.no_load_ns.load(Relaxed))
    }

    pub(crate) fn bounds(&self) -> (usize, usize) {
        (self.min, self.max)
    }
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("min", &self.min)
            .field("max", &self.max)
            .field("recent_latency", &self.recent_latency())
            .field("no_load_latency", &self.no_load_latency())
            .finish_non_exhaustive()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(NOT_TIMED - 1)
}

fn duration(ns: u64) -> Option<Duration> {
    (ns != NOT_TIMED).then(|| Duration::from_nanos(ns))
}
