//! The fleet's count window on DynamoDB across separate OS processes: 20
//! processes call a healthy dependency for 3 s, then it fails fast; the
//! fleet's evidence (its newest 20 calls, each process's failures in a row
//! placed after its healthy calls) opens every process after about as many
//! failures fleet-wide as one process's own window needs. Each process is
//! this test binary run again with `TOWER_BREAKER_DYNAMODB_FLEET` set; a
//! private `moto_server` on a free port.
//!
//! Only low rates: moto (single-threaded, for atomic conditional writes)
//! serves about 80 reports a second here, and 20 processes reporting
//! failures every flush interval (100 ms) send 200.

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use resilience_testkit::process::result_line;
use support::moto_server::{client_for, options, MotoServer};
use support::*;
use tokio::time::sleep;
use tower_breaker::{Breaker, FleetConfig, Outcome, State};
use tower_breaker_dynamodb::DynamoDbStore;

const MEMBER: &str = "TOWER_BREAKER_DYNAMODB_FLEET";
const TABLE: &str = "circuits";

/// Held while a fleet of processes runs.
static FLEETS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// One process of the fleet: from `start_ms` on, calls the dependency every
/// `every_ms` through its breaker (default thresholds and fleet settings:
/// its own window of 20 calls, judged from 10); the dependency succeeds
/// until `outage_ms` and fails from then on. Prints the calls it made in
/// the outage and when it first rejected. A no-op without
/// `TOWER_BREAKER_DYNAMODB_FLEET`.
#[test]
fn fleet_member_role() {
    let Ok(spec) = std::env::var(MEMBER) else {
        return;
    };
    let [url, start_ms, every_ms, outage_ms, refresh_ms]: [&str; 5] = spec
        .split(' ')
        .collect::<Vec<_>>()
        .try_into()
        .expect("url start every outage refresh");
    let refresh = ms(refresh_ms.parse().unwrap());
    let (start_ms, every_ms): (u128, u64) = (start_ms.parse().unwrap(), every_ms.parse().unwrap());
    let outage_ms: u128 = outage_ms.parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(DynamoDbStore::new(client_for(url), options(0).table(TABLE)).unwrap());
        let b = Breaker::with_config(
            "fleet",
            config().fleet(FleetConfig::new(store).refresh_interval(refresh)),
        );
        b.refresh().await.unwrap();
        while unix_ms() < start_ms {
            sleep(ms(1)).await;
        }
        let mut calls = 0;
        let deadline = outage_ms + 20_000;
        let rejected_at = loop {
            assert!(unix_ms() < deadline, "never opened");
            // As a service's `poll_ready` does: a decision older than the
            // allowed staleness is read first.
            match b.acquire().await {
                Ok(permit) if unix_ms() < outage_ms => permit.record(Outcome::Success),
                Ok(permit) => {
                    calls += 1;
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

/// Runs `n` member processes calling every `every_ms` from a common start,
/// spread over the interval, healthy for `healthy_ms`; returns the
/// dependency's calls in the outage (all processes) and each process's
/// first rejection (ms after the outage began), sorted.
async fn run_fleet_after(
    server: &MotoServer,
    n: usize,
    every_ms: u64,
    healthy_ms: u64,
    refresh_ms: u64,
) -> (u64, Vec<i64>) {
    // One fleet at a time: 20 processes of one test share the machine's
    // cores with nobody else's (two fleets at once on 2 cores spread the
    // first rejections by the scheduler's delays, not the store's).
    let _alone = FLEETS.lock().await;
    // The table, before any process reads it.
    server.store(TABLE, options(0)).await;
    let start_ms = unix_ms() + 1500;
    let outage_ms = start_ms + u128::from(healthy_ms);
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..n)
        .map(|i| {
            let start_ms = start_ms + (i as u128) * u128::from(every_ms) / n as u128;
            Command::new(&exe)
                .args([
                    "fleet_member_role",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(
                    MEMBER,
                    format!(
                        "{} {start_ms} {every_ms} {outage_ms} {refresh_ms}",
                        server.url()
                    ),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut calls = 0;
    let mut rejected = Vec::new();
    for child in children {
        let line = result_line(child, "member-result ").await;
        let mut fields = line.split(' ');
        let field = |f: Option<&str>, name: &str| -> u128 {
            f.and_then(|f| f.strip_prefix(name))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        };
        calls += u64::try_from(field(fields.next(), "calls=")).unwrap();
        let at = field(fields.next(), "rejected_at=");
        rejected.push(at as i64 - outage_ms as i64);
    }
    rejected.sort_unstable();
    (calls, rejected)
}

/// After 3 s of healthy traffic at 1 call/s per process (the seeds'
/// serverless fleet), the dependency fails fast: the fleet's count window
/// opens the circuit after about 10 failures fleet-wide, and every other
/// process, whose decision is older than the allowed staleness when its
/// next call comes, reads before that call and is refused. At most
/// 2 x `minimum_calls` reach the dependency (measured: 10). DynamoDB has no
/// push, so the staleness must be below the call interval: the refresh
/// interval is 400 ms here (staleness 800 ms). With the defaults (1 s, 2 s)
/// each process learns at its next report instead, one call late (29
/// calls); with the window in buckets, 54 (the 60 healthy calls of the
/// fleet's window held its failure rate under 50% for 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_healthy_traffic_twenty_processes_at_one_call_a_second_open_within_twice_the_minimum()
{
    let Some(server) = MotoServer::start_or_skip(
        "after_healthy_traffic_twenty_processes_at_one_call_a_second_open_within_twice_the_minimum",
    ) else {
        return;
    };
    let (calls, rejected) = run_fleet_after(&server, 20, 1000, 3_000, 400).await;
    println!(
        "dynamodb fleet: 20 x 1 call/s after 3 s healthy: {calls} calls until every process \
         rejects (first rejection {} ms after the outage)",
        rejected[0]
    );
    assert!(calls <= 2 * 10, "{calls} calls");
}
