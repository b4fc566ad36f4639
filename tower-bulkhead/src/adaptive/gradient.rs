//! A gradient controller: recent latency against measured no-load latency.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower_resilience_base::random::{unit, ProcessRandom, RandomSource};

use super::{LimitAlgorithm, Window};

/// A gradient controller: the limit follows the ratio of the no-load
/// latency to the recent latency, with a headroom of `sqrt(limit)` to
/// probe upwards while nothing queues.
///
/// Per closed [`Window`] with timed calls:
///
/// ```text
/// gradient  = clamp(no_load * (1 + tolerance) / recent, 0.5, 1.0)
/// headroom  = sqrt(limit) if gradient == 1, the compartment was at
///             least half used (window.max_in_flight >= limit / 2) and
///             the cut share is not rising (see below), else 0
/// target    = limit * gradient + headroom
/// limit     = (1 - smoothing) * limit + smoothing * target
/// ```
///
/// where `recent` is the window's mean latency. While the dependency
/// answers about as fast as without load, the gradient is 1 and the limit
/// grows by its headroom (about `0.2 * sqrt(limit)` per window); once
/// calls queue and the recent latency rises past `no_load * (1 +
/// tolerance)`, the gradient falls and the limit with it, until the queue
/// drains. A cut call (see [`Window::congested_samples`]) counts with
/// the latency it had when it was cut, so a queue that makes callers give
/// up shows in the mean. The headroom is left out while a queue is measured (unlike
/// Envoy's controller, which always adds it): added on top of a measured
/// queue, it would keep a standing queue of about `sqrt(limit)` calls,
/// which every call then waits behind. It is also left out while the
/// share of cut calls, smoothed over the last windows, is above the share
/// cut during the no-load measurement by more than half that
/// measurement's noise (plus 1%): when the callers' deadline is close to
/// the dependency's latency, the latency a queue adds is capped by the
/// deadline and hardly moves the mean, while the calls it cuts do.
/// A window with congestion signals
/// (calls dropped by their callers, deadlines exceeded, local timeouts)
/// also caps the limit at `limit * 0.9`, if its share of cut calls (or
/// that share smoothed over the last windows) is above the share cut
/// during the no-load measurement by more than its noise: a dependency whose latency is close to its callers' deadline
/// has calls cut even without load, and shrinking the limit below its
/// servers would not save them.
///
/// **Measuring the no-load latency.** As Envoy's adaptive concurrency
/// filter does, the no-load latency is *measured*, not guessed: the limit
/// is pinned to its minimum until [`MEASURE_SAMPLES`](Self::MEASURE_SAMPLES)
/// timed calls made at that concurrency have completed, and their mean
/// latency is the no-load latency; then the limit returns to where it
/// was. This happens after the first window (the initial limit may
/// already queue), and again every
/// [`remeasure_interval`](Self::remeasure_interval) (default 60 s, with
/// ±15% jitter so that a fleet does not pause in step), because a
/// dependency that became slower for good (a bigger data set, another
/// region) would otherwise look congested forever. A measurement lasts a
/// few windows; the pinned limit is the price of a baseline that no queue
/// can inflate.
///
/// **Defaults**, chosen to need no tuning from 1 ms to 1 s dependencies:
/// initial limit 20, bounds `[3, 1000]` (3 is also the measuring
/// concurrency), smoothing 0.2, tolerance 0.25, re-measure every 60 s.
/// Every quantity is a ratio of latencies, never a latency, and windows
/// are sized by the compartment from the observed latency (see the
/// [module docs](super)), so nothing depends on the dependency's speed.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_bulkhead::adaptive::{Gradient, LimitAlgorithm, Window};
/// use tokio::time::Instant;
///
/// let mut gradient = Gradient::new();
/// let window = |ms, in_flight| {
///     (0..20).fold(Window::new(Instant::now(), Duration::from_millis(50)), |w, _| {
///         w.with_sample(Duration::from_millis(ms), in_flight)
///     })
/// };
///
/// // The first window pins the limit to measure the no-load latency...
/// assert_eq!(gradient.update(20, &window(12, 20)), 3);
/// // ...over 40 calls made at that concurrency: 10 ms. Back to 20.
/// assert_eq!(gradient.update(3, &window(10, 3)), 3);
/// assert_eq!(gradient.update(3, &window(10, 3)), 20);
/// assert_eq!(gradient.no_load_latency(), Some(Duration::from_millis(10)));
///
/// // 10 ms under load: nothing queues, the limit grows by its headroom.
/// let grown = gradient.update(20, &window(10, 20));
/// assert!(grown > 20);
/// // Calls now take 40 ms: they queue, so the limit comes down.
/// assert!(gradient.update(grown, &window(40, grown)) < grown);
/// ```
///
/// # Clone
///
/// A clone copies the settings and the learnt state; each keyed
/// compartment starts from a clone of the value given to the layer.
#[derive(Debug, Clone)]
#[must_use]
pub struct Gradient {
    initial: usize,
    min: usize,
    max: usize,
    smoothing: f64,
    tolerance: f64,
    remeasure: Duration,
    random: Arc<dyn RandomSource>,
    state: State,
}

