//! The retry storm of three tiers (user -> A -> B -> C -> dependency), each
//! tier a separate service with the default retry layer (and a budget of
//! its own), the dependency always failing: retries happen in one tier
//! only and cost at most the budget's share, whatever the failure looks
//! like (an error, a 503, a gRPC UNAVAILABLE) and whatever the rate.

mod support;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response};
use support::get;
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_resilience_base::grpc::is_grpc;
use tower_resilience_base::Answer;
use tower_retry_budget::{RetryLayer, SeededRandom};

type Tier = BoxCloneService<Request<String>, Response<String>, BoxError>;

const USERS: usize = 2_000;

/// How the dependency fails.
#[derive(Clone, Copy, Debug)]
enum Failure {
    /// A refused connection (a transient error).
    Error,
    /// `503 Service Unavailable`.
    Unavailable,
    /// A trailers-only gRPC answer with status 14, UNAVAILABLE.
    GrpcUnavailable,
}

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// The dependency: always fails as `failure` says, counting its calls.
fn dependency(failure: Failure, calls: Arc<AtomicUsize>) -> Tier {
    BoxCloneService::new(service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::Relaxed);
        let out = match failure {
            Failure::Error => Err(BoxError::from(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            ))),
            Failure::Unavailable => {
                let mut r = Response::new(String::new());
                *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                Ok(r)
            }
            Failure::GrpcUnavailable => {
                let mut r = Response::new(String::new());
                let h = r.headers_mut();
                h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
                h.insert("grpc-status", HeaderValue::from_static("14"));
                Ok(r)
            }
        };
        std::future::ready(out)
    }))
}

/// A tier: a server counting its calls whose handler calls the next tier
/// through `client` and forwards its answer (status and headers, as a
/// gateway does), or turns the client's error into the answer a handler of
/// this toolkit gives (`Answer::for_error`).
fn tier(calls: Arc<AtomicUsize>, client: Tier, grpc: bool) -> Tier {
    BoxCloneService::new(service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::Relaxed);
        let client = client.clone();
        async move {
            let mut request = get();
            if grpc {
                request
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
                // gRPC calls are POSTs, retried only with a key.
                *request.method_mut() = http::Method::POST;
                request
                    .headers_mut()
                    .insert("idempotency-key", HeaderValue::from_static("k"));
            }
            let answer = match client.oneshot(request).await {
                Ok(downstream) => {
                    let (parts, _) = downstream.into_parts();
                    let mut answer = Response::new(String::new());
                    *answer.status_mut() = parts.status;
                    *answer.headers_mut() = parts.headers;
                    answer
                }
                Err(e) => Answer::for_error(&*e).into_response(grpc),
            };
            Ok::<_, BoxError>(answer)
        }
    }))
}

/// The default retry layer of one tier's client (a process of its own).
fn client(inner: Tier, seed: u64) -> Tier {
    let layer = RetryLayer::new()
        .random(SeededRandom::new(seed))
        .clone_bodies();
    BoxCloneService::new(layer.layer(inner))
}

struct Figures {
    per_user_at_dependency: f64,
    per_user_all_tiers: f64,
}

/// `USERS` user requests at `rate` per second into A, the dependency
/// failing as `failure` says.
async fn storm(failure: Failure, rate: u64) -> Figures {
    let seeds = AtomicU64::new(1);
    let seed = || seeds.fetch_add(1, Ordering::Relaxed);
    let grpc = matches!(failure, Failure::GrpcUnavailable);
    let (a, b, c, d) = (counter(), counter(), counter(), counter());
    let tier_c = tier(
        c.clone(),
        client(dependency(failure, d.clone()), seed()),
        grpc,
    );
    let tier_b = tier(b.clone(), client(tier_c, seed()), grpc);
    let tier_a = tier(a.clone(), client(tier_b, seed()), grpc);
    let gap = Duration::from_nanos(1_000_000_000 / rate);
    let mut users = Vec::with_capacity(USERS);
    for _ in 0..USERS {
        let tier_a = tier_a.clone();
        users.push(tokio::spawn(async move {
            let answer = tier_a.oneshot(get()).await.unwrap();
            assert!(
                answer.status().is_server_error() || is_grpc(answer.headers()),
                "{answer:?}"
            );
        }));
        tokio::time::sleep(gap).await;
    }
    for user in users {
        user.await.unwrap();
    }
    let load = |n: &AtomicUsize| n.load(Ordering::Relaxed) as f64 / USERS as f64;
    Figures {
        per_user_at_dependency: load(&d),
        per_user_all_tiers: load(&a) + load(&b) + load(&c) + load(&d),
    }
}

async fn check(failure: Failure, rate: u64) {
    let f = storm(failure, rate).await;
    println!(
        "{failure:?} at {rate}/s: {:.3} dependency calls and {:.3} calls across all tiers per user request",
        f.per_user_at_dependency, f.per_user_all_tiers
    );
    assert!(
        f.per_user_at_dependency <= 1.12,
        "{failure:?} at {rate}/s: {:.3} calls per request at the dependency",
        f.per_user_at_dependency
    );
    assert!(
        f.per_user_all_tiers <= 4.12,
        "{failure:?} at {rate}/s: {:.3} calls per request across the tiers",
        f.per_user_all_tiers
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn errors_at_50_per_second() {
    check(Failure::Error, 50).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn errors_at_500_per_second() {
    check(Failure::Error, 500).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn unavailable_at_50_per_second() {
    check(Failure::Unavailable, 50).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn unavailable_at_500_per_second() {
    check(Failure::Unavailable, 500).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grpc_unavailable_at_50_per_second() {
    check(Failure::GrpcUnavailable, 50).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grpc_unavailable_at_500_per_second() {
    check(Failure::GrpcUnavailable, 500).await;
}
