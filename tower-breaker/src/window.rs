//! The sliding windows: the last N outcomes, or the last N time buckets.
//!
//! Both are tagged with an epoch (the generation of the closed state they
//! count for), so that closing the circuit starts a fresh window without
//! touching the slots: anything tagged with an older epoch reads as empty.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use crate::state::{is_newer, Padded, GEN_BITS, GEN_MASK};

/// A success, counted.
pub(crate) const OK: u32 = 1;
/// A failure, counted.
pub(crate) const FAIL: u32 = 2;
/// A success slower than the slow-call threshold.
pub(crate) const SLOW: u32 = 3;

/// The largest count window: 16,383 outcomes.
pub(crate) const MAX_COUNT_WINDOW: usize = (1 << FIELD_BITS) - 1;

const FIELD_BITS: u32 = 14;
const FIELD_MASK: u64 = (1 << FIELD_BITS) - 1;
const EPOCH_SHIFT: u32 = 3 * FIELD_BITS;

/// The calls, failures and slow calls a window holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Counts {
    pub(crate) calls: u64,
    pub(crate) failures: u64,
    pub(crate) slow: u64,
}

// One per breaker, inline in its state: boxing the count window would add
// an indirection to every call for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Window {
    Count(CountWindow),
    Time(TimeWindow),
}

// === impl Window ===

impl Window {
    /// Whether recording needs the time.
    pub(crate) fn needs_clock(&self) -> bool {
        matches!(self, Window::Time(_))
    }

    #[inline]
    pub(crate) fn record(&self, epoch: u32, outcome: u32, now_ns: u64) {
        match self {
            Window::Count(w) => w.record(epoch, outcome),
            Window::Time(w) => w.record(epoch, outcome, now_ns),
        }
    }

    pub(crate) fn counts(&self, epoch: u32, now_ns: u64) -> Counts {
        match self {
            Window::Count(w) => w.counts(epoch),
            Window::Time(w) => w.counts(epoch, now_ns),
        }
    }
}

/// The last `N` outcomes: a ring of slots, each holding an epoch and an
/// outcome, and the aggregate counts packed into one word with the epoch.
#[derive(Debug)]
pub(crate) struct CountWindow {
    index: Padded<AtomicU64>,
    aggregate: Padded<AtomicU64>,
    slots: Box<[AtomicU32]>,
}

// === impl CountWindow ===

