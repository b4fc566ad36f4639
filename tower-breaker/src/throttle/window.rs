//! The sliding window of requests and refusals, per criticality: a ring of
//! time buckets,
//! each count an atomic word that carries the bucket's epoch beside the
//! count, so a bucket is reused by the first add of a new epoch without a
//! lock, a clearing pass or a timer.
//!
//! A word is `epoch (high 32 bits) | count (low 32 bits)`. Adding to epoch
//! `e` either increments a word already stamped `e`, or replaces an older
//! word with `e | 1` by compare-and-swap: an add is never lost to a
//! clearing, and a count never leaks into a later epoch. A sum reads only
//! the words stamped with the epochs the window covers.
//!
//! Threads do not share the words they write: each thread stripe has its
//! own ring, as the breaker's counters have their stripes, so that two
//! threads calling through one throttle never bounce a cache line between
//! them on the happy path.
//!
//! The hot path needs the window's totals, not a scan of every bucket: the
//! sums of the buckets before the newest one, over every stripe, are
//! cached when the newest epoch moves on (by the one call that moves it),
//! and a call adds its own stripe's counts of the newest bucket to them.
//!
//! A request counts as accepted from the moment it is made until it is
//! refused (it failed, was cut or dropped): the window counts requests
//! and *refusals*, and accepts are their difference. So a healthy call
//! writes one word, when it starts, and nothing when it ends; and calls in
//! flight, not refused yet, never make the rule reject (counted as not
//! accepted until they end, a second's worth of slow calls at a
//! throttle's start would).
//!
//! The move to a new bucket also sets a *budget*: how many refusals (or
//! requests taken back) the newest bucket may take before the least
//! critical rule could reject anything, given the past buckets (requests
//! only lower `requests − K·accepts` when K ≥ 1). Each refusal spends one;
//! while some is left, a call is admitted after one load, without the
//! sums (the healthy case: with K = 2, a past of R requests and no refusal
//! leaves R/3 for `Sheddable`'s K of 1.5).
//! So within the newest bucket (a sixtieth of the window) a thread sees
//! the other threads' calls only once the bucket is past; with one thread,
//! the sums are exact. A count that arrives for a bucket that is no longer
//! the newest (a call that spans a bucket's end) is added to the cache
//! too. The cache is recomputed from the buckets at each move, so whatever
//! a race put in it or left out of it lasts one bucket at most;
//! [`Window::sums`] (the snapshot's) always scans every stripe.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::config::{BUCKETS, STRIPES};

const COUNT_MASK: u64 = u32::MAX as u64;

/// One atomic count of one bucket, stamped with its epoch.
#[derive(Debug, Default)]
struct Word(AtomicU64);

/// One bucket of one stripe: requests and refusals of each criticality
/// (by `Criticality::index`), one cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Bucket {
    requests: [Word; 4],
    refusals: [Word; 4],
}

/// Cache-line padding for the words that every call touches.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

#[derive(Debug)]
pub(super) struct Window {
    /// `STRIPES` rings of `BUCKETS` buckets, one after the other.
    buckets: Box<[Bucket]>,
    /// The newest epoch and its budget: the words every call reads.
    head: Padded<Head>,
    /// The sums of the buckets before `head` within the window.
    past: Padded<Past>,
    /// The least critical K, for the budget.
    /// The least critical K, as `f64` bits (changed by
    /// `ThrottleHandle::reconfigure`).
    k0: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Head {
    /// The newest epoch a call has moved the window to.
    epoch: AtomicU64,
    /// The budget of that epoch: `epoch (low 32 bits) << 32 | budget (an
    /// i32)`. The refusals (or requests taken back) the window may take
    /// from the start of the newest bucket with the rule of `k0` still at
    /// zero; negative once spent, or when the past alone asks for the
    /// rule.
    budget: AtomicU64,
}

/// What [`Window::request`] did.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counted {
    /// The epoch the request was counted at.
    pub(super) epoch: u64,
    /// This stripe's requests of the request's criticality in the newest
    /// bucket before it.
    pub(super) before: u64,
    /// Whether this call moved the window on.
    pub(super) moved: bool,
    /// Whether the budget says no criticality can be rejected: the rule
    /// need not be computed.
    pub(super) quiet: bool,
}

/// The cached sums of requests and refusals of the buckets before the
/// newest, per criticality.
#[derive(Debug, Default)]
struct Past {
    requests: [AtomicU64; 4],
    refusals: [AtomicU64; 4],
}

