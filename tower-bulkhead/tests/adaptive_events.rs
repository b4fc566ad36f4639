//! The adaptive limit's debug events. Alone in its test binary: it records
//! `tracing` events with a thread-local subscriber, and an event of a
//! callsite that another test's thread registers at the same moment can
//! miss a thread-local subscriber (tracing caches each callsite's interest
//! process-wide). In `adaptive.rs` this test failed once in a CI run.

mod support;

use std::time::Duration;

use support::{answers_after, request, together};
use tokio::time::{advance, timeout};
use tower::ServiceExt;
use tower_bulkhead::adaptive::Aimd;
use tower_bulkhead::BulkheadLayer;
use tower_layer::Layer;

const MS: Duration = Duration::from_millis(1);

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_change_of_limit_is_a_debug_event_at_most_one_per_second() {
    let events = support::Events::at_least(tracing::Level::DEBUG);
    let _guard = tracing::subscriber::set_default(events.clone());
    let layer = BulkheadLayer::adaptive("dep", Aimd::new().initial(20));
    let handle = layer.handle();
    let svc = layer.layer(answers_after(50 * MS));
    let cut_ten = || {
        let calls: Vec<_> = (0..10)
            .map(|_| timeout(5 * MS, svc.clone().oneshot(request())))
            .collect();
        together(calls)
    };
    let changes = |events: &support::Events| {
        events
            .seen()
            .into_iter()
            .filter(|(message, _)| message == "bulkhead limit changed")
            .collect::<Vec<_>>()
    };
    for _ in 0..3 {
        advance(20 * MS).await;
        cut_ten().await;
    }
    assert_eq!(handle.limit(), 14, "20, 18, 16, 14");
    assert_eq!(changes(&events).len(), 1, "the later two are suppressed");
    advance(Duration::from_secs(1)).await;
    cut_ten().await;
    assert_eq!(handle.limit(), 12);
    let seen = changes(&events);
    assert_eq!(seen.len(), 2);
    assert_eq!(
        support::suppressed(&seen[1]),
        2,
        "it reports the two suppressed changes"
    );
}
