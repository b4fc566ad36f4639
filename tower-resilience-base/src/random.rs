//! The random source of the toolkit's jitter: retry backoff delays, the
//! breaker's open periods and ramp-up, hedging.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// A source of uniformly distributed 64-bit numbers.
///
/// Every layer that draws jitter takes one (`Arc<dyn RandomSource>`), so
/// tests inject a [`SeededRandom`] for reproducible delays, and the default
/// is a [`ProcessRandom`]. Successive calls must return different values
/// (a retry layer seeds each request's jitter with one).
///
/// # Example
///
/// ```
/// use tower_resilience_base::random::RandomSource;
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
/// # assert_eq!(Middle.next_u64(), u64::MAX / 2);
/// ```
pub trait RandomSource: fmt::Debug + Send + Sync + 'static {
    /// A uniformly distributed 64-bit number.
    fn next_u64(&self) -> u64;
}

/// The default [`RandomSource`]: a splitmix64 sequence on an atomic
/// counter, started from the process's random hasher keys and the wall
/// clock, so that sources differ between layers and between processes
/// started at the same moment. One relaxed `fetch_add` per number; not a
/// cryptographic generator, and it does not need to be.
///
/// # Example
///
/// ```
/// use tower_resilience_base::random::{ProcessRandom, RandomSource};
///
/// let random = ProcessRandom::new();
/// assert_ne!(random.next_u64(), random.next_u64());
/// ```
#[derive(Debug)]
pub struct ProcessRandom(SeededRandom);

/// A deterministic [`RandomSource`] for tests: the splitmix64 sequence that
/// starts at a fixed seed.
///
/// # Clone
///
/// Not `Clone`: it is shared by `Arc`, and every user of one source draws
/// from one sequence.
///
/// # Example
///
/// ```
/// use tower_resilience_base::random::{RandomSource, SeededRandom};
///
/// let a = SeededRandom::new(7);
/// let b = SeededRandom::new(7);
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert_ne!(a.next_u64(), a.next_u64());
/// ```
pub struct SeededRandom {
    state: AtomicU64,
}

/// A uniform number in `[0, 1)` from `random`.
///
/// # Example
///
/// ```
/// use tower_resilience_base::random::{unit, SeededRandom};
///
/// let x = unit(&SeededRandom::new(1));
/// assert!((0.0..1.0).contains(&x));
/// ```
#[must_use]
pub fn unit(random: &dyn RandomSource) -> f64 {
    (random.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// The splitmix64 output function.
#[must_use]
pub const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// === impl ProcessRandom ===

impl ProcessRandom {
    /// A source seeded from the process's random hasher keys and the wall
    /// clock.
    #[must_use]
    pub fn new() -> Self {
        let mut hasher = RandomState::new().build_hasher();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        hasher.write_u64(wall);
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

/// A shared source is a source: `Arc<SeededRandom>` or an
/// `Arc<dyn RandomSource>` can be handed to every layer's `random` setter,
/// and the layers then draw from one sequence.
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use tower_resilience_base::random::{RandomSource, SeededRandom};
///
/// let shared: Arc<dyn RandomSource> = Arc::new(SeededRandom::new(7));
/// let first = shared.next_u64();
/// assert_eq!(first, SeededRandom::new(7).next_u64());
/// assert_ne!(Arc::clone(&shared).next_u64(), first, "one sequence");
/// ```
impl<R: RandomSource + ?Sized> RandomSource for std::sync::Arc<R> {
    fn next_u64(&self) -> u64 {
        (**self).next_u64()
    }
}

// === impl SeededRandom ===

impl SeededRandom {
    /// The sequence that starts at `seed`.
    #[must_use]
    pub const fn new(seed: u64) -> Self {
        Self {
            state: AtomicU64::new(seed),
        }
    }
}

impl RandomSource for SeededRandom {
    fn next_u64(&self) -> u64 {
        mix(self.state.fetch_add(GAMMA, Relaxed).wrapping_add(GAMMA))
    }
}

impl fmt::Debug for SeededRandom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SeededRandom").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_sources_differ() {
        let (a, b) = (ProcessRandom::new(), ProcessRandom::new());
        assert_ne!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn a_shared_source_draws_from_one_sequence() {
        let shared: std::sync::Arc<dyn RandomSource> = std::sync::Arc::new(SeededRandom::new(9));
        let clone = std::sync::Arc::clone(&shared);
        let expected = SeededRandom::new(9);
        assert_eq!(shared.next_u64(), expected.next_u64());
        assert_eq!(clone.next_u64(), expected.next_u64(), "the clone goes on");
        assert_eq!(shared.next_u64(), expected.next_u64());
    }

    #[test]
    fn unit_is_in_range_and_spread() {
        let r = SeededRandom::new(3);
        let xs: Vec<f64> = (0..1000).map(|_| unit(&r)).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / 1000.0;
        assert!((0.45..0.55).contains(&mean), "mean {mean}");
    }
}
