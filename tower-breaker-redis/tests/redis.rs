//! The Redis store against real `redis-server`s: each test starts its own on
//! a free port of 127.0.0.1 (see `support::redis_server`), so it can kill
//! and restart it.
//!
//! Real time is unavoidable here (paused tokio time does not move Redis's
//! clock): open periods are a few hundred milliseconds, and the tests
//! assert the order of events with generous bounds, never tight timings.

mod support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use resilience_testkit::process::result_line;
use support::redis_server::RedisServer;
use support::*;
use tokio::time::{sleep, Instant};
use tower_breaker::store::{Decision, Election, ProbeToken, Store, StoreFailureMode};
use tower_breaker::FleetConfig;
use tower_breaker::{Breaker, BreakerConfig, Outcome, Permit, State};
use tower_breaker_redis::{InvalidName, RedisOptions, RedisStore};

const REFRESH: Duration = Duration::from_millis(100);
const OPEN: Duration = Duration::from_millis(400);
/// Slack for scheduling on a busy 2-core machine.
const SLACK: Duration = Duration::from_millis(400);

async fn store(server: &RedisServer) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::connect(&server.url(), RedisOptions::new())
            .await
            .expect("connect"),
    )
}

/// A breaker as one process of a fleet would have: its own window (2 calls,
/// opens at 50%) and, unless `shared` is given, its own connection.
fn breaker_on(name: &str, store: Arc<RedisStore>) -> Breaker {
    Breaker::with_config(name.to_owned(), fleet_config(store))
}

fn fleet_config(store: Arc<RedisStore>) -> BreakerConfig {
    fleet_config_with(FleetConfig::new(store).refresh_interval(REFRESH))
}

/// [`fleet_config`] with the fleet's settings as `fleet` says.
fn fleet_config_with(fleet: FleetConfig) -> BreakerConfig {
    config()
        .count_window(2)
        .minimum_calls(2)
        .open_period(OPEN)
        .fleet(fleet)
}

async fn fleet(server: &RedisServer, name: &str, n: usize) -> Vec<Breaker> {
    let mut fleet = Vec::with_capacity(n);
    for _ in 0..n {
        let b = breaker_on(name, store(server).await);
        b.refresh().await.expect("first read");
        fleet.push(b);
    }
    fleet
}

/// Records failures until the breaker opens (its window decides when).
fn trip(b: &Breaker) {
    while state(b) != State::Open {
        b.try_acquire()
            .expect("closed until it trips")
            .record(Outcome::Failure);
    }
}

/// Calls every breaker every few milliseconds until each has rejected a
/// call; returns how long each took.
async fn until_all_reject(fleet: &[Breaker], limit: Duration) -> Vec<Duration> {
    let start = Instant::now();
    let mut seen: Vec<Option<Duration>> = vec![None; fleet.len()];
    while seen.iter().any(Option::is_none) && start.elapsed() < limit {
        for (b, seen) in fleet.iter().zip(&mut seen) {
            if seen.is_none() {
                match b.try_acquire() {
                    Ok(p) => p.record(Outcome::Ignored),
                    Err(_) => *seen = Some(start.elapsed()),
                }
            }
        }
        sleep(ms(5)).await;
    }
    seen.into_iter()
        .map(|s| s.expect("every breaker rejects in time"))
        .collect()
}

/// Calls every breaker until each admits a call (and counts it as a
/// success); returns how long it took.
async fn until_all_admit(fleet: &[Breaker], limit: Duration) -> Duration {
    let start = Instant::now();
    let mut open: Vec<&Breaker> = fleet.iter().collect();
    while !open.is_empty() {
        assert!(
            start.elapsed() < limit,
            "{} breakers still reject",
            open.len()
        );
        open.retain(|b| match b.try_acquire() {
            Ok(p) => {
                p.record(Outcome::Success);
                false
            }
            Err(_) => true,
        });
        sleep(ms(5)).await;
    }
    start.elapsed()
}

