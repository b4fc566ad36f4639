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

/// Whether `program` runs (`program arg` succeeds). When it does not, says
/// so on the real stderr (not captured by the test harness) with `hint`,
/// so that `test` can return early; with `TOWER_REQUIRE_SERVERS` set (as
/// `.ci/run` does), a missing server fails the test instead.
pub fn server_found(program: &str, arg: &str, test: &str, hint: &str) -> bool {
    let found = std::process::Command::new(program)
        .arg(arg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        assert!(
            std::env::var_os("TOWER_REQUIRE_SERVERS").is_none(),
            "{program} not found and TOWER_REQUIRE_SERVERS is set: `{test}` must run"
        );
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr().lock(),
            "skipped: {program} not found ({hint}): {test}"
        );
    }
    found
}

pub mod redis_server;
#[cfg(feature = "tls")]
pub mod redis_tls;
pub mod redis_topology;
