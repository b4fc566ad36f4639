//! The keyed layer in server mode on an axum router, keyed by route: one
//! route's failures open only its own circuit.
//!
//! The key is the route's template, a `&'static str` (no allocation, and
//! made-up paths are not new keys). In an app, axum's `MatchedPath`
//! extension gives it (feature `matched-path`, on by default in axum, off
//! in this crate's dev-dependencies).

mod support;

use axum::body::Body;
use axum::extract::Request;
use axum::routing::get;
use axum::Router;
use support::*;
use tower::ServiceExt;
use tower_breaker::keyed::KeyedHttpBreakerLayer;
use tower_breaker::{BreakerRegistry, State};

/// The route template, not the raw path.
fn by_route(req: &Request) -> &'static str {
    match req.uri().path() {
        "/ok" => "/ok",
        path if path.starts_with("/flaky/") => "/flaky/{id}",
        _ => "unmatched",
    }
}

async fn status(app: &Router, path: &str) -> (u16, http::HeaderMap) {
    let request = Request::get(path).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    (response.status().as_u16(), response.headers().clone())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_routes_failures_open_only_its_circuit() {
    let routes = BreakerRegistry::new("routes", config().count_window(4).minimum_calls(4));
    let handled = CallCounter::default();
    let flaky_calls = handled.clone();
    let app = Router::new()
        .route(
            "/flaky/{id}",
            get(move || {
                flaky_calls.hit();
                async { (http::StatusCode::INTERNAL_SERVER_ERROR, "boom") }
            }),
        )
        .route("/ok", get(|| async { "fine" }))
        .layer(KeyedHttpBreakerLayer::new(routes.clone(), by_route));

    for id in 0..4 {
        assert_eq!(status(&app, &format!("/flaky/{id}")).await.0, 500);
        assert_eq!(status(&app, "/ok").await.0, 200);
    }
    let (code, headers) = status(&app, "/flaky/99").await;
    assert_eq!(code, 503, "answered by the open breaker");
    assert_eq!(headers["x-tower-no-retry"], "1");
    assert_eq!(headers["retry-after"], "5");
    assert_eq!(
        handled.calls(),
        4,
        "the failing handler was not called again"
    );
    for _ in 0..10 {
        assert_eq!(status(&app, "/ok").await.0, 200, "the other route answers");
    }

    let flaky = routes.find(&"/flaky/{id}").unwrap();
    assert_eq!(flaky.snapshot().state, State::Open);
    assert_eq!(flaky.name(), "routes:/flaky/{id}");
    let ok = routes.find(&"/ok").unwrap().snapshot();
    assert_eq!((ok.state, ok.totals.successful), (State::Closed, 14));
    assert_eq!(routes.len(), 2, "one breaker per route, not per path");

    // After the open period, one probe; the route is still broken.
    advance(secs(5)).await;
    assert_eq!(status(&app, "/flaky/1").await.0, 500);
    assert_eq!(status(&app, "/flaky/1").await.0, 503);
    assert_eq!(handled.calls(), 5);
}
