//! The latency estimate of the hedging layer: a percentile of recent
//! attempt latencies, from two rotating windows of atomic log-scale
//! buckets.
//!
//! Two kinds of sample: an attempt that answered took exactly its latency
//! (an *event*); an attempt cancelled in flight (a race's loser, a call the
//! caller dropped) took *at least* its elapsed time (a *censored* latency).
//! Dropping the censored ones loses the slow attempts exactly when hedges
//! win, so the percentile drifts low; counting them as if they had answered
//! then makes them look barely slower than the delay, so a delay that
//! started low (the first latencies known are the fast ones: the slow are
//! still in flight) climbs back by one hedge latency per refresh. The
//! percentile is therefore read from the product-limit (Kaplan-Meier)
//! estimate of the latency distribution: a censored attempt stays "at
//! risk" up to its elapsed time and then leaves without an answer, so its
//! weight goes to the latencies beyond it. When that weight never reaches
//! the percentile (the answers beyond are not known), the percentile is
//! "beyond every known latency", which the layer clamps to its longest
//! delay. Where latencies cluster (2 ms and 200 ms, say), the percentile
//! falls between two clusters; the estimate takes the side whose share of
//! attempts still running is nearer `1 - percentile`, since that share is
//! what gets hedged.
//!
//! Recording a latency is one bucket index (a `leading_zeros` and two
//! shifts), one load of the window's tag and one relaxed add: no lock, no
//! allocation. The first recorder of a new period recycles the older
//! window (a compare-and-swap on its tag, then zeroing its buckets, unless
//! the window was never used); a sample added to that window while it is
//! being zeroed may be lost, which an estimate can afford. Reading the
//! percentile walks both windows (two thousand relaxed loads or so), so the
//! layer does it at most once per refresh interval and caches the result.

use std::time::Duration;

use tokio::time::Instant;

use crate::sync::{
    AtomicU32, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed},
};

/// Sub-buckets per power of two: 16, so a bucket is at most 6.25% wide.
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Latencies below this many microseconds have a bucket each.
const LINEAR: u64 = 2 * SUB;
/// Latencies are capped just below 2^36 us (about 19 hours).
const MAX_EXP: u32 = 36;
const MAX_MICROS: u64 = (1 << MAX_EXP) - 1;
/// Buckets per window: the bucket of [`MAX_MICROS`] is the last.
pub(crate) const BUCKETS: usize = bucket_of(MAX_MICROS) + 1;

/// The bucket of a latency of `micros` microseconds: exact below
/// [`LINEAR`], then [`SUB`] buckets per power of two.
pub(crate) const fn bucket_of(micros: u64) -> usize {
    let v = if micros > MAX_MICROS {
        MAX_MICROS
    } else {
        micros
    };
    if v < LINEAR {
        return v as usize;
    }
    // 2^exp <= v < 2^(exp + 1), exp >= SUB_BITS + 1.
    let exp = 63 - v.leading_zeros();
    let shift = exp - SUB_BITS;
    // The top SUB_BITS + 1 bits of v: SUB..2 * SUB.
    (shift as u64 * SUB + (v >> shift)) as usize
}

/// The largest latency, in microseconds, that falls in `bucket`.
pub(crate) const fn upper_micros(bucket: usize) -> u64 {
    let b = bucket as u64;
    if b < LINEAR {
        return b;
    }
    let shift = b / SUB - 1;
    let mantissa = b % SUB + SUB;
    ((mantissa + 1) << shift) - 1
}

/// Recent latencies: two windows of one period each, rotated by time.
pub(crate) struct Estimator {
    origin: Instant,
    period_ns: u64,
    windows: [Window; 2],
}

/// One period's counts, tagged with the period they belong to.
struct Window {
    /// The period's index plus one (0: never used).
    tag: AtomicU64,
    /// Attempts that answered, by latency bucket; then, from
    /// [`BUCKETS`] on, attempts cancelled, by elapsed-time bucket.
    counts: Box<[AtomicU32]>,
}

