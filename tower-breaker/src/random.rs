//! The random source of the open period's jitter and of the ramp-up.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A source of random numbers for the breaker: the jitter of each open
/// period, and which calls a ramp-up admits.
///
/// It is asked only on rare paths (a transition, a call during ramp-up),
/// never on the closed hot path. Tests inject a [`SeededRandom`] for
/// reproducible periods; the default is [`ProcessRandom`].
///
/// The trait is object safe and is used as `Arc<dyn RandomSource>`.
///
/// # Example
///
/// ```
/// use tower_breaker::RandomSource;
///
/// /// Always the middle of the range: no jitter at all.
/// #[derive(Debug)]
/// struct Middle;
///
/// impl RandomSource for Middle {
///     fn next_u64(&self) -> u64 {
///         u64::MAX / 2
///     }
/// }
///
/// let config = tower_breaker::BreakerConfig::new().random(Middle);
/// # let _ = config;
/// ```
pub trait RandomSource: Send + Sync + fmt::Debug + 'static {
    /// A uniformly distributed 64-bit number.
    fn next_u64(&self) -> u64;
}

/// A [`RandomSource`] seeded once per process from the standard library's
/// random hasher keys; the default.
///
/// # Example
///
/// ```
/// use tower_breaker::{ProcessRandom, RandomSource};
///
/// let random = ProcessRandom::new();
/// assert_ne!(random.next_u64(), random.next_u64());
/// ```
#[derive(Debug)]
pub struct ProcessRandom(SeededRandom);

/// A [`RandomSource`] from a fixed seed (SplitMix64): the same seed gives
/// the same sequence, for reproducible tests.
///
/// # Clone
///
/// Not `Clone`: it is shared by `Arc` inside the breaker's configuration,
/// and every breaker built from that configuration draws from one sequence.
///
/// # Example
///
/// ```
/// use tower_breaker::{RandomSource, SeededRandom};
///
/// let a = SeededRandom::new(7);
/// let b = SeededRandom::new(7);
/// assert_eq!(a.next_u64(), b.next_u64());
/// ```
pub struct SeededRandom {
    state: AtomicU64,
}

// === impl ProcessRandom ===

impl ProcessRandom {
    /// A source seeded from the process's random hasher keys.
    #[must_use]
    pub fn new() -> Self {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(0x5eed);
        Self(SeededRandom::new(hasher.finish()))
    }
}

impl Default for ProcessRandom {
    fn default() -> Self {
        Self::new()
    }
}

impl RandomSource for ProcessRandom {
    fn next_u64(&self) -> u64 {
        self.0.next_u64()
    }
}

// === impl SeededRandom ===

impl SeededRandom {
    /// A source that starts from `seed`.
    #[must_use]
    pub const fn new(seed: u64) -> Self {
        Self {
            state: AtomicU64::new(seed),
        }
    }
}

impl RandomSource for SeededRandom {
    fn next_u64(&self) -> u64 {
        let mut z = self
            .state
            .fetch_add(0x9E37_79B9_7F4A_7C15, Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl fmt::Debug for SeededRandom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SeededRandom").finish_non_exhaustive()
    }
}

/// A uniform number in `[0, 1)`.
pub(crate) fn unit(random: &dyn RandomSource) -> f64 {
    (random.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}
