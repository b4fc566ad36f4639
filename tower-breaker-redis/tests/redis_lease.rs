//! The fleet's one-probe guarantee when things go wrong: the record is
//! flushed while the circuit is open, the probe outlasts the open period,
//! the prober's process is killed with SIGKILL mid-probe (its renewals
//! stop, so its lease lapses). Real
//! `redis-server`s on free ports; real time, with bounds taken from the
//! configured periods plus generous slack for a busy machine.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use support::redis_server::RedisServer;
use support::*;
use tokio::time::{sleep, Instant};
use tower_breaker::store::{Decision, Store};
use tower_breaker::FleetConfig;
use tower_breaker::{Breaker, BreakerConfig, Outcome, State};
use tower_breaker_conformance::fleet::{hammer, hammer_after_first, until_all_reject};
use tower_breaker_redis::{RedisOptions, RedisStore};

const REFRESH: Duration = Duration::from_millis(100);

/// Each process of the fleet: its own connection, a 2-call window, and the
/// given open period and probe lease (the half-open wait).
async fn fleet(url: &str, name: &str, n: usize, open: Duration, lease: Duration) -> Vec<Breaker> {
    let mut fleet = Vec::new();
    for _ in 0..n {
        let store = Arc::new(
            RedisStore::connect(url, RedisOptions::new().timeout(ms(500)))
                .await
                .expect("connect"),
        );
        let b = Breaker::with_config(name.to_owned(), fleet_config(store, open, lease));
        b.refresh().await.expect("first read");
        fleet.push(b);
    }
    fleet
}

fn fleet_config(store: Arc<RedisStore>, open: Duration, lease: Duration) -> BreakerConfig {
    config()
        .count_window(2)
        .minimum_calls(2)
        .open_period(open)
        .max_half_open_wait(lease)
        .fleet(FleetConfig::new(store).refresh_interval(REFRESH))
}

/// [`fleet_config`] with the default probe wait (30 s) and probe lease
/// (2 s, renewed while the probe runs).
fn default_lease_config(store: Arc<RedisStore>, open: Duration) -> BreakerConfig {
    config()
        .count_window(2)
        .minimum_calls(2)
        .open_period(open)
        .fleet(FleetConfig::new(store).refresh_interval(REFRESH))
}