/// Window counts, per criticality (by `Criticality::index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Sums {
    pub(super) requests: [u64; 4],
    /// Requests not refused (yet): accepted, or in flight.
    pub(super) accepts: [u64; 4],
}

impl Sums {
    fn from_counts(requests: [u64; 4], refusals: [u64; 4]) -> Self {
        Self {
            requests,
            accepts: std::array::from_fn(|i| requests[i].saturating_sub(refusals[i])),
        }
    }
}

// === impl Word ===

impl Word {
    /// The stamp of `epoch`: its low 32 bits, in the word's high half (it
    /// wraps after 2^32 buckets, 49 days of 1 ms buckets: stamps are
    /// compared as wrapping numbers).
    fn stamp(epoch: u64) -> u64 {
        (epoch & COUNT_MASK) << 32
    }

    /// The count for `epoch`, zero if the word holds another epoch.
    fn count(&self, epoch: u64) -> u64 {
        let w = self.0.load(Relaxed);
        if w & !COUNT_MASK == Self::stamp(epoch) {
            w & COUNT_MASK
        } else {
            0
        }
    }

    /// Adds one for `epoch`; returns the count before, or `None` when the
    /// word already holds a later epoch (the bucket has been reused: the
    /// add is dropped).
    #[inline]
    fn add(&self, epoch: u64) -> Option<u64> {
        let stamp = Self::stamp(epoch);
        let mut w = self.0.load(Relaxed);
        loop {
            let held = w & !COUNT_MASK;
            if held == stamp {
                if w & COUNT_MASK == COUNT_MASK {
                    // Full: 4 billion in one bucket; never carry into the
                    // stamp.
                    return Some(COUNT_MASK);
                }
                return Some(self.0.fetch_add(1, Relaxed) & COUNT_MASK);
            }
            // Later than `epoch`, as wrapping 32-bit numbers.
            if ((held >> 32) as u32).wrapping_sub(epoch as u32) as i32 > 0 {
                return None;
            }
            match self.0.compare_exchange_weak(w, stamp | 1, Relaxed, Relaxed) {
                Ok(_) => return Some(0),
                Err(now) => w = now,
            }
        }
    }

    /// Takes one back from `epoch`'s count; false when the word holds
    /// another epoch or a zero count.
    fn sub(&self, epoch: u64) -> bool {
        let stamp = Self::stamp(epoch);
        let mut w = self.0.load(Relaxed);
        loop {
            if w & !COUNT_MASK != stamp || w & COUNT_MASK == 0 {
                return false;
            }
            match self.0.compare_exchange_weak(w, w - 1, Relaxed, Relaxed) {
                Ok(_) => return true,
                Err(now) => w = now,
            }
        }
    }
}

// === impl Window ===

impl Window {
    /// An empty window for a throttle whose least critical K is `k0`.
    pub(super) fn new(k0: f64) -> Self {
        let window = Self {
            buckets: (0..STRIPES * BUCKETS).map(|_| Bucket::default()).collect(),
            head: Padded::default(),
            past: Padded::default(),
            k0: std::sync::atomic::AtomicU64::new(k0.to_bits()),
        };
        window.set_budget(0, 0, 0);
        window
    }

    /// Sets the budget of `epoch`, whose past buckets hold `requests`
    /// requests and `refusals` refusals.
    ///
    /// With R requests and F refusals in all, `requests − k0·accepts` is at
    /// most `k0·F − (k0 − 1)·R` (accepts are at least R − F), which more
    /// requests only lower: the rule stays at zero while the refusals
    /// since the past was summed are at most
    /// `((k0 − 1)·R_past − k0·F_past) / k0`.
    fn set_budget(&self, epoch: u64, requests: u64, refusals: u64) {
        let k0 = f64::from_bits(self.k0.load(Relaxed));
        let room = ((k0 - 1.0) * requests as f64 - k0 * refusals as f64) / k0;
        let budget = room.floor().clamp(-1.0, f64::from(i32::MAX)) as i32;
        self.head.0.budget.store(
            (epoch & COUNT_MASK) << 32 | u64::from(budget as u32),
            Relaxed,
        );
    }

