//! Per-key compartments: isolation between keys, a bounded registry, idle
//! eviction and the fallback compartment.

mod support;

use std::time::Duration;

use support::{request_to, Gate};
use tokio::time::advance;
use tower::{Service, ServiceExt};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::BulkheadLayer;
use tower_layer::Layer;

fn host_key(req: &support::Request) -> String {
    req.uri().host().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_saturated_key_leaves_the_other_key_untouched() {
    let slow = Gate::new();
    let layer = BulkheadLayer::new("upstream", 2).per_key(host_key);
    let mut service = layer.layer(slow.service());

    // Saturate "payments".
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut f =
            tokio_test::task::spawn(service.ready().await.unwrap().call(request_to("payments")));
        assert!(f.poll().is_pending());
        held.push(f);
    }
    let err = service
        .ready()
        .await
        .unwrap()
        .call(request_to("payments"))
        .await
        .unwrap_err();
    let full = err.downcast_ref::<BulkheadFull>().unwrap();
    assert_eq!(full.compartment(), "upstream[\"payments\"]");

    // "search" still has its whole compartment, every time.
    slow.open_all();
    for _ in 0..20 {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request_to("search"))
            .await
            .unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
    }
    let handle = layer.handle();
    assert_eq!(handle.get(&"search".to_owned()).unwrap().rejected(), 0);
    let payments = handle.get(&"payments".to_owned()).unwrap();
    assert_eq!((payments.in_flight(), payments.rejected()), (2, 1));
    drop(held);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hundred_thousand_distinct_keys_never_grow_the_registry_past_its_bound() {
    const MAX_KEYS: usize = 64;
    let gate = Gate::new();
    gate.open_all();
    let layer = BulkheadLayer::new("tenants", 4)
        .per_key(|req: &support::Request| req.headers()["x-tenant"].clone())
        .max_keys(MAX_KEYS);
    let handle = layer.handle();
    let mut service = layer.layer(gate.service());

    for i in 0..100_000u32 {
        let req = http::Request::builder()
            .header("x-tenant", i)
            .body(())
            .unwrap();
        service.ready().await.unwrap().call(req).await.unwrap();
        assert!(handle.len() <= MAX_KEYS);
    }
    assert_eq!(handle.len(), MAX_KEYS);
    assert_eq!(handle.snapshot().len(), MAX_KEYS);
    assert_eq!(gate.calls(), 100_000);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn past_the_bound_new_keys_share_the_fallback_compartment() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("upstream", 5)
        .per_key(host_key)
        .max_keys(1)
        .fallback_limit(1);
    let handle = layer.handle();
    let mut service = layer.layer(gate.service());

    let mut a = tokio_test::task::spawn(service.ready().await.unwrap().call(request_to("a")));
    assert!(a.poll().is_pending());
    // "b" and "c" are new while the registry is full: one fallback slot.
    let mut b = tokio_test::task::spawn(service.ready().await.unwrap().call(request_to("b")));
    assert!(b.poll().is_pending());
    let err = service
        .ready()
        .await
        .unwrap()
        .call(request_to("c"))
        .await
        .unwrap_err();
    let full = err.downcast_ref::<BulkheadFull>().unwrap();
    assert_eq!(full.compartment(), "upstream/fallback");
    assert_eq!(handle.fallback().in_flight(), 1);
    assert_eq!(handle.fallback().rejected(), 1);
    assert!(handle.get(&"b".to_owned()).is_none());
    // The known key keeps its own, larger compartment.
    let mut a2 = tokio_test::task::spawn(service.ready().await.unwrap().call(request_to("a")));
    assert!(a2.poll().is_pending());
    assert_eq!(handle.get(&"a".to_owned()).unwrap().in_flight(), 2);
}

const IDLE: Duration = Duration::from_secs(10);
const MS: Duration = Duration::from_millis(1);

/// A registry of two keys filled at t = 0, then a new key after `after`:
/// does it get its own compartment?
async fn new_key_gets_own_compartment_after(after: Duration) -> bool {
    let gate = Gate::new();
    gate.open_all();
    let layer = BulkheadLayer::new("upstream", 1)
        .per_key(host_key)
        .max_keys(2)
        .idle_timeout(IDLE);
    let handle = layer.handle();
    let mut service = layer.layer(gate.service());
    for host in ["a", "b"] {
        service
            .ready()
            .await
            .unwrap()
            .call(request_to(host))
            .await
            .unwrap();
    }
    advance(after).await;
    service
        .ready()
        .await
        .unwrap()
        .call(request_to("c"))
        .await
        .unwrap();
    handle.get(&"c".to_owned()).is_some()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn idle_compartments_are_kept_until_the_idle_timeout() {
    assert!(!new_key_gets_own_compartment_after(IDLE - MS).await);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn idle_compartments_are_evicted_after_the_idle_timeout() {
    assert!(new_key_gets_own_compartment_after(IDLE + MS).await);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn busy_compartments_survive_the_idle_timeout() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("upstream", 1)
        .per_key(host_key)
        .max_keys(1)
        .idle_timeout(IDLE);
    let handle = layer.handle();
    let mut service = layer.layer(gate.service());
    let mut a = tokio_test::task::spawn(service.ready().await.unwrap().call(request_to("a")));
    assert!(a.poll().is_pending());

    advance(IDLE * 3).await;
    let mut b = tokio_test::task::spawn(service.ready().await.unwrap().call(request_to("b")));
    assert!(b.poll().is_pending());
    assert!(handle.get(&"a".to_owned()).is_some(), "still in flight");
    assert!(
        handle.get(&"b".to_owned()).is_none(),
        "went to the fallback"
    );
    assert_eq!(handle.fallback().in_flight(), 1);
}
