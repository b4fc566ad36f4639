//! The retry budget: exact ratio, floor, sharing, races, refunds, and the
//! storm test.

mod support;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use proptest::prelude::*;
use support::{get, Log, Scripted};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_retry_budget::{RetryBudget, RetryLayer, SeededRandom};

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Deposits `requests`, then withdraws until refused; returns the retries
/// granted. Runs under paused time so the window cannot move.
fn granted(ratio: f64, requests: u64) -> u64 {
    paused_runtime().block_on(async {
        let budget = RetryBudget::new().ratio(ratio).min_per_sec(0);
        for _ in 0..requests {
            budget.deposit();
        }
        let mut n = 0;
        while budget.withdraw() {
            n += 1;
        }
        let c = budget.counters();
        assert_eq!(
            (c.requests, c.retries, c.refused_by_budget),
            (requests, n, 1)
        );
        n
    })
}

#[test]
fn common_ratios_are_exact() {
    for requests in [0, 1, 9, 10, 11, 99, 100, 101, 1_000, 9_999, 10_000] {
        assert_eq!(granted(0.1, requests), requests / 10, "0.1 of {requests}");
        assert_eq!(
            granted(0.3, requests),
            requests * 3 / 10,
            "0.3 of {requests}"
        );
        assert_eq!(
            granted(0.7, requests),
            requests * 7 / 10,
            "0.7 of {requests}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_fraction_is_exact(ppm in 0u64..=1_000_000, requests in 0u64..3_000) {
        let ratio = ppm as f64 / 1e6;
        prop_assert_eq!(granted(ratio, requests), ppm * requests / 1_000_000);
    }

    #[test]
    fn decimal_fractions_are_exact(tenths in 0u64..=10, requests in 0u64..3_000) {
        let ratio = tenths as f64 / 10.0;
        prop_assert_eq!(granted(ratio, requests), tenths * requests / 10);
    }

    /// Interleaved: every withdrawal is granted exactly when it fits.
    #[test]
    fn interleaved_never_exceeds_and_never_wastes(
        ppm in 0u64..=1_000_000,
        ops in proptest::collection::vec(any::<bool>(), 0..2_000),
    ) {
        paused_runtime().block_on(async {
            let budget = RetryBudget::new().ratio(ppm as f64 / 1e6).min_per_sec(0);
            let (mut requests, mut retries) = (0u64, 0u64);
            for deposit in ops {
                if deposit {
                    budget.deposit();
                    requests += 1;
                } else {
                    let fits = (retries + 1) * 1_000_000 <= ppm * requests;
                    assert_eq!(budget.withdraw(), fits);
                    retries += u64::from(fits);
                }
            }
        });
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn floor_lets_a_quiet_client_retry() {
    let log = Log::new();
    let layer = RetryLayer::new().random(SeededRandom::new(1));
    let svc = layer.layer(Scripted::always(&log, 503));
    for _ in 0..2 {
        let _ = svc.clone().oneshot(get()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // 10% of 2 requests is nothing, but the floor allows both retries.
    assert_eq!(log.count(), 6);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn floor_is_min_per_sec_times_window() {
    let budget = RetryBudget::new()
        .ratio(0.0)
        .min_per_sec(3)
        .window(Duration::from_secs(4));
    let n = std::iter::from_fn(|| budget.withdraw().then_some(())).count();
    assert_eq!(n, 12);
    // The window slides: after it has passed, the floor is available again.
    tokio::time::advance(Duration::from_secs(4)).await;
    let n = std::iter::from_fn(|| budget.withdraw().then_some(())).count();
    assert_eq!(n, 12);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn budget_is_shared_by_clones_and_by_every_layer_call() {
    let log = Log::new();
    let layer = RetryLayer::new()
        .budget(Arc::new(
            RetryBudget::new()
                .ratio(0.0)
                .min_per_sec(1)
                .window(Duration::from_secs(3)),
        ))
        .random(SeededRandom::new(3));
    // axum and hyper call `layer` once per connection.
    let first = layer.layer(Scripted::always(&log, 503));
    let second = layer.layer(Scripted::always(&log, 503));

    // Three retries in the whole budget: the first request takes two, a
    // clone of the first service the third, the second service none.
    let _ = first.clone().oneshot(get()).await.unwrap();
    assert_eq!(log.count(), 3);
    let _ = first.clone().oneshot(get()).await.unwrap();
    assert_eq!(log.count(), 5);
    let _ = second.clone().oneshot(get()).await.unwrap();
    assert_eq!(log.count(), 6);

    let c = layer.counters();
    assert_eq!((c.requests, c.retries, c.refused_by_budget), (3, 3, 2));
    assert_eq!(first.counters(), c);
    assert_eq!(second.counters(), c);
}

#[test]
fn racing_threads_never_overspend() {
    // A long window, so the race cannot straddle a bucket boundary.
    let budget = Arc::new(
        RetryBudget::new()
            .ratio(0.5)
            .min_per_sec(0)
            .window(Duration::from_secs(10_000)),
    );
    for _ in 0..10_000 {
        budget.deposit();
    }
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || (0..2_000).filter(|_| budget.withdraw()).count())
        })
        .collect();
    let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(granted, 5_000);
    let c = budget.counters();
    assert_eq!((c.retries, c.refused_by_budget), (5_000, 11_000));
}

#[test]
fn racing_deposits_are_all_counted() {
    let budget = Arc::new(RetryBudget::new().window(Duration::from_secs(10_000)));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || (0..10_000).for_each(|_| budget.deposit()))
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(budget.counters().requests, 40_000);
}

// Regression: a withdrawal summed the other buckets, then claimed room in
// its own; two threads whose clocks straddled a bucket boundary (so whose
// retries went to different buckets) could both take the last room.
#[test]
fn racing_threads_across_a_bucket_boundary_never_overspend() {
    const THREADS: usize = 8;
    const ALLOWANCE: usize = 100;
    for round in 0..200 {
        let budget = Arc::new(RetryBudget::new().ratio(0.5).min_per_sec(0));
        let t0 = Instant::now();
        (0..2 * ALLOWANCE).for_each(|_| budget.deposit_at(t0));
        // Bucket 4 and bucket 5 of 1 s each: both windows hold the
        // requests, and their retries go to different buckets.
        let before = t0 + Duration::from_millis(4_500);
        let after = t0 + Duration::from_millis(5_500);
        let start = Arc::new(Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let budget = Arc::clone(&budget);
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    (0..ALLOWANCE / 2)
                        .filter(|i| {
                            budget.withdraw_at(if (t + i) % 2 == 0 { before } else { after })
                        })
                        .count()
                })
            })
            .collect();
        let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(
            granted <= ALLOWANCE,
            "round {round}: {granted} > {ALLOWANCE}"
        );
        // And nothing is lost: a claim given back after a lost race is
        // still there for the next withdrawal.
        let rest = std::iter::from_fn(|| budget.withdraw_at(after).then_some(())).count();
        assert_eq!(granted + rest, ALLOWANCE, "round {round}");
        assert_eq!(budget.counters().retries, ALLOWANCE as u64);
    }
}

