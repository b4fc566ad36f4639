//! What counts: 5xx and errors fail, 4xx succeed, bulkhead rejections and
//! cancellations are not counted, classifiers are replaceable.

mod support;

use std::error::Error;
use std::sync::Arc;

use futures_util::FutureExt;
use support::*;
use tower::{service_fn, BoxError, Layer};
use tower_breaker::classify::classify_fn;
use tower_breaker::random::RandomSource;
use tower_breaker::snapshot::Listener;
use tower_breaker::store::Store;
use tower_breaker::{
    classify, Breaker, BreakerLayer, Classify, DefaultClassifier, Outcome, PlainBreakerLayer, State,
};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn client_errors_never_open_the_circuit() {
    let b = breaker(4);
    let calls = CallCounter::default();
    let svc = BreakerLayer::new(b.clone()).layer(answering(&calls, 404));
    for _ in 0..100 {
        assert_eq!(send(&svc).await.unwrap().status(), 404);
    }
    let s = b.snapshot();
    assert_eq!(s.state, State::Closed);
    assert_eq!(s.totals.successful, 100);
    for status in [400, 401, 403, 409, 422, 429] {
        let svc = BreakerLayer::new(b.clone()).layer(answering(&calls, status));
        send(&svc).await.unwrap();
    }
    assert_eq!(b.snapshot().window.failures, 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn server_errors_and_transport_errors_open_the_circuit() {
    let b = breaker(4);
    let calls = CallCounter::default();
    let svc = BreakerLayer::new(b.clone()).layer(answering(&calls, 500));
    for _ in 0..2 {
        send(&svc).await.unwrap();
    }
    let svc = BreakerLayer::new(b.clone()).layer(failing(&calls));
    for _ in 0..2 {
        assert!(send(&svc).await.is_err());
    }
    assert_eq!(state(&b), State::Open);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_cancelled_call_is_not_counted() {
    let b = breaker(1);
    let svc = BreakerLayer::new(b.clone()).layer(service_fn(|_req: http::Request<String>| {
        std::future::pending::<Result<http::Response<String>, BoxError>>()
    }));
    for _ in 0..5 {
        let mut call = Box::pin(send(&svc));
        assert!(call.as_mut().now_or_never().is_none());
    }
    let s = b.snapshot();
    assert_eq!(s.window.calls, 0);
    assert_eq!(s.totals.ignored, 5);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grpc_unavailable_in_the_headers_is_a_failure() {
    let ok = http::Response::builder()
        .header("grpc-status", "0")
        .body(())
        .unwrap();
    let unavailable = http::Response::builder()
        .header("grpc-status", "14")
        .body(())
        .unwrap();
    let not_found = http::Response::builder()
        .header("grpc-status", "5")
        .body(())
        .unwrap();
    assert_eq!(DefaultClassifier.classify_response(&ok), Outcome::Success);
    assert_eq!(
        DefaultClassifier.classify_response(&unavailable),
        Outcome::Failure
    );
    assert_eq!(
        DefaultClassifier.classify_response(&not_found),
        Outcome::Success
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_classifier_is_replaceable() {
    let b = breaker(2);
    let calls = CallCounter::default();
    let strict = classify_fn(
        |r: Result<&http::Response<String>, &(dyn Error + 'static)>| match r {
            Ok(r) if r.status() == 429 => Outcome::Failure,
            Ok(r) => DefaultClassifier.classify_response(r),
            Err(e) => classify::classify_error(e),
        },
    );
    let svc = BreakerLayer::new(b.clone())
        .classifier(strict)
        .layer(answering(&calls, 429));
    send(&svc).await.unwrap();
    send(&svc).await.unwrap();
    assert_eq!(state(&b), State::Open);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_plain_flavour_works_with_any_request() {
    let b = breaker(2);
    let svc = PlainBreakerLayer::new(b.clone()).layer(service_fn(|n: u32| async move {
        if n == 0 {
            Err::<u32, BoxError>("zero".into())
        } else {
            Ok(n)
        }
    }));
    use tower::ServiceExt;
    assert_eq!(svc.clone().oneshot(7).await.unwrap(), 7);
    assert!(svc.clone().oneshot(0).await.is_err());
    assert!(svc.clone().oneshot(0).await.is_err());
    assert_eq!(state(&b), State::Open);
    let err = svc.clone().oneshot(7).await.unwrap_err();
    assert!(err.is::<tower_breaker::error::CircuitOpen>());
}

/// Compile-only: the public policy traits are object safe.
#[allow(dead_code)]
fn object_safety(
    _: Box<dyn Classify<http::Response<()>>>,
    _: Arc<dyn Store>,
    _: Arc<dyn Listener>,
    _: Arc<dyn RandomSource>,
) {
    let _ = Breaker::new("x");
}