fn trip(b: &Breaker) {
    while state(b) != State::Open {
        b.try_acquire()
            .expect("closed until it trips")
            .record(Outcome::Failure);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_record_never_closes_the_fleet_without_a_probe() {
    let Some(server) =
        RedisServer::start_or_skip("a_flushed_record_never_closes_the_fleet_without_a_probe")
    else {
        return;
    };
    let open = secs(2);
    let fleet = Arc::new(fleet(&server.url(), "flushed", 5, open, secs(5)).await);
    let tripped = Instant::now();
    trip(&fleet[0]);
    until_all_reject(&fleet[1..], REFRESH * 20).await;

    let _: () = redis::cmd("FLUSHALL").query(&mut server.raw()).unwrap();
    // Until the end of the period, nobody closes on the missing record...
    let admitted = hammer(&fleet, 20, tripped + open - ms(200)).await;
    assert!(admitted.is_empty(), "{} calls passed", admitted.len());
    // ...and the openings were written again.
    let store = RedisStore::connect(&server.url(), RedisOptions::new())
        .await
        .unwrap();
    assert!(
        matches!(store.read("flushed").await.unwrap(), Decision::Open { .. }),
        "re-asserted"
    );
    // After it, exactly one probe (well before the next election's T).
    let (probes, _) = hammer_after_first(&fleet, 20, tripped + open + secs(3), Some(ms(500))).await;
    assert_eq!(probes.len(), 1, "one probe after the flush");
    assert!(probes[0].is_probe());
    println!(
        "flushall: the fleet stayed open and re-asserted its record; one probe at {:?}",
        tripped.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_slower_than_the_open_period_is_never_joined_by_a_second() {
    let Some(server) = RedisServer::start_or_skip(
        "a_probe_slower_than_the_open_period_is_never_joined_by_a_second",
    ) else {
        return;
    };
    let (open, lease) = (ms(300), secs(3));
    // Opened by some process, for long enough that the whole fleet starts
    // open (each breaker's first read adopts it).
    let store = RedisStore::connect(&server.url(), RedisOptions::new())
        .await
        .unwrap();
    let opened = Instant::now();
    store.try_open("slow-probe", secs(2)).await.unwrap();
    let fleet = Arc::new(fleet(&server.url(), "slow-probe", 5, open, lease).await);
    assert!(opened.elapsed() < secs(2), "the fleet was built in time");
    // Everyone calls until one probe is out...
    let (mut probes, _) = hammer_after_first(&fleet, 20, opened + secs(5), Some(ms(500))).await;
    assert_eq!(probes.len(), 1, "one probe");
    let probe = probes.pop().unwrap();
    assert!(probe.is_probe());
    let probing = Instant::now();
    // ...which takes five open periods (and two grown ones): nobody joins.
    let joined = hammer(&fleet, 20, probing + open * 5).await;
    assert!(
        joined.is_empty(),
        "{} more calls during the probe",
        joined.len()
    );
    probe.record(Outcome::Success);
    // Its success closes the fleet.
    let start = Instant::now();
    for b in fleet.iter() {
        while b.try_acquire().map(|p| p.record(Outcome::Success)).is_err() {
            assert!(start.elapsed() < secs(5), "the fleet closes");
            sleep(ms(5)).await;
        }
    }
    println!(
        "slow probe: held {:?} (open period {open:?}), no second prober; fleet closed {:?} after its success",
        probing.elapsed() - start.elapsed(),
        start.elapsed()
    );
}

const PROBER: &str = "TOWER_BREAKER_REDIS_PROBER";

/// The prober's process of `the_prober_killed_mid_probe...`: takes the
/// fleet's probe, says so, and hangs until it is killed. A no-op without
/// `TOWER_BREAKER_REDIS_PROBER`.
#[test]
fn prober_process_role() {
    let Ok(url) = std::env::var(PROBER) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(
            RedisStore::connect(&url, RedisOptions::new().timeout(ms(500)))
                .await
                .unwrap(),
        );
        let b = Breaker::with_config("killed", default_lease_config(store, ms(300)));
        b.refresh().await.unwrap();
        loop {
            if let Ok(permit) = b.try_acquire() {
                assert!(permit.is_probe(), "the circuit is open");
                println!("probing");
                std::mem::forget(permit);
                std::future::pending::<()>().await;
            }
            sleep(ms(2)).await;
        }
    });
}

/// The case, with the default settings (a 30 s probe wait, a 2 s
/// lease renewed every third of it): the prober's process is SIGKILLed a
/// second into its probe. Its last renewal holds the fleet off until about
/// 2 s after it; then exactly one other process probes, within 2 s of the
/// kill plus the open period (it was the whole 30 s wait before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prober_killed_mid_probe_frees_the_fleet_within_its_lease() {
    let Some(server) =
        RedisServer::start_or_skip("the_prober_killed_mid_probe_frees_the_fleet_within_its_lease")
    else {
        return;
    };
    let open = ms(300);
    let lease = tower_breaker::config::DEFAULT_PROBE_LEASE;
    // The circuit opens before the prober's process starts: it is the only
    // caller when the period ends, so it wins the election.
    let store = RedisStore::connect(&server.url(), RedisOptions::new())
        .await
        .unwrap();
    store.try_open("killed", open).await.unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "prober_process_role",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PROBER, server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.contains("probing"))
    })
    .await
    .unwrap();
    assert!(line.is_some(), "the child took the probe");
    // The rest of the fleet, with the same defaults, built while the
    // child probes (and renews its lease).
    let mut fleet = Vec::new();
    for _ in 0..5 {
        let store = Arc::new(
            RedisStore::connect(&server.url(), RedisOptions::new().timeout(ms(500)))
                .await
                .unwrap(),
        );
        let b = Breaker::with_config("killed", default_lease_config(store, open));
        b.refresh().await.unwrap();
        fleet.push(b);
    }
    let fleet = Arc::new(fleet);
    let probing = hammer(&fleet, 20, Instant::now() + secs(1)).await;
    assert!(
        probing.is_empty(),
        "{} calls joined the live probe",
        probing.len()
    );
    child.kill().unwrap(); // SIGKILL: no close, no re-open, no renewal
    child.wait().unwrap();
    let killed = Instant::now();

    // Its last renewal came at most a third of the lease before the kill.
    let during = hammer(&fleet, 20, killed + lease - lease / 3 - ms(100)).await;
    assert!(during.is_empty(), "{} calls during the lease", during.len());
    let (after, first) =
        hammer_after_first(&fleet, 20, killed + lease + open + secs(3), Some(ms(500))).await;
    assert_eq!(after.len(), 1, "one probe once the lease is over");
    assert!(after[0].is_probe());
    let freed = first.unwrap() - killed;
    assert!(
        freed <= lease + open + ms(700),
        "the fleet waited {freed:?} after the kill"
    );
    println!(
        "sigkill: the prober died a second into its probe; one new probe {freed:?} after the kill (lease {lease:?}, open period {open:?}; was the whole 30 s probe wait)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_slow_callers_open_together_from_the_fleets_window() {
    let Some(server) =
        RedisServer::start_or_skip("twenty_slow_callers_open_together_from_the_fleets_window")
    else {
        return;
    };
    // 20 processes (one connection each), default thresholds: a window of
    // 20 calls, 10 at least. Each calls once a second, so alone none would
    // trip for ten seconds.
    let mut fleet = Vec::new();
    for _ in 0..20 {
        let store = Arc::new(
            RedisStore::connect(&server.url(), RedisOptions::new().timeout(ms(500)))
                .await
                .unwrap(),
        );
        let b = Breaker::with_config("slow-callers", config().store(store));
        b.refresh().await.unwrap();
        fleet.push(b);
    }
    let start = Instant::now();
    let mut calls = 0;
    let mut first_open = None;
    while !fleet.iter().all(|b| state(b) == State::Open) {
        assert!(start.elapsed() < secs(8), "the fleet opens together");
        for b in &fleet {
            if let Ok(permit) = b.try_acquire() {
                calls += 1;
                permit.record(Outcome::Failure);
            }
            if first_open.is_none() && state(b) == State::Open {
                first_open = Some(start.elapsed());
            }
            sleep(ms(50)).await;
        }
    }
    let first_open = first_open.unwrap_or_default();
    println!(
        "fleet window: 20 processes x 1 call/s opened after {calls} calls to the dependency (minimum 10); \
         first open at {first_open:?}, all open at {:?}",
        start.elapsed()
    );
    // The fleet's 10th failure opens the record; every process learns at
    // its next read, each after at most one more call.
    assert!(calls <= 10 + 20 + 5, "{calls} calls");
}

