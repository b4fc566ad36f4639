//! Helpers shared by the integration tests: tower-breaker's own (the
//! breakers, the scripted dependencies, the event recorder), and the retry
//! layer the joints put below a breaker.
#![allow(dead_code, unreachable_pub)]

#[path = "../../../tower-breaker/tests/support/mod.rs"]
mod breaker;

#[allow(unused_imports)] // not every test binary uses every helper
pub use breaker::*;
use tower_breaker::SeededRandom;

/// A retry layer of 3 attempts with reproducible jitter, for `Clone` bodies.
pub fn retry() -> tower_retry_budget::RetryLayer<
    tower_retry_budget::DefaultPolicy,
    tower_retry_budget::body::CloneBody,
> {
    tower_retry_budget::RetryLayer::new()
        .max_attempts(3)
        .random(SeededRandom::new(3))
        .clone_bodies()
}
