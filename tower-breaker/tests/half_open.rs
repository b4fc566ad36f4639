//! Half-open: bounded probes, dropped probes free their slot, stale
//! outcomes are discarded.

mod support;

use std::time::Duration;

use futures_util::FutureExt;
use http::Request;
use support::*;
use tokio::sync::oneshot;
use tower::{service_fn, BoxError, Layer, Service};
use tower_breaker::{Breaker, BreakerLayer, Outcome, State};

/// A dependency whose calls wait for a signal and then answer `status`.
fn gated(
    calls: &CallCounter,
) -> (
    impl Service<
            Request<String>,
            Response = http::Response<String>,
            Error = BoxError,
            Future = impl Send,
        > + Clone
        + Send,
    tokio::sync::mpsc::UnboundedReceiver<oneshot::Sender<u16>>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let calls = calls.clone();
    let svc = service_fn(move |_req: Request<String>| {
        calls.hit();
        let (answer, wait) = oneshot::channel::<u16>();
        tx.send(answer).unwrap();
        async move {
            let status = wait.await.unwrap_or(599);
            let mut r = http::Response::new(String::new());
            *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
            Ok::<_, BoxError>(r)
        }
    });
    (svc, rx)
}

fn tripped(window: usize) -> Breaker {
    let b = breaker(window);
    record(&b, Outcome::Failure, window);
    assert_eq!(state(&b), State::Open);
    b
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn only_permitted_probes_pass_and_the_rest_fail_fast() {
    for permitted in [1, 3] {
        let b = Breaker::with_config(
            "t",
            config()
                .count_window(1)
                .minimum_calls(1)
                .permitted_probes(permitted),
        );
        record(&b, Outcome::Failure, 1);
        advance(secs(5)).await;
        let calls = CallCounter::default();
        let (dep, _answers) = gated(&calls);
        let svc = BreakerLayer::new(b.clone()).layer(dep);
        let mut pending = Vec::new();
        for _ in 0..10 {
            let mut f = Box::pin(send(&svc));
            if f.as_mut().now_or_never().is_none() {
                pending.push(f);
            }
        }
        assert_eq!(pending.len(), permitted as usize);
        assert_eq!(calls.calls(), permitted as usize);
        assert_eq!(b.snapshot().probes_in_flight, permitted);
        assert_eq!(b.snapshot().totals.rejected, 10 - u64::from(permitted));
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dropped_probe_frees_its_slot() {
    let b = tripped(1);
    advance(secs(5)).await;
    let calls = CallCounter::default();
    let (dep, _answers) = gated(&calls);
    let svc = BreakerLayer::new(b.clone()).layer(dep);

    let mut probe = Box::pin(send(&svc));
    assert!(probe.as_mut().now_or_never().is_none());
    assert!(
        send(&svc).now_or_never().unwrap().is_err(),
        "the slot is taken"
    );
    drop(probe);
    assert_eq!(b.snapshot().probes_in_flight, 0);
    let mut second = Box::pin(send(&svc));
    assert!(
        second.as_mut().now_or_never().is_none(),
        "the next call probes"
    );
    assert_eq!(calls.calls(), 2);
    assert_eq!(state(&b), State::HalfOpen);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dropped_probe_permit_frees_its_slot() {
    let b = tripped(1);
    advance(secs(5)).await;
    let p = b.try_acquire().unwrap();
    assert!(b.try_acquire().is_err());
    drop(p);
    assert!(b.try_acquire().unwrap().is_probe());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failed_probe_reopens_and_rejects_without_calling() {
    let b = tripped(1);
    advance(secs(5)).await;
    let calls = CallCounter::default();
    let svc = BreakerLayer::new(b.clone()).layer(answering(&calls, 503));
    let response = send(&svc).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(state(&b), State::Open);
    let err = send(&svc).await.unwrap_err();
    let open = err
        .downcast_ref::<tower_breaker::error::CircuitOpen>()
        .unwrap();
    assert_eq!(open.retry_after(), secs(10));
    assert_eq!(
        calls.calls(),
        1,
        "the rejected call never reached the dependency"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_stale_failure_does_not_count_against_the_new_window() {
    // A slow call admitted while closed...
    let b = breaker(2);
    let slow = b.try_acquire().unwrap();
    // ...the circuit opens and closes again meanwhile...
    record(&b, Outcome::Failure, 2);
    assert_eq!(state(&b), State::Open);
    advance(secs(5)).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    assert_eq!(state(&b), State::Closed);
    record(&b, Outcome::Failure, 1);
    // ...then completes with a failure: with it the new window would hold
    // 2 failures of 2 and open.
    slow.record(Outcome::Failure);
    let s = b.snapshot();
    assert_eq!(s.state, State::Closed);
    assert_eq!((s.window.calls, s.window.failures), (1, 1));
    assert_eq!(s.totals.stale, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_stale_failure_through_the_service_is_discarded() {
    let b = breaker(2);
    let calls = CallCounter::default();
    let (dep, mut answers) = gated(&calls);
    let svc = BreakerLayer::new(b.clone()).layer(dep);
    let slow = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc).await }
    });
    tokio::task::yield_now().await;
    let slow_answer = answers.recv().await.unwrap();

    record(&b, Outcome::Failure, 2);
    advance(secs(5)).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    record(&b, Outcome::Failure, 1);

    slow_answer.send(500).unwrap();
    assert_eq!(slow.await.unwrap().unwrap().status(), 500);
    assert_eq!(state(&b), State::Closed);
    assert_eq!(b.snapshot().window.failures, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_probe_that_never_completes_cannot_wedge_the_breaker() {
    let b = tripped(1);
    advance(secs(5)).await;
    let calls = CallCounter::default();
    let (dep, _answers) = gated(&calls);
    let svc = BreakerLayer::new(b.clone()).layer(dep);
    let mut hung = Box::pin(send(&svc));
    assert!(hung.as_mut().now_or_never().is_none());
    advance(tower_breaker::config::DEFAULT_MAX_HALF_OPEN_WAIT).await;
    assert!(send(&svc).now_or_never().unwrap().is_err());
    assert_eq!(state(&b), State::Open);
    advance(secs(10)).await;
    let mut next = Box::pin(send(&svc));
    assert!(
        next.as_mut().now_or_never().is_none(),
        "a new probe goes through"
    );
    assert_eq!(calls.calls(), 2);
    let _ = Duration::ZERO;
}
