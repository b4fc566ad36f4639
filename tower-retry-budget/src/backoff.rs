//! Backoff between attempts and the random source behind its jitter.

use std::time::Duration;

use tower_resilience_base::random::mix;

/// The increment of splitmix64 (the golden ratio in 64 bits).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// How long to wait before each retry.
///
/// Both strategies are exponential with a cap and draw their delays from a
/// per-request random sequence (see [`RandomSource`](crate::RandomSource)), so that callers that
/// fail at the same moment do not come back at the same moment.
///
/// - [`Backoff::full_jitter`] (the default, 50 ms base and 1 s cap): before
///   retry `n` (`n = 0` for the first retry) sleep a uniform random time in
///   `[0, min(cap, base * 2^n)]`. Its mean is half the bound. The factor 2
///   can be replaced with [`Backoff::multiplier`] (gRPC's
///   `backoffMultiplier`).
/// - [`Backoff::decorrelated`]: sleep a uniform random time in
///   `[base, min(cap, 3 * previous)]`, where `previous` starts at `base`.
///   Delays grow with the previous delay rather than with the attempt
///   number, and never go below `base`.
///
/// A server's explicit delay (`Retry-After`, `grpc-retry-pushback-ms`) is a
/// lower bound on top of the drawn delay: the layer waits for the larger of
/// the two.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_retry_budget::{Backoff, RetryLayer};
///
/// let layer = RetryLayer::new().backoff(Backoff::decorrelated(
///     Duration::from_millis(20),
///     Duration::from_millis(500),
/// ));
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    kind: Kind,
    base: Duration,
    cap: Duration,
    /// The growth factor of full jitter, as the bits of an `f64` (so that
    /// the type stays `Eq`); 2.0 takes the exact integer path.
    multiplier: u64,
}

/// The bits of the default growth factor, 2.0.
const DOUBLING: u64 = 0x4000_0000_0000_0000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Full,
    Decorrelated,
}

/// The per-request generator: splitmix64 state plus the previous delay (for
/// decorrelated jitter).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Jitter {
    state: u64,
    previous: Duration,
}

// === impl Backoff ===

impl Backoff {
    /// The default backoff: full jitter with a 50 ms base and a 1 s cap.
    pub const DEFAULT: Backoff =
        Backoff::full_jitter(Duration::from_millis(50), Duration::from_secs(1));

    /// Full jitter: before retry `n` (from 0), a uniform delay in
    /// `[0, min(cap, base * 2^n)]`.
    #[must_use]
    pub const fn full_jitter(base: Duration, cap: Duration) -> Self {
        Self {
            kind: Kind::Full,
            base,
            cap,
            multiplier: DOUBLING,
        }
    }

    /// Decorrelated jitter: a uniform delay in `[base, min(cap, 3 *
    /// previous)]`, where `previous` is the request's previous delay and
    /// starts at `base`.
    #[must_use]
    pub const fn decorrelated(base: Duration, cap: Duration) -> Self {
        Self {
            kind: Kind::Decorrelated,
            base,
            cap,
            multiplier: DOUBLING,
        }
    }

    /// Full jitter that grows by `factor` instead of 2: before retry `n`
    /// (from 0), a uniform delay in `[0, min(cap, base * factor^n)]`. This
    /// is gRPC's retry backoff (gRFC A6: `initialBackoff`, `maxBackoff`,
    /// `backoffMultiplier`, with A6's retry `n` being our `n - 1`). A
    /// factor below 1 shrinks the delays. Decorrelated jitter ignores it
    /// (its delays grow with the previous delay, not the attempt).
    ///
    /// # Panics
    ///
    /// If `factor` is not a finite number above 0.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_budget::Backoff;
    ///
    /// let b = Backoff::full_jitter(Duration::from_millis(100), Duration::from_secs(1))
    ///     .multiplier(1.5);
    /// assert_eq!(b.bound(0), Duration::from_millis(100));
    /// assert_eq!(b.bound(2), Duration::from_millis(225));
    /// assert_eq!(b.bound(10), Duration::from_secs(1));
    /// assert_eq!(b.multiplier_value(), 1.5);
    /// ```
    #[must_use]
    pub fn multiplier(mut self, factor: f64) -> Self {
        assert!(
            factor.is_finite() && factor > 0.0,
            "backoff multiplier must be a finite number above 0, got {factor}"
        );
        self.multiplier = factor.to_bits();
        self
    }

    /// The growth factor of full jitter (2 unless set with
    /// [`multiplier`](Self::multiplier)).
    #[must_use]
    pub fn multiplier_value(&self) -> f64 {
        f64::from_bits(self.multiplier)
    }

