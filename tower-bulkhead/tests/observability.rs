//! Counters per compartment, and rejection events rate limited to one per
//! compartment per second.

mod support;

use std::time::Duration;

use support::{request, suppressed, warnings, Gate};
use tokio::time::advance;
use tower::{Service, ServiceExt};
use tower_bulkhead::BulkheadLayer;
use tower_layer::Layer;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_flood_of_rejections_logs_once_per_second_with_the_suppressed_count() {
    let events = warnings();
    let _guard = resilience_testkit::set_default(events.clone());

    let gate = Gate::new();
    let layer = BulkheadLayer::new("payments", 1);
    let mut service = layer.layer(gate.service());
    let mut held = tokio_test::task::spawn(service.ready().await.unwrap().call(request()));
    assert!(held.poll().is_pending());

    for _ in 0..100 {
        let _ = service.ready().await.unwrap().call(request()).await;
    }
    assert_eq!(events.seen().len(), 1, "one event for the first rejection");
    assert_eq!(suppressed(&events.seen()[0]), 0);

    advance(Duration::from_millis(999)).await;
    let _ = service.ready().await.unwrap().call(request()).await;
    assert_eq!(events.seen().len(), 1, "still within the second");

    advance(Duration::from_millis(2)).await;
    let _ = service.ready().await.unwrap().call(request()).await;
    let seen = events.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        suppressed(&seen[1]),
        100,
        "the rejections in between are counted"
    );
    assert!(seen[1].0.contains("bulkhead full"));
    assert_eq!(layer.handle().rejected(), 102);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_rejection_tells_time_by_the_clock_reading_of_its_call() {
    use tower_resilience_base::CallContext;

    let events = warnings();
    let _guard = resilience_testkit::set_default(events.clone());
    let gate = Gate::new();
    let mut service = BulkheadLayer::new("reading", 1).layer(gate.service());
    let mut held = tokio_test::task::spawn(service.ready().await.unwrap().call(request()));
    assert!(held.poll().is_pending());

    let _ = service.ready().await.unwrap().call(request()).await;
    assert_eq!(events.seen().len(), 1, "the first rejection warns");
    // tokio's clock has not moved, but a layer above read it 2 s later
    // (a reading handed down in the call's context): by that reading, the
    // next warning is due.
    let later = tokio::time::Instant::now() + Duration::from_secs(2);
    let ready = service.ready().await.unwrap();
    let rejected = CallContext::scoped(|cx| cx.set_now(later), || ready.call(request()));
    assert!(rejected.await.is_err());
    assert_eq!(events.seen().len(), 2, "due by the call's reading");
    // Without a reading, the clock's time: within the second of the last
    // warning.
    let _ = service.ready().await.unwrap().call(request()).await;
    assert_eq!(events.seen().len(), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_compartment_has_its_own_log_budget() {
    let events = warnings();
    let _guard = resilience_testkit::set_default(events.clone());

    let gate = Gate::new();
    let layer = BulkheadLayer::new("upstream", 0)
        .per_key(|req: &support::Request| req.uri().path().to_owned());
    let mut service = layer.layer(gate.service());
    for path in ["/a", "/b", "/a", "/b"] {
        let req = http::Request::get(path).body(()).unwrap();
        let _ = service.ready().await.unwrap().call(req).await;
    }
    assert_eq!(events.seen().len(), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn stats_report_in_flight_rejected_and_available() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("dep", 3);
    let handle = layer.handle();
    let mut service = layer.layer(gate.service());
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut f = tokio_test::task::spawn(service.ready().await.unwrap().call(request()));
        assert!(f.poll().is_pending());
        held.push(f);
    }
    let _ = service.ready().await.unwrap().call(request()).await;
    let stats = handle.stats();
    assert_eq!(stats.in_flight(), 3);
    assert_eq!(stats.available(), 0);
    assert_eq!(stats.limit(), 3);
    assert_eq!(stats.rejected(), 1);
    drop(held.pop());
    assert_eq!(handle.stats().available(), 1);
}
