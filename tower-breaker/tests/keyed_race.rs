//! The keyed registry under threads: a flood of unique keys from several
//! threads never takes it past `max_keys`, never evicts an open breaker,
//! and callers racing on one new key all get the same breaker.
//!
//! These run on OS threads without a runtime, in real time (the registry
//! reads tokio's clock, which is the system clock outside a runtime).

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use support::*;
use tower_breaker::{BreakerRegistry, Mode, Outcome, State};

const THREADS: usize = 4;
const KEYS_PER_THREAD: usize = 20_000;
const MAX_KEYS: usize = 64;

/// Floods `registry` with unique keys from [`THREADS`] threads while a
/// watcher checks the bound; returns the most breakers the watcher saw.
fn flood(registry: &BreakerRegistry<String>) -> usize {
    let start = Arc::new(Barrier::new(THREADS + 1));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let registry = registry.clone();
        let done = done.clone();
        thread::spawn(move || {
            let mut most = 0;
            while !done.load(Ordering::Relaxed) {
                let (len, listed) = (registry.len(), registry.breakers().len());
                assert!(len <= MAX_KEYS, "len {len} over the bound");
                assert!(listed <= MAX_KEYS, "{listed} breakers listed");
                most = most.max(listed);
                thread::yield_now();
            }
            most
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let registry = registry.clone();
            let start = start.clone();
            thread::spawn(move || {
                start.wait();
                for i in 0..KEYS_PER_THREAD {
                    let breaker = registry.get(&format!("t{t}-{i}"));
                    // Some keys get calls, as they would through the layer.
                    if i % 7 == 0 {
                        if let Ok(permit) = breaker.try_acquire() {
                            permit.record(Outcome::Success);
                        }
                    }
                }
            })
        })
        .collect();
    start.wait();
    for worker in workers {
        worker.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    watcher.join().unwrap()
}

/// A registry holding `open`, opened by a failure, and `forced`, forced
/// open.
fn with_open_breakers(idle: Duration) -> BreakerRegistry<String> {
    let registry = BreakerRegistry::new(
        "flood",
        config()
            .count_window(1)
            .minimum_calls(1)
            .open_period(secs(3600))
            .max_open_period(secs(3600)),
    )
    .max_keys(MAX_KEYS)
    .idle_timeout(idle);
    record(&registry.get(&"open".to_owned()), Outcome::Failure, 1);
    registry
        .get(&"forced".to_owned())
        .set_mode(Mode::ForcedOpen);
    registry
}

fn assert_open_breakers_survived(registry: &BreakerRegistry<String>) {
    let open = registry
        .find(&"open".to_owned())
        .expect("the open breaker survived");
    assert_eq!(open.snapshot().state, State::Open);
    let forced = registry
        .find(&"forced".to_owned())
        .expect("the forced-open breaker survived");
    assert_eq!(forced.mode(), Mode::ForcedOpen);
}

#[test]
fn a_flood_that_evicts_all_the_time_stays_bounded_and_keeps_open_breakers() {
    // Idle timeout zero: every closed breaker may go at once, so nearly
    // every new key evicts one, from whichever shard is free.
    let registry = with_open_breakers(Duration::ZERO);
    let most = flood(&registry);
    assert!(most <= MAX_KEYS);
    assert_eq!(registry.len(), MAX_KEYS);
    assert_eq!(registry.breakers().len(), MAX_KEYS);
    assert_open_breakers_survived(&registry);
}

#[test]
fn a_flood_against_a_full_registry_of_fresh_breakers_gets_the_overflow_breaker() {
    let registry = with_open_breakers(secs(3600));
    for i in 0..MAX_KEYS - 2 {
        registry.get(&format!("resident{i}"));
    }
    assert_eq!(registry.len(), MAX_KEYS);
    flood(&registry);
    assert_eq!(registry.len(), MAX_KEYS);
    assert!((0..MAX_KEYS - 2).all(|i| registry.find(&format!("resident{i}")).is_some()));
    assert_open_breakers_survived(&registry);
    assert!(registry.overflow().snapshot().totals.successful > 0);
}

#[test]
fn callers_racing_on_one_new_key_share_one_breaker() {
    for round in 0..50 {
        let registry = BreakerRegistry::new("race", config());
        let start = Arc::new(Barrier::new(THREADS));
        let key = format!("key{round}");
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (registry, start, key) = (registry.clone(), start.clone(), key.clone());
                thread::spawn(move || {
                    start.wait();
                    registry.get(&key)
                })
            })
            .collect();
        let breakers: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(registry.len(), 1);
        breakers[0].set_mode(Mode::ForcedOpen);
        assert!(
            breakers.iter().all(|b| b.mode() == Mode::ForcedOpen),
            "one circuit"
        );
    }
}
