//! reqwest through the client stack, end to end over real sockets on
//! 127.0.0.1: `tower_breaker::reqwest::Client` (and, with the
//! `reqwest-middleware` feature, `StackMiddleware`) against a local axum
//! server that records every attempt it receives.
#![cfg(feature = "reqwest")]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::any;
use axum::Router;
use tower_breaker::error::CircuitOpen;
use tower_breaker::stack::{client_stack, ClientStack};
use tower_breaker::{BreakerConfig, State};

/// One attempt as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    body: Bytes,
    budget_ms: Option<u64>,
}

/// The local dependency. `/fail/N/...` answers 503 to the first N attempts
/// on that path, then 200 (201 for a POST); `/down` always 503; anything
/// else 200. Every attempt is recorded, body included.
#[derive(Clone, Default)]
struct Server {
    seen: Arc<Mutex<Vec<Seen>>>,
    per_path: Arc<Mutex<HashMap<String, u32>>>,
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("not poisoned").clone()
    }

    fn attempts(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }
}

async fn handle(
    Extract(server): Extract<Server>,
    method: axum::http::Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, String), Infallible> {
    let path = uri.path().to_owned();
    let budget_ms = headers
        .get("x-request-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    server.seen.lock().expect("not poisoned").push(Seen {
        path: path.clone(),
        body: body.clone(),
        budget_ms,
    });
    let n = {
        let mut per_path = server.per_path.lock().expect("not poisoned");
        let n = per_path.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    if path == "/down" {
        return Ok((StatusCode::SERVICE_UNAVAILABLE, "down".into()));
    }
    if let Some(rest) = path.strip_prefix("/fail/") {
        let failures: u32 = rest
            .split('/')
            .next()
            .and_then(|f| f.parse().ok())
            .unwrap_or(0);
        if n <= failures {
            return Ok((
                StatusCode::SERVICE_UNAVAILABLE,
                format!("attempt {n} fails"),
            ));
        }
    }
    let status = if method == axum::http::Method::POST {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, format!("attempt {n}: {} bytes", body.len())))
}

async fn start() -> (Server, String) {
    let server = Server::default();
    let app = Router::new()
        .route("/{*path}", any(handle))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr: SocketAddr = listener.local_addr().expect("local address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (server, format!("http://{addr}"))
}

/// A stack whose breaker never opens on its own during a test (a window
/// of 100 attempts, judged after 100).
fn patient(name: &str) -> ClientStack {
    client_stack(name)
        .breaker_config(BreakerConfig::new().count_window(100).minimum_calls(100))
        .timeout(Duration::from_secs(10))
}

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client")
}

/// A body of `len` bytes that are not all alike, so a replay that drops,
/// repeats or reorders a chunk is caught.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test]
async fn get_send_returns_the_answer_with_its_url() {
    let (_server, base) = start().await;
    let client = patient("items").reqwest(reqwest_client());

    let url = format!("{base}/items?page=2");
    let response = client.get(&url).send().await.expect("answered");
    assert_eq!(response.status(), 200);
    assert_eq!(response.url().as_str(), url);
    assert_eq!(response.text().await.expect("a body"), "attempt 1: 0 bytes");
}

#[tokio::test]
async fn retries_happen_and_the_breaker_counts_every_attempt() {
    let (server, base) = start().await;
    let stack = patient("flaky");
    let breaker = stack.breaker_handle().clone();
    let client = stack.reqwest(reqwest_client());

    // One call; the dependency fails twice, then answers.
    let response = client
        .get(format!("{base}/fail/2/items"))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.expect("a body"), "attempt 3: 0 bytes");

    assert_eq!(
        server.attempts("/fail/2/items").len(),
        3,
        "three attempts on the wire"
    );
    assert_eq!(stack.retry_counters().retries, 2);
    let snapshot = breaker.snapshot();
    // Every attempt, not every call: three outcomes, two of them failures.
    assert_eq!(snapshot.window.calls, 3);
    assert_eq!(snapshot.window.failures, 2);
    assert_eq!(snapshot.totals.successful, 1);
    assert_eq!(snapshot.totals.failed, 2);
}

#[tokio::test]
async fn retried_body_is_replayed_byte_for_byte() {
    let (server, base) = start().await;
    let client = patient("orders").reqwest(reqwest_client());

    // A streamed body of three chunks (not `Clone`: the retry layer must
    // record it while the first attempt sends it).
    let sent = pattern(40 * 1024);
    let chunks: Vec<Result<http_body::Frame<Bytes>, Infallible>> = sent
        .chunks(16 * 1024)
        .map(|c| Ok(http_body::Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));

    let response = client
        .post(format!("{base}/fail/1/orders"))
        .header("idempotency-key", "order-42")
        .body(reqwest::Body::wrap(body))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 201);

    let attempts = server.attempts("/fail/1/orders");
    assert_eq!(attempts.len(), 2, "the 503 was retried once");
    for (i, attempt) in attempts.iter().enumerate() {
        assert_eq!(attempt.body.len(), sent.len(), "attempt {} length", i + 1);
        assert!(attempt.body == sent[..], "attempt {} bytes differ", i + 1);
    }
}

