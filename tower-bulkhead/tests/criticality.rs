//! Criticality shedding: past its share of the limit, a criticality is
//! refused while more important ones are still admitted; the criticality
//! comes from the request's extension (HTTP requests) or the task-local
//! scope.

mod support;

use support::{request, Gate};
use tower::{Service, ServiceExt};
use tower_bulkhead::adaptive::Aimd;
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::{BulkheadLayer, HttpBulkheadLayer};
use tower_layer::Layer;
use tower_resilience_base::criticality::Criticality;

fn marked(criticality: Criticality) -> support::Request {
    let mut req = request();
    req.extensions_mut().insert(criticality);
    req
}

/// Takes `n` slots of `svc` with calls that hang on `gate`.
async fn fill<S>(svc: &mut S, n: usize) -> Vec<tokio_test::task::Spawn<S::Future>>
where
    S: Service<support::Request>,
    S::Error: std::fmt::Debug,
{
    let mut held = Vec::new();
    for _ in 0..n {
        let mut call = tokio_test::task::spawn(svc.ready().await.unwrap().call(request()));
        assert!(call.poll().is_pending());
        held.push(call);
    }
    held
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn at_sixty_percent_sheddable_is_refused_and_critical_admitted_from_the_scope() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("dep", 10);
    let handle = layer.handle();
    let mut svc = layer.layer(gate.service());
    let _held = fill(&mut svc, 6).await;

    // The client flavour in release-at-head mode reads the scope.
    // The criticality is read in `call`: the scope must be around it.
    let err = Criticality::Sheddable
        .scope(async { svc.ready().await.unwrap().call(request()).await })
        .await
        .unwrap_err();
    let full = err.downcast_ref::<BulkheadFull>().unwrap();
    assert_eq!((full.compartment(), full.limit()), ("dep", 10));
    // The error says it was shed for its criticality, not that the
    // compartment (6 of 10 in flight) was full.
    assert_eq!(full.shed(), Some(Criticality::Sheddable));
    assert_eq!(
        full.to_string(),
        "bulkhead compartment `dep` shed a `sheddable` call: over its share of the limit of 10"
    );
    assert_eq!(handle.stats().shed(), 1);
    assert_eq!(handle.rejected(), 1);

    // SheddablePlus (share 0.75: 7.5, rounded up to 8) still fits at 6.
    let ready = svc.ready().await.unwrap();
    let call = Criticality::SheddablePlus.sync_scope(|| ready.call(request()));
    let mut plus = tokio_test::task::spawn(call);
    assert!(plus.poll().is_pending());
    assert_eq!(handle.in_flight(), 7);

    // Critical, the default: admitted, in scope or not.
    let ready = svc.ready().await.unwrap();
    let call = Criticality::Critical.sync_scope(|| ready.call(request()));
    let mut critical = tokio_test::task::spawn(call);
    assert!(critical.poll().is_pending());
    let mut unmarked = tokio_test::task::spawn(svc.ready().await.unwrap().call(request()));
    assert!(unmarked.poll().is_pending());
    assert_eq!(handle.in_flight(), 9);
    assert_eq!(handle.stats().shed(), 1);
    gate.open_all();
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_http_flavour_reads_the_extension_first_and_answers_503() {
    let gate = Gate::new();
    let layer = HttpBulkheadLayer::new("api", 10);
    let handle = layer.handle();
    let mut svc = layer.layer(gate.service());
    let _held = fill(&mut svc, 6).await;

    let response = svc
        .ready()
        .await
        .unwrap()
        .call(marked(Criticality::Sheddable))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key(http::header::RETRY_AFTER));

    // The extension wins over a sheddable scope.
    let ready = svc.ready().await.unwrap();
    let call = Criticality::Sheddable.sync_scope(|| ready.call(marked(Criticality::Critical)));
    let mut critical = tokio_test::task::spawn(call);
    assert!(critical.poll().is_pending());
    // Without an extension, the scope counts.
    let response = Criticality::Sheddable
        .scope(async { svc.ready().await.unwrap().call(request()).await })
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(handle.stats().shed(), 2);
    gate.open_all();
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_client_flavour_in_body_mode_reads_the_extension() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("dep", 10).hold_until_body_end();
    let handle = layer.handle();
    let mut svc = layer.layer(gate.service());
    let _held = fill(&mut svc, 6).await;
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(marked(Criticality::Sheddable))
        .await
        .unwrap_err();
    assert!(err.is::<BulkheadFull>());
    assert_eq!(handle.stats().shed(), 1);
    gate.open_all();
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn below_the_lowest_share_every_criticality_is_admitted() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("dep", 10).hold_until_body_end();
    let handle = layer.handle();
    let mut svc = layer.layer(gate.service());
    let _held = fill(&mut svc, 4).await;
    let mut sheddable = tokio_test::task::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(marked(Criticality::Sheddable)),
    );
    assert!(sheddable.poll().is_pending(), "4 of 10: under half");
    assert_eq!(handle.in_flight(), 5);
    // Now at 5: the next sheddable one is over its half.
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(marked(Criticality::Sheddable))
        .await
        .unwrap_err();
    assert!(err.is::<BulkheadFull>());
    gate.open_all();
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shares_are_a_setting_and_shedding_can_be_turned_off() {
    let gate = Gate::new();
    // Off: a sheddable request may take the last slot.
    let off = BulkheadLayer::new("off", 3)
        .without_criticality_shedding()
        .hold_until_body_end();
    let mut svc = off.layer(gate.service());
    let _held = fill(&mut svc, 2).await;
    let mut last = tokio_test::task::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(marked(Criticality::Sheddable)),
    );
    assert!(last.poll().is_pending());

    // Custom: Critical keeps 2 of 10 slots from everyone else; out of
    // range values are brought into [0, 1].
    let layer = BulkheadLayer::new("custom", 10)
        .criticality_shares([0.0, 0.8, 7.0, f64::NAN])
        .hold_until_body_end();
    let handle = layer.handle();
    let mut svc = layer.layer(gate.service());
    let refused = svc
        .ready()
        .await
        .unwrap()
        .call(marked(Criticality::Sheddable))
        .await;
    assert!(
        refused.is_err(),
        "a zero share refuses even an empty compartment"
    );
    let _held = fill(&mut svc, 8).await;
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(marked(Criticality::SheddablePlus))
        .await
        .unwrap_err();
    assert!(err.is::<BulkheadFull>());
    let mut critical = tokio_test::task::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(marked(Criticality::CriticalPlus)),
    );
    assert!(critical.poll().is_pending());
    assert_eq!(handle.stats().shed(), 2);
    gate.open_all();
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn adaptive_compartments_shed_by_criticality_against_their_current_limit() {
    let gate = Gate::new();
    let layer = BulkheadLayer::adaptive("dep", Aimd::new().initial(10)).hold_until_body_end();
    let handle = layer.handle();
    let mut svc = layer.layer(gate.service());
    let _held = fill(&mut svc, 6).await;
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(marked(Criticality::Sheddable))
        .await
        .unwrap_err();
    assert_eq!(err.downcast_ref::<BulkheadFull>().unwrap().limit(), 10);
    let mut critical = tokio_test::task::spawn(
        svc.ready()
            .await
            .unwrap()
            .call(marked(Criticality::Critical)),
    );
    assert!(critical.poll().is_pending());
    assert_eq!((handle.in_flight(), handle.stats().shed()), (7, 1));
    gate.open_all();
}

/// A layer's `Debug` shows its shares as the fractions they were given
/// (kept in 1/1024ths, rounded up), for both flavours.
#[test]
fn a_layers_shares_read_back_as_fractions() {
    let shares = [0.25, 0.5, 0.75, 1.0];
    let plain = format!(
        "{:?}",
        BulkheadLayer::new("dep", 8).criticality_shares(shares)
    );
    let http = format!(
        "{:?}",
        HttpBulkheadLayer::new("dep", 8).criticality_shares(shares)
    );
    for debug in [plain, http] {
        assert!(
            debug.contains("criticality_shares: [0.25, 0.5, 0.75, 1.0]"),
            "{debug}"
        );
    }
}
