//! The retry budget: retries may add at most a fixed fraction to the
//! requests sent, over a sliding window.

use std::cell::Cell;
use std::fmt;
// The settings that change while the budget runs: `std` atomics, which
// the loom models (of the window's races) do not explore.
use std::sync::atomic::{AtomicU32 as LiveU32, AtomicU64 as LiveU64, AtomicUsize};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tower_resilience_base::fleet::SharedRetries;

use crate::sync::{
    zeroed, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};

/// Buckets in the sliding window.
const BUCKETS: usize = 10;
/// Stripes of the request counters, so that tasks on different threads do
/// not contend on one cache line.
const STRIPES: usize = 8;
/// How long after its creation a budget keeps sliding: 2^63 - 1 ns (292
/// years). Later instants count in the bucket of this one.
const MAX_NANOS: u64 = (1 << 63) - 1;
/// Ratios are kept in millionths, so 0.1, 0.3 and 0.7 are exact.
const PPM: u64 = 1_000_000;

/// The default share of requests that may be retried: 10%.
pub const DEFAULT_RATIO: f64 = 0.1;
/// The default floor: 5 retries per second, whatever the traffic.
pub const DEFAULT_MIN_PER_SEC: u32 = 5;
/// The default window over which requests and retries are counted: 10 s.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
/// The default floor of a budget shared by a fleet: 3 retries per window
/// for the whole fleet, whatever its traffic (see
/// [`RetryBudget::fleet_floor`]).
pub const DEFAULT_FLEET_FLOOR: u64 = 3;

/// A retry budget: over a sliding window, retries may be at most `ratio`
/// times the requests, or `min_per_sec` retries per second of window when
/// that is more. The larger of the two, never their sum.
///
/// With the defaults (ratio 0.1, floor 5 per second, window 10 s), a client
/// that sends 1,000 requests in ten seconds to a dependency that is down may
/// retry 100 of them: the dependency sees 1.1 times the load, not 3 times.
/// A quiet client that sends two requests in the window may still retry
/// both, thanks to the floor (50 retries per window, whatever the traffic).
///
/// Concretely, a retry is allowed when, counting the window's buckets,
/// `retries + 1 <= max(ratio * requests, min_per_sec * window)`, with the
/// ratio kept in millionths (so any decimal fraction down to 0.000001 is
/// exact) and integer arithmetic throughout. `min_per_sec * window` is in
/// whole retries, rounded down (5 per second over 300 ms is 1).
///
/// # Why the larger of share and floor, not their sum
///
/// The floor is for quiet clients, whose share would round to no retry at
/// all. Added on top of the share (as this budget did before), it loosened
/// the bound of every client: at 50 requests per second, 10% is 50 retries
/// per 10 s window and the floor another 50, so one retrying tier cost a
/// dependency that is down 1.2 times its load instead of 1.1, and three
/// such tiers 1.73 times instead of 1.33. As a minimum, the floor only
/// applies below `min_per_sec / ratio` requests per second (50 with the
/// defaults): above that, retries are at most `ratio` of the requests over
/// every window; below it, at most `min_per_sec` per second, a small
/// absolute amount.
///
/// # Windows
///
/// The window is a ring of ten time buckets (each a tenth of the window,
/// counted from the budget's creation), so it slides in steps of a tenth.
/// The bound holds over every window the budget sees: any ten consecutive
/// buckets. An interval of the window's length that is not aligned to the
/// buckets can see up to twice the allowance (a burst at the end of one
/// bucket, and another just after that bucket has left the window); over a
/// long run, retries stay within one allowance per window.
///
/// Each bucket is one atomic word holding its count in its low bits and its
/// full bucket index (its epoch) in its high bits; a stale bucket is
/// recycled by the first writer that sees it. The split is chosen per
/// window: the index of every instant within 292 years of the budget's
/// creation fits without wrapping, and a bucket still counts up to one
/// request per nanosecond of its length. So a bucket left idle for any
/// time is recognised as stale. (The epoch used to be kept in 24 bits and
/// compared modulo 2^24: a bucket idle for 2^23 bucket lengths, 97 days at
/// the default window or 9.7 days with a 1 s one, looked newer than the
/// clock and was never recycled, so deposits were lost in it and even the
/// floor could vanish.)
///
/// # Concurrency
///
/// Counting a request ([`deposit`](RetryBudget::deposit)) is one clock read,
/// one load and two uncontended atomic adds on a per-thread stripe (the
/// first request of a bucket on a stripe recycles it with a
/// compare-and-swap instead of the second add). Asking for a retry
/// ([`withdraw`](RetryBudget::withdraw)) sums the ring, claims the retry
/// with a compare-and-swap on its bucket, then reads the other buckets
/// again and gives the claim back if a withdrawal in another bucket (a
/// thread whose clock is already past a bucket boundary) took the room
/// meanwhile. So concurrent withdrawals never grant more than the
/// allowance, at a bucket boundary too; when two of them race there for the
/// very last retry, both may be refused. Nothing takes a lock.
///
/// Clock readings of different threads need not be in order. A withdrawal
/// whose reading is behind a retry already claimed in a newer bucket (two
/// threads at a boundary, or a reading kept too long) is judged and counted
/// at that newer bucket, as a fresh reading would be. A request counted
/// with a late reading goes to its own bucket, or to the newer one if
/// another thread has already recycled its slot. A late reading never wipes
/// newer counts.
///
/// # Refunds
///
/// A retry that was granted but is not sent (the circuit breaker refused it
/// after the backoff, say) is given back with
/// [`refund_at`](RetryBudget::refund_at): the window's allowance and the
/// [`Counters::retries`] counter are as if it had never been withdrawn, and
/// [`Counters::refunded`] counts it.
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
/// The floor is a minimum, not an addition:
///
/// ```
/// use tower_retry_budget::RetryBudget;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // 10% and 5 per second over 10 s: 50 retries, or 10% when that is more.
/// let budget = RetryBudget::new();
/// for _ in 0..500 {
///     budget.deposit();
/// }
/// let granted = std::iter::from_fn(|| budget.withdraw().then_some(())).count();
/// assert_eq!(granted, 50, "max(10% of 500, 50), not 50 + 50");
///
/// for _ in 0..500 {
///     budget.deposit();
/// }
/// let more = std::iter::from_fn(|| budget.withdraw().then_some(())).count();
/// assert_eq!(granted + more, 100, "10% of 1,000");
/// # }
/// ```
///
/// [`RetryLayer`]: crate::RetryLayer
/// [`RetryLayer::budget`]: crate::RetryLayer::budget
pub struct RetryBudget {
    /// Retries allowed per million requests as built; `None` means
    /// unlimited (which stays so: an unlimited budget counts no buckets).
    ratio_ppm: Option<u64>,
    /// The ratio now ([`set_ratio`](RetryBudget::set_ratio)).
    live_ppm: LiveU64,
    min_per_sec: LiveU32,
    window: Duration,
    /// `min_per_sec * window`, in retries.
    reserve: LiveU64,
    bucket_nanos: u64,
    /// How a bucket word splits into epoch and count.
    layout: Layout,
    start: Instant,
    stripes: Box<[Stripe]>,
    retries: [AtomicU64; BUCKETS],
    retried: AtomicU64,
    refused: AtomicU64,
    refunded: AtomicU64,
    /// The fleet's budget this one claims its retries from, once shared.
    shared: OnceLock<Arc<dyn SharedRetries>>,
    fleet_floor: u64,
}

