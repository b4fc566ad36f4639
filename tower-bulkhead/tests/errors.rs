//! The rejection is a typed error that survives boxing by other layers;
//! inner errors pass through unchanged.

mod support;

use std::time::Duration;

use support::{request, Gate};
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::BulkheadLayer;

#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("refused by the dependency")
    }
}

impl std::error::Error for Refused {}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn bulkhead_full_downcasts_behind_a_second_layer() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("payments", 1);
    let mut stack = ServiceBuilder::new()
        // A second layer that boxes the error again, as tower's do.
        .layer(tower::timeout::TimeoutLayer::new(Duration::from_secs(30)))
        .map_err(|e: BoxError| -> BoxError { e })
        .layer(layer.clone())
        .service(gate.service());

    let _held = tokio::spawn(stack.ready().await.unwrap().call(request()));
    tokio::task::yield_now().await;

    let err = stack
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap_err();
    assert!(err.is::<BulkheadFull>(), "got {err}");
    let full = err.downcast::<BulkheadFull>().unwrap();
    assert_eq!(full.compartment(), "payments");
    assert_eq!(full.waited(), Duration::ZERO);
    assert_eq!(full.shed(), None, "full, not shed for its criticality");
    assert_eq!(
        full.to_string(),
        "bulkhead compartment `payments` is full (1 in flight)"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inner_errors_pass_through_and_release_the_slot() {
    let layer = BulkheadLayer::new("dep", 1);
    let failing = service_fn(|_req: support::Request| async { Err::<(), _>(Refused) });
    let mut service = ServiceBuilder::new().layer(layer.clone()).service(failing);

    for _ in 0..3 {
        let err = service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap_err();
        assert!(err.is::<Refused>());
        assert!(!err.is::<BulkheadFull>());
    }
    assert_eq!(layer.handle().in_flight(), 0);
    assert_eq!(layer.handle().rejected(), 0);
}

#[test]
fn bulkhead_full_is_a_send_sync_static_error() {
    fn assert_error<E: std::error::Error + Send + Sync + Clone + 'static>() {}
    assert_error::<BulkheadFull>();
}
