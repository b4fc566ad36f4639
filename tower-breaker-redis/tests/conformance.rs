//! The store contract (`tower-breaker-conformance`), clause by clause, on
//! one Redis node (started for the clause), a Redis Cluster (feature
//! `cluster`) and a primary behind Sentinel, on free ports of 127.0.0.1.
//!
//! A cluster or a Sentinel set takes seconds to start, so the clauses that
//! run at the same time share one (see [`shared`]), each with a key prefix
//! of its own: a clause sees only its own keys, as on a fresh topology.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use support::redis_server::RedisServer;
use support::redis_topology::{SentinelSet, DATA_PASSWORD, SERVICE};
use tower_breaker_conformance::Fixture;
use tower_breaker_redis::{RedisOptions, RedisStore, RedisTarget};

async fn node(clause: &'static str) -> Option<Fixture> {
    let server = RedisServer::start_or_skip(clause)?;
    let store = RedisStore::connect(&server.url(), RedisOptions::new().timeout(secs(5)))
        .await
        .expect("connect to redis-server");
    Some(Fixture::with_guard(Arc::new(store), server))
}

/// The topology in `slot` if a clause still holds it, else a new one from
/// `start` (`None`: skipped). It stops when the last clause holding it
/// drops its fixture, so nothing outlives the test binary's clauses; with
/// the tests' threads running clauses side by side, one start usually
/// serves them all.
fn shared<T>(slot: &Mutex<Weak<T>>, start: impl FnOnce() -> Option<T>) -> Option<Arc<T>> {
    let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(running) = slot.upgrade() {
        return Some(running);
    }
    let started = Arc::new(start()?);
    *slot = Arc::downgrade(&started);
    Some(started)
}

/// Options with a key prefix no other clause of this binary uses.
fn own_prefix() -> RedisOptions {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    RedisOptions::new()
        .timeout(secs(5))
        .prefix(format!("conformance-{n}:"))
}

async fn sentinel(clause: &'static str) -> Option<Fixture> {
    static SET: Mutex<Weak<SentinelSet>> = Mutex::new(Weak::new());
    let set = shared(&SET, || SentinelSet::start_or_skip(clause, 1))?;
    let target = RedisTarget::sentinel(set.sentinel_urls(), SERVICE)
        .expect("a sentinel target")
        .password(DATA_PASSWORD);
    let store = RedisStore::connect_with(target, own_prefix())
        .await
        .expect("connect through the sentinels");
    Some(Fixture::with_guard(Arc::new(store), set))
}

fn secs(n: u64) -> std::time::Duration {
    std::time::Duration::from_secs(n)
}

mod on_one_node {
    tower_breaker_conformance::tests!(super::node);
}

mod behind_sentinel {
    tower_breaker_conformance::tests!(super::sentinel);
}

#[cfg(feature = "cluster")]
mod on_a_cluster {
    use super::*;
    use support::redis_topology::Cluster;

    async fn cluster(clause: &'static str) -> Option<Fixture> {
        static CLUSTER: Mutex<Weak<Cluster>> = Mutex::new(Weak::new());
        let cluster = shared(&CLUSTER, || Cluster::start_or_skip(clause))?;
        let target = RedisTarget::cluster(cluster.urls()).expect("a cluster target");
        let store = RedisStore::connect_with(target, own_prefix())
            .await
            .expect("connect to the cluster");
        Some(Fixture::with_guard(Arc::new(store), cluster))
    }

    tower_breaker_conformance::tests!(cluster);
}
