//! The settings of a throttle and the error of invalid ones.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_resilience_base::clock::CoarseClock;
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::random::RandomSource;

/// How many time buckets the window is cut into: its counts slide by a
/// sixtieth of the window (2 s with the default two minutes).
pub(crate) const BUCKETS: usize = 60;

/// How many rings of buckets the threads' counts are spread over (as the
/// breaker's counters are).
pub(crate) const STRIPES: usize = 8;

/// The default [`window`](ThrottleConfig::window): the SRE book's two
/// minutes.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(120);
/// The default [`k`](ThrottleConfig::k): the SRE book's 2.
pub const DEFAULT_K: f64 = 2.0;
/// The default [`max_rejection`](ThrottleConfig::max_rejection): 0.9.
pub const DEFAULT_MAX_REJECTION: f64 = 0.9;
/// The default [`min_requests`](ThrottleConfig::min_requests): 10.
pub const DEFAULT_MIN_REQUESTS: u64 = 10;

/// The shortest [`window`](ThrottleConfig::window): 60 ms (buckets of
/// 1 ms).
pub const MIN_WINDOW: Duration = Duration::from_millis(BUCKETS as u64);
/// The longest [`window`](ThrottleConfig::window): one day.
pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// The settings of a [`ThrottleHandle`](super::ThrottleHandle): the
/// window, K (one per criticality), the cap on the rejection share, the
/// least number of requests before any rejection, the random source of
/// the draws, and the clock.
///
/// The setters store what they are given; [`validate`](Self::validate)
/// (and so [`ThrottleHandle::try_with_config`](super::ThrottleHandle::try_with_config)
/// and [`ThrottleLayer::try_with_config`](super::ThrottleLayer::try_with_config))
/// refuses invalid values with a [`ThrottleConfigError`]. The setters of
/// [`ThrottleLayer`](super::ThrottleLayer) clamp them instead (documented
/// on each).
///
/// | setting | default | valid |
/// |---|---|---|
/// | [`window`](Self::window) | 120 s ([`DEFAULT_WINDOW`]) | 60 ms to 1 day |
/// | [`k`](Self::k) (Critical's K) | 2.0 ([`DEFAULT_K`]) | finite, at least 1.0 |
/// | [`criticality_k`](Self::criticality_k) | CriticalPlus: K; SheddablePlus: max(1, 0.875 K); Sheddable: max(1, 0.75 K) | finite, at least 1.0, and ordered (see there) |
/// | [`max_rejection`](Self::max_rejection) | 0.9 ([`DEFAULT_MAX_REJECTION`]) | `0.0..=1.0` |
/// | [`min_requests`](Self::min_requests) | 10 ([`DEFAULT_MIN_REQUESTS`]) | any |
/// | [`random`](Self::random) | a [`ProcessRandom`](tower_resilience_base::random::ProcessRandom) | any |
/// | [`coarse_clock`](Self::coarse_clock) | off (tokio's clock) | on or off |
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::throttle::{ThrottleConfig, ThrottleConfigError, ThrottleHandle};
///
/// // Envoy's admission control: a 30 s window, at most 80% rejected.
/// let config = ThrottleConfig::new()
///     .window(Duration::from_secs(30))
///     .max_rejection(0.8);
/// let handle = ThrottleHandle::try_with_config("search", config)?;
/// assert_eq!(handle.config().get_max_rejection(), 0.8);
///
/// let err = ThrottleHandle::try_with_config("search", ThrottleConfig::new().k(0.5)).unwrap_err();
/// assert!(matches!(err, ThrottleConfigError::InvalidK { .. }));
/// # Ok::<(), ThrottleConfigError>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct ThrottleConfig {
    pub(crate) window: Duration,
    pub(crate) k: f64,
    pub(crate) criticality_k: [Option<f64>; 4],
    pub(crate) max_rejection: f64,
    pub(crate) min_requests: u64,
    pub(crate) random: Option<Arc<dyn RandomSource>>,
    /// The coarse clock to tell time by, if any (`coarse_clock`).
    pub(crate) coarse_clock: Option<&'static CoarseClock>,
}

