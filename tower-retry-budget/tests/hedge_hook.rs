//! The hedging layer and the layers around it: every hedge admitted and
//! counted through the breaker's hook, losers reported as cancelled, a
//! retry layer below reporting each attempt's retries, and a bulkhead
//! below whose permits cancelled losers give back.

mod hedge_support;

use std::sync::Arc;
use std::time::Duration;

use hedge_support::{get, post, Event, ModelBreaker, Replicas, Reply, MS};
use http::Request;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_bulkhead::BulkheadLayer;
use tower_resilience_base::hook::Attempts;
use tower_resilience_base::CallContext;
use tower_retry_budget::hedge::HedgeLayer;
use tower_retry_budget::{AttemptToken, BoxError, RetryLayer, SeededRandom, RETRY_ATTEMPT_HEADER};

/// Calls `svc` with `breaker`'s hook on offer, as a breaker layer above
/// does; returns the response and whether the hook came back untaken.
async fn through_breaker<S>(
    breaker: &Arc<ModelBreaker>,
    mut svc: S,
    request: Request<String>,
) -> (Result<http::Response<String>, BoxError>, bool)
where
    S: Service<Request<String>, Response = http::Response<String>, Error = BoxError>,
{
    svc.ready().await.unwrap();
    let attempts = Attempts::new(breaker.clone(), AttemptToken::new(1, 0));
    let (future, left) = CallContext::offer_attempts(attempts, || svc.call(request));
    // An untaken hook: the breaker counts the call itself (here: drop it).
    let untaken = left.and_then(Attempts::into_in_flight).is_some();
    (future.await, untaken)
}

