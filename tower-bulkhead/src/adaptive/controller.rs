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
                self.sample(now.saturating_sub(start_ns), in_flight);
                self.maybe_close(limit, name, metrics, now);
            }
            Ending::Dropped | Ending::Congested => {
                self.congested(limit, name, metrics, start_ns, in_flight);
            }
            Ending::Completed | Ending::Ignored => {}
        }
    }

    #[inline]
    fn sample(&self, latency: u64, in_flight: usize) {
        self.sum_ns.fetch_add(latency, Relaxed);
        self.min_ns.fetch_min(latency, Relaxed);
        self.max_ns.fetch_max(latency, Relaxed);
        self.max_in_flight.fetch_max(in_flight, Relaxed);
        // Counted last: a closer that sees the count sees the sum.
        self.samples.fetch_add(1, Relaxed);
    }

    /// A congestion signal; if the call was timed, also a sample whose
    /// latency is when it was cut.
    #[cold]
    fn congested(
        &self,
        limit: &crate::sync::AtomicUsize,
        name: &str,
        metrics: &CompartmentMetrics,
        start_ns: u64,
        in_flight: usize,
    ) {
        let now = self.now_ns();
        if start_ns != NOT_TIMED {
            self.congested_samples.fetch_add(1, Relaxed);
            self.sample(now.saturating_sub(start_ns), in_flight);
        }
        self.congestion.fetch_add(1, Relaxed);
        self.maybe_close(limit, name, metrics, now);
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

#[cfg(test)]
mod tests {
    //! The controller alone, on the paused clock: which calls it times,
    //! when a window closes and what the algorithm is told, how the limit
    //! and the window's length follow, and the rate-limited change event.

    use std::sync::atomic::AtomicUsize as StdAtomicUsize;
    use std::sync::Mutex as StdMutex;

    use tokio::time::advance;

    use super::*;
    use crate::sync::AtomicUsize;

    const MS: Duration = Duration::from_millis(1);

    /// An algorithm that records every window it is shown (with the limit
    /// it was shown with) and answers the limit the test sets.
    #[derive(Clone)]
    struct Script {
        initial: usize,
        min: usize,
        max: usize,
        answer: Arc<StdAtomicUsize>,
        seen: Arc<StdMutex<Vec<(usize, Window)>>>,
        no_load: Option<Duration>,
    }

    impl Script {
        fn new(initial: usize, min: usize, max: usize) -> Self {
            Self {
                initial,
                min,
                max,
                answer: Arc::new(StdAtomicUsize::new(initial)),
                seen: Arc::default(),
                no_load: None,
            }
        }
    }

    impl LimitAlgorithm for Script {
        fn initial_limit(&self) -> usize {
            self.initial
        }
        fn min_limit(&self) -> usize {
            self.min
        }
        fn max_limit(&self) -> usize {
            self.max
        }
        fn update(&mut self, limit: usize, window: &Window) -> usize {
            self.seen.lock().unwrap().push((limit, *window));
            self.answer.load(Relaxed)
        }
        fn no_load_latency(&self) -> Option<Duration> {
            self.no_load
        }
    }

    /// A controller whose clock started 10 s before the test's "now" (so
    /// a call can have started before it), with its limit and script.
    struct Rig {
        controller: Controller,
        limit: AtomicUsize,
        metrics: CompartmentMetrics,
        script: Script,
        epoch: Instant,
    }

    impl Rig {
        fn new(script: Script) -> Self {
            let epoch = Instant::now() - Duration::from_secs(10);
            let (controller, initial) = Controller::new(Box::new(script.clone()), epoch);
            Self {
                controller,
                limit: AtomicUsize::new(initial),
                metrics: CompartmentMetrics::new("test"),
                script,
                epoch,
            }
        }

        fn now_ns(&self) -> u64 {
            nanos(Instant::now() - self.epoch)
        }

        fn end(&self, start_ns: u64, in_flight: usize, ending: Ending) {
            self.controller.end(
                &self.limit,
                "test",
                &self.metrics,
                start_ns,
                in_flight,
                ending,
            );
        }

        /// A timed call that ends now, after `latency`.
        fn timed(&self, latency: Duration, in_flight: usize, ending: Ending) {
            self.end(self.now_ns() - nanos(latency), in_flight, ending);
        }

        /// A call that was not timed, ending now.
        fn untimed(&self, ending: Ending) {
            self.end(NOT_TIMED, 1, ending);
        }

        fn limit(&self) -> usize {
            self.limit.load(Relaxed)
        }

        fn answer(&self, limit: usize) {
            self.script.answer.store(limit, Relaxed);
        }

        fn windows(&self) -> Vec<(usize, Window)> {
            self.script.seen.lock().unwrap().clone()
        }
    }

    #[test]
    fn bounds_are_at_least_one_and_the_initial_limit_lies_within_them() {
        let epoch = Instant::now();
        let (c, initial) = Controller::new(Box::new(Script::new(500, 0, 100)), epoch);
        assert_eq!((c.bounds(), initial), ((1, 100), 100));
        let (c, initial) = Controller::new(Box::new(Script::new(0, 5, 3)), epoch);
        assert_eq!((c.bounds(), initial), ((5, 5), 5), "max below min is min");
        let (c, initial) = Controller::new(Box::new(Script::new(7, 2, 9)), epoch);
        assert_eq!((c.bounds(), initial), ((2, 9), 7));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn every_call_is_timed_until_ten_samples_then_one_in_sixteen() {
        let rig = Rig::new(Script::new(10, 1, 100));
        advance(MS).await;
        let now = rig.now_ns();
        assert_eq!(now, 10_001_000_000);
        for i in 0..MIN_SAMPLES {
            let start = rig.controller.start();
            assert_eq!(
                start, now,
                "call {i} of the first ten is timed, with the clock"
            );
            rig.end(start, 1, Ending::Completed);
        }
        assert!(rig.windows().is_empty(), "the window is not due yet");
        // Sixteen consecutive calls hold one tick that is a multiple of
        // sixteen, wherever this thread's tick stands.
        let starts: Vec<u64> = (0..64).map(|_| rig.controller.start()).collect();
        let timed: Vec<u64> = starts.iter().copied().filter(|&s| s != NOT_TIMED).collect();
        assert_eq!(timed, [now; 4], "one call in sixteen: {starts:?}");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_window_closes_when_due_and_tells_the_algorithm_what_its_calls_saw() {
        let rig = Rig::new(Script::new(10, 1, 100));
        rig.answer(42);
        assert_eq!(rig.controller.recent_latency(), None);
        advance(5 * MS).await;
        let in_flight = [3, 2, 9, 1, 4, 5, 6, 7, 8, 2];
        for (i, n) in in_flight.into_iter().enumerate().take(9) {
            rig.timed(MS * (10 + 2 * i as u32), n, Ending::Completed);
        }
        advance(5 * MS - Duration::from_nanos(1)).await;
        rig.timed(28 * MS, in_flight[9], Ending::Completed);
        assert!(
            rig.windows().is_empty(),
            "10 samples, but the window lasts 10 ms: not due 1 ns before"
        );
        advance(Duration::from_nanos(1)).await;
        rig.timed(30 * MS, 1, Ending::Completed);

        let windows = rig.windows();
        assert_eq!(windows.len(), 1, "due at exactly 10 ms");
        let (shown, window) = windows[0];
        assert_eq!(shown, 10, "the algorithm sees the limit in force");
        assert_eq!(window.now(), Instant::now());
        assert_eq!(window.duration(), 10 * MS);
        assert_eq!(window.samples(), 11);
        assert_eq!(window.mean_latency(), Some(20 * MS), "(190 + 30) / 11 ms");
        assert_eq!(window.min_latency(), Some(10 * MS));
        assert_eq!(window.max_latency(), Some(30 * MS));
        assert_eq!(window.max_in_flight(), 9);
        assert_eq!((window.congestion(), window.congested_samples()), (0, 0));
        assert_eq!(rig.limit(), 42);
        assert_eq!(rig.controller.recent_latency(), Some(20 * MS));

        // The next window lasts twice the mean latency: 40 ms. Ten calls
        // dropped by their callers, not timed, 1 ns before it is due…
        advance(40 * MS - Duration::from_nanos(1)).await;
        for _ in 0..10 {
            rig.untimed(Ending::Dropped);
        }
        assert_eq!(rig.windows().len(), 1, "the 40 ms window is not due");
        // …and one cut by a timeout as it is.
        advance(Duration::from_nanos(1)).await;
        rig.untimed(Ending::Congested);
        let windows = rig.windows();
        assert_eq!(windows.len(), 2);
        let (shown, window) = windows[1];
        assert_eq!(shown, 42);
        assert_eq!(window.duration(), 40 * MS);
        assert_eq!(window.samples(), 0);
        assert_eq!(window.congestion(), 11, "dropped and cut calls both count");
        assert_eq!(window.min_latency(), None, "no timed call: no latency");
        assert_eq!(window.max_latency(), None);
        assert_eq!(window.mean_latency(), None);
        assert_eq!(
            rig.controller.recent_latency(),
            Some(20 * MS),
            "a window without timed calls keeps the last latency and length"
        );
        advance(40 * MS - Duration::from_nanos(1)).await;
        for _ in 0..10 {
            rig.untimed(Ending::Dropped);
        }
        assert_eq!(rig.windows().len(), 2, "still 40 ms long");
        advance(Duration::from_nanos(1)).await;
        rig.untimed(Ending::Dropped);
        assert_eq!(rig.windows().len(), 3);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_window_with_few_calls_closes_after_two_seconds() {
        let rig = Rig::new(Script::new(10, 1, 100));
        rig.answer(11);
        advance(MAX_WINDOW - Duration::from_nanos(1)).await;
        rig.timed(MS, 1, Ending::Completed);
        assert!(rig.windows().is_empty(), "1 signal, 1 ns short of 2 s");
        advance(Duration::from_nanos(1)).await;
        rig.timed(3 * MS, 2, Ending::Completed);
        let windows = rig.windows();
        assert_eq!(windows.len(), 1, "2 signals at 2 s");
        assert_eq!(windows[0].1.duration(), MAX_WINDOW);
        assert_eq!(windows[0].1.samples(), 2);
        assert_eq!(rig.limit(), 11);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_window_lasts_twice_the_mean_latency_within_its_bounds() {
        let rig = Rig::new(Script::new(10, 1, 100));
        advance(MIN_WINDOW).await;
        // A mean of 1.5 s: 3 s, capped at 2 s.
        for _ in 0..10 {
            rig.timed(1_500 * MS, 1, Ending::Completed);
        }
        assert_eq!(rig.windows().len(), 1);
        advance(MAX_WINDOW - Duration::from_nanos(1)).await;
        for _ in 0..10 {
            rig.timed(MS, 1, Ending::Completed);
        }
        assert_eq!(rig.windows().len(), 1, "1 ns short of 2 s");
        advance(Duration::from_nanos(1)).await;
        rig.timed(MS, 1, Ending::Completed);
        assert_eq!(rig.windows().len(), 2, "due at 2 s, not at 3 s");
        // A mean of 1 ms: 2 ms, raised to 10 ms.
        advance(2 * MS).await;
        for _ in 0..10 {
            rig.timed(MS, 1, Ending::Completed);
        }
        assert_eq!(rig.windows().len(), 2, "not due at 2 ms");
        advance(MIN_WINDOW - 2 * MS).await;
        rig.timed(MS, 1, Ending::Completed);
        assert_eq!(rig.windows().len(), 3, "due at 10 ms");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_cut_timed_call_is_one_sample_and_one_signal_not_two() {
        let rig = Rig::new(Script::new(10, 1, 100));
        advance(MIN_WINDOW).await;
        for _ in 0..5 {
            rig.timed(3 * MS, 4, Ending::Congested);
        }
        for _ in 0..4 {
            rig.untimed(Ending::Congested);
        }
        rig.untimed(Ending::Ignored);
        rig.untimed(Ending::Completed);
        rig.timed(MS, 1, Ending::Ignored);
        assert!(
            rig.windows().is_empty(),
            "9 signals: 5 cut timed calls, 4 cut untimed ones; other failures and \
             untimed successes say nothing"
        );
        rig.untimed(Ending::Dropped);
        let windows = rig.windows();
        assert_eq!(windows.len(), 1, "the tenth signal closes it");
        let window = windows[0].1;
        assert_eq!(window.samples(), 5);
        assert_eq!(window.congested_samples(), 5);
        assert_eq!(window.congestion(), 10);
        assert_eq!(window.mean_latency(), Some(3 * MS));
        assert_eq!(window.max_in_flight(), 4);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_limit_is_the_algorithms_clamped_and_its_no_load_latency_is_shown() {
        let mut script = Script::new(10, 3, 50);
        script.no_load = Some(7 * MS);
        let rig = Rig::new(script);
        assert_eq!(
            rig.controller.no_load_latency(),
            None,
            "until a window closes"
        );
        let close = || async {
            advance(MIN_WINDOW).await;
            for _ in 0..10 {
                rig.timed(MS, 1, Ending::Completed);
            }
        };
        rig.answer(1_000);
        close().await;
        assert_eq!(rig.limit(), 50);
        assert_eq!(rig.controller.no_load_latency(), Some(7 * MS));
        rig.answer(0);
        close().await;
        assert_eq!(rig.limit(), 3);
        assert_eq!(rig.windows().len(), 2);
        assert_eq!(rig.windows()[1].0, 50);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn limit_changes_are_logged_at_most_once_a_second_with_the_suppressed_count() {
        let events = resilience_testkit::Events::at_least(tracing::Level::DEBUG);
        let _guard = resilience_testkit::set_default(events.clone());
        let rig = Rig::new(Script::new(10, 1, 100));
        let close = |limit| {
            rig.answer(limit);
            for _ in 0..10 {
                rig.timed(2 * MS, 1, Ending::Completed);
            }
        };
        let logged = || {
            events
                .take()
                .into_iter()
                .filter(|(message, _)| message == "bulkhead limit changed")
                .map(|(_, fields)| {
                    let field = |name: &str| fields[name].clone();
                    (field("from"), field("limit"), field("suppressed"))
                })
                .collect::<Vec<_>>()
        };
        let s = |a: &str, b: &str, c: &str| (a.to_owned(), b.to_owned(), c.to_owned());

        advance(MIN_WINDOW).await;
        close(20);
        assert_eq!(logged(), [s("10", "20", "0")], "the first change");
        advance(MIN_WINDOW).await;
        close(30);
        advance(MIN_WINDOW).await;
        close(30);
        assert_eq!(logged(), [], "within the second: counted, not logged");
        advance(Duration::from_secs(1) - 2 * MIN_WINDOW - Duration::from_nanos(1)).await;
        close(40);
        assert_eq!(logged(), [], "1 ns short of the second");
        advance(Duration::from_nanos(1) + MIN_WINDOW).await;
        close(50);
        assert_eq!(
            logged(),
            [s("40", "50", "2")],
            "the two changes in between (not the window that kept 30)"
        );
        advance(Duration::from_secs(1) - MIN_WINDOW).await;
        close(60);
        assert_eq!(logged(), [], "the second counts from the last event");
        advance(MIN_WINDOW).await;
        close(70);
        let seen = logged();
        assert_eq!(seen, [s("60", "70", "1")], "exactly a second after it");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn without_a_debug_subscriber_a_change_is_not_an_event_and_not_counted() {
        let events = resilience_testkit::Events::at_least(tracing::Level::INFO);
        let _guard = resilience_testkit::set_default(events.clone());
        let rig = Rig::new(Script::new(10, 1, 100));
        rig.answer(20);
        advance(MIN_WINDOW).await;
        for _ in 0..10 {
            rig.timed(MS, 1, Ending::Completed);
        }
        assert_eq!(rig.limit(), 20);
        assert!(events.take().is_empty());
        assert_eq!(rig.controller.suppressed.load(Relaxed), 0);
        assert_eq!(rig.controller.last_log_ns.load(Relaxed), NOT_TIMED);
    }

    #[test]
    fn debug_shows_the_bounds_and_latencies() {
        let (c, _) = Controller::new(Box::new(Script::new(4, 2, 8)), Instant::now());
        assert_eq!(
            format!("{c:?}"),
            "Controller { min: 2, max: 8, recent_latency: None, no_load_latency: None, .. }"
        );
        assert_eq!(format!("{:?}", LimitSpec::Fixed(5)), "Fixed(5)");
        let spec = LimitSpec::adaptive(Script::new(4, 2, 8));
        assert_eq!(format!("{spec:?}"), "Adaptive");
        let LimitSpec::Adaptive(factory) = spec else {
            panic!("an adaptive spec")
        };
        assert_eq!(
            factory().initial_limit(),
            4,
            "the factory builds the algorithm"
        );
    }

    #[test]
    fn a_duration_beyond_u64_nanoseconds_stays_below_the_none_marker() {
        assert_eq!(nanos(Duration::MAX), u64::MAX - 1);
        assert_eq!(nanos(Duration::from_micros(3)), 3_000);
        assert_eq!(duration(NOT_TIMED), None);
        assert_eq!(duration(5), Some(Duration::from_nanos(5)));
    }
}
