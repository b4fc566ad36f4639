//! Two axum services over real sockets on 127.0.0.1: the front one receives
//! a budget, and its handler calls the back one through a client stacked
//! with the client layer.
//!
//! Real time runs here, so the assertions are about the order of events and
//! generous bounds, never tight timings.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_deadline::{ClientDeadline, ClientDeadlineLayer, ServerDeadlineLayer};
use tower_layer::Layer;

type Http = Client<HttpConnector, Full<Bytes>>;

#[derive(Debug)]
enum Event {
    BackStarted(Option<u64>),
    BackDropped,
}

struct NotifyOnDrop(mpsc::UnboundedSender<Event>);

impl Drop for NotifyOnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(Event::BackDropped);
    }
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn http_client() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

/// The back service: reports the budget it was given, then answers at once
/// (`/fast`) or after a minute (`/slow`).
async fn start_back(events: mpsc::UnboundedSender<Event>) -> SocketAddr {
    async fn handler(
        State(events): State<mpsc::UnboundedSender<Event>>,
        uri: axum::http::Uri,
        headers: HeaderMap,
    ) -> String {
        let budget = headers
            .get("x-request-timeout-ms")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let _ = events.send(Event::BackStarted(budget));
        let _guard = NotifyOnDrop(events);
        if uri.path() == "/slow" {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        "done".to_owned()
    }
    let app = Router::new()
        .route("/fast", get(handler))
        .route("/slow", get(handler))
        .with_state(events);
    serve(app).await
}

/// The front service: deadline from the caller, then a call to the back
/// service through the client layer.
async fn start_front(back: SocketAddr) -> SocketAddr {
    #[derive(Clone)]
    struct Front {
        back: SocketAddr,
        client: ClientDeadline<Http>,
    }
    async fn handler(State(front): State<Front>, uri: axum::http::Uri) -> (StatusCode, String) {
        let request = http::Request::get(format!("http://{}{}", front.back, uri.path()))
            .body(Full::new(Bytes::new()))
            .unwrap();
        match front.client.oneshot(request).await {
            Ok(response) => {
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (StatusCode::OK, String::from_utf8_lossy(&body).into_owned())
            }
            Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()),
        }
    }
    let state = Front {
        back,
        client: ClientDeadlineLayer::new().layer(http_client()),
    };
    let app = Router::new()
        .route("/fast", get(handler))
        .route("/slow", get(handler))
        .with_state(state)
        .layer(ServerDeadlineLayer::new());
    serve(app).await
}

async fn call_front(front: SocketAddr, path: &str, budget_ms: &str) -> StatusCode {
    let request = http::Request::get(format!("http://{front}{path}"))
        .header("x-request-timeout-ms", budget_ms)
        .body(Full::new(Bytes::new()))
        .unwrap();
    http_client().request(request).await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_back_service_sees_what_is_left_of_the_front_budget() {
    let (tx, mut events) = mpsc::unbounded_channel();
    let back = start_back(tx).await;
    let front = start_front(back).await;

    assert_eq!(call_front(front, "/fast", "300").await, StatusCode::OK);
    match events.recv().await.unwrap() {
        Event::BackStarted(Some(ms)) => {
            assert!(ms > 0 && ms <= 300, "back saw {ms} ms of a 300 ms budget");
        }
        other => panic!("expected the back service to start with a budget, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_back_service_yields_504_within_the_budget_and_is_cancelled() {
    let (tx, mut events) = mpsc::unbounded_channel();
    let back = start_back(tx).await;
    let front = start_front(back).await;

    let start = Instant::now();
    let status = call_front(front, "/slow", "300").await;
    let elapsed = start.elapsed();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    // The budget is 300 ms; allow a generous margin for a loaded machine,
    // far below the minute the back service would take.
    assert!(
        elapsed >= Duration::from_millis(250),
        "answered too early: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(5),
        "answered too late: {elapsed:?}"
    );

    // The back service had started before the front answered ...
    match events.try_recv() {
        Ok(Event::BackStarted(Some(ms))) => assert!(ms > 0 && ms <= 300, "{ms}"),
        other => panic!("expected BackStarted before the answer, got {other:?}"),
    }
    // ... and its handler future is dropped once the front gave up (the
    // connection is closed), long before its minute is over.
    let dropped = tokio::time::timeout(Duration::from_secs(10), events.recv()).await;
    assert!(
        matches!(dropped, Ok(Some(Event::BackDropped))),
        "back handler was not cancelled: {dropped:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(15));
}
