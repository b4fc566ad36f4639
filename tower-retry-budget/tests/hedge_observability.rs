//! Observability of the hedging layer: an event per hedge sent, won and
//! refused (with its reason) and per pause on pushback, and the counters.

mod hedge_support;

use std::sync::Arc;

use hedge_support::{get, Replicas, Reply, MS};
use tower::{Layer, ServiceExt};
use tower_retry_budget::hedge::HedgeLayer;
use tower_retry_budget::RetryBudget;

use resilience_testkit::Capture;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_hedge_sent_won_and_refused_is_an_event() {
    let capture = Capture::default();
    let _guard = resilience_testkit::set_default(capture.clone());

    // Room for one hedge (the floor: 1 per second over a 1 s window).
    let budget = Arc::new(
        RetryBudget::new()
            .ratio(0.0)
            .min_per_sec(1)
            .window(std::time::Duration::from_secs(1)),
    );
    let layer = HedgeLayer::new().fixed_delay(20 * MS).budget(budget);
    let replicas = Replicas::new(|n| match n {
        0 | 2 => (500 * MS, Reply::Status(200)),
        _ => (5 * MS, Reply::Status(200)),
    });
    let svc = layer.layer(replicas);
    svc.clone().oneshot(get()).await.unwrap();
    svc.oneshot(get()).await.unwrap();

    let sent = capture.lines("hedge sent");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0], "hedge sent attempt=2 delay_ms=20");
    assert_eq!(capture.lines("hedge won"), ["hedge won attempt=2"]);
    assert_eq!(
        capture.lines("hedge refused"),
        ["hedge refused attempt=2 reason=\"retry budget\""]
    );

    let c = layer.counters();
    assert_eq!(
        (
            c.requests,
            c.hedges,
            c.hedges_won,
            c.refused_by_budget,
            c.cancelled
        ),
        (2, 1, 1, 1, 1)
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_pause_on_pushback_is_an_event() {
    let capture = Capture::default();
    let _guard = resilience_testkit::set_default(capture.clone());
    let replicas = Replicas::new(|n| match n {
        0 => (50 * MS, Reply::Status(200)),
        _ => (5 * MS, Reply::With(503, "grpc-retry-pushback-ms", "1500")),
    });
    HedgeLayer::new()
        .fixed_delay(20 * MS)
        .layer(replicas)
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(
        capture.lines("server pushed back"),
        ["server pushed back: hedging paused pause_ms=1500"]
    );
}