/// A percentile read from the estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quantile {
    /// Fewer samples than asked for.
    TooFew,
    /// The percentile is at most this.
    At(Duration),
    /// The percentile is beyond every latency known: too many attempts
    /// were cancelled, slower than every answer seen.
    Beyond,
}

// === impl Estimator ===

impl Estimator {
    /// An empty estimate whose windows last `period` each (so it covers
    /// the last one to two periods).
    pub(crate) fn new(origin: Instant, period: Duration) -> Self {
        let period_ns = u64::try_from(period.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1_000_000);
        Self {
            origin,
            period_ns,
            windows: [Window::new(), Window::new()],
        }
    }

    /// The index of the period `at` falls in, plus one.
    #[inline]
    fn tag_at(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(nanos).unwrap_or(u64::MAX) / self.period_ns + 1
    }

    /// Counts one latency, measured at `at`: exactly `latency` for an
    /// attempt that answered, at least `latency` for one `cancelled` in
    /// flight.
    #[inline]
    pub(crate) fn record(&self, at: Instant, latency: Duration, cancelled: bool) {
        let tag = self.tag_at(at);
        let window = &self.windows[(tag % 2) as usize];
        let seen = window.tag.load(Acquire);
        if seen < tag
            && window
                .tag
                .compare_exchange(seen, tag, AcqRel, Acquire)
                .is_ok()
            // A slot never used holds no counts: zeroing it could only
            // wipe the samples racing recorders add meanwhile.
            && seen != 0
        {
            // This period's first sample in this slot: the counts there
            // are two or more periods old.
            for count in &window.counts[..] {
                count.store(0, Relaxed);
            }
        }
        // A newer tag (a thread whose clock is ahead recycled the slot):
        // count it there, late rather than lost.
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let index = bucket_of(micros) + if cancelled { BUCKETS } else { 0 };
        window.counts[index].fetch_add(1, Relaxed);
    }

    /// The `quantile` of the latencies of the current and previous
    /// periods, from the product-limit estimate (see the module docs);
    /// [`Quantile::TooFew`] with fewer than `min_samples` samples (and at
    /// least one).
    pub(crate) fn quantile(&self, now: Instant, quantile: f64, min_samples: u64) -> Quantile {
        let live = self.live(now);
        let count = |index: usize| -> u64 {
            live.iter()
                .flatten()
                .map(|w| u64::from(w.counts[index].load(Relaxed)))
                .sum()
        };
        let total: u64 = (0..2 * BUCKETS).map(count).sum();
        if total == 0 || total < min_samples {
            return Quantile::TooFew;
        }
        // Walk the buckets upwards: `at_risk` attempts took at least this
        // bucket's latency; of those, `answered` answered within it;
        // `surviving` is the share still running after it.
        let target = 1.0 - quantile;
        let mut at_risk = total as f64;
        let mut surviving = 1.0_f64;
        let mut previous: Option<(usize, f64)> = None;
        for b in 0..BUCKETS {
            let answered = count(b) as f64;
            let cancelled = count(BUCKETS + b) as f64;
            if answered > 0.0 && at_risk > 0.0 {
                surviving *= 1.0 - (answered / at_risk).min(1.0);
                // A tolerance for the rounding of the product.
                if surviving <= target + 1e-9 {
                    // Where latencies cluster, the percentile falls in the
                    // gap between two clusters: take the side whose share
                    // of attempts still running (the share that would be
                    // hedged) is nearer the target, not always the slower
                    // one. (5.1% of calls at 200 ms, the rest at 2 ms: the
                    // 95th percentile is 200 ms, which would hedge
                    // nothing; 2 ms hedges 5.1%.)
                    let bucket = match previous {
                        Some((p, running)) if running - target < target - surviving => p,
                        _ => b,
                    };
                    return Quantile::At(Duration::from_micros(upper_micros(bucket)));
                }
                previous = Some((b, surviving));
            }
            at_risk -= answered + cancelled;
        }
        // Counts changing between the passes land here too, harmlessly.
        Quantile::Beyond
    }
    /// The windows of the current and previous periods at `now`.
    fn live(&self, now: Instant) -> [Option<&Window>; 2] {
        let tag = self.tag_at(now);
        self.windows.each_ref().map(|w| {
            let t = w.tag.load(Acquire);
            (t == tag || t + 1 == tag).then_some(w)
        })
    }

