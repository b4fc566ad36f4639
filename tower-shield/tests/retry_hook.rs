//! Every attempt counted: `BreakerLayer` outside `tower_retry_budget`'s
//! `RetryLayer` sees each attempt once, stops the retries the moment the
//! circuit opens, and never counts the final outcome twice.

mod support;

use futures_util::FutureExt;
use support::*;
use tower::{BoxError, Layer, ServiceBuilder};
use tower_breaker::error::CircuitOpen;
use tower_breaker::{Breaker, BreakerLayer, Outcome, State};

/// A breaker tripped by one failure, whose open period has just ended: the
/// next call is its probe.
async fn ready_to_probe() -> Breaker {
    let breaker = counted(1);
    record(&breaker, Outcome::Failure, 1);
    advance(secs(5)).await;
    breaker
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn two_logical_requests_record_six_failures_and_the_third_never_reaches_the_dependency() {
    let breaker = counted(6);
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry())
        .service(answering(&calls, 503));

    let first = send(&client).await.unwrap();
    assert_eq!(first.status(), 503);
    assert_eq!(calls.calls(), 3);
    let s = breaker.snapshot();
    assert_eq!(
        (s.window.calls, s.window.failures),
        (3, 3),
        "three attempts, three records"
    );
    assert_eq!(s.state, State::Closed, "3 calls: below the minimum of 6");

    let second = send(&client).await.unwrap();
    assert_eq!(second.status(), 503);
    let s = breaker.snapshot();
    assert_eq!(s.totals.failed, 6, "six recorded failures, not two");
    assert_eq!(s.state, State::Open);
    assert_eq!(calls.calls(), 6);

    let third = send(&client).await.unwrap_err();
    assert!(third.is::<CircuitOpen>());
    assert_eq!(
        calls.calls(),
        6,
        "the third request never reached the dependency"
    );
    assert_eq!(breaker.snapshot().totals.rejected, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_retry_loop_stops_when_the_circuit_opens_during_it() {
    let breaker = counted(4);
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry())
        .service(failing(&calls));

    assert!(send(&client).await.is_err());
    assert_eq!(calls.calls(), 3);
    // The first attempt of the second request is the 4th failure: the
    // circuit opens, and the retry asks the breaker first, and stops.
    let err = send(&client).await.unwrap_err();
    let open = err
        .downcast_ref::<CircuitOpen>()
        .expect("the breaker's error");
    assert_eq!(open.breaker(), "dependency");
    assert_eq!(calls.calls(), 4, "no retry after the circuit opened");
    let s = breaker.snapshot();
    assert_eq!(s.state, State::Open);
    assert_eq!(s.totals.failed, 4);
    assert_eq!(s.totals.rejected, 1, "the refused retry");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_success_through_the_retry_layer_is_counted_once() {
    let breaker = counted(10);
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry())
        .service(answering(&calls, 200));
    for _ in 0..3 {
        assert_eq!(send(&client).await.unwrap().status(), 200);
    }
    let s = breaker.snapshot();
    assert_eq!(s.window.calls, 3);
    assert_eq!(s.totals.successful, 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_a_retry_layer_each_call_is_counted_once() {
    let breaker = counted(10);
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .service(answering(&calls, 503));
    for _ in 0..4 {
        send(&client).await.unwrap();
    }
    let s = breaker.snapshot();
    assert_eq!((s.window.calls, s.window.failures), (4, 4));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failed_probe_inside_a_retry_loop_stops_it() {
    let breaker = ready_to_probe().await;
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry())
        .service(answering(&calls, 503));
    let err = send(&client).await.unwrap_err();
    assert!(err.is::<CircuitOpen>());
    assert_eq!(
        calls.calls(),
        1,
        "one probe, no retries against a re-opened circuit"
    );
    assert_eq!(breaker.snapshot().state, State::Open);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_successful_retry_of_a_probe_closes() {
    // The probe goes through the retry layer and succeeds at once.
    let breaker = ready_to_probe().await;
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry())
        .service(answering(&calls, 200));
    assert_eq!(send(&client).await.unwrap().status(), 200);
    assert_eq!(breaker.snapshot().state, State::Closed);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_a_hooked_probe_frees_its_slot() {
    let breaker = ready_to_probe().await;
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry())
        .service(tower::service_fn(|_req: http::Request<String>| {
            std::future::pending::<Result<http::Response<String>, BoxError>>()
        }));
    let mut probe = Box::pin(send(&client));
    assert!(probe.as_mut().now_or_never().is_none());
    assert_eq!(breaker.snapshot().probes_in_flight, 1);
    drop(probe);
    assert_eq!(breaker.snapshot().probes_in_flight, 0);
    assert!(breaker.try_acquire().unwrap().is_probe());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_layer_above_the_breaker_does_not_retry_an_open_circuit() {
    // The wrong order (retry outside the breaker) must still not retry
    // against an open circuit: `CircuitOpen` carries the retry crate's
    // `LocalRejection` marker in its source chain.
    let breaker = counted(10);
    breaker.set_mode(tower_breaker::Mode::ForcedOpen);
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(retry())
        .layer(BreakerLayer::new(breaker.clone()))
        .service(answering(&calls, 200));
    let err = send(&client).await.unwrap_err();
    assert!(err.is::<CircuitOpen>(), "returned unchanged: {err}");
    assert!(tower_retry_budget::policy::is_local_rejection(&*err));
    assert_eq!(
        breaker.snapshot().totals.rejected,
        1,
        "one rejection, no retries"
    );
    assert_eq!(calls.calls(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_call_that_trips_the_circuit_returns_at_once_and_pays_only_for_retries_sent() {
    // The window fills on this call's second attempt: 2 failures of 2.
    let breaker = counted(2);
    let calls = CallCounter::default();
    let answered_at = std::sync::Arc::new(std::sync::Mutex::new(None));
    let dependency = tower::service_fn({
        let calls = calls.clone();
        let answered_at = answered_at.clone();
        move |_req: http::Request<String>| {
            calls.hit();
            *answered_at.lock().unwrap() = Some(tokio::time::Instant::now());
            async {
                Err::<http::Response<String>, BoxError>(
                    std::io::Error::from(std::io::ErrorKind::ConnectionReset).into(),
                )
            }
        }
    });
    let retry = retry().max_attempts(5);
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry.clone())
        .service(dependency);

    let err = send(&client).await.unwrap_err();
    assert!(err.is::<CircuitOpen>(), "{err}");
    assert_eq!(calls.calls(), 2);
    assert_eq!(breaker.snapshot().state, State::Open);
    // Regression: the loop used to sleep a backoff before asking the
    // breaker, and to pay the budget for a retry it then did not send.
    assert_eq!(
        Some(tokio::time::Instant::now()),
        *answered_at.lock().unwrap(),
        "no virtual time passed between the tripping attempt and the answer"
    );
    let counters = retry.counters();
    assert_eq!(counters.retries, 1, "one retry sent, one paid for");
    assert_eq!(counters.refunded, 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_refused_by_the_breaker_after_its_backoff_is_refunded() {
    let breaker = counted(10);
    let calls = CallCounter::default();
    let retry = retry();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry.clone())
        .service(failing(&calls));

    let mut call = tokio_test::task::spawn(send(&client));
    tokio_test::assert_pending!(call.poll(), "first attempt failed; backing off");
    assert_eq!(calls.calls(), 1);
    assert_eq!(retry.counters().retries, 1, "the retry is paid for");
    // The circuit opens (by hand) while the call sleeps its backoff.
    breaker.set_mode(tower_breaker::Mode::ForcedOpen);
    advance(secs(2)).await;
    let err = match call.poll() {
        std::task::Poll::Ready(result) => result.unwrap_err(),
        std::task::Poll::Pending => panic!("still waiting after the backoff"),
    };
    assert!(err.is::<CircuitOpen>(), "{err}");
    assert_eq!(calls.calls(), 1, "the retry was not sent");
    let counters = retry.counters();
    assert_eq!(
        (counters.retries, counters.refunded),
        (0, 1),
        "and its payment went back to the budget"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_dropped_during_its_backoff_gives_its_retry_back() {
    let breaker = counted(10);
    let calls = CallCounter::default();
    let retry = retry();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry.clone())
        .service(failing(&calls));

    let mut call = tokio_test::task::spawn(send(&client));
    tokio_test::assert_pending!(call.poll());
    assert_eq!(retry.counters().retries, 1);
    drop(call);
    let counters = retry.counters();
    assert_eq!((counters.retries, counters.refunded), (0, 1));
    assert_eq!(
        breaker.snapshot().totals.failed,
        1,
        "the failed attempt stays counted"
    );
}

/// An HTTP service answering 503, with the do-not-retry mark if `marked`.
fn answering_503(
    calls: &CallCounter,
    marked: bool,
) -> impl tower::Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = BoxError,
    Future = impl Send,
> + Clone
       + Send {
    let calls = calls.clone();
    tower::service_fn(move |_req: http::Request<String>| {
        calls.hit();
        let mut response = http::Response::new(String::new());
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        if marked {
            // The header name the bulkhead (and the breaker) answer with.
            response
                .headers_mut()
                .insert(tower_bulkhead::NO_RETRY_HEADER, "1".parse().unwrap());
        }
        async move { Ok::<_, BoxError>(response) }
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_no_retry_header_is_the_retry_layers() {
    // A 503 without the mark is retried: three attempts.
    let calls = CallCounter::default();
    let plain = retry().layer(answering_503(&calls, false));
    assert_eq!(send(&plain).await.unwrap().status(), 503);
    assert_eq!(calls.calls(), 3, "an unmarked 503 is retried");

    // The same 503 with the header our layers write: one attempt.
    let calls = CallCounter::default();
    let marked = retry().layer(answering_503(&calls, true));
    let response = send(&marked).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(calls.calls(), 1, "a marked 503 is not retried");
    assert_eq!(response.headers()[tower_bulkhead::NO_RETRY_HEADER], "1");

    // And the breaker's own answer (an open circuit, HTTP flavour) is
    // such a marked 503: the retry layer above it asks once.
    let breaker = counted(1);
    record(&breaker, Outcome::Failure, 1);
    assert_eq!(breaker.snapshot().state, State::Open);
    let calls = CallCounter::default();
    let counter = calls.clone();
    let dependency = tower::service_fn(move |_req: http::Request<String>| {
        counter.hit();
        async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
    });
    let client =
        retry().layer(tower_breaker::HttpBreakerLayer::new(breaker.clone()).layer(dependency));
    let response = tower::ServiceExt::oneshot(client, http::Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()[tower_bulkhead::NO_RETRY_HEADER], "1");
    assert_eq!(
        breaker.snapshot().totals.rejected,
        1,
        "asked once, not retried"
    );
    assert_eq!(calls.calls(), 0);
}

/// A dependency for which 404 is transient (it answers 404 while a
/// replica catches up): retried, and a failure.
#[derive(Debug, Clone)]
struct NotFoundIsTransient;

impl tower_resilience_base::classify::Classify for NotFoundIsTransient {
    fn classify_response(
        &self,
        status: http::StatusCode,
        headers: &http::HeaderMap,
    ) -> tower_resilience_base::classify::Class {
        if status == http::StatusCode::NOT_FOUND {
            return tower_resilience_base::classify::Class::Transient {
                reason: "404",
                after: None,
            };
        }
        tower_resilience_base::classify::classify_response(status, headers)
    }
}

impl tower_retry_budget::Policy for NotFoundIsTransient {}

fn retry_404(
) -> tower_retry_budget::RetryLayer<NotFoundIsTransient, tower_retry_budget::body::CloneBody> {
    retry().policy(NotFoundIsTransient)
}

/// One judgement per attempt: with the default classifier, the breaker
/// counts each attempt by the class the retry policy below gave it, so a
/// 404 the policy calls transient is retried and counted as a failure
/// (alone, the breaker's default counts a 404 as a success).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_breaker_counts_each_attempt_by_the_retry_policys_class() {
    let breaker = counted(6);
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry_404())
        .service(answering(&calls, 404));
    assert_eq!(send(&client).await.unwrap().status(), 404);
    assert_eq!(calls.calls(), 3, "the policy retried the 404");
    let s = breaker.snapshot();
    assert_eq!((s.window.calls, s.window.failures), (3, 3));

    // Without the retry layer, the default's own rules: a success.
    let alone = counted(6);
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(alone.clone()))
        .service(answering(&calls, 404));
    send(&client).await.unwrap();
    let s = alone.snapshot();
    assert_eq!((s.window.calls, s.window.failures), (1, 0));
}

/// A breaker with a classifier of its own judges each attempt by its own
/// rules, whatever class the retry layer below gave: here it counts only
/// 418 as a failure, so the retried 404s are successes to it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_breaker_with_its_own_classifier_ignores_the_retry_policys_class() {
    let breaker = counted(6);
    let calls = CallCounter::default();
    let teapots = tower_breaker::classify::classify_fn(
        |result: Result<&http::Response<String>, &(dyn std::error::Error + 'static)>| match result {
            Ok(r) if r.status() == 418 => Outcome::Failure,
            Ok(_) => Outcome::Success,
            Err(_) => Outcome::Failure,
        },
    );
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()).classifier(teapots))
        .layer(retry_404())
        .service(answering(&calls, 404));
    send(&client).await.unwrap();
    assert_eq!(calls.calls(), 3);
    let s = breaker.snapshot();
    assert_eq!((s.window.calls, s.window.failures), (3, 0));
}

/// One classifier for both layers: `by_class` makes the retry policy the
/// breaker's classifier too, alone or stacked.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn by_class_shares_the_retry_policy_with_the_breaker() {
    let breaker = counted(2);
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(
            BreakerLayer::new(breaker.clone())
                .classifier(tower_breaker::classify::by_class(NotFoundIsTransient)),
        )
        .service(answering(&calls, 404));
    send(&client).await.unwrap();
    send(&client).await.unwrap();
    assert_eq!(breaker.snapshot().state, State::Open, "two 404s: failures");
    assert!(send(&client).await.unwrap_err().is::<CircuitOpen>());
    assert_eq!(calls.calls(), 2);
}

/// Attempts reported through the hook from far more threads than the
/// breaker has stripes of counters: each thread's reports land in a
/// stripe, wrapping around, and every attempt is counted.
#[test]
fn attempts_reported_from_more_threads_than_stripes_are_all_counted() {
    const THREADS: usize = 100;
    let breaker = counted(1000);
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(retry())
        .service(answering(&calls, 200));
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                let answer = runtime.block_on(send(&client)).unwrap();
                assert_eq!(answer.status(), 200);
            });
        }
    });
    assert_eq!(calls.calls(), THREADS);
    let s = breaker.snapshot();
    assert_eq!(s.totals.successful, THREADS as u64);
    assert_eq!(s.window.calls, THREADS as u64);
}
