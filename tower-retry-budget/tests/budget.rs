//! The retry budget: exact ratio, floor, sharing, races, and the storm
//! test.

mod support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use support::{get, Log, Scripted};
use tokio::task::JoinHandle;
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

    let floor_times_window =
        u64::from(budget.min_per_sec_value()) * budget.window_value().as_secs();
    let bound = STORM_REQUESTS as u64 * 11 / 10 + floor_times_window;
    println!(
        "storm: {STORM_REQUESTS} requests against an always-503 dependency, at most 3 attempts each"
    );
    println!("  with the budget:    {with_budget} calls (bound {bound})");
    println!("  without the budget: {without_budget} calls");
    assert!(with_budget as u64 <= bound, "{with_budget} > {bound}");
    assert!(with_budget >= STORM_REQUESTS);
    assert_eq!(without_budget, 3 * STORM_REQUESTS);
}