/// A setting of a [`ThrottleConfig`] that is out of range.
///
/// # Example
///
/// ```
/// use tower_breaker::throttle::{ThrottleConfig, ThrottleConfigError};
///
/// let err = ThrottleConfig::new().max_rejection(1.5).validate().unwrap_err();
/// assert_eq!(err, ThrottleConfigError::InvalidMaxRejection { value: 1.5 });
/// assert_eq!(err.to_string(), "throttle max_rejection must be within 0.0..=1.0, got 1.5");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ThrottleConfigError {
    /// A K below 1.0 or not finite: with K < 1 the rule rejects requests
    /// the dependency would accept even when it accepts every one.
    InvalidK {
        /// The criticality whose K it is (`Critical` for [`k`](ThrottleConfig::k)).
        criticality: Criticality,
        /// The value given.
        value: f64,
    },
    /// Per-criticality Ks out of order: a less critical request must not
    /// get a larger K (be rejected less) than a more critical one, and
    /// `CriticalPlus` is never throttled below `Critical`'s rule.
    KOutOfOrder {
        /// The less critical of the two.
        lower: Criticality,
        /// Its K.
        lower_k: f64,
        /// The more critical one.
        higher: Criticality,
        /// Its K.
        higher_k: f64,
    },
    /// A [`max_rejection`](ThrottleConfig::max_rejection) outside
    /// `0.0..=1.0` (or NaN).
    InvalidMaxRejection {
        /// The value given.
        value: f64,
    },
    /// A [`window`](ThrottleConfig::window) shorter than [`MIN_WINDOW`] or
    /// longer than [`MAX_WINDOW`].
    InvalidWindow {
        /// The value given.
        value: Duration,
    },
}

// === impl ThrottleConfig ===