/// One stripe of request counters, alone on its cache lines.
#[repr(align(128))]
struct Stripe {
    total: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// How a bucket word splits: the count in the low `count_bits`, the
/// bucket's full index (its epoch) above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    count_bits: u32,
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
    /// Retries the budget allowed, less those given back with
    /// [`RetryBudget::refund_at`]: the retries paid for.
    pub retries: u64,
    /// Retries the budget refused.
    pub refused_by_budget: u64,
    /// Retries given back with [`RetryBudget::refund_at`]: allowed, then
    /// not sent. They are already subtracted from
    /// [`retries`](Counters::retries).
    pub refunded: u64,
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

/// The slot of the ring that holds bucket `index`.
const fn slot_of(index: u64) -> usize {
    (index % BUCKETS as u64) as usize
}

/// Adds one to the bucket `index` in `cell`, recycling the cell if it holds
/// an older bucket. Relaxed: request counts only ever raise the allowance,
/// so a reader that misses one is conservative.
fn bump(cell: &AtomicU64, index: u64, layout: Layout) {
    let mut current = cell.load(Relaxed);
    loop {
        if layout.epoch(current) >= index {
            // Current, or already recycled by a thread with a later clock:
            // count it there (late rather than lost).
            cell.fetch_add(1, Relaxed);
            return;
        }
        match cell.compare_exchange_weak(current, layout.word(index, 1), Relaxed, Relaxed) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

/// Takes one back from bucket `index` in `cell`, if the cell still holds
/// that bucket and it is not empty. A cell recycled since then no longer
/// holds the count to take back: the window has moved past it.
fn take_back(cell: &AtomicU64, index: u64, layout: Layout) {
    let mut current = cell.load(SeqCst);
    while layout.epoch(current) == index && layout.count(current) > 0 {
        match cell.compare_exchange_weak(current, current - 1, SeqCst, SeqCst) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

// === impl RetryBudget ===

impl RetryBudget {
    /// A budget with the defaults: [`DEFAULT_RATIO`] (10%),
    /// [`DEFAULT_MIN_PER_SEC`] (5 retries per second) and
    /// [`DEFAULT_WINDOW`] (10 s): at most 10% of the requests over the
    /// window, or 50 retries when that is more.
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
            live_ppm: LiveU64::new(ratio_ppm.unwrap_or(0)),
            min_per_sec: LiveU32::new(min_per_sec),
            window,
            reserve: LiveU64::new(reserve),
            bucket_nanos,
            layout: Layout::for_bucket(bucket_nanos),
            start: Instant::now(),
            stripes: (0..STRIPES)
                .map(|_| Stripe {
                    total: AtomicU64::new(0),
                    buckets: zeroed(),
                })
                .collect(),
            retries: zeroed(),
            retried: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            refunded: AtomicU64::new(0),
            shared: OnceLock::new(),
            fleet_floor: DEFAULT_FLEET_FLOOR,
        }
    }

    /// The floor of the fleet's budget when this one is
    /// [shared](Self::share): retries per window the whole fleet may make
    /// whatever its requests (default [`DEFAULT_FLEET_FLOOR`], 3). The
    /// fleet's retries are at most the larger of this and `ratio` of the
    /// fleet's requests; this budget's own
    /// [`min_per_sec`](Self::min_per_sec) only applies while the fleet
    /// cannot answer. It is read by whoever shares the budget (the
    /// stacks of `tower-shield` pass it to the breaker's store).
    #[must_use]
    pub fn fleet_floor(mut self, retries: u64) -> Self {
        self.fleet_floor = retries;
        self
    }

    /// The fleet's floor, in retries per window (see
    /// [`fleet_floor`](Self::fleet_floor)).
    #[must_use]
    pub const fn fleet_floor_value(&self) -> u64 {
        self.fleet_floor
    }

    /// Shares this budget with a fleet: from now on, each retry the retry
    /// layer would send is claimed from `fleet` (a store that every
    /// process's requests earn credit in; for a breaker's store,
    /// `tower_breaker::Breaker::share_retries`), and this budget decides
    /// alone only while the fleet answers
    /// [`Claim::Unavailable`](tower_resilience_base::fleet::Claim).
    /// Requests are still counted here (the fleet's handle reads
    /// [`counters`](Self::counters)). Hedges keep drawing on this budget
    /// alone: a hedge cannot wait for a store's answer.
    ///
    /// Returns `false`, and changes nothing, when the budget is already
    /// shared.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_resilience_base::fleet::{Claim, ClaimFuture, SharedRetries};
    /// use tower_retry_budget::RetryBudget;
    ///
    /// #[derive(Debug)]
    /// struct NoRetries;
    /// impl SharedRetries for NoRetries {
    ///     fn claim(&self) -> ClaimFuture {
    ///         Box::pin(async { Claim::Refused })
    ///     }
    ///     fn give_back(&self) {}
    /// }
    ///
    /// let budget = RetryBudget::new();
    /// assert!(budget.share(Arc::new(NoRetries)));
    /// assert!(budget.shared().is_some());
    /// assert!(!budget.share(Arc::new(NoRetries)), "shared once");
    /// ```
    pub fn share(&self, fleet: Arc<dyn SharedRetries>) -> bool {
        self.shared.set(fleet).is_ok()
    }

    /// The fleet this budget claims its retries from, if
    /// [shared](Self::share).
    #[must_use]
    pub fn shared(&self) -> Option<&Arc<dyn SharedRetries>> {
        self.shared.get()
    }

    /// Counts a retry the fleet granted (so that the window knows it,
    /// should the fleet stop answering).
    pub(crate) fn count_granted(&self, now: Instant) {
        self.retried.fetch_add(1, Relaxed);
        if self.ratio_ppm.is_some() {
            let index = self.bucket_index(now);
            bump(&self.retries[slot_of(index)], index, self.layout);
        }
    }

    /// Counts a retry the fleet refused.
    pub(crate) fn count_refused(&self) {
        self.refused.fetch_add(1, Relaxed);
    }

    /// The share of requests that may be retried over the window (default
    /// 0.1), kept with a resolution of one millionth. Values above 1 allow
    /// more retries than requests.
    ///
    /// The share and the [floor](Self::min_per_sec) are not added: the
    /// budget allows the larger of the two, so above `min_per_sec / ratio`
    /// requests per second (50 with the defaults) retries are at most this
    /// share of the requests over every window.
    ///
    /// Counts gathered so far are discarded: configure before use.
    ///
    /// # Panics
    ///
    /// Panics if `ratio` is negative, NaN or infinite.
    #[must_use]
    pub fn ratio(self, ratio: f64) -> Self {
        Self {
            fleet_floor: self.fleet_floor,
            ..Self::build(
                Some(ratio_to_ppm(ratio)),
                self.min_per_sec_value(),
                self.window,
            )
        }
    }

    /// The floor: a minimum of `min_per_sec` retries per second of window
    /// (`min_per_sec * window` per window, rounded down; default 5, so 50
    /// per 10 s window), whatever the traffic, so that a quiet client can
    /// still retry. Zero makes the [ratio](Self::ratio) the only allowance.
    ///
    /// It is a minimum, not an addition to the share: the budget allows
    /// `max(ratio * requests, min_per_sec * window)` retries per window. A
    /// busy client, whose share is larger, gets nothing from the floor;
    /// before, the floor was added on top, which let a client at 50
    /// requests per second retry 20% of them.
    ///
    /// Counts gathered so far are discarded: configure before use.
    #[must_use]
    pub fn min_per_sec(self, min_per_sec: u32) -> Self {
        Self {
            fleet_floor: self.fleet_floor,
            ..Self::build(self.live_ratio_ppm(), min_per_sec, self.window)
        }
    }

    /// The length of the sliding window over which both the share and the
    /// floor are counted (default 10 s, at least 1 ms). It is kept as ten
    /// buckets, so it slides in steps of a tenth.
    ///
    /// Counts gathered so far are discarded: configure before use.
    #[must_use]
    pub fn window(self, window: Duration) -> Self {
        Self {
            fleet_floor: self.fleet_floor,
            ..Self::build(self.live_ratio_ppm(), self.min_per_sec_value(), window)
        }
    }

    /// The configured ratio, or `None` for an [`unlimited`](Self::unlimited)
    /// budget.
    #[must_use]
    pub fn ratio_value(&self) -> Option<f64> {
        self.live_ratio_ppm().map(|ppm| ppm as f64 / PPM as f64)
    }

    fn live_ratio_ppm(&self) -> Option<u64> {
        self.ratio_ppm.map(|_| self.live_ppm.load(Relaxed))
    }

    /// The configured floor in retries per second.
    #[must_use]
    pub fn min_per_sec_value(&self) -> u32 {
        self.min_per_sec.load(Relaxed)
    }

    /// Changes the [ratio](Self::ratio) of a budget in use, keeping its
    /// window: the requests and retries already counted stay, and the next
    /// withdrawal is judged by the new share of them. A lower ratio can
    /// leave the window over its new allowance; retries are then refused
    /// until it slides back under.
    ///
    /// # Errors
    ///
    /// [`BudgetChangeError::Unlimited`] on an
    /// [`unlimited`](Self::unlimited) budget (it counts no window to
    /// apply a ratio to), [`BudgetChangeError::InvalidRatio`] for a
    /// negative, NaN or infinite ratio.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_retry_budget::RetryBudget;
    ///
    /// let budget = RetryBudget::new();
    /// budget.set_ratio(0.2)?;
    /// assert_eq!(budget.ratio_value(), Some(0.2));
    /// assert!(budget.set_ratio(-1.0).is_err());
    /// # Ok::<(), tower_retry_budget::BudgetChangeError>(())
    /// ```
    pub fn set_ratio(&self, ratio: f64) -> Result<(), BudgetChangeError> {
        if self.ratio_ppm.is_none() {
            return Err(BudgetChangeError::Unlimited);
        }
        if !ratio.is_finite() || ratio < 0.0 {
            return Err(BudgetChangeError::InvalidRatio { value: ratio });
        }
        self.live_ppm.store(ratio_to_ppm(ratio), Relaxed);
        Ok(())
    }

    /// Changes the [floor](Self::min_per_sec) of a budget in use, keeping
    /// its window.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_retry_budget::RetryBudget;
    ///
    /// let budget = RetryBudget::new();
    /// budget.set_min_per_sec(1);
    /// assert_eq!(budget.min_per_sec_value(), 1);
    /// ```
    pub fn set_min_per_sec(&self, min_per_sec: u32) {
        let reserve = (u128::from(min_per_sec) * self.window.as_millis() / 1000)
            .min(u128::from(u64::MAX)) as u64;
        self.min_per_sec.store(min_per_sec, Relaxed);
        self.reserve.store(reserve, Relaxed);
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

    /// [`deposit`](Self::deposit) with the clock already read: counts one
    /// request in the bucket of `now`. The retry layer reads the clock once
    /// per call and passes it here.
    ///
    /// `now` should be a fresh reading: a reading older than a bucket that
    /// another thread has already recycled is counted in that newer bucket,
    /// and one from before the budget's creation in its first bucket.
    #[inline]
    pub fn deposit_at(&self, now: Instant) {
        let stripe = &self.stripes[stripe_index()];
        stripe.total.fetch_add(1, Relaxed);
        if self.ratio_ppm.is_none() {
            return;
        }
        let index = self.bucket_index(now);
        bump(&stripe.buckets[slot_of(index)], index, self.layout);
    }

    /// [`withdraw`](Self::withdraw) with the clock already read: asks for
    /// one retry in the window that ends at `now`, or at the newest bucket
    /// in which another thread has already claimed a retry, if that is
    /// later (so a late reading cannot escape a window that has moved on).
    /// Keep `now` if the retry may be given back:
    /// [`refund_at`](Self::refund_at) takes the same instant.
    ///
    /// Concurrent calls never grant more than the allowance, in one bucket
    /// or across a boundary; see [Concurrency](Self#concurrency).
    #[must_use = "a refused retry must not be sent"]
    pub fn withdraw_at(&self, now: Instant) -> bool {
        let Some(ratio_ppm) = self.live_ratio_ppm() else {
            self.retried.fetch_add(1, Relaxed);
            return true;
        };
        let layout = self.layout;
        let mut index = self.bucket_index(now);
        'window: loop {
            let allowance = self.allowance(ratio_ppm, index);
            let fits = |retries: u64| u128::from(retries) * u128::from(PPM) <= allowance;
            let slot = slot_of(index);
            let cell = &self.retries[slot];
            let mut current = cell.load(SeqCst);
            loop {
                let have = layout.epoch(current);
                let (others, newest) = self.retries_seen(index, slot);
                if newest > index {
                    // A thread with a later clock has already claimed a
                    // retry in a newer bucket: our reading is behind (at a
                    // bucket boundary, say), so judge and count the retry
                    // at that bucket, as a fresh reading would. Counting it
                    // in ours could wipe newer retries, or escape a window
                    // that has already moved on.
                    index = newest;
                    continue 'window;
                }
                let mine = if have == index {
                    layout.count(current)
                } else {
                    0
                };
                if !fits(others + mine + 1) {
                    return self.refuse();
                }
                // Claim with a compare-and-swap, so that withdrawals in
                // the same bucket never overspend it.
                match cell.compare_exchange_weak(
                    current,
                    layout.word(index, mine + 1),
                    SeqCst,
                    SeqCst,
                ) {
                    Ok(_) => {
                        // Withdrawals in other buckets (threads whose clock
                        // is on the other side of a boundary) may have
                        // claimed room since we read them. Every claim is
                        // SeqCst, so of two racing claims the later one
                        // sees the earlier here, and gives its own back.
                        let (others, newest) = self.retries_seen(index, slot);
                        if newest > index {
                            take_back(cell, index, layout);
                            index = newest;
                            continue 'window;
                        }
                        if fits(others + mine + 1) {
                            self.retried.fetch_add(1, Relaxed);
                            return true;
                        }
                        take_back(cell, index, layout);
                        return self.refuse();
                    }
                    Err(actual) => current = actual,
                }
            }
        }
    }

    /// Gives back a retry that [`withdraw_at`](Self::withdraw_at) granted
    /// at `withdrawn_at` and that was not sent: for a retry that was paid
    /// for before its backoff and then refused after it (the circuit
    /// breaker opened meanwhile, say). Pass the instant given to
    /// `withdraw_at`, so the retry is taken out of the bucket that counted
    /// it.
    ///
    /// Afterwards the window's allowance is as if the retry had never been
    /// withdrawn; [`Counters::retries`] goes down by one and
    /// [`Counters::refunded`] up by one. If the retry's bucket has already
    /// left the window, only the counters change: the retry no longer
    /// limits anyone.
    ///
    /// One approximation: when `withdrawn_at` was behind a retry another
    /// thread had already claimed in a newer bucket, the retry was counted
    /// in that newer bucket (see [`withdraw_at`](Self::withdraw_at)), and
    /// the refund takes one from the bucket of `withdrawn_at` instead. If
    /// that bucket holds one, the allowance is right at once, but one
    /// retry of room comes back a little early, when the older bucket
    /// leaves the window; if it holds none, the retry keeps counting until
    /// its bucket leaves the window (the budget errs on the tight side).
    ///
    /// Call it once per granted retry, never for a refused one: an extra
    /// refund frees a retry someone else paid for.
    ///
    /// # Example
    ///
    /// ```
    /// use tokio::time::Instant;
    /// use tower_retry_budget::RetryBudget;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let budget = RetryBudget::new().min_per_sec(0);
    /// for _ in 0..10 {
    ///     budget.deposit();
    /// }
    /// let now = Instant::now();
    /// assert!(budget.withdraw_at(now));
    /// // The breaker refused the retry after the backoff: give it back.
    /// budget.refund_at(now);
    ///
    /// let counters = budget.counters();
    /// assert_eq!((counters.retries, counters.refunded), (0, 1));
    /// assert!(budget.withdraw(), "10% of 10 requests is still 1 retry");
    /// # }
    /// ```
    pub fn refund_at(&self, withdrawn_at: Instant) {
        let _ = self
            .retried
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
        self.refunded.fetch_add(1, Relaxed);
        if self.ratio_ppm.is_some() {
            let index = self.bucket_index(withdrawn_at);
            take_back(&self.retries[slot_of(index)], index, self.layout);
        }
    }

    /// Totals since the budget was created.
    #[must_use]
    pub fn counters(&self) -> Counters {
        Counters {
            requests: self.stripes.iter().map(|s| s.total.load(Relaxed)).sum(),
            retries: self.retried.load(Relaxed),
            refused_by_budget: self.refused.load(Relaxed),
            refunded: self.refunded.load(Relaxed),
        }
    }

    fn refuse(&self) -> bool {
        self.refused.fetch_add(1, Relaxed);
        false
    }

    /// Retries allowed in the window that ends at bucket `index`, in
    /// millionths: `max(ratio * requests, min_per_sec * window)`.
    fn allowance(&self, ratio_ppm: u64, index: u64) -> u128 {
        let requests: u64 = self
            .stripes
            .iter()
            .map(|s| window_sum(&s.buckets, index, self.layout))
            .sum();
        let share = u128::from(ratio_ppm) * u128::from(requests);
        let floor = u128::from(self.reserve.load(Relaxed)) * u128::from(PPM);
        share.max(floor)
    }

    /// The retries that count against the window ending at bucket `index`,
    /// except those of slot `skip`, and the newest bucket in the ring. Every
    /// bucket from the window's first on counts, newer ones too (claimed by
    /// threads with later clocks). SeqCst, for the claim-then-check.
    fn retries_seen(&self, index: u64, skip: usize) -> (u64, u64) {
        let first = index.saturating_sub(BUCKETS as u64 - 1);
        let (mut retries, mut newest) = (0, 0);
        for (slot, cell) in self.retries.iter().enumerate() {
            let w = cell.load(SeqCst);
            let epoch = self.layout.epoch(w);
            newest = newest.max(epoch);
            if slot != skip && epoch >= first {
                retries += self.layout.count(w);
            }
        }
        (retries, newest)
    }

    #[inline]
    fn bucket_index(&self, now: Instant) -> u64 {
        // Capped at MAX_NANOS, so that every index fits the layout; u64,
        // because u128 division is much slower.
        let nanos = now.saturating_duration_since(self.start).as_nanos();
        u64::try_from(nanos).map_or(MAX_NANOS, |n| n.min(MAX_NANOS)) / self.bucket_nanos
    }
}

/// The epoch bucket `slot` must hold to be inside the window that ends at
/// bucket `index`.
fn expected_epoch(index: u64, slot: usize) -> Option<u64> {
    let back = (index + BUCKETS as u64 - slot as u64) % BUCKETS as u64;
    index.checked_sub(back)
}

/// The counts of `ring` inside the window that ends at bucket `index`.
fn window_sum(ring: &[AtomicU64; BUCKETS], index: u64, layout: Layout) -> u64 {
    ring.iter()
        .enumerate()
        .map(|(slot, cell)| {
            let w = cell.load(Relaxed);
            match expected_epoch(index, slot) {
                Some(epoch) if layout.epoch(w) == epoch => layout.count(w),
                _ => 0,
            }
        })
        .sum()
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
            .field("min_per_sec", &self.min_per_sec_value())
            .field("window", &self.window)
            .field("shared", &self.shared.get())
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

// === impl Layout ===

impl Layout {
    /// The split for buckets of `bucket_nanos`: just enough epoch bits for
    /// the last bucket index a budget reaches (at [`MAX_NANOS`]), and the
    /// rest for the count, which leaves room for at least one count per
    /// nanosecond of the bucket.
    const fn for_bucket(bucket_nanos: u64) -> Self {
        let last_index = MAX_NANOS / bucket_nanos;
        let epoch_bits = u64::BITS - last_index.leading_zeros();
        let count_bits = u64::BITS - epoch_bits;
        Self {
            // At least one epoch bit, so that shifts stay below 64.
            count_bits: if count_bits > 63 { 63 } else { count_bits },
        }
    }

    const fn epoch(self, word: u64) -> u64 {
        word >> self.count_bits
    }

    const fn count(self, word: u64) -> u64 {
        word & ((1 << self.count_bits) - 1)
    }

    const fn word(self, epoch: u64, count: u64) -> u64 {
        (epoch << self.count_bits) | count
    }
}

#[cfg(all(test, tower_resilience_loom))]
mod loom_models;

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

    // Regression: the floor was added to the share (max(..) is the rule), so
    // a client at 50 requests per second could retry 20% of them.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn share_and_floor_are_not_added() {
        let now = Instant::now();
        for (requests, expected) in [(0, 50), (100, 50), (499, 50), (500, 50), (510, 51)] {
            let b = budget(0.1, 5);
            (0..requests).for_each(|_| b.deposit_at(now));
            assert_eq!(allowed(&b, now), expected, "{requests} requests");
        }
        let b = budget(0.1, 5);
        (0..1_000).for_each(|_| b.deposit_at(now));
        assert_eq!(allowed(&b, now), 100, "10% of 1,000, not 100 + 50");
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

    /// The window that ends at bucket 11 is buckets 2 to 11: the retries of
    /// bucket 0 no longer count, though their slot was never recycled.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn retries_of_a_bucket_the_window_left_no_longer_count() {
        let b = budget(0.0, 1);
        let t0 = Instant::now();
        assert_eq!(allowed(&b, t0), 10);
        assert_eq!(allowed(&b, t0 + Duration::from_secs(11)), 10);
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

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn lagging_withdrawal_is_judged_at_the_newer_bucket() {
        let b = budget(1.0, 0);
        let t0 = Instant::now();
        let late = t0 + Duration::from_secs(10); // same slot, next epoch
        b.deposit_at(late);
        b.deposit_at(late);
        assert!(b.withdraw_at(late));
        // A thread that read the clock a window earlier: its own window
        // holds no request, but the bucket it maps to is newer, so it is
        // judged there (one more fits) and never wipes the newer retry.
        assert!(b.withdraw_at(t0));
        assert!(!b.withdraw_at(t0));
        assert_eq!(allowed(&b, late), 0);
        assert_eq!(b.counters().retries, 2);
    }

    /// As tower's `Budget`, the budget counts and refuses exactly as through
    /// its own methods.
    #[cfg(feature = "tower")]
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_tower_budget_trait_is_the_same_budget() {
        use tower::retry::budget::Budget;

        let b = budget(0.5, 0);
        (0..4).for_each(|_| Budget::deposit(&b));
        assert!(Budget::withdraw(&b));
        assert!(Budget::withdraw(&b));
        assert!(!Budget::withdraw(&b), "50% of 4 requests is 2 retries");
        let counters = b.counters();
        assert_eq!(
            (
                counters.requests,
                counters.retries,
                counters.refused_by_budget
            ),
            (4, 2, 1)
        );
    }

    // A refused withdrawal claims nothing: a reading that lags it is still
    // judged in its own window, not at the refused one's bucket.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_refused_withdrawal_claims_no_bucket() {
        let b = budget(1.0, 0);
        let t0 = Instant::now();
        b.deposit_at(t0);
        let late = t0 + Duration::from_secs(10); // same slot, next lap
        assert!(!b.withdraw_at(late), "the request has left late's window");
        assert!(b.withdraw_at(t0), "t0's window holds the request");
        assert_eq!(b.counters().refused_by_budget, 1);
        assert_eq!(b.counters().retries, 1);
    }

    // Regression: epochs were kept modulo 2^24 and compared as "after" when
    // less than 2^23 ahead, so a bucket idle for 2^23 to 2^24 bucket
    // lengths looked newer than the clock and was never recycled.
    #[test]
    fn layout_fits_every_index_and_a_count_per_nanosecond() {
        let windows = [
            Duration::from_millis(1),
            // Buckets of 2^17 ns: the last index, (2^63 - 1) >> 17, is one
            // below a power of two, so the count gets the bit the epoch
            // does not need (an end at 2^63 would take it away).
            Duration::from_nanos(10 << 17),
            Duration::from_millis(7),
            Duration::from_secs(1),
            DEFAULT_WINDOW,
            Duration::from_secs(86_400 * 365),
            Duration::MAX,
        ];
        for window in windows {
            let b = RetryBudget::new().window(window);
            let layout = b.layout;
            let last = MAX_NANOS / b.bucket_nanos;
            assert_eq!(layout.epoch(layout.word(last, 0)), last, "{window:?}");
            let capacity = layout.count(u64::MAX);
            assert!(
                capacity >= b.bucket_nanos.min(1 << 62),
                "{window:?}: {capacity} counts in {} ns",
                b.bucket_nanos
            );
            // A full count does not spill into the epoch.
            let w = layout.word(last, capacity);
            assert_eq!((layout.epoch(w), layout.count(w)), (last, capacity));
        }
        // The shortest window needs the most epoch bits, 24 were too few.
        let short = RetryBudget::new().window(Duration::from_millis(1)).layout;
        assert!(u64::BITS - short.count_bits > 24);
    }

    /// The stripes exist so that threads do not contend: different threads
    /// land on different stripes, and each keeps its own.
    #[test]
    fn threads_spread_over_the_stripes_and_keep_theirs() {
        let stripes: Vec<usize> = (0..STRIPES)
            .map(|_| {
                std::thread::spawn(|| {
                    let first = stripe_index();
                    assert_eq!(stripe_index(), first, "a thread keeps its stripe");
                    first
                })
                .join()
                .unwrap()
            })
            .collect();
        assert!(stripes.iter().all(|&s| s < STRIPES), "{stripes:?}");
        let mut distinct = stripes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(
            distinct.len() > 1,
            "every thread on one stripe: {stripes:?}"
        );
    }

    /// Far more threads than stripes: they wrap around the stripes, and
    /// every deposit counts, in the totals and in the window.
    #[test]
    fn deposits_from_more_threads_than_stripes_are_all_counted() {
        const THREADS: usize = 12 * STRIPES;
        let b = budget(1.0, 0);
        let now = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| (0..10).for_each(|_| b.deposit_at(now)));
            }
        });
        assert_eq!(b.counters().requests, THREADS as u64 * 10);
        assert_eq!(allowed(&b, now), THREADS as u64 * 10);
    }

    #[test]
    fn stale_bucket_is_recycled_after_any_gap() {
        let layout = Layout::for_bucket(1_000_000_000);
        for gap in [
            10,
            1 << 23,
            (1 << 23) + 10,
            (1 << 24) - 10,
            1 << 24,
            5 << 24,
        ] {
            let cell = AtomicU64::new(layout.word(3, 7));
            bump(&cell, 3 + gap, layout);
            let w = cell.load(Relaxed);
            assert_eq!(
                (layout.epoch(w), layout.count(w)),
                (3 + gap, 1),
                "gap {gap}"
            );
        }
    }

    #[test]
    fn take_back_only_touches_its_own_bucket() {
        let layout = Layout::for_bucket(1_000_000_000);
        let cell = AtomicU64::new(layout.word(12, 2));
        take_back(&cell, 12, layout);
        assert_eq!(cell.load(Relaxed), layout.word(12, 1));
        // A bucket recycled since keeps its count.
        take_back(&cell, 2, layout);
        assert_eq!(cell.load(Relaxed), layout.word(12, 1));
        take_back(&cell, 12, layout);
        take_back(&cell, 12, layout);
        assert_eq!(cell.load(Relaxed), layout.word(12, 0), "never below zero");
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

/// Why [`RetryBudget::set_ratio`] refused a change.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum BudgetChangeError {
    /// The budget is [`unlimited`](RetryBudget::unlimited): it counts no
    /// window to apply a ratio to. Build a limited one.
    Unlimited,
    /// A negative, NaN or infinite ratio.
    InvalidRatio {
        /// The value given.
        value: f64,
    },
}

impl fmt::Display for BudgetChangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unlimited => {
                f.write_str("an unlimited retry budget cannot take a ratio while it runs")
            }
            Self::InvalidRatio { value } => {
                write!(
                    f,
                    "a retry budget ratio must be finite and at least 0, got {value}"
                )
            }
        }
    }
}

impl std::error::Error for BudgetChangeError {}
