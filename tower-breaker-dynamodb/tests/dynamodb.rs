//! The DynamoDB store against a real DynamoDB-compatible server: each test
//! starts its own `moto_server` on a free port of 127.0.0.1 (see
//! `support::moto_server`), so it can kill and restart it.
//!
//! The store takes its times from an injected wall clock, so the store's
//! rules are tested by giving each "process" (each store) its own clock
//! offset instead of waiting. The tests through breakers run in real time
//! with open periods of a few hundred milliseconds and generous bounds.

mod support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use support::moto_server::{client_for, options, MotoServer};
use support::*;
use tokio::time::{sleep, Instant};
use tower_breaker::store::{
    Decision, Election, FleetRule, ProbeToken, Report, Store, StoreFailureMode,
};
use tower_breaker::FleetConfig;
use tower_breaker::{Breaker, BreakerConfig, Outcome, Permit, State};
use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore};

const TABLE: &str = "circuits";
const REFRESH: Duration = Duration::from_millis(100);
const OPEN: Duration = Duration::from_millis(400);
/// A store on `server`'s table, as one process would have, with its clock
/// `skew_ms` off.
async fn process(server: &MotoServer, skew_ms: i64) -> Arc<DynamoDbStore> {
    Arc::new(server.store(TABLE, options(skew_ms)).await)
}

/// A store whose clock offset the test moves.
async fn movable(server: &MotoServer) -> (Arc<DynamoDbStore>, Arc<AtomicI64>) {
    let offset = Arc::new(AtomicI64::new(0));
    let o = offset.clone();
    let store = server
        .store(
            TABLE,
            DynamoDbOptions::new()
                .timeout(secs(5))
                .clock(move || shifted(o.load(SeqCst))),
        )
        .await;
    (Arc::new(store), offset)
}

fn shifted(skew_ms: i64) -> SystemTime {
    let now = SystemTime::now();
    if skew_ms >= 0 {
        now + ms(skew_ms as u64)
    } else {
        now - ms(skew_ms.unsigned_abs())
    }
}

/// The item behind the store's back, attribute by attribute (numbers and
/// strings as text).
async fn item(server: &MotoServer, key: &str) -> HashMap<String, String> {
    let out = server
        .client()
        .get_item()
        .table_name(TABLE)
        .key("pk", AttributeValue::S(key.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    out.item
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let text = match v {
                AttributeValue::N(n) | AttributeValue::S(n) => n,
                other => format!("{other:?}"),
            };
            (k, text)
        })
        .collect()
}

fn num(item: &HashMap<String, String>, name: &str) -> u64 {
    item[name].parse().unwrap()
}