    /// A new least critical K. The newest bucket's budget was set with the
    /// old one: it is spent, so that every request judges by the rule
    /// until the next bucket sets a budget with the new K.
    pub(super) fn set_k0(&self, k0: f64) {
        self.k0.store(k0.to_bits(), Relaxed);
        let head = &self.head.0;
        let epoch = head.epoch.load(Relaxed);
        head.budget.store(
            (epoch & COUNT_MASK) << 32 | u64::from((-1i32) as u32),
            Relaxed,
        );
    }

    /// Spends one of the newest bucket's budget: a refusal, or a request
    /// taken back.
    fn spend(&self) {
        let head = &self.head.0;
        let mut w = head.budget.load(Relaxed);
        loop {
            if w >> 32 != head.epoch.load(Relaxed) & COUNT_MASK || (w as u32 as i32) < 0 {
                // Another epoch's (the move to a new one is setting it), or
                // spent already.
                return;
            }
            let next = (w & !COUNT_MASK) | u64::from((w as u32 as i32 - 1) as u32);
            match head.budget.compare_exchange_weak(w, next, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(now) => w = now,
            }
        }
    }

    /// The bucket of `epoch` in the ring of `stripe` (taken modulo
    /// `STRIPES`).
    fn bucket(&self, stripe: usize, epoch: u64) -> &Bucket {
        let i = (stripe % STRIPES) * BUCKETS + (epoch % BUCKETS as u64) as usize;
        &self.buckets[i]
    }

    /// Counts a request of criticality `c` at `epoch` (the caller's clock
    /// reading, in buckets) on `stripe`: at the newest epoch seen, if that
    /// is later. Says whether the budget admits it without the rule (see
    /// the module docs).
    #[inline]
    pub(super) fn request(&self, epoch: u64, c: usize, stripe: usize) -> Counted {
        let head = self.head.0.epoch.load(Relaxed);
        let (epoch, moved) = if epoch > head {
            self.advance(head, epoch)
        } else {
            (head, false)
        };
        let bucket = self.bucket(stripe, epoch);
        let before = bucket.requests[c].add(epoch).unwrap_or(0);
        let budget = self.head.0.budget.load(Relaxed);
        let quiet = budget >> 32 == epoch & COUNT_MASK && budget as u32 as i32 >= 0;
        Counted {
            epoch,
            before,
            moved,
            quiet,
        }
    }

    /// The window's sums as `stripe` saw them before the request that
    /// [`request`](Self::request) counted as `counted`: the cached past
    /// and this stripe's newest bucket.
    pub(super) fn seen(&self, counted: Counted, c: usize, stripe: usize) -> Sums {
        let epoch = counted.epoch;
        let bucket = self.bucket(stripe, epoch);
        let past = &self.past.0;
        let mut requests = [0; 4];
        let mut refusals = [0; 4];
        for i in 0..4 {
            let live = if i == c {
                counted.before
            } else {
                bucket.requests[i].count(epoch)
            };
            requests[i] = past.requests[i].load(Relaxed) + live;
            refusals[i] = past.refusals[i].load(Relaxed) + bucket.refusals[i].count(epoch);
        }
        Sums::from_counts(requests, refusals)
    }

    /// Counts the refusal of a request of criticality `c` counted at
    /// `epoch` on `stripe` (the one it was counted on): it failed, or its
    /// caller gave up on it.
    #[cold]
    pub(super) fn refuse(&self, epoch: u64, c: usize, stripe: usize) {
        if self.is_gone(epoch) {
            return;
        }
        if self.bucket(stripe, epoch).refusals[c].add(epoch).is_some() && self.is_past(epoch) {
            self.past.0.refusals[c].fetch_add(1, Relaxed);
        }
        self.spend();
    }

    /// Takes back a request of criticality `c` counted at `epoch` on
    /// `stripe` (the one it was counted on): it turned out not to reach
    /// the dependency. (One request and one accept fewer: that raises
    /// `requests − K·accepts` by K − 1, so it spends the budget as a
    /// refusal does.)
    pub(super) fn forget(&self, epoch: u64, c: usize, stripe: usize) {
        if self.is_gone(epoch) {
            return;
        }
        if self.bucket(stripe, epoch).requests[c].sub(epoch) && self.is_past(epoch) {
            let _ = self.past.0.requests[c]
                .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        }
        self.spend();
    }

    /// Whether `epoch` has left the window.
    fn is_gone(&self, epoch: u64) -> bool {
        self.head.0.epoch.load(Relaxed).saturating_sub(epoch) >= BUCKETS as u64
    }