    /// The base delay.
    #[must_use]
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The cap on any delay.
    #[must_use]
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// The upper bound of the full-jitter delay before retry `n` (from 0):
    /// `min(cap, base * 2^n)` (or `base * multiplier^n`, see
    /// [`multiplier`](Self::multiplier)), saturating instead of
    /// overflowing. With a multiplier other than 2 it is computed in
    /// floating point and rounded to the nanosecond.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_budget::Backoff;
    ///
    /// let b = Backoff::full_jitter(Duration::from_millis(100), Duration::from_secs(1));
    /// assert_eq!(b.bound(0), Duration::from_millis(100));
    /// assert_eq!(b.bound(2), Duration::from_millis(400));
    /// assert_eq!(b.bound(10), Duration::from_secs(1));
    /// ```
    #[must_use]
    pub fn bound(&self, n: u32) -> Duration {
        if self.multiplier != DOUBLING {
            let exponent = i32::try_from(n).unwrap_or(i32::MAX);
            let secs = self.base.as_secs_f64() * self.multiplier_value().powi(exponent);
            return Duration::try_from_secs_f64(secs)
                .unwrap_or(Duration::MAX)
                .min(self.cap);
        }
        let factor = 1u32.checked_shl(n).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.cap)
    }

    /// The delay before retry `n` (from 0), drawn from `jitter`.
    pub(crate) fn delay(&self, n: u32, jitter: &mut Jitter) -> Duration {
        match self.kind {
            Kind::Full => uniform(Duration::ZERO, self.bound(n), jitter.next()),
            Kind::Decorrelated => {
                let high = jitter
                    .previous
                    .max(self.base)
                    .saturating_mul(3)
                    .min(self.cap);
                let low = self.base.min(high);
                let delay = uniform(low, high, jitter.next());
                jitter.previous = delay;
                delay
            }
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A uniform duration in `[low, high]` (nanosecond resolution) from 64
/// random bits, by multiply-and-shift.
fn uniform(low: Duration, high: Duration, bits: u64) -> Duration {
    let span = high
        .saturating_sub(low)
        .as_nanos()
        .min(u128::from(u64::MAX - 1)) as u64;
    let offset = ((u128::from(bits) * (u128::from(span) + 1)) >> 64) as u64;
    low.saturating_add(Duration::from_nanos(offset))
}

// === impl Jitter ===

impl Jitter {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            state: seed,
            previous: Duration::ZERO,
        }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn bound_doubles_then_caps_without_overflow() {
        let b = Backoff::full_jitter(10 * MS, 100 * MS);
        let bounds: Vec<_> = (0..6).map(|n| b.bound(n)).collect();
        assert_eq!(
            bounds,
            [10 * MS, 20 * MS, 40 * MS, 80 * MS, 100 * MS, 100 * MS]
        );
        assert_eq!(b.bound(u32::MAX), 100 * MS);
        let huge = Backoff::full_jitter(Duration::MAX, Duration::MAX);
        assert_eq!(huge.bound(3), Duration::MAX);
    }

    #[test]
    fn a_multiplier_grows_the_bound_by_its_factor_then_caps() {
        let b = Backoff::full_jitter(100 * MS, 1_000 * MS).multiplier(1.5);
        let bounds: Vec<_> = (0..7).map(|n| b.bound(n)).collect();
        assert_eq!(
            bounds,
            [
                100 * MS,
                150 * MS,
                225 * MS,
                Duration::from_micros(337_500),
                Duration::from_micros(506_250),
                Duration::from_nanos(759_375_000),
                1_000 * MS,
            ]
        );
        assert_eq!(b.bound(u32::MAX), 1_000 * MS, "saturates to the cap");
        // Below 1 the delays shrink; 2 is the integer path, unchanged.
        let shrinking = Backoff::full_jitter(100 * MS, 1_000 * MS).multiplier(0.5);
        assert_eq!(shrinking.bound(1), 50 * MS);
        let doubling = Backoff::full_jitter(10 * MS, 100 * MS).multiplier(2.0);
        assert_eq!(doubling, Backoff::full_jitter(10 * MS, 100 * MS));
        let huge = Backoff::full_jitter(Duration::MAX, Duration::MAX).multiplier(3.0);
        assert_eq!(huge.bound(3), Duration::MAX);
    }

    #[test]
    #[should_panic(expected = "backoff multiplier must be a finite number above 0")]
    fn a_multiplier_of_zero_panics() {
        let _ = Backoff::DEFAULT.multiplier(0.0);
    }

    #[test]
    fn uniform_stays_in_range_and_hits_both_ends() {
        assert_eq!(uniform(MS, 3 * MS, 0), MS);
        assert_eq!(uniform(MS, 3 * MS, u64::MAX), 3 * MS);
        assert_eq!(uniform(5 * MS, 5 * MS, 12345), 5 * MS);
        // Inverted bounds never panic and collapse to the low end.
        assert_eq!(uniform(5 * MS, MS, u64::MAX), 5 * MS);
    }

    #[test]
    fn full_jitter_mean_is_half_the_bound() {
        let b = Backoff::full_jitter(100 * MS, 10_000 * MS);
        let mut j = Jitter::new(42);
        let n = 20_000;
        let total: Duration = (0..n).map(|_| b.delay(1, &mut j)).sum();
        let mean = total / n;
        // bound(1) = 200 ms: mean within 2% of 100 ms.
        assert!(mean > 98 * MS && mean < 102 * MS, "{mean:?}");
    }

    #[test]
    fn decorrelated_stays_between_base_and_cap() {
        let b = Backoff::decorrelated(10 * MS, 200 * MS);
        let mut j = Jitter::new(7);
        let mut previous = 10 * MS;
        for _ in 0..1_000 {
            let d = b.delay(0, &mut j);
            assert!(d >= 10 * MS && d <= 200 * MS, "{d:?}");
            assert!(d <= (previous * 3).min(200 * MS));
            previous = d;
        }
    }
}
