//! The Redis store through Sentinel, against a real primary, replica and
//! sentinels started by the test (see `support::redis_topology`): the
//! fleet keeps one circuit through a failover, whether the primary is
//! killed (its connections drop) or frozen (they go silent).
//!
//! What a failover may cost: a record written before it that had not
//! reached the replica is lost (Redis replicates asynchronously). The
//! breakers that know the circuit open keep their local opening through
//! the outage (failing open keeps the local decision: no breaker probes
//! early) and write it again when they find the record missing, so the
//! fleet loses at most that one write, never its circuit.
//!
//! Real time, as in `tests/redis.rs`: the order of events is asserted,
//! with generous bounds; the measured durations are printed.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use support::redis_topology::{poll, SentinelSet, DATA_PASSWORD, SERVICE};
use support::*;
use tokio::time::{sleep, Instant};
use tower_breaker::store::{Decision, Store};
use tower_breaker::FleetConfig;
use tower_breaker::{Breaker, BreakerConfig, Outcome, State};
use tower_breaker_redis::{RedisOptions, RedisStore, RedisTarget};

const REFRESH: Duration = Duration::from_millis(100);
/// Sentinel's detection (300 ms), election and promotion, on a busy
/// machine.
const FAILOVER: Duration = Duration::from_secs(30);
/// The stores' reconnection (backoff up to 1 s) plus scheduling slack.
const FOLLOW: Duration = Duration::from_secs(5);

fn target(set: &SentinelSet) -> RedisTarget {
    RedisTarget::sentinel(set.sentinel_urls(), SERVICE)
        .unwrap()
        .password(DATA_PASSWORD)
}

async fn store(set: &SentinelSet) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::connect_with(target(set), RedisOptions::new())
            .await
            .expect("connect through the sentinels"),
    )
}

fn fleet_config(store: Arc<RedisStore>) -> BreakerConfig {
    config()
        .count_window(2)
        .minimum_calls(2)
        // Longer than any failover here: the circuit must stay open
        // through it, with no probe.
        .open_period(secs(120))
        .fleet(FleetConfig::new(store).refresh_interval(REFRESH))
}

fn trip(b: &Breaker) {
    while state(b) != State::Open {
        b.try_acquire()
            .expect("closed until it trips")
            .record(Outcome::Failure);
    }
}

async fn until_all_reject(breakers: &[Breaker], limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let admitting = breakers
            .iter()
            .filter(|b| match b.try_acquire() {
                Ok(p) => {
                    p.record(Outcome::Ignored);
                    true
                }
                Err(_) => false,
            })
            .count();
        if admitting == 0 {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{admitting} breakers still admit");
        sleep(ms(5)).await;
    }
}

/// Until a fresh breaker on a fresh store (through the sentinels) reads
/// the circuit open; returns how long it took.
async fn until_a_newcomer_sees_it_open(set: &SentinelSet, name: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    let newcomer = Breaker::with_config(name.to_owned(), fleet_config(store(set).await));
    loop {
        let _ = newcomer.refresh().await;
        if state(&newcomer) == State::Open {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "the newcomer never saw it open");
        sleep(REFRESH).await;
    }
}

/// Until `store` answers again (it follows the new primary).
async fn until_answers(store: &RedisStore, name: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    while store.read(name).await.is_err() {
        assert!(
            start.elapsed() < limit,
            "the store did not follow the primary"
        );
        sleep(ms(20)).await;
    }
    start.elapsed()
}

/// Watches `fleet` every few milliseconds until stopped: any admitted call
/// would be a probe the fleet did not elect.
fn watch_rejects(fleet: &[Breaker]) -> (Arc<AtomicBool>, Arc<AtomicUsize>) {
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicUsize::new(0));
    let (fleet, s, a) = (fleet.to_vec(), stop.clone(), admitted.clone());
    tokio::spawn(async move {
        while !s.load(SeqCst) {
            for b in &fleet {
                if let Ok(p) = b.try_acquire() {
                    a.fetch_add(1, SeqCst);
                    p.record(Outcome::Ignored);
                }
            }
            sleep(ms(5)).await;
        }
    });
    (stop, admitted)
}