/// The tight case of the race above: one retry of room left, and threads
/// on both sides of the boundary released together for it, round after
/// round. Without the check after the claim, two claims in different
/// buckets both took it in about one round in 150 on two cores.
#[test]
fn racing_threads_for_the_last_retry_across_a_bucket_boundary_never_overspend() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 3_000;
    const ALLOWANCE: usize = 100;
    let t0 = Instant::now();
    let before = t0 + Duration::from_millis(4_500);
    let after = t0 + Duration::from_millis(5_500);
    let budgets: Arc<Vec<RetryBudget>> = Arc::new(
        (0..ROUNDS)
            .map(|_| {
                let budget = RetryBudget::new().ratio(0.5).min_per_sec(0);
                (0..2 * ALLOWANCE).for_each(|_| budget.deposit_at(t0));
                assert!((1..ALLOWANCE).all(|_| budget.withdraw_at(before)));
                budget
            })
            .collect(),
    );
    let start = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let budgets = Arc::clone(&budgets);
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                let now = if t % 2 == 0 { before } else { after };
                budgets
                    .iter()
                    .map(|budget| {
                        start.wait();
                        u64::from(budget.withdraw_at(now))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let per_thread: Vec<Vec<u64>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let mut both_refused = 0;
    for (round, budget) in budgets.iter().enumerate() {
        let granted: u64 = per_thread.iter().map(|g| g[round]).sum();
        assert!(
            granted <= 1,
            "round {round}: {granted} threads got the last retry"
        );
        // A claim given back after a lost race is not lost: when every
        // racer was refused, the retry is still there.
        let rest = u64::from(budget.withdraw_at(after));
        assert_eq!(granted + rest, 1, "round {round}");
        both_refused += 1 - granted;
    }
    println!("rounds where every racer was refused: {both_refused} of {ROUNDS}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn refund_leaves_allowance_and_counters_as_if_never_withdrawn() {
    let refunding = RetryBudget::new().min_per_sec(0);
    let plain = RetryBudget::new().min_per_sec(0);
    for budget in [&refunding, &plain] {
        (0..100).for_each(|_| budget.deposit());
        assert!((0..3).all(|_| budget.withdraw()));
    }
    // Paid for, then not sent (the breaker refused it after the backoff).
    let now = Instant::now();
    assert!(refunding.withdraw_at(now));
    tokio::time::advance(Duration::from_millis(300)).await;
    refunding.refund_at(now);

    let before = refunding.counters();
    assert_eq!(before.retries, plain.counters().retries);
    assert_eq!((before.retries, before.refunded), (3, 1));
    // The same room is left in both: 10% of 100, less the 3 kept.
    for budget in [&refunding, &plain] {
        let n = std::iter::from_fn(|| budget.withdraw().then_some(())).count();
        assert_eq!(n, 7);
    }
    let (r, p) = (refunding.counters(), plain.counters());
    assert_eq!(
        (r.requests, r.retries, r.refused_by_budget, r.refunded),
        (p.requests, p.retries, p.refused_by_budget, 1)
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn refund_returns_the_retry_to_the_bucket_that_counted_it() {
    // A floor of 10 retries per 10 s window, no share.
    let budget = RetryBudget::new().ratio(0.0).min_per_sec(1);
    let t0 = Instant::now();
    assert!((0..10).all(|_| budget.withdraw_at(t0)));
    // Refunded three buckets later: the room is back at once...
    let t3 = t0 + Duration::from_secs(3);
    budget.refund_at(t0);
    assert!(budget.withdraw_at(t3));
    assert!(!budget.withdraw_at(t3));
    // ...and when bucket 0 leaves the window, it takes 9 retries with it,
    // not 10: the one of bucket 3 still counts.
    let t10 = t0 + Duration::from_secs(10);
    let n = std::iter::from_fn(|| budget.withdraw_at(t10).then_some(())).count();
    assert_eq!(n, 9);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn refund_after_the_window_moved_on_changes_only_the_counters() {
    let budget = RetryBudget::new().ratio(0.0).min_per_sec(1);
    let t0 = Instant::now();
    assert!(budget.withdraw_at(t0));
    // The retry's bucket has left the window: it limits no one any more,
    // and the refund frees nothing beyond the floor.
    let t10 = t0 + Duration::from_secs(10);
    budget.refund_at(t0);
    let n = std::iter::from_fn(|| budget.withdraw_at(t10).then_some(())).count();
    assert_eq!(n, 10);
    let c = budget.counters();
    assert_eq!((c.retries, c.refunded), (10, 1));
}

#[test]
fn unlimited_budget_counts_refunds_too() {
    let budget = RetryBudget::unlimited();
    let now = Instant::now();
    assert!(budget.withdraw_at(now));
    assert!(budget.withdraw_at(now));
    budget.refund_at(now);
    let c = budget.counters();
    assert_eq!((c.retries, c.refunded), (1, 1));
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Deposit,
    Withdraw,
    /// A withdrawal given back: must leave no trace but `refunded`.
    WithdrawThenRefund,
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// With refunds interleaved, every withdrawal is still granted exactly
    /// when it fits, as if the refunded ones had never happened.
    #[test]
    fn refunded_withdrawals_leave_no_trace(
        ppm in 0u64..=1_000_000,
        floor in 0u32..5,
        ops in proptest::collection::vec(
            prop_oneof![
                3 => Just(Op::Deposit),
                2 => Just(Op::Withdraw),
                1 => Just(Op::WithdrawThenRefund),
            ],
            0..1_500,
        ),
    ) {
        paused_runtime().block_on(async {
            let budget = RetryBudget::new().ratio(ppm as f64 / 1e6).min_per_sec(floor);
            let now = Instant::now();
            let (mut requests, mut retries, mut refunded) = (0u64, 0u64, 0u64);
            for op in ops {
                let allowance = (ppm * requests).max(u64::from(floor) * 10 * 1_000_000);
                let fits = (retries + 1) * 1_000_000 <= allowance;
                match op {
                    Op::Deposit => {
                        budget.deposit_at(now);
                        requests += 1;
                    }
                    Op::Withdraw => {
                        prop_assert_eq!(budget.withdraw_at(now), fits);
                        retries += u64::from(fits);
                    }
                    Op::WithdrawThenRefund => {
                        if budget.withdraw_at(now) {
                            prop_assert!(fits);
                            budget.refund_at(now);
                            refunded += 1;
                        } else {
                            prop_assert!(!fits);
                        }
                    }
                }
                let c = budget.counters();
                prop_assert_eq!((c.requests, c.retries, c.refunded), (requests, retries, refunded));
            }
            Ok(())
        })?;
    }
}

const STORM_REQUESTS: usize = 10_000;

/// 10,000 requests against an always-503 dependency, 2,000 a second for
/// five seconds of simulated time; returns the calls the dependency got.
async fn storm(layer: RetryLayer) -> usize {
    let log = Log::new();
    let svc = layer.layer(Scripted::always(&log, 503));
    let mut tasks: Vec<JoinHandle<()>> = Vec::with_capacity(STORM_REQUESTS);
    for _ in 0..10 {
        for _ in 0..STORM_REQUESTS / 10 {
            let svc = svc.clone();
            tasks.push(tokio::spawn(async move {
                let response = svc.oneshot(get()).await.unwrap();
                assert_eq!(response.status(), 503);
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    log.count()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn storm_stays_near_one_point_one_times_the_requests() {
    let layer = RetryLayer::new().random(SeededRandom::new(11));
    let budget = layer.shared_budget().clone();
    let with_budget = storm(layer).await;
    let without_budget = storm(RetryLayer::new().no_budget().random(SeededRandom::new(11))).await;

    // The floor is a minimum, not added to the share: the 10,000 requests
    // fit in one window, so the retries are at most max(10%, floor).
    let floor_times_window =
        u64::from(budget.min_per_sec_value()) * budget.window_value().as_secs();
    let bound = STORM_REQUESTS as u64 + (STORM_REQUESTS as u64 / 10).max(floor_times_window);
    println!(
        "storm: {STORM_REQUESTS} requests against an always-503 dependency, at most 3 attempts each"
    );
    println!("  with the budget:    {with_budget} calls (bound {bound})");
    println!("  without the budget: {without_budget} calls");
    assert!(with_budget as u64 <= bound, "{with_budget} > {bound}");
    assert!(with_budget >= STORM_REQUESTS);
    assert_eq!(without_budget, 3 * STORM_REQUESTS);
}
