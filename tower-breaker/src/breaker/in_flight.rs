//! Calls in flight, by start time: a hung call is slow evidence while it
//! hangs, not only once it ends.
//!
//! With slow-call detection on, every closed-state call already reads the
//! clock when it starts. [`InFlight`] counts those calls by the bucket of
//! their start time (buckets of a power of two of nanoseconds, at most an
//! eighth of the slow-call threshold): one compare-and-swap on a slot when
//! a call starts and one when it ends, no timer and no allocation. The
//! first call to start in a new bucket *sweeps*: it adds up the calls of
//! the buckets that ended at least the threshold ago (every call counted
//! has been in flight for at least the threshold) and hands the figure to
//! the judgement, which adds it to the window's calls and slow calls.
//!
//! Nothing provisional is ever written to the window: a call leaves the
//! slots before its outcome is counted, so it is counted once, first as in
//! flight, then (if it ends slow) as a slow call of the window.
//!
//! Each slot holds a tag (the closed state's generation and the bucket)
//! beside its count. A call counts only in its own generation, so calls
//! left over from before the circuit last opened are no evidence against
//! the closed state that followed. A slot reused for a newer bucket of the
//! same generation (its calls in flight for longer than the ring's span,
//! 32 buckets, so between two and four thresholds) first moves its calls
//! to one overflow counter of the generation, where they count as stuck
//! until they leave. The slots are split in four rings by start time, so
//! that calls on different threads seldom touch the same slot.

use crate::sync::{AtomicU64, Ordering::Relaxed};

/// Slots per ring: buckets of start time, the ring's span.
const SLOTS: usize = 32;
/// Rings, chosen by a hash of the start time.
const RINGS: usize = 4;
const COUNT_BITS: u32 = 32;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const BUCKET_BITS: u32 = 20;
const BUCKET_MASK: u64 = (1 << BUCKET_BITS) - 1;
const GEN_MASK: u64 = (1 << 12) - 1;

/// The calls in flight of one breaker, by start-time bucket (present only
/// when slow-call detection is on).
#[derive(Debug)]
pub(super) struct InFlight {
    /// Bucket width: `1 << shift` nanoseconds.
    shift: u32,
    /// The slow-call threshold, in nanoseconds (changed by
    /// `Breaker::reconfigure`; the bucket width stays the one it was built
    /// with, so a call is counted at most one such bucket late).
    threshold_ns: std::sync::atomic::AtomicU64,
    /// `RINGS * SLOTS` slots: tag (generation, bucket) << 32 | count.
    slots: Box<[AtomicU64]>,
    /// The bucket of the last sweep.
    swept: AtomicU64,
    /// Calls moved out of reused slots: generation << 40 | count.
    overflow: AtomicU64,
}

const OVERFLOW_COUNT: u64 = (1 << 40) - 1;

// === impl InFlight ===

impl InFlight {
    /// Counters for a slow-call threshold of `threshold_ns` (at least 1).
    pub(super) fn new(threshold_ns: u64) -> Self {
        // The widest power of two at most an eighth of the threshold: a
        // call is counted at most an eighth of the threshold late.
        let shift = 63 - (threshold_ns / 8).max(1).leading_zeros();
        Self {
            shift,
            threshold_ns: std::sync::atomic::AtomicU64::new(threshold_ns),
            slots: (0..RINGS * SLOTS).map(|_| AtomicU64::new(0)).collect(),
            swept: AtomicU64::new(0),
            overflow: AtomicU64::new(0),
        }
    }

    /// A new slow-call threshold (at least 1 ns).
    pub(super) fn set_threshold(&self, threshold_ns: u64) {
        self.threshold_ns.store(threshold_ns.max(1), Relaxed);
    }

    #[inline]
    fn slot(&self, start_ns: u64) -> (&AtomicU64, u64) {
        let bucket = start_ns >> self.shift;
        // Readings of a real clock differ in their low bits; those of a
        // coarse clock (whole milliseconds) above bit 20.
        let ring = ((start_ns ^ (start_ns >> 20)) as usize) & (RINGS - 1);
        let index = ring * SLOTS + (bucket as usize & (SLOTS - 1));
        (&self.slots[index], bucket)
    }

