//! The client stack's retry budget is the fleet's when its breaker has a
//! store: short-lived processes (here, stacks in one process, each with its
//! own breaker and budget, on one shared `MemoryStore`) against a
//! dependency that fails every fourth call it receives send at most 1.12
//! calls per request in all, where budgets of their own let each one retry
//! whatever it wants. (The same across OS processes on Redis and DynamoDB:
//! the outage demo's `--lambda` fleet.)

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use http_body_util::BodyExt;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_breaker::store::MemoryStore;
use tower_breaker::{BreakerConfig, FleetConfig};
use tower_retry_budget::body::ReplayBody;
use tower_shield::stack::client_stack;

/// Requests and dependency calls of a fleet of `processes` short-lived
/// stacks of `requests` requests each, one after the other, each ending
/// with a flush of its breaker; on `store`, or each alone.
async fn fleet(store: Option<&Arc<MemoryStore>>, processes: usize, requests: usize) -> (u64, u64) {
    let received = Arc::new(AtomicU64::new(0));
    let mut sent = 0;
    for _ in 0..processes {
        let calls = Arc::clone(&received);
        let dependency = service_fn(move |req: http::Request<ReplayBody<String>>| {
            let n = calls.fetch_add(1, SeqCst);
            drop(req);
            async move {
                let status = if n % 4 == 3 { 503 } else { 200 };
                let mut response = http::Response::new(String::new());
                *response.status_mut() = http::StatusCode::from_u16(status)?;
                Ok::<_, BoxError>(response)
            }
        });
        let mut config = BreakerConfig::new().minimum_calls(1_000);
        if let Some(store) = store {
            config = config.fleet(FleetConfig::new(store.clone()));
        }
        let stack = client_stack("dependency").breaker_config(config);
        let breaker = stack.breaker_handle().clone();
        let client = stack.layer(dependency);
        for _ in 0..requests {
            let response = client
                .clone()
                .oneshot(http::Request::new(String::new()))
                .await
                .unwrap();
            let _ = response.into_body().collect().await;
            sent += 1;
        }
        breaker.flush().await.unwrap();
    }
    (sent, received.load(SeqCst))
}

#[tokio::test(start_paused = true)]
async fn twenty_short_lived_processes_share_ten_percent_not_twenty_floors() {
    let (requests, calls) = fleet(None, 20, 5).await;
    let alone = calls as f64 / requests as f64;
    let store = Arc::new(MemoryStore::new());
    let (requests, calls) = fleet(Some(&store), 20, 5).await;
    let shared = calls as f64 / requests as f64;
    eprintln!("calls per request: {alone:.2} with budgets of their own, {shared:.2} shared");
    assert!(
        alone > 1.25,
        "alone, only the attempts limit bounds them: {alone:.2}"
    );
    assert!(shared <= 1.12, "shared: {shared:.2}");
}

#[tokio::test(start_paused = true)]
async fn a_fleet_still_retries_its_share() {
    // 50 processes of 10 requests: 500 requests earn 50 retries, and a
    // quarter of the calls fail, so the fleet spends its share.
    let store = Arc::new(MemoryStore::new());
    let (requests, calls) = fleet(Some(&store), 50, 10).await;
    let retries = calls - requests;
    assert!(
        (45..=53).contains(&retries),
        "{retries} retries for {requests} requests (10% plus a floor of 3)"
    );
}
