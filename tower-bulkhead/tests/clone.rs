//! Clones of the layer and of the service share the compartments; every
//! `Layer::layer` call of one layer value shares them too.

mod support;

use support::{request, Gate};
use tower::{Service, ServiceExt};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::BulkheadLayer;
use tower_layer::Layer;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn services_from_separate_layer_calls_share_one_compartment() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("dep", 2);
    // As axum::serve does: one `layer` call per connection.
    let mut services: Vec<_> = (0..3).map(|_| layer.layer(gate.service())).collect();

    let mut held = Vec::new();
    for service in &mut services[..2] {
        let mut f = tokio_test::task::spawn(service.ready().await.unwrap().call(request()));
        assert!(f.poll().is_pending());
        held.push(f);
    }
    let err = services[2]
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap_err();
    assert!(err.is::<BulkheadFull>());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn clones_of_layer_and_service_share_counters() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("dep", 1);
    let layer_clone = layer.clone();
    let mut service = layer_clone.layer(gate.service());
    let mut service_clone = service.clone();

    let mut held = tokio_test::task::spawn(service.ready().await.unwrap().call(request()));
    assert!(held.poll().is_pending());
    assert!(service_clone
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .is_err());

    assert_eq!(layer.handle().in_flight(), 1);
    assert_eq!(layer.handle().rejected(), 1);
    assert_eq!(layer_clone.handle().rejected(), 1);
    assert_eq!(layer.handle().name(), "dep");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn separately_constructed_layers_do_not_share() {
    let gate = Gate::new();
    let a = BulkheadLayer::new("dep", 1);
    let b = BulkheadLayer::new("dep", 1);
    let mut sa = a.layer(gate.service());
    let mut sb = b.layer(gate.service());
    let mut held_a = tokio_test::task::spawn(sa.ready().await.unwrap().call(request()));
    assert!(held_a.poll().is_pending());
    let mut held_b = tokio_test::task::spawn(sb.ready().await.unwrap().call(request()));
    assert!(held_b.poll().is_pending());
    assert_eq!((a.handle().in_flight(), b.handle().in_flight()), (1, 1));
}
