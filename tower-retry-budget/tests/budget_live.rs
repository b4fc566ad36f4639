//! A budget's ratio and floor changed while it runs: its window is kept.

use tower_retry_budget::{BudgetChangeError, RetryBudget};

fn withdrawals(budget: &RetryBudget) -> usize {
    std::iter::from_fn(|| budget.withdraw().then_some(())).count()
}

#[tokio::test(start_paused = true)]
async fn a_new_ratio_applies_to_the_requests_already_counted() {
    let budget = RetryBudget::new().min_per_sec(0);
    for _ in 0..1_000 {
        budget.deposit();
    }
    assert_eq!(withdrawals(&budget), 100, "10% of 1,000");
    budget.set_ratio(0.2).unwrap();
    assert_eq!(
        withdrawals(&budget),
        100,
        "20% of the same 1,000, less the 100 spent"
    );
    budget.set_ratio(0.05).unwrap();
    assert_eq!(withdrawals(&budget), 0, "over the new allowance: refused");
    let counters = budget.counters();
    assert_eq!((counters.requests, counters.retries), (1_000, 200));
    assert_eq!(budget.ratio_value(), Some(0.05));
}

#[tokio::test(start_paused = true)]
async fn a_new_floor_applies_at_once() {
    let budget = RetryBudget::new().min_per_sec(0);
    assert_eq!(withdrawals(&budget), 0);
    budget.set_min_per_sec(2);
    assert_eq!(
        withdrawals(&budget),
        20,
        "2 per second over the 10 s window"
    );
    assert_eq!(budget.min_per_sec_value(), 2);
}

#[test]
fn invalid_changes_are_refused() {
    let budget = RetryBudget::new();
    assert_eq!(
        budget.set_ratio(f64::NAN).unwrap_err().to_string(),
        "a retry budget ratio must be finite and at least 0, got NaN"
    );
    assert!(matches!(
        budget.set_ratio(-0.1),
        Err(BudgetChangeError::InvalidRatio { .. })
    ));
    assert_eq!(
        RetryBudget::unlimited().set_ratio(0.1),
        Err(BudgetChangeError::Unlimited)
    );
    assert_eq!(budget.ratio_value(), Some(0.1), "unchanged");
}

/// A ratio of 0 is a valid change (no retries beyond the floor), not an
/// invalid one: only negative, NaN and infinite ratios are refused.
#[tokio::test(start_paused = true)]
async fn a_ratio_of_zero_is_accepted_and_leaves_only_the_floor() {
    let budget = RetryBudget::new().min_per_sec(1);
    for _ in 0..1_000 {
        budget.deposit();
    }
    budget.set_ratio(0.0).expect("0 is a ratio");
    assert_eq!(budget.ratio_value(), Some(0.0));
    assert_eq!(
        withdrawals(&budget),
        10,
        "the floor: 1 per second over 10 s"
    );
}

/// The fleet's floor is a setting of its own: it reads back as set, and
/// the builder methods that rebuild the budget (ratio, floor, window) keep
/// it.
#[test]
fn the_fleet_floor_reads_back_and_survives_the_other_settings() {
    assert_eq!(
        RetryBudget::new().fleet_floor_value(),
        tower_retry_budget::DEFAULT_FLEET_FLOOR
    );
    let budget = RetryBudget::new()
        .fleet_floor(7)
        .ratio(0.2)
        .min_per_sec(2)
        .window(std::time::Duration::from_secs(5));
    assert_eq!(budget.fleet_floor_value(), 7);
    assert_eq!(RetryBudget::new().fleet_floor(0).fleet_floor_value(), 0);
}
