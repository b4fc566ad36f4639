//! What is retried: statuses, Retry-After, gRPC pushback, errors, and a
//! replaceable policy.

mod support;

use std::io;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use support::{gaps, get, status, status_with, Log, Scripted, MS};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_retry_budget::error::{AttemptsExhausted, BudgetExhausted};
use tower_retry_budget::{
    policy, Class, Classify, GaveUp, Policy, RetryBudget, RetryLayer, SeededRandom, StopReason,
    NO_RETRY_HEADER,
};

fn layer() -> RetryLayer {
    RetryLayer::new().random(SeededRandom::new(17))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn gateway_errors_are_retried() {
    for code in [502, 503, 504] {
        let log = Log::new();
        let svc = layer().layer(Scripted::fails_then_ok(&log, code, 2));
        let response = svc.oneshot(get()).await.unwrap();
        assert_eq!(response.status(), 200, "{code}");
        assert_eq!(log.count(), 3, "{code}");
        assert!(response.extensions().get::<GaveUp>().is_none());
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn other_client_and_server_errors_are_not_retried() {
    for code in [400, 401, 403, 404, 409, 422, 429, 500, 501] {
        let log = Log::new();
        let svc = layer().layer(Scripted::always(&log, code));
        let response = svc.oneshot(get()).await.unwrap();
        assert_eq!(response.status(), code);
        assert_eq!(log.count(), 1, "{code} must not be retried");
        let gave_up = response.extensions().get::<GaveUp>().unwrap();
        assert_eq!(gave_up.reason(), StopReason::NotRetryable);
        assert!(!response.headers().contains_key(NO_RETRY_HEADER));
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retry_after_delta_seconds_is_obeyed() {
    for code in [429, 503] {
        let log = Log::new();
        let svc = layer().layer(Scripted::new(&log, move |i| {
            Ok(if i == 0 {
                status_with(code, "retry-after", "2")
            } else {
                status(200)
            })
        }));
        let response = svc.oneshot(get()).await.unwrap();
        assert_eq!(response.status(), 200);
        // The server's delay wins over the (shorter) jittered one.
        assert_eq!(gaps(&log.times()), [Duration::from_secs(2)], "{code}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retry_after_http_date_is_obeyed() {
    let log = Log::new();
    let svc = layer().layer(Scripted::new(&log, |i| {
        if i > 0 {
            return Ok(status(200));
        }
        let at = SystemTime::now() + Duration::from_secs(3);
        Ok(status_with(
            503,
            "retry-after",
            &httpdate::fmt_http_date(at),
        ))
    }));
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    let gap = gaps(&log.times())[0];
    // HTTP dates have whole seconds: between 2 and 3 seconds from now.
    assert!(
        gap >= Duration::from_secs(2) && gap <= Duration::from_secs(3) + MS,
        "{gap:?}"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retry_after_longer_than_allowed_is_not_retried() {
    let log = Log::new();
    let svc = layer()
        .max_server_delay(Duration::from_secs(5))
        .layer(Scripted::new(&log, |_| {
            Ok(status_with(503, "retry-after", "60"))
        }));
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(log.count(), 1);
    assert_eq!(
        response.extensions().get::<GaveUp>().unwrap().reason(),
        StopReason::NotRetryable
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grpc_pushback_is_obeyed_and_negative_means_never() {
    // Positive pushback on a 503: wait that long.
    let log = Log::new();
    let svc = layer().layer(Scripted::new(&log, |i| {
        Ok(if i == 0 {
            status_with(503, "grpc-retry-pushback-ms", "700")
        } else {
            status(200)
        })
    }));
    assert_eq!(svc.oneshot(get()).await.unwrap().status(), 200);
    assert_eq!(gaps(&log.times()), [Duration::from_millis(700)]);

    // A trailers-only gRPC UNAVAILABLE with pushback.
    let log = Log::new();
    let svc = layer().layer(Scripted::new(&log, |i| {
        if i > 0 {
            return Ok(status(200));
        }
        let mut r = status_with(200, "grpc-status", "14");
        r.headers_mut()
            .insert("grpc-retry-pushback-ms", "300".parse().unwrap());
        Ok(r)
    }));
    assert_eq!(svc.oneshot(get()).await.unwrap().status(), 200);
    assert_eq!(gaps(&log.times()), [Duration::from_millis(300)]);

    // Negative pushback: never retried, even on a retryable status.
    for value in ["-1", "soon"] {
        let log = Log::new();
        let svc = layer().layer(Scripted::new(&log, move |_| {
            Ok(status_with(503, "grpc-retry-pushback-ms", value))
        }));
        let response = svc.oneshot(get()).await.unwrap();
        assert_eq!(log.count(), 1, "{value}");
        assert_eq!(
            response.extensions().get::<GaveUp>().unwrap().reason(),
            StopReason::NotRetryable
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn transport_errors_are_retried_and_wrapped_when_attempts_run_out() {
    let log = Log::new();
    let svc = layer().layer(Scripted::new(&log, |_| {
        Err(io::Error::from(io::ErrorKind::ConnectionRefused).into())
    }));
    let err = svc.oneshot(get()).await.unwrap_err();
    assert_eq!(log.count(), 3);
    let exhausted = err
        .downcast_ref::<AttemptsExhausted>()
        .expect("AttemptsExhausted");
    assert_eq!(exhausted.attempts(), 3);
    let source = std::error::Error::source(exhausted).unwrap();
    assert_eq!(
        source.downcast_ref::<io::Error>().unwrap().kind(),
        io::ErrorKind::ConnectionRefused
    );
    assert_eq!(
        err.to_string(),
        "retries exhausted after 3 attempts: connection refused"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn budget_refusal_is_named_for_responses_and_errors() {
    let empty = || std::sync::Arc::new(RetryBudget::new().ratio(0.0).min_per_sec(0));
    let log = Log::new();
    let svc = layer().budget(empty()).layer(Scripted::always(&log, 503));
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(log.count(), 1);
    assert_eq!(
        response.extensions().get::<GaveUp>().unwrap().reason(),
        StopReason::Budget
    );
    assert_eq!(response.headers()[NO_RETRY_HEADER], "1");

    let svc = layer().budget(empty()).layer(Scripted::new(&log, |_| {
        Err(io::Error::from(io::ErrorKind::TimedOut).into())
    }));
    let err = svc.oneshot(get()).await.unwrap_err();
    assert_eq!(err.downcast_ref::<BudgetExhausted>().unwrap().attempts(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn our_own_errors_are_never_retried_by_a_tier_above() {
    let log = Log::new();
    let svc = ServiceBuilder::new()
        .layer(layer())
        .layer(layer())
        .service(Scripted::new(&log, |_| {
            Err(io::Error::from(io::ErrorKind::ConnectionReset).into())
        }));
    let err = svc.oneshot(get()).await.unwrap_err();
    // Three attempts below, none repeated above.
    assert_eq!(log.count(), 3);
    assert!(err.is::<AttemptsExhausted>());
}

/// A dependency that hangs (records the call, then never answers in time).
fn hanging(
    log: &std::sync::Arc<Log>,
) -> impl tower::Service<
    http::Request<tower_retry_budget::body::ReplayBody<String>>,
    Response = http::Response<String>,
    Error = tower::BoxError,
    Future: Send,
> + Clone {
    let log = log.clone();
    tower::service_fn(
        move |req: http::Request<tower_retry_budget::body::ReplayBody<String>>| {
            let log = log.clone();
            async move {
                let _ = Scripted::always(&log, 200).oneshot(req).await;
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok::<_, tower::BoxError>(status(200))
            }
        },
    )
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_callers_expired_deadline_is_never_retried() {
    use tower_deadline::error::DeadlineExceeded;
    use tower_deadline::{ClientDeadlineLayer, Deadline};

    let log = Log::new();
    let svc = ServiceBuilder::new()
        .layer(layer())
        .layer(ClientDeadlineLayer::new())
        .service(hanging(&log));
    // The whole call's deadline, known to the retry layer through the
    // task-local scope, is what passes: the caller's budget is spent.
    let err = Deadline::after(Duration::from_millis(100))
        .scope(svc.oneshot(get()))
        .await
        .unwrap_err();
    assert_eq!(log.count(), 1);
    assert!(err.is::<DeadlineExceeded>(), "{err}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_per_attempt_timeout_below_the_layer_is_retried() {
    use tower_deadline::error::DeadlineExceeded;
    use tower_deadline::{ClientDeadlineLayer, Deadline};

    // Regression: a per-attempt `ClientDeadlineLayer` with a shorter timeout
    // than the call's deadline used to count as "the caller's deadline
    // passed" and was never retried.
    let log = Log::new();
    let svc = ServiceBuilder::new()
        .layer(layer())
        .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_millis(100)))
        .service(hanging(&log));
    let err = Deadline::after(Duration::from_secs(5))
        .scope(svc.clone().oneshot(get()))
        .await
        .unwrap_err();
    assert_eq!(log.count(), 3, "every attempt timed out and was retried");
    let exhausted = err
        .downcast_ref::<AttemptsExhausted>()
        .expect("attempts ran out");
    assert!(std::error::Error::source(exhausted).is_some_and(|e| e.is::<DeadlineExceeded>()));

    // Without any call deadline the per-attempt timeout is retried too.
    let log = Log::new();
    let svc = ServiceBuilder::new()
        .layer(layer())
        .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_millis(100)))
        .service(hanging(&log));
    let err = svc.oneshot(get()).await.unwrap_err();
    assert_eq!(log.count(), 3);
    assert!(err.is::<AttemptsExhausted>(), "{err}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn bulkhead_rejections_are_never_retried() {
    use tower_bulkhead::error::BulkheadFull;
    use tower_bulkhead::BulkheadLayer;

    // A full compartment (limit 0) below the retry layer: the rejection is
    // local overload, and retrying it would only add load.
    let log = Log::new();
    let bulkhead = BulkheadLayer::new("payments", 0);
    let stats = bulkhead.handle();
    let svc = ServiceBuilder::new()
        .layer(layer())
        .layer(bulkhead)
        .service(Scripted::always(&log, 200));
    let err = svc.oneshot(get()).await.unwrap_err();
    assert!(err.is::<BulkheadFull>(), "{err}");
    assert_eq!(stats.rejected(), 1, "the rejection must not be retried");
    assert_eq!(log.count(), 0);
}

#[derive(Debug, Clone)]
struct AlsoRetry500;

impl Policy for AlsoRetry500 {}

impl Classify for AlsoRetry500 {
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Class {
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            return Class::Transient {
                reason: "500",
                after: None,
            };
        }
        policy::classify_response(status, headers)
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_policy_is_replaceable() {
    let log = Log::new();
    let svc = layer()
        .policy(AlsoRetry500)
        .layer(Scripted::fails_then_ok(&log, 500, 1));
    assert_eq!(svc.oneshot(get()).await.unwrap().status(), 200);
    assert_eq!(log.count(), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn gave_up_after_attempts_marks_the_response() {
    let log = Log::new();
    let svc = layer().layer(Scripted::always(&log, 503));
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(log.count(), 3);
    let gave_up = response.extensions().get::<GaveUp>().unwrap();
    assert_eq!(
        (gave_up.reason(), gave_up.attempts()),
        (StopReason::Attempts, 3)
    );
    assert_eq!(response.headers()[NO_RETRY_HEADER], "1");
}
