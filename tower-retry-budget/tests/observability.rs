//! Observability: a tracing event per retry and per budget refusal, and
//! counters readable from the layer.

mod support;

use std::sync::Arc;

use support::{get, Log, Scripted};
use tower::{Layer, ServiceExt};
use tower_retry_budget::{RetryBudget, RetryLayer, SeededRandom};

use resilience_testkit::Capture;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_retry_and_each_refusal_is_an_event() {
    let capture = Capture::default();
    let _guard = resilience_testkit::set_default(capture.clone());

    let log = Log::new();
    let budget = Arc::new(
        RetryBudget::new()
            .ratio(0.0)
            .min_per_sec(1)
            .window(std::time::Duration::from_secs(2)),
    );
    let layer = RetryLayer::new()
        .budget(budget)
        .random(SeededRandom::new(5));
    let svc = layer.layer(Scripted::always(&log, 503));
    let _ = svc.clone().oneshot(get()).await.unwrap();
    let _ = svc.oneshot(get()).await.unwrap();

    let retries = capture.lines("retrying request");
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert!(
        retries[0].contains(" attempt=2 ")
            && retries[0].contains(" delay_ms=")
            && retries[0].ends_with("reason=\"503\""),
        "{}",
        retries[0]
    );
    assert!(retries[1].contains(" attempt=3 "), "{}", retries[1]);

    let refusals = capture.lines("retry refused by the retry budget");
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(refusals[0].contains(" attempt=1 "), "{}", refusals[0]);

    let c = layer.counters();
    assert_eq!((c.requests, c.retries, c.refused_by_budget), (2, 2, 1));
    assert_eq!(log.count(), 4);
}
