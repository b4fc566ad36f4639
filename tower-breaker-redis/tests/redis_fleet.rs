//! The fleet-wide window across separate OS processes: 20 processes, each
//! calling a failing dependency at a low rate, open together from the
//! fleet's evidence; and a key of keyed breakers, called rarely by each of
//! three processes, closes again after its outage. Each process is this
//! test binary run again with `TOWER_BREAKER_REDIS_FLEET` (or
//! `TOWER_BREAKER_REDIS_KEYED`) set; a private `redis-server` on a free
//! port.

mod support;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use resilience_testkit::process::result_line;
use support::redis_server::RedisServer;
use support::*;
use tokio::time::sleep;
use tower_breaker::{Breaker, Outcome, State};
use tower_breaker_redis::{RedisOptions, RedisStore};

const MEMBER: &str = "TOWER_BREAKER_REDIS_FLEET";
const KEYED_MEMBER: &str = "TOWER_BREAKER_REDIS_KEYED";

/// Held while a fleet of processes runs.
static FLEETS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// One process of the fleet: from `start_ms` on, calls the dependency every
/// `every_ms` through its breaker (default thresholds, its own window of
/// 20 calls), until its breaker rejects; prints how many calls it made and
/// when it first rejected. A no-op without `TOWER_BREAKER_REDIS_FLEET`.
#[test]
fn fleet_member_role() {
    let Ok(spec) = std::env::var(MEMBER) else {
        return;
    };
    let [url, start_ms, every_ms, healthy_ms]: [&str; 4] = spec
        .split(' ')
        .collect::<Vec<_>>()
        .try_into()
        .expect("url start every healthy");
    let (start_ms, every_ms): (u128, u64) = (start_ms.parse().unwrap(), every_ms.parse().unwrap());
    // The dependency is healthy until then, and fails from then on.
    let outage_ms: u128 = healthy_ms.parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(
            RedisStore::connect(url, RedisOptions::new().timeout(ms(500)))
                .await
                .unwrap(),
        );
        let client = redis::Client::open(url).unwrap();
        let mut dependency = redis::aio::ConnectionManager::new(client).await.unwrap();
        let b = Breaker::with_config("fleet", config().store(store));
        b.refresh().await.unwrap();
        while unix_ms() < start_ms {
            sleep(ms(1)).await;
        }
        let mut calls = 0;
        let deadline = outage_ms + 20_000;
        let rejected_at = loop {
            assert!(unix_ms() < deadline, "never opened");
            match b.try_acquire() {
                Ok(permit) if unix_ms() < outage_ms => permit.record(Outcome::Success),
                Ok(permit) => {
                    calls += 1;
                    // The dependency: counts calls fleet-wide, and fails.
                    let _: i64 = redis::cmd("INCR")
                        .arg("dependency-calls")
                        .query_async(&mut dependency)
                        .await
                        .unwrap();
                    permit.record(Outcome::Failure);
                }
                Err(_) => break unix_ms(),
            }
            // Wait for the next call, but notice an opening meanwhile.
            for _ in 0..every_ms {
                if state(&b) == State::Open {
                    break;
                }
                sleep(ms(1)).await;
            }
        };
        println!("member-result calls={calls} rejected_at={rejected_at}");
    });
}

