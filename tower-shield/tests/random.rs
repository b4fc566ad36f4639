//! The stacks' `random(..)`: one seeded source makes the jitter of the
//! layers a stack builds reproducible (the breaker's open periods, the
//! retry layer's backoff), and what the user passes in keeps its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_breaker::{Breaker, BreakerConfig, Outcome, SeededRandom};
use tower_retry_budget::body::ReplayBody;
use tower_shield::stack::{client_stack, server_stack};

/// Opens `breaker` with failures and returns the open period its
/// rejection announces (under paused time, exactly the drawn period).
fn open_period(breaker: &Breaker) -> Duration {
    while let Ok(permit) = breaker.try_acquire() {
        permit.record(Outcome::Failure);
    }
    breaker.try_acquire().unwrap_err().retry_after()
}

/// The open period of a breaker built by hand with a source seeded `seed`.
fn seeded_period(seed: u64) -> Duration {
    open_period(&Breaker::with_config(
        "hand",
        BreakerConfig::default().random(SeededRandom::new(seed)),
    ))
}

#[tokio::test(start_paused = true)]
async fn a_seeded_server_stack_draws_its_breakers_period_from_the_seed() {
    let a = server_stack("shop").random(SeededRandom::new(7));
    let b = server_stack("shop").random(SeededRandom::new(7));
    let other = server_stack("shop").random(SeededRandom::new(8));
    let period = open_period(a.breaker_handle());
    assert_eq!(period, open_period(b.breaker_handle()));
    assert_eq!(period, seeded_period(7), "the seed's first draw");
    assert_ne!(period, open_period(other.breaker_handle()));
    assert_eq!(a.breaker_handle().name(), "shop", "rebuilt under its name");
}

#[tokio::test(start_paused = true)]
async fn a_seeded_client_stack_draws_its_breakers_period_from_the_seed() {
    let stack = client_stack("catalog").random(SeededRandom::new(7));
    assert_eq!(open_period(stack.breaker_handle()), seeded_period(7));
    assert_eq!(stack.breaker_handle().name(), "catalog");
}

#[tokio::test(start_paused = true)]
async fn the_source_reaches_a_breaker_configured_before_or_after_it() {
    let config = BreakerConfig::default().minimum_calls(4);
    let before = client_stack("catalog")
        .breaker_config(config.clone())
        .random(SeededRandom::new(11));
    let after = client_stack("catalog")
        .random(SeededRandom::new(11))
        .breaker_config(config);
    assert_eq!(before.breaker_handle().config().get_minimum_calls(), 4);
    assert_eq!(after.breaker_handle().config().get_minimum_calls(), 4);
    let period = open_period(before.breaker_handle());
    assert_eq!(period, open_period(after.breaker_handle()));
    assert_eq!(period, seeded_period(11));
}

#[tokio::test(start_paused = true)]
async fn a_breaker_passed_in_keeps_its_identity_and_its_source() {
    let mine = Breaker::with_config(
        "mine",
        BreakerConfig::default().random(SeededRandom::new(5)),
    );
    let client = client_stack("catalog")
        .breaker(mine.clone())
        .random(SeededRandom::new(6));
    let server = server_stack("shop")
        .breaker(mine.clone())
        .random(SeededRandom::new(6));
    assert_eq!(client.breaker_handle().name(), "mine");
    assert_eq!(server.breaker_handle().name(), "mine");
    let period = open_period(&mine);
    assert_eq!(period, seeded_period(5), "its own seed, not the stack's");
    // The stacks hold the very breaker that was opened.
    let seen = client.breaker_handle().try_acquire().unwrap_err();
    assert_eq!(seen.retry_after(), period);
    let seen = server.breaker_handle().try_acquire().unwrap_err();
    assert_eq!(seen.retry_after(), period);
}

/// The time a call takes through a client stack seeded `seed` whose
/// dependency answers 503 once and then 200: the first retry's backoff.
async fn backoff(seed: u64) -> Duration {
    let calls = Arc::new(AtomicUsize::new(0));
    let transport = service_fn(move |_req: Request<ReplayBody<String>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut response = Response::new(String::new());
            if n == 0 {
                *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            }
            Ok::<_, BoxError>(response)
        }
    });
    let stack = client_stack("catalog").random(SeededRandom::new(seed));
    let client = stack.layer(transport);
    let start = Instant::now();
    let response = client
        .oneshot(Request::new(String::new()))
        .await
        .expect("the retry succeeds");
    assert_eq!(response.status(), 200);
    assert_eq!(stack.retry_counters().retries, 1, "one retry");
    start.elapsed()
}

#[tokio::test(start_paused = true)]
async fn a_seeded_client_stack_retries_after_the_same_backoff() {
    let first = backoff(21).await;
    assert!(first > Duration::ZERO, "a backoff was slept");
    assert_eq!(backoff(21).await, first);
    let others = [backoff(22).await, backoff(23).await, backoff(24).await];
    assert!(
        others.iter().any(|d| *d != first),
        "other seeds draw other delays: {first:?} {others:?}"
    );
}
