//! The sliding window of requests and accepts: a ring of time buckets,
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
//! The hot path needs the window's totals, not a scan of every bucket: the
//! sums of the buckets before the newest one are cached when the newest
//! epoch moves on (by the one call that moves it), and a call adds the
//! newest bucket's live counts to them. A count that arrives for a bucket
//! that is no longer the newest (a call that spans a bucket's end) is
//! added to the cache too. The cache is recomputed from the buckets at
//! each move, so whatever a race put in it or left out of it lasts one
//! bucket at most; [`Window::sums`] (the snapshot's) always scans.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::config::BUCKETS;

const COUNT_MASK: u64 = u32::MAX as u64;

/// One atomic count of one bucket, stamped with its epoch.
#[derive(Debug, Default)]
struct Word(AtomicU64);

#[derive(Debug, Default)]
struct Bucket {
    requests: Word,
    accepts: Word,
}

/// Cache-line padding for the words that every call touches.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

#[derive(Debug)]
pub(super) struct Window {
    buckets: Box<[Padded<Bucket>]>,
    /// The newest epoch a call has moved the window to.
    head: Padded<AtomicU64>,
    /// The sums of requests and accepts of the buckets before `head`
    /// within the window.
    past_requests: AtomicU64,
    past_accepts: AtomicU64,
}

/// Window counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Sums {
    pub(super) requests: u64,
    pub(super) accepts: u64,
}

// === impl Word ===

impl Word {
    fn stamp(epoch: u64) -> u64 {
        epoch << 32
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
            if held > stamp {
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
    pub(super) fn new() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| Padded::default()).collect(),
            head: Padded(AtomicU64::new(0)),
            past_requests: AtomicU64::new(0),
            past_accepts: AtomicU64::new(0),
        }
    }

    fn bucket(&self, epoch: u64) -> &Bucket {
        &self.buckets[(epoch % BUCKETS as u64) as usize].0
    }

    /// Counts a request at `epoch` (the caller's clock reading, in
    /// buckets); returns the epoch it was counted at (never before the
    /// newest epoch seen), the window's sums as they stood before it, and
    /// whether this call moved the window on.
    #[inline]
    pub(super) fn request(&self, epoch: u64) -> (u64, Sums, bool) {
        let head = self.head.0.load(Relaxed);
        let (epoch, moved) = if epoch > head {
            self.advance(head, epoch)
        } else {
            (head, false)
        };
        let bucket = self.bucket(epoch);
        let before = bucket.requests.add(epoch).unwrap_or(0);
        let sums = Sums {
            requests: self.past_requests.load(Relaxed) + before,
            accepts: self.past_accepts.load(Relaxed) + bucket.accepts.count(epoch),
        };
        (epoch, sums, moved)
    }

    /// Counts an accept of a request counted at `epoch`.
    #[inline]
    pub(super) fn accept(&self, epoch: u64) {
        if self.is_gone(epoch) {
            return;
        }
        if self.bucket(epoch).accepts.add(epoch).is_some() && self.is_past(epoch) {
            self.past_accepts.fetch_add(1, Relaxed);
        }
    }

    /// Takes back a request counted at `epoch` (it turned out not to reach
    /// the dependency).
    pub(super) fn forget(&self, epoch: u64) {
        if self.is_gone(epoch) {
            return;
        }
        if self.bucket(epoch).requests.sub(epoch) && self.is_past(epoch) {
            let _ = self
                .past_requests
                .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        }
    }

    /// Whether `epoch` has left the window.
    fn is_gone(&self, epoch: u64) -> bool {
        self.head.0.load(Relaxed).saturating_sub(epoch) >= BUCKETS as u64
    }

    /// Whether `epoch` is an older bucket still in the window, whose counts
    /// the cache holds.
    fn is_past(&self, epoch: u64) -> bool {
        let head = self.head.0.load(Relaxed);
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
                .compare_exchange_weak(head, epoch, Relaxed, Relaxed)
            {
                Ok(_) => {
                    let past = self.scan(epoch, false);
                    self.past_requests.store(past.requests, Relaxed);
                    self.past_accepts.store(past.accepts, Relaxed);
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
        let last = if newest { epoch } else { epoch.saturating_sub(1) };
        let mut sums = Sums::default();
        if !newest && epoch == 0 {
            return sums;
        }
        for e in first..=last {
            let bucket = self.bucket(e);
            sums.requests += bucket.requests.count(e);
            sums.accepts += bucket.accepts.count(e);
        }
        sums
    }

    /// The exact sums of the window that ends at `epoch` (or at the newest
    /// epoch seen, if later), read bucket by bucket.
    pub(super) fn sums(&self, epoch: u64) -> Sums {
        self.scan(epoch.max(self.head.0.load(Relaxed)), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_slide_out_bucket_by_bucket() {
        let w = Window::new();
        for _ in 0..3 {
            w.request(1);
        }
        w.accept(1);
        let (_, before, _) = w.request(2);
        assert_eq!(before, Sums { requests: 3, accepts: 1 });
        assert_eq!(w.sums(2), Sums { requests: 4, accepts: 1 });
        // Epoch 1 leaves the window when epoch 1 + BUCKETS begins.
        let last = BUCKETS as u64;
        assert_eq!(w.request(last).1, Sums { requests: 4, accepts: 1 });
        assert_eq!(w.request(last + 1).1, Sums { requests: 2, accepts: 0 });
        assert_eq!(w.sums(last + 1), Sums { requests: 3, accepts: 0 });
        // A reused bucket starts from zero, and a stale add is dropped.
        w.accept(1);
        assert_eq!(w.sums(last + 1), Sums { requests: 3, accepts: 0 });
        assert_eq!(w.request(10 * last).1, Sums::default());
    }

    #[test]
    fn late_accepts_and_forgotten_requests_reach_the_cache() {
        let w = Window::new();
        let (e, _, _) = w.request(5);
        w.request(6); // moves on: epoch 5 is in the cache
        w.accept(e);
        w.forget(e);
        assert_eq!(w.request(6).1, Sums { requests: 1, accepts: 1 });
        assert_eq!(w.sums(6), Sums { requests: 2, accepts: 1 });
    }

    #[test]
    fn an_old_clock_reading_counts_at_the_newest_epoch() {
        let w = Window::new();
        w.request(9);
        assert_eq!(w.request(3).0, 9);
        assert!(!w.request(9).2);
        assert!(w.request(10).2);
    }
}
