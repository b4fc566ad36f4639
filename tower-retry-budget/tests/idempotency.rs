//! Only requests that are safe to repeat are retried.

mod support;

use http::{HeaderMap, Method, Request};
use support::{get, post, Log, Scripted};
use tower::{Layer, ServiceExt};
use tower_retry_budget::{policy, Classify, GaveUp, Policy, RetryLayer, SeededRandom, StopReason};

fn layer() -> RetryLayer {
    RetryLayer::new().random(SeededRandom::new(31))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn post_without_idempotency_key_is_not_retried() {
    let log = Log::new();
    let svc = layer().layer(Scripted::always(&log, 503));
    let response = svc.oneshot(post()).await.unwrap();
    assert_eq!(log.count(), 1);
    assert_eq!(
        response.extensions().get::<GaveUp>().unwrap().reason(),
        StopReason::NotRetryable
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn post_with_idempotency_key_is_retried() {
    let log = Log::new();
    let svc = layer().layer(Scripted::fails_then_ok(&log, 503, 2));
    let mut request = post();
    request
        .headers_mut()
        .insert("Idempotency-Key", "order-7".parse().unwrap());
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(log.count(), 3);
    assert!(log
        .calls()
        .iter()
        .all(|c| c.method == Method::POST && c.headers["idempotency-key"] == "order-7"));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn idempotent_methods_are_retried_others_are_not() {
    for (method, retried) in [
        ("GET", true),
        ("HEAD", true),
        ("OPTIONS", true),
        ("PUT", true),
        ("DELETE", true),
        ("TRACE", true),
        ("POST", false),
        ("PATCH", false),
    ] {
        let log = Log::new();
        let svc = layer().layer(Scripted::always(&log, 503));
        let request = Request::builder()
            .method(method)
            .uri("/x")
            .body(String::new())
            .unwrap();
        let _ = svc.oneshot(request).await.unwrap();
        assert_eq!(log.count(), if retried { 3 } else { 1 }, "{method}");
    }
}

#[derive(Debug, Clone)]
struct GetOnly;

impl Policy for GetOnly {
    fn is_retryable_request(&self, method: &Method, _headers: &HeaderMap) -> bool {
        method == Method::GET
    }
}

impl Classify for GetOnly {}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_idempotency_rule_is_replaceable() {
    let log = Log::new();
    let svc = layer().policy(GetOnly).layer(Scripted::always(&log, 503));
    let request = Request::put("/x").body(String::new()).unwrap();
    let _ = svc.clone().oneshot(request).await.unwrap();
    assert_eq!(log.count(), 1, "PUT is not retried under this rule");
    let _ = svc.oneshot(get()).await.unwrap();
    assert_eq!(log.count(), 4);
    // The default rule stays available to custom policies.
    assert!(policy::is_idempotent(&Method::PUT, &HeaderMap::new()));
}
