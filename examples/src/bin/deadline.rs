//! Deadline propagation across three hops, over real sockets on 127.0.0.1.
//!
//! A caller gives the first service an 800 ms budget. Each service does
//! 150 ms of work, then calls the next one through `ClientDeadlineLayer`;
//! each hop prints the budget it received, so you can watch it shrink. Then
//! the last service becomes slow, and the caller gets a 504 when its budget
//! runs out, while every hop's pending work is cancelled.
//!
//! Run it with:
//!
//! ```text
//! cargo run -p examples --bin deadline
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_deadline::error::{DeadlineExceeded, InsufficientBudget};
use tower_deadline::{ClientDeadline, ClientDeadlineLayer, Deadline, ServerDeadlineLayer};

type Http = Client<HttpConnector, Full<Bytes>>;

const WORK: Duration = Duration::from_millis(150);

#[derive(Clone)]
struct Hop {
    name: &'static str,
    next: Option<SocketAddr>,
    client: ClientDeadline<Http>,
}

/// Dropped when a hop's handler is cancelled before it finished.
struct Cancelled {
    name: &'static str,
    done: bool,
}

impl Drop for Cancelled {
    fn drop(&mut self) {
        if !self.done {
            println!("    {}: handler cancelled, work abandoned", self.name);
        }
    }
}

async fn hop(State(hop): State<Hop>, uri: Uri, headers: HeaderMap) -> (StatusCode, String) {
    let received = headers
        .get("x-request-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none");
    let left = Deadline::current().map_or(0, |d| d.remaining().as_millis());
    println!(
        "    {}: received x-request-timeout-ms: {received:>4}  ({left} ms left here)",
        hop.name
    );
    let mut guard = Cancelled {
        name: hop.name,
        done: false,
    };
    let slow = uri.path() == "/slow";
    let work = if slow && hop.next.is_none() {
        Duration::from_secs(30)
    } else {
        WORK
    };
    tokio::time::sleep(work).await;

    let answer = match hop.next {
        None => (StatusCode::OK, format!("{} done", hop.name)),
        Some(next) => {
            let request = http::Request::get(format!("http://{next}{}", uri.path()))
                .body(Full::new(Bytes::new()))
                .expect("valid request");
            match hop.client.oneshot(request).await {
                Ok(response) => {
                    let status = response.status();
                    let body = response
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    (status, String::from_utf8_lossy(&body).into_owned())
                }
                Err(e) if e.is::<DeadlineExceeded>() || e.is::<InsufficientBudget>() => {
                    (StatusCode::GATEWAY_TIMEOUT, e.to_string())
                }
                Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()),
            }
        }
    };
    guard.done = true;
    answer
}

async fn start(name: &'static str, next: Option<SocketAddr>) -> SocketAddr {
    let state = Hop {
        name,
        next,
        client: ClientDeadlineLayer::new()
            .margin(Duration::from_millis(1))
            .layer(Client::builder(TokioExecutor::new()).build_http()),
    };
    let app = Router::new()
        .route("/fast", get(hop))
        .route("/slow", get(hop))
        .with_state(state)
        .layer(ServerDeadlineLayer::new().max_timeout(Duration::from_secs(10)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn call(first: SocketAddr, path: &str, budget_ms: u64) -> (StatusCode, Duration) {
    let client: Http = Client::builder(TokioExecutor::new()).build_http();
    let request = http::Request::get(format!("http://{first}{path}"))
        .header("x-request-timeout-ms", budget_ms.to_string())
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let start = Instant::now();
    let status = match client.request(request).await {
        Ok(r) => r.status(),
        Err(e) => {
            eprintln!("request failed: {e}");
            StatusCode::BAD_GATEWAY
        }
    };
    (status, start.elapsed())
}

#[tokio::main]
async fn main() {
    let c = start("C", None).await;
    let b = start("B", Some(c)).await;
    let a = start("A", Some(b)).await;

    println!("1. A healthy chain: caller -> A -> B -> C, each hop works {WORK:?}, budget 800 ms");
    let (status, took) = call(a, "/fast", 800).await;
    println!("   caller got {status} after {} ms\n", took.as_millis());
    let healthy = status == StatusCode::OK;

    println!("2. C hangs: the same 800 ms budget");
    let (status, took) = call(a, "/slow", 800).await;
    println!(
        "   caller got {status} after {} ms (budget 800 ms)",
        took.as_millis()
    );
    // Give the cancellations a moment to be printed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cut = status == StatusCode::GATEWAY_TIMEOUT && took < Duration::from_secs(5);

    println!("\n3. Too little budget to start: 0 ms");
    let (status, took) = call(a, "/fast", 0).await;
    println!(
        "   caller got {status} after {} ms; no hop did any work",
        took.as_millis()
    );
    let fast_fail = status == StatusCode::GATEWAY_TIMEOUT;

    if !(healthy && cut && fast_fail) {
        eprintln!("unexpected result");
        std::process::exit(1);
    }
}