fn record(set: &SentinelSet, port: u16, key: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(key)
        .query(&mut set.raw(port))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_keeps_one_circuit_when_the_primary_is_killed_and_the_replica_promoted() {
    let Some(mut set) = SentinelSet::start_or_skip(
        "the_fleet_keeps_one_circuit_when_the_primary_is_killed_and_the_replica_promoted",
        3,
    ) else {
        return;
    };
    let name = "failover";
    let stores = [store(&set).await, store(&set).await, store(&set).await];
    let fleet: Vec<Breaker> = stores
        .iter()
        .map(|s| Breaker::with_config(name, fleet_config(s.clone())))
        .collect();
    for b in &fleet {
        b.refresh().await.expect("first read");
    }
    trip(&fleet[0]);
    let followed = until_all_reject(&fleet[1..], REFRESH * 10 + FOLLOW).await;
    let key = stores[0].key(name).unwrap();
    let (old, replica) = (set.primary.port, set.replica.port);
    poll("the record on the replica", FOLLOW, || {
        record(&set, replica, &key).contains_key("until")
    });

    // One sentinel is gone too: the store asks all of them at once.
    set.sentinels[0].kill();
    let (stop, admitted) = watch_rejects(&fleet);
    set.primary.kill();
    let killed = Instant::now();
    poll("the replica promoted", FAILOVER, || set.promoted(replica));
    let promoted = killed.elapsed();
    assert_eq!(set.primary_port(), Some(replica));
    assert_ne!(replica, old);

    // Every store follows the new primary by itself.
    let mut follow = Vec::new();
    for s in &stores {
        follow.push(until_answers(s, name, FOLLOW).await);
    }
    // The record had reached the replica: a newcomer sees the circuit open.
    let newcomer = until_a_newcomer_sees_it_open(&set, name, FOLLOW).await;

    // Now the worst case: the record is lost (as if the replica had not
    // received it). The breakers that know the circuit open write it
    // again; a newcomer then sees it open.
    redis::cmd("DEL")
        .arg(&key)
        .query::<()>(&mut set.raw(replica))
        .unwrap();
    let lost = Instant::now();
    let rewritten = Instant::now();
    poll("the opening written again", FOLLOW, || {
        record(&set, replica, &key).contains_key("until")
    });
    let rewritten = rewritten.elapsed();
    let newcomer_after_loss = until_a_newcomer_sees_it_open(&set, name, FOLLOW).await;
    let lost_for = lost.elapsed();

    stop.store(true, SeqCst);
    assert_eq!(
        admitted.load(SeqCst),
        0,
        "no breaker let a call through during the failover"
    );
    for b in &fleet {
        assert_eq!(state(b), State::Open);
    }
    let errors: Vec<u64> = fleet
        .iter()
        .map(|b| b.snapshot().totals.store_errors)
        .collect();
    println!(
        "sentinel (killed primary): others followed the trip in {followed:?}; promotion {promoted:?} after the kill; \
         stores answered again {follow:?} after it; a newcomer saw it open in {newcomer:?}; \
         after the record was deleted it was written again in {rewritten:?} and a newcomer saw it open after {lost_for:?} ({newcomer_after_loss:?}); \
         store errors {errors:?}; calls admitted during the failover: 0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_leaves_a_frozen_primary_for_the_promoted_replica() {
    let Some(set) = SentinelSet::start_or_skip(
        "the_store_leaves_a_frozen_primary_for_the_promoted_replica",
        1,
    ) else {
        return;
    };
    let name = "frozen";
    let (a, b) = (store(&set).await, store(&set).await);
    let opener = Breaker::with_config(name, fleet_config(a.clone()));
    let other = Breaker::with_config(name, fleet_config(b.clone()));
    opener.refresh().await.unwrap();
    other.refresh().await.unwrap();
    let replica = set.replica.port;

    // A frozen primary sends no error: calls go unanswered (the store's
    // timeout), its connections stay open. The store asks the sentinels
    // whether the primary moved.
    set.primary.signal("STOP");
    let frozen = Instant::now();
    poll("the replica promoted", FAILOVER, || set.promoted(replica));
    let promoted = frozen.elapsed();
    let follow = [
        until_answers(&a, name, FOLLOW).await,
        until_answers(&b, name, FOLLOW).await,
    ];

    // Sharing works on the new primary.
    trip(&opener);
    let followed = until_all_reject(std::slice::from_ref(&other), REFRESH * 10 + FOLLOW).await;
    assert!(record(&set, replica, &a.key(name).unwrap()).contains_key("until"));
    assert!(matches!(b.read(name).await, Ok(Decision::Open { .. })));

    // The old primary wakes up (still believing it is the primary, until
    // the sentinel demotes it): the stores stay with the new one, where
    // a new record lands (replication only flows from it).
    set.primary.signal("CONT");
    let after = a.key("frozen-after").unwrap();
    a.try_open("frozen-after", secs(120))
        .await
        .expect("writes still work");
    assert!(record(&set, replica, &after).contains_key("until"));
    println!(
        "sentinel (frozen primary): promotion {promoted:?} after the freeze; stores answered again {follow:?} after it; \
         the other breaker followed a trip on the new primary in {followed:?}; store errors {} + {}",
        opener.snapshot().totals.store_errors,
        other.snapshot().totals.store_errors
    );
}
