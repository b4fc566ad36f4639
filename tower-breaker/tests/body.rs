//! The outcome of a call is known when its body ends: a body that fails
//! after a good head is a failure, a gRPC status in the trailers counts as
//! the trailers say, a body dropped half read counts as its head said, and
//! a half-open probe lasts until its body ends; with a retry layer below,
//! the last attempt's body is counted once and never retried.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use support::{config, counts, streaming, Scripted, Step};
use tower::{service_fn, Layer, ServiceExt};
use tower_breaker::config::CallEnd;
use tower_breaker::{Breaker, BreakerConfig, BreakerLayer, HttpBreakerLayer, Mode, State};

fn breaker(config: BreakerConfig) -> Breaker {
    Breaker::with_config("dependency", config)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_good_body_counts_one_success_when_it_ends_not_at_the_head() {
    let calls = Arc::new(AtomicUsize::new(0));
    let breaker = breaker(config());
    let svc = BreakerLayer::new(breaker.clone()).layer(streaming(
        vec![Step::Data("a"), Step::Wait(10), Step::Data("b")],
        &calls,
    ));
    let response = svc.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(counts(&breaker), (0, 0, 0), "the head is not the end");
    assert!(response.body().is_pending());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ab");
    assert_eq!(counts(&breaker), (1, 0, 0));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_that_fails_after_a_good_head_counts_as_a_failure() {
    let calls = Arc::new(AtomicUsize::new(0));
    let breaker = breaker(config());
    let svc = BreakerLayer::new(breaker.clone())
        .layer(streaming(vec![Step::Data("a"), Step::Fail], &calls));
    let response = svc.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(response.status(), 200);
    let err = response.into_body().collect().await.unwrap_err();
    assert_eq!(err.to_string(), "connection reset mid-body");
    assert_eq!(counts(&breaker), (0, 1, 0));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_dropped_half_read_counts_as_its_head_said() {
    let calls = Arc::new(AtomicUsize::new(0));
    let breaker = breaker(config());
    let svc = BreakerLayer::new(breaker.clone())
        .layer(streaming(vec![Step::Data("a"), Step::Stall], &calls));
    let response = svc.oneshot(Request::new(String::new())).await.unwrap();
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    assert_eq!(counts(&breaker), (0, 0, 0));
    drop(body);
    assert_eq!(counts(&breaker), (1, 0, 0));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_grpc_status_in_the_trailers_counts_as_the_trailers_say() {
    let calls = Arc::new(AtomicUsize::new(0));
    let breaker = breaker(config());
    for (code, want) in [(14, (0, 1, 0)), (0, (1, 1, 0)), (5, (2, 1, 0))] {
        let svc = BreakerLayer::new(breaker.clone()).layer(streaming(
            vec![Step::Data("message"), Step::GrpcStatus(code)],
            &calls,
        ));
        let request = Request::post("/stock.Stock/Watch")
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap();
        let response = svc.oneshot(request).await.unwrap();
        let collected = response.into_body().collect().await.unwrap();
        assert_eq!(
            collected.trailers().unwrap()["grpc-status"],
            code.to_string().as_str()
        );
        // UNAVAILABLE is a failure; OK, and NOT_FOUND (the caller's), are not.
        assert_eq!(counts(&breaker), want, "grpc-status {code}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_probe_lasts_until_its_body_ends() {
    let calls = Arc::new(AtomicUsize::new(0));
    let breaker = breaker(
        config()
            .count_window(2)
            .minimum_calls(2)
            .open_period(Duration::from_secs(1)),
    );
    let svc = BreakerLayer::new(breaker.clone()).layer(streaming(
        vec![Step::Data("a"), Step::Wait(50), Step::Fail],
        &calls,
    ));
    for _ in 0..2 {
        let response = svc
            .clone()
            .oneshot(Request::new(String::new()))
            .await
            .unwrap();
        let _ = response.into_body().collect().await;
    }
    assert_eq!(breaker.snapshot().state, State::Open);
    tokio::time::advance(Duration::from_secs(1)).await;

    let probe = svc
        .clone()
        .oneshot(Request::new(String::new()))
        .await
        .unwrap();
    let s = breaker.snapshot();
    assert_eq!((s.state, s.probes_in_flight), (State::HalfOpen, 1));
    // Its body is still coming: everyone else is refused meanwhile.
    let refused = svc.clone().oneshot(Request::new(String::new())).await;
    assert!(refused.is_err());
    // The probe's body fails: open again, and the slot is free.
    let _ = probe.into_body().collect().await;
    let s = breaker.snapshot();
    assert_eq!((s.state, s.probes_in_flight), (State::Open, 0));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn slow_call_timing_ends_at_the_body_by_default_and_at_the_head_when_asked() {
    let steps = vec![Step::Data("a"), Step::Wait(200), Step::Data("b")];
    for (end, slow) in [
        (None, 1),
        (Some(CallEnd::Head), 0),
        (Some(CallEnd::Body), 1),
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut config = config().slow_calls(Duration::from_millis(100), 1.0);
        if let Some(end) = end {
            config = config.slow_call_end(end);
        }
        let breaker = breaker(config);
        let svc = BreakerLayer::new(breaker.clone()).layer(streaming(steps.clone(), &calls));
        let response = svc.oneshot(Request::new(String::new())).await.unwrap();
        response.into_body().collect().await.unwrap();
        let s = breaker.snapshot();
        assert_eq!(s.totals.successful, 1);
        assert_eq!(
            s.window.slow, slow,
            "{end:?}: a 200 ms body, a 100 ms threshold"
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_server_flavour_counts_a_streaming_body_that_fails() {
    let calls = Arc::new(AtomicUsize::new(0));
    let breaker = breaker(config());
    let handler = {
        let calls = calls.clone();
        service_fn(move |_req: Request<String>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, std::io::Error>(Response::new(
                    Scripted::new(vec![Step::Data("a"), Step::Fail]).boxed_unsync(),
                ))
            }
        })
    };
    let svc = HttpBreakerLayer::new(breaker.clone()).layer(handler);
    let Ok(response) = svc.oneshot(Request::new(String::new())).await else {
        panic!("the server flavour does not fail");
    };
    assert_eq!(counts(&breaker), (0, 0, 0));
    assert!(response.into_body().collect().await.is_err());
    assert_eq!(counts(&breaker), (0, 1, 0));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_untracked_mode_leaves_nothing_to_settle() {
    let calls = Arc::new(AtomicUsize::new(0));
    let breaker = breaker(config());
    breaker.set_mode(Mode::Disabled);
    let svc = BreakerLayer::new(breaker.clone())
        .layer(streaming(vec![Step::Data("a"), Step::Fail], &calls));
    let response = svc.oneshot(Request::new(String::new())).await.unwrap();
    assert!(!response.body().is_pending());
    let _ = response.into_body().collect().await;
    assert_eq!(counts(&breaker), (0, 0, 0));
}