/// Starts this test binary again as one member process: its test `role`
/// alone, with `spec` in the environment variable `env`.
fn member(role: &str, env: &str, spec: String) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([role, "--exact", "--nocapture", "--test-threads=1"])
        .env(env, spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Runs `n` member processes calling every `every_ms` from a common start,
/// spread over the interval; returns the dependency's calls and, for each
/// process, its first rejection and its own start (ms since the common
/// start).
async fn run_fleet(server: &RedisServer, n: usize, every_ms: u64) -> (i64, Vec<(i64, i64)>) {
    run_fleet_after(server, n, every_ms, 0).await
}

/// [`run_fleet`], healthy for `healthy_ms` first: the times are then from
/// the outage.
async fn run_fleet_after(
    server: &RedisServer,
    n: usize,
    every_ms: u64,
    healthy_ms: u64,
) -> (i64, Vec<(i64, i64)>) {
    // One fleet at a time: 20 processes of one test share the machine's
    // cores with nobody else's (two fleets at once on 2 cores spread the
    // first rejections by the scheduler's delays, not the store's).
    let _alone = FLEETS.lock().await;
    let common_ms = unix_ms() + 1500;
    let outage_ms = common_ms + u128::from(healthy_ms);
    let start_ms = common_ms;
    // Spread over the interval, as independent callers are.
    let children: Vec<_> = (0..n)
        .map(|i| {
            let start_ms = start_ms + (i as u128) * u128::from(every_ms) / n as u128;
            let spec = format!("{} {start_ms} {every_ms} {outage_ms}", server.url());
            member("fleet_member_role", MEMBER, spec)
        })
        .collect();
    let mut rejected = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let offset = (i as u64 * every_ms / n as u64) as i64;
        let line = result_line(child, "member-result ").await;
        let at: u128 = line.split_once("rejected_at=").unwrap().1.parse().unwrap();
        rejected.push((at as i64 - outage_ms as i64, offset));
    }
    let calls: i64 = redis::cmd("GET")
        .arg("dependency-calls")
        .query(&mut server.raw())
        .unwrap();
    rejected.sort_unstable();
    (calls, rejected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_processes_at_one_call_a_second_open_together() {
    let Some(server) =
        RedisServer::start_or_skip("twenty_processes_at_one_call_a_second_open_together")
    else {
        return;
    };
    let (calls, rejected) = run_fleet(&server, 20, 1000).await;
    let opened = rejected[0].0;
    // Processes already running when the fleet opened: how long until each
    // rejected (the others reject at their first call).
    let learned: Vec<i64> = rejected
        .iter()
        .filter(|(_, start)| *start < opened)
        .map(|(at, _)| at - opened)
        .collect();
    let spread = learned.iter().max().copied().unwrap_or(0);
    println!(
        "fleet processes: 20 x 1 call/s: {calls} calls to open the whole fleet (minimum 10); \
         first rejection {opened} ms after the start; the {} processes running then all \
         rejected within {spread} ms",
        learned.len()
    );
    assert!(
        rejected.iter().all(|(at, start)| at >= start),
        "nobody rejects before it starts"
    );
    // Alone, each process would need 10 calls: 200 in all.
    assert!(calls <= 2 * 10 + 20, "{calls} calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_processes_at_fifty_calls_a_second_open_together() {
    let Some(server) =
        RedisServer::start_or_skip("twenty_processes_at_fifty_calls_a_second_open_together")
    else {
        return;
    };
    let (calls, rejected) = run_fleet(&server, 20, 20).await;
    let first = rejected[0].0;
    let last = rejected.iter().map(|(at, _)| *at).max().unwrap();
    println!(
        "fleet processes: 20 x 50 calls/s: {calls} calls to open the whole fleet (minimum 10); \
         every process rejected between {first} and {last} ms after the start"
    );
    // Each process alone trips after 10 failures: 200 in all.
    assert!(calls <= 60, "{calls} calls");
}

/// After 3 s of healthy traffic at 50 calls/s per process, the dependency
/// fails fast: the fleet's count window (its newest 20 calls, failures in a
/// row placed after each process's healthy calls) opens the whole fleet
/// after about 10 failures fleet-wide. Before it, 182 calls: the healthy
/// history diluted the fleet's window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_healthy_traffic_twenty_processes_at_fifty_calls_a_second_open_within_thirty_calls() {
    let Some(server) = RedisServer::start_or_skip(
        "after_healthy_traffic_twenty_processes_at_fifty_calls_a_second_open_within_thirty_calls",
    ) else {
        return;
    };
    let (calls, rejected) = run_fleet_after(&server, 20, 20, 3_000).await;
    let first = rejected[0].0;
    let last = rejected.iter().map(|(at, _)| *at).max().unwrap();
    println!(
        "fleet processes: 20 x 50 calls/s after 3 s healthy: {calls} calls until every process \
         rejects; first rejections between {first} and {last} ms after the outage (spread {} ms)",
        last - first
    );
    assert!(calls <= 30, "{calls} calls");
    assert!(last - first <= 20, "spread {} ms", last - first);
}

/// The same at 1 call/s per process: at most 2 x `minimum_calls`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_healthy_traffic_twenty_processes_at_one_call_a_second_open_within_twice_the_minimum()
{
    let Some(server) = RedisServer::start_or_skip(
        "after_healthy_traffic_twenty_processes_at_one_call_a_second_open_within_twice_the_minimum",
    ) else {
        return;
    };
    let (calls, rejected) = run_fleet_after(&server, 20, 1000, 3_000).await;
    let first = rejected[0].0;
    println!(
        "fleet processes: 20 x 1 call/s after 3 s healthy: {calls} calls until every process \
         rejects (first rejection {first} ms after the outage)"
    );
    assert!(calls <= 2 * 10, "{calls} calls");
}

/// The keyed breakers of the keyed fleet's processes: a key's circuit
/// opens after 2 failures and stays open for 3 s.
fn keyed_registry(store: Arc<RedisStore>) -> tower_breaker::BreakerRegistry<u32> {
    tower_breaker::BreakerRegistry::new(
        "hosts",
        config()
            .count_window(2)
            .minimum_calls(2)
            .open_period(secs(3))
            .store(store),
    )
}

/// One process of the keyed fleet: learns key 1's circuit (open), then
/// from `start_ms` on calls key 1 through a keyed breaker `calls` times,
/// one call every `every_ms`, on a healthy dependency (a counter in
/// Redis); prints how many calls were answered and how many refused. A
/// no-op without `TOWER_BREAKER_REDIS_KEYED`.
#[test]
fn keyed_member_role() {
    use tower::ServiceExt;

    let Ok(spec) = std::env::var(KEYED_MEMBER) else {
        return;
    };
    let [url, start_ms, every_ms, calls]: [&str; 4] = spec
        .split(' ')
        .collect::<Vec<_>>()
        .try_into()
        .expect("url start every calls");
    let (start_ms, every_ms, calls): (u128, u64, usize) = (
        start_ms.parse().unwrap(),
        every_ms.parse().unwrap(),
        calls.parse().unwrap(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(
            RedisStore::connect(url, RedisOptions::new().timeout(ms(500)))
                .await
                .unwrap(),
        );
        let registry = keyed_registry(store);
        let key = registry.get(&1);
        key.refresh().await.unwrap();
        assert_eq!(state(&key), State::Open, "the member knows the key open");
        let dependency = {
            let client = redis::Client::open(url).unwrap();
            let connection = redis::aio::ConnectionManager::new(client).await.unwrap();
            tower::service_fn(move |_: u32| {
                let mut connection = connection.clone();
                async move {
                    redis::cmd("INCR")
                        .arg("dependency-calls")
                        .query_async::<i64>(&mut connection)
                        .await
                }
            })
        };
        let service = tower_breaker::keyed::KeyedPlainCircuitBreaker::new(
            dependency,
            registry.clone(),
            |key: &u32| *key,
        );
        let (mut answered, mut refused) = (0, 0);
        for call in 0..calls {
            let at = start_ms + call as u128 * u128::from(every_ms);
            while unix_ms() < at {
                sleep(ms(1)).await;
            }
            match service.clone().oneshot(1).await {
                Ok(_) => answered += 1,
                Err(e) if e.is::<tower_breaker::error::CircuitOpen>() => refused += 1,
                Err(e) => panic!("the dependency failed: {e}"),
            }
        }
        println!("keyed-result answered={answered} refused={refused}");
    });
}

/// Three processes call one key of their keyed breakers once every 1.6 s
/// each, staggered, after the key's circuit opened fleet-wide; the
/// dependency is healthy again. The first call after the open period
/// waits for the election it starts, probes and closes the key for the
/// whole fleet: every later call is answered. Before, keyed breakers did
/// not wait: each call started an election and was refused, the winner
/// gave the probe back 1.3 s later with no call to probe with, and the
/// key stayed open for good (every call refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_calling_a_key_rarely_close_it_after_its_open_period() {
    let Some(server) = RedisServer::start_or_skip(
        "three_processes_calling_a_key_rarely_close_it_after_its_open_period",
    ) else {
        return;
    };
    let _alone = FLEETS.lock().await;
    let store = Arc::new(
        RedisStore::connect(&server.url(), RedisOptions::new().timeout(ms(500)))
            .await
            .unwrap(),
    );
    let registry = keyed_registry(store);
    let key = registry.get(&1);
    for _ in 0..2 {
        key.try_acquire().unwrap().record(Outcome::Failure);
    }
    assert_eq!(state(&key), State::Open);
    let opened_ms = unix_ms();
    // The opening reaches the store: a fresh process reads it.
    let reader = keyed_registry(Arc::new(
        RedisStore::connect(&server.url(), RedisOptions::new())
            .await
            .unwrap(),
    ));
    loop {
        assert!(
            unix_ms() < opened_ms + 2_000,
            "the opening never reached Redis"
        );
        let fresh = reader.get(&1);
        if fresh.refresh().await.is_ok() && state(&fresh) == State::Open {
            break;
        }
        sleep(ms(10)).await;
    }
    // Redis timed the open period from the opening's write, before now.
    let written_by_ms = unix_ms();

    const PROCESSES: u64 = 3;
    const EVERY_MS: u64 = 1_600;
    const CALLS: usize = 4;
    // The first call 0.3 s after the open period at the latest, the others
    // staggered over the interval.
    let first_ms = written_by_ms + 3_300;
    let children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            let start_ms = first_ms + u128::from(i * EVERY_MS / PROCESSES);
            let spec = format!("{} {start_ms} {EVERY_MS} {CALLS}", server.url());
            member("keyed_member_role", KEYED_MEMBER, spec)
        })
        .collect();
    let (mut answered, mut refused) = (0, 0);
    for child in children {
        let line = result_line(child, "keyed-result ").await;
        let count = |field: &str| -> usize {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(field))
                .unwrap()
                .parse()
                .unwrap()
        };
        answered += count("answered=");
        refused += count("refused=");
    }
    // Never set when nothing reached the dependency.
    let calls: i64 = redis::cmd("GET")
        .arg("dependency-calls")
        .query::<Option<i64>>(&mut server.raw())
        .unwrap()
        .unwrap_or(0);
    println!(
        "keyed fleet: 3 processes x 1 call per 1.6 s on a key open for 3 s: \
         {answered} answered, {refused} refused"
    );
    assert_eq!(refused, 0, "the key never recovered in {answered} answered");
    assert_eq!(answered, PROCESSES as usize * CALLS);
    assert_eq!(
        calls, answered as i64,
        "each answer was a call of the dependency"
    );
}
