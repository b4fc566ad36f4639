//! HTTP mode: rejections become 503 or gRPC RESOURCE_EXHAUSTED answers, the
//! inner error type passes through.

mod support;

use std::time::Duration;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::StatusCode;
use support::{grpc_request, request, Gate};
use tower::{service_fn, Service, ServiceExt};
use tower_bulkhead::{HttpBulkhead, HttpBulkheadLayer, NO_RETRY_HEADER};
use tower_layer::Layer;

async fn saturate<S>(service: &mut S, n: usize) -> Vec<tokio::task::JoinHandle<()>>
where
    S: Service<support::Request> + Send,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    let mut held = Vec::new();
    for _ in 0..n {
        let f = service.ready().await.ok().unwrap().call(request());
        held.push(tokio::spawn(async move {
            let _ = f.await;
        }));
    }
    tokio::task::yield_now().await;
    held
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn full_compartment_answers_503_with_retry_after_and_the_no_retry_mark() {
    let gate = Gate::new();
    let layer = HttpBulkheadLayer::new("api", 2);
    let mut service = layer.layer(gate.service());
    let _held = saturate(&mut service, 2).await;

    let response = service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[RETRY_AFTER], "1");
    assert_eq!(response.headers()[NO_RETRY_HEADER], "1");
    assert_eq!(response.body(), "");
    assert_eq!(gate.calls(), 2);
    assert_eq!(layer.handle().rejected(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retry_after_is_configurable_and_rounded_up_to_whole_seconds() {
    let gate = Gate::new();
    let layer = HttpBulkheadLayer::new("api", 0).retry_after(Duration::from_millis(2_500));
    let response = layer
        .layer(gate.service())
        .oneshot(request())
        .await
        .unwrap();
    assert_eq!(response.headers()[RETRY_AFTER], "3");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grpc_requests_get_a_trailers_only_resource_exhausted() {
    let gate = Gate::new();
    let response = HttpBulkhead::new(gate.service(), "api", 0)
        .oneshot(grpc_request())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
    assert_eq!(response.headers()["grpc-status"], "8");
    assert_eq!(response.headers()["grpc-message"], "bulkhead full");
    assert!(response.headers().get(RETRY_AFTER).is_none());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inner_errors_pass_through_unchanged() {
    #[derive(Debug, PartialEq)]
    struct Oops;
    let failing =
        service_fn(|_req: support::Request| async { Err::<http::Response<String>, _>(Oops) });
    let layer = HttpBulkheadLayer::new("api", 1);
    let err = layer.layer(failing).oneshot(request()).await.unwrap_err();
    assert_eq!(err, Oops);
    assert_eq!(layer.handle().in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn successful_responses_are_untouched() {
    let gate = Gate::new();
    gate.open_all();
    let response = HttpBulkhead::new(gate.service(), "api", 1)
        .oneshot(http::Request::get("/hello").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.body(), "/hello");
    assert!(response.headers().get(NO_RETRY_HEADER).is_none());
}