    /// Whether `epoch` is an older bucket still in the window, whose counts
    /// the cache holds.
    fn is_past(&self, epoch: u64) -> bool {
        let head = self.head.0.epoch.load(Relaxed);
        epoch < head && head - epoch < BUCKETS as u64
    }

    /// Moves the newest epoch from `head` to `epoch`; the call that moves
    /// it recomputes the cache. Returns the newest epoch after the move, and whether this call moved
    /// it.
    #[cold]
    fn advance(&self, mut head: u64, epoch: u64) -> (u64, bool) {
        loop {
            if epoch <= head {
                // Another call moved it this far or further.
                return (head, false);
            }
            match self
                .head
                .0
                .epoch
                .compare_exchange_weak(head, epoch, Relaxed, Relaxed)
            {
                Ok(_) => {
                    let (requests, refusals) = self.scan(epoch, false);
                    let past = &self.past.0;
                    for i in 0..4 {
                        past.requests[i].store(requests[i], Relaxed);
                        past.refusals[i].store(refusals[i], Relaxed);
                    }
                    // Until this store, calls of the new epoch find the
                    // old epoch's budget and compute the rule.
                    self.set_budget(epoch, requests.iter().sum(), refusals.iter().sum());
                    return (epoch, true);
                }
                Err(now) => head = now,
            }
        }
    }

    /// The requests and refusals of the buckets of the window that ends
    /// at `epoch`, the newest bucket included or not.
    fn scan(&self, epoch: u64, newest: bool) -> ([u64; 4], [u64; 4]) {
        let first = epoch.saturating_sub(BUCKETS as u64 - 1);
        let last = if newest {
            epoch
        } else {
            epoch.saturating_sub(1)
        };
        let mut requests = [0; 4];
        let mut refusals = [0; 4];
        if !newest && epoch == 0 {
            return (requests, refusals);
        }
        for stripe in 0..STRIPES {
            for e in first..=last {
                let bucket = self.bucket(stripe, e);
                for i in 0..4 {
                    requests[i] += bucket.requests[i].count(e);
                    refusals[i] += bucket.refusals[i].count(e);
                }
            }
        }
        (requests, refusals)
    }

