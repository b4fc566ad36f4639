//! The Redis store on a real 3-node Redis Cluster started by the test
//! (see `support::redis_topology`): breakers whose keys live on every node
//! share their circuits across two stores; scripts load on every node,
//! again after a `SCRIPT FLUSH`; and a slot moved to another node (the
//! stores' slot maps now stale, so Redis answers `MOVED`) keeps working.
//!
//! Real time, as in `tests/redis.rs`: the order of events is asserted,
//! with generous bounds.
#![cfg(feature = "cluster")]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use support::redis_topology::{command_calls, Cluster};
use support::*;
use tokio::time::{sleep, Instant};
use tower_breaker::store::{Decision, Store};
use tower_breaker::FleetConfig;
use tower_breaker::{Breaker, BreakerConfig, Outcome, State};
use tower_breaker_redis::{RedisOptions, RedisStore, RedisTarget};

const REFRESH: Duration = Duration::from_millis(100);
/// Slack for scheduling on a busy 2-core machine.
const SLACK: Duration = Duration::from_secs(2);

fn fleet_config(store: Arc<RedisStore>) -> BreakerConfig {
    config()
        .count_window(2)
        .minimum_calls(2)
        .open_period(secs(60))
        .fleet(FleetConfig::new(store).refresh_interval(REFRESH))
}

fn trip(b: &Breaker) {
    while state(b) != State::Open {
        b.try_acquire()
            .expect("closed until it trips")
            .record(Outcome::Failure);
    }
}

/// Calls every breaker until each rejects; returns the time it took.
async fn until_all_reject(breakers: &[Breaker], limit: Duration) -> Duration {
    let start = Instant::now();
    let mut open: Vec<&Breaker> = breakers.iter().collect();
    while !open.is_empty() {
        assert!(
            start.elapsed() < limit,
            "{} breakers still admit",
            open.len()
        );
        open.retain(|b| match b.try_acquire() {
            Ok(p) => {
                p.record(Outcome::Ignored);
                true
            }
            Err(_) => false,
        });
        sleep(ms(5)).await;
    }
    start.elapsed()
}

/// The keys of the store's prefix on node `node`.
fn keys_on(cluster: &Cluster, node: usize) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("tower-breaker:*")
        .query(&mut cluster.raw(node))
        .unwrap()
}

fn errorstat(cluster: &Cluster, node: usize, error: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut cluster.raw(node))
        .unwrap();
    let prefix = format!("errorstat_{error}:count=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breakers_on_every_node_share_their_circuits_through_slot_moves_and_script_flushes() {
    let Some(cluster) = Cluster::start_or_skip(
        "breakers_on_every_node_share_their_circuits_through_slot_moves_and_script_flushes",
    ) else {
        return;
    };
    let started = Instant::now();
    let urls = cluster.urls();
    // One store knows every node, the other only the last: it learns the
    // rest from the cluster.
    let a_store = Arc::new(
        RedisStore::connect_with(
            RedisTarget::cluster(&urls).unwrap(),
            RedisOptions::new().timeout(Duration::from_millis(500)),
        )
        .await
        .expect("connect to the cluster"),
    );
    let b_store = Arc::new(
        RedisStore::connect_with(
            RedisTarget::cluster([&urls[2]]).unwrap(),
            RedisOptions::new().timeout(Duration::from_millis(500)),
        )
        .await
        .expect("connect through one node"),
    );
    let connected = started.elapsed();

    // Two breaker names per node, so that every node runs the scripts.
    let mut per_node: HashMap<usize, Vec<String>> = HashMap::new();
    for i in 0.. {
        let name = format!("svc-{i}");
        let owner = cluster.owner(cluster.slot(&a_store.key(&name).unwrap()));
        let names = per_node.entry(owner).or_default();
        if names.len() < 2 {
            names.push(name);
        }
        if (0..3).all(|n| per_node.get(&n).is_some_and(|v| v.len() == 2)) {
            break;
        }
    }
    let names: Vec<String> = (0..3).flat_map(|n| per_node[&n].clone()).collect();

    let mut a_side = Vec::new();
    let mut b_side = Vec::new();
    for name in &names {
        let a = Breaker::with_config(name.clone(), fleet_config(a_store.clone()));
        let b = Breaker::with_config(name.clone(), fleet_config(b_store.clone()));
        a.refresh().await.expect("first read (a)");
        b.refresh().await.expect("first read (b)");
        a_side.push(a);
        b_side.push(b);
    }
    for a in &a_side {
        trip(a);
    }
    let followed = until_all_reject(&b_side, REFRESH * 10 + SLACK).await;
    for node in 0..3 {
        let keys = keys_on(&cluster, node);
        assert_eq!(keys.len(), 2, "node {node} holds its two records: {keys:?}");
        assert!(
            cluster.command_calls(node, "evalsha") > 0,
            "node {node} ran the scripts"
        );
    }
    for b in a_side.iter().chain(&b_side) {
        assert_eq!(b.snapshot().totals.store_errors, 0);
    }

    // Every node forgets the scripts: the next calls load them again on
    // whichever node they run.
    for node in 0..3 {
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query::<()>(&mut cluster.raw(node))
            .unwrap();
    }
    let loads_before: Vec<u64> = (0..3)
        .map(|n| command_calls(&mut cluster.raw(n), "script|load"))
        .collect();
    for name in &names {
        assert!(
            matches!(b_store.read(name).await, Ok(Decision::Open { .. })),
            "{name} reads open after the flush"
        );
    }
    for (node, before) in loads_before.iter().enumerate() {
        assert!(
            command_calls(&mut cluster.raw(node), "script|load") > *before,
            "node {node} loaded the scripts again"
        );
    }

    // Resharding: the first name's slot moves to another node, with its
    // record. Both stores' slot maps are stale; Redis answers `MOVED`,
    // and the stores follow.
    let moved = &names[0];
    let slot = cluster.slot(&a_store.key(moved).unwrap());
    let from = cluster.owner(slot);
    let to = (from + 1) % 3;
    let moved_before = errorstat(&cluster, from, "MOVED");
    cluster.move_slot(slot, to);
    assert!(keys_on(&cluster, to).contains(&a_store.key(moved).unwrap()));
    let fresh = Breaker::with_config(moved.clone(), fleet_config(b_store.clone()));
    fresh.refresh().await.expect("a read after the move");
    assert_eq!(state(&fresh), State::Open, "the record moved with its slot");
    a_store
        .try_open(moved, secs(60))
        .await
        .expect("a write after the move");
    let redirected = errorstat(&cluster, from, "MOVED") - moved_before;
    assert!(redirected > 0, "the old owner answered MOVED");
    // Every breaker keeps reading the store without errors afterwards.
    let errors_after_move: Vec<u64> = a_side
        .iter()
        .chain(&b_side)
        .map(|b| b.snapshot().totals.store_errors)
        .collect();
    for b in a_side.iter().chain(&b_side) {
        b.refresh()
            .await
            .expect("reads keep working after the move");
        assert_eq!(state(b), State::Open);
    }
    println!(
        "cluster: 2 stores connected in {connected:?}; 6 names on 3 nodes; the b side followed {followed:?} after the trips; \
         slot {slot} moved {from} -> {to}: {redirected} MOVED answers followed; store errors since: {errors_after_move:?}"
    );
}