    /// Samples in the current and previous periods.
    pub(crate) fn samples(&self, now: Instant) -> u64 {
        self.live(now)
            .iter()
            .flatten()
            .map(|w| {
                w.counts
                    .iter()
                    .map(|c| u64::from(c.load(Relaxed)))
                    .sum::<u64>()
            })
            .sum()
    }
}

// === impl Window ===

impl Window {
    fn new() -> Self {
        Self {
            tag: AtomicU64::new(0),
            counts: (0..2 * BUCKETS).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

#[cfg(all(test, tower_resilience_loom))]
mod loom_models;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn buckets_are_contiguous_and_bounded() {
        assert_eq!(BUCKETS, 528);
        let mut previous = 0;
        for micros in 0..100_000u64 {
            let b = bucket_of(micros);
            assert!(b == previous || b == previous + 1, "{micros} us");
            assert!(micros <= upper_micros(b), "{micros} us above its bound");
            if b > 0 {
                assert!(micros > upper_micros(b - 1), "{micros} us below its bucket");
            }
            previous = b;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(upper_micros(BUCKETS - 1), MAX_MICROS);
    }

    proptest! {
        // A bucket is at most 6.25% wide, so the estimate errs by that much
        // at most, always upwards.
        #[test]
        fn bound_is_within_a_sixteenth_above(micros in 0u64..MAX_MICROS) {
            let upper = upper_micros(bucket_of(micros));
            prop_assert!(upper >= micros);
            prop_assert!((upper - micros) as f64 <= micros as f64 / 16.0 + 1.0);
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_95th_percentile_of_a_bimodal_latency() {
        let now = Instant::now();
        let e = Estimator::new(now, Duration::from_secs(10));
        for i in 0..100 {
            e.record(now, if i < 95 { 10 * MS } else { 200 * MS }, false);
        }
        let at = |q| match e.quantile(now, q, 100) {
            Quantile::At(d) => d,
            other => panic!("{other:?}"),
        };
        let p95 = at(0.95);
        assert!(p95 >= 10 * MS && p95 < 11 * MS, "{p95:?}");
        // The 96th percentile is 200 ms, which leaves no attempt running
        // (0% hedged, 4% from the target); 10 ms leaves 5% (1% from it).
        let p96 = at(0.96);
        assert!(p96 >= 10 * MS && p96 < 11 * MS, "{p96:?}");
        let p99 = at(0.99);
        assert!(p99 >= 200 * MS && p99 < 213 * MS, "{p99:?}");
        assert_eq!(e.quantile(now, 0.95, 101), Quantile::TooFew);
    }

    /// In a gap between two clusters, the side whose share still running
    /// is nearer the target, the slower side on a tie.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn in_a_gap_the_nearer_side_and_on_a_tie_the_slower_one() {
        let now = Instant::now();
        let at = |e: &Estimator, q| match e.quantile(now, q, 1) {
            Quantile::At(d) => d,
            other => panic!("{other:?}"),
        };
        // 1 at 10 ms, 5 at 20 ms, 2 at 200 ms; the median: 87.5% still
        // run after 10 ms (37.5% from 50%), 25% after 20 ms (25% from it).
        let e = Estimator::new(now, Duration::from_secs(10));
        e.record(now, 10 * MS, false);
        (0..5).for_each(|_| e.record(now, 20 * MS, false));
        (0..2).for_each(|_| e.record(now, 200 * MS, false));
        let median = at(&e, 0.5);
        assert!(median >= 20 * MS && median < 21 * MS, "{median:?}");
        // 2 at 10 ms and 2 at 200 ms; the 75th percentile: 50% still run
        // after 10 ms and 0% after 200 ms, both 25% from the target.
        let e = Estimator::new(now, Duration::from_secs(10));
        (0..2).for_each(|_| e.record(now, 10 * MS, false));
        (0..2).for_each(|_| e.record(now, 200 * MS, false));
        let p75 = at(&e, 0.75);
        assert!(p75 >= 200 * MS && p75 < 213 * MS, "{p75:?}");
    }

    // Regression: cancelled attempts counted as answers at their elapsed
    // time sat just above the delay, so a delay that started low climbed
    // back by one hedge latency per refresh (4 ms per second in a test
    // where it should have been 530 ms); dropped, they made it drift low.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn cancelled_attempts_count_as_at_least_their_elapsed_time() {
        let now = Instant::now();
        let e = Estimator::new(now, Duration::from_secs(10));
        // 90 answers at 10 ms, 10 attempts cancelled after 20 ms: at
        // least 10% took more than 20 ms, so the p95 is beyond what is
        // known.
        (0..90).for_each(|_| e.record(now, 10 * MS, false));
        (0..10).for_each(|_| e.record(now, 20 * MS, true));
        assert_eq!(e.quantile(now, 0.95, 1), Quantile::Beyond);
        assert!(matches!(e.quantile(now, 0.9, 1), Quantile::At(d) if d < 11 * MS));
        // Answers beyond them take their weight: ten more, half at 100 ms,
        // half at 300 ms. Of the 20 attempts past 20 ms, half answered at
        // 100 ms: the share still running falls from 18% (after 10 ms) to
        // 9% (after 100 ms) and 0% (after 300 ms), and 9% is nearer 5%.
        (0..5).for_each(|_| e.record(now, 100 * MS, false));
        (0..5).for_each(|_| e.record(now, 300 * MS, false));
        let Quantile::At(p95) = e.quantile(now, 0.95, 1) else {
            panic!("known now")
        };
        assert!(p95 >= 100 * MS && p95 < 107 * MS, "{p95:?}");
        let Quantile::At(p99) = e.quantile(now, 0.99, 1) else {
            panic!("known now")
        };
        assert!(p99 >= 300 * MS && p99 < 320 * MS, "{p99:?}");
        // An early cancellation says nothing of the percentile.
        (0..100).for_each(|_| e.record(now, MS, true));
        assert_eq!(e.quantile(now, 0.95, 1), Quantile::At(p95));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn windows_rotate_out_old_latencies() {
        let t0 = Instant::now();
        let e = Estimator::new(t0, Duration::from_secs(10));
        (0..10).for_each(|_| e.record(t0, 100 * MS, false));
        // The next period still sees the previous one...
        let t1 = t0 + Duration::from_secs(19);
        (0..10).for_each(|_| e.record(t1, MS, false));
        assert_eq!(e.samples(t1), 20);
        assert!(matches!(e.quantile(t1, 0.95, 1), Quantile::At(d) if d >= 100 * MS));
        // ...the one after does not.
        let t2 = t0 + Duration::from_secs(20);
        assert_eq!(e.samples(t2), 10);
        assert!(matches!(e.quantile(t2, 0.95, 1), Quantile::At(d) if d < 2 * MS));
        // A sample of the new period recycles the oldest window.
        e.record(t2, 5 * MS, true);
        assert_eq!(e.samples(t2), 11);
        assert_eq!(e.samples(t0 + Duration::from_secs(30)), 1);
    }

    #[test]
    fn racing_recorders_lose_nothing_within_a_period() {
        let origin = Instant::now();
        let e = std::sync::Arc::new(Estimator::new(origin, Duration::from_secs(3600)));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let e = e.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        e.record(
                            origin,
                            Duration::from_micros(t * 1000 + i % 100),
                            i % 2 == 0,
                        );
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(e.samples(origin), 40_000);
    }
}