impl ThrottleConfig {
    /// The defaults: the SRE book's rule (K = 2 over two minutes), at most
    /// 90% rejected, no rejection before 10 requests in the window.
    pub fn new() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            k: DEFAULT_K,
            criticality_k: [None; 4],
            max_rejection: DEFAULT_MAX_REJECTION,
            min_requests: DEFAULT_MIN_REQUESTS,
            random: None,
            coarse_clock: None,
        }
    }

    /// The span of time the counts cover (default 120 s, the SRE book's).
    /// It slides by a sixtieth of itself: the counts of each bucket leave
    /// the window together. Valid from [`MIN_WINDOW`] (60 ms) to
    /// [`MAX_WINDOW`] (one day).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// K, the multiplier of accepts for `Critical` requests (default 2.0,
    /// the SRE book's): the client sends up to K times as many requests as
    /// the dependency accepts before it rejects any locally. At least 1.0;
    /// a larger K rejects later and lets more doomed requests through. The
    /// other criticalities' K follow it unless set with
    /// [`criticality_k`](Self::criticality_k).
    pub fn k(mut self, k: f64) -> Self {
        self.k = k;
        self
    }

    /// The K of requests of `criticality` (setting `Critical`'s is the same
    /// as [`k`](Self::k)). Defaults: `CriticalPlus` takes `Critical`'s K;
    /// `SheddablePlus` seven eighths of it and `Sheddable` three quarters
    /// of it, at least 1.0 each, so that less critical requests are
    /// rejected first and more often. Against a dependency that fails a
    /// steady share `f` of the requests it gets, a K starts rejecting when
    /// `f > 1 − 1/K`: with K = 2, `Sheddable` (1.5) at 33% failures,
    /// `SheddablePlus` (1.75) at 43%, `Critical` at 50%. (A K of 1 rejects
    /// at the first failure, and a client whose traffic is all of that
    /// criticality then climbs to the cap at any steady failure share.) Each criticality's rule reads the requests and
    /// accepts of that criticality and the ones above it (see the
    /// [module docs](super#criticality)).
    ///
    /// The Ks must be ordered: `Sheddable` ≤ `SheddablePlus` ≤ `Critical`
    /// ≤ `CriticalPlus`, each at least 1.0
    /// ([`ThrottleConfigError::KOutOfOrder`] otherwise).
    pub fn criticality_k(mut self, criticality: Criticality, k: f64) -> Self {
        if criticality == Criticality::Critical {
            self.k = k;
        } else {
            self.criticality_k[criticality.index()] = Some(k);
        }
        self
    }

    /// The largest share of requests the throttle rejects (default 0.9),
    /// `0.0..=1.0`.
    ///
    /// The SRE book's rule has no cap: against a dependency that accepts
    /// nothing it tends to reject everything, and a client that sends
    /// nothing never sees the dependency recover. The cap keeps a trickle
    /// (10% by default) going, which is how the accepts come back. Envoy's
    /// admission control caps at 0.8; we cap at 0.9 because the throttle is
    /// one layer of a stack whose breaker already stops a dependency that
    /// fails outright, so the throttle's job is shedding under overload,
    /// where every request sent beyond the dependency's capacity is wasted
    /// work for it.
    pub fn max_rejection(mut self, max: f64) -> Self {
        self.max_rejection = max;
        self
    }

    /// The least number of requests in the window before the throttle
    /// rejects anything (default 10): a quiet client whose first few
    /// requests fail is not throttled on so little evidence.
    pub fn min_requests(mut self, min: u64) -> Self {
        self.min_requests = min;
        self
    }

    /// The random source of the draws (default: a
    /// [`ProcessRandom`](tower_resilience_base::random::ProcessRandom)); a
    /// [`SeededRandom`](tower_resilience_base::random::SeededRandom) makes
    /// tests reproducible.
    pub fn random(mut self, random: impl RandomSource) -> Self {
        self.random = Some(Arc::new(random));
        self
    }

    /// Tell time by the coarse clock (off by default): a reading is then
    /// an atomic load instead of a read of the system's clock (about 20 ns
    /// on a virtual machine), for a throttle that is not below a layer
    /// that already read the clock for the call (in
    /// `tower_shield::stack::client_stack`, the throttle takes the stack's
    /// reading, and this setting makes no difference).
    ///
    /// The throttle needs the time only to know which of the window's 60
    /// buckets a request falls in (two seconds each by default), so the
    /// coarse clock's lag (a millisecond plus the delay the operating
    /// system adds to its thread's wake-ups, see
    /// [`CoarseClock`](tower_resilience_base::clock::CoarseClock)) moves a
    /// request into the previous bucket at most that long after a
    /// bucket's start. The coarse clock follows the real clock, not
    /// tokio's paused test clock: a throttle that uses it does not see
    /// `tokio::time::advance`. If its thread cannot be started, the
    /// throttle reads tokio's clock. Not changed by
    /// [`ThrottleHandle::reconfigure`](super::ThrottleHandle::reconfigure).
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker::throttle::{ThrottleConfig, ThrottleHandle};
    /// use tower_resilience_base::criticality::Criticality;
    ///
    /// let throttle = ThrottleHandle::try_with_config("search", ThrottleConfig::new().coarse_clock(true))?;
    /// assert!(throttle.try_acquire(Criticality::Critical).is_ok());
    /// # Ok::<(), tower_breaker::throttle::ThrottleConfigError>(())
    /// ```
    pub fn coarse_clock(mut self, on: bool) -> Self {
        self.coarse_clock = if on { CoarseClock::shared() } else { None };
        self
    }

    /// Whether the throttle tells time by the coarse clock
    /// ([`coarse_clock`](Self::coarse_clock); false also when it was asked
    /// for and its thread could not be started).
    #[must_use]
    pub const fn get_coarse_clock(&self) -> bool {
        self.coarse_clock.is_some()
    }

    /// The window.
    #[must_use]
    pub const fn get_window(&self) -> Duration {
        self.window
    }

    /// The K of requests of `criticality`, defaults applied (not checked).
    #[must_use]
    pub fn get_k(&self, criticality: Criticality) -> f64 {
        self.ks()[criticality.index()]
    }

    /// The cap on the rejection share.
    #[must_use]
    pub const fn get_max_rejection(&self) -> f64 {
        self.max_rejection
    }

    /// The least number of requests before any rejection.
    #[must_use]
    pub const fn get_min_requests(&self) -> u64 {
        self.min_requests
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// The first [`ThrottleConfigError`] found: the window, then each K,
    /// then their order, then the cap.
    pub fn validate(&self) -> Result<(), ThrottleConfigError> {
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&self.window) {
            return Err(ThrottleConfigError::InvalidWindow { value: self.window });
        }
        let ks = self.ks();
        for c in Criticality::ALL {
            let k = ks[c.index()];
            if !(k.is_finite() && k >= 1.0) {
                return Err(ThrottleConfigError::InvalidK {
                    criticality: c,
                    value: k,
                });
            }
        }
        for pair in Criticality::ALL.windows(2) {
            let (lower, higher) = (pair[0], pair[1]);
            let (lower_k, higher_k) = (ks[lower.index()], ks[higher.index()]);
            if lower_k > higher_k {
                return Err(ThrottleConfigError::KOutOfOrder {
                    lower,
                    lower_k,
                    higher,
                    higher_k,
                });
            }
        }
        if !(0.0..=1.0).contains(&self.max_rejection) {
            return Err(ThrottleConfigError::InvalidMaxRejection {
                value: self.max_rejection,
            });
        }
        Ok(())
    }

    /// This config with every setting brought into range: the window
    /// clamped to its bounds, each K to at least 1.0 (NaN: the default) and
    /// into order (a lower criticality's K lowered to the next one's), the
    /// cap clamped to `0.0..=1.0` (NaN: the default).
    pub(crate) fn clamped(mut self) -> Self {
        self.window = self.window.clamp(MIN_WINDOW, MAX_WINDOW);
        let fix = |k: f64, default: f64| {
            if k.is_nan() {
                default
            } else {
                k.clamp(1.0, f64::MAX)
            }
        };
        self.k = fix(self.k, DEFAULT_K);
        let critical = self.k;
        for c in Criticality::ALL {
            if let Some(k) = &mut self.criticality_k[c.index()] {
                *k = fix(*k, critical);
            }
        }
        // Into order: CriticalPlus up to Critical, the sheddables down.
        let mut ks = self.ks();
        let plus = Criticality::CriticalPlus.index();
        ks[plus] = ks[plus].max(critical);
        for i in (0..Criticality::Critical.index()).rev() {
            ks[i] = ks[i].min(ks[i + 1]);
        }
        for c in Criticality::ALL {
            if c != Criticality::Critical {
                self.criticality_k[c.index()] = Some(ks[c.index()]);
            }
        }
        self.max_rejection = if self.max_rejection.is_nan() {
            DEFAULT_MAX_REJECTION
        } else {
            self.max_rejection.clamp(0.0, 1.0)
        };
        self
    }

    /// Every criticality's K, defaults applied.
    pub(crate) fn ks(&self) -> [f64; 4] {
        let k = self.k;
        let default = |c: Criticality| match c {
            Criticality::Sheddable => (0.75 * k).max(1.0),
            Criticality::SheddablePlus => (0.875 * k).max(1.0),
            Criticality::Critical | Criticality::CriticalPlus => k,
        };
        Criticality::ALL.map(|c| {
            if c == Criticality::Critical {
                k
            } else {
                self.criticality_k[c.index()].unwrap_or_else(|| default(c))
            }
        })
    }
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ThrottleConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleConfig")
            .field("window", &self.window)
            .field("k", &self.ks())
            .field("max_rejection", &self.max_rejection)
            .field("min_requests", &self.min_requests)
            .field("random", &self.random)
            .field("coarse_clock", &self.coarse_clock.is_some())
            .finish()
    }
}

