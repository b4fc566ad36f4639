//! `reqwest::Client` under the full client stack, used with reqwest-style
//! code: `client.get(url).send().await?.text().await?`.
//!
//! The stack is `ClientDeadline -> Breaker -> Retry (budget) -> Bulkhead ->
//! ClientDeadline (per attempt) -> ReqwestService`, built in one call by
//! `client_stack(..).reqwest(reqwest::Client)` from the published
//! `tower_shield::reqwest` module (feature `reqwest`): `ReqwestService`
//! turns the `http::Request` the layers speak into a `reqwest::Request`,
//! and `tower_shield::reqwest::Client` gives back `get`/`post`/`send`
//! with reqwest's own request builder inside (here `query`, from feature
//! `reqwest-query`). The `reqwest::Client` comes from
//! `ReqwestService::client_builder()`, which turns reqwest's own retries
//! off, so every attempt on the wire is one the breaker counts. Against a
//! local server on 127.0.0.1, it shows:
//!
//! 1. a `get` with a query string through the stack, with the budget
//!    header on the wire;
//! 2. a `POST` with an `Idempotency-Key` that fails once with 503 and is
//!    retried, its body replayed byte for byte;
//! 3. a per-call `timeout` cutting a hanging call (`DeadlineExceeded`);
//! 4. a dependency that keeps failing: the breaker opens and later calls
//!    fail at once with `CircuitOpen`, never reaching the server.
//!
//! Run it with:
//!
//! ```text
//! cargo run -p examples --bin reqwest-stack
//! ```

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use examples::demo::check;
use tokio::time::Instant;
use tower_breaker::error::CircuitOpen;
use tower_breaker::{BoxError, Breaker, BreakerConfig};
use tower_deadline::error::DeadlineExceeded;
use tower_shield::reqwest::ReqwestService;
use tower_shield::stack::client_stack;

/// The local server: counts calls, fails the first attempt of each order.
#[derive(Clone, Default)]
struct Server {
    calls: Arc<AtomicUsize>,
    seen_keys: Arc<Mutex<HashSet<String>>>,
}

async fn items(State(s): State<Server>, headers: HeaderMap) -> String {
    s.calls.fetch_add(1, Ordering::SeqCst);
    let budget = headers
        .get("x-request-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none");
    format!("[apples, pears] (x-request-timeout-ms: {budget})")
}

async fn orders(State(s): State<Server>, headers: HeaderMap, body: Bytes) -> (StatusCode, String) {
    s.calls.fetch_add(1, Ordering::SeqCst);
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let attempt = headers
        .get("x-retry-attempt")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("1")
        .to_owned();
    let first = s.seen_keys.lock().expect("not poisoned").insert(key);
    println!(
        "     server: attempt {attempt} received {} bytes: {}",
        body.len(),
        String::from_utf8_lossy(&body)
    );
    if first {
        (StatusCode::SERVICE_UNAVAILABLE, "busy, try again".into())
    } else {
        (
            StatusCode::CREATED,
            format!("order stored ({} bytes)", body.len()),
        )
    }
}

async fn hangs(State(s): State<Server>) -> &'static str {
    s.calls.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    "late"
}

async fn down(State(s): State<Server>) -> StatusCode {
    s.calls.fetch_add(1, Ordering::SeqCst);
    StatusCode::SERVICE_UNAVAILABLE
}

async fn start(server: Server) -> SocketAddr {
    let app = Router::new()
        .route("/items", get(items))
        .route("/orders", post(orders))
        .route("/hangs", get(hangs))
        .route("/down", get(down))
        .with_state(server);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server = Server::default();
    let addr = start(server.clone()).await;
    let mut failures = Vec::new();

    // Build the stack once; the client is cheap to clone and shares it.
    let breaker = Breaker::with_config(
        "catalog",
        BreakerConfig::new()
            .count_window(10)
            .minimum_calls(10)
            .open_period(Duration::from_secs(5)),
    );
    // Deadline, breaker, retry, bulkhead, per-attempt deadline, in one line.
    let stack = client_stack("catalog")
        .breaker(breaker.clone())
        .timeout(Duration::from_secs(2))
        .concurrency(32);
    let retry_counters = {
        let stack = stack.clone();
        move || stack.retry_counters()
    };
    let client = stack.reqwest(
        ReqwestService::client_builder()
            .connect_timeout(Duration::from_millis(200))
            .build()?,
    );
    let base = format!("http://{addr}");

    println!("1. client.get(url).query(..).send().await, through the stack");
    let response = client
        .get(format!("{base}/items"))
        .query(&[("kind", "fruit & nuts")])
        .send()
        .await?;
    let status = response.status();
    let url = response.url().clone();
    let text = response.text().await?;
    println!("   {status} from {url}: {text}");
    check(
        status == StatusCode::OK
            && !text.contains("none")
            && url.query() == Some("kind=fruit+%26+nuts"),
        "answered, the query encoded by reqwest, the 2 s budget written on the wire",
        &mut failures,
    );

    println!("\n2. client.post(url).header(idempotency-key).body(..): 503 once, then retried");
    let order = r#"{"sku":"apples","quantity":3}"#;
    let response = client
        .post(format!("{base}/orders"))
        .header("idempotency-key", "order-42")
        .header("content-type", "application/json")
        .body(order)
        .send()
        .await?;
    let status = response.status();
    println!("   {status}: {}", response.text().await?);
    check(
        status == StatusCode::CREATED && retry_counters().retries == 1,
        "one retry, the body replayed byte for byte",
        &mut failures,
    );

    println!("\n3. .timeout(300 ms) on a call that hangs");
    let start = Instant::now();
    let result = client
        .get(format!("{base}/hangs"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    let took = start.elapsed();
    match &result {
        Ok(r) => println!("   unexpected answer {}", r.status()),
        Err(e) => println!("   error after {} ms: {e}", took.as_millis()),
    }
    check(
        result.as_ref().is_err_and(|e| e.is::<DeadlineExceeded>())
            && took < Duration::from_millis(600),
        "cut at the deadline with DeadlineExceeded",
        &mut failures,
    );

    println!("\n4. A dependency that keeps failing (503): the breaker opens");
    let s = breaker.snapshot();
    println!(
        "   breaker window so far: {} calls, {} failures (the 503 of step 2, the timeout of step 3)",
        s.window.calls, s.window.failures
    );
    let before = server.calls.load(Ordering::SeqCst);
    let mut last = None;
    for i in 1..=5 {
        let start = Instant::now();
        let result = client.get(format!("{base}/down")).send().await;
        let took = start.elapsed();
        match &result {
            Ok(r) => println!(
                "   request {i}: {} after {} ms",
                r.status(),
                took.as_millis()
            ),
            Err(e) => println!("   request {i}: error after {} us: {e}", took.as_micros()),
        }
        last = Some((result, took));
    }
    let reached = server.calls.load(Ordering::SeqCst) - before;
    let totals = breaker.snapshot().totals;
    println!(
        "   the server saw {reached} attempts for 5 requests; the breaker rejected {}",
        totals.rejected
    );
    let (last, took) = last.expect("five calls");
    check(
        last.is_err_and(|e| e.is::<CircuitOpen>())
            && took < Duration::from_millis(5)
            && reached < 5 * 3,
        "later calls fail at once with CircuitOpen, without reaching the server",
        &mut failures,
    );

    if !failures.is_empty() {
        eprintln!("\nnot demonstrated: {failures:?}");
        std::process::exit(1);
    }
    Ok(())
}