    /// A call of generation `gen` started at `start_ns`. Returns whether
    /// this call should sweep (the first to start in a new bucket).
    #[inline]
    pub(super) fn enter(&self, gen: u32, start_ns: u64) -> bool {
        let (slot, bucket) = self.slot(start_ns);
        let tag = tag(gen, bucket);
        let mut v = slot.load(Relaxed);
        loop {
            if v & !COUNT_MASK == tag {
                match slot.compare_exchange_weak(v, v + 1, Relaxed, Relaxed) {
                    Ok(_) => break,
                    Err(actual) => v = actual,
                }
                continue;
            }
            match age(v, gen, bucket) {
                Age::OlderGeneration => {
                    // Calls of a closed state that is over: forgotten.
                    match slot.compare_exchange_weak(v, tag | 1, Relaxed, Relaxed) {
                        Ok(_) => break,
                        Err(actual) => v = actual,
                    }
                }
                Age::OlderBucket => {
                    // Still in flight a lap later: moved to the overflow
                    // first, so that one of them leaving meanwhile finds
                    // itself in the slot (and the exchange fails) or in
                    // the overflow, never in neither.
                    let moved = v & COUNT_MASK;
                    self.add_overflow(gen, moved);
                    match slot.compare_exchange(v, tag | 1, Relaxed, Relaxed) {
                        Ok(_) => break,
                        Err(actual) => {
                            self.sub_overflow(gen, moved);
                            v = actual;
                        }
                    }
                }
                Age::NewerBucket => {
                    // This call's start was read a lap before the slot's
                    // latest: it belongs with the moved calls.
                    self.add_overflow(gen, 1);
                    break;
                }
                // This call's closed state is already over.
                Age::NewerGeneration => break,
            }
        }
        let swept = self.swept.load(Relaxed);
        bucket > swept
            && self
                .swept
                .compare_exchange(swept, bucket, Relaxed, Relaxed)
                .is_ok()
    }

    /// The call of generation `gen` that started at `start_ns` has ended
    /// (or stopped being timed): it leaves its slot, unless the slot was
    /// reused since.
    #[inline]
    pub(super) fn leave(&self, gen: u32, start_ns: u64) {
        let (slot, bucket) = self.slot(start_ns);
        let tag = tag(gen, bucket);
        let mut v = slot.load(Relaxed);
        while v & !COUNT_MASK == tag && v & COUNT_MASK != 0 {
            match slot.compare_exchange_weak(v, v - 1, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(actual) => v = actual,
            }
        }
        // Not in its slot: moved to the overflow (or its generation is
        // over, and nothing counts it any more).
        self.sub_overflow(gen, 1);
    }

    fn add_overflow(&self, gen: u32, n: u64) {
        let gen = u64::from(gen) & GEN_MASK;
        let mut v = self.overflow.load(Relaxed);
        loop {
            let next = if v >> 40 == gen { v + n } else { gen << 40 | n };
            match self
                .overflow
                .compare_exchange_weak(v, next, Relaxed, Relaxed)
            {
                Ok(_) => return,
                Err(actual) => v = actual,
            }
        }
    }

    fn sub_overflow(&self, gen: u32, n: u64) {
        let gen = u64::from(gen) & GEN_MASK;
        let mut v = self.overflow.load(Relaxed);
        while v >> 40 == gen && v & OVERFLOW_COUNT >= n && n != 0 {
            match self
                .overflow
                .compare_exchange_weak(v, v - n, Relaxed, Relaxed)
            {
                Ok(_) => return,
                Err(actual) => v = actual,
            }
        }
    }

    /// The calls of generation `gen` in flight at `now_ns` that have been
    /// for at least the threshold (their whole bucket ended at least the
    /// threshold ago).
    pub(super) fn stuck(&self, gen: u32, now_ns: u64) -> u64 {
        let Some(cutoff) = now_ns.checked_sub(self.threshold_ns.load(Relaxed)) else {
            return 0;
        };
        // Bucket b ended at (b + 1) << shift; it counts when that is at
        // most `cutoff`, that is when b < cutoff >> shift.
        let limit = cutoff >> self.shift;
        let current = now_ns >> self.shift;
        // Moved calls have been in flight for a lap: more than the
        // threshold.
        let overflow = self.overflow.load(Relaxed);
        let mut stuck = if overflow >> 40 == u64::from(gen) & GEN_MASK {
            overflow & OVERFLOW_COUNT
        } else {
            0
        };
        for slot in self.slots.iter() {
            let v = slot.load(Relaxed);
            let count = v & COUNT_MASK;
            if count == 0 || (v >> (COUNT_BITS + BUCKET_BITS)) != u64::from(gen) & GEN_MASK {
                continue;
            }
            // The slot keeps the bucket's low bits: the bucket is the
            // latest one with those bits, at most `current`.
            let low = (v >> COUNT_BITS) & BUCKET_MASK;
            let bucket = current.wrapping_sub(current.wrapping_sub(low) & BUCKET_MASK);
            if bucket < limit {
                stuck += count;
            }
        }
        stuck
    }
}