// === impl ThrottleConfigError ===

impl fmt::Display for ThrottleConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidK { criticality, value } => write!(
                f,
                "throttle K of {criticality} requests must be finite and at least 1.0, got {value}"
            ),
            Self::KOutOfOrder {
                lower,
                lower_k,
                higher,
                higher_k,
            } => write!(
                f,
                "throttle K of {lower} requests ({lower_k}) is above the K of {higher} requests ({higher_k})"
            ),
            Self::InvalidMaxRejection { value } => write!(
                f,
                "throttle max_rejection must be within 0.0..=1.0, got {value}"
            ),
            Self::InvalidWindow { value } => write!(
                f,
                "throttle window must be from {MIN_WINDOW:?} to {MAX_WINDOW:?}, got {value:?}"
            ),
        }
    }
}

impl std::error::Error for ThrottleConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_ordered() {
        let config = ThrottleConfig::new();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.ks(), [1.5, 1.75, 2.0, 2.0]);
        assert_eq!(ThrottleConfig::new().k(1.0).ks(), [1.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn clamping_brings_every_setting_into_range() {
        let config = ThrottleConfig::new()
            .window(Duration::ZERO)
            .k(f64::NAN)
            .criticality_k(Criticality::CriticalPlus, 1.5)
            .criticality_k(Criticality::Sheddable, 3.0)
            .max_rejection(7.0)
            .clamped();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.window, MIN_WINDOW);
        assert_eq!(config.ks(), [1.75, 1.75, 2.0, 2.0]);
        assert_eq!(config.max_rejection, 1.0);
        let config = ThrottleConfig::new()
            .k(-3.0)
            .max_rejection(f64::NAN)
            .clamped();
        assert_eq!(config.ks(), [1.0; 4]);
        assert_eq!(config.max_rejection, DEFAULT_MAX_REJECTION);
    }
}
