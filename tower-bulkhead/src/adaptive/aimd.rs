//! Additive increase, multiplicative decrease.

use std::time::Duration;

use super::{LimitAlgorithm, Window};

/// AIMD: grow the limit by one per window while calls complete fine and
/// the compartment is used, cut it by a ratio on congestion.
///
/// Per closed [`Window`]:
///
/// - **decrease**: if the window saw a congestion signal (a call dropped
///   by its caller, a deadline exceeded, a local timeout) or a call slower
///   than [`timeout`](Self::timeout), the limit becomes
///   `floor(limit * backoff_ratio)` (at least one less, never below the
///   minimum);
/// - **increase**: otherwise, if calls completed and the compartment was
///   at least half used (the most calls in flight seen by a timed call is
///   at least `limit / 2`), the limit grows by one;
/// - otherwise it stays: an idle compartment does not inflate its limit.
///
/// Defaults (those of Netflix's `AIMDLimit`): initial limit 20, bounds
/// `[1, 1000]`, backoff ratio 0.9, timeout 5 s.
///
/// **Trade-off.** AIMD learns only from congestion: it grows until calls
/// are cut (or exceed `timeout`), so it keeps a queue at the dependency as
/// long as the callers' deadlines tolerate one, and its latency is the
/// deadline's rather than the dependency's. Where latency matters, prefer
/// [`Gradient`](super::Gradient), or set [`timeout`](Self::timeout) to the
/// latency you accept (say half the callers' deadline). And every cut
/// counts: a dependency whose own latency is close to its callers'
/// deadline (calls cut even without load) drives AIMD to its minimum,
/// where [`Gradient`](super::Gradient) compares the share cut with the
/// share cut without load.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_bulkhead::adaptive::{Aimd, LimitAlgorithm, Window};
/// use tokio::time::Instant;
///
/// let mut aimd = Aimd::new().initial(10).bounds(2, 50);
/// assert_eq!(aimd.initial_limit(), 10);
///
/// // A busy window with no trouble: one more.
/// let fine = Window::new(Instant::now(), Duration::from_millis(20))
///     .with_sample(Duration::from_millis(5), 8);
/// assert_eq!(aimd.update(10, &fine), 11);
///
/// // A call was dropped by its caller: back off by 10%.
/// let congested = fine.with_congestion(1);
/// assert_eq!(aimd.update(11, &congested), 9);
/// ```
///
/// # Clone
///
/// A clone is an independent copy (AIMD keeps no state besides its
/// settings): each keyed compartment gets its own.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct Aimd {
    initial: usize,
    min: usize,
    max: usize,
    backoff_ratio: f64,
    timeout: Duration,
}

// === impl Aimd ===

impl Aimd {
    /// The default initial limit: 20.
    pub const DEFAULT_INITIAL: usize = 20;
    /// The default lower bound: 1.
    pub const DEFAULT_MIN: usize = 1;
    /// The default upper bound: 1000.
    pub const DEFAULT_MAX: usize = 1000;
    /// The default backoff ratio: 0.9.
    pub const DEFAULT_BACKOFF_RATIO: f64 = 0.9;
    /// The default latency above which a call counts as congestion: 5 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// AIMD with the defaults: initial 20, bounds `[1, 1000]`, backoff
    /// ratio 0.9, timeout 5 s.
    pub const fn new() -> Self {
        Self {
            initial: Self::DEFAULT_INITIAL,
            min: Self::DEFAULT_MIN,
            max: Self::DEFAULT_MAX,
            backoff_ratio: Self::DEFAULT_BACKOFF_RATIO,
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// The limit before the first window closes (default 20); kept within
    /// the bounds.
    pub fn initial(mut self, initial: usize) -> Self {
        self.initial = initial;
        self
    }

    /// The bounds of the limit (default `[1, 1000]`). A minimum of zero is
    /// raised to one (a compartment that lets nothing through learns
    /// nothing), and a maximum below the minimum is raised to it.
    pub fn bounds(mut self, min: usize, max: usize) -> Self {
        self.min = min.max(1);
        self.max = max.max(self.min);
        self
    }

    /// The factor applied to the limit on congestion (default 0.9). Values
    /// outside `[0.1, 0.99]` (and NaN) are brought back into it.
    pub fn backoff_ratio(mut self, ratio: f64) -> Self {
        self.backoff_ratio = if ratio.is_nan() {
            Self::DEFAULT_BACKOFF_RATIO
        } else {
            ratio.clamp(0.1, 0.99)
        };
        self
    }

    /// A call slower than this counts as congestion (default 5 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl Default for Aimd {
    fn default() -> Self {
        Self::new()
    }
}

impl LimitAlgorithm for Aimd {
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
        let too_slow = window.max_latency().is_some_and(|l| l > self.timeout);
        let next = if window.congestion() > 0 || too_slow {
            // Truncation is the point: at least one less.
            let cut = (limit as f64 * self.backoff_ratio) as usize;
            cut.min(limit.saturating_sub(1))
        } else if window.samples() > 0 && window.max_in_flight().saturating_mul(2) >= limit {
            limit.saturating_add(1)
        } else {
            limit
        };
        next.clamp(self.min, self.max)
    }
}
