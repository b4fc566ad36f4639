//! Signals on the wire: the attempt number on retries, and the "do not
//! retry" header, obeyed, stripped and added.

mod support;

use http::header::CONTENT_TYPE;
use http::{HeaderName, Request};
use support::{get, status_with, Log, Scripted};
use tower::{Layer, ServiceExt};
use tower_retry_budget::{
    GaveUp, RetryLayer, SeededRandom, StopReason, GRPC_PREVIOUS_RPC_ATTEMPTS, NO_RETRY_HEADER,
    RETRY_ATTEMPT_HEADER,
};

fn layer() -> RetryLayer {
    RetryLayer::new().random(SeededRandom::new(23))
}

#[test]
fn header_names_are_the_documented_ones() {
    assert_eq!(NO_RETRY_HEADER, "x-tower-no-retry");
    assert_eq!(RETRY_ATTEMPT_HEADER, "x-retry-attempt");
    assert_eq!(GRPC_PREVIOUS_RPC_ATTEMPTS, "grpc-previous-rpc-attempts");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_bulkhead_503_is_not_retried_and_its_mark_is_passed_on() {
    // A server-side bulkhead (HTTP mode) answers 503 with the mark; a client
    // retry layer above it must not retry, and passes the mark on so that no
    // tier above retries either.
    let log = Log::new();
    let bulkhead = tower_bulkhead::HttpBulkheadLayer::new("orders", 0);
    let stats = bulkhead.handle();
    let svc = layer().layer(bulkhead.layer(Scripted::always(&log, 200)));
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()[NO_RETRY_HEADER], "1");
    assert!(response.headers().get("retry-after").is_some());
    assert_eq!(stats.rejected(), 1);
    assert_eq!(log.count(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn http_retries_carry_the_attempt_number() {
    let log = Log::new();
    let svc = layer().layer(Scripted::always(&log, 503));
    let _ = svc.oneshot(get()).await.unwrap();
    let numbers: Vec<_> = log
        .calls()
        .iter()
        .map(|c| {
            c.headers
                .get(RETRY_ATTEMPT_HEADER)
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(numbers, [None, Some("2".into()), Some("3".into())]);
    assert!(log
        .calls()
        .iter()
        .all(|c| !c.headers.contains_key(GRPC_PREVIOUS_RPC_ATTEMPTS)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grpc_retries_carry_previous_rpc_attempts() {
    let log = Log::new();
    let svc = layer().layer(Scripted::new(&log, |_| {
        Ok(status_with(200, "grpc-status", "14"))
    }));
    let request = Request::post("http://dependency/pkg.Service/Method")
        .header(CONTENT_TYPE, "application/grpc+proto")
        .body(String::new())
        .unwrap();
    // gRPC calls are POSTs: mark this one as safe to repeat.
    let mut request = request;
    request
        .headers_mut()
        .insert("idempotency-key", "k1".parse().unwrap());
    let _ = svc.oneshot(request).await.unwrap();
    let numbers: Vec<_> = log
        .calls()
        .iter()
        .map(|c| {
            c.headers
                .get(GRPC_PREVIOUS_RPC_ATTEMPTS)
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(numbers, [None, Some("1".into()), Some("2".into())]);
    assert!(log
        .calls()
        .iter()
        .all(|c| !c.headers.contains_key(RETRY_ATTEMPT_HEADER)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn attempt_header_is_configurable() {
    let log = Log::new();
    let name = HeaderName::from_static("x-attempt");
    let svc = layer()
        .attempt_header(name.clone())
        .layer(Scripted::fails_then_ok(&log, 503, 1));
    let _ = svc.oneshot(get()).await.unwrap();
    assert_eq!(log.calls()[1].headers[&name], "2");

    let log = Log::new();
    let svc = layer()
        .no_attempt_header()
        .layer(Scripted::fails_then_ok(&log, 503, 1));
    let _ = svc.oneshot(get()).await.unwrap();
    assert_eq!(log.calls()[1].headers.len(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_marked_answer_is_not_retried_and_the_mark_is_passed_on() {
    // Regression: the mark used to be stripped after one hop, so the tier
    // above a tier that declined because of it retried the failure again.
    let log = Log::new();
    // What a bulkhead or breaker of this toolkit answers when it rejects.
    let svc = layer().layer(Scripted::new(&log, |_| {
        let mut r = status_with(503, "x-tower-no-retry", "1");
        r.headers_mut().insert("retry-after", "1".parse().unwrap());
        Ok(r)
    }));
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(log.count(), 1);
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.headers()[NO_RETRY_HEADER],
        "1",
        "passed on to the tier above"
    );
    assert_eq!(
        response.extensions().get::<GaveUp>().unwrap().reason(),
        StopReason::SpentBelow
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_mark_on_a_success_passes_through_untouched() {
    let log = Log::new();
    let svc = layer().layer(Scripted::new(&log, |_| {
        Ok(status_with(200, "x-tower-no-retry", "1"))
    }));
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(response.headers()[NO_RETRY_HEADER], "1");
    assert!(response.extensions().get::<GaveUp>().is_none());
    assert_eq!(log.count(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_mark_is_added_only_when_a_limit_ends_retries() {
    // Attempts exhausted: marked.
    let log = Log::new();
    let response = layer()
        .layer(Scripted::always(&log, 502))
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.headers()[NO_RETRY_HEADER], "1");
    // Not retryable: not marked.
    let response = layer()
        .layer(Scripted::always(&log, 404))
        .oneshot(get())
        .await
        .unwrap();
    assert!(!response.headers().contains_key(NO_RETRY_HEADER));
    // Success after a retry: not marked.
    let log = Log::new();
    let response = layer()
        .layer(Scripted::fails_then_ok(&log, 503, 1))
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(!response.headers().contains_key(NO_RETRY_HEADER));
}