fn field(record: &HashMap<String, String>, name: &str) -> i64 {
    record[name].parse().unwrap()
}

async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        sleep(ms(5)).await;
    }
}

// --- the fleet ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_20_breakers_trips_and_every_other_rejects_within_one_refresh_interval() {
    let Some(server) = RedisServer::start_or_skip(
        "one_of_20_breakers_trips_and_every_other_rejects_within_one_refresh_interval",
    ) else {
        return;
    };
    let fleet = fleet(&server, "fleet", 20).await;
    trip(&fleet[0]);
    let key = store(&server).await.key("fleet").unwrap();
    let written = Instant::now();
    wait_for("the write-through", SLACK, || {
        server.record(&key).contains_key("until")
    })
    .await;
    let write_through = written.elapsed();

    let took = until_all_reject(&fleet[1..], REFRESH * 10).await;
    let slowest = took.iter().max().unwrap();
    println!(
        "fleet: write-through {write_through:?}; 19 others rejected after {:?} (fastest) to {slowest:?} (slowest), refresh interval {REFRESH:?}",
        took.iter().min().unwrap()
    );
    assert!(*slowest <= REFRESH + SLACK, "{slowest:?}");
    for b in &fleet[1..] {
        assert_eq!(b.snapshot().totals.failed, 0, "never saw a failure itself");
        assert_eq!(state(b), State::Open);
        assert!(b.try_acquire().unwrap_err().retry_after() <= OPEN);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_openers_keep_the_first_writers_t() {
    let Some(server) =
        RedisServer::start_or_skip("fifty_concurrent_openers_keep_the_first_writers_t")
    else {
        return;
    };
    // What is tested is the scripts' atomicity, not latency: a generous
    // bound, so a busy machine cannot fail a call.
    let store = Arc::new(
        RedisStore::connect(&server.url(), RedisOptions::new().timeout(secs(10)))
            .await
            .expect("connect"),
    );
    let key = store.key("openers").unwrap();
    // Distinct periods, so the record tells which opener wrote it.
    let period = |i: u64| ms(2_000 + 10 * i);
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50u64)
        .map(|i| {
            let store = store.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                (i, store.try_open("openers", period(i)).await.unwrap())
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let record = server.record(&key);
    let (until, since, stored_period) = (
        field(&record, "until"),
        field(&record, "since"),
        field(&record, "period"),
    );
    // Exactly one opener wrote (it got its own period back, to the ms);
    // the record is its T, not the last caller's.
    let writers: Vec<_> = results
        .iter()
        .filter(|(i, remaining)| *remaining == period(*i))
        .collect();
    assert_eq!(writers.len(), 1, "{results:?}");
    let first = writers[0].0;
    assert_eq!(stored_period as u128, period(first).as_millis());
    assert_eq!(
        until - since,
        stored_period,
        "T = the first writer's now + its period"
    );
    for (i, remaining) in &results {
        assert!(
            *remaining <= period(first),
            "opener {i} saw T pushed forward"
        );
    }
    println!(
        "openers: the first writer was #{first} of 50; stored T = its write + {stored_period} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_t_passes_one_call_of_50_breakers_x_20_tasks_probes_and_its_success_closes_all() {
    let Some(server) = RedisServer::start_or_skip(
        "when_t_passes_one_call_of_50_breakers_x_20_tasks_probes_and_its_success_closes_all",
    ) else {
        return;
    };
    let fleet = Arc::new(fleet(&server, "election", 50).await);
    trip(&fleet[0]);
    until_all_reject(&fleet[1..], REFRESH * 10).await;

    let hits = Arc::new(AtomicUsize::new(0));
    let held: Arc<Mutex<Vec<Permit>>> = Arc::default();
    // Hammer until well past T, but before the election's T' (T + 2 x OPEN).
    let stop = Instant::now() + OPEN + ms(500);
    let tasks: Vec<_> = (0..50 * 20)
        .map(|i| {
            let (fleet, hits, held) = (fleet.clone(), hits.clone(), held.clone());
            tokio::spawn(async move {
                let b = &fleet[i % 50];
                while Instant::now() < stop {
                    if let Ok(permit) = b.try_acquire() {
                        hits.fetch_add(1, SeqCst); // the dependency
                        held.lock().unwrap().push(permit);
                    }
                    sleep(ms(3)).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        hits.load(SeqCst),
        1,
        "exactly one call reaches the dependency"
    );
    let probe = held.lock().unwrap().pop().unwrap();
    assert!(probe.is_probe());
    assert_eq!(
        fleet.iter().filter(|b| state(b) == State::HalfOpen).count(),
        1
    );

    probe.record(Outcome::Success);
    let closed_in = until_all_admit(&fleet, REFRESH * 10).await;
    println!("election: 1 probe among 1000 tasks; all 50 closed {closed_in:?} after its success");
    assert!(closed_in <= REFRESH + SLACK, "{closed_in:?}");
    let key = store(&server).await.key("election").unwrap();
    assert_eq!(
        server.record(&key).get("state").map(String::as_str),
        Some("closed"),
        "the prober marked the circuit closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_probes_keep_the_fleet_open_for_growing_periods_whoever_probes() {
    let Some(server) = RedisServer::start_or_skip(
        "failed_probes_keep_the_fleet_open_for_growing_periods_whoever_probes",
    ) else {
        return;
    };
    let fleet = fleet(&server, "growth", 4).await;
    let key = store(&server).await.key("growth").unwrap();
    trip(&fleet[0]);
    until_all_reject(&fleet[1..], REFRESH * 10).await;

    // Round 1: whoever wins probes, and fails.
    let (winner, probe) = probe_among(&fleet, OPEN + SLACK * 2).await;
    probe.record(Outcome::Failure);
    wait_for("the re-open", SLACK, || {
        server.record(&key).get("reopens").map(String::as_str) == Some("1")
    })
    .await;
    let record = server.record(&key);
    assert_eq!(field(&record, "period"), 2 * OPEN.as_millis() as i64);
    let remaining = field(&record, "until") - server.now_ms();
    assert!(
        remaining > OPEN.as_millis() as i64,
        "a longer period: {remaining} ms"
    );
    // Nobody probes during it.
    let quiet_until = Instant::now() + OPEN;
    while Instant::now() < quiet_until {
        for b in &fleet {
            assert!(b.try_acquire().is_err(), "still open");
        }
        sleep(ms(10)).await;
    }

    // Round 2: only the others call, so another breaker wins; it learns
    // the fleet's count of re-opens, and the period grows again.
    let others: Vec<Breaker> = fleet
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != winner)
        .map(|(_, b)| b.clone())
        .collect();
    let (_, probe) = probe_among(&others, OPEN * 2 + SLACK * 2).await;
    probe.record(Outcome::Failure);
    wait_for("the second re-open", SLACK, || {
        server.record(&key).get("reopens").map(String::as_str) == Some("2")
    })
    .await;
    let record = server.record(&key);
    assert_eq!(field(&record, "period"), 4 * OPEN.as_millis() as i64);
    println!(
        "growth: open {OPEN:?}, then {} ms and {} ms after two failed probes by two breakers",
        2 * OPEN.as_millis(),
        field(&record, "period")
    );
}

/// Calls the breakers until one admits a probe; returns its index.
async fn probe_among(fleet: &[Breaker], limit: Duration) -> (usize, Permit) {
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < limit, "no probe in {limit:?}");
        for (i, b) in fleet.iter().enumerate() {
            if let Ok(p) = b.try_acquire() {
                assert!(p.is_probe());
                return (i, p);
            }
        }
        sleep(ms(5)).await;
    }
}

// --- separate OS processes ---

const CHILD: &str = "TOWER_BREAKER_REDIS_CHILD";

/// One OS process of the fleet: re-invoked by
/// `one_probe_across_separate_os_processes` with `TOWER_BREAKER_REDIS_CHILD`
/// set; a no-op otherwise.
#[test]
fn child_process_role() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let [url, name, stop_ms]: [&str; 3] = spec
        .split(' ')
        .collect::<Vec<_>>()
        .try_into()
        .expect("url name stop");
    let stop_ms: u128 = stop_ms.parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (hits, probes) = rt.block_on(async {
        let store = Arc::new(RedisStore::connect(url, RedisOptions::new()).await.unwrap());
        let client = redis::Client::open(url).unwrap();
        let dependency = redis::aio::ConnectionManager::new(client).await.unwrap();
        let breakers: Vec<Breaker> = (0..10).map(|_| breaker_on(name, store.clone())).collect();
        for b in &breakers {
            b.refresh().await.unwrap();
        }
        let hits = Arc::new(AtomicUsize::new(0));
        let probes = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let b = breakers[i % 10].clone();
                let (hits, probes, mut dependency) =
                    (hits.clone(), probes.clone(), dependency.clone());
                tokio::spawn(async move {
                    while unix_ms() < stop_ms {
                        if let Ok(permit) = b.try_acquire() {
                            hits.fetch_add(1, SeqCst);
                            if permit.is_probe() {
                                probes.fetch_add(1, SeqCst);
                            }
                            // The dependency: counts calls fleet-wide, and fails.
                            let _: i64 = redis::cmd("INCR")
                                .arg("dependency-calls")
                                .query_async(&mut dependency)
                                .await
                                .unwrap();
                            permit.record(Outcome::Failure);
                        }
                        sleep(ms(3)).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        (hits.load(SeqCst), probes.load(SeqCst))
    });
    println!("child-result hits={hits} probes={probes}");
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_probe_across_separate_os_processes() {
    let Some(server) = RedisServer::start_or_skip("one_probe_across_separate_os_processes") else {
        return;
    };
    let store = store(&server).await;
    // The trip, as some process reported it.
    store.try_open("processes", OPEN).await.unwrap();
    // The children stop before the election's T' (T + 2 x OPEN), so one
    // election happens while they run.
    let stop = unix_ms() + OPEN.as_millis() * 2 + 300;
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "child_process_role",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, format!("{} processes {stop}", server.url()))
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut per_child = Vec::new();
    for child in children {
        per_child.push(result_line(child, "child-result ").await);
    }
    let calls: i64 = redis::cmd("GET")
        .arg("dependency-calls")
        .query(&mut server.raw())
        .unwrap();
    println!(
        "processes: 4 processes x 10 breakers x 100 tasks: {per_child:?}; dependency calls {calls}"
    );
    assert_eq!(calls, 1, "one probe across the processes");
    let key = store.key("processes").unwrap();
    assert_eq!(
        server.record(&key)["reopens"],
        "1",
        "the failed probe re-opened with its token, from its own process"
    );
}

// --- faults ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_bounds_every_store_call_by_the_timeout() {
    let Some(server) =
        RedisServer::start_or_skip("a_paused_redis_bounds_every_store_call_by_the_timeout")
    else {
        return;
    };
    let timeout = ms(50);
    let store = Arc::new(
        RedisStore::connect(&server.url(), RedisOptions::new().timeout(timeout))
            .await
            .unwrap(),
    );
    let b = breaker_on("slow", store.clone());
    b.refresh().await.unwrap();

    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .query(&mut server.raw())
        .unwrap();
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let start = Instant::now();
        assert!(store.read("slow").await.is_err());
        assert!(store.try_open("slow", OPEN).await.is_err());
        assert!(b.refresh().await.is_err());
        slowest = slowest.max(start.elapsed() / 3);
    }
    // The closed path never waits for the store.
    let start = Instant::now();
    for _ in 0..1000 {
        b.try_acquire().unwrap().record(Outcome::Success);
    }
    let calls = start.elapsed();
    println!("slow: each store call gave up after {slowest:?} at most (timeout {timeout:?}); 1000 calls took {calls:?}");
    assert!(slowest < timeout + ms(200), "{slowest:?}");
    assert!(b.snapshot().totals.store_errors >= 5);

    sleep(ms(1600)).await;
    assert_eq!(
        store.read("slow").await.unwrap(),
        Decision::Missing,
        "back by itself"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_rejects_while_the_store_is_down_and_fail_open_does_not() {
    let Some(mut server) = RedisServer::start_or_skip(
        "fail_closed_rejects_while_the_store_is_down_and_fail_open_does_not",
    ) else {
        return;
    };
    let closed = Breaker::with_config(
        "closed",
        fleet_config_with(
            FleetConfig::new(store(&server).await)
                .refresh_interval(REFRESH)
                .on_store_failure(StoreFailureMode::FailClosed),
        ),
    );
    let open = breaker_on("open", store(&server).await);
    closed.refresh().await.unwrap();
    open.refresh().await.unwrap();
    closed.try_acquire().unwrap().record(Outcome::Success);

    server.kill();
    let rejected = until_all_reject(std::slice::from_ref(&closed), secs(2)).await[0];
    let err = closed.try_acquire().unwrap_err();
    assert_eq!(err.retry_after(), REFRESH);
    assert_eq!(state(&closed), State::Closed, "no failure was counted");
    for _ in 0..20 {
        open.try_acquire()
            .expect("fail open")
            .record(Outcome::Success);
        sleep(ms(10)).await;
    }

    server.restart();
    let admitted = until_all_admit(std::slice::from_ref(&closed), secs(10)).await;
    println!("fail-closed: rejecting {rejected:?} after redis died; admitting {admitted:?} after it came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_redis_is_an_error_and_an_open_repairs_it() {
    let Some(server) =
        RedisServer::start_or_skip("garbage_in_redis_is_an_error_and_an_open_repairs_it")
    else {
        return;
    };
    let store = store(&server).await;
    let key = store.key("garbage").unwrap();
    let b = breaker_on("garbage", store.clone());

    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("banana")
        .query(&mut server.raw())
        .unwrap();
    assert!(store.read("garbage").await.is_err(), "wrong type");
    assert!(b.refresh().await.is_err());
    assert_eq!(b.snapshot().totals.store_errors, 1);
    b.try_acquire()
        .expect("fails open")
        .record(Outcome::Success);

    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query(&mut server.raw())
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("until")
        .arg("banana")
        .query(&mut server.raw())
        .unwrap();
    let err = store.read("garbage").await.unwrap_err();
    assert!(format!("{:?}", std::error::Error::source(&err)).contains("unreadable record"));
    assert_eq!(
        store.try_open("garbage", OPEN).await.unwrap(),
        OPEN,
        "repaired"
    );
    assert!(matches!(
        store.read("garbage").await.unwrap(),
        Decision::Open { .. }
    ));
}

// --- cost ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closed_path_costs_about_one_read_per_breaker_per_interval() {
    let Some(server) =
        RedisServer::start_or_skip("the_closed_path_costs_about_one_read_per_breaker_per_interval")
    else {
        return;
    };
    let fleet = fleet(&server, "cost", 4).await;
    let before = server.command_calls();
    let start = Instant::now();
    let calls = 100_000;
    for i in 0..calls {
        fleet[i % 4].try_acquire().unwrap().record(Outcome::Success);
        if i % 100 == 99 {
            // Spread the calls over about a second of real time.
            sleep(ms(1)).await;
        }
    }
    let elapsed = start.elapsed();
    sleep(ms(50)).await; // reads in flight land
    let after = server.command_calls();
    // Redis counts the commands a script runs (TIME, HGET) too; what the
    // breakers send is the scripts (EVALSHA, or EVAL and SCRIPT after a
    // restart).
    let mut spent: Vec<(String, u64)> = after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    spent.sort();
    let total: u64 = spent
        .iter()
        .filter(|(name, _)| name.starts_with("eval") || name.starts_with("script"))
        .map(|(_, n)| n)
        .sum();
    let intervals = elapsed.as_secs_f64() / REFRESH.as_secs_f64();
    let per = total as f64 / (4.0 * intervals);
    println!(
        "cost: {calls} closed calls over {elapsed:?} on 4 breakers, refresh {REFRESH:?}: {total} redis commands sent ({per:.2} per breaker per interval); server-side {spent:?}"
    );
    let bound = 4.0 * (intervals.ceil() + 1.0);
    assert!((total as f64) <= bound, "{total} > {bound}");
    assert!(total > 0, "the cache is refreshed");
}

// --- the store's own semantics ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_election_winner_and_only_its_token_closes() {
    let Some(server) =
        RedisServer::start_or_skip("exactly_one_election_winner_and_only_its_token_closes")
    else {
        return;
    };
    let store = store(&server).await;
    assert_eq!(store.read("votes").await.unwrap(), Decision::Missing);
    store.try_open("votes", ms(100)).await.unwrap();
    assert!(matches!(
        store.try_acquire_probe("votes", OPEN, OPEN).await.unwrap(),
        Election::Lost { .. }
    ));
    sleep(ms(150)).await;
    assert_eq!(store.read("votes").await.unwrap(), Decision::Expired);

    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.try_acquire_probe("votes", OPEN, OPEN).await.unwrap()
            })
        })
        .collect();
    let mut won = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Election::Won(token) => won.push(token),
            Election::Probing { remaining, lease } => {
                assert!(
                    remaining <= OPEN && lease <= OPEN,
                    "{remaining:?} {lease:?}"
                )
            }
            other => panic!("the record is there: {other:?}"),
        }
    }
    assert_eq!(won.len(), 1);
    let token = won[0];
    assert_eq!(token.reopens(), 0);
    assert!(!store
        .close("votes", ProbeToken::new(token.get() ^ 1))
        .await
        .unwrap());
    assert!(store.close("votes", token).await.unwrap());
    assert_eq!(store.read("votes").await.unwrap(), Decision::Closed);
    assert!(!store.close("votes", token).await.unwrap(), "only once");
    assert_eq!(
        store.try_acquire_probe("votes", OPEN, OPEN).await.unwrap(),
        Election::Closed,
        "the mark says closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_expire_some_time_after_t_for_cleanup_only() {
    let Some(server) =
        RedisServer::start_or_skip("records_expire_some_time_after_t_for_cleanup_only")
    else {
        return;
    };
    let store = RedisStore::connect(
        &server.url(),
        RedisOptions::new().prefix("app:").cleanup_after(secs(30)),
    )
    .await
    .unwrap();
    store.try_open("ttl", secs(5)).await.unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg("app:ttl")
        .query(&mut server.raw())
        .unwrap();
    assert!((30_000..=35_000).contains(&ttl), "{ttl}");
}

// --- configuration ---

#[tokio::test(flavor = "current_thread")]
async fn names_and_prefixes_are_checked_at_construction() {
    let Some(server) = RedisServer::start_or_skip("names_and_prefixes_are_checked_at_construction")
    else {
        return;
    };
    let err = RedisStore::connect(&server.url(), RedisOptions::new().prefix("my app:"))
        .await
        .unwrap_err();
    let source = std::error::Error::source(&err).unwrap();
    assert!(source.downcast_ref::<InvalidName>().is_some(), "{source}");

    let store = store(&server).await;
    assert_eq!(store.key("payments").unwrap(), "tower-breaker:payments");
    // Names are encoded, not refused: spaces, route templates, IPv6 hosts.
    assert_eq!(
        store.key("with space").unwrap(),
        "tower-breaker:with%20space"
    );
    assert_eq!(store.key("100%").unwrap(), "tower-breaker:100%25");
    assert_ne!(store.key("a%20b").unwrap(), store.key("a b").unwrap());
    let err = store.key("").unwrap_err();
    assert_eq!(err.name(), "");
    let err = Breaker::try_with_config("", config().store(store.clone())).unwrap_err();
    let source = std::error::Error::source(&err).unwrap();
    assert!(source.downcast_ref::<InvalidName>().is_some());
    // A name past the limit (a keyed breaker's long route) is kept in a
    // bounded form, the same for every process, never refused.
    let long = format!("/search?q={}", "x".repeat(300));
    assert!(Breaker::try_with_config(long.clone(), config().store(store.clone())).is_ok());
    let key = store.key(&long).unwrap();
    assert_eq!(key, store.key(&long).unwrap());
    assert_ne!(key, store.key(&format!("{long}y")).unwrap());
    assert!(key.len() <= "tower-breaker:".len() + 3 * 200, "{key}");
    assert!(Breaker::try_with_config("/users/{id}", config().store(store.clone())).is_ok());
    assert!(Breaker::try_with_config("hosts:api.example:443", config().store(store)).is_ok());
}

#[tokio::test(flavor = "current_thread")]
async fn connect_fails_in_time_and_connect_lazy_fails_open() {
    let Some(mut server) =
        RedisServer::start_or_skip("connect_fails_in_time_and_connect_lazy_fails_open")
    else {
        return;
    };
    let url = server.url();
    server.kill();
    let start = Instant::now();
    assert!(
        RedisStore::connect(&url, RedisOptions::new().connect_timeout(ms(300)))
            .await
            .is_err()
    );
    assert!(start.elapsed() < secs(2));

    let lazy = Arc::new(RedisStore::connect_lazy(&url, RedisOptions::new()).unwrap());
    let b = breaker_on("lazy", lazy.clone());
    assert!(b.refresh().await.is_err());
    b.try_acquire()
        .expect("fails open")
        .record(Outcome::Success);

    server.restart();
    let start = Instant::now();
    while lazy.read("lazy").await.is_err() {
        assert!(start.elapsed() < secs(10), "reconnects by itself");
        sleep(ms(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_names_with_route_templates_and_ipv6_hosts_share_their_circuits() {
    let Some(server) = RedisServer::start_or_skip(
        "keyed_names_with_route_templates_and_ipv6_hosts_share_their_circuits",
    ) else {
        return;
    };
    for name in [
        "routes:/users/{id}",
        "hosts:[::1]:8080",
        "tenants:café 100%",
    ] {
        let fleet = fleet(&server, name, 2).await;
        trip(&fleet[0]);
        until_all_reject(&fleet[1..], REFRESH * 20).await;
        let store = store(&server).await;
        assert!(
            matches!(store.read(name).await.unwrap(), Decision::Open { .. }),
            "{name}"
        );
    }
}

/// A failover to a node whose clock is an hour behind the old one's: the
/// record's T, written by the old node's clock, lies an hour ahead by the
/// new node's. The time left is capped at the opening's period, so the
/// fleet stays open at most one period more, not an hour, for reads,
/// elections and openers alike (as the DynamoDB store caps it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_left_is_capped_by_the_openings_period_whatever_the_nodes_clock() {
    let Some(server) = RedisServer::start_or_skip(
        "the_time_left_is_capped_by_the_openings_period_whatever_the_nodes_clock",
    ) else {
        return;
    };
    let store = store(&server).await;
    store.try_open("behind", secs(2)).await.unwrap();
    let key = store.key("behind").unwrap();
    let hour_ahead = server.now_ms() + 3_600_000;
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("until")
        .arg(hour_ahead)
        .query(&mut server.raw())
        .unwrap();
    match store.read("behind").await.unwrap() {
        Decision::Open { remaining } => assert!(remaining <= secs(2), "read: {remaining:?}"),
        other => panic!("open, got {other:?}"),
    }
    match store
        .try_acquire_probe("behind", secs(2), secs(2))
        .await
        .unwrap()
    {
        Election::Lost { remaining } => assert!(remaining <= secs(2), "elect: {remaining:?}"),
        other => panic!("lost, got {other:?}"),
    }
    let left = store.try_open("behind", secs(5)).await.unwrap();
    assert!(left <= secs(2), "open: {left:?}");
}