#[derive(Debug, Clone, Copy, Default)]
struct State {
    /// The limit as a real number, so that small steps add up.
    estimate: Option<f64>,
    /// The no-load latency of the last measurement.
    no_load: Option<Duration>,
    /// The share of timed calls cut during the last measurement: cuts the
    /// dependency causes without load (a deadline close to its latency).
    no_load_cut: f64,
    /// The share of timed calls cut, smoothed over windows (weight 0.2).
    recent_cut: f64,
    /// When the next measurement starts (once one has been made).
    next_remeasure: Option<Instant>,
    /// A measurement under way.
    measuring: Option<Measuring>,
}

/// A measurement of the no-load latency: the limit is pinned to the
/// minimum until enough calls made at that concurrency have been timed.
#[derive(Debug, Clone, Copy)]
struct Measuring {
    /// The limit to return to.
    saved: f64,
    samples: u64,
    cut: u64,
    latency_sum: Duration,
}

// === impl Gradient ===

impl Gradient {
    /// The default initial limit: 20.
    pub const DEFAULT_INITIAL: usize = 20;
    /// The default lower bound, also the concurrency at which the no-load
    /// latency is measured: 3.
    pub const DEFAULT_MIN: usize = 3;
    /// How many calls a measurement of the no-load latency times: 40.
    pub const MEASURE_SAMPLES: u64 = 40;
    /// The default upper bound: 1000.
    pub const DEFAULT_MAX: usize = 1000;
    /// The default smoothing: 0.2 (a fifth of the way to the target per
    /// window).
    pub const DEFAULT_SMOOTHING: f64 = 0.2;
    /// The default tolerance: 0.25 (recent latency up to 1.25 times the
    /// no-load latency counts as no queueing).
    pub const DEFAULT_TOLERANCE: f64 = 0.25;
    /// The default interval between no-load measurements: 60 s.
    pub const DEFAULT_REMEASURE_INTERVAL: Duration = Duration::from_secs(60);
    /// The jitter of that interval: ±15%.
    pub const REMEASURE_JITTER: f64 = 0.15;

    /// A gradient controller with the defaults (see the type's docs).
    pub fn new() -> Self {
        Self {
            initial: Self::DEFAULT_INITIAL,
            min: Self::DEFAULT_MIN,
            max: Self::DEFAULT_MAX,
            smoothing: Self::DEFAULT_SMOOTHING,
            tolerance: Self::DEFAULT_TOLERANCE,
            remeasure: Self::DEFAULT_REMEASURE_INTERVAL,
            random: Arc::new(ProcessRandom::new()),
            state: State::default(),
        }
    }

    /// The limit before the first window closes (default 20); kept within
    /// the bounds.
    pub fn initial(mut self, initial: usize) -> Self {
        self.initial = initial;
        self
    }

    /// The bounds of the limit (default `[3, 1000]`). The minimum is also
    /// the concurrency at which the no-load latency is measured. A minimum
    /// of zero is raised to one, and a maximum below the minimum is raised
    /// to it.
    pub fn bounds(mut self, min: usize, max: usize) -> Self {
        self.min = min.max(1);
        self.max = max.max(self.min);
        self
    }

    /// How far the limit moves towards its target per window (default
    /// 0.2); brought into `[0.01, 1]` (NaN: the default).
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = if smoothing.is_nan() {
            Self::DEFAULT_SMOOTHING
        } else {
            smoothing.clamp(0.01, 1.0)
        };
        self
    }

    /// How much slower than the no-load latency the recent latency may be
    /// before the limit comes down (default 0.25, i.e. 25%); brought into
    /// `[0, 10]` (NaN: the default).
    pub fn tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = if tolerance.is_nan() {
            Self::DEFAULT_TOLERANCE
        } else {
            tolerance.clamp(0.0, 10.0)
        };
        self
    }

    /// How often the no-load latency is measured again (default 60 s,
    /// jittered by ±15%). [`Duration::MAX`] never re-measures.
    pub fn remeasure_interval(mut self, interval: Duration) -> Self {
        self.remeasure = interval;
        self
    }

    /// The random source of the re-measurement jitter (default: a
    /// [`ProcessRandom`]); inject a seeded one for reproducible tests.
    pub fn random(mut self, random: impl RandomSource) -> Self {
        self.random = Arc::new(random);
        self
    }

    fn next_remeasure(&self, now: Instant) -> Option<Instant> {
        let jitter = 1.0 + Self::REMEASURE_JITTER * (2.0 * unit(&*self.random) - 1.0);
        let wait = Duration::try_from_secs_f64(self.remeasure.as_secs_f64() * jitter).ok()?;
        now.checked_add(wait)
    }

    /// Whether the window's share of cut calls is above the share measured
    /// without load, by more than the noise of both (two standard
    /// deviations of a binomial share each, plus 1%), or the smoothed share of the last windows
    /// is more than a quarter above it (plus the noise of the baseline
    /// measurement, plus 5%). With no timed call, any cut counts.
    fn more_cuts_than_without_load(&mut self, window: &Window) -> bool {
        let n = window.samples() as f64;
        if n == 0.0 {
            return true;
        }
        let base = self.state.no_load_cut;
        let share = window.congested_samples() as f64 / n;
        self.state.recent_cut = 0.8 * self.state.recent_cut + 0.2 * share;
        // The baseline is itself a measurement of MEASURE_SAMPLES calls:
        // allow for its noise too.
        let base_noise = 2.0 * (base * (1.0 - base) / Self::MEASURE_SAMPLES as f64).sqrt();
        // A burst of cuts in this window, beyond its noise...
        let burst = share > base + base_noise + 2.0 * (base * (1.0 - base) / n).sqrt() + 0.01;
        // ...or a lasting excess over the windows.
        let lasting = self.state.recent_cut > base * 1.25 + base_noise + 0.05;
        burst || lasting
    }

    /// Whether the cut share smoothed over the last windows is above the
    /// share cut without load by more than half the noise of that
    /// baseline (and 1%): too little to bring the limit down, enough to
    /// stop probing upwards.
    fn cuts_rising(&self) -> bool {
        let base = self.state.no_load_cut;
        let base_noise = 2.0 * (base * (1.0 - base) / Self::MEASURE_SAMPLES as f64).sqrt();
        self.state.recent_cut > base + base_noise / 2.0 + 0.01
    }

    fn bounded(&self, estimate: f64) -> f64 {
        estimate.clamp(self.min as f64, self.max as f64)
    }
}

