//! A retry that a layer below refuses without calling the dependency (a
//! full bulkhead, a throttle) costs the budget nothing: the payment is
//! given back, as for a retry the hook refuses or the caller drops during
//! the backoff. Found by the network simulation (`sim/`, seed 22): the
//! budget counted retries that never left the process.

mod support;

use std::sync::Arc;

use support::{get, status, Log, Scripted};
use tower::{Layer, ServiceExt};
use tower_resilience_base::error::{BulkheadFull, Throttled};
use tower_retry_budget::{RetryBudget, RetryLayer, SeededRandom};

fn layer(budget: &Arc<RetryBudget>) -> RetryLayer {
    RetryLayer::new()
        .random(SeededRandom::new(5))
        .max_attempts(3)
        .budget(Arc::clone(budget))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_refused_by_the_bulkhead_below_is_refunded() {
    let budget = Arc::new(RetryBudget::new());
    let log = Log::new();
    // A 503 (retried), then the bulkhead below is full for every retry.
    let inner = Scripted::new(&log, |n| match n {
        0 => Ok(status(503)),
        _ => Err(BulkheadFull::new("dependency", 4, None).into()),
    });
    let err = layer(&budget)
        .layer(inner)
        .oneshot(get())
        .await
        .unwrap_err();
    assert!(
        tower_resilience_base::error::find::<BulkheadFull>(&*err).is_some(),
        "{err:?}"
    );
    let c = budget.counters();
    assert_eq!(log.count(), 2, "the first attempt and one refused retry");
    assert_eq!((c.requests, c.retries, c.refunded), (1, 0, 1));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_sent_retry_stays_paid_and_only_the_refused_one_is_refunded() {
    let budget = Arc::new(RetryBudget::new());
    let log = Log::new();
    // 503, a retry the dependency answers 503, then a throttled retry.
    let inner = Scripted::new(&log, |n| match n {
        0 | 1 => Ok(status(503)),
        _ => Err(Throttled::new("dependency", 0.5).into()),
    });
    let _ = layer(&budget).layer(inner).oneshot(get()).await;
    let c = budget.counters();
    assert_eq!(log.count(), 3);
    assert_eq!((c.requests, c.retries, c.refunded), (1, 1, 1));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_first_attempt_refused_below_refunds_nothing() {
    let budget = Arc::new(RetryBudget::new());
    let log = Log::new();
    let inner = Scripted::new(&log, |_| {
        Err(BulkheadFull::new("dependency", 4, None).into())
    });
    let _ = layer(&budget).layer(inner).oneshot(get()).await;
    let c = budget.counters();
    assert_eq!((c.requests, c.retries, c.refunded), (1, 0, 0));
}