impl CountWindow {
    pub(crate) fn new(size: usize) -> Self {
        let size = size.clamp(1, MAX_COUNT_WINDOW);
        Self {
            index: Padded(AtomicU64::new(0)),
            aggregate: Padded(AtomicU64::new(0)),
            slots: (0..size).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Records one outcome in the next slot.
    ///
    /// The new outcome is added to the aggregate before it replaces the
    /// slot's old one, which is subtracted after: whoever subtracts an
    /// outcome always finds it added, so no field ever goes below zero
    /// (the total may exceed the window by the number of records in
    /// flight, for an instant). A slot that already holds the same outcome
    /// of the same epoch is left alone, and a success recorded in a window
    /// full of successes writes nothing at all (the window's content, a
    /// multiset of equal outcomes, would not change): the healthy steady
    /// state costs one load.
    #[inline]
    pub(crate) fn record(&self, epoch: u32, outcome: u32) {
        let n = self.slots.len() as u64;
        if outcome == OK {
            // A window full of successes stays the same with one more: no
            // write at all, so threads do not contend in the healthy case.
            let all_ok = (u64::from(epoch & GEN_MASK) << EPOCH_SHIFT) | (n << (2 * FIELD_BITS));
            if self.aggregate.load(Relaxed) == all_ok {
                return;
            }
        }
        let i = (self.index.fetch_add(1, Relaxed) % n) as usize;
        let slot = &self.slots[i];
        let new = (epoch << 2) | outcome;
        if slot.load(Relaxed) == new {
            return;
        }
        if !self.update(epoch, outcome, true) {
            return; // a newer epoch began: this outcome is stale
        }
        let old = slot.swap(new, AcqRel);
        let (old_epoch, old_outcome) = (old >> 2, old & 0b11);
        if old_outcome != 0 && old_epoch == epoch {
            self.update(epoch, old_outcome, false);
        }
    }

    /// Adds (or subtracts) one outcome to the aggregate of `epoch`. Returns
    /// false if the aggregate belongs to a newer epoch.
    fn update(&self, epoch: u32, outcome: u32, add: bool) -> bool {
        let mut current = self.aggregate.load(Relaxed);
        loop {
            let held = (current >> EPOCH_SHIFT) as u32 & GEN_MASK;
            let counts = if held == epoch {
                unpack(current)
            } else if add && is_newer(epoch, held) {
                Counts::default()
            } else {
                return false;
            };
            let counts = apply(counts, outcome, add);
            let next = pack(epoch, counts);
            match self
                .aggregate
                .compare_exchange_weak(current, next, AcqRel, Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    pub(crate) fn counts(&self, epoch: u32) -> Counts {
        let current = self.aggregate.load(Acquire);
        if (current >> EPOCH_SHIFT) as u32 & GEN_MASK == epoch {
            unpack(current)
        } else {
            Counts::default()
        }
    }
}

fn apply(mut c: Counts, outcome: u32, add: bool) -> Counts {
    let (f, s) = match outcome {
        FAIL => (1, 0),
        SLOW => (0, 1),
        _ => (0, 0),
    };
    if add {
        c.calls = (c.calls + 1).min(FIELD_MASK);
        c.failures = (c.failures + f).min(FIELD_MASK);
        c.slow = (c.slow + s).min(FIELD_MASK);
    } else {
        c.calls = c.calls.saturating_sub(1);
        c.failures = c.failures.saturating_sub(f);
        c.slow = c.slow.saturating_sub(s);
    }
    c
}

fn pack(epoch: u32, c: Counts) -> u64 {
    (u64::from(epoch & GEN_MASK) << EPOCH_SHIFT)
        | (c.calls << (2 * FIELD_BITS))
        | (c.failures << FIELD_BITS)
        | c.slow
}

fn unpack(w: u64) -> Counts {
    Counts {
        calls: (w >> (2 * FIELD_BITS)) & FIELD_MASK,
        failures: (w >> FIELD_BITS) & FIELD_MASK,
        slow: w & FIELD_MASK,
    }
}

/// The last `N` buckets of time.
#[derive(Debug)]
pub(crate) struct TimeWindow {
    bucket_ns: u64,
    buckets: Box<[Bucket]>,
}

/// One bucket: which tick and epoch it counts for, and its counts.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Bucket {
    /// `tick << GEN_BITS | epoch`, where tick is the bucket's index since
    /// the breaker was created.
    stamp: AtomicU64,
    calls: AtomicU64,
    /// Failures in the low 32 bits, slow calls in the high 32.
    bad: AtomicU64,
}

// === impl TimeWindow ===

impl TimeWindow {
    pub(crate) fn new(buckets: usize, bucket_ns: u64) -> Self {
        Self {
            bucket_ns: bucket_ns.max(1),
            buckets: (0..buckets.clamp(1, 3600))
                .map(|_| Bucket::default())
                .collect(),
        }
    }

    /// Records one outcome in the bucket of `now_ns`.
    ///
    /// A bucket is recycled by the first writer that finds it stamped with
    /// an older tick or epoch, with a compare-and-swap on the stamp and then
    /// plain stores of its own outcome. A writer that finds the new stamp
    /// between those two steps adds its outcome and may see it overwritten:
    /// at each rollover, a few outcomes recorded in the same instant can be
    /// lost. An outcome whose bucket was already recycled for a later tick
    /// is dropped.
    pub(crate) fn record(&self, epoch: u32, outcome: u32, now_ns: u64) {
        let tick = now_ns / self.bucket_ns;
        let bucket = &self.buckets[(tick % self.buckets.len() as u64) as usize];
        let want = (tick << GEN_BITS) | u64::from(epoch);
        let bad = match outcome {
            FAIL => 1,
            SLOW => 1 << 32,
            _ => 0,
        };
        let mut stamp = bucket.stamp.load(Acquire);
        loop {
            if stamp == want {
                bucket.calls.fetch_add(1, Relaxed);
                if bad != 0 {
                    bucket.bad.fetch_add(bad, Relaxed);
                }
                return;
            }
            let (held_tick, held_epoch) = (stamp >> GEN_BITS, stamp as u32 & GEN_MASK);
            let older = held_tick < tick
                || (held_tick == tick && held_epoch != epoch && is_newer(epoch, held_epoch))
                || stamp == 0;
            if !older {
                return;
            }
            match bucket.stamp.compare_exchange(stamp, want, AcqRel, Acquire) {
                Ok(_) => {
                    bucket.calls.store(1, Relaxed);
                    bucket.bad.store(bad, Release);
                    return;
                }
                Err(actual) => stamp = actual,
            }
        }
    }

    /// The sum of the buckets of the last `N` ticks that count for `epoch`.
    pub(crate) fn counts(&self, epoch: u32, now_ns: u64) -> Counts {
        let tick = now_ns / self.bucket_ns;
        let n = self.buckets.len() as u64;
        let oldest = (tick + 1).saturating_sub(n);
        let mut counts = Counts::default();
        for bucket in self.buckets.iter() {
            let stamp = bucket.stamp.load(Acquire);
            let (held_tick, held_epoch) = (stamp >> GEN_BITS, stamp as u32 & GEN_MASK);
            if stamp == 0 || held_epoch != epoch || held_tick < oldest || held_tick > tick {
                continue;
            }
            let bad = bucket.bad.load(Acquire);
            counts.calls += bucket.calls.load(Relaxed);
            counts.failures += bad & 0xFFFF_FFFF;
            counts.slow += bad >> 32;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(calls: u64, failures: u64, slow: u64) -> Counts {
        Counts {
            calls,
            failures,
            slow,
        }
    }

    #[test]
    fn count_window_slides() {
        let w = CountWindow::new(4);
        for _ in 0..4 {
            w.record(1, OK);
        }
        assert_eq!(w.counts(1), counts(4, 0, 0));
        w.record(1, FAIL);
        w.record(1, FAIL);
        assert_eq!(w.counts(1), counts(4, 2, 0));
        for _ in 0..4 {
            w.record(1, SLOW);
        }
        assert_eq!(w.counts(1), counts(4, 0, 4));
    }

    #[test]
    fn a_new_epoch_starts_empty_and_old_ones_are_ignored() {
        let w = CountWindow::new(3);
        w.record(1, FAIL);
        w.record(1, FAIL);
        w.record(2, OK);
        assert_eq!(w.counts(2), counts(1, 0, 0));
        assert_eq!(w.counts(1), Counts::default());
        // A late outcome of epoch 1 does not touch epoch 2's window.
        w.record(1, FAIL);
        assert_eq!(w.counts(2), counts(1, 0, 0));
        // Replacing a slot of an older epoch subtracts nothing.
        for _ in 0..3 {
            w.record(2, FAIL);
        }
        assert_eq!(w.counts(2), counts(3, 3, 0));
    }

    #[test]
    fn time_window_expires_old_buckets() {
        let s = 1_000_000_000;
        let w = TimeWindow::new(3, s);
        w.record(1, FAIL, 0);
        w.record(1, OK, s);
        w.record(1, SLOW, 2 * s);
        assert_eq!(w.counts(1, 2 * s), counts(3, 1, 1));
        assert_eq!(w.counts(1, 3 * s), counts(2, 0, 1));
        w.record(1, OK, 3 * s);
        assert_eq!(w.counts(1, 3 * s), counts(3, 0, 1));
        assert_eq!(w.counts(1, 10 * s), Counts::default());
        assert_eq!(w.counts(2, 3 * s), Counts::default());
    }

    #[test]
    fn concurrent_records_never_underflow() {
        let w = std::sync::Arc::new(CountWindow::new(8));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u32 {
                        w.record(5, [OK, FAIL, SLOW][((i + t) % 3) as usize]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let c = w.counts(5);
        assert_eq!(c.calls, 8);
        let slots: Vec<u32> = w.slots.iter().map(|s| s.load(Relaxed) & 3).collect();
        let fails = slots.iter().filter(|&&o| o == FAIL).count() as u64;
        let slow = slots.iter().filter(|&&o| o == SLOW).count() as u64;
        assert_eq!((c.failures, c.slow), (fails, slow));
    }
}