impl Default for Gradient {
    fn default() -> Self {
        Self::new()
    }
}

impl LimitAlgorithm for Gradient {
    fn initial_limit(&self) -> usize {
        self.initial.clamp(self.min, self.max)
    }

    fn min_limit(&self) -> usize {
        self.min
    }

    fn max_limit(&self) -> usize {
        self.max
    }

    fn update(&mut self, limit: usize, window: &Window) -> usize {
        let now = window.now();
        let mut estimate = match self.state.estimate {
            // The compartment's limit is the truth; the estimate only
            // keeps the fraction.
            Some(e) if e.round() as usize == limit => e,
            _ => limit as f64,
        };

        // Measuring: only calls made at the pinned concurrency count.
        if let Some(mut m) = self.state.measuring {
            if window.samples() > 0 && window.max_in_flight() <= self.min {
                m.samples += window.samples();
                m.cut += window.congested_samples();
                m.latency_sum = m.latency_sum.saturating_add(
                    window.mean_latency().unwrap_or_default() * window.samples() as u32,
                );
            }
            if m.samples < Self::MEASURE_SAMPLES {
                self.state.measuring = Some(m);
                return self.min;
            }
            self.state.measuring = None;
            self.state.no_load = Some(m.latency_sum / m.samples as u32);
            self.state.no_load_cut = m.cut as f64 / m.samples as f64;
            self.state.recent_cut = self.state.no_load_cut;
            self.state.next_remeasure = self.next_remeasure(now);
            self.state.estimate = Some(m.saved);
            return m.saved.round() as usize;
        }

        // Nothing measured yet, or time to measure again: pin the limit.
        let due = self.state.next_remeasure.is_some_and(|at| now >= at);
        if self.state.no_load.is_none() || due {
            self.state.measuring = Some(Measuring {
                saved: estimate,
                samples: 0,
                cut: 0,
                latency_sum: Duration::ZERO,
            });
            self.state.next_remeasure = None;
            return self.min;
        }

        let cut = self.more_cuts_than_without_load(window);
        if let (Some(mean), Some(no_load)) = (window.mean_latency(), self.state.no_load) {
            let ratio = no_load.as_secs_f64() * (1.0 + self.tolerance) / mean.as_secs_f64();
            let gradient = if ratio.is_finite() {
                ratio.clamp(0.5, 1.0)
            } else {
                1.0
            };
            // Headroom only while nothing queues (probing upwards on top
            // of a measured queue would keep one standing) and while the
            // compartment is used (at least half of it: a limit that is
            // never reached, say behind a throttle, must not drift up).
            // Nor while the smoothed share of cut calls is above the
            // share cut without load: a deadline close to the latency caps
            // the latencies a queue adds, and more calls cut is then the
            // first sign of one.
            let used = window.max_in_flight().saturating_mul(2) >= limit;
            let headroom = if gradient >= 1.0 && used && !self.cuts_rising() {
                estimate.sqrt()
            } else {
                0.0
            };
            let target = estimate * gradient + headroom;
            estimate = (1.0 - self.smoothing) * estimate + self.smoothing * target;
        }
        if window.congestion() > 0 && cut {
            estimate = estimate.min(limit as f64 * 0.9);
        }
        estimate = self.bounded(estimate);
        self.state.estimate = Some(estimate);
        estimate.round() as usize
    }

    fn no_load_latency(&self) -> Option<Duration> {
        self.state.no_load
    }
}
