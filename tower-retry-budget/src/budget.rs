//! The retry budget: retries may add at most a fixed fraction to the
//! requests sent, over a sliding window.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

/// Buckets in the sliding window.
const BUCKETS: usize = 10;
/// Stripes of the request counters, so that tasks on different threads do
/// not contend on one cache line.
const STRIPES: usize = 8;
/// Bits of a bucket word that hold the count; the rest hold the bucket's
/// epoch (its index modulo 2^24).
const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << (64 - COUNT_BITS)) - 1;
/// Ratios are kept in millionths, so 0.1, 0.3 and 0.7 are exact.
const PPM: u64 = 1_000_000;

/// The default share of requests that may be retried: 10%.
pub const DEFAULT_RATIO: f64 = 0.1;
/// The default floor: 5 retries per second, whatever the traffic.
pub const DEFAULT_MIN_PER_SEC: u32 = 5;
/// The default window over which requests and retries are counted: 10 s.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// A retry budget: over a sliding window, retries may be at most
/// `ratio` times the requests, plus a floor of `min_per_sec` retries per
/// second of window.
///
/// With the defaults (ratio 0.1, floor 5 per second, window 10 s), a client
/// that sends 1,000 requests in ten seconds to a dependency that is down may
/// retry 100 of them plus 50: the dependency sees about 1.1 times the load,
/// not 3 times. A quiet client that sends two requests in the window may
/// still retry both, thanks to the floor.
///
/// Concretely, a retry is allowed when, counting the window's buckets,
/// `retries + 1 <= ratio * requests + min_per_sec * window`, with the ratio
/// kept in millionths (so any decimal fraction down to 0.000001 is exact)
/// and integer arithmetic throughout.
///
/// The window is a ring of ten time buckets (each a tenth of the window),
/// so it slides in steps of a tenth. Each bucket is one atomic word holding
/// its epoch and its count; a stale bucket is recycled by the first writer
/// that sees it. Counting a request ([`deposit`](RetryBudget::deposit)) is
/// one clock read and one uncontended atomic add on a per-thread stripe;
/// asking for a retry ([`withdraw`](RetryBudget::withdraw)) sums the ring
/// and claims the retry with a compare-and-swap, so concurrent retries
/// never overspend it. Nothing takes a lock.
///
/// # Clone
///
/// `RetryBudget` is not `Clone`; share one by `Arc`. [`RetryLayer`]
/// creates one in its constructor and every service it builds, and every
/// clone of those, draws from it; pass the same `Arc` to several layers
/// with [`RetryLayer::budget`] to give them one budget.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_retry_budget::RetryBudget;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let budget = RetryBudget::new()
///     .ratio(0.2)
///     .min_per_sec(0)
///     .window(Duration::from_secs(10));
/// for _ in 0..10 {
///     budget.deposit();
/// }
/// assert!(budget.withdraw());
/// assert!(budget.withdraw());
/// assert!(!budget.withdraw(), "20% of 10 requests is 2 retries");
///
/// let counters = budget.counters();
/// assert_eq!(counters.requests, 10);
/// assert_eq!(counters.retries, 2);
/// assert_eq!(counters.refused_by_budget, 1);
/// # }
/// ```
///
/// [`RetryLayer`]: crate::RetryLayer
/// [`RetryLayer::budget`]: crate::RetryLayer::budget
pub struct RetryBudget {
    /// Retries allowed per million requests; `None` means unlimited.
    ratio_ppm: Option<u64>,
    min_per_sec: u32,
    window: Duration,
    /// `min_per_sec * window`, in retries.
    reserve: u64,
    bucket_nanos: u64,
    start: Instant,
    stripes: Box<[Stripe]>,
    retries: [AtomicU64; BUCKETS],
    retried: AtomicU64,
    refused: AtomicU64,
}

/// One stripe of request counters, alone on its cache lines.
#[repr(align(128))]
struct Stripe {
    total: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// A snapshot of the counters of a [`RetryBudget`] (and so of every layer
/// that shares it), totals since it was created.
///
/// # Example
///
/// ```
/// use tower_retry_budget::RetryLayer;
///
/// let layer = RetryLayer::new();
/// let counters = layer.counters();
/// assert_eq!((counters.requests, counters.retries, counters.refused_by_budget), (0, 0, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Counters {
    /// Logical requests (first attempts) counted.
    pub requests: u64,
    /// Retries the budget allowed.
    pub retries: u64,
    /// Retries the budget refused.
    pub refused_by_budget: u64,
}