/// The tag of generation `gen`'s bucket `bucket`, in place above the count.
#[inline]
fn tag(gen: u32, bucket: u64) -> u64 {
    (((u64::from(gen) & GEN_MASK) << BUCKET_BITS) | (bucket & BUCKET_MASK)) << COUNT_BITS
}

/// How slot value `v` compares with generation `gen`'s bucket `bucket`.
#[derive(Debug, PartialEq, Eq)]
enum Age {
    OlderGeneration,
    NewerGeneration,
    OlderBucket,
    NewerBucket,
}

#[inline]
fn age(v: u64, gen: u32, bucket: u64) -> Age {
    let slot_gen = v >> (COUNT_BITS + BUCKET_BITS);
    let gen = u64::from(gen) & GEN_MASK;
    if slot_gen != gen {
        // Generations only grow: a tag that is not ours is older unless
        // it is within half the tag space ahead of ours (an empty slot is
        // older than anything).
        let ahead = slot_gen.wrapping_sub(gen) & GEN_MASK;
        return if v == 0 || ahead > GEN_MASK / 2 {
            Age::OlderGeneration
        } else {
            Age::NewerGeneration
        };
    }
    let low = (v >> COUNT_BITS) & BUCKET_MASK;
    let behind = (bucket & BUCKET_MASK).wrapping_sub(low) & BUCKET_MASK;
    if behind <= BUCKET_MASK / 2 {
        Age::OlderBucket
    } else {
        Age::NewerBucket
    }
}

