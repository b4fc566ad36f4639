//! The three-tier retry storm with a breaker above each tier's retry layer:
//! the breakers open within the first calls and the dependency that is down
//! sees almost nothing of the storm (the retry crate's `tests/storm.rs` has
//! the same chain without breakers: 1.10 calls per user request).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_resilience_base::Answer;
use tower_retry_budget::{RetryLayer, SeededRandom};
use tower_shield::stack::client_stack;

type Tier = BoxCloneService<Request<String>, Response<String>, BoxError>;

const USERS: usize = 2_000;

fn tier(client: Tier) -> Tier {
    BoxCloneService::new(service_fn(move |_req: Request<String>| {
        let client = client.clone();
        async move {
            let answer = match client.oneshot(Request::new(String::new())).await {
                Ok(downstream) => {
                    let (parts, _) = downstream.into_parts();
                    let mut answer = Response::new(String::new());
                    *answer.status_mut() = parts.status;
                    *answer.headers_mut() = parts.headers;
                    answer
                }
                Err(e) => Answer::for_error(&*e).into_response(false),
            };
            Ok::<_, BoxError>(answer)
        }
    }))
}

/// One tier's client: the whole stack in one line, as a user would build it.
fn client(inner: Tier, seed: u64) -> Tier {
    let stack = client_stack(format!("tier-{seed}")).retry(
        RetryLayer::new()
            .random(SeededRandom::new(seed))
            .clone_bodies(),
    );
    // The tiers pass on heads only (their bodies are empty).
    BoxCloneService::new(
        stack
            .layer(inner)
            .map_response(|response| response.map(|_| String::new())),
    )
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn with_a_breaker_above_each_retry_layer_the_dependency_sees_almost_nothing() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dependency = BoxCloneService::new(service_fn({
        let calls = calls.clone();
        move |_req: Request<String>| {
            calls.fetch_add(1, Ordering::Relaxed);
            let mut r = Response::new(String::new());
            *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            std::future::ready(Ok::<_, BoxError>(r))
        }
    }));
    let c = tier(client(dependency, 1));
    let b = tier(client(c, 2));
    let top = client(b, 3);
    let mut users = Vec::new();
    for _ in 0..USERS {
        let top = top.clone();
        users.push(tokio::spawn(async move {
            let _ = top.oneshot(Request::new(String::new())).await;
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for user in users {
        user.await.unwrap();
    }
    let per_user = calls.load(Ordering::Relaxed) as f64 / USERS as f64;
    println!(
        "three tiers with breakers, 503s at 50/s: {per_user:.3} dependency calls per user request"
    );
    assert!(per_user <= 0.05, "{per_user}");
}