/// The winner of the fleet's election that never calls (`try_acquire`
/// does not wait for the election it starts; a keyed breaker's key
/// without traffic; a caller that gave up while it waited) gives the probe
/// back after two lease renewals without a probe in flight: another
/// process probes about 1.3 s after the win (default 2 s lease), not after
/// the election's T (here 20 s), and never while the winner lives, as
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_winner_gives_the_probe_back_to_the_fleet() {
    let Some(server) =
        RedisServer::start_or_skip("a_quiet_winner_gives_the_probe_back_to_the_fleet")
    else {
        return;
    };
    let mut fleet = Vec::new();
    for _ in 0..2 {
        let store = Arc::new(
            RedisStore::connect(&server.url(), RedisOptions::new().timeout(ms(500)))
                .await
                .expect("connect"),
        );
        let b = Breaker::with_config("quiet", default_lease_config(store, secs(10)));
        b.refresh().await.expect("first read");
        fleet.push(b);
    }
    let (quiet, busy) = (&fleet[0], &fleet[1]);
    // Opened for 300 ms by some process: both adopt it.
    let store = RedisStore::connect(&server.url(), RedisOptions::new())
        .await
        .unwrap();
    store.try_open("quiet", ms(300)).await.unwrap();
    quiet.refresh().await.unwrap();
    busy.refresh().await.unwrap();
    assert_eq!(state(quiet), State::Open);
    sleep(ms(400)).await;
    assert!(quiet.try_acquire().is_err(), "the election starts");
    let start = Instant::now();
    while state(quiet) != State::HalfOpen {
        assert!(start.elapsed() < secs(2), "the quiet process won");
        sleep(ms(1)).await;
    }
    let won = Instant::now();
    let probe = loop {
        assert!(won.elapsed() < secs(8), "nobody else ever probed");
        if let Ok(permit) = busy.acquire().await {
            break permit;
        }
        sleep(ms(20)).await;
    };
    let after = won.elapsed();
    assert!(probe.is_probe());
    assert!(
        after < secs(3),
        "the other process probed {after:?} after the win"
    );
    probe.record(Outcome::Success);
    let start = Instant::now();
    while quiet
        .try_acquire()
        .map(|p| p.record(Outcome::Success))
        .is_err()
    {
        assert!(start.elapsed() < secs(2), "the fleet closes");
        sleep(ms(5)).await;
    }
    println!("a quiet winner gave the probe back: another process probed {after:?} after the win");
}
