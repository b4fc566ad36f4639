//! The sliding window of requests and accepts, per criticality: a ring of
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
//! The same move also caches a *margin*: how many more requests, none of
//! them accepted, the newest bucket may take before the least critical
//! rule could reject anything. A call whose stripe's requests in the
//! newest bucket are within it is admitted after one compare, without the
//! sums (the healthy case: the accepts of the past buckets leave a margin
//! of about half their requests with K = 2).
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

/// One bucket of one stripe: requests and accepts of each criticality
/// (by `Criticality::index`), one cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Bucket {
    requests: [Word; 4],
    accepts: [Word; 4],
}

/// Cache-line padding for the words that every call touches.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

#[derive(Debug)]
pub(super) struct Window {
    /// `STRIPES` rings of `BUCKETS` buckets, one after the other.
    buckets: Box<[Bucket]>,
    /// The newest epoch and its margin: the words every call reads.
    head: Padded<Head>,
    /// The sums of the buckets before `head` within the window.
    past: Padded<Past>,
    /// The least critical K, for the margin.
    k0: f64,
    /// The least number of requests before any rejection, for the margin.
    min_requests: u64,
}

#[derive(Debug, Default)]
struct Head {
    /// The newest epoch a call has moved the window to.
    epoch: AtomicU64,
    /// The margin of that epoch: `epoch (low 32 bits) << 32 | margin (an
    /// i32)`. The requests (of any criticality, on one stripe) that the
    /// newest bucket may hold with the rule of `k0` still at zero, whatever
    /// it accepts; negative when the past alone asks for the rule.
    margin: AtomicU64,
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
    /// Whether the margin says no criticality can be rejected: the rule
    /// need not be computed.
    pub(super) quiet: bool,
}

/// The cached sums of requests and accepts of the buckets before the
/// newest, per criticality.
#[derive(Debug, Default)]
struct Past {
    requests: [AtomicU64; 4],
    accepts: [AtomicU64; 4],
}

