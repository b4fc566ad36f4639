//! Over real sockets on 127.0.0.1: a local axum server sends the head of
//! its answer at once and then stalls the body, fails it mid-stream or
//! trickles it; a hyper client under `client_stack` reads it. A stalled
//! read fails at the deadline, the breaker counts a failure, and the
//! bulkhead counts the call in flight until the body ends or is dropped.
//!
//! Real time: the bounds are generous, and the elapsed times are printed.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use tokio::time::Instant;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, ServiceExt};
use tower_deadline::error::DeadlineExceeded;
use tower_retry_budget::body::ReplayBody;
use tower_shield::stack::client_stack;

const DEADLINE: Duration = Duration::from_millis(300);

fn chunk() -> Result<Bytes, Infallible> {
    Ok(Bytes::from_static(b"chunk;"))
}

async fn serve() -> std::net::SocketAddr {
    let app = Router::new()
        // The head and a first chunk at once, then nothing, ever.
        .route(
            "/stall",
            get(|| async {
                Body::from_stream(stream::once(async { chunk() }).chain(stream::pending()))
            }),
        )
        // Twenty chunks, 10 ms apart: 200 ms, inside the deadline.
        .route(
            "/steady",
            get(|| async {
                Body::from_stream(stream::iter(0..20).then(|_| async {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    chunk()
                }))
            }),
        )
        // A chunk, a pause (the head and the chunk go out), then the
        // stream fails: hyper cuts the response.
        .route(
            "/reset",
            get(|| async {
                let fail = async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Err(std::io::Error::other("the upstream went away"))
                };
                Body::from_stream(
                    stream::once(async { Ok(Bytes::from_static(b"chunk;")) })
                        .chain(stream::once(fail)),
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

type Transport = Client<HttpConnector, ReplayBody<Full<Bytes>>>;

fn transport() -> Transport {
    Client::builder(TokioExecutor::new()).build_http()
}

fn get_request(addr: std::net::SocketAddr, path: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_after_the_head_fails_at_the_deadline_and_counts_a_failure() {
    let addr = serve().await;
    let stack = client_stack("stalls").timeout(DEADLINE);
    let (breaker, bulkhead) = (stack.breaker_handle().clone(), stack.bulkhead_handle());
    let client = stack.layer(transport());

    let start = Instant::now();
    let response = client.oneshot(get_request(addr, "/stall")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(bulkhead.in_flight(), 1, "the body is still being read");
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "chunk;");
    let err = loop {
        match body.frame().await {
            Some(Ok(_)) => {}
            Some(Err(e)) => break e,
            None => panic!("a stalled body ended"),
        }
    };
    let elapsed = start.elapsed();
    println!("stalled body cut after {elapsed:?} (deadline {DEADLINE:?})");
    assert!(err.is::<DeadlineExceeded>(), "{err:?}");
    assert!(elapsed >= DEADLINE, "cut early: {elapsed:?}");
    assert!(
        elapsed < DEADLINE + Duration::from_secs(2),
        "cut late: {elapsed:?}"
    );
    let s = breaker.snapshot();
    assert_eq!((s.totals.successful, s.totals.failed), (0, 1));
    assert_eq!(bulkhead.in_flight(), 0, "released when the body failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_fails_mid_stream_counts_a_failure_and_frees_the_slot() {
    let addr = serve().await;
    let stack = client_stack("resets").timeout(DEADLINE);
    let (breaker, bulkhead) = (stack.breaker_handle().clone(), stack.bulkhead_handle());
    let client = stack.layer(transport());

    let response = client.oneshot(get_request(addr, "/reset")).await.unwrap();
    assert_eq!(response.status(), 200);
    let err = response.into_body().collect().await.unwrap_err();
    assert!(!err.is::<DeadlineExceeded>(), "a transport error: {err:?}");
    let s = breaker.snapshot();
    assert_eq!((s.totals.successful, s.totals.failed), (0, 1));
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_steady_body_within_the_deadline_succeeds() {
    let addr = serve().await;
    let stack = client_stack("steady").timeout(Duration::from_secs(5));
    let (breaker, bulkhead) = (stack.breaker_handle().clone(), stack.bulkhead_handle());
    let client = stack.layer(transport());

    let start = Instant::now();
    let response = client.oneshot(get_request(addr, "/steady")).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    println!("steady body read in {:?}", start.elapsed());
    assert_eq!(body.len(), 20 * "chunk;".len());
    let s = breaker.snapshot();
    assert_eq!((s.totals.successful, s.totals.failed), (1, 0));
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_read_body_dropped_frees_the_slot_and_counts_as_its_head() {
    let addr = serve().await;
    let stack = client_stack("dropped").timeout(DEADLINE);
    let (breaker, bulkhead) = (stack.breaker_handle().clone(), stack.bulkhead_handle());
    let client = stack.layer(transport());

    let response = client.oneshot(get_request(addr, "/stall")).await.unwrap();
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    assert_eq!(bulkhead.in_flight(), 1);
    drop(body);
    assert_eq!(bulkhead.in_flight(), 0, "the slot is freed with the body");
    let s = breaker.snapshot();
    assert_eq!((s.totals.successful, s.totals.failed), (1, 0));
    // And nothing fires later: the deadline's timer went with the body.
    tokio::time::sleep(DEADLINE + Duration::from_millis(50)).await;
    let s = breaker.snapshot();
    assert_eq!((s.totals.successful, s.totals.failed), (1, 0));
}
