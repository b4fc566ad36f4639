//! Readiness is the inner service's only: `poll_ready` forwards it, and
//! no budget is counted or withdrawn for a service made ready and never
//! called (the retry layer and the hedge layer).

mod support;

use std::sync::Arc;

use http::{Request, Response};
use support::{get, status};
use tokio_test::{assert_pending, assert_ready_ok};
use tower::Layer;
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::hedge::{HedgeCounters, HedgeLayer};
use tower_retry_budget::{Counters, RetryBudget, RetryLayer, SeededRandom};
use tower_test::mock;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retry_inner_pending_propagates_and_counts_nothing() {
    let budget = Arc::new(RetryBudget::new());
    let layer = RetryLayer::new()
        .random(SeededRandom::new(5))
        .budget(budget.clone())
        .clone_bodies();
    let (mut svc, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer);
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());
    drop(svc);
    assert_eq!(
        budget.counters(),
        Counters::default(),
        "readiness alone pays nothing"
    );

    // The budget is whole: a call made afterwards counts once.
    let layer = RetryLayer::new()
        .random(SeededRandom::new(5))
        .budget(budget.clone())
        .clone_bodies();
    let (mut svc, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer);
    assert_ready_ok!(svc.poll_ready());
    let mut call = tokio_test::task::spawn(svc.call(get()));
    let (_req, send) = handle.next_request().await.unwrap();
    send.send_response(status(200));
    assert_eq!(assert_ready_ok!(call.poll()).status(), 200);
    assert_eq!(budget.counters().requests, 1);
    assert_eq!(budget.counters().retries, 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn hedge_inner_pending_propagates_and_counts_nothing() {
    let budget = Arc::new(RetryBudget::new());
    let layer = HedgeLayer::new()
        .fixed_delay(std::time::Duration::from_millis(20))
        .budget(budget.clone());
    let (mock, mut handle) = mock::pair::<Request<ReplayBody<String>>, Response<String>>();
    let mut svc = mock::Spawn::new(layer.layer(mock));
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());
    drop(svc);
    assert_eq!(
        budget.counters(),
        Counters::default(),
        "readiness alone pays nothing"
    );
    assert_eq!(layer.counters(), HedgeCounters::default());
    // The service is gone and sent nothing: the channel ends empty.
    assert!(
        tokio_test::assert_ready!(handle.poll_request()).is_none(),
        "nothing was sent"
    );
}
