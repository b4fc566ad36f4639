//! reqwest through the client stack, end to end over real sockets on
//! 127.0.0.1: `tower_shield::reqwest::Client` (and, with the
//! `reqwest-middleware` feature, `StackMiddleware`) against a local axum
//! server that records every attempt it receives and can echo a request
//! back as it arrived, so that a request built by our builder can be
//! compared with the same request sent by plain reqwest. The timing tests
//! that need no socket run on paused time against a test service.
#![cfg(feature = "reqwest")]

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::any;
use axum::Router;
use tower::{service_fn, Layer};
use tower_breaker::error::CircuitOpen;
use tower_breaker::{BoxError, BreakerConfig, State};
use tower_deadline::error::DeadlineExceeded;
use tower_deadline::{ClientDeadlineLayer, Deadline};
use tower_shield::reqwest::{find_error, Client, HttpRequest, ReqwestService};
use tower_shield::stack::{client_stack, ClientStack};

/// One attempt as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    body: Bytes,
    budget_ms: Option<u64>,
}

/// The local dependency. `/fail/N/...` answers 503 to the first N attempts
/// on that path, then 200 (201 for a POST); `/down` always 503;
/// `/stall/...` answers after 30 s; `/echo/...` answers with the request
/// as it arrived ([`echo`]); anything else 200. Every attempt is recorded,
/// body included.
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
    if path.starts_with("/echo") {
        return Ok((StatusCode::OK, echo(&method, &uri, &headers, &body)));
    }
    if path.starts_with("/stall") {
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
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

/// The request as the server saw it: the method and the request target,
/// then every header, names sorted and each name's values in the order
/// they arrived (so a lost, merged or reordered value shows), then the
/// body. The budget header our stack writes is left out: plain reqwest
/// sends none.
fn echo(method: &axum::http::Method, uri: &Uri, headers: &HeaderMap, body: &Bytes) -> String {
    let mut by_name: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if name == "x-request-timeout-ms" {
            continue;
        }
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        by_name.entry(name.as_str()).or_default().push(value);
    }
    let mut out = format!("{method} {uri}\n");
    for (name, values) in by_name {
        let _ = writeln!(out, "{name}: {values:?}");
    }
    let _ = write!(out, "\n{}", String::from_utf8_lossy(body));
    out
}

/// The values of header `name` in an echo.
fn echoed<'a>(echo: &'a str, name: &str) -> Option<&'a str> {
    echo.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(": "))
}