fn fleet_config(store: Arc<DynamoDbStore>) -> BreakerConfig {
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

/// Calls every breaker every few milliseconds until each has rejected a
/// call; returns how long it took.
async fn until_all_reject(fleet: &[Breaker], limit: Duration) -> Duration {
    let start = Instant::now();
    let mut open = vec![false; fleet.len()];
    while open.iter().any(|o| !o) {
        assert!(start.elapsed() < limit, "some breakers still admit");
        for (b, open) in fleet.iter().zip(&mut open) {
            match b.try_acquire() {
                Ok(p) => p.record(Outcome::Ignored),
                Err(_) => *open = true,
            }
        }
        sleep(ms(5)).await;
    }
    start.elapsed()
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

// --- the store's rules ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_openers_keep_the_first_writers_t() {
    let Some(server) =
        MotoServer::start_or_skip("fifty_concurrent_openers_keep_the_first_writers_t")
    else {
        return;
    };
    let store = process(&server, 0).await;
    let key = store.key("openers").unwrap();
    // Distinct periods, so the item tells which opener wrote it.
    let period = |i: u64| ms(20_000 + 10 * i);
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50u64)
        .map(|i| {
            let (store, barrier) = (store.clone(), barrier.clone());
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
    let record = item(&server, &key).await;
    let usage = store.usage();
    assert_eq!(
        usage.writes - usage.refused,
        1,
        "exactly one opener wrote; the others' conditional writes were refused: {usage:?}"
    );
    let first = (0..50)
        .find(|i| period(*i).as_millis() == u128::from(num(&record, "period_ms")))
        .expect("the item holds one opener's period");
    assert!(
        results.contains(&(first, period(first))),
        "the writer got its own period back"
    );
    assert_eq!(
        num(&record, "until_ms") - num(&record, "since_ms"),
        num(&record, "period_ms"),
        "T = the first writer's now + its period"
    );
    for (i, remaining) in &results {
        assert!(
            *remaining <= period(first),
            "opener {i} saw T pushed forward"
        );
    }
    println!(
        "openers: #{first} of 50 wrote; {} reads and {} conditional writes ({} refused) for 50 openers",
        usage.reads, usage.writes, usage.refused
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_processes_x_20_racing_tasks_elect_exactly_one_prober_and_only_its_token_closes() {
    let Some(server) = MotoServer::start_or_skip(
        "fifty_processes_x_20_racing_tasks_elect_exactly_one_prober_and_only_its_token_closes",
    ) else {
        return;
    };
    let opener = process(&server, 0).await;
    opener.try_open("election", ms(1_000)).await.unwrap();
    // 50 processes whose clocks are 2 s on: T has passed for each of them.
    // Their clocks also disagree among themselves by up to 49 ms.
    let mut fleet = Vec::new();
    for p in 0..50 {
        fleet.push(Arc::new(
            DynamoDbStore::new(
                server.client(),
                options(2_000 + p).table(TABLE).timeout(secs(60)),
            )
            .unwrap(),
        ));
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(1000));
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let (store, barrier) = (fleet[i % 50].clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                // The winner's lease (10 minutes) outlasts the race, however
                // slow a loaded machine makes it: past a lease, a second
                // winner would be right (the first counts as gone).
                store
                    .try_acquire_probe("election", ms(1_000), secs(600))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut won = Vec::new();
    let mut lost = 0;
    for t in tasks {
        match t.await.unwrap() {
            Election::Won(token) => won.push(token),
            Election::Probing { remaining, lease } => {
                assert!(remaining <= secs(601), "{remaining:?}");
                assert!(lease <= secs(601), "{lease:?}");
                lost += 1;
            }
            other => panic!("nobody closed: {other:?}"),
        }
    }
    assert_eq!(won.len(), 1, "exactly one prober among 1000 tasks");
    assert_eq!(lost, 999);
    let token = won[0];
    // A loser cannot close or re-open with a guessed token.
    let guess = ProbeToken::new(token.get().wrapping_add(1));
    assert!(!fleet[3].close("election", guess).await.unwrap());
    fleet[3].reopen("election", guess, secs(60)).await.unwrap();
    let key = opener.key("election").unwrap();
    assert_eq!(item(&server, &key).await["ver"], token.get().to_string());
    // The winner's token closes, from any process.
    assert!(fleet[7].close("election", token).await.unwrap());
    assert_eq!(opener.read("election").await.unwrap(), Decision::Closed);
    assert!(!fleet[7].close("election", token).await.unwrap(), "once");
    let requests: u64 = fleet
        .iter()
        .map(|s| s.usage().reads + s.usage().writes)
        .sum();
    println!("election: 1 winner among 50 processes x 20 tasks, {requests} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_prober_cannot_close_or_reopen_a_circuit_reopened_or_reelected_since() {
    let Some(server) = MotoServer::start_or_skip(
        "a_stale_prober_cannot_close_or_reopen_a_circuit_reopened_or_reelected_since",
    ) else {
        return;
    };
    let a = process(&server, 2_000).await;
    let b = process(&server, 60_000).await;
    process(&server, 0)
        .await
        .try_open("stale", ms(1_000))
        .await
        .unwrap();
    // A wins with a 5 s lease, then stalls (a frozen Lambda).
    let Election::Won(stale) = a
        .try_acquire_probe("stale", secs(5), secs(5))
        .await
        .unwrap()
    else {
        panic!("A wins")
    };
    // Long after A's lease (B's clock is ~58 s on), B wins the next election.
    let Election::Won(fresh) = b
        .try_acquire_probe("stale", secs(5), secs(5))
        .await
        .unwrap()
    else {
        panic!("B takes the dead prober's place")
    };
    assert_eq!(fresh.reopens(), 0);
    // A thaws: its success must not close B's circuit, its failure must
    // not re-open it (its token is stale).
    assert!(!a.close("stale", stale).await.unwrap());
    let key = a.key("stale").unwrap();
    let before = item(&server, &key).await;
    let remaining = a.reopen("stale", stale, secs(50)).await.unwrap();
    assert!(remaining <= secs(5), "A adopts B's T, not its own 50 s");
    assert_eq!(item(&server, &key).await, before, "nothing written");
    // B's probe fails: the fleet re-opens, and the count goes up.
    b.reopen("stale", fresh, secs(10)).await.unwrap();
    let record = item(&server, &key).await;
    assert_eq!(record["reopens"], "1");
    assert_eq!(record["lease_until_ms"], "0", "no prober while re-opened");
    // B's token is spent too: the re-open wrote a new version.
    assert!(!b.close("stale", fresh).await.unwrap());
    assert!(matches!(
        b.read("stale").await.unwrap(),
        Decision::Open { .. }
    ));
}

// --- clocks ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prober_lease_holds_against_clocks_ahead_within_the_tolerated_skew() {
    let Some(server) = MotoServer::start_or_skip(
        "a_prober_lease_holds_against_clocks_ahead_within_the_tolerated_skew",
    ) else {
        return;
    };
    let prober = process(&server, 2_000).await;
    process(&server, 0)
        .await
        .try_open("lease", ms(1_000))
        .await
        .unwrap();
    let Election::Won(_) = prober
        .try_acquire_probe("lease", ms(500), secs(10))
        .await
        .unwrap()
    else {
        panic!("the prober wins")
    };
    // The lease ends 10 s after the win by the prober's clock. A contender
    // whose clock is 10.8 s ahead of the prober's sees it over by 0.8 s:
    // within the tolerated 1 s, it still loses.
    let within = process(&server, 2_000 + 10_800).await;
    match within
        .try_acquire_probe("lease", ms(500), secs(10))
        .await
        .unwrap()
    {
        Election::Probing { lease, .. } => {
            assert!(lease <= ms(200), "the skew margin's rest: {lease:?}")
        }
        other => panic!("a clock 0.8 s past the lease must lose: {other:?}"),
    }
    // Beyond the bound (1.3 s past by its clock) a contender takes over:
    // the documented limit of the skew margin.
    let beyond = process(&server, 2_000 + 11_300).await;
    assert!(matches!(
        beyond
            .try_acquire_probe("lease", ms(500), secs(10))
            .await
            .unwrap(),
        Election::Won(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_that_watched_a_whole_lease_takes_over_whatever_its_clock_says() {
    let Some(server) = MotoServer::start_or_skip(
        "a_contender_that_watched_a_whole_lease_takes_over_whatever_its_clock_says",
    ) else {
        return;
    };
    let prober = process(&server, 2_000).await;
    process(&server, 0)
        .await
        .try_open("watched", ms(1_000))
        .await
        .unwrap();
    let Election::Won(_) = prober
        .try_acquire_probe("watched", ms(500), secs(10))
        .await
        .unwrap()
    else {
        panic!("the prober wins")
    };
    // The prober vanishes. A contender whose clock runs 30 s *behind*
    // would, by the lease's end time alone, wait 40 s more; it measures
    // the lease itself instead: the same version for 10 s of its clock.
    let (contender, offset) = movable(&server).await;
    offset.store(-30_000, SeqCst);
    let first = contender
        .try_acquire_probe("watched", ms(500), secs(10))
        .await
        .unwrap();
    assert!(
        matches!(first, Election::Probing { lease, .. } if lease <= secs(10)),
        "{first:?}"
    );
    offset.store(-30_000 + 9_500, SeqCst);
    assert!(matches!(
        contender.try_acquire_probe("watched", ms(500), secs(10)).await.unwrap(),
        Election::Probing { lease, .. } if lease <= ms(600)
    ));
    offset.store(-30_000 + 10_100, SeqCst);
    let Election::Won(token) = contender
        .try_acquire_probe("watched", ms(500), secs(10))
        .await
        .unwrap()
    else {
        panic!("a whole lease watched: the prober is gone")
    };
    assert!(contender.close("watched", token).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_with_skewed_clocks_see_one_opening_never_longer_than_its_period() {
    let Some(server) = MotoServer::start_or_skip(
        "readers_with_skewed_clocks_see_one_opening_never_longer_than_its_period",
    ) else {
        return;
    };
    let writer = process(&server, 0).await;
    writer.try_open("skew", secs(5)).await.unwrap();
    let behind = process(&server, -3_000).await;
    let ahead = process(&server, 3_000).await;
    let far_ahead = process(&server, 6_000).await;
    let open = |d: Decision| match d {
        Decision::Open { remaining } => remaining,
        other => panic!("open expected: {other:?}"),
    };
    let r = open(behind.read("skew").await.unwrap());
    assert!(
        r <= secs(5) && r > secs(4),
        "behind: capped at the period: {r:?}"
    );
    let r = open(ahead.read("skew").await.unwrap());
    assert!(
        r <= secs(2) && r > secs(1),
        "ahead: sees T 3 s early: {r:?}"
    );
    assert_eq!(far_ahead.read("skew").await.unwrap(), Decision::Expired);
}

// --- TTL, garbage, names ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_past_their_ttl_read_as_missing_and_the_ttl_is_cleanup_only() {
    let Some(server) = MotoServer::start_or_skip(
        "items_past_their_ttl_read_as_missing_and_the_ttl_is_cleanup_only",
    ) else {
        return;
    };
    let short = |skew| options(skew).cleanup_after(secs(60));
    let now = Arc::new(server.store(TABLE, short(0)).await);
    now.try_open("ttl", secs(5)).await.unwrap();
    let key = now.key("ttl").unwrap();
    let record = item(&server, &key).await;
    let expires = num(&record, "expires_at");
    assert_eq!(expires, (num(&record, "until_ms") + 60_000).div_ceil(1000));
    // 30 s later: expired, not missing (the TTL is long after T).
    let later = server.store(TABLE, short(30_000)).await;
    assert_eq!(later.read("ttl").await.unwrap(), Decision::Expired);
    // Past the TTL: moto never deletes items (nor, for up to days, does
    // DynamoDB), but the store reads it as missing ...
    let much_later = server.store(TABLE, short(70_000)).await;
    assert!(!item(&server, &key).await.is_empty(), "still in the table");
    assert_eq!(much_later.read("ttl").await.unwrap(), Decision::Missing);
    // ... and an election on it is won, as on a missing item.
    assert!(matches!(
        much_later.try_acquire_probe("ttl", secs(5), secs(5)).await.unwrap(),
        Election::Won(t) if t.reopens() == 0
    ));
}

/// The case: traffic stopped while the circuit was open, for
/// longer than the cleanup time, so the item is past its TTL (still in the
/// table: DynamoDB deletes lazily). A new process, a healthy dependency:
/// its reports `ADD` to the old item's window, which gives the item a new
/// TTL with its old opening. The store must not read that opening back as
/// expired (which opened the breaker, elected it and rejected a call):
/// every call succeeds, and nothing but reports is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_item_past_its_ttl_is_not_revived_by_reports() {
    let Some(server) =
        MotoServer::start_or_skip("an_open_item_past_its_ttl_is_not_revived_by_reports")
    else {
        return;
    };
    let short = |skew| options(skew).cleanup_after(secs(60));
    let old = server.store(TABLE, short(0)).await;
    old.try_open("revived", secs(5)).await.unwrap();
    let key = old.key("revived").unwrap();
    let before = item(&server, &key).await;

    // 70 s later by the new process's clock: past T plus the cleanup time.
    let store = Arc::new(server.store(TABLE, short(70_000)).await);
    let b = Breaker::with_config(
        "revived",
        config().count_window(4).minimum_calls(4).fleet(
            FleetConfig::new(store.clone())
                .refresh_interval(ms(50))
                .flush_interval(ms(10)),
        ),
    );
    b.refresh().await.unwrap();
    for _ in 0..10 {
        b.try_acquire()
            .expect("a healthy dependency: closed")
            .record(Outcome::Success);
        sleep(ms(60)).await;
    }
    // A failure makes a report at once, and is not enough to open.
    b.try_acquire().expect("closed").record(Outcome::Failure);
    sleep(ms(300)).await;
    assert_eq!(state(&b), State::Closed);
    assert_eq!(b.snapshot().totals.rejected, 0);
    let after = item(&server, &key).await;
    for field in ["state", "until_ms", "ver"] {
        assert_eq!(
            after.get(field),
            before.get(field),
            "{field}: no opening, no election"
        );
    }
    assert!(
        after.keys().any(|k| !before.contains_key(k)),
        "the reports landed in the window: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_the_item_is_an_error_and_an_open_repairs_it() {
    let Some(server) =
        MotoServer::start_or_skip("garbage_in_the_item_is_an_error_and_an_open_repairs_it")
    else {
        return;
    };
    let store = process(&server, 0).await;
    store.try_open("garbage", secs(5)).await.unwrap();
    let key = store.key("garbage").unwrap();
    server
        .client()
        .update_item()
        .table_name(TABLE)
        .key("pk", AttributeValue::S(key.clone()))
        .update_expression("SET until_ms = :x")
        .expression_attribute_values(":x", AttributeValue::S("soon".into()))
        .send()
        .await
        .unwrap();
    let err = store.read("garbage").await.unwrap_err();
    assert!(err.to_string().contains("unreadable"), "{err}");
    assert_eq!(store.try_open("garbage", secs(5)).await.unwrap(), secs(5));
    assert!(matches!(
        store.read("garbage").await.unwrap(),
        Decision::Open { .. }
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn names_tables_and_prefixes_are_checked_at_construction() {
    let client = client_for("http://127.0.0.1:9");
    for bad in ["ab", "a b", "tables/1"] {
        let err =
            DynamoDbStore::new(client.clone(), DynamoDbOptions::new().table(bad)).unwrap_err();
        assert!(
            err.to_string().contains("invalid dynamodb table name"),
            "{err}"
        );
    }
    let err = DynamoDbStore::new(
        client.clone(),
        DynamoDbOptions::new().prefix("p".repeat(65)),
    )
    .unwrap_err();
    assert!(err.to_string().contains("longer than 64 bytes"), "{err}");
    let err = DynamoDbStore::new(client.clone(), DynamoDbOptions::new().prefix("a")).unwrap_err();
    assert!(err.to_string().contains("must end with ':'"), "{err}");
    // No two (prefix, name) pairs share a key.
    let a = DynamoDbStore::new(client.clone(), DynamoDbOptions::new().prefix("a:")).unwrap();
    let ab = DynamoDbStore::new(client.clone(), DynamoDbOptions::new().prefix("a:b:")).unwrap();
    assert_eq!(a.key(":b").unwrap(), "a:%3Ab");
    assert_ne!(a.key("b:c").unwrap(), ab.key("c").unwrap());
    assert_ne!(a.key("%3Ab").unwrap(), a.key(":b").unwrap());
    let store =
        Arc::new(DynamoDbStore::new(client, DynamoDbOptions::new().prefix("shop:")).unwrap());
    assert_eq!(
        store.key("routes:/users/{id} é").unwrap(),
        "shop:routes%3A/users/{id} é"
    );
    assert!(store.key("").is_err());
    // A name past the limit is kept in a bounded form, never refused.
    let long = "n".repeat(301);
    let key = store.key(&long).unwrap();
    assert_eq!(key.len(), "shop:".len() + 200, "{key}");
    assert_ne!(key, store.key(&"n".repeat(302)).unwrap());
    let err = Breaker::try_with_config("", BreakerConfig::new().store(store)).unwrap_err();
    assert!(err.to_string().contains("invalid breaker name"), "{err}");
}

// --- the fleet's window ---

fn rule() -> FleetRule {
    FleetRule::new(10, secs(1), secs(5)).with_minimum_calls(10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_of_many_processes_add_up_and_open_the_circuit_together() {
    let Some(server) =
        MotoServer::start_or_skip("reports_of_many_processes_add_up_and_open_the_circuit_together")
    else {
        return;
    };
    let failing = Report::new(2, 2, 0);
    // Four racing processes report 2 failures each: 8 calls in the
    // fleet's window, below its minimum of 10, and none is lost.
    let mut fleet = Vec::new();
    for p in 0..4 {
        fleet.push(process(&server, p).await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(4));
    let decisions: Vec<_> = (0..4)
        .map(|i| {
            let (store, barrier) = (fleet[i].clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.report("window", failing, rule()).await.unwrap()
            })
        })
        .collect();
    let mut seen = Vec::new();
    for d in decisions {
        seen.push(d.await.unwrap());
    }
    assert_eq!(
        seen.iter().filter(|d| **d == Decision::Missing).count(),
        4,
        "8 calls: below the minimum: {seen:?}"
    );
    let mut opened = Vec::new();
    for store in &fleet {
        opened.push(store.report("window", failing, rule()).await.unwrap());
    }
    // The next report brings the fleet to its minimum of 10: it opens.
    assert_eq!(
        opened[0],
        Decision::Open { remaining: secs(5) },
        "{opened:?}"
    );
    // Once open, reports are not counted, and the others learn it.
    for d in &opened[1..] {
        assert!(
            matches!(d, Decision::Open { remaining } if *remaining <= secs(5)),
            "{opened:?}"
        );
    }
    let key = fleet[0].key("window").unwrap();
    let record = item(&server, &key).await;
    assert!(
        !record.keys().any(|k| k.starts_with('w')),
        "the opening cleared the window: {record:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_whose_clock_is_behind_the_whole_window_is_refused_loudly() {
    let Some(server) = MotoServer::start_or_skip(
        "a_process_whose_clock_is_behind_the_whole_window_is_refused_loudly",
    ) else {
        return;
    };
    let on_time = process(&server, 0).await;
    let behind = process(&server, -12_000).await;
    let healthy = Report::new(1, 0, 0);
    on_time.report("late", healthy, rule()).await.unwrap();
    // 12 s behind, with a 10 s window of 1 s buckets: its bucket is older
    // than the fleet's window. Rather than counting into nowhere, it is
    // refused.
    let err = behind.report("late", healthy, rule()).await.unwrap_err();
    assert!(err.to_string().contains("clock is behind"), "{err}");
    let key = on_time.key("late").unwrap();
    // The ticks of the item's buckets older than this process's window.
    let late = |record: &HashMap<String, String>| {
        let now_tick = (unix_ms() / 1000) as u64;
        record
            .keys()
            .filter_map(|k| k.strip_prefix('w')?.parse::<u64>().ok())
            .filter(|t| t + 10 <= now_tick)
            .count()
    };
    assert_eq!(
        late(&item(&server, &key).await),
        1,
        "the late bucket is in the item"
    );
    // The next reports (the first finds it, the second removes it) clean
    // it up.
    on_time
        .report("late", Report::default(), rule())
        .await
        .unwrap();
    on_time
        .report("late", Report::default(), rule())
        .await
        .unwrap();
    assert_eq!(
        late(&item(&server, &key).await),
        0,
        "the late bucket is gone"
    );
    // 3 s behind is within the window: its counts land in an older bucket,
    // still summed by the others. 6 failures, then 6 more: 12 of 13 calls.
    let slightly = process(&server, -3_000).await;
    let failing = Report::new(6, 6, 0);
    assert_eq!(
        slightly.report("late", failing, rule()).await.unwrap(),
        Decision::Missing
    );
    assert!(matches!(
        on_time.report("late", failing, rule()).await.unwrap(),
        Decision::Open { .. }
    ));
}

// --- breakers on the store ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breakers_that_each_saw_two_failures_open_together_and_one_probe_closes_them() {
    let Some(server) = MotoServer::start_or_skip(
        "breakers_that_each_saw_two_failures_open_together_and_one_probe_closes_them",
    ) else {
        return;
    };
    // Eight "processes", each with its own store, whose own windows need
    // 20 calls: none of them can open alone on its 2 failures.
    let mut fleet = Vec::new();
    for _ in 0..8 {
        let b = Breaker::with_config(
            "together",
            fleet_config_with(
                FleetConfig::new(process(&server, 0).await)
                    .refresh_interval(REFRESH)
                    .flush_interval(ms(20)),
            )
            .count_window(20)
            .minimum_calls(10),
        );
        b.refresh().await.unwrap();
        fleet.push(b);
    }
    for b in &fleet {
        for _ in 0..2 {
            b.try_acquire().unwrap().record(Outcome::Failure);
        }
        assert_eq!(state(b), State::Closed);
    }
    // Generous bounds: what is tested is that they open together and
    // close on one probe; the figures are printed.
    let opened = until_all_reject(&fleet, secs(15)).await;
    // One probe after the open period, among all, and its success closes
    // every breaker within about a refresh interval.
    let start = Instant::now();
    let probe: Permit = loop {
        assert!(start.elapsed() < secs(15), "no probe");
        if let Some(p) = fleet.iter().find_map(|b| b.try_acquire().ok()) {
            break p;
        }
        sleep(ms(5)).await;
    };
    assert!(probe.is_probe());
    for b in &fleet {
        assert!(b.try_acquire().is_err(), "one probe at a time, fleet-wide");
    }
    probe.record(Outcome::Success);
    let closed = until_all_admit(&fleet, secs(15)).await;
    println!("fleet window: 8 breakers x 2 failures opened all in {opened:?}; one probe closed all in {closed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closed_path_makes_no_request() {
    let Some(server) = MotoServer::start_or_skip("the_closed_path_makes_no_request") else {
        return;
    };
    let store = process(&server, 0).await;
    let b = Breaker::with_config(
        "quiet",
        fleet_config_with(FleetConfig::new(store.clone()).refresh_interval(secs(3600))),
    );
    b.refresh().await.unwrap();
    let before = store.usage();
    for _ in 0..10_000 {
        b.try_acquire().unwrap().record(Outcome::Success);
    }
    sleep(ms(200)).await;
    let after = store.usage();
    assert_eq!(
        (after.reads, after.writes),
        (before.reads, before.writes),
        "10,000 closed calls, no request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_server_fails_open_with_the_alarm_and_sharing_resumes_after_a_restart() {
    let Some(mut server) = MotoServer::start_or_skip(
        "killing_the_server_fails_open_with_the_alarm_and_sharing_resumes_after_a_restart",
    ) else {
        return;
    };
    let store = Arc::new(server.store(TABLE, options(0).timeout(ms(300))).await);
    let b = Breaker::with_config("down", fleet_config(store.clone()));
    b.refresh().await.unwrap();
    let strict = Breaker::with_config(
        "strict",
        fleet_config_with(
            FleetConfig::new(store.clone())
                .refresh_interval(REFRESH)
                .on_store_failure(StoreFailureMode::FailClosed),
        ),
    );
    strict.refresh().await.unwrap();
    server.kill();
    // Fail closed (if asked): its calls are refused once a store call failed.
    let start = Instant::now();
    while strict
        .try_acquire()
        .map(|p| p.record(Outcome::Success))
        .is_ok()
    {
        assert!(start.elapsed() < secs(5), "fail-closed never refused");
        sleep(ms(10)).await;
    }
    assert_eq!(strict.try_acquire().unwrap_err().retry_after(), REFRESH);
    // Fail open: calls keep being admitted, each failed store call counts.
    let start = Instant::now();
    while b.snapshot().totals.store_errors == 0 {
        assert!(start.elapsed() < secs(5), "no store error counted");
        b.try_acquire().expect("fail open").record(Outcome::Success);
        sleep(ms(10)).await;
    }
    let err = b.refresh().await.unwrap_err();
    assert!(
        err.to_string().contains("dynamodb"),
        "the alarm says where: {err}"
    );
    for _ in 0..20 {
        b.try_acquire()
            .expect("still fail open")
            .record(Outcome::Success);
    }
    // The local window still protects this process.
    while state(&b) != State::Open {
        b.try_acquire().unwrap().record(Outcome::Failure);
    }
    // The server comes back empty (moto keeps nothing): the table is
    // created again, and the opening this process knows is written again.
    server.restart();
    store.create_table().await.unwrap();
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < secs(5),
            "the opening was not written again"
        );
        // Open again (or already elected again: this process probes).
        if matches!(
            store.read("down").await,
            Ok(Decision::Open { .. } | Decision::Probing { .. })
        ) {
            break;
        }
        let _ = b.try_acquire();
        sleep(ms(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_bounds_every_store_call_by_the_timeout() {
    let Some(server) =
        MotoServer::start_or_skip("a_hung_server_bounds_every_store_call_by_the_timeout")
    else {
        return;
    };
    let store = server.store(TABLE, options(0).timeout(ms(150))).await;
    let pid = server.pid();
    let stop = |signal: &str| {
        assert!(Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap()
            .success())
    };
    stop("-STOP");
    let start = Instant::now();
    let read = store.read("hung").await;
    let open = store.try_open("hung", secs(5)).await;
    let elect = store.try_acquire_probe("hung", secs(5), secs(5)).await;
    let elapsed = start.elapsed();
    stop("-CONT");
    assert!(read.is_err() && open.is_err() && elect.is_err());
    assert!(read
        .unwrap_err()
        .to_string()
        .contains("no answer from dynamodb within 150ms"));
    assert!(
        elapsed < ms(150 * 3 + 400),
        "three calls, each bounded: {elapsed:?}"
    );
}

// --- separate OS processes with skewed clocks ---

const CHILD: &str = "TOWER_BREAKER_DYNAMODB_CHILD";
/// The clock of the process that probes first, and of the contender.
const PROBER_SKEW_MS: i64 = -700;
const CONTENDER_SKEW_MS: i64 = 700;
/// The probe's lease, and how long the probe takes: the contender's
/// clock, 1.4 s ahead, sees the lease end 1.4 s early, before the probe
/// is over (unless it adds the tolerated skew).
const LEASE: Duration = Duration::from_secs(4);
const PROBE_TAKES: Duration = Duration::from_millis(3_500);

/// One OS process: re-invoked by
/// `a_slow_probe_stays_alone_across_os_processes_whose_clocks_disagree`
/// with the variable set (`prober` or `contender`); a no-op otherwise.
#[test]
fn child_process_role() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let [role, url, max_skew_ms, stop_ms]: [&str; 4] = spec
        .split(' ')
        .collect::<Vec<_>>()
        .try_into()
        .expect("role url skew stop");
    let max_skew = ms(max_skew_ms.parse().unwrap());
    let stop_ms: u128 = stop_ms.parse().unwrap();
    let skew = if role == "prober" {
        PROBER_SKEW_MS
    } else {
        CONTENDER_SKEW_MS
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let options = options(skew).table(TABLE).max_clock_skew(max_skew);
        let store = Arc::new(DynamoDbStore::new(client_for(url), options).unwrap());
        let config = fleet_config(store).max_half_open_wait(LEASE);
        let breakers: Vec<Breaker> = (0..5)
            .map(|_| Breaker::with_config("skewed", config.clone()))
            .collect();
        for b in &breakers {
            b.refresh().await.unwrap();
        }
        if role == "prober" {
            let probe = loop {
                if let Some(p) = breakers.iter().find_map(|b| b.try_acquire().ok()) {
                    break p;
                }
                sleep(ms(5)).await;
            };
            assert!(probe.is_probe());
            println!("child-won {}", unix_ms());
            sleep(PROBE_TAKES).await;
            probe.record(Outcome::Failure);
            // The re-open is written by a background task: let it land
            // (it ends the lease) before the process exits. Without the
            // skew margin a contender may have re-elected since, and this
            // stale prober's re-open is fenced out: then the wait ends at
            // its bound.
            let client = client_for(url);
            let start = Instant::now();
            while start.elapsed() < secs(5) {
                let out = client
                    .get_item()
                    .table_name(TABLE)
                    .key("pk", AttributeValue::S("skewed".into()))
                    .consistent_read(true)
                    .send()
                    .await
                    .unwrap();
                let lease = out.item.as_ref().and_then(|i| i.get("lease_until_ms"));
                if lease.and_then(|v| v.as_n().ok()).map(String::as_str) == Some("0") {
                    break;
                }
                sleep(ms(20)).await;
            }
            return;
        }
        let admitted = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let (b, admitted) = (breakers[i % 5].clone(), admitted.clone());
                tokio::spawn(async move {
                    while unix_ms() < stop_ms {
                        if let Ok(permit) = b.try_acquire() {
                            admitted.fetch_add(1, SeqCst);
                            permit.record(Outcome::Failure);
                        }
                        sleep(ms(5)).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        println!("child-admitted {}", admitted.load(SeqCst));
    });
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// A prober process wins the election and probes slowly; a contender
/// process whose clock is 1.4 s ahead arrives while it probes. Returns
/// how many calls the contender let through before the probe ended.
async fn slow_probe_and_contender(server: &MotoServer, max_skew_ms: u64) -> usize {
    use std::io::{BufRead, BufReader};
    process(server, 0)
        .await
        .try_open("skewed", OPEN)
        .await
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let child = |role: &str, stop: u128| {
        Command::new(&exe)
            .args([
                "child_process_role",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD,
                format!("{role} {} {max_skew_ms} {stop}", server.url()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    };
    let mut prober = child("prober", 0);
    let stdout = prober.stdout.take().unwrap();
    // Read the prober's output to its end (it must never write into a
    // closed pipe), handing over its win as soon as it says so.
    let (tx, rx) = std::sync::mpsc::channel::<u128>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some((_, t)) = line.split_once("child-won ") {
                let _ = tx.send(t.trim().parse().unwrap());
            }
        }
    });
    let won = tokio::task::spawn_blocking(move || rx.recv().expect("the prober process wins"))
        .await
        .unwrap();
    // The contender calls from just after the win until just before the
    // probe ends.
    let stop = won + PROBE_TAKES.as_millis() - 100;
    let contender = child("contender", stop);
    let out = tokio::task::spawn_blocking(move || {
        let out = contender.wait_with_output().unwrap();
        assert!(prober.wait().unwrap().success());
        out
    })
    .await
    .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    stdout
        .lines()
        .find_map(|l| {
            l.split_once("child-admitted ")
                .map(|(_, n)| n.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no result in {stdout:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_probe_stays_alone_across_os_processes_whose_clocks_disagree() {
    let Some(server) = MotoServer::start_or_skip(
        "a_slow_probe_stays_alone_across_os_processes_whose_clocks_disagree",
    ) else {
        return;
    };
    // Tolerating 1.5 s of skew, the contender (1.4 s ahead) waits for the
    // prober's lease: one probe.
    let admitted = slow_probe_and_contender(&server, 1_500).await;
    assert_eq!(
        admitted, 0,
        "the contender joined a probe still within its lease"
    );
    let key = process(&server, 0).await.key("skewed").unwrap();
    assert_eq!(
        item(&server, &key).await["reopens"],
        "1",
        "the slow probe failed and re-opened, fenced by its token"
    );

    // The control, beyond the bound: tolerating no skew, the same
    // contender takes the probe over while the first one still runs. This
    // is what the skew margin prevents.
    let server = MotoServer::start();
    process(&server, 0).await;
    let admitted = slow_probe_and_contender(&server, 0).await;
    assert!(admitted >= 1, "without the margin a second probe starts");
    println!("skewed processes (1.4 s apart): 0 calls joined the probe with a 1.5 s margin, {admitted} without");
}

// --- lost answers ---

/// A proxy in front of the server that forwards every request and relays
/// its answer, except that it drops the answer of the first request whose
/// `X-Amz-Target` ends with `drop_target`: the server applied it, the
/// client hears nothing (its connection closes).
async fn lossy_proxy(upstream: String, drop_target: &'static str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let dropped = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let (upstream, dropped) = (upstream.clone(), dropped.clone());
            tokio::spawn(async move {
                // One request per connection: read its head and body.
                let mut request = Vec::new();
                let mut buf = [0u8; 8192];
                let head_end = loop {
                    let n = client.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    if let Some(i) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&request[..head_end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                while request.len() < head_end + length {
                    let n = client.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                }
                let target = head
                    .lines()
                    .find_map(|l| l.strip_prefix("x-amz-target:"))
                    .unwrap_or("")
                    .trim()
                    .to_owned();
                let addr = upstream.trim_start_matches("http://");
                let mut server = tokio::net::TcpStream::connect(addr).await.unwrap();
                // Ask the server to close after its answer, so the answer
                // is read to its end.
                let request = String::from_utf8_lossy(&request)
                    .replacen("\r\n", "\r\nConnection: close\r\n", 1)
                    .into_bytes();
                server.write_all(&request).await.unwrap();
                let mut answer = Vec::new();
                server.read_to_end(&mut answer).await.unwrap();
                if target.ends_with(&drop_target.to_lowercase())
                    && dropped.fetch_add(1, SeqCst) == 0
                {
                    return; // applied upstream; the client hears nothing
                }
                let _ = client.write_all(&answer).await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_won_whose_answer_was_lost_is_still_won() {
    let Some(server) =
        MotoServer::start_or_skip("an_election_won_whose_answer_was_lost_is_still_won")
    else {
        return;
    };
    process(&server, 0)
        .await
        .try_open("lost", ms(1_000))
        .await
        .unwrap();
    let proxy = lossy_proxy(server.url(), ".PutItem").await;
    // Through the proxy, T passed: the election's PutItem lands, its answer
    // is lost, the SDK sends it again, and that copy's condition fails
    // (the item holds the first copy's version).
    let store = DynamoDbStore::new(client_for(&proxy), options(2_000).table(TABLE)).unwrap();
    let election = store
        .try_acquire_probe("lost", ms(1_000), secs(30))
        .await
        .unwrap();
    let Election::Won(token) = election else {
        panic!("the write landed: the election is won, not lost behind its own lease: {election:?}")
    };
    assert!(
        store.usage().refused >= 1,
        "the retried copy was refused: {:?}",
        store.usage()
    );
    assert!(store.close("lost", token).await.unwrap());
}

#[tokio::test(flavor = "current_thread")]
async fn a_report_to_a_missing_table_is_known_not_applied() {
    let Some(server) =
        MotoServer::start_or_skip("a_report_to_a_missing_table_is_known_not_applied")
    else {
        return;
    };
    // No such table: the report never ran, so the breaker reports it again.
    let missing = DynamoDbStore::new(
        server.client(),
        DynamoDbOptions::new()
            .table("no-such-table")
            .timeout(Duration::from_secs(10)),
    )
    .unwrap();
    let rule = FleetRule::new(10, Duration::from_secs(1), Duration::from_secs(5));
    let err = missing
        .report("payments", Report::new(3, 3, 0), rule)
        .await
        .unwrap_err();
    assert!(err.is_not_applied(), "{err}");
    // A table that exists: nothing refused.
    let store = process(&server, 0).await;
    assert!(store
        .report("payments", Report::new(3, 0, 0), rule)
        .await
        .is_ok());
}

// --- windows in shards ---

/// `n` processes' stores whose windows are spread over `shards` items.
async fn sharded(server: &MotoServer, n: usize, shards: u32) -> Vec<Arc<DynamoDbStore>> {
    let mut fleet = Vec::new();
    for _ in 0..n {
        let store = server.store(TABLE, options(0).window_shards(shards)).await;
        fleet.push(Arc::new(store));
    }
    fleet
}

/// The write requests of `fleet` per item, summed over its stores.
fn writes_per_item(fleet: &[Arc<DynamoDbStore>]) -> HashMap<String, u64> {
    let mut all = HashMap::new();
    for store in fleet {
        for (item, n) in store.item_writes() {
            *all.entry(item).or_default() += n;
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_reports_spread_over_items_and_a_shard_that_breaks_opens_the_breakers_item() {
    let Some(server) = MotoServer::start_or_skip(
        "sharded_reports_spread_over_items_and_a_shard_that_breaks_opens_the_breakers_item",
    ) else {
        return;
    };
    let fleet = sharded(&server, 16, 4).await;
    // 40 calls before the fleet judges: 10 in a shard. Open for a second:
    // long enough for 16 reads from moto on a busy machine.
    let open_for = secs(1);
    let rule = FleetRule::new(10, secs(1), open_for).with_minimum_calls(40);
    let healthy = Report::new(2, 0, 0);
    for store in &fleet {
        assert_eq!(
            store.report("sharded", healthy, rule).await.unwrap(),
            Decision::Missing
        );
    }
    let key = fleet[0].key("sharded").unwrap();
    let writes = writes_per_item(&fleet);
    assert!(
        !writes.contains_key(&key),
        "no report wrote the breaker's item: {writes:?}"
    );
    assert!(writes.len() >= 2, "the reports spread: {writes:?}");
    assert!(writes.values().all(|n| *n < 16), "{writes:?}");
    // Failures: a shard's window tips (10 calls in it, half failed), and
    // the breaker's item opens for every process.
    let failing = Report::new(3, 3, 0);
    let mut opened_at = None;
    for _ in 0..4 {
        for store in &fleet {
            let sent = Instant::now();
            if matches!(
                store.report("sharded", failing, rule).await.unwrap(),
                Decision::Open { .. }
            ) {
                opened_at.get_or_insert(sent);
            }
        }
        if opened_at.is_some() {
            break;
        }
    }
    let opened_at = opened_at.expect("a shard's window broke the rule");
    // Every process reads the opening while it lasts: a read answered
    // within the open period (counted from before the opening report was
    // sent, so never late) must say open. Later answers may say it is over.
    let mut checked = 0;
    for store in &fleet {
        let decision = store.read("sharded").await.unwrap();
        if opened_at.elapsed() < open_for {
            assert!(matches!(decision, Decision::Open { .. }), "{decision:?}");
            checked += 1;
        }
    }
    assert!(checked > 0, "no read came back within the open period");
    // After the close, the evidence from before it no longer counts in
    // any shard, though it is within the window's 10 s.
    sleep(open_for.saturating_sub(opened_at.elapsed()) + ms(100)).await;
    let token = match fleet[0]
        .try_acquire_probe("sharded", open_for, secs(2))
        .await
        .unwrap()
    {
        Election::Won(token) => token,
        other => panic!("the election should be won, got {other:?}"),
    };
    assert!(fleet[0].close("sharded", token).await.unwrap());
    for store in &fleet {
        let decision = store
            .report("sharded", Report::new(1, 1, 0), rule)
            .await
            .unwrap();
        assert_eq!(
            decision,
            Decision::Closed,
            "16 failures after the close, 4 a shard at most"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_retry_budgets_never_grant_more_than_the_fleet_earned() {
    let Some(server) =
        MotoServer::start_or_skip("sharded_retry_budgets_never_grant_more_than_the_fleet_earned")
    else {
        return;
    };
    let fleet = sharded(&server, 8, 2).await;
    let budget = tower_breaker::store::BudgetRule::new(secs(86_400), 0);
    let rule = rule().with_minimum_calls(1_000).with_budget(budget);
    // 8 processes x 20 requests at 10%: 16 retries earned, in two shards.
    for store in &fleet {
        let report = Report::new(20, 0, 0).with_credit(2_000_000);
        store.report("budget", report, rule).await.unwrap();
    }
    let mut granted = 0;
    for _ in 0..4 {
        for store in &fleet {
            if store.claim_retry("budget", budget).await.unwrap() {
                granted += 1;
            }
        }
    }
    assert_eq!(granted, 16, "each shard grants its own earnings, no more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_window_item_stays_small_when_every_process_reports_once() {
    let Some(server) = MotoServer::start_or_skip(
        "a_count_window_item_stays_small_when_every_process_reports_once",
    ) else {
        return;
    };
    // 60 processes, each reporting once (as rarely invoked Lambda
    // environments do): no process's next report removes what no longer
    // counts, so the report that finds too many parts does.
    let rule = rule().with_minimum_calls(1_000).with_count_window(20);
    let mut fleet = Vec::new();
    for _ in 0..60 {
        fleet.push(process(&server, 0).await);
    }
    for store in &fleet {
        store
            .report("small", Report::new(2, 0, 0), rule)
            .await
            .unwrap();
        sleep(ms(2)).await;
    }
    let key = fleet[0].key("small").unwrap();
    let parts = item(&server, &key)
        .await
        .keys()
        .filter(|a| a.starts_with('g'))
        .count();
    assert!(parts <= 34, "{parts} parts of a 20-call window in the item");
}
