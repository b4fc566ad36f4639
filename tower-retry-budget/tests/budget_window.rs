//! The budget over time: share and floor against an always-failing
//! dependency, window after window, and buckets left idle for any length of
//! time.

use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;
use tower_retry_budget::RetryBudget;

/// Buckets in the budget's window.
const BUCKETS: u64 = 10;
/// Attempts per request: the first and at most two retries.
const ATTEMPTS: u32 = 3;
/// Millionths, the budget's unit for the ratio.
const PPM: u128 = 1_000_000;

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Withdraws at `now` until refused; returns the retries granted.
fn drain(budget: &RetryBudget, now: Instant) -> u64 {
    let mut n = 0;
    while budget.withdraw_at(now) {
        n += 1;
        assert!(n < 10_000_000, "runaway budget");
    }
    n
}

/// The retries a window with `requests` allows: `max(ratio * requests,
/// min_per_sec * window)`, from the budget's own configuration.
fn allowance(budget: &RetryBudget, requests: u64) -> u64 {
    let ppm = (budget.ratio_value().unwrap() * 1e6).round() as u128;
    let share = ppm * u128::from(requests) / PPM;
    let floor = u128::from(budget.min_per_sec_value()) * budget.window_value().as_millis() / 1000;
    share.max(floor) as u64
}

/// Requests sent and retries granted in one bucket.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    requests: u64,
    retries: u64,
}

/// `rate` requests per second for `secs` seconds against a dependency that
/// always fails: each request is deposited, then retried (at most
/// `ATTEMPTS - 1` times) while the budget allows. The clock is injected,
/// starting at the budget's creation, so the tally's buckets are the
/// budget's.
fn always_failing(budget: &RetryBudget, t0: Instant, rate: u32, secs: u32) -> Vec<Tally> {
    let bucket = budget.window_value() / BUCKETS as u32;
    let step = Duration::from_secs(1) / rate;
    let mut tallies = vec![
        Tally::default();
        (Duration::from_secs(secs.into()).as_nanos() / bucket.as_nanos())
            as usize
    ];
    for i in 0..rate * secs {
        let offset = step * i;
        let now = t0 + offset;
        let tally = &mut tallies[(offset.as_nanos() / bucket.as_nanos()) as usize];
        budget.deposit_at(now);
        tally.requests += 1;
        for _ in 1..ATTEMPTS {
            if !budget.withdraw_at(now) {
                break;
            }
            tally.retries += 1;
        }
    }
    tallies
}

/// Sums each window the budget sees (ten consecutive buckets, shorter at
/// the start), as (last bucket, requests, retries).
fn windows(tallies: &[Tally]) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
    (0..tallies.len()).map(move |last| {
        let first = (last + 1).saturating_sub(BUCKETS as usize);
        let window = &tallies[first..=last];
        (
            last,
            window.iter().map(|t| t.requests).sum(),
            window.iter().map(|t| t.retries).sum(),
        )
    })
}

/// Runs [`always_failing`] for three windows with the default budget and
/// checks the bound over every window: at most `max(share, floor)`.
fn retries_per_window(rate: u32) -> Vec<(usize, u64, u64)> {
    paused_runtime().block_on(async {
        let budget = RetryBudget::new();
        let t0 = Instant::now();
        let tallies = always_failing(&budget, t0, rate, 30);
        let windows: Vec<_> = windows(&tallies).collect();
        for &(last, requests, retries) in &windows {
            let bound = allowance(&budget, requests);
            assert!(
                retries <= bound,
                "{rate}/s, window ending at bucket {last}: {retries} retries of {requests} requests > max(share, floor) = {bound}"
            );
        }
        let c = budget.counters();
        let total: u64 = tallies.iter().map(|t| t.retries).sum();
        assert_eq!((c.requests, c.retries), (u64::from(rate) * 30, total));
        windows
    })
}

// Regression: the floor was added to the share, so at 50 requests per second
// (share 50 and floor 50 per 10 s window) a retrying tier cost 1.2x.
#[test]
fn floor_is_not_added_to_the_share_at_50_per_second() {
    let windows = retries_per_window(50);
    // At steady state (full windows), retries are exactly 10%: the floor
    // (50) and the share (10% of 500) coincide, and they are not added.
    for &(last, requests, retries) in &windows[BUCKETS as usize - 1..] {
        assert_eq!(requests, 500, "bucket {last}");
        assert_eq!(
            retries, 50,
            "bucket {last}: {retries} retries of {requests}"
        );
    }
}

#[test]
fn share_is_exact_at_500_per_second() {
    let windows = retries_per_window(500);
    for &(last, requests, retries) in &windows[BUCKETS as usize - 1..] {
        // The share (500) dominates the floor (50): at most 10%, and the
        // budget leaves nothing unused.
        assert_eq!(requests, 5_000, "bucket {last}");
        assert!(
            retries * 10 <= requests,
            "bucket {last}: {retries} > 10% of {requests}"
        );
        assert_eq!(retries, 500, "bucket {last}");
    }
    let (requests, retries) = windows
        .iter()
        .skip(BUCKETS as usize - 1)
        .step_by(BUCKETS as usize)
        .fold((0, 0), |(q, r), &(_, q1, r1)| (q + q1, r + r1));
    // The dependency sees 1.1 times the requests, not 3 times.
    assert_eq!((requests + retries) * 10, requests * 11);
}

#[test]
fn floor_is_a_minimum_for_a_quiet_client_at_20_per_second() {
    let windows = retries_per_window(20);
    for &(last, requests, retries) in &windows[BUCKETS as usize - 1..] {
        // 10% of 200 would be 20; the floor lets the quiet client retry 50.
        assert_eq!((requests, retries), (200, 50), "bucket {last}");
    }
}