fn layer() -> HedgeLayer {
    HedgeLayer::new().fixed_delay(20 * MS)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_hedge_is_admitted_through_the_hook_and_the_loser_cancelled() {
    let breaker = ModelBreaker::new();
    let replicas = Replicas::first_slow(500 * MS, 5 * MS);
    let (response, untaken) = through_breaker(&breaker, layer().layer(replicas), get()).await;
    assert_eq!(response.unwrap().status(), 200);
    assert!(!untaken, "the hedging layer took the hook");
    assert_eq!(
        breaker.events(),
        [
            Event::Check,
            Event::Admit,
            Event::Record(Ok(200)),
            Event::Cancel
        ],
        "asked, admitted, the hedge's answer counted, the first attempt cancelled"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_fast_answer_is_recorded_once() {
    let breaker = ModelBreaker::new();
    let replicas = Replicas::all(5 * MS);
    let (response, _) = through_breaker(&breaker, layer().layer(replicas), get()).await;
    assert_eq!(response.unwrap().status(), 200);
    assert_eq!(breaker.events(), [Event::Record(Ok(200))]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_open_circuit_refuses_the_hedge_before_any_budget_is_spent() {
    let breaker = ModelBreaker::new();
    breaker.open();
    let replicas = Replicas::first_slow(100 * MS, 5 * MS);
    let layer = layer();
    let (response, _) = through_breaker(&breaker, layer.layer(replicas.clone()), get()).await;
    assert_eq!(
        response.unwrap().status(),
        200,
        "the first attempt still answers"
    );
    assert_eq!(replicas.count(), 1);
    assert_eq!(breaker.events(), [Event::Check, Event::Record(Ok(200))]);
    let budget = layer.shared_budget().counters();
    assert_eq!((budget.retries, budget.refunded), (0, 0), "no token");
    assert_eq!(layer.counters().refused_by_breaker, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_half_open_circuit_refuses_the_hedge_at_admission_and_the_token_comes_back() {
    let breaker = ModelBreaker::new();
    breaker.half_open();
    let replicas = Replicas::first_slow(100 * MS, 5 * MS);
    let layer = layer();
    let (response, _) = through_breaker(&breaker, layer.layer(replicas.clone()), get()).await;
    assert_eq!(response.unwrap().status(), 200);
    assert_eq!(replicas.count(), 1);
    assert_eq!(
        breaker.events(),
        [Event::Check, Event::Refused, Event::Record(Ok(200))]
    );
    let budget = layer.shared_budget().counters();
    assert_eq!((budget.retries, budget.refunded), (0, 1), "refunded");
    assert_eq!(layer.counters().refused_by_breaker, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_that_is_not_hedged_leaves_the_hook_to_the_layers_below() {
    let breaker = ModelBreaker::new();
    let replicas = Replicas::first_slow(100 * MS, 5 * MS);
    let (response, untaken) = through_breaker(&breaker, layer().layer(replicas), post()).await;
    assert_eq!(response.unwrap().status(), 200);
    assert!(
        untaken,
        "a POST is not hedged: the breaker counts it itself"
    );
    assert!(breaker.events().is_empty());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn with_a_retry_layer_below_every_attempt_and_retry_is_counted() {
    // The first attempt is slow; the hedge fails fast with a 503, is
    // retried below after a backoff, and the retry wins.
    let replicas = Replicas::new(|n| match n {
        0 => (500 * MS, Reply::Status(200)),
        1 => (5 * MS, Reply::Status(503)),
        _ => (5 * MS, Reply::Status(200)),
    });
    let retry = RetryLayer::new().random(SeededRandom::new(7));
    let hedge = HedgeLayer::above(&retry).fixed_delay(20 * MS);
    let svc = ServiceBuilder::new()
        .layer(hedge.clone())
        .layer(retry.clone())
        .service(replicas.clone());
    let breaker = ModelBreaker::new();
    let (response, untaken) = through_breaker(&breaker, svc, get()).await;
    assert_eq!(response.unwrap().status(), 200);
    assert!(!untaken);

    let calls = replicas.calls();
    assert_eq!(calls.len(), 3, "first, hedge, the hedge's retry");
    assert_eq!(calls[1].headers["x-hedge-attempt"], "2");
    assert_eq!(calls[2].headers[RETRY_ATTEMPT_HEADER], "2");
    // Every attempt the dependency saw is known to the breaker: two
    // recorded (the hedge's 503 and its retry's 200), the first
    // cancelled; two admitted beyond the first (the hedge, the retry).
    assert_eq!(breaker.count(&Event::Admit), 2);
    assert_eq!(breaker.records(), 2);
    assert_eq!(breaker.count(&Event::Record(Ok(503))), 1);
    assert_eq!(breaker.count(&Event::Cancel), 1);
    assert_eq!(replicas.cancelled(), 1);
    assert_eq!(hedge.counters().hedges_won, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn cancelled_losers_release_their_bulkhead_permits() {
    let bulkhead = BulkheadLayer::new("dependency", 2);
    let handle = bulkhead.handle();
    let replicas = Replicas::first_slow(500 * MS, 50 * MS);
    let svc = ServiceBuilder::new()
        .layer(layer())
        .layer(bulkhead)
        .service(replicas.clone());
    let call = tokio::spawn(svc.oneshot(get()));
    tokio::time::sleep(21 * MS).await;
    assert_eq!(handle.in_flight(), 2, "a permit per attempt");
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        handle.in_flight(),
        0,
        "the cancelled first attempt gave its permit back"
    );
    assert_eq!(replicas.cancelled(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_full_bulkhead_stops_hedging_without_failing_the_call() {
    let bulkhead = BulkheadLayer::new("dependency", 1);
    let handle = bulkhead.handle();
    let replicas = Replicas::first_slow(100 * MS, 5 * MS);
    let layer = layer().max_hedges(2);
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(bulkhead)
        .service(replicas.clone());
    let start = tokio::time::Instant::now();
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200, "the first attempt's answer");
    assert_eq!(start.elapsed(), 100 * MS);
    assert_eq!(replicas.count(), 1, "the hedge was rejected locally");
    assert_eq!(handle.rejected(), 1);
    let c = layer.counters();
    assert_eq!((c.hedges, c.refused_by_pushback), (1, 1), "no second hedge");
    assert_eq!(handle.in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_the_call_reports_every_admission_as_cancelled() {
    let breaker = ModelBreaker::new();
    let replicas = Replicas::all(Duration::from_secs(1));
    let mut svc = layer().layer(replicas.clone());
    let attempts = Attempts::new(breaker.clone(), AttemptToken::new(1, 0));
    let (future, _) = CallContext::offer_attempts(attempts, || svc.call(get()));
    let mut call = tokio_test::task::spawn(future);
    assert!(call.poll().is_pending());
    tokio::time::sleep(20 * MS).await;
    assert!(call.poll().is_pending());
    assert_eq!(replicas.in_flight(), 2);
    drop(call);
    assert_eq!(breaker.count(&Event::Cancel), 2);
    assert_eq!(breaker.records(), 0);
    assert_eq!(replicas.in_flight(), 0);
}
