//! Readiness is the inner service's only: `poll_ready` forwards it, and
//! the deadline is taken in `call`, so time spent waiting for readiness
//! is not charged to a request that has not started.

mod support;

use std::time::Duration;

use http::{Request, Response};
use support::request_with;
use tokio::time::advance;
use tokio_test::{assert_pending, assert_ready_ok};
use tower_deadline::{ClientDeadlineLayer, Deadline, ServerDeadlineLayer};
use tower_test::mock;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn client_inner_pending_propagates_and_starts_no_clock() {
    let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<()>, _>(
        ClientDeadlineLayer::new().default_timeout(Duration::from_secs(1)),
    );
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    // Longer than the timeout, while not ready.
    advance(Duration::from_secs(2)).await;
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());

    let mut call = tokio_test::task::spawn(svc.call(Request::new(())));
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(
        req.headers()["x-request-timeout-ms"],
        "1000",
        "the whole timeout, counted from the call"
    );
    advance(Duration::from_millis(999)).await;
    assert_pending!(call.poll());
    send.send_response(Response::new(()));
    assert_ready_ok!(call.poll());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn client_poll_ready_without_a_call_sends_nothing() {
    let layer = ClientDeadlineLayer::new().default_timeout(Duration::from_secs(1));
    let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<()>, _>(layer);
    assert_ready_ok!(svc.poll_ready());
    drop(svc);
    // The service is gone and sent nothing: the channel ends empty.
    assert!(
        tokio_test::assert_ready!(handle.poll_request()).is_none(),
        "no request was sent"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn server_inner_pending_propagates_and_starts_no_clock() {
    let (mut svc, mut handle) =
        mock::spawn_layer::<Request<()>, Response<()>, _>(ServerDeadlineLayer::new());
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    advance(Duration::from_secs(1)).await;
    handle.allow(1);
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());

    let mut call = tokio_test::task::spawn(svc.call(request_with("x-request-timeout-ms", "100")));
    let (req, send) = handle.next_request().await.unwrap();
    let deadline = Deadline::from_extensions(req.extensions()).expect("a deadline");
    assert_eq!(
        deadline.remaining(),
        Duration::from_millis(100),
        "the caller's 100 ms start at the call, not at poll_ready"
    );
    send.send_response(Response::new(()));
    assert_eq!(assert_ready_ok!(call.poll()).status(), 200);
}
