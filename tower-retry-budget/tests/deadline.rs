//! Deadline awareness: never sleep past the deadline, never start an
//! attempt without the minimum slice, and say so.

mod support;

use std::io;
use std::time::Duration;

use http::Request;
use support::{get, status, Log, Scripted, MS};
use tokio::time::Instant;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_deadline::Deadline;
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::error::DeadlineTooClose;
use tower_retry_budget::{Backoff, GaveUp, RetryLayer, SeededRandom, StopReason, NO_RETRY_HEADER};

/// Always exactly 200 ms: decorrelated jitter with base = cap.
const BACKOFF_200: Backoff =
    Backoff::decorrelated(Duration::from_millis(200), Duration::from_millis(200));

fn layer() -> RetryLayer {
    RetryLayer::new()
        .backoff(BACKOFF_200)
        .random(SeededRandom::new(41))
}

fn with_deadline(budget: Duration) -> Request<String> {
    let mut request = get();
    request.extensions_mut().insert(Deadline::after(budget));
    request
}

/// A dependency that takes `latency` to answer 503.
fn slow_503(
    log: &std::sync::Arc<Log>,
    latency: Duration,
) -> impl tower::Service<
    Request<ReplayBody<String>>,
    Response = http::Response<String>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    let log = log.clone();
    service_fn(move |req: Request<ReplayBody<String>>| {
        let log = log.clone();
        async move {
            let _ = Scripted::always(&log, 503).oneshot(req).await;
            tokio::time::sleep(latency).await;
            Ok::<_, BoxError>(status(503))
        }
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_200ms_backoff_never_sleeps_past_a_250ms_deadline() {
    let log = Log::new();
    let svc = layer().layer(slow_503(&log, Duration::from_millis(100)));
    let start = Instant::now();
    let response = svc
        .oneshot(with_deadline(Duration::from_millis(250)))
        .await
        .unwrap();
    // Failed at 100 ms; a retry at 300 ms would be past the deadline, so
    // the layer answers at once instead of sleeping.
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(log.count(), 1);
    let gave_up = response.extensions().get::<GaveUp>().unwrap();
    assert_eq!(
        (gave_up.reason(), gave_up.attempts()),
        (StopReason::Deadline, 1)
    );
    assert_eq!(response.headers()[NO_RETRY_HEADER], "1");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_that_fits_is_made_and_the_next_one_is_not() {
    let log = Log::new();
    let svc = layer().layer(Scripted::always(&log, 503));
    let start = Instant::now();
    let response = svc
        .oneshot(with_deadline(Duration::from_millis(250)))
        .await
        .unwrap();
    // 0 ms: fails; 200 ms: retry (50 ms left >= 10 ms); 400 ms would be late.
    assert_eq!(log.times(), [start, start + Duration::from_millis(200)]);
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert_eq!(
        response.extensions().get::<GaveUp>().unwrap().reason(),
        StopReason::Deadline
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_attempt_starts_with_less_than_the_minimum_slice() {
    let log = Log::new();
    let svc = layer()
        .min_remaining(Duration::from_millis(60))
        .layer(Scripted::always(&log, 503));
    let _ = svc
        .oneshot(with_deadline(Duration::from_millis(250)))
        .await
        .unwrap();
    // A retry at 200 ms would have 50 ms < 60 ms.
    assert_eq!(log.count(), 1);

    // At exactly the minimum it is made.
    let log = Log::new();
    let svc = layer()
        .min_remaining(Duration::from_millis(50))
        .layer(Scripted::always(&log, 503));
    let _ = svc
        .oneshot(with_deadline(Duration::from_millis(250)))
        .await
        .unwrap();
    assert_eq!(log.count(), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_task_local_deadline_counts_and_the_earliest_wins() {
    let log = Log::new();
    let svc = layer().layer(Scripted::always(&log, 503));
    // The request says 10 s, the task-local scope 250 ms.
    let response = Deadline::after(Duration::from_millis(250))
        .scope(svc.oneshot(with_deadline(Duration::from_secs(10))))
        .await
        .unwrap();
    assert_eq!(log.count(), 2);
    assert_eq!(
        response.extensions().get::<GaveUp>().unwrap().reason(),
        StopReason::Deadline
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn full_jitter_never_sleeps_past_the_deadline() {
    for seed in 0..200 {
        let log = Log::new();
        let svc = RetryLayer::new()
            .backoff(Backoff::full_jitter(
                Duration::from_millis(100),
                Duration::from_secs(1),
            ))
            .max_attempts(10)
            .no_budget()
            .random(SeededRandom::new(seed))
            .layer(Scripted::always(&log, 503));
        let start = Instant::now();
        let deadline = start + Duration::from_millis(250);
        let _ = svc
            .oneshot(with_deadline(Duration::from_millis(250)))
            .await
            .unwrap();
        assert!(Instant::now() <= deadline, "seed {seed}");
        for at in log.times() {
            // Every attempt had at least the 10 ms slice (timer rounding: 1 ms).
            assert!(
                at + Duration::from_millis(10) <= deadline + MS,
                "seed {seed}"
            );
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn errors_stopped_by_the_deadline_say_so() {
    let log = Log::new();
    let svc = layer().layer(Scripted::new(&log, |_| {
        Err(io::Error::from(io::ErrorKind::ConnectionReset).into())
    }));
    let err = svc
        .oneshot(with_deadline(Duration::from_millis(150)))
        .await
        .unwrap_err();
    let too_close = err
        .downcast_ref::<DeadlineTooClose>()
        .expect("DeadlineTooClose");
    assert_eq!(too_close.attempts(), 1);
    assert_eq!(
        err.to_string(),
        "no time left to retry before the deadline after 1 attempt: connection reset"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_a_deadline_retries_are_not_limited_by_time() {
    let log = Log::new();
    let svc = layer().layer(Scripted::always(&log, 503));
    let _ = svc.oneshot(get()).await.unwrap();
    assert_eq!(log.count(), 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_backoff_tells_the_layers_above_when_it_wakes_the_task() {
    // A deadline above the retry layer need not arm a timer of its own
    // while the backoff's timer (ending before the deadline) wakes the task.
    let log = Log::new();
    let svc = layer().layer(Scripted::fails_then_ok(&log, 503, 1));
    let start = Instant::now();
    let mut call = std::pin::pin!(svc.oneshot(with_deadline(Duration::from_secs(1))));
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let watch = tower_resilience_base::wake::Watch::start();
    assert!(
        std::future::Future::poll(call.as_mut(), &mut cx).is_pending(),
        "in the backoff"
    );
    assert_eq!(
        watch.finish(),
        Some(start + Duration::from_millis(200)),
        "the backoff's end"
    );
    let response = call.await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(200));
}
