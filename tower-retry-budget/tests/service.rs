//! The service: readiness, clones, dropping, and object safety of the
//! public traits.

mod support;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method, Request, Response, StatusCode};
use support::{get, status, Log, Scripted};
use tokio_test::{assert_pending, assert_ready, assert_ready_ok};
use tower::Service;
use tower::{BoxError, Layer, ServiceExt};
use tower_resilience_base::hook::Attempts;
use tower_resilience_base::CallContext;
use tower_retry_budget::{
    AttemptHook, AttemptOutcome, AttemptToken, Class, Classify, DefaultPolicy, Policy,
    ProcessRandom, RandomSource, RetryLayer, SeededRandom,
};
use tower_test::mock;

fn layer() -> RetryLayer<DefaultPolicy, tower_retry_budget::body::CloneBody> {
    RetryLayer::new()
        .random(SeededRandom::new(71))
        .clone_bodies()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn ready_call_passes_through() {
    let (mut svc, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer());
    assert_ready_ok!(svc.poll_ready());
    let mut fut = tokio_test::task::spawn(svc.call(get()));
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.uri(), "http://dependency/items");
    send.send_response(status(200));
    let response = assert_ready_ok!(fut.poll());
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inner_pending_propagates() {
    let (mut svc, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer());
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_waits_for_readiness_in_the_future_not_in_poll_ready() {
    let (mut svc, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer());
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let mut fut = tokio_test::task::spawn(svc.call(get()));
    assert_pending!(fut.poll());
    let (_req, send) = handle.next_request().await.unwrap();
    send.send_response(status(503));
    // Backoff, then the inner service is not ready: the future waits.
    assert_pending!(fut.poll());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_pending!(fut.poll());
    handle.allow(1);
    assert_pending!(fut.poll());
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.headers()["x-retry-attempt"], "2");
    send.send_response(status(200));
    assert_eq!(assert_ready_ok!(fut.poll()).status(), 200);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_the_future_during_backoff_stops_retries() {
    let log = Log::new();
    let svc = RetryLayer::new()
        .random(SeededRandom::new(1))
        .layer(Scripted::always(&log, 503));
    let mut fut = tokio_test::task::spawn(svc.oneshot(get()));
    assert_pending!(fut.poll());
    assert_eq!(log.count(), 1);
    drop(fut);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(log.count(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inner_readiness_errors_end_the_retries() {
    let (mut svc, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer());
    assert_ready_ok!(svc.poll_ready());
    let mut fut = tokio_test::task::spawn(svc.call(get()));
    assert_pending!(fut.poll());
    let (_req, send) = handle.next_request().await.unwrap();
    send.send_response(status(503));
    handle.send_error("connection pool closed");
    assert_pending!(fut.poll());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let err = assert_ready!(fut.poll()).unwrap_err();
    assert_eq!(err.to_string(), "connection pool closed");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn clones_share_the_budget_and_counters() {
    let log = Log::new();
    let svc = RetryLayer::new()
        .random(SeededRandom::new(2))
        .layer(Scripted::fails_then_ok(&log, 503, 1));
    let clone = svc.clone();
    let _ = svc.clone().oneshot(get()).await.unwrap();
    let _ = clone.clone().oneshot(get()).await.unwrap();
    let c = clone.counters();
    assert_eq!((c.requests, c.retries, c.refused_by_budget), (2, 1, 0));
    assert_eq!(svc.counters(), c);
}

/// A service that counts its clones and answers 503 to the first `fail`
/// calls made through any of them, 200 after.
#[derive(Clone)]
struct CountsClones {
    clones: Arc<std::sync::atomic::AtomicUsize>,
    calls: Arc<std::sync::atomic::AtomicUsize>,
    fail: usize,
}

impl CountsClones {
    fn new(fail: usize) -> Self {
        Self {
            clones: Arc::default(),
            calls: Arc::default(),
            fail,
        }
    }

    fn clones(&self) -> usize {
        self.clones.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `Clone` by hand, to count.
#[derive(Debug)]
struct Counted(CountsClones);

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.0
            .clones
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Counted(self.0.clone())
    }
}

impl std::fmt::Debug for CountsClones {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CountsClones")
    }
}

impl Service<Request<String>> for Counted {
    type Response = Response<String>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response<String>, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        let n = self
            .0
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::future::ready(Ok(status(if n < self.0.fail { 503 } else { 200 })))
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn calls_that_need_no_retry_clone_no_service_and_retries_clone_a_spare() {
    let probe = CountsClones::new(0);
    let mut svc = layer().layer(Counted(probe.clone()));
    for _ in 0..100 {
        let response = svc.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    // One spare for the retries, made on the first retryable call; none per
    // call (a clone per call costs several reference counts in a stack).
    assert_eq!(probe.clones(), 1);

    let probe = CountsClones::new(2);
    let mut svc = layer().layer(Counted(probe.clone()));
    let response = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(response.status(), 200, "retried twice, through clones");
    assert_eq!(probe.calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    // The spare, and one clone of it for this call's retries.
    assert_eq!(probe.clones(), 2);
}

#[test]
fn debug_output_is_useful() {
    let layer = RetryLayer::new();
    let text = format!("{layer:?}");
    assert!(text.contains("max_attempts: 3"), "{text}");
    assert!(text.contains("ratio: Some(0.1)"), "{text}");
}

// === object safety (compile-only) ===

#[derive(Debug)]
struct Hook;

impl AttemptHook for Hook {
    fn admit(&self) -> Result<AttemptToken, BoxError> {
        Ok(AttemptToken::new(0, 0))
    }
    fn record(&self, _: AttemptToken, _: AttemptOutcome<'_>) {}
    fn cancel(&self, _: AttemptToken) {}
}

#[allow(dead_code)]
fn object_safety(_policy: &dyn Policy, _random: &dyn RandomSource, _hook: &dyn AttemptHook) {}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn trait_objects_work_as_policy_random_source_and_hook() {
    let policy: Arc<dyn Policy> = Arc::new(DefaultPolicy::new());
    let boxed: Box<dyn Policy> = Box::new(DefaultPolicy::new());
    assert!(boxed.is_retryable_request(&Method::GET, &HeaderMap::new()));
    assert_eq!(
        boxed.classify_response(StatusCode::OK, &HeaderMap::new()),
        Class::Success
    );
    let random: Box<dyn RandomSource> = Box::new(ProcessRandom::new());
    let _ = random.next_u64();
    let hook: Arc<dyn AttemptHook> = Arc::new(Hook);
    assert!(hook.admit().is_ok());

    let log = Log::new();
    let mut svc = RetryLayer::new()
        .policy(policy)
        .random(SeededRandom::new(3))
        .layer(Scripted::fails_then_ok(&log, 503, 1));
    ServiceExt::<Request<String>>::ready(&mut svc)
        .await
        .unwrap();
    let attempts = Attempts::new(hook, AttemptToken::new(0, 0));
    let (future, left) = CallContext::offer_attempts(attempts, || svc.call(get()));
    assert!(left.is_none());
    assert_eq!(future.await.unwrap().status(), 200);
    assert_eq!(log.count(), 2);
}