#[cfg(test)]
#[cfg(not(tower_resilience_loom))]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_call_counts_only_once_its_whole_bucket_is_past_the_threshold() {
        let f = InFlight::new(200 * MS);
        // Width: 2^24 ns, about 16.8 ms.
        assert_eq!(f.shift, 24);
        let start = 1_000 * MS;
        f.enter(1, start);
        assert_eq!(f.stuck(1, start + 199 * MS), 0, "not yet at the threshold");
        let bucket_end = ((start >> 24) + 1) << 24;
        assert_eq!(f.stuck(1, bucket_end + 200 * MS - 1), 0);
        assert_eq!(f.stuck(1, bucket_end + 200 * MS), 1);
        assert_eq!(f.stuck(2, bucket_end + 200 * MS), 0, "another generation");
        f.leave(1, start);
        assert_eq!(
            f.stuck(1, bucket_end + 300 * MS),
            0,
            "left: not counted again"
        );
    }

    #[test]
    fn a_newer_generation_replaces_the_slot_and_the_old_call_leaving_changes_nothing() {
        let f = InFlight::new(80 * MS);
        let start = 500 * MS;
        f.enter(3, start);
        f.enter(4, start);
        f.leave(3, start);
        assert_eq!(
            f.stuck(4, start + 200 * MS),
            1,
            "gen 4's call is still in flight"
        );
        // A stale admission of gen 3 after gen 4 took the slot is not counted.
        f.enter(3, start);
        assert_eq!(f.stuck(4, start + 200 * MS), 1);
        assert_eq!(f.stuck(3, start + 200 * MS), 0);
    }

    #[test]
    fn calls_in_flight_for_more_than_a_lap_move_to_the_overflow_and_still_count() {
        let f = InFlight::new(80 * MS);
        let width = 1u64 << f.shift;
        // Two calls in bucket 1, then a call a whole lap later in the same
        // slot (the ring is chosen by the start's bits above bit 20, kept).
        let start = width;
        let lap = start + SLOTS as u64 * width;
        assert_eq!(f.slot(start).0 as *const _, f.slot(lap).0 as *const _);
        f.enter(1, start);
        f.enter(1, start);
        f.enter(1, lap);
        let later = lap + 100 * MS;
        assert_eq!(f.stuck(1, later), 3, "two moved, one in its slot");
        f.leave(1, start);
        assert_eq!(f.stuck(1, later), 2, "a moved call leaves the overflow");
        f.leave(1, start);
        f.leave(1, lap);
        assert_eq!(f.stuck(1, later), 0);
        f.leave(1, start);
        assert_eq!(
            f.stuck(1, later),
            0,
            "an extra leave takes nothing below zero"
        );
    }

    #[test]
    fn buckets_are_the_widest_power_of_two_within_an_eighth_of_the_threshold() {
        assert_eq!(InFlight::new(1).shift, 0, "at least a nanosecond");
        assert_eq!(InFlight::new(15).shift, 0);
        assert_eq!(InFlight::new(16).shift, 1);
        assert_eq!(InFlight::new(8 << 20).shift, 20);
        assert_eq!(InFlight::new((8 << 20) - 1).shift, 19);
    }

    #[test]
    fn a_tag_holds_the_generation_and_the_buckets_low_bits_above_the_count() {
        assert_eq!(tag(5, 3), 5 << 52 | 3 << 32);
        assert_eq!(tag(5 + 4096, 3 + (1 << 20)), tag(5, 3), "both wrap");
        assert_eq!(tag(0, 0), 0);
    }

    #[test]
    fn generations_and_buckets_are_ordered_within_half_their_space() {
        let slot = |gen: u32, bucket: u64| tag(gen, bucket) | 1;
        assert_eq!(age(0, 7, 9), Age::OlderGeneration, "an empty slot");
        assert_eq!(age(slot(9, 0), 10, 0), Age::OlderGeneration);
        assert_eq!(age(slot(11, 0), 10, 0), Age::NewerGeneration);
        assert_eq!(age(slot(10 + 2047, 0), 10, 0), Age::NewerGeneration);
        assert_eq!(age(slot(10 + 2048, 0), 10, 0), Age::OlderGeneration);
        assert_eq!(
            age(slot(4095, 0), 1, 0),
            Age::OlderGeneration,
            "across the wrap"
        );
        let half = BUCKET_MASK / 2;
        assert_eq!(age(slot(3, 100), 3, 101), Age::OlderBucket);
        assert_eq!(age(slot(3, 100), 3, 100 + half), Age::OlderBucket);
        assert_eq!(age(slot(3, 100), 3, 100 + half + 1), Age::NewerBucket);
        assert_eq!(age(slot(3, 100), 3, 99), Age::NewerBucket);
        assert_eq!(
            age(slot(3, BUCKET_MASK), 3, BUCKET_MASK + 2),
            Age::OlderBucket,
            "across the wrap"
        );
    }

    #[test]
    fn calls_started_a_nanosecond_or_a_coarse_millisecond_apart_use_different_rings() {
        let f = InFlight::new(80 * MS);
        let index = |start: u64| {
            let (slot, _) = f.slot(start);
            (slot as *const AtomicU64 as usize - f.slots.as_ptr() as usize)
                / std::mem::size_of::<AtomicU64>()
        };
        // Readings whose bits above bit 20 are not zero in the ring's two
        // bits (as most readings are): the low bits still choose the ring.
        for start in [987_655_369_576_u64, 1_000_001_060_921] {
            assert_ne!((start >> 20) & 3, 0);
            let fine: Vec<usize> = (0..4).map(|i| index(start + i) / SLOTS).collect();
            let mut rings = fine.clone();
            rings.sort_unstable();
            assert_eq!(rings, [0, 1, 2, 3], "{start}: {fine:?}");
        }
        let coarse: Vec<usize> = (2..6).map(|k| index(k * MS) / SLOTS).collect();
        let mut rings = coarse.clone();
        rings.sort_unstable();
        assert_eq!(rings, [0, 1, 2, 3], "{coarse:?}");
        // Within a ring, consecutive buckets take consecutive slots.
        let width = 1u64 << f.shift;
        let first = index(width * 40);
        assert_eq!(index(width * 41) % SLOTS, (first + 1) % SLOTS);
        assert_eq!(
            index(width * 40 + (width * SLOTS as u64)),
            first,
            "a lap later"
        );
    }

    #[test]
    fn a_call_and_its_leave_find_the_same_slot_in_every_ring() {
        let f = InFlight::new(80 * MS);
        let starts: Vec<u64> = (0..64).map(|i| 5_000 * MS + i * 7_919).collect();
        for &start in &starts {
            f.enter(2, start);
        }
        let later = 6_000 * MS;
        assert_eq!(f.stuck(2, later), 64);
        for (i, &start) in starts.iter().enumerate() {
            f.leave(2, start);
            assert_eq!(f.stuck(2, later), 63 - i as u64);
        }
        assert!(f.slots.iter().all(|s| s.load(Relaxed) & COUNT_MASK == 0));
        assert_eq!(f.overflow.load(Relaxed) & OVERFLOW_COUNT, 0);
    }

    #[test]
    fn calls_of_one_bucket_share_their_slot_and_are_not_stuck_before_the_threshold() {
        let f = InFlight::new(80 * MS);
        let start = 5_000 * MS;
        for _ in 0..3 {
            f.enter(2, start);
        }
        let (slot, bucket) = f.slot(start);
        assert_eq!(slot.load(Relaxed), tag(2, bucket) | 3);
        assert_eq!(f.overflow.load(Relaxed), 0, "nothing moved");
        assert_eq!(f.stuck(2, start + MS), 0, "in flight for a millisecond");
        f.leave(2, start);
        assert_eq!(slot.load(Relaxed), tag(2, bucket) | 2);
    }

    #[test]
    fn a_leave_without_its_call_changes_nothing() {
        let f = InFlight::new(80 * MS);
        let start = 5_000 * MS;
        f.enter(2, start);
        f.leave(2, start);
        f.leave(2, start);
        let (slot, bucket) = f.slot(start);
        assert_eq!(slot.load(Relaxed), tag(2, bucket), "the count stays at 0");
        assert_eq!(f.stuck(2, start + 300 * MS), 0);
    }

    #[test]
    fn calls_moved_in_one_generation_add_up() {
        let f = InFlight::new(80 * MS);
        let width = 1u64 << f.shift;
        let lap = SLOTS as u64 * width;
        for first in [width, 2 * width, 3 * width] {
            f.enter(1, first);
            f.enter(1, first + lap);
        }
        assert_eq!(f.overflow.load(Relaxed), 1 << 40 | 3, "three moves of one");
        assert_eq!(f.stuck(1, 3 * width + lap + 100 * MS), 6);
    }

    #[test]
    fn the_overflow_belongs_to_one_generation() {
        let f = InFlight::new(80 * MS);
        let width = 1u64 << f.shift;
        let lap = SLOTS as u64 * width;
        f.enter(1, width);
        f.enter(1, width);
        f.enter(1, width + lap);
        assert_eq!(f.overflow.load(Relaxed), 1 << 40 | 2);
        f.enter(2, 3 * width);
        f.enter(2, 3 * width + lap);
        assert_eq!(
            f.overflow.load(Relaxed),
            2 << 40 | 1,
            "gen 1's are forgotten"
        );
        let later = 3 * width + lap + 100 * MS;
        assert_eq!(f.stuck(2, later), 2, "one moved, one in its slot");
        assert_eq!(f.stuck(1, later), 1, "gen 1: only the call in its slot");
        f.leave(1, width);
        assert_eq!(
            f.overflow.load(Relaxed),
            2 << 40 | 1,
            "another generation's"
        );
        f.leave(2, 3 * width);
        assert_eq!(f.overflow.load(Relaxed), 2 << 40, "its own");
        f.leave(2, 3 * width);
        assert_eq!(f.overflow.load(Relaxed), 2 << 40, "never below zero");
    }

    #[test]
    fn a_new_threshold_moves_the_cutoff_and_is_at_least_a_nanosecond() {
        let f = InFlight::new(200 * MS);
        let start = 1_000 * MS;
        f.enter(1, start);
        let bucket_end = ((start >> f.shift) + 1) << f.shift;
        assert_eq!(f.stuck(1, bucket_end + 100 * MS), 0);
        f.set_threshold(100 * MS);
        assert_eq!(f.stuck(1, bucket_end + 100 * MS - 1), 0);
        assert_eq!(f.stuck(1, bucket_end + 100 * MS), 1);
        f.set_threshold(0);
        assert_eq!(
            f.stuck(1, bucket_end),
            0,
            "1 ns: not yet at the bucket's end"
        );
        assert_eq!(f.stuck(1, bucket_end + 1), 1);
        assert_eq!(f.stuck(1, 0), 0, "before the threshold's length: nothing");
    }

    #[test]
    fn the_first_call_of_each_new_bucket_sweeps() {
        let f = InFlight::new(80 * MS);
        let width = 1u64 << f.shift;
        assert!(f.enter(1, 10 * width), "first call of a new bucket");
        assert!(!f.enter(1, 10 * width + 1), "same bucket");
        assert!(f.enter(1, 11 * width));
        assert!(!f.enter(1, 10 * width), "an older bucket never sweeps");
    }
}
