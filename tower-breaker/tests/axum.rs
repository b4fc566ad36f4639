//! Through a real axum server on 127.0.0.1: the circuit lives in the
//! breaker, shared by every connection, and an open circuit answers 503
//! with `Retry-After` without calling the handler.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::*;
use tower_breaker::{Breaker, HttpBreakerLayer, State};

async fn serve(
    breaker: Breaker,
    handled: Arc<AtomicUsize>,
    hung: Arc<AtomicUsize>,
) -> std::net::SocketAddr {
    let app = Router::new()
        .route(
            "/hang",
            get(move || {
                hung.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>()
            }),
        )
        .route(
            "/",
            get(move || {
                let handled = handled.clone();
                async move {
                    handled.fetch_add(1, Ordering::SeqCst);
                    (http::StatusCode::BAD_GATEWAY, "dependency failed")
                }
            }),
        )
        .route(
            "/grpc",
            axum::routing::post(|| async { (http::StatusCode::BAD_GATEWAY, "") }),
        )
        .layer(HttpBreakerLayer::new(breaker));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_over_many_connections_open_one_circuit_and_get_503_with_retry_after() {
    let breaker = Breaker::with_config("backend", config().count_window(10).minimum_calls(10));
    let handled = Arc::new(AtomicUsize::new(0));
    let hung = Arc::new(AtomicUsize::new(0));
    let addr = serve(breaker.clone(), handled.clone(), hung.clone()).await;
    let url = format!("http://{addr}/");

    // A fresh client (so a fresh connection) for every request: axum calls
    // `Layer::layer` once per connection.
    for _ in 0..10 {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
        let response = client.get(url.parse().unwrap()).await.unwrap();
        assert_eq!(response.status(), 502);
    }
    assert_eq!(breaker.snapshot().state, State::Open);

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let response = client.get(url.parse().unwrap()).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "5");
    assert_eq!(response.headers()["x-tower-no-retry"], "1");
    assert_eq!(
        handled.load(Ordering::SeqCst),
        10,
        "the handler was not called"
    );

    // The rejection never waits on the dependency: a handler that never
    // answers still gets the 503, because the breaker answers without
    // calling it (what it costs in time is the bench's job, not the
    // test's; the timeout only turns a hang into a failure).
    let before = breaker.snapshot().totals;
    let hanging = format!("http://{addr}/hang");
    let response = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        client.get(hanging.parse().unwrap()),
    )
    .await
    .expect("the open circuit answered without waiting on the handler")
    .unwrap();
    assert_eq!(response.status(), 503);
    let after = breaker.snapshot().totals;
    assert_eq!(after.rejected, before.rejected + 1);
    assert_eq!(
        after.calls() + after.ignored,
        before.calls() + before.ignored,
        "no call was admitted"
    );
    assert_eq!(hung.load(Ordering::SeqCst), 0, "the handler never ran");
    assert_eq!(after.rejected, 2);

    // gRPC callers get a trailers-only UNAVAILABLE.
    let request = http::Request::post(format!("http://{addr}/grpc"))
        .header("content-type", "application/grpc")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["grpc-status"], "14");
    let _ = ms(0);
}
