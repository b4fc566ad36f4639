//! Backoff: full-jitter bounds and mean, decorrelated jitter, and jitter
//! that is independent per request.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use support::{gaps, get, Log, Scripted, MS};
use tower::{Layer, ServiceExt};
use tower_retry_budget::{Backoff, ProcessRandom, RandomSource, RetryLayer, SeededRandom};

const BASE: Duration = Duration::from_millis(100);
const CAP: Duration = Duration::from_secs(10);

/// Delays of `requests` sequential requests against an always-503
/// dependency, grouped per request.
async fn delays(layer: RetryLayer, requests: usize, attempts: usize) -> Vec<Vec<Duration>> {
    let log = Log::new();
    let svc = layer.layer(Scripted::always(&log, 503));
    for _ in 0..requests {
        let response = svc.clone().oneshot(get()).await.unwrap();
        assert_eq!(response.status(), 503);
    }
    let times = log.times();
    assert_eq!(times.len(), requests * attempts);
    times.chunks(attempts).map(gaps).collect()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn full_jitter_delays_fall_within_bounds_and_average_half() {
    let backoff = Backoff::full_jitter(BASE, CAP);
    let layer = RetryLayer::new()
        .backoff(backoff)
        .max_attempts(4)
        .no_budget()
        .random(SeededRandom::new(2024));
    let n = 2_000;
    let per_request = delays(layer, n, 4).await;

    for retry in 0..3u32 {
        let bound = backoff.bound(retry);
        let sample: Vec<_> = per_request.iter().map(|d| d[retry as usize]).collect();
        for d in &sample {
            // Tokio's timer rounds a sleep up to the next millisecond.
            assert!(*d <= bound + MS, "retry {retry}: {d:?} > {bound:?}");
        }
        let mean = sample.iter().sum::<Duration>() / n as u32;
        let half = bound / 2;
        let low = half.mul_f64(0.95);
        let high = half.mul_f64(1.05) + MS;
        println!("retry {retry}: bound {bound:?}, mean delay {mean:?}");
        assert!(
            mean >= low && mean <= high,
            "retry {retry}: mean {mean:?}, expected about {half:?}"
        );
        // Spread over the whole range, not clustered.
        let min = sample.iter().min().unwrap();
        let max = sample.iter().max().unwrap();
        assert!(
            *min < bound / 20 && *max > bound.mul_f64(0.95),
            "{min:?}..{max:?}"
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn cap_limits_full_jitter() {
    let layer = RetryLayer::new()
        .backoff(Backoff::full_jitter(BASE, Duration::from_millis(150)))
        .max_attempts(4)
        .no_budget()
        .random(SeededRandom::new(5));
    for d in delays(layer, 300, 4).await {
        assert!(d[1] <= Duration::from_millis(151) && d[2] <= Duration::from_millis(151));
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn decorrelated_jitter_stays_between_base_and_three_times_previous() {
    let base = Duration::from_millis(20);
    let cap = Duration::from_millis(500);
    let layer = RetryLayer::new()
        .backoff(Backoff::decorrelated(base, cap))
        .max_attempts(5)
        .no_budget()
        .random(SeededRandom::new(9));
    for d in delays(layer, 500, 5).await {
        let mut previous = base;
        for delay in d {
            assert!(delay >= base, "{delay:?}");
            assert!(
                delay <= (previous * 3).min(cap) + MS,
                "{delay:?} after {previous:?}"
            );
            previous = delay;
        }
    }
}

/// The second attempts of two requests that failed at the same instant.
async fn second_attempts(layer: RetryLayer) -> (Duration, Duration) {
    let log_a = Log::new();
    let log_b = Log::new();
    let a = layer.layer(Scripted::fails_then_ok(&log_a, 503, 1));
    let b = layer.layer(Scripted::fails_then_ok(&log_b, 503, 1));
    let start = tokio::time::Instant::now();
    let (ra, rb) = tokio::join!(a.oneshot(get()), b.oneshot(get()));
    assert_eq!(ra.unwrap().status(), 200);
    assert_eq!(rb.unwrap().status(), 200);
    let (ta, tb) = (log_a.times(), log_b.times());
    assert_eq!(
        (ta[0], tb[0]),
        (start, start),
        "both failed at the same moment"
    );
    (ta[1] - start, tb[1] - start)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn simultaneous_failures_get_independent_delays() {
    let backoff = Backoff::full_jitter(Duration::from_secs(1), CAP);
    for seed in 0..20 {
        let layer = RetryLayer::new()
            .backoff(backoff)
            .random(SeededRandom::new(seed));
        let (a, b) = second_attempts(layer).await;
        assert_ne!(a, b, "seed {seed}: lock-step retries");
    }
    // The default, process-wide source too. Its delays are drawn to the
    // millisecond, so two independent draws agree one time in a thousand:
    // lock-step means every one of five pairs agrees.
    let mut pairs = Vec::new();
    for _ in 0..5 {
        let layer = RetryLayer::new()
            .backoff(backoff)
            .random(ProcessRandom::new());
        pairs.push(second_attempts(layer).await);
    }
    assert!(
        pairs.iter().any(|(a, b)| a != b),
        "default source: lock-step retries {pairs:?}"
    );
}

/// A random source that replays the same seed: the shared-backoff bug the
/// test above must catch.
#[derive(Debug, Default)]
struct SameSeed(AtomicU64);

impl RandomSource for SameSeed {
    fn next_u64(&self) -> u64 {
        self.0.load(Ordering::Relaxed) + 7
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_shared_seed_would_retry_in_lock_step() {
    let layer = RetryLayer::new()
        .backoff(Backoff::full_jitter(Duration::from_secs(1), CAP))
        .random(SameSeed::default());
    let (a, b) = second_attempts(layer).await;
    assert_eq!(a, b, "the independence test must be able to fail");
}
