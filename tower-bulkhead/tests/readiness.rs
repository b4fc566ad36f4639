//! `poll_ready` forwards the inner readiness and never takes a slot.

mod support;

use tokio_test::{assert_pending, assert_ready_ok};
use tower_bulkhead::BulkheadLayer;
use tower_test::{assert_request_eq, mock};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn ready_inner_passes_the_call_through() {
    let layer = BulkheadLayer::new("dep", 1);
    let (mut service, mut handle) = mock::spawn_layer::<&str, &str, _>(layer.clone());

    assert_ready_ok!(service.poll_ready());
    let mut response = tokio_test::task::spawn(service.call("hello"));
    assert_eq!(layer.handle().in_flight(), 1);

    assert_request_eq!(handle, "hello").send_response("world");
    assert_eq!(assert_ready_ok!(response.poll()), "world");
    assert_eq!(layer.handle().in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inner_pending_propagates_without_taking_a_slot() {
    let layer = BulkheadLayer::new("dep", 1);
    let (mut service, mut handle) = mock::spawn_layer::<&str, &str, _>(layer.clone());

    handle.allow(0);
    assert_pending!(service.poll_ready());
    assert_eq!(layer.handle().in_flight(), 0);

    handle.allow(1);
    assert!(service.is_woken());
    assert_ready_ok!(service.poll_ready());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn full_compartment_still_reports_ready() {
    // A "reject" design: readiness never reflects the compartment, so a
    // caller (or axum) that polls readiness on many clones never stalls.
    let layer = BulkheadLayer::new("dep", 1);
    let (mut service, _handle) = mock::spawn_layer::<&str, &str, _>(layer.clone());

    assert_ready_ok!(service.poll_ready());
    let _held = service.call("first");
    assert_eq!(layer.handle().in_flight(), 1);

    for _ in 0..3 {
        assert_ready_ok!(service.poll_ready());
    }
    assert_eq!(layer.handle().in_flight(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn poll_ready_alone_never_reserves_capacity() {
    // Many clones made ready but never called must not hold slots: the
    // stall of permit-in-poll_ready designs.
    let layer = BulkheadLayer::new("dep", 2);
    let (mock, mut handle) = mock::pair::<&str, &str>();
    let mut clones: Vec<_> = (0..10)
        .map(|_| mock::Spawn::new(tower_layer::Layer::layer(&layer, mock.clone())))
        .collect();
    for clone in &mut clones {
        assert_ready_ok!(clone.poll_ready());
    }
    assert_eq!(layer.handle().in_flight(), 0);

    let mut response = tokio_test::task::spawn(clones[9].call("late"));
    assert_request_eq!(handle, "late").send_response("ok");
    assert_eq!(assert_ready_ok!(response.poll()), "ok");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_service_made_ready_and_dropped_uncalled_leaves_the_compartment_empty() {
    // One slot. A service made ready (one whose inner service was still
    // pending, one ready) and dropped without a call holds nothing, so the
    // next caller gets the only slot.
    let layer = BulkheadLayer::new("dep", 1);
    let (mut waiting, mut waiting_handle) = mock::spawn_layer::<&str, &str, _>(layer.clone());
    waiting_handle.allow(0);
    assert_pending!(waiting.poll_ready());
    let (mut ready, _ready_handle) = mock::spawn_layer::<&str, &str, _>(layer.clone());
    assert_ready_ok!(ready.poll_ready());
    drop((waiting, ready));
    assert_eq!(layer.handle().in_flight(), 0);
    assert_eq!(layer.handle().rejected(), 0);

    let (mut service, mut handle) = mock::spawn_layer::<&str, &str, _>(layer.clone());
    assert_ready_ok!(service.poll_ready());
    let mut response = tokio_test::task::spawn(service.call("only"));
    assert_eq!(layer.handle().in_flight(), 1);
    assert_request_eq!(handle, "only").send_response("done");
    assert_eq!(assert_ready_ok!(response.poll()), "done");
    assert_eq!(layer.handle().in_flight(), 0);
    assert_eq!(layer.handle().rejected(), 0);
}
