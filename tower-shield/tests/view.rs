//! The live view: its snapshot follows the stacks it shows (an open
//! circuit, its countdown, rejections, the bulkhead, retries, a throttle,
//! fault injection), and a real HTTP client fetches the JSON and the page
//! from an axum server on 127.0.0.1.
#![cfg(all(feature = "view", feature = "chaos"))]

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_shield::breaker::throttle::ThrottleLayer;
use tower_shield::breaker::BreakerConfig;
use tower_shield::chaos::{FaultHandle, FaultLayer, FaultPlan};
use tower_shield::client_stack;
use tower_shield::view::LiveView;

type Sent = Request<tower_shield::retry::body::ReplayBody<String>>;

/// A dependency that answers 503 to everything (behind the stack's retry
/// layer, which replays request bodies).
fn failing(
) -> impl tower::Service<Sent, Response = Response<String>, Error = BoxError, Future = impl Send> + Clone
{
    service_fn(|_req: Sent| async {
        let mut response = Response::new(String::new());
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        Ok::<_, BoxError>(response)
    })
}

/// An open circuit shows as open with its countdown and rejections; the
/// other dependency stays closed; the throttle and the faults show.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_snapshot_follows_the_stacks() {
    let payments = client_stack("payments")
        .breaker_config(
            BreakerConfig::new()
                .count_window(10)
                .minimum_calls(5)
                .open_period(Duration::from_secs(5)),
        )
        .throttle(ThrottleLayer::new("payments"));
    let catalog = client_stack("catalog");
    let faults = FaultHandle::new("payments-faults");
    let view = LiveView::new();
    view.add_client_stack(&payments);
    view.add_client_stack(&catalog);
    let _ = view.dependency("payments-faults").faults(faults.clone());

    let svc = payments.layer(FaultLayer::new(faults.clone()).layer(failing()));
    faults
        .set(FaultPlan::new().latency(1.0, Duration::from_millis(1)))
        .unwrap();
    for _ in 0..20 {
        let _ = svc.clone().oneshot(Request::new(String::new())).await;
    }
    let snapshot = view.snapshot();
    let names: Vec<_> = snapshot
        .dependencies
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, ["payments", "catalog", "payments-faults"]);
    let payments = &snapshot.dependencies[0];
    let breaker = payments.breaker.as_ref().unwrap();
    assert_eq!(breaker.state, "open");
    assert!(breaker.rejected > 0 && breaker.opened == 1, "{breaker:?}");
    let countdown = breaker.retry_after_ms.expect("a countdown while open");
    // The last transitions, newest first: the opening, with its window.
    let opening = &breaker.transitions[0];
    assert_eq!(
        (opening.from, opening.to, opening.cause),
        ("closed", "open", "failure_rate")
    );
    assert!(
        opening.failures >= 5 && opening.open_for_ms.is_some(),
        "{opening:?}"
    );
    // The open period, 5 s, with its jitter.
    assert!((1..=6_000).contains(&countdown), "{countdown}");
    // Below the breaker: only the calls it let through.
    let retries = payments.retries.as_ref().unwrap();
    // The breaker counts every attempt: 5 opened it.
    assert!(
        retries.requests >= 1 && retries.requests + retries.retries >= 5,
        "{retries:?}"
    );
    assert_eq!(payments.bulkhead.as_ref().unwrap().in_flight, 0);
    assert!(payments.throttle.as_ref().unwrap().requests > 0);
    assert_eq!(
        snapshot.dependencies[1].breaker.as_ref().unwrap().state,
        "closed"
    );
    let faults_view = snapshot.dependencies[2].faults.as_ref().unwrap();
    assert!(faults_view.on && faults_view.injected["latency"] > 0);

    // The countdown counts down.
    tokio::time::advance(Duration::from_secs(2)).await;
    let later = view.snapshot().dependencies[0]
        .breaker
        .as_ref()
        .unwrap()
        .retry_after_ms
        .unwrap();
    assert!(later + 1_500 <= countdown, "{later} {countdown}");

    // Registering a name again replaces it.
    view.add_client_stack(&client_stack("catalog"));
    assert_eq!(view.snapshot().dependencies.len(), 3);
}

/// The JSON has the documented keys and nothing else (no store, no
/// credentials, no request contents).
#[test]
fn the_json_shows_only_names_states_and_counters() {
    let view = LiveView::new();
    view.add_client_stack(&client_stack("catalog"));
    let json: Value = serde_json::from_str(&view.json()).unwrap();
    let top: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
    assert_eq!(top, ["dependencies", "taken_at_unix_ms"]);
    let dependency = &json["dependencies"][0];
    let mut keys: Vec<_> = dependency.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    assert_eq!(
        keys,
        ["breaker", "bulkhead", "faults", "name", "retries", "throttle"]
    );
    let mut breaker: Vec<_> = dependency["breaker"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    breaker.sort();
    assert_eq!(
        breaker,
        [
            "calls",
            "failed",
            "failure_rate",
            "failures",
            "mode",
            "opened",
            "probes_in_flight",
            "rejected",
            "retry_after_ms",
            "since_transition_ms",
            "slow",
            "slow_in_flight",
            "slow_rate",
            "state",
            "successful",
            "transitions"
        ]
    );
    assert_eq!(dependency["throttle"], Value::Null);
}

/// Served by axum on 127.0.0.1 and fetched with a real HTTP client: the
/// JSON (not cached) and the page, which loads nothing from elsewhere and
/// polls the path it was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_client_fetches_the_json_and_the_page() {
    let view = LiveView::new();
    view.add_client_stack(&client_stack("catalog"));
    let app = axum::Router::new()
        .route_service("/ops/resilience.json", view.json_service())
        .route_service("/ops/resilience", view.page_service("/ops/resilience.json"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let get = |path: &str| {
        Request::get(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };

    let response = client.request(get("/ops/resilience.json")).await.unwrap();
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.headers()["cache-control"], "no-store");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let json: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["dependencies"][0]["name"], "catalog");
    assert_eq!(json["dependencies"][0]["breaker"]["state"], "closed");

    let response = client.request(get("/ops/resilience")).await.unwrap();
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let page = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(page.contains(r#"const SOURCE = "/ops/resilience.json";"#));
    for outside in ["<script src", "<link", "url(", "@import", "https://"] {
        assert!(!page.contains(outside), "the page loads {outside}");
    }
}

/// A path given to the page cannot break out of its string.
#[test]
fn the_json_path_is_kept_inside_the_page_script() {
    let view = LiveView::new();
    let page = view.page_service(r#"/x";alert(1);//<script>"#);
    let rendered = format!("{page:?}");
    assert!(
        rendered.contains(r#"const SOURCE = \"/x;alert(1);//script\";"#),
        "{rendered}"
    );
}
