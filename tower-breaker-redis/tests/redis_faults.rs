//! A killed Redis: the fleet fails open with an alarm, and sharing resumes
//! by itself when Redis is back. Alone in its test binary: it counts
//! `tracing` events with a thread-local subscriber, and events of a
//! callsite that other tests' threads hit at the same moment can miss a
//! thread-local subscriber (tracing caches each callsite's interest
//! process-wide).

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::redis_server::RedisServer;
use support::*;
use tokio::time::{sleep, Instant};
use tower_breaker::FleetConfig;
use tower_breaker::{Breaker, Outcome, State};
use tower_breaker_redis::{RedisOptions, RedisStore};

const REFRESH: Duration = Duration::from_millis(100);

async fn store(server: &RedisServer) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::connect(&server.url(), RedisOptions::new())
            .await
            .expect("connect"),
    )
}

/// Records failures until the breaker opens.
fn trip(b: &Breaker) {
    while state(b) != State::Open {
        b.try_acquire()
            .expect("closed until it trips")
            .record(Outcome::Failure);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn killed_redis_fails_open_with_an_alarm_and_sharing_resumes_when_it_is_back() {
    // The test runs on one thread, so a thread-local default catches
    // every event.
    let alarms = resilience_testkit::Events::at_least(tracing::Level::WARN);
    let _guard = resilience_testkit::set_default(alarms.clone());
    let Some(mut server) = RedisServer::start_or_skip(
        "killed_redis_fails_open_with_an_alarm_and_sharing_resumes_when_it_is_back",
    ) else {
        return;
    };
    let long = |store| {
        config()
            .count_window(2)
            .minimum_calls(2)
            .open_period(secs(20))
            .fleet(FleetConfig::new(store).refresh_interval(REFRESH))
    };
    let a = Breaker::with_config("faults", long(store(&server).await));
    let b = Breaker::with_config("faults", long(store(&server).await));
    a.refresh().await.unwrap();
    b.refresh().await.unwrap();

    server.kill();
    let start = Instant::now();
    let mut admitted = 0;
    while start.elapsed() < REFRESH * 5 {
        for x in [&a, &b] {
            x.try_acquire()
                .expect("fails open")
                .record(Outcome::Success);
            admitted += 1;
        }
        sleep(ms(5)).await;
    }
    let errors = |x: &Breaker| x.snapshot().totals.store_errors;
    assert!(errors(&a) > 0 && errors(&b) > 0);
    assert!(
        alarms.count("circuit_store_failed") > 0,
        "circuit_store_failed events"
    );
    println!(
        "faults: redis down, {admitted} calls admitted, store_errors {} + {}, {} alarm events",
        errors(&a),
        errors(&b),
        alarms.count("circuit_store_failed")
    );

    // The local breaker keeps working; its opening cannot be shared yet.
    trip(&a);
    sleep(REFRESH * 2).await;
    b.try_acquire()
        .expect("b has not heard")
        .record(Outcome::Success);

    server.restart();
    let back = Instant::now();
    // Both keep serving; `a`'s next read finds the store empty and writes
    // its opening again, then `b`'s next read adopts it.
    loop {
        assert!(back.elapsed() < secs(10), "sharing did not resume");
        assert!(a.try_acquire().is_err());
        match b.try_acquire() {
            Ok(p) => p.record(Outcome::Success),
            Err(_) => break,
        }
        sleep(ms(5)).await;
    }
    println!(
        "faults: redis restarted; b rejects {:?} later (sharing resumed by itself)",
        back.elapsed()
    );
    assert_eq!(b.snapshot().totals.failed, 0, "b never saw a failure");
}
