//! A retry or a hedge that a layer below refuses without calling the
//! dependency (a full bulkhead, a throttle) costs the budget nothing: the payment is
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

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hedge_refused_by_the_bulkhead_below_is_refunded() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::Duration;
    use tower_retry_budget::body::ReplayBody;
    use tower_retry_budget::hedge::HedgeLayer;

    let budget = Arc::new(RetryBudget::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    // The first attempt answers after 100 ms; the hedge, sent at 20 ms,
    // finds the bulkhead below full.
    let inner = tower::service_fn(move |_: http::Request<ReplayBody<String>>| {
        let n = counted.fetch_add(1, SeqCst);
        async move {
            if n == 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(http::Response::new(String::new()))
            } else {
                Err::<_, tower::BoxError>(BulkheadFull::new("dependency", 4, None).into())
            }
        }
    });
    let layer = HedgeLayer::new()
        .fixed_delay(Duration::from_millis(20))
        .budget(Arc::clone(&budget));
    let response = layer.layer(inner).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(calls.load(SeqCst), 2, "the first attempt and the hedge");
    let c = budget.counters();
    assert_eq!((c.retries, c.refunded), (0, 1), "{c:?}");
}
