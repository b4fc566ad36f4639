//! A full compartment refuses at once, without calling the inner service.

mod support;

use support::{request, Gate};
use tokio_test::assert_ready_err;
use tower::{Service, ServiceExt};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::BulkheadLayer;
use tower_layer::Layer;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn beyond_the_limit_calls_fail_at_once_and_never_reach_the_inner_service() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("payments", 3);
    let mut service = layer.layer(gate.service());

    let mut held = Vec::new();
    for _ in 0..3 {
        let mut call = tokio_test::task::spawn(service.ready().await.unwrap().call(request()));
        assert!(call.poll().is_pending());
        held.push(call);
    }
    assert_eq!(gate.current(), 3);

    for _ in 0..5 {
        let mut call = tokio_test::task::spawn(service.ready().await.unwrap().call(request()));
        // Ready on the first poll: no timer, no waiting.
        let err = assert_ready_err!(call.poll());
        let full = err.downcast_ref::<BulkheadFull>().unwrap();
        assert_eq!(full.compartment(), "payments");
        assert_eq!(full.limit(), 3);
        assert!(!full.waited_and_timed_out());
    }
    assert_eq!(gate.calls(), 3);
    let stats = layer.handle().stats();
    assert_eq!(
        (stats.in_flight(), stats.rejected(), stats.available()),
        (3, 5, 0)
    );

    gate.open(1);
    let done = held.remove(0).await.unwrap();
    assert_eq!(done.status(), http::StatusCode::OK);
    assert_eq!(layer.handle().in_flight(), 2);
    let dropped = service.ready().await.unwrap().call(request());
    drop(dropped);
    assert_eq!(
        layer.handle().in_flight(),
        2,
        "a future that is not kept releases at once"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_limit_of_zero_refuses_everything() {
    let gate = Gate::new();
    let service = BulkheadLayer::new("off", 0).layer(gate.service());
    let err = service.oneshot(request()).await.unwrap_err();
    assert!(err.is::<BulkheadFull>());
    assert_eq!(gate.calls(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn freed_slots_are_reused() {
    let gate = Gate::new();
    gate.open_all();
    let layer = BulkheadLayer::new("dep", 1);
    let mut service = layer.layer(gate.service());
    for _ in 0..100 {
        service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
    }
    assert_eq!(layer.handle().rejected(), 0);
    assert_eq!(gate.calls(), 100);
}
