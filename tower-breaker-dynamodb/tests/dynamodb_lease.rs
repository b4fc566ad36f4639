//! The fleet's one-probe guarantee on DynamoDB when the prober goes away
//! or is slow, with the default probe settings (a 30 s probe wait, a 2 s
//! lease renewed every third of it): the prober's OS process is SIGKILLed
//! mid-probe (its renewals stop), and a live probe lasts five leases.
//! A private `moto_server` on a free port; real time, with bounds taken
//! from the configured periods plus generous slack for a busy machine.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use support::moto_server::{client_for, options, MotoServer};
use support::*;
use tokio::time::{sleep, Instant};
use tower_breaker::config::DEFAULT_PROBE_LEASE;
use tower_breaker::store::Store;
use tower_breaker::{Breaker, BreakerConfig, FleetConfig, Outcome, State};
use tower_breaker_conformance::fleet::{hammer, hammer_after_first};
use tower_breaker_dynamodb::DynamoDbStore;

const TABLE: &str = "circuits";
const REFRESH: Duration = Duration::from_millis(100);
const OPEN: Duration = Duration::from_millis(300);
const PROBER: &str = "TOWER_BREAKER_DYNAMODB_PROBER";

/// A process's breaker of `name` on `url`, with the default probe wait and
/// lease, a 2-call window and a 300 ms open period.
fn breaker(url: &str, name: &str) -> Breaker {
    let store = Arc::new(DynamoDbStore::new(client_for(url), options(0).table(TABLE)).unwrap());
    Breaker::with_config(name.to_owned(), default_lease_config(store))
}

fn default_lease_config(store: Arc<DynamoDbStore>) -> BreakerConfig {
    config()
        .count_window(2)
        .minimum_calls(2)
        .open_period(OPEN)
        .fleet(FleetConfig::new(store).refresh_interval(REFRESH))
}

/// Five processes' breakers of `name`, each on its own client, each having
/// read the circuit once.
async fn fleet(url: &str, name: &str) -> Arc<Vec<Breaker>> {
    let mut fleet = Vec::new();
    for _ in 0..5 {
        let b = breaker(url, name);
        b.refresh().await.unwrap();
        fleet.push(b);
    }
    Arc::new(fleet)
}

/// The prober's process: takes the fleet's probe, says so, and hangs until
/// it is killed. A no-op without `TOWER_BREAKER_DYNAMODB_PROBER`.
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
        let b = breaker(&url, "killed");
        b.refresh().await.unwrap();
        loop {
            if let Ok(permit) = b.acquire().await {
                assert!(permit.is_probe(), "the circuit is open");
                println!("probing");
                std::mem::forget(permit);
                std::future::pending::<()>().await;
            }
            sleep(ms(2)).await;
        }
    });
}

/// The prober's process is SIGKILLed a second into its probe: its last
/// renewal holds the fleet off until about a lease after it; then exactly
/// one other process probes, within the lease plus the open period (and
/// the refresh that sees the lease unchanged) of the kill. Before heartbeat
/// leases this was the whole 30 s probe wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prober_killed_mid_probe_frees_the_fleet_within_its_lease() {
    let Some(server) =
        MotoServer::start_or_skip("the_prober_killed_mid_probe_frees_the_fleet_within_its_lease")
    else {
        return;
    };
    let store = server.store(TABLE, options(0)).await;
    // Open before the prober's process starts: it is the only caller when
    // the period ends, so it wins the election.
    store.try_open("killed", OPEN).await.unwrap();
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
    let fleet = fleet(&server.url(), "killed").await;
    let probing = hammer(&fleet, 20, Instant::now() + secs(1)).await;
    assert!(
        probing.is_empty(),
        "{} calls joined the live probe",
        probing.len()
    );
    child.kill().unwrap(); // SIGKILL: no close, no re-open, no renewal
    child.wait().unwrap();
    let killed = Instant::now();

    let lease = DEFAULT_PROBE_LEASE;
    // Its last renewal came at most a third of the lease before the kill.
    let during = hammer(&fleet, 20, killed + lease - lease / 3 - ms(100)).await;
    assert!(during.is_empty(), "{} calls during the lease", during.len());
    let (after, first) =
        hammer_after_first(&fleet, 20, killed + lease + OPEN + secs(3), Some(ms(500))).await;
    assert_eq!(after.len(), 1, "one probe once the lease is over");
    assert!(after[0].is_probe());
    let freed = first.unwrap() - killed;
    assert!(
        freed <= lease + OPEN + REFRESH + ms(700),
        "the fleet waited {freed:?} after the kill"
    );
    println!(
        "dynamodb sigkill: the prober died a second into its probe; one new probe {freed:?} after \
         the kill (lease {lease:?}, open period {OPEN:?}; was the whole 30 s probe wait)"
    );
}

/// A live probe that lasts five leases keeps its lease by renewing it: no
/// second process probes meanwhile, and its success closes the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_probe_of_five_leases_stays_alone() {
    let Some(server) = MotoServer::start_or_skip("a_live_probe_of_five_leases_stays_alone") else {
        return;
    };
    let store = server.store(TABLE, options(0)).await;
    store.try_open("slow", OPEN).await.unwrap();
    let fleet = fleet(&server.url(), "slow").await;
    let (mut probes, _) =
        hammer_after_first(&fleet, 20, Instant::now() + secs(5), Some(ms(500))).await;
    assert_eq!(probes.len(), 1, "one probe");
    let probe = probes.pop().unwrap();
    assert!(probe.is_probe());
    let probing = Instant::now();
    let joined = hammer(&fleet, 20, probing + DEFAULT_PROBE_LEASE * 5).await;
    assert!(
        joined.is_empty(),
        "{} more calls during the probe",
        joined.len()
    );
    let held = probing.elapsed();
    probe.record(Outcome::Success);
    let start = Instant::now();
    for b in fleet.iter() {
        while b.try_acquire().map(|p| p.record(Outcome::Success)).is_err() {
            assert!(start.elapsed() < secs(5), "the fleet closes");
            sleep(ms(5)).await;
        }
        assert_eq!(state(b), State::Closed);
    }
    println!(
        "dynamodb slow probe: held {held:?} (lease {DEFAULT_PROBE_LEASE:?}), no second prober; \
         fleet closed {:?} after its success",
        start.elapsed()
    );
}