async fn start() -> (Server, String) {
    let server = Server::default();
    let app = Router::new()
        // The head and a first chunk at once, then the body stalls for
        // ever (a GC pause, a buffering proxy, a half-dead upstream).
        .route(
            "/body-stall",
            any(|| async {
                use futures_util::StreamExt as _;
                let first = futures_util::stream::once(async {
                    Ok::<_, Infallible>(Bytes::from_static(b"first;"))
                });
                axum::body::Body::from_stream(first.chain(futures_util::stream::pending()))
            }),
        )
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
fn patient(name: &'static str) -> ClientStack {
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
async fn get_send_returns_the_answer_with_its_url_and_remote_address() {
    let (_server, base) = start().await;
    let client = patient("items").reqwest(reqwest_client());

    let url = format!("{base}/items?page=2");
    let response = client.get(&url).send().await.expect("answered");
    assert_eq!(response.status(), 200);
    assert_eq!(response.url().as_str(), url);
    // The connection's information comes through the stack too.
    let server: std::net::SocketAddr = base
        .trim_start_matches("http://")
        .parse()
        .expect("the server's address");
    assert_eq!(response.remote_addr(), Some(server));
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

/// The same request through our builder and the stack, and through plain
/// reqwest, as the echo server saw each.
async fn both(
    ours: tower_shield::reqwest::RequestBuilder,
    plain: reqwest::RequestBuilder,
) -> (String, String) {
    let ours = ours.send().await.expect("ours answered");
    assert_eq!(ours.status(), 200);
    let plain = plain.send().await.expect("plain reqwest answered");
    assert_eq!(plain.status(), 200);
    (
        ours.text().await.expect("our echo"),
        plain.text().await.expect("plain echo"),
    )
}

#[tokio::test]
async fn header_twice_sends_both_values_in_order() {
    let (_server, base) = start().await;
    let client = patient("headers").reqwest(reqwest_client());
    let plain = reqwest_client();
    let url = format!("{base}/echo/header");

    let (ours, theirs) = both(
        client
            .get(&url)
            .header("x-tag", "red")
            .header("x-tag", "blue"),
        plain
            .get(&url)
            .header("x-tag", "red")
            .header("x-tag", "blue"),
    )
    .await;
    assert_eq!(echoed(&ours, "x-tag"), Some(r#"["red", "blue"]"#), "{ours}");
    assert_eq!(ours, theirs);
}

#[tokio::test]
async fn headers_map_with_appended_values_arrives_intact() {
    // Regression: `headers(HeaderMap)` kept only the first value of each
    // name, and replaced what the builder already had instead of merging
    // as reqwest does.
    let (_server, base) = start().await;
    let client = patient("header-map").reqwest(reqwest_client());
    let plain = reqwest_client();
    let url = format!("{base}/echo/headers");
    let map = || {
        let mut map = reqwest::header::HeaderMap::new();
        for tag in ["red", "green", "blue"] {
            map.append("x-tag", tag.parse().expect("a value"));
        }
        map.append("x-other", "one".parse().expect("a value"));
        map
    };

    let (ours, theirs) = both(
        client
            .get(&url)
            .header("x-kept", "before")
            .header("x-tag", "replaced")
            .headers(map()),
        plain
            .get(&url)
            .header("x-kept", "before")
            .header("x-tag", "replaced")
            .headers(map()),
    )
    .await;
    assert_eq!(
        echoed(&ours, "x-tag"),
        Some(r#"["red", "green", "blue"]"#),
        "{ours}"
    );
    assert_eq!(echoed(&ours, "x-other"), Some(r#"["one"]"#));
    assert_eq!(echoed(&ours, "x-kept"), Some(r#"["before"]"#));
    assert_eq!(ours, theirs);
}

#[tokio::test]
async fn basic_and_bearer_auth_match_reqwest() {
    let (_server, base) = start().await;
    let client = patient("auth").reqwest(reqwest_client());
    let plain = reqwest_client();
    let url = format!("{base}/echo/auth");

    let (ours, theirs) = both(
        client.get(&url).basic_auth("ops", Some("secret")),
        plain.get(&url).basic_auth("ops", Some("secret")),
    )
    .await;
    assert_eq!(
        echoed(&ours, "authorization"),
        Some(r#"["Basic b3BzOnNlY3JldA=="]"#)
    );
    assert_eq!(ours, theirs);

    let (ours, theirs) = both(
        client.get(&url).basic_auth("ops", None::<&str>),
        plain.get(&url).basic_auth("ops", None::<&str>),
    )
    .await;
    assert_eq!(ours, theirs);

    let (ours, theirs) = both(
        client.get(&url).bearer_auth("t0ken"),
        plain.get(&url).bearer_auth("t0ken"),
    )
    .await;
    assert_eq!(echoed(&ours, "authorization"), Some(r#"["Bearer t0ken"]"#));
    assert_eq!(ours, theirs);
}

#[tokio::test]
async fn url_userinfo_becomes_basic_authorization() {
    // Regression: a URL's userinfo was dropped instead of becoming the
    // `Authorization: Basic` header reqwest's builder makes of it.
    let (_server, base) = start().await;
    let client = patient("userinfo").reqwest(reqwest_client());
    let plain = reqwest_client();
    let url = base.replacen("http://", "http://user:pa%20ss@", 1) + "/echo/userinfo";

    let response = client.get(&url).send().await.expect("answered");
    // The credentials leave the URL (percent-decoded into the header).
    assert_eq!(
        response.url().as_str(),
        format!("{base}/echo/userinfo"),
        "no userinfo left in the URL"
    );
    let ours = response.text().await.expect("an echo");
    assert_eq!(
        echoed(&ours, "authorization"),
        Some(r#"["Basic dXNlcjpwYSBzcw=="]"#),
        "{ours}"
    );
    let theirs = plain
        .get(&url)
        .send()
        .await
        .expect("answered")
        .text()
        .await
        .expect("an echo");
    assert_eq!(ours, theirs);
}

#[cfg(feature = "reqwest-query")]
#[tokio::test]
async fn query_matches_reqwest() {
    let (_server, base) = start().await;
    let client = patient("query").reqwest(reqwest_client());
    let plain = reqwest_client();
    let url = format!("{base}/echo/query?page=2");
    let pairs = [("q", "red apples & pears"), ("sort", "prix/€"), ("q", "x")];

    let (ours, theirs) = both(
        client.get(&url).query(&pairs),
        plain.get(&url).query(&pairs),
    )
    .await;
    assert!(
        ours.starts_with(
            "GET /echo/query?page=2&q=red+apples+%26+pears&sort=prix%2F%E2%82%AC&q=x\n"
        ),
        "{ours}"
    );
    assert_eq!(ours, theirs);
}

#[cfg(feature = "reqwest-form")]
#[tokio::test]
async fn form_matches_reqwest() {
    let (_server, base) = start().await;
    let client = patient("form").reqwest(reqwest_client());
    let plain = reqwest_client();
    let url = format!("{base}/echo/form");
    let form = [("sku", "apples"), ("note", "ripe & red")];

    let (ours, theirs) = both(client.post(&url).form(&form), plain.post(&url).form(&form)).await;
    assert_eq!(
        echoed(&ours, "content-type"),
        Some(r#"["application/x-www-form-urlencoded"]"#)
    );
    assert!(ours.ends_with("\n\nsku=apples&note=ripe+%26+red"), "{ours}");
    assert_eq!(ours, theirs);
}

#[cfg(feature = "reqwest-json")]
#[tokio::test]
async fn json_matches_reqwest() {
    let (_server, base) = start().await;
    let client = patient("json").reqwest(reqwest_client());
    let plain = reqwest_client();
    let url = format!("{base}/echo/json");
    let order = BTreeMap::from([("sku", "apples"), ("note", "\"ripe\"")]);

    let (ours, theirs) = both(client.put(&url).json(&order), plain.put(&url).json(&order)).await;
    assert_eq!(
        echoed(&ours, "content-type"),
        Some(r#"["application/json"]"#)
    );
    assert!(
        ours.ends_with(r#"{"note":"\"ripe\"","sku":"apples"}"#),
        "{ours}"
    );
    assert_eq!(ours, theirs);
}

#[cfg(feature = "reqwest-multipart")]
#[tokio::test]
async fn multipart_sends_reqwests_form() {
    let (server, base) = start().await;
    let client = patient("multipart").reqwest(reqwest_client());
    let form = reqwest::multipart::Form::new()
        .text("sku", "apples")
        .text("note", "ripe");

    let response = client
        .post(format!("{base}/echo/multipart"))
        .multipart(form)
        .send()
        .await
        .expect("answered");
    let echo = response.text().await.expect("an echo");
    let content_type = echoed(&echo, "content-type").expect("a content type");
    assert!(
        content_type.contains("multipart/form-data; boundary="),
        "{echo}"
    );
    let body = &server.attempts("/echo/multipart")[0].body;
    let body = String::from_utf8_lossy(body);
    assert!(body.contains("name=\"sku\"\r\n\r\napples\r\n"), "{body}");
    assert!(body.contains("name=\"note\"\r\n\r\nripe\r\n"), "{body}");
}

#[tokio::test]
async fn a_users_reqwest_client_goes_under_the_stack() {
    let (_server, base) = start().await;
    let mut defaults = reqwest::header::HeaderMap::new();
    defaults.insert("x-client", "catalog-app".parse().expect("a value"));
    let users = reqwest::Client::builder()
        .no_proxy()
        .user_agent("catalog-app/1.0")
        .default_headers(defaults)
        .connect_timeout(Duration::from_secs(1))
        .build()
        .expect("the user's reqwest client");
    let stack = patient("users-client");
    let breaker = stack.breaker_handle().clone();
    let client = stack.reqwest(users);

    let echo = client
        .get(format!("{base}/echo/users"))
        .send()
        .await
        .expect("answered")
        .text()
        .await
        .expect("an echo");
    // The user's settings are applied by the client at the bottom.
    assert_eq!(echoed(&echo, "user-agent"), Some(r#"["catalog-app/1.0"]"#));
    assert_eq!(echoed(&echo, "x-client"), Some(r#"["catalog-app"]"#));
    assert_eq!(breaker.snapshot().window.calls, 1, "through the breaker");
}

#[tokio::test]
async fn execute_sends_a_built_and_changed_request() {
    let (server, base) = start().await;
    let client = patient("execute").reqwest(reqwest_client());

    let mut request = client
        .get(format!("{base}/echo/first"))
        .header("x-tag", "built")
        .build()
        .expect("a request");
    request.url_mut().set_path("/echo/second");
    let echo = client
        .execute(request)
        .await
        .expect("answered")
        .text()
        .await
        .expect("an echo");
    assert!(echo.starts_with("GET /echo/second\n"), "{echo}");
    assert_eq!(echoed(&echo, "x-tag"), Some(r#"["built"]"#));
    assert!(server.attempts("/echo/first").is_empty());

    // The same through `build_split`, and a `try_clone` sent twice.
    let builder = client.get(format!("{base}/echo/twice"));
    let copy = builder.try_clone().expect("a bodiless builder clones");
    let (client, request) = builder.build_split();
    client
        .execute(request.expect("a request"))
        .await
        .expect("answered");
    copy.send().await.expect("answered");
    assert_eq!(server.attempts("/echo/twice").len(), 2);
}

/// The deadlines a [`recording`] stack saw, one per request.
type Deadlines = Arc<Mutex<Vec<Option<Deadline>>>>;

/// A test stack that records the deadline each request carries and
/// answers after `delay`.
fn recording(
    delay: Duration,
) -> (
    Deadlines,
    impl tower::Service<HttpRequest, Response = http::Response<reqwest::Body>, Error = Infallible>
        + Clone,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let service = service_fn(move |request: HttpRequest| {
        let record = Arc::clone(&record);
        async move {
            record
                .lock()
                .expect("not poisoned")
                .push(Deadline::from_extensions(request.extensions()));
            tokio::time::sleep(delay).await;
            Ok::<_, Infallible>(http::Response::new(reqwest::Body::from("ok")))
        }
    });
    (seen, service)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn timeout_counts_from_send_not_from_the_builder() {
    // Regression: the budget started when `timeout()` was called, so time
    // spent between building and sending was taken from it.
    let (seen, stack) = recording(Duration::ZERO);
    let client = Client::from_parts(reqwest::Client::new(), stack);

    let builder = client
        .get("http://127.0.0.1:9/items")
        .timeout(Duration::from_millis(100));
    tokio::time::advance(Duration::from_millis(250)).await;
    let sent = tokio::time::Instant::now();
    let call = builder.send();
    // Counted from `send()`, not from the first poll, as reqwest does.
    tokio::time::advance(Duration::from_millis(30)).await;
    call.await.expect("answered");
    assert_eq!(
        seen.lock().expect("not poisoned")[..],
        [Some(Deadline::at(sent + Duration::from_millis(100)))]
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_stacks_deadline_enforces_the_timeout_from_send() {
    for (delay_ms, in_time) in [(99, true), (101, false)] {
        let (_seen, inner) = recording(Duration::from_millis(delay_ms));
        let client = Client::from_parts(
            reqwest::Client::new(),
            ClientDeadlineLayer::new().layer(inner),
        );
        let builder = client
            .get("http://127.0.0.1:9/items")
            .timeout(Duration::from_millis(100));
        // Longer than the timeout, between building and sending.
        tokio::time::advance(Duration::from_millis(500)).await;
        let result = builder.send().await;
        if in_time {
            let response = result.expect("answered within 100 ms of send");
            assert_eq!(response.text().await.expect("a body"), "ok");
        } else {
            let err = result.expect_err("cut at 100 ms after send");
            assert!(err.is::<DeadlineExceeded>(), "{err:?}");
        }
    }
}

#[tokio::test]
async fn timeout_counts_from_send_over_a_real_socket() {
    let (server, base) = start().await;
    let client = patient("late-send").reqwest(reqwest_client());

    let builder = client
        .get(format!("{base}/items"))
        .timeout(Duration::from_millis(500));
    // A real wait (the socket needs real time, so no paused clock here):
    // longer than the timeout, before `send`.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let response = builder.send().await.expect("the budget starts at send");
    assert_eq!(response.status(), 200);
    let budget = server.attempts("/items")[0]
        .budget_ms
        .expect("a budget header");
    assert!(budget > 0 && budget <= 500, "got {budget} ms");
}

#[tokio::test]
async fn a_server_stalling_past_the_timeout_fails_with_deadline_exceeded() {
    let (server, base) = start().await;
    let client = patient("stall").reqwest(reqwest_client());

    let started = tokio::time::Instant::now();
    let err = client
        .get(format!("{base}/stall/items"))
        .timeout(Duration::from_millis(200))
        .send()
        .await
        .expect_err("the server answers after 30 s");
    assert!(err.is::<DeadlineExceeded>(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "cut by the deadline, not by the server"
    );
    assert_eq!(server.attempts("/stall/items").len(), 1, "not retried");
}

#[tokio::test]
async fn a_body_that_stalls_after_the_head_fails_at_the_deadline_and_counts_a_failure() {
    let (_server, base) = start().await;
    let deadline = Duration::from_millis(300);
    let stack = patient("body-stall").timeout(deadline);
    let (breaker, bulkhead) = (stack.breaker_handle().clone(), stack.bulkhead_handle());
    let client = stack.reqwest(reqwest_client());

    let started = tokio::time::Instant::now();
    let mut response = client
        .get(format!("{base}/body-stall"))
        .send()
        .await
        .expect("the head comes at once");
    assert_eq!(response.status(), 200);
    assert_eq!(bulkhead.in_flight(), 1, "the body is still coming");
    assert_eq!(
        response.chunk().await.expect("the first chunk"),
        Some(Bytes::from_static(b"first;"))
    );
    let err = response.text().await.expect_err("the body stalls");
    let elapsed = started.elapsed();
    println!("stalled body cut after {elapsed:?} (deadline {deadline:?})");
    assert!(find_error::<DeadlineExceeded>(&err).is_some(), "{err:?}");
    assert!(elapsed >= deadline, "cut early: {elapsed:?}");
    assert!(
        elapsed < deadline + Duration::from_secs(2),
        "cut late: {elapsed:?}"
    );
    let totals = breaker.snapshot().totals;
    assert_eq!((totals.successful, totals.failed), (0, 1));
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn a_response_dropped_half_read_frees_the_bulkhead_slot() {
    let (_server, base) = start().await;
    let stack = patient("body-drop");
    let (breaker, bulkhead) = (stack.breaker_handle().clone(), stack.bulkhead_handle());
    let client = stack.reqwest(reqwest_client());

    let mut response = client
        .get(format!("{base}/body-stall"))
        .send()
        .await
        .expect("the head comes at once");
    response.chunk().await.expect("the first chunk");
    assert_eq!(bulkhead.in_flight(), 1);
    drop(response);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(breaker.snapshot().totals.successful, 1, "as its head said");
}

#[tokio::test]
async fn a_body_error_of_the_stack_reaches_text_with_its_type() {
    // The stack's answer streams one chunk, then fails the way a deadline
    // held by the body would.
    let stack = service_fn(|_: HttpRequest| async {
        let frames: Vec<Result<http_body::Frame<Bytes>, BoxError>> = vec![
            Ok(http_body::Frame::data(Bytes::from_static(b"partial"))),
            Err(DeadlineExceeded::new().into()),
        ];
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        Ok::<_, Infallible>(http::Response::new(body))
    });
    let client = Client::from_parts(reqwest::Client::new(), stack);

    let mut response = client
        .get("http://127.0.0.1:9/items")
        .send()
        .await
        .expect("the head arrives");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.chunk().await.expect("the first chunk"),
        Some(Bytes::from_static(b"partial"))
    );
    let err = response.text().await.expect_err("the body fails");
    assert!(err.is_decode(), "{err:?}");
    assert!(
        find_error::<DeadlineExceeded>(&err).is_some(),
        "the typed error in the source chain: {err:?}"
    );
    assert!(find_error::<std::io::Error>(&err).is_none());
}

#[test]
fn client_new_finds_the_transport_of_a_hand_built_stack() {
    // A default header marks the transport's client; reqwest's `Debug`
    // of a client shows its default headers.
    let mut marker = reqwest::header::HeaderMap::new();
    marker.insert("x-marker", "the-transport".parse().expect("a value"));
    let transport = ReqwestService::client_builder()
        .no_proxy()
        .default_headers(marker)
        .build()
        .expect("a reqwest client");
    let stack = ClientDeadlineLayer::new()
        .layer(patient("hand-built").layer(ReqwestService::new(transport)));
    let client = Client::new(stack);
    let found = format!("{:?}", client.reqwest_client());
    assert!(found.contains("the-transport"), "{found}");
    let request = client
        .get("http://127.0.0.1:9/items")
        .build()
        .expect("a request");
    assert_eq!(request.url().path(), "/items");
}

#[cfg(feature = "reqwest-middleware")]
mod middleware {
    use super::*;
    use tower_breaker::{Breaker, Mode};
    use tower_retry_budget::error::AttemptsExhausted;
    use tower_shield::reqwest::{downcast_error, StackMiddleware};

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
        // The last attempt's outcome waits for its body.
        assert_eq!(breaker.snapshot().window.calls, 2);
        assert!(response
            .text()
            .await
            .expect("the body")
            .starts_with("attempt 3"));
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