/// Window counts, per criticality (by `Criticality::index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Sums {
    pub(super) requests: [u64; 4],
    pub(super) accepts: [u64; 4],
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
    /// An empty window for a throttle whose least critical K is `k0`
    /// and that rejects nothing below `min_requests` requests.
    pub(super) fn new(k0: f64, min_requests: u64) -> Self {
        let window = Self {
            buckets: (0..STRIPES * BUCKETS).map(|_| Bucket::default()).collect(),
            head: Padded::default(),
            past: Padded::default(),
            k0,
            min_requests,
        };
        window.set_margin(0, &Sums::default());
        window
    }

    /// Caches the margin of `epoch`, whose past buckets sum to `past`.
    fn set_margin(&self, epoch: u64, past: &Sums) {
        let requests: u64 = past.requests.iter().sum();
        let accepts: u64 = past.accepts.iter().sum();
        let under_min = self.min_requests as i128 - 1 - i128::from(requests);
        // floor(k0 * accepts) - requests: a request count within it keeps
        // `requests - k0 * accepts` at or below zero.
        let under_k = (self.k0 * accepts as f64).floor() as i128 - i128::from(requests);
        let margin = under_min.max(under_k).clamp(-1, i128::from(i32::MAX)) as i32;
        self.head.0.margin.store(
            (epoch & COUNT_MASK) << 32 | u64::from(margin as u32),
            Relaxed,
        );
    }

    /// The bucket of `epoch` in the ring of `stripe` (taken modulo
    /// `STRIPES`).
    fn bucket(&self, stripe: usize, epoch: u64) -> &Bucket {
        let i = (stripe % STRIPES) * BUCKETS + (epoch % BUCKETS as u64) as usize;
        &self.buckets[i]
    }

    /// Counts a request of criticality `c` at `epoch` (the caller's clock
    /// reading, in buckets) on `stripe`: at the newest epoch seen, if that
    /// is later. Says whether the margin admits it without the rule (see
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
        let margin = self.head.0.margin.load(Relaxed);
        let quiet = margin >> 32 == epoch & COUNT_MASK && {
            let mut live = before;
            for (i, word) in bucket.requests.iter().enumerate() {
                if i != c {
                    live += word.count(epoch);
                }
            }
            live as i64 <= i64::from(margin as u32 as i32)
        };
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
        let mut sums = Sums::default();
        for i in 0..4 {
            let live = if i == c {
                counted.before
            } else {
                bucket.requests[i].count(epoch)
            };
            sums.requests[i] = past.requests[i].load(Relaxed) + live;
            sums.accepts[i] = past.accepts[i].load(Relaxed) + bucket.accepts[i].count(epoch);
        }
        sums
    }

    /// Counts an accept of a request of criticality `c` counted at
    /// `epoch`, on `stripe` (any stripe: the one of the thread that
    /// completes the call).
    #[inline]
    pub(super) fn accept(&self, epoch: u64, c: usize, stripe: usize) {
        if self.is_gone(epoch) {
            return;
        }
        if self.bucket(stripe, epoch).accepts[c].add(epoch).is_some() && self.is_past(epoch) {
            self.past.0.accepts[c].fetch_add(1, Relaxed);
        }
    }

    /// Takes back a request of criticality `c` counted at `epoch` on
    /// `stripe` (the one it was counted on): it turned out not to reach
    /// the dependency.
    pub(super) fn forget(&self, epoch: u64, c: usize, stripe: usize) {
        if self.is_gone(epoch) {
            return;
        }
        if self.bucket(stripe, epoch).requests[c].sub(epoch) && self.is_past(epoch) {
            let _ = self.past.0.requests[c]
                .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        }
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
                    let sums = self.scan(epoch, false);
                    let past = &self.past.0;
                    for i in 0..4 {
                        past.requests[i].store(sums.requests[i], Relaxed);
                        past.accepts[i].store(sums.accepts[i], Relaxed);
                    }
                    // Until this store, calls of the new epoch find the
                    // old epoch's margin and compute the rule.
                    self.set_margin(epoch, &sums);
                    return (epoch, true);
                }
                Err(now) => head = now,
            }
        }
    }

    /// The sums of the buckets of the window that ends at `epoch`, the
    /// newest bucket included or not.
    fn scan(&self, epoch: u64, newest: bool) -> Sums {
        let first = epoch.saturating_sub(BUCKETS as u64 - 1);
        let last = if newest {
            epoch
        } else {
            epoch.saturating_sub(1)
        };
        let mut sums = Sums::default();
        if !newest && epoch == 0 {
            return sums;
        }
        for stripe in 0..STRIPES {
            for e in first..=last {
                let bucket = self.bucket(stripe, e);
                for i in 0..4 {
                    sums.requests[i] += bucket.requests[i].count(e);
                    sums.accepts[i] += bucket.accepts[i].count(e);
                }
            }
        }
        sums
    }

    /// The exact sums of the window that ends at `epoch` (or at the newest
    /// epoch seen, if later), read bucket by bucket.
    pub(super) fn sums(&self, epoch: u64) -> Sums {
        self.scan(epoch.max(self.head.0.epoch.load(Relaxed)), true)
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
        let w = Window::new(1.5, 10);
        for _ in 0..3 {
            req(&w, 1, 2, 0);
        }
        w.accept(1, 2, 0);
        let (_, before, _) = req(&w, 2, 2, 0);
        assert_eq!(before, sums(3, 1));
        assert_eq!(w.sums(2), sums(4, 1));
        // Epoch 1 leaves the window when epoch 1 + BUCKETS begins.
        let last = BUCKETS as u64;
        assert_eq!(req(&w, last, 2, 0).1, sums(4, 1));
        assert_eq!(req(&w, last + 1, 2, 0).1, sums(2, 0));
        assert_eq!(w.sums(last + 1), sums(3, 0));
        // A stale add is dropped.
        w.accept(1, 2, 0);
        assert_eq!(w.sums(last + 1), sums(3, 0));
        assert_eq!(req(&w, 10 * last, 2, 0).1, Sums::default());
    }

    #[test]
    fn criticalities_are_counted_apart() {
        let w = Window::new(1.5, 10);
        req(&w, 1, 0, 0);
        req(&w, 1, 3, 0);
        w.accept(1, 3, 0);
        let (_, before, _) = req(&w, 1, 0, 0);
        assert_eq!(before.requests, [1, 0, 0, 1]);
        assert_eq!(before.accepts, [0, 0, 0, 1]);
    }

    #[test]
    fn late_accepts_and_forgotten_requests_reach_the_cache() {
        let w = Window::new(1.5, 10);
        let (e, _, _) = req(&w, 5, 2, 0);
        req(&w, 6, 2, 0); // moves on: epoch 5 is in the cache
        w.accept(e, 2, 0);
        w.forget(e, 2, 0);
        assert_eq!(req(&w, 6, 2, 0).1, sums(1, 1));
        assert_eq!(w.sums(6), sums(2, 1));
    }

    #[test]
    fn stripes_count_apart_and_meet_when_the_bucket_is_past() {
        let w = Window::new(1.5, 10);
        req(&w, 1, 2, 0);
        w.accept(1, 2, 1);
        // Stripe 1 sees its own live counts, not stripe 0's.
        assert_eq!(req(&w, 1, 2, 1).1, sums(0, 1));
        assert_eq!(w.sums(1), sums(2, 1));
        // Once the bucket is past, every stripe sees all of it.
        assert_eq!(req(&w, 2, 2, 3).1, sums(2, 1));
    }

    #[test]
    fn stamps_wrap_after_2_pow_32_buckets() {
        let w = Window::new(1.5, 10);
        let before_wrap = u64::from(u32::MAX) - 1;
        req(&w, before_wrap, 2, 0);
        // The next use of that bucket's slot is after the wrap.
        let after = before_wrap + BUCKETS as u64;
        assert_eq!(req(&w, after, 2, 0).1, Sums::default());
        assert_eq!(req(&w, after, 2, 0).1, sums(1, 0));
        assert_eq!(w.sums(after), sums(2, 0));
    }

    #[test]
    fn the_margin_admits_while_the_rule_is_surely_zero() {
        // K0 = 1.5, at least 10 requests.
        let w = Window::new(1.5, 10);
        // Below the least number of requests: 9 before this one.
        for n in 0..10 {
            assert!(w.request(1, 2, 0).quiet, "request {n}");
        }
        assert!(!w.request(1, 2, 0).quiet, "10 before it: the rule decides");
        // 20 requests, 20 accepts in a past bucket: floor(1.5 * 20) - 20
        // = 10 more requests (of any criticality) before the rule could
        // reject.
        let w = Window::new(1.5, 10);
        for _ in 0..20 {
            let counted = w.request(1, 2, 0);
            w.accept(counted.epoch, 2, 0);
        }
        for n in 0..11 {
            let c = if n % 2 == 0 { 0 } else { 3 };
            assert!(w.request(2, c, 0).quiet, "request {n} of the new bucket");
        }
        assert!(!w.request(2, 2, 0).quiet);
        // Another stripe has its own newest bucket.
        assert!(w.request(2, 2, 1).quiet);
        // A past that failed: no margin at all.
        let w = Window::new(1.5, 10);
        for _ in 0..20 {
            w.request(1, 2, 0);
        }
        assert!(!w.request(2, 2, 0).quiet);
    }

    #[test]
    fn an_old_clock_reading_counts_at_the_newest_epoch() {
        let w = Window::new(1.5, 10);
        req(&w, 9, 2, 0);
        assert_eq!(req(&w, 3, 2, 0).0, 9);
        assert!(!req(&w, 9, 2, 0).2);
        assert!(req(&w, 10, 2, 0).2);
    }
}