#[tokio::test]
async fn open_circuit_rejects_without_reaching_the_server() {
    let (server, base) = start().await;
    // Judged after 4 attempts; 2 attempts per call.
    let stack = client_stack("down")
        .breaker_config(
            BreakerConfig::new()
                .count_window(4)
                .minimum_calls(4)
                .open_period(Duration::from_secs(60)),
        )
        .max_attempts(2)
        .timeout(Duration::from_secs(10));
    let breaker = stack.breaker_handle().clone();
    let client = stack.reqwest(reqwest_client());

    // Two calls are four attempts: enough to open, because the breaker
    // counts attempts (counting calls, it would need four calls).
    for _ in 0..2 {
        let _ = client.get(format!("{base}/down")).send().await;
    }
    assert_eq!(server.attempts("/down").len(), 4);
    assert_eq!(breaker.snapshot().state, State::Open);

    let before = server.seen().len();
    let err = client
        .get(format!("{base}/down"))
        .send()
        .await
        .expect_err("rejected");
    let open = err.downcast_ref::<CircuitOpen>().expect("a CircuitOpen");
    assert_eq!(open.breaker(), "down");
    assert_eq!(server.seen().len(), before, "nothing reached the server");
    assert_eq!(breaker.snapshot().totals.rejected, 1);
}

#[tokio::test]
async fn deadline_is_propagated_as_a_header() {
    let (server, base) = start().await;
    let client = client_stack("budget")
        .timeout(Duration::from_secs(2))
        .reqwest(reqwest_client());

    // The stack's budget, less the time already spent.
    client
        .get(format!("{base}/whole"))
        .send()
        .await
        .expect("answered");
    let whole = server.attempts("/whole")[0]
        .budget_ms
        .expect("a budget header");
    assert!(whole > 1000 && whole <= 2000, "got {whole} ms");

    // A shorter budget for one call wins.
    client
        .get(format!("{base}/short"))
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .expect("answered");
    let short = server.attempts("/short")[0]
        .budget_ms
        .expect("a budget header");
    assert!(short > 0 && short <= 300, "got {short} ms");
}

#[tokio::test]
async fn each_retry_carries_the_budget_left() {
    let (server, base) = start().await;
    let client = patient("left").reqwest(reqwest_client());

    client
        .get(format!("{base}/fail/1/left"))
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .expect("answered");
    let budgets: Vec<u64> = server
        .attempts("/fail/1/left")
        .iter()
        .map(|s| s.budget_ms.expect("a budget header"))
        .collect();
    assert_eq!(budgets.len(), 2);
    assert!(
        budgets[0] <= 3000 && budgets[1] <= budgets[0],
        "got {budgets:?}"
    );
}

#[tokio::test]
async fn invalid_url_fails_at_send_without_a_call() {
    let (server, _base) = start().await;
    let stack = patient("invalid");
    let breaker = stack.breaker_handle().clone();
    let client = stack.reqwest(reqwest_client());

    let result = client.get("not a url").send().await;
    assert!(result.is_err(), "an invalid URL is an error");
    assert!(server.seen().is_empty());
    assert_eq!(breaker.snapshot().window.calls, 0);
}

#[cfg(feature = "reqwest-middleware")]
mod middleware {
    use super::*;
    use tower_breaker::reqwest::{downcast_error, StackMiddleware};
    use tower_breaker::{Breaker, Mode};
    use tower_retry_budget::error::AttemptsExhausted;

    fn client(stack: ClientStack) -> reqwest_middleware::ClientWithMiddleware {
        reqwest_middleware::ClientBuilder::new(reqwest_client())
            .with(StackMiddleware::new(stack))
            .build()
    }

    #[tokio::test]
    async fn middleware_counts_every_attempt_and_replays_the_body() {
        let (server, base) = start().await;
        let stack = patient("mw-orders");
        let breaker = stack.breaker_handle().clone();
        let client = client(stack.clone());

        let sent = pattern(20 * 1024);
        let response = client
            .post(format!("{base}/fail/2/mw-orders"))
            .header("idempotency-key", "order-7")
            .body(sent.clone())
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), 201);
        assert_eq!(response.url().path(), "/fail/2/mw-orders");

        let attempts = server.attempts("/fail/2/mw-orders");
        assert_eq!(attempts.len(), 3);
        for attempt in &attempts {
            assert!(attempt.body == sent[..], "a replay differs");
            assert!(attempt.budget_ms.is_some_and(|ms| ms <= 10_000));
        }
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.window.calls, 3, "every attempt counted");
        assert_eq!(snapshot.window.failures, 2);
        assert_eq!(stack.retry_counters().retries, 2);
    }

    #[tokio::test]
    async fn middleware_open_circuit_is_a_downcastable_error() {
        let (server, base) = start().await;
        let breaker = Breaker::new("mw-open");
        breaker.set_mode(Mode::ForcedOpen);
        let client = client(client_stack("mw-open").breaker(breaker));

        let err = client
            .get(format!("{base}/items"))
            .send()
            .await
            .expect_err("rejected");
        assert!(matches!(err, reqwest_middleware::Error::Middleware(_)));
        let open = downcast_error::<CircuitOpen>(&err).expect("a CircuitOpen");
        assert_eq!(open.breaker(), "mw-open");
        assert!(server.seen().is_empty(), "nothing reached the server");
    }

    #[tokio::test]
    async fn middleware_give_up_wraps_the_reqwest_error() {
        // A port nobody listens on: connection refused on every attempt.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        drop(listener);
        let stack = patient("mw-refused");
        let breaker = stack.breaker_handle().clone();
        let client = client(stack);

        let err = client
            .get(format!("http://{addr}/items"))
            .send()
            .await
            .expect_err("refused");
        // The retry layer gave up: its give-up stays a `Middleware` error
        // (so no retry middleware above retries it again), with the last
        // attempt's `reqwest::Error` beneath it.
        assert!(
            matches!(err, reqwest_middleware::Error::Middleware(_)),
            "{err:?}"
        );
        let exhausted = downcast_error::<AttemptsExhausted>(&err).expect("a give-up");
        assert_eq!(exhausted.attempts(), 3);
        let last = downcast_error::<reqwest::Error>(&err).expect("reqwest's error beneath");
        assert!(last.is_connect());
        // Refused connections are retried, and each attempt counted.
        assert_eq!(breaker.snapshot().window.failures, 3);
    }
}
