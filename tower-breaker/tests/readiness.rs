//! Readiness is the inner service's only: `poll_ready` forwards it (a
//! "reject" design), takes no probe slot, and never waits on the circuit.

mod support;

use http::{Request, Response};
use support::*;
use tokio_test::{assert_pending, assert_ready_ok};
use tower_breaker::error::CircuitOpen;
use tower_breaker::{BreakerLayer, Outcome, State};
use tower_test::mock;

type Mock = (
    mock::Spawn<tower_breaker::CircuitBreaker<mock::Mock<Request<String>, Response<String>>>>,
    mock::Handle<Request<String>, Response<String>>,
);

fn spawn(breaker: &tower_breaker::Breaker) -> Mock {
    mock::spawn_layer(BreakerLayer::new(breaker.clone()))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn ready_inner_passes_the_call_through() {
    let breaker = counted(4);
    let (mut svc, mut handle) = spawn(&breaker);
    assert_ready_ok!(svc.poll_ready());
    let mut call = tokio_test::task::spawn(svc.call(Request::new("hi".to_owned())));
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.body(), "hi");
    send.send_response(Response::new("ok".to_owned()));
    assert_eq!(assert_ready_ok!(call.poll()).body().get_ref(), "ok");
    assert_eq!(breaker.snapshot().totals.successful, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inner_pending_propagates() {
    let breaker = counted(4);
    let (mut svc, mut handle) = spawn(&breaker);
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());
    let s = breaker.snapshot();
    assert_eq!(s.window.calls, 0, "readiness records nothing");
    assert_eq!(s.totals.rejected, 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_open_circuit_is_ready_and_rejects_in_call() {
    let breaker = counted(1);
    record(&breaker, Outcome::Failure, 1);
    let (mut svc, mut handle) = spawn(&breaker);
    assert_ready_ok!(svc.poll_ready(), "never Pending while open");
    let err = svc.call(Request::new(String::new())).await.unwrap_err();
    assert!(err.is::<CircuitOpen>());
    assert_eq!(breaker.snapshot().totals.rejected, 1);
    handle.allow(1);
    assert_pending!(handle.poll_request(), "the inner service was not called");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn poll_ready_without_a_call_holds_no_probe_slot() {
    // One probe allowed, due now. Services made ready (one of them while
    // its inner service was still pending) and dropped without a call
    // must not hold that probe: the next caller is the probe.
    let breaker = counted(1);
    record(&breaker, Outcome::Failure, 1);
    advance(secs(5)).await;
    assert_eq!(breaker.snapshot().retry_after, Some(secs(0)));

    let (mut pending, mut pending_handle) = spawn(&breaker);
    pending_handle.allow(0);
    assert_pending!(pending.poll_ready());
    for _ in 0..3 {
        let (mut ready, _handle) = spawn(&breaker);
        assert_ready_ok!(ready.poll_ready());
    }
    drop(pending);
    let s = breaker.snapshot();
    assert_eq!(s.state, State::Open, "readiness moved nothing");
    assert_eq!(s.retry_after, Some(secs(0)), "the probe is still free");

    let (mut svc, mut handle) = spawn(&breaker);
    assert_ready_ok!(svc.poll_ready());
    let mut probe = tokio_test::task::spawn(svc.call(Request::new(String::new())));
    let (_req, send) = handle.next_request().await.unwrap();
    assert_eq!(breaker.snapshot().state, State::HalfOpen);

    // The slot is the probe's now: a second caller is refused.
    let (mut other, _other_handle) = spawn(&breaker);
    assert_ready_ok!(other.poll_ready());
    let err = other.call(Request::new(String::new())).await.unwrap_err();
    assert!(err.is::<CircuitOpen>());

    send.send_response(Response::new(String::new()));
    assert_ready_ok!(probe.poll());
    assert_eq!(breaker.snapshot().state, State::Closed);
}
