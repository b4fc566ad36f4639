//! Loom models of the hedging layer's latency estimate: recorders racing
//! each other (on one bucket, and to recycle a window for a new period)
//! and a reader of the percentile. Run with `scripts/loom`.
//!
//! The estimate's windows are their real size (a thousand counters each),
//! and loom counts every atomic access as a branch of the execution (two,
//! for a load): a read of the percentile alone loads some five thousand
//! counters. So these models run under
//! `loom_sync::model_with_branches`, with room for that many branches; the
//! preemption bound is the same.

use std::sync::Arc;
use std::time::Duration;

use loom::thread;
use tokio::time::Instant;

use super::*;

const MS: Duration = Duration::from_millis(1);
/// A period as short as the estimate allows, so that a sample of period
/// `n` is taken at `origin + n * PERIOD`.
const PERIOD: Duration = Duration::from_millis(1);
/// The branches one execution may take: well above what the longest model
/// takes (a percentile read loads every bucket; loom's default is 1,000).
const MAX_BRANCHES: usize = 100_000;

fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    tower_resilience_base::loom_sync::model_with_branches(MAX_BRANCHES, f);
}

/// The percentile the estimate gives for a latency of `latency`: the top
/// of its bucket.
fn at(latency: Duration) -> Quantile {
    Quantile::At(Duration::from_micros(upper_micros(bucket_of(
        latency.as_micros() as u64,
    ))))
}

/// The answered samples the window of `tag` holds in the bucket of
/// `latency`.
fn count(e: &Estimator, tag: u64, latency: Duration) -> u32 {
    let window = &e.windows[(tag % 2) as usize];
    window.counts[bucket_of(latency.as_micros() as u64)].load(Relaxed)
}

/// Three answers within one period from two threads, two of them in one
/// bucket (10 ms, 10 ms and 20 ms), both threads racing to claim the
/// window that was never used; the main thread reads the median
/// meanwhile. The median read is always what some of the samples recorded
/// so far give (too few, or the bucket of 10 ms or of 20 ms): never a
/// bucket nobody recorded, never "beyond" for answered samples.
/// Once both are done no sample is lost: three samples (two of 10 ms), so
/// the median is in the bucket of 10 ms.
#[test]
fn racing_recorders_lose_no_sample_and_a_reader_sees_only_recorded_buckets() {
    model(|| {
        let origin = Instant::now();
        let e = Arc::new(Estimator::new(origin, PERIOD));
        let a = {
            let e = e.clone();
            thread::spawn(move || {
                e.record(origin, 10 * MS, false);
                e.record(origin, 20 * MS, false);
            })
        };
        let b = {
            let e = e.clone();
            thread::spawn(move || e.record(origin, 10 * MS, false))
        };
        let read = e.quantile(origin, 0.5, 1);
        assert!(
            [Quantile::TooFew, at(10 * MS), at(20 * MS)].contains(&read),
            "{read:?}"
        );
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(count(&e, 1, 10 * MS), 2, "a racing add was lost");
        assert_eq!(count(&e, 1, 20 * MS), 1);
        assert_eq!(e.quantile(origin, 0.5, 3), at(10 * MS));
    });
}

/// A window holds a sample of period 1 (100 ms); two answers of period 3
/// (10 ms and 20 ms), which falls in the same window, race to recycle it.
/// Once both are done the window is period 3's and holds none of period
/// 1's samples; of the two racing samples, one may be lost to the
/// recycling (the module docs allow it), never both: the recycler counts
/// its own sample after wiping the old ones.
#[test]
fn racing_recorders_recycle_a_window_without_keeping_the_old_period() {
    model(|| {
        let origin = Instant::now();
        let e = Arc::new(Estimator::new(origin, PERIOD));
        e.record(origin, 100 * MS, false);
        assert_eq!(e.samples(origin), 1);
        let later = origin + 2 * PERIOD;
        let racers: Vec<_> = [10 * MS, 20 * MS]
            .into_iter()
            .map(|latency| {
                let e = e.clone();
                thread::spawn(move || e.record(later, latency, false))
            })
            .collect();
        for racer in racers {
            racer.join().unwrap();
        }
        assert_eq!(e.windows[1].tag.load(Acquire), 3);
        assert_eq!(count(&e, 3, 100 * MS), 0, "period 1's sample kept");
        let kept = count(&e, 3, 10 * MS) + count(&e, 3, 20 * MS);
        assert!((1..=2).contains(&kept), "{kept} of the two racing samples");
        assert_eq!(e.samples(later), u64::from(kept));
    });
}
