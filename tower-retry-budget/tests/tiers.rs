//! Three tiers, each calling the next through this layer, in front of a
//! dependency that is down: the bottom sees about one call per user
//! request, not 27.

mod support;

use std::future::{ready, Ready};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use support::{get, Log, Scripted};
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_retry_budget::{RetryLayer, SeededRandom};

type Tier = BoxCloneService<Request<String>, Response<String>, BoxError>;

/// A server whose handler calls `client` and answers with what it got,
/// status and headers, like a gateway.
fn server(client: Tier) -> Tier {
    BoxCloneService::new(service_fn(move |_req: Request<String>| {
        let client = client.clone();
        async move {
            let downstream = client.oneshot(get()).await?;
            let (parts, _) = downstream.into_parts();
            let mut answer = Response::new(String::new());
            *answer.status_mut() = parts.status;
            *answer.headers_mut() = parts.headers;
            Ok::<_, BoxError>(answer)
        }
    }))
}

/// Builds user -> A -> B -> C -> bottom, with `client` wrapping each call.
fn chain(bottom: Tier, client: impl Fn(Tier) -> Tier) -> Tier {
    let c = client(bottom); // C's client of the bottom dependency
    let b = client(server(c)); // B's client of C
    client(server(b)) // A's client of B
}

/// Sends `users` requests, 50 a second, and returns the bottom's calls.
async fn run(users: usize, client: impl Fn(Tier) -> Tier) -> usize {
    let log = Log::new();
    let top = chain(BoxCloneService::new(Scripted::always(&log, 503)), client);
    let mut tasks = Vec::new();
    for _ in 0..users {
        let top = top.clone();
        tasks.push(tokio::spawn(async move {
            let response = top.oneshot(get()).await.unwrap();
            assert_eq!(response.status(), 503);
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    log.count()
}

fn ours(layer: RetryLayer) -> impl Fn(Tier) -> Tier {
    let layer = layer.clone_bodies();
    move |inner| BoxCloneService::new(layer.layer(inner))
}

/// tower's own retry, three attempts, no budget: every tier retries.
#[derive(Clone)]
struct ThreeAttempts(usize);

impl tower::retry::Policy<Request<String>, Response<String>, BoxError> for ThreeAttempts {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _req: &mut Request<String>,
        result: &mut Result<Response<String>, BoxError>,
    ) -> Option<Self::Future> {
        let failed = result
            .as_ref()
            .map_or(true, |r| r.status().is_server_error());
        (failed && self.0 < 3).then(|| {
            self.0 += 1;
            ready(())
        })
    }

    fn clone_request(&mut self, req: &Request<String>) -> Option<Request<String>> {
        Some(req.clone())
    }
}

const USERS: usize = 2_000;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn three_tiers_do_not_multiply_retries() {
    // Each tier is a different process: a layer (and budget) of its own.
    let seeds = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let per_tier = |no_budget: bool| {
        let seeds = Arc::clone(&seeds);
        move |inner: Tier| {
            let seed = seeds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let layer = RetryLayer::new().random(SeededRandom::new(seed));
            let layer = if no_budget { layer.no_budget() } else { layer };
            ours(layer)(inner)
        }
    };
    let with_budget = run(USERS, per_tier(false)).await;
    let signal_only = run(USERS, per_tier(true)).await;
    let naive = run(USERS, |inner| {
        BoxCloneService::new(tower::retry::RetryLayer::new(ThreeAttempts(1)).layer(inner))
    })
    .await;

    let per_user = |calls: usize| calls as f64 / USERS as f64;
    println!("three tiers, bottom down, {USERS} user requests at 50/s:");
    println!(
        "  this layer (budget + no-retry signal): {with_budget} bottom calls, {:.2} per request",
        per_user(with_budget)
    );
    println!(
        "  this layer without budget (mark only): {signal_only} bottom calls, {:.2} per request",
        per_user(signal_only)
    );
    println!(
        "  tower::retry at every tier, 3 attempts: {naive} bottom calls, {:.2} per request",
        per_user(naive)
    );
    assert!(with_budget <= 3 * USERS, "{with_budget}");
    assert!(per_user(with_budget) < 1.6, "{with_budget}");
    // The mark alone stops every tier above the one that retried: the
    // bottom tier's 3 attempts, and no more (it used to be stripped after
    // one hop, and the top tier retried again: 3 x 1 x 3).
    assert_eq!(signal_only, 3 * USERS);
    assert_eq!(naive, 27 * USERS);
}
