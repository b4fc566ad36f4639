//! With `max_wait`, a call that finds its compartment full waits in its
//! response future, bounded in time, and is woken in order.

mod support;

use std::time::Duration;

use support::request;
use tokio::time::advance;
use tokio_test::{assert_pending, assert_ready_err, assert_ready_ok};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::{BulkheadLayer, HttpBulkheadLayer};
use tower_test::mock;

const WAIT: Duration = Duration::from_millis(100);
const MS: Duration = Duration::from_millis(1);

type Spawned = tower_test::mock::Spawn<
    tower_bulkhead::Bulkhead<tower_test::mock::Mock<support::Request, &'static str>>,
>;

fn setup() -> (
    BulkheadLayer,
    Spawned,
    mock::Handle<support::Request, &'static str>,
) {
    let layer = BulkheadLayer::new("dep", 1).max_wait(WAIT);
    let (service, handle) = mock::spawn_layer(layer.clone());
    (layer, service, handle)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_slot_freed_just_before_max_wait_goes_to_the_waiting_call() {
    let (layer, mut service, mut handle) = setup();

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let (_, first_reply) = handle.next_request().await.unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut waiting = tokio_test::task::spawn(service.call(request()));
    assert_pending!(waiting.poll());

    advance(WAIT - MS).await;
    assert_pending!(waiting.poll());
    // The inner service has not seen the waiting call yet.
    assert!(handle.poll_request().is_pending());

    first_reply.send_response("first");
    assert_eq!(assert_ready_ok!(first.poll()), "first");
    assert!(waiting.is_woken());
    assert_pending!(waiting.poll());
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response("second");
    assert_eq!(assert_ready_ok!(waiting.poll()), "second");
    assert_eq!(layer.handle().rejected(), 0);
    assert_eq!(layer.handle().in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiting_call_is_refused_just_after_max_wait() {
    let (layer, mut service, mut handle) = setup();

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let _first_reply = handle.next_request().await.unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut waiting = tokio_test::task::spawn(service.call(request()));
    assert_pending!(waiting.poll());

    advance(WAIT - MS).await;
    assert_pending!(waiting.poll());
    advance(2 * MS).await;
    let err = assert_ready_err!(waiting.poll());
    let full = err.downcast_ref::<BulkheadFull>().unwrap();
    assert!(full.waited_and_timed_out());
    assert_eq!(full.waited(), WAIT);
    assert_eq!(layer.handle().rejected(), 1);
    assert_eq!(
        layer.handle().in_flight(),
        1,
        "the first call still holds its slot"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn waiters_are_woken_in_the_order_they_started_waiting() {
    let (_layer, mut service, mut handle) = setup();

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let (_, first_reply) = handle.next_request().await.unwrap();

    let mut waiters: Vec<_> = (0..3)
        .map(|_| {
            assert_ready_ok!(service.poll_ready());
            let mut w = tokio_test::task::spawn(service.call(request()));
            assert_pending!(w.poll());
            w
        })
        .collect();

    first_reply.send_response("0");
    assert_ready_ok!(first.poll());
    for i in 0..3 {
        assert!(waiters[i].is_woken(), "waiter {i} is next");
        for later in &waiters[i + 1..] {
            assert!(!later.is_woken());
        }
        assert_pending!(waiters[i].poll());
        let (_, reply) = handle.next_request().await.unwrap();
        reply.send_response("done");
        assert_ready_ok!(waiters[i].poll());
    }
    drop(waiters);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dropped_waiter_passes_its_turn_on() {
    let (layer, mut service, mut handle) = setup();

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let (_, first_reply) = handle.next_request().await.unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut a = tokio_test::task::spawn(service.call(request()));
    assert_pending!(a.poll());
    assert_ready_ok!(service.poll_ready());
    let mut b = tokio_test::task::spawn(service.call(request()));
    assert_pending!(b.poll());

    drop(a);
    first_reply.send_response("0");
    assert_ready_ok!(first.poll());
    assert!(b.is_woken());
    assert_pending!(b.poll());
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response("b");
    assert_eq!(assert_ready_ok!(b.poll()), "b");
    assert_eq!(layer.handle().in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn http_mode_answers_503_after_waiting_in_vain() {
    let layer = HttpBulkheadLayer::new("dep", 1).max_wait(WAIT);
    let (mut service, mut handle) =
        mock::spawn_layer::<support::Request, http::Response<String>, _>(layer.clone());

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let _first_reply = handle.next_request().await.unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut waiting = tokio_test::task::spawn(service.call(support::grpc_request()));
    assert_pending!(waiting.poll());
    advance(WAIT + MS).await;
    let answer = assert_ready_ok!(waiting.poll());
    assert_eq!(answer.headers()["grpc-status"], "8");
}