/// Keeps the budget busy for one window: in each bucket, 100 requests and
/// every retry the budget allows. Returns the last bucket's start.
fn fill_one_window(budget: &RetryBudget, t0: Instant) -> Instant {
    let bucket = budget.window_value() / BUCKETS as u32;
    let mut now = t0;
    for b in 0..BUCKETS as u32 {
        now = t0 + bucket * b;
        (0..100).for_each(|_| budget.deposit_at(now));
        drain(budget, now);
    }
    now
}

// Regression: the bucket epoch was kept in 24 bits and compared modulo
// 2^24, so a bucket untouched for 2^23 to 2^24 bucket lengths (97 to 194
// days with the default window) looked newer than the clock and was never
// recycled: deposits were lost in it and its stale retries ate the floor.
// (5 * 2^24 buckets brought stale counts back to life.)
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn budget_idle_for_2_pow_24_buckets_counts_and_grants_again() {
    const GAPS: [u64; 6] = [
        (1 << 23) + 1,
        3 << 22,
        (1 << 24) - 1,
        1 << 24,
        (1 << 24) + 1,
        5 << 24,
    ];
    for gap in GAPS {
        let budget = RetryBudget::new();
        let bucket = budget.window_value() / BUCKETS as u32;
        let t0 = Instant::now();
        fill_one_window(&budget, t0);
        // Idle for `gap` bucket lengths after the last busy bucket.
        tokio::time::advance(bucket * 10).await;
        tokio::time::advance(bucket * (gap - 1) as u32).await;

        // Busy again: the floor is all there...
        let now = Instant::now();
        assert_eq!(drain(&budget, now), 50, "gap of {gap} buckets: floor");
        // ...and new requests count: 10% of 1,000 (the 50 above included).
        (0..1_000).for_each(|_| budget.deposit());
        assert_eq!(drain(&budget, now), 50, "gap of {gap} buckets: share");
        // One window later, only the floor again.
        tokio::time::advance(budget.window_value()).await;
        assert_eq!(
            drain(&budget, Instant::now()),
            50,
            "gap of {gap} buckets: next window"
        );
        assert_eq!(budget.counters().requests, 2_000, "gap of {gap} buckets");
    }
}

/// Idle gaps in bucket lengths: short ones, some near 2^23, 2^24 and
/// 5 * 2^24 (where 24-bit epochs went wrong), and any up to 2^33 (272 years
/// of 1 s buckets).
fn idle_gap() -> impl Strategy<Value = u64> {
    prop_oneof![
        BUCKETS..1_000,
        (1u64 << 23) - 64..(1 << 23) + 64,
        (1u64 << 24) - 64..(1 << 24) + 64,
        (5u64 << 24) - 64..(5 << 24) + 64,
        BUCKETS..1 << 33,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// After any idle gap of at least a window, the budget is fresh: it
    /// counts new requests and grants `max(share, floor)` exactly, then
    /// the floor again one window later.
    #[test]
    fn any_idle_gap_leaves_a_fresh_budget(
        (window_ms, min_per_sec) in prop::sample::select(vec![(1u64, 20_000u32), (1_000, 50), (10_000, 5)]),
        gap in idle_gap(),
        within in 0.0..1.0f64,
        requests in 0u64..3_000,
    ) {
        paused_runtime().block_on(async {
            let budget = RetryBudget::new()
                .min_per_sec(min_per_sec)
                .window(Duration::from_millis(window_ms));
            let bucket = budget.window_value() / BUCKETS as u32;
            let t0 = Instant::now();
            let last = fill_one_window(&budget, t0);
            let floor = allowance(&budget, 0);
            prop_assert!(floor > 0);

            // `gap` bucket lengths after the last busy bucket, anywhere in
            // that bucket.
            let gap_nanos = u128::from(gap) * bucket.as_nanos();
            let now = last
                + Duration::from_nanos(u64::try_from(gap_nanos).unwrap())
                + bucket.mul_f64(within);
            (0..requests).for_each(|_| budget.deposit_at(now));
            prop_assert_eq!(drain(&budget, now), allowance(&budget, requests), "requests {}", requests);

            let later = now + budget.window_value();
            prop_assert_eq!(drain(&budget, later), floor);
            prop_assert_eq!(budget.counters().requests, 100 * BUCKETS + requests);
            Ok(())
        })?;
    }
}

/// Retries whose bucket left the window no longer count, even while their
/// slot of the ring still holds them: here the slot of bucket 1 (reused
/// only at bucket 11, which sees no retry) still holds bucket 1's retries
/// when a withdrawal at bucket 12 sums the window 3..=12. Counting them
/// (a window taken as two buckets longer) refuses retries the window
/// allows.
#[test]
fn a_stale_slot_just_behind_the_window_is_not_counted() {
    paused_runtime().block_on(async {
        let budget = RetryBudget::new().ratio(0.1).min_per_sec(0);
        let start = Instant::now();
        let at = |bucket: u64| start + Duration::from_millis(bucket * 1_000 + 500);
        // Bucket 1: 20 requests, 2 retries, the window's whole allowance.
        for _ in 0..20 {
            budget.deposit_at(at(1));
        }
        assert_eq!(drain(&budget, at(1)), 2);
        // Bucket 12: bucket 1 has left the window (3..=12) with its
        // requests and retries; 20 new requests allow 2 new retries.
        for _ in 0..20 {
            budget.deposit_at(at(12));
        }
        assert_eq!(drain(&budget, at(12)), 2);
        // And once more across the ring: bucket 12's slot is bucket 2's,
        // never used; bucket 13 sums 4..=13 with bucket 12's 2 retries.
        for _ in 0..10 {
            budget.deposit_at(at(13));
        }
        assert_eq!(drain(&budget, at(13)), 1, "30 requests, 3 retries in all");
    });
}