thread_local! {
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

fn stripe_index() -> usize {
    STRIPE.with(|s| {
        let mut i = s.get();
        if i == usize::MAX {
            i = NEXT_STRIPE.fetch_add(1, Relaxed) % STRIPES;
            s.set(i);
        }
        i
    })
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

/// Whether epoch `a` is after epoch `b`, modulo 2^24.
fn is_after(a: u64, b: u64) -> bool {
    let d = a.wrapping_sub(b) & EPOCH_MASK;
    d != 0 && d < (EPOCH_MASK >> 1)
}

const fn word(epoch: u64, count: u64) -> u64 {
    (epoch << COUNT_BITS) | count
}

/// Adds one to the bucket `slot` for `epoch`, recycling it if stale.
fn bump(slot: &AtomicU64, epoch: u64) {
    let mut current = slot.load(Relaxed);
    loop {
        let have = current >> COUNT_BITS;
        if have == epoch || is_after(have, epoch) {
            // Current, or already recycled by a thread with a later clock:
            // count it there (at most one bucket late).
            slot.fetch_add(1, Relaxed);
            return;
        }
        match slot.compare_exchange_weak(current, word(epoch, 1), Relaxed, Relaxed) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

// === impl RetryBudget ===

impl RetryBudget {
    /// A budget with the defaults: [`DEFAULT_RATIO`] (10%),
    /// [`DEFAULT_MIN_PER_SEC`] (5 retries per second) and
    /// [`DEFAULT_WINDOW`] (10 s).
    #[must_use]
    pub fn new() -> Self {
        Self::build(
            Some(ratio_to_ppm(DEFAULT_RATIO)),
            DEFAULT_MIN_PER_SEC,
            DEFAULT_WINDOW,
        )
    }

    /// A budget that allows every retry but still counts requests and
    /// retries. Use it to measure what the budget saves, not in production.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_retry_budget::RetryBudget;
    ///
    /// let budget = RetryBudget::unlimited();
    /// assert!((0..1000).all(|_| budget.withdraw()));
    /// ```
    #[must_use]
    pub fn unlimited() -> Self {
        Self::build(None, 0, DEFAULT_WINDOW)
    }

    fn build(ratio_ppm: Option<u64>, min_per_sec: u32, window: Duration) -> Self {
        let window = window.max(Duration::from_millis(1));
        let bucket_nanos =
            (window.as_nanos() / BUCKETS as u128).clamp(1, u128::from(u64::MAX)) as u64;
        let reserve =
            (u128::from(min_per_sec) * window.as_millis() / 1000).min(u128::from(u64::MAX)) as u64;
        Self {
            ratio_ppm,
            min_per_sec,
            window,
            reserve,
            bucket_nanos,
            start: Instant::now(),
            stripes: (0..STRIPES)
                .map(|_| Stripe {
                    total: ZERO,
                    buckets: [ZERO; BUCKETS],
                })
                .collect(),
            retries: [ZERO; BUCKETS],
            retried: ZERO,
            refused: ZERO,
        }
    }

    /// The share of requests that may be retried (default 0.1), kept with a
    /// resolution of one millionth. Values above 1 allow more retries than
    /// requests.
    ///
    /// Counts gathered so far are discarded: configure before use.
    ///
    /// # Panics
    ///
    /// Panics if `ratio` is negative, NaN or infinite.
    #[must_use]
    pub fn ratio(self, ratio: f64) -> Self {
        Self::build(Some(ratio_to_ppm(ratio)), self.min_per_sec, self.window)
    }

    /// The floor: retries allowed per second of window whatever the traffic
    /// (default 5), so that a quiet client can still retry. Zero makes the
    /// ratio the only allowance.
    ///
    /// Counts gathered so far are discarded: configure before use.
    #[must_use]
    pub fn min_per_sec(self, min_per_sec: u32) -> Self {
        Self::build(self.ratio_ppm, min_per_sec, self.window)
    }

    /// The length of the sliding window (default 10 s, at least 1 ms). It is
    /// kept as ten buckets, so it slides in steps of a tenth.
    ///
    /// Counts gathered so far are discarded: configure before use.
    #[must_use]
    pub fn window(self, window: Duration) -> Self {
        Self::build(self.ratio_ppm, self.min_per_sec, window)
    }

    /// The configured ratio, or `None` for an [`unlimited`](Self::unlimited)
    /// budget.
    #[must_use]
    pub fn ratio_value(&self) -> Option<f64> {
        self.ratio_ppm.map(|ppm| ppm as f64 / PPM as f64)
    }

    /// The configured floor in retries per second.
    #[must_use]
    pub const fn min_per_sec_value(&self) -> u32 {
        self.min_per_sec
    }

    /// The configured window.
    #[must_use]
    pub const fn window_value(&self) -> Duration {
        self.window
    }

    /// Counts one request (a first attempt). The retry layer calls this for
    /// every request it receives.
    pub fn deposit(&self) {
        self.deposit_at(Instant::now());
    }

    /// Asks for one retry: `true` (and the retry is counted) when the
    /// window's allowance has room, `false` (and the refusal is counted)
    /// otherwise.
    #[must_use = "a refused retry must not be sent"]
    pub fn withdraw(&self) -> bool {
        self.withdraw_at(Instant::now())
    }

    /// [`deposit`](Self::deposit) with the clock already read.
    #[inline]
    pub(crate) fn deposit_at(&self, now: Instant) {
        let stripe = &self.stripes[stripe_index()];
        stripe.total.fetch_add(1, Relaxed);
        if self.ratio_ppm.is_none() {
            return;
        }
        let index = self.bucket_index(now);
        bump(
            &stripe.buckets[(index % BUCKETS as u64) as usize],
            index & EPOCH_MASK,
        );
    }

    /// [`withdraw`](Self::withdraw) with the clock already read.
    pub(crate) fn withdraw_at(&self, now: Instant) -> bool {
        let Some(ratio_ppm) = self.ratio_ppm else {
            self.retried.fetch_add(1, Relaxed);
            return true;
        };
        let index = self.bucket_index(now);
        let epoch = index & EPOCH_MASK;
        let slot = (index % BUCKETS as u64) as usize;

        let requests: u64 = self
            .stripes
            .iter()
            .map(|s| window_sum(&s.buckets, index))
            .sum();
        let allowance = u128::from(ratio_ppm) * u128::from(requests)
            + u128::from(self.reserve) * u128::from(PPM);
        let others = window_sum_except(&self.retries, index, slot);

        let cell = &self.retries[slot];
        let mut current = cell.load(Relaxed);
        loop {
            let have = current >> COUNT_BITS;
            if is_after(have, epoch) {
                // A thread with a later clock recycled our bucket: count the
                // retry there rather than losing it (checked against the
                // same allowance).
                let mine = (current & COUNT_MASK) + others;
                if u128::from(mine + 1) * u128::from(PPM) > allowance {
                    return self.refuse();
                }
                cell.fetch_add(1, Relaxed);
                break;
            }
            let mine = if have == epoch {
                current & COUNT_MASK
            } else {
                0
            };
            if u128::from(others + mine + 1) * u128::from(PPM) > allowance {
                return self.refuse();
            }
            match cell.compare_exchange_weak(current, word(epoch, mine + 1), Relaxed, Relaxed) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        self.retried.fetch_add(1, Relaxed);
        true
    }

    fn refuse(&self) -> bool {
        self.refused.fetch_add(1, Relaxed);
        false
    }

    #[inline]
    fn bucket_index(&self, now: Instant) -> u64 {
        // u64 nanoseconds last 584 years; u128 division is much slower.
        let nanos = now.saturating_duration_since(self.start).as_nanos();
        u64::try_from(nanos).unwrap_or(u64::MAX) / self.bucket_nanos
    }

    /// Totals since the budget was created.
    #[must_use]
    pub fn counters(&self) -> Counters {
        Counters {
            requests: self.stripes.iter().map(|s| s.total.load(Relaxed)).sum(),
            retries: self.retried.load(Relaxed),
            refused_by_budget: self.refused.load(Relaxed),
        }
    }
}

/// The epoch bucket `slot` must hold to be inside the window that ends at
/// bucket `index`.
fn expected_epoch(index: u64, slot: usize) -> Option<u64> {
    let back = (index + BUCKETS as u64 - slot as u64) % BUCKETS as u64;
    index.checked_sub(back).map(|i| i & EPOCH_MASK)
}

fn window_sum(ring: &[AtomicU64; BUCKETS], index: u64) -> u64 {
    ring.iter()
        .enumerate()
        .map(|(slot, cell)| count_in_window(cell, index, slot))
        .sum()
}

fn window_sum_except(ring: &[AtomicU64; BUCKETS], index: u64, skip: usize) -> u64 {
    ring.iter()
        .enumerate()
        .filter(|(slot, _)| *slot != skip)
        .map(|(slot, cell)| count_in_window(cell, index, slot))
        .sum()
}

fn count_in_window(cell: &AtomicU64, index: u64, slot: usize) -> u64 {
    let w = cell.load(Relaxed);
    match expected_epoch(index, slot) {
        Some(epoch) if w >> COUNT_BITS == epoch => w & COUNT_MASK,
        _ => 0,
    }
}

fn ratio_to_ppm(ratio: f64) -> u64 {
    assert!(
        ratio.is_finite() && ratio >= 0.0,
        "retry budget ratio must be finite and non-negative, got {ratio}"
    );
    (ratio * PPM as f64).round() as u64
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ratio", &self.ratio_value())
            .field("min_per_sec", &self.min_per_sec)
            .field("window", &self.window)
            .field("counters", &self.counters())
            .finish()
    }
}

#[cfg(feature = "tower")]
impl tower::retry::budget::Budget for RetryBudget {
    fn deposit(&self) {
        RetryBudget::deposit(self);
    }

    fn withdraw(&self) -> bool {
        RetryBudget::withdraw(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(ratio: f64, min_per_sec: u32) -> RetryBudget {
        RetryBudget::new()
            .ratio(ratio)
            .min_per_sec(min_per_sec)
            .window(Duration::from_secs(10))
    }

    fn allowed(b: &RetryBudget, now: Instant) -> u64 {
        let mut n = 0;
        while b.withdraw_at(now) {
            n += 1;
            assert!(n < 1_000_000, "runaway budget");
        }
        n
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn floor_alone_allows_min_per_sec_times_window() {
        let b = budget(0.1, 3);
        assert_eq!(allowed(&b, Instant::now()), 30);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn window_slides_out_old_requests() {
        let b = budget(0.5, 0);
        let t0 = Instant::now();
        for _ in 0..10 {
            b.deposit_at(t0);
        }
        assert_eq!(allowed(&b, t0), 5);
        // 9.9 s later the requests and retries are still in the window.
        let t1 = t0 + Duration::from_millis(9_900);
        assert_eq!(allowed(&b, t1), 0);
        // 10 s later their bucket has left the window.
        let t2 = t0 + Duration::from_secs(10);
        assert_eq!(allowed(&b, t2), 0);
        b.deposit_at(t2);
        b.deposit_at(t2);
        assert_eq!(allowed(&b, t2), 1);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn retries_of_old_buckets_expire_too() {
        let b = budget(0.0, 1);
        let t0 = Instant::now();
        assert_eq!(allowed(&b, t0), 10);
        assert_eq!(allowed(&b, t0 + Duration::from_millis(999)), 0);
        // One bucket (1 s) later, the first bucket's retries still count...
        assert_eq!(allowed(&b, t0 + Duration::from_secs(9)), 0);
        // ...until the whole window has passed.
        assert_eq!(allowed(&b, t0 + Duration::from_secs(10)), 10);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn lagging_clock_never_wipes_newer_bucket() {
        let b = budget(1.0, 0);
        let t0 = Instant::now();
        let late = t0 + Duration::from_secs(10); // same slot, next epoch
        b.deposit_at(late);
        b.deposit_at(t0); // a thread that read the clock earlier
        assert_eq!(allowed(&b, late), 2);
    }

    #[test]
    fn epochs_compare_modulo() {
        assert!(is_after(1, 0));
        assert!(!is_after(0, 1));
        assert!(!is_after(5, 5));
        assert!(is_after(0, EPOCH_MASK));
    }

    #[test]
    fn expected_epoch_covers_the_last_ten_buckets() {
        let index = 23;
        let mut epochs: Vec<_> = (0..BUCKETS)
            .filter_map(|s| expected_epoch(index, s))
            .collect();
        epochs.sort_unstable();
        assert_eq!(epochs, (14..=23).collect::<Vec<_>>());
        // Early on, slots ahead of the clock have no valid epoch.
        assert_eq!(expected_epoch(2, 5), None);
    }

    #[test]
    #[should_panic(expected = "finite and non-negative")]
    fn negative_ratio_panics() {
        let _ = RetryBudget::new().ratio(-0.1);
    }
}
