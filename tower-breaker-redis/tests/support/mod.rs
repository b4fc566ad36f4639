//! Helpers shared by the store's integration tests: the local servers
//! they start (a `redis-server` node, a TLS node, Sentinel and Cluster
//! topologies) and a few small ones.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use tower_breaker::{Breaker, BreakerConfig, SeededRandom, State};

/// A deterministic configuration: no jitter, a fixed seed.
pub fn config() -> BreakerConfig {
    BreakerConfig::new()
        .jitter(0.0)
        .random(SeededRandom::new(7))
}

pub fn state(breaker: &Breaker) -> State {
    breaker.snapshot().state
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Whether `program` runs; a loud skip, or a failure under
/// `TOWER_REQUIRE_SERVERS` (the conformance crate's helper, shared).
pub use tower_breaker_conformance::server_found;

pub mod proxy;
pub mod redis_server;
#[cfg(feature = "tls")]
pub mod redis_tls;
pub mod redis_topology;