    /// The exact sums of the window that ends at `epoch` (or at the newest
    /// epoch seen, if later), read bucket by bucket.
    pub(super) fn sums(&self, epoch: u64) -> Sums {
        let (requests, refusals) = self.scan(epoch.max(self.head.0.epoch.load(Relaxed)), true);
        Sums::from_counts(requests, refusals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request, with the sums its stripe saw before it.
    fn req(w: &Window, epoch: u64, c: usize, stripe: usize) -> (u64, Sums, bool) {
        let counted = w.request(epoch, c, stripe);
        (counted.epoch, w.seen(counted, c, stripe), counted.moved)
    }

    fn sums(requests: u64, accepts: u64) -> Sums {
        Sums {
            requests: [0, 0, requests, 0],
            accepts: [0, 0, accepts, 0],
        }
    }

    #[test]
    fn counts_slide_out_bucket_by_bucket() {
        let w = Window::new(1.5);
        for _ in 0..3 {
            req(&w, 1, 2, 0);
        }
        w.refuse(1, 2, 0);
        w.refuse(1, 2, 0);
        let (_, before, _) = req(&w, 2, 2, 0);
        assert_eq!(before, sums(3, 1));
        assert_eq!(w.sums(2), sums(4, 2));
        // Epoch 1 leaves the window when epoch 1 + BUCKETS begins.
        let last = BUCKETS as u64;
        assert_eq!(req(&w, last, 2, 0).1, sums(4, 2));
        assert_eq!(req(&w, last + 1, 2, 0).1, sums(2, 2));
        assert_eq!(w.sums(last + 1), sums(3, 3));
        // A stale refusal is dropped.
        w.refuse(1, 2, 0);
        assert_eq!(w.sums(last + 1), sums(3, 3));
        assert_eq!(req(&w, 10 * last, 2, 0).1, Sums::default());
    }

    #[test]
    fn criticalities_are_counted_apart() {
        let w = Window::new(1.5);
        req(&w, 1, 0, 0);
        req(&w, 1, 3, 0);
        w.refuse(1, 0, 0);
        let (_, before, _) = req(&w, 1, 0, 0);
        assert_eq!(before.requests, [1, 0, 0, 1]);
        assert_eq!(before.accepts, [0, 0, 0, 1]);
    }

    #[test]
    fn late_refusals_and_forgotten_requests_reach_the_cache() {
        let w = Window::new(1.5);
        let (e, _, _) = req(&w, 5, 2, 0);
        req(&w, 5, 2, 0);
        req(&w, 6, 2, 0); // moves on: epoch 5 is in the cache
        w.refuse(e, 2, 0);
        w.forget(e, 2, 0);
        // Epoch 5: one request left, refused.
        assert_eq!(req(&w, 6, 2, 0).1, sums(2, 1));
        assert_eq!(w.sums(6), sums(3, 2));
    }

    #[test]
    fn stripes_count_apart_and_meet_when_the_bucket_is_past() {
        let w = Window::new(1.5);
        req(&w, 1, 2, 0);
        w.refuse(1, 2, 0);
        req(&w, 1, 2, 1);
        // Stripe 1 sees its own live counts, not stripe 0's.
        assert_eq!(req(&w, 1, 2, 1).1, sums(1, 1));
        assert_eq!(w.sums(1), sums(3, 2));
        // Once the bucket is past, every stripe sees all of it.
        assert_eq!(req(&w, 2, 2, 3).1, sums(3, 2));
    }

    #[test]
    fn stamps_wrap_after_2_pow_32_buckets() {
        let w = Window::new(1.5);
        let before_wrap = u64::from(u32::MAX) - 1;
        req(&w, before_wrap, 2, 0);
        // The next use of that bucket's slot is after the wrap.
        let after = before_wrap + BUCKETS as u64;
        assert_eq!(req(&w, after, 2, 0).1, Sums::default());
        assert_eq!(req(&w, after, 2, 0).1, sums(1, 1));
        assert_eq!(w.sums(after), sums(2, 2));
    }

    #[test]
    fn the_budget_admits_while_the_rule_is_surely_zero() {
        // K0 = 1.5: a past of 30 requests and no refusal leaves
        // (0.5 * 30 - 0) / 1.5 = 10 refusals before the rule could reject.
        let w = Window::new(1.5);
        for _ in 0..30 {
            assert!(w.request(1, 2, 0).quiet, "no refusal yet");
        }
        // The first bucket has no past: its first refusal spends it all.
        w.refuse(1, 2, 0);
        assert!(!w.request(1, 2, 0).quiet);
        let w = Window::new(1.5);
        for _ in 0..30 {
            w.request(1, 2, 0);
        }
        assert!(w.request(2, 0, 3).quiet);
        for n in 0..10 {
            // Refusals of any criticality, on any stripe, of any bucket.
            w.refuse(2, n % 4, 3);
            assert!(w.request(2, 2, 0).quiet, "{} refusals", n + 1);
        }
        // The eleventh.
        w.refuse(1, 2, 0);
        assert!(!w.request(2, 2, 0).quiet);
        // A request taken back spends it as a refusal does.
        let w = Window::new(1.5);
        w.request(1, 2, 0);
        assert!(w.request(2, 2, 0).quiet);
        w.forget(1, 2, 0);
        assert!(!w.request(2, 2, 0).quiet);
        // A past with too many refusals: no budget at all.
        let w = Window::new(1.5);
        for _ in 0..30 {
            w.request(1, 2, 0);
            w.refuse(1, 2, 0);
        }
        assert!(!w.request(2, 2, 0).quiet);
    }

    #[test]
    fn a_word_counts_one_epoch_and_drops_adds_for_an_earlier_one() {
        let word = Word::default();
        assert_eq!(word.add(5), Some(0));
        assert_eq!(word.add(5), Some(1));
        // An earlier epoch's add (a call that spans a bucket's end) is
        // dropped: the bucket already holds a later lap.
        assert_eq!(word.add(4), None);
        assert_eq!((word.count(5), word.count(4)), (2, 0));
        // A later epoch's add starts the word over.
        assert_eq!(word.add(6), Some(0));
        assert_eq!((word.count(6), word.count(5)), (1, 0));
    }

    #[test]
    fn a_word_takes_back_only_its_own_epoch_and_never_below_zero() {
        let word = Word::default();
        word.add(5);
        word.add(5);
        assert!(!word.sub(4), "another epoch's count is not touched");
        assert_eq!(word.count(5), 2);
        assert!(word.sub(5));
        assert!(word.sub(5));
        assert!(!word.sub(5), "nothing left to take back");
        assert_eq!(word.count(5), 0);
        // The stamp is intact: the epoch counts on from zero.
        assert_eq!(word.add(5), Some(0));
    }

    #[test]
    fn every_stripe_and_epoch_of_a_lap_has_a_bucket_of_its_own() {
        let w = Window::new(1.5);
        let mut seen = std::collections::HashSet::new();
        for stripe in 0..STRIPES {
            for epoch in 0..BUCKETS as u64 {
                let bucket: *const Bucket = w.bucket(stripe, epoch);
                assert!(seen.insert(bucket), "stripe {stripe}, epoch {epoch}");
            }
        }
        // The next lap reuses the ring; a stripe past the last wraps.
        assert!(std::ptr::eq(
            w.bucket(1, 3),
            w.bucket(1, 3 + BUCKETS as u64)
        ));
        assert!(std::ptr::eq(w.bucket(2, 3), w.bucket(2 + STRIPES, 3)));
    }

    #[test]
    fn a_late_refusal_reaches_the_cache_from_anywhere_in_the_window() {
        // The oldest bucket still in the window.
        let w = Window::new(1.5);
        req(&w, 1, 2, 0);
        let last = BUCKETS as u64;
        req(&w, last, 2, 0);
        w.refuse(1, 2, 0);
        assert_eq!(req(&w, last, 2, 0).1, sums(2, 1));
        // The bucket just before the newest, far from the start.
        let w = Window::new(1.5);
        req(&w, 1000, 2, 0);
        req(&w, 1001, 2, 0);
        w.refuse(1000, 2, 0);
        assert_eq!(req(&w, 1001, 2, 0).1, sums(2, 1));
    }

    #[test]
    fn a_request_taken_back_in_the_newest_bucket_leaves_the_past_alone() {
        let w = Window::new(1.5);
        req(&w, 1, 2, 0);
        req(&w, 1, 2, 0);
        req(&w, 2, 2, 0); // moves on: the past holds epoch 1's two
        w.forget(2, 2, 0);
        assert_eq!(req(&w, 2, 2, 0).1, sums(2, 2));
        assert_eq!(w.sums(2), sums(3, 3));
    }

    #[test]
    fn a_refusal_for_a_bucket_that_left_the_window_spends_no_budget() {
        let w = Window::new(1.5);
        req(&w, 1, 2, 0);
        let late = 1 + BUCKETS as u64;
        for _ in 0..30 {
            w.request(late, 2, 0);
        }
        // K0 = 1.5 and a past of 30 requests: a budget of 10 refusals.
        assert!(w.request(late + 1, 2, 0).quiet);
        w.refuse(1, 2, 0); // epoch 1 is gone
        for n in 0..10 {
            w.refuse(late + 1, 2, 0);
            assert!(w.request(late + 1, 2, 0).quiet, "{} refusals", n + 1);
        }
        w.refuse(late + 1, 2, 0);
        assert!(!w.request(late + 1, 2, 0).quiet);
    }

    #[test]
    fn a_new_k_spends_the_newest_budget_and_sets_the_next_one() {
        let w = Window::new(1.5);
        for _ in 0..30 {
            w.request(1, 2, 0);
        }
        assert!(w.request(2, 2, 0).quiet);
        w.set_k0(3.0);
        assert!(
            !w.request(2, 2, 0).quiet,
            "judged by the rule until the next bucket"
        );
        // Epoch 3's past: 32 requests, no refusal. K0 = 3 leaves
        // (2 * 32) / 3 = 21 refusals (K0 = 1.5 would leave 10).
        assert!(w.request(3, 2, 0).quiet);
        for n in 0..21 {
            w.refuse(3, 2, 0);
            assert!(w.request(3, 2, 0).quiet, "{} refusals", n + 1);
        }
        w.refuse(3, 2, 0);
        assert!(!w.request(3, 2, 0).quiet);
    }

    #[test]
    fn an_old_clock_reading_counts_at_the_newest_epoch() {
        let w = Window::new(1.5);
        req(&w, 9, 2, 0);
        assert_eq!(req(&w, 3, 2, 0).0, 9);
        assert!(!req(&w, 9, 2, 0).2);
        assert!(req(&w, 10, 2, 0).2);
    }
}
