//! The sliding windows: the last N outcomes, or the last N time buckets.
//!
//! Both are tagged with an epoch (the generation of the closed state they
//! count for), so that closing the circuit starts a fresh window without
//! touching the slots: anything tagged with an older epoch reads as empty.

use crate::state::{is_newer, Padded, GEN_BITS, GEN_MASK};
use crate::sync::{fence, spin_loop, AtomicU32, AtomicU64, Ordering::*};

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

    /// How many outcomes a count window holds; `None` for a time window.
    pub(crate) fn size(&self) -> Option<u64> {
        match self {
            Window::Count(w) => Some(w.slots.len() as u64),
            Window::Time(_) => None,
        }
    }

    /// The failures in a row at the end of a count window (up to `max`);
    /// 0 for a time window, which does not keep the order.
    pub(crate) fn tail(&self, epoch: u32, max: u64) -> u64 {
        match self {
            Window::Count(w) => w.tail(epoch, max),
            Window::Time(_) => 0,
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
        // Never overwrite an outcome of a newer epoch: a record delayed
        // across a close (its add went to the old epoch's aggregate, now
        // replaced) would otherwise take out of the ring an outcome the new
        // aggregate counts, and that count would stay there, held by no
        // slot, until the next close.
        let mut old = slot.load(Relaxed);
        loop {
            if old & 0b11 != 0 && is_newer((old >> 2) & GEN_MASK, epoch) {
                return;
            }
            match slot.compare_exchange_weak(old, new, AcqRel, Relaxed) {
                Ok(_) => break,
                Err(actual) => old = actual,
            }
        }
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

    /// The failures of `epoch` in a row in the newest slots, up to `max`
    /// (a read of the ring, racing records may blur its end by a slot).
    pub(crate) fn tail(&self, epoch: u32, max: u64) -> u64 {
        let n = self.slots.len() as u64;
        let end = self.index.load(Acquire);
        let fail = (epoch << 2) | FAIL;
        let mut tail = 0;
        while tail < max.min(n).min(end) {
            let i = ((end - 1 - tail) % n) as usize;
            if self.slots[i].load(Relaxed) != fail {
                break;
            }
            tail += 1;
        }
        tail
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
///
/// The stamp doubles as the sequence word of a seqlock: a writer that
/// recycles the bucket for a newer tick or epoch first claims it by
/// swapping the old stamp for `new | BUSY`, then resets the counts, then
/// publishes `new`. Readers skip a busy bucket and retry (or skip) one
/// whose stamp changed while they read its counts, so the counts of an
/// old lap are never summed under a new stamp. Stamps only ever grow
/// (ticks are monotonic, and a bucket is only recycled for a newer tick,
/// or a newer epoch of the same tick), so a stamp that reads the same
/// before and after the counts was not recycled in between.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Bucket {
    /// `tick << GEN_BITS | epoch`, where tick is the bucket's index since
    /// the breaker was created, plus [`BUSY`] while it is being recycled.
    stamp: AtomicU64,
    calls: AtomicU64,
    /// Failures in the low 32 bits, slow calls in the high 32.
    bad: AtomicU64,
}

/// The bit of a stamp that marks a bucket being recycled. No real stamp
/// has it: [`stamp_of`] keeps the tick to 43 bits (278 years of 1 ms
/// buckets; the configuration allows no shorter one).
const BUSY: u64 = 1 << 63;

/// How many times a writer polls a bucket that another writer is
/// recycling for the writer's own tick before it drops its outcome.
const BUSY_SPINS: u32 = 64;

/// How many times a reader tries to read a bucket that is being recycled
/// for a tick it counts, before it counts the bucket as empty.
const READ_TRIES: u32 = 4;

/// The stamp of `tick` and `epoch`, never [`BUSY`].
#[inline]
fn stamp_of(tick: u64, epoch: u32) -> u64 {
    ((tick << GEN_BITS) | u64::from(epoch)) & !BUSY
}

/// Whether a bucket stamped `held` (not busy) counts for an older tick or
/// epoch than `tick` and `epoch`, and may be recycled for them.
#[inline]
fn older(held: u64, tick: u64, epoch: u32) -> bool {
    let (held_tick, held_epoch) = (held >> GEN_BITS, held as u32 & GEN_MASK);
    held_tick < tick
        || (held_tick == tick && held_epoch != epoch && is_newer(epoch, held_epoch))
        || held == 0
}

// === impl Bucket ===

impl Bucket {
    /// A consistent `(calls, bad)` of the bucket, if its stamp satisfies
    /// `counted`; `None` if it does not, or if the bucket kept changing
    /// under the reader (it is being recycled: its new lap has only just
    /// begun and holds next to nothing).
    fn read(&self, counted: impl Fn(u64) -> bool) -> Option<(u64, u64)> {
        for _ in 0..READ_TRIES {
            // Acquire: pairs with the Release store that published this
            // stamp, so the counts read below are the reset of this lap or
            // later values, never those of an earlier lap.
            let stamp = self.stamp.load(Acquire);
            if stamp & BUSY != 0 {
                // The old lap is gone; only the new one could count.
                if !counted(stamp & !BUSY) {
                    return None;
                }
                spin_loop();
                continue;
            }
            if !counted(stamp) {
                return None;
            }
            // Acquire: pairs with the Release `fetch_add`s of writers, whose
            // `calls` increments come first, so `calls` below includes the
            // call of every failure or slow call read here.
            let bad = self.bad.load(Acquire);
            let calls = self.calls.load(Relaxed);
            // If either load above read a store made after a recycling
            // writer's Release fence (the reset, or an add after it), this
            // fence synchronizes with that one, and the load below sees
            // that writer's BUSY stamp or a later one: the change is
            // caught. Stamps never repeat, so equal means unchanged.
            fence(Acquire);
            if self.stamp.load(Relaxed) == stamp {
                return Some((calls, bad));
            }
        }
        None
    }
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
    /// In the common case the bucket already counts for this tick and
    /// epoch: one load and one or two `fetch_add`s. Otherwise the first
    /// writer that finds it stamped with an older tick or epoch recycles
    /// it (see [`Bucket`]), and writers of the same tick that find it busy
    /// wait for the reset to be published, then add their outcome after
    /// it: no outcome is overwritten by a reset. Outcomes are dropped in
    /// two cases only: the bucket already counts for a later tick or a
    /// newer epoch (the outcome is late), or the recycling thread was
    /// descheduled between claiming the bucket and publishing it (three
    /// stores) for longer than [`BUSY_SPINS`] polls of the writers of that
    /// tick, which drop their outcome rather than block. A writer
    /// descheduled between reading the stamp and adding for about a whole
    /// window may add its outcome to the bucket's next lap.
    pub(crate) fn record(&self, epoch: u32, outcome: u32, now_ns: u64) {
        let tick = now_ns / self.bucket_ns;
        let bucket = &self.buckets[(tick % self.buckets.len() as u64) as usize];
        let want = stamp_of(tick, epoch);
        let bad = match outcome {
            FAIL => 1,
            SLOW => 1 << 32,
            _ => 0,
        };
        // Acquire (here and on every reload): pairs with the Release store
        // that published `want`, so the reset of this lap happens before
        // our adds, which come after it in each counter's order and are
        // never wiped by it.
        let mut stamp = bucket.stamp.load(Acquire);
        let mut spins = 0;
        loop {
            if stamp == want {
                // Calls first, then the failure with Release: a reader that
                // sees the failure (with Acquire) sees its call too.
                bucket.calls.fetch_add(1, Relaxed);
                if bad != 0 {
                    bucket.bad.fetch_add(bad, Release);
                }
                return;
            }
            if stamp & BUSY != 0 {
                // Another writer is recycling the bucket. Wait for it if it
                // is recycling for this tick and epoch (or an older one,
                // which this writer will then recycle in turn).
                let target = stamp & !BUSY;
                if (target != want && !older(target, tick, epoch)) || spins == BUSY_SPINS {
                    return;
                }
                spins += 1;
                spin_loop();
                stamp = bucket.stamp.load(Acquire);
                continue;
            }
            if !older(stamp, tick, epoch) {
                return;
            }
            match bucket
                .stamp
                .compare_exchange(stamp, want | BUSY, Acquire, Acquire)
            {
                Ok(_) => {
                    // Release fence: a reader whose loads see the reset (or
                    // anything added after it) also sees the BUSY stamp
                    // when it re-checks the stamp (see `Bucket::read`).
                    fence(Release);
                    bucket.calls.store(1, Relaxed);
                    bucket.bad.store(bad, Relaxed);
                    // Release: publishes the reset to readers and writers
                    // that load this stamp with Acquire.
                    bucket.stamp.store(want, Release);
                    return;
                }
                Err(actual) => stamp = actual,
            }
        }
    }

    /// The sum of the buckets of the last `N` ticks that count for `epoch`.
    ///
    /// Each bucket is read consistently: its counts are those of the tick
    /// its stamp names, never those of an earlier lap (see [`Bucket`]). A
    /// bucket caught in the middle of being recycled for a tick the window
    /// covers counts as empty: its new lap has only just begun. Failures
    /// never exceed calls, nor failures and slow calls together (the sum
    /// is clamped, for a writer descheduled across a whole lap, as
    /// [`record`](Self::record) describes).
    pub(crate) fn counts(&self, epoch: u32, now_ns: u64) -> Counts {
        let tick = now_ns / self.bucket_ns;
        let n = self.buckets.len() as u64;
        let oldest = (tick + 1).saturating_sub(n);
        let counted = |stamp: u64| {
            let (held_tick, held_epoch) = (stamp >> GEN_BITS, stamp as u32 & GEN_MASK);
            stamp != 0 && held_epoch == epoch && held_tick >= oldest && held_tick <= tick
        };
        let mut counts = Counts::default();
        for bucket in self.buckets.iter() {
            if let Some((calls, bad)) = bucket.read(counted) {
                let failures = (bad & 0xFFFF_FFFF).min(calls);
                counts.calls += calls;
                counts.failures += failures;
                counts.slow += (bad >> 32).min(calls - failures);
            }
        }
        counts
    }
}

#[cfg(all(test, tower_resilience_loom))]
mod loom_models;

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
        // Nor does one that its slot does not hold already.
        w.record(1, SLOW);
        assert_eq!(w.counts(2), counts(1, 0, 0));
        // Replacing a slot of an older epoch subtracts nothing.
        for _ in 0..3 {
            w.record(2, FAIL);
        }
        assert_eq!(w.counts(2), counts(3, 3, 0));
    }

    /// The largest count window is 16,383 outcomes, the most each 14-bit
    /// field of the aggregate can count.
    #[test]
    fn the_largest_count_window_is_what_its_fields_can_count() {
        let w = CountWindow::new(usize::MAX);
        assert_eq!(w.slots.len(), 16_383);
        for _ in 0..MAX_COUNT_WINDOW {
            w.record(1, FAIL);
        }
        let full = MAX_COUNT_WINDOW as u64;
        assert_eq!(w.counts(1), counts(full, full, 0));
    }

    /// The healthy steady state: a success recorded in a window full of
    /// successes writes nothing at all (no slot, no index, no aggregate),
    /// so threads that only succeed never contend.
    #[test]
    fn a_success_in_a_window_of_successes_writes_nothing() {
        let w = CountWindow::new(3);
        for _ in 0..3 {
            w.record(4, OK);
        }
        let before = (w.index.load(Relaxed), w.aggregate.load(Relaxed));
        for _ in 0..10 {
            w.record(4, OK);
        }
        assert_eq!((w.index.load(Relaxed), w.aggregate.load(Relaxed)), before);
        assert_eq!(w.counts(4), counts(3, 0, 0));
        // Not yet full: a success is counted.
        let w = CountWindow::new(3);
        w.record(4, OK);
        w.record(4, OK);
        assert_eq!(w.counts(4), counts(2, 0, 0));
    }

    /// Generations are 20 bits and wrap. A window that counts in the
    /// generations it is given, a quarter of the range apart at most (as
    /// the breaker's closed states follow one another), counts right all
    /// the way across the wrap, with a slot still empty or holding the
    /// outcome of a long-gone generation.
    #[test]
    fn a_count_window_counts_right_across_the_generation_wrap() {
        let w = CountWindow::new(4);
        let quarter = 1 << (GEN_BITS - 2);
        // One failure in each of three generations: slots 0 to 2, and
        // slot 3 stays empty.
        for epoch in [1, quarter + 1, 2 * quarter + 1] {
            w.record(epoch, FAIL);
            assert_eq!(w.counts(epoch), counts(1, 1, 0), "{epoch}");
        }
        let e = 2 * quarter + 1;
        // Slot 3 (empty), 0 and 1 (older generations), 2 (e's failure).
        for _ in 0..4 {
            w.record(e, OK);
        }
        assert_eq!(w.counts(e), counts(4, 0, 0));
        w.record(e, FAIL);
        assert_eq!(w.counts(e), counts(4, 1, 0));
        // Every quarter and across the wrap, each generation replacing its
        // own outcomes too.
        let w = CountWindow::new(2);
        let generations = [1, 2, 3].map(|k| k * quarter + 1);
        for epoch in generations
            .into_iter()
            .chain([GEN_MASK - 1, GEN_MASK, 0, 1])
        {
            for outcome in [FAIL, OK, OK, FAIL] {
                w.record(epoch, outcome);
            }
            assert_eq!(w.counts(epoch), counts(2, 1, 0), "{epoch}");
        }
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

    /// A bucket is recycled only for a later tick, or for a newer
    /// generation of the same tick: a late outcome (of an older tick that
    /// maps to the same bucket, or of an older generation) is dropped and
    /// never wipes what the bucket counts.
    #[test]
    fn only_a_later_tick_or_a_newer_generation_recycles_a_bucket() {
        let s = 1_000_000_000;
        let w = TimeWindow::new(3, s);
        w.record(2, FAIL, 3 * s);
        // Tick 0 maps to tick 3's bucket: late, whatever its generation.
        w.record(2, OK, 0);
        w.record(3, OK, 0);
        assert_eq!(w.counts(2, 3 * s), counts(1, 1, 0));
        // An older generation at the same tick: late too.
        w.record(1, OK, 3 * s);
        assert_eq!(w.counts(2, 3 * s), counts(1, 1, 0));
        // A newer generation at the same tick starts the bucket afresh.
        w.record(3, SLOW, 3 * s);
        assert_eq!(w.counts(3, 3 * s), counts(1, 0, 1));
        assert_eq!(w.counts(2, 3 * s), Counts::default());
        // And so does a later tick.
        w.record(3, OK, 6 * s);
        assert_eq!(w.counts(3, 6 * s), counts(1, 0, 0));
    }

    /// A writer that finds its bucket being recycled for its own tick (or
    /// an older one) polls it at most `BUSY_SPINS` times, then drops its
    /// outcome rather than block; a reader counts such a bucket as empty.
    /// Once the recycler publishes, both go on as usual.
    #[test]
    fn a_bucket_stuck_mid_recycle_blocks_no_one() {
        let s = 1_000_000_000;
        let w = TimeWindow::new(1, s);
        let stuck = stamp_of(2, 7);
        w.buckets[0].stamp.store(stuck | BUSY, Relaxed);
        w.record(7, FAIL, 2 * s); // its own tick
        w.record(7, FAIL, 3 * s); // a later tick, which waits for tick 2
        w.record(6, FAIL, s); // a late outcome: gives up at once
        assert_eq!(w.counts(7, 2 * s), Counts::default());
        assert_eq!(w.buckets[0].calls.load(Relaxed), 0);
        // The recycler publishes its (empty) lap.
        w.buckets[0].stamp.store(stuck, Release);
        w.record(7, FAIL, 2 * s);
        assert_eq!(w.counts(7, 2 * s), counts(1, 1, 0));
    }

    /// A writer descheduled across a whole lap may add its failure or slow
    /// call to the bucket's next lap after the reset: the sum is clamped,
    /// so a read never shows more failures than calls, nor more failures
    /// and slow calls together.
    #[test]
    fn counts_clamp_a_lap_with_more_bad_outcomes_than_calls() {
        let s = 1_000_000_000;
        let w = TimeWindow::new(1, s);
        w.record(7, OK, 0);
        w.record(7, FAIL, 0);
        assert_eq!(w.counts(7, 0), counts(2, 1, 0));
        // Two late adds land in this lap: one failure, two slow calls.
        w.buckets[0].bad.fetch_add(1 + (2 << 32), Release);
        assert_eq!(w.counts(7, 0), counts(2, 2, 0));
        w.buckets[0].calls.fetch_add(1, Relaxed);
        assert_eq!(w.counts(7, 0), counts(3, 2, 1));
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

    /// Readers and writers meet at bucket boundaries: before each round the
    /// one bucket holds a lap full of failures, then writers record
    /// successes and slow calls in the next tick (recycling the bucket)
    /// while readers sum the window of that tick. No read may count the old
    /// lap, nor see more failures or slow calls than calls (checked on the
    /// bucket itself too, as `counts` clamps).
    ///
    /// The barrier lines several writers up on the same boundary, so that
    /// they race to recycle the bucket.
    #[test]
    fn rollover_in_lockstep_never_shows_a_stale_bucket() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::{Arc, Barrier};

        const ROUNDS: u64 = 5_000;
        const WRITERS: usize = 2;
        const READERS: usize = 2;
        // Outcomes per writer per round: a read above this many calls, or
        // with any failure, counts the old lap.
        const OKS: u64 = 16;
        const OLD_FAILS: u64 = 200;
        const EPOCH: u32 = 7;
        let ns = 1_000;
        let w = Arc::new(TimeWindow::new(1, ns));
        let start = Arc::new(Barrier::new(WRITERS + READERS + 1));
        let end = Arc::new(Barrier::new(WRITERS + READERS + 1));
        let writing = Arc::new(AtomicUsize::new(0));
        let reading = Arc::new(AtomicUsize::new(0));
        let stale = Arc::new(AtomicU64::new(0));
        let torn = Arc::new(AtomicU64::new(0));
        let reads = Arc::new(AtomicU64::new(0));
        let max_calls = WRITERS as u64 * OKS;

        let mut threads = Vec::new();
        for t in 0..WRITERS {
            let (w, start, end) = (w.clone(), start.clone(), end.clone());
            let (writing, reading) = (writing.clone(), reading.clone());
            threads.push(std::thread::spawn(move || {
                for k in 1..=ROUNDS {
                    start.wait();
                    // Let at least one reader spin first, so that reads
                    // overlap the recycle.
                    while reading.load(Acquire) == 0 {
                        std::thread::yield_now();
                    }
                    for i in 0..OKS {
                        let outcome = if i % 2 == 0 { OK } else { SLOW };
                        w.record(EPOCH, outcome, k * ns + (i * 7 + t as u64) % ns);
                    }
                    writing.fetch_sub(1, Release);
                    end.wait();
                }
            }));
        }
        for _ in 0..READERS {
            let (w, start, end) = (w.clone(), start.clone(), end.clone());
            let (writing, reading) = (writing.clone(), reading.clone());
            let (stale, torn, reads) = (stale.clone(), torn.clone(), reads.clone());
            threads.push(std::thread::spawn(move || {
                for k in 1..=ROUNDS {
                    start.wait();
                    reading.fetch_add(1, Release);
                    let mut n = 0;
                    loop {
                        let done = writing.load(Acquire) == 0;
                        let c = w.counts(EPOCH, k * ns + n % ns);
                        n += 1;
                        if c.failures > 0 || c.calls > max_calls {
                            stale.fetch_add(1, Relaxed);
                        }
                        if c.failures + c.slow > c.calls {
                            torn.fetch_add(1, Relaxed);
                        }
                        if let Some((calls, bad)) = w.buckets[0].read(|_| true) {
                            if (bad & 0xFFFF_FFFF) + (bad >> 32) > calls {
                                torn.fetch_add(1, Relaxed);
                            }
                        }
                        if done {
                            break;
                        }
                        // Two cores: let the writers run.
                        if n % 64 == 0 {
                            std::thread::yield_now();
                        }
                    }
                    reads.fetch_add(n, Relaxed);
                    end.wait();
                }
            }));
        }

        let mut stale_rounds = 0;
        let mut seen = 0;
        let mut lost = 0;
        for k in 1..=ROUNDS {
            // The lap about to be recycled: failures of tick k - 1.
            for i in 0..OLD_FAILS {
                w.record(EPOCH, FAIL, (k - 1) * ns + i % ns);
            }
            assert!(w.counts(EPOCH, (k - 1) * ns).failures >= OLD_FAILS);
            writing.store(WRITERS, Relaxed);
            reading.store(0, Relaxed);
            start.wait();
            end.wait();
            let now = stale.load(Relaxed) + torn.load(Relaxed);
            if now != seen {
                stale_rounds += 1;
                seen = now;
            }
            let c = w.counts(EPOCH, k * ns);
            assert_eq!(c.failures, 0, "round {k}: {c:?}");
            assert!(
                c.slow <= c.calls && c.calls <= max_calls,
                "round {k}: {c:?}"
            );
            // Outcomes dropped at the rollover: not asserted, as a writer
            // may give up on a bucket whose recycler was descheduled.
            lost += max_calls - c.calls;
        }
        for t in threads {
            t.join().unwrap();
        }
        let (stale, torn) = (stale.load(Relaxed), torn.load(Relaxed));
        eprintln!(
            "lockstep rollover race: {stale} stale and {torn} torn reads in {stale_rounds} of {ROUNDS} rounds \
             ({} reads); {lost} of {} outcomes lost",
            reads.load(Relaxed),
            ROUNDS * max_calls
        );
        assert_eq!(
            (stale, torn),
            (0, 0),
            "stale reads, torn reads ({stale_rounds} of {ROUNDS} rounds affected)"
        );
    }

    /// Writers and readers race at bucket boundaries, over and over. One
    /// bucket; a driver walks the ticks, publishing each before recording
    /// in it: a lap of failures in every odd tick, successes and slow calls
    /// in every even one, so that each even tick recycles a bucket full of
    /// failures. Another writer records successes in the published tick
    /// (and recycles the bucket when it gets there first), while readers
    /// sum the window of the published tick. A read of an even tick that
    /// shows a failure counts the old lap. No read may show more failures
    /// and slow calls than calls, either (checked on the bucket itself too,
    /// as `counts` clamps).
    ///
    /// Every failure and slow call is recorded by the driver alone, which
    /// finishes each record before it moves on: after the fix, no reader
    /// can see one where it does not belong, however threads are
    /// scheduled.
    #[test]
    fn rollover_never_shows_a_stale_bucket() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;

        const CROSSINGS: u64 = 100_000;
        const OLD_FAILS: u64 = 16;
        const READERS: usize = 2;
        const EPOCH: u32 = 7;
        let ns = 1_000;
        let w = Arc::new(TimeWindow::new(1, ns));
        let tick = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let stale = Arc::new(AtomicU64::new(0));
        let torn = Arc::new(AtomicU64::new(0));
        let reads = Arc::new(AtomicU64::new(0));

        let mut threads = Vec::new();
        {
            let (w, tick, done) = (w.clone(), tick.clone(), done.clone());
            threads.push(std::thread::spawn(move || {
                let mut i = 0;
                while !done.load(Relaxed) {
                    w.record(EPOCH, OK, tick.load(Acquire) * ns + i % ns);
                    i += 1;
                }
            }));
        }
        for _ in 0..READERS {
            let (w, tick, done) = (w.clone(), tick.clone(), done.clone());
            let (stale, torn, reads) = (stale.clone(), torn.clone(), reads.clone());
            threads.push(std::thread::spawn(move || {
                let mut n = 0;
                while !done.load(Relaxed) {
                    let t = tick.load(Acquire);
                    let c = w.counts(EPOCH, t * ns + n % ns);
                    n += 1;
                    if t % 2 == 0 && c.failures > 0 {
                        stale.fetch_add(1, Relaxed);
                    }
                    if c.failures + c.slow > c.calls {
                        torn.fetch_add(1, Relaxed);
                    }
                    if let Some((calls, bad)) = w.buckets[0].read(|_| true) {
                        if (bad & 0xFFFF_FFFF) + (bad >> 32) > calls {
                            torn.fetch_add(1, Relaxed);
                        }
                    }
                }
                reads.fetch_add(n, Relaxed);
            }));
        }

        let mut stale_crossings = 0;
        let mut seen = 0;
        for k in 1..=CROSSINGS {
            let t = 2 * k - 1;
            tick.store(t, Release);
            for i in 0..OLD_FAILS {
                w.record(EPOCH, FAIL, t * ns + i);
            }
            tick.store(t + 1, Release);
            for i in 0..4 {
                w.record(EPOCH, [OK, SLOW][i as usize % 2], (t + 1) * ns + i);
            }
            // The driver reads too, right after its own records.
            let c = w.counts(EPOCH, (t + 1) * ns);
            if c.failures > 0 || c.slow > 2 {
                stale.fetch_add(1, Relaxed);
            }
            if c.failures + c.slow > c.calls {
                torn.fetch_add(1, Relaxed);
            }
            let now = stale.load(Relaxed) + torn.load(Relaxed);
            if now != seen {
                stale_crossings += 1;
                seen = now;
            }
        }
        done.store(true, Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let (stale, torn) = (stale.load(Relaxed), torn.load(Relaxed));
        eprintln!(
            "rollover race: {stale} stale and {torn} torn reads after {stale_crossings} of \
             {CROSSINGS} crossings ({} reads)",
            reads.load(Relaxed),
        );
        assert_eq!(
            (stale, torn),
            (0, 0),
            "stale reads, torn reads (after {stale_crossings} of {CROSSINGS} crossings)"
        );
    }
}
